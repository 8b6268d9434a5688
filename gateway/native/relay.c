/* The relay's per-read work in one compiled call: gateway/native/__init__.py builds and loads it.
 *
 * A `Reader` is one upstream answer's body. `feed(data)` takes the bytes of one read as they
 * came off the socket and de-frames them (HTTP/1.1 chunked, a Content-Length, or until the
 * close). Until a relay attaches, the body bytes are appended to a list (`body`); once one
 * has (`attach`), the same call also cuts SSE events, tracks and strips a resumable stream's
 * token ids (the first event with the prompt's ids, token chunks, the finish and usage
 * chunks, [DONE]: an answer as the servers send it needs no Python; any other event goes to
 * the Python tracker), finds
 * the events that report usage (handed to the Python usage reader), writes what goes to the
 * client framed as one HTTP chunk, and keeps the gap and pace bookkeeping and the bucket
 * counts of the gaps between writes. Python runs only when something happens: the call
 * returns 0 on an ordinary read, else flags saying what. An ordinary read touches no Python
 * object but the client's transport (its write, is_closing and buffer size, looked up once)
 * and the tracker's buffer of raw ids: the tracker's other state is read once after attach
 * and after each call into its Python, and its counts are written back before its Python
 * runs, with any flags, and at `settle` (the pump's end), when Python may look at them.
 *
 * A `Tap` is the upstream connection's protocol: it hands each read of an answer's body to
 * its Reader with no Python frame between the event loop and this code.
 *
 * gateway/proxy/tracker.py and pump.py are the reference: what this writes to the client,
 * and what it leaves in the tracker, must be byte for byte what they do
 * (tests/gateway/native/test_native_relay*.py hold both to it over recorded and generated
 * streams).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* feed / relay flags: what the caller must look at (0: nothing). */
#define F_GONE 1       /* the client's transport is closing: abort the unit's connection */
#define F_FAILED 2     /* the stream must break: the tracker's error, or `failure` */
#define F_COMPLETE 4   /* the answer ended (its last bytes are relayed or collected) */
#define F_PAUSE 8      /* the client's send buffer is above the high-water mark */
#define F_BROKEN 16    /* the body's framing is not HTTP: `error` says why; nothing relayed */
#define F_JUNK 32      /* bytes after the end of the answer: it stands, the connection goes */
#define F_ENDED 64     /* with F_COMPLETE: the last write also ended the client's stream */

enum { M_CHUNKED = 0, M_LENGTH = 1, M_CLOSE = 2 };
enum {
    C_SIZE,      /* reading hex digits of a chunk size */
    C_EXT,       /* after the size: extensions up to CR LF */
    C_SIZE_LF,   /* CR seen after the size line */
    C_DATA,      /* inside a chunk's data */
    C_DATA_CR,   /* the CR after a chunk's data */
    C_DATA_LF,   /* the LF after it */
    C_TRAILER,   /* at the start of a trailer line (after the last chunk) */
    C_TRAILER_LINE,
    C_TRAILER_LF,
    C_END_LF,    /* CR of the empty line ending the trailers seen */
};

#define MAX_SIZE_LINE 4096          /* a chunk-size line (digits and extensions) */
#define MAX_HEX_DIGITS 15           /* 2^60 bytes: more is a lie, not a chunk */
#define MAX_EVENT (8 * 1024 * 1024) /* one SSE event still incomplete */
#define SIZE_LINE 18                /* "%zx\r\n" of the largest chunk */

typedef struct {
    const char *p;
    Py_ssize_t n;
} Span;

typedef struct {
    PyObject_HEAD
    /* framing */
    int mode, cstate, complete, junk;
    uint64_t remaining;
    Py_ssize_t line;
    PyObject *error;   /* str: why the framing is broken */
    PyObject *failure; /* str: why the stream was broken here (no tracker to hold it) */
    PyObject *body;    /* list of bytes: the body collected until a relay attaches */
    /* the relay */
    int attached, chat, client_ids, mid_event;
    int last_chunk; /* a clean end also writes the chunked coding's last chunk */
    PyObject *client, *tracker, *usage, *names;
    /* the client transport's methods a read calls, looked up once at attach */
    PyObject *c_write, *c_is_closing, *c_buffer_size;
    /* the response head, still to go out ahead of this call's write (relay's `head`) */
    const char *head;
    Py_ssize_t head_len;
    /* The tracker's state, read at the first read after `attach` and after each call into
     * its Python (only that and this change it while a relay is attached): whether events
     * are skipped (done, or an error), whether it has an error, whether the token-chunk path
     * applies (capable, not continuing), its counts, and its buffer of raw ids. `synced`:
     * this state is the tracker's. `dirty`: the counts changed here and are written back
     * before its Python runs, before a read returns flags (Python will look), and when the
     * pump settles (`settle`). */
    int t_skip, t_error, t_fast, t_first, t_synced, t_dirty;
    Py_ssize_t t_produced, t_committed;
    PyObject *t_unparsed;
    Py_ssize_t high_water;
    /* the SSE event still incomplete */
    char *tail;
    Py_ssize_t tail_len, tail_cap;
    /* the client's next chunk's data (flush_out frames it) */
    char *out;
    Py_ssize_t out_len, out_cap;
    /* pace: the time of the last write, the running gap estimate, the gaps' buckets */
    double now, last, gap, sum; /* `now`: the loop's time the caller passed with the read */
    int has_gap;
    int uncounted; /* this call's write is an answer's first bytes: no gap between tokens */
    double *bounds;
    unsigned long long *counts;
    Py_ssize_t nbounds;
    /* the de-framed spans of the current read */
    Span *spans;
    Py_ssize_t nspans, spans_cap;
    int borrowed; /* out and spans are the module's scratch buffers during this call */
} Reader;

/* `out` and `spans` live only for one call: every Reader borrows these (the GIL serialises
 * calls; one made while another is running, which no callback does today, gets its own). An
 * open stream then holds no output buffer between reads. */
static char *g_out;
static Py_ssize_t g_out_cap;
static Span *g_spans;
static Py_ssize_t g_spans_cap;
static int g_busy;
#define SCRATCH_KEPT (1024 * 1024) /* a bigger buffer is freed after its call */

static void borrow(Reader *r)
{
    r->borrowed = !g_busy;
    if (r->borrowed) {
        g_busy = 1;
        r->out = g_out;
        r->out_cap = g_out_cap;
        r->spans = g_spans;
        r->spans_cap = g_spans_cap;
    } else {
        r->out = NULL;
        r->out_cap = 0;
        r->spans = NULL;
        r->spans_cap = 0;
    }
}

static void give_back(Reader *r)
{
    if (r->borrowed && r->out_cap <= SCRATCH_KEPT) {
        g_out = r->out;
        g_out_cap = r->out_cap;
    } else {
        PyMem_Free(r->out);
        if (r->borrowed) {
            g_out = NULL;
            g_out_cap = 0;
        }
    }
    if (r->borrowed) {
        g_spans = r->spans;
        g_spans_cap = r->spans_cap;
        g_busy = 0;
    } else {
        PyMem_Free(r->spans);
    }
    r->borrowed = 0;
    r->out = NULL;
    r->out_cap = 0;
    r->out_len = 0;
    r->spans = NULL;
    r->spans_cap = 0;
    r->nspans = 0;
}

static PyObject *s_done, *s_error, *s_capable, *s_continuing, *s_produced, *s_committed,
    *s_unparsed, *s_finish_reason, *s_prompt_ids, *s_template, *s_choices, *s_prompt_key,
    *s_event, *s_feed, *s_flush, *s_write, *s_is_closing, *s_buffer_size;

static const char IDS[] = ",\"token_ids\":[";
static const char NULL_FINISH[] = "\"finish_reason\":null";
static const char FINISH[] = "\"finish_reason\":\"";
static const char STOP_NULL[] = ",\"stop_reason\":null";
static const char VLLM_PROMPT[] = ",\"prompt_token_ids\":null";
static const char END_A[] = "}]}\n\n";
static const char END_B[] = "}],\"usage\":null}\n\n";
static const char TEXT_CHAT[] = "\"delta\":{\"content\":\"";
static const char TEXT_PLAIN[] = "\"text\":\"";
static const char EMPTY_DELTA[] = "\"delta\":{}";
static const char CHOICES[] = "\"choices\"";
static const char NO_CHOICES[] = "\"choices\":[]";
static const char USAGE_OBJECT[] = "\"usage\":{";
static const char ERROR_KEY[] = "\"error\"";
static const char ANY_IDS[] = "token_ids\"";
static const char DONE[] = "data: [DONE]\n\n";
static const char PROMPT_KEY[] = "\"prompt_token_ids\"";
static const char ROLE_DELTA[] = "\"delta\":{\"role\":\"";
static const char FIRST_CHOICE[] = "\"choices\":[{";
/* tracker.py's _TEMPLATE_KEYS, in its order: what a continuation's chunks take from the
 * answer's first event. */
#define N_TEMPLATE 5
static const char *const TEMPLATE_KEYS[N_TEMPLATE] = {"id", "object", "created", "model",
                                                      "system_fingerprint"};
static PyObject *s_template_keys[N_TEMPLATE];
static PyObject *g_loads, *g_dumps; /* orjson's */
static PyObject *g_array; /* array.array */
static const char USAGE[] = "\"usage\"";
static const char DATA_OBJ[] = "data: {";
#define LIT(s) (s), ((Py_ssize_t)sizeof(s) - 1)

static Py_ssize_t find(const char *h, Py_ssize_t hn, const char *n, Py_ssize_t nn)
{
    if (nn > hn)
        return -1;
    const char *at = memmem(h, (size_t)hn, n, (size_t)nn);
    return at == NULL ? -1 : at - h;
}

/* Where `n[0:nn]` stands in h[0:hn] when it stands there exactly once, else -1. */
static Py_ssize_t find_once(const char *h, Py_ssize_t hn, const char *n, Py_ssize_t nn)
{
    Py_ssize_t at = find(h, hn, n, nn);
    return at >= 0 && find(h + at + 1, hn - at - 1, n, nn) < 0 ? at : -1;
}

static Py_ssize_t rfind(const char *h, Py_ssize_t hn, const char *n, Py_ssize_t nn)
{
    for (Py_ssize_t i = hn - nn; i >= 0; i--) {
        if (h[i] == n[0] && memcmp(h + i, n, (size_t)nn) == 0)
            return i;
    }
    return -1;
}

static int grow(char **buf, Py_ssize_t *cap, Py_ssize_t need)
{
    if (need <= *cap)
        return 0;
    Py_ssize_t cap2 = *cap ? *cap : 256;
    while (cap2 < need)
        cap2 *= 2;
    char *p = PyMem_Realloc(*buf, (size_t)cap2);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = cap2;
    return 0;
}

static int out_add(Reader *r, const char *p, Py_ssize_t n)
{
    if (n <= 0)
        return 0;
    if (grow(&r->out, &r->out_cap, r->out_len + n) < 0)
        return -1;
    memcpy(r->out + r->out_len, p, (size_t)n);
    r->out_len += n;
    return 0;
}

static int out_add_bytes(Reader *r, PyObject *b)
{
    if (!PyBytes_Check(b)) {
        PyErr_SetString(PyExc_TypeError, "the tracker returned something other than bytes");
        return -1;
    }
    return out_add(r, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
}

static int add_span(Reader *r, const char *p, Py_ssize_t n)
{
    if (n <= 0)
        return 0;
    if (r->nspans > 0) { /* adjacent to the last one: one span */
        Span *last = &r->spans[r->nspans - 1];
        if (last->p + last->n == p) {
            last->n += n;
            return 0;
        }
    }
    if (r->nspans == r->spans_cap) {
        Py_ssize_t cap = r->spans_cap ? r->spans_cap * 2 : 8;
        Span *s = PyMem_Realloc(r->spans, (size_t)cap * sizeof(Span));
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->spans = s;
        r->spans_cap = cap;
    }
    r->spans[r->nspans].p = p;
    r->spans[r->nspans].n = n;
    r->nspans++;
    return 0;
}

static void broken(Reader *r, const char *why)
{
    Py_XSETREF(r->error, PyUnicode_FromString(why));
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* In deframe(): the one byte the framing allows here, then on to state `next`; anything else
 * breaks the body with `why`. */
#define EXPECT(want, next, why)                                                              \
    if (c != (want)) {                                                                       \
        broken(r, why);                                                                      \
        return 0;                                                                            \
    }                                                                                        \
    i++;                                                                                     \
    r->cstate = (next);                                                                      \
    break

/* De-frame one read into r->spans. Returns 0, or -1 with a Python error; a framing error sets
 * r->error (and stops). Bytes after the end of the answer set r->junk. */
static int deframe(Reader *r, const char *p, Py_ssize_t n)
{
    r->nspans = 0;
    Py_ssize_t i = 0;
    if (r->complete) {
        r->junk = n > 0;
        return 0;
    }
    if (r->mode == M_CLOSE)
        return add_span(r, p, n);
    if (r->mode == M_LENGTH) {
        Py_ssize_t take = (uint64_t)n < r->remaining ? n : (Py_ssize_t)r->remaining;
        r->remaining -= (uint64_t)take;
        if (add_span(r, p, take) < 0)
            return -1;
        if (r->remaining == 0) {
            r->complete = 1;
            r->junk = take < n;
        }
        return 0;
    }
    while (i < n) {
        char c = p[i];
        switch (r->cstate) {
        case C_SIZE: {
            int v = hexval(c);
            if (v >= 0) {
                if (++r->line > MAX_HEX_DIGITS) {
                    broken(r, "a chunk size with too many digits");
                    return 0;
                }
                r->remaining = r->remaining * 16 + (uint64_t)v;
                i++;
            } else if (r->line == 0) {
                broken(r, "a chunk size that is not hexadecimal");
                return 0;
            } else if (c == ';' || c == ' ' || c == '\t') {
                r->cstate = C_EXT;
            } else if (c == '\r') {
                r->cstate = C_SIZE_LF;
                i++;
            } else {
                broken(r, "a chunk size that is not hexadecimal");
                return 0;
            }
            break;
        }
        case C_EXT:
            if (c == '\r') {
                r->cstate = C_SIZE_LF;
            } else if (c == '\n' || c == '\0') {
                broken(r, "a chunk extension with a bare LF or a NUL byte");
                return 0;
            } else if (++r->line > MAX_SIZE_LINE) {
                broken(r, "a chunk-size line longer than 4096 bytes");
                return 0;
            }
            i++;
            break;
        case C_SIZE_LF:
            if (c != '\n') {
                broken(r, "a chunk-size line not ended by CR LF");
                return 0;
            }
            i++;
            r->line = 0;
            r->cstate = r->remaining == 0 ? C_TRAILER : C_DATA;
            break;
        case C_DATA: {
            Py_ssize_t avail = n - i;
            Py_ssize_t take = (uint64_t)avail < r->remaining ? avail : (Py_ssize_t)r->remaining;
            if (add_span(r, p + i, take) < 0)
                return -1;
            i += take;
            r->remaining -= (uint64_t)take;
            if (r->remaining == 0)
                r->cstate = C_DATA_CR;
            break;
        }
        case C_DATA_CR:
            EXPECT('\r', C_DATA_LF, "a chunk longer than its size");
        case C_DATA_LF:
            EXPECT('\n', C_SIZE, "a chunk not ended by CR LF");
        case C_TRAILER:
            if (c == '\r') {
                r->cstate = C_END_LF;
            } else {
                r->cstate = C_TRAILER_LINE;
                r->line = 1;
            }
            i++;
            break;
        case C_TRAILER_LINE:
            if (c == '\r') {
                r->cstate = C_TRAILER_LF;
            } else if (++r->line > MAX_SIZE_LINE) {
                broken(r, "a trailer line longer than 4096 bytes");
                return 0;
            }
            i++;
            break;
        case C_TRAILER_LF:
            EXPECT('\n', C_TRAILER, "a trailer line not ended by CR LF");
        case C_END_LF:
            if (c != '\n') {
                broken(r, "the last chunk not ended by CR LF");
                return 0;
            }
            i++;
            r->complete = 1;
            r->junk = i < n;
            return 0;
        }
    }
    return 0;
}

/* -- the tracker's common events, in C (tracker.py's _known_shape) ---------------------- */

/* Whether e[0:at] ends with the `n` bytes of `s`. */
static int ends_with(const char *e, Py_ssize_t at, const char *s, Py_ssize_t n)
{
    return at >= n && memcmp(e + at - n, s, (size_t)n) == 0;
}

/* The finish reason ending just before `at` when it is a plain word (tracker.py's
 * _finish_before): its length, with *word where it starts; 0 when it is not one. */
static Py_ssize_t finish_before(const char *e, Py_ssize_t at, Py_ssize_t *word)
{
    if (at < 1 || e[at - 1] != '"')
        return 0;
    Py_ssize_t w = at - 1;
    while (w > at - 33 && w > 0 && ((e[w - 1] >= 'a' && e[w - 1] <= 'z') || e[w - 1] == '_'))
        w--;
    if (w == at - 1 || !ends_with(e, w, LIT(FINISH)))
        return 0;
    *word = w;
    return at - 1 - w;
}

/* tracker.py's _is_usage_chunk. */
static int is_usage_chunk(const char *e, Py_ssize_t n)
{
    Py_ssize_t at = find_once(e, n, LIT(CHOICES));
    return at >= 0 && find(e + at, n - at, LIT(NO_CHOICES)) == 0 &&
           find(e, n, LIT(USAGE_OBJECT)) >= 0 && find(e, n, LIT(ERROR_KEY)) < 0 &&
           find(e, n, LIT(ANY_IDS)) < 0;
}

/* 1: handled (out has what goes to the client); 0: not a known shape; -1: a Python error. */
static int known_shape(Reader *r, const char *e, Py_ssize_t n)
{
    Py_ssize_t ids_len = (Py_ssize_t)sizeof(IDS) - 1;
    Py_ssize_t start = rfind(e, n, LIT(IDS));
    if (start < 0)
        return is_usage_chunk(e, n) ? (out_add(r, e, n) < 0 ? -1 : 1) : 0;
    /* Before the ids: the finish reason (null, or a plain word), then perhaps vLLM's null
     * stop_reason, then perhaps its null prompt ids (which the client does not see). */
    Py_ssize_t cut = start, at = start, word = 0, finish = 0;
    if (ends_with(e, at, LIT(VLLM_PROMPT)))
        cut = at = at - ((Py_ssize_t)sizeof(VLLM_PROMPT) - 1);
    if (ends_with(e, at, LIT(STOP_NULL)))
        at -= (Py_ssize_t)sizeof(STOP_NULL) - 1;
    if (!ends_with(e, at, LIT(NULL_FINISH))) {
        finish = finish_before(e, at, &word);
        if (finish == 0)
            return 0;
    }
    Py_ssize_t from = start + ids_len;
    const char *close = memchr(e + from, ']', (size_t)(n - from));
    if (close == NULL)
        return 0;
    Py_ssize_t end = close - e, rest = n - end - 1;
    int ending_a = rest == (Py_ssize_t)sizeof(END_A) - 1 && memcmp(close + 1, LIT(END_A)) == 0;
    int ending_b = rest == (Py_ssize_t)sizeof(END_B) - 1 && memcmp(close + 1, LIT(END_B)) == 0;
    if (!ending_a && !ending_b)
        return 0;
    if (find(e, start, LIT(IDS)) >= 0) /* another token_ids before: not the one shape */
        return 0;
    const char *text = r->chat ? TEXT_CHAT : TEXT_PLAIN;
    Py_ssize_t text_len = r->chat ? (Py_ssize_t)sizeof(TEXT_CHAT) - 1
                                  : (Py_ssize_t)sizeof(TEXT_PLAIN) - 1;
    Py_ssize_t text_at = find(e, n, text, text_len);
    int has_text = 0;
    if (text_at >= 0)
        has_text = e[text_at + text_len] != '"';
    else if (!(finish > 0 && r->chat && find(e, n, LIT(EMPTY_DELTA)) >= 0))
        return 0; /* (a chat finish chunk's empty delta has no text) */
    Py_ssize_t listed = end - from;
    if (listed > 0) {
        Py_ssize_t commas = 0;
        for (Py_ssize_t k = from; k < end; k++)
            commas += e[k] == ',';
        PyObject *buf = r->t_unparsed;
        Py_ssize_t had = PyByteArray_GET_SIZE(buf);
        if (PyByteArray_Resize(buf, had + listed + 1) < 0)
            return -1;
        memcpy(PyByteArray_AS_STRING(buf) + had, e + from, (size_t)listed);
        PyByteArray_AS_STRING(buf)[had + listed] = ',';
        r->t_produced += commas + 1;
        r->t_dirty = 1;
    }
    if (has_text) {
        r->t_committed = r->t_produced;
        r->t_dirty = 1;
    }
    if (finish > 0) { /* once an answer: set on the tracker at once */
        PyObject *reason = PyUnicode_FromStringAndSize(e + word, finish);
        if (reason == NULL)
            return -1;
        int bad = PyObject_SetAttr(r->tracker, s_finish_reason, reason);
        Py_DECREF(reason);
        if (bad < 0)
            return -1;
    }
    if (r->client_ids)
        return out_add(r, e, n) < 0 ? -1 : 1;
    if (!has_text && finish == 0)
        return 1; /* a chunk that only carried token ids the client did not ask for */
    if (out_add(r, e, cut) < 0 || out_add(r, e + end + 1, n - end - 1) < 0)
        return -1;
    return 1;
}

/* 1 when `v` (a new reference, consumed) is truthy, 0 when not, -1 on an error (or NULL). */
static int truthy(PyObject *v)
{
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static int attr_true(PyObject *o, PyObject *name) { return truthy(PyObject_GetAttr(o, name)); }

static int attr_ssize(PyObject *o, PyObject *name, Py_ssize_t *out)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Read the tracker's state (see Reader). */
static int sync_in(Reader *r)
{
    PyObject *v = PyObject_GetAttr(r->tracker, s_error);
    if (v == NULL)
        return -1;
    int errored = v != Py_None;
    Py_DECREF(v);
    int done = attr_true(r->tracker, s_done);
    if (done < 0)
        return -1;
    v = PyObject_GetAttr(r->tracker, s_capable);
    if (v == NULL)
        return -1;
    int capable = v == Py_True, unknown = v == Py_None;
    Py_DECREF(v);
    int continuing = attr_true(r->tracker, s_continuing);
    if (continuing < 0)
        return -1;
    if (attr_ssize(r->tracker, s_produced, &r->t_produced) < 0 ||
        attr_ssize(r->tracker, s_committed, &r->t_committed) < 0)
        return -1;
    v = PyObject_GetAttr(r->tracker, s_unparsed);
    if (v == NULL)
        return -1;
    if (!PyByteArray_Check(v)) {
        Py_DECREF(v);
        PyErr_SetString(PyExc_TypeError, "the tracker's `unparsed` is not a bytearray");
        return -1;
    }
    Py_XSETREF(r->t_unparsed, v);
    r->t_skip = done || errored;
    r->t_error = errored;
    r->t_fast = capable && !continuing;
    r->t_first = unknown && !continuing;
    r->t_synced = 1;
    r->t_dirty = 0;
    return 0;
}

/* Write the counts back to the tracker if they changed here. */
static int sync_out(Reader *r)
{
    if (!r->t_dirty)
        return 0;
    PyObject *produced = PyLong_FromSsize_t(r->t_produced);
    PyObject *committed = PyLong_FromSsize_t(r->t_committed);
    int bad = produced == NULL || committed == NULL ||
              PyObject_SetAttr(r->tracker, s_produced, produced) < 0 ||
              PyObject_SetAttr(r->tracker, s_committed, committed) < 0;
    Py_XDECREF(produced);
    Py_XDECREF(committed);
    if (bad)
        return -1;
    r->t_dirty = 0;
    return 0;
}

/* -- an answer's first event, in C (tracker.py's _original, for the servers' shapes) ----- */

/* The JSON list of ints at p[0:n] (just past its `[`) as 32-bit ints in `ids` (room for n/2+1):
 * how many, with *end at its `]`; -1 when it is anything else (empty, a space, a float, a
 * leading zero, past 32 bits: the parser's path then decides, as it would for any list). */
static Py_ssize_t int_list(const char *p, Py_ssize_t n, int32_t *ids, Py_ssize_t *end)
{
    Py_ssize_t i = 0, count = 0;
    for (;;) {
        int negative = i < n && p[i] == '-';
        i += negative;
        if (i >= n || p[i] < '0' || p[i] > '9' || (p[i] == '0' && i + 1 < n && p[i + 1] >= '0' &&
                                                   p[i + 1] <= '9'))
            return -1;
        int64_t v = 0;
        int digits = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && digits <= 10) {
            v = v * 10 + (p[i++] - '0');
            digits++;
        }
        v = negative ? -v : v;
        if (digits > 10 || v > INT32_MAX || v < INT32_MIN)
            return -1;
        ids[count++] = (int32_t)v;
        if (i < n && p[i] == ',') {
            i++;
            continue;
        }
        if (i < n && p[i] == ']') {
            *end = i;
            return count;
        }
        return -1;
    }
}

/* `obj`'s value at `key` when it is a list (a borrowed reference), else NULL. */
static PyObject *list_at(PyObject *obj, PyObject *key)
{
    PyObject *v = PyDict_Check(obj) ? PyDict_GetItemWithError(obj, key) : NULL;
    return v != NULL && PyList_Check(v) ? v : NULL;
}

/* The first event's template (tracker.py's, from the parsed event `obj`): a new dict. */
static PyObject *template_of(PyObject *obj)
{
    PyObject *template = PyDict_New();
    for (int k = 0; template != NULL && k < N_TEMPLATE; k++) {
        PyObject *v = PyDict_GetItemWithError(obj, s_template_keys[k]);
        if ((v == NULL && PyErr_Occurred()) ||
            (v != NULL && PyDict_SetItem(template, s_template_keys[k], v) < 0))
            Py_CLEAR(template);
    }
    return template;
}

/* Whether e[0:n] is a chat answer's opening chunk: one choice, whose delta has a role and no
 * finish reason, and no token ids (tracker.py's _is_opening, for this shape). */
static int opening(const char *e, Py_ssize_t n)
{
    return find_once(e, n, LIT(FIRST_CHOICE)) >= 0 && find(e, n, LIT(ROLE_DELTA)) >= 0 &&
           find(e, n, LIT(NULL_FINISH)) >= 0 && find(e, n, LIT(ANY_IDS)) < 0;
}

/* The answer's first event when it carries the prompt's ids as the servers send them: at the
 * top level (chat) or in the one choice (completions), once, a list of 32-bit ints. The
 * event is parsed (orjson, as the Python path parses it: what is not JSON goes there), the
 * tracker gets its template, its prompt ids and `capable`; what is left once the prompt ids
 * are cut out is a token chunk (known_shape) or a chat answer's opening chunk. 1: handled;
 * 0: not this shape (the Python tracker reads it); -1: a Python error. */
static int first_event(Reader *r, const char *e, Py_ssize_t n)
{
    Py_ssize_t key = find_once(e, n, LIT(PROMPT_KEY));
    Py_ssize_t key_len = (Py_ssize_t)sizeof(PROMPT_KEY) - 1;
    if (key < 1 || e[key - 1] != ',')
        return 0;
    if (key + key_len + 2 > n || e[key + key_len] != ':' || e[key + key_len + 1] != '[')
        return 0;
    if (e[n - 3] != '}' || memchr(e, '\n', (size_t)(n - 2)) != NULL ||
        memchr(e, '\r', (size_t)n) != NULL)
        return 0; /* one `data:` line, one object */
    Py_ssize_t from = key + key_len + 2, close = 0;
    int32_t *ids = PyMem_Malloc((size_t)((n - from) / 2 + 1) * sizeof(int32_t));
    char *cut = PyMem_Malloc((size_t)n);
    PyObject *view = NULL, *obj = NULL, *template = NULL, *prompt = NULL;
    int result = -1;
    if (ids == NULL || cut == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    result = 0;
    Py_ssize_t count = int_list(e + from, n - from, ids, &close);
    if (count <= 0)
        goto done;
    close += from;
    /* the event without `,"prompt_token_ids":[...]` */
    Py_ssize_t head = key - 1, rest = n - close - 1, m = head + rest;
    memcpy(cut, e, (size_t)head);
    memcpy(cut + head, e + close + 1, (size_t)rest);
    result = -1;
    view = PyMemoryView_FromMemory((char *)e + 6, n - 8, PyBUF_READ); /* the `data:` payload */
    if (view == NULL)
        goto done;
    obj = PyObject_CallOneArg(g_loads, view);
    if (obj == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* not JSON: the parser's path says */
            PyErr_Clear();
            result = 0;
        }
        goto done;
    }
    PyObject *choices = list_at(obj, s_choices);
    PyObject *first = choices != NULL && PyList_GET_SIZE(choices) > 0
                          ? PyList_GET_ITEM(choices, 0) : NULL;
    int at_top = list_at(obj, s_prompt_key) != NULL;
    int in_choice = !at_top && first != NULL && list_at(first, s_prompt_key) != NULL;
    if (PyErr_Occurred())
        goto done;
    if (!at_top && !in_choice) {
        result = 0; /* the ids are somewhere else: not this shape */
        goto done;
    }
    /* Cutting bytes out gives what the Python path's re-serialisation gives only when the
     * unit wrote what orjson writes (compact, its escapes): else that path takes it. */
    PyObject *again = PyObject_CallOneArg(g_dumps, obj);
    if (again == NULL)
        goto done;
    int same = PyBytes_GET_SIZE(again) == n - 8 &&
               memcmp(PyBytes_AS_STRING(again), e + 6, (size_t)(n - 8)) == 0;
    Py_DECREF(again);
    result = 0;
    if (!same)
        goto done;
    Py_ssize_t before = r->out_len;
    if (find(cut, m, LIT(IDS)) >= 0) {
        result = known_shape(r, cut, m);
    } else if (r->chat && opening(cut, m)) {
        result = out_add(r, cut, m) < 0 ? -1 : 1; /* relayed: it has no ids to strip */
    }
    if (result != 1)
        goto done;
    if (r->client_ids) { /* the client asked for ids: the event goes as it came */
        r->out_len = before;
        if (out_add(r, e, n) < 0) {
            result = -1;
            goto done;
        }
    }
    result = -1;
    template = template_of(obj);
    prompt = template == NULL ? NULL
                              : PyObject_CallFunction(g_array, "sy#", "i", (const char *)ids,
                                                      count * (Py_ssize_t)sizeof(int32_t));
    if (prompt == NULL || PyObject_SetAttr(r->tracker, s_template, template) < 0 ||
        PyObject_SetAttr(r->tracker, s_prompt_ids, prompt) < 0 ||
        PyObject_SetAttr(r->tracker, s_capable, Py_True) < 0)
        goto done;
    r->t_first = 0;
    r->t_fast = 1;
    result = 1;
done:
    Py_XDECREF(view);
    Py_XDECREF(obj);
    Py_XDECREF(template);
    Py_XDECREF(prompt);
    PyMem_Free(ids);
    PyMem_Free(cut);
    return result;
}

/* One whole event of a resumable stream: the C path when it is the common token chunk, else
 * the Python tracker's `_event`. */
static int tracked_event(Reader *r, const char *e, Py_ssize_t n)
{
    if (r->t_skip)
        return 0; /* nothing follows the end, or an error the gateway will handle */
    if (r->t_fast && n >= (Py_ssize_t)sizeof(DATA_OBJ) - 1 && memcmp(e, LIT(DATA_OBJ)) == 0) {
        int handled = known_shape(r, e, n);
        if (handled != 0)
            return handled < 0 ? -1 : 0;
    }
    if (r->t_first && n >= (Py_ssize_t)sizeof(DATA_OBJ) - 1 && memcmp(e, LIT(DATA_OBJ)) == 0) {
        int handled = first_event(r, e, n);
        if (handled != 0)
            return handled < 0 ? -1 : 0;
    }
    if (n == (Py_ssize_t)sizeof(DONE) - 1 && memcmp(e, LIT(DONE)) == 0) {
        /* the answer's end, as _event takes it: nothing after it is relayed */
        if (PyObject_SetAttr(r->tracker, s_done, Py_True) < 0)
            return -1;
        r->t_skip = 1;
        return out_add(r, e, n);
    }
    if (sync_out(r) < 0)
        return -1;
    PyObject *event = PyBytes_FromStringAndSize(e, n);
    if (event == NULL)
        return -1;
    PyObject *out = PyObject_CallMethodOneArg(r->tracker, s_event, event);
    Py_DECREF(event);
    if (out == NULL)
        return -1;
    int bad = out_add_bytes(r, out);
    Py_DECREF(out);
    if (bad)
        return -1;
    return sync_in(r);
}

static Py_ssize_t skip_space(const char *p, Py_ssize_t i, Py_ssize_t n)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    return i;
}

/* Whether e[0:n] names a usage that is not null: OpenAI sends `"usage": null` on every chunk
 * before the last when usage is asked for, and those need no Python (usage.py's says_usage). */
static int says_usage(const char *e, Py_ssize_t n)
{
    Py_ssize_t i = 0, at;
    while ((at = find(e + i, n - i, LIT(USAGE))) >= 0) {
        i = skip_space(e, i + at + (Py_ssize_t)sizeof USAGE - 1, n);
        if (i >= n || e[i] != ':')
            return 1;
        i = skip_space(e, i + 1, n);
        if (n - i < 4 || memcmp(e + i, "null", 4) != 0)
            return 1;
        i += 4;
    }
    return 0;
}

static int usage_event(Reader *r, const char *e, Py_ssize_t n)
{
    if (!says_usage(e, n))
        return 0;
    PyObject *event = PyBytes_FromStringAndSize(e, n);
    if (event == NULL)
        return -1;
    PyObject *res = PyObject_CallMethodOneArg(r->usage, s_event, event);
    Py_DECREF(event);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

static int on_event(Reader *r, const char *e, Py_ssize_t n)
{
    return r->tracker != Py_None ? tracked_event(r, e, n) : usage_event(r, e, n);
}

/* The end of the first event in p[0:n]: just past `\r?\n\r?\n`, or -1 (sse.py's rule). */
static Py_ssize_t event_end(const char *p, Py_ssize_t n)
{
    const char *at = p, *stop = p + n;
    while ((at = memchr(at, '\n', (size_t)(stop - at))) != NULL) {
        Py_ssize_t i = at - p;
        if (i + 1 < n && p[i + 1] == '\n')
            return i + 2;
        if (i + 2 < n && p[i + 1] == '\r' && p[i + 2] == '\n')
            return i + 3;
        at++;
    }
    return -1;
}

static int set_failure(Reader *r, const char *why)
{
    if (r->tracker != Py_None) {
        PyObject *msg = PyUnicode_FromString(why);
        if (msg == NULL)
            return -1;
        int bad = PyObject_SetAttr(r->tracker, s_error, msg);
        Py_DECREF(msg);
        r->t_skip = r->t_error = 1;
        return bad;
    }
    Py_XSETREF(r->failure, PyUnicode_FromString(why));
    if (r->failure == NULL)
        return -1;
    return r->usage == Py_None ? 0 : PyObject_SetAttr(r->usage, s_error, r->failure);
}

/* Cut the events of one body piece (after what the tail holds) and handle each. The tail may
 * outgrow MAX_EVENT by one read: relay() breaks the stream after the read (as the Python
 * path does after splitting all of it), which bounds it. */
static int split(Reader *r, const char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    if (r->tail_len > 0) {
        /* Look for the end of the pending event across the tail and this piece: the tail
         * holds no end of its own, but its last bytes may begin one. */
        Py_ssize_t keep = r->tail_len < 2 ? r->tail_len : 2;
        Py_ssize_t look = n < 3 ? n : 3;
        char probe[5];
        memcpy(probe, r->tail + r->tail_len - keep, (size_t)keep);
        memcpy(probe + keep, p, (size_t)look);
        Py_ssize_t end = event_end(probe, keep + look);
        if (end > keep) {
            end -= keep; /* bytes of p in the event */
        } else {
            end = event_end(p, n);
            if (end < 0) {
                if (grow(&r->tail, &r->tail_cap, r->tail_len + n) < 0)
                    return -1;
                memcpy(r->tail + r->tail_len, p, (size_t)n);
                r->tail_len += n;
                return 0;
            }
        }
        if (grow(&r->tail, &r->tail_cap, r->tail_len + end) < 0)
            return -1;
        memcpy(r->tail + r->tail_len, p, (size_t)end);
        Py_ssize_t len = r->tail_len + end;
        r->tail_len = 0;
        if (on_event(r, r->tail, len) < 0)
            return -1;
        i = end;
    }
    while (i < n) {
        Py_ssize_t end = event_end(p + i, n - i);
        if (end < 0) {
            if (grow(&r->tail, &r->tail_cap, n - i) < 0)
                return -1;
            memcpy(r->tail, p + i, (size_t)(n - i));
            r->tail_len = n - i;
            break;
        }
        if (on_event(r, p + i, end) < 0)
            return -1;
        i += end;
    }
    return 0;
}

static int body_piece(Reader *r, const char *p, Py_ssize_t n)
{
    if (r->tracker == Py_None) { /* a plain stream: relayed verbatim, read for usage */
        if (out_add(r, p, n) < 0)
            return -1;
        if (r->usage == Py_None)
            return 0;
    }
    return split(r, p, n);
}

static void observe(Reader *r, double t)
{
    double g = t - r->last;
    Py_ssize_t b = 0;
    while (b < r->nbounds && r->bounds[b] < g) /* bisect_left over a few bounds */
        b++;
    r->counts[b]++;
    r->sum += g;
    r->gap = r->has_gap ? r->gap + 0.25 * (g - r->gap) : g; /* health/pace.py's next_gap */
    r->has_gap = 1;
    r->last = t;
}

/* "%zx\r\n" of `n` into `out` (SIZE_LINE bytes), without printf's machinery; its length. */
static int size_line(char *out, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    char digits[16];
    int k = 0;
    do {
        digits[k++] = hex[n & 15];
        n >>= 4;
    } while (n > 0);
    for (int i = 0; i < k; i++)
        out[i] = digits[k - 1 - i];
    out[k] = '\r';
    out[k + 1] = '\n';
    return k + 2;
}

/* Send the client, in one write, the response head if it is still to go, out[] as one chunk
 * if it holds anything, and the last chunk if `ending`. */
static int flush_out(Reader *r, int ending)
{
    Py_ssize_t n = r->out_len;
    if (n == 0 && r->head_len == 0 && !ending)
        return 0;
    char size[SIZE_LINE];
    int hn = n > 0 ? size_line(size, (size_t)n) : 0;
    Py_ssize_t total = r->head_len + (n > 0 ? hn + n + 2 : 0) + (ending ? 5 : 0);
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, total);
    if (bytes == NULL)
        return -1;
    char *w = PyBytes_AS_STRING(bytes);
    if (r->head_len > 0) {
        memcpy(w, r->head, (size_t)r->head_len);
        w += r->head_len;
        r->head_len = 0;
    }
    if (n > 0) {
        const char *content = r->out;
        memcpy(w, size, (size_t)hn);
        memcpy(w + hn, content, (size_t)n);
        memcpy(w + hn + n, "\r\n", 2);
        w += hn + n + 2;
        r->mid_event = !(n >= 2 && content[n - 2] == '\n' && content[n - 1] == '\n');
        r->out_len = 0;
    }
    if (ending)
        memcpy(w, "0\r\n\r\n", 5);
    PyObject *res = PyObject_CallOneArg(r->c_write, bytes);
    Py_DECREF(bytes);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    if (n == 0)
        return 0;
    if (r->uncounted)
        r->last = r->now;
    else
        observe(r, r->now);
    return 0;
}

/* Whether an answer that ended leaves the tracker (if any) done: a clean end. */
static int tracker_done(Reader *r)
{
    return r->tracker == Py_None ? 1 : attr_true(r->tracker, s_done);
}

/* pump.py's PythonPump.push, for the body spans of one read (`complete`: the answer ended). */
static PyObject *relay(Reader *r, int complete)
{
    int closing = truthy(PyObject_CallNoArgs(r->c_is_closing));
    if (closing < 0)
        return NULL;
    if (closing)
        return PyLong_FromLong(F_GONE);
    int failed = 0;
    r->out_len = 0;
    int names = r->names != Py_None;
    if (r->nspans > 0 || (complete && names)) {
        if (r->tracker != Py_None && !r->t_synced && sync_in(r) < 0)
            return NULL;
        if (names) {
            PyObject *joined = PyBytes_FromStringAndSize(NULL, 0);
            for (Py_ssize_t k = 0; joined != NULL && k < r->nspans; k++) {
                PyObject *more = PyBytes_FromStringAndSize(r->spans[k].p, r->spans[k].n);
                if (more == NULL)
                    Py_CLEAR(joined);
                else
                    PyBytes_ConcatAndDel(&joined, more);
            }
            if (joined == NULL)
                return NULL;
            PyObject *renamed = PyObject_CallMethodOneArg(r->names, s_feed, joined);
            Py_DECREF(joined);
            if (renamed == NULL)
                return NULL;
            if (!PyBytes_Check(renamed)) {
                Py_DECREF(renamed);
                PyErr_SetString(PyExc_TypeError, "the renamer returned something other than bytes");
                return NULL;
            }
            if (complete) {
                PyObject *rest = PyObject_CallMethodNoArgs(r->names, s_flush);
                if (rest == NULL) {
                    Py_DECREF(renamed);
                    return NULL;
                }
                PyBytes_ConcatAndDel(&renamed, rest);
                if (renamed == NULL)
                    return NULL;
            }
            int res = body_piece(r, PyBytes_AS_STRING(renamed), PyBytes_GET_SIZE(renamed));
            Py_DECREF(renamed);
            if (res < 0)
                return NULL;
            failed |= res > 0;
        } else {
            for (Py_ssize_t k = 0; k < r->nspans && !failed; k++) {
                int res = body_piece(r, r->spans[k].p, r->spans[k].n);
                if (res < 0)
                    return NULL;
                failed |= res > 0;
            }
        }
        r->nspans = 0;
        if (r->tail_len > MAX_EVENT) {
            r->tail_len = 0;
            if (set_failure(r, "the unit sent an SSE event longer than 8 MiB") < 0)
                return NULL;
            failed = 1;
        }
        failed |= r->t_error; /* set only with a tracker */
    }
    int ending = 0;
    if (complete && r->last_chunk && !failed) {
        ending = tracker_done(r);
        if (ending < 0)
            return NULL;
    }
    if (flush_out(r, ending) < 0)
        return NULL;
    long flags = failed ? F_FAILED : complete ? F_COMPLETE | (ending ? F_ENDED : 0) : 0;
    if (!flags) {
        PyObject *size = PyObject_CallNoArgs(r->c_buffer_size);
        if (size == NULL)
            return NULL;
        Py_ssize_t buffered = PyLong_AsSsize_t(size);
        Py_DECREF(size);
        if (buffered == -1 && PyErr_Occurred())
            return NULL;
        flags = buffered > r->high_water ? F_PAUSE : 0;
    }
    if (flags && r->tracker != Py_None && sync_out(r) < 0) /* Python will look */
        return NULL;
    return PyLong_FromLong(flags);
}

/* -- the type ------------------------------------------------------------------------------ */

static int Reader_init(Reader *r, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"mode", "length", NULL};
    int mode;
    unsigned long long length = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|K", kwlist, &mode, &length))
        return -1;
    if (mode < M_CHUNKED || mode > M_CLOSE) {
        PyErr_SetString(PyExc_ValueError, "mode must be 0 (chunked), 1 (length) or 2 (close)");
        return -1;
    }
    r->mode = mode;
    r->cstate = C_SIZE;
    r->remaining = mode == M_LENGTH ? length : 0;
    r->complete = mode == M_LENGTH && length == 0;
    Py_XSETREF(r->body, PyList_New(0));
    if (r->body == NULL)
        return -1;
    Py_XSETREF(r->client, Py_NewRef(Py_None));
    Py_XSETREF(r->tracker, Py_NewRef(Py_None));
    Py_XSETREF(r->usage, Py_NewRef(Py_None));
    Py_XSETREF(r->names, Py_NewRef(Py_None));
    return 0;
}

static void Reader_dealloc(Reader *r)
{
    PyObject_GC_UnTrack(r);
    Py_CLEAR(r->error);
    Py_CLEAR(r->failure);
    Py_CLEAR(r->body);
    Py_CLEAR(r->client);
    Py_CLEAR(r->c_write);
    Py_CLEAR(r->c_is_closing);
    Py_CLEAR(r->c_buffer_size);
    Py_CLEAR(r->tracker);
    Py_CLEAR(r->usage);
    Py_CLEAR(r->names);
    Py_CLEAR(r->t_unparsed);
    PyMem_Free(r->tail);
    PyMem_Free(r->out);
    PyMem_Free(r->bounds);
    PyMem_Free(r->counts);
    PyMem_Free(r->spans);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int Reader_traverse(Reader *r, visitproc visit, void *arg)
{
    Py_VISIT(r->body);
    Py_VISIT(r->client);
    Py_VISIT(r->c_write);
    Py_VISIT(r->c_is_closing);
    Py_VISIT(r->c_buffer_size);
    Py_VISIT(r->tracker);
    Py_VISIT(r->usage);
    Py_VISIT(r->names);
    Py_VISIT(r->t_unparsed);
    return 0;
}

static int Reader_clear(Reader *r)
{
    Py_CLEAR(r->body);
    Py_CLEAR(r->client);
    Py_CLEAR(r->c_write);
    Py_CLEAR(r->c_is_closing);
    Py_CLEAR(r->c_buffer_size);
    Py_CLEAR(r->tracker);
    Py_CLEAR(r->usage);
    Py_CLEAR(r->names);
    Py_CLEAR(r->t_unparsed);
    return 0;
}

/* One read of the unit's bytes at the loop's time `now`: the flags (feed's and the Tap's). */
static PyObject *feed_read(Reader *r, PyObject *data, double now)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    r->now = now;
    borrow(r);
    int was_complete = r->complete;
    PyObject *res = NULL;
    if (r->error != NULL) { /* broken already: nothing more is read */
        res = PyLong_FromLong(F_BROKEN);
        goto done;
    }
    if (deframe(r, view.buf, view.len) < 0)
        goto done;
    if (r->error != NULL) {
        r->nspans = 0;
        res = PyLong_FromLong(F_BROKEN);
        goto done;
    }
    long extra = r->junk ? F_JUNK : 0;
    if (was_complete) { /* nothing more belongs to this answer */
        r->nspans = 0;
        res = PyLong_FromLong(extra);
        goto done;
    }
    if (!r->attached) {
        for (Py_ssize_t k = 0; k < r->nspans; k++) {
            PyObject *piece = PyBytes_FromStringAndSize(r->spans[k].p, r->spans[k].n);
            if (piece == NULL || PyList_Append(r->body, piece) < 0) {
                Py_XDECREF(piece);
                goto done;
            }
            Py_DECREF(piece);
        }
        r->nspans = 0;
        res = PyLong_FromLong((r->complete ? F_COMPLETE : 0) | extra);
        goto done;
    }
    res = relay(r, r->complete);
    if (res != NULL && extra) {
        long flags = PyLong_AsLong(res) | extra;
        Py_SETREF(res, PyLong_FromLong(flags));
    }
done:
    give_back(r);
    PyBuffer_Release(&view);
    return res;
}

static PyObject *Reader_feed(Reader *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "feed(data, now) takes 2 arguments");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    return feed_read(r, args[0], now);
}

static PyObject *Reader_relay(Reader *r, PyObject *args)
{
    Py_buffer view, head = {0};
    int complete, counted = 1;
    double now;
    if (!PyArg_ParseTuple(args, "y*pd|py*", &view, &complete, &now, &counted, &head))
        return NULL;
    if (!r->attached) {
        PyBuffer_Release(&view);
        if (head.buf != NULL)
            PyBuffer_Release(&head);
        PyErr_SetString(PyExc_RuntimeError, "relay() before attach(): no client to relay to");
        return NULL;
    }
    r->now = now;
    r->uncounted = !counted;
    r->head = head.buf;
    r->head_len = head.buf != NULL ? head.len : 0;
    borrow(r);
    PyObject *res = NULL;
    if (add_span(r, view.buf, view.len) == 0)
        res = relay(r, complete);
    r->uncounted = 0;
    r->head = NULL;
    r->head_len = 0;
    give_back(r);
    PyBuffer_Release(&view);
    if (head.buf != NULL)
        PyBuffer_Release(&head);
    return res;
}

static PyObject *Reader_end(Reader *r, PyObject *Py_UNUSED(ignored))
{
    if (r->mode != M_CLOSE || r->complete)
        return PyBool_FromLong(0);
    r->complete = 1;
    return PyBool_FromLong(1);
}

static PyObject *Reader_attach(Reader *r, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"client",     "tracker", "usage", "names",      "bounds",
                             "high_water", "now",     "chat",  "client_ids", "tail",
                             "last_chunk", NULL};
    PyObject *client, *tracker, *usage, *names, *bounds;
    Py_ssize_t high_water;
    double now;
    int chat = 0, client_ids = 0, last_chunk = 0;
    Py_buffer tail = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOnd|ppy*p", kwlist, &client, &tracker,
                                     &usage, &names, &bounds, &high_water, &now, &chat,
                                     &client_ids, &tail, &last_chunk))
        return NULL;
    PyObject *write = PyObject_GetAttr(client, s_write);
    PyObject *is_closing = write ? PyObject_GetAttr(client, s_is_closing) : NULL;
    PyObject *buffer_size = is_closing ? PyObject_GetAttr(client, s_buffer_size) : NULL;
    PyObject *seq = buffer_size ? PySequence_Fast(bounds, "bounds must be a sequence of floats")
                                : NULL;
    if (seq == NULL) {
        Py_XDECREF(write);
        Py_XDECREF(is_closing);
        Py_XDECREF(buffer_size);
        PyBuffer_Release(&tail);
        return NULL;
    }
    Py_XSETREF(r->c_write, write);
    Py_XSETREF(r->c_is_closing, is_closing);
    Py_XSETREF(r->c_buffer_size, buffer_size);
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(seq);
    double *b = PyMem_Calloc((size_t)nb + 1, sizeof(double));
    unsigned long long *c = PyMem_Calloc((size_t)nb + 1, sizeof(unsigned long long));
    if (b == NULL || c == NULL) {
        PyMem_Free(b);
        PyMem_Free(c);
        Py_DECREF(seq);
        PyBuffer_Release(&tail);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < nb; k++) {
        b[k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, k));
        if (b[k] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(b);
            PyMem_Free(c);
            Py_DECREF(seq);
            PyBuffer_Release(&tail);
            return NULL;
        }
    }
    Py_DECREF(seq);
    r->tail_len = 0;
    if (tail.buf != NULL && tail.len > 0) {
        if (grow(&r->tail, &r->tail_cap, tail.len) < 0) {
            PyMem_Free(b);
            PyMem_Free(c);
            PyBuffer_Release(&tail);
            return NULL;
        }
        memcpy(r->tail, tail.buf, (size_t)tail.len);
        r->tail_len = tail.len;
    }
    PyBuffer_Release(&tail);
    PyMem_Free(r->bounds);
    PyMem_Free(r->counts);
    r->bounds = b;
    r->counts = c;
    r->nbounds = nb;
    r->sum = 0.0;
    r->has_gap = 0;
    r->last = r->now = now;
    Py_SETREF(r->client, Py_NewRef(client));
    Py_SETREF(r->tracker, Py_NewRef(tracker));
    r->t_synced = 0; /* read it at the first read */
    Py_SETREF(r->usage, Py_NewRef(usage));
    Py_SETREF(r->names, Py_NewRef(names));
    r->high_water = high_water;
    r->chat = chat;
    r->client_ids = client_ids;
    r->last_chunk = last_chunk;
    r->attached = 1;
    Py_RETURN_NONE;
}

static PyObject *Reader_settle(Reader *r, PyObject *Py_UNUSED(ignored))
{
    if (r->tracker != NULL && r->tracker != Py_None && sync_out(r) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Reader_gaps(Reader *r, PyObject *Py_UNUSED(ignored))
{
    PyObject *counts = PyList_New(r->counts == NULL ? 0 : r->nbounds + 1);
    if (counts == NULL)
        return NULL;
    for (Py_ssize_t k = 0; r->counts != NULL && k <= r->nbounds; k++) {
        PyObject *v = PyLong_FromUnsignedLongLong(r->counts[k]);
        if (v == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SET_ITEM(counts, k, v);
    }
    return Py_BuildValue("(Nd)", counts, r->sum);
}

static PyObject *Reader_get_error(Reader *r, void *c)
{
    return Py_NewRef(r->error ? r->error : Py_None);
}
static PyObject *Reader_get_failure(Reader *r, void *c)
{
    return Py_NewRef(r->failure ? r->failure : Py_None);
}
static PyObject *Reader_get_body(Reader *r, void *c) { return Py_NewRef(r->body); }
static PyObject *Reader_get_complete(Reader *r, void *c) { return PyBool_FromLong(r->complete); }
static PyObject *Reader_get_mid_event(Reader *r, void *c) { return PyBool_FromLong(r->mid_event); }
static PyObject *Reader_get_heard(Reader *r, void *c) { return PyFloat_FromDouble(r->now); }
static PyObject *Reader_get_gap(Reader *r, void *c)
{
    if (!r->has_gap)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(r->gap);
}
static PyObject *Reader_get_pending(Reader *r, void *c) { return PyLong_FromSsize_t(r->tail_len); }

static int Reader_set_mid_event(Reader *r, PyObject *v, void *c)
{
    int t = v == NULL ? 0 : PyObject_IsTrue(v);
    if (t < 0)
        return -1;
    r->mid_event = t;
    return 0;
}

static PyGetSetDef Reader_getset[] = {
    {"error", (getter)Reader_get_error, NULL, "why the body's framing is broken", NULL},
    {"failure", (getter)Reader_get_failure, NULL, "why a plain stream was broken here", NULL},
    {"body", (getter)Reader_get_body, NULL, "body pieces read before a relay attached", NULL},
    {"complete", (getter)Reader_get_complete, NULL, "the answer's body ended", NULL},
    {"mid_event", (getter)Reader_get_mid_event, (setter)Reader_set_mid_event,
     "the last bytes written end inside an SSE event", NULL},
    {"heard", (getter)Reader_get_heard, NULL, "the loop's time of the last read", NULL},
    {"gap", (getter)Reader_get_gap, NULL, "running estimate of the gap between writes", NULL},
    {"pending", (getter)Reader_get_pending, NULL, "bytes of an SSE event still incomplete", NULL},
    {NULL},
};

static PyMethodDef Reader_methods[] = {
    {"feed", (PyCFunction)(void (*)(void))Reader_feed, METH_FASTCALL,
     "feed(data, now) -> flags: one read of the unit's bytes at the loop's time `now`,\n"
     "de-framed (and relayed once attached)"},
    {"relay", (PyCFunction)Reader_relay, METH_VARARGS,
     "relay(body, complete, now, counted=True, head=b'') -> flags: bytes already de-framed,\n"
     "relayed; not `counted`: an answer's first bytes, whose write is no gap between tokens;\n"
     "`head`: the response head, sent in the same write (alone if nothing else goes)"},
    {"end", (PyCFunction)Reader_end, METH_NOARGS,
     "end() -> bool: the connection closed; True when that ends a close-delimited body"},
    {"attach", (PyCFunction)(void (*)(void))Reader_attach, METH_VARARGS | METH_KEYWORDS,
     "attach(client, tracker, usage, names, bounds, high_water, now, chat, client_ids, tail,\n"
     "last_chunk): `last_chunk`: a clean end writes the stream's last chunk (flag ENDED)"},
    {"settle", (PyCFunction)Reader_settle, METH_NOARGS,
     "settle(): write the counts kept here since the last look back to the tracker"},
    {"gaps", (PyCFunction)Reader_gaps, METH_NOARGS,
     "gaps() -> (bucket counts, sum): the gaps between writes since attach"},
    {NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.native._relay.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One upstream answer's body: de-framed, and relayed once a relay attaches.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_traverse = (traverseproc)Reader_traverse,
    .tp_clear = (inquiry)Reader_clear,
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
};

/* -- the Tap: the connection's protocol, so that no Python frame runs per read ---------------
 *
 * The event loop calls its protocol's `data_received` for every read. With the Tap as the
 * protocol, a read of an answer's body goes from the loop straight to `feed_read`: the
 * connection's Python `data_received` (gateway/upstream/connection.py) runs only while the
 * connection has no Reader (the response head), and its `_native_flags` only when the read
 * needs Python, exactly when that method would have called it. The time of the read stays
 * in the Reader (`heard`), where the connection's method keeps it on itself (`last_data`).
 * Every other protocol call goes to the connection as it is. */

typedef struct {
    PyObject_HEAD
    PyObject *conn;  /* the UpstreamConnection */
    PyObject *clock; /* its loop's `time` */
    /* Where the connection keeps `reader` and `events`: the byte offsets of its __slots__,
     * read with no attribute lookup per read (-1: not a plain slot, looked up by name). */
    Py_ssize_t reader_at, events_at;
} Tap;

static PyObject *s_reader, *s_events, *s_native_flags, *s_data_received,
    *s_connection_made, *s_connection_lost, *s_eof_received, *s_pause_writing,
    *s_resume_writing, *s_loop, *s_time;

/* The offset of `name` in instances of `type` when it is a plain object slot (__slots__),
 * else -1: a property, a dict attribute or anything else is read by name. */
static Py_ssize_t slot_offset(PyTypeObject *type, PyObject *name)
{
    PyObject *descr = PyObject_GetAttr((PyObject *)type, name); /* a slot's: its descriptor */
    if (descr == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t at = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && (member->flags & READONLY) == 0)
            at = member->offset;
    }
    Py_DECREF(descr);
    return at;
}

/* A new reference to the connection's `name` (its slot at `at`, or by name); NULL with an
 * exception when it is unset, as the attribute lookup would raise. */
static PyObject *conn_attr(Tap *t, Py_ssize_t at, PyObject *name)
{
    if (at < 0)
        return PyObject_GetAttr(t->conn, name);
    PyObject *value = *(PyObject **)((char *)t->conn + at);
    if (value == NULL)
        return PyObject_GetAttr(t->conn, name); /* unset: its AttributeError */
    return Py_NewRef(value);
}

static int Tap_init(Tap *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"conn", NULL};
    PyObject *conn;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &conn))
        return -1;
    PyObject *loop = PyObject_GetAttr(conn, s_loop);
    if (loop == NULL)
        return -1;
    PyObject *clock = PyObject_GetAttr(loop, s_time);
    Py_DECREF(loop);
    if (clock == NULL)
        return -1;
    Py_XSETREF(t->conn, Py_NewRef(conn));
    Py_XSETREF(t->clock, clock);
    t->reader_at = slot_offset(Py_TYPE(conn), s_reader);
    t->events_at = slot_offset(Py_TYPE(conn), s_events);
    return 0;
}

static void Tap_dealloc(Tap *t)
{
    PyObject_GC_UnTrack(t);
    Py_CLEAR(t->conn);
    Py_CLEAR(t->clock);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static int Tap_traverse(Tap *t, visitproc visit, void *arg)
{
    Py_VISIT(t->conn);
    Py_VISIT(t->clock);
    return 0;
}

static int Tap_clear(Tap *t)
{
    Py_CLEAR(t->conn);
    Py_CLEAR(t->clock);
    return 0;
}

static int tap_ready(Tap *t)
{
    if (t->conn != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "Tap() was not initialised with its connection");
    return -1;
}

/* What UpstreamConnection.data_received does once the connection has a Reader, in C. */
static PyObject *Tap_data_received(Tap *t, PyObject *data)
{
    if (tap_ready(t) < 0)
        return NULL;
    PyObject *reader = conn_attr(t, t->reader_at, s_reader);
    if (reader == NULL)
        return NULL;
    if (!Py_IS_TYPE(reader, &ReaderType)) { /* the head: httptools, in Python */
        Py_DECREF(reader);
        return PyObject_CallMethodOneArg(t->conn, s_data_received, data);
    }
    PyObject *res = NULL, *flags = NULL, *events = NULL;
    PyObject *now = PyObject_CallNoArgs(t->clock);
    if (now == NULL)
        goto done;
    double when = PyFloat_AsDouble(now);
    if (when == -1.0 && PyErr_Occurred())
        goto done;
    flags = feed_read((Reader *)reader, data, when);
    if (flags == NULL)
        goto done;
    int any = PyObject_IsTrue(flags);
    if (any < 0)
        goto done;
    if (!any) {
        events = conn_attr(t, t->events_at, s_events);
        if (events == NULL)
            goto done;
    }
    if (any || events == Py_None) /* no relay yet: the request task may be waiting */
        res = PyObject_CallMethodOneArg(t->conn, s_native_flags, flags);
    else
        res = Py_NewRef(Py_None);
done:
    Py_XDECREF(events);
    Py_XDECREF(flags);
    Py_XDECREF(now);
    Py_DECREF(reader);
    return res;
}

static PyObject *tap_forward(Tap *t, PyObject *name, PyObject *arg)
{
    if (tap_ready(t) < 0)
        return NULL;
    if (arg == NULL)
        return PyObject_CallMethodNoArgs(t->conn, name);
    return PyObject_CallMethodOneArg(t->conn, name, arg);
}

static PyObject *Tap_connection_made(Tap *t, PyObject *transport)
{
    return tap_forward(t, s_connection_made, transport);
}
static PyObject *Tap_connection_lost(Tap *t, PyObject *exc)
{
    return tap_forward(t, s_connection_lost, exc);
}
static PyObject *Tap_eof_received(Tap *t, PyObject *Py_UNUSED(ignored))
{
    return tap_forward(t, s_eof_received, NULL);
}
static PyObject *Tap_pause_writing(Tap *t, PyObject *Py_UNUSED(ignored))
{
    return tap_forward(t, s_pause_writing, NULL);
}
static PyObject *Tap_resume_writing(Tap *t, PyObject *Py_UNUSED(ignored))
{
    return tap_forward(t, s_resume_writing, NULL);
}
static PyObject *Tap_get_conn(Tap *t, void *c)
{
    if (tap_ready(t) < 0)
        return NULL;
    return Py_NewRef(t->conn);
}

static PyMethodDef Tap_methods[] = {
    {"data_received", (PyCFunction)Tap_data_received, METH_O,
     "data_received(data): a read; the body's go to the connection's Reader here"},
    {"connection_made", (PyCFunction)Tap_connection_made, METH_O, "the connection's"},
    {"connection_lost", (PyCFunction)Tap_connection_lost, METH_O, "the connection's"},
    {"eof_received", (PyCFunction)Tap_eof_received, METH_NOARGS, "the connection's"},
    {"pause_writing", (PyCFunction)Tap_pause_writing, METH_NOARGS, "the connection's"},
    {"resume_writing", (PyCFunction)Tap_resume_writing, METH_NOARGS, "the connection's"},
    {NULL},
};

static PyGetSetDef Tap_getset[] = {
    {"conn", (getter)Tap_get_conn, NULL, "the UpstreamConnection this is the protocol of", NULL},
    {NULL},
};

static PyTypeObject TapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.native._relay.Tap",
    .tp_basicsize = sizeof(Tap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Tap(conn): an UpstreamConnection's protocol, reading its answer's body in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tap_init,
    .tp_dealloc = (destructor)Tap_dealloc,
    .tp_traverse = (traverseproc)Tap_traverse,
    .tp_clear = (inquiry)Tap_clear,
    .tp_methods = Tap_methods,
    .tp_getset = Tap_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.native._relay",
    .m_doc = "The relay's per-read work in one compiled call.",
    .m_size = -1,
};

#define INTERN(var, text)                                                                    \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                    \
        return NULL;

PyMODINIT_FUNC PyInit__relay(void)
{
    INTERN(s_done, "done");
    INTERN(s_finish_reason, "finish_reason");
    INTERN(s_error, "error");
    INTERN(s_capable, "capable");
    INTERN(s_continuing, "continuing");
    INTERN(s_produced, "produced");
    INTERN(s_committed, "committed");
    INTERN(s_unparsed, "unparsed");
    INTERN(s_event, "_event");
    INTERN(s_feed, "feed");
    INTERN(s_flush, "flush");
    INTERN(s_write, "write");
    INTERN(s_is_closing, "is_closing");
    INTERN(s_buffer_size, "get_write_buffer_size");
    INTERN(s_reader, "reader");
    INTERN(s_events, "events");
    INTERN(s_native_flags, "_native_flags");
    INTERN(s_data_received, "data_received");
    INTERN(s_connection_made, "connection_made");
    INTERN(s_connection_lost, "connection_lost");
    INTERN(s_eof_received, "eof_received");
    INTERN(s_pause_writing, "pause_writing");
    INTERN(s_resume_writing, "resume_writing");
    INTERN(s_loop, "loop");
    INTERN(s_time, "time");
    INTERN(s_prompt_ids, "prompt_ids");
    INTERN(s_template, "template");
    INTERN(s_choices, "choices");
    INTERN(s_prompt_key, "prompt_token_ids");
    for (int k = 0; k < N_TEMPLATE; k++)
        INTERN(s_template_keys[k], TEMPLATE_KEYS[k]);
    PyObject *orjson = PyImport_ImportModule("orjson");
    PyObject *array = orjson == NULL ? NULL : PyImport_ImportModule("array");
    g_loads = orjson == NULL ? NULL : PyObject_GetAttrString(orjson, "loads");
    g_dumps = orjson == NULL ? NULL : PyObject_GetAttrString(orjson, "dumps");
    g_array = array == NULL ? NULL : PyObject_GetAttrString(array, "array");
    Py_XDECREF(orjson);
    Py_XDECREF(array);
    if (g_loads == NULL || g_dumps == NULL || g_array == NULL)
        return NULL;
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&TapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObjectRef(m, "Tap", (PyObject *)&TapType) < 0 ||
        PyModule_AddIntConstant(m, "GONE", F_GONE) < 0 ||
        PyModule_AddIntConstant(m, "FAILED", F_FAILED) < 0 ||
        PyModule_AddIntConstant(m, "COMPLETE", F_COMPLETE) < 0 ||
        PyModule_AddIntConstant(m, "PAUSE", F_PAUSE) < 0 ||
        PyModule_AddIntConstant(m, "BROKEN", F_BROKEN) < 0 ||
        PyModule_AddIntConstant(m, "JUNK", F_JUNK) < 0 ||
        PyModule_AddIntConstant(m, "ENDED", F_ENDED) < 0 ||
        PyModule_AddIntConstant(m, "MAX_EVENT", MAX_EVENT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
