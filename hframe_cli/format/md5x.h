/* hframe_cli/format/md5x.h: the md5 of many byte strings at once (multi-buffer md5), for the compiled
 * parts (write/_blobs.c, verify/_walk.c).
 *
 * Why: md5 is one long chain of dependent 32-bit additions and rotations; one stream cannot run
 * faster than that chain (about 700 MB/s a core here, OpenSSL's or md5sum's). A pack has many
 * frames, each hashed on its own, so 16 of them can be hashed side by side, one in each 32-bit
 * lane of a vector register: the same 64 steps, on 16 blocks at once. Storage systems do the same
 * (Intel ISA-L's md5_mb, MinIO's md5-simd). The digests are md5's, bit for bit (tests compare them
 * with hashlib's at every length around the block and padding boundaries).
 *
 * One source, written with GCC/Clang vector types; on x86-64 it is compiled three times
 * (AVX-512, AVX2, baseline SSE2) and the best this CPU runs is used; other machines get the
 * generic build. Nothing here calls Python.
 *
 *   md5x_many(ptrs, lens, n, out)   out[16 * i .. 16 * i + 15] = md5(ptrs[i][0 .. lens[i]])
 *   md5x_many_with(isa, ...)        the same with the build asked for (tests run each one this
 *                                   CPU can: MD5X_AVX512, MD5X_AVX2, MD5X_BASELINE)
 *   md5x_best()                     the build md5x_many uses here
 */
#ifndef HFRAME_MD5X_H
#define HFRAME_MD5X_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
/* md5 reads its input as little-endian words, as they lie in memory here (the build of this
 * optional part fails elsewhere, and hashlib does the hashing) */
#error "md5x.h reads md5's little-endian words as they are in memory"
#endif

#define MD5X_LANES 16

typedef uint32_t md5x_vec __attribute__((vector_size(4 * MD5X_LANES)));

enum { MD5X_BASELINE = 0, MD5X_AVX2 = 1, MD5X_AVX512 = 2 };

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MD5X_X86 1
#endif

static const uint32_t md5x_k[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
};

/* One lane: the string it hashes now, its blocks still to go, and the last one or two blocks
 * (the string's tail, 0x80, zeros, the length in bits) built when it starts. */
typedef struct {
    const unsigned char *p; /* next full block of the string itself */
    size_t full;            /* full blocks of the string left */
    int tail;               /* blocks of `pad` left (1 or 2) */
    int tail_at;            /* which block of `pad` is next */
    size_t job;             /* the string's index, or (size_t)-1: the lane is idle */
    unsigned char pad[128];
} md5x_lane;

static void md5x_start(md5x_lane *ln, const unsigned char *p, size_t len, size_t job) {
    size_t rest = len & 63;
    ln->p = p;
    ln->full = len >> 6;
    ln->job = job;
    ln->tail_at = 0;
    ln->tail = rest < 56 ? 1 : 2;
    memset(ln->pad, 0, sizeof ln->pad);
    if (rest) memcpy(ln->pad, p + (len - rest), rest);
    ln->pad[rest] = 0x80;
    uint64_t bits = (uint64_t)len << 3;
    memcpy(ln->pad + 64 * ln->tail - 8, &bits, 8); /* little-endian (checked above) */
}

#define MD5X_ROTL(x, s) (((x) << (s)) | ((x) >> (32 - (s))))
#define MD5X_STEP(f, a, b, c, d, w, k, s) \
    do {                                  \
        a += f(b, c, d) + (w) + (k);      \
        a = MD5X_ROTL(a, s) + b;          \
    } while (0)
#define MD5X_F(b, c, d) ((d) ^ ((b) & ((c) ^ (d))))
#define MD5X_G(b, c, d) ((c) ^ ((d) & ((b) ^ (c))))
#define MD5X_H(b, c, d) ((b) ^ (c) ^ (d))
#define MD5X_I(b, c, d) ((c) ^ ((b) | ~(d)))

/* The algorithm; inlined into one function per instruction set below, which compiles it for that set. */
static inline __attribute__((always_inline)) void md5x_core(const unsigned char *const *ptrs, const size_t *lens,
                                                            size_t n, unsigned char *out) {
    static const unsigned char idle_block[64];
    md5x_lane lanes[MD5X_LANES];
    uint32_t st[4][MD5X_LANES];
    uint32_t w[16][MD5X_LANES] __attribute__((aligned(64)));
    size_t next = 0;
    int busy = 0;

    for (int l = 0; l < MD5X_LANES; l++) {
        lanes[l].job = (size_t)-1;
        if (next < n) {
            md5x_start(&lanes[l], ptrs[next], lens[next], next);
            next++;
            busy++;
        }
        st[0][l] = 0x67452301u;
        st[1][l] = 0xefcdab89u;
        st[2][l] = 0x98badcfeu;
        st[3][l] = 0x10325476u;
    }

    while (busy) {
        /* each lane's next block, its words laid out word by word across the lanes */
        for (int l = 0; l < MD5X_LANES; l++) {
            md5x_lane *ln = &lanes[l];
            const unsigned char *b;
            if (ln->job == (size_t)-1)
                b = idle_block;
            else if (ln->full)
                b = ln->p;
            else
                b = ln->pad + 64 * ln->tail_at;
            uint32_t words[16];
            memcpy(words, b, 64);
            for (int j = 0; j < 16; j++) w[j][l] = words[j];
        }

        md5x_vec a, b, c, d, aa, bb, cc, dd, x[16];
        memcpy(&a, st[0], sizeof a);
        memcpy(&b, st[1], sizeof b);
        memcpy(&c, st[2], sizeof c);
        memcpy(&d, st[3], sizeof d);
        for (int j = 0; j < 16; j++) memcpy(&x[j], w[j], sizeof x[j]);
        aa = a, bb = b, cc = c, dd = d;

        MD5X_STEP(MD5X_F, a, b, c, d, x[0], md5x_k[0], 7);
        MD5X_STEP(MD5X_F, d, a, b, c, x[1], md5x_k[1], 12);
        MD5X_STEP(MD5X_F, c, d, a, b, x[2], md5x_k[2], 17);
        MD5X_STEP(MD5X_F, b, c, d, a, x[3], md5x_k[3], 22);
        MD5X_STEP(MD5X_F, a, b, c, d, x[4], md5x_k[4], 7);
        MD5X_STEP(MD5X_F, d, a, b, c, x[5], md5x_k[5], 12);
        MD5X_STEP(MD5X_F, c, d, a, b, x[6], md5x_k[6], 17);
        MD5X_STEP(MD5X_F, b, c, d, a, x[7], md5x_k[7], 22);
        MD5X_STEP(MD5X_F, a, b, c, d, x[8], md5x_k[8], 7);
        MD5X_STEP(MD5X_F, d, a, b, c, x[9], md5x_k[9], 12);
        MD5X_STEP(MD5X_F, c, d, a, b, x[10], md5x_k[10], 17);
        MD5X_STEP(MD5X_F, b, c, d, a, x[11], md5x_k[11], 22);
        MD5X_STEP(MD5X_F, a, b, c, d, x[12], md5x_k[12], 7);
        MD5X_STEP(MD5X_F, d, a, b, c, x[13], md5x_k[13], 12);
        MD5X_STEP(MD5X_F, c, d, a, b, x[14], md5x_k[14], 17);
        MD5X_STEP(MD5X_F, b, c, d, a, x[15], md5x_k[15], 22);

        MD5X_STEP(MD5X_G, a, b, c, d, x[1], md5x_k[16], 5);
        MD5X_STEP(MD5X_G, d, a, b, c, x[6], md5x_k[17], 9);
        MD5X_STEP(MD5X_G, c, d, a, b, x[11], md5x_k[18], 14);
        MD5X_STEP(MD5X_G, b, c, d, a, x[0], md5x_k[19], 20);
        MD5X_STEP(MD5X_G, a, b, c, d, x[5], md5x_k[20], 5);
        MD5X_STEP(MD5X_G, d, a, b, c, x[10], md5x_k[21], 9);
        MD5X_STEP(MD5X_G, c, d, a, b, x[15], md5x_k[22], 14);
        MD5X_STEP(MD5X_G, b, c, d, a, x[4], md5x_k[23], 20);
        MD5X_STEP(MD5X_G, a, b, c, d, x[9], md5x_k[24], 5);
        MD5X_STEP(MD5X_G, d, a, b, c, x[14], md5x_k[25], 9);
        MD5X_STEP(MD5X_G, c, d, a, b, x[3], md5x_k[26], 14);
        MD5X_STEP(MD5X_G, b, c, d, a, x[8], md5x_k[27], 20);
        MD5X_STEP(MD5X_G, a, b, c, d, x[13], md5x_k[28], 5);
        MD5X_STEP(MD5X_G, d, a, b, c, x[2], md5x_k[29], 9);
        MD5X_STEP(MD5X_G, c, d, a, b, x[7], md5x_k[30], 14);
        MD5X_STEP(MD5X_G, b, c, d, a, x[12], md5x_k[31], 20);

        MD5X_STEP(MD5X_H, a, b, c, d, x[5], md5x_k[32], 4);
        MD5X_STEP(MD5X_H, d, a, b, c, x[8], md5x_k[33], 11);
        MD5X_STEP(MD5X_H, c, d, a, b, x[11], md5x_k[34], 16);
        MD5X_STEP(MD5X_H, b, c, d, a, x[14], md5x_k[35], 23);
        MD5X_STEP(MD5X_H, a, b, c, d, x[1], md5x_k[36], 4);
        MD5X_STEP(MD5X_H, d, a, b, c, x[4], md5x_k[37], 11);
        MD5X_STEP(MD5X_H, c, d, a, b, x[7], md5x_k[38], 16);
        MD5X_STEP(MD5X_H, b, c, d, a, x[10], md5x_k[39], 23);
        MD5X_STEP(MD5X_H, a, b, c, d, x[13], md5x_k[40], 4);
        MD5X_STEP(MD5X_H, d, a, b, c, x[0], md5x_k[41], 11);
        MD5X_STEP(MD5X_H, c, d, a, b, x[3], md5x_k[42], 16);
        MD5X_STEP(MD5X_H, b, c, d, a, x[6], md5x_k[43], 23);
        MD5X_STEP(MD5X_H, a, b, c, d, x[9], md5x_k[44], 4);
        MD5X_STEP(MD5X_H, d, a, b, c, x[12], md5x_k[45], 11);
        MD5X_STEP(MD5X_H, c, d, a, b, x[15], md5x_k[46], 16);
        MD5X_STEP(MD5X_H, b, c, d, a, x[2], md5x_k[47], 23);

        MD5X_STEP(MD5X_I, a, b, c, d, x[0], md5x_k[48], 6);
        MD5X_STEP(MD5X_I, d, a, b, c, x[7], md5x_k[49], 10);
        MD5X_STEP(MD5X_I, c, d, a, b, x[14], md5x_k[50], 15);
        MD5X_STEP(MD5X_I, b, c, d, a, x[5], md5x_k[51], 21);
        MD5X_STEP(MD5X_I, a, b, c, d, x[12], md5x_k[52], 6);
        MD5X_STEP(MD5X_I, d, a, b, c, x[3], md5x_k[53], 10);
        MD5X_STEP(MD5X_I, c, d, a, b, x[10], md5x_k[54], 15);
        MD5X_STEP(MD5X_I, b, c, d, a, x[1], md5x_k[55], 21);
        MD5X_STEP(MD5X_I, a, b, c, d, x[8], md5x_k[56], 6);
        MD5X_STEP(MD5X_I, d, a, b, c, x[15], md5x_k[57], 10);
        MD5X_STEP(MD5X_I, c, d, a, b, x[6], md5x_k[58], 15);
        MD5X_STEP(MD5X_I, b, c, d, a, x[13], md5x_k[59], 21);
        MD5X_STEP(MD5X_I, a, b, c, d, x[4], md5x_k[60], 6);
        MD5X_STEP(MD5X_I, d, a, b, c, x[11], md5x_k[61], 10);
        MD5X_STEP(MD5X_I, c, d, a, b, x[2], md5x_k[62], 15);
        MD5X_STEP(MD5X_I, b, c, d, a, x[9], md5x_k[63], 21);

        a += aa, b += bb, c += cc, d += dd;
        memcpy(st[0], &a, sizeof a);
        memcpy(st[1], &b, sizeof b);
        memcpy(st[2], &c, sizeof c);
        memcpy(st[3], &d, sizeof d);

        /* advance each lane; a lane whose string is done gives its digest and takes the next */
        for (int l = 0; l < MD5X_LANES; l++) {
            md5x_lane *ln = &lanes[l];
            if (ln->job == (size_t)-1) continue;
            if (ln->full) {
                ln->full--;
                ln->p += 64;
                continue;
            }
            if (++ln->tail_at < ln->tail) continue;
            unsigned char *o = out + 16 * ln->job;
            for (int r = 0; r < 4; r++) {
                memcpy(o + 4 * r, &st[r][l], 4);
            }
            st[0][l] = 0x67452301u;
            st[1][l] = 0xefcdab89u;
            st[2][l] = 0x98badcfeu;
            st[3][l] = 0x10325476u;
            if (next < n) {
                md5x_start(ln, ptrs[next], lens[next], next);
                next++;
            } else {
                ln->job = (size_t)-1;
                busy--;
            }
        }
    }
}

static void md5x_many_baseline(const unsigned char *const *ptrs, const size_t *lens, size_t n, unsigned char *out) {
    md5x_core(ptrs, lens, n, out);
}

#ifdef MD5X_X86
__attribute__((target("avx2"))) static void md5x_many_avx2(const unsigned char *const *ptrs, const size_t *lens,
                                                          size_t n, unsigned char *out) {
    md5x_core(ptrs, lens, n, out);
}

__attribute__((target("avx512f"))) static void md5x_many_avx512(const unsigned char *const *ptrs,
                                                               const size_t *lens, size_t n, unsigned char *out) {
    md5x_core(ptrs, lens, n, out);
}
#endif

/* The best build this CPU runs. */
static int md5x_best(void) {
#ifdef MD5X_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return MD5X_AVX512;
    if (__builtin_cpu_supports("avx2")) return MD5X_AVX2;
#endif
    return MD5X_BASELINE;
}

/* md5x_many with build `isa`; -1 (nothing hashed) when this CPU cannot run it. */
static int md5x_many_with(int isa, const unsigned char *const *ptrs, const size_t *lens, size_t n,
                          unsigned char *out) {
    if (isa > md5x_best()) return -1;
#ifdef MD5X_X86
    if (isa == MD5X_AVX512) {
        md5x_many_avx512(ptrs, lens, n, out);
        return 0;
    }
    if (isa == MD5X_AVX2) {
        md5x_many_avx2(ptrs, lens, n, out);
        return 0;
    }
#endif
    if (isa != MD5X_BASELINE) return -1;
    md5x_many_baseline(ptrs, lens, n, out);
    return 0;
}

__attribute__((unused)) static void md5x_many(const unsigned char *const *ptrs, const size_t *lens, size_t n,
                                                unsigned char *out) {
    static int best = -1;
    if (best < 0) best = md5x_best();
    md5x_many_with(best, ptrs, lens, n, out);
}

#endif /* HFRAME_MD5X_H */
