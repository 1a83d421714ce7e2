/*
 * qpool.c — QMaxPool, QAveragePool, QAdd and Requantize (qkernels.h): the
 * reference's integers without its per-tap bounds checks and divisions.
 * Pools clip each window to the input once (the taps inside are those of
 * [k0, k1) along each axis); QAdd and Requantize run 8 lanes of int64 with
 * AVX-512 on the VNNI path, else the scalar loop.
 */
#include "../parallel.h"
#include "qkernels.h"
#include "simd.h"

#if defined(AI_AVX512_KERNEL)
#define AI_Q_X86 1
#include <immintrin.h>
#define Q_AVX512 __attribute__((target("arch=x86-64-v4")))
#endif

/* taps [*k0, *k1) of window o that fall inside [0, size) */
static inline void taps_inside(int32_t o, int32_t s, int32_t pad, int32_t d, int32_t k,
                               int32_t size, int32_t *k0, int32_t *k1)
{
    const int64_t start = (int64_t)o * s - pad;
    int64_t a = start < 0 ? (-start + d - 1) / d : 0;
    int64_t b = start + (int64_t)(k - 1) * d < size ? k : (size - 1 - start) / d + 1;
    if (size - 1 - start < 0)
        b = 0;
    *k0 = (int32_t)(a > k ? k : a);
    *k1 = (int32_t)(b < *k0 ? *k0 : b);
}

typedef struct {
    const aik_window *p;
    const int8_t *x;
    int8_t *y;
    bool avg;
} pool_job;

/* floor(sum / count + 1/2) as avg_i8 of the reference */
static inline int8_t avg_round(int32_t sum, int32_t count)
{
    if (count <= 0)
        return 0;
    const int64_t num = 2 * (int64_t)sum + count, den = 2 * (int64_t)count;
    int64_t q = num / den;
    if (num % den != 0 && num < 0)
        q -= 1;
    return (int8_t)q;
}

static void pool_range(void *ctx, int64_t lo, int64_t hi)
{
    const pool_job *j = ctx;
    const aik_window *p = j->p;
    for (int64_t nc = lo; nc < hi; nc++) {
        const int8_t *xc = j->x + nc * p->h * p->w;
        int8_t *yc = j->y + nc * p->oh * p->ow;
        for (int32_t oy = 0; oy < p->oh; oy++) {
            int32_t ky0, ky1;
            taps_inside(oy, p->sh, p->pt, p->dh, p->kh, p->h, &ky0, &ky1);
            const int32_t iy0 = oy * p->sh - p->pt;
            for (int32_t ox = 0; ox < p->ow; ox++) {
                int32_t kx0, kx1;
                taps_inside(ox, p->sw, p->pl, p->dw, p->kw, p->w, &kx0, &kx1);
                const int64_t at = (int64_t)iy0 * p->w + ((int64_t)ox * p->sw - p->pl);
                int32_t acc = j->avg ? 0 : INT8_MIN;
                for (int32_t ky = ky0; ky < ky1; ky++) {
                    const int64_t r = at + (int64_t)ky * p->dh * p->w;
                    if (j->avg)
                        for (int32_t kx = kx0; kx < kx1; kx++)
                            acc += xc[r + kx * p->dw];
                    else
                        for (int32_t kx = kx0; kx < kx1; kx++)
                            acc = xc[r + kx * p->dw] > acc ? xc[r + kx * p->dw] : acc;
                }
                if (j->avg) {
                    const int32_t count = p->count_include_pad ? p->kh * p->kw
                                                               : (ky1 - ky0) * (kx1 - kx0);
                    yc[(int64_t)oy * p->ow + ox] = avg_round(acc, count);
                } else {
                    yc[(int64_t)oy * p->ow + ox] = (int8_t)acc;
                }
            }
        }
    }
}

static void pool(const aik_window *p, const int8_t *x, int8_t *y, bool avg)
{
    pool_job j = {p, x, y, avg};
    const int64_t planes = (int64_t)p->n * p->c;
    ai_parallel_for(planes, ai_grain_of((int64_t)p->h * p->w), pool_range, &j);
}

void ai_qmaxpool(const aik_window *p, const int8_t *x, int8_t *y) { pool(p, x, y, false); }

void ai_qavgpool(const aik_window *p, const int8_t *x, int8_t *y) { pool(p, x, y, true); }

/* ---------------------------------------------------------------- QAdd, Requantize */

typedef struct {
    const int8_t *a, *b;
    int32_t ma, mb; /* Requantize: b NULL, ma its multiplier */
    int32_t shift, lo, hi;
    int8_t *y;
} ew_job;

#ifdef AI_Q_X86
static Q_AVX512 void ew_avx512(const ew_job *j, int64_t lo, int64_t hi)
{
    const __m512i ma = _mm512_set1_epi64(j->ma), mb = _mm512_set1_epi64(j->mb);
    const __m512i half = _mm512_set1_epi64(j->shift > 0 ? (int64_t)1 << (j->shift - 1) : 0);
    const __m128i sh = _mm_cvtsi32_si128(j->shift);
    const __m512i vlo = _mm512_set1_epi64(j->lo), vhi = _mm512_set1_epi64(j->hi);
    for (int64_t i = lo; i < hi; i += 8) {
        const __mmask8 m = (__mmask8)(hi - i < 8 ? (1u << (hi - i)) - 1 : 0xff);
        __m512i v = _mm512_mullo_epi64(
            _mm512_cvtepi8_epi64(_mm_maskz_loadu_epi8(m, j->a + i)), ma);
        if (j->b)
            v = _mm512_add_epi64(v, _mm512_mullo_epi64(
                                        _mm512_cvtepi8_epi64(_mm_maskz_loadu_epi8(m, j->b + i)),
                                        mb));
        v = _mm512_sra_epi64(_mm512_add_epi64(v, half), sh);
        v = _mm512_min_epi64(_mm512_max_epi64(v, vlo), vhi);
        _mm512_mask_cvtepi64_storeu_epi8(j->y + i, m, v);
    }
}
#endif

static void ew_range(void *ctx, int64_t lo, int64_t hi)
{
    const ew_job *j = ctx;
#ifdef AI_Q_X86
    if (ai_q_path() >= AI_Q_VNNI) {
        ew_avx512(j, lo, hi);
        return;
    }
#endif
    for (int64_t i = lo; i < hi; i++) {
        int64_t v = (int64_t)j->a[i] * j->ma + (j->b ? (int64_t)j->b[i] * j->mb : 0);
        if (j->shift > 0)
            v = (v + ((int64_t)1 << (j->shift - 1))) >> j->shift;
        j->y[i] = (int8_t)(v < j->lo ? j->lo : v > j->hi ? j->hi : v);
    }
}

void ai_qadd(int64_t n, const int8_t *a, int32_t ma, const int8_t *b, int32_t mb,
             int32_t shift, int32_t lo, int32_t hi, int8_t *y)
{
    ew_job j = {a, b, ma, mb, shift, lo, hi, y};
    ai_parallel_for(n, AI_GRAIN_ELEMS, ew_range, &j);
}

void ai_qrequant(int64_t n, const int8_t *x, const aik_rq *rq, int8_t *y)
{
    ew_job j = {x, NULL, rq->multiplier, 0, rq->shift, rq->lo, rq->hi, y};
    ai_parallel_for(n, AI_GRAIN_ELEMS, ew_range, &j);
}
