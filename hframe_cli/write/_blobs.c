/* hframe_cli.write._blobs: a packing worker's chunk of small files, read and laid out in C.
 *
 * The optional compiled part of ``hframe pack`` (issue 35). A folder of small files costs per
 * file, and in Python most of that cost is the interpreter around five system calls: opening,
 * reading and hashing the file, sniffing it, reading an image's header, encoding its record
 * header and index row. For a chunk of files that are all blobs stored as they are or JPEG/PNG
 * images whose header says their size (``parallel._add_sources``) this module does it in one
 * call and hands back the chunk's records as one buffer plus its index columns. The bytes are
 * exactly those ``PackWriter.add``/``add_blob`` and ``ChunkWriter.write_at`` produce for the same
 * files (tests/write/test_native.py compares them, and the suite runs the packing tests again
 * with ``HFRAME_NATIVE=0``: the pure-Python path stays the reference):
 *
 *   read_chunk(paths, sizes, mtimes, names, first, end, max_name, max_size, blob_kind,
 *              image_kind, image_meta)
 *       -> None | (image, count, rec_offs, offsets, lengths, md5s, digest_input,
 *                  media, widths, heights, modes)
 *
 *   paths, sizes, mtimes, names   the source list's columns (str, int, int ns, bytes)
 *   first, end                    the chunk: sources first..end-1
 *   max_name, max_size            MAX_NAME_BYTES, STREAM_ABOVE
 *   blob_kind, image_kind         the record kinds (layout.KIND_IDS)
 *   image_meta                    whether images get their size and mode (MediaOptions)
 *
 *   None when any source of the chunk is not one of those, read as listed: a located source
 *   (its path holds a NUL), too large, a long name, another image format or a header the
 *   Python path would ask Pillow about, a file that vanished, cannot be read, or changed since
 *   it was listed. The caller then takes the chunk through the general path, which says what
 *   is wrong with which file.
 *
 *   image         bytearray: the chunk's records back to back, headers with frame ids 0..n-1
 *                 and no CRC yet (``number`` sets both once the chunk is placed)
 *   rec_offs, offsets, lengths   bytes of int64 (native order): each record's offset in the
 *                 chunk, its payload's offset in the chunk, its length
 *   md5s          bytes: 16 per frame
 *   digest_input  bytearray: what ``PackWriter`` feeds the pack digest for these frames
 *   media, modes  bytes, one per frame: codes of format.index.COMPILED_MEDIA, COMPILED_MODES
 *   widths, heights   bytes of int32 (0 for a blob)
 *
 *   number(image, rec_offs, first_frame) -> None
 *       frame ids first_frame.. and the CRC of every record header (``layout.encode_record``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the pack layout is little-endian; this module stores integers as they are in memory"
#endif

#include "../format/md5x.h"

#define RECORD_FIXED 76 /* layout.RECORD_FIXED: "<4sIQQQ16sqHHIIII" */
#define HEAD_NO_CRC 72
#define DIGEST_FIXED 20 /* writer._DIGEST: "<IQq" (name length, length, mtime) */
#define SNIFF_BYTES 18

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* zlib.crc32(data, crc) */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--) crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* Whether ``layout.sniff_media_type`` names a media type for these first bytes (not "unknown"). */
static int known_media(const unsigned char *h, Py_ssize_t n) {
    if (n <= 0) return 0;
    switch (h[0]) {
    case 0xFF:
        return n >= 3 && memcmp(h, "\xff\xd8\xff", 3) == 0;
    case 0x89:
        return n >= 8 && memcmp(h, "\x89PNG\r\n\x1a\n", 8) == 0;
    case 0x47:
        return n >= 6 && (memcmp(h, "GIF87a", 6) == 0 || memcmp(h, "GIF89a", 6) == 0);
    case 0x42: {
        if (n < 18 || h[1] != 'M') return 0;
        uint32_t dib = (uint32_t)h[14] | (uint32_t)h[15] << 8 | (uint32_t)h[16] << 16 | (uint32_t)h[17] << 24;
        return dib == 12 || dib == 16 || dib == 40 || dib == 52 || dib == 56 || dib == 64 || dib == 108 ||
               dib == 124; /* layout._BMP_DIB_SIZES */
    }
    case 0x49:
    case 0x4D:
        return n >= 4 && (memcmp(h, "II*\0", 4) == 0 || memcmp(h, "MM\0*", 4) == 0);
    case 0x52:
        return n >= 12 && memcmp(h, "RIFF", 4) == 0 && memcmp(h + 8, "WEBP", 4) == 0;
    default:
        return 0;
    }
}

/* Media codes this module hands back (format.index.COMPILED_MEDIA): a blob, or an image whose
 * header it read. */
#define MEDIA_BLOB 0
#define MEDIA_JPEG 1
#define MEDIA_PNG 2

/* Image modes (format.index.COMPILED_MODES), as ``imagehead`` names them. */
enum { MODE_NONE, MODE_L, MODE_RGB, MODE_CMYK, MODE_1, MODE_P, MODE_LA, MODE_RGBA };
static const char *const MODE_NAMES[] = {"", "L", "RGB", "CMYK", "1", "P", "LA", "RGBA"};

static unsigned be16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* ``imagehead._jpeg``: walk the marker segments to the first SOF; 0 when unsure (the Python
 * path then asks Pillow, and this chunk is declined). */
static int jpeg_info(const unsigned char *d, Py_ssize_t n, uint32_t *w, uint32_t *h, int *mode) {
    Py_ssize_t pos = 2;
    while (pos + 4 <= n) {
        if (d[pos] != 0xFF) return 0;
        unsigned marker = d[pos + 1];
        if (marker == 0xFF) { /* fill byte */
            pos += 1;
            continue;
        }
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) { /* TEM, RSTn: no length */
            pos += 2;
            continue;
        }
        unsigned length = be16(d + pos + 2);
        if (length < 2) return 0;
        int sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
        if (sof) {
            if (pos + 10 > n) return 0;
            *h = be16(d + pos + 5);
            *w = be16(d + pos + 7);
            unsigned comps = d[pos + 9];
            *mode = comps == 1 ? MODE_L : comps == 3 ? MODE_RGB : comps == 4 ? MODE_CMYK : MODE_NONE;
            return *mode != MODE_NONE && *w && *h;
        }
        if (marker == 0xD9 || marker == 0xDA) return 0; /* end of image, or a scan before any SOF */
        pos += 2 + (Py_ssize_t)length;
    }
    return 0;
}

/* ``imagehead._png``: the IHDR chunk right after the signature; 0 when unsure. */
static int png_info(const unsigned char *d, Py_ssize_t n, uint32_t *w, uint32_t *h, int *mode) {
    if (n < 33 || memcmp(d + 12, "IHDR", 4) != 0) return 0;
    *w = be32(d + 16);
    *h = be32(d + 20);
    unsigned depth = d[24], color = d[25];
    *mode = MODE_NONE;
    if (color == 0) *mode = depth == 1 ? MODE_1 : (depth == 2 || depth == 4 || depth == 8) ? MODE_L : MODE_NONE;
    if (color == 2 && depth == 8) *mode = MODE_RGB;
    if (color == 3 && (depth == 1 || depth == 2 || depth == 4 || depth == 8)) *mode = MODE_P;
    if (color == 4 && depth == 8) *mode = MODE_LA;
    if (color == 6 && depth == 8) *mode = MODE_RGBA;
    return *mode != MODE_NONE && *w && *h;
}

#define EXTRA_MAX 64 /* the longest extra an image gets: entry (6) + {"height":N,"mode":"M","width":N} */

/* The folder of the file being read: consecutive files of one folder (sources come sorted by
 * name) are opened relative to it, so the kernel walks their path once per folder. */
typedef struct {
    char *path;
    size_t len;
    int fd; /* -1: none (files are then opened by their whole path) */
} folder_t;

static int open_in(folder_t *dir, const char *path) {
    const char *slash = strrchr(path, '/');
    if (slash == NULL || slash == path) return open(path, O_RDONLY | O_CLOEXEC);
    size_t len = (size_t)(slash - path);
    if (dir->path == NULL || dir->len != len || memcmp(dir->path, path, len) != 0) {
        if (dir->fd >= 0) close(dir->fd);
        free(dir->path);
        dir->fd = -1;
        dir->len = len;
        dir->path = malloc(len + 1);
        if (dir->path != NULL) {
            memcpy(dir->path, path, len);
            dir->path[len] = 0;
            dir->fd = open(dir->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        }
    }
    if (dir->fd < 0) return open(path, O_RDONLY | O_CLOEXEC);
    return openat(dir->fd, slash + 1, O_RDONLY | O_CLOEXEC);
}

/* Read the file into ``buf`` (room for size + 1 bytes): 1 when it holds exactly ``size`` bytes
 * and was last modified at ``mtime_ns``, as listed; 0 otherwise. */
static int read_as_listed(folder_t *dir, const char *path, unsigned char *buf, Py_ssize_t size, long long mtime_ns) {
    int fd = open_in(dir, path);
    if (fd < 0) return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == size &&
             (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec == mtime_ns;
    Py_ssize_t want = size + 1, got = 0; /* one byte more than listed: a file that grew shows */
    while (ok && got < want) {
        ssize_t n = read(fd, buf + got, (size_t)(want - got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ok = n == 0;
            break;
        }
        got += n;
    }
    close(fd);
    return ok && got == size;
}

static void put_u16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

typedef struct {
    PyObject *path; /* bytes (file system encoding) */
    const unsigned char *name;
    Py_ssize_t nlen, size;
    long long mtime_ns;
} file_t;

static PyObject *read_chunk(PyObject *self, PyObject *args) {
    PyObject *paths, *sizes, *mtimes, *names;
    Py_ssize_t first, end, max_name, max_size, blob_kind, image_kind;
    int image_meta;
    if (!PyArg_ParseTuple(args, "O!O!O!O!nnnnnnp", &PyList_Type, &paths, &PyList_Type, &sizes, &PyList_Type,
                          &mtimes, &PyList_Type, &names, &first, &end, &max_name, &max_size, &blob_kind, &image_kind,
                          &image_meta))
        return NULL;
    Py_ssize_t total = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(sizes) != total || PyList_GET_SIZE(mtimes) != total || PyList_GET_SIZE(names) != total ||
        first < 0 || end > total || first > end) {
        PyErr_SetString(PyExc_ValueError, "read_chunk: columns of different lengths or a chunk outside them");
        return NULL;
    }
    Py_ssize_t n = end - first, room = 1, digest_room = 0;
    file_t *files = PyMem_Calloc(n ? (size_t)n : 1, sizeof(file_t));
    if (files == NULL) return PyErr_NoMemory();
    /* the payloads, hashed together once the chunk is read (md5x.h); where each md5 goes */
    const unsigned char **payloads = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*payloads));
    size_t *payload_lens = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*payload_lens));
    Py_ssize_t *digest_at = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*digest_at));
    if (payloads == NULL || payload_lens == NULL || digest_at == NULL) {
        PyMem_Free(files);
        PyMem_Free(payloads);
        PyMem_Free(payload_lens);
        PyMem_Free(digest_at);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL, *image = NULL, *rec_offs = NULL, *offsets = NULL, *lengths = NULL, *md5s = NULL,
             *digest = NULL, *media = NULL, *widths = NULL, *heights = NULL, *modes = NULL;
    folder_t dir = {NULL, 0, -1};
    int plain = 1;
    for (Py_ssize_t j = 0; j < n; j++) {
        file_t *f = &files[j];
        PyObject *path = PyList_GET_ITEM(paths, first + j), *name = PyList_GET_ITEM(names, first + j);
        if (!PyUnicode_Check(path) || !PyBytes_Check(name)) {
            plain = 0;
            break;
        }
        f->size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, first + j));
        f->mtime_ns = PyLong_AsLongLong(PyList_GET_ITEM(mtimes, first + j));
        if (PyErr_Occurred()) goto done;
        f->name = (const unsigned char *)PyBytes_AS_STRING(name);
        f->nlen = PyBytes_GET_SIZE(name);
        if (f->size < 0 || f->size > max_size || f->nlen > max_name) {
            plain = 0;
            break;
        }
        f->path = PyUnicode_EncodeFSDefault(path);
        if (f->path == NULL) goto done;
        if ((Py_ssize_t)strlen(PyBytes_AS_STRING(f->path)) != PyBytes_GET_SIZE(f->path)) {
            plain = 0; /* a located source (sources/locator.py): read where it sits */
            break;
        }
        room += RECORD_FIXED + f->nlen + EXTRA_MAX + f->size;
        digest_room += 2 * DIGEST_FIXED + f->nlen + 16 + EXTRA_MAX;
    }
    if (!plain) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    image = PyByteArray_FromStringAndSize(NULL, room);
    rec_offs = PyBytes_FromStringAndSize(NULL, 8 * n);
    offsets = PyBytes_FromStringAndSize(NULL, 8 * n);
    lengths = PyBytes_FromStringAndSize(NULL, 8 * n);
    md5s = PyBytes_FromStringAndSize(NULL, 16 * n);
    digest = PyByteArray_FromStringAndSize(NULL, digest_room);
    media = PyBytes_FromStringAndSize(NULL, n);
    widths = PyBytes_FromStringAndSize(NULL, 4 * n);
    heights = PyBytes_FromStringAndSize(NULL, 4 * n);
    modes = PyBytes_FromStringAndSize(NULL, n);
    if (!image || !rec_offs || !offsets || !lengths || !md5s || !digest || !media || !widths || !heights || !modes)
        goto done;
    unsigned char *buf = (unsigned char *)PyByteArray_AS_STRING(image);
    unsigned char *dg = (unsigned char *)PyByteArray_AS_STRING(digest), *dg0 = dg;
    unsigned char *sums = (unsigned char *)PyBytes_AS_STRING(md5s);
    unsigned char *kinds = (unsigned char *)PyBytes_AS_STRING(media), *mode_of = (unsigned char *)PyBytes_AS_STRING(modes);
    int64_t *rec_at = (int64_t *)PyBytes_AS_STRING(rec_offs), *pay_at = (int64_t *)PyBytes_AS_STRING(offsets),
            *len_at = (int64_t *)PyBytes_AS_STRING(lengths);
    int32_t *w_of = (int32_t *)PyBytes_AS_STRING(widths), *h_of = (int32_t *)PyBytes_AS_STRING(heights);
    Py_ssize_t pos = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        file_t *f = &files[j];
        unsigned char *h = buf + pos, *payload = h + RECORD_FIXED + f->nlen;
        if ((j & 63) == 63 && PyErr_CheckSignals() < 0) goto done;
        if (!read_as_listed(&dir, PyBytes_AS_STRING(f->path), payload, f->size, f->mtime_ns)) goto decline;
        /* what it is: a blob, or an image whose size and mode its header says (as FramePrep.prepare) */
        uint32_t width = 0, height = 0;
        int mode = MODE_NONE, kind = MEDIA_BLOB;
        if (known_media(payload, f->size < SNIFF_BYTES ? f->size : SNIFF_BYTES)) {
            if (!image_meta) goto decline;
            if (payload[0] == 0xFF && jpeg_info(payload, f->size, &width, &height, &mode))
                kind = MEDIA_JPEG;
            else if (payload[0] == 0x89 && png_info(payload, f->size, &width, &height, &mode))
                kind = MEDIA_PNG;
            else
                goto decline; /* other formats, and headers only Pillow can tell: the Python path */
            if (width > INT32_MAX || height > INT32_MAX) goto decline;
        }
        unsigned char extra[EXTRA_MAX];
        Py_ssize_t elen = 0;
        if (kind != MEDIA_BLOB) { /* media.encode_meta's JSON in an extra entry (layout.encode_extra) */
            int jlen = snprintf((char *)extra + 6, EXTRA_MAX - 6, "{\"height\":%u,\"mode\":\"%s\",\"width\":%u}",
                                (unsigned)height, MODE_NAMES[mode], (unsigned)width);
            if (jlen < 0 || jlen >= EXTRA_MAX - 6) goto decline;
            put_u16(extra, 1); /* layout.EXTRA_META */
            put_u32(extra + 2, (uint32_t)jlen);
            elen = 6 + jlen;
            memmove(payload + elen, payload, (size_t)f->size);
            memcpy(payload, extra, (size_t)elen);
            payload += elen;
        }
        payloads[j] = payload;
        payload_lens[j] = (size_t)f->size;
        Py_ssize_t hdr = RECORD_FIXED + f->nlen + elen;
        memcpy(h, "HFR1", 4);
        put_u32(h + 4, (uint32_t)hdr);
        put_u64(h + 8, (uint64_t)j); /* frame id and CRC: number() */
        put_u64(h + 16, (uint64_t)f->size);
        put_u64(h + 24, (uint64_t)f->size);
        /* h + 32: the md5, below */
        put_u64(h + 48, (uint64_t)f->mtime_ns);
        put_u16(h + 56, 0); /* codec */
        put_u16(h + 58, (uint16_t)(kind == MEDIA_BLOB ? blob_kind : image_kind));
        put_u32(h + 60, (uint32_t)f->nlen);
        put_u32(h + 64, (uint32_t)elen);
        put_u32(h + 68, 0); /* flags */
        put_u32(h + 72, 0); /* crc */
        memcpy(h + RECORD_FIXED, f->name, (size_t)f->nlen);
        rec_at[j] = pos;
        pay_at[j] = pos + hdr;
        len_at[j] = f->size;
        kinds[j] = (unsigned char)kind;
        mode_of[j] = (unsigned char)mode;
        w_of[j] = (int32_t)width;
        h_of[j] = (int32_t)height;
        /* the pack digest's input (PackWriter._append_row) */
        put_u32(dg, (uint32_t)f->nlen);
        put_u64(dg + 4, (uint64_t)f->size);
        put_u64(dg + 12, (uint64_t)f->mtime_ns);
        memcpy(dg + DIGEST_FIXED, f->name, (size_t)f->nlen);
        digest_at[j] = (dg - dg0) + DIGEST_FIXED + f->nlen; /* the md5, below */
        dg += DIGEST_FIXED + f->nlen + 16;
        if (elen) {
            put_u32(dg, 0); /* codec */
            put_u64(dg + 4, (uint64_t)f->size);
            put_u64(dg + 12, (uint64_t)elen);
            memcpy(dg + DIGEST_FIXED, h + RECORD_FIXED + f->nlen, (size_t)elen);
            dg += DIGEST_FIXED + elen;
        }
        pos += hdr + f->size;
    }
    Py_BEGIN_ALLOW_THREADS
    md5x_many(payloads, payload_lens, (size_t)n, sums);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        memcpy(buf + rec_at[j] + 32, sums + 16 * j, 16);
        memcpy(dg0 + digest_at[j], sums + 16 * j, 16);
    }
    if (PyByteArray_Resize(image, pos) < 0 || PyByteArray_Resize(digest, dg - dg0) < 0) goto done;
    result = Py_BuildValue("(OnOOOOOOOOO)", image, n, rec_offs, offsets, lengths, md5s, digest, media, widths,
                           heights, modes);
    goto done;
decline: /* not a chunk for this loop: the Python path takes it, and says what is wrong if anything is */
    result = Py_NewRef(Py_None);
done:
    if (dir.fd >= 0) close(dir.fd);
    free(dir.path);
    for (Py_ssize_t j = 0; j < n; j++) Py_XDECREF(files[j].path);
    PyMem_Free(files);
    PyMem_Free(payloads);
    PyMem_Free(payload_lens);
    PyMem_Free(digest_at);
    Py_XDECREF(image);
    Py_XDECREF(rec_offs);
    Py_XDECREF(offsets);
    Py_XDECREF(lengths);
    Py_XDECREF(md5s);
    Py_XDECREF(digest);
    Py_XDECREF(media);
    Py_XDECREF(widths);
    Py_XDECREF(heights);
    Py_XDECREF(modes);
    return result;
}

static PyObject *number(PyObject *self, PyObject *args) {
    Py_buffer image, rec_offs;
    unsigned long long first_frame;
    if (!PyArg_ParseTuple(args, "w*y*K", &image, &rec_offs, &first_frame)) return NULL;
    PyObject *result = NULL;
    unsigned char *buf = image.buf;
    const int64_t *at = rec_offs.buf;
    Py_ssize_t n = rec_offs.len / 8;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (at[j] < 0 || at[j] + RECORD_FIXED > image.len) goto bad;
        unsigned char *h = buf + at[j];
        uint32_t nlen, extra;
        memcpy(&nlen, h + 60, 4);
        memcpy(&extra, h + 64, 4);
        if (memcmp(h, "HFR1", 4) != 0 || at[j] + RECORD_FIXED + (Py_ssize_t)nlen + (Py_ssize_t)extra > image.len)
            goto bad;
        put_u64(h + 8, first_frame + (uint64_t)j);
        /* layout.encode_record: the fixed part, then the name and the extra */
        uint32_t crc = crc32_update(crc32_update(0, h, HEAD_NO_CRC), h + RECORD_FIXED, (size_t)nlen + extra);
        put_u32(h + HEAD_NO_CRC, crc);
    }
    result = Py_NewRef(Py_None);
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError, "number: a record offset outside the image or not at a record");
done:
    PyBuffer_Release(&image);
    PyBuffer_Release(&rec_offs);
    return result;
}

static PyObject *crc32(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &crc)) return NULL;
    uint32_t out = crc32_update(crc, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(out);
}

static PyObject *media_known(PyObject *self, PyObject *args) {
    Py_buffer head;
    if (!PyArg_ParseTuple(args, "y*", &head)) return NULL;
    int known = known_media(head.buf, head.len < SNIFF_BYTES ? head.len : SNIFF_BYTES);
    PyBuffer_Release(&head);
    return PyBool_FromLong(known);
}

static PyMethodDef methods[] = {
    {"read_chunk", read_chunk, METH_VARARGS, "Read a chunk of plain blobs and lay out its records (see the module)."},
    {"number", number, METH_VARARGS, "Set the frame ids and CRCs of a chunk's record headers."},
    {"crc32", crc32, METH_VARARGS, "zlib.crc32 as number() computes it (for the tests)."},
    {"media_known", media_known, METH_VARARGS, "Whether sniff_media_type names a type (for the tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_blobs", NULL, -1, methods};

PyMODINIT_FUNC PyInit__blobs(void) {
    crc_init();
    return PyModule_Create(&module);
}
