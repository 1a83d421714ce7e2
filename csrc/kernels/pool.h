/*
 * pool.h — MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool kernels
 * (ONNX semantics, matching PyTorch), 1 to 3 spatial dims, float32 and float64.
 *
 * x (N, C, in...), y (N, C, out...), contiguous. Along each spatial dim,
 * window o covers the input positions o*stride - pad_begin + j*dilation,
 * j < kernel; positions outside [0, in) are padding.
 *   out = floor((in + pad_begin + pad_end - dilation*(kernel-1) - 1) / stride) + 1
 * or with ceil_mode the ceiling, minus one if the last window would start
 * past the input and the left padding (torch's rule). Windows of padding only
 * are rejected by ai_pool_check.
 *
 * MaxPool: padding never wins. idx holds, per output, the flat position in
 * the input plane (n, c) of the first maximum in scan order; a NaN counts as
 * a maximum and a later NaN replaces an earlier one (as in torch), so NaN
 * propagates. AveragePool divides the window's sum by the number of its input
 * elements, or with count_include_pad by its size clipped to the padded input
 * [-pad_begin, in + pad_end) (torch's divisor with ceil_mode); with
 * dilation, which torch's avg_pool lacks, both count taps, not positions.
 *
 * Forward overwrites y (and idx); backward ACCUMULATES (+=) into dx.
 * The caller validates the parameters with ai_pool_check() (or fills `out`
 * with ai_pool_infer_out()) first.
 */
#ifndef AI_POOL_H
#define AI_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "../aidge.h"

typedef struct {
    int nsp;                 /* spatial dims, 1..3 */
    int64_t N, C;            /* batch, channels */
    int64_t in[3], out[3];   /* spatial sizes of x and y */
    int64_t kernel[3], stride[3], dilation[3], pad_begin[3], pad_end[3];
    bool ceil_mode;
    bool count_include_pad;  /* AveragePool only */
} ai_pool_params;

/* Fills p->out from the other fields, then validates like ai_pool_check(). */
ai_status ai_pool_infer_out(ai_pool_params *p);
/* AI_ERR_VALUE with a message naming the problem if `p` is not a valid,
 * self-consistent pooling description. */
ai_status ai_pool_check(const ai_pool_params *p);

/* float32. idx is (N, C, out...); for the global pools x is (NC, S) with
 * S >= 1, y and idx are (NC). The max pools' forward takes idx NULL where
 * nothing needs the maxima's positions (no backward). */
void ai_maxpool_forward_f32(const ai_pool_params *p, float *y, int64_t *idx,
                            const float *x);
void ai_maxpool_backward_f32(const ai_pool_params *p, float *dx, const float *dy,
                             const int64_t *idx);
void ai_avgpool_forward_f32(const ai_pool_params *p, float *y, const float *x);
void ai_avgpool_backward_f32(const ai_pool_params *p, float *dx, const float *dy);
void ai_global_maxpool_forward_f32(float *y, int64_t *idx, const float *x, int64_t NC,
                                   int64_t S);
void ai_global_maxpool_backward_f32(float *dx, const float *dy, const int64_t *idx,
                                    int64_t NC, int64_t S);
void ai_global_avgpool_forward_f32(float *y, const float *x, int64_t NC, int64_t S);
void ai_global_avgpool_backward_f32(float *dx, const float *dy, int64_t NC, int64_t S);

/* float64 */
void ai_maxpool_forward_f64(const ai_pool_params *p, double *y, int64_t *idx,
                            const double *x);
void ai_maxpool_backward_f64(const ai_pool_params *p, double *dx, const double *dy,
                             const int64_t *idx);
void ai_avgpool_forward_f64(const ai_pool_params *p, double *y, const double *x);
void ai_avgpool_backward_f64(const ai_pool_params *p, double *dx, const double *dy);
void ai_global_maxpool_forward_f64(double *y, int64_t *idx, const double *x, int64_t NC,
                                   int64_t S);
void ai_global_maxpool_backward_f64(double *dx, const double *dy, const int64_t *idx,
                                    int64_t NC, int64_t S);
void ai_global_avgpool_forward_f64(double *y, const double *x, int64_t NC, int64_t S);
void ai_global_avgpool_backward_f64(double *dx, const double *dy, int64_t NC,
                                    int64_t S);

#endif
