/* framing.c: an answer's body de-framed, one read at a time: HTTP/1.1 chunked (its sizes,
 * extensions, trailers and their bounds), a Content-Length, or until the close. The body's
 * bytes become spans of the read (no copy); a framing that is not HTTP breaks the body with
 * the reason (`error`), and bytes after the answer's end are junk. Part of relay.c's
 * translation unit (see relay.h).
 */
#include "relay.h"

#define MAX_SIZE_LINE 4096          /* a chunk-size line (digits and extensions) */
#define MAX_HEX_DIGITS 15           /* 2^60 bytes: more is a lie, not a chunk */

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
