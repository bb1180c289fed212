/* CPU kernels for decoding and verification: the model file's own blocks times float32 activations,
 * and attention over a float32 KV cache. Built by engine/native/__init__.py on first use.
 *
 * Both are row-invariant by construction: the result for one token's row is computed by the same
 * operations in the same order whatever the number of rows in the call (T), because every reduction
 * runs over a fixed structure of its own inputs (the blocks of a weight row; the keys 0..p of the
 * row's own position p, in blocks and segments aligned to absolute positions) and rows never share
 * a reduction. So verifying k drafted tokens in one forward gives the bits that k one-token steps
 * give, which is what makes speculative decoding token-identical to plain decoding.
 *
 * Threads: OpenMP over output rows (matmul) and over (KV head, key segment) pairs (attention); the
 * split among threads never changes what a row computes. Vectors: GCC/Clang vector extensions, so
 * one source compiles to AVX2/AVX-512 on x86 and NEON on ARM; the weights' tile has its own
 * 512-bit version where the compiler targets AVX-512 (1.3-1.6x the 8-lane tile on a Zen 5 EPYC).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)  /* F16C without AVX2: Ivy Bridge */
#include <immintrin.h>
#endif

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v8u8 __attribute__((vector_size(8)));
typedef int8_t v8s8 __attribute__((vector_size(8)));

#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif

static inline v8f load8(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }
static inline v8f splat(float x) { return (v8f){x, x, x, x, x, x, x, x}; }
static inline float hsum8(v8f v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }
#ifdef __AVX2__  /* GCC scalarizes __builtin_convertvector from bytes: say it in intrinsics */
static inline v8f u8_to_f(const uint8_t *p) {
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline v8f s8_to_f(const int8_t *p) {
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#else
static inline v8f u8_to_f(const uint8_t *p) {
    v8u8 b; memcpy(&b, p, 8); return __builtin_convertvector(__builtin_convertvector(b, v8i), v8f);
}
static inline v8f s8_to_f(const int8_t *p) {
    v8s8 b; memcpy(&b, p, 8); return __builtin_convertvector(__builtin_convertvector(b, v8i), v8f);
}
#endif
static inline v8f vmax(v8f a, v8f b) { v8i gt = a > b; return (v8f)((gt & (v8i)a) | (~gt & (v8i)b)); }

int triforce_kernels_version(void) { return 11; }

/* ------------------------------------------------------------------ weights: GGUF blocks
 * The weight is the file's own blocks, [out, nb] blocks of 32 weights of one row:
 *   Q4_0: [d f16][16 bytes] w = d * (q - 8)   Q4_1: [d f16][m f16][16 bytes] w = d * q + m
 *   Q8_0: [d f16][32 int8]  w = d * q
 * Q8_0 is read as stored (kind 8). The 4-bit kinds are read repacked (kind 6, engine/native): d and
 * m widened to float32 (Q4_0's m = -8 d, exact), so no block pays two half-to-float conversions and
 * broadcasts (a quarter of a 1-token matmul of the bundled model's Q4_1 layers), and the blocks of a
 * row grouped by four: [d0..d3 f32][m0..m3 f32][the file's 16 bytes of b0]..[b3] (a row's last group
 * may hold 1-3 blocks, laid out alike), so the int16-activation kernel below reads a group's 128
 * nibbles in one load and its four scales in another. 24 bytes a block either way. The float kernel reads the same
 * floats and nibbles per block: its products are the same bits as from the file's layout.
 * In a 4-bit block, byte j holds element j (low nibble) and element j + 16 (high nibble). The
 * weights are widened to float32 in registers (Q4_0's as d * q + (-8 d), which is exactly d * (q - 8))
 * and multiplied with float32 activations x [T, in]: y [T, out], in = 32 nb. Tokens are taken up to
 * 8 at a time, so a block is widened once per 8 tokens. */
static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
    float f;
    if (exp == 0x1F) bits = sign | 0x7F800000u | (man << 13);
    else if (exp) bits = sign | ((exp + 112u) << 23) | (man << 13);
    else {  /* zero or subnormal: man * 2^-24, exact in float32 */
        f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    memcpy(&f, &bits, 4);
    return f;
#endif
}

#define GROUP_BLOCKS 4
#define GROUP_BYTES (GROUP_BLOCKS * (8 + 16))

/* bytes of one row of nb blocks */
static inline int64_t row_bytes(int kind, int64_t nb) { return (kind == 8 ? 34 : 24) * nb; }

/* block b of a row of nb: its scale d, offset m and where its quants start (Q8_0: d as stored, f16,
 * m unused; the repacked 4-bit kinds: float32, in the block's group of n) */
static inline const uint8_t *block_at(int kind, const uint8_t *row, int64_t nb, int64_t b, float *d, float *m) {
    if (kind == 8) {
        const uint8_t *blk = row + 34 * b;
        *d = half_to_float(blk);
        *m = 0.0f;
        return blk + 2;
    }
    const int64_t first = b / GROUP_BLOCKS * GROUP_BLOCKS;
    const int n = nb - first < GROUP_BLOCKS ? (int)(nb - first) : GROUP_BLOCKS, k = (int)(b - first);
    const uint8_t *g = row + first * 24;
    memcpy(d, g + 4 * k, 4);
    memcpy(m, g + 4 * n + 4 * k, 4);
    return g + 8 * n + 16 * k;
}

#define TOKENS_PER_PASS 8
#define ROWS_PER_PASS 2

typedef uint8_t v16u8 __attribute__((vector_size(16)));

/* a * b + c rounded once where the CPU has FMA, else two roundings; spelled out rather than left to
 * the compiler's contraction, which treated the instances of attend_group for 1, 2 and 3 rows
 * differently (float32 K/V with head sizes other than 64 and 128) and so broke row invariance; the
 * weights' tile, instantiated per row and token count, uses it for the same reason */
static inline v8f fmadd8(v8f a, v8f b, v8f c) {
#if defined(__FMA__) && defined(__AVX2__)
    return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__FP_FAST_FMAF)  /* a hardware FMA the compiler could contract to (ARM): use it always */
    v8f r;
    for (int i = 0; i < 8; i++) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
#else  /* no FMA instruction: nothing to contract to */
    return a * b + c;
#endif
}

/* one token's 32 weights into its two accumulators, in the order every block tile uses (acc[0] takes
 * weights 0-7 and 16-23, acc[1] 8-15 and 24-31), so each kind's sums round alike */
static inline void fmadd32(v8f acc[2], const v8f w[4], const float *xp) {
    acc[0] = fmadd8(w[0], load8(xp), acc[0]);
    acc[1] = fmadd8(w[1], load8(xp + 8), acc[1]);
    acc[0] = fmadd8(w[2], load8(xp + 16), acc[0]);
    acc[1] = fmadd8(w[3], load8(xp + 24), acc[1]);
}

static inline void widen_q4(const uint8_t *nib, float d, float m, v8f w[4]) {
    const v8f dv = splat(d), mv = splat(m);
#ifdef __AVX2__
    /* The 16 bytes in both 128-bit lanes, then one byte shuffle per 8 elements that spreads bytes to
     * dwords (within lanes, zeros above). Two thirds of the cycles per block of the earlier
     * cvtepu8_epi32 + byte-shift version on a Zen 3 EPYC, with the same products. */
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nib));
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
    const __m256i first = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                           4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i second = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,
                                            12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1);
    w[0] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, first)), dv, mv);   /* elements 0-7 */
    w[1] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, second)), dv, mv);  /* 8-15 */
    w[2] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, first)), dv, mv);   /* 16-23 */
    w[3] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, second)), dv, mv);  /* 24-31 */
#else
    v16u8 b, lo, hi;
    memcpy(&b, nib, sizeof b);  /* elements 0-15 in the low nibbles, 16-31 in the high ones */
    lo = b & 0x0F;
    hi = b >> 4;
    const uint8_t *l = (const uint8_t *)&lo, *h = (const uint8_t *)&hi;
    w[0] = fmadd8(u8_to_f(l), dv, mv);
    w[1] = fmadd8(u8_to_f(l + 8), dv, mv);
    w[2] = fmadd8(u8_to_f(h), dv, mv);
    w[3] = fmadd8(u8_to_f(h + 8), dv, mv);
#endif
}

static inline void widen_q8(const int8_t *q, float d, v8f w[4]) {
    v8f dv = splat(d);
    for (int k = 0; k < 4; k++) w[k] = s8_to_f(q + 8 * k) * dv;
}

#ifdef __AVX512F__
/* With 512-bit vectors a block is two registers: elements 0-15 and 16-31. Widened with one FMA each
 * (d * q + m, for Q4_0 m = -8 d: exactly d * (q - 8), rounded once). */
static inline void widen16_q4(const uint8_t *nib, float d, float m, __m512 w[2]) {
    const __m128i b = _mm_loadu_si128((const __m128i *)nib), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
    w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), dv, mv);
    w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), dv, mv);
}

static inline void widen16_q8(const int8_t *q, float d, __m512 w[2]) {
    const __m512 dv = _mm512_set1_ps(d);
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), dv);
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))), dv);
}

/* Rows [o, o + nr) times tokens [t0, t0 + nt). Per row and token two 16-lane accumulators, one for
 * each half of every block, over the blocks in order, summed at the end in a fixed order: the same
 * operations for a token whatever nr, nt or the other tokens. */
static inline __attribute__((always_inline)) void tile(int kind, const uint8_t *blocks, int64_t nb,
                                                       const float *x, int64_t in, int64_t t0, int nt,
                                                       float *y, int64_t ys, int64_t o, int nr) {
    const int64_t rb = row_bytes(kind, nb);
    __m512 acc[ROWS_PER_PASS][TOKENS_PER_PASS][2];  /* only [nr][nt] used */
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < nr; r++) {
            float d, m;
            const uint8_t *qp = block_at(kind, blocks + (o + r) * rb, nb, b, &d, &m);
            __m512 w[2];
            if (kind == 8) widen16_q8((const int8_t *)qp, d, w);
            else widen16_q4(qp, d, m, w);
            for (int t = 0; t < nt; t++) {
                const float *xp = x + (t0 + t) * in + 32 * b;
                acc[r][t][0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xp), acc[r][t][0]);
                acc[r][t][1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xp + 16), acc[r][t][1]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const __m512 s = _mm512_add_ps(acc[r][t][0], acc[r][t][1]);
            /* halves, quarters, pairs, lanes: one fixed tree */
            const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
            y[(t0 + t) * ys + o + r] = hsum8((v8f)h);
        }
}
#else
/* Rows [o, o + nr) times tokens [t0, t0 + nt). Per row and token two 8-lane accumulators, one for
 * the even and one for the odd quarters of every block, over the blocks in order, summed at the end
 * in a fixed order: the same operations for a token whatever nr, nt or the other tokens. */
static inline __attribute__((always_inline)) void tile(int kind, const uint8_t *blocks, int64_t nb,
                                                       const float *x, int64_t in, int64_t t0, int nt,
                                                       float *y, int64_t ys, int64_t o, int nr) {
    const int64_t rb = row_bytes(kind, nb);
    v8f acc[ROWS_PER_PASS][TOKENS_PER_PASS][2];  /* only [nr][nt] used */
    memset(acc, 0, sizeof acc);
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < nr; r++) {
            float d, m;
            const uint8_t *qp = block_at(kind, blocks + (o + r) * rb, nb, b, &d, &m);
            v8f w[4];
            if (kind == 8) widen_q8((const int8_t *)qp, d, w);
            else widen_q4(qp, d, m, w);
            for (int t = 0; t < nt; t++) {
                const float *xp = x + (t0 + t) * in + 32 * b;
                fmadd32(acc[r][t], w, xp);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[(t0 + t) * ys + o + r] = hsum8(acc[r][t][0] + acc[r][t][1]);
}
#endif

/* ------------------------------------------------------------------ weights: GGUF blocks read as stored
 * Q4_K, Q5_K and Q6_K (super-blocks of 256 weights) and Q5_0, Q5_1 (blocks of 32) are read straight
 * from the file's bytes (a memory map may back them: nothing is repacked). A block is widened 32
 * weights at a time (a K sub-block, or the whole 32-block) into four 8-lane vectors (the float
 * kernel's tile for the 32-weight kinds; a prefill chunk's widened copy for every stored kind; the K
 * kinds' matmul runs with int16 activations, further below):
 *   Q4_K [d f16][dmin f16][12 bytes: 8 six-bit scales and mins][128 bytes]: sub-block j's weights
 *        are nibble (j % 2) of bytes 32 (j / 2) .. + 31, w = (d sc_j) q - (dmin m_j)
 *   Q5_K the same with [32 bytes qh] before the nibbles: bit j of qh[i] is element i's fifth bit
 *   Q6_K [128 bytes ql][64 bytes qh][16 int8 scales][d f16]: per half h (128 weights) element r
 *        has ql nibble r / 64 of ql[64 h + r % 64] and two bits 2 (r / 32) of qh[32 h + r % 32],
 *        w = (d sc_{e / 16}) (q - 32)
 *   Q5_0 [d f16][qh u32][16 bytes], w = d (q - 16); Q5_1 [d f16][m f16][qh u32][16 bytes], w = d q + m:
 *        element i < 16 the low nibble of byte i, element i + 16 its high one, bit i of qh the fifth.
 * Every product here is exact in float32 (d's 11 significant bits times a scale of at most 8 and a
 * code of at most 6), so a widened weight is the value gguf's dequantize computes, bit for bit, and
 * the matmul differs from the float32 oracle only in the order of its sums. */
typedef uint8_t v32u8 __attribute__((vector_size(32)));
typedef int8_t v32s8 __attribute__((vector_size(32)));

#define KIND_Q4_K 12
#define KIND_Q5_K 13
#define KIND_Q6_K 14
#define KIND_Q5_0 20
#define KIND_Q5_1 21
#define KIND_Q4_0_STORED 22  /* Q4_0 and Q4_1 as in the file, not repacked (kind 6): a large model's */
#define KIND_Q4_1_STORED 23
#define KIND_STACKED 1

static inline int is_stored_kind(int kind) { return kind >= KIND_Q4_K && kind <= KIND_Q4_1_STORED; }
static inline int64_t stored_block_bytes(int kind) {
    switch (kind) {
    case KIND_Q4_K: return 144;
    case KIND_Q5_K: return 176;
    case KIND_Q6_K: return 210;
    case KIND_Q5_0: return 22;
    case KIND_Q4_0_STORED: return 18;
    case KIND_Q4_1_STORED: return 20;
    default: return 24;  /* Q5_1 */
    }
}
static inline int64_t stored_block_weights(int kind) { return kind <= KIND_Q6_K ? 256 : 32; }

static inline v32u8 load32u8(const uint8_t *p) { v32u8 v; memcpy(&v, p, sizeof v); return v; }

/* 32 codes 0..255 -> w[k] = code * d + m for elements 8k .. 8k + 7 */
static inline void widen32_u8(v32u8 q, float d, float m, v8f w[4]) {
    const v8f dv = splat(d), mv = splat(m);
#ifdef __AVX2__
    const __m256i v = (__m256i)q;
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    w[0] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), dv, mv);
    w[1] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), dv, mv);
    w[2] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), dv, mv);
    w[3] = fmadd8((v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), dv, mv);
#else
    const uint8_t *b = (const uint8_t *)&q;
    for (int k = 0; k < 4; k++) w[k] = fmadd8(u8_to_f(b + 8 * k), dv, mv);
#endif
}

/* 32 signed codes -> w = code * d0 for elements 0-15, code * d1 for 16-31 (Q6_K's scales per 16) */
static inline void widen32_s8(v32s8 q, float d0, float d1, v8f w[4]) {
    const v8f a = splat(d0), b = splat(d1);
#ifdef __AVX2__
    const __m256i v = (__m256i)q;
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    w[0] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)) * a;
    w[1] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))) * a;
    w[2] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)) * b;
    w[3] = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))) * b;
#else
    const int8_t *s = (const int8_t *)&q;
    w[0] = s8_to_f(s) * a;
    w[1] = s8_to_f(s + 8) * a;
    w[2] = s8_to_f(s + 16) * b;
    w[3] = s8_to_f(s + 24) * b;
#endif
}

/* Q4_K / Q5_K: the 8 sub-blocks' effective scales d sc_j and offsets -(dmin m_j) */
static inline void k_scales(const uint8_t *blk, float d[8], float m[8]) {
    const float dd = half_to_float(blk), dmin = half_to_float(blk + 2);
    const uint8_t *s = blk + 4;
    for (int j = 0; j < 4; j++) {
        d[j] = dd * (float)(s[j] & 63);
        m[j] = -(dmin * (float)(s[j + 4] & 63));
    }
    for (int j = 4; j < 8; j++) {
        d[j] = dd * (float)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        m[j] = -(dmin * (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4)));
    }
}

/* Q5_0 / Q5_1: the 32 five-bit codes of a block, nibbles at `qs`, fifth bits in `qh` */
static inline v32u8 q5_codes(const uint8_t *qs, uint32_t qh) {
#ifdef __AVX2__
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i spread = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick), bit);
    const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(spread, bit), _mm256_set1_epi8(0x10));
    return (v32u8)_mm256_or_si256(nib, fifth);
#else
    v32u8 q;
    for (int i = 0; i < 16; i++) {
        q[i] = (uint8_t)((qs[i] & 15) | (((qh >> i) & 1) << 4));
        q[i + 16] = (uint8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
    }
    return q;
#endif
}

/* Q4_0 / Q4_1 as stored: the 32 codes of a block, element i < 16 the low nibble of byte i, i + 16 its high one */
static inline v32u8 q4_codes(const uint8_t *qs) {
#ifdef __AVX2__
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    return (v32u8)_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
#else
    v32u8 q;
    for (int i = 0; i < 16; i++) {
        q[i] = (uint8_t)(qs[i] & 15);
        q[i + 16] = (uint8_t)(qs[i] >> 4);
    }
    return q;
#endif
}

/* One stored block's scales: d[16] (sub-block scales) and m[8] (sub-block offsets, zero where the kind
 * has none) and, for Q5_K, the 32 high bits qh; Q4_0/Q5_0 fold their constant offset into m[0]. */
static inline void block_scales(int kind, const uint8_t *blk, float d[16], float m[8], v32u8 *qh) {
    if (kind == KIND_Q6_K) {
        const float dd = half_to_float(blk + 208);
        for (int j = 0; j < 16; j++) d[j] = dd * (float)(int8_t)blk[192 + j];
    } else if (kind == KIND_Q4_K || kind == KIND_Q5_K) {
        k_scales(blk, d, m);
        if (kind == KIND_Q5_K) *qh = load32u8(blk + 16);
    } else {
        d[0] = half_to_float(blk);
        m[0] = kind == KIND_Q5_0 ? -16.0f * d[0] : kind == KIND_Q4_0_STORED ? -8.0f * d[0] : half_to_float(blk + 2);
    }
}

/* Weights 32 j .. 32 j + 31 of a stored block `blk` (its scales from block_scales) widened to float32,
 * w[k] elements 8k .. 8k + 7: each the exact value gguf's dequantize computes */
static inline __attribute__((always_inline)) void widen_stored(int kind, const uint8_t *blk, int j, const float d[16],
                                                               const float m[8], v32u8 qh, v8f w[4]) {
    if (kind == KIND_Q4_K) {
        widen32_u8((load32u8(blk + 16 + 32 * (j / 2)) >> (4 * (j % 2))) & 15, d[j], m[j], w);
    } else if (kind == KIND_Q5_K) {
        const v32u8 q = ((load32u8(blk + 48 + 32 * (j / 2)) >> (4 * (j % 2))) & 15) | (((qh >> j) & 1) << 4);
        widen32_u8(q, d[j], m[j], w);
    } else if (kind == KIND_Q6_K) {
        const int h = j / 4, k = j % 4;
        const v32u8 lo = (load32u8(blk + 64 * h + 32 * (k % 2)) >> (4 * (k / 2))) & 15;
        const v32u8 hi = (load32u8(blk + 128 + 32 * h) >> (2 * k)) & 3;
        widen32_s8((v32s8)(lo | (hi << 4)) - 32, d[2 * j], d[2 * j + 1], w);
    } else if (kind == KIND_Q4_0_STORED || kind == KIND_Q4_1_STORED) {
        widen32_u8(q4_codes(blk + (kind == KIND_Q4_0_STORED ? 2 : 4)), d[0], m[0], w);
    } else {
        const int off = kind == KIND_Q5_0 ? 2 : 4;
        uint32_t bits;
        memcpy(&bits, blk + off, 4);
        widen32_u8(q5_codes(blk + off + 4, bits), d[0], m[0], w);
    }
}

/* Rows [o, o + nr) times tokens [t0, t0 + nt) of a stored kind, y row stride ys. Per row and token
 * two 8-lane accumulators (even and odd quarters of every 32 weights), over the weights in order,
 * summed at the end in a fixed order: the same operations for a token whatever nr, nt or the other
 * tokens. */
static inline __attribute__((always_inline)) void tile_stored(int kind, const uint8_t *blocks, int64_t nblk,
                                                              const float *x, int64_t in, int64_t t0, int nt,
                                                              float *y, int64_t ys, int64_t o, int nr) {
    const int64_t bb = stored_block_bytes(kind), rb = bb * nblk, bw = stored_block_weights(kind);
    v8f acc[ROWS_PER_PASS][TOKENS_PER_PASS][2];  /* only [nr][nt] used */
    memset(acc, 0, sizeof acc);
    for (int64_t s = 0; s < nblk; s++) {
        for (int r = 0; r < nr; r++) {
            const uint8_t *blk = blocks + (o + r) * rb + s * bb;
            float d[16], m[8] = {0};
            v32u8 qh = {0};
            const int subs = (int)(bw / 32);
            block_scales(kind, blk, d, m, &qh);
            #pragma GCC unroll 8
            for (int j = 0; j < subs; j++) {
                v8f w[4];
                widen_stored(kind, blk, j, d, m, qh, w);
                for (int t = 0; t < nt; t++) {
                    const float *xp = x + (t0 + t) * in + bw * s + 32 * j;
                    fmadd32(acc[r][t], w, xp);
                }
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[(t0 + t) * ys + o + r] = hsum8(acc[r][t][0] + acc[r][t][1]);
}

static inline __attribute__((always_inline)) void matmul_rows(int kind, const uint8_t *blocks, int64_t out,
                                                               int64_t in, const float *x, int64_t T, float *y,
                                                               int64_t ys, int64_t o) {
    const int stored = is_stored_kind(kind);
    const int64_t nb = stored ? in / stored_block_weights(kind) : in / 32;
    const int nr = out - o < ROWS_PER_PASS ? (int)(out - o) : ROWS_PER_PASS;
    for (int64_t t0 = 0; t0 < T; t0 += TOKENS_PER_PASS) {
        const int nt = T - t0 < TOKENS_PER_PASS ? (int)(T - t0) : TOKENS_PER_PASS;
        /* constant counts keep the accumulators in registers: two rows at a time for one or two
         * tokens (enough independent sums to hide the FMA latency), one row for three to eight */
#define TILE(NT, O, NR) do { if (stored) tile_stored(kind, blocks, nb, x, in, t0, NT, y, ys, O, NR); \
                             else tile(kind, blocks, nb, x, in, t0, NT, y, ys, O, NR); } while (0)
#define TWO_ROWS(NT) if (nr == 2) TILE(NT, o, 2); else TILE(NT, o, 1)
#define ROW_BY_ROW(NT) for (int r = 0; r < nr; r++) TILE(NT, o + r, 1)
        if (stored) {  /* fewer instances (five per kind keep the build short): decoding's one token
                        * and two in registers, larger verifications one tile of any count */
            if (nt == 1) { TWO_ROWS(1); }
            else if (nt == 2) { TWO_ROWS(2); }
            else ROW_BY_ROW(nt);
            continue;
        }
        switch (nt) {
        case 1: TWO_ROWS(1); break;
        case 2: TWO_ROWS(2); break;
#ifdef __AVX512F__  /* 32 registers: two rows at a time up to six tokens */
        case 3: TWO_ROWS(3); break;
        case 4: TWO_ROWS(4); break;
        case 5: TWO_ROWS(5); break;
        case 6: TWO_ROWS(6); break;
#else
        case 3: ROW_BY_ROW(3); break;
        case 4: ROW_BY_ROW(4); break;
        case 5: ROW_BY_ROW(5); break;
        case 6: ROW_BY_ROW(6); break;
#endif
        case 7: ROW_BY_ROW(7); break;
        default: ROW_BY_ROW(8); break;
        }
#undef TWO_ROWS
#undef ROW_BY_ROW
#undef TILE
    }
}

/* Rows [0, out) of one weight of one kind times float32 activations into y's columns [0, out), row
 * stride ys (every kind but the K kinds). kind: 6 (Q4_0 or Q4_1 repacked), 8 (Q8_0): blocks [out,
 * row_bytes(kind, in / 32)]; a stored 32-weight kind (Q5_0, Q5_1, Q4_0 / Q4_1 as stored): blocks
 * [out, in / 32 * block bytes], as in the file. Each kind gets its own
 * instance of the tiles (a constant kind: no per-block branching on it, shifts by constants). */
static void float_matmul_into(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                              float *y, int64_t ys, int threads) {
    const int64_t pairs = (out + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < pairs; p++) {
        const int64_t o = p * ROWS_PER_PASS;
        switch (kind) {
        case 6: matmul_rows(6, blocks, out, in, x, T, y, ys, o); break;
        case 8: matmul_rows(8, blocks, out, in, x, T, y, ys, o); break;
        case KIND_Q5_0: matmul_rows(KIND_Q5_0, blocks, out, in, x, T, y, ys, o); break;
        case KIND_Q4_0_STORED: matmul_rows(KIND_Q4_0_STORED, blocks, out, in, x, T, y, ys, o); break;
        case KIND_Q4_1_STORED: matmul_rows(KIND_Q4_1_STORED, blocks, out, in, x, T, y, ys, o); break;
        default: matmul_rows(KIND_Q5_1, blocks, out, in, x, T, y, ys, o); break;
        }
    }
}

static int k16_into(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                    float *y, int64_t ys, int threads);

static inline int is_k_kind(int kind) { return kind >= KIND_Q4_K && kind <= KIND_Q6_K; }

/* The target's matmul of one weight of one kind into y's columns [0, out), row stride ys: the K kinds
 * (Q4_K, Q5_K, Q6_K) through the int16-activation kernel (below: x per 32 elements to int16, integer
 * products summed exactly), the other kinds through the float32 kernel. Returns 0, or the kernel's
 * error code. */
static int block_matmul_into(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                             float *y, int64_t ys, int threads) {
    if (is_k_kind(kind)) return k16_into(kind, blocks, out, in, x, T, y, ys, threads);
    float_matmul_into(kind, blocks, out, in, x, T, y, ys, threads);
    return 0;
}

/* A projection stacked from parts along `out` (q | k | v, gate | up), each part the file's own tensor
 * where it lies (a view of the mapped file: nothing is concatenated or copied), of its own kind (a
 * Q4_K_M file's v is Q6_K where q and k are Q4_K): each part's rows computed by its own kind's kernel
 * into its columns. cols[p], where not NULL, is where each of the part's rows goes among the part's
 * columns (the row order llama.cpp stores a Llama's Q and K in is not the model's): its row r is
 * computed as any row is, then written to column cols[p][r]. */
typedef struct {
    int64_t parts;
    int64_t kinds[4];
    const uint8_t *blocks[4];
    int64_t rows[4];
    const int32_t *cols[4];
} StackedWeight;

/* y[t, cols[r]] = part[t, r] for a part [T, rows] computed apart, y row stride ys */
static void scatter_columns(const float *part, int64_t rows, int64_t T, const int32_t *cols, float *y, int64_t ys) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) y[t * ys + cols[r]] = part[t * rows + r];
}

/* One weight's product into y's columns (row stride ys): block_matmul_into or draft_into. */
typedef int (*MatmulInto)(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                          float *y, int64_t ys, int threads);

/* A StackedWeight's parts through `into`, each into its columns of y [T, out]; a part stored in the
 * file's row order goes through a scratch and is scattered to its model-order columns. */
static int stacked_into(MatmulInto into, const StackedWeight *w, int64_t out, int64_t in, const float *x, int64_t T,
                        float *y, int threads) {
    int64_t first = 0;
    int rc = 0;
    for (int64_t p = 0; p < w->parts && !rc; p++) {
        if (w->cols[p]) {
            float *part = malloc(sizeof(float) * T * w->rows[p]);
            if (!part) return -2;
            rc = into((int)w->kinds[p], w->blocks[p], w->rows[p], in, x, T, part, w->rows[p], threads);
            if (!rc) scatter_columns(part, w->rows[p], T, w->cols[p], y + first, out);
            free(part);
        } else {
            rc = into((int)w->kinds[p], w->blocks[p], w->rows[p], in, x, T, y + first, out, threads);
        }
        first += w->rows[p];
    }
    return rc;
}

/* kind: 6 (Q4_0 or Q4_1 repacked), 8 (Q8_0), a stored kind (12 Q4_K, 13 Q5_K, 14 Q6_K, 20 Q5_0,
 * 21 Q5_1), or 1: `blocks` is a StackedWeight of parts of those kinds whose rows add up to `out`.
 * x [T, in] float32 -> y [T, out] float32. Returns 0, or -2 where memory ran out. */
int triforce_block_matmul(int kind, const uint8_t *blocks, int64_t out, int64_t in,
                          const float *x, int64_t T, float *y, int threads) {
    if (kind != KIND_STACKED) return block_matmul_into(kind, blocks, out, in, x, T, y, out, threads);
    return stacked_into(block_matmul_into, (const StackedWeight *)(const void *)blocks, out, in, x, T, y, threads);
}

/* A stored kind's blocks [out, in / weights per block * block bytes] widened to float32 y [out, in]:
 * gguf's dequantize, bit for bit (every widened weight is exact, see widen_stored), both threads over
 * rows. What a prefill chunk's GEMM multiplies. Returns 0, or -1 for a kind that is not stored. */
static inline __attribute__((always_inline)) void dequantize_row(int kind, const uint8_t *row, int64_t nblk, float *y) {
    const int64_t bb = stored_block_bytes(kind), bw = stored_block_weights(kind);
    for (int64_t s = 0; s < nblk; s++) {
        const uint8_t *blk = row + s * bb;
        float d[16], m[8] = {0};
        v32u8 qh = {0};
        block_scales(kind, blk, d, m, &qh);
        #pragma GCC unroll 8
        for (int j = 0; j < (int)(bw / 32); j++) {
            v8f w[4];
            if (kind == KIND_Q5_0 || kind == KIND_Q4_0_STORED) {  /* (q - 16) d, (q - 8) d: a product, so a
                                                                    * zero code of a negative d is -0 as in gguf */
                uint32_t bits;
                memcpy(&bits, blk + 2, 4);
                const v32u8 q = kind == KIND_Q5_0 ? q5_codes(blk + 6, bits) : q4_codes(blk + 2);
                widen32_s8((v32s8)q - (int8_t)(kind == KIND_Q5_0 ? 16 : 8), d[0], d[0], w);
            } else {
                widen_stored(kind, blk, j, d, m, qh, w);
            }
            for (int k = 0; k < 4; k++) store8(y + bw * s + 32 * j + 8 * k, w[k]);
        }
    }
}

int triforce_dequantize(int kind, const uint8_t *blocks, int64_t out, int64_t in, float *y, int threads) {
    if (!is_stored_kind(kind) || in % stored_block_weights(kind)) return -1;
    const int64_t nblk = in / stored_block_weights(kind), rb = nblk * stored_block_bytes(kind);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *row = blocks + o * rb;
        switch (kind) {  /* an instance per kind */
        case KIND_Q4_K: dequantize_row(KIND_Q4_K, row, nblk, y + o * in); break;
        case KIND_Q5_K: dequantize_row(KIND_Q5_K, row, nblk, y + o * in); break;
        case KIND_Q6_K: dequantize_row(KIND_Q6_K, row, nblk, y + o * in); break;
        case KIND_Q5_0: dequantize_row(KIND_Q5_0, row, nblk, y + o * in); break;
        case KIND_Q4_0_STORED: dequantize_row(KIND_Q4_0_STORED, row, nblk, y + o * in); break;
        case KIND_Q4_1_STORED: dequantize_row(KIND_Q4_1_STORED, row, nblk, y + o * in); break;
        default: dequantize_row(KIND_Q5_1, row, nblk, y + o * in); break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ int16 activations: a drafter's matmul
 * NOT the target's arithmetic, and used only where a level drafts (L1, whose every token L2 checks, so
 * the output stays exact): each row of x is quantized per block of 32 to int16 (d_a = max |x| / 32767,
 * q_a = x / d_a rounded), the 4-bit weights' integer products are summed exactly (AVX512-VNNI
 * vpdpwssd: 32 products an instruction; a lane sums 4 products, below 2^24, so its float conversion is
 * exact), and y = sum over blocks of d_w d_a isum + m_w d_a sum(q_a): within ~2e-5 of the float
 * product. Per group of four blocks about 22 instructions where the float kernel spends about 50.
 * (int8 activations, tried: 6e-3 off, and L1's acceptance fell 1.5 points at qa 1K and 8K, which
 * cost what the faster products gained: docs/notes/cpu-speed.md, "Twentieth pass".)
 * Only the repacked 4-bit kinds (kind 6). */
typedef struct {
    int16_t lo[16 * GROUP_BLOCKS], hi[16 * GROUP_BLOCKS];  /* block k's elements 0-15 at 16k, 16-31 at 16k */
    float da[2][16];  /* lanes of the two partial sums: [b0 x8 | b1 x8], [b2 x8 | b3 x8] */
    float sa[GROUP_BLOCKS];      /* block k's d_a * sum(q_a), for the offset m */
} ActGroup;

static void quantize_activations(const float *x, int64_t nb, ActGroup *g) {
    memset(g, 0, sizeof(ActGroup) * ((nb + GROUP_BLOCKS - 1) / GROUP_BLOCKS));
    for (int64_t b = 0; b < nb; b++) {
        ActGroup *G = g + b / GROUP_BLOCKS;
        const int k = (int)(b % GROUP_BLOCKS);
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 32767.0f, inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            long q = lrintf(xb[j] * inv);
            q = q > 32767 ? 32767 : q < -32767 ? -32767 : q;
            sum += (int)q;
            if (j < 16) G->lo[16 * k + j] = (int16_t)q;
            else G->hi[16 * k + j - 16] = (int16_t)q;
        }
        for (int i = 0; i < 8; i++) G->da[k / 2][8 * (k % 2) + i] = d;
        G->sa[k] = d * (float)sum;
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)  /* VL: the 128-bit masked loads */
static inline __attribute__((always_inline)) void row_q16a(const uint8_t *row, int64_t nb, const ActGroup *q,
                                                           int nt, float *y, int64_t ystride) {
    const int64_t ng = (nb + GROUP_BLOCKS - 1) / GROUP_BLOCKS, full = nb / GROUP_BLOCKS;
    const int tail = (int)(nb - full * GROUP_BLOCKS);
    const __mmask64 tail_bytes = (1ULL << (16 * tail)) - 1;  /* tail < 4: at most 48 bits */
    const __mmask8 tail_lanes = (__mmask8)((1u << tail) - 1);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    const __m512i spread01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i spread23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
    __m512 acc[4];
    __m128 off[4];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_setzero_ps();
        off[t] = _mm_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *G = row + g * GROUP_BYTES;
        __m512i w;
        __m128 d4, mw;
        if (g < full) {
            w = _mm512_loadu_si512(G + 8 * GROUP_BLOCKS);
            d4 = _mm_loadu_ps((const float *)G);
            mw = _mm_loadu_ps((const float *)(G + 4 * GROUP_BLOCKS));
        } else {  /* the last group's `tail` blocks, laid out alike; zeros for the absent ones */
            w = _mm512_maskz_loadu_epi8(tail_bytes, G + 8 * tail);
            d4 = _mm_maskz_loadu_ps(tail_lanes, G);
            mw = _mm_maskz_loadu_ps(tail_lanes, G + 4 * tail);
        }
        const __m512i lo = _mm512_and_si512(w, mask), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
        /* [b0 | b1] and [b2 | b3] elements 0-15 and 16-31, as int16 */
        const __m512i lo01 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(lo));
        const __m512i lo23 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(lo, 1));
        const __m512i hi01 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(hi));
        const __m512i hi23 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(hi, 1));
        const __m512 d512 = _mm512_castps128_ps512(d4);
        const __m512 dw01 = _mm512_permutexvar_ps(spread01, d512), dw23 = _mm512_permutexvar_ps(spread23, d512);
        for (int t = 0; t < nt; t++) {
            const ActGroup *a = q + t * ng + g;
            __m512i s01 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), lo01, _mm512_loadu_si512(a->lo));
            s01 = _mm512_dpwssd_epi32(s01, hi01, _mm512_loadu_si512(a->hi));
            __m512i s23 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), lo23, _mm512_loadu_si512(a->lo + 32));
            s23 = _mm512_dpwssd_epi32(s23, hi23, _mm512_loadu_si512(a->hi + 32));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s01), _mm512_mul_ps(dw01, _mm512_loadu_ps(a->da[0])), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s23), _mm512_mul_ps(dw23, _mm512_loadu_ps(a->da[1])), acc[t]);
            off[t] = _mm_fmadd_ps(mw, _mm_loadu_ps(a->sa), off[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        __m128 o = _mm_add_ps(off[t], _mm_movehl_ps(off[t], off[t]));
        o = _mm_add_ss(o, _mm_shuffle_ps(o, o, 1));
        y[t * ystride] = _mm512_reduce_add_ps(acc[t]) + _mm_cvtss_f32(o);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 without VNNI (Zen 1-3, Intel before Ice Lake): vpmaddwd sums the same pairs of int16 products
 * that vpdpwssd does, so each 8-lane accumulator (blocks 0 and 2; blocks 1 and 3) holds the bits of
 * the matching half of the VNNI body's; only the final horizontal sum may round differently. (The
 * plain-C body made an L1 forward of the bundled model 1.6x the float kernel's on a Zen 1.) */
static inline __m256i nibbles16(__m128i bytes) { return _mm256_cvtepu8_epi16(bytes); }

static inline __attribute__((always_inline)) void row_q16a(const uint8_t *row, int64_t nb, const ActGroup *q,
                                                           int nt, float *y, int64_t ystride) {
    const int64_t ng = (nb + GROUP_BLOCKS - 1) / GROUP_BLOCKS, full = nb / GROUP_BLOCKS;
    const int tail = (int)(nb - full * GROUP_BLOCKS);
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256 acc02[4], acc13[4];
    __m128 off[4];
    for (int t = 0; t < nt; t++) {
        acc02[t] = _mm256_setzero_ps();
        acc13[t] = _mm256_setzero_ps();
        off[t] = _mm_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *G = row + g * GROUP_BYTES;
        float dw[GROUP_BLOCKS], mw[GROUP_BLOCKS];
        uint8_t nib[16 * GROUP_BLOCKS];
        const uint8_t *w = G + 8 * GROUP_BLOCKS;
        if (g < full) {
            memcpy(dw, G, sizeof dw);
            memcpy(mw, G + 4 * GROUP_BLOCKS, sizeof mw);
        } else {  /* the last group's `tail` blocks, laid out alike; zeros for the absent ones */
            memset(dw, 0, sizeof dw);
            memset(mw, 0, sizeof mw);
            memset(nib, 0, sizeof nib);
            memcpy(dw, G, 4 * tail);
            memcpy(mw, G + 4 * tail, 4 * tail);
            memcpy(nib, G + 8 * tail, 16 * tail);
            w = nib;
        }
        const __m256i w01 = _mm256_loadu_si256((const __m256i *)w), w23 = _mm256_loadu_si256((const __m256i *)(w + 32));
        const __m256i lo01 = _mm256_and_si256(w01, mask), hi01 = _mm256_and_si256(_mm256_srli_epi16(w01, 4), mask);
        const __m256i lo23 = _mm256_and_si256(w23, mask), hi23 = _mm256_and_si256(_mm256_srli_epi16(w23, 4), mask);
        /* block k's elements 0-15 (lo) and 16-31 (hi) as int16 */
        const __m256i l0 = nibbles16(_mm256_castsi256_si128(lo01)), l1 = nibbles16(_mm256_extracti128_si256(lo01, 1));
        const __m256i h0 = nibbles16(_mm256_castsi256_si128(hi01)), h1 = nibbles16(_mm256_extracti128_si256(hi01, 1));
        const __m256i l2 = nibbles16(_mm256_castsi256_si128(lo23)), l3 = nibbles16(_mm256_extracti128_si256(lo23, 1));
        const __m256i h2 = nibbles16(_mm256_castsi256_si128(hi23)), h3 = nibbles16(_mm256_extracti128_si256(hi23, 1));
        const __m256 d0 = _mm256_set1_ps(dw[0]), d1 = _mm256_set1_ps(dw[1]);
        const __m256 d2 = _mm256_set1_ps(dw[2]), d3 = _mm256_set1_ps(dw[3]);
        const __m128 m4 = _mm_loadu_ps(mw);
        for (int t = 0; t < nt; t++) {
            const ActGroup *a = q + t * ng + g;
            const __m256i *alo = (const __m256i *)a->lo, *ahi = (const __m256i *)a->hi;
            const __m256i s0 = _mm256_add_epi32(_mm256_madd_epi16(l0, _mm256_loadu_si256(alo)),
                                                _mm256_madd_epi16(h0, _mm256_loadu_si256(ahi)));
            const __m256i s1 = _mm256_add_epi32(_mm256_madd_epi16(l1, _mm256_loadu_si256(alo + 1)),
                                                _mm256_madd_epi16(h1, _mm256_loadu_si256(ahi + 1)));
            const __m256i s2 = _mm256_add_epi32(_mm256_madd_epi16(l2, _mm256_loadu_si256(alo + 2)),
                                                _mm256_madd_epi16(h2, _mm256_loadu_si256(ahi + 2)));
            const __m256i s3 = _mm256_add_epi32(_mm256_madd_epi16(l3, _mm256_loadu_si256(alo + 3)),
                                                _mm256_madd_epi16(h3, _mm256_loadu_si256(ahi + 3)));
            acc02[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(d0, _mm256_loadu_ps(a->da[0])), acc02[t]);
            acc13[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(d1, _mm256_loadu_ps(a->da[0] + 8)), acc13[t]);
            acc02[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), _mm256_mul_ps(d2, _mm256_loadu_ps(a->da[1])), acc02[t]);
            acc13[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s3), _mm256_mul_ps(d3, _mm256_loadu_ps(a->da[1] + 8)), acc13[t]);
            off[t] = _mm_fmadd_ps(m4, _mm_loadu_ps(a->sa), off[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        const __m256 s = _mm256_add_ps(acc02[t], acc13[t]);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        h = _mm_add_ps(h, off[t]);
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        y[t * ystride] = _mm_cvtss_f32(h);
    }
}
#else
static inline void row_q16a(const uint8_t *row, int64_t nb, const ActGroup *q, int nt, float *y, int64_t ystride) {
    const int64_t ng = (nb + GROUP_BLOCKS - 1) / GROUP_BLOCKS;
    for (int t = 0; t < nt; t++) {
        float acc = 0.0f, off = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const ActGroup *a = q + t * ng + b / GROUP_BLOCKS;
            const int k = (int)(b % GROUP_BLOCKS);
            float d, m;
            const uint8_t *nib = block_at(6, row, nb, b, &d, &m);
            int64_t s = 0;
            for (int j = 0; j < 16; j++) s += (nib[j] & 0x0F) * a->lo[16 * k + j] + (nib[j] >> 4) * a->hi[16 * k + j];
            acc += (float)s * (d * a->da[k / 2][8 * (k % 2)]);
            off += m * a->sa[k];
        }
        y[t * ystride] = acc + off;
    }
}
#endif

/* x [T, in] float32 @ W.T -> y [T, out], W repacked 4-bit blocks (kind 6) [out, row_bytes(6, in / 32)].
 * ActGroups of absent blocks (past nb in a row's last group) hold zeros, as do the weights loaded there. */
static int q16a_into(const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T, float *y,
                     int64_t ys, int threads);

int triforce_block_matmul_q16a(const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                               float *y, int threads) {
    return q16a_into(blocks, out, in, x, T, y, out, threads);
}

/* triforce_block_matmul_q16a into y's columns [0, out), row stride ys */
static int q16a_into(const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T, float *y,
                     int64_t ys, int threads) {
    if (in % 32 || T < 1) return -1;
    const int64_t nb = in / 32, ng = (nb + GROUP_BLOCKS - 1) / GROUP_BLOCKS, rb = row_bytes(6, nb);
    ActGroup *q = malloc(sizeof(ActGroup) * ng * T);
    if (!q) return -2;
    for (int64_t t = 0; t < T; t++) quantize_activations(x + t * in, nb, q + t * ng);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *row = blocks + o * rb;
        for (int64_t t0 = 0; t0 < T; t0 += 4) {
            const int nt = T - t0 < 4 ? (int)(T - t0) : 4;
            const ActGroup *qt = q + t0 * ng;
            float *yt = y + t0 * ys + o;
            switch (nt) {  /* constant counts keep the accumulators in registers */
            case 1: row_q16a(row, nb, qt, 1, yt, ys); break;
            case 2: row_q16a(row, nb, qt, 2, yt, ys); break;
            case 3: row_q16a(row, nb, qt, 3, yt, ys); break;
            default: row_q16a(row, nb, qt, 4, yt, ys); break;
            }
        }
    }
    free(q);
    return 0;
}

/* ------------------------------------------------------------------ int16 activations on the stored 32-weight kinds
 * The drafter's matmul above for the 32-weight kinds read as stored (Q5_0, Q5_1, Q4_0 and Q4_1 as in
 * the file), from the file's bytes: each row of x quantized per 32 elements to int16 as above (d_a,
 * q_a in natural order), the weights' integer codes times q_a summed in int32 (vpmaddwd: pairs, then
 * 8 lanes), and y = sum over blocks of d d_a isum + m d_a sum(q_a) (Q5_0: m = -16 d, Q4_0: -8 d).
 * A 5-bit kind's 32-weight sum may round in its float conversion, in the last bit. Within ~1e-5 of
 * the float product, a row's value whatever the tokens beside it; NOT the target's arithmetic for
 * these kinds: only a drafting level uses it. (The K kinds have their own kernel below, the target's.) */
typedef struct {
    int16_t q[32];  /* round(x / d_a), in element order */
    float d, s;     /* d_a and d_a * sum(q) */
} Act32;

/* One 32-element chunk rounded to int16 on its own scale: q = round(x / d_a), d_a = max|x| / 32767;
 * returns d_a and sets *sum = sum(q). The drafting kernel and the K kinds' kernel share it. */
static float round_chunk(const float *xc, int16_t q[32], int *sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xc[j]));
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    int total = 0;
    for (int j = 0; j < 32; j++) {
        long v = lrintf(xc[j] * inv);
        v = v > 32767 ? 32767 : v < -32767 ? -32767 : v;
        total += (int)v;
        q[j] = (int16_t)v;
    }
    *sum = total;
    return amax / 32767.0f;
}

static void quantize32(const float *x, int64_t n32, Act32 *a) {
    for (int64_t c = 0; c < n32; c++) {
        int sum;
        a[c].d = round_chunk(x + 32 * c, a[c].q, &sum);
        a[c].s = a[c].d * (float)sum;
    }
}

/* acc += (codes . q_a) s, codes signed bytes: elements 0-15 and 16-31 paired in int32, then added */
static inline v8f dot32(v32s8 codes, const int16_t *qa, float s, v8f acc) {
    v8i lo, hi;
#ifdef __AVX2__
    const __m256i c = (__m256i)codes;
    lo = (v8i)_mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(c)), _mm256_loadu_si256((const __m256i *)qa));
    hi = (v8i)_mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(c, 1)),
                                _mm256_loadu_si256((const __m256i *)(qa + 16)));
#else
    for (int i = 0; i < 8; i++) {
        lo[i] = codes[2 * i] * qa[2 * i] + codes[2 * i + 1] * qa[2 * i + 1];
        hi[i] = codes[16 + 2 * i] * qa[16 + 2 * i] + codes[17 + 2 * i] * qa[17 + 2 * i];
    }
#endif
    return fmadd8(__builtin_convertvector(lo + hi, v8f), splat(s), acc);
}

/* One row of a stored kind times nt tokens' quantized activations (n32 chunks of 32 a token) */
static inline __attribute__((always_inline)) void row_stored_q16a(int kind, const uint8_t *row, int64_t nblk,
                                                                  const Act32 *a, int64_t n32, int nt,
                                                                  float *y, int64_t ys) {
    const int64_t bb = stored_block_bytes(kind);
    v8f acc[4];
    float off[4];
    for (int t = 0; t < nt; t++) {
        acc[t] = splat(0.0f);
        off[t] = 0.0f;
    }
    for (int64_t s = 0; s < nblk; s++) {
        const uint8_t *blk = row + s * bb;
        float d[16], m[8] = {0};
        v32u8 qh = {0};
        block_scales(kind, blk, d, m, &qh);
        v32s8 codes;
        if (kind == KIND_Q4_0_STORED || kind == KIND_Q4_1_STORED) {
            codes = (v32s8)q4_codes(blk + (kind == KIND_Q4_0_STORED ? 2 : 4));
        } else {
            const int at = kind == KIND_Q5_0 ? 2 : 4;
            uint32_t bits;
            memcpy(&bits, blk + at, 4);
            codes = (v32s8)q5_codes(blk + at + 4, bits);
        }
        for (int t = 0; t < nt; t++) {
            const Act32 *q = a + t * n32 + s;
            acc[t] = dot32(codes, q->q, d[0] * q->d, acc[t]);
            off[t] += m[0] * q->s;
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = hsum8(acc[t]) + off[t];
}

static inline __attribute__((always_inline)) void rows_stored_q16a(int kind, const uint8_t *blocks, int64_t o,
                                                                   int64_t in, const Act32 *a, int64_t T,
                                                                   float *y, int64_t ys) {
    const int64_t nblk = in / stored_block_weights(kind), n32 = in / 32;
    const uint8_t *row = blocks + o * nblk * stored_block_bytes(kind);
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
        const int nt = T - t0 < 4 ? (int)(T - t0) : 4;
        const Act32 *at = a + t0 * n32;
        float *yt = y + t0 * ys + o;
        switch (nt) {  /* constant counts keep the accumulators in registers */
        case 1: row_stored_q16a(kind, row, nblk, at, n32, 1, yt, ys); break;
        case 2: row_stored_q16a(kind, row, nblk, at, n32, 2, yt, ys); break;
        case 3: row_stored_q16a(kind, row, nblk, at, n32, 3, yt, ys); break;
        default: row_stored_q16a(kind, row, nblk, at, n32, 4, yt, ys); break;
        }
    }
}

static int stored_q16a_into(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                            float *y, int64_t ys, int threads) {
    if (in % stored_block_weights(kind) || T < 1) return -1;
    const int64_t n32 = in / 32;
    Act32 *a = malloc(sizeof(Act32) * n32 * T);
    if (!a) return -2;
    for (int64_t t = 0; t < T; t++) quantize32(x + t * in, n32, a + t * n32);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < out; o++) {
        switch (kind) {  /* an instance per kind: no branching on it per block */
        case KIND_Q5_0: rows_stored_q16a(KIND_Q5_0, blocks, o, in, a, T, y, ys); break;
        case KIND_Q4_0_STORED: rows_stored_q16a(KIND_Q4_0_STORED, blocks, o, in, a, T, y, ys); break;
        case KIND_Q4_1_STORED: rows_stored_q16a(KIND_Q4_1_STORED, blocks, o, in, a, T, y, ys); break;
        default: rows_stored_q16a(KIND_Q5_1, blocks, o, in, a, T, y, ys); break;
        }
    }
    free(a);
    return 0;
}

/* ------------------------------------------------------------------ the K kinds: int16 activations, the target's
 * Q4_K, Q5_K and Q6_K run with the int16 activations above (per 32 elements d_a = max |x| / 32767,
 * q_a = round(x / d_a)) for decoding and verification alike, target and drafter: y is within
 * max|x| / 65534 sum |w| (per 32) of the float64 product (tests/test_native.py states it). The codes
 * come out of the file's bytes as 16-bit lanes without a byte shuffle: 32 bytes read as 16 words,
 * word i = bytes 2i, 2i + 1, so masks and shifts give elements 2i (the "even" lanes) and 2i + 1
 * (the "odd" ones) of a 32-weight sub-block, and the activations are stored split alike (KAct). A
 * lane of (even . q_even) + (odd . q_odd) (vpmaddwd, pairs) then holds elements 4i .. 4i + 3, summed
 * exactly in int32 (at most 4 * 32 * 32767 < 2^24: its float conversion is exact too); per sub-block
 * one FMA adds the lanes times (d sc_j) d_a (Q6_K: lanes 0-3 and 4-7 take the scales of its two
 * 16-weight groups), and the mins' term -(dmin m_j) d_a sum(q_a) is one FMA per super-block. The
 * same operations for a row whatever the tokens beside it, or the thread that computes it: threads
 * take rows in chunks of 32 as they come free, so where another process holds a core the thread
 * that runs takes the rows the other has not started. */
typedef int16_t v16i16 __attribute__((vector_size(32)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));

typedef struct {
    int16_t even[16], odd[16];  /* q_a of elements 2i and 2i + 1 of a 32-element chunk */
} KChunk;

typedef struct {  /* one token's activations: n32 chunks, their d_a and d_a * sum(q_a) */
    const KChunk *q;
    const float *d, *s;
} KAct;

static void quantize_k(const float *x, int64_t n32, KChunk *q, float *d, float *s) {
    for (int64_t c = 0; c < n32; c++) {
        int16_t chunk[32];
        int sum;
        d[c] = round_chunk(x + 32 * c, chunk, &sum);
        for (int j = 0; j < 16; j++) {
            q[c].even[j] = chunk[2 * j];
            q[c].odd[j] = chunk[2 * j + 1];
        }
        s[c] = d[c] * (float)sum;
    }
}

static inline v16u16 load16u16(const uint8_t *p) { v16u16 v; memcpy(&v, p, sizeof v); return v; }

/* lane i: a[2i] b[2i] + a[2i + 1] b[2i + 1], exact in int32 */
static inline v8i madd16(v16i16 a, const int16_t *b) {
#ifdef __AVX2__
    return (v8i)_mm256_madd_epi16((__m256i)a, _mm256_loadu_si256((const __m256i *)b));
#else
    v8i r;
    for (int i = 0; i < 8; i++) r[i] = (int32_t)a[2 * i] * b[2 * i] + (int32_t)a[2 * i + 1] * b[2 * i + 1];
    return r;
#endif
}

/* every lane = lane `j` of v */
static inline v8f lane_splat(v8f v, int j) {
#ifdef __AVX2__
    return (v8f)_mm256_permutevar8x32_ps((__m256)v, _mm256_set1_epi32(j));
#else
    return splat(v[j]);
#endif
}

/* lanes 0-3 = lane g of v, lanes 4-7 = lane g + 1 */
static inline v8f pair_splat(v8f v, int g) {
#ifdef __AVX2__
    return (v8f)_mm256_permutevar8x32_ps((__m256)v, _mm256_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1));
#else
    return (v8f){v[g], v[g], v[g], v[g], v[g + 1], v[g + 1], v[g + 1], v[g + 1]};
#endif
}

/* Q4_K / Q5_K: the 8 sub-blocks' d sc_j and -(dmin m_j) as vectors (the values k_scales computes) */
static inline void k_scales8(const uint8_t *blk, v8f *d, v8f *m) {
    uint32_t a, b, c;
    memcpy(&a, blk + 4, 4);
    memcpy(&b, blk + 8, 4);
    memcpy(&c, blk + 12, 4);
    const uint32_t sc[2] = {a & 0x3F3F3F3Fu, (c & 0x0F0F0F0Fu) | (((a >> 6) & 0x03030303u) << 4)};
    const uint32_t mn[2] = {b & 0x3F3F3F3Fu, ((c >> 4) & 0x0F0F0F0Fu) | (((b >> 6) & 0x03030303u) << 4)};
    *d = splat(half_to_float(blk)) * u8_to_f((const uint8_t *)sc);
    *m = -(splat(half_to_float(blk + 2)) * u8_to_f((const uint8_t *)mn));
}

/* sub-block j's codes, even and odd lanes (Q6_K's minus 32) */
static inline __attribute__((always_inline)) void k_codes(int kind, const uint8_t *blk, int j, v16i16 *e, v16i16 *o) {
    if (kind == KIND_Q6_K) {
        const int h = j / 4, k = j % 4, sh = 4 * (k / 2);
        const v16u16 l = load16u16(blk + 64 * h + 32 * (k % 2)), q = load16u16(blk + 128 + 32 * h);
        *e = (v16i16)(((l >> sh) & 15) | (((q >> (2 * k)) & 3) << 4)) - 32;
        *o = (v16i16)(((l >> (8 + sh)) & 15) | (((q >> (8 + 2 * k)) & 3) << 4)) - 32;
        return;
    }
    const v16u16 w = load16u16(blk + (kind == KIND_Q5_K ? 48 : 16) + 32 * (j / 2));
    const int sh = 4 * (j % 2);
    v16u16 ev = (w >> sh) & 15, od = (w >> (8 + sh)) & 15;
    if (kind == KIND_Q5_K) {
        const v16u16 qh = load16u16(blk + 16);
        ev |= ((qh >> j) & 1) << 4;
        od |= ((qh >> (8 + j)) & 1) << 4;
    }
    *e = (v16i16)ev;
    *o = (v16i16)od;
}

/* One row of a K kind times nt tokens' activations: y[t ys] */
static inline __attribute__((always_inline)) void row_k16(int kind, const uint8_t *row, int64_t nblk,
                                                          const KAct *a, int nt, float *y, int64_t ys) {
    const int64_t bb = stored_block_bytes(kind);
    v8f acc[4], off[4];
    for (int t = 0; t < nt; t++) acc[t] = off[t] = splat(0.0f);
    for (int64_t s = 0; s < nblk; s++) {
        const uint8_t *blk = row + s * bb;
        v8f sc[4], sc2[4];  /* per token: sub-block scales times d_a (Q6_K: groups 0-7, 8-15 times d_a) */
        if (kind == KIND_Q6_K) {
            const float dd = half_to_float(blk + 208);
            const v8f g0 = splat(dd) * s8_to_f((const int8_t *)blk + 192), g1 = splat(dd) * s8_to_f((const int8_t *)blk + 200);
            for (int t = 0; t < nt; t++) {
                const v8f da = load8(a[t].d + 8 * s);
                /* group g = 2j + i's scale times chunk j's d_a: [g0 g0 g1 g1 ..] x [da0 da0 da1 da1 ..] */
                sc[t] = g0 * SHUFFLE(da, da, 0, 0, 1, 1, 2, 2, 3, 3);
                sc2[t] = g1 * SHUFFLE(da, da, 4, 4, 5, 5, 6, 6, 7, 7);
            }
        } else {
            v8f d, m;
            k_scales8(blk, &d, &m);
            for (int t = 0; t < nt; t++) {
                sc[t] = d * load8(a[t].d + 8 * s);
                off[t] = fmadd8(m, load8(a[t].s + 8 * s), off[t]);
            }
        }
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            v16i16 e, o;
            k_codes(kind, blk, j, &e, &o);
            for (int t = 0; t < nt; t++) {
                const KChunk *q = a[t].q + 8 * s + j;
                const v8i isum = madd16(e, q->even) + madd16(o, q->odd);  /* lane i: elements 4i .. 4i + 3 */
                v8f scale;
                if (kind == KIND_Q6_K) {  /* lanes 0-3: group 2j's scale, 4-7: group 2j + 1's */
                    const v8f half = j < 4 ? sc[t] : sc2[t];
                    const int g = 2 * (j % 4);
                    scale = pair_splat(half, g);
                } else {
                    scale = lane_splat(sc[t], j);
                }
                acc[t] = fmadd8(__builtin_convertvector(isum, v8f), scale, acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) y[t * ys] = hsum8(acc[t]) + hsum8(off[t]);
}

static int k16_into(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                    float *y, int64_t ys, int threads) {
    if (in % 256 || T < 1) return -1;
    const int64_t n32 = in / 32, nblk = in / 256, rb = nblk * stored_block_bytes(kind);
    char *buf = malloc((sizeof(KChunk) + 2 * sizeof(float)) * n32 * T);
    if (!buf) return -2;
    KChunk *q = (KChunk *)buf;
    float *d = (float *)(buf + sizeof(KChunk) * n32 * T), *s = d + n32 * T;
    for (int64_t t = 0; t < T; t++) quantize_k(x + t * in, n32, q + t * n32, d + t * n32, s + t * n32);
    #pragma omp parallel for schedule(dynamic, 32) num_threads(threads)
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *row = blocks + o * rb;
        for (int64_t t0 = 0; t0 < T; t0 += 4) {
            const int nt = T - t0 < 4 ? (int)(T - t0) : 4;
            KAct a[4];
            for (int t = 0; t < nt; t++) a[t] = (KAct){q + (t0 + t) * n32, d + (t0 + t) * n32, s + (t0 + t) * n32};
            float *yt = y + t0 * ys + o;
#define K16(KIND) switch (nt) { /* constant counts keep the accumulators in registers */ \
            case 1: row_k16(KIND, row, nblk, a, 1, yt, ys); break; \
            case 2: row_k16(KIND, row, nblk, a, 2, yt, ys); break; \
            case 3: row_k16(KIND, row, nblk, a, 3, yt, ys); break; \
            default: row_k16(KIND, row, nblk, a, 4, yt, ys); break; }
            if (kind == KIND_Q4_K) { K16(KIND_Q4_K) }
            else if (kind == KIND_Q5_K) { K16(KIND_Q5_K) }
            else { K16(KIND_Q6_K) }
#undef K16
        }
    }
    free(buf);
    return 0;
}

/* A drafting level's matmul of one weight of one kind into y's columns [0, out), row stride ys: the
 * int16-activation kernels where the kind has one (the repacked 4-bit kind, the stored kinds), else
 * the float kernel (Q8_0) */
static int draft_into(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                      float *y, int64_t ys, int threads) {
    if (kind == 6) return q16a_into(blocks, out, in, x, T, y, ys, threads);
    if (is_k_kind(kind)) return k16_into(kind, blocks, out, in, x, T, y, ys, threads);
    if (is_stored_kind(kind)) return stored_q16a_into(kind, blocks, out, in, x, T, y, ys, threads);
    float_matmul_into(kind, blocks, out, in, x, T, y, ys, threads);
    return 0;
}

/* triforce_block_matmul for a drafting level (L1): the same operands (any kind, or 1: a StackedWeight),
 * each weight or part through draft_into. Returns 0, or a kernel's error code. */
int triforce_block_matmul_draft(int kind, const uint8_t *blocks, int64_t out, int64_t in, const float *x, int64_t T,
                                float *y, int threads) {
    if (kind != KIND_STACKED) return draft_into(kind, blocks, out, in, x, T, y, out, threads);
    return stacked_into(draft_into, (const StackedWeight *)(const void *)blocks, out, in, x, T, y, threads);
}

/* ------------------------------------------------------------------ attention
 * q [Hq, T, D] (query head hq uses KV head hq / G), keys/values [Hkv, cap, D], the first `total`
 * positions held, cap a multiple of BLOCK_KEYS (whole blocks are read; what lies past `total` is
 * finite and gets no weight); row t of the T new tokens is position p = total - T + t and sees
 * keys 0..p.
 * out [Hq, T, D]. D a multiple of 8, at most MAX_DIM.
 * Keys are split into segments of SEGMENT positions (absolute), and each segment into blocks of
 * BLOCK_KEYS: per row, a segment keeps (running max, sum of exp, sum of exp * v) updated block by
 * block in key order (flash-attention style; one pass over K and V for all the rows of a KV head),
 * then the segments are combined in order. */
#define MAX_DIM 256
#define SEGMENT 512
#define BLOCK_KEYS 32

/* exp(x) for x <= 0 (scores minus their running max), Cephes' polynomial on [-ln2/2, ln2/2]; one
 * body for 8 and 16 lanes, so each lane runs the same operations (the same bits) in both */
#define EXP_NEG(NAME, VF, VI, SPLAT) \
static inline VF NAME(VF x) { \
    const VI gt = x > SPLAT(-87.0f); \
    x = (VF)((gt & (VI)x) | (~gt & (VI)SPLAT(-87.0f))); \
    const VF magic = SPLAT(12582912.0f);  /* 1.5 * 2^23: adding it rounds to an integer */ \
    VF n = (x * SPLAT(1.44269504088896341f) + magic) - magic; \
    VF r = (x - n * SPLAT(0.693359375f)) - n * SPLAT(-2.12194440e-4f); \
    VF p = SPLAT(1.9875691500e-4f); \
    p = p * r + SPLAT(1.3981999507e-3f); \
    p = p * r + SPLAT(8.3334519073e-3f); \
    p = p * r + SPLAT(4.1665795894e-2f); \
    p = p * r + SPLAT(1.6666665459e-1f); \
    p = p * r + SPLAT(5.0000001201e-1f); \
    p = p * r * r + r + SPLAT(1.0f); \
    VI bits = (__builtin_convertvector(n, VI) + 127) << 23; \
    VF scale; \
    memcpy(&scale, &bits, sizeof scale); \
    return p * scale; \
}
EXP_NEG(exp_neg, v8f, v8i, splat)

static inline float exp_neg1(float x) { return exp_neg(splat(x))[0]; }

#ifdef __AVX512F__
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16f splat16(float x) { return (v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
EXP_NEG(exp_neg16, v16f, v16i, splat16)
#endif


/* [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7] (x86's hadd) */
static inline v8f pair_sums(v8f a, v8f b) {
    return SHUFFLE(a, b, 0, 2, 8, 10, 4, 6, 12, 14) + SHUFFLE(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

/* lane j = the sum of the 8 lanes of a[j], always as ((0+1)+(2+3)) + ((4+5)+(6+7)) */
static inline v8f lane_sums(const v8f a[8]) {
    v8f u0 = pair_sums(pair_sums(a[0], a[1]), pair_sums(a[2], a[3]));
    v8f u1 = pair_sums(pair_sums(a[4], a[5]), pair_sums(a[6], a[7]));
    return SHUFFLE(u0, u1, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE(u0, u1, 4, 5, 6, 7, 12, 13, 14, 15);
}

/* 8 elements of a K/V buffer from element idx: float32, or float16 widened (exactly) */
static inline __attribute__((always_inline)) v8f kv8(const void *base, int64_t idx, const int half) {
    if (!half) return load8((const float *)base + idx);
#ifdef __F16C__
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx)));
#else
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = half_to_float((const uint8_t *)((const uint16_t *)base + idx + i));
    return load8(t);
#endif
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* 512-bit registers holding what two 8-lane ones held, so each FMA does the work of two and every
 * lane computes what the 8-lane code computes, in the same order: the same bits. With 32 registers,
 * groups of 6 rows (two tokens of a 3-query-head GQA group) share each widened K/V chunk, a block's
 * 8 keys are summed (lane_sums' tree) in 4 registers rather than 8, and exp runs 16 lanes at a time.
 * Against the 8-lane code (docs/notes/cpu-speed.md, "Eighteenth pass"), per layer over 4K keys:
 * 1 token 0.205 -> 0.155 ms, 2 tokens 0.364 -> 0.231, 4 tokens 0.653 -> 0.401. */
#define WIDE_ATTENTION 1
#endif
/* rows attended together (two tokens of a 3-query-head GQA group): a K/V chunk is widened once for
 * all of them. With 8-lane registers a group of 6 keeps 12 accumulators and 2 widened chunks in
 * the 16 registers (scores: 6 rows x 2 keys; values: 6 rows x 2 chunks), and a verification forward
 * widens each chunk once per 6 of its rows */
#define ROW_GROUP 6

#ifdef WIDE_ATTENTION
/* [8 elements of K/V from i0 | 8 from i1], widened as kv8 widens them */
static inline __attribute__((always_inline)) __m512 kv_pair(const void *base, int64_t i0, int64_t i1, const int half) {
    if (!half) {
        const float *f = (const float *)base;
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(f + i0)), _mm256_loadu_ps(f + i1), 1);
    }
    const uint16_t *h = (const uint16_t *)base;
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(h + i0))),
                                                 _mm_loadu_si128((const __m128i *)(h + i1)), 1);
    return _mm512_cvtph_ps(both);
}

/* 16 elements of a K/V buffer from element idx: two kv8's side by side */
static inline __attribute__((always_inline)) __m512 kv16(const void *base, int64_t idx, const int half) {
    if (!half) return _mm512_loadu_ps((const float *)base + idx);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + idx)));
}

/* pair_sums on both halves at once: [pair_sums(a.lo, b.lo) | pair_sums(a.hi, b.hi)] */
static inline __m512 pair_sums2(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

/* lane_sums of the 8 keys held as z[p] = [key p | key p + 4]: the same tree, both halves at once */
static inline v8f lane_sums2(const __m512 z[4]) {
    const __m512 u = pair_sums2(pair_sums2(z[0], z[1]), pair_sums2(z[2], z[3]));  /* [u0 | u1] */
    const __m512 lo = _mm512_shuffle_f32x4(u, u, 0x88);  /* 128-bit lanes u0.0, u1.0, u0.0, u1.0 -> [u0.0 u1.0] */
    const __m512 hi = _mm512_shuffle_f32x4(u, u, 0xDD);  /* [u0.1 u1.1] */
    return (v8f)_mm512_castps512_ps256(_mm512_add_ps(lo, hi));
}
#endif

/* A group of nr rows over the first n[r] keys of one block (kb/vb: its BLOCK_KEYS keys and values,
 * all readable; n[r] >= 1): updates each row's running max m[r], sum of exp l[r] and sum of
 * exp * v acc[r][dim]. Per row, every sum runs in the order a row alone would run it (a key's score
 * over its chunks in order, then one fixed tree over 8 keys; values in key order), so a row's bits
 * do not depend on which rows share its group. */
static inline __attribute__((always_inline)) void attend_group(const int nr, const float *const qs[ROW_GROUP],
                                                               const void *kb, const void *vb, const int half,
                                                               const int n[ROW_GROUP], int64_t dim,
                                                               float *const m[ROW_GROUP], float *const l[ROW_GROUP],
                                                               float *const acc[ROW_GROUP]) {
    float s[ROW_GROUP][BLOCK_KEYS], e[ROW_GROUP][BLOCK_KEYS];
    for (int j0 = 0; j0 < BLOCK_KEYS; j0 += 8) {  /* scores, two keys at a time for every row */
#ifdef WIDE_ATTENTION
        /* all 8 keys at once, two to a register: lanes 0-7 key p, lanes 8-15 key p + 4 */
        __m512 x[ROW_GROUP][4];
        for (int r = 0; r < nr; r++) x[r][0] = x[r][1] = x[r][2] = x[r][3] = _mm512_setzero_ps();
        for (int64_t c = 0; c < dim; c += 8) {
            __m512 k[4];
            for (int p = 0; p < 4; p++) k[p] = kv_pair(kb, (j0 + p) * dim + c, (j0 + p + 4) * dim + c, half);
            for (int r = 0; r < nr; r++) {
                const __m512 qc = _mm512_broadcast_f32x8(_mm256_loadu_ps(qs[r] + c));
                for (int p = 0; p < 4; p++) x[r][p] = _mm512_fmadd_ps(qc, k[p], x[r][p]);
            }
        }
        for (int r = 0; r < nr; r++) store8(s[r] + j0, lane_sums2(x[r]));
#else
        v8f a[ROW_GROUP][8];
        for (int j = 0; j < 8; j += 2) {
            v8f x0[ROW_GROUP], x1[ROW_GROUP];
            for (int r = 0; r < nr; r++) x0[r] = x1[r] = splat(0.0f);
            for (int64_t c = 0; c < dim; c += 8) {
                const v8f k0 = kv8(kb, (j0 + j) * dim + c, half), k1 = kv8(kb, (j0 + j + 1) * dim + c, half);
                for (int r = 0; r < nr; r++) {
                    const v8f qc = load8(qs[r] + c);
                    x0[r] = fmadd8(qc, k0, x0[r]);
                    x1[r] = fmadd8(qc, k1, x1[r]);
                }
            }
            for (int r = 0; r < nr; r++) {
                a[r][j] = x0[r];
                a[r][j + 1] = x1[r];
            }
        }
        for (int r = 0; r < nr; r++) store8(s[r] + j0, lane_sums(a[r]));
#endif
    }
    int most = 0;
    for (int r = 0; r < nr; r++) {  /* each row's softmax update */
        float *sr = s[r], *er = e[r];
        for (int j = n[r]; j < BLOCK_KEYS; j++) sr[j] = -FLT_MAX;  /* keys past the row's own: no weight */
        v8f top = load8(sr);
        for (int j = 8; j < BLOCK_KEYS; j += 8) top = vmax(top, load8(sr + j));
        top = vmax(top, SHUFFLE(top, top, 4, 5, 6, 7, 0, 1, 2, 3));
        top = vmax(top, SHUFFLE(top, top, 2, 3, 0, 1, 6, 7, 4, 5));
        top = vmax(top, SHUFFLE(top, top, 1, 0, 3, 2, 5, 4, 7, 6));
        const float block_max = top[0];
        if (block_max > *m[r]) {  /* rescale what was summed under the old max (skipped when it stays) */
            float c = exp_neg1(*m[r] - block_max);
            *l[r] *= c;
            for (int64_t i = 0; i < dim; i += 8) store8(acc[r] + i, load8(acc[r] + i) * splat(c));
            *m[r] = block_max;
        }
#ifdef WIDE_ATTENTION
        for (int j = 0; j < BLOCK_KEYS; j += 16) {
            v16f x;
            memcpy(&x, sr + j, sizeof x);
            x = exp_neg16(x - splat16(*m[r]));
            memcpy(er + j, &x, sizeof x);
        }
#else
        for (int j = 0; j < BLOCK_KEYS; j += 8) store8(er + j, exp_neg(load8(sr + j) - splat(*m[r])));
#endif
        for (int j = n[r]; j < BLOCK_KEYS; j++) er[j] = 0.0f;  /* adds exactly nothing below */
        v8f esum = load8(er);
        for (int j = 8; j < BLOCK_KEYS; j += 8) esum += load8(er + j);
        *l[r] += hsum8(esum);
        most = n[r] > most ? n[r] : most;
    }
    int64_t i = 0;
#ifdef WIDE_ATTENTION
    for (; i + 64 <= dim; i += 64) {  /* values: 64 elements of every row at a time, keys in order */
        __m512 w[ROW_GROUP][4];
        for (int r = 0; r < nr; r++)
            for (int p = 0; p < 4; p++) w[r][p] = _mm512_loadu_ps(acc[r] + i + 16 * p);
        for (int j = 0; j < most; j++) {
            __m512 v[4];
            for (int p = 0; p < 4; p++) v[p] = kv16(vb, j * dim + i + 16 * p, half);
            for (int r = 0; r < nr; r++) {
                const __m512 ej = _mm512_set1_ps(e[r][j]);
                for (int p = 0; p < 4; p++) w[r][p] = _mm512_fmadd_ps(ej, v[p], w[r][p]);
            }
        }
        for (int r = 0; r < nr; r++)
            for (int p = 0; p < 4; p++) _mm512_storeu_ps(acc[r] + i + 16 * p, w[r][p]);
    }
#endif
    for (; i + 16 <= dim; i += 16) {  /* values: two chunks of every row at a time, keys in order */
        v8f a0[ROW_GROUP], a1[ROW_GROUP];
        for (int r = 0; r < nr; r++) {
            a0[r] = load8(acc[r] + i);
            a1[r] = load8(acc[r] + i + 8);
        }
        for (int j = 0; j < most; j++) {
            const v8f v0 = kv8(vb, j * dim + i, half), v1 = kv8(vb, j * dim + i + 8, half);
            for (int r = 0; r < nr; r++) {
                const v8f ej = splat(e[r][j]);
                a0[r] = fmadd8(ej, v0, a0[r]);
                a1[r] = fmadd8(ej, v1, a1[r]);
            }
        }
        for (int r = 0; r < nr; r++) {
            store8(acc[r] + i, a0[r]);
            store8(acc[r] + i + 8, a1[r]);
        }
    }
    if (i < dim) {  /* a last single chunk (dim an odd multiple of 8) */
        v8f a0[ROW_GROUP];
        for (int r = 0; r < nr; r++) a0[r] = load8(acc[r] + i);
        for (int j = 0; j < most; j++) {
            const v8f v0 = kv8(vb, j * dim + i, half);
            for (int r = 0; r < nr; r++) a0[r] = fmadd8(splat(e[r][j]), v0, a0[r]);
        }
        for (int r = 0; r < nr; r++) store8(acc[r] + i, a0[r]);
    }
}

/* attend_group with constant row counts, element types and the usual head sizes (loops unroll) */
static void attend_group_any(int nr, const float *const qs[ROW_GROUP], const void *kb, const void *vb, int half,
                             const int n[ROW_GROUP], int64_t dim, float *const m[ROW_GROUP],
                             float *const l[ROW_GROUP], float *const acc[ROW_GROUP]) {
#define ATTEND(NR, HALF) do { \
        if (dim == 64) attend_group(NR, qs, kb, vb, HALF, n, 64, m, l, acc); \
        else if (dim == 128) attend_group(NR, qs, kb, vb, HALF, n, 128, m, l, acc); \
        else attend_group(NR, qs, kb, vb, HALF, n, dim, m, l, acc); } while (0)
#define ROWS(HALF) if (nr == 6) ATTEND(6, HALF); else if (nr == 5) ATTEND(5, HALF); else if (nr == 4) ATTEND(4, HALF); \
        else if (nr == 3) ATTEND(3, HALF); else if (nr == 2) ATTEND(2, HALF); else ATTEND(1, HALF)
    if (half) {
        ROWS(1);
    } else {
        ROWS(0);
    }
#undef ROWS
#undef ATTEND
}

/* keys/values hold float32, or float16 when `half` (widened exactly, chunk by chunk in registers,
 * once per group of up to ROW_GROUP rows: the cache's bytes halve, the arithmetic stays float32). */
int triforce_attention(const float *q, const void *keys, const void *values, int half, int64_t cap,
                       int64_t n_heads, int64_t n_kv, int64_t T, int64_t dim, int64_t total,
                       float scale, float *out, int threads) {
    if (dim % 8 || dim > MAX_DIM || n_heads % n_kv || total < T || total > cap || cap % BLOCK_KEYS) return -1;
    const int64_t group = n_heads / n_kv, rows = group * T;
    const int64_t n_seg = (total + SEGMENT - 1) / SEGMENT;
    const int64_t state = dim + 2;  /* per row and segment: acc[dim], m, l */
    float *parts = malloc(sizeof(float) * n_kv * n_seg * rows * state);
    if (!parts) return -2;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t item = 0; item < n_kv * n_seg; item++) {
        const int64_t h = item / n_seg, seg = item % n_seg;
        const int64_t head = h * cap * dim, esize = half ? 2 : 4;
        const char *k = (const char *)keys + head * esize, *v = (const char *)values + head * esize;
        const int64_t seg_start = seg * SEGMENT, last = total - 1;  /* the last row sees keys 0..last */
        if (seg_start > last) continue;
        const int64_t seg_stop = seg_start + SEGMENT < total ? seg_start + SEGMENT : total;
        float *first = parts + (h * n_seg + seg) * rows * state;
        for (int64_t r = 0; r < rows; r++) {  /* no key seen yet */
            float *st = first + r * state;
            st[dim] = -FLT_MAX;
            st[dim + 1] = 0.0f;
        }
        float *qs = malloc(sizeof(float) * rows * dim);
        for (int64_t r = 0; r < rows; r++) {
            const float *qr = q + ((h * group + r / T) * T + r % T) * dim;
            for (int64_t i = 0; i < dim; i++) qs[r * dim + i] = qr[i] * scale;
            memset(first + r * state, 0, sizeof(float) * dim);
        }
        /* blocks outer, rows inner: a block's keys and values are read from memory once for all rows,
         * and widened once per group of up to ROW_GROUP rows */
        for (int64_t j0 = seg_start; j0 < seg_stop; j0 += BLOCK_KEYS) {
            const void *kb = k + j0 * dim * esize, *vb = v + j0 * dim * esize;
            const float *gq[ROW_GROUP];
            float *gm[ROW_GROUP], *gl[ROW_GROUP], *gacc[ROW_GROUP];
            int gn[ROW_GROUP], nr = 0;
            for (int64_t r = 0; r < rows; r++) {
                const int64_t pos = total - T + r % T;
                if (j0 > pos) continue;  /* past this row's own position */
                int64_t stop = seg_stop < pos + 1 ? seg_stop : pos + 1;
                float *st = first + r * state;
                gq[nr] = qs + r * dim;
                gn[nr] = stop - j0 < BLOCK_KEYS ? (int)(stop - j0) : BLOCK_KEYS;
                gacc[nr] = st;
                gm[nr] = st + dim;
                gl[nr] = st + dim + 1;
                if (++nr == ROW_GROUP) {
                    attend_group_any(nr, gq, kb, vb, (int)half, gn, dim, gm, gl, gacc);
                    nr = 0;
                }
            }
            if (nr) attend_group_any(nr, gq, kb, vb, (int)half, gn, dim, gm, gl, gacc);
        }
        free(qs);
    }
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t hr = 0; hr < n_kv * rows; hr++) {
        const int64_t h = hr / rows, r = hr % rows, g = r / T, t = r % T, pos = total - T + t;
        const int64_t segs = pos / SEGMENT + 1;  /* the segments this row sees */
        const float *first = parts + (h * n_seg * rows + r) * state;
        float top = -FLT_MAX;
        for (int64_t s = 0; s < segs; s++) {
            float ms = first[s * rows * state + dim];
            top = ms > top ? ms : top;
        }
        float acc[MAX_DIM], l = 0.0f;
        memset(acc, 0, sizeof(float) * dim);
        for (int64_t s = 0; s < segs; s++) {
            const float *st = first + s * rows * state;
            float c = exp_neg1(st[dim] - top);
            l += c * st[dim + 1];
            for (int64_t i = 0; i < dim; i += 8) store8(acc + i, load8(acc + i) + splat(c) * load8(st + i));
        }
        float *o = out + ((h * group + g) * T + t) * dim;
        v8f inv = splat(1.0f / l);
        for (int64_t i = 0; i < dim; i += 8) store8(o + i, load8(acc + i) * inv);
    }
    free(parts);
    return 0;
}

/* ------------------------------------------------------------------ prefill attention
 * A prefill chunk's rows (T tokens x G query heads per KV head) over `total` held keys: compute
 * bound, so it runs as blocked matrix products with a tile's rows in the vector lanes. Per work item
 * (a KV head and a panel of up to PANEL_ROWS of its rows, token-major: row r = t*G + g), the keys
 * are walked in blocks of PREFILL_KEYS aligned to absolute positions; each block's keys and values
 * are widened to float32 once for the panel. Per tile of TILE_ROWS rows (queries transposed once,
 * [D][TILE_ROWS]): scores^T [keys][rows] (TILE_ROWS x 4 keys of accumulators, a broadcast key
 * element per FMA), the online-softmax update lane-wise (running max, rescale, exp, sum), and
 * probs @ V into a transposed accumulator [D][rows] (TILE_ROWS x 4 dimensions, a broadcast value
 * element per FMA). Only keys below `total` are read (views of any capacity and head stride).
 * A row lives in one lane: its dot products over D in order, its maxima, its sum and its values
 * over keys in order, blocks in order; nothing depends on which rows share its tile, panel or call,
 * nor on the threads. So every cache kind that prefills through here gets the same bits for a
 * row. They are not the bits of a decoding step (triforce_attention), which prefill never needs. */
#ifndef PREFILL_KEYS
#define PREFILL_KEYS 64
#endif
#ifndef TILE_VECS
#define TILE_VECS 3
#endif
#ifndef SCORE_KEYS
#define SCORE_KEYS 4  /* keys per pass of the scores' register tile (divides PREFILL_KEYS) */
#endif
#define TILE_ROWS (8 * TILE_VECS)
#define PANEL_ROWS (4 * TILE_ROWS)

/* st[j][TILE_ROWS] = the tile's rows (qt [dim][TILE_ROWS]) . key j (kf [PREFILL_KEYS][dim]), j < nk4 */
static inline __attribute__((always_inline)) void prefill_scores(const float *qt, const float *kf, int nk4,
                                                                 int64_t dim, float *st) {
    for (int j = 0; j < nk4; j += SCORE_KEYS) {
        v8f a[SCORE_KEYS][TILE_VECS];
        for (int p = 0; p < SCORE_KEYS; p++)
            for (int i = 0; i < TILE_VECS; i++) a[p][i] = splat(0.0f);
        for (int64_t d = 0; d < dim; d++) {
            v8f qv[TILE_VECS];
            for (int i = 0; i < TILE_VECS; i++) qv[i] = load8(qt + d * TILE_ROWS + 8 * i);
            for (int p = 0; p < SCORE_KEYS; p++) {
                const v8f kb = splat(kf[(j + p) * dim + d]);
                for (int i = 0; i < TILE_VECS; i++) a[p][i] = fmadd8(qv[i], kb, a[p][i]);
            }
        }
        for (int p = 0; p < SCORE_KEYS; p++)
            for (int i = 0; i < TILE_VECS; i++) store8(st + (j + p) * TILE_ROWS + 8 * i, a[p][i]);
    }
}

/* acc[d][TILE_ROWS] += sum over keys j < nk, in order, of vf[j][d] * pt[j][TILE_ROWS] */
static inline __attribute__((always_inline)) void prefill_values(const float *pt, const float *vf, int nk,
                                                                 int64_t dim, float *acc) {
    for (int64_t d = 0; d < dim; d += 4) {
        v8f w[4][TILE_VECS];
        for (int p = 0; p < 4; p++)
            for (int i = 0; i < TILE_VECS; i++) w[p][i] = load8(acc + (d + p) * TILE_ROWS + 8 * i);
        for (int j = 0; j < nk; j++) {
            v8f pv[TILE_VECS];
            for (int i = 0; i < TILE_VECS; i++) pv[i] = load8(pt + j * TILE_ROWS + 8 * i);
            for (int p = 0; p < 4; p++) {
                const v8f vb = splat(vf[j * dim + d + p]);
                for (int i = 0; i < TILE_VECS; i++) w[p][i] = fmadd8(vb, pv[i], w[p][i]);
            }
        }
        for (int p = 0; p < 4; p++)
            for (int i = 0; i < TILE_VECS; i++) store8(acc + (d + p) * TILE_ROWS + 8 * i, w[p][i]);
    }
}

/* One tile over one key block (keys j0 .. j0+nk-1): pos [TILE_ROWS] the rows' positions (a row sees
 * keys up to its own), m/l [TILE_ROWS] running max and sum, acc [dim][TILE_ROWS]. */
static void prefill_tile(const float *qt, const float *kf, const float *vf, int nk, int64_t dim, int64_t j0,
                         const int32_t *pos, float *m, float *l, float *acc) {
    float st[PREFILL_KEYS * TILE_ROWS] __attribute__((aligned(32)));
    const int nk4 = (nk + SCORE_KEYS - 1) / SCORE_KEYS * SCORE_KEYS;  /* kf holds zeros past nk */
    if (dim == 64) prefill_scores(qt, kf, nk4, 64, st);
    else if (dim == 128) prefill_scores(qt, kf, nk4, 128, st);
    else prefill_scores(qt, kf, nk4, dim, st);
    for (int i = 0; i < TILE_VECS; i++) {  /* the online-softmax update, 8 rows a vector */
        v8i pv;
        memcpy(&pv, pos + 8 * i, sizeof pv);
        v8i lo = pv;
        for (int s = 4; s; s >>= 1) {  /* the fewest keys any of these rows sees: masks only where needed */
            v8i x;
            for (int k = 0; k < 8; k++) x[k] = lo[k ^ s];
            lo = (v8i)((lo < x) & lo) | (~(lo < x) & x);
        }
        const int masked = j0 + nk - 1 > lo[0];
        const v8f old = load8(m + 8 * i);
        v8f top = old;
        for (int j = 0; j < nk; j++) {
            v8f s = load8(st + j * TILE_ROWS + 8 * i);
            if (masked) {
                const v8i seen = pv >= (int32_t)(j0 + j);
                s = (v8f)((seen & (v8i)s) | (~seen & (v8i)splat(-INFINITY)));
            }
            top = vmax(top, s);
        }
        const v8f c = exp_neg(old - top);  /* 1 where the max stays; the first block: acc and l are 0 */
        v8f sum = load8(l + 8 * i) * c;
        for (int j = 0; j < nk; j++) {
            v8f e = exp_neg(load8(st + j * TILE_ROWS + 8 * i) - top);
            if (masked) {
                const v8i seen = pv >= (int32_t)(j0 + j);
                e = (v8f)(seen & (v8i)e);  /* hidden keys: no weight at all */
            }
            store8(st + j * TILE_ROWS + 8 * i, e);
            sum += e;
        }
        store8(l + 8 * i, sum);
        store8(m + 8 * i, top);
        for (int64_t d = 0; d < dim; d++) store8(acc + d * TILE_ROWS + 8 * i, load8(acc + d * TILE_ROWS + 8 * i) * c);
    }
    if (dim == 64) prefill_values(st, vf, nk, 64, acc);
    else if (dim == 128) prefill_values(st, vf, nk, 128, acc);
    else prefill_values(st, vf, nk, dim, acc);
}

/* q [Hq, T, D] float32 (the last T of `total` positions), keys/values: KV head h's position p at
 * element h * head_stride + p * D (float32, or float16 when `half`), positions 0..total-1 held
 * -> out [Hq, T, D]. D a multiple of 8, at most MAX_DIM. Both threads on (KV head, panel) items. */
int triforce_prefill_attention(const float *q, const void *keys, const void *values, int half, int64_t head_stride,
                               int64_t n_heads, int64_t n_kv, int64_t T, int64_t dim, int64_t total,
                               float scale, float *out, int threads) {
    if (dim % 8 || dim > MAX_DIM || n_heads % n_kv || total < T || T < 1 || total > INT32_MAX) return -1;
    const int64_t group = n_heads / n_kv, rows = group * T;
    const int64_t panels = (rows + PANEL_ROWS - 1) / PANEL_ROWS;
    int failed = 0;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t item = 0; item < n_kv * panels; item++) {
        const int64_t h = item % n_kv, panel = item / n_kv;  /* panels late in the chunk (more keys) first */
        const int64_t r0 = (panels - 1 - panel) * PANEL_ROWS;
        const int64_t nr = rows - r0 < PANEL_ROWS ? rows - r0 : PANEL_ROWS;
        const int64_t tiles = (nr + TILE_ROWS - 1) / TILE_ROWS, padded = tiles * TILE_ROWS;
        float *work = malloc(sizeof(float) * (2 * padded * dim + 2 * padded + 2 * PREFILL_KEYS * dim));
        if (!work) {
            failed = 1;
            continue;
        }
        float *qt = work, *acc = qt + padded * dim, *m = acc + padded * dim, *l = m + padded;
        float *kf = l + padded, *vf = kf + PREFILL_KEYS * dim;
        int32_t pos[PANEL_ROWS];
        for (int64_t r = 0; r < padded; r++) {  /* padding rows repeat the last row: computed, dropped */
            const int64_t row = r0 + (r < nr ? r : nr - 1), t = row / group, g = row % group;
            const float *qr = q + ((h * group + g) * T + t) * dim;
            float *tq = qt + (r / TILE_ROWS) * TILE_ROWS * dim + r % TILE_ROWS;  /* [tile][dim][TILE_ROWS] */
            for (int64_t i = 0; i < dim; i++) tq[i * TILE_ROWS] = qr[i] * scale;
            pos[r] = (int32_t)(total - T + t);
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * padded * dim);
        const int64_t last = pos[padded - 1];  /* the panel's last row sees the most keys */
        const char *kh = (const char *)keys + h * head_stride * (half ? 2 : 4);
        const char *vh = (const char *)values + h * head_stride * (half ? 2 : 4);
        for (int64_t j0 = 0; j0 <= last; j0 += PREFILL_KEYS) {
            const int nk = total - j0 < PREFILL_KEYS ? (int)(total - j0) : PREFILL_KEYS;
            for (int j = 0; j < nk; j++)  /* both float32, row-major */
                for (int64_t c = 0; c < dim; c += 8) {
                    store8(kf + j * dim + c, kv8(kh, (j0 + j) * dim + c, half));
                    store8(vf + j * dim + c, kv8(vh, (j0 + j) * dim + c, half));
                }
            memset(kf + nk * dim, 0, sizeof(float) * (PREFILL_KEYS - nk) * dim);
            for (int64_t tile = 0; tile < tiles; tile++) {
                if (pos[tile * TILE_ROWS + TILE_ROWS - 1] < j0) continue;  /* the block lies past every row */
                prefill_tile(qt + tile * TILE_ROWS * dim, kf, vf, nk, dim, j0, pos + tile * TILE_ROWS,
                             m + tile * TILE_ROWS, l + tile * TILE_ROWS, acc + tile * TILE_ROWS * dim);
            }
        }
        for (int64_t r = 0; r < nr; r++) {
            const int64_t row = r0 + r, t = row / group, g = row % group;
            const float *ta = acc + (r / TILE_ROWS) * TILE_ROWS * dim + r % TILE_ROWS;
            float *o = out + ((h * group + g) * T + t) * dim;
            const float inv = 1.0f / l[r];
            for (int64_t i = 0; i < dim; i++) o[i] = ta[i * TILE_ROWS] * inv;
        }
        free(work);
    }
    return failed ? -2 : 0;
}

/* ------------------------------------------------------------------ the small ops of a layer
 * Each is one call where torch ran 3-10 ops (about 8 us each on this 2-core CPU, ~12 ms a forward
 * of the bundled model). Per row, in a fixed order: row-invariant like the rest. One thread: a
 * forward's rows are few and short, and waking the other thread costs more than it saves. */

/* exp(x) for x in [-87, 88] (clamped), Cephes' polynomial */
static inline v8f exp_any(v8f x) {
    v8f c = splat(88.0f);
    v8i gt = x > c;
    x = (v8f)((gt & (v8i)c) | (~gt & (v8i)x));
    return exp_neg(x);  /* its range reduction holds on [-87, 88]; it clamps only the low end */
}

/* y[t] = w * (x[t] / sqrt(mean(x[t]^2) + eps)), x and y [T, H] (y may be x) */
void triforce_rms_norm(const float *x, const float *w, int64_t T, int64_t H, float eps, float *y) {
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * H;
        float *yr = y + t * H;
        v8f acc = splat(0.0f);
        int64_t i = 0;
        for (; i + 8 <= H; i += 8) acc += load8(xr + i) * load8(xr + i);
        float ss = hsum8(acc);
        for (; i < H; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / __builtin_sqrtf(ss / (float)H + eps);
        for (i = 0; i + 8 <= H; i += 8) store8(yr + i, load8(w + i) * (load8(xr + i) * splat(inv)));
        for (; i < H; i++) yr[i] = w[i] * (xr[i] * inv);
    }
}

/* out[h, t] = x[h, t] * cos[t] + roll(x[h, t], D / 2) * sin[t] (Llama's half-split RoPE with the
 * sign folded into sin, as engine/kv/rope.py lays them out); x element (h, t, i) at
 * x + h * sh + t * st + i, cos/sin [T, D], out [H, T, D] contiguous. */
#if defined(__clang__)
#define NO_FMA_CONTRACTION
#else
#define NO_FMA_CONTRACTION __attribute__((optimize("fp-contract=off")))
#endif
/* Two products and a sum, each rounded, as torch computes rotate(): the same bits (no FMA). */
NO_FMA_CONTRACTION void triforce_rope(const float *x, int64_t sh, int64_t st, const float *cos, const float *sin,
                                      int64_t H, int64_t T, int64_t D, float *out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    const int64_t half = D / 2;
    for (int64_t h = 0; h < H; h++)
        for (int64_t t = 0; t < T; t++) {
            const float *xr = x + h * sh + t * st, *c = cos + t * D, *s = sin + t * D;
            float *o = out + (h * T + t) * D;
            for (int64_t i = 0; i < D; i++) o[i] = xr[i] * c[i] + xr[(i + half) % D] * s[i];
        }
}

/* out[t] = silu(gu[t, :I]) * gu[t, I:], gu [T, 2I] */
void triforce_silu_mul(const float *gu, int64_t T, int64_t I, float *out) {
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) {
            v8f gv = load8(g + i);
            store8(o + i, gv / (splat(1.0f) + exp_any(-gv)) * load8(u + i));
        }
        for (; i < I; i++) {
            float gi = g[i];
            o[i] = gi / (1.0f + exp_any(splat(-gi))[0]) * u[i];
        }
    }
}

/* ------------------------------------------------------------------ a decoder layer in one call
 * One decoder layer of a decoding or verification forward, every step of LlamaRunner.forward's
 * layer, in one call where Python ran about 25 torch ops and kernel calls (some 7 ms of a one-token
 * forward of the bundled model on 2 cores, ~8 us each):
 *   h = rms_norm(x); [q | k | v] = h Wqkv^T; q, k = rope(q), rope(k); K/V written at `start`;
 *   x += attention(q, K, V) Wo^T; h = rms_norm(x); x += silu_mul(h Wgate_up^T) Wdown^T.
 * The same kernels in the same order as the Python path, so the bits are the same (K/V stored as
 * float16 round to nearest even, as torch's copy does). Weights: any kind triforce_block_matmul
 * takes (a stacked q|k|v included); with `draft` (a drafting level: L1) through
 * triforce_block_matmul_draft, as matmul_draft does.
 * x [T, H] is updated in place; cos/sin [T, D]; keys/values [Hkv, cap, D] (float16 when `half`);
 * scratch holds at least triforce_layer_scratch(...) floats. Returns 0, or a kernel's error code. */
static inline uint16_t float_to_half(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);  /* round to nearest even */
#else
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint32_t sign = (bits >> 16) & 0x8000u, mag = bits & 0x7fffffffu;
    if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));  /* inf, nan */
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds past 65504: inf */
    if (mag < 0x38800000u) {  /* a half subnormal (or zero): m * 2^-24, m rounded to nearest even */
        float a;
        memcpy(&a, &mag, sizeof a);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t h = (((mag >> 23) - 112u) << 10) | ((mag & 0x7fffffu) >> 13);
    const uint32_t rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
#endif
}

/* out[i] = x[i] as IEEE half, rounded to nearest even (torch's float -> float16) */
void triforce_to_half(const float *x, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = float_to_half(x[i]);
}

static int layer_matmul(int draft, int kind, const uint8_t *w, int64_t out, int64_t in, const float *x, int64_t T,
                        float *y, int threads) {
    return draft ? triforce_block_matmul_draft(kind, w, out, in, x, T, y, threads)
                 : triforce_block_matmul(kind, w, out, in, x, T, y, threads);
}

int64_t triforce_layer_scratch(int64_t T, int64_t H, int64_t n_heads, int64_t n_kv, int64_t D, int64_t I) {
    const int64_t qkv = (n_heads + 2 * n_kv) * D;
    return T * (H + qkv + 3 * n_heads * D + n_kv * D + 3 * I + H);
}

int triforce_layer(int draft, float *x, int64_t T, int64_t H, float eps, const float *attn_norm, const float *mlp_norm,
                   int qkv_kind, const uint8_t *wqkv, int o_kind, const uint8_t *wo,
                   int gu_kind, const uint8_t *wgu, int down_kind, const uint8_t *wdown,
                   int64_t n_heads, int64_t n_kv, int64_t D, int64_t I, const float *cos, const float *sin,
                   void *keys, void *values, int half, int64_t cap, int64_t start, float scale,
                   float *scratch, int threads) {
    if (start + T > cap) return -3;
    const int64_t qkv = (n_heads + 2 * n_kv) * D, qd = n_heads * D;
    float *h = scratch, *proj = h + T * H, *qr = proj + T * qkv, *kr = qr + T * qd, *att = kr + T * n_kv * D;
    float *flat = att + T * qd, *gu = flat + T * qd, *act = gu + T * 2 * I, *y = act + T * I;
    int rc;
    triforce_rms_norm(x, attn_norm, T, H, eps, h);
    if ((rc = layer_matmul(draft, qkv_kind, wqkv, qkv, H, h, T, proj, threads))) return rc;  /* [T, q | k | v] */
    triforce_rope(proj, D, qkv, cos, sin, n_heads, T, D, qr);  /* [Hq, T, D] */
    triforce_rope(proj + qd, D, qkv, cos, sin, n_kv, T, D, kr);  /* [Hkv, T, D] */
    for (int64_t hk = 0; hk < n_kv; hk++)
        for (int64_t t = 0; t < T; t++) {
            const float *k = kr + (hk * T + t) * D, *v = proj + t * qkv + qd + (n_kv + hk) * D;
            const int64_t slot = (hk * cap + start + t) * D;
            if (half) {
                triforce_to_half(k, D, (uint16_t *)keys + slot);
                triforce_to_half(v, D, (uint16_t *)values + slot);
            } else {
                memcpy((float *)keys + slot, k, sizeof(float) * D);
                memcpy((float *)values + slot, v, sizeof(float) * D);
            }
        }
    if ((rc = triforce_attention(qr, keys, values, half, cap, n_heads, n_kv, T, D, start + T, scale, att, threads)))
        return rc;
    for (int64_t hq = 0; hq < n_heads; hq++)  /* [Hq, T, D] -> [T, Hq D] */
        for (int64_t t = 0; t < T; t++) memcpy(flat + t * qd + hq * D, att + (hq * T + t) * D, sizeof(float) * D);
    if ((rc = layer_matmul(draft, o_kind, wo, H, qd, flat, T, y, threads))) return rc;
    for (int64_t i = 0; i < T * H; i++) x[i] = x[i] + y[i];
    triforce_rms_norm(x, mlp_norm, T, H, eps, h);
    if ((rc = layer_matmul(draft, gu_kind, wgu, 2 * I, H, h, T, gu, threads))) return rc;
    triforce_silu_mul(gu, T, I, act);
    if ((rc = layer_matmul(draft, down_kind, wdown, H, I, act, T, y, threads))) return rc;
    for (int64_t i = 0; i < T * H; i++) x[i] = x[i] + y[i];
    return 0;
}
