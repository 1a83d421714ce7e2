/*
 * pool.c — MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool (ONNX
 * opsets 11 to 21) over the kernels of kernels/pool.h, float32 and float64;
 * MaxPool also int8 and uint8 (quantized models), through float32 copies
 * in the workspace (exact).
 *
 * MaxPool and AveragePool take 1 to 3 spatial dims and the attributes
 * kernel_shape, strides, pads (begin..., end...), dilations, ceil_mode,
 * auto_pad; AveragePool also count_include_pad. MaxPool's optional second
 * output, Indices (int64), flattens like ONNX: (n*C + c)*plane + position in
 * the plane, row-major (storage_order 0; 1 is not supported). The global
 * pools take any number of spatial dims and give (N, C, 1, ..., 1).
 *
 * The max pools save, per output, where the maximum is (int64, in per-node
 * state) for backward, which routes the gradient to the first maximum in scan
 * order like torch. Backward accumulates into dX.
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "spatial.h"
#include "../kernels/pool.h"

enum { MAX_POOL, AVG_POOL, GLOBAL_MAX_POOL, GLOBAL_AVG_POOL };

typedef struct {
    int kind, auto_pad;
    int64_t ceil_mode, count_include_pad;
    ai_int_list kernel_shape, strides, dilations, pads;
} pool_attrs;

/* Reads a 0/1 int attribute. */
static ai_status read_flag(const ai_node *n, const char *name, int64_t *out)
{
    ai_status st = ai_attr_int(n, name, 0, out);
    if (!st && *out != 0 && *out != 1)
        return ai_node_error(n, AI_ERR_VALUE, "%s is %lld; 0 or 1 expected", name,
                             (long long)*out);
    return st;
}

static ai_status pool_init(ai_node *n)
{
    static const char *names[] = {"MaxPool", "AveragePool", "GlobalMaxPool",
                                  "GlobalAveragePool"};
    pool_attrs *a = calloc(1, sizeof *a);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    for (int k = 0; k < 4; k++)
        if (strcmp(n->op_type, names[k]) == 0)
            a->kind = k;
    if (a->kind == GLOBAL_MAX_POOL || a->kind == GLOBAL_AVG_POOL)
        return AI_OK;
    int64_t storage_order;
    ai_status st = ai_read_auto_pad(n, &a->auto_pad);
    if (st)
        return st;
    if ((st = ai_read_int_list(n, "kernel_shape", 3, 1, &a->kernel_shape)) ||
        (st = ai_read_int_list(n, "strides", 3, 1, &a->strides)) ||
        (st = ai_read_int_list(n, "dilations", 3, 1, &a->dilations)) ||
        (st = ai_read_int_list(n, "pads", 6, 0, &a->pads)) ||
        (st = read_flag(n, "ceil_mode", &a->ceil_mode)) ||
        (st = read_flag(n, "count_include_pad", &a->count_include_pad)) ||
        (st = read_flag(n, "storage_order", &storage_order)))
        return st;
    if (a->kernel_shape.n < 0)
        return ai_node_error(n, AI_ERR_VALUE, "kernel_shape is required");
    if (a->pads.n >= 0 && a->auto_pad != AI_PAD_NOTSET)
        return ai_node_error(n, AI_ERR_VALUE, "pads and auto_pad cannot both be given");
    if (storage_order && n->n_out > 1)
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "storage_order 1 (column-major "
                             "Indices) is not supported");
    return AI_OK;
}

static bool is_8bit(const ai_tensor *x) { return x->dtype == AI_I8 || x->dtype == AI_U8; }

/* x: float32 or float64, or with `any8` int8 or uint8 */
static ai_status check_input(const ai_node *n, const ai_tensor *x, int max_rank, bool any8)
{
    if (x->dtype != AI_F32 && x->dtype != AI_F64 && !(any8 && is_8bit(x)))
        return ai_node_error(n, AI_ERR_TYPE, "input is %s; float32 or float64%s expected",
                             ai_dtype_name(x->dtype), any8 ? " (or int8, uint8)" : "");
    if (x->ndim < 3 || x->ndim > max_rank)
        return ai_node_error(n, AI_ERR_VALUE, "input has rank %d; (N, C, spatial...) with 1 "
                             "to %d spatial dims expected", x->ndim, max_rank - 2);
    return AI_OK;
}

/* Fills *p for MaxPool / AveragePool from the attributes and the input's
 * shape, validating everything (errors name the attribute). */
static ai_status pool_setup(const ai_ctx *c, ai_pool_params *p)
{
    const ai_node *n = c->node;
    const pool_attrs *a = n->params;
    const ai_tensor *x = c->in[0];
    ai_status st = check_input(n, x, 5, a->kind == MAX_POOL);
    if (st)
        return st;
    const int nsp = x->ndim - 2;
    memset(p, 0, sizeof *p);
    p->nsp = nsp;
    p->N = x->shape[0];
    p->C = x->shape[1];
    p->ceil_mode = a->ceil_mode;
    p->count_include_pad = a->count_include_pad;
    if ((st = ai_spatial_list(n, "kernel_shape", &a->kernel_shape, nsp, 1, p->kernel)) ||
        (st = ai_spatial_list(n, "strides", &a->strides, nsp, 1, p->stride)) ||
        (st = ai_spatial_list(n, "dilations", &a->dilations, nsp, 1, p->dilation)))
        return st;
    if (a->pads.n >= 0 && a->pads.n != 2 * nsp)
        return ai_node_error(n, AI_ERR_VALUE, "pads has %lld values; %d (begin..., end...) "
                             "expected", (long long)a->pads.n, 2 * nsp);
    for (int d = 0; d < nsp; d++) {
        int64_t in = x->shape[2 + d], s = p->stride[d];
        int64_t extent = (p->kernel[d] - 1) * p->dilation[d] + 1;
        p->in[d] = in;
        if (a->auto_pad == AI_PAD_SAME_UPPER || a->auto_pad == AI_PAD_SAME_LOWER) {
            /* out = ceil(in / stride); AI_PAD_SAME_UPPER puts the odd pad at the end */
            int64_t total = ((in + s - 1) / s - 1) * s + extent - in;
            total = total > 0 ? total : 0;
            p->pad_begin[d] = a->auto_pad == AI_PAD_SAME_UPPER ? total / 2 : total - total / 2;
            p->pad_end[d] = total - p->pad_begin[d];
        } else if (a->pads.n >= 0) {
            p->pad_begin[d] = a->pads.v[d];
            p->pad_end[d] = a->pads.v[nsp + d];
        }
        if (in + p->pad_begin[d] + p->pad_end[d] < extent)
            return ai_node_error(n, AI_ERR_VALUE, "spatial dim %d: the window spans %lld "
                                 "(kernel_shape %lld, dilations %lld) but the padded input "
                                 "has %lld", d, (long long)extent, (long long)p->kernel[d],
                                 (long long)p->dilation[d],
                                 (long long)(in + p->pad_begin[d] + p->pad_end[d]));
    }
    if ((st = ai_pool_infer_out(p)))
        return ai_node_error(n, st, "%s", ai_last_error());
    return AI_OK;
}

/* Global pools: x seen as (NC, S). */
static ai_status global_setup(const ai_ctx *c, int64_t *NC, int64_t *S)
{
    const ai_tensor *x = c->in[0];
    ai_status st = check_input(c->node, x, AI_MAX_DIMS, false);
    if (st)
        return st;
    *NC = x->shape[0] * x->shape[1];
    *S = 1;
    for (int d = 2; d < x->ndim; d++) {
        if (x->shape[d] == 0)
            return ai_node_error(c->node, AI_ERR_VALUE, "spatial dim %d is empty", d - 2);
        *S *= x->shape[d];
    }
    return AI_OK;
}

static int64_t prod(const int64_t *v, int n)
{
    int64_t r = 1;
    for (int i = 0; i < n; i++)
        r *= v[i];
    return r;
}

static ai_status pool_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    const pool_attrs *a = c->node->params;
    const ai_tensor *x = c->in[0];
    ai_status st;
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    out[0].shape[0] = x->shape[0];
    out[0].shape[1] = x->shape[1];
    if (a->kind == GLOBAL_MAX_POOL || a->kind == GLOBAL_AVG_POOL) {
        int64_t NC, S;
        if ((st = global_setup(c, &NC, &S)))
            return st;
        for (int d = 2; d < x->ndim; d++)
            out[0].shape[d] = 1;
        if (a->kind == GLOBAL_MAX_POOL)
            *state = (size_t)NC * sizeof(int64_t);
        return AI_OK;
    }
    ai_pool_params p;
    if ((st = pool_setup(c, &p)))
        return st;
    memcpy(out[0].shape + 2, p.out, sizeof(int64_t) * (size_t)p.nsp);
    if (a->kind == MAX_POOL) {
        *state = (size_t)(p.N * p.C * prod(p.out, p.nsp)) * sizeof(int64_t);
        if (is_8bit(x)) /* float32 copies of x and y */
            *ws = (size_t)(ai_tensor_numel(x) + p.N * p.C * prod(p.out, p.nsp)) * sizeof(float);
        if (c->n_out > 1) {
            out[1] = out[0];
            out[1].dtype = AI_I64;
        }
    }
    return AI_OK;
}

static ai_status pool_forward(ai_ctx *c)
{
    const pool_attrs *a = c->node->params;
    const bool f32 = c->in[0]->dtype == AI_F32;
    void *y = c->out[0]->data;
    const void *x = c->in[0]->data;
    /* the maxima's positions: for backward and the Indices output only */
    int64_t *idx = c->g->need_backward || c->n_out > 1 ? c->state : NULL;
    ai_status st;
    if (a->kind == GLOBAL_MAX_POOL || a->kind == GLOBAL_AVG_POOL) {
        int64_t NC, S;
        if ((st = global_setup(c, &NC, &S)))
            return st;
        if (a->kind == GLOBAL_MAX_POOL && f32)
            ai_global_maxpool_forward_f32(y, idx, x, NC, S);
        else if (a->kind == GLOBAL_MAX_POOL)
            ai_global_maxpool_forward_f64(y, idx, x, NC, S);
        else if (f32)
            ai_global_avgpool_forward_f32(y, x, NC, S);
        else
            ai_global_avgpool_forward_f64(y, x, NC, S);
        return AI_OK;
    }
    ai_pool_params p;
    if ((st = pool_setup(c, &p)))
        return st;
    if (a->kind == AVG_POOL) {
        if (f32)
            ai_avgpool_forward_f32(&p, y, x);
        else
            ai_avgpool_forward_f64(&p, y, x);
        return AI_OK;
    }
    if (is_8bit(c->in[0])) {
        const int64_t nx = ai_tensor_numel(c->in[0]), ny = ai_tensor_numel(c->out[0]);
        const bool u8 = c->in[0]->dtype == AI_U8;
        float *xf = c->workspace, *yf = xf + nx;
        for (int64_t i = 0; i < nx; i++)
            xf[i] = u8 ? ((const uint8_t *)x)[i] : ((const int8_t *)x)[i];
        ai_maxpool_forward_f32(&p, yf, idx, xf);
        for (int64_t i = 0; i < ny; i++)
            if (u8)
                ((uint8_t *)y)[i] = (uint8_t)yf[i];
            else
                ((int8_t *)y)[i] = (int8_t)yf[i];
    } else if (f32) {
        ai_maxpool_forward_f32(&p, y, idx, x);
    } else {
        ai_maxpool_forward_f64(&p, y, idx, x);
    }
    if (c->n_out > 1) { /* ONNX Indices: positions in the whole (N, C, in...) tensor */
        int64_t *ind = c->out[1]->data, plane = prod(p.in, p.nsp);
        int64_t OS = prod(p.out, p.nsp), total = p.N * p.C * OS;
        for (int64_t i = 0; i < total; i++)
            ind[i] = idx[i] + i / OS * plane;
    }
    return AI_OK;
}

static ai_status pool_backward(ai_ctx *c)
{
    const pool_attrs *a = c->node->params;
    const bool f32 = c->in[0]->dtype == AI_F32;
    void *dx = c->din[0]->data; /* the only input: backward runs only when it needs it */
    const void *dy = c->dout[0]->data;
    const int64_t *idx = c->state;
    ai_status st;
    if (a->kind == GLOBAL_MAX_POOL || a->kind == GLOBAL_AVG_POOL) {
        int64_t NC, S;
        if ((st = global_setup(c, &NC, &S)))
            return st;
        if (a->kind == GLOBAL_MAX_POOL && f32)
            ai_global_maxpool_backward_f32(dx, dy, idx, NC, S);
        else if (a->kind == GLOBAL_MAX_POOL)
            ai_global_maxpool_backward_f64(dx, dy, idx, NC, S);
        else if (f32)
            ai_global_avgpool_backward_f32(dx, dy, NC, S);
        else
            ai_global_avgpool_backward_f64(dx, dy, NC, S);
        return AI_OK;
    }
    ai_pool_params p;
    if ((st = pool_setup(c, &p)))
        return st;
    if (a->kind == MAX_POOL && f32)
        ai_maxpool_backward_f32(&p, dx, dy, idx);
    else if (a->kind == MAX_POOL)
        ai_maxpool_backward_f64(&p, dx, dy, idx);
    else if (f32)
        ai_avgpool_backward_f32(&p, dx, dy);
    else
        ai_avgpool_backward_f64(&p, dx, dy);
    return AI_OK;
}

/* backward reads dy and the max positions kept in the state: no value */
#define POOL_OP(VAR, NAME, NOUT)                                                          \
    static const ai_op_def VAR = {NAME, "", 1, 1, 1, NOUT, AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, \
                                  pool_init, pool_shape, pool_forward, pool_backward};

POOL_OP(op_max_pool, "MaxPool", 2)
POOL_OP(op_average_pool, "AveragePool", 1)
POOL_OP(op_global_max_pool, "GlobalMaxPool", 1)
POOL_OP(op_global_average_pool, "GlobalAveragePool", 1)

const ai_op_def *const ai_ops_pool[] = {
    &op_max_pool, &op_average_pool, &op_global_max_pool, &op_global_average_pool, NULL,
};
