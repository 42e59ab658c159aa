/* runwire.jobs._otlp: the OTLP/HTTP request writer of runwire.jobs.otlp, compiled.
 *
 * encode_request(spans, resource, version="") -> bytes writes the same bytes as the
 * pure-Python encode_request_python in pipeline/jobs/otlp.py, its twin: tests/jobs/test_otlp_native.py
 * checks the two byte for byte over generated spans, and every other test of the exporter runs
 * on whichever of the two the process loaded (runwire.jobs.otlp says which; RUNWIRE_PURE=1
 * forces the Python one). The message shapes are those of opentelemetry/proto/trace/v1/trace.proto
 * and common/v1/common.proto (1.x); what is written, and in which order, is documented there.
 *
 * A span is a runwire.jobs.spans.Span, or the bytes of one that the compiled fold (_fold.c,
 * SpanFold) wrote as it ended.
 *
 * A nested message's length precedes it: each is written after one reserved byte, and moved
 * right by the length's extra bytes once its size is known (a span is mostly 128 B - 16 KiB:
 * one move of its bytes by one byte).
 */
#include "_wire.h"

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* tag, length and the bytes of `digits` hex digits (an id: 32 or 16) */
static int put_hex_id(Buf *b, unsigned char tag, PyObject *text, Py_ssize_t digits) {
    Py_ssize_t n;
    const char *hex = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    if (hex == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an id is a str of hex digits");
        return -1;
    }
    if (n != digits) {
        PyErr_Format(PyExc_ValueError, "an id of %zd hex digits, not %zd", digits, n);
        return -1;
    }
    unsigned char out[2 + 16];
    out[0] = tag;
    out[1] = (unsigned char)(digits / 2);
    for (Py_ssize_t i = 0; i < digits / 2; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            PyErr_SetString(PyExc_ValueError, "an id holds a character that is not a hex digit");
            return -1;
        }
        out[2 + i] = (unsigned char)(hi << 4 | lo);
    }
    return put(b, out, 2 + digits / 2);
}

/* an AnyValue's fields (the message's content, without its own head) */
static int put_kind(Buf *b, PyObject *operation) {
    const char *op = PyUnicode_Check(operation) ? PyUnicode_AsUTF8(operation) : NULL;
    if (op == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a span's operation is a str");
        return -1;
    }
    unsigned char kind;
    if (strcmp(op, "invoke_agent") == 0 || strcmp(op, "execute_tool") == 0) kind = 1;  /* INTERNAL */
    else if (strcmp(op, "chat") == 0) kind = 3;  /* CLIENT */
    else {
        PyErr_Format(PyExc_KeyError, "%R", operation);
        return -1;
    }
    unsigned char out[2] = {0x30, kind};
    return put(b, out, 2);
}

static int put_status(Buf *b, PyObject *status, PyObject *message) {
    const char *code = PyUnicode_Check(status) ? PyUnicode_AsUTF8(status) : NULL;
    if (code == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a span's status is a str");
        return -1;
    }
    if (strcmp(code, "unset") == 0) return 0;
    if (strcmp(code, "ok") == 0) return put_status_code(b, 1, message);
    if (strcmp(code, "error") == 0) return put_status_code(b, 2, message);
    PyErr_Format(PyExc_KeyError, "%R", status);
    return -1;
}

static PyObject **const SPAN_FIELDS[] = {
    &S_trace_id, &S_parent_span_id, &S_name, &S_operation, &S_span_id, &S_start_ns, &S_end_ns,
    &S_attributes, &S_events, &S_status, &S_status_message,
};
#define N_SPAN_FIELDS (sizeof(SPAN_FIELDS) / sizeof(SPAN_FIELDS[0]))

static int put_span(Buf *b, PyObject *span) {
    PyObject *f[N_SPAN_FIELDS] = {NULL};
    int failed = 1;
    for (size_t i = 0; i < N_SPAN_FIELDS; i++) {
        if ((f[i] = PyObject_GetAttr(span, *SPAN_FIELDS[i])) == NULL) goto done;
    }
    PyObject *trace = f[0], *parent = f[1], *name = f[2], *operation = f[3], *id = f[4],
             *start_ns = f[5], *end_ns = f[6], *attributes = f[7], *events = f[8],
             *status = f[9], *message = f[10];
    if (end_ns == Py_None) {
        PyErr_SetString(PyExc_ValueError, "only ended spans are exported");
        goto done;
    }
    Py_ssize_t start = open_field(b, 0x12);  /* ScopeSpans.spans */
    if (start < 0 || put_hex_id(b, 0x0A, trace, 32) < 0) goto done;
    int has_parent = PyObject_IsTrue(parent);
    if (has_parent < 0 || (has_parent && put_hex_id(b, 0x22, parent, 16) < 0)) goto done;
    if (put_string(b, 0x2A, name) < 0 || put_kind(b, operation) < 0) goto done;
    if (put_hex_id(b, 0x12, id, 16) < 0) goto done;
    if (put_u64_of(b, 0x39, start_ns, "start_ns") < 0 || put_u64_of(b, 0x41, end_ns, "end_ns") < 0) goto done;
    if (put_attributes(b, 0x4A, attributes) < 0) goto done;
    PyObject *items = PySequence_Fast(events, "a span's events are a list");
    if (items == NULL) goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
        if (put_event(b, PySequence_Fast_GET_ITEM(items, i)) < 0) {
            Py_DECREF(items);
            goto done;
        }
    }
    Py_DECREF(items);
    if (put_status(b, status, message) < 0) goto done;
    failed = close_field(b, start) < 0;
done:
    for (size_t i = 0; i < N_SPAN_FIELDS; i++) Py_XDECREF(f[i]);
    return failed ? -1 : 0;
}

static const char SCHEMA_URL[] = "https://opentelemetry.io/schemas/1.37.0";
static const char SCOPE[] = "runwire";

static PyObject *encode_request(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"spans", "resource", "version", NULL};
    PyObject *spans, *resource, *version = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|U:encode_request", names, &spans, &resource, &version))
        return NULL;
    PyObject *items = PySequence_Fast(spans, "spans are a sequence");
    if (items == NULL) return NULL;
    Buf b = {NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t request = open_field(&b, 0x0A);  /* ExportTraceServiceRequest.resource_spans */
    if (request < 0) goto done;
    Py_ssize_t res = open_field(&b, 0x0A);  /* ResourceSpans.resource */
    if (res < 0 || put_attributes(&b, 0x0A, resource) < 0 || close_field(&b, res) < 0) goto done;
    Py_ssize_t scope_spans = open_field(&b, 0x12);  /* ResourceSpans.scope_spans */
    if (scope_spans < 0) goto done;
    Py_ssize_t scope = open_field(&b, 0x0A);  /* ScopeSpans.scope */
    if (scope < 0 || put_bytes_field(&b, 0x0A, SCOPE, sizeof(SCOPE) - 1) < 0) goto done;
    if (version != NULL && PyUnicode_GET_LENGTH(version) > 0 && put_string(&b, 0x12, version) < 0) goto done;
    if (close_field(&b, scope) < 0) goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
        PyObject *span = PySequence_Fast_GET_ITEM(items, i);
        if (PyBytes_Check(span)) {  /* a span the compiled fold wrote (SpanFold): its message's bytes */
            if (put_bytes_field(&b, 0x12, PyBytes_AS_STRING(span), PyBytes_GET_SIZE(span)) < 0) goto done;
        } else if (put_span(&b, span) < 0) {
            goto done;
        }
    }
    if (put_bytes_field(&b, 0x1A, SCHEMA_URL, sizeof(SCHEMA_URL) - 1) < 0 || close_field(&b, scope_spans) < 0)
        goto done;
    if (put_bytes_field(&b, 0x1A, SCHEMA_URL, sizeof(SCHEMA_URL) - 1) < 0 || close_field(&b, request) < 0)
        goto done;
    result = PyBytes_FromStringAndSize(b.data, b.len);
done:
    Py_DECREF(items);
    PyMem_Free(b.data);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_request", (PyCFunction)(void (*)(void))encode_request, METH_VARARGS | METH_KEYWORDS,
     "encode_request(spans, resource, version='') -> bytes: one ExportTraceServiceRequest, "
     "the same bytes as runwire.jobs.otlp's pure-Python writer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlp", NULL, 0, methods};

int fold_add_type(PyObject *module);  /* _fold.c */

PyMODINIT_FUNC PyInit__otlp(void) {
    if (wire_intern() < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && fold_add_type(m) < 0) Py_CLEAR(m);
    return m;
}
