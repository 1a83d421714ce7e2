/*
 * conv_im2col.c — convolution as im2col + GEMM: the general case, which
 * takes every shape that no faster family took (any group, 3 spatial dims,
 * float64), and ConvTranspose, whose forward is the input gradient of the
 * Conv mapping its y to its x (col2im).
 *
 *   forward   y_g (Mg, OS) = w_g (Mg, Cg K) @ cols(x_g) (Cg K, OS) + b, image by image
 *   dx        dx_g (Cg, IS) += col2im(w_g^T @ dy_g)
 *   dw        dw_g (Mg, Cg K) += dy_g (Mg, OS) @ cols(x_g)^T
 *
 * cols(x) (C K, OS) holds, in row (c, k), the input value that tap k of
 * channel c reads for each output position (0 in the padding); a 1x1,
 * stride-1, unpadded conv's columns are x itself. The GEMMs (gemm.c) split
 * across threads; im2col by column rows, col2im by channels.
 */
#include "conv_internal.h"

/*
 * The backward of a one-group conv that reaches im2col (strided, or not
 * covered by the direct kernels) on several small images: the images in
 * COLS_GROUPS groups (fewer with fewer images), runs of consecutive groups
 * on the pool (one run at one thread), each group's images in turn as the
 * serial path does them (im2col, the GEMMs, col2im, in its run's columns
 * slot), its weight gradient summed in a slot of its own; the slots are
 * then added to dw in group order: the same values at any thread count.
 * Image by image, the GEMMs are too small to split across threads
 * (ResNet-8's strided convs and shortcuts). (Chunks of images side by
 * side in one GEMM per gradient split well but leave L2.) A group's slots (columns and weight
 * gradient) are at most COLS_GROUP_ELEMS. Returns the number of groups, 0
 * for other convs, and for those whose input gradient the direct kernel
 * computes (stride 1, float32): their weight gradient goes to direct_weight_grad or,
 * where that declines, to the serial loop, and reserving the groups'
 * workspace for them would grow the memory plan for nothing.
 */
#define COLS_GROUPS 8
#define COLS_GROUP_ELEMS (INT64_C(1) << 18)
static int64_t cols_groups_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype)
{
    const int64_t rows = p->C * g->ksize;
    if (p->group != 1 || g->pointwise || p->N < 2 || g->grid_size == 0 ||
        rows * (g->grid_size + p->M) > COLS_GROUP_ELEMS ||
        direct_input_grad_workspace(p, dtype) > 0)
        return 0;
    return p->N < COLS_GROUPS ? p->N : COLS_GROUPS;
}

#define T float
#define SFX _f32
#define GEMM ai_gemm_f32
#include "conv_im2col_impl.h"

#define T double
#define SFX _f64
#define GEMM ai_gemm_f64
#include "conv_im2col_impl.h"

bool im2col_forward(const conv_call *c)
{
    return c->dtype == AI_F32 ? forward_f32(c) : forward_f64(c);
}

bool im2col_backward(conv_call *c)
{
    if (conv_is_depthwise(c->p))
        return false;
    return c->dtype == AI_F32 ? backward_f32(c) : backward_f64(c);
}

void im2col_transposed_forward(const conv_call *c)
{
    if (c->dtype == AI_F32)
        transposed_forward_f32(c);
    else
        transposed_forward_f64(c);
}

void im2col_transposed_backward(conv_call *c)
{
    if (c->dtype == AI_F32)
        transposed_backward_f32(c);
    else
        transposed_backward_f64(c);
}

/* The columns of one image (of the image groups, when they run), none for
 * the shapes other families always take. */
int64_t im2col_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype,
                         bool transposed)
{
    if (g->pointwise ||
        (!transposed && (shifted_gemm_accepts(p, g) || conv_is_depthwise(p))))
        return 0;
    const int64_t channels = (transposed ? p->M : p->C) / p->group; /* image side */
    int64_t cols = channels * g->ksize * g->grid_size;
    const int64_t groups = transposed ? 0 : cols_groups_of(p, g, dtype);
    if (groups * p->C * g->ksize * (g->grid_size + p->M) > cols)
        cols = groups * p->C * g->ksize * (g->grid_size + p->M);
    return cols;
}
