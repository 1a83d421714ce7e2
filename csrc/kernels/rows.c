/*
 * rows.c — float32 softmax, log-softmax and sums along contiguous rows,
 * 16 lanes (AVX-512); see rows.h.
 *
 * One-node graphs of 64 x 64 x 128 floats along the last axis, 1 thread,
 * this machine (AMD EPYC, AVX-512): the references took 0.47 ms (softmax;
 * of it the exponentials alone 0.17, their max scalar and their double sum
 * a chain of 8-lane adds folded lane by lane) and 0.062 ms (a row sum).
 * Here a pass for the max, one for exp and the sum (softmax stores e), one
 * that scales e or writes (x - max) - log(sum): 0.28 ms; row sums 0.027 ms.
 */
#include "rows.h"

#include <math.h>

#include "fastmath.h"
#include "simd.h"

#ifdef AI_AVX512_KERNEL
#include <immintrin.h>

typedef int32_t v16_i32 __attribute__((vector_size(64)));
typedef double v8_f64 __attribute__((vector_size(64)));
typedef float v8_f32 __attribute__((vector_size(32)));
typedef double v4_f64 __attribute__((vector_size(32)));
typedef double v2_f64 __attribute__((vector_size(16)));
typedef ai_vec16_f32 v16;

/* helpers inlined into the kernels (compiled for the same target) */
#define V16_INLINE AI_AVX512_KERNEL static inline __attribute__((always_inline))
#define V16_LOAD(p) (*(const v16 *)(p))
#define V16_STORE(p, v) (*(v16 *)(p) = (v))
#define V16_SET1(s) ((v16){0} + (s))
/* lane by lane: m ? a : b (m a comparison's all-ones or zero lanes) */
#define V16_SELECT(m, a, b) ((v16)(((v16_i32)(a) & (m)) | ((v16_i32)(b) & ~(m))))

/* exp(x) for x <= 0 (x - max, a log-softmax output) or NaN: ai_expf's
 * reduction and polynomial with its products and sums fused (FMA);
 * below -86.64, 0; NaN stays NaN */
V16_INLINE v16 v16_exp_nonpositive(v16 x)
{
    const v16_i32 under = x < -86.64f;
    const v16 xc = V16_SELECT(under, V16_SET1(-86.64f), x);
    const v16 t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: rounds */
    const v16 n = t - 12582912.0f;
    v16 r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const v16 e = p * r * r + r + 1.0f;
    /* e 2^n (n in [-125, 0]: a normal float, the product exact) by one
     * scalef, 0 on the lanes under -86.64: the values of e * 2^(n - 1) * 2
     * by integer operations and two products, which took the time of 3 of
     * the 18 instructions here */
    const __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, (__m512)V16_SET1(-86.64f), _CMP_NLT_UQ);
    return (v16)_mm512_maskz_scalef_ps(keep, (__m512)e, (__m512)n);
}

/* the 16 lanes as two vectors of 8 doubles, added */
V16_INLINE v8_f64 v16_to_f64(v16 v)
{
    const v8_f32 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    const v8_f32 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    return __builtin_convertvector(lo, v8_f64) + __builtin_convertvector(hi, v8_f64);
}

V16_INLINE double v8_f64_sum(v8_f64 d)
{
    const v4_f64 a = __builtin_shufflevector(d, d, 0, 1, 2, 3) +
                     __builtin_shufflevector(d, d, 4, 5, 6, 7);
    const v2_f64 b = __builtin_shufflevector(a, a, 0, 1) + __builtin_shufflevector(a, a, 2, 3);
    return b[0] + b[1];
}

#define ROW_BLOCK 256 /* values per float block of a sum: 16 terms a lane */

/* the maximum of x[0, L), NaN skipped (-inf if all are NaN) */
V16_INLINE float row_max(const float *x, int64_t L)
{
    v16 m16 = V16_SET1(-INFINITY);
    int64_t l = 0;
    for (; l + 16 <= L; l += 16) {
        const v16 v = V16_LOAD(x + l);
        m16 = V16_SELECT(v > m16, v, m16);
    }
    /* the 16 lanes folded in halves (the rows are short: one by one, 16
     * dependent compares were a sizeable part of a row of 128) */
    const v16 h8 = __builtin_shufflevector(m16, m16, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3,
                                           4, 5, 6, 7);
    m16 = V16_SELECT(h8 > m16, h8, m16);
    const v16 h4 = __builtin_shufflevector(m16, m16, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8,
                                           9, 10, 11);
    m16 = V16_SELECT(h4 > m16, h4, m16);
    const v16 h2 = __builtin_shufflevector(m16, m16, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14,
                                           15, 12, 13);
    m16 = V16_SELECT(h2 > m16, h2, m16);
    float m = m16[1] > m16[0] ? m16[1] : m16[0];
    for (; l < L; l++)
        m = x[l] > m ? x[l] : m;
    return m;
}

AI_AVX512_KERNEL static void softmax_rows(float *y, const float *x, bool log_, int64_t R,
                                          int64_t L)
{
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * L;
        float *yr = y + r * L;
        const float m = row_max(xr, L);
        const v16 m16 = V16_SET1(m);
        v8_f64 s8 = {0};
        int64_t l = 0;
        while (l + 16 <= L) { /* e = exp(x - max), stored by softmax, and its sum */
            const int64_t end = l + ROW_BLOCK < L ? l + ROW_BLOCK : L;
            v16 s16 = {0};
            for (; l + 16 <= end; l += 16) {
                const v16 e = v16_exp_nonpositive(V16_LOAD(xr + l) - m16);
                if (!log_)
                    V16_STORE(yr + l, e);
                s16 += e;
            }
            s8 += v16_to_f64(s16);
        }
        double sum = v8_f64_sum(s8);
        for (; l < L; l++) {
            const float e = ai_expf(xr[l] - m);
            if (!log_)
                yr[l] = e;
            sum += e;
        }
        if (log_) {
            const float ls = (float)log(sum);
            for (l = 0; l < L; l++)
                yr[l] = (xr[l] - m) - ls;
        } else {
            const float inv = (float)(1.0 / sum);
            for (l = 0; l < L; l++)
                yr[l] *= inv;
        }
    }
}

/* the sum of x[0, L) */
V16_INLINE double row_sum(const float *x, int64_t L)
{
    v8_f64 s8 = {0};
    int64_t l = 0;
    while (l + 16 <= L) {
        const int64_t end = l + ROW_BLOCK < L ? l + ROW_BLOCK : L;
        v16 s16 = {0};
        for (; l + 16 <= end; l += 16)
            s16 += V16_LOAD(x + l);
        s8 += v16_to_f64(s16);
    }
    double sum = v8_f64_sum(s8);
    for (; l < L; l++)
        sum += x[l];
    return sum;
}

AI_AVX512_KERNEL static void logsoftmax_backward_rows(float *dx, const float *dy,
                                                      const float *y, bool assign, int64_t R,
                                                      int64_t L)
{
    for (int64_t r = 0; r < R; r++) {
        const float *dyr = dy + r * L, *yr = y + r * L;
        float *dxr = dx + r * L;
        const float s = (float)row_sum(dyr, L);
        const v16 s16 = V16_SET1(s);
        int64_t l = 0;
        for (; l + 16 <= L; l += 16) {
            const v16 g = V16_LOAD(dyr + l) - v16_exp_nonpositive(V16_LOAD(yr + l)) * s16;
            if (assign)
                V16_STORE(dxr + l, g);
            else
                V16_STORE(dxr + l, V16_LOAD(dxr + l) + g);
        }
        for (; l < L; l++) {
            const float g = dyr[l] - ai_expf(yr[l]) * s;
            dxr[l] = assign ? g : dxr[l] + g;
        }
    }
}

/* the sum of a[l] b[l] over [0, L): each product rounded to float (the
 * reference sums exact double products), in row_sum's blocks */
V16_INLINE double row_dot(const float *a, const float *b, int64_t L)
{
    v8_f64 s8 = {0};
    int64_t l = 0;
    while (l + 16 <= L) {
        const int64_t end = l + ROW_BLOCK < L ? l + ROW_BLOCK : L;
        v16 s16 = {0};
        for (; l + 16 <= end; l += 16) {
            const v16 p = V16_LOAD(a + l) * V16_LOAD(b + l);
            s16 += p;
        }
        s8 += v16_to_f64(s16);
    }
    double sum = v8_f64_sum(s8);
    for (; l < L; l++)
        sum += a[l] * b[l];
    return sum;
}

AI_AVX512_KERNEL static void softmax_backward_rows(float *dx, const float *dy, const float *y,
                                                   bool assign, int64_t R, int64_t L)
{
    for (int64_t r = 0; r < R; r++) {
        const float *dyr = dy + r * L, *yr = y + r * L;
        float *dxr = dx + r * L;
        const float s = (float)row_dot(dyr, yr, L);
        const v16 s16 = V16_SET1(s);
        int64_t l = 0;
        for (; l + 16 <= L; l += 16) {
            const v16 g = V16_LOAD(yr + l) * (V16_LOAD(dyr + l) - s16);
            if (assign)
                V16_STORE(dxr + l, g);
            else
                V16_STORE(dxr + l, V16_LOAD(dxr + l) + g);
        }
        for (; l < L; l++) {
            const float g = yr[l] * (dyr[l] - s);
            dxr[l] = assign ? g : dxr[l] + g;
        }
    }
}

AI_AVX512_KERNEL static void sum_rows(double *acc, const float *x, int64_t R, int64_t L)
{
    for (int64_t r = 0; r < R; r++)
        acc[r] += row_sum(x + r * L, L);
}

bool ai_softmax_rows_v16(float *y, const float *x, bool log_, int64_t R, int64_t L)
{
    if (!ai_cpu_avx512())
        return false;
    softmax_rows(y, x, log_, R, L);
    return true;
}

bool ai_logsoftmax_backward_rows_v16(float *dx, const float *dy, const float *y, bool assign,
                                     int64_t R, int64_t L)
{
    if (!ai_cpu_avx512())
        return false;
    logsoftmax_backward_rows(dx, dy, y, assign, R, L);
    return true;
}

bool ai_softmax_backward_rows_v16(float *dx, const float *dy, const float *y, bool assign,
                                  int64_t R, int64_t L)
{
    if (!ai_cpu_avx512())
        return false;
    softmax_backward_rows(dx, dy, y, assign, R, L);
    return true;
}

bool ai_sum_rows_v16(double *acc, const float *x, int64_t R, int64_t L)
{
    if (!ai_cpu_avx512())
        return false;
    sum_rows(acc, x, R, L);
    return true;
}

#else /* no 16-lane kernels in this build */

bool ai_softmax_rows_v16(float *y, const float *x, bool log_, int64_t R, int64_t L)
{
    (void)y, (void)x, (void)log_, (void)R, (void)L;
    return false;
}

bool ai_logsoftmax_backward_rows_v16(float *dx, const float *dy, const float *y, bool assign,
                                     int64_t R, int64_t L)
{
    (void)dx, (void)dy, (void)y, (void)assign, (void)R, (void)L;
    return false;
}

bool ai_softmax_backward_rows_v16(float *dx, const float *dy, const float *y, bool assign,
                                  int64_t R, int64_t L)
{
    (void)dx, (void)dy, (void)y, (void)assign, (void)R, (void)L;
    return false;
}

bool ai_sum_rows_v16(double *acc, const float *x, int64_t R, int64_t L)
{
    (void)acc, (void)x, (void)R, (void)L;
    return false;
}

#endif
