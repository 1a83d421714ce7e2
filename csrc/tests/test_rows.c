/*
 * test_rows.c — kernels/rows.c's 16-lane row kernels against the same
 * computations in double: softmax and log-softmax forward, log-softmax
 * backward (assigning and accumulating), row sums, on rows of every length
 * around the vector width and the sums' 256-value blocks, with NaN, -inf,
 * +inf and very negative rows. Where they do not run (no AVX-512 in the
 * CPU or the build) they must say so and leave the output alone.
 */
#include <math.h>
#include <stdlib.h>

#include "../kernels/rows.h"
#include "../kernels/simd.h"
#include "ctest.h"

static const int64_t lengths[] = {1, 7, 15, 16, 17, 33, 128, 255, 256, 257, 1000, 4099};
#define NLEN (sizeof lengths / sizeof lengths[0])
#define ROWS 6

/* R x L values in [-8, 8), row 1 with a NaN, row 2 with -inf and +inf
 * (NaN rows), row 3 all -1e30 but one -inf (one), row 4 spread over
 * [-200, 0] (exponentials under float's range) */
static float *special_rows(int64_t L)
{
    float *x = malloc(sizeof(float) * ROWS * L);
    unsigned s = 12345;
    for (int64_t i = 0; i < ROWS * L; i++) {
        s = s * 1103515245u + 12345u;
        x[i] = (float)((s >> 8) % 16000) / 1000.0f - 8.0f;
    }
    x[1 * L + L / 2] = NAN;
    x[2 * L] = -INFINITY;
    x[2 * L + L - 1] = INFINITY;
    for (int64_t l = 0; l < L; l++) {
        x[3 * L + l] = l == L / 3 ? -INFINITY : -1e30f;
        x[4 * L + l] = -200.0f * (float)l / (float)L;
    }
    return x;
}

static bool same_or_close(double got, double want, double tol)
{
    return isnan(want) ? isnan(got) : (got == want || fabs(got - want) <= tol);
}

static void softmax_ref(double *y, const float *x, bool log_, int64_t L)
{
    float m = -INFINITY; /* x - max in float, as the kernels (and torch) */
    double s = 0;
    for (int64_t l = 0; l < L; l++)
        m = x[l] > m ? x[l] : m;
    for (int64_t l = 0; l < L; l++)
        s += exp((double)(x[l] - m));
    for (int64_t l = 0; l < L; l++)
        y[l] = log_ ? (double)(x[l] - m) - log(s) : exp((double)(x[l] - m)) / s;
}

TEST(rows_v16_softmax_and_log_softmax_against_double)
{
    for (size_t i = 0; i < NLEN; i++) {
        const int64_t L = lengths[i];
        float *x = special_rows(L), *y = malloc(sizeof(float) * ROWS * L);
        double *ref = malloc(sizeof(double) * L);
        for (int log_ = 0; log_ < 2; log_++) {
            if (!ai_softmax_rows_v16(y, x, log_, ROWS, L)) {
                CHECK(!ai_cpu_avx512());
                continue;
            }
            for (int64_t r = 0; r < ROWS; r++) {
                softmax_ref(ref, x + r * L, log_, L);
                for (int64_t l = 0; l < L; l++) {
                    /* 2-ulp exponentials, a float sum, a rounded scale */
                    const double tol = log_ ? 1e-6 * (1 + fabs(ref[l])) : 1e-6 * ref[l] + 1e-37;
                    CHECK(same_or_close(y[r * L + l], ref[l], tol));
                }
            }
            CHECK(isnan(y[1 * L]) && isnan(y[2 * L]));
        }
        free(x), free(y), free(ref);
    }
}

TEST(rows_v16_log_softmax_backward_against_double)
{
    for (size_t i = 0; i < NLEN; i++) {
        const int64_t L = lengths[i];
        float *x = special_rows(L), *y = malloc(sizeof(float) * ROWS * L);
        float *dy = malloc(sizeof(float) * ROWS * L), *dx = malloc(sizeof(float) * ROWS * L);
        if (!ai_softmax_rows_v16(y, x, true, ROWS, L)) {
            CHECK(!ai_cpu_avx512());
            free(x), free(y), free(dy), free(dx);
            continue;
        }
        for (int64_t k = 0; k < ROWS * L; k++)
            dy[k] = (float)((k * 37) % 101) / 50.0f - 1.0f;
        for (int assign = 0; assign < 2; assign++) {
            for (int64_t k = 0; k < ROWS * L; k++)
                dx[k] = 0.5f;
            CHECK(ai_logsoftmax_backward_rows_v16(dx, dy, y, assign, ROWS, L));
            for (int64_t r = 0; r < ROWS; r++) {
                double s = 0, sa = 0;
                for (int64_t l = 0; l < L; l++)
                    s += dy[r * L + l], sa += fabs(dy[r * L + l]);
                for (int64_t l = 0; l < L; l++) {
                    const int64_t k = r * L + l;
                    const double want = (assign ? 0 : 0.5) + dy[k] - exp((double)y[k]) * s;
                    CHECK(same_or_close(dx[k], want, 1e-6 * (1 + sa)));
                }
            }
        }
        free(x), free(y), free(dy), free(dx);
    }
}

TEST(rows_v16_sums_against_double)
{
    for (size_t i = 0; i < NLEN; i++) {
        const int64_t L = lengths[i];
        float *x = special_rows(L);
        double acc[ROWS];
        for (int r = 0; r < ROWS; r++)
            acc[r] = r;
        if (!ai_sum_rows_v16(acc, x, ROWS, L)) {
            CHECK(!ai_cpu_avx512());
            free(x);
            continue;
        }
        for (int r = 0; r < ROWS; r++) {
            double s = r, sa = 0;
            for (int64_t l = 0; l < L; l++)
                s += x[r * L + l], sa += fabs(x[r * L + l]);
            /* float blocks of 16 terms a lane: about 16 roundings of the block */
            CHECK(same_or_close(acc[r], s, 1e-6 * sa));
        }
        CHECK(isnan(acc[1]) && acc[3] == -INFINITY);
        CHECK(L == 1 ? acc[2] == INFINITY : isnan(acc[2])); /* -inf + inf, or +inf alone */
        free(x);
    }
}

TEST(rows_v16_off_leaves_the_output_alone)
{
    const bool on = ai_cpu_avx512();
    float x[40] = {0}, y[40] = {0};
    double acc[1] = {7};
    ai_set_avx512(false);
    CHECK(!ai_softmax_rows_v16(y, x, false, 1, 40) && y[0] == 0);
    CHECK(!ai_logsoftmax_backward_rows_v16(y, x, x, true, 1, 40) && y[0] == 0);
    CHECK(!ai_sum_rows_v16(acc, x, 1, 40) && acc[0] == 7);
    ai_set_avx512(on);
}

const ctest_case rows_cases[] = {
    CASE(rows_v16_softmax_and_log_softmax_against_double),
    CASE(rows_v16_log_softmax_backward_against_double),
    CASE(rows_v16_sums_against_double),
    CASE(rows_v16_off_leaves_the_output_alone),
    {NULL, NULL},
};
