/* reader.c: the Reader type, one upstream answer's body: `feed` (a read de-framed, collected
 * until a relay attaches, relayed after), `relay` (bytes already de-framed), `attach` and the
 * rest of its methods and attributes; the output buffer and the scratch buffers a call
 * borrows; pump.py's push in C (`relay`: the client gone, the events, the one write of a
 * chunk, the send buffer's high-water mark) and the pace of the writes (the gap estimate and
 * its buckets). Part of relay.c's translation unit (see relay.h).
 */
#include "relay.h"

#define SIZE_LINE 18                /* "%zx\r\n" of the largest chunk */

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

static void observe(Reader *r, double t)
{
    double g = t - r->last;
    Py_ssize_t b = 0;
    while (b < r->nbounds && r->bounds[b] < g) /* bisect_left over a few bounds */
        b++;
    r->counts[b]++;
    r->sum += g;
    r->gap = r->has_gap ? r->gap + 0.25 * (g - r->gap) : g; /* relay/pace.py's next_gap */
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
                             "last_chunk", "read_usage", NULL};
    PyObject *client, *tracker, *usage, *names, *bounds;
    Py_ssize_t high_water;
    double now;
    int chat = 0, client_ids = 0, last_chunk = 0, read_usage = 0;
    Py_buffer tail = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOnd|ppy*pp", kwlist, &client, &tracker,
                                     &usage, &names, &bounds, &high_water, &now, &chat,
                                     &client_ids, &tail, &last_chunk, &read_usage))
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
    r->read_usage = read_usage;
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
     "last_chunk, read_usage): `last_chunk`: a clean end writes the stream's last chunk (flag\n"
     "ENDED); `read_usage`: the usage chunk goes to the tracker's Python path"},
    {"settle", (PyCFunction)Reader_settle, METH_NOARGS,
     "settle(): write the counts kept here since the last look back to the tracker"},
    {"gaps", (PyCFunction)Reader_gaps, METH_NOARGS,
     "gaps() -> (bucket counts, sum): the gaps between writes since attach"},
    {NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.relay.native._relay.Reader",
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
