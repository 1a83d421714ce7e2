/* test_portable.c — the integer arithmetic of the portable kernels against
 * values worked out by hand (rounding half up on both signs, clamps,
 * average-pool rounding, a depthwise convolution). */
#include "../portable/aidge_kernels.h"
#include <stddef.h>

#include "ctest.h"

TEST(round_shift_rounds_half_up)
{
    /* v / 4: 5/4=1.25->1, 6/4=1.5->2, -6/4=-1.5->-1, -7/4=-1.75->-2, -2/4=-0.5->0 */
    CHECK(aik_round_shift(5, 2) == 1);
    CHECK(aik_round_shift(6, 2) == 2);
    CHECK(aik_round_shift(-6, 2) == -1);
    CHECK(aik_round_shift(-7, 2) == -2);
    CHECK(aik_round_shift(-2, 2) == 0);
    CHECK(aik_round_shift(-3, 2) == -1);
    CHECK(aik_round_shift(-9, 0) == -9);
    CHECK(aik_round_shift(-(INT64_C(1) << 40), 40) == -1);
}

TEST(requant_multiplies_shifts_and_clamps)
{
    aik_rq r = {3, 1, -127, 127, 0, 0}; /* y = round(acc * 3 / 2) */
    CHECK(aik_requant(1, &r) == 2);     /* 1.5 -> 2 */
    CHECK(aik_requant(-1, &r) == -1);   /* -1.5 -> -1 */
    CHECK(aik_requant(100, &r) == 127); /* 150 clamped */
    CHECK(aik_requant(-100, &r) == -127);
    aik_rq relu = {1, 0, 0, 127, 0, 0};
    CHECK(aik_requant(-5, &relu) == 0);
}

TEST(round_shift_even_sends_ties_to_even)
{
    /* every v / 2^s: the nearest integer, the even one of two */
    for (int32_t s = 0; s <= 4; s++)
        for (int64_t v = -70; v <= 70; v++) {
            const int64_t d = INT64_C(1) << s;
            int64_t best = -1000;
            for (int64_t k = -71; k <= 71; k++) { /* |v - k d| least, then k even */
                const int64_t e = v - k * d < 0 ? k * d - v : v - k * d;
                const int64_t eb = v - best * d < 0 ? best * d - v : v - best * d;
                if (e < eb || (e == eb && k % 2 == 0))
                    best = k;
            }
            CHECK(aik_round_shift_even(v, s) == best);
        }
    CHECK(aik_round_shift_even(-(INT64_C(3) << 40), 41) == -2); /* -1.5 -> -2 */
    CHECK(aik_round_shift_even(INT64_C(5) << 40, 41) == 2);     /* 2.5 -> 2 */
}

TEST(requant_adds_the_zero_point_and_may_round_ties_to_even)
{
    aik_rq r = {3, 1, -128, 127, 10, 1}; /* y = rint(acc * 3 / 2 + 10) */
    CHECK(aik_requant(1, &r) == 12);     /* 1.5 -> 2 */
    CHECK(aik_requant(-1, &r) == 8);     /* -1.5 -> -2 */
    CHECK(aik_requant(5, &r) == 18);     /* 7.5 -> 8 */
    CHECK(aik_requant(3, &r) == 14);     /* 4.5 -> 4 */
    CHECK(aik_requant(100, &r) == 127);  /* 160 clamped */
    r.half_even = 0;
    CHECK(aik_requant(3, &r) == 15);     /* 4.5 -> 5 */
    r = (aik_rq){3, 1, -128, 127, 3, 1}; /* the sum rounds: rint(acc * 3 / 2 + 3) */
    CHECK(aik_requant(1, &r) == 4);      /* 4.5 -> 4 (not rint(1.5) + 3 = 5) */
    CHECK(aik_requant(-3, &r) == -2);    /* -1.5 -> -2 */
}

TEST(avgpool_i8_rounds_half_up)
{
    /* 1x1x2x2 input, 2x2 window: sums 3 (0.75 -> 1) and -2 (-0.5 -> 0), -6 (-1.5 -> -1) */
    aik_window p = {1, 1, 2, 2, 1, 1, 1, 2, 2, 1, 1, 1, 1, 0, 0, 1, 0};
    int8_t y;
    const int8_t a[4] = {1, 1, 1, 0}, b[4] = {-1, -1, 0, 0}, c[4] = {-2, -2, -1, -1};
    aik_avgpool2d_i8(&p, a, 0, &y);
    CHECK(y == 1);
    aik_avgpool2d_i8(&p, b, 0, &y);
    CHECK(y == 0);
    aik_avgpool2d_i8(&p, c, 0, &y);
    CHECK(y == -1);
    const int8_t d[4] = {3, 3, 2, 2}, e[4] = {1, 1, 1, 2}; /* 2.5, 1.25 */
    aik_avgpool2d_i8(&p, d, 1, &y); /* ties to even */
    CHECK(y == 2);
    aik_avgpool2d_i8(&p, b, 1, &y);
    CHECK(y == 0);
    aik_avgpool2d_i8(&p, c, 1, &y);
    CHECK(y == -2);
    aik_avgpool2d_i8(&p, e, 1, &y);
    CHECK(y == 1);
}

TEST(depthwise_conv_i8_with_padding)
{
    /* 2 channels of 2x2, 3x3 depthwise all-ones kernel, pad 1: every output
     * is the sum of its channel (all positions see the whole 2x2 map) */
    aik_window p = {1, 2, 2, 2, 2, 2, 2, 3, 3, 1, 1, 1, 1, 1, 1, 2, 0};
    int8_t x[8] = {1, 2, 3, 4, -1, -2, -3, -5}, w[18], y[8];
    for (int i = 0; i < 18; i++)
        w[i] = 1;
    int32_t bias[2] = {10, 0};
    aik_rq r[2] = {{1, 0, -127, 127, 0, 0}, {1, 0, -127, 127, 0, 0}};
    aik_conv2d_i8(&p, x, w, bias, r, y);
    for (int i = 0; i < 4; i++) {
        CHECK(y[i] == 20);
        CHECK(y[4 + i] == -11);
    }
    /* per channel: channel 0 times 3/2 (30), channel 1 halved (-5.5 -> -5), ReLU */
    aik_rq pc[2] = {{3, 1, -127, 127, 0, 0}, {1, 1, 0, 127, 0, 0}};
    aik_conv2d_i8(&p, x, w, bias, pc, y);
    for (int i = 0; i < 4; i++) {
        CHECK(y[i] == 30);
        CHECK(y[4 + i] == 0);
    }
    pc[1].lo = -127;
    aik_conv2d_i8(&p, x, w, bias, pc, y);
    CHECK(y[4] == -5);
}

TEST(fc_i8_requantizes_each_output_column)
{
    /* x (2, 3), w (2, 3): column 0 sums x, column 1 sums -x */
    const int8_t x[6] = {1, 2, 3, -4, -5, -7}, w[6] = {1, 1, 1, -1, -1, -1};
    const int32_t bias[2] = {1, 0};
    const aik_rq rq[2] = {{1, 1, -127, 127, 0, 0}, {5, 2, -127, 127, 0, 0}};
    int8_t y[4];
    aik_fc_i8(2, 3, 2, x, w, bias, rq, y);
    CHECK(y[0] == 4);  /* (6 + 1) / 2 = 3.5 -> 4 */
    CHECK(y[1] == -7); /* -6 * 5 / 4 = -7.5 -> -7 */
    CHECK(y[2] == -7); /* (-16 + 1) / 2 = -7.5 -> -7 */
    CHECK(y[3] == 20); /* 16 * 5 / 4 */
}

const ctest_case portable_cases[] = {
    CASE(round_shift_rounds_half_up),
    CASE(requant_multiplies_shifts_and_clamps),
    CASE(round_shift_even_sends_ties_to_even),
    CASE(requant_adds_the_zero_point_and_may_round_ties_to_even),
    CASE(avgpool_i8_rounds_half_up),
    CASE(depthwise_conv_i8_with_padding),
    CASE(fc_i8_requantizes_each_output_column),
    {NULL, NULL},
};
