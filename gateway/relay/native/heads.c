/* heads.c: HTTP heads of the common shape, read in one call: a client's request head
 * (`request_head`, for the lean front) and a unit's response head (`response_head`, for the
 * upstream connection). Part of relay.c's translation unit (see relay.h).
 *
 * The Python readers are the reference: httptools (llhttp) with gateway/front/head.py for a
 * request, with gateway/upstream/connection.py for a response. These functions take only the
 * heads they can read exactly and say None to every other, which then goes to the Python
 * reader as before: so a head they take must come out as the Python reader makes it, and a
 * head they leave costs only the time of looking. They take plain ASCII field lines (a token,
 * a colon, visible characters, spaces and tabs), no folded line, no bare LF, no field that
 * changes how the message is framed or coded beyond a Content-Length (or, in a response, a
 * chunked body), and no field the lean front leaves to aiohttp or reads with more care
 * (Expect, Origin, Content-Encoding, Upgrade). tests/gateway/relay/test_native_heads.py holds
 * them to the Python readers over generated heads.
 */
#include "relay.h"

/* aiohttp's limits on a request head's parts (gateway/front/head.py: MAX_LINE, MAX_FIELDS). */
#define HEAD_MAX_LINE 8190
#define HEAD_MAX_FIELDS 128

static inline int is_alnum(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* RFC 9110's tchar: what a field name is made of. */
static inline int is_tchar(unsigned char c)
{
    return is_alnum(c) || (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* A request target's characters taken here: RFC 3986's pchar, '/' and '?' (no fragment, no
 * character llhttp might refuse or a client would have to escape). */
static inline int is_target_char(unsigned char c)
{
    return is_alnum(c) || (c != 0 && strchr("-._~!$&'()*+,;=:@%/?", c) != NULL);
}

/* A field value's characters taken here: visible ASCII, space and tab. */
static inline int is_value_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c < 0x7f);
}

/* `text` of `len` bytes equals the lower-case `lit`, ignoring ASCII case. */
static int same_name(const char *text, Py_ssize_t len, const char *lit)
{
    Py_ssize_t k = 0;
    for (; k < len && lit[k] != '\0'; k++) {
        unsigned char c = (unsigned char)text[k];
        if (c >= 'A' && c <= 'Z')
            c += 'a' - 'A';
        if (c != (unsigned char)lit[k])
            return 0;
    }
    return k == len && lit[k] == '\0';
}

/* RFC 9110's singletons, as gateway/front/head.py's SINGLETONS: a second one is aiohttp's 400. */
static const char *const SINGLETONS[] = {
    "content-length", "content-location", "content-range", "content-type", "etag",
    "host",           "max-forwards",     "server",        "transfer-encoding", "user-agent",
};
#define N_SINGLETONS (sizeof(SINGLETONS) / sizeof(SINGLETONS[0]))

static int singleton(const char *name, Py_ssize_t len)
{
    for (size_t k = 0; k < N_SINGLETONS; k++)
        if (same_name(name, len, SINGLETONS[k]))
            return (int)k;
    return -1;
}

typedef struct {
    const char *name, *value;
    Py_ssize_t name_len, value_len; /* the value without the whitespace around it */
    Py_ssize_t raw_len;             /* without the whitespace before it only (llhttp's) */
} Field;

/* The field line at `at` of `p` (a head of `n` bytes): the index past its CR LF, or -1 when it
 * is not of the plain shape. */
static Py_ssize_t read_field(const char *p, Py_ssize_t at, Py_ssize_t n, Field *f)
{
    Py_ssize_t i = at;
    while (i < n && is_tchar((unsigned char)p[i]))
        i++;
    if (i == at || i >= n || p[i] != ':')
        return -1;
    f->name = p + at;
    f->name_len = i - at;
    i++;
    while (i < n && (p[i] == ' ' || p[i] == '\t'))
        i++;
    Py_ssize_t v = i;
    while (i < n && is_value_char((unsigned char)p[i]))
        i++;
    if (i + 1 >= n || p[i] != '\r' || p[i + 1] != '\n')
        return -1;
    Py_ssize_t e = i;
    while (e > v && (p[e - 1] == ' ' || p[e - 1] == '\t'))
        e--;
    f->value = p + v;
    f->value_len = e - v;
    f->raw_len = i - v;
    return i + 2;
}

/* A Content-Length's digits as a number; -1 when they are not 1 to 18 digits. */
static long long read_length(const Field *f)
{
    if (f->value_len < 1 || f->value_len > 18)
        return -1;
    long long length = 0;
    for (Py_ssize_t k = 0; k < f->value_len; k++) {
        unsigned char c = (unsigned char)f->value[k];
        if (c < '0' || c > '9')
            return -1;
        length = length * 10 + (c - '0');
    }
    return length;
}

/* A Connection field: `keep_alive` cleared by `close`; -1 (leave the head) for a second one
 * or any other value (an upgrade, a list of options: httptools' to read). */
static int read_connection(const Field *f, int *seen, int *keep_alive)
{
    if ((*seen)++)
        return -1;
    if (same_name(f->value, f->value_len, "close"))
        *keep_alive = 0;
    else if (!same_name(f->value, f->value_len, "keep-alive"))
        return -1;
    return 0;
}

/* request_head(head: bytes) -> (path, fields, length, keep_alive) | None
 *
 * `head` ends in its blank line. Taken: `POST <target> HTTP/1.1` and plain field lines with one
 * Content-Length. `path` is the target up to its query (bytes); `fields` the (name, value)
 * pairs in order, the name as sent and the value without the whitespace around it;
 * `keep_alive` False only with `Connection: close`. */
static PyObject *request_head(PyObject *module, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "request_head takes bytes");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n < 9 || memcmp(p + n - 4, "\r\n\r\n", 4) != 0 || memcmp(p, "POST /", 6) != 0)
        Py_RETURN_NONE;
    Py_ssize_t i = 5;
    while (i < n && is_target_char((unsigned char)p[i]))
        i++;
    Py_ssize_t target_end = i, path_end = 5;
    if (target_end - 5 > HEAD_MAX_LINE || n - i < 11 || memcmp(p + i, " HTTP/1.1\r\n", 11) != 0)
        Py_RETURN_NONE;
    while (path_end < target_end && p[path_end] != '?')
        path_end++;
    i += 11;
    PyObject *fields = PyList_New(0);
    if (fields == NULL)
        return NULL;
    long long length = -1;
    int keep_alive = 1, connection = 0, count = 0;
    unsigned seen = 0;
    while (p[i] != '\r') {
        Field f;
        Py_ssize_t next = read_field(p, i, n, &f);
        if (next < 0 || ++count > HEAD_MAX_FIELDS || f.name_len > HEAD_MAX_LINE ||
            f.raw_len > HEAD_MAX_LINE)
            goto leave;
        int s = singleton(f.name, f.name_len);
        if (s >= 0) {
            if (seen & (1u << s))
                goto leave;
            seen |= 1u << s;
        }
        if (same_name(f.name, f.name_len, "content-length")) {
            if ((length = read_length(&f)) < 0)
                goto leave;
        }
        else if (same_name(f.name, f.name_len, "connection")) {
            if (read_connection(&f, &connection, &keep_alive) < 0)
                goto leave;
        }
        else if (same_name(f.name, f.name_len, "transfer-encoding") ||
                 same_name(f.name, f.name_len, "upgrade") ||
                 same_name(f.name, f.name_len, "content-encoding") ||
                 same_name(f.name, f.name_len, "expect") ||
                 same_name(f.name, f.name_len, "origin"))
            goto leave;
        PyObject *name = PyUnicode_DecodeLatin1(f.name, f.name_len, NULL);
        PyObject *value = name == NULL ? NULL : PyUnicode_DecodeLatin1(f.value, f.value_len, NULL);
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (pair == NULL || PyList_Append(fields, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(fields);
            return NULL;
        }
        Py_DECREF(pair);
        i = next;
    }
    if (i + 2 != n || length < 0) /* the blank line ends the head; a Content-Length is in it */
        goto leave;
    return Py_BuildValue("(y#NLO)", p + 5, path_end - 5, fields, length,
                         keep_alive ? Py_True : Py_False);
leave:
    Py_DECREF(fields);
    Py_RETURN_NONE;
}

/* response_head(buf: bytes, end: int) -> (status, headers, keep_alive) | None
 *
 * `buf[:end]` is a response head, ending in its blank line. Taken: `HTTP/1.1 <status>
 * <reason>` with a status of 200 to 599, a body framed by one Content-Length or as chunked, and
 * plain field lines. `headers` holds what the connection keeps of them (connection.py's
 * _HEADERS_READ): content-type, content-length, transfer-encoding, by lower-case name, the
 * value without the whitespace before it; `keep_alive` False only with `Connection: close`. */
static PyObject *response_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "response_head takes bytes and an end");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    const char *p = PyBytes_AS_STRING(args[0]);
    if (n < 17 || n > PyBytes_GET_SIZE(args[0]) || memcmp(p + n - 4, "\r\n\r\n", 4) != 0 ||
        memcmp(p, "HTTP/1.1 ", 9) != 0)
        Py_RETURN_NONE;
    int status = 0;
    for (int k = 9; k < 12; k++) {
        if (p[k] < '0' || p[k] > '9')
            Py_RETURN_NONE;
        status = status * 10 + (p[k] - '0');
    }
    if (status < 200 || status > 599 || p[12] != ' ')
        Py_RETURN_NONE;
    Py_ssize_t i = 13;
    while (i < n && is_value_char((unsigned char)p[i]))
        i++;
    if (i == 13 || p[i] != '\r' || p[i + 1] != '\n')
        Py_RETURN_NONE;
    i += 2;
    PyObject *headers = PyDict_New();
    if (headers == NULL)
        return NULL;
    int keep_alive = 1, connection = 0, length = 0, chunked = 0;
    while (p[i] != '\r') {
        Field f;
        Py_ssize_t next = read_field(p, i, n, &f);
        if (next < 0 || f.raw_len != f.value_len) /* trailing whitespace: httptools' to keep */
            goto leave;
        const char *kept = NULL;
        if (same_name(f.name, f.name_len, "content-length")) {
            if (length++ || read_length(&f) < 0)
                goto leave;
            kept = "content-length";
        }
        else if (same_name(f.name, f.name_len, "transfer-encoding")) {
            if (chunked++ || !same_name(f.value, f.value_len, "chunked"))
                goto leave;
            kept = "transfer-encoding";
        }
        else if (same_name(f.name, f.name_len, "content-type"))
            kept = "content-type";
        else if (same_name(f.name, f.name_len, "connection")) {
            if (read_connection(&f, &connection, &keep_alive) < 0)
                goto leave;
        }
        else if (same_name(f.name, f.name_len, "upgrade") ||
                 same_name(f.name, f.name_len, "content-encoding"))
            goto leave;
        if (kept != NULL) {
            PyObject *key = PyBytes_FromString(kept);
            PyObject *value = key == NULL ? NULL : PyBytes_FromStringAndSize(f.value, f.value_len);
            int failed = value == NULL || PyDict_SetItem(headers, key, value) < 0;
            Py_XDECREF(key);
            Py_XDECREF(value);
            if (failed) {
                Py_DECREF(headers);
                return NULL;
            }
        }
        i = next;
    }
    if (i + 2 != n || length + chunked != 1) /* framed one way: a length, or chunked */
        goto leave;
    return Py_BuildValue("(iNO)", status, headers, keep_alive ? Py_True : Py_False);
leave:
    Py_DECREF(headers);
    Py_RETURN_NONE;
}

static PyMethodDef head_methods[] = {
    {"request_head", (PyCFunction)request_head, METH_O,
     "A request head of the common shape as (path, fields, length, keep_alive), else None."},
    {"response_head", (PyCFunction)(void (*)(void))response_head, METH_FASTCALL,
     "A response head of the common shape as (status, headers, keep_alive), else None."},
    {NULL, NULL, 0, NULL},
};
