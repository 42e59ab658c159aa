/* runwire.core._native: the worker's per-event path (fan-in, sequencing, shaping's windows),
 * compiled, for runwire.processing.processor.Processor.process_each; and beside it the Redis
 * write's packing (runwire.bus.redis.entries) and a decoded batch's timestamp check
 * (runwire.core.events), each with its twin named where it is defined below.
 *
 * process(processor, events, outputs, now, in_place) does what process_each's loop does — for
 * each event Processor._one(event, outputs, now), an event that raises reported as
 * (index, error) — and returns the failures. It runs the usual case of each step here and hands
 * any other case to the step's Python code (the same objects' methods) before it has changed
 * anything that step changes:
 *
 * - an event (Processor._one): its run's stream loaded and no child_ref; else Processor._one.
 *   Its run's owner checked by Processor._check_owner where not yet decided or another tenant's,
 *   a root's child.spawn learned by ParentMap.learn; a child's ancestors are the route its run's
 *   last event gave while its links and the parent map are unchanged, else Processor._chain's,
 *   cut at another tenant's run by Processor._same_tenant;
 * - each admission into a stream (Processor._admit): the stream's run not ended, the publisher's
 *   seq 0 or its source's next; else Processor._admit (a duplicate, a gap, an ended run);
 * - the shaping of what was admitted (DeltaCoalescer.feed_into): no hole in the input; for a
 *   delta no window due to close, none closed and held, no closes to replay, its ts read before
 *   (ts_ms's cache); for any other event no window open or held and no closes; else
 *   DeltaCoalescer.feed_into.
 *
 * Its twin is that Python code run alone (Processor(core=None), or RUNWIRE_PURE=1):
 * tests/workers/test_core.py processes generated runs with both and compares every output,
 * checkpoint, failure and counter. Fields are read and written straight in their slots (a
 * msgspec Struct's field, a __slots__ attribute: a member descriptor's offset, looked up once per
 * type and name), as runwire.jobs._otlp's fold reads them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* ---- what runwire.processing.processor hands over, once (setup) ---- */
static PyObject *T_output, *T_window, *T_text, *T_reasoning, *T_spawn, *T_lifecycle;
static PyObject *T_text_payload, *NO_END, *F_last_seq, *EMPTY, *M_sort;
static PyObject *UNSET, *F_replace, *F_is_terminal, *F_format_millis, *TS_CACHE, *S_text, *S_reasoning;
static PyObject *A_run_id, *A_tenant, *A_state, *A_owned, *A_child_ref, *A_parent_id, *A_root_id,
    *A_route, *A_version, *A_ancestors, *A_seq, *A_terminal, *A_output, *A_sources, *A_last_activity,
    *A_last_seq, *A_coalescer, *A_raw, *A_shaped, *A_fed, *A_floor, *A_windows, *A_held, *A_closes,
    *A_clock, *A_first_end, *A_window_ms, *A_texts, *A_ts, *A_payload, *A_text, *A_first_seq,
    *A_end_ms, *A_thread_id, *A_ext, *A_summary, *A_stream, *A_streams, *A_parents, *A_ended, *M_admit, *M_check_owner, *M_learn, *M_chain, *M_same_tenant, *M_wanted, *M_one, *M_feed_into, *ZERO;
/* keyword names of the calls made: StreamOutput(run_id, stream), Window(first_seq, last_seq,
 * end_ms, ts), replace(event, seq, run_id, child_ref, parent_id, root_id), replace(event, seq) */
static PyObject *KW_output, *KW_window, *KW_copy, *KW_seq, *KW_key, *KW_text, *KW_shaped;

static int intern_all(void) {
    struct { PyObject **slot; const char *text; } names[] = {
        {&A_run_id, "run_id"}, {&A_tenant, "tenant"}, {&A_state, "state"}, {&A_owned, "owned"},
        {&A_child_ref, "child_ref"}, {&A_parent_id, "parent_id"}, {&A_root_id, "root_id"},
        {&A_route, "route"}, {&A_version, "version"}, {&A_ancestors, "ancestors"}, {&A_seq, "seq"},
        {&A_terminal, "terminal"}, {&A_output, "output"}, {&A_sources, "sources"},
        {&A_last_activity, "last_activity"}, {&A_last_seq, "last_seq"}, {&A_coalescer, "coalescer"},
        {&A_raw, "raw"}, {&A_shaped, "shaped"}, {&A_fed, "fed"}, {&A_floor, "floor"},
        {&A_windows, "windows"}, {&A_held, "held"}, {&A_closes, "closes"}, {&A_clock, "clock"},
        {&A_first_end, "_first_end"}, {&A_window_ms, "window_ms"}, {&A_texts, "texts"}, {&A_ts, "ts"},
        {&A_payload, "payload"}, {&A_text, "text"}, {&A_first_seq, "first_seq"}, {&A_end_ms, "end_ms"}, {&A_thread_id, "thread_id"}, {&A_ext, "ext"}, {&A_summary, "summary"},
        {&A_stream, "stream"}, {&A_streams, "_streams"}, {&A_parents, "parents"}, {&A_ended, "_ended"},
        {&M_admit, "_admit"}, {&M_check_owner, "_check_owner"}, {&M_learn, "learn"}, {&M_chain, "_chain"}, {&M_same_tenant, "_same_tenant"}, {&M_wanted, "_wanted"}, {&M_one, "_one"}, {&M_feed_into, "feed_into"}, {&M_sort, "sort"},
        {&EMPTY, ""},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    }
    if ((ZERO = PyLong_FromLong(0)) == NULL) return -1;
    KW_output = PyTuple_Pack(2, A_run_id, A_stream);
    KW_window = PyTuple_Pack(4, A_first_seq, A_last_seq, A_end_ms, A_ts);
    KW_copy = PyTuple_Pack(5, A_seq, A_run_id, A_child_ref, A_parent_id, A_root_id);
    KW_seq = PyTuple_Pack(1, A_seq);
    PyObject *key = PyUnicode_InternFromString("key"), *span = PyUnicode_InternFromString("span");
    KW_key = key == NULL ? NULL : PyTuple_Pack(1, key);
    KW_text = PyTuple_Pack(1, A_text);
    KW_shaped = span == NULL ? NULL : PyTuple_Pack(3, A_ts, A_payload, span);
    Py_XDECREF(key), Py_XDECREF(span);
    return KW_output && KW_window && KW_copy && KW_seq && KW_key && KW_text && KW_shaped ? 0 : -1;
}

/* ---- a field in its slot ----
 * A msgspec Struct's field and a __slots__ attribute are member descriptors over an object slot.
 * Each field read here is a Field: its name, the type it belongs to (an event's: Envelope, which
 * every event type extends) and its offset there, found once (setup). An object of that type is
 * read and written in the slot, without the look-up through its type's MRO; anything else (or an
 * empty slot) goes through GetAttr and SetAttr. A write of an object the collector tracks also goes
 * through SetAttr: msgspec starts tracking a Struct that comes to hold one. */
typedef struct { PyObject **name; PyTypeObject *type; Py_ssize_t offset; int exact; } Field;
static Field EV_thread_id = {&A_thread_id, NULL, -1, 0}, OUT_summary = {&A_summary, NULL, -1, 0};
static Field EV_ext = {&A_ext, NULL, -1, 0};
static Field TD_payload = {&A_payload, NULL, -1, 0}, RD_payload = {&A_payload, NULL, -1, 0}, PL_text = {&A_text, NULL, -1, 0};
static Field CO_fed = {&A_fed, NULL, -1, 0}, CO_first_end = {&A_first_end, NULL, -1, 0}, CO_floor = {&A_floor, NULL, -1, 0},
    CO_state = {&A_state, NULL, -1, 0}, CO_texts = {&A_texts, NULL, -1, 0}, CO_window_ms = {&A_window_ms, NULL, -1, 0},
    EV_child_ref = {&A_child_ref, NULL, -1, 0}, EV_parent_id = {&A_parent_id, NULL, -1, 0},
    EV_root_id = {&A_root_id, NULL, -1, 0}, EV_run_id = {&A_run_id, NULL, -1, 0}, EV_seq = {&A_seq, NULL, -1, 0}, EV_tenant = {&A_tenant, NULL, -1, 0},
    EV_ts = {&A_ts, NULL, -1, 0}, OUT_raw = {&A_raw, NULL, -1, 0}, OUT_shaped = {&A_shaped, NULL, -1, 0}, SH_clock = {&A_clock, NULL, -1, 0},
    SH_closes = {&A_closes, NULL, -1, 0}, SH_held = {&A_held, NULL, -1, 0}, SH_windows = {&A_windows, NULL, -1, 0},
    SS_ancestors = {&A_ancestors, NULL, -1, 0}, SS_last_seq = {&A_last_seq, NULL, -1, 0}, SS_owned = {&A_owned, NULL, -1, 0},
    SS_sources = {&A_sources, NULL, -1, 0}, SS_tenant = {&A_tenant, NULL, -1, 0}, SS_terminal = {&A_terminal, NULL, -1, 0},
    ST_coalescer = {&A_coalescer, NULL, -1, 0}, ST_last_activity = {&A_last_activity, NULL, -1, 0}, ST_output = {&A_output, NULL, -1, 0},
    ST_route = {&A_route, NULL, -1, 0}, ST_run_id = {&A_run_id, NULL, -1, 0}, ST_state = {&A_state, NULL, -1, 0},
    WIN_end_ms = {&A_end_ms, NULL, -1, 0}, WIN_first_seq = {&A_first_seq, NULL, -1, 0}, WIN_last_seq = {&A_last_seq, NULL, -1, 0},
    WIN_ts = {&A_ts, NULL, -1, 0};

static inline PyObject **slot(PyObject *obj, const Field *f) {
    PyTypeObject *t = Py_TYPE(obj);  /* (a field's type is set, with its offset, or NULL) */
    if (t == f->type || (!f->exact && f->type != NULL && (t->tp_base == f->type || PyType_IsSubtype(t, f->type))))
        return (PyObject **)((char *)obj + f->offset);
    return NULL;
}

static inline PyObject *get(PyObject *obj, const Field *f) {  /* a new reference */
    PyObject **where = slot(obj, f);
    if (where != NULL && *where != NULL) return Py_NewRef(*where);
    return PyObject_GetAttr(obj, *f->name);
}

static int set(PyObject *obj, const Field *f, PyObject *value) {
    PyObject **where = slot(obj, f);
    if (where != NULL && !PyObject_IS_GC(value)) {
        PyObject *old = *where;
        *where = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(obj, *f->name, value);
}

static PyObject *attr(PyObject *obj, PyObject *name) {  /* any other attribute (a new reference) */
    return PyObject_GetAttr(obj, name);
}

/* An int as a C integer, as PyLong_AsLongLongAndOverflow gives it (overflow set past 64 bits),
 * an int of one or two digits read in place (CPython before 3.12 keeps its sign in ob_size) */
static inline long long as_long(PyObject *value, int *overflow) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyLong_CheckExact(value)) {
        Py_ssize_t size = Py_SIZE(value);
        const digit *d = ((PyLongObject *)value)->ob_digit;
        *overflow = 0;
        if (size == 0) return 0;
        if (size == 1) return (long long)d[0];
        if (size == -1) return -(long long)d[0];
        if (size == 2) return (long long)d[0] | ((long long)d[1] << PyLong_SHIFT);
    }
#endif
    return PyLong_AsLongLongAndOverflow(value, overflow);
}

/* An int field as a C integer; -1 with an error set (not an int, or past 64 bits) */
static int get_long(PyObject *obj, const Field *f, long long *out) {
    PyObject **where = slot(obj, f);
    PyObject *value = where != NULL && *where != NULL ? Py_NewRef(*where) : PyObject_GetAttr(obj, *f->name);
    if (value == NULL) return -1;
    int overflow = 0;
    *out = PyLong_Check(value) ? as_long(value, &overflow) : -1;
    int failed = !PyLong_Check(value) || overflow || (*out == -1 && PyErr_Occurred());
    Py_DECREF(value);
    if (failed && !PyErr_Occurred()) PyErr_SetString(PyExc_OverflowError, "not a 64-bit int");
    return failed ? -1 : 0;
}

/* A Field's type and offset: the member descriptor of its name on ``type`` */
static int find_field(Field *f, PyTypeObject *type, int exact) {
    PyObject *d = _PyType_Lookup(type, *f->name);
    Py_CLEAR(f->type);  /* (no type: never read in a slot, whatever the offset) */
    f->offset = -1;
    if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY)) f->offset = m->offset;
    }
    if (f->offset < 0 || type->tp_getattro != PyObject_GenericGetAttr) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a field in a slot", type->tp_name, *f->name);
        return -1;
    }
    f->exact = exact;
    f->type = (PyTypeObject *)Py_NewRef(type);
    return 0;
}

/* Each Field's type and offset, from the types setup() is given */
static int find_fields(PyObject *types) {
    struct { Field *field; const char *type; int exact; } all[] = {
        {&CO_fed, "coalescer", 1},
        {&CO_first_end, "coalescer", 1},
        {&CO_floor, "coalescer", 1},
        {&CO_state, "coalescer", 1},
        {&CO_texts, "coalescer", 1},
        {&CO_window_ms, "coalescer", 1},
        {&EV_child_ref, "envelope", 0},
        {&EV_parent_id, "envelope", 0},
        {&TD_payload, "text_delta", 1},
        {&EV_thread_id, "envelope", 0},
        {&OUT_summary, "output", 1},
        {&RD_payload, "reasoning_delta", 1},
        {&PL_text, "text_payload", 1},
        {&EV_root_id, "envelope", 0},
        {&EV_run_id, "envelope", 0},
        {&EV_seq, "envelope", 0},
        {&EV_tenant, "envelope", 0},
        {&EV_ts, "envelope", 0},
        {&OUT_raw, "output", 1},
        {&OUT_shaped, "output", 1},
        {&SH_clock, "shaper_state", 1},
        {&SH_closes, "shaper_state", 1},
        {&SH_held, "shaper_state", 1},
        {&SH_windows, "shaper_state", 1},
        {&SS_ancestors, "sequencer_state", 1},
        {&SS_last_seq, "sequencer_state", 1},
        {&SS_owned, "sequencer_state", 1},
        {&SS_sources, "sequencer_state", 1},
        {&SS_tenant, "sequencer_state", 1},
        {&SS_terminal, "sequencer_state", 1},
        {&ST_coalescer, "stream", 1},
        {&ST_last_activity, "stream", 1},
        {&ST_output, "stream", 1},
        {&ST_route, "stream", 1},
        {&ST_run_id, "stream", 1},
        {&ST_state, "stream", 1},
        {&WIN_end_ms, "window", 1},
        {&WIN_first_seq, "window", 1},
        {&WIN_last_seq, "window", 1},
        {&WIN_ts, "window", 1},
    };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        PyObject *type = PyDict_GetItemString(types, all[i].type);
        if (type == NULL || !PyType_Check(type)) {
            PyErr_Format(PyExc_TypeError, "setup() names the type %s", all[i].type);
            return -1;
        }
        if (find_field(all[i].field, (PyTypeObject *)type, all[i].exact) < 0) return -1;
    }
    return 0;
}

static int equal(PyObject *a, PyObject *b) {
    return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
}

/* ---- the steps: each returns 0 done here, 1 left to its Python code (nothing changed), -1 error */

/* ---- shaping's windows (DeltaCoalescer) ---- */

/* list.sort(key=last_seq), in place: Python's own (stable) sort */
static int sort_by_last_seq(PyObject *list) {
    PyObject *args[] = {list, F_last_seq};
    PyObject *r = PyObject_VectorcallMethod(M_sort, args, 1, KW_key);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The earliest end of the open windows (_first_end) */
static PyObject *first_end_of(PyObject *windows) {
    PyObject *key, *window, *best = NULL;
    long long least = 0;
    Py_ssize_t pos = 0;
    while (PyDict_Next(windows, &pos, &key, &window)) {
        long long end;
        if (get_long(window, &WIN_end_ms, &end) < 0) { Py_XDECREF(best); return NULL; }
        if (best == NULL || end < least) {
            Py_XSETREF(best, get(window, &WIN_end_ms));
            if (best == NULL) return NULL;
            least = end;
        }
    }
    return best == NULL ? Py_NewRef(NO_END) : best;
}

/* _send (and _shaped): a window's shaped event, out unless the shaped view has it */
static int send(PyObject *co, PyObject *window, PyObject *out) {
    PyObject *first = NULL, *texts = NULL, *list = NULL, *last = NULL, *last_seq = NULL, *text = NULL,
             *ts = NULL, *payload = NULL, *span = NULL, *shaped = NULL, *start = NULL;
    int rc = -1;
    if ((first = get(window, &WIN_first_seq)) == NULL || (texts = get(co, &CO_texts)) == NULL) goto done;
    if ((list = PyObject_GetItem(texts, first)) == NULL || PyObject_DelItem(texts, first) < 0) goto done;
    long long window_last, floor;
    if (get_long(window, &WIN_last_seq, &window_last) < 0 || get_long(co, &CO_floor, &floor) < 0) goto done;
    if (window_last <= floor) { rc = 0; goto done; }  /* (a successor's replay: sent before) */
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) < 2) {
        PyErr_SetString(PyExc_TypeError, "a window's texts are its newest delta and its texts");
        goto done;
    }
    last = Py_NewRef(PyList_GET_ITEM(list, 0));
    if (PyList_GET_SIZE(list) == 2) {
        text = Py_NewRef(PyList_GET_ITEM(list, 1));
    } else {
        PyObject *parts = PyList_GetSlice(list, 1, PyList_GET_SIZE(list));
        text = parts == NULL ? NULL : PyUnicode_Join(EMPTY, parts);
        Py_XDECREF(parts);
        if (text == NULL) goto done;
    }
    if ((start = PyLong_FromLongLong(floor + 1)) == NULL || (last_seq = get(last, &EV_seq)) == NULL
        || set(co, &CO_floor, last_seq) < 0) goto done;
    if ((ts = get(window, &WIN_ts)) == NULL) goto done;
    int opened = PyObject_IsTrue(ts);
    if (opened < 0) goto done;
    if (!opened) {
        Py_SETREF(ts, get(last, &EV_ts));
        if (ts == NULL) goto done;
    }
    PyObject *payload_args[] = {text};
    if ((payload = PyObject_Vectorcall(T_text_payload, payload_args, 0, KW_text)) == NULL) goto done;
    if ((span = PyTuple_Pack(2, start, last_seq)) == NULL) goto done;
    PyObject *args[] = {last, ts, payload, span};
    if ((shaped = PyObject_Vectorcall(F_replace, args, 1, KW_shaped)) == NULL) goto done;
    rc = PyList_Append(out, shaped);
done:
    Py_XDECREF(first), Py_XDECREF(texts), Py_XDECREF(list), Py_XDECREF(last), Py_XDECREF(last_seq);
    Py_XDECREF(text), Py_XDECREF(ts), Py_XDECREF(payload), Py_XDECREF(span), Py_XDECREF(shaped);
    Py_XDECREF(start);
    return rc;
}

/* _expire: the open windows that end by clock move to held, in last-seq order */
static int expire(PyObject *co, PyObject *windows, PyObject *held, long long clock) {
    PyObject *due = PyList_New(0), *key, *window;
    if (due == NULL) return -1;
    Py_ssize_t pos = 0;
    int rc = -1;
    while (PyDict_Next(windows, &pos, &key, &window)) {
        long long end;
        if (get_long(window, &WIN_end_ms, &end) < 0) goto done;
        if (end <= clock && PyList_Append(due, key) < 0) goto done;
    }
    if (PyList_GET_SIZE(due) == 0) { rc = 0; goto done; }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(due); i++) {
        PyObject *closed = PyObject_GetItem(windows, PyList_GET_ITEM(due, i));
        int failed = closed == NULL || PyObject_DelItem(windows, PyList_GET_ITEM(due, i)) < 0
                     || PyList_Append(held, closed) < 0;
        Py_XDECREF(closed);
        if (failed) goto done;
    }
    if (sort_by_last_seq(held) < 0) goto done;
    PyObject *first = first_end_of(windows);
    rc = first == NULL ? -1 : set(co, &CO_first_end, first);
    Py_XDECREF(first);
done:
    Py_DECREF(due);
    return rc;
}

/* _release: the held windows that end before every open one, sent (so seq keeps increasing) */
static int release(PyObject *co, PyObject *windows, PyObject *held, PyObject *out) {
    PyObject *key, *window;
    Py_ssize_t pos = 0, count = 0;
    long long bound = 0;
    int bounded = 0;
    while (PyDict_Next(windows, &pos, &key, &window)) {
        long long last;
        if (get_long(window, &WIN_last_seq, &last) < 0) return -1;
        if (!bounded || last < bound) bound = last, bounded = 1;
    }
    if (!bounded) {
        count = PyList_GET_SIZE(held);
    } else {
        for (; count < PyList_GET_SIZE(held); count++) {
            long long last;
            if (get_long(PyList_GET_ITEM(held, count), &WIN_last_seq, &last) < 0) return -1;
            if (last >= bound) break;
        }
    }
    if (count == 0) return 0;
    PyObject *sending = PyList_GetSlice(held, 0, count);
    if (sending == NULL) return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < count; i++) rc = send(co, PyList_GET_ITEM(sending, i), out);
    Py_DECREF(sending);
    return rc < 0 ? -1 : PyList_SetSlice(held, 0, count, NULL);
}

/* _emit_all: every window, held or open, sent in last-seq order */
static int emit_all(PyObject *co, PyObject *state, PyObject *windows, PyObject *held, PyObject *out) {
    PyObject *closing = PyList_GetSlice(held, 0, PyList_GET_SIZE(held)), *values = NULL, *fresh_held = NULL,
             *fresh_windows = NULL;
    int rc = -1;
    if (closing == NULL || (values = PyDict_Values(windows)) == NULL) goto done;
    if (PyList_SetSlice(closing, PyList_GET_SIZE(closing), PyList_GET_SIZE(closing), values) < 0) goto done;
    if (sort_by_last_seq(closing) < 0) goto done;
    if ((fresh_held = PyList_New(0)) == NULL || (fresh_windows = PyDict_New()) == NULL) goto done;
    if (set(state, &SH_held, fresh_held) < 0 || set(state, &SH_windows, fresh_windows) < 0
        || set(co, &CO_first_end, NO_END) < 0) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(closing); i++) {
        if (send(co, PyList_GET_ITEM(closing, i), out) < 0) goto done;
    }
    rc = 0;
done:
    Py_XDECREF(closing), Py_XDECREF(values), Py_XDECREF(fresh_held), Py_XDECREF(fresh_windows);
    return rc;
}

/* Whether key holds part at start (1, 0; -1 an error): ASCII compared in place, else Tailmatch */
static inline Py_ssize_t part_at(PyObject *key, PyObject *part, Py_ssize_t start) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(part);
    if (PyUnicode_IS_ASCII(key) && PyUnicode_IS_ASCII(part))
        return memcmp((const char *)PyUnicode_DATA(key) + start, PyUnicode_DATA(part), n) == 0;
    return PyUnicode_Tailmatch(key, part, start, start + n, start ? 1 : -1);
}

/* windows.get(child + suffix) (child NULL: suffix), without making the key: a stream has a
 * window or a few open, whose keys are compared in place (0, *window a new reference or NULL) */
static int window_of(PyObject *windows, PyObject *child, PyObject *suffix, PyObject **window) {
    PyObject *key, *value;
    Py_ssize_t pos = 0, head = child == NULL ? 0 : PyUnicode_GET_LENGTH(child);
    Py_ssize_t length = head + PyUnicode_GET_LENGTH(suffix);
    *window = NULL;
    if (child != NULL && !PyUnicode_CheckExact(child)) {
        PyErr_SetString(PyExc_TypeError, "a child_ref is a str");
        return -1;
    }
    while (PyDict_Next(windows, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || PyUnicode_GET_LENGTH(key) != length) continue;
        Py_ssize_t same = key == suffix ? 1 : part_at(key, suffix, head);
        if (same > 0 && child != NULL) same = part_at(key, child, 0);
        if (same < 0) return -1;
        if (same) {
            *window = Py_NewRef(value);
            return 0;
        }
    }
    return 0;
}

/* DeltaCoalescer.feed_into(event, out), but for a hole in the input or closes to replay */
static int feed(PyObject *co, PyObject *event, PyObject *out, long long seq, PyObject *seq_obj) {
    PyObject *state = NULL, *fed = NULL, *windows = NULL, *held = NULL, *closes = NULL, *ts = NULL,
             *window = NULL, *key = NULL, *child = NULL, *texts = NULL, *list = NULL, *payload = NULL,
             *text = NULL;
    int rc = -1;
    if ((state = get(co, &CO_state)) == NULL || (fed = get(co, &CO_fed)) == NULL) goto done;
    if (fed != Py_None) {
        int overflow = 0;
        long long fed_n = as_long(fed, &overflow);
        if (overflow || (fed_n == -1 && PyErr_Occurred()) || seq > fed_n + 1) { PyErr_Clear(); rc = 1; goto done; }
    }
    PyTypeObject *type = Py_TYPE(event);
    PyObject *suffix = type == (PyTypeObject *)T_text ? S_text : type == (PyTypeObject *)T_reasoning ? S_reasoning : NULL;
    if ((windows = get(state, &SH_windows)) == NULL || (held = get(state, &SH_held)) == NULL
        || (closes = get(state, &SH_closes)) == NULL) goto done;
    if (!PyDict_CheckExact(windows) || !PyList_CheckExact(held) || !PyDict_CheckExact(closes)
        || PyDict_GET_SIZE(closes)) { rc = 1; goto done; }  /* (closes to replay: feed_into's) */
    if (suffix == NULL) {  /* not a delta (§4 R3): flush, then the event itself */
        if (fed != Py_None && set(co, &CO_fed, seq_obj) < 0) goto done;
        if ((PyDict_GET_SIZE(windows) || PyList_GET_SIZE(held)) && emit_all(co, state, windows, held, out) < 0) goto done;
        if (set(state, &SH_clock, ZERO) < 0) goto done;
        long long floor;
        if (get_long(co, &CO_floor, &floor) < 0) goto done;
        if (seq > floor && (PyList_Append(out, event) < 0 || set(co, &CO_floor, seq_obj) < 0)) goto done;
        rc = 0;
        goto done;
    }
    if ((ts = get(event, &EV_ts)) == NULL) goto done;
    PyObject *millis = PyUnicode_CheckExact(ts) ? PyDict_GetItemWithError(TS_CACHE, ts) : NULL;
    if (millis == NULL) {  /* (ts_ms parses it, or says why not) */
        if (PyErr_Occurred()) goto done;
        rc = 1;
        goto done;
    }
    long long now, clock, first_end, window_ms;
    int overflow = 0;
    now = as_long(millis, &overflow);
    if (overflow || (now == -1 && PyErr_Occurred())) { PyErr_Clear(); rc = 1; goto done; }
    if (get_long(state, &SH_clock, &clock) < 0) goto done;
    /* from here on it is this step's */
    if (fed != Py_None && set(co, &CO_fed, seq_obj) < 0) goto done;
    if (now > clock) {
        clock = now;
        if (set(state, &SH_clock, millis) < 0) goto done;
    }
    if (get_long(co, &CO_first_end, &first_end) < 0) goto done;
    if (first_end <= clock) {
        if (expire(co, windows, held, clock) < 0 || get_long(co, &CO_first_end, &first_end) < 0) goto done;
    }
    if ((child = get(event, &EV_child_ref)) == NULL) goto done;
    int named = child != UNSET && child != Py_None && PyObject_IsTrue(child);
    if (named < 0) goto done;
    if ((texts = get(co, &CO_texts)) == NULL
        || (payload = get(event, suffix == S_text ? &TD_payload : &RD_payload)) == NULL
        || (text = get(payload, &PL_text)) == NULL) goto done;
    if (window_of(windows, named ? child : NULL, suffix, &window) < 0) goto done;
    if (window == NULL) {
        key = named ? PyUnicode_Concat(child, suffix) : Py_NewRef(suffix);
        if (key == NULL) goto done;
        if (get_long(co, &CO_window_ms, &window_ms) < 0) goto done;
        long long end_ms = clock + window_ms;
        PyObject *opened_ts = now == clock ? Py_NewRef(ts) : NULL;
        if (opened_ts == NULL) {
            PyObject *at = PyLong_FromLongLong(clock);
            opened_ts = at == NULL ? NULL : PyObject_CallOneArg(F_format_millis, at);
            Py_XDECREF(at);
            if (opened_ts == NULL) goto done;
        }
        PyObject *end = PyLong_FromLongLong(end_ms);
        if (end == NULL) { Py_DECREF(opened_ts); goto done; }
        PyObject *args[] = {seq_obj, seq_obj, end, opened_ts};
        window = PyObject_Vectorcall(T_window, args, 0, KW_window);
        Py_DECREF(opened_ts);
        if (window == NULL || PyDict_SetItem(windows, key, window) < 0) { Py_DECREF(end); goto done; }
        list = PyList_New(2);
        if (list == NULL) { Py_DECREF(end); goto done; }
        PyList_SET_ITEM(list, 0, Py_NewRef(event));
        PyList_SET_ITEM(list, 1, Py_NewRef(text));
        int failed = PyDict_SetItem(texts, seq_obj, list) < 0 || (end_ms < first_end && set(co, &CO_first_end, end) < 0);
        Py_DECREF(end);
        if (failed) goto done;
    } else {
        if (set(window, &WIN_last_seq, seq_obj) < 0) goto done;
        PyObject *first = get(window, &WIN_first_seq);
        if (first == NULL) goto done;
        list = PyObject_GetItem(texts, first);
        Py_DECREF(first);
        if (list == NULL) goto done;
        if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) < 1) {
            PyErr_SetString(PyExc_TypeError, "a window's texts are a list, its newest delta first");
            goto done;
        }
        Py_SETREF(PyList_GET_ITEM(list, 0), Py_NewRef(event));  /* (a list's item: SETREF keeps the count) */
        if (PyList_Append(list, text) < 0) goto done;
    }
    if (PyList_GET_SIZE(held) && release(co, windows, held, out) < 0) goto done;
    rc = 0;
done:
    Py_XDECREF(state), Py_XDECREF(fed), Py_XDECREF(windows), Py_XDECREF(held), Py_XDECREF(closes);
    Py_XDECREF(ts), Py_XDECREF(window), Py_XDECREF(key), Py_XDECREF(child), Py_XDECREF(texts);
    Py_XDECREF(list), Py_XDECREF(payload), Py_XDECREF(text);
    return rc;
}

/* replace(event, seq=, run_id=, child_ref=, parent_id=, root_id=): a fan-in copy. msgspec's
 * __copy__ (every slot, the collector's tracking as the event's) and the five written in their
 * slots, none of them an object the collector tracks: what replace() makes, without its
 * keyword matching */
static PyCFunction COPY;

static PyObject *copied(PyObject *event, PyObject *seq, PyObject *run_id, PyObject *child_ref,
                        PyObject *parent_id, PyObject *root_id) {
    if (COPY == NULL || slot(event, &EV_seq) == NULL) {
        PyObject *args[] = {event, seq, run_id, child_ref, parent_id, root_id};
        return PyObject_Vectorcall(F_replace, args, 1, KW_copy);
    }
    PyObject *copy = COPY(event, NULL);
    if (copy == NULL) return NULL;
    if (Py_TYPE(copy) != Py_TYPE(event) || set(copy, &EV_seq, seq) < 0 || set(copy, &EV_run_id, run_id) < 0
        || set(copy, &EV_child_ref, child_ref) < 0 || set(copy, &EV_parent_id, parent_id) < 0
        || set(copy, &EV_root_id, root_id) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "__copy__ made another type");
        Py_DECREF(copy);
        return NULL;
    }
    return copy;
}

/* ---- StreamOutput.summary: what runwire.store.runmeta.summarize_run reads of raw, summed as each
 * event is admitted, while it is in the CPU's caches (read again by the replay log's thread after
 * the write, from memory, the same reads cost several times as much). Each admission sums the raw
 * events not summed yet, in order: those a step in Python appended too. The replay log builds
 * the run's delta from it (runmeta.summary_delta); tests/workers/test_core.py checks it against
 * summarize_run for every output. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    int linked;
    PyObject *first_seq, *last_seq, *first_ts, *last_ts, *tenant, *parent_id, *root_id, *thread_id, *metered;
} RunSummary;

static void run_summary_dealloc(RunSummary *self) {
    Py_XDECREF(self->first_seq), Py_XDECREF(self->last_seq), Py_XDECREF(self->first_ts);
    Py_XDECREF(self->last_ts), Py_XDECREF(self->tenant), Py_XDECREF(self->parent_id);
    Py_XDECREF(self->root_id), Py_XDECREF(self->thread_id), Py_XDECREF(self->metered);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef run_summary_members[] = {
    {"count", T_PYSSIZET, offsetof(RunSummary, count), READONLY, "How many of raw's events are summed."},
    {"linked", T_BOOL, offsetof(RunSummary, linked), READONLY, "Whether one of the run's own named its parent."},
    {"first_seq", T_OBJECT, offsetof(RunSummary, first_seq), READONLY, "The first event's seq."},
    {"last_seq", T_OBJECT, offsetof(RunSummary, last_seq), READONLY, "The last event's seq."},
    {"first_ts", T_OBJECT, offsetof(RunSummary, first_ts), READONLY, "The least ts."},
    {"last_ts", T_OBJECT, offsetof(RunSummary, last_ts), READONLY, "The greatest ts."},
    {"tenant", T_OBJECT, offsetof(RunSummary, tenant), READONLY, "The first tenant named."},
    {"parent_id", T_OBJECT, offsetof(RunSummary, parent_id), READONLY, "The parent the run's own first named."},
    {"root_id", T_OBJECT, offsetof(RunSummary, root_id), READONLY, "Its root, then."},
    {"thread_id", T_OBJECT, offsetof(RunSummary, thread_id), READONLY, "The thread the run's own first named."},
    {"metered", T_OBJECT, offsetof(RunSummary, metered), READONLY, "The run's own metered events, in order."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RunSummaryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runwire.core._native.RunSummary",
    .tp_basicsize = sizeof(RunSummary),
    .tp_dealloc = (destructor)run_summary_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What the replay log's run summary reads of a stream output's raw events, summed as admitted.",
    .tp_members = run_summary_members,
    .tp_new = PyType_GenericNew,
};

static PyObject *METERED;  /* the types of runmeta's metered events */

/* a against b: -1, 0, 1 (-2 an error); two ASCII strs compared in place */
static int str_order(PyObject *a, PyObject *b) {
    if (a == b) return 0;
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b) && PyUnicode_IS_ASCII(a) && PyUnicode_IS_ASCII(b)) {
        Py_ssize_t na = PyUnicode_GET_LENGTH(a), nb = PyUnicode_GET_LENGTH(b);
        int c = memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), na < nb ? na : nb);
        if (c == 0) c = na < nb ? -1 : na > nb;
        return c < 0 ? -1 : c > 0;
    }
    int less = PyObject_RichCompareBool(a, b, Py_LT);
    if (less) return less < 0 ? -2 : -1;
    int more = PyObject_RichCompareBool(a, b, Py_GT);
    return more < 0 ? -2 : more;
}

static int sum_event(RunSummary *acc, PyObject *event) {
    PyObject *seq = get(event, &EV_seq), *ts = seq == NULL ? NULL : get(event, &EV_ts), *child = NULL;
    int rc = -1;
    if (ts == NULL) goto done;
    if (acc->count == 0) {
        Py_XSETREF(acc->first_seq, Py_NewRef(seq));
        Py_XSETREF(acc->first_ts, Py_NewRef(ts));
        Py_XSETREF(acc->last_ts, Py_NewRef(ts));
    } else {  /* (the first of equals kept, as min and max keep it; past the greatest, not below the least) */
        int above = str_order(ts, acc->last_ts);
        if (above == -2) goto done;
        if (above > 0) {
            Py_SETREF(acc->last_ts, Py_NewRef(ts));
        } else if (above < 0) {
            int below = str_order(ts, acc->first_ts);
            if (below == -2) goto done;
            if (below < 0) Py_SETREF(acc->first_ts, Py_NewRef(ts));
        }
    }
    Py_XSETREF(acc->last_seq, Py_NewRef(seq));
    if (acc->tenant == NULL || acc->tenant == Py_None) {
        PyObject *tenant = get(event, &EV_tenant);
        if (tenant == NULL) goto done;
        Py_XSETREF(acc->tenant, tenant);
    }
    if ((child = get(event, &EV_child_ref)) == NULL) goto done;
    if (child == UNSET || child == Py_None) {  /* the run's own */
        if (!acc->linked) {
            PyObject *parent = get(event, &EV_parent_id);
            if (parent == NULL) goto done;
            if (parent != Py_None) {
                PyObject *root = get(event, &EV_root_id);
                if (root == NULL) { Py_DECREF(parent); goto done; }
                Py_XSETREF(acc->parent_id, parent);
                Py_XSETREF(acc->root_id, root);
                acc->linked = 1;
            } else {
                Py_DECREF(parent);
            }
        }
        if (acc->thread_id == NULL || acc->thread_id == Py_None) {
            PyObject *thread = get(event, &EV_thread_id);
            if (thread == NULL) goto done;
            Py_XSETREF(acc->thread_id, thread);
        }
        int metered = PySet_Contains(METERED, (PyObject *)Py_TYPE(event));
        if (metered < 0) goto done;
        if (metered) {
            if (acc->metered == NULL && (acc->metered = PyList_New(0)) == NULL) goto done;
            if (PyList_Append(acc->metered, event) < 0) goto done;
        }
    }
    acc->count++;
    rc = 0;
done:
    Py_XDECREF(seq), Py_XDECREF(ts), Py_XDECREF(child);
    return rc;
}

/* raw's events not summed yet, summed (the output's summary made at its first) */
static int sum_raw(PyObject *output, PyObject *raw) {
    PyObject **where = slot(output, &OUT_summary);
    if (where == NULL || !PyList_CheckExact(raw)) return 0;
    RunSummary *acc = (RunSummary *)*where;
    if ((PyObject *)acc == Py_None || acc == NULL) {
        PyObject *made = PyType_GenericNew(&RunSummaryType, NULL, NULL);
        if (made == NULL || set(output, &OUT_summary, made) < 0) { Py_XDECREF(made); return -1; }
        Py_DECREF(made);
        acc = (RunSummary *)made;
    } else if (!Py_IS_TYPE(acc, &RunSummaryType)) {
        return 0;
    }
    while (acc->count < PyList_GET_SIZE(raw)) {
        if (sum_event(acc, PyList_GET_ITEM(raw, acc->count)) < 0) return -1;
    }
    return 0;
}

typedef struct {
    PyObject *processor, *outputs, *now;
    int in_place;
} Batch;

/* Processor._admit(stream, event, published, source, outputs, now, parent_id, root_id, copy) */
static int admit(Batch *b, PyObject *stream, PyObject *event, PyObject *published, long long published_n,
                 PyObject *source, PyObject *parent_id, PyObject *root_id, int copy) {
    PyObject *state = NULL, *terminal = NULL, *run_id = NULL, *output = NULL, *sources = NULL,
             *seq_obj = NULL, *admitted = NULL, *raw = NULL, *shaped = NULL, *co = NULL;
    int rc = -1, python = 0;
    if ((state = get(stream, &ST_state)) == NULL || (terminal = get(state, &SS_terminal)) == NULL) goto done;
    if (terminal != Py_False) { python = 1; goto done; }
    if ((run_id = get(stream, &ST_run_id)) == NULL || (output = get(stream, &ST_output)) == NULL) goto done;
    if (output == Py_None) {
        Py_DECREF(output);
        PyObject *args[] = {run_id, stream};
        if ((output = PyObject_Vectorcall(T_output, args, 0, KW_output)) == NULL) goto done;
        if (set(stream, &ST_output, output) < 0 || PyDict_SetItem(b->outputs, run_id, output) < 0) goto done;
    }
    if (published_n) {
        if ((sources = get(state, &SS_sources)) == NULL) goto done;
        if (!PyDict_CheckExact(sources)) { python = 1; goto done; }
        PyObject *last = PyDict_GetItemWithError(sources, source);
        long long last_n = 0;
        if (last == NULL && PyErr_Occurred()) goto done;
        if (last != NULL) {
            int overflow = 0;
            last_n = PyLong_Check(last) ? as_long(last, &overflow) : -1;
            if (!PyLong_Check(last) || overflow || (last_n == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                python = 1;
                goto done;
            }
        }
        if (published_n != last_n + 1) { python = 1; goto done; }  /* a duplicate or a gap */
        if (PyDict_SetItem(sources, source, published) < 0) goto done;
    }
    if (set(stream, &ST_last_activity, b->now) < 0) goto done;
    long long seq;
    if (get_long(state, &SS_last_seq, &seq) < 0) goto done;
    if ((seq_obj = PyLong_FromLongLong(++seq)) == NULL || set(state, &SS_last_seq, seq_obj) < 0) goto done;
    if (copy) {
        admitted = copied(event, seq_obj, run_id, source, parent_id, root_id);
    } else if (b->in_place) {
        admitted = set(event, &EV_seq, seq_obj) < 0 ? NULL : Py_NewRef(event);
    } else {
        PyObject *args[] = {event, seq_obj};
        admitted = PyObject_Vectorcall(F_replace, args, 1, KW_seq);
    }
    if (admitted == NULL || (raw = get(output, &OUT_raw)) == NULL || PyList_Append(raw, admitted) < 0) goto done;
    if (sum_raw(output, raw) < 0) goto done;
    if ((shaped = get(output, &OUT_shaped)) == NULL || (co = get(stream, &ST_coalescer)) == NULL) goto done;
    if (!PyList_CheckExact(shaped)) {
        PyErr_SetString(PyExc_TypeError, "a stream output's shaped events are a list");
        goto done;
    }
    int fed = feed(co, admitted, shaped, seq, seq_obj);
    if (fed == 1) {
        PyObject *r = PyObject_CallMethodObjArgs(co, M_feed_into, admitted, shaped, NULL);
        fed = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    rc = fed;
done:
    if (python) {
        PyObject *r = PyObject_CallMethodObjArgs(b->processor, M_admit, stream, event, published, source,
                                                 b->outputs, b->now, parent_id, root_id,
                                                 copy ? Py_True : Py_False, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_XDECREF(state), Py_XDECREF(terminal), Py_XDECREF(run_id), Py_XDECREF(output), Py_XDECREF(sources);
    Py_XDECREF(seq_obj), Py_XDECREF(admitted), Py_XDECREF(raw), Py_XDECREF(shaped), Py_XDECREF(co);
    return rc;
}

/* A stream's state owned by this tenant: 1 yes, 0 no (or unknown), -1 error */
static int owned_by(PyObject *state, PyObject *tenant) {
    PyObject *owned = get(state, &SS_owned);
    if (owned == NULL) return -1;
    int yes = owned == Py_True;
    Py_DECREF(owned);
    if (!yes) return 0;
    PyObject *theirs = get(state, &SS_tenant);
    if (theirs == NULL) return -1;
    int same = equal(theirs, tenant);
    Py_DECREF(theirs);
    return same;
}

/* Processor._one(event, outputs, now) */
static int one(Batch *b, PyObject *streams, PyObject *parents, PyObject *event) {
    PyObject *run_id = NULL, *source = NULL, *own = NULL, *tenant = NULL, *state = NULL, *ref = NULL, *parent = NULL,
             *route = NULL, *version = NULL, *root_id = NULL, *ancestors = NULL, *held = NULL,
             *published = NULL;
    int rc = -1, python = 0;
    PyTypeObject *type = Py_TYPE(event);
    if ((run_id = get(event, &EV_run_id)) == NULL) goto done;
    own = PyDict_GetItemWithError(streams, run_id);
    if (own == NULL) {
        if (PyErr_Occurred()) goto done;
        python = 1;  /* (not loaded: _one says so) */
        goto done;
    }
    Py_INCREF(own);
    if ((tenant = get(event, &EV_tenant)) == NULL || (state = get(own, &ST_state)) == NULL) goto done;
    if ((source = get(own, &ST_run_id)) == NULL) goto done;  /* (the stream's own str: equal, its hash kept) */
    if ((ref = get(event, &EV_child_ref)) == NULL || (parent = get(event, &EV_parent_id)) == NULL) goto done;
    if (ref != UNSET && ref != Py_None) { python = 1; goto done; }
    int owner = owned_by(state, tenant);
    if (owner < 0) goto done;
    if (!owner) {  /* the run's first writer's tenant owns it (or the event is refused) */
        PyObject *r = PyObject_CallMethodObjArgs(b->processor, M_check_owner, state, event, NULL);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    if (parent == Py_None && type == (PyTypeObject *)T_spawn) {  /* a root's child.spawn: its link */
        PyObject *r = PyObject_CallMethodObjArgs(parents, M_learn, event, NULL);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    if (parent != Py_None) {  /* its ancestors: the route its run's last event gave, else _chain's */
        if ((route = get(own, &ST_route)) == NULL) goto done;
        int hit = 0;
        if (PyTuple_CheckExact(route) && PyTuple_GET_SIZE(route) == 5 && type != (PyTypeObject *)T_spawn) {
            if ((version = attr(parents, A_version)) == NULL || (root_id = get(event, &EV_root_id)) == NULL) goto done;
            hit = equal(PyTuple_GET_ITEM(route, 3), version);
            if (hit > 0) hit = equal(PyTuple_GET_ITEM(route, 0), parent);
            if (hit > 0) hit = equal(PyTuple_GET_ITEM(route, 1), root_id);
            if (hit > 0) hit = equal(PyTuple_GET_ITEM(route, 2), tenant);
            if (hit < 0) goto done;
        }
        ancestors = hit ? Py_NewRef(PyTuple_GET_ITEM(route, 4))
                        : PyObject_CallMethodObjArgs(b->processor, M_chain, own, event, run_id, Py_False, NULL);
        if (ancestors == NULL) goto done;
        if (!PyList_CheckExact(ancestors)) {
            PyErr_SetString(PyExc_TypeError, "a run's ancestors are a list");
            goto done;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ancestors); i++) {  /* all of this tenant's (the rule) */
            PyObject *name = PyList_GET_ITEM(ancestors, i);
            PyObject *above = PyDict_GetItemWithError(streams, name);
            if (above == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, name);
                goto done;
            }
            PyObject *above_state = get(above, &ST_state);
            if (above_state == NULL) goto done;
            int theirs = owned_by(above_state, tenant);
            Py_DECREF(above_state);
            if (theirs < 0) goto done;
            if (!theirs) {
                PyObject *kept = PyObject_CallMethodObjArgs(b->processor, M_same_tenant, ancestors, tenant, NULL);
                if (kept == NULL) goto done;
                Py_SETREF(ancestors, kept);
                if (!PyList_CheckExact(ancestors)) {
                    PyErr_SetString(PyExc_TypeError, "a run's ancestors are a list");
                    goto done;
                }
                break;
            }
        }
        if (PyList_GET_SIZE(ancestors)) {
            if ((held = get(state, &SS_ancestors)) == NULL) goto done;
            int same_chain = equal(held, ancestors);
            if (same_chain < 0 || (!same_chain && set(state, &SS_ancestors, ancestors) < 0)) goto done;
        }
    }
    /* from here on it is this step's: each admission its own, or _admit's */
    long long published_n;
    if ((published = get(event, &EV_seq)) == NULL) goto done;
    int overflow = 0;
    published_n = PyLong_Check(published) ? as_long(published, &overflow) : -1;
    if (!PyLong_Check(published) || overflow || (published_n == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_OverflowError, "a publisher seq past 64 bits");
        goto done;
    }
    Py_ssize_t count = ancestors == NULL ? 0 : PyList_GET_SIZE(ancestors);
    if (count) {
        PyObject *root = PyList_GET_ITEM(ancestors, count - 1);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *stream = PyDict_GetItemWithError(streams, PyList_GET_ITEM(ancestors, i));
            if (stream == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, PyList_GET_ITEM(ancestors, i));
                goto done;
            }
            Py_INCREF(stream);
            int last = i == count - 1;
            int r = admit(b, stream, event, published, published_n, source,
                          last ? Py_None : PyList_GET_ITEM(ancestors, i + 1), last ? Py_None : root, 1);
            Py_DECREF(stream);
            if (r < 0) goto done;
        }
    }
    if (admit(b, own, event, published, published_n, source, Py_None, Py_None, 0) < 0) goto done;
    if (type == (PyTypeObject *)T_lifecycle) {
        PyObject *ends = PyObject_CallOneArg(F_is_terminal, event);
        if (ends == NULL) goto done;
        int yes = PyObject_IsTrue(ends);
        Py_DECREF(ends);
        if (yes < 0) goto done;
        if (yes) {
            PyObject *ended = attr(b->processor, A_ended);
            int failed = ended == NULL || set(state, &SS_terminal, Py_True) < 0 || PyList_Append(ended, own) < 0;
            Py_XDECREF(ended);
            if (failed) goto done;
        }
    }
    rc = 0;
done:
    if (python) {
        PyObject *r = PyObject_CallMethodObjArgs(b->processor, M_one, event, b->outputs, b->now, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_XDECREF(run_id), Py_XDECREF(source), Py_XDECREF(own), Py_XDECREF(tenant), Py_XDECREF(state), Py_XDECREF(ref);
    Py_XDECREF(parent), Py_XDECREF(route), Py_XDECREF(version), Py_XDECREF(root_id);
    Py_XDECREF(ancestors), Py_XDECREF(held), Py_XDECREF(published);
    return rc;
}

static PyObject *process(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (T_output == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runwire.core._native.setup() was not called");
        return NULL;
    }
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "process(processor, events, outputs, now, in_place)");
        return NULL;
    }
    Batch b = {args[0], args[2], args[3], PyObject_IsTrue(args[4])};
    if (b.in_place < 0) return NULL;
    if (!PyDict_CheckExact(b.outputs)) {
        PyErr_SetString(PyExc_TypeError, "outputs is a dict");
        return NULL;
    }
    PyObject *events = PySequence_Fast(args[1], "events is a sequence");
    PyObject *streams = attr(b.processor, A_streams), *parents = attr(b.processor, A_parents);
    PyObject *failures = PyList_New(0);
    if (events == NULL || streams == NULL || parents == NULL || failures == NULL) goto fail;
    if (!PyDict_CheckExact(streams)) {
        PyErr_SetString(PyExc_TypeError, "the processor's streams are a dict");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(events); i++) {
        if (one(&b, streams, parents, PySequence_Fast_GET_ITEM(events, i)) == 0) continue;
        if (!PyErr_ExceptionMatches(PyExc_Exception)) goto fail;  /* (KeyboardInterrupt and the like go on up) */
        PyObject *kind, *error, *trace;
        PyErr_Fetch(&kind, &error, &trace);
        PyErr_NormalizeException(&kind, &error, &trace);
        if (trace != NULL) PyException_SetTraceback(error, trace);
        Py_XDECREF(kind), Py_XDECREF(trace);
        PyObject *failure = Py_BuildValue("(nN)", i, error);
        if (failure == NULL || PyList_Append(failures, failure) < 0) { Py_XDECREF(failure); goto fail; }
        Py_DECREF(failure);
    }
    Py_DECREF(events), Py_DECREF(streams), Py_DECREF(parents);
    return failures;
fail:
    Py_XDECREF(events), Py_XDECREF(streams), Py_XDECREF(parents), Py_XDECREF(failures);
    return NULL;
}

/* missing(processor, events, wanted): Processor.missing's loop; an event that states a link to
 * learn (a child.spawn), or a child's whose streams are not both loaded, to Processor._wanted */
static PyObject *missing(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PySet_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "missing(processor, events, wanted: set)");
        return NULL;
    }
    PyObject *processor = args[0], *wanted = args[2];
    PyObject *events = PySequence_Fast(args[1], "events is a sequence");
    PyObject *streams = events == NULL ? NULL : attr(processor, A_streams);
    if (streams == NULL || !PyDict_CheckExact(streams)) {
        if (streams != NULL) PyErr_SetString(PyExc_TypeError, "the processor's streams are a dict");
        Py_XDECREF(events), Py_XDECREF(streams);
        return NULL;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(events); i++) {
        PyObject *event = PySequence_Fast_GET_ITEM(events, i);
        PyObject *parent = NULL, *run_id = NULL, *root = NULL;
        int general = Py_TYPE(event) == (PyTypeObject *)T_spawn;
        if (!general) {
            failed = (parent = get(event, &EV_parent_id)) == NULL || (run_id = get(event, &EV_run_id)) == NULL;
            if (!failed && parent == Py_None) {  /* a root's own event: no ancestors */
                int held = PyDict_Contains(streams, run_id);
                failed = held < 0 || (!held && PySet_Add(wanted, run_id) < 0);
            } else if (!failed) {  /* a child of a loaded root: both its destinations loaded */
                failed = (root = get(event, &EV_root_id)) == NULL;
                int loaded = failed ? -1 : equal(parent, root);
                if (loaded > 0) loaded = PyDict_Contains(streams, parent);
                if (loaded > 0) loaded = PyDict_Contains(streams, run_id);
                failed = loaded < 0;
                general = loaded == 0;
            }
        }
        if (!failed && general) {
            PyObject *r = PyObject_CallMethodObjArgs(processor, M_wanted, event, wanted, NULL);
            failed = r == NULL;
            Py_XDECREF(r);
        }
        Py_XDECREF(parent), Py_XDECREF(run_id), Py_XDECREF(root);
    }
    Py_DECREF(events), Py_DECREF(streams);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* ---- a worker's write to Redis delivery streams, as RESP: runwire.bus.redis.entries.pack_append_many ----
 * Byte for byte its Python twin's (tests/bus/test_pack_native.py): the EVALSHA of APPEND_MANY,
 * each stream's keys (keys_of), its state, whether it ends its run, its entries; a stream of one
 * entry of contiguous seqs encoded as Lines (the worker's usual append) is read here, any other
 * through entry_args and ends_run's Python. Two passes: the sizes, then one bytes object written
 * in place (each event's line copied once, as b"".join copies it). */
static PyObject *P_entry_args, *P_ends_run, *P_lines, *P_lifecycle;
static Py_ssize_t P_entry_events;

typedef struct {
    PyObject *keys, *state, *joined, *entries;  /* joined: the one entry's lines; else entries */
    char spec[48];
    int spec_len, ends;
} Packed;

static Py_ssize_t digits_of(unsigned long long n) {
    Py_ssize_t d = 1;
    while (n >= 10) n /= 10, d++;
    return d;
}

static char *put_uint(char *at, unsigned long long n) {
    Py_ssize_t d = digits_of(n);
    for (Py_ssize_t i = d - 1; i >= 0; i--) at[i] = (char)('0' + n % 10), n /= 10;
    return at + d;
}

static Py_ssize_t bulk_size(Py_ssize_t n) { return 1 + digits_of((unsigned long long)n) + 2 + n + 2; }

static char *put_bulk(char *at, const char *data, Py_ssize_t n) {
    *at++ = '$';
    at = put_uint(at, (unsigned long long)n);
    *at++ = '\r', *at++ = '\n';
    memcpy(at, data, n);
    at += n;
    *at++ = '\r', *at++ = '\n';
    return at;
}

static char *put_bulk_int(char *at, unsigned long long value) {
    char digits[24];
    Py_ssize_t d = put_uint(digits, value) - digits;
    return put_bulk(at, digits, d);
}

static Py_ssize_t bulk_int_size(unsigned long long value) { return bulk_size(digits_of(value)); }

/* One stream's entries: its one entry read here (1), or entry_args's list (0); -1 an error */
static int pack_one(Packed *p, PyObject *events, PyObject *encoded) {
    Py_ssize_t n = PyList_CheckExact(events) ? PyList_GET_SIZE(events) : -1;
    if (n > 0 && n <= P_entry_events && Py_IS_TYPE(encoded, (PyTypeObject *)P_lines)
        && PyObject_Length(encoded) == n) {
        long long first, last;
        if (get_long(PyList_GET_ITEM(events, 0), &EV_seq, &first) < 0
            || get_long(PyList_GET_ITEM(events, n - 1), &EV_seq, &last) < 0) return -1;
        if (first >= 0 && last - first == n - 1) {
            PyObject *joined = PyObject_GetAttrString(encoded, "joined");
            if (joined == NULL) return -1;
            if (PyBytes_CheckExact(joined)) {
                p->joined = joined;
                p->spec_len = snprintf(p->spec, sizeof(p->spec), "%lld+%zd", first, n);
                return 1;
            }
            Py_DECREF(joined);
        }
    }
    if (PyErr_Occurred()) return -1;
    p->entries = PyObject_CallFunctionObjArgs(P_entry_args, events, encoded, NULL);
    if (p->entries == NULL) return -1;
    if (!PyList_CheckExact(p->entries)) {
        PyErr_SetString(PyExc_TypeError, "entry_args gives a list");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(p->entries); i++) {
        if (!PyBytes_Check(PyList_GET_ITEM(p->entries, i))) {
            PyErr_SetString(PyExc_TypeError, "an entry's parts are bytes");
            return -1;
        }
    }
    return 0;
}

/* ends_run(events): no run.lifecycle among them (most appends), else its Python */
static int ends_of(PyObject *events) {
    if (PyList_CheckExact(events)) {
        int any = 0;
        for (Py_ssize_t i = 0; !any && i < PyList_GET_SIZE(events); i++)
            any = Py_TYPE(PyList_GET_ITEM(events, i)) == (PyTypeObject *)P_lifecycle;
        if (!any) return 0;
    }
    PyObject *r = PyObject_CallOneArg(P_ends_run, events);
    if (r == NULL) return -1;
    int yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    return yes;
}

static PyObject *pack_append_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (P_entry_args == NULL || nargs != 4 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, P_entry_args == NULL ? "setup_pack() was not called"
                        : "pack_append_many(framed_sha: bytes, head: bytes, appends, keys_of)");
        return NULL;
    }
    PyObject *sha = args[0], *head = args[1], *keys_of = args[3];
    PyObject *appends = PySequence_Fast(args[2], "appends is a sequence");
    if (appends == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(appends), arguments = 3, size = 0, done = 0;
    Packed *packed = PyMem_Calloc(count ? count : 1, sizeof(Packed));
    PyObject *result = NULL;
    if (packed == NULL) { PyErr_NoMemory(); goto finish; }
    for (; done < count; done++) {
        Packed *p = &packed[done];
        PyObject *item = PySequence_Fast_GET_ITEM(appends, done);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "an append is (key, events, encoded, state)");
            goto finish;
        }
        PyObject *key = PyTuple_GET_ITEM(item, 0), *events = PyTuple_GET_ITEM(item, 1),
                 *encoded = PyTuple_GET_ITEM(item, 2), *state = PyTuple_GET_ITEM(item, 3);
        if ((p->keys = PyObject_CallOneArg(keys_of, key)) == NULL) goto finish;
        if (!PyBytes_CheckExact(p->keys) || (state != Py_None && !PyBytes_CheckExact(state))) {
            PyErr_SetString(PyExc_TypeError, "framed keys and a state are bytes");
            goto finish;
        }
        p->state = Py_NewRef(state);
        int one = pack_one(p, events, encoded);
        if (one < 0 || (p->ends = ends_of(events)) < 0) goto finish;
        Py_ssize_t entries = one ? 2 : PyList_GET_SIZE(p->entries);
        arguments += 4 + entries;
        size += PyBytes_GET_SIZE(p->keys);
        size += state == Py_None ? 13 : 7 + bulk_size(PyBytes_GET_SIZE(state));
        size += 7 + bulk_int_size((unsigned long long)(entries / 2));
        if (one) {
            size += bulk_size(p->spec_len) + bulk_size(PyBytes_GET_SIZE(p->joined));
        } else {
            for (Py_ssize_t i = 0; i < entries; i++) size += bulk_size(PyBytes_GET_SIZE(PyList_GET_ITEM(p->entries, i)));
        }
    }
    Py_ssize_t keys = count * 3, total = 3 + keys + arguments;
    size += 1 + digits_of((unsigned long long)total) + 2 + 13 + PyBytes_GET_SIZE(sha)
            + bulk_int_size((unsigned long long)keys) + PyBytes_GET_SIZE(head);
    if ((result = PyBytes_FromStringAndSize(NULL, size)) == NULL) goto finish;
    char *at = PyBytes_AS_STRING(result);
    *at++ = '*';
    at = put_uint(at, (unsigned long long)total);
    memcpy(at, "\r\n$7\r\nEVALSHA\r\n", 15);
    at += 15;
    memcpy(at, PyBytes_AS_STRING(sha), PyBytes_GET_SIZE(sha));
    at += PyBytes_GET_SIZE(sha);
    at = put_bulk_int(at, (unsigned long long)keys);
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(at, PyBytes_AS_STRING(packed[i].keys), PyBytes_GET_SIZE(packed[i].keys));
        at += PyBytes_GET_SIZE(packed[i].keys);
    }
    memcpy(at, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head));
    at += PyBytes_GET_SIZE(head);
    for (Py_ssize_t i = 0; i < count; i++) {
        Packed *p = &packed[i];
        if (p->state == Py_None) {
            memcpy(at, "$1\r\n0\r\n$0\r\n\r\n", 13);
            at += 13;
        } else {
            memcpy(at, "$1\r\n1\r\n", 7);
            at = put_bulk(at + 7, PyBytes_AS_STRING(p->state), PyBytes_GET_SIZE(p->state));
        }
        memcpy(at, p->ends ? "$1\r\n1\r\n" : "$1\r\n0\r\n", 7);
        at += 7;
        if (p->joined != NULL) {
            at = put_bulk_int(at, 1);
            at = put_bulk(at, p->spec, p->spec_len);
            at = put_bulk(at, PyBytes_AS_STRING(p->joined), PyBytes_GET_SIZE(p->joined));
        } else {
            at = put_bulk_int(at, (unsigned long long)(PyList_GET_SIZE(p->entries) / 2));
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(p->entries); j++) {
                PyObject *part = PyList_GET_ITEM(p->entries, j);
                at = put_bulk(at, PyBytes_AS_STRING(part), PyBytes_GET_SIZE(part));
            }
        }
    }
    if (at != PyBytes_AS_STRING(result) + size) {
        PyErr_SetString(PyExc_SystemError, "pack_append_many: the sizes did not add up");
        Py_CLEAR(result);
    }
finish:
    for (Py_ssize_t i = 0; packed != NULL && i < count && i <= done; i++) {
        Py_XDECREF(packed[i].keys), Py_XDECREF(packed[i].state), Py_XDECREF(packed[i].joined);
        Py_XDECREF(packed[i].entries);
    }
    PyMem_Free(packed);
    Py_DECREF(appends);
    return result;
}


/* ---- runwire.core.envelope's timestamp check (events.py's _TS_PATTERN, re.ASCII) ----
 * ^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\Z, ASCII digits only;
 * its twin is the regex (tests/test_ts_native.py compares them over generated strings). */
static inline int digits(const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

static int ts_matches(PyObject *value) {
    if (!PyUnicode_Check(value) || PyUnicode_READY(value) < 0 || !PyUnicode_IS_ASCII(value)) return 0;
    const char *s = (const char *)PyUnicode_DATA(value);
    Py_ssize_t n = PyUnicode_GET_LENGTH(value), i = 19;
    if (n < 20 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' || !digits(s + 8, 2)
        || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !digits(s + 11, 2) || s[13] != ':'
        || !digits(s + 14, 2) || s[16] != ':' || !digits(s + 17, 2))
        return 0;
    if (s[i] == '.') {
        Py_ssize_t start = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == start || i - start > 9) return 0;
    }
    if (i < n && (s[i] == 'Z' || s[i] == 'z')) return i + 1 == n;
    return i + 6 == n && (s[i] == '+' || s[i] == '-') && digits(s + i + 1, 2) && s[i + 3] == ':'
           && digits(s + i + 4, 2);
}

/* ts_all_match(events) -> bool: whether every event's ts matches (setup_ts first) */
static PyObject *ts_all_match(PyObject *module, PyObject *events) {
    if (!PyList_Check(events)) {
        PyErr_SetString(PyExc_TypeError, "ts_all_match() takes a list of events");
        return NULL;
    }
    PyObject *last = NULL;  /* (neighbours often share a ts: the same str, checked once) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *ts = get(PyList_GET_ITEM(events, i), &EV_ts);
        if (ts == NULL) return NULL;
        int ok = ts == last || ts_matches(ts);
        Py_DECREF(ts);  /* (the event holds it while the list does) */
        if (!ok) Py_RETURN_FALSE;
        last = ts;
    }
    Py_RETURN_TRUE;
}

/* ts_new(events, cache) -> [ts]: the events' distinct ts not in cache (a dict), in order */
static PyObject *ts_new(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "ts_new(events, cache) takes a list and a dict");
        return NULL;
    }
    PyObject *events = args[0], *cache = args[1], *out = PyList_New(0), *seen = NULL, *last = NULL;
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *ts = get(PyList_GET_ITEM(events, i), &EV_ts);
        if (ts == NULL) goto failed;
        int skip = ts == last;  /* (neighbours often share a ts: the same str) */
        last = ts;
        if (!skip) skip = PyDict_Contains(cache, ts);
        if (!skip && seen != NULL) skip = PySet_Contains(seen, ts);
        if (skip == 0) {
            if ((seen == NULL && (seen = PySet_New(NULL)) == NULL) || PySet_Add(seen, ts) < 0
                || PyList_Append(out, ts) < 0)
                skip = -1;
        }
        Py_DECREF(ts);  /* (the event holds it while the list does) */
        if (skip < 0) goto failed;
    }
    Py_XDECREF(seen);
    return out;
failed:
    Py_XDECREF(seen);
    Py_DECREF(out);
    return NULL;
}

/* deep_lines(joined, count, indexes, limit) -> [index] | None: runwire.core.joined's twin. Of the
 * lines of `joined` (split at each '\n'), those at `indexes` (ascending) whose '{' and '[' number
 * more than `limit`; None when `joined` is not `count` lines. One pass, no line copied. */
static PyObject *deep_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t count, limit;
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyList_Check(args[2])
        || (count = PyLong_AsSsize_t(args[1])) < 0 || (limit = PyLong_AsSsize_t(args[3])) < 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "deep_lines(joined: bytes, count >= 0, indexes: list, limit >= 0)");
        }
        return NULL;
    }
    const char *at = PyBytes_AS_STRING(args[0]), *end = at + PyBytes_GET_SIZE(args[0]);
    PyObject *indexes = args[2], *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t line = 0, next = 0, wanted = -1, last = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(indexes); i++) {
        Py_ssize_t index = PyLong_AsSsize_t(PyList_GET_ITEM(indexes, i));
        if (index == -1 && PyErr_Occurred()) goto failed;
        if (index <= last || index >= count) {
            PyErr_SetString(PyExc_ValueError, "deep_lines() takes ascending indexes below count");
            goto failed;
        }
        last = index;
    }
    for (;;) {
        if (wanted < 0 && next < PyList_GET_SIZE(indexes))
            wanted = PyLong_AsSsize_t(PyList_GET_ITEM(indexes, next++));
        const char *nl = memchr(at, '\n', (size_t)(end - at));
        const char *stop = nl == NULL ? end : nl;
        if (line == wanted) {
            Py_ssize_t brackets = 0;
            for (const char *c = at; c < stop; c++) brackets += *c == '{' || *c == '[';
            if (brackets > limit) {
                PyObject *index = PyLong_FromSsize_t(line);
                if (index == NULL || PyList_Append(out, index) < 0) { Py_XDECREF(index); goto failed; }
                Py_DECREF(index);
            }
            wanted = -1;
        }
        line++;
        if (nl == NULL) break;
        at = nl + 1;
    }
    if (line != count || wanted >= 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
failed:
    Py_DECREF(out);
    return NULL;
}

/* ascending_past(events, last) -> bool: runwire.bus.base's twin. Whether the list holds events
 * whose seqs are each above `last` and the one before (setup_ts first: the seq read in its slot) */
static PyObject *ascending_past(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    long long prev;
    if (nargs != 2 || !PyList_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "ascending_past(events: list, last: int)");
        return NULL;
    }
    int overflow = 0;
    prev = as_long(args[1], &overflow);
    if (overflow || (prev == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_OverflowError, "ascending_past(): last is past 64 bits");
        return NULL;
    }
    PyObject *events = args[0];
    if (PyList_GET_SIZE(events) == 0) Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        long long seq;
        if (get_long(PyList_GET_ITEM(events, i), &EV_seq, &seq) < 0) return NULL;
        if (seq <= prev) Py_RETURN_FALSE;
        prev = seq;
    }
    Py_RETURN_TRUE;
}

/* deep_candidates(events, free_form) -> [index]: runwire.core.envelope's twin. The indexes of the
 * events of a type in the tuple `free_form`, or with an `ext` that is not None (setup_ts first) */
static PyObject *deep_candidates(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "deep_candidates(events: list, free_form: tuple)");
        return NULL;
    }
    PyObject *events = args[0], *types = args[1], *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        int found = 0;
        for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(types) && !found; t++)
            found = (PyObject *)Py_TYPE(event) == PyTuple_GET_ITEM(types, t);
        if (!found) {
            PyObject *ext = get(event, &EV_ext);
            if (ext == NULL) { Py_DECREF(out); return NULL; }
            found = ext != Py_None;
            Py_DECREF(ext);
        }
        if (found) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(out, index) < 0) { Py_XDECREF(index); Py_DECREF(out); return NULL; }
            Py_DECREF(index);
        }
    }
    return out;
}

/* ts_matches(value) -> bool: one value (the twin test's) */
static PyObject *ts_matches_py(PyObject *module, PyObject *value) {
    return PyBool_FromLong(ts_matches(value));
}

static PyObject *setup_ts(PyObject *module, PyObject *envelope) {
    if (!PyType_Check(envelope)) {
        PyErr_SetString(PyExc_TypeError, "setup_ts() takes the Envelope type");
        return NULL;
    }
    if (find_field(&EV_ts, (PyTypeObject *)envelope, 0) < 0 || find_field(&EV_seq, (PyTypeObject *)envelope, 0) < 0
        || find_field(&EV_ext, (PyTypeObject *)envelope, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *setup_pack(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"entry_args", "ends_run", "lines", "run_lifecycle", "entry_events", NULL};
    PyObject *entry_args, *ends_run, *lines, *lifecycle;
    Py_ssize_t entry_events;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOO!O!n", names, &entry_args, &ends_run, &PyType_Type, &lines,
                                     &PyType_Type, &lifecycle, &entry_events))
        return NULL;
    Py_XSETREF(P_entry_args, Py_NewRef(entry_args));
    Py_XSETREF(P_ends_run, Py_NewRef(ends_run));
    Py_XSETREF(P_lines, Py_NewRef(lines));
    Py_XSETREF(P_lifecycle, Py_NewRef(lifecycle));
    P_entry_events = entry_events;
    Py_RETURN_NONE;
}

static PyObject *setup(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"output", "window", "text_delta", "reasoning_delta", "child_spawn",
                            "run_lifecycle", "unset", "replace", "is_terminal", "format_millis",
                            "ts_cache", "text_suffix", "reasoning_suffix", "text_payload", "no_end",
                            "last_seq", "metered", "types", NULL};
    PyObject *given[17], *types;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOOOOOO!UUOOOO!O!", names, &given[0], &given[1],
                                     &given[2], &given[3], &given[4], &given[5], &given[6], &given[7],
                                     &given[8], &given[9], &PyDict_Type, &given[10], &given[11], &given[12],
                                     &given[13], &given[14], &given[15], &PyFrozenSet_Type, &given[16],
                                     &PyDict_Type, &types))
        return NULL;
    if (find_fields(types) < 0) return NULL;
    PyObject *copy = _PyType_Lookup(EV_seq.type, PyUnicode_InternFromString("__copy__"));
    COPY = copy != NULL && Py_IS_TYPE(copy, &PyMethodDescr_Type)
           && ((PyMethodDescrObject *)copy)->d_method->ml_flags == METH_NOARGS
           ? ((PyMethodDescrObject *)copy)->d_method->ml_meth : NULL;
    PyObject **slots[] = {&T_output, &T_window, &T_text, &T_reasoning, &T_spawn, &T_lifecycle, &UNSET,
                          &F_replace, &F_is_terminal, &F_format_millis, &TS_CACHE, &S_text, &S_reasoning,
                          &T_text_payload, &NO_END, &F_last_seq, &METERED};
    for (int i = 0; i < 17; i++) Py_XSETREF(*slots[i], Py_NewRef(given[i]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"process", (PyCFunction)(void (*)(void))process, METH_FASTCALL,
     "process(processor, events, outputs, now, in_place) -> [(index, error)]: Processor.process_each's loop."},
    {"pack_append_many", (PyCFunction)(void (*)(void))pack_append_many, METH_FASTCALL,
     "pack_append_many(framed_sha, head, appends, keys_of) -> bytes: runwire.bus.redis.entries'."},
    {"setup_pack", (PyCFunction)(void (*)(void))setup_pack, METH_VARARGS | METH_KEYWORDS,
     "setup_pack(entry_args, ends_run, lines, run_lifecycle, entry_events): once, before pack_append_many()."},
    {"missing", (PyCFunction)(void (*)(void))missing, METH_FASTCALL,
     "missing(processor, events, wanted): Processor.missing's loop, adding to wanted."},
    {"ts_all_match", ts_all_match, METH_O,
     "ts_all_match(events) -> bool: whether every event's ts is an RFC 3339 timestamp (setup_ts first)."},
    {"deep_lines", (PyCFunction)(void (*)(void))deep_lines, METH_FASTCALL,
     "deep_lines(joined, count, indexes, limit) -> [index] | None: the lines at indexes with more than limit "
     "brackets; None when joined is not count lines."},
    {"ts_new", (PyCFunction)(void (*)(void))ts_new, METH_FASTCALL,
     "ts_new(events, cache) -> [ts]: the events' distinct ts not in cache, in order (setup_ts first)."},
    {"ts_matches", ts_matches_py, METH_O, "ts_matches(value) -> bool: events.py's _TS_RE.match, for one value."},
    {"setup_ts", setup_ts, METH_O, "setup_ts(Envelope): once, before ts_all_match(), ts_new(), ascending_past() and deep_candidates()."},
    {"deep_candidates", (PyCFunction)(void (*)(void))deep_candidates, METH_FASTCALL,
     "deep_candidates(events, free_form) -> [index]: the events of a free_form type or with an ext (setup_ts first)."},
    {"ascending_past", (PyCFunction)(void (*)(void))ascending_past, METH_FASTCALL,
     "ascending_past(events, last) -> bool: whether each event's seq is above last and the one before (setup_ts first)."},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(**types and functions of runwire.processing): once, before process()."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, 0, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (intern_all() < 0 || PyType_Ready(&RunSummaryType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "RunSummary", (PyObject *)&RunSummaryType) < 0) Py_CLEAR(m);
    return m;
}
