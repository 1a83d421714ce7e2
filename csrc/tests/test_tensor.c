/* test_tensor.c — tensors, storage lifetime, strides, dtype conversion. */
#include <stdint.h>
#include <string.h>

#include "../aidge.h"
#include "ctest.h"

TEST(new_is_zeroed_contiguous_and_aligned)
{
    int64_t shape[] = {2, 3, 4};
    ai_tensor *t;
    CHECK_OK(ai_tensor_new(&t, AI_F32, 3, shape));
    CHECK(ai_tensor_numel(t) == 24);
    CHECK(ai_tensor_nbytes(t) == 96);
    CHECK(t->strides[0] == 12 && t->strides[1] == 4 && t->strides[2] == 1);
    CHECK(ai_tensor_is_contiguous(t));
    CHECK(((uintptr_t)t->data % AI_ALIGN) == 0);
    const float *f = t->data;
    for (int i = 0; i < 24; i++)
        CHECK(f[i] == 0.0f);
    ai_tensor_free(t);
}

TEST(scalar_and_empty)
{
    ai_tensor *s, *e;
    CHECK_OK(ai_tensor_new(&s, AI_F64, 0, NULL));
    CHECK(ai_tensor_numel(s) == 1);
    CHECK(ai_tensor_is_contiguous(s));
    *(double *)s->data = 2.5;
    CHECK(ai_tensor_get_flat(s, 0) == 2.5);
    int64_t shape[] = {3, 0, 5};
    CHECK_OK(ai_tensor_new(&e, AI_I64, 3, shape));
    CHECK(ai_tensor_numel(e) == 0);
    CHECK(ai_tensor_nbytes(e) == 0);
    CHECK(!ai_tensor_overlaps(e));
    ai_tensor *c;
    CHECK_OK(ai_tensor_clone(&c, e));
    CHECK(c->ndim == 3 && c->shape[1] == 0);
    ai_tensor_free(c);
    ai_tensor_free(s);
    ai_tensor_free(e);
}

TEST(bad_shapes_are_errors)
{
    ai_tensor *t = (ai_tensor *)1;
    int64_t neg[] = {2, -1};
    CHECK(ai_tensor_new(&t, AI_F32, 2, neg) == AI_ERR_VALUE);
    CHECK(t == NULL);
    CHECK(strstr(ai_last_error(), "negative") != NULL);
    int64_t huge[] = {INT64_C(1) << 40, INT64_C(1) << 40};
    CHECK(ai_tensor_new(&t, AI_F32, 2, huge) == AI_ERR_NOMEM);
    int64_t big[] = {INT64_C(1) << 61};
    CHECK(ai_tensor_new(&t, AI_F64, 1, big) == AI_ERR_NOMEM);
    int64_t one[] = {1};
    CHECK(ai_tensor_new(&t, AI_F32, AI_MAX_DIMS + 1, one) == AI_ERR_VALUE);
    CHECK(ai_tensor_new(&t, (ai_dtype)99, 1, one) == AI_ERR_TYPE);
    ai_dtype dt;
    CHECK(ai_dtype_from_name("complex64", &dt) == AI_ERR_TYPE);
    CHECK_OK(ai_dtype_from_name("int16", &dt));
    CHECK(dt == AI_I16);
}

static int released;
static void count_release(void *ctx) { released += *(int *)ctx; }

TEST(borrow_releases_once_after_last_share)
{
    float buf[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[] = {2, 3};
    int one = 1;
    released = 0;
    ai_tensor *a, *b;
    CHECK_OK(ai_tensor_borrow(&a, buf, AI_F32, 2, shape, NULL, 0, false,
                              count_release, &one));
    CHECK(a->data == buf);
    CHECK_OK(ai_tensor_share(&b, a));
    ai_tensor_free(a);
    CHECK(released == 0);
    CHECK(ai_tensor_get_flat(b, 4) == 4.0);
    ai_tensor_free(b);
    CHECK(released == 1);
}

TEST(borrow_failure_still_releases)
{
    float buf[4];
    int64_t shape[] = {2, 2}, strides[] = {0, 1};
    int one = 1;
    released = 0;
    ai_tensor *a;
    CHECK(ai_tensor_borrow(&a, buf, AI_F32, 2, shape, strides, 0, false,
                           count_release, &one) == AI_ERR_VALUE);
    CHECK(released == 1);
    CHECK(strstr(ai_last_error(), "more than once") != NULL);
    /* the same view is accepted when overlap is allowed (read-only broadcast) */
    CHECK_OK(ai_tensor_borrow(&a, buf, AI_F32, 2, shape, strides,
                              AI_TENSOR_READONLY, true, count_release, &one));
    ai_tensor_free(a);
    CHECK(released == 2);
}

TEST(overlap_detection)
{
    ai_tensor t = {.dtype = AI_F32, .ndim = 2, .shape = {3, 4}};
    int64_t cases[][2] = {{4, 1}, {1, 3}, {-4, 1}, {4, -1}, {8, 2}};
    for (int i = 0; i < 5; i++) {
        t.strides[0] = cases[i][0];
        t.strides[1] = cases[i][1];
        CHECK(!ai_tensor_overlaps(&t));
    }
    int64_t bad[][2] = {{0, 1}, {2, 1}, {1, 1}, {3, 0}};
    for (int i = 0; i < 4; i++) {
        t.strides[0] = bad[i][0];
        t.strides[1] = bad[i][1];
        CHECK(ai_tensor_overlaps(&t));
    }
    t.shape[0] = 1; /* a stride of a size-1 dimension never matters */
    t.strides[0] = 0;
    t.strides[1] = 1;
    CHECK(!ai_tensor_overlaps(&t));
}

TEST(strided_copy_negative_and_transposed)
{
    /* a 3x4 matrix viewed with rows reversed, then transposed */
    float buf[12];
    for (int i = 0; i < 12; i++)
        buf[i] = (float)i;
    int64_t shape[] = {4, 3}, strides[] = {1, -4};
    ai_tensor *v, *c;
    CHECK_OK(ai_tensor_borrow(&v, buf + 8, AI_F32, 2, shape, strides, 0, false,
                              NULL, NULL));
    CHECK(!ai_tensor_is_contiguous(v));
    CHECK_OK(ai_tensor_clone(&c, v));
    CHECK(ai_tensor_is_contiguous(c));
    const float *o = c->data;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            CHECK(o[i * 3 + j] == buf[(2 - j) * 4 + i]);
    ai_tensor_free(v);
    ai_tensor_free(c);
}

TEST(strided_copy_expanded_and_row_paths)
{
    /* a column of 3 doubles expanded to (2, 3, 4): strides 0, 1, 0 */
    double col[] = {1.5, -2.0, 7.25};
    int64_t shape[] = {2, 3, 4}, expanded[] = {0, 1, 0};
    ai_tensor *v, *c;
    CHECK_OK(ai_tensor_borrow(&v, col, AI_F64, 3, shape, expanded, 0, true, NULL, NULL));
    CHECK_OK(ai_tensor_clone(&c, v));
    const double *o = c->data;
    for (int i = 0; i < 24; i++)
        CHECK(o[i] == col[(i / 4) % 3]);
    ai_tensor_free(v);
    ai_tensor_free(c);
    /* every other row of a (4, 5) int32 matrix: rows contiguous, a memcpy each */
    int32_t m[20];
    for (int i = 0; i < 20; i++)
        m[i] = i * 3 - 7;
    int64_t rows_shape[] = {2, 5}, rows_strides[] = {10, 1};
    CHECK_OK(ai_tensor_borrow(&v, m, AI_I32, 2, rows_shape, rows_strides, 0, false, NULL,
                              NULL));
    CHECK_OK(ai_tensor_clone(&c, v));
    const int32_t *r = c->data;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++)
            CHECK(r[i * 5 + j] == m[i * 10 + j]);
    ai_tensor_free(v);
    ai_tensor_free(c);
}

TEST(dtype_conversion)
{
    double src[] = {-1.5, 0.0, 2.75, 300.0, -200.0, 1e30, NAN};
    int64_t shape[] = {7};
    ai_tensor *s, *i8, *f16, *b;
    CHECK_OK(ai_tensor_borrow(&s, src, AI_F64, 1, shape, NULL, 0, false, NULL, NULL));
    CHECK_OK(ai_tensor_new(&i8, AI_I32, 1, shape));
    CHECK_OK(ai_tensor_copy(i8, s));
    const int32_t *iv = i8->data;
    CHECK(iv[0] == -1 && iv[1] == 0 && iv[2] == 2 && iv[3] == 300);
    CHECK(iv[4] == -200 && iv[6] == 0); /* NaN -> 0, never UB */
    CHECK_OK(ai_tensor_new(&f16, AI_F16, 1, shape));
    CHECK_OK(ai_tensor_copy(f16, s));
    CHECK(ai_tensor_get_flat(f16, 2) == 2.75);
    CHECK(ai_tensor_get_flat(f16, 5) == INFINITY);
    CHECK(isnan(ai_tensor_get_flat(f16, 6)));
    CHECK_OK(ai_tensor_new(&b, AI_BOOL, 1, shape));
    CHECK_OK(ai_tensor_copy(b, s));
    const uint8_t *bv = b->data;
    CHECK(bv[0] == 1 && bv[1] == 0 && bv[2] == 1);
    ai_tensor_free(s);
    ai_tensor_free(i8);
    ai_tensor_free(f16);
    ai_tensor_free(b);
}

TEST(f16_round_trip_exhaustive)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ai_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        CHECK(ai_f32_to_f16(f) == h);
    }
    CHECK(ai_f16_to_f32(0x3c00) == 1.0f);
    CHECK(ai_f16_to_f32(0x0001) == 5.9604644775390625e-08f); /* 2^-24 */
    CHECK(ai_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(ai_f32_to_f16(65519.0f) == 0x7bff);   /* rounds down */
    CHECK(ai_f32_to_f16(65520.0f) == 0x7c00);   /* ties to even -> inf */
    CHECK(ai_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie -> even */
    CHECK(ai_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);
    CHECK(ai_f32_to_f16(2.9802322387695312e-08f) == 0x0000); /* 2^-25 tie */
    CHECK(ai_f32_to_f16(-0.0f) == 0x8000);
}

TEST(bf16_round_trip_exhaustive_and_rounding)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ai_bf16_to_f32((uint16_t)h);
        if (isnan(f)) {
            CHECK(isnan(ai_bf16_to_f32(ai_f32_to_bf16(f))));
            continue;
        }
        CHECK(ai_f32_to_bf16(f) == h);
    }
    CHECK(ai_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(ai_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80); /* tie -> even */
    CHECK(ai_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82); /* tie -> even (up) */
    CHECK(ai_f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3f81);
    CHECK(ai_f32_to_bf16(3.4028235e38f) == 0x7f80);     /* FLT_MAX rounds to inf */
    CHECK(ai_f32_to_bf16(-0.0f) == 0x8000);
    uint32_t nan_low = 0x7f800001u; /* a NaN whose top half alone is inf */
    float f;
    memcpy(&f, &nan_low, 4);
    CHECK(isnan(ai_bf16_to_f32(ai_f32_to_bf16(f))));
    /* the tensor copy's bulk path and its element path agree */
    float src[5] = {1.0f + 3.0f / 256, -2.5f, 1e-40f, INFINITY, NAN};
    int64_t shape[] = {5}, stride[] = {-1};
    ai_tensor *s, *r, *d, *e;
    CHECK_OK(ai_tensor_borrow(&s, src, AI_F32, 1, shape, NULL, 0, false, NULL, NULL));
    CHECK_OK(ai_tensor_borrow(&r, src + 4, AI_F32, 1, shape, stride, 0, false, NULL, NULL));
    CHECK_OK(ai_tensor_new(&d, AI_BF16, 1, shape));
    CHECK_OK(ai_tensor_new(&e, AI_BF16, 1, shape));
    CHECK_OK(ai_tensor_copy(d, s)); /* contiguous: the bulk conversion */
    CHECK_OK(ai_tensor_copy(e, r)); /* reversed: element by element */
    for (int i = 0; i < 4; i++)
        CHECK(((uint16_t *)d->data)[i] == ((uint16_t *)e->data)[4 - i]);
    CHECK(ai_tensor_get_flat(d, 0) == 1.015625 && ai_tensor_get_flat(d, 1) == -2.5);
    CHECK(isnan(ai_tensor_get_flat(d, 4)) && isnan(ai_tensor_get_flat(e, 0)));
    CHECK(strcmp(ai_dtype_name(AI_BF16), "bfloat16") == 0 && ai_dtype_size(AI_BF16) == 2);
    ai_tensor_free(s);
    ai_tensor_free(r);
    ai_tensor_free(d);
    ai_tensor_free(e);
}

TEST(live_counters_return_to_zero)
{
    int64_t t0 = ai_debug_live_tensors(), s0 = ai_debug_live_storages();
    int64_t b0 = ai_debug_owned_bytes();
    int64_t shape[] = {1000};
    ai_tensor *a, *b;
    CHECK_OK(ai_tensor_new(&a, AI_F64, 1, shape));
    CHECK(ai_debug_owned_bytes() - b0 == 8000);
    CHECK_OK(ai_tensor_share(&b, a));
    CHECK(ai_debug_live_tensors() - t0 == 2);
    CHECK(ai_debug_live_storages() - s0 == 1);
    ai_tensor_free(a);
    ai_tensor_free(b);
    CHECK(ai_debug_live_tensors() == t0);
    CHECK(ai_debug_live_storages() == s0);
    CHECK(ai_debug_owned_bytes() == b0);
}

/* Every code of each small float decodes and encodes back to itself (NaN
 * codes to a NaN), without saturation (E5M2's infinities stay) and E8M0
 * rounding down (rounding up, the float32 subnormal 2^-127 becomes 2^-126
 * in onnx.numpy_helper.to_float8e8m0 too). */
TEST(small_float_round_trip_exhaustive)
{
    const ai_dtype dts[] = {AI_F8E4M3FN, AI_F8E4M3FNUZ, AI_F8E5M2, AI_F8E5M2FNUZ,
                            AI_F8E8M0, AI_F4E2M1};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        const int codes = dts[k] == AI_F4E2M1 ? 16 : 256;
        for (int c = 0; c < codes; c++) {
            double v = ai_small_float_to_f64((uint8_t)c, dts[k]);
            uint8_t back = ai_f64_to_small_float(v, dts[k], (ai_convert_mode){false, AI_ROUND_DOWN});
            if (isnan(v))
                CHECK(isnan(ai_small_float_to_f64(back, dts[k])));
            else
                CHECK(back == c);
        }
    }
}

TEST(small_float_rounding_and_saturation)
{
    const ai_convert_mode sat = AI_CONVERT_DEFAULT, nosat = {false, AI_ROUND_UP};
    /* E4M3FN: largest 448 (0x7e), NaN 0x7f, no infinity */
    CHECK(ai_f64_to_small_float(448, AI_F8E4M3FN, nosat) == 0x7e);
    CHECK(ai_f64_to_small_float(464, AI_F8E4M3FN, nosat) == 0x7e);  /* tie to even */
    CHECK(ai_f64_to_small_float(465, AI_F8E4M3FN, nosat) == 0x7f);  /* rounds past: NaN */
    CHECK(ai_f64_to_small_float(465, AI_F8E4M3FN, sat) == 0x7e);
    CHECK(ai_f64_to_small_float(-INFINITY, AI_F8E4M3FN, sat) == 0xfe);
    CHECK(ai_f64_to_small_float(INFINITY, AI_F8E4M3FN, nosat) == 0x7f);
    CHECK(ai_f64_to_small_float(ldexp(1, -10), AI_F8E4M3FN, sat) == 0x00); /* tie: 0 */
    CHECK(ai_f64_to_small_float(ldexp(3, -11), AI_F8E4M3FN, sat) == 0x01);
    CHECK(ai_f64_to_small_float(-0.0, AI_F8E4M3FN, sat) == 0x80);
    CHECK(ai_f64_to_small_float(0.4789, AI_F8E4M3FN, sat) == 0x2f); /* 0.46875 */
    /* E5M2: IEEE infinities, kept without saturation */
    CHECK(ai_f64_to_small_float(61440, AI_F8E5M2, nosat) == 0x7c); /* tie up to 2^16 */
    CHECK(ai_f64_to_small_float(61440, AI_F8E5M2, sat) == 0x7b);
    CHECK(ai_f64_to_small_float(-INFINITY, AI_F8E5M2, nosat) == 0xfc);
    CHECK(isinf(ai_small_float_to_f64(0x7c, AI_F8E5M2)));
    /* FNUZ: one NaN (0x80), no -0 */
    CHECK(ai_f64_to_small_float(-0.0, AI_F8E4M3FNUZ, sat) == 0x00);
    CHECK(ai_f64_to_small_float(-1e-9, AI_F8E5M2FNUZ, sat) == 0x00);
    CHECK(ai_f64_to_small_float(NAN, AI_F8E5M2FNUZ, sat) == 0x80);
    CHECK(ai_f64_to_small_float(1e6, AI_F8E4M3FNUZ, nosat) == 0x80);
    CHECK(ai_small_float_to_f64(0x7f, AI_F8E4M3FNUZ) == 240);
    /* float4 E2M1: no infinity nor NaN, always saturates */
    CHECK(ai_f64_to_small_float(INFINITY, AI_F4E2M1, nosat) == 0x7);
    CHECK(ai_f64_to_small_float(-5, AI_F4E2M1, sat) == 0xe); /* tie: -4 */
    /* E8M0: 2^(e - 127), rounded by round_mode */
    CHECK(ai_f64_to_small_float(3, AI_F8E8M0, sat) == 129);
    CHECK(ai_f64_to_small_float(3, AI_F8E8M0, (ai_convert_mode){true, AI_ROUND_DOWN}) == 128);
    CHECK(ai_f64_to_small_float(2.5, AI_F8E8M0, (ai_convert_mode){true, AI_ROUND_NEAREST}) == 128);
    CHECK(ai_f64_to_small_float(ldexp(1.5, 127), AI_F8E8M0, sat) == 254);
    CHECK(ai_f64_to_small_float(ldexp(1.5, 127), AI_F8E8M0, nosat) == 255);
    CHECK(isnan(ai_small_float_to_f64(255, AI_F8E8M0)));
}

/* The sub-byte integers (one a byte, low bits) and uint64 through copies. */
TEST(int4_and_uint64_conversion)
{
    int64_t shape[] = {6};
    ai_tensor *src, *i4, *u4, *f, *u64;
    CHECK_OK(ai_tensor_new(&src, AI_I64, 1, shape));
    const int64_t vals[] = {9, -9, 7, -8, 17, -1};
    memcpy(src->data, vals, sizeof vals);
    CHECK_OK(ai_tensor_new(&i4, AI_I4, 1, shape));
    CHECK_OK(ai_tensor_copy(i4, src)); /* integers wrap */
    CHECK(ai_tensor_get_flat_i64(i4, 0) == -7 && ai_tensor_get_flat_i64(i4, 1) == 7);
    CHECK(ai_tensor_get_flat_i64(i4, 3) == -8 && ai_tensor_get_flat_i64(i4, 4) == 1);
    CHECK(((uint8_t *)i4->data)[5] == 0xf); /* -1: the low nibble only */
    CHECK_OK(ai_tensor_new(&u4, AI_U4, 1, shape));
    CHECK_OK(ai_tensor_copy(u4, i4));
    CHECK(ai_tensor_get_flat_i64(u4, 5) == 15);
    /* floats truncate; out of range gives 0 (ml_dtypes, the ONNX reference) */
    CHECK_OK(ai_tensor_new(&f, AI_F64, 1, shape));
    const double fv[] = {7.9, 8.0, -8.9, -9.0, NAN, 15.9};
    memcpy(f->data, fv, sizeof fv);
    CHECK_OK(ai_tensor_copy(i4, f));
    CHECK(ai_tensor_get_flat_i64(i4, 0) == 7 && ai_tensor_get_flat_i64(i4, 1) == 0);
    CHECK(ai_tensor_get_flat_i64(i4, 2) == -8 && ai_tensor_get_flat_i64(i4, 3) == 0);
    CHECK(ai_tensor_get_flat_i64(i4, 4) == 0);
    CHECK_OK(ai_tensor_copy(u4, f));
    CHECK(ai_tensor_get_flat_i64(u4, 5) == 15 && ai_tensor_get_flat_i64(u4, 2) == 0);
    /* uint64 above 2^63 converts to and from floats by value */
    CHECK_OK(ai_tensor_new(&u64, AI_U64, 1, shape));
    ((double *)f->data)[0] = 1e19;
    CHECK_OK(ai_tensor_copy(u64, f));
    CHECK(((uint64_t *)u64->data)[0] == UINT64_C(10000000000000000000));
    ((uint64_t *)u64->data)[1] = UINT64_MAX;
    CHECK_OK(ai_tensor_copy(f, u64));
    CHECK(((double *)f->data)[1] == 18446744073709551616.0);
    ai_tensor_free(src);
    ai_tensor_free(i4);
    ai_tensor_free(u4);
    ai_tensor_free(f);
    ai_tensor_free(u64);
}

const ctest_case tensor_cases[] = {
    CASE(new_is_zeroed_contiguous_and_aligned),
    CASE(scalar_and_empty),
    CASE(bad_shapes_are_errors),
    CASE(borrow_releases_once_after_last_share),
    CASE(borrow_failure_still_releases),
    CASE(overlap_detection),
    CASE(strided_copy_negative_and_transposed),
    CASE(strided_copy_expanded_and_row_paths),
    CASE(dtype_conversion),
    CASE(f16_round_trip_exhaustive),
    CASE(bf16_round_trip_exhaustive_and_rounding),
    CASE(small_float_round_trip_exhaustive),
    CASE(small_float_rounding_and_saturation),
    CASE(int4_and_uint64_conversion),
    CASE(live_counters_return_to_zero),
    {NULL, NULL},
};
