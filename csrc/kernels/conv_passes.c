/*
 * conv_passes.c — passes over whole planes that several convolution
 * families run: y filled with the bias, the epilogue (bias, BatchNorm's
 * affine, Relu) on finished planes, the bias gradient, and transposes
 * (planes <-> channels-last buffers). Each splits its planes or channels
 * across the pool, never a sum: results do not depend on the thread count.
 */
#include "conv_internal.h"

#define T float
#define SFX _f32
#include "conv_passes_impl.h"

#define T double
#define SFX _f64
#include "conv_passes_impl.h"

void ai_transpose_f32(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                      int64_t cols, bool add)
{
    transpose_f32(dst, ldd, src, lds, rows, cols, add);
}
