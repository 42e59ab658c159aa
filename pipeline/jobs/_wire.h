/* The protobuf primitives of the compiled span export (runwire.jobs._otlp): a growable buffer,
 * varints, length-delimited fields written after one reserved length byte and moved into place
 * when their size is known, and OTLP's AnyValue, KeyValue and Span.Event. Included by _otlp.c
 * (the request writer) and _fold.c (the fold); every function is static to each. */
#ifndef RUNWIRE_WIRE_H
#define RUNWIRE_WIRE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int grow_slow(Buf *b, Py_ssize_t more) {
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

static inline int grow(Buf *b, Py_ssize_t more) {
    return b->len + more <= b->cap ? 0 : grow_slow(b, more);
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

/* the attribute names read off spans and span events, interned once per compilation unit */
static int wire_intern(void) {
    struct { PyObject **slot; const char *name; } interned[] = {
        {&S_trace_id, "trace_id"}, {&S_span_id, "span_id"}, {&S_parent_span_id, "parent_span_id"},
        {&S_name, "name"}, {&S_operation, "operation"}, {&S_start_ns, "start_ns"},
        {&S_end_ns, "end_ns"}, {&S_attributes, "attributes"}, {&S_events, "events"},
        {&S_status, "status"}, {&S_status_message, "status_message"}, {&S_time_ns, "time_ns"},
    };
    for (size_t i = 0; i < sizeof(interned) / sizeof(interned[0]); i++) {
        if (*interned[i].slot == NULL && (*interned[i].slot = PyUnicode_InternFromString(interned[i].name)) == NULL)
            return -1;
    }
    return 0;
}

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

/* Span.Status: its message (if any) and code (1 ok, 2 error) in field 15 */
static int put_status_code(Buf *b, int code, PyObject *message) {
    Py_ssize_t start = open_field(b, 0x7A);
    if (start < 0) return -1;
    if (message != NULL) {
        int truthy = PyObject_IsTrue(message);
        if (truthy < 0 || (truthy && put_string(b, 0x12, message) < 0)) return -1;
    }
    unsigned char out[2] = {0x18, (unsigned char)code};
    if (put(b, out, 2) < 0) return -1;
    return close_field(b, start);
}

#endif
