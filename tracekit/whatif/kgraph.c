/* The what-if graph's two passes over every node, in C: its topological levels and its replay.

   Both are exact integer algorithms with the same result as their numpy versions in graph.py (which stay, for
   an install without a compiler and for the durations that are not integers):

   levels(n, src, dst, level)
       Kahn's algorithm one level at a time: `level` (n int64, written) gets each node's longest-chain level
       (a node without in-edges 0, any other one more than its latest predecessor's); a node on a cycle, or
       downstream of one, keeps -1. `src`/`dst`: the edges, int32 or int64 (both the same).

   replay(order, first, in_ptr, in_src, start, dur, gap, out)
       Every node's start when the graph runs with `dur` and `gap` (int64): the nodes in `order` (a
       topological order: the plan's level order); the first `first` of them (level 0: no in-edges) keep
       `start`, every later one begins `gap` after its latest predecessor's end (start + dur). `in_ptr`
       (n + 1) and `in_src`: each node's in-edges, grouped by destination; `order`, `in_ptr` and `in_src`
       int32 or int64 (all the same). Sums wrap as numpy's int64 arithmetic does.

   The arrays come as Python buffers (numpy arrays, C-contiguous); the wrapper (graph.py) checks dtypes. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int get_buf(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != 4 && view->itemsize != 8) {
        PyErr_Format(PyExc_TypeError, "%s: 4- or 8-byte integers expected", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline int64_t at(const Py_buffer *v, Py_ssize_t i) {
    return v->itemsize == 8 ? ((const int64_t *)v->buf)[i] : (int64_t)((const int32_t *)v->buf)[i];
}

static inline int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

static PyObject *levels(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    PyObject *o_src, *o_dst, *o_level;
    if (!PyArg_ParseTuple(args, "nOOO", &n, &o_src, &o_dst, &o_level)) return NULL;
    Py_buffer src, dst, lev;
    if (get_buf(o_src, &src, 0, "src") < 0) return NULL;
    if (get_buf(o_dst, &dst, 0, "dst") < 0) { PyBuffer_Release(&src); return NULL; }
    if (get_buf(o_level, &lev, 1, "level") < 0) { PyBuffer_Release(&src); PyBuffer_Release(&dst); return NULL; }
    Py_ssize_t m = src.len / src.itemsize;
    PyObject *result = NULL;
    int64_t *ptr = NULL, *succ = NULL, *indeg = NULL, *front = NULL;
    if (dst.len / dst.itemsize != m || lev.itemsize != 8 || lev.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "levels: mismatched array sizes");
        goto done;
    }
    ptr = calloc((size_t)n + 1, sizeof(int64_t));
    succ = malloc(((size_t)m + 1) * sizeof(int64_t));
    indeg = calloc((size_t)n + 1, sizeof(int64_t));
    front = malloc(((size_t)n + 1) * sizeof(int64_t));
    if (!ptr || !succ || !indeg || !front) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t s = at(&src, k), d = at(&dst, k);
        if (s < 0 || s >= n || d < 0 || d >= n) {
            PyErr_SetString(PyExc_IndexError, "levels: edge endpoint out of range");
            goto done;
        }
        ptr[s + 1]++;
        indeg[d]++;
    }
    for (Py_ssize_t v = 0; v < n; v++) ptr[v + 1] += ptr[v];
    {
        int64_t *fill = front;  /* reused as each source's next free slot while filling */
        for (Py_ssize_t v = 0; v < n; v++) fill[v] = ptr[v];
        for (Py_ssize_t k = 0; k < m; k++) succ[fill[at(&src, k)]++] = at(&dst, k);
    }
    int64_t *level = (int64_t *)lev.buf;
    Py_ssize_t head = 0, tail = 0;
    Py_BEGIN_ALLOW_THREADS  /* plain memory from here on: other threads (what-ifs replayed at once) run */
    for (Py_ssize_t v = 0; v < n; v++) {
        level[v] = -1;
        if (indeg[v] == 0) front[tail++] = v;
    }
    /* the queue holds the frontier of each level one after the other: every node enters once, when its
       last predecessor is done, one level after the latest of them */
    int64_t lv = 0;
    while (head < tail) {
        Py_ssize_t end = tail;
        for (; head < end; head++) {
            int64_t v = front[head];
            level[v] = lv;
            for (int64_t k = ptr[v]; k < ptr[v + 1]; k++)
                if (--indeg[succ[k]] == 0) front[tail++] = succ[k];
        }
        lv++;
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free(ptr); free(succ); free(indeg); free(front);
    PyBuffer_Release(&src); PyBuffer_Release(&dst); PyBuffer_Release(&lev);
    return result;
}

static PyObject *replay(PyObject *self, PyObject *args) {
    PyObject *o[8];
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "OnOOOOOO", &o[0], &first, &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    static const char *names[8] = {"order", "", "in_ptr", "in_src", "start", "dur", "gap", "out"};
    Py_buffer b[8];
    int got = 0;
    PyObject *result = NULL;
    int64_t *end = NULL;
    for (int i = 0; i < 8; i++) {
        if (i == 1) continue;
        if (get_buf(o[i], &b[i], i == 7, names[i]) < 0) goto done;
        got |= 1 << i;
    }
    Py_ssize_t n = b[4].len / b[4].itemsize;
    if (b[0].len / b[0].itemsize != n || b[2].len / b[2].itemsize != n + 1 || b[2].itemsize != b[0].itemsize
        || b[3].itemsize != b[0].itemsize || b[4].itemsize != 8 || b[5].itemsize != 8 || b[6].itemsize != 8
        || b[7].itemsize != 8 || b[5].len != b[4].len || b[6].len != b[4].len || b[7].len != b[4].len
        || first < 0 || first > n) {
        PyErr_SetString(PyExc_ValueError, "replay: mismatched array sizes or types");
        goto done;
    }
    const int64_t *start = b[4].buf, *dur = b[5].buf, *gap = b[6].buf;
    int64_t *out = b[7].buf;
    Py_ssize_t n_src = b[3].len / b[3].itemsize;
    end = malloc(((size_t)n + 1) * sizeof(int64_t));
    if (!end) { PyErr_NoMemory(); goto done; }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS  /* plain memory from here on: other threads (what-ifs replayed at once) run */
    for (Py_ssize_t p = 0; p < first; p++) {
        int64_t v = at(&b[0], p);
        out[v] = start[v];
        end[v] = wrap_add(start[v], dur[v]);
    }
    for (Py_ssize_t p = first; p < n; p++) {
        int64_t v = at(&b[0], p);
        int64_t lo = at(&b[2], v), hi = at(&b[2], v + 1);
        if (lo < 0 || hi > n_src || hi <= lo) {
            bad = 1;
            break;
        }
        int64_t m = end[at(&b[3], lo)];
        for (int64_t k = lo + 1; k < hi; k++) {
            int64_t e = end[at(&b[3], k)];
            if (e > m) m = e;
        }
        int64_t s = wrap_add(m, gap[v]);
        out[v] = s;
        end[v] = wrap_add(s, dur[v]);
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "replay: a node after the first level without in-edges");
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    free(end);
    for (int i = 0; i < 8; i++)
        if (got & (1 << i)) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"levels", levels, METH_VARARGS, "levels(n, src, dst, level): each node's topological level into `level`."},
    {"replay", replay, METH_VARARGS,
     "replay(order, first, in_ptr, in_src, start, dur, gap, out): every node's replayed start into `out`."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kgraph", "The what-if graph's levels and replay in C.",
                                    -1, methods};

PyMODINIT_FUNC PyInit_kgraph(void) { return PyModule_Create(&module); }
