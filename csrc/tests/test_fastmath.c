/*
 * test_fastmath.c — kernels/fastmath.h against libm in double: ai_expf (and
 * ai_expf_fma) within 2 ulp over its whole normal range (a strided sweep of every float bit
 * pattern there), its saturation and special values; ai_tanhf and ai_erff
 * likewise; ai_gelu_erff and ai_gelu_erf_gradf against Gelu and its
 * derivative in double.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../aidge.h"
#include "../kernels/fastmath.h"
#include "ctest.h"

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* |got - want| in units of the float spacing at want */
static double ulps(float got, double want)
{
    const double spacing = nextafterf((float)fabs(want), INFINITY) - (float)fabs(want);
    return fabs((double)got - want) / spacing;
}

TEST(expf_within_2_ulp_and_saturates)
{
    double worst = 0;
    for (uint64_t b = 0; b < UINT64_C(1) << 32; b += 997) { /* every sign and exponent */
        const float x = from_bits((uint32_t)b);
        if (!(x >= -86.64f && x <= 88.72283f))
            continue;
        const double u = ulps(ai_expf(x), exp((double)x));
        worst = u > worst ? u : worst;
    }
    CHECK(worst <= 2.0);
    worst = 0;
    for (uint64_t b = 0; b < UINT64_C(1) << 32; b += 997) { /* the same by fmaf() */
        const float x = from_bits((uint32_t)b);
        if (!(x >= -86.64f && x <= 88.72283f))
            continue;
        const double u = ulps(ai_expf_fma(x), exp((double)x));
        worst = u > worst ? u : worst;
    }
    CHECK(worst <= 2.0);
    CHECK(ai_expf_fma(0.0f) == 1.0f && ai_expf_fma(INFINITY) == INFINITY &&
          ai_expf_fma(-INFINITY) == 0.0f && isnan(ai_expf_fma(NAN)));
    CHECK(ai_expf(0.0f) == 1.0f && ai_expf(-0.0f) == 1.0f);
    CHECK(ai_expf(88.8f) == INFINITY && ai_expf(INFINITY) == INFINITY);
    CHECK(ai_expf(-86.7f) == 0.0f && ai_expf(-INFINITY) == 0.0f && ai_expf(-1e30f) == 0.0f);
    CHECK(isnan(ai_expf(NAN)) && isnan(ai_expf(-NAN)));
}

TEST(tanhf_within_a_few_ulp)
{
    double worst = 0;
    for (uint64_t b = 0; b < UINT64_C(1) << 32; b += 997) {
        const float x = from_bits((uint32_t)b);
        if (!isfinite(x) || fabsf(x) < 1e-30f)
            continue;
        const double u = ulps(ai_tanhf(x), tanh((double)x));
        worst = u > worst ? u : worst;
    }
    CHECK(worst <= 4.0);
    CHECK(ai_tanhf(INFINITY) == 1.0f && ai_tanhf(-INFINITY) == -1.0f && isnan(ai_tanhf(NAN)));
}

TEST(erff_within_8_ulp)
{
    double worst = 0;
    for (uint64_t b = 0; b < UINT64_C(1) << 32; b += 997) {
        const float x = from_bits((uint32_t)b);
        if (!isfinite(x) || fabsf(x) < 1e-30f)
            continue;
        const double u = ulps(ai_erff(x), erf((double)x));
        worst = u > worst ? u : worst;
        CHECK(fabsf(ai_erff(x)) <= 1.0f);
    }
    CHECK(worst <= 8.0);
    CHECK(ai_erff(0.0f) == 0.0f && signbit(ai_erff(-0.0f)));
    CHECK(ai_erff(INFINITY) == 1.0f && ai_erff(-INFINITY) == -1.0f && isnan(ai_erff(NAN)));
}

/* against x/2 (1 + erf(x / sqrt 2)) in double: within 1.5e-6 max(|Gelu|, 1)
 * (its bound: 1e-6, where torch's formula with ai_erff is 1.2e-6) */
TEST(gelu_erff_against_double)
{
    double worst = 0;
    for (uint64_t b = 0; b < UINT64_C(1) << 32; b += 997) {
        const float x = from_bits((uint32_t)b);
        if (!isfinite(x) || fabsf(x) > 1e30f)
            continue;
        const double ref = 0.5 * (double)x * (1 + erf((double)x * 0.70710678118654752440));
        const double e = fabs(ai_gelu_erff(x) - ref) / fmax(fabs(ref), 1.0);
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= 1.5e-6);
    CHECK(ai_gelu_erff(0.0f) == 0.0f && ai_gelu_erff(-6.0f) == 0.0f &&
          ai_gelu_erff(-1e30f) == 0.0f && ai_gelu_erff(1e30f) == 1e30f);
    CHECK(ai_gelu_erff(INFINITY) == INFINITY && isnan(ai_gelu_erff(-INFINITY)) &&
          isnan(ai_gelu_erff(NAN)));
}

/* Gelu's derivative against Phi(x) + x phi(x) in double: within 1e-6
 * max(|x phi(x)|, 1) over [-12, 12] in steps of 1e-5 and on a sample of every
 * float; 0 or 1 far out, NaN at +-inf and NaN as the formula gives */
TEST(gelu_erf_gradf_against_double)
{
    double worst = 0;
    for (int64_t i = -1200000; i <= 1200000; i++) {
        const float x = (float)((double)i * 1e-5);
        const double xd = x, xphi = xd * exp(-0.5 * xd * xd) * 0.39894228040143267794;
        const double ref = 0.5 * (1 + erf(xd * 0.70710678118654752440)) + xphi;
        const double e = fabs(ai_gelu_erf_gradf(x) - ref) / fmax(fabs(xphi), 1.0);
        worst = e > worst ? e : worst;
    }
    for (uint64_t b = 0; b < UINT64_C(1) << 32; b += 997) {
        const float x = from_bits((uint32_t)b);
        if (!isfinite(x))
            continue;
        const double xd = x, xphi = xd * exp(-0.5 * xd * xd) * 0.39894228040143267794;
        const double ref = 0.5 * (1 + erf(xd * 0.70710678118654752440)) + xphi;
        const double e = fabs(ai_gelu_erf_gradf(x) - ref) / fmax(fabs(xphi), 1.0);
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= 1e-6);
    CHECK(ai_gelu_erf_gradf(0.0f) == 0.5f && ai_gelu_erf_gradf(-20.0f) == 0.0f &&
          ai_gelu_erf_gradf(20.0f) == 1.0f && ai_gelu_erf_gradf(1e30f) == 1.0f);
    CHECK(isnan(ai_gelu_erf_gradf(INFINITY)) && isnan(ai_gelu_erf_gradf(-INFINITY)) &&
          isnan(ai_gelu_erf_gradf(NAN)));
}

const ctest_case fastmath_cases[] = {
    CASE(expf_within_2_ulp_and_saturates),
    CASE(tanhf_within_a_few_ulp),
    CASE(erff_within_8_ulp),
    CASE(gelu_erff_against_double),
    CASE(gelu_erf_gradf_against_double),
    {NULL, NULL},
};
