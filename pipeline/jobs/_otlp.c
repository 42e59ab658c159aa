/* runwire.jobs._otlp: the OTLP/HTTP request writer of runwire.jobs.otlp, compiled.
 *
 * encode_request(spans, resource, version="") -> bytes writes the same bytes as the
 * pure-Python encode_request_python in pipeline/jobs/otlp.py, its twin: tests/jobs/test_otlp_native.py
 * checks the two byte for byte over generated spans, and every other test of the exporter runs
 * on whichever of the two the process loaded (runwire.jobs.otlp says which; RUNWIRE_PURE=1
 * forces the Python one). The message shapes are those of opentelemetry/proto/trace/v1/trace.proto
 * and common/v1/common.proto (1.x); what is written, and in which order, is documented there.
 *
 * A nested message's length precedes it: each is written after one reserved byte, and moved
 * right by the length's extra bytes once its size is known (a span is mostly 128 B - 16 KiB:
 * one move of its bytes by one byte).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int grow(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) {
        if (cap > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); return -1; }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int put(Buf *b, const void *src, Py_ssize_t n) {
    if (grow(b, n) < 0) return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int put_byte(Buf *b, unsigned char c) {
    if (grow(b, 1) < 0) return -1;
    b->data[b->len++] = (char)c;
    return 0;
}

static int put_varint(Buf *b, unsigned long long n) {
    unsigned char out[10];
    int k = 0;
    while (n > 0x7F) {
        out[k++] = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    out[k++] = (unsigned char)n;
    return put(b, out, k);
}

static int put_fixed64(Buf *b, unsigned char tag, unsigned long long n) {
    unsigned char out[9];
    out[0] = tag;
    for (int i = 0; i < 8; i++) out[1 + i] = (unsigned char)(n >> (8 * i));
    return put(b, out, 9);
}

/* Open a length-delimited field: its tag and one reserved length byte; returns where its
 * content starts (close() writes the length there). */
static Py_ssize_t open_field(Buf *b, unsigned char tag) {
    if (put_byte(b, tag) < 0 || put_byte(b, 0) < 0) return -1;
    return b->len;
}

static int close_field(Buf *b, Py_ssize_t start) {
    unsigned long long size = (unsigned long long)(b->len - start);
    unsigned char head[10];
    int k = 0;
    unsigned long long n = size;
    while (n > 0x7F) {
        head[k++] = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    head[k++] = (unsigned char)n;
    if (k > 1) {
        if (grow(b, k - 1) < 0) return -1;
        memmove(b->data + start + k - 1, b->data + start, (size_t)size);
        b->len += k - 1;
    }
    memcpy(b->data + start - 1, head, k);
    return 0;
}

static int put_bytes_field(Buf *b, unsigned char tag, const char *data, Py_ssize_t n) {
    if (put_byte(b, tag) < 0 || put_varint(b, (unsigned long long)n) < 0) return -1;
    return put(b, data, n);
}

static int put_string(Buf *b, unsigned char tag, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "expected a str, got %.100s", Py_TYPE(text)->tp_name);
        return -1;
    }
    Py_ssize_t n;
    const char *data = PyUnicode_AsUTF8AndSize(text, &n);
    if (data == NULL) return -1;
    return put_bytes_field(b, tag, data, n);
}

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
static int put_any_value(Buf *b, PyObject *value, int depth) {
    if (PyUnicode_Check(value)) return put_string(b, 0x0A, value);
    if (PyBool_Check(value)) {
        unsigned char out[2] = {0x10, value == Py_True ? 1 : 0};
        return put(b, out, 2);
    }
    if (PyLong_Check(value)) {
        unsigned long long n = PyLong_AsUnsignedLongLongMask(value);  /* two's complement, mod 2**64 */
        if (n == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        if (put_byte(b, 0x18) < 0) return -1;
        return put_varint(b, n);
    }
    if (PyFloat_Check(value)) {
        double d = PyFloat_AS_DOUBLE(value);
        unsigned char out[9];
        out[0] = 0x21;
        if (PyFloat_Pack8(d, (char *)out + 1, 1) < 0) return -1;
        return put(b, out, 9);
    }
    if (PyList_Check(value) || PyTuple_Check(value)) {
        if (depth > 32) {
            PyErr_SetString(PyExc_ValueError, "an attribute's value nests deeper than 32 lists");
            return -1;
        }
        PyObject *items = PySequence_Fast(value, "a list");
        if (items == NULL) return -1;
        Py_ssize_t array = open_field(b, 0x2A);
        int failed = array < 0;
        Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
        for (Py_ssize_t i = 0; !failed && i < count; i++) {
            Py_ssize_t item = open_field(b, 0x0A);
            failed = item < 0 || put_any_value(b, PySequence_Fast_GET_ITEM(items, i), depth + 1) < 0
                     || close_field(b, item) < 0;
        }
        Py_DECREF(items);
        return failed ? -1 : close_field(b, array);
    }
    PyObject *text = PyObject_Str(value);
    if (text == NULL) return -1;
    int result = put_string(b, 0x0A, text);
    Py_DECREF(text);
    return result;
}

/* one attribute: a KeyValue in field `tag` of the message holding it */
static int put_attribute(Buf *b, unsigned char tag, PyObject *key, PyObject *value) {
    Py_ssize_t pair = open_field(b, tag);
    if (pair < 0 || put_string(b, 0x0A, key) < 0) return -1;
    Py_ssize_t any = open_field(b, 0x12);
    if (any < 0 || put_any_value(b, value, 0) < 0 || close_field(b, any) < 0) return -1;
    return close_field(b, pair);
}

static int put_attributes(Buf *b, unsigned char tag, PyObject *mapping) {
    if (PyDict_Check(mapping)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(mapping, &pos, &key, &value)) {
            Py_INCREF(key);
            Py_INCREF(value);
            int result = put_attribute(b, tag, key, value);
            Py_DECREF(key);
            Py_DECREF(value);
            if (result < 0) return -1;
        }
        return 0;
    }
    PyObject *items = PyMapping_Items(mapping);
    if (items == NULL) return -1;
    int failed = 0;
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "a mapping's items are pairs");
            failed = 1;
        } else {
            failed = put_attribute(b, tag, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1)) < 0;
        }
    }
    Py_DECREF(items);
    return failed ? -1 : 0;
}

static PyObject *S_trace_id, *S_span_id, *S_parent_span_id, *S_name, *S_operation, *S_start_ns,
    *S_end_ns, *S_attributes, *S_events, *S_status, *S_status_message, *S_time_ns;

static int put_u64_of(Buf *b, unsigned char tag, PyObject *number, const char *what) {
    if (number == Py_None) {
        PyErr_Format(PyExc_ValueError, "only ended spans are exported (%s is None)", what);
        return -1;
    }
    unsigned long long n = PyLong_AsUnsignedLongLong(number);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    return put_fixed64(b, tag, n);
}

static int put_event(Buf *b, PyObject *event) {
    PyObject *time_ns = NULL, *name = NULL, *attributes = NULL;
    int failed = 1;
    Py_ssize_t start = open_field(b, 0x5A);
    if (start < 0) return -1;
    if ((time_ns = PyObject_GetAttr(event, S_time_ns)) == NULL) goto done;
    if (put_u64_of(b, 0x09, time_ns, "an event's time_ns") < 0) goto done;
    if ((name = PyObject_GetAttr(event, S_name)) == NULL || put_string(b, 0x12, name) < 0) goto done;
    if ((attributes = PyObject_GetAttr(event, S_attributes)) == NULL) goto done;
    if (put_attributes(b, 0x1A, attributes) < 0) goto done;
    failed = close_field(b, start) < 0;
done:
    Py_XDECREF(time_ns);
    Py_XDECREF(name);
    Py_XDECREF(attributes);
    return failed ? -1 : 0;
}

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
    unsigned char number;
    if (strcmp(code, "ok") == 0) number = 1;
    else if (strcmp(code, "error") == 0) number = 2;
    else {
        PyErr_Format(PyExc_KeyError, "%R", status);
        return -1;
    }
    Py_ssize_t start = open_field(b, 0x7A);
    if (start < 0) return -1;
    int truthy = PyObject_IsTrue(message);
    if (truthy < 0 || (truthy && put_string(b, 0x12, message) < 0)) return -1;
    unsigned char out[2] = {0x18, number};
    if (put(b, out, 2) < 0) return -1;
    return close_field(b, start);
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
        if (put_span(&b, PySequence_Fast_GET_ITEM(items, i)) < 0) goto done;
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

PyMODINIT_FUNC PyInit__otlp(void) {
    struct { PyObject **slot; const char *name; } interned[] = {
        {&S_trace_id, "trace_id"}, {&S_span_id, "span_id"}, {&S_parent_span_id, "parent_span_id"},
        {&S_name, "name"}, {&S_operation, "operation"}, {&S_start_ns, "start_ns"},
        {&S_end_ns, "end_ns"}, {&S_attributes, "attributes"}, {&S_events, "events"},
        {&S_status, "status"}, {&S_status_message, "status_message"}, {&S_time_ns, "time_ns"},
    };
    for (size_t i = 0; i < sizeof(interned) / sizeof(interned[0]); i++) {
        if (*interned[i].slot == NULL && (*interned[i].slot = PyUnicode_InternFromString(interned[i].name)) == NULL)
            return NULL;
    }
    return PyModule_Create(&module);
}
