/*
 * qgemm.c — the int8 GEMM of the quantized operators (qkernels.h): weight
 * and panel packing, the three paths (VNNI, AVX2, plain) and the fused
 * requantizing store, or the int32 store (ai_qgemm_i32: the accumulators
 * plus u[j] v[r], MatMulInteger's zero-point correction).
 *
 * VNNI tiles: 4 rows x 4 blocks (64 columns), 16 zmm accumulators, one
 * vpdpbusd per row and block per 4 k (a broadcast of the row's 4 weights).
 * AVX2 tiles: 2 rows x 1 block, each 4 columns' bytes widened to int16,
 * one vpmaddwd against each row's 4 weights (int16, packed once) repeated;
 * pairs are summed at the end (vphaddd).
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "qkernels.h"
#include "simd.h"
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#if defined(AI_AVX512_KERNEL)
#define AI_Q_X86 1
#include <immintrin.h>
#define Q_VNNI __attribute__((target("arch=x86-64-v4,avx512vnni")))
#define Q_AVX2 __attribute__((target("arch=x86-64-v3")))
#endif

/* ---------------------------------------------------------------- the path */

static int cpu_best(void)
{
#ifdef AI_Q_X86
    if (ai_cpu_avx512() && __builtin_cpu_supports("avx512vnni"))
        return AI_Q_VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        return AI_Q_AVX2;
#endif
    return AI_Q_PLAIN;
}

static atomic_int q_path = -1; /* -1: not known yet */

int ai_q_path(void)
{
    int p = atomic_load_explicit(&q_path, memory_order_relaxed);
    if (p < 0) {
        p = cpu_best();
        atomic_store_explicit(&q_path, p, memory_order_relaxed);
    }
    return p;
}

int ai_q_set_path(int path)
{
    const int best = cpu_best();
    path = path < AI_Q_REFERENCE ? AI_Q_REFERENCE : path > best ? best : path;
    atomic_store_explicit(&q_path, path, memory_order_relaxed);
    return path;
}

/* ---------------------------------------------------------------- packing */

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

size_t ai_qweights_bytes(int32_t m, int32_t k)
{
    const size_t kp = (size_t)((k + 3) & ~3);
    return ALIGN64(sizeof(int32_t) * (size_t)m) + ALIGN64((size_t)m * kp) +
           ALIGN64(sizeof(int16_t) * (size_t)m * kp);
}

void ai_qweights_pack(ai_qweights *q, void *mem, int32_t m, int32_t k, int32_t seg,
                      int32_t seg_pad, const int8_t *w, const int32_t *bias)
{
    const int32_t kq = k / seg * seg_pad, kp = (kq + 3) & ~3;
    char *b = mem;
    q->m = m, q->k = kq, q->kp = kp;
    q->cb = (int32_t *)b;
    q->w8 = (int8_t *)(b + ALIGN64(sizeof(int32_t) * (size_t)m));
    q->w16 = (int16_t *)(b + ALIGN64(sizeof(int32_t) * (size_t)m) + ALIGN64((size_t)m * kp));
    for (int32_t r = 0; r < m; r++) {
        const int8_t *wr = w + (int64_t)r * k;
        uint32_t sum = 0;
        for (int32_t i = 0; i < kp; i++) {
            const int32_t s = i / seg_pad, t = i % seg_pad;
            const int8_t v = i < kq && t < seg ? wr[s * seg + t] : 0;
            q->w8[(int64_t)r * kp + i] = v;
            q->w16[(int64_t)r * kp + i] = v;
            sum += (uint32_t)(int32_t)v;
        }
        /* bias - 128 sum(w), wrapping (the true sums fit in int32) */
        q->cb[r] = (int32_t)((bias ? (uint32_t)bias[r] : 0u) - 128u * sum);
    }
}

void ai_qpack_rows(int32_t k, int64_t cols, const int8_t *rows, int64_t ld, uint8_t *xp)
{
    const int32_t kp = (k + 3) & ~3;
    const int64_t blocks = (cols + 15) / 16;
    for (int64_t b = 0; b < blocks; b++) {
        uint8_t *dst = xp + b * 16 * kp;
        const int64_t j0 = b * 16, n = cols - j0 < 16 ? cols - j0 : 16;
        for (int32_t kb = 0; kb < kp; kb += 4, dst += 64) {
#ifdef __SSE2__
            if (n == 16) {
                __m128i r[4];
                for (int t = 0; t < 4; t++)
                    r[t] = kb + t < k ? _mm_loadu_si128((const __m128i *)(rows + (kb + t) * ld +
                                                                          j0))
                                      : _mm_setzero_si128();
                const __m128i s = _mm_set1_epi8((char)0x80);
                for (int t = 0; t < 4; t++)
                    r[t] = _mm_xor_si128(r[t], s);
                ai_qpanel_block(dst, r);
                continue;
            }
#endif
            for (int j = 0; j < 16; j++)
                for (int t = 0; t < 4; t++)
                    dst[j * 4 + t] = j < n && kb + t < k
                                         ? (uint8_t)(rows[(kb + t) * ld + j0 + j] ^ 0x80)
                                         : 0x80;
        }
    }
}

/* ---------------------------------------------------------------- plain */

static void store16_plain(const int32_t *acc, const aik_rq *r, int8_t *y, int64_t ldj, int n)
{
    for (int j = 0; j < n; j++)
        y[j * ldj] = ai_q_requant(acc[j], r);
}

/* The int32 store: y[j ldj] = acc[j] + u[j] v (u NULL: none), wrapping. */
static void store16_i32_plain(const int32_t *acc, const ai_qi32 *o, int32_t r, int64_t c,
                              int n)
{
    int32_t *y = o->y + r * o->ldr + c * o->ldj;
    for (int j = 0; j < n; j++)
        y[j * o->ldj] = (int32_t)((uint32_t)acc[j] +
                                  (o->u ? (uint32_t)o->u[c + j] * (uint32_t)o->v[r] : 0u));
}

AI_VECTOR_CLONES
static void gemm_plain(const ai_qweights *q, int64_t cols, const uint8_t *xp, const aik_rq *rq,
                       int8_t *y, int64_t ldr, int64_t ldj, const ai_qi32 *o)
{
    const int32_t kp = q->kp;
    for (int64_t b = 0; b < (cols + 15) / 16; b++) {
        const uint8_t *xb = xp + b * 16 * kp;
        const int n = cols - b * 16 < 16 ? (int)(cols - b * 16) : 16;
        for (int32_t r = 0; r < q->m; r++) {
            const int8_t *w = q->w8 + (int64_t)r * kp;
            uint32_t acc[16];
            for (int j = 0; j < 16; j++)
                acc[j] = (uint32_t)q->cb[r];
            for (int32_t kb = 0; kb < kp; kb += 4)
                for (int j = 0; j < 16; j++)
                    for (int t = 0; t < 4; t++)
                        acc[j] += (uint32_t)((int32_t)w[kb + t] * xb[kb * 16 + j * 4 + t]);
            int32_t s[16];
            for (int j = 0; j < 16; j++)
                s[j] = (int32_t)acc[j];
            if (o)
                store16_i32_plain(s, o, r, b * 16, n);
            else
                store16_plain(s, &rq[r], y + r * ldr + b * 16 * ldj, ldj, n);
        }
    }
}

/* ---------------------------------------------------------------- AVX-512 VNNI */

#ifdef AI_Q_X86
/* The requantization with a zero point or ties to even (ONNX's QLinear
 * operators, quantize(rounding="half_even")): int64 lanes, p = acc * mul +
 * zero point 2^s, (p + 2^(s-1) - 1 + bit s of p) >> s for ties to even,
 * clamped; 16 int8 in the result. */
static Q_VNNI __m128i requant16_zp_even(__m512i acc, const aik_rq *r)
{
    const __m512i mul = _mm512_set1_epi64(r->multiplier);
    const __m512i half = _mm512_set1_epi64(r->shift > 0 ? ((int64_t)1 << (r->shift - 1)) -
                                                              (r->half_even ? 1 : 0)
                                                        : 0);
    const __m512i odd = _mm512_set1_epi64(r->half_even && r->shift > 0 ? 1 : 0);
    const __m128i sh = _mm_cvtsi32_si128(r->shift);
    const __m512i zp = _mm512_set1_epi64(r->zero_point * ((int64_t)1 << r->shift));
    const __m512i lo = _mm512_set1_epi64(r->lo), hi = _mm512_set1_epi64(r->hi);
    __m512i h[2] = {_mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc)),
                    _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc, 1))};
    for (int i = 0; i < 2; i++) {
        const __m512i p = _mm512_add_epi64(_mm512_mullo_epi64(h[i], mul), zp);
        const __m512i t = _mm512_add_epi64(p, _mm512_add_epi64(
                                                  half, _mm512_and_si512(_mm512_sra_epi64(p, sh),
                                                                         odd)));
        h[i] = _mm512_min_epi64(_mm512_max_epi64(_mm512_sra_epi64(t, sh), lo), hi);
    }
    return _mm_unpacklo_epi64(_mm512_cvtepi64_epi8(h[0]), _mm512_cvtepi64_epi8(h[1]));
}

/* 16 int32 accumulators -> requantized int8 at y[j ldj], j < n */
static inline __attribute__((always_inline)) Q_VNNI void store16_avx512(__m512i acc,
                                                                        const aik_rq *r,
                                                                        int8_t *y, int64_t ldj,
                                                                        int n)
{
    __m128i v;
    if (r->zero_point || r->half_even) {
        v = requant16_zp_even(acc, r);
    } else if (r->multiplier == 1) {
        /* int32 lanes: floor(a / 2^s + 1/2) = (a >> s) + bit s - 1 of a, exact
         * (no a + 2^(s-1) to overflow); counts past 31 shift in the sign */
        __m512i a = acc;
        if (r->shift > 0)
            a = _mm512_add_epi32(_mm512_sra_epi32(acc, _mm_cvtsi32_si128(r->shift)),
                                 _mm512_and_si512(_mm512_sra_epi32(
                                                      acc, _mm_cvtsi32_si128(r->shift - 1)),
                                                  _mm512_set1_epi32(1)));
        a = _mm512_min_epi32(_mm512_max_epi32(a, _mm512_set1_epi32(r->lo)),
                             _mm512_set1_epi32(r->hi));
        v = _mm512_cvtepi32_epi8(a);
    } else {
        const __m512i mul = _mm512_set1_epi64(r->multiplier);
        const __m512i half =
            _mm512_set1_epi64(r->shift > 0 ? (int64_t)1 << (r->shift - 1) : 0);
        const __m128i sh = _mm_cvtsi32_si128(r->shift);
        const __m512i lo = _mm512_set1_epi64(r->lo), hi = _mm512_set1_epi64(r->hi);
        /* the even lanes' and the odd lanes' int64 products (vpmuldq),
         * requantized, then the odd ones' low halves moved up beside them */
        __m512i a = _mm512_mul_epi32(acc, mul);
        __m512i b = _mm512_mul_epi32(_mm512_srli_epi64(acc, 32), mul);
        a = _mm512_sra_epi64(_mm512_add_epi64(a, half), sh);
        b = _mm512_sra_epi64(_mm512_add_epi64(b, half), sh);
        a = _mm512_min_epi64(_mm512_max_epi64(a, lo), hi);
        b = _mm512_min_epi64(_mm512_max_epi64(b, lo), hi);
        v = _mm512_cvtepi32_epi8(
            _mm512_mask_blend_epi32((__mmask16)0xAAAA, a, _mm512_slli_epi64(b, 32)));
    }
    if (ldj == 1) {
        _mm_mask_storeu_epi8(y, (__mmask16)((1u << n) - 1), v);
    } else {
        int8_t t[16];
        _mm_storeu_si128((__m128i *)t, v);
        for (int j = 0; j < n; j++)
            y[j * ldj] = t[j];
    }
}

/* The int32 store of 16 accumulators (store16_i32_plain). */
static inline __attribute__((always_inline)) Q_VNNI void
store16_i32_avx512(__m512i acc, const ai_qi32 *o, int32_t r, int64_t c, int n)
{
    const __mmask16 m = (__mmask16)((1u << n) - 1);
    if (o->u)
        acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(m, o->u + c),
                                                       _mm512_set1_epi32(o->v[r])));
    int32_t *y = o->y + r * o->ldr + c * o->ldj;
    if (o->ldj == 1) {
        _mm512_mask_storeu_epi32(y, m, acc);
    } else {
        int32_t t[16];
        _mm512_storeu_si512(t, acc);
        for (int j = 0; j < n; j++)
            y[j * o->ldj] = t[j];
    }
}

static inline __attribute__((always_inline)) Q_VNNI void
vnni_tile(const int mr, const int nr, const ai_qweights *q, int32_t r0, const uint8_t *xb,
          int64_t j0, int64_t cols, const aik_rq *rq, int8_t *y, int64_t ldr, int64_t ldj,
          const ai_qi32 *o)
{
    const int32_t kp = q->kp;
    const size_t bs = (size_t)16 * kp;
    __m512i acc[4][4];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            acc[i][j] = _mm512_set1_epi32(q->cb[r0 + i]);
    const int8_t *w = q->w8 + (int64_t)r0 * kp;
    for (int32_t kb = 0; kb < kp; kb += 4) {
        __m512i xv[4];
        for (int j = 0; j < nr; j++)
            xv[j] = _mm512_loadu_si512(xb + j * bs + (size_t)kb * 16);
        for (int i = 0; i < mr; i++) {
            int32_t wi;
            memcpy(&wi, w + (int64_t)i * kp + kb, 4);
            const __m512i wv = _mm512_set1_epi32(wi);
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xv[j], wv);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            const int64_t c = j0 + 16 * j;
            const int n = cols - c < 16 ? (int)(cols - c) : 16;
            if (o)
                store16_i32_avx512(acc[i][j], o, r0 + i, c, n);
            else
                store16_avx512(acc[i][j], &rq[r0 + i], y + (r0 + i) * ldr + c * ldj, ldj, n);
        }
}

#define Q_TILE_CASE(MR, NR, F) \
    case (MR) * 8 + (NR):      \
        F(MR, NR);             \
        break;
#define Q_TILE_SWITCH(key, F)                                                              \
    switch (key) {                                                                         \
        Q_TILE_CASE(1, 1, F) Q_TILE_CASE(1, 2, F) Q_TILE_CASE(1, 3, F) Q_TILE_CASE(1, 4, F) \
        Q_TILE_CASE(2, 1, F) Q_TILE_CASE(2, 2, F) Q_TILE_CASE(2, 3, F) Q_TILE_CASE(2, 4, F) \
        Q_TILE_CASE(3, 1, F) Q_TILE_CASE(3, 2, F) Q_TILE_CASE(3, 3, F) Q_TILE_CASE(3, 4, F) \
        Q_TILE_CASE(4, 1, F) Q_TILE_CASE(4, 2, F) Q_TILE_CASE(4, 3, F) Q_TILE_CASE(4, 4, F) \
    }

static Q_VNNI void gemm_vnni(const ai_qweights *q, int64_t cols, const uint8_t *xp,
                             const aik_rq *rq, int8_t *y, int64_t ldr, int64_t ldj,
                             const ai_qi32 *o)
{
    const int64_t blocks = (cols + 15) / 16;
    for (int64_t b = 0; b < blocks; b += 4) {
        const int nr = blocks - b < 4 ? (int)(blocks - b) : 4;
        const uint8_t *xb = xp + b * 16 * q->kp;
        for (int32_t r0 = 0; r0 < q->m; r0 += 4) {
            const int mr = q->m - r0 < 4 ? q->m - r0 : 4;
#define VNNI_TILE(MR, NR) vnni_tile(MR, NR, q, r0, xb, b * 16, cols, rq, y, ldr, ldj, o)
            Q_TILE_SWITCH(mr * 8 + nr, VNNI_TILE)
#undef VNNI_TILE
        }
    }
}

static Q_VNNI void store_rows_avx512(const int32_t *acc, int64_t rows, int64_t cols,
                                     int64_t lda, const aik_rq *r, int8_t *y)
{
    if (cols <= 16 && lda < 2 * cols && rows * lda <= 4096) {
        /* short rows: the accumulators requantized as one line, then each
         * row's bytes moved */
        int8_t t[4096 + 16];
        const int64_t len = (rows - 1) * lda + cols;
        for (int64_t i = 0; i < len; i += 16) {
            const int c = len - i < 16 ? (int)(len - i) : 16;
            store16_avx512(_mm512_maskz_loadu_epi32((__mmask16)((1u << c) - 1), acc + i), r,
                           t + i, 1, c);
        }
        const __mmask16 m = (__mmask16)((1u << cols) - 1);
        for (int64_t row = 0; row < rows; row++)
            _mm_mask_storeu_epi8(y + row * cols, m, _mm_maskz_loadu_epi8(m, t + row * lda));
        return;
    }
    for (int64_t row = 0; row < rows; row++)
        for (int64_t i = 0; i < cols; i += 16) {
            const int c = cols - i < 16 ? (int)(cols - i) : 16;
            const __m512i v =
                _mm512_maskz_loadu_epi32((__mmask16)((1u << c) - 1), acc + row * lda + i);
            store16_avx512(v, r, y + row * cols + i, 1, c);
        }
}

/* ---------------------------------------------------------------- AVX2 */

/* ai_q_requant of 8 int32 lanes, clamped, as int32 lanes. Multiplier 1
 * without zero point or ties to even: int32 lanes, as store16_avx512.
 * Otherwise the int64 products of the even and of the odd lanes (vpmuldq),
 * AVX2 lacking 64-bit arithmetic shifts and min/max: x >> s as
 * ((x >>> s) ^ 2^(63-s)) - 2^(63-s), the clamp by compares and blends. */
static inline __attribute__((always_inline)) Q_AVX2 __m256i requant8_avx2(__m256i acc,
                                                                         const aik_rq *r)
{
    const int s = r->shift;
    if (!r->zero_point && !r->half_even && r->multiplier == 1) {
        __m256i a = acc;
        if (s > 0)
            a = _mm256_add_epi32(_mm256_sra_epi32(acc, _mm_cvtsi32_si128(s)),
                                 _mm256_and_si256(_mm256_sra_epi32(acc, _mm_cvtsi32_si128(s - 1)),
                                                  _mm256_set1_epi32(1)));
        return _mm256_min_epi32(_mm256_max_epi32(a, _mm256_set1_epi32(r->lo)),
                                _mm256_set1_epi32(r->hi));
    }
    const __m256i mul = _mm256_set1_epi64x(r->multiplier);
    const __m256i zp = _mm256_set1_epi64x(r->zero_point * ((int64_t)1 << s));
    const __m256i half =
        _mm256_set1_epi64x(s > 0 ? ((int64_t)1 << (s - 1)) - (r->half_even ? 1 : 0) : 0);
    const __m256i odd = _mm256_set1_epi64x(r->half_even && s > 0 ? 1 : 0);
    const __m256i top = _mm256_set1_epi64x((int64_t)((uint64_t)1 << (63 - s)));
    const __m256i lo = _mm256_set1_epi64x(r->lo), hi = _mm256_set1_epi64x(r->hi);
    const __m128i sh = _mm_cvtsi32_si128(s);
    __m256i h[2] = {_mm256_mul_epi32(acc, mul), _mm256_mul_epi32(_mm256_srli_epi64(acc, 32), mul)};
    for (int i = 0; i < 2; i++) {
        const __m256i p = _mm256_add_epi64(h[i], zp);
        const __m256i t = _mm256_add_epi64(
            p, _mm256_add_epi64(half, _mm256_and_si256(_mm256_srl_epi64(p, sh), odd)));
        __m256i v = _mm256_sub_epi64(_mm256_xor_si256(_mm256_srl_epi64(t, sh), top), top);
        v = _mm256_blendv_epi8(v, hi, _mm256_cmpgt_epi64(v, hi));
        h[i] = _mm256_blendv_epi8(v, lo, _mm256_cmpgt_epi64(lo, v));
    }
    return _mm256_blend_epi32(h[0], _mm256_slli_epi64(h[1], 32), 0xAA);
}

/* 16 int32 accumulators (a: columns 0-7, b: 8-15) -> requantized int8 at
 * y[j ldj], j < n */
static inline __attribute__((always_inline)) Q_AVX2 void
store16_avx2(__m256i a, __m256i b, const aik_rq *r, int8_t *y, int64_t ldj, int n)
{
    /* clamped: the saturating packs are exact */
    const __m256i t = _mm256_permute4x64_epi64(
        _mm256_packs_epi32(requant8_avx2(a, r), requant8_avx2(b, r)), 0xD8);
    const __m128i v = _mm_packs_epi16(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    if (ldj == 1 && n == 16) {
        _mm_storeu_si128((__m128i *)y, v);
        return;
    }
    int8_t o[16];
    _mm_storeu_si128((__m128i *)o, v);
    for (int j = 0; j < n; j++)
        y[j * ldj] = o[j];
}

/* AVX2 tiles: mr <= 2 rows x 1 block (16 columns), for each 4 k: each 4
 * columns' 16 bytes widened to int16 (vpmovzxbw: column 0's u at k .. k +
 * 3, then column 1's, ...), one vpmaddwd against each row's 4 weights
 * (int16) repeated: 2 sums a column, added at the end (vphaddd). 8
 * accumulators, 2 weights and one group of columns at a time: none spilled
 * to memory (8 columns of 4 rows: GCC spills an accumulator). Tiles of 4
 * rows x 4 columns read each weight 4 times per block: 3.7x the time of a
 * 32 -> 64 channel 3x3 convolution on 32x32, whose weights (36 KiB as
 * int16) leave L1. */
static inline __attribute__((always_inline)) Q_AVX2 void
avx2_tile(const int mr, const ai_qweights *q, int32_t r0, const uint8_t *xb, int64_t j0,
          int64_t cols, const aik_rq *rq, int8_t *y, int64_t ldr, int64_t ldj, const ai_qi32 *o)
{
    const int32_t kp = q->kp;
    const int16_t *w0 = q->w16 + (int64_t)r0 * kp, *w1 = w0 + (mr > 1 ? kp : 0);
    const uint8_t *x = xb;
    __m256i acc[2][4];
    for (int i = 0; i < 2; i++)
        for (int c = 0; c < 4; c++)
            acc[i][c] = _mm256_setzero_si256();
    for (int32_t kb = 0; kb < kp; kb += 4, x += 64, w0 += 4, w1 += 4) {
        int64_t wi[2];
        memcpy(&wi[0], w0, 8);
        memcpy(&wi[1], w1, 8);
        const __m256i wv0 = _mm256_set1_epi64x(wi[0]), wv1 = _mm256_set1_epi64x(wi[1]);
        for (int c = 0; c < 4; c++) {
            const __m256i xv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(x + 16 * c)));
            acc[0][c] = _mm256_add_epi32(acc[0][c], _mm256_madd_epi16(xv, wv0));
            acc[1][c] = _mm256_add_epi32(acc[1][c], _mm256_madd_epi16(xv, wv1));
        }
    }
    const int n = cols - j0 < 16 ? (int)(cols - j0) : 16;
    for (int i = 0; i < mr; i++) {
        const __m256i cb = _mm256_set1_epi32(q->cb[r0 + i]);
        const __m256i lo = _mm256_add_epi32(
            _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[i][0], acc[i][1]), 0xD8), cb);
        const __m256i hi = _mm256_add_epi32(
            _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[i][2], acc[i][3]), 0xD8), cb);
        if (o) {
            int32_t s[16];
            _mm256_storeu_si256((__m256i *)s, lo);
            _mm256_storeu_si256((__m256i *)(s + 8), hi);
            store16_i32_plain(s, o, r0 + i, j0, n);
        } else
            store16_avx2(lo, hi, &rq[r0 + i], y + (r0 + i) * ldr + j0 * ldj, ldj, n);
    }
}

static Q_AVX2 void gemm_avx2(const ai_qweights *q, int64_t cols, const uint8_t *xp,
                             const aik_rq *rq, int8_t *y, int64_t ldr, int64_t ldj,
                             const ai_qi32 *o)
{
    /* rows outside: their weights stay in L1 with the panel (at most about
     * 32 KiB), each row's outputs stored in order */
    const int64_t blocks = (cols + 15) / 16;
    int32_t r0 = 0;
    for (; r0 + 2 <= q->m; r0 += 2)
        for (int64_t b = 0; b < blocks; b++)
            avx2_tile(2, q, r0, xp + b * 16 * q->kp, b * 16, cols, rq, y, ldr, ldj, o);
    if (r0 < q->m)
        for (int64_t b = 0; b < blocks; b++)
            avx2_tile(1, q, r0, xp + b * 16 * q->kp, b * 16, cols, rq, y, ldr, ldj, o);
}

static Q_AVX2 void store_rows_avx2(const int32_t *acc, int64_t rows, int64_t cols, int64_t lda,
                                   const aik_rq *r, int8_t *y)
{
    if (rows > 1 && cols < 16 && lda < 2 * cols && rows * lda <= 4096) {
        /* short rows: the accumulators requantized as one line, then each
         * row's bytes moved */
        int8_t t[4096 + 16];
        const int64_t len = (rows - 1) * lda + cols;
        store_rows_avx2(acc, 1, len, len, r, t);
        for (int64_t row = 0; row < rows; row++) {
            /* two overlapping copies of a fixed size, no call */
            int8_t *d = y + row * cols;
            const int8_t *src = t + row * lda;
            if (cols >= 8) {
                memcpy(d, src, 8);
                memcpy(d + cols - 8, src + cols - 8, 8);
            } else if (cols >= 4) {
                memcpy(d, src, 4);
                memcpy(d + cols - 4, src + cols - 4, 4);
            } else
                for (int64_t i = 0; i < cols; i++)
                    d[i] = src[i];
        }
        return;
    }
    for (int64_t row = 0; row < rows; row++) {
        int64_t i = 0;
        for (; i + 16 <= cols; i += 16)
            store16_avx2(_mm256_loadu_si256((const __m256i *)(acc + row * lda + i)),
                         _mm256_loadu_si256((const __m256i *)(acc + row * lda + i + 8)), r,
                         y + row * cols + i, 1, 16);
        if (i < cols) {
            int32_t t[16] = {0};
            memcpy(t, acc + row * lda + i, sizeof(int32_t) * (size_t)(cols - i));
            store16_avx2(_mm256_loadu_si256((const __m256i *)t),
                         _mm256_loadu_si256((const __m256i *)(t + 8)), r, y + row * cols + i, 1,
                         (int)(cols - i));
        }
    }
}
#endif

/* the requantizing store (o NULL) or the int32 one */
static void qgemm_any(const ai_qweights *q, int64_t cols, const uint8_t *xp, const aik_rq *rq,
                      int8_t *y, int64_t ldr, int64_t ldj, const ai_qi32 *o)
{
#ifdef AI_Q_X86
    const int path = ai_q_path();
    if (path >= AI_Q_VNNI) {
        gemm_vnni(q, cols, xp, rq, y, ldr, ldj, o);
        return;
    }
    if (path == AI_Q_AVX2) {
        gemm_avx2(q, cols, xp, rq, y, ldr, ldj, o);
        return;
    }
#endif
    gemm_plain(q, cols, xp, rq, y, ldr, ldj, o);
}

void ai_qgemm(const ai_qweights *q, int64_t cols, const uint8_t *xp, const aik_rq *rq,
              int8_t *y, int64_t ldr, int64_t ldj)
{
    qgemm_any(q, cols, xp, rq, y, ldr, ldj, NULL);
}

void ai_qgemm_i32(const ai_qweights *q, int64_t cols, const uint8_t *xp, const ai_qi32 *o)
{
    qgemm_any(q, cols, xp, NULL, NULL, 0, 0, o);
}

void ai_q_store_rows(const int32_t *acc, int64_t rows, int64_t cols, int64_t lda,
                     const aik_rq *r, int8_t *y)
{
#ifdef AI_Q_X86
    if (ai_q_path() >= AI_Q_VNNI) {
        store_rows_avx512(acc, rows, cols, lda, r, y);
        return;
    }
    if (ai_q_path() == AI_Q_AVX2) {
        store_rows_avx2(acc, rows, cols, lda, r, y);
        return;
    }
#endif
    for (int64_t row = 0; row < rows; row++)
        for (int64_t i = 0; i < cols; i++)
            y[row * cols + i] = ai_q_requant(acc[row * lda + i], r);
}
