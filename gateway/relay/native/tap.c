/* tap.c: the Tap type, an UpstreamConnection's protocol: each read of an answer's body goes
 * from the event loop to its Reader (feed_read) with no Python frame between; everything else
 * goes to the connection. Part of relay.c's translation unit (see relay.h).
 */
#include "relay.h"

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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.relay.native._relay.Tap",
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
