/* hframe_cli.format._md5x: md5 of many byte strings in one call, side by side (md5x.h), for Python.
 *
 *   md5_each(frames, isa=-1) -> list of 16-byte digests, md5(frames[k]) for each (a sequence of
 *                       objects with a contiguous buffer: bytes, memoryview, bytearray); isa: the
 *                       build to use (ISAS; -1: the best this CPU runs; ValueError if it cannot)
 *   isa() -> the build md5_each uses here: an index into ISAS
 *   ISAS = ("baseline", "avx2", "avx512f")
 *
 * The GIL is released while hashing (the buffers are held until the call returns).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "md5x.h"

static PyObject *md5_each(PyObject *self, PyObject *args) {
    PyObject *frames;
    int want = -1;
    if (!PyArg_ParseTuple(args, "O|i", &frames, &want)) return NULL;
    if (want < 0) want = md5x_best();
    if (want > md5x_best()) {
        PyErr_Format(PyExc_ValueError, "md5_each: this CPU cannot run build %d", want);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(frames, "md5_each: expected a sequence of buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), held = 0;
    PyObject *result = NULL;
    size_t m = n ? (size_t)n : 1;
    Py_buffer *views = PyMem_Calloc(m, sizeof(Py_buffer));
    const unsigned char **ptrs = PyMem_Calloc(m, sizeof(*ptrs));
    size_t *lens = PyMem_Calloc(m, sizeof(*lens));
    unsigned char *out = PyMem_Malloc(16 * m);
    if (views == NULL || ptrs == NULL || lens == NULL || out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held], PyBUF_C_CONTIGUOUS) < 0) goto done;
        ptrs[held] = views[held].buf;
        lens[held] = (size_t)views[held].len;
    }
    Py_BEGIN_ALLOW_THREADS
    md5x_many_with(want, ptrs, lens, (size_t)n, out);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result == NULL) goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *d = PyBytes_FromStringAndSize((const char *)out + 16 * k, 16);
        if (d == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, k, d);
    }
done:
    for (Py_ssize_t k = 0; k < held; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    PyMem_Free(out);
    Py_DECREF(seq);
    return result;
}

static PyObject *isa(PyObject *self, PyObject *unused) { return PyLong_FromLong(md5x_best()); }

static PyMethodDef methods[] = {
    {"md5_each", md5_each, METH_VARARGS, "md5_each(frames) -> list of md5 digests, hashed 16 side by side."},
    {"isa", isa, METH_NOARGS, "isa() -> the instruction set md5_each runs with here."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_md5x", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__md5x(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *isas = Py_BuildValue("(sss)", "baseline", "avx2", "avx512f");
    if (isas == NULL || PyModule_AddObject(m, "ISAS", isas) < 0) {
        Py_XDECREF(isas);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
