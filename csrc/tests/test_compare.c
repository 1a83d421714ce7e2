/* test_compare.c — ai_compare: the assert_close rule, NaN and inf, strides,
 * dtypes, empty and 0-d tensors, errors. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../aidge.h"
#include "ctest.h"

/* A borrowed 1-d (or shaped) view over a caller's buffer. */
static ai_tensor *view(void *data, ai_dtype dt, int ndim, const int64_t *shape,
                       const int64_t *strides)
{
    ai_tensor *t = NULL;
    CHECK_OK(ai_tensor_borrow(&t, data, dt, ndim, shape, strides, 0, false, NULL, NULL));
    return t;
}

static ai_compare_result run(const ai_tensor *a, const ai_tensor *e, double rtol,
                             double atol, bool equal_nan)
{
    ai_compare_result r;
    memset(&r, 0xff, sizeof r);
    CHECK_OK(ai_compare(a, e, rtol, atol, equal_nan, &r));
    return r;
}

TEST(identical_tensors_have_no_mismatch)
{
    float x[6] = {1, -2, 3.5f, 0, 1e-30f, -7};
    int64_t shape[] = {2, 3};
    ai_tensor *a = view(x, AI_F32, 2, shape, NULL);
    ai_compare_result r = run(a, a, 0, 0, false);
    CHECK(r.numel == 6 && r.mismatches == 0);
    CHECK(r.max_abs_diff == 0 && r.max_rel_diff == 0);
    CHECK(r.max_abs_index == 0 && r.max_rel_index == 0);
    ai_tensor_free(a);
}

TEST(tolerance_rule_is_atol_plus_rtol_times_expected)
{
    /* allowed = 0.1 + 0.01 * |e|: 0.2 at e=10, 1.1 at e=100 */
    double e[5] = {10, 10, 100, 100, 0};
    double a[5] = {10.19, 10.21, 101.0, 98.8, 0.05};
    int64_t shape[] = {5};
    ai_tensor *ta = view(a, AI_F64, 1, shape, NULL), *te = view(e, AI_F64, 1, shape, NULL);
    ai_compare_result r = run(ta, te, 0.01, 0.1, false);
    CHECK(r.numel == 5);
    CHECK(r.mismatches == 2); /* 10.21 and 98.8 */
    /* greatest over the mismatches: 1.2 at 3 (not 1.0 at 2, which passes) */
    CHECK_CLOSE(r.max_abs_diff, 1.2, 1e-12);
    CHECK(r.max_abs_index == 3);
    CHECK_CLOSE(r.max_rel_diff, 0.21 / 10, 1e-12);
    CHECK(r.max_rel_index == 1);
    /* with a wider tolerance everything passes: maxima over all elements,
     * including the relative difference inf of 0.05 against 0 */
    r = run(ta, te, 0.05, 0.1, false);
    CHECK(r.mismatches == 0);
    CHECK_CLOSE(r.max_abs_diff, 1.2, 1e-12);
    CHECK(r.max_abs_index == 3);
    CHECK(isinf(r.max_rel_diff) && r.max_rel_index == 4);
    ai_tensor_free(ta);
    ai_tensor_free(te);
}

TEST(nan_is_a_mismatch_unless_equal_nan)
{
    float a[4] = {1, NAN, NAN, 2};
    float e[4] = {1, NAN, 3, 2.5f};
    int64_t shape[] = {4};
    ai_tensor *ta = view(a, AI_F32, 1, shape, NULL), *te = view(e, AI_F32, 1, shape, NULL);
    ai_compare_result r = run(ta, te, 0, 0, false);
    CHECK(r.mismatches == 3);
    CHECK(isnan(r.max_abs_diff) && r.max_abs_index == 1); /* NaN is the greatest */
    CHECK(isnan(r.max_rel_diff) && r.max_rel_index == 1);
    r = run(ta, te, 0, 0, true);
    CHECK(r.mismatches == 2); /* NaN vs 3, 2 vs 2.5 */
    CHECK(isnan(r.max_abs_diff) && r.max_abs_index == 2);
    /* a NaN never passes on tolerance, however wide */
    r = run(ta, te, 1e30, 1e30, true);
    CHECK(r.mismatches == 1 && r.max_abs_index == 2);
    ai_tensor_free(ta);
    ai_tensor_free(te);
}

TEST(infinities_must_match_exactly)
{
    double a[5] = {INFINITY, -INFINITY, INFINITY, 1.0, 1e308};
    double e[5] = {INFINITY, -INFINITY, -INFINITY, INFINITY, -1e308};
    int64_t shape[] = {5};
    ai_tensor *ta = view(a, AI_F64, 1, shape, NULL), *te = view(e, AI_F64, 1, shape, NULL);
    /* rtol * |inf| = inf would let 1 pass against inf: it must not; nor the
     * finite pair whose difference overflows to inf */
    ai_compare_result r = run(ta, te, 1e-3, 1e-3, true);
    CHECK(r.mismatches == 3);
    CHECK(isinf(r.max_abs_diff) && r.max_abs_index == 2);
    /* inf / inf is NaN, the greatest, as in torch */
    CHECK(isnan(r.max_rel_diff) && r.max_rel_index == 2);
    ai_tensor_free(ta);
    ai_tensor_free(te);
}

TEST(empty_and_zero_dim)
{
    int64_t shape[] = {3, 0};
    ai_tensor *ea = view(NULL, AI_F32, 2, shape, NULL), *ee = view(NULL, AI_F32, 2, shape, NULL);
    ai_compare_result r = run(ea, ee, 0, 0, false);
    CHECK(r.numel == 0 && r.mismatches == 0);
    CHECK(r.max_abs_index == -1 && r.max_rel_index == -1);
    CHECK(r.max_abs_diff == 0 && r.max_rel_diff == 0);
    ai_tensor_free(ea);
    ai_tensor_free(ee);

    double x = 2.0, y = 2.5;
    ai_tensor *sa = view(&x, AI_F64, 0, NULL, NULL), *se = view(&y, AI_F64, 0, NULL, NULL);
    r = run(sa, se, 0, 0.1, false);
    CHECK(r.numel == 1 && r.mismatches == 1);
    CHECK(r.max_abs_diff == 0.5 && r.max_abs_index == 0);
    CHECK(r.max_rel_diff == 0.2 && r.max_rel_index == 0);
    ai_tensor_free(sa);
    ai_tensor_free(se);
}

TEST(strided_views_use_logical_flat_indices)
{
    /* a: 3x4 row-major; e: the same values stored transposed (4x3) and
     * viewed back as 3x4, plus a reversed view of rows */
    float a[12], et[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            a[i * 4 + j] = (float)(i * 4 + j);
            et[j * 3 + i] = (float)(i * 4 + j);
        }
    et[3 * 3 + 1] += 0.5f; /* logical (1, 3): flat 7 */
    int64_t shape[] = {3, 4}, tstrides[] = {1, 3};
    ai_tensor *ta = view(a, AI_F32, 2, shape, NULL), *te = view(et, AI_F32, 2, shape, tstrides);
    ai_compare_result r = run(ta, te, 0, 0, false);
    CHECK(r.mismatches == 1);
    CHECK(r.max_abs_diff == 0.5 && r.max_abs_index == 7);
    ai_tensor_free(te);

    /* rows reversed through a negative stride: logical (0, j) is et row 2 */
    float rev[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            rev[(2 - i) * 4 + j] = a[i * 4 + j];
    rev[2 * 4 + 2] = -1.0f; /* logical (0, 2): flat 2 */
    int64_t rstrides[] = {-4, 1};
    te = view(rev + 8, AI_F32, 2, shape, rstrides);
    r = run(ta, te, 0, 0, false);
    CHECK(r.mismatches == 1 && r.max_abs_index == 2 && r.max_abs_diff == 3.0);
    ai_tensor_free(ta);
    ai_tensor_free(te);
}

TEST(float16_and_integer_dtypes)
{
    uint16_t ha[3] = {ai_f32_to_f16(1.0f), ai_f32_to_f16(2.0f), 0x7c00u /* +inf */};
    uint16_t he[3] = {ai_f32_to_f16(1.0f), ai_f32_to_f16(2.5f), 0x7c00u};
    int64_t shape[] = {3};
    ai_tensor *ta = view(ha, AI_F16, 1, shape, NULL), *te = view(he, AI_F16, 1, shape, NULL);
    ai_compare_result r = run(ta, te, 0, 0, false);
    CHECK(r.mismatches == 1 && r.max_abs_diff == 0.5 && r.max_abs_index == 1);
    ai_tensor_free(ta);
    ai_tensor_free(te);

    /* |INT64_MAX - INT64_MIN| overflows int64: it must come out as 2^64 - 1 */
    int64_t ia[3] = {INT64_MAX, 5, 7}, ie[3] = {INT64_MIN, 5, 9};
    ta = view(ia, AI_I64, 1, shape, NULL);
    te = view(ie, AI_I64, 1, shape, NULL);
    r = run(ta, te, 0, 1.5, false);
    CHECK(r.mismatches == 2);
    CHECK(r.max_abs_diff == 18446744073709551615.0 && r.max_abs_index == 0);
    CHECK(r.max_rel_index == 0 && r.max_rel_diff == 2.0);
    ai_tensor_free(ta);
    ai_tensor_free(te);

    int8_t ba[3] = {-128, 0, 127}, be[3] = {127, 0, 127};
    ta = view(ba, AI_I8, 1, shape, NULL);
    te = view(be, AI_I8, 1, shape, NULL);
    r = run(ta, te, 0, 0, false);
    CHECK(r.mismatches == 1 && r.max_abs_diff == 255.0 && r.max_abs_index == 0);
    ai_tensor_free(ta);
    ai_tensor_free(te);
}

TEST(mismatched_metadata_and_bad_tolerances_are_errors)
{
    float x[6] = {0};
    double y[6] = {0};
    int64_t s23[] = {2, 3}, s32[] = {3, 2}, s6[] = {6};
    ai_tensor *a = view(x, AI_F32, 2, s23, NULL), *b = view(x, AI_F32, 2, s32, NULL);
    ai_tensor *c = view(x, AI_F32, 1, s6, NULL), *d = view(y, AI_F64, 2, s23, NULL);
    ai_compare_result r;
    CHECK(ai_compare(a, b, 0, 0, false, &r) == AI_ERR_VALUE);
    CHECK(strstr(ai_last_error(), "shapes differ: actual is (2, 3), expected is (3, 2)"));
    CHECK(ai_compare(c, a, 0, 0, false, &r) == AI_ERR_VALUE);
    CHECK(strstr(ai_last_error(), "actual is (6,), expected is (2, 3)"));
    CHECK(ai_compare(a, d, 0, 0, false, &r) == AI_ERR_VALUE);
    CHECK(strstr(ai_last_error(), "dtypes differ: actual is float32, expected is float64"));
    CHECK(ai_compare(a, a, -1e-3, 0, false, &r) == AI_ERR_VALUE);
    CHECK(ai_compare(a, a, 0, NAN, false, &r) == AI_ERR_VALUE);
    CHECK(strstr(ai_last_error(), "must be >= 0"));
    ai_tensor_free(a);
    ai_tensor_free(b);
    ai_tensor_free(c);
    ai_tensor_free(d);
}

const ctest_case compare_cases[] = {
    CASE(identical_tensors_have_no_mismatch),
    CASE(tolerance_rule_is_atol_plus_rtol_times_expected),
    CASE(nan_is_a_mismatch_unless_equal_nan),
    CASE(infinities_must_match_exactly),
    CASE(empty_and_zero_dim),
    CASE(strided_views_use_logical_flat_indices),
    CASE(float16_and_integer_dtypes),
    CASE(mismatched_metadata_and_bad_tolerances_are_errors),
    {NULL, NULL},
};
