/* hframe_cli.verify._walk: verify's loop over sound frames, in C.
 *
 * The optional compiled part of ``hframe verify`` (issue 35). Nearly every byte of a full verify
 * goes through ``Verifier.clean_run``: per frame, the record header unpacked and compared with
 * the index row, its CRC, name, padding and magic bytes checked, the payload's md5 compared
 * with both. In Python that is 4-6 us of interpreter a frame around the md5; here it is a few
 * compares, and the md5s of 512 frames at a time hashed side by side (md5x.h: 16 at once, about
 * 5x one hashlib stream on a core), after their other checks. The answer is exactly
 * ``clean_run``'s (tests/verify/test_native_walk.py compares them on sound and damaged packs, and
 * the verify tests run again with ``HFRAME_NATIVE=0``):
 *
 *   clean_run(wb, ws, pos, i, stop, end, offset, length, record_offset, raw_length, codec,
 *             names, md5s, kind, mtime_us, magics, first_id) -> (pos, i, nbytes)
 *
 *   wb            the pack's bytes from offset ws (any buffer)
 *   pos, i        where the run starts: the record of frame i at byte pos
 *   stop, end     frames up to stop (excluded), bytes up to end
 *   offset .. mtime_us   the index columns (IndexCols: array('q') or list of int)
 *   names         list of bytes; md5s: 16 bytes a frame
 *   magics        list of bytes or None, by frame id - first_id
 *
 * Stops at the first frame that is not sound (the caller's careful path then says why).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the pack layout is little-endian; this module reads integers as they are in memory"
#endif

#include "../format/md5x.h"

#define RECORD_FIXED 76 /* layout.RECORD_FIXED: "<4sIQQQ16sqHHIIII" */
#define HEAD_NO_CRC 72

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--) crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* One index column: an array('q') (read in place) or a list of int. */
typedef struct {
    PyObject *obj;
    Py_buffer view;
    int has_view;
    Py_ssize_t len;
} column_t;

static int column_open(column_t *c, PyObject *obj) {
    c->obj = obj;
    c->has_view = 0;
    if (PyList_Check(obj)) {
        c->len = PyList_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    c->has_view = 1;
    if (c->view.itemsize != 8 || c->view.format == NULL || (strcmp(c->view.format, "q") != 0 && strcmp(c->view.format, "l") != 0)) {
        PyBuffer_Release(&c->view);
        c->has_view = 0;
        PyErr_SetString(PyExc_TypeError, "clean_run: an index column is neither a list nor an array of int64");
        return -1;
    }
    c->len = c->view.len / 8;
    return 0;
}

static void column_close(column_t *c) {
    if (c->has_view) PyBuffer_Release(&c->view);
    c->has_view = 0;
}

/* Item k (< len) as int64; -1 with an exception set on error (check PyErr_Occurred). */
static int64_t column_get(const column_t *c, Py_ssize_t k) {
    if (c->has_view) return ((const int64_t *)c->view.buf)[k];
    return (int64_t)PyLong_AsLongLong(PyList_GET_ITEM(c->obj, k));
}

static int64_t floor_div_1000(int64_t a) {
    int64_t q = a / 1000;
    return (a % 1000 != 0 && a < 0) ? q - 1 : q;
}

/* Frames are hashed BATCH at a time (md5x.h: 16 side by side), after their other checks. */
#define BATCH 512

/* The md5s of a batch of frames (frame ids i - nb .. i - 1, sound but for their md5) compared
 * with their record headers' and the index's. All match: 0, nbytes counted. Else the first frame
 * whose md5 differs becomes where the run stops (*i, *pos back to it): 1. */
static int settle(const unsigned char **p, const size_t *len, const unsigned char **head, const int64_t *at,
                  int nb, const unsigned char *imd5, Py_ssize_t *i, int64_t *pos, int64_t *nbytes) {
    unsigned char digests[16 * BATCH];
    Py_BEGIN_ALLOW_THREADS
    md5x_many(p, len, (size_t)nb, digests);
    Py_END_ALLOW_THREADS
    Py_ssize_t first = *i - nb;
    for (int k = 0; k < nb; k++) {
        const unsigned char *d = digests + 16 * k;
        if (memcmp(d, head[k], 16) != 0 || memcmp(d, imd5 + 16 * (first + k), 16) != 0) {
            *i = first + k;
            *pos = at[k];
            return 1;
        }
        *nbytes += (int64_t)len[k];
    }
    return 0;
}

static PyObject *clean_run(PyObject *self, PyObject *args) {
    Py_buffer wbv, md5v;
    long long ws_, pos_, end_;
    Py_ssize_t i, stop, first_id;
    PyObject *cols[7], *names, *magics;
    if (!PyArg_ParseTuple(args, "y*LLnnLOOOOOO!y*OOO!n", &wbv, &ws_, &pos_, &i, &stop, &end_, &cols[0], &cols[1],
                          &cols[2], &cols[3], &cols[4], &PyList_Type, &names, &md5v, &cols[5], &cols[6],
                          &PyList_Type, &magics, &first_id))
        return NULL;
    column_t c[7];
    int opened = 0;
    PyObject *result = NULL;
    for (; opened < 7; opened++)
        if (column_open(&c[opened], cols[opened]) < 0) goto done;
    const column_t *offs = &c[0], *lens = &c[1], *rofs = &c[2], *iraw = &c[3], *icodec = &c[4], *ikind = &c[5],
                   *imtime = &c[6];
    const unsigned char *wb = wbv.buf, *imd5 = md5v.buf;
    int64_t ws = ws_, pos = pos_, end = end_, wlen = wbv.len;
    int64_t limit = ws + wlen < end ? ws + wlen : end;
    Py_ssize_t n = PyList_GET_SIZE(names), nmagics = PyList_GET_SIZE(magics);
    for (int k = 0; k < 7; k++)
        if (c[k].len < n) n = c[k].len;
    if (md5v.len / 16 < n) n = md5v.len / 16;
    int64_t nbytes = 0;
    const unsigned char *batch_p[BATCH], *batch_head[BATCH];
    size_t batch_len[BATCH];
    int64_t batch_pos[BATCH];
    int nb = 0;
    while (i < stop && i < n) {
        int64_t off = column_get(offs, i), ln = column_get(lens, i), rof = column_get(rofs, i);
        if (PyErr_Occurred()) goto done;
        int64_t at = pos - ws;
        if (ln < 0 || off + ln > limit || rof != pos || at < 0 || at + RECORD_FIXED > wlen) break; /* (ln < 0: rlen != ln) */
        const unsigned char *h = wb + at;
        uint32_t rsize, nlen, elen, rcrc;
        uint64_t rid, rlen, rraw;
        int64_t rmtime;
        uint16_t rcodec, rkind;
        memcpy(&rsize, h + 4, 4);
        memcpy(&rid, h + 8, 8);
        memcpy(&rlen, h + 16, 8);
        memcpy(&rraw, h + 24, 8);
        memcpy(&rmtime, h + 48, 8);
        memcpy(&rcodec, h + 56, 2);
        memcpy(&rkind, h + 58, 2);
        memcpy(&nlen, h + 60, 4);
        memcpy(&elen, h + 64, 4);
        memcpy(&rcrc, h + 72, 4);
        int64_t body = at + RECORD_FIXED, hend = body + (int64_t)nlen + (int64_t)elen, rec_end = at + (int64_t)rsize;
        int64_t kind_i = column_get(ikind, i), mtime_i = column_get(imtime, i), codec_i = column_get(icodec, i),
                raw_i = column_get(iraw, i);
        if (PyErr_Occurred()) goto done;
        /* the same checks as Verifier.clean_run, in its order */
        if (rid != (uint64_t)i || rlen != (uint64_t)ln || (int64_t)rkind != kind_i ||
            floor_div_1000(rmtime) != mtime_i || pos + (int64_t)rsize != off || hend > rec_end || rcodec ||
            codec_i || raw_i < 0 || rraw != (uint64_t)raw_i || memcmp(h, "HFR1", 4) != 0)
            break;
        /* (in the window: rec_end = off - ws <= limit - ws <= len(wb)) */
        if (crc32_update(crc32_update(0, h, HEAD_NO_CRC), wb + body, (size_t)(nlen + elen)) != rcrc) break;
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) != (Py_ssize_t)nlen ||
            memcmp(PyBytes_AS_STRING(name), wb + body, nlen) != 0)
            break;
        int padded = 1;
        for (int64_t p = hend; p < rec_end; p++)
            if (wb[p]) padded = 0;
        if (!padded) break;
        int64_t p0 = off - ws;
        Py_ssize_t m = i - first_id;
        if (m < 0 || m >= nmagics) break;
        PyObject *magic = PyList_GET_ITEM(magics, m);
        if (magic != Py_None) {
            if (!PyBytes_Check(magic)) break;
            Py_ssize_t ml = PyBytes_GET_SIZE(magic);
            if (ln < ml || memcmp(wb + p0, PyBytes_AS_STRING(magic), (size_t)ml) != 0) break;
        }
        /* sound but for its md5: hashed with the rest of its batch, below */
        batch_p[nb] = wb + p0;
        batch_len[nb] = (size_t)ln;
        batch_head[nb] = h + 32;
        batch_pos[nb] = pos;
        nb++;
        pos = off + ln;
        i += 1;
        if (nb == BATCH) {
            if (settle(batch_p, batch_len, batch_head, batch_pos, nb, imd5, &i, &pos, &nbytes)) {
                nb = 0;
                goto answer;
            }
            nb = 0;
        }
    }
    if (nb) settle(batch_p, batch_len, batch_head, batch_pos, nb, imd5, &i, &pos, &nbytes);
answer:
    result = Py_BuildValue("(LnL)", (long long)pos, i, (long long)nbytes);
done:
    for (int k = 0; k < opened; k++) column_close(&c[k]);
    PyBuffer_Release(&wbv);
    PyBuffer_Release(&md5v);
    return result;
}

static PyMethodDef methods[] = {
    {"clean_run", clean_run, METH_VARARGS, "Verifier.clean_run in C (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_walk", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__walk(void) {
    crc_init();
    return PyModule_Create(&module);
}
