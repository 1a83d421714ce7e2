/*
 * conv.h — Conv and ConvTranspose kernels (ONNX semantics, matching PyTorch),
 * 1 to 3 spatial dims, float32 and float64, through im2col/col2im + GEMM.
 *
 * Conv           x (N, C, in...)   w (M, C/group, kernel...)  b (M) or NULL
 *                y (N, M, out...)
 *                out = floor((in + pad_begin + pad_end
 *                             - dilation*(kernel-1) - 1) / stride) + 1
 * ConvTranspose  x (N, C, in...)   w (C, M/group, kernel...)  b (M) or NULL
 *                y (N, M, out...)
 *                out = stride*(in-1) + output_padding
 *                      + dilation*(kernel-1) + 1 - pad_begin - pad_end
 *
 * All tensors are contiguous. ConvTranspose forward is the data gradient of
 * the Conv that maps y's shape to x's with the same w (col2im).
 *
 * Forward overwrites y. Backward ACCUMULATES (+=) into each of dx, dw, db that
 * is not NULL; a NULL one is not computed. With assign_dx it overwrites dx
 * instead (dx may hold garbage; dx == dw is allowed: then both add to zeros). The kernels never allocate: the
 * caller passes `workspace`, ai_conv[transpose]_workspace_bytes() long (may be
 * NULL when that is 0), and must have validated the parameters with
 * ai_conv[transpose]_check() (or filled `out` with ..._infer_out()).
 */
#ifndef AI_CONV_H
#define AI_CONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../aidge.h"

typedef struct {
    int nsp;                      /* spatial dims, 1..3 */
    int64_t N, C, M, group;       /* batch, x channels, y channels, groups */
    int64_t in[3], out[3];        /* spatial sizes of x and y */
    int64_t kernel[3], stride[3], dilation[3], pad_begin[3], pad_end[3];
    int64_t output_padding[3];    /* ConvTranspose only; must be 0 for Conv */
} ai_conv_params;

/* Fills p->out from the other fields, then validates like ..._check(). */
ai_status ai_conv_infer_out(ai_conv_params *p);
ai_status ai_convtranspose_infer_out(ai_conv_params *p);
/* AI_ERR_VALUE with a message naming the problem if `p` is not a valid,
 * self-consistent Conv (ConvTranspose) description. */
ai_status ai_conv_check(const ai_conv_params *p);
ai_status ai_convtranspose_check(const ai_conv_params *p);

/* Bytes of scratch the kernels need (0 for a 1x1, stride-1, unpadded conv). */
size_t ai_conv_workspace_bytes(const ai_conv_params *p, ai_dtype dtype);
size_t ai_convtranspose_workspace_bytes(const ai_conv_params *p, ai_dtype dtype);

/* An epilogue the forward applies to each output plane as soon as the conv
 * has written it (while it is in cache), after the bias: y = y ab[m] +
 * ab[M + m] for output channel m when `ab` (2 M values of y's type), then
 * y = max(y, 0) with `relu` (NaN kept). The same arithmetic as running
 * these as passes of their own afterwards (FusedConv's BatchNorm and Relu). */
typedef struct {
    const void *ab;
    bool relu;
} ai_conv_epilogue;

/* float32; `ep` may be NULL (none) */
void ai_conv_forward_f32(const ai_conv_params *p, float *y, const float *x,
                         const float *w, const float *b, float *workspace,
                         const ai_conv_epilogue *ep);
void ai_conv_backward_f32(const ai_conv_params *p, float *dx, float *dw, float *db,
                          const float *dy, const float *x, const float *w,
                          float *workspace, bool assign_dx);
void ai_convtranspose_forward_f32(const ai_conv_params *p, float *y, const float *x,
                                  const float *w, const float *b, float *workspace);
void ai_convtranspose_backward_f32(const ai_conv_params *p, float *dx, float *dw,
                                   float *db, const float *dy, const float *x,
                                   const float *w, float *workspace, bool assign_dx);

/*
 * Blocked channels ("NCHWc8", the layout of the fused inference graph's
 * conv chains, recipe block_channels): a 2-D activation (N, C, H, W) stored
 * as (N, ceil(C / 8), H, W, 8), channel c in lane c % 8 of block c / 8; the
 * lanes past C are padding, which the kernels write (as zeros, from zero
 * weights) and never read into a real channel. A conv's output is then a
 * vector of 8 channels per position, written as the register tiles hold it:
 * no transposes into planes, and the next conv reads its input the same
 * way. float32, 2-D, forward only, x blocked or NCHW (`x_blocked`), y
 * always blocked; the epilogue is applied before the store, as for the
 * other forwards. Fast kernels: convs of one group (the direct tiles, at
 * most 640 taps: channel-kernel positions; 3x3 stride-1 ones on blocked x
 * with 16 channels or more in and out by Winograd, conv_winograd.c) and
 * depthwise ones (channel multiplier 1), ai_conv_blocked_fast; any other
 * 2-D conv (or planes too large for the tiles' slots) runs the NCHW
 * forward between reorders. The workspace is ai_conv_blocked_workspace_bytes
 * long. `r` (or NULL): a residual blocked like y, added after the
 * epilogue's affine and before its Relu (a ResNet block's Add and Relu; the
 * direct tiles and Winograd add it in registers, the other paths in a pass
 * after the conv).
 * The direct and patch tiles read w packed by blocks of output channels,
 * Winograd its transform U: made in the workspace at every call, or, for a
 * caller that keeps them while w holds (ops/fused.c through packed.c), by
 * ai_conv_blocked_pack into ai_conv_blocked_packed_size(...) floats (0: p's
 * kernel reads w as it is) and passed as `wp` (NULL: made at the call).
 * *layout names the layout (1 the tiles', 2 Winograd's): a copy is good
 * for its layout only. The same sums bit for bit either way.
 */
#define AI_CONV_BLOCK 8
bool ai_conv_blocked_fast(int64_t C, int64_t M, int64_t group, int64_t ksize);
size_t ai_conv_blocked_workspace_bytes(const ai_conv_params *p, bool x_blocked);
int64_t ai_conv_blocked_packed_size(const ai_conv_params *p, bool x_blocked, int *layout);
void ai_conv_blocked_pack(const ai_conv_params *p, bool x_blocked, const float *w, float *wp);
void ai_conv_forward_blocked_f32(const ai_conv_params *p, float *y, const float *x,
                                 const float *w, const float *wp, const float *b, float *ws,
                                 const ai_conv_epilogue *ep, bool x_blocked, const float *r);
/* plain (N, C, S) <-> blocked (N, ceil(C / 8), S, 8) of elem_size-byte
 * elements (4 or 8): to_blocked writes blocked (padding lanes zero), else
 * plain; with `add` the destination is added to (blocked: its padding
 * lanes left as they are). On the pool. */
void ai_channels_reorder(void *blocked, void *plain, int64_t N, int64_t C, int64_t S,
                         size_t elem_size, bool to_blocked, bool add);

/* dst (cols, rows) = src (rows, cols)^T, or += with `add` (rows of dst ldd
 * apart, of src lds apart): 8 x 8 blocks of 4-byte elements by shuffles
 * where the CPU has them. One thread. */
void ai_transpose_f32(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                      int64_t cols, bool add);

/* float64 */
void ai_conv_forward_f64(const ai_conv_params *p, double *y, const double *x,
                         const double *w, const double *b, double *workspace,
                         const ai_conv_epilogue *ep);
void ai_conv_backward_f64(const ai_conv_params *p, double *dx, double *dw,
                          double *db, const double *dy, const double *x,
                          const double *w, double *workspace, bool assign_dx);
void ai_convtranspose_forward_f64(const ai_conv_params *p, double *y,
                                  const double *x, const double *w, const double *b,
                                  double *workspace);
void ai_convtranspose_backward_f64(const ai_conv_params *p, double *dx, double *dw,
                                   double *db, const double *dy, const double *x,
                                   const double *w, double *workspace, bool assign_dx);

#endif
