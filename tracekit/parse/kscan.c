/* Native column builder for one piece of a Kineto `traceEvents` array (tracekit/parse/native.py).

   scan(piece) reads a JSON array of events and returns the columns of its complete (`X`) events, the
   places of its metadata (`M`) and instant (`i`) events and the count of each phase, or None. None means
   "not sure": the caller decodes the piece with msgspec as before. The scanner says None for anything
   beyond the common shape of a Kineto event: invalid JSON, invalid UTF-8, an escape in a string it would
   have to keep, an exponent or a quoted value in a time, a number beyond int64, a type the typed msgspec
   decoder would refuse, a key twice, an unknown phase, nesting deeper than 64. So every piece it accepts gives the
   columns msgspec's typed decode and `kineto._add_rows` give (tests/parse/test_native_scan.py), and every
   other piece takes the msgspec path, errors included.

   One pass over the bytes; names and categories interned in a hash table of byte spans, so each distinct
   one becomes a Python string once. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_DEPTH 64

typedef struct { const unsigned char *p, *end, *base; int bail; } Cur;

enum { V_NONE = 0, V_STR, V_INT, V_FLOAT, V_NULL, V_BOOL, V_OBJ, V_ARR };

typedef struct {
    int type;
    const unsigned char *s, *e; /* the value's text (a string's without its quotes) */
    int escaped, high;          /* a string: holds a backslash / a byte over 0x7F */
    int exp;                    /* a number: has an exponent */
} Val;

/* growable byte buffer */
typedef struct { char *d; size_t n, cap; } Buf;

static inline int buf_put(Buf *b, const void *src, size_t k) {
    if (__builtin_expect(b->n + k > b->cap, 0)) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + k) cap *= 2;
        char *d = realloc(b->d, cap);
        if (!d) return -1;
        b->d = d; b->cap = cap;
    }
    memcpy(b->d + b->n, src, k);
    b->n += k;
    return 0;
}

static inline void ws(Cur *c) {
    const unsigned char *p = c->p, *end = c->end;
    if (p < end && *p > ' ') return;  /* compact JSON: no whitespace */
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    c->p = p;
}

static int hexd(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* length of the valid UTF-8 sequence at p (strict: no overlong forms, surrogates or code points over
   U+10FFFF), 0 if invalid */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char b = p[0];
    int n;
    uint32_t cp;
    if (b >= 0xC2 && b <= 0xDF) { n = 2; cp = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) { n = 3; cp = b & 0x0F; }
    else if (b >= 0xF0 && b <= 0xF4) { n = 4; cp = b & 0x07; }
    else return 0;
    if (end - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* at the opening quote; leaves c->p after the closing quote. Invalid UTF-8 fails the scan, so that msgspec
   (and the caller's repair) decides about it. */
static unsigned char PLAIN[256];  /* 1: a byte a string holds as it is (not '"', '\\', a control or high byte) */

static int scan_string(Cur *c, Val *v) {
    const unsigned char *p = c->p + 1, *end = c->end;
    v->type = V_STR; v->escaped = 0; v->high = 0;
    v->s = p;
    while (p < end) {
#ifdef __SSE2__
        while (p + 16 <= end) {  /* 16 bytes at a time: stop at '"', '\\', a control or a high byte */
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')),
                                                     _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'))),
                                        _mm_cmplt_epi8(x, _mm_set1_epi8(0x20)));  /* signed: high bytes too */
            int m = _mm_movemask_epi8(stop);
            if (m) { p += __builtin_ctz(m); break; }
            p += 16;
        }
#endif
        while (p + 4 <= end && PLAIN[p[0]] && PLAIN[p[1]] && PLAIN[p[2]] && PLAIN[p[3]]) p += 4;
        while (p < end && PLAIN[*p]) p++;
        if (p >= end) break;
        unsigned char ch = *p;
        if (ch == '"') { v->e = p; c->p = p + 1; return 0; }
        if (ch < 0x20) return -1;
        if (ch >= 0x80) {
            int k = utf8_len(p, end);
            if (!k) return -1;
            v->high = 1; p += k; continue;
        }
        if (ch == '\\') {
            v->escaped = 1;
            if (p + 1 >= end) return -1;
            unsigned char e = p[1];
            if (e == 'u') {
                if (p + 5 >= end || !hexd(p[2]) || !hexd(p[3]) || !hexd(p[4]) || !hexd(p[5])) return -1;
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else return -1;
            continue;
        }
        p++;
    }
    return -1;
}

static int scan_number(Cur *c, Val *v) {
    const unsigned char *p = c->p, *end = c->end;
    v->s = p; v->exp = 0;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') { p++; }
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') p++; }
    else return -1;
    int is_float = 0;
    if (p < end && *p == '.') {
        p++; is_float = 1;
        if (p >= end || !(*p >= '0' && *p <= '9')) return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++; is_float = 1; v->exp = 1;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !(*p >= '0' && *p <= '9')) return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    v->e = p; c->p = p;
    v->type = is_float ? V_FLOAT : V_INT;
    return 0;
}

static int scan_value(Cur *c, Val *v, int depth);

static int scan_container(Cur *c, Val *v, int depth) {
    unsigned char open = *c->p;
    unsigned char close = open == '{' ? '}' : ']';
    if (depth >= MAX_DEPTH) return -1;
    v->type = open == '{' ? V_OBJ : V_ARR;
    v->s = c->p;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) { c->p++; v->e = c->p; return 0; }
    for (;;) {
        Val inner;
        if (open == '{') {
            if (c->p >= c->end || *c->p != '"') return -1;
            if (scan_string(c, &inner)) return -1;
            ws(c);
            if (c->p >= c->end || *c->p != ':') return -1;
            c->p++;
            ws(c);
        }
        if (scan_value(c, &inner, depth + 1)) return -1;
        ws(c);
        if (c->p >= c->end) return -1;
        if (*c->p == ',') { c->p++; ws(c); continue; }
        if (*c->p == close) { c->p++; v->e = c->p; return 0; }
        return -1;
    }
}

static int lit(Cur *c, const char *word, size_t k) {
    if ((size_t)(c->end - c->p) < k || memcmp(c->p, word, k)) return -1;
    c->p += k;
    return 0;
}

/* any JSON value, validated; c->p at its first byte */
static int scan_value(Cur *c, Val *v, int depth) {
    if (c->p >= c->end) return -1;
    unsigned char ch = *c->p;
    v->s = c->p;
    switch (ch) {
    case '"': return scan_string(c, v);
    case '{': case '[': return scan_container(c, v, depth);
    case 't': v->type = V_BOOL; if (lit(c, "true", 4)) return -1; v->e = c->p; return 0;
    case 'f': v->type = V_BOOL; if (lit(c, "false", 5)) return -1; v->e = c->p; return 0;
    case 'n': v->type = V_NULL; if (lit(c, "null", 4)) return -1; v->e = c->p; return 0;
    default:
        if (ch == '-' || (ch >= '0' && ch <= '9')) return scan_number(c, v);
        return -1;
    }
}

/* a JSON integer literal as int64; -1 when beyond it */
static int int_value(const Val *v, int64_t *out) {
    const unsigned char *p = v->s;
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    if (v->e - p <= 18) {  /* fits: no overflow check */
        int64_t y = 0;
        for (; p < v->e; p++) y = y * 10 + (*p - '0');
        *out = neg ? -y : y;
        return 0;
    }
    __int128 x = 0;
    for (; p < v->e; p++) {
        x = x * 10 + (*p - '0');
        if (x > ((__int128)1 << 63)) return -1;
    }
    if (neg) x = -x;
    if (x > INT64_MAX || x < INT64_MIN) return -1;
    *out = (int64_t)x;
    return 0;
}

/* exact µs text -> ns, sub-ns digits rounded half away from zero (decode.decimal_text_to_ns); -1: no */
static int ns_value(const Val *v, int64_t *out) {
    if (v->exp) return -1;
    const unsigned char *p = v->s;
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    const unsigned char *q = p;
    while (q < v->e && *q != '.') q++;
    __int128 x;
    if (q - p <= 15) {  /* µs digits: the ns value fits int64 without checks */
        int64_t y = 0;
        for (; p < q; p++) y = y * 10 + (*p - '0');
        x = y;
    } else {
        x = 0;
        for (; p < q; p++) {
            x = x * 10 + (*p - '0');
            if (x > ((__int128)1 << 64)) return -1;
        }
    }
    x *= 1000;
    if (p < v->e && *p == '.') {
        p++;
        int64_t scale = 100;
        for (int k = 0; k < 3; k++) {
            if (p < v->e) { x += (int64_t)(*p - '0') * scale; p++; }
            scale /= 10;
        }
        if (p < v->e && *p >= '5') x += 1;
    }
    if (neg) x = -x;
    if (x > INT64_MAX || x < INT64_MIN) return -1;
    *out = (int64_t)x;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* interning of byte spans into first-occurrence indices, with their Python strings */

typedef struct {
    int32_t *slots;            /* index+1, 0 empty */
    uint64_t *hashes;
    size_t cap;
    const unsigned char **s;   /* per index: text */
    size_t *len;
    size_t n, room;
    PyObject *list;            /* per index: str (or None for the null entry; bytes in a table of texts) */
    int32_t none_index;
    int texts;                 /* a table of JSON texts: bytes, as they are */
} Intern;

static int intern_init(Intern *t) {
    memset(t, 0, sizeof *t);
    t->cap = 1024;
    t->slots = calloc(t->cap, sizeof(int32_t));
    t->hashes = calloc(t->cap, sizeof(uint64_t));
    t->list = PyList_New(0);
    t->none_index = -1;
    return (t->slots && t->hashes && t->list) ? 0 : -1;
}

static void intern_free(Intern *t) {
    free(t->slots); free(t->hashes); free(t->s); free(t->len);
    Py_XDECREF(t->list);
}

static uint64_t hash_bytes(const unsigned char *s, size_t k) {
    uint64_t h = 1469598103934665603ULL ^ k;
    size_t i = 0;
    for (; i + 8 <= k; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < k; i++) { h ^= s[i]; h *= 1099511628211ULL; }
    h ^= h >> 32;
    return h ? h : 1;
}

static int intern_grow(Intern *t) {
    size_t cap = t->cap * 2;
    int32_t *slots = calloc(cap, sizeof(int32_t));
    uint64_t *hashes = calloc(cap, sizeof(uint64_t));
    if (!slots || !hashes) { free(slots); free(hashes); return -1; }
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i]) continue;
        size_t j = t->hashes[i] & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i]; hashes[j] = t->hashes[i];
    }
    free(t->slots); free(t->hashes);
    t->slots = slots; t->hashes = hashes; t->cap = cap;
    return 0;
}

/* the next index (its text not yet set), or -1 */
static int32_t intern_slot(Intern *t) {
    if (t->n == t->room) {
        size_t room = t->room ? t->room * 2 : 256;
        const unsigned char **s = realloc(t->s, room * sizeof *s);
        if (!s) return -1;
        t->s = s;
        size_t *len = realloc(t->len, room * sizeof *len);
        if (!len) return -1;
        t->len = len; t->room = room;
    }
    return (int32_t)t->n++;
}

/* index of the string value v (no escapes; UTF-8 checked by Python's decoder); -1 on failure */
static int32_t intern_str(Intern *t, const Val *v) {
    size_t k = v->e - v->s;
    uint64_t h = hash_bytes(v->s, k);
    size_t j = h & (t->cap - 1);
    while (t->slots[j]) {
        int32_t idx = t->slots[j] - 1;
        if (t->hashes[j] == h && t->len[idx] == k && t->s[idx] && !memcmp(t->s[idx], v->s, k)) return idx;
        j = (j + 1) & (t->cap - 1);
    }
    PyObject *str = t->texts ? PyBytes_FromStringAndSize((const char *)v->s, (Py_ssize_t)k)
                             : PyUnicode_DecodeUTF8((const char *)v->s, (Py_ssize_t)k, "strict");
    if (!str) { PyErr_Clear(); return -1; }
    if (PyList_Append(t->list, str)) { Py_DECREF(str); PyErr_Clear(); return -1; }
    Py_DECREF(str);
    int32_t idx = intern_slot(t);
    if (idx < 0) return -1;
    t->s[idx] = v->s; t->len[idx] = k;
    t->slots[j] = idx + 1; t->hashes[j] = h;
    if (t->n * 2 > t->cap && intern_grow(t)) return -1;
    return idx;
}

static int32_t intern_none(Intern *t) {
    if (t->none_index >= 0) return t->none_index;
    if (PyList_Append(t->list, Py_None)) { PyErr_Clear(); return -1; }
    int32_t idx = intern_slot(t);
    if (idx < 0) return -1;
    t->s[idx] = NULL; t->len[idx] = 0;  /* never matches a string */
    t->none_index = idx;
    return idx;
}

/* ---------------------------------------------------------------------------------------------- */

/* args keys, in decode.ARG_FIELDS' order; kinds: what the typed (row) decoder accepts */
enum { K_INTSTR_KEEP, K_STR_KEEP, K_INTSTR, K_STR, K_RAW, K_FLOAT, K_RANK };
typedef struct { const char *key; int kind; int slot; } ArgKey;
enum { A_EXT, A_EXT_OLD, A_CORR, A_STREAM, A_DEVICE, N_INTS };  /* int columns, ROW_FIELDS order */
enum { S_DIMS, S_TYPE, S_STRIDES, S_CONCRETE, N_SHAPES };        /* decode.SHAPE_FIELDS order */
enum { T_KERNEL, T_COLL };
static const ArgKey ARG_KEYS[] = {
    {"External id", K_INTSTR_KEEP, A_EXT},
    {"kernel", K_STR_KEEP, T_KERNEL},
    {"device", K_INTSTR_KEEP, A_DEVICE},
    {"stream", K_INTSTR_KEEP, A_STREAM},
    {"correlation", K_INTSTR_KEEP, A_CORR},
    {"external id", K_INTSTR_KEEP, A_EXT_OLD},
    {"Concrete Inputs", K_RAW, S_CONCRETE},
    {"Input type", K_RAW, S_TYPE},
    {"Input Strides", K_RAW, S_STRIDES},
    {"Input Dims", K_RAW, S_DIMS},
    {"flops", K_FLOAT, 0},
    {"Collective name", K_STR_KEEP, T_COLL},
    {"In msg nelems", K_INTSTR, 0},
    {"Out msg nelems", K_INTSTR, 0},
    {"Group size", K_INTSTR, 0},
    {"dtype", K_STR, 0},
    {"rank", K_RANK, 0},  /* TraceFusion's merged multi-rank files: any type; an integer is the event's rank */
};
#define N_ARG_KEYS (sizeof ARG_KEYS / sizeof ARG_KEYS[0])
#define MAX_KEY 32
static int8_t BY_LEN[MAX_KEY][N_ARG_KEYS + 1];  /* per key length: the ARG_KEYS of that length, then -1 */

static const char PHASES[] = "XMiIstfCbenBEPONDR()STpFcG";  /* decode.Event's tags */

/* the per-row columns, grown together */
typedef struct {
    int32_t *name, *cat;
    int32_t *shapes;
    int64_t *ts, *dur, *pid, *tid, *ints, *spans, *rank;
    uint8_t *ts_ok, *dur_ok, *ints_ok, *flops_ok, *rank_ok;
    double *flops;
    size_t cap;
} Cols;

#define COLS(X) X(name, 1) X(cat, 1) X(ts, 1) X(dur, 1) X(pid, 1) X(tid, 1) X(ints, N_INTS) X(shapes, N_SHAPES) \
    X(spans, 2) X(rank, 1) X(rank_ok, 1) X(ts_ok, 1) X(dur_ok, 1) X(ints_ok, N_INTS) X(flops_ok, 1) X(flops, 1)

static int cols_room(Cols *k, size_t n) {
    if (__builtin_expect(n < k->cap, 1)) return 0;
    size_t cap = k->cap ? k->cap * 2 : 8192;
#define GROW(f, w) { void *d = realloc(k->f, cap * (w) * sizeof *k->f); if (!d) return -1; k->f = d; }
    COLS(GROW)
#undef GROW
    k->cap = cap;
    return 0;
}

static void cols_free(Cols *k) {
#define FREE(f, w) free(k->f);
    COLS(FREE)
#undef FREE
}

typedef struct {
    Cols k;
    Buf others;
    Intern names, cats, shape_texts[N_SHAPES];
    PyObject *ids, *coll, *launch, *int_texts;
    int64_t counts[256];
    unsigned char order[256];  /* phases in order of first occurrence */
    int n_phases;
    Py_ssize_t n;
} Out;

static PyObject *plain_str(const Val *v) {  /* a kept string: no escapes */
    if (v->escaped) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)v->s, v->e - v->s, "strict");
    if (!s) PyErr_Clear();
    return s;
}

static int add_pair(PyObject *list, Py_ssize_t row, PyObject *value) {  /* steals value */
    if (!value) return -1;
    PyObject *t = Py_BuildValue("(nN)", row, value);
    if (!t) { PyErr_Clear(); return -1; }
    int r = PyList_Append(list, t);
    Py_DECREF(t);
    if (r) { PyErr_Clear(); return -1; }
    return 0;
}

static int put_id(Out *o, int64_t *slot, const Val *v, int which) {
    *slot = 0;
    if (v->type == V_INT) return int_value(v, slot);
    PyObject *value;
    if (v->type == V_NONE || v->type == V_NULL) { value = Py_None; Py_INCREF(value); }
    else if (v->type == V_STR) { value = plain_str(v); if (!value) return -1; }
    else return -1;
    PyObject *t = Py_BuildValue("(niN)", o->n, which, value);
    if (!t) { PyErr_Clear(); return -1; }
    int r = PyList_Append(o->ids, t);
    Py_DECREF(t);
    if (r) { PyErr_Clear(); return -1; }
    return 0;
}

static inline int put_ns(int64_t *slot, uint8_t *ok, const Val *v) {
    *slot = 0; *ok = 0;
    if (v->type == V_INT || v->type == V_FLOAT) {
        if (ns_value(v, slot)) return -1;
        *ok = 1;
    } else if (v->type != V_NONE) return -1;
    return 0;
}

/* what an event's args object holds for the columns, read while it is scanned */
typedef struct {
    int bad;                   /* a value the typed decoder refuses, or a key twice (matters only for `X` events) */
    int64_t ints[N_INTS];
    uint8_t ints_ok[N_INTS];
    Val int_text[N_INTS];      /* V_STR where an integer arg is text */
    Val kernel, coll;          /* V_STR where present */
    Val shape[N_SHAPES];       /* the whole text of each shape arg (a string's with its quotes) */
    double flops;
    uint8_t flops_ok;
    int64_t rank;
    uint8_t rank_ok;           /* `rank` is an integer (in int64) */
} Args;

static void arg_value(Args *a, int kind, int slot, const Val *v) {
    switch (kind) {
    case K_INTSTR_KEEP:
        if (v->type == V_INT) {
            if (int_value(v, &a->ints[slot])) a->bad = 1;
            else a->ints_ok[slot] = 1;
        } else if (v->type == V_STR) a->int_text[slot] = *v;
        else if (v->type != V_NULL) a->bad = 1;
        break;
    case K_STR_KEEP:
        if (v->type == V_STR) *(slot == T_KERNEL ? &a->kernel : &a->coll) = *v;
        else if (v->type != V_NULL) a->bad = 1;
        break;
    case K_INTSTR:
        if (v->type == V_INT) { int64_t x; if (int_value(v, &x)) a->bad = 1; }
        else if (v->type != V_STR && v->type != V_NULL) a->bad = 1;
        break;
    case K_STR:
        if (v->type != V_STR && v->type != V_NULL) a->bad = 1;
        break;
    case K_RAW: {
        Val *t = &a->shape[slot];
        t->type = V_STR;
        t->s = v->type == V_STR ? v->s - 1 : v->s;
        t->e = v->type == V_STR ? v->e + 1 : v->e;
        break;
    }
    case K_FLOAT:
        if (v->type == V_INT) {
            int64_t x;
            if (int_value(v, &x) || x > ((int64_t)1 << 53) || x < -((int64_t)1 << 53)) a->bad = 1;
            else { a->flops = (double)x; a->flops_ok = 1; }
        } else if (v->type == V_FLOAT) {
            char tmp[64];
            size_t k = v->e - v->s;
            if (v->exp || k >= sizeof tmp) { a->bad = 1; break; }
            memcpy(tmp, v->s, k); tmp[k] = 0;
            a->flops = strtod(tmp, NULL); a->flops_ok = 1;
        } else if (v->type != V_NULL) a->bad = 1;
        break;
    case K_RANK:
        if (v->type == V_INT) {
            if (int_value(v, &a->rank)) a->bad = 1;
            else a->rank_ok = 1;
        }
        break;
    default:
        break;
    }
}

/* the args object at c->p ('{'), validated as JSON (-1: invalid) and read into a */
static int scan_args(Cur *c, Args *a, Val *whole) {
    a->bad = 0; a->flops = 0; a->flops_ok = 0; a->rank = 0; a->rank_ok = 0;
    for (int i = 0; i < N_INTS; i++) { a->ints[i] = 0; a->ints_ok[i] = 0; a->int_text[i].type = V_NONE; }
    for (int i = 0; i < N_SHAPES; i++) a->shape[i].type = V_NONE;
    a->kernel.type = a->coll.type = V_NONE;
    whole->type = V_OBJ;
    whole->s = c->p;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; whole->e = c->p; return 0; }
    unsigned seen = 0;
    for (;;) {
        Val k, v;
        if (c->p >= c->end || *c->p != '"' || scan_string(c, &k)) return -1;
        ws(c);
        if (c->p >= c->end || *c->p != ':') return -1;
        c->p++;
        ws(c);
        if (scan_value(c, &v, 2)) return -1;
        if (k.escaped) a->bad = 1;  /* msgspec would unescape it: maybe a known key */
        else {
            size_t klen = k.e - k.s;
            for (const int8_t *cand = klen < MAX_KEY ? BY_LEN[klen] : BY_LEN[0]; *cand >= 0; cand++) {
                int i = *cand;
                if (k.s[0] != (unsigned char)ARG_KEYS[i].key[0] || memcmp(k.s, ARG_KEYS[i].key, klen)) continue;
                if (seen & (1u << i)) a->bad = 1;  /* a key twice */
                seen |= 1u << i;
                arg_value(a, ARG_KEYS[i].kind, ARG_KEYS[i].slot, &v);
                break;
            }
        }
        ws(c);
        if (c->p >= c->end) return -1;
        if (*c->p == ',') { c->p++; ws(c); continue; }
        if (*c->p == '}') { c->p++; whole->e = c->p; return 0; }
        return -1;
    }
}

static int complete_event(Out *o, const Val *f, Args *a, const unsigned char *ev_s, const unsigned char *ev_e,
                          const unsigned char *base) {
    /* f: ph, name, cat, pid, tid, ts, dur, args */
    const Val *name = &f[1], *cat = &f[2], *args = &f[7];
    Cols *k = &o->k;
    size_t r = (size_t)o->n;
    if (cols_room(k, r)) return -1;
    int32_t idx;
    if (name->type == V_NONE) {
        Val empty = {V_STR, ev_s, ev_s, 0, 0, 0};
        idx = intern_str(&o->names, &empty);
    } else if (name->type == V_STR && !name->escaped) idx = intern_str(&o->names, name);
    else return -1;
    if (idx < 0) return -1;
    k->name[r] = idx;
    if (cat->type == V_NONE || cat->type == V_NULL) idx = intern_none(&o->cats);
    else if (cat->type == V_STR && !cat->escaped) idx = intern_str(&o->cats, cat);
    else return -1;
    if (idx < 0) return -1;
    k->cat[r] = idx;
    if (put_ns(&k->ts[r], &k->ts_ok[r], &f[5]) || put_ns(&k->dur[r], &k->dur_ok[r], &f[6])) return -1;
    if (put_id(o, &k->pid[r], &f[3], 0) || put_id(o, &k->tid[r], &f[4], 1)) return -1;

    int64_t *ints = &k->ints[r * N_INTS];
    uint8_t *ints_ok = &k->ints_ok[r * N_INTS];
    int32_t *shapes = &k->shapes[r * N_SHAPES];
    const Val *shape = a->shape;
    for (int i = 0; i < N_SHAPES; i++) shapes[i] = 0;
    if (args->type == V_OBJ) {
        if (a->bad) return -1;
        for (int i = 0; i < N_INTS; i++) {
            ints[i] = a->ints[i];
            ints_ok[i] = a->ints_ok[i];
            if (a->int_text[i].type == V_STR) {  /* "0x0": kineto.to_int in Python */
                PyObject *text = plain_str(&a->int_text[i]);
                if (!text) return -1;
                PyObject *t = Py_BuildValue("(niN)", o->n, i, text);
                if (!t) { PyErr_Clear(); return -1; }
                int bad = PyList_Append(o->int_texts, t);
                Py_DECREF(t);
                if (bad) { PyErr_Clear(); return -1; }
            }
        }
        if (a->kernel.type == V_STR && add_pair(o->launch, o->n, plain_str(&a->kernel))) return -1;
        if (a->coll.type == V_STR && add_pair(o->coll, o->n, plain_str(&a->coll))) return -1;
    } else if (args->type == V_NONE) {
        for (int i = 0; i < N_INTS; i++) { ints[i] = 0; ints_ok[i] = 0; }
        a->flops = 0; a->flops_ok = 0; a->rank = 0; a->rank_ok = 0;
        shape = NULL;
    } else return -1;
    double flops = a->flops;
    uint8_t flops_ok = a->flops_ok;
    if (shape && shape[S_DIMS].type != V_NONE) {  /* an op recorded with shapes: its four texts coded (else all 0) */
        for (int i = 0; i < N_SHAPES; i++) {
            Val text = shape[i];
            if (text.type == V_NONE) { text.s = text.e = ev_s; }
            int32_t code = intern_str(&o->shape_texts[i], &text);
            if (code < 0) return -1;
            shapes[i] = code;
        }
    }
    k->flops[r] = flops;
    k->flops_ok[r] = flops_ok;
    k->rank[r] = a->rank;
    k->rank_ok[r] = a->rank_ok;
    k->spans[2 * r] = ev_s - base;
    k->spans[2 * r + 1] = ev_e - base;
    o->n++;
    return 0;
}

/* EVENT_KEYS: "ph", "name", "cat", "pid", "tid", "ts", "dur", "args" (event_key gives the index) */

/* index of an event key in EVENT_KEYS, -1 for the others */
static inline int event_key(const unsigned char *s, size_t n) {
    switch (n) {
    case 2:
        if (s[0] == 'p' && s[1] == 'h') return 0;
        if (s[0] == 't' && s[1] == 's') return 5;
        return -1;
    case 3:
        if (!memcmp(s, "cat", 3)) return 2;
        if (!memcmp(s, "pid", 3)) return 3;
        if (!memcmp(s, "tid", 3)) return 4;
        if (!memcmp(s, "dur", 3)) return 6;
        return -1;
    case 4:
        if (!memcmp(s, "name", 4)) return 1;
        if (!memcmp(s, "args", 4)) return 7;
        return -1;
    default:
        return -1;
    }
}

/* one event object at c->p */
static int event(Out *o, Cur *c) {
    const unsigned char *ev_s = c->p;
    Val f[8];
    Args args;
    for (int i = 0; i < 8; i++) f[i].type = V_NONE;
    if (c->p >= c->end || *c->p != '{') return -1;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; return -1; }  /* no ph */
    for (;;) {
        Val k, other;
        if (c->p >= c->end || *c->p != '"' || scan_string(c, &k)) return -1;
        if (k.escaped) return -1;
        int i = event_key(k.s, k.e - k.s);
        Val *v = &other;
        if (i >= 0) {
            if (f[i].type != V_NONE) return -1;  /* a key twice */
            v = &f[i];
        }
        ws(c);
        if (c->p >= c->end || *c->p != ':') return -1;
        c->p++;
        ws(c);
        if (i == 7 && c->p < c->end && *c->p == '{') {
            if (scan_args(c, &args, v)) return -1;
        } else if (scan_value(c, v, 1)) return -1;
        ws(c);
        if (c->p >= c->end) return -1;
        if (*c->p == ',') { c->p++; ws(c); continue; }
        if (*c->p == '}') { c->p++; break; }
        return -1;
    }
    const unsigned char *ev_e = c->p;
    if (f[0].type != V_STR || f[0].escaped || f[0].e - f[0].s != 1) return -1;
    unsigned char ph = *f[0].s;
    if (!memchr(PHASES, ph, sizeof PHASES - 1)) return -1;
    if (!o->counts[ph]++) o->order[o->n_phases++] = ph;
    if (ph == 'X') return complete_event(o, f, &args, ev_s, ev_e, c->base);
    if (ph == 'M' || ph == 'i') {
        int64_t span[3] = {ev_s - c->base, ev_e - c->base, ph};
        return buf_put(&o->others, span, sizeof span);
    }
    return 0;
}

static PyObject *as_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->d ? b->d : "", (Py_ssize_t)b->n);
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE)) return NULL;
    Out o;
    memset(&o, 0, sizeof o);
    PyObject *result = NULL;
    if (intern_init(&o.names) || intern_init(&o.cats)) goto done;
    for (int i = 0; i < N_SHAPES; i++) {
        Val empty = {V_STR, (const unsigned char *)"", (const unsigned char *)"", 0, 0, 0};
        if (intern_init(&o.shape_texts[i])) goto done;
        o.shape_texts[i].texts = 1;
        if (intern_str(&o.shape_texts[i], &empty) != 0) goto done;  /* code 0: no text */
    }
    o.ids = PyList_New(0); o.coll = PyList_New(0); o.launch = PyList_New(0); o.int_texts = PyList_New(0);
    if (!o.ids || !o.coll || !o.launch || !o.int_texts) goto done;
    Cur c = {view.buf, (const unsigned char *)view.buf + view.len, view.buf, 0};
    int ok = 1;
    ws(&c);
    if (c.p >= c.end || *c.p != '[') ok = 0;
    else {
        c.p++;
        ws(&c);
        if (c.p < c.end && *c.p == ']') c.p++;
        else for (;;) {
            if (event(&o, &c)) { ok = 0; break; }
            ws(&c);
            if (c.p >= c.end) { ok = 0; break; }
            if (*c.p == ',') { c.p++; ws(&c); continue; }
            if (*c.p == ']') { c.p++; break; }
            ok = 0; break;
        }
        ws(&c);
        if (c.p != c.end) ok = 0;
    }
    if (PyErr_Occurred()) goto done;
    if (!ok) { result = Py_None; Py_INCREF(result); goto done; }
    PyObject *counts = PyDict_New();
    if (!counts) goto done;
    for (int i = 0; i < o.n_phases; i++) {
        int ph = o.order[i];
        PyObject *key = PyUnicode_FromOrdinal(ph), *val = PyLong_FromLongLong(o.counts[ph]);
        if (!key || !val || PyDict_SetItem(counts, key, val)) { Py_XDECREF(key); Py_XDECREF(val); Py_DECREF(counts); goto done; }
        Py_DECREF(key); Py_DECREF(val);
    }
    size_t n = (size_t)o.n;
    PyObject *shape_lists = PyTuple_New(N_SHAPES);
    if (!shape_lists) { Py_DECREF(counts); goto done; }
    for (int i = 0; i < N_SHAPES; i++) { Py_INCREF(o.shape_texts[i].list); PyTuple_SET_ITEM(shape_lists, i, o.shape_texts[i].list); }
#define B(f, w) PyBytes_FromStringAndSize(o.k.f ? (const char *)o.k.f : "", (Py_ssize_t)(n * (w) * sizeof *o.k.f))
    result = Py_BuildValue(
        "{s:n,s:O,s:N,s:O,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:O,s:N,s:N,s:O,s:N,s:N,s:O,s:O,s:N,s:N,s:N,s:N,s:N,s:N,s:N}",
        "n", o.n, "names", o.names.list, "name_idx", B(name, 1), "cats", o.cats.list, "cat_idx", B(cat, 1),
        "ts", B(ts, 1), "ts_ok", B(ts_ok, 1), "dur", B(dur, 1), "dur_ok", B(dur_ok, 1),
        "pid", B(pid, 1), "tid", B(tid, 1), "ids", o.ids, "ints", B(ints, N_INTS),
        "ints_ok", B(ints_ok, N_INTS), "int_texts", o.int_texts, "flops", B(flops, 1), "flops_ok", B(flops_ok, 1),
        "coll", o.coll, "launch", o.launch, "shapes", B(shapes, N_SHAPES), "shape_texts", shape_lists, "spans", B(spans, 2), "rank", B(rank, 1), "rank_ok", B(rank_ok, 1),
        "others", as_bytes(&o.others), "counts", counts);
#undef B
done:
    intern_free(&o.names); intern_free(&o.cats);
    for (int i = 0; i < N_SHAPES; i++) intern_free(&o.shape_texts[i]);
    Py_XDECREF(o.ids); Py_XDECREF(o.coll); Py_XDECREF(o.launch); Py_XDECREF(o.int_texts);
    cols_free(&o.k);
    free(o.others.d);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O, "Columns of one JSON array of Kineto events, or None (see the module's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kscan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_kscan(void) {
    for (int b = 0; b < 256; b++) PLAIN[b] = b >= 0x20 && b < 0x80 && b != '"' && b != '\\';
    memset(BY_LEN, -1, sizeof BY_LEN);
    for (size_t a = 0; a < N_ARG_KEYS; a++) {
        int8_t *slot = BY_LEN[strlen(ARG_KEYS[a].key)];
        while (*slot >= 0) slot++;
        *slot = (int8_t)a;
    }
    return PyModule_Create(&module);
}
