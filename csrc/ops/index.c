/*
 * index.c — operators that pick elements by index: Gather (slices of the
 * data at the indices along an axis), GatherElements (one element per
 * index), Trilu (the elements on one side of a diagonal) and OneHot (the
 * on value at each index, the off value elsewhere). Backward adds the
 * output gradient back to the picked places (a data-movement family:
 * movement.h).
 */
#include <string.h>

#include "../parallel.h"
#include "movement.h"

/* ---------------------------------------------------------------- Trilu, GatherElements */

/* element i of a float32/float64 gradient, written from a double */
static void put_d(ai_tensor *t, int64_t i, double v)
{
    if (t->dtype == AI_F32)
        ((float *)t->data)[i] = (float)v;
    else
        ((double *)t->data)[i] = v;
}

/* Trilu: X's last two dims keep the elements on and above (upper = 1) or on
 * and below (upper = 0) diagonal k (an optional constant input), the rest
 * 0; backward masks dY the same way. */
static ai_status trilu_k(const ai_ctx *c, int64_t *k, int64_t *upper)
{
    *k = 0;
    ai_status st = ai_attr_int(c->node, "upper", 1, upper);
    if (st || c->n_in < 2 || !c->in[1])
        return st;
    return ai_ctx_int_scalar(c, 1, "k", k);
}

static ai_status trilu_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int64_t k, upper;
    ai_status st = trilu_k(c, &k, &upper);
    if (!st && c->in[0]->ndim < 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank %d; >= 2 expected",
                             c->in[0]->ndim);
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
}

/* dst = src masked (add: dst += src masked: float gradients) */
static void trilu_run(const ai_tensor *src, ai_tensor *dst, int64_t k, bool upper, bool add)
{
    const int nd = src->ndim;
    const int64_t R = src->shape[nd - 2], C = src->shape[nd - 1];
    const int64_t mats = R && C ? ai_tensor_numel(src) / (R * C) : 0;
    const size_t es = ai_dtype_size(src->dtype);
    for (int64_t m = 0; m < mats; m++)
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                const int64_t at = (m * R + i) * C + j;
                const bool keep = upper ? j - i >= k : j - i <= k;
                char *d = (char *)dst->data + at * (int64_t)es;
                if (add) {
                    if (keep)
                        put_d(dst, at, ai_tensor_get_flat(dst, at) + ai_tensor_get_flat(src, at));
                } else if (keep) {
                    memcpy(d, (const char *)src->data + at * (int64_t)es, es);
                } else {
                    memset(d, 0, es);
                }
            }
}

static ai_status trilu_forward(ai_ctx *c)
{
    int64_t k, upper;
    ai_status st = trilu_k(c, &k, &upper);
    if (!st)
        trilu_run(c->in[0], c->out[0], k, upper != 0, false);
    return st;
}

static ai_status trilu_backward(ai_ctx *c)
{
    int64_t k, upper;
    ai_status st = trilu_k(c, &k, &upper);
    if (!st && !(st = ai_check_grad_dtype(c, c->din[0])))
        trilu_run(c->dout[0], c->din[0], k, upper != 0, !c->din_assign[0]);
    return st;
}

/* GatherElements: Y has the shape of `indices`; Y[i...] = X[i...] with the
 * index along `axis` replaced by indices[i...] (negative from the end).
 * Backward adds dY[i...] into dX at the same place. */
typedef struct {
    int axis, nd;
    int64_t xs[AI_MAX_DIMS]; /* X's contiguous strides */
} ge_plan;

static ai_status ge_setup(const ai_ctx *c, ge_plan *p)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    int64_t a;
    ai_status st = ai_attr_int(c->node, "axis", 0, &a);
    if (!st)
        st = ai_norm_axis(c->node, a, x->ndim, &p->axis);
    if (st)
        return st;
    if (idx->dtype != AI_I64 && idx->dtype != AI_I32)
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s; int32 or int64 expected",
                             ai_dtype_name(idx->dtype));
    if (idx->ndim != x->ndim)
        return ai_node_error(c->node, AI_ERR_VALUE, "indices have rank %d, data rank %d",
                             idx->ndim, x->ndim);
    for (int d = 0; d < x->ndim; d++)
        if (d != p->axis && idx->shape[d] > x->shape[d])
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "indices dim %d is %lld, larger than data's %lld", d,
                                 (long long)idx->shape[d], (long long)x->shape[d]);
    p->nd = x->ndim;
    ai_contiguous_strides(x->ndim, x->shape, p->xs);
    return AI_OK;
}

static ai_status ge_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    ge_plan p;
    ai_status st = ge_setup(c, &p);
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, c->in[1]->ndim, c->in[1]->shape);
}

/* Over each element e of indices and its offset in X: forward copies X's
 * element into dst[e], backward adds src[e] into dst at that offset. */
static ai_status ge_walk(const ai_ctx *c, const ge_plan *p, ai_tensor *dst,
                         const ai_tensor *src, bool backward, bool add)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    const int64_t n = ai_tensor_numel(idx), len = x->shape[p->axis];
    const size_t es = ai_dtype_size(x->dtype);
    int64_t mi[AI_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; e++) {
        int64_t k = ai_tensor_get_flat_i64(idx, e);
        if (k < -len || k >= len)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "index %lld is out of range for axis %d of size %lld",
                                 (long long)k, p->axis, (long long)len);
        k = k < 0 ? k + len : k;
        int64_t off = 0;
        for (int d = 0; d < p->nd; d++)
            off += (d == p->axis ? k : mi[d]) * p->xs[d];
        if (!backward)
            memcpy((char *)dst->data + e * (int64_t)es,
                   (const char *)src->data + off * (int64_t)es, es);
        else if (add)
            put_d(dst, off, ai_tensor_get_flat(dst, off) + ai_tensor_get_flat(src, e));
        for (int d = p->nd - 1; d >= 0; d--) {
            if (++mi[d] < idx->shape[d])
                break;
            mi[d] = 0;
        }
    }
    return AI_OK;
}

static ai_status ge_forward(ai_ctx *c)
{
    ge_plan p;
    ai_status st = ge_setup(c, &p);
    return st ? st : ge_walk(c, &p, c->out[0], c->in[0], false, false);
}

static ai_status ge_backward(ai_ctx *c)
{
    ge_plan p;
    ai_status st = ge_setup(c, &p);
    if (st || !c->din[0] || (st = ai_check_grad_dtype(c, c->din[0])))
        return st;
    if (c->din_assign[0] && ai_tensor_nbytes(c->din[0]))
        memset(c->din[0]->data, 0, ai_tensor_nbytes(c->din[0]));
    return ge_walk(c, &p, c->din[0], c->dout[0], true, true);
}

/* ---------------------------------------------------------------- Gather */

static ai_status gather_axis(const ai_ctx *c, int *axis)
{
    int64_t a;
    ai_status st = ai_attr_int(c->node, "axis", 0, &a);
    if (!st && c->in[0]->ndim == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "cannot gather from a scalar");
    return st ? st : ai_norm_axis(c->node, a, c->in[0]->ndim, axis);
}

static ai_status gather_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    int a;
    ai_status st = gather_axis(c, &a);
    if (st)
        return st;
    if (idx->dtype != AI_I64 && idx->dtype != AI_I32)
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s; int64 or int32 expected",
                             ai_dtype_name(idx->dtype));
    const int nd = x->ndim - 1 + idx->ndim;
    if (nd > AI_MAX_DIMS)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "output rank %d exceeds %d", nd,
                             AI_MAX_DIMS);
    int64_t s[AI_MAX_DIMS];
    memcpy(s, x->shape, sizeof(int64_t) * (size_t)a);
    memcpy(s + a, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    memcpy(s + a + idx->ndim, x->shape + a + 1, sizeof(int64_t) * (size_t)(x->ndim - a - 1));
    return ai_set_meta(&out[0], x->dtype, nd, s);
}

/* Index i of the indices, made non-negative; -1 when out of range. */
static int64_t gather_index(const ai_tensor *idx, int64_t i, int64_t dim)
{
    int64_t v = idx->dtype == AI_I64 ? ((const int64_t *)idx->data)[i]
                                     : ((const int32_t *)idx->data)[i];
    if (v < 0)
        v += dim;
    return v >= 0 && v < dim ? v : -1;
}

/* Gather's rows: data (outer, dim, inner) and out (outer, ni, inner) of
 * es-byte elements. Forward: items are output rows, each in `blocks` pieces
 * of at least the pool's grain (one long row, as a scalar index on the
 * first axis takes, is split too). Backward: items are
 * (o, block of GATHER_BLOCK columns), each adding the rows of dy to dx at
 * the indices in index order, so that a repeated index sums its rows in
 * the same order at any thread count (a split by rows would race on it). */
#define GATHER_BLOCK 64
typedef struct {
    const ai_tensor *idx;
    const char *src;
    char *dst;
    size_t es;
    int64_t dim, ni, inner, blocks;
} gather_job;

static void gather_rows(void *ctx, int64_t lo, int64_t hi)
{
    const gather_job *j = ctx;
    const size_t row = (size_t)j->inner * j->es;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t r = it / j->blocks, p = it % j->blocks;
        const int64_t o = r / j->ni, i = r % j->ni;
        const size_t a = (size_t)(j->inner * p / j->blocks) * j->es;
        const size_t b = (size_t)(j->inner * (p + 1) / j->blocks) * j->es;
        memcpy(j->dst + (size_t)r * row + a,
               j->src + (size_t)(o * j->dim + gather_index(j->idx, i, j->dim)) * row + a, b - a);
    }
}

static void gather_add_blocks(void *ctx, int64_t lo, int64_t hi)
{
    const gather_job *j = ctx;
    const ai_row_fn add = j->es == sizeof(float) ? ai_row_add_f32 : ai_row_add_f64;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t o = it / j->blocks, c0 = it % j->blocks * GATHER_BLOCK;
        const int64_t n = j->inner - c0 < GATHER_BLOCK ? j->inner - c0 : GATHER_BLOCK;
        for (int64_t i = 0; i < j->ni; i++) {
            const int64_t to = (o * j->dim + gather_index(j->idx, i, j->dim)) * j->inner + c0;
            const int64_t from = (o * j->ni + i) * j->inner + c0;
            add(j->dst + (size_t)to * j->es, 1, j->src + (size_t)from * j->es, 1, n, j->es);
        }
    }
}

/* data (outer, dim, inner), indices (ni) -> out (outer, ni, inner) */
static ai_status gather_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    int a;
    ai_status st = gather_axis(c, &a);
    if (st)
        return st;
    const int64_t outer = ai_shape_prod(x->shape, 0, a), dim = x->shape[a];
    const int64_t inner = ai_shape_prod(x->shape, a + 1, x->ndim), ni = ai_tensor_numel(idx);
    for (int64_t i = 0; i < ni; i++)
        if (gather_index(idx, i, dim) < 0)
            return ai_node_error(c->node, AI_ERR_INDEX,
                                 "index %g is out of range for axis %d of size %lld",
                                 ai_tensor_get_flat(idx, i), a, (long long)dim);
    if (!inner)
        return AI_OK;
    const int64_t pieces = inner >= 2 * AI_GRAIN_ELEMS ? inner / AI_GRAIN_ELEMS : 1;
    gather_job j = {idx, x->data, c->out[0]->data, ai_dtype_size(x->dtype), dim, ni, inner,
                    pieces};
    ai_parallel_for(outer * ni * pieces, pieces > 1 ? 1 : ai_grain_of(inner), gather_rows, &j);
    return AI_OK;
}

/* dx[o, idx[i], :] += dy[o, i, :]; repeated indices accumulate */
static ai_status gather_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    ai_tensor *dx = c->din[0];
    int a;
    ai_status st = gather_axis(c, &a);
    if (!st && dx)
        st = ai_check_grad_dtype(c, dx);
    if (st || !dx)
        return st;
    const int64_t outer = ai_shape_prod(x->shape, 0, a), dim = x->shape[a];
    const int64_t inner = ai_shape_prod(x->shape, a + 1, x->ndim), ni = ai_tensor_numel(idx);
    if (!inner)
        return AI_OK;
    const int64_t block = inner < GATHER_BLOCK ? inner : GATHER_BLOCK;
    gather_job j = {idx, c->dout[0]->data, dx->data, ai_dtype_size(dx->dtype), dim, ni, inner,
                    (inner + GATHER_BLOCK - 1) / GATHER_BLOCK};
    ai_parallel_for(outer * j.blocks, ai_grain_of(ni * block), gather_add_blocks, &j);
    return AI_OK;
}

/* ---------------------------------------------------------------- OneHot */

/* OneHot(indices, depth, values = [off, on]): the indices' shape with an
 * axis of `depth` inserted at `axis` (default -1: last), `on` where the
 * position along it equals the index, `off` elsewhere; negative indices
 * count from depth, indices still out of [0, depth) give a line of `off`.
 * Float indices and depth are truncated to integers. depth sets the shape,
 * so it must be known when the graph is planned (a constant, or a scalar
 * graph input: it re-plans). Backward: values get the sums of dY at the
 * off and the on places; indices and depth none. */
typedef struct {
    int axis;
    int64_t depth, outer, inner;
} onehot_dims;

/* (float indices truncate, saturating: an infinite one is out of range) */
static int64_t onehot_index(const ai_tensor *t, int64_t i)
{
    return ai_tensor_get_flat_i64(t, i);
}

static ai_status onehot_dims_of(const ai_ctx *c, onehot_dims *d)
{
    const ai_tensor *x = c->in[0], *depth = ai_ctx_const(c, 1);
    int64_t axis;
    ai_status st = ai_attr_int(c->node, "axis", -1, &axis);
    if (st || (st = ai_norm_axis(c->node, axis, x->ndim + 1, &d->axis)))
        return st;
    if (x->dtype == AI_BOOL || ai_dtype_is_half(x->dtype) || c->in[1]->dtype == AI_BOOL ||
        ai_dtype_is_half(c->in[1]->dtype))
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s and depth %s; numbers "
                             "expected", ai_dtype_name(x->dtype),
                             ai_dtype_name(c->in[1]->dtype));
    if (!depth && c->in[1]->data) /* at run time */
        depth = c->in[1];
    if (!depth)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "depth must be known when the "
                             "graph is planned (a constant or a scalar graph input)");
    if (ai_tensor_numel(depth) != 1 || depth->ndim > 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "depth has %lld elements; one expected",
                             (long long)ai_tensor_numel(depth));
    if (ai_tensor_numel(c->in[2]) != 2 || c->in[2]->ndim != 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "values has %lld elements; [off, on] "
                             "expected", (long long)ai_tensor_numel(c->in[2]));
    d->depth = onehot_index(depth, 0);
    if (d->depth < 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "depth is %lld", (long long)d->depth);
    d->outer = d->inner = 1;
    for (int i = 0; i < x->ndim; i++)
        *(i < d->axis ? &d->outer : &d->inner) *= x->shape[i];
    return AI_OK;
}

static ai_status onehot_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    onehot_dims d;
    ai_status st = onehot_dims_of(c, &d);
    if (st)
        return st;
    const ai_tensor *x = c->in[0];
    out[0].dtype = c->in[2]->dtype;
    out[0].ndim = x->ndim + 1;
    for (int i = 0, j = 0; i <= x->ndim; i++)
        out[0].shape[i] = i == d.axis ? d.depth : x->shape[j++];
    return AI_OK;
}

/* Whether output element (o, k, i) is on. */
static bool onehot_on(const ai_tensor *x, const onehot_dims *d, int64_t o, int64_t k,
                      int64_t i)
{
    int64_t v = onehot_index(x, o * d->inner + i);
    return (v < 0 ? v + d->depth : v) == k;
}

static ai_status onehot_forward(ai_ctx *c)
{
    onehot_dims d;
    ai_status st = onehot_dims_of(c, &d);
    if (st)
        return st;
    const size_t es = ai_dtype_size(c->out[0]->dtype);
    const char *values = c->in[2]->data;
    char *y = c->out[0]->data;
    for (int64_t o = 0; o < d.outer; o++)
        for (int64_t k = 0; k < d.depth; k++)
            for (int64_t i = 0; i < d.inner; i++, y += es)
                memcpy(y, values + (onehot_on(c->in[0], &d, o, k, i) ? es : 0), es);
    return AI_OK;
}

static ai_status onehot_backward(ai_ctx *c)
{
    ai_tensor *dv = c->din[2];
    if (!dv)
        return AI_OK;
    onehot_dims d;
    ai_status st = onehot_dims_of(c, &d);
    if (st)
        return st;
    double sum[2] = {ai_tensor_get_flat(dv, 0), ai_tensor_get_flat(dv, 1)};
    int64_t at = 0;
    for (int64_t o = 0; o < d.outer; o++)
        for (int64_t k = 0; k < d.depth; k++)
            for (int64_t i = 0; i < d.inner; i++)
                sum[onehot_on(c->in[0], &d, o, k, i)] += ai_tensor_get_flat(c->dout[0], at++);
    put_d(dv, 0, sum[0]);
    put_d(dv, 1, sum[1]);
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

OP(op_trilu, "Trilu", 1, 2, 1, AI_OP_HALF | ASSIGN1 | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, trilu_shape,
   trilu_forward, trilu_backward)
OP(op_gather_elements, "GatherElements", 2, 2, 1, ASSIGN1 | AI_OP_HALF | AI_OP_ANY_DTYPE | AI_OP_BWD_NO_Y, ge_shape,
   ge_forward, ge_backward)
OP(op_gather, "Gather", 2, 2, 1, AI_OP_HALF | AI_OP_ANY_DTYPE, gather_shape, gather_forward, gather_backward)

OP(op_onehot, "OneHot", 3, 3, 1, AI_OP_SHAPE_FROM_VALUES | AI_OP_BWD_NO_Y, onehot_shape,
   onehot_forward, onehot_backward)

const ai_op_def *const ai_ops_index[] = {&op_trilu, &op_gather_elements, &op_gather,
                                         &op_onehot, NULL};
