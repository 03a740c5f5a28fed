/* Dense ids of a column of Python objects by identity, in C (columns.py `sorted_codes`).

   first_seen(values: list) -> (ids: bytes, distinct: list)
       ids: one int64 per item, the index in `distinct` of the first item that is the same object;
       distinct: each distinct object once, in order of first occurrence. A string column read from Arrow
       holds one object per distinct value (`from_arrow`), so this is a pass over pointers with a hash table
       instead of a dict lookup (a string hash and compare) per row; `sorted_codes` then merges equal values
       among the few distinct objects. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

static inline size_t mix(uintptr_t p) {
    uint64_t x = (uint64_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static PyObject *first_seen(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "first_seen: a list expected");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *ids = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    PyObject *distinct = PyList_New(0);
    size_t cap = 1024;
    PyObject **keys = calloc(cap, sizeof(PyObject *));
    int64_t *vals = malloc(cap * sizeof(int64_t));
    if (!ids || !distinct || !keys || !vals) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(ids);
    size_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(arg, i);
        size_t mask = cap - 1, h = mix((uintptr_t)o) & mask;
        while (keys[h] != NULL && keys[h] != o) h = (h + 1) & mask;
        if (keys[h] == NULL) {
            if (PyList_Append(distinct, o) < 0) goto fail;
            keys[h] = o;
            vals[h] = (int64_t)used++;
            if (2 * used > cap) {  /* grow: rehash every key */
                size_t ncap = cap * 2;
                PyObject **nk = calloc(ncap, sizeof(PyObject *));
                int64_t *nv = malloc(ncap * sizeof(int64_t));
                if (!nk || !nv) { free(nk); free(nv); PyErr_NoMemory(); goto fail; }
                for (size_t k = 0; k < cap; k++) {
                    if (keys[k] == NULL) continue;
                    size_t g = mix((uintptr_t)keys[k]) & (ncap - 1);
                    while (nk[g] != NULL) g = (g + 1) & (ncap - 1);
                    nk[g] = keys[k];
                    nv[g] = vals[k];
                }
                free(keys); free(vals);
                keys = nk; vals = nv; cap = ncap;
                out[i] = (int64_t)(used - 1);
                continue;
            }
        }
        out[i] = vals[h];
    }
    free(keys); free(vals);
    return Py_BuildValue("(NN)", ids, distinct);
fail:
    free(keys); free(vals);
    Py_XDECREF(ids); Py_XDECREF(distinct);
    return NULL;
}

static PyMethodDef methods[] = {
    {"first_seen", first_seen, METH_O,
     "first_seen(values: list) -> (ids: bytes of int64, distinct: list): ids by object identity."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kcolumns", "Column ids by object identity in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit_kcolumns(void) { return PyModule_Create(&module); }
