/* hframe_cli.sources._scan: a folder of plain files listed in C.
 *
 * The optional compiled part of listing (issue 35). A folder of small files costs per entry, and
 * in Python most of that is the interpreter around one stat: a DirEntry, its name sorted,
 * checked, encoded and appended (``inputs._Collector.add_entries``). When every entry of a
 * folder is a regular file the plain rules take as it is (not empty, not over the size limit,
 * not named like an output, a UTF-8 name), this module lists it in one call, into the same
 * columns in the same order; any other folder is declined and listed in Python, which stays the
 * reference (tests/sources/test_native_scan.py compares them; the suite runs again with
 * ``HFRAME_NATIVE=0``):
 *
 *   scan_files(folder, prefix, max_bytes, forbidden, paths, names, sizes, mtimes) -> bool
 *
 *   folder      str: the folder, as the walk has it (entries' paths are os.path.join(folder, name))
 *   prefix      bytes: what its files' names in the pack start with ("" or "a/b/")
 *   max_bytes   --max-frame-bytes
 *   forbidden   tuple of bytes: names that may be an output (the careful path decides)
 *   paths .. mtimes   the source list's columns, appended to when True is returned
 *
 * True: every entry was a plain file, appended in name order. False: nothing appended (a
 * subfolder, a link or anything else, an empty or oversized file, a forbidden or non-UTF-8 name,
 * or a folder that cannot be read): the Python walk lists it, and says what is wrong.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether s[0..n) is UTF-8 that Python's strict decoder takes (no overlong forms, no surrogates,
 * nothing past U+10FFFF): for such names the byte order is the order of the decoded str. */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return 0;
        if (i + len > n) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += len;
    }
    return 1;
}

typedef struct {
    char *name;
    size_t len;
    long long size, mtime_ns;
} entry_t;

static int by_name(const void *a, const void *b) {
    const entry_t *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static PyObject *scan_files(PyObject *self, PyObject *args) {
    PyObject *folder_obj, *forbidden, *paths, *names, *sizes, *mtimes;
    const char *prefix;
    Py_ssize_t prefix_len;
    long long max_bytes;
    if (!PyArg_ParseTuple(args, "Uy#LO!O!O!O!O!", &folder_obj, &prefix, &prefix_len, &max_bytes, &PyTuple_Type,
                          &forbidden, &PyList_Type, &paths, &PyList_Type, &names, &PyList_Type, &sizes,
                          &PyList_Type, &mtimes))
        return NULL;
    PyObject *folder_bytes = PyUnicode_EncodeFSDefault(folder_obj);
    if (folder_bytes == NULL) return NULL;
    const char *folder = PyBytes_AS_STRING(folder_bytes);
    size_t folder_len = (size_t)PyBytes_GET_SIZE(folder_bytes);
    entry_t *entries = NULL;
    size_t n = 0, cap = 0;
    int plain = folder_len > 0 && strlen(folder) == folder_len;
    PyObject *result = NULL;
    PyObject *new_cols[4] = {NULL, NULL, NULL, NULL};
    DIR *dir = plain ? opendir(folder) : NULL;
    if (dir == NULL) plain = 0;
    while (plain) {
        errno = 0;
        struct dirent *d = readdir(dir);
        if (d == NULL) {
            if (errno) plain = 0;
            break;
        }
        const char *nm = d->d_name;
        if (nm[0] == '.' && (nm[1] == 0 || (nm[1] == '.' && nm[2] == 0))) continue;
        size_t len = strlen(nm);
        if ((d->d_type != DT_REG && d->d_type != DT_UNKNOWN) || !valid_utf8((const unsigned char *)nm, len)) {
            plain = 0;
            break;
        }
        struct stat st;
        if (fstatat(dirfd(dir), nm, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
            (long long)st.st_size > max_bytes) {
            plain = 0; /* (vanished, unreadable, empty, oversized: the careful path's words) */
            break;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(forbidden); k++) {
            PyObject *f = PyTuple_GET_ITEM(forbidden, k);
            if (PyBytes_Check(f) && (size_t)PyBytes_GET_SIZE(f) == len && memcmp(PyBytes_AS_STRING(f), nm, len) == 0)
                plain = 0;
        }
        if (!plain) break;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            entry_t *grown = realloc(entries, cap * sizeof *entries);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            entries = grown;
        }
        entries[n].name = malloc(len + 1);
        if (entries[n].name == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(entries[n].name, nm, len + 1);
        entries[n].len = len;
        entries[n].size = (long long)st.st_size;
        entries[n].mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        n++;
    }
    if (!plain) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    qsort(entries, n, sizeof *entries, by_name);
    for (int k = 0; k < 4; k++)
        if ((new_cols[k] = PyList_New((Py_ssize_t)n)) == NULL) goto done;
    int slash = folder[folder_len - 1] != '/';
    size_t room = folder_len + 2;
    for (size_t j = 0; j < n; j++)
        if (entries[j].len + folder_len + 2 > room) room = entries[j].len + folder_len + 2;
    char *path = malloc(room);
    if (path == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(path, folder, folder_len);
    if (slash) path[folder_len] = '/';
    for (size_t j = 0; j < n; j++) {
        entry_t *e = &entries[j];
        memcpy(path + folder_len + slash, e->name, e->len);
        PyObject *p = PyUnicode_DecodeFSDefaultAndSize(path, (Py_ssize_t)(folder_len + slash + e->len));
        PyObject *b = PyBytes_FromStringAndSize(NULL, prefix_len + (Py_ssize_t)e->len);
        PyObject *sz = PyLong_FromLongLong(e->size), *mt = PyLong_FromLongLong(e->mtime_ns);
        if (b != NULL) {
            memcpy(PyBytes_AS_STRING(b), prefix, (size_t)prefix_len);
            memcpy(PyBytes_AS_STRING(b) + prefix_len, e->name, e->len);
        }
        if (!p || !b || !sz || !mt) {
            Py_XDECREF(p);
            Py_XDECREF(b);
            Py_XDECREF(sz);
            Py_XDECREF(mt);
            free(path);
            goto done;
        }
        PyList_SET_ITEM(new_cols[0], (Py_ssize_t)j, p);
        PyList_SET_ITEM(new_cols[1], (Py_ssize_t)j, b);
        PyList_SET_ITEM(new_cols[2], (Py_ssize_t)j, sz);
        PyList_SET_ITEM(new_cols[3], (Py_ssize_t)j, mt);
    }
    free(path);
    PyObject *cols[4] = {paths, names, sizes, mtimes};
    Py_ssize_t at[4];
    for (int k = 0; k < 4; k++) {
        at[k] = PyList_GET_SIZE(cols[k]);
        if (PyList_SetSlice(cols[k], at[k], at[k], new_cols[k]) < 0) { /* (only out of memory) */
            for (int j = 0; j < k; j++) /* the columns stay in step: the ones extended, cut back */
                PyList_SetSlice(cols[j], at[j], PyList_GET_SIZE(cols[j]), NULL);
            goto done;
        }
    }
    result = Py_NewRef(Py_True);
done:
    if (dir != NULL) closedir(dir);
    for (size_t j = 0; j < n; j++) free(entries[j].name);
    free(entries);
    for (int k = 0; k < 4; k++) Py_XDECREF(new_cols[k]);
    Py_DECREF(folder_bytes);
    return result;
}

static PyObject *utf8_ok(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    int ok = valid_utf8(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"scan_files", scan_files, METH_VARARGS, "List a folder of plain files (see the module)."},
    {"utf8_ok", utf8_ok, METH_VARARGS, "Whether bytes are strict UTF-8 (for the tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
