/*
 * qpool.c — QMaxPool, QAveragePool, QAdd and Requantize (qkernels.h): the
 * reference's integers without its per-tap bounds checks and divisions.
 * Pools clip each window to the input once (the taps inside are those of
 * [k0, k1) along each axis); the 2x2 max pool of stride 2, QAdd and
 * Requantize run AVX-512 on the VNNI path, AVX2 on the AVX2 path, else the
 * scalar loop. Then ONNX Runtime's QLinearAdd in integers and
 * QLinearGlobalAveragePool's sums (ops/qlinear.c): AVX-512 on the VNNI
 * path, AVX2, plain C.
 */
#include <math.h>
#include <string.h>

#include "../parallel.h"
#include "qkernels.h"
#include "simd.h"

#if defined(AI_AVX512_KERNEL)
#define AI_Q_X86 1
#include <immintrin.h>
#define Q_AVX512 __attribute__((target("arch=x86-64-v4")))
#define Q_AVX2 __attribute__((target("arch=x86-64-v3")))
#endif

/* taps [*k0, *k1) of window o that fall inside [0, size) */
static inline void taps_inside(int32_t o, int32_t s, int32_t pad, int32_t d, int32_t k,
                               int32_t size, int32_t *k0, int32_t *k1)
{
    const int64_t start = (int64_t)o * s - pad;
    int64_t a = 0, b = k;
    if (d == 1) { /* no division */
        a = start < 0 ? -start : 0;
        b = size - start < k ? size - start : k;
    } else {
        a = start < 0 ? (-start + d - 1) / d : 0;
        if (start + (int64_t)(k - 1) * d >= size)
            b = size - 1 - start < 0 ? 0 : (size - 1 - start) / d + 1;
    }
    *k0 = (int32_t)(a > k ? k : a);
    *k1 = (int32_t)(b < *k0 ? *k0 : b);
}

typedef struct {
    const aik_window *p;
    const int8_t *x;
    int8_t *y;
    bool avg;
    bool avx512; /* max2x2_avx512 */
    bool avx2;   /* max2x2_avx2 */
} pool_job;

#ifdef AI_Q_X86
/* The 2x2 max pool of stride 2 of one plane: 32 outputs per step, the max
 * of the two input rows, then of each byte pair (as int16 lanes: the high
 * byte shifted onto the low one), the low bytes kept (vpmovwb). */
static Q_AVX512 void max2x2_avx512(const aik_window *p, const int8_t *xc, int8_t *yc)
{
    for (int32_t oy = 0; oy < p->oh; oy++) {
        const int8_t *x0 = xc + (int64_t)2 * oy * p->w, *x1 = x0 + p->w;
        int8_t *yr = yc + (int64_t)oy * p->ow;
        for (int32_t ox = 0; ox < p->ow; ox += 32) {
            const int n = p->ow - ox < 32 ? p->ow - ox : 32;
            const __mmask64 in = n == 32 ? ~(__mmask64)0 : ((__mmask64)1 << (2 * n)) - 1;
            const __m512i m = _mm512_max_epi8(_mm512_maskz_loadu_epi8(in, x0 + 2 * ox),
                                              _mm512_maskz_loadu_epi8(in, x1 + 2 * ox));
            const __m512i t = _mm512_max_epi8(m, _mm512_srli_epi16(m, 8));
            _mm256_mask_storeu_epi8(yr + ox, (__mmask32)(((uint64_t)1 << n) - 1),
                                    _mm512_cvtepi16_epi8(t));
        }
    }
}
#endif

#ifdef AI_Q_X86
/* max2x2_avx512 with 16 outputs per AVX2 step (the bytes kept by a mask and
 * vpackuswb); the 32-byte loads may pass a row's end, not the input's
 * (end): the last outputs of the last rows one at a time */
static Q_AVX2 void max2x2_avx2(const aik_window *p, const int8_t *xc, int8_t *yc,
                               const int8_t *end)
{
    const __m256i low = _mm256_set1_epi16(0xff);
    for (int32_t oy = 0; oy < p->oh; oy++) {
        const int8_t *x0 = xc + (int64_t)2 * oy * p->w, *x1 = x0 + p->w;
        int8_t *yr = yc + (int64_t)oy * p->ow;
        int32_t ox = 0;
        for (; ox < p->ow && end - x1 >= 2 * (int64_t)ox + 32; ox += 16) {
            const __m256i m = _mm256_max_epi8(_mm256_loadu_si256((const __m256i *)(x0 + 2 * ox)),
                                              _mm256_loadu_si256((const __m256i *)(x1 + 2 * ox)));
            const __m256i t = _mm256_and_si256(_mm256_max_epi8(m, _mm256_srli_epi16(m, 8)), low);
            const __m128i v = _mm256_castsi256_si128(
                _mm256_permute4x64_epi64(_mm256_packus_epi16(t, t), 0x08));
            if (p->ow - ox >= 16) {
                _mm_storeu_si128((__m128i *)(yr + ox), v);
                continue;
            }
            int8_t o[16];
            _mm_storeu_si128((__m128i *)o, v);
            memcpy(yr + ox, o, (size_t)(p->ow - ox));
        }
        for (; ox < p->ow; ox++) {
            const int8_t a = x0[2 * ox] > x0[2 * ox + 1] ? x0[2 * ox] : x0[2 * ox + 1];
            const int8_t b = x1[2 * ox] > x1[2 * ox + 1] ? x1[2 * ox] : x1[2 * ox + 1];
            yr[ox] = a > b ? a : b;
        }
    }
}
#endif

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

/* Output positions per row segment (their accumulators on the stack); rows
 * shorter than POOL_WIDE go output by output. */
#define POOL_SEG 256
#define POOL_WIDE 16

/* First output position >= 0 whose tap at offset t (ox * s + t) is >= v. */
static inline int64_t first_at_least(int64_t v, int64_t t, int32_t s)
{
    const int64_t u = v - t;
    return u <= 0 ? 0 : (u + s - 1) / s;
}

/* Tap by tap over a segment of an output row (a division per row and tap,
 * none per output): acc[ox] takes tap (ky, kx) for the ox whose input
 * column is inside. */
static void pool_range(void *ctx, int64_t lo, int64_t hi)
{
    const pool_job *j = ctx;
    /* locals: the int8 stores may alias any memory, not these */
    const aik_window win = *j->p, *p = &win;
    const bool avg = j->avg;
    const bool max2x2 = !avg && p->kh == 2 && p->kw == 2 && p->sh == 2 && p->sw == 2 &&
                        p->dh == 1 && p->dw == 1 && p->pt == 0 && p->pl == 0 &&
                        2 * p->oh <= p->h && 2 * p->ow <= p->w;
    const bool global = p->oh == 1 && p->ow == 1 && p->kh == p->h && p->kw == p->w &&
                        p->pt == 0 && p->pl == 0 && p->dh == 1 && p->dw == 1;
    int32_t acc[POOL_SEG], cnt[POOL_SEG];
    for (int64_t nc = lo; nc < hi; nc++) {
        const int8_t *xc = j->x + nc * p->h * p->w;
        int8_t *yc = j->y + nc * p->oh * p->ow;
        if (global) { /* one window over the whole plane: a sum or max of a line */
            int32_t a = avg ? 0 : INT8_MIN;
            if (avg)
                for (int64_t i = 0; i < (int64_t)p->h * p->w; i++)
                    a += xc[i];
            else
                for (int64_t i = 0; i < (int64_t)p->h * p->w; i++)
                    a = xc[i] > a ? xc[i] : a;
            yc[0] = avg ? avg_round(a, p->h * p->w) : (int8_t)a;
            continue;
        }
        if (max2x2) { /* 2x2 windows, stride 2, inside the input: the common max pool */
#ifdef AI_Q_X86
            if (j->avx512) {
                max2x2_avx512(p, xc, yc);
                continue;
            }
            if (j->avx2) {
                max2x2_avx2(p, xc, yc, j->x + (int64_t)p->n * p->c * p->h * p->w);
                continue;
            }
#endif
            for (int32_t oy = 0; oy < p->oh; oy++) {
                const int8_t *x0 = xc + (int64_t)2 * oy * p->w, *x1 = x0 + p->w;
                int8_t *yr = yc + (int64_t)oy * p->ow;
                for (int32_t ox = 0; ox < p->ow; ox++) {
                    const int8_t a = x0[2 * ox] > x0[2 * ox + 1] ? x0[2 * ox] : x0[2 * ox + 1];
                    const int8_t b = x1[2 * ox] > x1[2 * ox + 1] ? x1[2 * ox] : x1[2 * ox + 1];
                    yr[ox] = a > b ? a : b;
                }
            }
            continue;
        }
        for (int32_t oy = 0; oy < p->oh; oy++) {
            int32_t ky0, ky1;
            taps_inside(oy, p->sh, p->pt, p->dh, p->kh, p->h, &ky0, &ky1);
            const int64_t iy0 = (int64_t)oy * p->sh - p->pt;
            if (p->ow < POOL_WIDE) { /* output by output: rows too short for taps first */
                for (int32_t ox = 0; ox < p->ow; ox++) {
                    int32_t kx0, kx1;
                    taps_inside(ox, p->sw, p->pl, p->dw, p->kw, p->w, &kx0, &kx1);
                    const int64_t at = iy0 * p->w + (int64_t)ox * p->sw - p->pl;
                    int32_t a = avg ? 0 : INT8_MIN;
                    for (int32_t ky = ky0; ky < ky1; ky++) {
                        const int64_t r = at + (int64_t)ky * p->dh * p->w;
                        if (avg)
                            for (int32_t kx = kx0; kx < kx1; kx++)
                                a += xc[r + (int64_t)kx * p->dw];
                        else
                            for (int32_t kx = kx0; kx < kx1; kx++)
                                a = xc[r + (int64_t)kx * p->dw] > a ? xc[r + (int64_t)kx * p->dw]
                                                                    : a;
                    }
                    yc[(int64_t)oy * p->ow + ox] =
                        avg ? avg_round(a, p->count_include_pad ? p->kh * p->kw
                                                                : (ky1 - ky0) * (kx1 - kx0))
                            : (int8_t)a;
                }
                continue;
            }
            for (int32_t ox0 = 0; ox0 < p->ow; ox0 += POOL_SEG) {
                const int32_t n = p->ow - ox0 < POOL_SEG ? p->ow - ox0 : POOL_SEG;
                for (int32_t i = 0; i < n; i++)
                    acc[i] = avg ? 0 : INT8_MIN, cnt[i] = 0;
                /* the taps inside for some output of the segment */
                int32_t a0, b0, a1, b1;
                taps_inside(ox0, p->sw, p->pl, p->dw, p->kw, p->w, &a0, &b0);
                taps_inside(ox0 + n - 1, p->sw, p->pl, p->dw, p->kw, p->w, &a1, &b1);
                for (int32_t kx = a1; kx < b0; kx++) {
                    const int64_t t = (int64_t)kx * p->dw - p->pl; /* column of ox: ox sw + t */
                    int64_t l = first_at_least(0, t, p->sw), r = first_at_least(p->w, t, p->sw);
                    l = l < ox0 ? 0 : l - ox0;
                    r = r - ox0 > n ? n : r - ox0;
                    for (int32_t ky = ky0; ky < ky1; ky++) {
                        const int64_t at = (iy0 + (int64_t)ky * p->dh) * p->w + t +
                                           (int64_t)ox0 * p->sw;
                        if (avg)
                            for (int64_t i = l; i < r; i++)
                                acc[i] += xc[at + i * p->sw];
                        else
                            for (int64_t i = l; i < r; i++) {
                                const int32_t v = xc[at + i * p->sw];
                                acc[i] = v > acc[i] ? v : acc[i];
                            }
                    }
                    for (int64_t i = l; i < r; i++)
                        cnt[i] += ky1 - ky0;
                }
                int8_t *yr = yc + (int64_t)oy * p->ow + ox0;
                if (avg)
                    for (int32_t i = 0; i < n; i++)
                        yr[i] = avg_round(acc[i], p->count_include_pad ? p->kh * p->kw : cnt[i]);
                else
                    for (int32_t i = 0; i < n; i++)
                        yr[i] = (int8_t)acc[i];
            }
        }
    }
}

static void pool(const aik_window *p, const int8_t *x, int8_t *y, bool avg)
{
    pool_job j = {p, x, y, avg, false, false};
#ifdef AI_Q_X86
    j.avx512 = ai_q_path() >= AI_Q_VNNI;
    j.avx2 = ai_q_path() == AI_Q_AVX2;
#endif
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

/* ew_avx512 in 8 int32 lanes: the int64 sums of products of the even and of
 * the odd lanes (vpmuldq), >> s as ((x >>> s) ^ 2^(63-s)) - 2^(63-s) (AVX2
 * has no 64-bit arithmetic shift, nor min/max: compares and blends) */
static Q_AVX2 void ew_avx2(const ew_job *j, int64_t lo, int64_t hi)
{
    const __m256i ma = _mm256_set1_epi64x(j->ma), mb = _mm256_set1_epi64x(j->mb);
    const __m256i half = _mm256_set1_epi64x(j->shift > 0 ? (int64_t)1 << (j->shift - 1) : 0);
    const __m256i top = _mm256_set1_epi64x((int64_t)((uint64_t)1 << (63 - j->shift)));
    const __m128i sh = _mm_cvtsi32_si128(j->shift);
    const __m256i vlo = _mm256_set1_epi64x(j->lo), vhi = _mm256_set1_epi64x(j->hi);
    for (int64_t i = lo; i < hi; i += 8) {
        const int n = hi - i < 8 ? (int)(hi - i) : 8;
        int8_t t[2][8] = {{0}}; /* the last n < 8 */
        const int8_t *pa = j->a + i, *pb = j->b ? j->b + i : t[1];
        if (n < 8) {
            memcpy(t[0], pa, (size_t)n);
            if (j->b)
                memcpy(t[1], pb, (size_t)n);
            pa = t[0], pb = t[1];
        }
        const __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)pa));
        const __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)pb));
        __m256i v[2];
        for (int h = 0; h < 2; h++) {
            const __m256i ah = h ? _mm256_srli_epi64(a, 32) : a;
            const __m256i bh = h ? _mm256_srli_epi64(b, 32) : b;
            const __m256i s = _mm256_add_epi64(
                _mm256_add_epi64(_mm256_mul_epi32(ah, ma), _mm256_mul_epi32(bh, mb)), half);
            __m256i r = _mm256_sub_epi64(_mm256_xor_si256(_mm256_srl_epi64(s, sh), top), top);
            r = _mm256_blendv_epi8(r, vhi, _mm256_cmpgt_epi64(r, vhi));
            v[h] = _mm256_blendv_epi8(r, vlo, _mm256_cmpgt_epi64(vlo, r));
        }
        const __m256i y32 = _mm256_blend_epi32(v[0], _mm256_slli_epi64(v[1], 32), 0xAA);
        const __m128i y16 = _mm_packs_epi32(_mm256_castsi256_si128(y32),
                                            _mm256_extracti128_si256(y32, 1));
        if (n == 8) {
            _mm_storel_epi64((__m128i *)(j->y + i), _mm_packs_epi16(y16, y16));
            continue;
        }
        _mm_storel_epi64((__m128i *)t[0], _mm_packs_epi16(y16, y16));
        memcpy(j->y + i, t[0], (size_t)n);
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
    if (ai_q_path() == AI_Q_AVX2) {
        ew_avx2(j, lo, hi);
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
    if (rq->zero_point || rq->half_even) { /* (the lanes below round half up) */
        aik_requant_i8(n, x, rq, y);
        return;
    }
    ew_job j = {x, NULL, rq->multiplier, 0, rq->shift, rq->lo, rq->hi, y};
    ai_parallel_for(n, AI_GRAIN_ELEMS, ew_range, &j);
}

/* ---------------------------------------------------------------- QLinearAdd */

bool ai_qladd_init(ai_qladd *p, double as, double az, double bs, double bz, double cs,
                   double cz, bool u8)
{
    if (!(as > 0 && bs > 0 && cs > 0) || !isfinite(as) || !isfinite(bs) || !isfinite(cs))
        return false;
    const double fa = as / cs, fb = bs / cs;
    if (!isfinite(fa) || !isfinite(fb))
        return false;
    int ex;
    frexp(fa > fb ? fa : fb, &ex); /* the greater = m 2^ex, m in [1/2, 1): A, B < 2^30 */
    const int K = 30 - ex;
    if (K < 16 || K > 52)
        return false;
    *p = (ai_qladd){.K = K, .lo = u8 ? 0 : INT8_MIN, .hi = u8 ? UINT8_MAX : INT8_MAX, .u8 = u8,
                    .as = as, .az = az, .bs = bs, .bz = bz, .cs = cs, .cz = cz};
    p->A = llround(ldexp(fa, K)), p->B = llround(ldexp(fb, K));
    p->C0 = (int64_t)cz * ((int64_t)1 << K) + ((int64_t)1 << (K - 1)) - p->A * (int64_t)az -
            p->B * (int64_t)bz;
    p->D = 512 + (int64_t)ceil(ldexp(255.0 * (fa + fb), K - 50));
    return true;
}

/* the definition (ops/qlinear.c's reference), for the values near a tie */
static int32_t qladd_exact(const ai_qladd *p, int32_t a, int32_t b)
{
    const double v = rint((p->as * ((double)a - p->az) + p->bs * ((double)b - p->bz)) / p->cs) +
                     p->cz;
    return v < p->lo ? p->lo : v > p->hi ? p->hi : (int32_t)v;
}

static inline int32_t qladd_at(const void *x, int64_t i, bool u8)
{
    return u8 ? ((const uint8_t *)x)[i] : ((const int8_t *)x)[i];
}

/* elements [lo, hi) in plain C */
static void qladd_plain(const ai_qladd *p, const void *a, int64_t sa, const void *b, int64_t sb,
                        uint8_t *y, int64_t lo, int64_t hi)
{
    const ai_qladd q = *p; /* (a local: the byte stores may alias *p, not it) */
    const int64_t mask = ((int64_t)1 << q.K) - 1, span = mask + 1 - 2 * q.D;
    for (int64_t i = lo; i < hi; i++) {
        const int32_t va = qladd_at(a, i * sa, q.u8), vb = qladd_at(b, i * sb, q.u8);
        const int64_t P = q.A * va + q.B * vb + q.C0;
        const int64_t c = P >> q.K;
        if ((uint64_t)((P & mask) - q.D) > (uint64_t)span) /* near a tie */
            y[i] = (uint8_t)qladd_exact(&q, va, vb);
        else
            y[i] = (uint8_t)(c < q.lo ? q.lo : c > q.hi ? q.hi : c);
    }
}

#ifdef AI_Q_X86
/* 8 elements per step in int64 lanes (vpmuldq: the low 32 bits, signed) */
static Q_AVX512 void qladd_avx512(const ai_qladd *p, const void *a, int64_t sa, const void *b,
                                  int64_t sb, uint8_t *y, int64_t lo, int64_t hi)
{
    const __m512i A = _mm512_set1_epi64(p->A), B = _mm512_set1_epi64(p->B);
    const __m512i C0 = _mm512_set1_epi64(p->C0), D = _mm512_set1_epi64(p->D);
    const __m512i mask = _mm512_set1_epi64(((int64_t)1 << p->K) - 1);
    const __m512i span = _mm512_set1_epi64(((int64_t)1 << p->K) - 2 * p->D);
    const __m512i vlo = _mm512_set1_epi64(p->lo), vhi = _mm512_set1_epi64(p->hi);
    const __m128i K = _mm_cvtsi32_si128(p->K);
    const __m512i a1 = _mm512_set1_epi64(qladd_at(a, 0, p->u8));
    const __m512i b1 = _mm512_set1_epi64(qladd_at(b, 0, p->u8));
    for (int64_t i = lo; i < hi; i += 8) {
        const int n = hi - i < 8 ? (int)(hi - i) : 8;
        const __mmask8 m = (__mmask8)((1u << n) - 1);
        __m512i va = a1, vb = b1;
        if (sa) {
            const __m128i r = _mm_maskz_loadu_epi8(m, (const uint8_t *)a + i);
            va = p->u8 ? _mm512_cvtepu8_epi64(r) : _mm512_cvtepi8_epi64(r);
        }
        if (sb) {
            const __m128i r = _mm_maskz_loadu_epi8(m, (const uint8_t *)b + i);
            vb = p->u8 ? _mm512_cvtepu8_epi64(r) : _mm512_cvtepi8_epi64(r);
        }
        const __m512i P = _mm512_add_epi64(
            _mm512_add_epi64(_mm512_mul_epi32(va, A), _mm512_mul_epi32(vb, B)), C0);
        const __m512i q = _mm512_min_epi64(_mm512_max_epi64(_mm512_sra_epi64(P, K), vlo), vhi);
        _mm512_mask_cvtepi64_storeu_epi8(y + i, m, q);
        __mmask8 near = _mm512_mask_cmpgt_epu64_mask(
            m, _mm512_sub_epi64(_mm512_and_si512(P, mask), D), span);
        while (near) { /* near a tie: the definition */
            const int k = __builtin_ctz(near);
            near &= (__mmask8)(near - 1);
            y[i + k] = (uint8_t)qladd_exact(p, qladd_at(a, (i + k) * sa, p->u8),
                                            qladd_at(b, (i + k) * sb, p->u8));
        }
    }
}

/* 4 int64 lanes (vpmuldq); the quotient of P clamped first, so that a
 * logical shift of P - lo 2^K >= 0 gives it (AVX2 has no arithmetic one) */
static Q_AVX2 void qladd_avx2(const ai_qladd *p, const void *a, int64_t sa, const void *b,
                              int64_t sb, uint8_t *y, int64_t lo, int64_t hi)
{
    const int64_t one = (int64_t)1 << p->K;
    const __m256i A = _mm256_set1_epi64x(p->A), B = _mm256_set1_epi64x(p->B);
    const __m256i C0 = _mm256_set1_epi64x(p->C0), mask = _mm256_set1_epi64x(one - 1);
    const __m256i D = _mm256_set1_epi64x(p->D), top = _mm256_set1_epi64x(one - p->D);
    const __m256i plo = _mm256_set1_epi64x((int64_t)p->lo * one);
    const __m256i phi = _mm256_set1_epi64x(((int64_t)p->hi + 1) * one - 1);
    const __m256i vlo = _mm256_set1_epi64x(p->lo);
    const __m128i K = _mm_cvtsi32_si128(p->K);
    const __m256i a1 = _mm256_set1_epi64x(qladd_at(a, 0, p->u8));
    const __m256i b1 = _mm256_set1_epi64x(qladd_at(b, 0, p->u8));
    int64_t i = lo;
    for (; i + 4 <= hi; i += 4) {
        __m256i va = a1, vb = b1;
        if (sa) {
            int32_t w;
            memcpy(&w, (const uint8_t *)a + i, 4);
            const __m128i r = _mm_cvtsi32_si128(w);
            va = p->u8 ? _mm256_cvtepu8_epi64(r) : _mm256_cvtepi8_epi64(r);
        }
        if (sb) {
            int32_t w;
            memcpy(&w, (const uint8_t *)b + i, 4);
            const __m128i r = _mm_cvtsi32_si128(w);
            vb = p->u8 ? _mm256_cvtepu8_epi64(r) : _mm256_cvtepi8_epi64(r);
        }
        __m256i P = _mm256_add_epi64(
            _mm256_add_epi64(_mm256_mul_epi32(va, A), _mm256_mul_epi32(vb, B)), C0);
        const __m256i r = _mm256_and_si256(P, mask);
        const int near = _mm256_movemask_pd(_mm256_castsi256_pd(
            _mm256_or_si256(_mm256_cmpgt_epi64(r, top), _mm256_cmpgt_epi64(D, r))));
        P = _mm256_blendv_epi8(P, plo, _mm256_cmpgt_epi64(plo, P));
        P = _mm256_blendv_epi8(P, phi, _mm256_cmpgt_epi64(P, phi));
        const __m256i q = _mm256_add_epi64(_mm256_srl_epi64(_mm256_sub_epi64(P, plo), K), vlo);
        /* byte 0 of each lane to bytes 0..3 */
        const __m256i t = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0));
        const int32_t w = _mm_cvtsi128_si32(
            _mm_shuffle_epi8(_mm256_castsi256_si128(t), _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1,
                                                                      -1, -1, -1, -1, -1, -1, -1,
                                                                      -1)));
        memcpy(y + i, &w, 4);
        for (int k = 0; k < 4; k++) /* near a tie: the definition */
            if (near >> k & 1)
                y[i + k] = (uint8_t)qladd_exact(p, qladd_at(a, (i + k) * sa, p->u8),
                                                qladd_at(b, (i + k) * sb, p->u8));
    }
    qladd_plain(p, a, sa, b, sb, y, i, hi);
}
#endif

typedef struct {
    const ai_qladd *p;
    const void *a, *b;
    int64_t sa, sb;
    uint8_t *y;
    int path;
} qladd_job;

static void qladd_range(void *ctx, int64_t lo, int64_t hi)
{
    const qladd_job *j = ctx;
#ifdef AI_Q_X86
    if (j->path >= AI_Q_VNNI) {
        qladd_avx512(j->p, j->a, j->sa, j->b, j->sb, j->y, lo, hi);
        return;
    }
    if (j->path == AI_Q_AVX2) {
        qladd_avx2(j->p, j->a, j->sa, j->b, j->sb, j->y, lo, hi);
        return;
    }
#endif
    qladd_plain(j->p, j->a, j->sa, j->b, j->sb, j->y, lo, hi);
}

void ai_qladd_run(const ai_qladd *p, int64_t n, const void *a, int64_t sa, const void *b,
                  int64_t sb, void *y)
{
    qladd_job j = {p, a, b, sa, sb, y, ai_q_path()};
    ai_parallel_for(n, AI_GRAIN_ELEMS, qladd_range, &j);
}

/* ------------------------------------------------ QLinearGlobalAveragePool's sums */

typedef struct {
    int64_t c, s;
    bool last, u8;
    const uint8_t *x;
    int64_t *sums;
    int path;
} qsums_job;

#ifdef AI_Q_X86
/* the sum of n bytes: vpsadbw against 0 (int8: as x + 128, x ^ 0x80) */
static Q_AVX512 int64_t row_sum_avx512(const uint8_t *x, int64_t n, bool u8)
{
    const __m512i flip = _mm512_set1_epi8(u8 ? 0 : (char)0x80), zero = _mm512_setzero_si512();
    __m512i acc = zero;
    for (int64_t i = 0; i < n; i += 64) {
        const __mmask64 m = n - i < 64 ? ((__mmask64)1 << (n - i)) - 1 : ~(__mmask64)0;
        const __m512i v = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + i), flip);
        acc = _mm512_add_epi64(acc, _mm512_sad_epu8(_mm512_maskz_mov_epi8(m, v), zero));
    }
    return _mm512_reduce_add_epi64(acc) - (u8 ? 0 : 128 * n);
}

static Q_AVX2 int64_t row_sum_avx2(const uint8_t *x, int64_t n, bool u8)
{
    const __m256i flip = _mm256_set1_epi8(u8 ? 0 : (char)0x80), zero = _mm256_setzero_si256();
    __m256i acc = zero;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        acc = _mm256_add_epi64(
            acc, _mm256_sad_epu8(
                     _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x + i)), flip), zero));
    int64_t sum = _mm256_extract_epi64(acc, 0) + _mm256_extract_epi64(acc, 1) +
                  _mm256_extract_epi64(acc, 2) + _mm256_extract_epi64(acc, 3) -
                  (u8 ? 0 : 128 * i);
    for (; i < n; i++)
        sum += u8 ? x[i] : (int8_t)x[i];
    return sum;
}
#endif

static void qsums_range(void *ctx, int64_t lo, int64_t hi)
{
    const qsums_job *j = ctx;
    if (j->last) { /* items: images; each position's c values added to the c sums */
        for (int64_t i = lo; i < hi; i++) {
            int64_t *sum = j->sums + i * j->c;
            const uint8_t *x = j->x + i * j->s * j->c;
            memset(sum, 0, sizeof(int64_t) * (size_t)j->c);
            for (int64_t k = 0; k < j->s; k++, x += j->c)
                if (j->u8)
                    for (int64_t ch = 0; ch < j->c; ch++)
                        sum[ch] += x[ch];
                else
                    for (int64_t ch = 0; ch < j->c; ch++)
                        sum[ch] += (int8_t)x[ch];
        }
        return;
    }
    for (int64_t r = lo; r < hi; r++) { /* items: (image, channel) rows of s values */
        const uint8_t *x = j->x + r * j->s;
#ifdef AI_Q_X86
        if (j->path >= AI_Q_VNNI) {
            j->sums[r] = row_sum_avx512(x, j->s, j->u8);
            continue;
        }
        if (j->path == AI_Q_AVX2) {
            j->sums[r] = row_sum_avx2(x, j->s, j->u8);
            continue;
        }
#endif
        int64_t sum = 0;
        if (j->u8)
            for (int64_t k = 0; k < j->s; k++)
                sum += x[k];
        else
            for (int64_t k = 0; k < j->s; k++)
                sum += (int8_t)x[k];
        j->sums[r] = sum;
    }
}

void ai_qsums(int64_t n, int64_t c, int64_t s, bool last, bool u8, const void *x,
              int64_t *sums)
{
    qsums_job j = {c, s, last, u8, x, sums, ai_q_path()};
    if (last)
        ai_parallel_for(n, ai_grain_of(s * c), qsums_range, &j);
    else
        ai_parallel_for(n * c, ai_grain_of(s), qsums_range, &j);
}
