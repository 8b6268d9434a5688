/* events.c: the SSE events of a relayed body. Cutting them (sse.py's rule, across reads),
 * the tracker's common events in C (token chunks, finish and usage chunks, [DONE]: tracker.py's
 * _known_shape), an answer's first event with the prompt's ids and its template (tracker.py's
 * _original), the tracker's state read once and its counts written back (sync_in, sync_out),
 * any other event handed to the Python tracker, and the events that report usage handed to the
 * usage reader. Part of relay.c's translation unit (see relay.h).
 */
#include "relay.h"

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
static const char USAGE[] = "\"usage\"";
static const char DATA_OBJ[] = "data: {";
#define LIT(s) (s), ((Py_ssize_t)sizeof(s) - 1)

/* The needle's byte to look for first: one that stands only a few times in an event's JSON
 * (a bracket, a brace, an `x`, an underscore, a colon, in that order), else -1. Inlined where
 * the needle is one of the constants above, so the compiler folds it to a number. */
static inline __attribute__((always_inline)) Py_ssize_t anchor(const char *n, Py_ssize_t nn)
{
    const char *at;
    if ((at = memchr(n, '[', (size_t)nn)) != NULL || (at = memchr(n, '{', (size_t)nn)) != NULL ||
        (at = memchr(n, 'x', (size_t)nn)) != NULL || (at = memchr(n, '_', (size_t)nn)) != NULL ||
        (at = memchr(n, ':', (size_t)nn)) != NULL)
        return at - n;
    return -1;
}

/* Where n[0:nn] first stands in h[0:hn], or -1: memmem's answer. Each token's event is
 * searched twice, and glibc's memmem costs about two instructions a byte of it (a third of
 * the relay's C work per request, measured with callgrind); memchr over a rare byte of the
 * needle, then a compare at each of its few places, costs a tenth of that. */
static inline __attribute__((always_inline)) Py_ssize_t find(const char *h, Py_ssize_t hn,
                                                              const char *n, Py_ssize_t nn)
{
    if (nn > hn)
        return -1;
    Py_ssize_t a = anchor(n, nn);
    if (a < 0) {
        const char *at = memmem(h, (size_t)hn, n, (size_t)nn);
        return at == NULL ? -1 : at - h;
    }
    /* An occurrence at i has n[a] at i + a, for i in [0, hn - nn]: scan those in order. */
    const char *p = h + a, *last = h + (hn - nn) + a;
    while (p <= last) {
        const char *hit = memchr(p, (unsigned char)n[a], (size_t)(last - p + 1));
        if (hit == NULL)
            return -1;
        if (memcmp(hit - a, n, (size_t)nn) == 0)
            return hit - a - h;
        p = hit + 1;
    }
    return -1;
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

static int out_add_bytes(Reader *r, PyObject *b)
{
    if (!PyBytes_Check(b)) {
        PyErr_SetString(PyExc_TypeError, "the tracker returned something other than bytes");
        return -1;
    }
    return out_add(r, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
}

/* -- the tracker's common events, in C (tracker.py's _known_shape) ------------------------- */

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
        return !r->read_usage && is_usage_chunk(e, n) ? (out_add(r, e, n) < 0 ? -1 : 1) : 0;
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

/* -- an answer's first event, in C (tracker.py's _original, for the servers' shapes) ------- */

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

/* -- usage, and cutting the events (sse.py's EventSplitter) -------------------------------- */

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
