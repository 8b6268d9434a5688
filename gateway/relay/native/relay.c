/* relay.c: the module gateway.relay.native._relay, the relay's per-read work in one compiled call
 * (gateway/relay/native/__init__.py builds and loads it).
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
 * gateway/relay/tracker.py and pump.py are the reference: what this writes to the client,
 * and what it leaves in the tracker, must be byte for byte what they do
 * (tests/gateway/relay/test_native_relay*.py hold both to it over recorded and generated
 * streams).
 *
 * relay.c is the module: its initialisation, the names it interns (the attributes of the
 * Python objects the relay touches, declared in gateway/relay/native/contract.py) and the objects
 * it takes from orjson and array. It is also the one translation unit, a unity build: it
 * includes the other files, so that their functions stay static and inline across files as
 * they did in one file (gateway/relay/native/__init__.py says why).
 *   relay.h    what the files share: the flags, the Reader, the interned names, the calls
 *   framing.c  the body's HTTP framing (chunked, a length, the close): deframe
 *   events.c   SSE events: cutting them, the tracker's common events and first event, usage
 *   reader.c   the Reader type: feed, relay, attach; the write to the client and its pace
 *   tap.c      the Tap type: the connection's protocol
 *   heads.c    request and response heads of the common shape, read in one call
 */
#include "relay.h"

#include "framing.c"
#include "events.c"
#include "reader.c"
#include "tap.c"
#include "heads.c"

/* tracker.py's _TEMPLATE_KEYS, in its order: what a continuation's chunks take from the
 * answer's first event. */
static const char *const TEMPLATE_KEYS[N_TEMPLATE] = {"id", "object", "created", "model",
                                                      "system_fingerprint"};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.relay.native._relay",
    .m_doc = "The relay's per-read work in one compiled call.",
    .m_size = -1,
    .m_methods = head_methods,
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
