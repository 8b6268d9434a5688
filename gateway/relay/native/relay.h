/* relay.h: what the files of the native relay share (gateway/relay/native/__init__.py builds them).
 *
 * relay.c is the one translation unit: it includes this header, then framing.c, events.c,
 * reader.c and tap.c, then initialises the module. So every function and global here is
 * `static` (the built module exports PyInit__relay alone), and the static declarations of
 * the globals below are their definitions. This holds the flags a read returns, the framing
 * states, the Reader (one answer's body and its relay), the names the module interns at
 * init, and the functions one file calls in another.
 */
#ifndef UNITGATE_RELAY_H
#define UNITGATE_RELAY_H

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

#define MAX_EVENT (8 * 1024 * 1024) /* one SSE event still incomplete */

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
    int read_usage; /* the tracker reads the usage chunk itself (tracker.py's reads_usage) */
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

/* -- the names, interned at module init (relay.c) ---------------------------------------------
 * The attributes and methods of the Python objects the relay touches (gateway/relay/native/
 * contract.py declares them, and tests/gateway/relay/test_native_contract.py holds the two
 * to each other), and the keys of an answer's first event. */
static PyObject *s_done, *s_error, *s_capable, *s_continuing, *s_produced, *s_committed,
    *s_unparsed, *s_finish_reason, *s_prompt_ids, *s_template, *s_choices, *s_prompt_key,
    *s_event, *s_feed, *s_flush, *s_write, *s_is_closing, *s_buffer_size;
static PyObject *s_reader, *s_events, *s_native_flags, *s_data_received,
    *s_connection_made, *s_connection_lost, *s_eof_received, *s_pause_writing,
    *s_resume_writing, *s_loop, *s_time;
#define N_TEMPLATE 5 /* tracker.py's _TEMPLATE_KEYS (relay.c's TEMPLATE_KEYS) */
static PyObject *s_template_keys[N_TEMPLATE];
static PyObject *g_loads, *g_dumps; /* orjson's */
static PyObject *g_array; /* array.array */

/* -- framing.c: the body's HTTP framing ---------------------------------------------------- */
static int add_span(Reader *r, const char *p, Py_ssize_t n);
static int deframe(Reader *r, const char *p, Py_ssize_t n);

/* -- events.c: SSE events, the tracker's state, usage -------------------------------------- */
static int truthy(PyObject *v);
static int attr_true(PyObject *o, PyObject *name);
static int sync_in(Reader *r);
static int sync_out(Reader *r);
static int set_failure(Reader *r, const char *why);
static int body_piece(Reader *r, const char *p, Py_ssize_t n);

/* -- reader.c: the Reader type, its buffers and its writes to the client ------------------- */
static int grow(char **buf, Py_ssize_t *cap, Py_ssize_t need);
static int out_add(Reader *r, const char *p, Py_ssize_t n);
static PyObject *feed_read(Reader *r, PyObject *data, double now);
static PyTypeObject ReaderType;

/* -- tap.c: the Tap type ------------------------------------------------------------------- */
static PyTypeObject TapType;

#endif /* UNITGATE_RELAY_H */
