/* runwire.jobs._otlp.SpanFold: runwire.jobs.spans.SpanTree's fold, compiled, for the exporter
 * (and, at the end, runwire.jobs._otlp.Staging: runwire.jobs.staging.Staging, compiled).
 *
 * SpanFold(root_id) folds a root run's stream as SpanTree(root_id, keep=False) does (content off:
 * with the content opt-in the exporter folds with SpanTree), and apply_many(events, past) returns
 * the spans the events ended, each already written as its OTLP Span message's bytes, which
 * runwire.jobs._otlp.encode_request takes as they are. No Span object is made: a span lives
 * here as a C record from the event that opens it to the one that ends it.
 *
 * Its twin is SpanTree: tests/jobs/test_fold_native.py folds generated streams with both, chunk
 * by chunk, and compares the requests written from what each returned, last_seq and is_open.
 * The rarer rules (an agent's name, a failed tool's or run's status message, the approval span
 * events) are the same Python functions of runwire.jobs.spans, called from here; the times are
 * ts_ms's. What is here, rule by rule, is SpanTree.apply_many and what it calls, in its order.
 */
#include "_wire.h"
#include <stdint.h>
#include <structmember.h>

/* ---- what is read from runwire.jobs.spans, once ---- */
static PyObject *T_text, *T_reasoning, *T_extension, *T_tool_start, *T_tool_end, *T_usage, *T_step,
    *T_spawn, *T_lifecycle;
static PyObject *UNSET, *F_ts_ms, *F_agent_name, *F_tool_error, *F_run_error, *F_requested, *F_resolved,
    *F_known, *TERMINAL, *MODEL_KINDS, *TS_CACHE;
static PyObject *A_seq, *A_child_ref, *A_ext, *A_ts, *A_parent_id, *A_thread_id, *A_tenant, *A_payload,
    *A_call_id, *A_tool, *A_ok, *A_error, *A_input_tokens, *A_output_tokens, *A_model, *A_step_kind,
    *A_step_index, *A_child_id, *A_state, *A_reason;
static PyObject *K_op, *K_agent_id, *K_run_id, *K_tenant, *K_agent_name, *K_conversation, *K_tool_name,
    *K_call_id, *K_error_type, *K_step_index, *K_step_kind, *K_input, *K_output, *K_request_model,
    *K_response_model, *K_run_state;
static PyObject *V_invoke_agent, *V_execute_tool, *V_chat, *V_unknown_tool, *V_other, *V_ended_before,
    *V_awaiting, *V_error, *ZERO;

static int intern_all(void) {
    struct { PyObject **slot; const char *text; } names[] = {
        {&A_seq, "seq"}, {&A_child_ref, "child_ref"}, {&A_ext, "ext"}, {&A_ts, "ts"},
        {&A_parent_id, "parent_id"}, {&A_thread_id, "thread_id"}, {&A_tenant, "tenant"},
        {&A_payload, "payload"}, {&A_call_id, "call_id"}, {&A_tool, "tool"}, {&A_ok, "ok"},
        {&A_error, "error"}, {&A_input_tokens, "input_tokens"}, {&A_output_tokens, "output_tokens"},
        {&A_model, "model"}, {&A_step_kind, "step_kind"}, {&A_step_index, "step_index"},
        {&A_child_id, "child_id"}, {&A_state, "state"}, {&A_reason, "reason"},
        {&K_op, "gen_ai.operation.name"}, {&K_agent_id, "gen_ai.agent.id"}, {&K_run_id, "runwire.run_id"},
        {&K_tenant, "runwire.tenant"}, {&K_agent_name, "gen_ai.agent.name"},
        {&K_conversation, "gen_ai.conversation.id"}, {&K_tool_name, "gen_ai.tool.name"},
        {&K_call_id, "gen_ai.tool.call.id"}, {&K_error_type, "error.type"},
        {&K_step_index, "runwire.step.index"}, {&K_step_kind, "runwire.step.kind"},
        {&K_input, "gen_ai.usage.input_tokens"}, {&K_output, "gen_ai.usage.output_tokens"},
        {&K_request_model, "gen_ai.request.model"}, {&K_response_model, "gen_ai.response.model"},
        {&K_run_state, "runwire.run.state"},
        {&V_invoke_agent, "invoke_agent"}, {&V_execute_tool, "execute_tool"}, {&V_chat, "chat"},
        {&V_unknown_tool, "(unknown)"}, {&V_other, "_OTHER"},
        {&V_ended_before, "the run ended before the call did"}, {&V_awaiting, "awaiting_approval"},
        {&V_error, "error"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    }
    return (ZERO = PyLong_FromLong(0)) == NULL ? -1 : 0;
}

static int load_spans_module(void) {
    if (T_text != NULL) return 0;
    PyObject *spans = PyImport_ImportModule("runwire.jobs.spans");
    if (spans == NULL) return -1;
    struct { PyObject **slot; const char *name; } wanted[] = {
        {&T_text, "TextDelta"}, {&T_reasoning, "ReasoningDelta"}, {&T_extension, "Extension"},
        {&T_tool_start, "ToolStart"}, {&T_tool_end, "ToolEnd"}, {&T_usage, "Usage"},
        {&T_step, "StepBoundary"}, {&T_spawn, "ChildSpawn"}, {&T_lifecycle, "RunLifecycle"},
        {&UNSET, "UNSET"}, {&F_ts_ms, "ts_ms"}, {&F_agent_name, "agent_name"}, {&F_tool_error, "tool_error"},
        {&F_run_error, "run_error"}, {&F_requested, "approval_requested"}, {&F_resolved, "approval_resolved"},
        {&F_known, "known"},
        {&TERMINAL, "TERMINAL_STATES"}, {&MODEL_KINDS, "MODEL_STEP_KINDS"},
    };
    int failed = 0;
    for (size_t i = 0; !failed && i < sizeof(wanted) / sizeof(wanted[0]); i++) {
        failed = (*wanted[i].slot = PyObject_GetAttrString(spans, wanted[i].name)) == NULL;
    }
    Py_DECREF(spans);
    if (!failed) {
        PyObject *events = PyImport_ImportModule("runwire.core.events");
        failed = events == NULL || (TS_CACHE = PyObject_GetAttrString(events, "_TS_CACHE")) == NULL
                 || !PyDict_CheckExact(TS_CACHE);
        Py_XDECREF(events);
        if (failed && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "runwire.core.events._TS_CACHE is a dict");
    }
    if (failed) {
        T_text = NULL;
        return -1;
    }
    return 0;
}

/* ---- reading an event's fields: straight from a msgspec struct's slot ----
 * A field of an event or payload (a msgspec Struct) is a member descriptor over an object slot:
 * its offset, looked up once per (type, name) and kept, reads it as PyObject_GetAttr would,
 * without the lookup through the type's MRO on every read. Anything else (a type with its own
 * __getattribute__, an attribute that is not such a slot, an empty slot) is read by GetAttr. */
typedef struct { PyTypeObject *type; PyObject *name; Py_ssize_t offset; } Slot;
static Slot SLOTS[512];

static PyObject *get(PyObject *obj, PyObject *name) {
    PyTypeObject *t = Py_TYPE(obj);
    Slot *e = &SLOTS[(((uintptr_t)t >> 4) * 31 + ((uintptr_t)name >> 4)) & 511];
    if (e->type != t || e->name != name) {
        Py_ssize_t offset = -1;
        PyObject *d = t->tp_getattro == PyObject_GenericGetAttr ? _PyType_Lookup(t, name) : NULL;
        if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX) offset = m->offset;
        }
        Py_INCREF(t);  /* kept while its entry is: an address reused by another type never matches */
        Py_XDECREF(e->type);
        e->type = t, e->name = name, e->offset = offset;
    }
    if (e->offset >= 0) {
        PyObject *value = *(PyObject **)((char *)obj + e->offset);
        if (value != NULL) return Py_NewRef(value);
    }
    return PyObject_GetAttr(obj, name);
}

/* ---- SHA-256 (FIPS 180-4), for span ids: the root's part absorbed once, a copy per span ---- */
typedef struct {
    uint32_t h[8];
    unsigned char block[64];
    uint64_t length;  /* bytes absorbed */
} Sha;

static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(Sha *c, const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + SHA_K[i] + w[i];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g, g = f, f = e, e = d + t1, d = cc, cc = b, b = a, a = t1 + t2;
    }
    c->h[0] += a, c->h[1] += b, c->h[2] += cc, c->h[3] += d, c->h[4] += e, c->h[5] += f, c->h[6] += g, c->h[7] += h;
}

/* The same compression with the x86 SHA extensions (SHA-NI), where the CPU has them: a block in
 * ~10 % of the instructions. Chosen once (cpuid); the plain one above otherwise, or if told
 * (_otlp._sha_accelerated(False): the tests run both). */
static void (*sha_compress)(Sha *, const unsigned char *) = sha_block;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>

__attribute__((target("sha,sse4.1,ssse3")))
static void sha_block_ni(Sha *c, const unsigned char *p) {
    const __m128i order = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i t = _mm_loadu_si128((const __m128i *)&c->h[0]);       /* a b c d, lane 0 first */
    __m128i s1 = _mm_loadu_si128((const __m128i *)&c->h[4]);      /* e f g h */
    t = _mm_shuffle_epi32(t, 0xB1);
    s1 = _mm_shuffle_epi32(s1, 0x1B);
    __m128i s0 = _mm_alignr_epi8(t, s1, 8);                        /* ABEF */
    s1 = _mm_blend_epi16(s1, t, 0xF0);                             /* CDGH */
    __m128i abef = s0, cdgh = s1, w[4];
    for (int g = 0; g < 16; g++) {
        __m128i group;
        if (g < 4) {
            group = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), order);
        } else {  /* W[t..t+3] from W[t-16..t-1]: the ring holds the last four groups */
            __m128i x = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
            x = _mm_add_epi32(x, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
            group = _mm_sha256msg2_epu32(x, w[(g + 3) & 3]);
        }
        w[g & 3] = group;
        __m128i m = _mm_add_epi32(group, _mm_loadu_si128((const __m128i *)&SHA_K[4 * g]));
        s1 = _mm_sha256rnds2_epu32(s1, s0, m);
        s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E));
    }
    s0 = _mm_add_epi32(s0, abef);
    s1 = _mm_add_epi32(s1, cdgh);
    t = _mm_shuffle_epi32(s0, 0x1B);                               /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);                              /* DCHG */
    s0 = _mm_blend_epi16(t, s1, 0xF0);                             /* DCBA */
    s1 = _mm_alignr_epi8(s1, t, 8);                                /* HGFE */
    _mm_storeu_si128((__m128i *)&c->h[0], s0);
    _mm_storeu_si128((__m128i *)&c->h[4], s1);
}

static int sha_ni_present(void) {
    unsigned int a, b, cc, d;
    if (!__get_cpuid(1, &a, &b, &cc, &d) || !(cc & (1u << 19)) || !(cc & (1u << 9))) return 0;  /* SSE4.1, SSSE3 */
    return __get_cpuid_count(7, 0, &a, &b, &cc, &d) && (b & (1u << 29));                        /* SHA */
}
#else
static void sha_block_ni(Sha *c, const unsigned char *p) { sha_block(c, p); }
static int sha_ni_present(void) { return 0; }
#endif

static void sha_init(Sha *c) {
    static const uint32_t start[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, start, sizeof(start));
    c->length = 0;
}

static void sha_update(Sha *c, const unsigned char *data, size_t n) {
    size_t used = (size_t)(c->length % 64);
    c->length += n;
    if (used) {
        size_t take = 64 - used < n ? 64 - used : n;
        memcpy(c->block + used, data, take);
        data += take, n -= take, used += take;
        if (used < 64) return;
        sha_compress(c, c->block);
    }
    for (; n >= 64; data += 64, n -= 64) sha_compress(c, data);
    memcpy(c->block, data, n);
}

static void sha_final(Sha *c, unsigned char out[32]) {
    uint64_t bits = c->length * 8;
    unsigned char pad[72] = {0x80};
    size_t used = (size_t)(c->length % 64), n = (used < 56 ? 56 : 120) - used;
    for (int i = 0; i < 8; i++) pad[n + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_update(c, pad, n + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24), out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8), out[4 * i + 3] = (unsigned char)c->h[i];
    }
}

/* ---- a span's attributes, in the order they were first set (a dict's) ---- */
typedef struct { PyObject *key, *value; } Attr;
typedef struct { Attr *items; int n, cap; } Attrs;

static int attrs_set(Attrs *a, PyObject *key, PyObject *value) {  /* keys: the interned K_* */
    for (int i = 0; i < a->n; i++) {
        if (a->items[i].key == key) {
            Py_INCREF(value);
            Py_SETREF(a->items[i].value, value);
            return 0;
        }
    }
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 8;
        Attr *items = PyMem_Realloc(a->items, sizeof(Attr) * cap);
        if (items == NULL) { PyErr_NoMemory(); return -1; }
        a->items = items;
        a->cap = cap;
    }
    Py_INCREF(key);
    Py_INCREF(value);
    a->items[a->n++] = (Attr){key, value};
    return 0;
}

static int attrs_has(Attrs *a, PyObject *key) {
    for (int i = 0; i < a->n; i++) if (a->items[i].key == key) return 1;
    return 0;
}

/* ---- a span, from the event that opens it to the one that ends it ---- */
typedef struct {
    unsigned char id[8], parent[8];
    int has_parent, kind;  /* kind: 1 INTERNAL, 3 CLIENT */
    PyObject *name, *message, *events;  /* message and events: NULL until set */
    long long start_ns, end_ns, end_seq;
    int error;
    Attrs attrs;
} Rec;

static void rec_clear(Rec *r) {
    Py_CLEAR(r->name);
    Py_CLEAR(r->message);
    Py_CLEAR(r->events);
    for (int i = 0; i < r->attrs.n; i++) {
        Py_DECREF(r->attrs.items[i].key);
        Py_DECREF(r->attrs.items[i].value);
    }
    PyMem_Free(r->attrs.items);
    r->attrs = (Attrs){NULL, 0, 0};
}

typedef struct Run Run;
struct Run {
    Rec span;
    PyObject *run_id;
    Run *parent;
    Run **children;
    int n_children, cap_children;
    PyObject **tool_ids;  /* open tool calls: call_id -> span, in the order they opened */
    Rec **tools;
    int n_tools, cap_tools;
    long long step_start;
    PyObject *usage;  /* the x.usage events of the step so far: a list, or NULL */
    long long chats;
    PyObject *awaiting;  /* the approval's SpanEvent while the run waits, else NULL */
};

typedef struct {
    PyObject_HEAD
    PyObject *root_id, *runs, *done, *ended;
    Sha ids;  /* fed "runwire span\\0{root_id}\\0": a copy of it per span id (SpanTree._ids) */
    Buf out;  /* a span's bytes while written (kept: no allocation per span) */
    unsigned char trace[16];
    long long last_seq;
    int emit;
} Fold;

static Run *run_of(Fold *f, PyObject *run_id) {
    PyObject *capsule = PyDict_GetItemWithError(f->runs, run_id);
    return capsule == NULL ? NULL : PyCapsule_GetPointer(capsule, NULL);
}

/* SpanTree._id: a copy of the root's hash fed "kind\0a" (and "\0b", or "\0" and a count) */
static int span_id(Fold *f, unsigned char out[8], const char *kind, PyObject *a, PyObject *b, long long n) {
    Sha c = f->ids;
    Py_ssize_t size;
    sha_update(&c, (const unsigned char *)kind, strlen(kind) + 1);
    const char *text = PyUnicode_AsUTF8AndSize(a, &size);
    if (text == NULL) return -1;
    sha_update(&c, (const unsigned char *)text, (size_t)size);
    if (b != NULL) {
        if ((text = PyUnicode_AsUTF8AndSize(b, &size)) == NULL) return -1;
        sha_update(&c, (const unsigned char *)"", 1);
        sha_update(&c, (const unsigned char *)text, (size_t)size);
    }
    if (n >= 0) {  /* "\0" and n in decimal (str(n)), written backwards from the end */
        unsigned char digits[24];
        int k = (int)sizeof(digits);
        do digits[--k] = (unsigned char)('0' + n % 10); while ((n /= 10) > 0);
        digits[--k] = 0;
        sha_update(&c, digits + k, sizeof(digits) - (size_t)k);
    }
    unsigned char digest[32];
    sha_final(&c, digest);
    memcpy(out, digest, 8);
    return 0;
}

/* ---- a span ended: its Span message's bytes, returned if past the caller's cursor ---- */
static int put_time(Buf *b, unsigned char tag, long long ns) {
    if (ns < 0) {
        PyErr_SetString(PyExc_OverflowError, "a span's time is before 1970");
        return -1;
    }
    return put_fixed64(b, tag, (unsigned long long)ns);
}

static int emit(Fold *f, Rec *r) {
    if (!f->emit) return 0;
    Buf b = f->out;
    b.len = 0;
    unsigned char head[2 + 16];
    head[0] = 0x0A, head[1] = 0x10;
    memcpy(head + 2, f->trace, 16);
    int failed = put(&b, head, 18) < 0;
    if (!failed && r->has_parent) {
        head[0] = 0x22, head[1] = 0x08;
        memcpy(head + 2, r->parent, 8);
        failed = put(&b, head, 10) < 0;
    }
    if (!failed) {
        unsigned char kind[2] = {0x30, (unsigned char)r->kind};
        failed = put_string(&b, 0x2A, r->name) < 0 || put(&b, kind, 2) < 0;
    }
    if (!failed) {
        head[0] = 0x12, head[1] = 0x08;
        memcpy(head + 2, r->id, 8);
        failed = put(&b, head, 10) < 0 || put_time(&b, 0x39, r->start_ns) < 0 || put_time(&b, 0x41, r->end_ns) < 0;
    }
    for (int i = 0; !failed && i < r->attrs.n; i++)
        failed = put_attribute(&b, 0x4A, r->attrs.items[i].key, r->attrs.items[i].value) < 0;
    if (!failed && r->events != NULL) {
        for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(r->events); i++)
            failed = put_event(&b, PyList_GET_ITEM(r->events, i)) < 0;
    }
    if (!failed && r->error) failed = put_status_code(&b, 2, r->message) < 0;
    PyObject *bytes = failed ? NULL : PyBytes_FromStringAndSize(b.data, b.len);
    if (b.cap > (1 << 16)) {  /* a span with long content: the buffer is not kept that large */
        PyMem_Free(b.data);
        b = (Buf){NULL, 0, 0};
    }
    f->out = b;
    if (bytes == NULL) return -1;
    int result = PyList_Append(f->ended, bytes);
    Py_DECREF(bytes);
    return result;
}

/* SpanTree._end */
static int end_span(Fold *f, Rec *r, long long seq, long long at) {
    r->end_ns = at > r->start_ns ? at : r->start_ns;
    r->end_seq = seq;
    return emit(f, r);
}

static int set_error(Rec *r, PyObject *message, PyObject *type) {
    r->error = 1;
    Py_INCREF(message);
    Py_XSETREF(r->message, message);
    return attrs_set(&r->attrs, K_error_type, type);
}

/* ---- runs ---- */
static int push_child(Run *parent, Run *child) {
    if (parent->n_children == parent->cap_children) {
        int cap = parent->cap_children ? parent->cap_children * 2 : 4;
        Run **children = PyMem_Realloc(parent->children, sizeof(Run *) * cap);
        if (children == NULL) { PyErr_NoMemory(); return -1; }
        parent->children = children;
        parent->cap_children = cap;
    }
    parent->children[parent->n_children++] = child;
    return 0;
}

static void drop_child(Run *parent, Run *child) {
    for (int i = 0; i < parent->n_children; i++) {
        if (parent->children[i] == child) {
            memmove(parent->children + i, parent->children + i + 1, sizeof(Run *) * (parent->n_children - i - 1));
            parent->n_children--;
            return;
        }
    }
}

static void free_tool(Rec *r) {
    rec_clear(r);
    PyMem_Free(r);
}

static void free_run(Run *run) {
    rec_clear(&run->span);
    for (int i = 0; i < run->n_tools; i++) {
        Py_DECREF(run->tool_ids[i]);
        free_tool(run->tools[i]);
    }
    PyMem_Free(run->tool_ids);
    PyMem_Free(run->tools);
    PyMem_Free(run->children);
    Py_XDECREF(run->run_id);
    Py_XDECREF(run->usage);
    Py_XDECREF(run->awaiting);
    PyMem_Free(run);
}

static int is_under(Run *run, Run *ancestor) {
    for (Run *above = run->parent; above != NULL; above = above->parent) if (above == ancestor) return 1;
    return 0;
}

static int equal(PyObject *a, PyObject *b) {
    return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
}

/* SpanTree._adopt */
static int adopt(Fold *f, Run *run, PyObject *parent_id) {
    Run *parent = run_of(f, parent_id);
    if (parent == NULL) return PyErr_Occurred() ? -1 : 0;
    if (parent == run || is_under(parent, run)) return 0;
    if (run->parent != NULL) drop_child(run->parent, run);
    run->parent = parent;
    if (push_child(parent, run) < 0) return -1;
    memcpy(run->span.parent, parent->span.id, 8);
    run->span.has_parent = 1;
    return 0;
}

/* SpanTree._run: the run's record, opened if new (and its root's, if that is not open); NULL and
 * no error for a run whose span ended */
static Run *open_run(Fold *f, PyObject *run_id, PyObject *parent_id, PyObject *event, long long at) {
    Run *run = run_of(f, run_id);
    if (run == NULL && PyErr_Occurred()) return NULL;
    if (run != NULL) {
        if (parent_id != NULL) {
            int moved = run->parent == NULL ? 1 : !equal(run->parent->run_id, parent_id);
            int is_root = equal(run_id, f->root_id);
            if (moved < 0 || is_root < 0) return NULL;
            if (moved && !is_root && adopt(f, run, parent_id) < 0) return NULL;
        }
        if (at < run->span.start_ns) run->span.start_ns = at;
        return run;
    }
    int done = PySet_Contains(f->done, run_id);
    if (done != 0) return NULL;  /* an event after the run's end (or an error) */
    Run *parent = NULL;
    int is_root = equal(run_id, f->root_id);
    if (is_root < 0) return NULL;
    if (!is_root) {
        int named = parent_id == NULL ? 0 : PyObject_IsTrue(parent_id);  /* parent_id or root_id */
        if (named < 0) return NULL;
        parent = run_of(f, named ? parent_id : f->root_id);
        if (parent == NULL) {
            if (PyErr_Occurred()) return NULL;
            parent = open_run(f, f->root_id, NULL, event, at);
            if (parent == NULL && PyErr_Occurred()) return NULL;
        }
    }
    PyObject *tenant = get(event, A_tenant);
    if (tenant == NULL) return NULL;
    int has_tenant = PyObject_IsTrue(tenant);
    run = PyMem_Calloc(1, sizeof(Run));
    if (run == NULL) {
        Py_DECREF(tenant);
        PyErr_NoMemory();
        return NULL;
    }
    Py_INCREF(run_id);
    run->run_id = run_id;
    run->parent = parent;
    run->span.kind = 1;
    run->span.start_ns = run->step_start = at;
    Py_INCREF(V_invoke_agent);
    run->span.name = V_invoke_agent;
    int failed = has_tenant < 0 || attrs_set(&run->span.attrs, K_op, V_invoke_agent) < 0
                 || attrs_set(&run->span.attrs, K_agent_id, run_id) < 0
                 || attrs_set(&run->span.attrs, K_run_id, run_id) < 0
                 || (has_tenant && attrs_set(&run->span.attrs, K_tenant, tenant) < 0)
                 || span_id(f, run->span.id, "agent", run_id, NULL, -1) < 0;
    Py_DECREF(tenant);
    if (!failed && parent != NULL) {
        memcpy(run->span.parent, parent->span.id, 8);
        run->span.has_parent = 1;
    }
    PyObject *capsule = failed ? NULL : PyCapsule_New(run, NULL, NULL);
    if (capsule == NULL || PyDict_SetItem(f->runs, run_id, capsule) < 0) {
        Py_XDECREF(capsule);
        free_run(run);
        return NULL;
    }
    Py_DECREF(capsule);
    if (parent != NULL && push_child(parent, run) < 0) return NULL;
    return run;
}

/* SpanTree._name */
static int name_run(Run *run, PyObject *event, PyObject *ext, PyObject *thread) {  /* thread: NULL if not read yet */
    if (ext != Py_None) {
        PyObject *name = PyObject_CallOneArg(F_agent_name, ext);
        if (name == NULL) return -1;
        if (name != Py_None) {
            PyObject *span_name = PyUnicode_FromFormat("invoke_agent %U", name);
            int failed = span_name == NULL || attrs_set(&run->span.attrs, K_agent_name, name) < 0;
            if (span_name != NULL) Py_SETREF(run->span.name, span_name);
            if (failed) {
                Py_DECREF(name);
                return -1;
            }
        }
        Py_DECREF(name);
    }
    thread = thread != NULL ? Py_NewRef(thread) : get(event, A_thread_id);
    if (thread == NULL) return -1;
    int truthy = PyObject_IsTrue(thread);
    int failed = truthy < 0 || (truthy && !attrs_has(&run->span.attrs, K_conversation)
                                && attrs_set(&run->span.attrs, K_conversation, thread) < 0);
    Py_DECREF(thread);
    return failed ? -1 : 0;
}

/* A span's name "{prefix} {value}" (SpanTree's f"execute_tool {tool}", f"chat {model}"), made
 * once per tool or model name, which repeat: a dict per prefix, emptied when it holds NAMES_MAX
 * (a bound, whatever names a publisher sends). Only an exact str is kept (its str() is itself). */
#define NAMES_MAX 1024
static PyObject *TOOL_NAMES, *CHAT_NAMES;

static PyObject *span_name(PyObject *names, const char *format, PyObject *value) {
    int exact = PyUnicode_CheckExact(value);
    if (exact) {
        PyObject *known = PyDict_GetItemWithError(names, value);
        if (known != NULL) return Py_NewRef(known);
        if (PyErr_Occurred()) return NULL;
    }
    PyObject *name = PyUnicode_FromFormat(format, value);
    if (name != NULL && exact) {
        if (PyDict_GET_SIZE(names) >= NAMES_MAX) PyDict_Clear(names);
        if (PyDict_SetItem(names, value, name) < 0) Py_CLEAR(name);
    }
    return name;
}

/* ---- what each event type does (SpanTree._HANDLERS) ---- */

/* SpanTree._open_tool */
static Rec *open_tool(Fold *f, Run *run, PyObject *call_id, PyObject *tool, long long at) {
    Rec *r = PyMem_Calloc(1, sizeof(Rec));
    if (r == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    r->kind = 1;
    r->start_ns = at;
    r->has_parent = 1;
    memcpy(r->parent, run->span.id, 8);
    if ((r->name = span_name(TOOL_NAMES, "execute_tool %S", tool)) == NULL
            || attrs_set(&r->attrs, K_op, V_execute_tool) < 0 || attrs_set(&r->attrs, K_tool_name, tool) < 0
            || attrs_set(&r->attrs, K_call_id, call_id) < 0 || attrs_set(&r->attrs, K_run_id, run->run_id) < 0
            || span_id(f, r->id, "tool", run->run_id, call_id, -1) < 0) {
        free_tool(r);
        return NULL;
    }
    for (int i = 0; i < run->n_tools; i++) {  /* a call id open already: its span is replaced */
        int same = equal(run->tool_ids[i], call_id);
        if (same < 0) {
            free_tool(r);
            return NULL;
        }
        if (same) {
            free_tool(run->tools[i]);
            run->tools[i] = r;
            return r;
        }
    }
    if (run->n_tools == run->cap_tools) {
        int cap = run->cap_tools ? run->cap_tools * 2 : 4;
        PyObject **ids = PyMem_Realloc(run->tool_ids, sizeof(PyObject *) * cap);
        if (ids != NULL) run->tool_ids = ids;
        Rec **tools = ids == NULL ? NULL : PyMem_Realloc(run->tools, sizeof(Rec *) * cap);
        if (tools == NULL) {
            free_tool(r);
            PyErr_NoMemory();
            return NULL;
        }
        run->tools = tools;
        run->cap_tools = cap;
    }
    Py_INCREF(call_id);
    run->tool_ids[run->n_tools] = call_id;
    run->tools[run->n_tools++] = r;
    return r;
}

/* the open call's span, taken out of the run's (NULL and no error: none open) */
static Rec *pop_tool(Run *run, PyObject *call_id) {
    for (int i = 0; i < run->n_tools; i++) {
        int same = equal(run->tool_ids[i], call_id);
        if (same < 0) return NULL;
        if (same) {
            Rec *r = run->tools[i];
            Py_DECREF(run->tool_ids[i]);
            memmove(run->tool_ids + i, run->tool_ids + i + 1, sizeof(PyObject *) * (run->n_tools - i - 1));
            memmove(run->tools + i, run->tools + i + 1, sizeof(Rec *) * (run->n_tools - i - 1));
            run->n_tools--;
            return r;
        }
    }
    return NULL;
}

static PyObject *field(PyObject *event, PyObject *name) {  /* payload.name */
    PyObject *payload = get(event, A_payload);
    if (payload == NULL) return NULL;
    PyObject *value = get(payload, name);
    Py_DECREF(payload);
    return value;
}

static int tool_start(Fold *f, Run *run, PyObject *event, long long seq, long long at) {
    (void)seq;
    PyObject *call_id = field(event, A_call_id), *tool = call_id == NULL ? NULL : field(event, A_tool);
    Rec *r = tool == NULL ? NULL : open_tool(f, run, call_id, tool, at);
    Py_XDECREF(call_id);
    Py_XDECREF(tool);
    return r == NULL ? -1 : 0;
}

static int tool_end(Fold *f, Run *run, PyObject *event, long long seq, long long at) {
    PyObject *call_id = field(event, A_call_id), *ok = NULL, *failure = NULL;
    if (call_id == NULL) return -1;
    Rec *r = pop_tool(run, call_id);
    if (r == NULL && !PyErr_Occurred()) {  /* its start is not in the stream: an end alone */
        r = open_tool(f, run, call_id, V_unknown_tool, at) != NULL ? pop_tool(run, call_id) : NULL;
    }
    Py_DECREF(call_id);
    if (r == NULL) return -1;
    int failed = (ok = field(event, A_ok)) == NULL;
    int good = failed ? 0 : PyObject_IsTrue(ok);
    failed = failed || good < 0;
    if (!failed && !good) {
        PyObject *error = field(event, A_error);
        failure = error == NULL ? NULL : PyObject_CallOneArg(F_tool_error, error);
        Py_XDECREF(error);
        failed = failure == NULL || !PyTuple_Check(failure) || PyTuple_GET_SIZE(failure) != 2
                 || set_error(r, PyTuple_GET_ITEM(failure, 0), PyTuple_GET_ITEM(failure, 1)) < 0;
    }
    Py_XDECREF(ok);
    Py_XDECREF(failure);
    failed = failed || end_span(f, r, seq, at) < 0;
    free_tool(r);
    if (failed) return -1;
    if (at > run->step_start) run->step_start = at;
    return 0;
}

static int usage(Fold *f, Run *run, PyObject *event, long long seq, long long at) {
    (void)f, (void)seq, (void)at;
    if (run->usage == NULL && (run->usage = PyList_New(0)) == NULL) return -1;
    return PyList_Append(run->usage, event);
}

static int spawn(Fold *f, Run *run, PyObject *event, long long seq, long long at) {
    (void)seq;
    PyObject *child_id = field(event, A_child_id);
    if (child_id == NULL) return -1;
    Run *child = open_run(f, child_id, run->run_id, event, at);
    Py_DECREF(child_id);
    return child == NULL && PyErr_Occurred() ? -1 : 0;
}

/* the sum of one field of the usage events' payloads */
static PyObject *usage_sum(PyObject *events, PyObject *name) {
    Py_INCREF(ZERO);
    PyObject *total = ZERO;
    for (Py_ssize_t i = 0; total != NULL && i < PyList_GET_SIZE(events); i++) {
        PyObject *value = field(PyList_GET_ITEM(events, i), name);
        PyObject *sum = value == NULL ? NULL : PyNumber_Add(total, value);
        Py_XDECREF(value);
        Py_SETREF(total, sum);
    }
    return total;
}

/* SpanTree._chat: a model step's span, ended at its boundary */
static int chat(Fold *f, Run *run, PyObject *event, long long seq, long long at) {
    Rec r = {0};
    r.kind = 3;
    r.start_ns = run->step_start > at ? at : run->step_start;
    r.has_parent = 1;
    memcpy(r.parent, run->span.id, 8);
    PyObject *index = field(event, A_step_index), *kind = NULL, *model = NULL, *in = NULL, *out = NULL;
    int failed = index == NULL || (kind = field(event, A_step_kind)) == NULL
                 || attrs_set(&r.attrs, K_op, V_chat) < 0 || attrs_set(&r.attrs, K_run_id, run->run_id) < 0
                 || attrs_set(&r.attrs, K_step_index, index) < 0 || attrs_set(&r.attrs, K_step_kind, kind) < 0;
    Py_ssize_t count = run->usage == NULL ? 0 : PyList_GET_SIZE(run->usage);
    if (!failed && count == 1) {
        PyObject *only = PyList_GET_ITEM(run->usage, 0);
        failed = (in = field(only, A_input_tokens)) == NULL || (out = field(only, A_output_tokens)) == NULL
                 || (model = field(only, A_model)) == NULL;
        if (!failed && model == UNSET) Py_SETREF(model, Py_NewRef(Py_None));
    } else if (!failed && count > 1) {
        failed = (in = usage_sum(run->usage, A_input_tokens)) == NULL
                 || (out = usage_sum(run->usage, A_output_tokens)) == NULL;
        for (Py_ssize_t i = count - 1; !failed && model == NULL && i >= 0; i--) {
            PyObject *value = field(PyList_GET_ITEM(run->usage, i), A_model);
            PyObject *known = value == NULL ? NULL : PyObject_CallOneArg(F_known, value);
            Py_XDECREF(value);
            int truthy = known == NULL ? -1 : PyObject_IsTrue(known);
            if (truthy > 0) model = known;
            else Py_XDECREF(known);
            failed = truthy < 0;
        }
    }
    if (!failed && count > 0) failed = attrs_set(&r.attrs, K_input, in) < 0 || attrs_set(&r.attrs, K_output, out) < 0;
    int named = failed || model == NULL ? 0 : PyObject_IsTrue(model);
    failed = failed || named < 0;
    if (!failed && named) failed = attrs_set(&r.attrs, K_request_model, model) < 0
                                   || attrs_set(&r.attrs, K_response_model, model) < 0;
    if (!failed) failed = span_id(f, r.id, "chat", run->run_id, NULL, run->chats) < 0;
    if (!failed) failed = (r.name = named ? span_name(CHAT_NAMES, "chat %S", model) : Py_NewRef(V_chat)) == NULL;
    Py_XDECREF(index);
    Py_XDECREF(kind);
    Py_XDECREF(model);
    Py_XDECREF(in);
    Py_XDECREF(out);
    if (!failed) {
        run->chats++;
        r.end_ns = at;
        r.end_seq = seq;
        failed = emit(f, &r) < 0;
    }
    rec_clear(&r);
    return failed ? -1 : 0;
}

static int step(Fold *f, Run *run, PyObject *event, long long seq, long long at) {
    PyObject *kind = field(event, A_step_kind);
    if (kind == NULL) return -1;
    int model = PySet_Contains(MODEL_KINDS, kind);
    Py_DECREF(kind);
    if (model < 0) return -1;
    int used = run->usage != NULL && PyList_GET_SIZE(run->usage) > 0;
    if ((model || used) && chat(f, run, event, seq, at) < 0) return -1;
    run->step_start = at;
    Py_CLEAR(run->usage);
    return 0;
}

/* SpanTree._end_run: a run with nothing open under it ends: its open calls, its usage, its span */
static int end_run(Fold *f, Run *run, long long seq, long long at) {
    for (int i = 0; i < run->n_tools; i++) {
        Rec *r = run->tools[i];
        if (set_error(r, V_ended_before, V_other) < 0 || end_span(f, r, seq, at) < 0) return -1;
    }
    for (int i = 0; i < run->n_tools; i++) {
        Py_DECREF(run->tool_ids[i]);
        free_tool(run->tools[i]);
    }
    run->n_tools = 0;
    if (run->usage != NULL && PyList_GET_SIZE(run->usage) > 0) {
        PyObject *in = usage_sum(run->usage, A_input_tokens), *out = in == NULL ? NULL : usage_sum(run->usage, A_output_tokens);
        int zero_in = out == NULL ? -1 : PyObject_RichCompareBool(in, ZERO, Py_EQ);
        int zero_out = zero_in < 0 ? -1 : PyObject_RichCompareBool(out, ZERO, Py_EQ);
        int failed = zero_out < 0 || (!(zero_in && zero_out) && (attrs_set(&run->span.attrs, K_input, in) < 0
                                                                 || attrs_set(&run->span.attrs, K_output, out) < 0));
        Py_XDECREF(in);
        Py_XDECREF(out);
        if (failed) return -1;
    }
    if (run->parent != NULL) {
        drop_child(run->parent, run);
        if (at > run->parent->step_start) run->parent->step_start = at;
    }
    if (PySet_Add(f->done, run->run_id) < 0) return -1;
    int failed = end_span(f, &run->span, seq, at) < 0;
    if (PyDict_DelItem(f->runs, run->run_id) < 0) failed = 1;  /* the capsule only: the run is freed here */
    for (int i = 0; i < run->n_children; i++) run->children[i]->parent = NULL;
    free_run(run);
    return failed ? -1 : 0;
}

/* SpanTree._close: a run's span ends, and first whatever is still open under it, the deepest
 * first; a stack of its own, not the C stack (a chain of sub-runs is as deep as a stream makes it) */
static int close_run(Fold *f, Run *run, long long seq, long long at) {
    Py_ssize_t depth = 1, cap = 16;
    Run **stack = PyMem_Malloc(sizeof(Run *) * cap);
    if (stack == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    stack[0] = run;
    int failed = 0;
    while (!failed && depth > 0) {
        Run *top = stack[depth - 1];
        if (top->n_children > 0) {  /* its end takes it out of its parent's list */
            if (depth == cap) {
                Run **more = PyMem_Realloc(stack, sizeof(Run *) * cap * 2);
                if (more == NULL) {
                    PyErr_NoMemory();
                    failed = 1;
                    break;
                }
                stack = more;
                cap *= 2;
            }
            stack[depth++] = top->children[0];
        } else {
            depth--;
            failed = end_run(f, top, seq, at) < 0;
        }
    }
    PyMem_Free(stack);
    return failed ? -1 : 0;
}

/* SpanTree._lifecycle */
static int lifecycle(Fold *f, Run *run, PyObject *event, long long seq, long long at) {
    PyObject *state = field(event, A_state), *when = NULL;
    if (state == NULL) return -1;
    int waiting = equal(state, V_awaiting), failed = waiting < 0;
    if (!failed && (run->awaiting != NULL && !waiting) | (waiting && run->awaiting == NULL))
        failed = (when = PyLong_FromLongLong(at)) == NULL;
    if (!failed && run->awaiting != NULL && !waiting) {
        PyObject *resolved = PyObject_CallFunctionObjArgs(F_resolved, event, when, run->awaiting, NULL);
        failed = resolved == NULL || (run->span.events == NULL && (run->span.events = PyList_New(0)) == NULL)
                 || PyList_Append(run->span.events, resolved) < 0;
        Py_XDECREF(resolved);
        Py_CLEAR(run->awaiting);
    }
    if (!failed && waiting && run->awaiting == NULL) {
        run->awaiting = PyObject_CallFunctionObjArgs(F_requested, event, when, NULL);
        failed = run->awaiting == NULL || (run->span.events == NULL && (run->span.events = PyList_New(0)) == NULL)
                 || PyList_Append(run->span.events, run->awaiting) < 0;
    }
    Py_XDECREF(when);
    int terminal = failed ? -1 : PySet_Contains(TERMINAL, state);
    failed = failed || terminal < 0;
    if (!failed && terminal) {
        int error = equal(state, V_error);
        failed = error < 0 || attrs_set(&run->span.attrs, K_run_state, state) < 0;
        if (!failed && error) {
            PyObject *reason = field(event, A_reason);
            PyObject *message = reason == NULL ? NULL : PyObject_CallOneArg(F_run_error, reason);
            Py_XDECREF(reason);
            failed = message == NULL || set_error(&run->span, message, V_other) < 0;
            Py_XDECREF(message);
        }
        Py_DECREF(state);
        return failed ? -1 : close_run(f, run, seq, at);
    }
    Py_DECREF(state);
    return failed ? -1 : 0;
}

typedef int (*Handler)(Fold *, Run *, PyObject *, long long, long long);

static Handler handler_of(PyTypeObject *kind) {
    PyObject *k = (PyObject *)kind;
    if (k == T_tool_start) return tool_start;
    if (k == T_tool_end) return tool_end;
    if (k == T_usage) return usage;
    if (k == T_step) return step;
    if (k == T_spawn) return spawn;
    if (k == T_lifecycle) return lifecycle;
    return NULL;  /* text deltas do nothing here (content is off); the others only open or name */
}

/* ---- SpanTree.apply and apply_many ---- */
static long long as_long_long(PyObject *number) {
#if LONG_MAX == LLONG_MAX
    return PyLong_AsLong(number);  /* the same value, by a shorter path for a two-digit int */
#else
    return PyLong_AsLongLong(number);
#endif
}

static long long seq_of(PyObject *event) {
    PyObject *seq = get(event, A_seq);
    if (seq == NULL) return -1;
    long long value = as_long_long(seq);
    Py_DECREF(seq);
    return value;
}

static int at_of(PyObject *event, long long *at) {
    PyObject *ts = get(event, A_ts);
    if (ts == NULL) return -1;
    /* ts_ms's own cache first (a dict it clears when full, never replaces), else ts_ms itself */
    PyObject *ms = PyUnicode_CheckExact(ts) ? PyDict_GetItemWithError(TS_CACHE, ts) : NULL;
    if (ms != NULL) Py_INCREF(ms);
    else if (!PyErr_Occurred()) ms = PyObject_CallOneArg(F_ts_ms, ts);
    Py_DECREF(ts);
    if (ms == NULL) return -1;
    long long value = as_long_long(ms);
    Py_DECREF(ms);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (value > LLONG_MAX / 1000000 || value < LLONG_MIN / 1000000) {
        PyErr_SetString(PyExc_OverflowError, "an event's ts is past what a span's time holds (2262)");
        return -1;
    }
    *at = value * 1000000;
    return 0;
}

static int apply(Fold *f, PyObject *event, long long seq) {
    if (seq <= f->last_seq) return 0;
    f->last_seq = seq;
    PyTypeObject *kind = Py_TYPE(event);
    PyObject *ref = get(event, A_child_ref), *ext = NULL, *parent_id = NULL, *named = NULL;
    if (ref == NULL) return -1;
    int own = ref == UNSET || ref == Py_None;
    PyObject *run_id = own ? f->root_id : ref;
    int failed = (ext = get(event, A_ext)) == NULL;
    Run *run = failed ? NULL : run_of(f, run_id);
    failed = failed || (run == NULL && PyErr_Occurred());
    PyObject *k = (PyObject *)kind;
    if (!failed && run != NULL && (k == T_text || k == T_reasoning || k == T_extension) && ext == Py_None) {
        Py_DECREF(ref);
        Py_DECREF(ext);
        return 0;  /* the common case, a delta of a run already open: nothing to do */
    }
    long long at = 0;
    failed = failed || at_of(event, &at) < 0;
    if (!failed && !own) {  /* fanned in: the parent is known from its spawn (or the event names it) */
        failed = (parent_id = get(event, A_parent_id)) == NULL;
        int truthy = failed ? 0 : PyObject_IsTrue(parent_id);
        int same = truthy > 0 ? equal(parent_id, ref) : 0;
        failed = failed || truthy < 0 || same < 0;
        if (!failed && (!truthy || same)) Py_CLEAR(parent_id);
    }
    if (!failed) {
        int moved = 0;
        if (parent_id != NULL && run != NULL)
            moved = run->parent == NULL ? 1 : !equal(run->parent->run_id, parent_id);
        failed = moved < 0;
        if (!failed && (run == NULL || at < run->span.start_ns || moved)) {
            run = open_run(f, run_id, parent_id, event, at);
            failed = run == NULL && PyErr_Occurred();
        }
    }
    if (!failed && run != NULL) {
        int truthy = 0;
        if (ext == Py_None) {
            failed = (named = get(event, A_thread_id)) == NULL;
            truthy = failed ? 0 : PyObject_IsTrue(named);
            failed = failed || truthy < 0;
        }
        if (!failed && (ext != Py_None || truthy)) failed = name_run(run, event, ext, named) < 0;
        Handler handle = failed ? NULL : handler_of(kind);
        if (handle != NULL) failed = handle(f, run, event, seq, at) < 0;
    }
    Py_DECREF(ref);
    Py_XDECREF(ext);
    Py_XDECREF(parent_id);
    Py_XDECREF(named);
    return failed ? -1 : 0;
}

/* apply_many's work over ``items`` (a PySequence_Fast of the events): the spans they ended past ``past`` */
static PyObject *fold_apply(Fold *f, PyObject *items, long long past) {
    PyObject *ended = PyList_New(0);
    if (ended == NULL) return NULL;
    f->ended = ended;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    int failed = 0;
    for (Py_ssize_t i = 0; !failed && i < count; i++) {
        PyObject *event = PySequence_Fast_GET_ITEM(items, i), *k = (PyObject *)Py_TYPE(event);
        if (k == T_text || k == T_reasoning) {  /* passed over: a delta of an open run, without ext */
            PyObject *ext = get(event, A_ext), *ref = NULL;
            failed = ext == NULL || (ref = get(event, A_child_ref)) == NULL;
            int open = 0;
            if (!failed && ext == Py_None) {
                open = PyDict_Contains(f->runs, ref == UNSET || ref == Py_None ? f->root_id : ref);
                failed = open < 0;
            }
            Py_XDECREF(ext);
            Py_XDECREF(ref);
            if (failed) break;
            if (open) continue;
        }
        long long seq = seq_of(event);
        failed = seq == -1 && PyErr_Occurred();
        if (!failed) {
            f->emit = seq > past;
            failed = apply(f, event, seq) < 0;
        }
    }
    if (!failed && count > 0) {
        long long last = seq_of(PySequence_Fast_GET_ITEM(items, count - 1));
        failed = last == -1 && PyErr_Occurred();
        if (!failed && last > f->last_seq) f->last_seq = last;
    }
    f->ended = NULL;
    if (failed) {
        Py_DECREF(ended);
        return NULL;
    }
    return ended;
}

static PyObject *apply_many(Fold *f, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"events", "past", NULL};
    PyObject *events;
    long long past = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|L:apply_many", names, &events, &past)) return NULL;
    PyObject *items = PySequence_Fast(events, "events are a sequence");
    if (items == NULL) return NULL;
    PyObject *ended = fold_apply(f, items, past);
    Py_DECREF(items);
    return ended;
}

/* ---- the type ---- */
static int fold_init(Fold *f, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"root_id", NULL};
    PyObject *root_id;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U:SpanFold", names, &root_id)) return -1;
    if (f->runs != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a SpanFold folds one root run");
        return -1;
    }
    if (load_spans_module() < 0) return -1;
    Py_ssize_t size;
    const char *root = PyUnicode_AsUTF8AndSize(root_id, &size);
    if (root == NULL) return -1;
    Sha trace;  /* spans.trace_id: the first 16 bytes of SHA-256("runwire trace\0" root) */
    unsigned char digest[32];
    sha_init(&trace);
    sha_update(&trace, (const unsigned char *)"runwire trace", 14);  /* with its NUL */
    sha_update(&trace, (const unsigned char *)root, (size_t)size);
    sha_final(&trace, digest);
    memcpy(f->trace, digest, 16);
    Py_INCREF(root_id);
    f->root_id = root_id;
    sha_init(&f->ids);
    sha_update(&f->ids, (const unsigned char *)"runwire span", 13);  /* with its NUL */
    sha_update(&f->ids, (const unsigned char *)root, (size_t)size);
    sha_update(&f->ids, (const unsigned char *)"", 1);
    if ((f->runs = PyDict_New()) == NULL || (f->done = PySet_New(NULL)) == NULL) return -1;
    return 0;
}

static void fold_dealloc(Fold *f) {
    if (f->runs != NULL) {
        Py_ssize_t pos = 0;
        PyObject *key, *capsule;
        while (PyDict_Next(f->runs, &pos, &key, &capsule)) free_run(PyCapsule_GetPointer(capsule, NULL));
    }
    Py_XDECREF(f->runs);
    Py_XDECREF(f->done);
    PyMem_Free(f->out.data);
    Py_XDECREF(f->root_id);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *fold_last_seq(Fold *f, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(f->last_seq);
}

static PyObject *fold_is_open(Fold *f, void *closure) {
    (void)closure;
    return PyBool_FromLong(f->runs != NULL && PyDict_GET_SIZE(f->runs) > 0);
}

static PyMethodDef fold_methods[] = {
    {"apply_many", (PyCFunction)(void (*)(void))apply_many, METH_VARARGS | METH_KEYWORDS,
     "apply_many(events, past=0) -> list[bytes]: SpanTree.apply_many's spans, each as its Span message's bytes"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fold_getset[] = {
    {"last_seq", (getter)fold_last_seq, NULL, "the seq of the last event applied", NULL},
    {"is_open", (getter)fold_is_open, NULL, "whether a span is still open", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FoldType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runwire.jobs._otlp.SpanFold",
    .tp_basicsize = sizeof(Fold),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SpanFold(root_id): runwire.jobs.spans.SpanTree(root_id, keep=False)'s fold, compiled, "
              "content off; apply_many returns each ended span as its OTLP Span message's bytes.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fold_init,
    .tp_dealloc = (destructor)fold_dealloc,
    .tp_methods = fold_methods,
    .tp_getset = fold_getset,
};

/* ---- Staging: the exporter's fold as the worker encodes, compiled ----
 * runwire.jobs.staging.Staging's twin (that module's docs say what it does; tests/jobs/
 * test_staging.py checks the two call for call). Each call is made by the worker's loop for each
 * root run's stream it encodes, and release once for each write after the log holds it: in C,
 * not to run the Python around a run's fold a stream at a time. */
static PyObject *S_tree, *S_cursor, *S_staged, *S_pending, *S_last_seq, *S_apply_many;

typedef struct {
    PyObject_HEAD
    PyObject *trees, *begin, *failed;
    Py_ssize_t pending, limit;
} Staging;

static long long seq_item(PyObject *items, Py_ssize_t index) {
    return seq_of(PySequence_Fast_GET_ITEM(items, index));
}

/* the stream folded into ``held``'s tree and staged there: its token, or None (not taken) */
static PyObject *stage_held(Staging *s, PyObject *held, PyObject *run_id, PyObject *events) {
    PyObject *items = PySequence_Fast(events, "events are a sequence");
    if (items == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    if (count == 0 || s->pending > s->limit) {
        Py_DECREF(items);
        Py_RETURN_NONE;
    }
    PyObject *tree = NULL, *cursor = NULL, *ended = NULL, *staged = NULL, *result = NULL;
    long long first = -1, last = -1, tree_last = -1, past = 0;
    int failed = (tree = get(held, S_tree)) == NULL || (cursor = get(held, S_cursor)) == NULL;
    failed = failed || ((first = seq_item(items, 0)) == -1 && PyErr_Occurred());
    failed = failed || ((last = seq_item(items, count - 1)) == -1 && PyErr_Occurred());
    int native = !failed && Py_IS_TYPE(tree, &FoldType);
    if (!failed && native) tree_last = ((Fold *)tree)->last_seq;
    else if (!failed) {
        PyObject *value = PyObject_GetAttr(tree, S_last_seq);
        failed = value == NULL || ((tree_last = as_long_long(value)) == -1 && PyErr_Occurred());
        Py_XDECREF(value);
    }
    if (!failed && first != tree_last + 1) {  /* not the tree's next: handed over after the write */
        Py_DECREF(items);
        Py_DECREF(tree);
        Py_DECREF(cursor);
        Py_RETURN_NONE;
    }
    if (!failed && native) {
        failed = ((past = as_long_long(cursor)) == -1 && PyErr_Occurred());
        failed = failed || (ended = fold_apply((Fold *)tree, items, past)) == NULL;
    } else if (!failed) {
        failed = (ended = PyObject_CallMethodObjArgs(tree, S_apply_many, events, cursor, NULL)) == NULL;
    }
    Py_XDECREF(tree);
    Py_XDECREF(cursor);
    Py_DECREF(items);
    if (failed) {  /* the exporter drops the tree and folds the run again from the log */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        PyObject *told = PyObject_CallFunctionObjArgs(s->failed, run_id, value ? value : Py_None, NULL);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        if (told == NULL) return NULL;
        Py_DECREF(told);
        Py_RETURN_NONE;
    }
    Py_ssize_t size = PyList_Check(ended) ? PyList_GET_SIZE(ended) : PyObject_Size(ended);
    PyObject *stretch = size < 0 ? NULL : Py_BuildValue("(LLO)", first, last, ended);
    Py_DECREF(ended);
    if (stretch != NULL && (staged = get(held, S_staged)) != NULL) {
        if (PyList_Append(staged, stretch) == 0) {
            s->pending += size;
            result = Py_BuildValue("(OL)", held, last);
        }
        Py_DECREF(staged);
    }
    Py_XDECREF(stretch);
    return result;
}

static PyObject *staging_call(Staging *s, PyObject *args, PyObject *kwargs) {
    PyObject *run_id, *events;
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) || !PyArg_UnpackTuple(args, "Staging", 2, 2, &run_id, &events)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Staging(run_id, events) takes no keywords");
        return NULL;
    }
    PyObject *held = PyDict_GetItemWithError(s->trees, run_id);
    if (held != NULL) Py_INCREF(held);
    else if (PyErr_Occurred() || (held = PyObject_CallFunctionObjArgs(s->begin, run_id, events, NULL)) == NULL)
        return NULL;
    PyObject *result = held == Py_None ? Py_NewRef(Py_None) : stage_held(s, held, run_id, events);
    Py_DECREF(held);
    return result;
}

static PyObject *staging_release(Staging *s, PyObject *taken) {
    (void)s;
    PyObject *items = PySequence_Fast(taken, "taken is a sequence");
    if (items == NULL) return NULL;
    int failed = 0;
    for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(items); i++) {
        PyObject *token = PySequence_Fast_GET_ITEM(items, i), *staged = NULL, *pending = NULL;
        if (!PyTuple_Check(token) || PyTuple_GET_SIZE(token) != 2) {
            PyErr_SetString(PyExc_TypeError, "a token is what Staging returned: (held, last)");
            failed = 1;
            break;
        }
        PyObject *held = PyTuple_GET_ITEM(token, 0);
        long long last = as_long_long(PyTuple_GET_ITEM(token, 1));
        failed = (last == -1 && PyErr_Occurred()) || (staged = get(held, S_staged)) == NULL
                 || (pending = get(held, S_pending)) == NULL;
        if (!failed && (!PyList_CheckExact(staged) || !PyList_CheckExact(pending))) {  /* not a _Held: its own */
            PyObject *done = PyObject_CallMethod(held, "logged", "L", last);
            failed = done == NULL;
            Py_XDECREF(done);
        } else {
            while (!failed && PyList_GET_SIZE(staged) > 0) {  /* _Held.logged(last) */
                PyObject *stretch = PyList_GET_ITEM(staged, 0);
                long long end = -1;
                failed = !PyTuple_Check(stretch) || PyTuple_GET_SIZE(stretch) != 3;
                failed = failed || ((end = as_long_long(PyTuple_GET_ITEM(stretch, 1))) == -1 && PyErr_Occurred());
                if (failed || end > last) break;
                Py_ssize_t at = PyList_GET_SIZE(pending);
                failed = PyList_SetSlice(pending, at, at, PyTuple_GET_ITEM(stretch, 2)) < 0
                         || PyList_SetSlice(staged, 0, 1, NULL) < 0;
            }
            if (failed && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a staged stretch is (first, last, ended)");
        }
        Py_XDECREF(staged);
        Py_XDECREF(pending);
    }
    Py_DECREF(items);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static int staging_init(Staging *s, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"trees", "begin", "failed", "limit", NULL};
    PyObject *trees, *begin, *failed;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOn:Staging", names, &PyDict_Type, &trees, &begin, &failed, &limit))
        return -1;
    Py_INCREF(trees);
    Py_INCREF(begin);
    Py_INCREF(failed);
    Py_XSETREF(s->trees, trees);
    Py_XSETREF(s->begin, begin);
    Py_XSETREF(s->failed, failed);
    s->limit = limit;
    s->pending = 0;
    return 0;
}

static int staging_traverse(Staging *s, visitproc visit, void *arg) {
    Py_VISIT(s->trees);
    Py_VISIT(s->begin);
    Py_VISIT(s->failed);
    return 0;
}

static int staging_clear(Staging *s) {
    Py_CLEAR(s->trees);
    Py_CLEAR(s->begin);
    Py_CLEAR(s->failed);
    return 0;
}

static void staging_dealloc(Staging *s) {
    PyObject_GC_UnTrack(s);
    staging_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef staging_methods[] = {
    {"release", (PyCFunction)staging_release, METH_O,
     "release(taken): each (held, last) a call returned, its write now in the log: held.logged(last)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef staging_members[] = {
    {"pending", T_PYSSIZET, offsetof(Staging, pending), 0, "ended spans not sent yet, staged or pending"},
    {"limit", T_PYSSIZET, offsetof(Staging, limit), 0, "past this many pending, nothing is staged"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StagingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runwire.jobs._otlp.Staging",
    .tp_basicsize = sizeof(Staging),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Staging(trees, begin, failed, limit): runwire.jobs.staging.Staging, compiled.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)staging_init,
    .tp_dealloc = (destructor)staging_dealloc,
    .tp_traverse = (traverseproc)staging_traverse,
    .tp_clear = (inquiry)staging_clear,
    .tp_call = (ternaryfunc)staging_call,
    .tp_methods = staging_methods,
    .tp_members = staging_members,
};

static int staging_add_type(PyObject *module) {
    struct { PyObject **slot; const char *text; } names[] = {
        {&S_tree, "tree"}, {&S_cursor, "cursor"}, {&S_staged, "staged"}, {&S_pending, "pending"},
        {&S_last_seq, "last_seq"}, {&S_apply_many, "apply_many"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    }
    if (PyType_Ready(&StagingType) < 0) return -1;
    Py_INCREF(&StagingType);
    if (PyModule_AddObject(module, "Staging", (PyObject *)&StagingType) < 0) {
        Py_DECREF(&StagingType);
        return -1;
    }
    return 0;
}

static PyObject *sha_accelerated(PyObject *module, PyObject *args) {
    (void)module;
    int wanted = -1;
    if (!PyArg_ParseTuple(args, "|p:_sha_accelerated", &wanted)) return NULL;
    if (wanted >= 0) sha_compress = wanted && sha_ni_present() ? sha_block_ni : sha_block;
    return PyBool_FromLong(sha_compress == sha_block_ni);
}

static PyMethodDef fold_functions[] = {
    {"_sha_accelerated", sha_accelerated, METH_VARARGS,
     "_sha_accelerated([on]) -> bool: whether span ids are hashed with the CPU's SHA extensions "
     "(on: where the CPU has them; off: the plain C), for the tests to run both"},
    {NULL, NULL, 0, NULL},
};

int fold_add_type(PyObject *module) {
    if (wire_intern() < 0 || intern_all() < 0 || PyType_Ready(&FoldType) < 0) return -1;
    if ((TOOL_NAMES = PyDict_New()) == NULL || (CHAT_NAMES = PyDict_New()) == NULL) return -1;
    if (PyModule_AddFunctions(module, fold_functions) < 0) return -1;
    sha_compress = sha_ni_present() ? sha_block_ni : sha_block;
    Py_INCREF(&FoldType);
    if (PyModule_AddObject(module, "SpanFold", (PyObject *)&FoldType) < 0) {
        Py_DECREF(&FoldType);
        return -1;
    }
    return staging_add_type(module);
}
