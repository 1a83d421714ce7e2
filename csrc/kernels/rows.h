/*
 * rows.h — float32 kernels along contiguous rows with 16-lane vectors
 * (AVX-512): softmax and log-softmax forward and backward, row sums.
 * x, y, dy, dx are R rows of L floats, one after the other.
 *
 * Each returns false, having done nothing, where it does not run (a build
 * without AI_AVX512_KERNEL, a CPU without AVX-512, ai_set_avx512(false)):
 * the caller then runs its reference kernel (ops/norm.c's
 * sm_rows_forward_f32 and sm_rows_backward_f32, ops/reduce.c's
 * sum_row_f32), which the tests compare these with. A row's values never
 * depend on how the rows are split between threads.
 *
 * Sums run in blocks of 256 values: 16 float lanes of at most 16 terms
 * each, folded into 8 double lanes, which are added in a fixed tree at the
 * row's end (its last L % 16 values one by one, in double). The
 * references sum every value in double (8 lanes): on rows of 128, 2.3
 * times the time of the float blocks (the conversions); lanes folded one
 * by one instead of the tree made softmax 1.2 times slower.
 */
#ifndef AI_ROWS_H
#define AI_ROWS_H

#include <stdbool.h>
#include <stdint.h>

/* softmax: y = exp(x - max) / sum, as y = e * (float)(1 / sum);
 * log: y = (x - max) - (float)log(sum); sum = sum of exp(x - max), with
 * ai_expf's polynomial. max skips NaN, which then makes the row NaN. */
bool ai_softmax_rows_v16(float *y, const float *x, bool log_, int64_t R, int64_t L);

/* dx = dy - exp(y) * (float)sum(dy), or dx += that unless assign; y a
 * log-softmax output (<= 0, or NaN). */
bool ai_logsoftmax_backward_rows_v16(float *dx, const float *dy, const float *y, bool assign,
                                     int64_t R, int64_t L);

/* dx = y * (dy - (float)sum(dy * y)), or dx += that unless assign; y a
 * softmax output. */
bool ai_softmax_backward_rows_v16(float *dx, const float *dy, const float *y, bool assign,
                                  int64_t R, int64_t L);

/* acc[r] += the sum of row r */
bool ai_sum_rows_v16(double *acc, const float *x, int64_t R, int64_t L);

#endif
