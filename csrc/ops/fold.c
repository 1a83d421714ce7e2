/*
 * fold.c — Col2Im (opset 18): torch's F.fold, in any number of spatial
 * dims, forward and backward (Im2Col, torch's F.unfold).
 *
 * input (N, C * prod(block_shape), L) holds, per channel c and block
 * offset k, one value per block position l; image_shape and block_shape
 * (int64 inputs, known at plan time) give the output (N, C, image...).
 * With pads (begin..., end...), strides and dilations, the blocks slide
 * over the padded image: n_d = (image_d + pads - (dilation_d (block_d - 1)
 * + 1)) / stride_d + 1 positions per dim, L = prod(n_d). Each value adds
 * into the image element at l_d * stride_d - pad_begin_d + k_d * dilation_d
 * (none in the padding). Backward reads dY at the same element. Work splits
 * by (n, c): each owns its output plane and its input rows.
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../parallel.h"
#include "spatial.h"

#define FOLD_MAX_SP 3 /* (the attribute lists hold 6 pads) */

typedef struct {
    ai_int_list dilations, pads, strides;
} fold_attrs;

static ai_status fold_init(ai_node *n)
{
    fold_attrs *a = calloc(1, sizeof *a);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    ai_status st;
    if ((st = ai_read_int_list(n, "dilations", FOLD_MAX_SP, 1, &a->dilations)) ||
        (st = ai_read_int_list(n, "pads", 2 * FOLD_MAX_SP, 0, &a->pads)) ||
        (st = ai_read_int_list(n, "strides", FOLD_MAX_SP, 1, &a->strides)))
        return st;
    return AI_OK;
}

typedef struct {
    int r;
    int64_t N, C, K, L;
    int64_t image[FOLD_MAX_SP], block[FOLD_MAX_SP], count[FOLD_MAX_SP];
    int64_t stride[FOLD_MAX_SP], dilation[FOLD_MAX_SP], pad_begin[FOLD_MAX_SP];
} fold_geom;

/* The geometry from the inputs and attributes, validated. */
static ai_status fold_geom_of(const ai_ctx *c, fold_geom *g)
{
    const ai_node *n = c->node;
    const fold_attrs *a = n->params;
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(n, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    if (x->ndim != 3)
        return ai_node_error(n, AI_ERR_VALUE, "input has rank %d; (N, C * prod(block_shape), "
                             "L) expected", x->ndim);
    const ai_tensor *t[2];
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "block_shape" : "image_shape";
        t[i] = ai_ctx_const(c, 1 + i);
        if (!t[i] && !(t[i] = c->in[1 + i]->data ? c->in[1 + i] : NULL))
            return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "%s must be known when the graph "
                                 "is planned (a constant or a graph input)", name);
        if (t[i]->dtype != AI_I64 || t[i]->ndim != 1)
            return ai_node_error(n, AI_ERR_VALUE, "%s must be a 1-D int64 tensor", name);
    }
    g->r = (int)ai_tensor_numel(t[0]);
    if (g->r < 1 || g->r > FOLD_MAX_SP || ai_tensor_numel(t[1]) != g->r)
        return ai_node_error(n, AI_ERR_VALUE, "image_shape has %lld values, block_shape %lld; "
                             "the same number, 1 to %d, expected",
                             (long long)ai_tensor_numel(t[0]), (long long)ai_tensor_numel(t[1]),
                             FOLD_MAX_SP);
    ai_status st;
    if ((st = ai_spatial_list(n, "dilations", &a->dilations, g->r, 1, g->dilation)) ||
        (st = ai_spatial_list(n, "strides", &a->strides, g->r, 1, g->stride)))
        return st;
    if (a->pads.n >= 0 && a->pads.n != 2 * g->r)
        return ai_node_error(n, AI_ERR_VALUE, "pads has %lld values; %d (begin..., end...) "
                             "expected", (long long)a->pads.n, 2 * g->r);
    g->K = g->L = 1;
    for (int d = 0; d < g->r; d++) {
        g->image[d] = ai_tensor_get_flat_i64(t[0], d);
        g->block[d] = ai_tensor_get_flat_i64(t[1], d);
        if (g->image[d] < 1 || g->image[d] > INT32_MAX || g->block[d] < 1 ||
            g->block[d] > INT32_MAX)
            return ai_node_error(n, AI_ERR_VALUE, "image_shape[%d] is %lld, block_shape[%d] "
                                 "%lld; positive sizes expected", d, (long long)g->image[d], d,
                                 (long long)g->block[d]);
        g->pad_begin[d] = a->pads.n < 0 ? 0 : a->pads.v[d];
        const int64_t pad_end = a->pads.n < 0 ? 0 : a->pads.v[g->r + d];
        const int64_t padded = g->image[d] + g->pad_begin[d] + pad_end;
        const int64_t extent = g->dilation[d] * (g->block[d] - 1) + 1;
        if (padded < extent)
            return ai_node_error(n, AI_ERR_VALUE, "dim %d: the block spans %lld but the padded "
                                 "image has %lld", d, (long long)extent, (long long)padded);
        g->count[d] = (padded - extent) / g->stride[d] + 1;
        g->K *= g->block[d];
        g->L *= g->count[d];
    }
    if (x->shape[1] % g->K || x->shape[2] != g->L)
        return ai_node_error(n, AI_ERR_VALUE, "input is (%lld, %lld, %lld); (N, C * %lld, %lld) "
                             "expected (block_shape's product, the block positions)",
                             (long long)x->shape[0], (long long)x->shape[1],
                             (long long)x->shape[2], (long long)g->K, (long long)g->L);
    g->N = x->shape[0];
    g->C = x->shape[1] / g->K;
    return AI_OK;
}

static ai_status fold_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    fold_geom g;
    ai_status st = fold_geom_of(c, &g);
    if (st)
        return st;
    out[0].dtype = c->in[0]->dtype;
    out[0].ndim = 2 + g.r;
    out[0].shape[0] = g.N;
    out[0].shape[1] = g.C;
    memcpy(out[0].shape + 2, g.image, sizeof(int64_t) * (size_t)g.r);
    return AI_OK;
}

typedef struct {
    const fold_geom *g;
    const ai_tensor *cols, *dy; /* forward: the input; backward: dY */
    ai_tensor *y, *dcols;       /* forward: Y; backward: the input's gradient */
} fold_job;

/* Image position (in the plane) of block offset k at block position l;
 * -1 in the padding. */
static int64_t fold_at(const fold_geom *g, int64_t k, int64_t l)
{
    int64_t at[FOLD_MAX_SP], pos = 0;
    for (int d = g->r - 1; d >= 0; d--) {
        at[d] = l % g->count[d] * g->stride[d] - g->pad_begin[d] +
                k % g->block[d] * g->dilation[d];
        l /= g->count[d];
        k /= g->block[d];
        if (at[d] < 0 || at[d] >= g->image[d])
            return -1;
    }
    for (int d = 0; d < g->r; d++)
        pos = pos * g->image[d] + at[d];
    return pos;
}

static void fold_range(void *ctx, int64_t lo, int64_t hi)
{
    const fold_job *j = ctx;
    const fold_geom *g = j->g;
    int64_t plane = 1;
    for (int d = 0; d < g->r; d++)
        plane *= g->image[d];
    for (int64_t nc = lo; nc < hi; nc++) {
        const int64_t row0 = nc * g->K * g->L, out0 = nc * plane; /* (n, c) = nc */
        for (int64_t k = 0; k < g->K; k++)
            for (int64_t l = 0; l < g->L; l++) {
                const int64_t at = fold_at(g, k, l), ci = row0 + k * g->L + l;
                if (at < 0)
                    continue;
                if (j->y)
                    ai_float_set(j->y, out0 + at,
                                 ai_float_at(j->y, out0 + at) + ai_float_at(j->cols, ci));
                else
                    ai_float_set(j->dcols, ci,
                                 ai_float_at(j->dcols, ci) + ai_float_at(j->dy, out0 + at));
            }
    }
}

static ai_status fold_forward(ai_ctx *c)
{
    fold_geom g;
    ai_status st = fold_geom_of(c, &g);
    if (st)
        return st;
    fold_job j = {.g = &g, .cols = c->in[0], .y = c->out[0]};
    ai_tensor *y = c->out[0];
    memset(y->data, 0, (size_t)ai_tensor_numel(y) * ai_dtype_size(y->dtype));
    ai_parallel_for(g.N * g.C, ai_grain_of(g.K * g.L), fold_range, &j);
    return AI_OK;
}

static ai_status fold_backward(ai_ctx *c)
{
    fold_geom g;
    ai_status st = fold_geom_of(c, &g);
    if (st || !c->din[0])
        return st;
    fold_job j = {.g = &g, .dy = c->dout[0], .dcols = c->din[0]};
    ai_parallel_for(g.N * g.C, ai_grain_of(g.K * g.L), fold_range, &j);
    return AI_OK;
}

/* backward reads dY only (and the shapes) */
static const ai_op_def op_col2im = {"Col2Im", "", 3, 3, 1, 1, AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
                                    fold_init, fold_shape, fold_forward, fold_backward};

const ai_op_def *const ai_ops_fold[] = {&op_col2im, NULL};
