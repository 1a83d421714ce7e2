/*
 * fastmath.h — float32 exp, tanh and erf written without branches or library
 * calls, so that loops calling them vectorise (glibc's are scalar calls).
 *
 * ai_expf: Cephes' degree-6 polynomial on [-ln2/2, ln2/2] after the range
 * reduction x = n ln2 + r (ln2 split in two), scaled by 2^n through the
 * exponent bits: within 2 ulp of exp over the normal range. exp(+inf) = inf,
 * exp(-inf) = 0, NaN stays NaN; results below 2^-125 (x < -86.64) are 0
 * instead of denormals. ai_expf_fma: the same by fmaf() (for
 * AI_WIDE_FMA_CLONES: 7 operations fewer), within 2 ulp too.
 *
 * ai_tanhf: an odd polynomial (Cephes' tanhf coefficients) for |x| < 0.625,
 * else sign(x) (1 - 2 / (exp(2|x|) + 1)) with ai_expf: within a few ulp of
 * tanh; +-1 beyond |x| = 9.01 (as float32 tanh), NaN stays NaN.
 *
 * ai_erff: erf(x) = x P(x^2) / Q(x^2) on |x| <= 3.92 (degrees 6 and 4, fitted
 * here for relative error, 7e-8 in exact arithmetic), +-1 beyond, where
 * float32 erf rounds to +-1. Measured against double erf over [-10, 10] in
 * steps of 1e-5: within 7 ulp (4e-7 relative); NaN stays NaN.
 *
 * ai_gelu_erff: Gelu(x) = x/2 (1 + erf(x / sqrt 2)) as h + h r, h = x/2,
 * r = x A(x^2) / B(x^2): ai_erff's fraction with 1/sqrt 2 folded into its
 * coefficients, |x| clamped at 3.92 sqrt 2 and r at +-1 (exactly +-1 there),
 * by fmaf() (for AI_WIDE_FMA_CLONES: 16 operations a value, torch's formula
 * with ai_erff 21). Over [-12, 12] in steps of 1e-5 its error is within
 * 1e-6 max(|Gelu(x)|, 1) (torch's formula with ai_erff: 1.2e-6); NaN stays
 * NaN, -inf gives NaN as torch's formula does, x below -5.55 gives +0.
 * ai_gelu_erf_gradf: its derivative with the same fraction and ai_expf_fma.
 */
#ifndef AI_FASTMATH_H
#define AI_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ai_expf's body; fused: its multiply-adds by fmaf (ai_expf_fma), else a
 * product and a sum each (a constant where it is inlined) */
static inline __attribute__((always_inline)) float ai_expf_by(float x, int fused)
{
#define AI_MADD_(a, b, c) (fused ? fmaf((a), (b), (c)) : (a) * (b) + (c))
    const float hi = 88.72283f, lo = -86.64f;
    float xc = hi < x ? hi : x; /* min and max that keep a NaN: one instruction each */
    xc = lo > xc ? lo : xc;
    const float t = AI_MADD_(xc, 1.44269504088896341f, 12582912.0f); /* 1.5 * 2^23: rounds */
    const float n = t - 12582912.0f;
    float r = AI_MADD_(-n, 0.693359375f, xc);
    r = AI_MADD_(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = AI_MADD_(p, r, 1.3981999507e-3f);
    p = AI_MADD_(p, r, 8.3334519073e-3f);
    p = AI_MADD_(p, r, 4.1665795894e-2f);
    p = AI_MADD_(p, r, 1.6666665459e-1f);
    p = AI_MADD_(p, r, 5.0000001201e-1f);
    const float e = AI_MADD_(p * r, r, r) + 1.0f;
#undef AI_MADD_
    /* n, in [-125, 128], is the low bits of t: 2^(n-1) built from them without a
     * float -> int conversion (which a NaN would make undefined) */
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const uint32_t bits = (tb - UINT32_C(0x4B400000) + 126u) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    float res = e * s * 2.0f; /* NaN in, NaN out (through e) */
    res = x > hi ? (float)INFINITY : res;
    return x < lo ? 0.0f : res;
}

static inline float ai_expf(float x)
{
    return ai_expf_by(x, 0);
}

/* for the kernels of AI_WIDE_FMA_CLONES */
static inline float ai_expf_fma(float x)
{
    return ai_expf_by(x, 1);
}

static inline float ai_tanhf(float x)
{
    const float a = fabsf(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = p * z * x + x;
    const float big = 1.0f - 2.0f / (ai_expf(2.0f * (a < 9.1f ? a : 9.1f)) + 1.0f);
    const float r = a < 0.625f ? small : copysignf(big, x);
    return x == x ? r : x;
}

static inline float ai_erff(float x)
{
    float c = x < 3.92f ? x : 3.92f;
    c = c > -3.92f ? c : -3.92f;
    const float y = c * c;
    float p = 2.010060088e-08f;
    p = p * y - 1.952718516e-06f;
    p = p * y + 1.389690573e-04f;
    p = p * y + 3.572492194e-03f;
    p = p * y + 5.015901048e-02f;
    p = p * y + 1.968408735e-01f;
    p = p * y + 1.128379136e+00f;
    float q = 9.254776588e-04f;
    q = q * y + 1.408832580e-02f;
    q = q * y + 1.137187244e-01f;
    q = q * y + 5.077777676e-01f;
    q = q * y + 1.0f;
    float r = c * p / q;
    r = r < 1.0f ? r : 1.0f; /* the rounding of p / q can pass 1 by 2 ulp */
    r = r > -1.0f ? r : -1.0f;
    r = x < 3.92f ? r : 1.0f; /* float32 erf is 1 there */
    r = x > -3.92f ? r : -1.0f;
    return x == x ? r : x;
}

/* erf(x / sqrt 2) as x A(x^2) / B(x^2) by fmaf (ai_gelu_erff's fraction),
 * |x| clamped at 3.92 sqrt 2 and the result at +-1; NaN stays NaN */
static inline float ai_erf_sqrt1_2f(float x)
{
    /* the comparisons keep a NaN x (it is their second operand: maxps, minps) */
    float c = x > 5.54371738f ? 5.54371738f : x;
    c = c < -5.54371738f ? -5.54371738f : c;
    const float y = c * c;
    float a = 2.220823664e-10f;
    a = fmaf(a, y, -4.314939162e-08f);
    a = fmaf(a, y, 6.141622634e-06f);
    a = fmaf(a, y, 3.157666943e-04f);
    a = fmaf(a, y, 8.866944350e-03f);
    a = fmaf(a, y, 6.959375739e-02f);
    a = fmaf(a, y, 7.978845239e-01f);
    float b = 5.784235327e-05f;
    b = fmaf(b, y, 1.761040767e-03f);
    b = fmaf(b, y, 2.842968144e-02f);
    b = fmaf(b, y, 2.538888752e-01f);
    b = fmaf(b, y, 1.0f);
    float r = c * a / b;
    r = r > 1.0f ? 1.0f : r;
    return r < -1.0f ? -1.0f : r;
}

static inline float ai_gelu_erff(float x)
{
    const float h = 0.5f * x;
    return fmaf(h, ai_erf_sqrt1_2f(x), h);
}

/* Gelu's derivative Phi(x) + x phi(x) = (1 + erf(x / sqrt 2)) / 2 +
 * x exp(-x^2 / 2) / sqrt(2 pi), by ai_erf_sqrt1_2f and ai_expf_fma (for
 * AI_WIDE_FMA_CLONES). Over [-12, 12] in steps of 1e-5 within 1e-6
 * max(|x| phi(x), 1) of the double formula, as torch's float formula;
 * NaN stays NaN, -inf gives NaN (-inf * 0) as torch's formula does. */
static inline float ai_gelu_erf_gradf(float x)
{
    const float e = ai_expf_fma(-0.5f * x * x) * 0.398942280401432678f;
    return fmaf(0.5f, ai_erf_sqrt1_2f(x), fmaf(x, e, 0.5f));
}

#endif
