/*
 * scatter.c — operators that write single elements of a copy of the data at
 * computed places: ScatterElements (and the deprecated Scatter, its opset
 * 9-10 form without reduction), the inverse of GatherElements, and
 * TensorScatter (a key/value cache: updates written along one axis from each
 * batch's write index). Both first compute each update's offset in the data
 * (the workspace), then copy or reduce into the output; backward follows
 * torch's scatter and scatter_reduce(include_self=True) (a data-movement
 * family: movement.h).
 */
#include <string.h>

#include "movement.h"

/* ---------------------------------------------------------------- the shared walk */

/* Y = data; then for each update e in order: Y[off[e]] = updates[e], or
 * Y[off[e]] op= updates[e] for a reduction. */
static void scatter_run(const ai_ctx *c, int upd, const int64_t *off, int red)
{
    const ai_tensor *x = c->in[0], *u = c->in[upd];
    const size_t es = ai_dtype_size(x->dtype);
    char *y = c->out[0]->data;
    if (ai_tensor_nbytes(x))
        memcpy(y, x->data, ai_tensor_nbytes(x));
    for (int64_t e = 0; e < ai_tensor_numel(u); e++) {
        const char *src = (const char *)u->data + (size_t)e * es;
        if (red == RED_NONE)
            memcpy(y + (size_t)off[e] * es, src, es);
        else
            ai_scatter_reduce_row(red, x->dtype, y + (size_t)off[e] * es, src, 1);
    }
}

/* The gradients of scatter_run, as torch's scatter (none), scatter_add (add)
 * and scatter_reduce with include_self (mul: prod, max: amax, min: amin):
 *   none      dData = dY, 0 where an update was written; dUpdates[e] = dY[off[e]]
 *   add       dData = dY; dUpdates[e] = dY[off[e]]
 *   mul       dData = dY * (product of the place's updates); dUpdates[e] =
 *             dY[off[e]] * data * (product of the place's other updates)
 *   max, min  dY shared evenly among the data element and the updates that
 *             equal the result (Y) at their place
 * `count` and `prod` are scratch of one element per data element. */
static ai_status scatter_grad(const ai_ctx *c, int upd, const int64_t *off, int red,
                              int64_t *count, double *prod)
{
    const ai_tensor *x = c->in[0], *u = c->in[upd], *dy = c->dout[0], *y = c->out[0];
    ai_tensor *dx = c->din[0], *du = c->din[upd];
    ai_status st = AI_OK;
    if ((dx && (st = ai_check_grad_dtype(c, dx))) || (du && (st = ai_check_grad_dtype(c, du))))
        return st;
    const int64_t nx = ai_tensor_numel(x), nu = ai_tensor_numel(u);
    /* count: writes (none), zero updates (mul) or ties with Y (max, min);
     * prod: the product of the nonzero updates (mul) */
    for (int64_t i = 0; i < nx; i++) {
        count[i] = (red == RED_MAX || red == RED_MIN) &&
                   ai_tensor_get_flat(x, i) == ai_tensor_get_flat(y, i);
        prod[i] = 1;
    }
    for (int64_t e = 0; e < nu; e++) {
        const double v = ai_tensor_get_flat(u, e);
        if (red == RED_NONE)
            count[off[e]] = 1;
        else if (red == RED_MUL && v == 0)
            count[off[e]]++;
        else if (red == RED_MUL)
            prod[off[e]] *= v;
        else if (red != RED_ADD)
            count[off[e]] += v == ai_tensor_get_flat(y, off[e]);
    }
    for (int64_t i = 0; dx && i < nx; i++) {
        double g = ai_tensor_get_flat(dy, i);
        if (red == RED_NONE)
            g = count[i] ? 0 : g;
        else if (red == RED_MUL)
            g *= count[i] ? 0 : prod[i];
        else if (red != RED_ADD)
            g = ai_tensor_get_flat(x, i) == ai_tensor_get_flat(y, i) ? g / (double)count[i] : 0;
        ai_float_set(dx, i, ai_float_at(dx, i) + g);
    }
    for (int64_t e = 0; du && e < nu; e++) {
        const int64_t at = off[e];
        double g = ai_tensor_get_flat(dy, at);
        if (red == RED_MUL) {
            const double v = ai_tensor_get_flat(u, e);
            const double others = v != 0 ? (count[at] ? 0 : prod[at] / v)
                                         : (count[at] == 1 ? prod[at] : 0);
            g *= ai_tensor_get_flat(x, at) * others;
        } else if (red == RED_MAX || red == RED_MIN) {
            const double r = ai_tensor_get_flat(y, at);
            g = ai_tensor_get_flat(u, e) == r ? g / (double)count[at] : 0;
        }
        ai_float_set(du, e, ai_float_at(du, e) + g);
    }
    return AI_OK;
}

/* Workspace: the offsets of `n_upd` updates, then (for backward) the scratch
 * of scatter_grad. */
static size_t scatter_workspace(const ai_ctx *c, int64_t n_upd)
{
    const size_t nx = (size_t)ai_tensor_numel(c->in[0]);
    return (size_t)n_upd * sizeof(int64_t) +
           (c->g->need_backward ? nx * (sizeof(int64_t) + sizeof(double)) : 0);
}

static ai_status scatter_backward_with(const ai_ctx *c, int upd, const int64_t *off, int red)
{
    int64_t *count = (int64_t *)c->workspace + ai_tensor_numel(c->in[upd]);
    return scatter_grad(c, upd, off, red, count,
                        (double *)(count + ai_tensor_numel(c->in[0])));
}

/* ---------------------------------------------------------------- ScatterElements */

/* ScatterElements(data, indices, updates; axis, reduction): updates and
 * indices have one shape, of data's rank, no larger than data's off `axis`;
 * update e at multi-index i goes to data[i with i[axis] = indices[i]]
 * (negative from the end). */
typedef struct {
    int axis, red;
} se_args;

static ai_status se_setup(const ai_ctx *c, se_args *a)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1], *u = c->in[2];
    int64_t axis;
    ai_status st = ai_attr_int(c->node, "axis", 0, &axis);
    if (st || (st = ai_norm_axis(c->node, axis, x->ndim, &a->axis)) ||
        (st = ai_scatter_reduction(c, &a->red)))
        return st;
    if (idx->dtype != AI_I64 && idx->dtype != AI_I32)
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s; int32 or int64 expected",
                             ai_dtype_name(idx->dtype));
    if (u->dtype != x->dtype)
        return ai_node_error(c->node, AI_ERR_TYPE, "updates are %s, data %s",
                             ai_dtype_name(u->dtype), ai_dtype_name(x->dtype));
    bool same = idx->ndim == u->ndim && idx->ndim == x->ndim;
    for (int d = 0; same && d < idx->ndim; d++)
        same = idx->shape[d] == u->shape[d];
    if (!same)
        return ai_node_error(c->node, AI_ERR_VALUE, "indices (rank %d) and updates (rank %d) "
                             "must have one shape, of data's rank %d", idx->ndim, u->ndim,
                             x->ndim);
    for (int d = 0; d < x->ndim; d++)
        if (d != a->axis && idx->shape[d] > x->shape[d])
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "indices dim %d is %lld, larger than data's %lld", d,
                                 (long long)idx->shape[d], (long long)x->shape[d]);
    return AI_OK;
}

static ai_status se_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    se_args a = {0};
    ai_status st = se_setup(c, &a);
    *ws = scatter_workspace(c, ai_tensor_numel(c->in[1]));
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
}

/* off[e]: the data offset of update e; AI_ERR_INDEX naming the node when an
 * index is out of range. */
static ai_status se_offsets(const ai_ctx *c, const se_args *a, int64_t *off)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    const int64_t n = ai_tensor_numel(idx), len = x->shape[a->axis];
    int64_t xs[AI_MAX_DIMS], mi[AI_MAX_DIMS] = {0};
    ai_contiguous_strides(x->ndim, x->shape, xs);
    for (int64_t e = 0; e < n; e++) {
        int64_t k = ai_tensor_get_flat_i64(idx, e);
        if (k < -len || k >= len)
            return ai_node_error(c->node, AI_ERR_INDEX,
                                 "index %lld is out of range for axis %d of size %lld",
                                 (long long)k, a->axis, (long long)len);
        off[e] = 0;
        for (int d = 0; d < x->ndim; d++)
            off[e] += (d == a->axis ? (k < 0 ? k + len : k) : mi[d]) * xs[d];
        for (int d = x->ndim - 1; d >= 0; d--) {
            if (++mi[d] < idx->shape[d])
                break;
            mi[d] = 0;
        }
    }
    return AI_OK;
}

static ai_status se_forward(ai_ctx *c)
{
    se_args a = {0};
    ai_status st = se_setup(c, &a);
    if (!st && !(st = se_offsets(c, &a, c->workspace)))
        scatter_run(c, 2, c->workspace, a.red);
    return st;
}

static ai_status se_backward(ai_ctx *c)
{
    se_args a = {0};
    ai_status st = se_setup(c, &a);
    if (st || (!c->din[0] && !c->din[2]) || (st = se_offsets(c, &a, c->workspace)))
        return st;
    return scatter_backward_with(c, 2, c->workspace, a.red);
}

/* ---------------------------------------------------------------- TensorScatter */

/* TensorScatter(past_cache, update, write_indices?; axis = -2, mode):
 * update matches the cache off `axis` (not the batch axis 0) and is no
 * longer along it; batch b's update goes to positions write_indices[b] + j
 * along `axis` (0 when write_indices is absent), modulo the axis's length
 * in mode 'circular'; in 'linear' mode they must fit. */
static ai_status ts_setup(const ai_ctx *c, int *axis, bool *circular)
{
    const ai_tensor *x = c->in[0], *u = c->in[1];
    const ai_tensor *w = c->n_in > 2 ? c->in[2] : NULL;
    int64_t a;
    const char *mode;
    ai_status st = ai_attr_int(c->node, "axis", -2, &a);
    if (st || (st = ai_attr_string(c->node, "mode", "linear", &mode)))
        return st;
    if (strcmp(mode, "linear") && strcmp(mode, "circular"))
        return ai_node_error(c->node, AI_ERR_VALUE, "mode is '%s'; linear or circular "
                             "expected", mode);
    *circular = mode[0] == 'c';
    if (x->ndim < 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "past_cache has rank %d; >= 2 expected",
                             x->ndim);
    if ((st = ai_norm_axis(c->node, a, x->ndim, axis)))
        return st;
    if (*axis == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "axis is the batch axis 0");
    if (u->dtype != x->dtype)
        return ai_node_error(c->node, AI_ERR_TYPE, "update is %s, past_cache %s",
                             ai_dtype_name(u->dtype), ai_dtype_name(x->dtype));
    bool ok = u->ndim == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++)
        ok = d == *axis ? u->shape[d] <= x->shape[d] : u->shape[d] == x->shape[d];
    if (!ok)
        return ai_node_error(c->node, AI_ERR_VALUE, "update must have past_cache's shape, "
                             "shorter or equal along axis %d", *axis);
    if (w && (w->dtype != AI_I64 || w->ndim != 1 || w->shape[0] != x->shape[0]))
        return ai_node_error(c->node, AI_ERR_VALUE, "write_indices must be int64 of shape "
                             "[%lld] (one per batch)", (long long)x->shape[0]);
    return AI_OK;
}

static ai_status ts_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    int axis = 0;
    bool circ = false;
    ai_status st = ts_setup(c, &axis, &circ);
    *ws = scatter_workspace(c, ai_tensor_numel(c->in[1]));
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
}

static ai_status ts_offsets(const ai_ctx *c, int axis, bool circular, int64_t *off)
{
    const ai_tensor *x = c->in[0], *u = c->in[1];
    const ai_tensor *w = c->n_in > 2 ? c->in[2] : NULL;
    const int64_t n = ai_tensor_numel(u), len = x->shape[axis];
    int64_t xs[AI_MAX_DIMS], mi[AI_MAX_DIMS] = {0};
    ai_contiguous_strides(x->ndim, x->shape, xs);
    for (int64_t e = 0; e < n; e++) {
        int64_t k = (w ? ((const int64_t *)w->data)[mi[0]] : 0) + mi[axis];
        if (circular)
            k = ((k % len) + len) % len;
        if (k < 0 || k >= len)
            return ai_node_error(c->node, AI_ERR_INDEX,
                                 "batch %lld writes position %lld of axis %d of size %lld "
                                 "(mode linear)", (long long)mi[0], (long long)k, axis,
                                 (long long)len);
        off[e] = 0;
        for (int d = 0; d < x->ndim; d++)
            off[e] += (d == axis ? k : mi[d]) * xs[d];
        for (int d = x->ndim - 1; d >= 0; d--) {
            if (++mi[d] < u->shape[d])
                break;
            mi[d] = 0;
        }
    }
    return AI_OK;
}

static ai_status ts_forward(ai_ctx *c)
{
    int axis = 0;
    bool circ = false;
    ai_status st = ts_setup(c, &axis, &circ);
    if (!st && !(st = ts_offsets(c, axis, circ, c->workspace)))
        scatter_run(c, 1, c->workspace, RED_NONE);
    return st;
}

static ai_status ts_backward(ai_ctx *c)
{
    int axis = 0;
    bool circ = false;
    ai_status st = ts_setup(c, &axis, &circ);
    if (st || (!c->din[0] && !c->din[1]) || (st = ts_offsets(c, axis, circ, c->workspace)))
        return st;
    return scatter_backward_with(c, 1, c->workspace, RED_NONE);
}

/* ---------------------------------------------------------------- registry */

OP(op_scatter_elements, "ScatterElements", 3, 3, 1, 0, se_shape, se_forward, se_backward)
OP(op_scatter, "Scatter", 3, 3, 1, 0, se_shape, se_forward, se_backward)
OP(op_tensor_scatter, "TensorScatter", 2, 3, 1, 0, ts_shape, ts_forward, ts_backward)

const ai_op_def *const ai_ops_scatter[] = {&op_scatter_elements, &op_scatter,
                                           &op_tensor_scatter, NULL};
