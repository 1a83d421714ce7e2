/*
 * pool.c — MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool (ONNX
 * opsets 11 to 21) over the kernels of kernels/pool.h, float32 and float64;
 * LpPool in reference loops (in double) on the same geometry; MaxUnpool.
 *
 * MaxPool (also of integer tensors, forward only), AveragePool and LpPool
 * take 1 to 3 spatial dims and the attributes kernel_shape, strides, pads
 * (begin..., end...), dilations, ceil_mode, auto_pad; AveragePool also
 * count_include_pad, LpPool p.
 * MaxPool's optional second output, Indices (int64), flattens like ONNX:
 * (n*C + c)*plane + position in the plane, row-major (storage_order 0) or
 * column-major (1). The global pools take any number of spatial dims and
 * give (N, C, 1, ..., 1).
 *
 * The max pools save, per output, where the maximum is (int64, in per-node
 * state) for backward, which routes the gradient to the first maximum in scan
 * order like torch. Backward accumulates into dX.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../parallel.h"
#include "spatial.h"
#include "../kernels/pool.h"

enum { MAX_POOL, AVG_POOL, GLOBAL_MAX_POOL, GLOBAL_AVG_POOL, LP_POOL, MAX_UNPOOL };

typedef struct {
    int kind, auto_pad;
    int64_t ceil_mode, count_include_pad, storage_order, p;
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
                                  "GlobalAveragePool", "LpPool", "MaxUnpool"};
    pool_attrs *a = calloc(1, sizeof *a);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    for (int k = 0; k < 6; k++)
        if (strcmp(n->op_type, names[k]) == 0)
            a->kind = k;
    if (a->kind == GLOBAL_MAX_POOL || a->kind == GLOBAL_AVG_POOL)
        return AI_OK;
    ai_status st = ai_read_auto_pad(n, &a->auto_pad);
    if (st)
        return st;
    if ((st = ai_read_int_list(n, "kernel_shape", 3, 1, &a->kernel_shape)) ||
        (st = ai_read_int_list(n, "strides", 3, 1, &a->strides)) ||
        (st = ai_read_int_list(n, "dilations", 3, 1, &a->dilations)) ||
        (st = ai_read_int_list(n, "pads", 6, 0, &a->pads)) ||
        (st = read_flag(n, "ceil_mode", &a->ceil_mode)) ||
        (st = read_flag(n, "count_include_pad", &a->count_include_pad)) ||
        (st = read_flag(n, "storage_order", &a->storage_order)) ||
        (st = ai_attr_int(n, "p", 2, &a->p)))
        return st;
    if (a->kind == LP_POOL && a->p < 1)
        return ai_node_error(n, AI_ERR_VALUE, "p is %lld; >= 1 expected", (long long)a->p);
    if (a->kernel_shape.n < 0)
        return ai_node_error(n, AI_ERR_VALUE, "kernel_shape is required");
    if (a->pads.n >= 0 && a->auto_pad != AI_PAD_NOTSET)
        return ai_node_error(n, AI_ERR_VALUE, "pads and auto_pad cannot both be given");
    return AI_OK;
}

static ai_status check_input(const ai_node *n, const ai_tensor *x, int max_rank)
{
    const pool_attrs *a = n->params;
    const bool ints = a->kind == MAX_POOL && !ai_dtype_is_float(x->dtype) && x->dtype != AI_BOOL;
    if (x->dtype != AI_F32 && x->dtype != AI_F64 && !ints)
        return ai_node_error(n, AI_ERR_TYPE, "input is %s; float32 or float64%s expected",
                             ai_dtype_name(x->dtype),
                             a->kind == MAX_POOL ? " (or an integer type)" : "");
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
    ai_status st = check_input(n, x, 5);
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
    ai_status st = check_input(c->node, x, AI_MAX_DIMS);
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
    (void)ws;
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
        if (c->n_out > 1) {
            out[1] = out[0];
            out[1].dtype = AI_I64;
        }
    }
    return AI_OK;
}

/* A row-major position in the (in...) plane as the column-major one
 * (storage_order 1: the first spatial dim varies fastest). */
static int64_t column_major(const ai_pool_params *p, int64_t pos)
{
    int64_t coord[3], r = 0, stride = 1;
    for (int d = p->nsp - 1; d >= 0; d--) {
        coord[d] = pos % p->in[d];
        pos /= p->in[d];
    }
    for (int d = 0; d < p->nsp; d++) {
        r += coord[d] * stride;
        stride *= p->in[d];
    }
    return r;
}

/* LpPool: y = (sum over the window of |x|^p)^(1/p), the padding adding 0,
 * in double. Backward: dx += dy sign(x) (|x| / y)^(p - 1), 0 where y is 0
 * (torch gives NaN there). Work splits by (n, c) plane. */
typedef struct {
    const ai_pool_params *p;
    double pw;
    const ai_tensor *x, *y, *dy;
    ai_tensor *out, *dx; /* forward: out = y */
} lp_job;

/* Where output position o's window starts in each spatial dim. */
static void window_start(const ai_pool_params *p, int64_t o, int64_t *start)
{
    for (int d = p->nsp - 1; d >= 0; d--) {
        start[d] = o % p->out[d] * p->stride[d] - p->pad_begin[d];
        o /= p->out[d];
    }
}

/* The taps of the window at `start` that fall inside the input, in scan
 * order (the first kernel dim slowest): per dim the kernel indices [lo, hi)
 * inside, so a window mostly in the padding costs only its taps inside (a
 * kernel of 2^31 with SAME padding does not loop 2^31 times). */
typedef struct {
    int64_t k[3], lo[3], hi[3];
} tap_iter;

/* False when no tap of the window is inside. */
static bool taps_begin(const ai_pool_params *p, const int64_t *start, tap_iter *t)
{
    for (int d = 0; d < p->nsp; d++) {
        const int64_t dil = p->dilation[d], room = p->in[d] - start[d];
        t->lo[d] = start[d] < 0 ? (-start[d] + dil - 1) / dil : 0;
        t->hi[d] = room <= 0 ? 0 : (room + dil - 1) / dil;
        if (t->hi[d] > p->kernel[d])
            t->hi[d] = p->kernel[d];
        if (t->lo[d] >= t->hi[d])
            return false;
        t->k[d] = t->lo[d];
    }
    return true;
}

static bool taps_next(const ai_pool_params *p, tap_iter *t)
{
    for (int d = p->nsp - 1; d >= 0; d--) {
        if (++t->k[d] < t->hi[d])
            return true;
        t->k[d] = t->lo[d];
    }
    return false;
}

/* The current tap's position in the plane. */
static int64_t tap_pos(const ai_pool_params *p, const int64_t *start, const tap_iter *t)
{
    int64_t pos = 0;
    for (int d = 0; d < p->nsp; d++)
        pos = pos * p->in[d] + start[d] + t->k[d] * p->dilation[d];
    return pos;
}

static void lp_range(void *ctx, int64_t lo, int64_t hi)
{
    const lp_job *j = ctx;
    const ai_pool_params *p = j->p;
    const int64_t plane = prod(p->in, p->nsp), oplane = prod(p->out, p->nsp);
    int64_t start[3];
    tap_iter t;
    for (int64_t pl = lo; pl < hi; pl++)
        for (int64_t o = 0; o < oplane; o++) {
            const int64_t at = pl * oplane + o;
            window_start(p, o, start);
            if (!j->dx) {
                double sum = 0;
                if (taps_begin(p, start, &t))
                    do
                        sum += pow(fabs(ai_float_at(j->x, pl * plane + tap_pos(p, start, &t))), j->pw);
                    while (taps_next(p, &t));
                ai_float_set(j->out, at, pow(sum, 1 / j->pw));
                continue;
            }
            const double y = ai_float_at(j->y, at), g = ai_float_at(j->dy, at);
            if (y == 0 || !taps_begin(p, start, &t))
                continue;
            do {
                const int64_t xi = pl * plane + tap_pos(p, start, &t);
                const double xv = ai_float_at(j->x, xi);
                const double d = (xv > 0 ? g : xv < 0 ? -g : 0) * pow(fabs(xv) / y, j->pw - 1);
                ai_float_set(j->dx, xi, ai_float_at(j->dx, xi) + d);
            } while (taps_next(p, &t));
        }
}

/* MaxPool of an integer tensor, forward only: the first maximum in scan
 * order, and its position in the plane (idx). */
static void int_maxpool(const ai_pool_params *p, const ai_tensor *x, ai_tensor *y, int64_t *idx)
{
    const int64_t plane = prod(p->in, p->nsp), oplane = prod(p->out, p->nsp);
    const size_t size = ai_dtype_size(x->dtype);
    int64_t start[3];
    tap_iter t;
    for (int64_t pl = 0; pl < p->N * p->C; pl++)
        for (int64_t o = 0; o < oplane; o++) {
            int64_t best = -1, best_v = 0;
            window_start(p, o, start);
            if (taps_begin(p, start, &t))
                do {
                    const int64_t pos = tap_pos(p, start, &t);
                    const int64_t v = ai_tensor_get_flat_i64(x, pl * plane + pos);
                    if (best < 0 || v > best_v) {
                        best = pos;
                        best_v = v;
                    }
                } while (taps_next(p, &t));
            /* (a window in the padding alone: the plane's first element) */
            best = best < 0 ? 0 : best;
            memcpy((char *)y->data + (size_t)(pl * oplane + o) * size,
                   (const char *)x->data + (size_t)(pl * plane + best) * size, size);
            if (idx)
                idx[pl * oplane + o] = best;
        }
}

static void lp_run(const ai_ctx *c, const ai_pool_params *p, bool backward)
{
    lp_job j = {.p = p, .pw = (double)((const pool_attrs *)c->node->params)->p, .x = c->in[0]};
    if (backward) {
        j.y = c->out[0];
        j.dy = c->dout[0];
        j.dx = c->din[0];
    } else {
        j.out = c->out[0];
    }
    ai_parallel_for(p->N * p->C, ai_grain_of(prod(p->out, p->nsp) * prod(p->kernel, p->nsp)),
                    lp_range, &j);
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
    if (a->kind == LP_POOL) {
        lp_run(c, &p, false);
        return AI_OK;
    }
    if (a->kind == AVG_POOL) {
        if (f32)
            ai_avgpool_forward_f32(&p, y, x);
        else
            ai_avgpool_forward_f64(&p, y, x);
        return AI_OK;
    }
    if (!ai_dtype_is_float(c->in[0]->dtype))
        int_maxpool(&p, c->in[0], c->out[0], idx);
    else if (f32)
        ai_maxpool_forward_f32(&p, y, idx, x);
    else
        ai_maxpool_forward_f64(&p, y, idx, x);
    if (c->n_out > 1) { /* ONNX Indices: positions in the whole (N, C, in...) tensor */
        int64_t *ind = c->out[1]->data, plane = prod(p.in, p.nsp);
        int64_t OS = prod(p.out, p.nsp), total = p.N * p.C * OS;
        for (int64_t i = 0; i < total; i++)
            ind[i] = (a->storage_order ? column_major(&p, idx[i]) : idx[i]) + i / OS * plane;
    }
    return AI_OK;
}

static ai_status pool_backward(ai_ctx *c)
{
    const pool_attrs *a = c->node->params;
    const bool f32 = c->in[0]->dtype == AI_F32;
    if (!c->din[0]) /* (an integer MaxPool: no gradient) */
        return AI_OK;
    void *dx = c->din[0]->data;
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
    if (a->kind == LP_POOL)
        lp_run(c, &p, true);
    else if (a->kind == MAX_POOL && f32)
        ai_maxpool_backward_f32(&p, dx, dy, idx);
    else if (a->kind == MAX_POOL)
        ai_maxpool_backward_f64(&p, dx, dy, idx);
    else if (f32)
        ai_avgpool_backward_f32(&p, dx, dy);
    else
        ai_avgpool_backward_f64(&p, dx, dy);
    return AI_OK;
}

/* MaxUnpool: X's values placed at I's flat indices, as MaxPool's Indices
 * give them, into zeros of output_shape or else of the unpooled shape
 * ((in - 1) * stride + kernel - pads per spatial dim); a later j wins a
 * repeated index. With output_shape the indices count in it, as torch's
 * max_unpool and ONNX Runtime (MaxPool's input shape: the round trip);
 * ONNX's reference counts them in the unpooled shape, padded at the end.
 * Backward dX[j] += dY.flat[I[j]]. */
static ai_status unpool_shape(ai_ctx *c, ai_meta *meta, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    int64_t *out = meta[0].shape;
    const ai_node *n = c->node;
    const pool_attrs *a = n->params;
    const ai_tensor *x = c->in[0], *ind = c->in[1];
    ai_status st = check_input(n, x, 5);
    if (st)
        return st;
    if (ind->dtype != AI_I64 || ind->ndim != x->ndim ||
        memcmp(ind->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
        return ai_node_error(n, AI_ERR_VALUE, "I must be int64 of X's shape; it is %s of rank "
                             "%d", ai_dtype_name(ind->dtype), ind->ndim);
    const int nsp = x->ndim - 2;
    int64_t kernel[3], stride[3];
    if ((st = ai_spatial_list(n, "kernel_shape", &a->kernel_shape, nsp, 1, kernel)) ||
        (st = ai_spatial_list(n, "strides", &a->strides, nsp, 1, stride)))
        return st;
    if (a->pads.n >= 0 && a->pads.n != 2 * nsp)
        return ai_node_error(n, AI_ERR_VALUE, "pads has %lld values; %d (begin..., end...) "
                             "expected", (long long)a->pads.n, 2 * nsp);
    meta[0].dtype = x->dtype;
    meta[0].ndim = x->ndim;
    out[0] = x->shape[0];
    out[1] = x->shape[1];
    for (int d = 0; d < nsp; d++) {
        const int64_t pads = a->pads.n < 0 ? 0 : a->pads.v[d] + a->pads.v[nsp + d];
        out[2 + d] = (x->shape[2 + d] - 1) * stride[d] + kernel[d] - pads;
        if (out[2 + d] < 0)
            return ai_node_error(n, AI_ERR_VALUE, "spatial dim %d: the pads (%lld) exceed the "
                                 "unpooled size", d, (long long)pads);
    }
    if (c->n_in < 3 || !c->in[2])
        return AI_OK;
    const ai_tensor *shape = ai_ctx_const(c, 2);
    if (!shape && !(shape = c->in[2]->data ? c->in[2] : NULL))
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "output_shape must be known when the "
                             "graph is planned (a constant or a graph input)");
    if (ai_tensor_numel(shape) != x->ndim)
        return ai_node_error(n, AI_ERR_VALUE, "output_shape has %lld values; %d expected",
                             (long long)ai_tensor_numel(shape), x->ndim);
    for (int d = 0; d < x->ndim; d++) {
        const int64_t v = ai_tensor_get_flat_i64(shape, d);
        if (d < 2 ? v != x->shape[d] : v < 0 || v > INT32_MAX)
            return ai_node_error(n, AI_ERR_VALUE, "output_shape[%d] is %lld; %s expected", d,
                                 (long long)v, d < 2 ? "X's N and C" : "a size");
        out[d] = v;
    }
    return AI_OK;
}

static ai_status unpool_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    const int64_t *ind = c->in[1]->data;
    ai_tensor *y = c->out[0];
    const int64_t total = ai_tensor_numel(y);
    memset(y->data, 0, (size_t)total * ai_dtype_size(y->dtype));
    for (int64_t j = 0; j < ai_tensor_numel(x); j++) {
        if (ind[j] < 0 || ind[j] >= total)
            return ai_node_error(c->node, AI_ERR_INDEX, "I[%lld] is %lld; outside the %lld "
                                 "elements of the output", (long long)j, (long long)ind[j],
                                 (long long)total);
        ai_float_set(y, ind[j], ai_float_at(x, j));
    }
    return AI_OK;
}

/* (forward checked the indices) */
static ai_status unpool_backward(ai_ctx *c)
{
    const int64_t *ind = c->in[1]->data;
    ai_tensor *dx = c->din[0];
    for (int64_t j = 0; dx && j < ai_tensor_numel(dx); j++)
        ai_float_set(dx, j, ai_float_at(dx, j) + ai_float_at(c->dout[0], ind[j]));
    return AI_OK;
}

/* backward reads I, not X's or Y's values */
static const ai_op_def op_max_unpool = {"MaxUnpool", "", 2, 3, 1, 1, AI_OP_BWD_NO_Y, pool_init,
                                        unpool_shape, unpool_forward, unpool_backward};

/* backward reads dy and the max positions kept in the state: no value */
#define POOL_OP(VAR, NAME, NOUT)                                                          \
    static const ai_op_def VAR = {NAME, "", 1, 1, 1, NOUT,                                \
                                  AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y | AI_OP_UNSIGNED,       \
                                  pool_init, pool_shape, pool_forward, pool_backward};

POOL_OP(op_max_pool, "MaxPool", 2)
POOL_OP(op_average_pool, "AveragePool", 1)
POOL_OP(op_global_max_pool, "GlobalMaxPool", 1)
POOL_OP(op_global_average_pool, "GlobalAveragePool", 1)
/* backward reads x and y */
static const ai_op_def op_lp_pool = {"LpPool", "", 1, 1, 1, 1, 0, pool_init, pool_shape,
                                     pool_forward, pool_backward};

const ai_op_def *const ai_ops_pool[] = {
    &op_max_pool, &op_average_pool, &op_global_max_pool, &op_global_average_pool, &op_lp_pool,
    &op_max_unpool, NULL,
};
