/* OTLP protobuf trace requests straight to the buffers of the spans table's Arrow columns.
 *
 * The decode workers' Python walk over protobuf objects was most of ingest's CPU (bench/decode.py). This walks
 * the wire format once and writes the column buffers directly. It handles the requests that need nothing but
 * that: every span valid, nothing past the span limits, no duplicate keys or spans, only the attribute value
 * kinds below. For anything else it answers None and the Python decoder (mapping.otlp, span_rows), which
 * defines the behaviour, decodes the request instead; tests hold the two to the same rows.
 *
 * Every read is bounds-checked against the request: a hostile request can only make it answer None. The walk runs
 * without the GIL (its buffers come from PyMem_Raw*; a float takes the GIL back for float_text), so the server
 * decodes on threads in parallel with its own Python work.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fixed64 fields are read as little-endian"
#endif

enum { OK = 0, FALLBACK = 1, NOMEM = -1 };
#define TRY(expr) do { int rc_ = (expr); if (rc_ != OK) return rc_; } while (0)
#define MAX_COLUMN_BYTES ((size_t)1 << 30) /* Arrow string offsets are int32; past this, Python decodes */
#define MAX_PRECEDENCE 32
#define MAX_RESOURCE_ATTRIBUTES 65536 /* the Python path keeps them all; past this many, it decodes the request */

/* --- growable buffers ------------------------------------------------------------------------------------ */

typedef struct { char *data; size_t len, cap; } Buf;

static int buf_grow(Buf *b, size_t extra) {
    if (extra > MAX_COLUMN_BYTES || b->len + extra > MAX_COLUMN_BYTES) return FALLBACK;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra) cap *= 2;
    char *p = PyMem_RawRealloc(b->data, cap);
    if (p == NULL) return NOMEM;
    b->data = p;
    b->cap = cap;
    return OK;
}

static inline int buf_put(Buf *b, const void *s, size_t n) {
    if (n > b->cap - b->len) TRY(buf_grow(b, n));
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    return OK;
}

#define PUT_LIT(b, s) buf_put((b), (s), sizeof(s) - 1)

static inline int buf_byte(Buf *b, char c) { return buf_put(b, &c, 1); }

static void buf_free(Buf *b) {
    PyMem_RawFree(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* --- the wire format -------------------------------------------------------------------------------------- */

typedef struct { const uint8_t *p, *end; } Reader;
typedef struct { uint32_t num; int wire; uint64_t v; const uint8_t *p; size_t len; } Field;

/* A varint of at most `max_bytes` bytes: protobuf's parser takes values in up to 10, but tags and lengths in no
 * more than 5 (a longer one makes it reject the message, which the Python decoder reports). */
static int read_varint(Reader *r, uint64_t *out, int max_bytes) {
    uint64_t v = 0;
    for (int shift = 0; shift <= 63 && shift < 7 * max_bytes; shift += 7) {
        if (r->p >= r->end) return FALLBACK;
        uint8_t b = *r->p++;
        if (shift == 63 && b > 1) return FALLBACK;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return OK;
        }
    }
    return FALLBACK;
}

static int read_field(Reader *r, Field *f) {
    uint64_t key;
    TRY(read_varint(r, &key, 5));
    if ((key >> 3) == 0 || (key >> 3) > 536870911u) return FALLBACK;
    f->num = (uint32_t)(key >> 3);
    f->wire = (int)(key & 7);
    switch (f->wire) {
    case 0:
        return read_varint(r, &f->v, 10);
    case 1:
        if (r->end - r->p < 8) return FALLBACK;
        memcpy(&f->v, r->p, 8);
        r->p += 8;
        return OK;
    case 5: {
        uint32_t v32;
        if (r->end - r->p < 4) return FALLBACK;
        memcpy(&v32, r->p, 4);
        f->v = v32;
        r->p += 4;
        return OK;
    }
    case 2: {
        uint64_t n;
        TRY(read_varint(r, &n, 5));
        if (n > (uint64_t)(r->end - r->p)) return FALLBACK;
        f->p = r->p;
        f->len = (size_t)n;
        r->p += n;
        return OK;
    }
    default: /* groups: never in OTLP */
        return FALLBACK;
    }
}

#define EXPECT(f, w) do { if ((f).wire != (w)) return FALLBACK; } while (0)

/* Strict UTF-8 as protobuf requires of string fields (no overlongs, no surrogates, nothing past U+10FFFF). */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t chunk;
            memcpy(&chunk, s + i, 8);
            if (!(chunk & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; cp = c & 0x07; }
        else return 0;
        if (n - i - 1 < need) return 0;
        for (size_t k = 1; k <= need; k++) {
            uint8_t cc = s[i + k];
            if ((cc & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if (need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
        if (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

static inline int bytes_field(const Field *f, const uint8_t **p, size_t *len) {
    if (f->wire != 2) return FALLBACK;
    *p = f->p;
    *len = f->len;
    return OK;
}

static inline int string_field(const Field *f) {
    if (f->wire != 2 || !utf8_valid(f->p, f->len)) return FALLBACK;
    return OK;
}

/* --- JSON text (what orjson writes: the same escapes, UTF-8 as it is) ------------------------------------ */

static const char HEX[] = "0123456789abcdef";
static unsigned char ESCAPE[256];

static int json_string(Buf *b, const uint8_t *s, size_t n) {
    TRY(buf_byte(b, '"'));
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (!ESCAPE[c]) continue;
        TRY(buf_put(b, s + start, i - start));
        start = i + 1;
        switch (c) {
        case '"': TRY(PUT_LIT(b, "\\\"")); break;
        case '\\': TRY(PUT_LIT(b, "\\\\")); break;
        case '\n': TRY(PUT_LIT(b, "\\n")); break;
        case '\r': TRY(PUT_LIT(b, "\\r")); break;
        case '\t': TRY(PUT_LIT(b, "\\t")); break;
        case '\b': TRY(PUT_LIT(b, "\\b")); break;
        case '\f': TRY(PUT_LIT(b, "\\f")); break;
        default: {
            char esc[6] = {'\\', 'u', '0', '0', HEX[c >> 4], HEX[c & 15]};
            TRY(buf_put(b, esc, 6));
        }
        }
    }
    TRY(buf_put(b, s + start, n - start));
    return buf_byte(b, '"');
}

static int json_uint(Buf *b, uint64_t v) {
    char digits[24];
    int i = 24;
    do {
        digits[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return buf_put(b, digits + i, (size_t)(24 - i));
}

static int json_int(Buf *b, int64_t v) {
    if (v >= 0) return json_uint(b, (uint64_t)v);
    TRY(buf_byte(b, '-'));
    return json_uint(b, (uint64_t)0 - (uint64_t)v);
}

static int hex(Buf *b, const uint8_t *s, size_t n) {
    if (n > (SIZE_MAX / 2)) return FALLBACK;
    if (2 * n > b->cap - b->len) TRY(buf_grow(b, 2 * n));
    char *out = b->data + b->len;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = HEX[s[i] >> 4];
        out[2 * i + 1] = HEX[s[i] & 15];
    }
    b->len += 2 * n;
    return OK;
}

/* --- attribute values --------------------------------------------------------------------------------------- */

enum { V_NULL, V_STRING, V_BOOL, V_INT, V_DOUBLE, V_ARRAY };

typedef struct {
    int type;
    const uint8_t *p; /* V_STRING: the text; V_ARRAY: the ArrayValue message */
    size_t len;
    int64_t i;
    double d;
} Value;

typedef struct {
    const uint8_t *key;
    size_t key_len;
    Value value;
} Attribute;

/* An AnyValue with one scalar (or an array of scalars) set; kvlist and bytes values go the Python way. */
static int parse_any(const uint8_t *p, size_t n, Value *v) {
    Reader r = {p, p + n};
    v->type = V_NULL;
    int seen = 0;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        if (seen++) return FALLBACK; /* a oneof set twice: protobuf keeps the last, or merges messages */
        switch (f.num) {
        case 1: TRY(string_field(&f)); v->type = V_STRING; v->p = f.p; v->len = f.len; break;
        case 2: EXPECT(f, 0); v->type = V_BOOL; v->i = f.v != 0; break;
        case 3: EXPECT(f, 0); v->type = V_INT; v->i = (int64_t)f.v; break;
        case 4: EXPECT(f, 1); v->type = V_DOUBLE; memcpy(&v->d, &f.v, 8); break;
        case 5: EXPECT(f, 2); v->type = V_ARRAY; v->p = f.p; v->len = f.len; break;
        default: return FALLBACK;
        }
    }
    return OK;
}

typedef struct {
    PyObject *float_text; /* orjson.dumps: floats in exactly the text the Python path writes */
    size_t value_length;  /* strings longer than this are cut: the Python path does that */
    PyThreadState **released; /* the walk runs without the GIL; a float takes it back to call float_text */
} JsonOptions;

/* The float's JSON text from float_text (the GIL held). */
static int float_json(Buf *b, double value, PyObject *float_text) {
    PyObject *number = PyFloat_FromDouble(value);
    if (number == NULL) {
        PyErr_Clear();
        return NOMEM;
    }
    PyObject *text = PyObject_CallOneArg(float_text, number);
    Py_DECREF(number);
    if (text == NULL || !PyBytes_Check(text)) {
        Py_XDECREF(text);
        PyErr_Clear();
        return FALLBACK;
    }
    int rc = buf_put(b, PyBytes_AS_STRING(text), (size_t)PyBytes_GET_SIZE(text));
    Py_DECREF(text);
    return rc;
}

static int json_scalar(Buf *b, const Value *v, const JsonOptions *o) {
    switch (v->type) {
    case V_NULL: return PUT_LIT(b, "null");
    case V_STRING:
        if (v->len > o->value_length) return FALLBACK; /* bytes past the limit: characters may be too */
        return json_string(b, v->p, v->len);
    case V_BOOL: return v->i ? PUT_LIT(b, "true") : PUT_LIT(b, "false");
    case V_INT: return json_int(b, v->i);
    case V_DOUBLE: {
        if (!isfinite(v->d)) return FALLBACK;
        PyEval_RestoreThread(*o->released);
        int rc = float_json(b, v->d, o->float_text);
        *o->released = PyEval_SaveThread();
        return rc;
    }
    default: return FALLBACK;
    }
}

static int json_value(Buf *b, const Value *v, const JsonOptions *o) {
    if (v->type != V_ARRAY) return json_scalar(b, v, o);
    Reader r = {v->p, v->p + v->len};
    TRY(buf_byte(b, '['));
    int first = 1;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        if (f.num != 1 || f.wire != 2) return FALLBACK;
        Value item;
        TRY(parse_any(f.p, f.len, &item));
        if (item.type == V_ARRAY) return FALLBACK; /* nested arrays: the Python path checks their depth */
        if (!first) TRY(buf_byte(b, ','));
        first = 0;
        TRY(json_scalar(b, &item, o));
    }
    return buf_byte(b, ']');
}

/* --- scratch arrays ----------------------------------------------------------------------------------------- */

typedef struct { Attribute *items; size_t len, cap; } Attributes;
typedef struct { const uint8_t *p; size_t len; } Slice;
typedef struct { Slice *items; size_t len, cap; } Slices;

static int attributes_push(Attributes *a, Attribute item) {
    if (a->len == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        Attribute *p = PyMem_RawRealloc(a->items, cap * sizeof(Attribute));
        if (p == NULL) return NOMEM;
        a->items = p;
        a->cap = cap;
    }
    a->items[a->len++] = item;
    return OK;
}

static int slices_push(Slices *s, const uint8_t *p, size_t len) {
    if (s->len == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        Slice *items = PyMem_RawRealloc(s->items, cap * sizeof(Slice));
        if (items == NULL) return NOMEM;
        s->items = items;
        s->cap = cap;
    }
    s->items[s->len].p = p;
    s->items[s->len].len = len;
    s->len++;
    return OK;
}

/* A set of byte strings by open addressing, for duplicate attribute keys and duplicate spans. */
typedef struct { uint32_t *slots; size_t cap; } Seen;

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* Past this many probes for one string the set is being flooded (keys chosen to collide under this unkeyed
 * hash): the Python decoder's dicts (keyed SipHash) take the request instead of a quadratic walk here. */
#define MAX_PROBES 64

/* Whether any two of `n` byte strings (start and length through `at`) are equal; FALLBACK when flooded. */
static int any_equal(Seen *seen, size_t n, const uint8_t *(*at)(const void *, size_t, size_t *), const void *ctx,
                     int *found) {
    *found = 0;
    if (n < 2) return OK;
    if (n >= UINT32_MAX) return FALLBACK; /* slots hold uint32 indices, UINT32_MAX marks an empty one */
    if (n <= 8) {
        for (size_t i = 0; i < n; i++) {
            size_t li;
            const uint8_t *si = at(ctx, i, &li);
            for (size_t j = i + 1; j < n; j++) {
                size_t lj;
                const uint8_t *sj = at(ctx, j, &lj);
                if (li == lj && memcmp(si, sj, li) == 0) {
                    *found = 1;
                    return OK;
                }
            }
        }
        return OK;
    }
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    if (cap > seen->cap) {
        uint32_t *slots = PyMem_RawRealloc(seen->slots, cap * sizeof(uint32_t));
        if (slots == NULL) return NOMEM;
        seen->slots = slots;
        seen->cap = cap;
    }
    memset(seen->slots, 0xff, cap * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        size_t li;
        const uint8_t *si = at(ctx, i, &li);
        size_t slot = (size_t)hash_bytes(si, li) & (cap - 1);
        int probes = 0;
        while (seen->slots[slot] != UINT32_MAX) {
            size_t lj;
            const uint8_t *sj = at(ctx, seen->slots[slot], &lj);
            if (li == lj && memcmp(si, sj, li) == 0) {
                *found = 1;
                return OK;
            }
            if (++probes > MAX_PROBES) return FALLBACK;
            slot = (slot + 1) & (cap - 1);
        }
        seen->slots[slot] = (uint32_t)i;
    }
    return OK;
}

static const uint8_t *attribute_key(const void *ctx, size_t i, size_t *len) {
    const Attribute *a = &((const Attributes *)ctx)->items[i];
    *len = a->key_len;
    return a->key;
}

static const uint8_t *span_key(const void *ctx, size_t i, size_t *len) {
    *len = 24;
    return (const uint8_t *)((const Buf *)ctx)->data + 24 * i;
}

/* --- key-value lists ------------------------------------------------------------------------------------------ */

/* Append the KeyValue messages in `list` (slices) as parsed attributes to `out`. */
/* One attribute onto `out`; past `max` of them, Python decodes the request: a span with millions of attributes makes
 * no array of millions here (the walk runs in the server, and the Python path cuts them to the limits anyway). */
static int parse_key_value(const uint8_t *p, size_t n, Attributes *out, size_t max) {
    if (out->len >= max) return FALLBACK;
    Reader r = {p, p + n};
    Attribute a = {(const uint8_t *)"", 0, {V_NULL, NULL, 0, 0, 0.0}};
    int values = 0;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        if (f.num == 1) {
            TRY(string_field(&f));
            a.key = f.p;
            a.key_len = f.len;
        } else if (f.num == 2) {
            EXPECT(f, 2);
            if (values++) return FALLBACK; /* a message field set twice is merged by protobuf */
            TRY(parse_any(f.p, f.len, &a.value));
        } else {
            return FALLBACK;
        }
    }
    return attributes_push(out, a);
}

static int json_object(Buf *b, Seen *seen, const Attributes *a, const JsonOptions *o) {
    int duplicate;
    TRY(any_equal(seen, a->len, attribute_key, a, &duplicate));
    if (duplicate) return FALLBACK; /* a dict keeps the first position and the last value */
    TRY(buf_byte(b, '{'));
    for (size_t i = 0; i < a->len; i++) {
        if (i) TRY(buf_byte(b, ','));
        TRY(json_string(b, a->items[i].key, a->items[i].key_len));
        TRY(buf_byte(b, ':'));
        TRY(json_value(b, &a->items[i].value, o));
    }
    return buf_byte(b, '}');
}

static const Value *lookup(const Attributes *a, const uint8_t *key, size_t len) {
    for (size_t i = 0; i < a->len; i++)
        if (a->items[i].key_len == len && memcmp(a->items[i].key, key, len) == 0) return &a->items[i].value;
    return NULL;
}

/* --- columns ------------------------------------------------------------------------------------------------- */

typedef struct {
    Buf data, offsets, validity;
    int nullable;
    size_t rows, nulls;
} Column;

static int column_end(Column *c, int valid) {
    if (c->data.len > MAX_COLUMN_BYTES) return FALLBACK;
    int32_t offset = (int32_t)c->data.len;
    TRY(buf_put(&c->offsets, &offset, 4));
    if (c->nullable) {
        if (c->rows % 8 == 0) TRY(buf_byte(&c->validity, 0));
        if (valid) c->validity.data[c->validity.len - 1] |= (char)(1 << (c->rows % 8));
        else c->nulls++;
    }
    c->rows++;
    return OK;
}

static int column_text(Column *c, const uint8_t *s, size_t n) {
    TRY(buf_put(&c->data, s, n));
    return column_end(c, 1);
}

enum {
    C_TRACE, C_SPAN, C_PARENT, C_NAME, C_MESSAGE, C_ATTRIBUTES, C_EVENTS, C_LINKS, C_KEY, C_KEY_SOURCE,
    N_STRING_COLUMNS
};

/* A resource or scope the rows refer to, stored once per request (span_rows.SpanRows); its text is in
 * Decoder.dictionary (a resource's JSON) or the request (service.name, a scope's name and version). */
typedef struct {
    size_t json_start, json_len;
    const uint8_t *a, *b; /* service.name (NULL: none) / scope name; - / scope version */
    size_t a_len, b_len;
} Entry;

typedef struct {
    Column strings[N_STRING_COLUMNS];
    Buf kind, start, end, code, resource_index, scope_index, keys;
    size_t rows;
    Attributes attributes, item_attributes;
    Slices events, links;
    Buf resource, scratch;
    Buf dictionary, resources, scopes; /* resources' JSON; Entry arrays */
    size_t dictionary_bytes; /* UTF-8 bytes of the entries' text, counted against row_bytes as the rows are */
    Seen seen;
    size_t attribute_count, value_length, event_count, link_count, event_attribute_count, row_bytes;
    JsonOptions json;
    Slice precedence[MAX_PRECEDENCE];
    size_t n_precedence;
} Decoder;

static void decoder_free(Decoder *d) {
    for (int i = 0; i < N_STRING_COLUMNS; i++) {
        buf_free(&d->strings[i].data);
        buf_free(&d->strings[i].offsets);
        buf_free(&d->strings[i].validity);
    }
    buf_free(&d->kind);
    buf_free(&d->start);
    buf_free(&d->end);
    buf_free(&d->code);
    buf_free(&d->resource_index);
    buf_free(&d->scope_index);
    buf_free(&d->keys);
    buf_free(&d->resource);
    buf_free(&d->dictionary);
    buf_free(&d->resources);
    buf_free(&d->scopes);
    buf_free(&d->scratch);
    PyMem_RawFree(d->attributes.items);
    PyMem_RawFree(d->item_attributes.items);
    PyMem_RawFree(d->events.items);
    PyMem_RawFree(d->links.items);
    PyMem_RawFree(d->seen.slots);
}

/* The resource of one ResourceSpans, as its spans refer to it. */
typedef struct {
    int32_t index; /* in Decoder.resources, once a span refers to it; -1 before */
    size_t json_start, json_len; /* in Decoder.resource */
    const uint8_t *service;
    size_t service_len;
    int has_service;
    const Slice *key_name;
    const Value *key_value;
} Resource;

static const uint8_t ZEROS[16];

static int is_zero(const uint8_t *p, size_t n) { return memcmp(p, ZEROS, n) == 0; }

static int id_column(Column *c, const uint8_t *p, size_t n) {
    TRY(hex(&c->data, p, n));
    return column_end(c, 1);
}

static int own_key(Decoder *d, const Attributes *a, const Slice **name, const Value **value) {
    for (size_t k = 0; k < d->n_precedence; k++) {
        const Value *v = lookup(a, d->precedence[k].p, d->precedence[k].len);
        if (v == NULL || v->type == V_NULL || (v->type == V_STRING && v->len == 0)) continue;
        if (v->type != V_STRING) return FALLBACK; /* str() of a number or list: the Python path's way */
        *name = &d->precedence[k];
        *value = v;
        return OK;
    }
    *name = NULL;
    return OK;
}

static int event_json(Decoder *d, Buf *b, const Slice *event) {
    Reader r = {event->p, event->p + event->len};
    uint64_t time = 0;
    const uint8_t *name = (const uint8_t *)"";
    size_t name_len = 0;
    d->item_attributes.len = 0;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        switch (f.num) {
        case 1: EXPECT(f, 1); time = f.v; break;
        case 2: TRY(string_field(&f)); name = f.p; name_len = f.len; break;
        case 3: EXPECT(f, 2); TRY(parse_key_value(f.p, f.len, &d->item_attributes, d->event_attribute_count)); break;
        case 4: EXPECT(f, 0); break;
        default: return FALLBACK;
        }
    }
    if (d->item_attributes.len > d->event_attribute_count) return FALLBACK;
    TRY(PUT_LIT(b, "{\"name\":"));
    TRY(json_string(b, name, name_len));
    TRY(PUT_LIT(b, ",\"time_ns\":"));
    TRY(json_uint(b, time));
    TRY(PUT_LIT(b, ",\"attributes\":"));
    TRY(json_object(b, &d->seen, &d->item_attributes, &d->json));
    return buf_byte(b, '}');
}

static int link_json(Decoder *d, Buf *b, const Slice *link) {
    Reader r = {link->p, link->p + link->len};
    Slice trace = {NULL, 0}, span = {NULL, 0};
    d->item_attributes.len = 0;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        switch (f.num) {
        case 1: TRY(bytes_field(&f, &trace.p, &trace.len)); break;
        case 2: TRY(bytes_field(&f, &span.p, &span.len)); break;
        case 3: TRY(string_field(&f)); break;
        case 4: EXPECT(f, 2); TRY(parse_key_value(f.p, f.len, &d->item_attributes, d->attribute_count)); break;
        case 5: EXPECT(f, 0); break;
        case 6: EXPECT(f, 5); break;
        default: return FALLBACK;
        }
    }
    if (d->item_attributes.len > d->attribute_count) return FALLBACK;
    TRY(PUT_LIT(b, "{\"trace_id\":\""));
    TRY(hex(b, trace.p, trace.len));
    TRY(PUT_LIT(b, "\",\"span_id\":\""));
    TRY(hex(b, span.p, span.len));
    TRY(PUT_LIT(b, "\",\"attributes\":"));
    TRY(json_object(b, &d->seen, &d->item_attributes, &d->json));
    return buf_byte(b, '}');
}

static int list_json(Decoder *d, Column *c, const Slices *items, int (*item_json)(Decoder *, Buf *, const Slice *)) {
    TRY(buf_byte(&c->data, '['));
    for (size_t i = 0; i < items->len; i++) {
        if (i) TRY(buf_byte(&c->data, ','));
        TRY(item_json(d, &c->data, &items->items[i]));
    }
    TRY(buf_byte(&c->data, ']'));
    return column_end(c, 1);
}

static int status_fields(const Field *status, uint64_t *code, Slice *message) {
    Reader r = {status->p, status->p + status->len};
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        if (f.num == 2) {
            TRY(string_field(&f));
            message->p = f.p;
            message->len = f.len;
        } else if (f.num == 3) {
            EXPECT(f, 0);
            *code = f.v;
        } else {
            return FALLBACK;
        }
    }
    return OK;
}

/* An enum's wire value as the int protobuf gives Python, stored when it fits int8 (else 0, as Python does). */
static int8_t enum_int8(uint64_t v) {
    int32_t value = (int32_t)(uint32_t)v;
    return (value >= -128 && value <= 127) ? (int8_t)value : 0;
}

/* The texts a request's rows hold, as span_rows.spans_to_arrow counts them against SpanLimits.request_row_bytes. */
static size_t text_bytes(const Decoder *d) {
    size_t total = d->dictionary_bytes;
    for (int i = 0; i < N_STRING_COLUMNS; i++) total += d->strings[i].data.len;
    return total;
}

/* The resource's and scope's places in the request's dictionaries, adding them with the first span that refers to
 * them (the Python path stores only what a span refers to). */
static int dictionary_refs(Decoder *d, Resource *res, const Slice *scope_name, const Slice *scope_version,
                           int32_t *scope_index) {
    if (res->index < 0) {
        Entry e = {d->dictionary.len, res->json_len, res->has_service ? res->service : NULL, NULL,
                   res->has_service ? res->service_len : 0, 0};
        TRY(buf_put(&d->dictionary, (const uint8_t *)d->resource.data + res->json_start, res->json_len));
        TRY(buf_put(&d->resources, &e, sizeof e));
        res->index = (int32_t)(d->resources.len / sizeof e - 1);
        d->dictionary_bytes += e.json_len + e.a_len;
    }
    if (*scope_index < 0) {
        Entry e = {0, 0, scope_name->p, scope_version->p, scope_name->len, scope_version->len};
        TRY(buf_put(&d->scopes, &e, sizeof e));
        *scope_index = (int32_t)(d->scopes.len / sizeof e - 1);
        d->dictionary_bytes += e.a_len + e.b_len;
    }
    TRY(buf_put(&d->resource_index, &res->index, 4));
    return buf_put(&d->scope_index, scope_index, 4);
}

static int span_row(Decoder *d, const uint8_t *p, size_t n, Resource *res, const Slice *scope_name,
                    const Slice *scope_version, int32_t *scope_index) {
    Reader r = {p, p + n};
    Slice trace = {NULL, 0}, span = {NULL, 0}, parent = {NULL, 0}, name = {NULL, 0}, message = {NULL, 0};
    uint64_t kind = 0, start = 0, end = 0, code = 0;
    int statuses = 0;
    d->attributes.len = 0;
    d->events.len = 0;
    d->links.len = 0;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        switch (f.num) {
        case 1: TRY(bytes_field(&f, &trace.p, &trace.len)); break;
        case 2: TRY(bytes_field(&f, &span.p, &span.len)); break;
        case 3: TRY(string_field(&f)); break;
        case 4: TRY(bytes_field(&f, &parent.p, &parent.len)); break;
        case 5: TRY(string_field(&f)); name.p = f.p; name.len = f.len; break;
        case 6: EXPECT(f, 0); kind = f.v; break;
        case 7: EXPECT(f, 1); start = f.v; break;
        case 8: EXPECT(f, 1); end = f.v; break;
        case 9: EXPECT(f, 2); TRY(parse_key_value(f.p, f.len, &d->attributes, d->attribute_count)); break;
        case 10: case 12: case 14: EXPECT(f, 0); break;
        case 11: EXPECT(f, 2); if (d->events.len >= d->event_count) return FALLBACK;
            TRY(slices_push(&d->events, f.p, f.len)); break;
        case 13: EXPECT(f, 2); if (d->links.len >= d->link_count) return FALLBACK;
            TRY(slices_push(&d->links, f.p, f.len)); break;
        case 15: EXPECT(f, 2); if (statuses++) return FALLBACK; TRY(status_fields(&f, &code, &message)); break;
        case 16: EXPECT(f, 5); break;
        default: return FALLBACK;
        }
    }
    /* what the Python path reports as a problem or cuts to the limits, it decodes */
    if (trace.len != 16 || is_zero(trace.p, 16) || span.len != 8 || is_zero(span.p, 8)) return FALLBACK;
    if (parent.len != 0 && parent.len != 8) return FALLBACK;
    if (name.len == 0 || start > (uint64_t)INT64_MAX || end > (uint64_t)INT64_MAX) return FALLBACK;
    if (d->attributes.len > d->attribute_count || d->events.len > d->event_count || d->links.len > d->link_count)
        return FALLBACK;

    Column *c = d->strings;
    TRY(id_column(&c[C_TRACE], trace.p, 16));
    TRY(id_column(&c[C_SPAN], span.p, 8));
    if (parent.len == 8 && !is_zero(parent.p, 8)) TRY(id_column(&c[C_PARENT], parent.p, 8));
    else TRY(column_end(&c[C_PARENT], 0));
    TRY(buf_put(&d->keys, trace.p, 16));
    TRY(buf_put(&d->keys, span.p, 8));
    TRY(column_text(&c[C_NAME], name.p, name.len));
    int8_t kind8 = enum_int8(kind), code8 = enum_int8(code);
    int64_t start64 = (int64_t)start, end64 = (int64_t)end;
    TRY(buf_put(&d->kind, &kind8, 1));
    TRY(buf_put(&d->start, &start64, 8));
    TRY(buf_put(&d->end, &end64, 8));
    TRY(buf_put(&d->code, &code8, 1));
    TRY(column_text(&c[C_MESSAGE], message.p, message.len));
    TRY(dictionary_refs(d, res, scope_name, scope_version, scope_index));
    TRY(json_object(&c[C_ATTRIBUTES].data, &d->seen, &d->attributes, &d->json));
    TRY(column_end(&c[C_ATTRIBUTES], 1));
    TRY(list_json(d, &c[C_EVENTS], &d->events, event_json));
    TRY(list_json(d, &c[C_LINKS], &d->links, link_json));
    const Slice *key_name;
    const Value *key_value;
    TRY(own_key(d, &d->attributes, &key_name, &key_value));
    if (key_name == NULL) {
        key_name = res->key_name;
        key_value = res->key_value;
    }
    if (key_name != NULL) {
        TRY(column_text(&c[C_KEY], key_value->p, key_value->len));
        TRY(column_text(&c[C_KEY_SOURCE], key_name->p, key_name->len));
    } else {
        TRY(column_end(&c[C_KEY], 0));
        TRY(column_end(&c[C_KEY_SOURCE], 0));
    }
    d->rows++;
    /* past the limit Python decodes the request, which refuses it: the buffers stop one row past it */
    return text_bytes(d) > d->row_bytes ? FALLBACK : OK;
}

static int resource_of(Decoder *d, const Field *resource, Resource *res, Attributes *attributes) {
    attributes->len = 0;
    if (resource != NULL) {
        Reader r = {resource->p, resource->p + resource->len};
        while (r.p < r.end) {
            Field f;
            TRY(read_field(&r, &f));
            if (f.num == 1) {
                EXPECT(f, 2);
                TRY(parse_key_value(f.p, f.len, attributes, MAX_RESOURCE_ATTRIBUTES));
            } else if (f.num == 2) {
                EXPECT(f, 0);
            } else {
                return FALLBACK;
            }
        }
    }
    /* the resource's values are not cut to the span limits, as in the Python path */
    JsonOptions uncut = {d->json.float_text, SIZE_MAX, d->json.released};
    d->resource.len = 0;
    TRY(json_object(&d->resource, &d->seen, attributes, &uncut));
    res->index = -1;
    res->json_start = 0;
    res->json_len = d->resource.len;
    const Value *service = lookup(attributes, (const uint8_t *)"service.name", 12);
    res->has_service = service != NULL && service->type == V_STRING;
    if (res->has_service) {
        res->service = service->p;
        res->service_len = service->len;
    }
    res->key_name = NULL;
    for (size_t k = 0; k < d->n_precedence; k++) {
        const Value *v = lookup(attributes, d->precedence[k].p, d->precedence[k].len);
        if (v != NULL && v->type == V_STRING && v->len > 0) {
            res->key_name = &d->precedence[k];
            res->key_value = v;
            break;
        }
    }
    return OK;
}

static int scope_spans(Decoder *d, const Field *group, Resource *res) {
    Reader r = {group->p, group->p + group->len};
    Slice name = {(const uint8_t *)"", 0}, version = {(const uint8_t *)"", 0};
    int scopes = 0;
    while (r.p < r.end) { /* the scope first: it may follow its spans on the wire */
        Field f;
        TRY(read_field(&r, &f));
        if (f.num == 1) {
            EXPECT(f, 2);
            if (scopes++) return FALLBACK;
            Reader s = {f.p, f.p + f.len};
            while (s.p < s.end) {
                Field g;
                TRY(read_field(&s, &g));
                if (g.num == 1) { TRY(string_field(&g)); name.p = g.p; name.len = g.len; }
                else if (g.num == 2) { TRY(string_field(&g)); version.p = g.p; version.len = g.len; }
                else if (g.num == 4) EXPECT(g, 0);
                else return FALLBACK; /* scope attributes: the Python path validates what it ignores */
            }
        } else if (f.num == 2) {
            EXPECT(f, 2);
        } else if (f.num == 3) {
            TRY(string_field(&f));
        } else {
            return FALLBACK;
        }
    }
    if (name.len > d->value_length || version.len > d->value_length) return FALLBACK; /* Python cuts them */
    int32_t scope_index = -1;
    r.p = group->p;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        if (f.num == 2) TRY(span_row(d, f.p, f.len, res, &name, &version, &scope_index));
    }
    return OK;
}

static int resource_spans(Decoder *d, const Field *group) {
    Reader r = {group->p, group->p + group->len};
    Field resource = {0, 0, 0, NULL, 0};
    int resources = 0;
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        if (f.num == 1) {
            EXPECT(f, 2);
            if (resources++) return FALLBACK;
            resource = f;
        } else if (f.num == 2) {
            EXPECT(f, 2);
        } else if (f.num == 3) {
            TRY(string_field(&f));
        } else {
            return FALLBACK;
        }
    }
    Resource res = {-1, 0, 0, NULL, 0, 0, NULL, NULL};
    Attributes attributes = {NULL, 0, 0}; /* span attributes are parsed while these are in use */
    int rc = resource_of(d, resources ? &resource : NULL, &res, &attributes);
    r.p = group->p;
    while (rc == OK && r.p < r.end) {
        Field f;
        rc = read_field(&r, &f);
        if (rc == OK && f.num == 2) rc = scope_spans(d, &f, &res);
    }
    PyMem_RawFree(attributes.items);
    return rc;
}

static int decode(Decoder *d, const uint8_t *p, size_t n) {
    Reader r = {p, p + n};
    while (r.p < r.end) {
        Field f;
        TRY(read_field(&r, &f));
        if (f.num != 1 || f.wire != 2) return FALLBACK;
        TRY(resource_spans(d, &f));
    }
    int duplicate;
    TRY(any_equal(&d->seen, d->rows, span_key, &d->keys, &duplicate));
    return duplicate ? FALLBACK : OK; /* a span sent twice in one request: the last one wins there */
}

/* --- the module ----------------------------------------------------------------------------------------------- */

/* A column buffer handed to Python without a copy: it owns the walk's memory and exposes it through the buffer
 * protocol, so pyarrow wraps it (pa.py_buffer) as it is; pickled (a decode worker's answer) as bytes. Copying every
 * buffer into bytes had made the server hold each request's rows twice at its peak. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
} Owned;

static void owned_dealloc(Owned *self) {
    PyMem_RawFree(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int owned_getbuffer(Owned *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : (char *)"", self->len, 1, flags);
}

static Py_ssize_t owned_length(Owned *self) { return self->len; }

static PyObject *owned_reduce(Owned *self, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("(O(y#))", (PyObject *)&PyBytes_Type, self->data ? self->data : "", self->len);
}

static PyObject *owned_bytes(Owned *self, PyObject *unused) {
    (void)unused;
    return PyBytes_FromStringAndSize(self->data ? self->data : "", self->len);
}

static PyBufferProcs OWNED_BUFFER = {(getbufferproc)owned_getbuffer, NULL};
static PySequenceMethods OWNED_SEQUENCE = {.sq_length = (lenfunc)owned_length};
static PyMethodDef OWNED_METHODS[] = {
    {"__reduce__", (PyCFunction)owned_reduce, METH_NOARGS, "pickled as bytes"},
    {"__bytes__", (PyCFunction)owned_bytes, METH_NOARGS, "a copy as bytes"},
    {NULL, NULL, 0, NULL},
};
static PyTypeObject OWNED_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_otlp_columns.Buffer",
    .tp_basicsize = sizeof(Owned),
    .tp_dealloc = (destructor)owned_dealloc,
    .tp_as_buffer = &OWNED_BUFFER,
    .tp_as_sequence = &OWNED_SEQUENCE,
    .tp_methods = OWNED_METHODS,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A column buffer of the C walk, wrapped without a copy.",
};

/* The buffer's memory as a Python object, taken from the walk (the buffer is left empty). */
static PyObject *handed_over(Buf *b) {
    Owned *out = PyObject_New(Owned, &OWNED_TYPE);
    if (out == NULL) return NULL;
    if (b->data != NULL && b->cap - b->len > 4096) { /* grown by doubling: give the unused half back */
        char *fitted = PyMem_RawRealloc(b->data, b->len ? b->len : 1);
        if (fitted != NULL) b->data = fitted;
    }
    out->data = b->data;
    out->len = (Py_ssize_t)b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return (PyObject *)out;
}

static PyObject *result(Decoder *d) {
    PyObject *strings = PyList_New(N_STRING_COLUMNS);
    if (strings == NULL) return NULL;
    for (int i = 0; i < N_STRING_COLUMNS; i++) {
        Column *c = &d->strings[i];
        PyObject *item = c->nullable
            ? Py_BuildValue("(NNNn)", handed_over(&c->offsets), handed_over(&c->data), handed_over(&c->validity),
                            (Py_ssize_t)c->nulls)
            : Py_BuildValue("(NNOn)", handed_over(&c->offsets), handed_over(&c->data), Py_None, (Py_ssize_t)0);
        if (item == NULL) {
            Py_DECREF(strings);
            return NULL;
        }
        PyList_SET_ITEM(strings, i, item);
    }
    size_t n_resources = d->resources.len / sizeof(Entry), n_scopes = d->scopes.len / sizeof(Entry);
    PyObject *resources = PyList_New((Py_ssize_t)n_resources), *scopes = PyList_New((Py_ssize_t)n_scopes);
    if (resources == NULL || scopes == NULL) goto fail;
    for (size_t i = 0; i < n_resources; i++) {
        const Entry *e = (const Entry *)d->resources.data + i;
        PyObject *item = e->a == NULL
            ? Py_BuildValue("(y#O)", d->dictionary.data + e->json_start, (Py_ssize_t)e->json_len, Py_None)
            : Py_BuildValue("(y#y#)", d->dictionary.data + e->json_start, (Py_ssize_t)e->json_len,
                            (const char *)e->a, (Py_ssize_t)e->a_len);
        if (item == NULL) goto fail;
        PyList_SET_ITEM(resources, (Py_ssize_t)i, item);
    }
    for (size_t i = 0; i < n_scopes; i++) {
        const Entry *e = (const Entry *)d->scopes.data + i;
        PyObject *item = Py_BuildValue("(y#y#)", (const char *)e->a, (Py_ssize_t)e->a_len, (const char *)e->b,
                                       (Py_ssize_t)e->b_len);
        if (item == NULL) goto fail;
        PyList_SET_ITEM(scopes, (Py_ssize_t)i, item);
    }
    return Py_BuildValue("(n(NNNNNN)NNN)", (Py_ssize_t)d->rows, handed_over(&d->kind), handed_over(&d->start),
                         handed_over(&d->end), handed_over(&d->code), handed_over(&d->resource_index),
                         handed_over(&d->scope_index), strings, resources, scopes);
fail:
    Py_DECREF(strings);
    Py_XDECREF(resources);
    Py_XDECREF(scopes);
    return NULL;
}

static PyObject *columns(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer payload;
    PyObject *precedence, *float_text;
    Py_ssize_t attribute_count, value_length, event_count, link_count, event_attribute_count, row_bytes;
    if (!PyArg_ParseTuple(args, "y*O!nnnnnnO:columns", &payload, &PyTuple_Type, &precedence, &attribute_count,
                          &value_length, &event_count, &link_count, &event_attribute_count, &row_bytes, &float_text))
        return NULL;
    Decoder d;
    memset(&d, 0, sizeof d);
    PyObject *out = NULL;
    Py_ssize_t n_keys = PyTuple_GET_SIZE(precedence);
    if (n_keys > MAX_PRECEDENCE || attribute_count < 0 || value_length < 0 || event_count < 0 || link_count < 0 ||
        event_attribute_count < 0 || row_bytes < 0 || !PyCallable_Check(float_text)) {
        PyErr_SetString(PyExc_ValueError, "columns: bad limits, keys or float_text");
        goto done;
    }
    for (Py_ssize_t k = 0; k < n_keys; k++) {
        PyObject *key = PyTuple_GET_ITEM(precedence, k);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "columns: conversation key names must be bytes");
            goto done;
        }
        d.precedence[k].p = (const uint8_t *)PyBytes_AS_STRING(key);
        d.precedence[k].len = (size_t)PyBytes_GET_SIZE(key);
    }
    d.n_precedence = (size_t)n_keys;
    d.attribute_count = (size_t)attribute_count;
    d.event_count = (size_t)event_count;
    d.link_count = (size_t)link_count;
    d.event_attribute_count = (size_t)event_attribute_count;
    d.value_length = (size_t)value_length;
    d.row_bytes = (size_t)row_bytes;
    d.json.float_text = float_text;
    d.json.value_length = (size_t)value_length;
    d.strings[C_PARENT].nullable = 1;
    d.strings[C_KEY].nullable = d.strings[C_KEY_SOURCE].nullable = 1;
    int rc = OK;
    for (int i = 0; i < N_STRING_COLUMNS && rc == OK; i++) {
        int32_t zero = 0;
        rc = buf_put(&d.strings[i].offsets, &zero, 4);
    }
    if (rc == OK) { /* without the GIL: the server decodes on threads, in parallel with its Python */
        PyThreadState *released = PyEval_SaveThread();
        d.json.released = &released;
        rc = decode(&d, (const uint8_t *)payload.buf, (size_t)payload.len);
        PyEval_RestoreThread(released);
    }
    if (rc == NOMEM) PyErr_NoMemory();
    else if (rc == FALLBACK) out = Py_NewRef(Py_None);
    else out = result(&d);
done:
    decoder_free(&d);
    PyBuffer_Release(&payload);
    return out;
}

static PyMethodDef METHODS[] = {
    {"columns", columns, METH_VARARGS,
     "columns(payload, key_precedence, attribute_count, value_length, event_count, link_count, "
     "event_attribute_count, row_bytes, float_text) -> (rows, fixed-width buffers, string columns, resources, "
     "scopes) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_otlp_columns",
                                    "OTLP protobuf trace requests to Arrow column buffers.", -1, METHODS,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__otlp_columns(void) {
    for (int c = 0; c < 0x20; c++) ESCAPE[c] = 1;
    ESCAPE['"'] = ESCAPE['\\'] = 1;
    if (PyType_Ready(&OWNED_TYPE) < 0) return NULL;
    return PyModule_Create(&MODULE);
}
