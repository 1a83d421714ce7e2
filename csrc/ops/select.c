/*
 * select.c — operators whose output length depends on their inputs'
 * values: NonZero (the positions of the nonzero elements), Compress (the
 * slices where a condition holds) and Unique (the distinct elements or
 * slices, with where they were first seen, where each went and how often).
 *
 * Their shape() needs those values: they are AI_OP_SHAPE_FROM_DATA, and the
 * plan gives shape() the values it knows (constants, and values computed
 * from the graph inputs they depend on, read when the graph is planned: a
 * new value re-plans; docs/engine.md). Forward then recomputes from the
 * same values and checks that the lengths agree. Compress's backward adds
 * dY back to the picked slices; NonZero and Unique have no gradient, as in
 * torch.
 */
#include <stdlib.h>
#include <string.h>

#include "movement.h"

/* AI_OK when input i's values are there (at forward, or known at plan). */
static ai_status values_known(const ai_ctx *c, int i, const char *what)
{
    if (c->in[i]->data || !ai_tensor_numel(c->in[i]))
        return AI_OK;
    return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                         "the output's shape depends on the values of %s, which are not "
                         "known when the graph is planned (they come from a random or "
                         "unknown value)", what);
}

/* Element i of t is nonzero (NaN is). */
static bool nonzero_at(const ai_tensor *t, int64_t i)
{
    return ai_dtype_is_float(t->dtype) ? ai_tensor_get_flat(t, i) != 0
                                       : ai_tensor_get_flat_i64(t, i) != 0;
}

/* Forward writes into outputs planned from the same values: a mismatch
 * means they changed under the plan. */
static ai_status planned_length(const ai_ctx *c, int64_t planned, int64_t now)
{
    if (planned == now)
        return AI_OK;
    return ai_node_error(c->node, AI_ERR_VALUE, "the output has %lld rows at forward, %lld "
                         "when the graph was planned", (long long)now, (long long)planned);
}

/* ---------------------------------------------------------------- NonZero */

/* NonZero(X): int64 [rank, n], the indices of X's n nonzero elements in
 * row-major order (a scalar has rank 0: [0, n]). */
static int64_t nonzero_count(const ai_tensor *x)
{
    int64_t n = 0;
    for (int64_t i = 0; i < ai_tensor_numel(x); i++)
        n += nonzero_at(x, i);
    return n;
}

static ai_status nonzero_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    ai_status st = values_known(c, 0, "X");
    if (st)
        return st;
    const int64_t s[2] = {c->in[0]->ndim, nonzero_count(c->in[0])};
    return ai_set_meta(&out[0], AI_I64, 2, s);
}

static ai_status nonzero_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    const int64_t n = c->out[0]->shape[1];
    ai_status st = planned_length(c, n, nonzero_count(x));
    int64_t *y = c->out[0]->data, mi[AI_MAX_DIMS] = {0}, k = 0;
    for (int64_t i = 0; !st && i < ai_tensor_numel(x); i++) {
        if (nonzero_at(x, i)) {
            for (int d = 0; d < x->ndim; d++)
                y[d * n + k] = mi[d];
            k++;
        }
        for (int d = x->ndim - 1; d >= 0; d--) {
            if (++mi[d] < x->shape[d])
                break;
            mi[d] = 0;
        }
    }
    return st;
}

/* ---------------------------------------------------------------- Compress */

/* Compress(input, condition; axis): the slices of input along `axis` whose
 * condition is true (condition may be shorter than the axis: the slices
 * past it are dropped); without axis, the elements of the flattened input. */
typedef struct {
    int axis;                 /* -1: flattened */
    int64_t outer, len, inner; /* input as (outer, len, inner) */
} compress_dims;

static ai_status compress_setup(const ai_ctx *c, compress_dims *d)
{
    const ai_tensor *x = c->in[0], *cond = c->in[1];
    const ai_attr *a = ai_node_attr(c->node, "axis");
    ai_status st = AI_OK;
    if (cond->dtype != AI_BOOL || cond->ndim != 1)
        return ai_node_error(c->node, AI_ERR_TYPE, "condition must be a 1-D bool tensor, "
                             "not %s of rank %d", ai_dtype_name(cond->dtype), cond->ndim);
    d->axis = -1;
    if (a) {
        int64_t axis;
        if ((st = ai_attr_int(c->node, "axis", 0, &axis)) ||
            (st = ai_norm_axis(c->node, axis, x->ndim, &d->axis)))
            return st;
    }
    d->outer = d->axis < 0 ? 1 : ai_shape_prod(x->shape, 0, d->axis);
    d->len = d->axis < 0 ? ai_tensor_numel(x) : x->shape[d->axis];
    d->inner = d->axis < 0 ? 1 : ai_shape_prod(x->shape, d->axis + 1, x->ndim);
    if (cond->shape[0] > d->len)
        return ai_node_error(c->node, AI_ERR_VALUE, "condition has %lld elements, more than "
                             "the %lld slices of the input", (long long)cond->shape[0],
                             (long long)d->len);
    return values_known(c, 1, "condition");
}

static int64_t compress_count(const ai_tensor *cond)
{
    int64_t n = 0;
    for (int64_t i = 0; i < cond->shape[0]; i++)
        n += ((const bool *)cond->data)[i];
    return n;
}

static ai_status compress_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    compress_dims d = {0};
    ai_status st = compress_setup(c, &d);
    if (st)
        return st;
    const ai_tensor *x = c->in[0];
    const int64_t n = compress_count(c->in[1]);
    if (d.axis < 0)
        return ai_set_meta(&out[0], x->dtype, 1, &n);
    ai_set_meta(&out[0], x->dtype, x->ndim, x->shape);
    out[0].shape[d.axis] = n;
    return AI_OK;
}

/* Over the kept slices: forward copies input slice j to output slice k,
 * backward adds dY's slice k into dX's slice j. */
static ai_status compress_walk(ai_ctx *c, bool backward)
{
    compress_dims d = {0};
    ai_status st = compress_setup(c, &d);
    const ai_tensor *cond = c->in[1];
    const int64_t n = compress_count(cond);
    if (st || (st = planned_length(c, d.axis < 0 ? c->out[0]->shape[0]
                                                 : c->out[0]->shape[d.axis], n)))
        return st;
    const ai_tensor *x = backward ? c->din[0] : c->in[0];
    const ai_tensor *y = backward ? c->dout[0] : c->out[0];
    const size_t es = ai_dtype_size(x->dtype), row = (size_t)d.inner * es;
    const ai_row_fn add = x->dtype == AI_F32 ? ai_row_add_f32 : ai_row_add_f64;
    for (int64_t o = 0; row && o < d.outer; o++)
        for (int64_t j = 0, k = 0; j < cond->shape[0]; j++) {
            if (!((const bool *)cond->data)[j])
                continue;
            char *xs = (char *)x->data + (size_t)(o * d.len + j) * row;
            char *ys = (char *)y->data + (size_t)(o * n + k++) * row;
            if (backward)
                add(xs, 1, ys, 1, d.inner, es);
            else
                memcpy(ys, xs, row);
        }
    return AI_OK;
}

static ai_status compress_forward(ai_ctx *c)
{
    return compress_walk(c, false);
}

static ai_status compress_backward(ai_ctx *c)
{
    ai_status st = AI_OK;
    if (!c->din[0] || (st = ai_check_grad_dtype(c, c->din[0])))
        return st;
    return compress_walk(c, true);
}

/* ---------------------------------------------------------------- Unique */

/* Unique(X; axis, sorted = 1) -> Y, indices, inverse_indices, counts (int64).
 * The items are X's elements (no axis: X flattened) or its slices along
 * axis. Y holds each distinct item once: in ascending order (sorted; slices
 * compared element by element, as numpy.unique) or in the order of first
 * occurrence; indices the item where each first occurs, inverse_indices
 * the Y item of each item of X, counts how often each occurs. NaNs count
 * as equal, above every number (numpy's equal_nan). */
typedef struct {
    const ai_tensor *x;
    int64_t n, len, inner, outer; /* n items of len = outer * inner elements */
} unique_items;

/* Element e (< len) of item i */
static int64_t item_at(const unique_items *u, int64_t i, int64_t e)
{
    const int64_t o = e / u->inner, r = e % u->inner;
    return (o * u->n + i) * u->inner + r;
}

static int item_cmp(const unique_items *u, int64_t a, int64_t b)
{
    const bool flt = ai_dtype_is_float(u->x->dtype);
    for (int64_t e = 0; e < u->len; e++) {
        const int64_t ia = item_at(u, a, e), ib = item_at(u, b, e);
        if (flt) {
            const double va = ai_tensor_get_flat(u->x, ia), vb = ai_tensor_get_flat(u->x, ib);
            const bool na = va != va, nb = vb != vb;
            if (na || nb) {
                if (na != nb)
                    return na ? 1 : -1;
                continue;
            }
            if (va != vb)
                return va < vb ? -1 : 1;
        } else {
            const int64_t va = ai_tensor_get_flat_i64(u->x, ia);
            const int64_t vb = ai_tensor_get_flat_i64(u->x, ib);
            if (va != vb)
                return va < vb ? -1 : 1;
        }
    }
    return 0;
}

/* Stable merge sort of order[0..n) by item_cmp (tmp: n scratch). */
static void item_sort(const unique_items *u, int64_t *order, int64_t *tmp, int64_t n)
{
    if (n < 2)
        return;
    const int64_t h = n / 2;
    item_sort(u, order, tmp, h);
    item_sort(u, order + h, tmp, n - h);
    int64_t i = 0, j = h, k = 0;
    while (i < h || j < n)
        tmp[k++] = j >= n || (i < h && item_cmp(u, order[i], order[j]) <= 0) ? order[i++]
                                                                               : order[j++];
    memcpy(order, tmp, sizeof(int64_t) * (size_t)n);
}

static ai_status unique_setup(const ai_ctx *c, unique_items *u, int *axis, bool *sorted)
{
    const ai_tensor *x = c->in[0];
    int64_t s;
    ai_status st = ai_attr_int(c->node, "sorted", 1, &s);
    if (st)
        return st;
    *sorted = s != 0;
    *axis = -1;
    if (ai_node_attr(c->node, "axis")) {
        int64_t a;
        if ((st = ai_attr_int(c->node, "axis", 0, &a)) ||
            (st = ai_norm_axis(c->node, a, x->ndim, axis)))
            return st;
    }
    u->x = x;
    u->n = *axis < 0 ? ai_tensor_numel(x) : x->shape[*axis];
    u->outer = *axis < 0 ? 1 : ai_shape_prod(x->shape, 0, *axis);
    u->inner = *axis < 0 ? 1 : ai_shape_prod(x->shape, *axis + 1, x->ndim);
    u->len = u->outer * u->inner;
    return values_known(c, 0, "X");
}

/* The distinct items: *k of them; with `first` (forward, planned for
 * `planned` of them), first[g] (the item where distinct item g first
 * occurs, in Y's order) and group[i] (the Y index of item i). Memory:
 * malloc'd here (shape runs it before any workspace). */
static ai_status unique_run(const ai_ctx *c, const unique_items *u, bool sorted,
                            int64_t planned, int64_t *k, int64_t *first, int64_t *group)
{
    const int64_t n = u->n;
    int64_t *order = malloc(sizeof(int64_t) * (size_t)(3 * n + 1));
    if (!order)
        return ai_node_error(c->node, AI_ERR_NOMEM, "out of memory sorting %lld items",
                             (long long)n);
    int64_t *tmp = order + n, *gid = tmp + n;
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    item_sort(u, order, tmp, n);
    /* groups in sorted order: tmp[g] = first item of group g, gid[item] = g */
    int64_t g = -1;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || item_cmp(u, order[i - 1], order[i]) != 0)
            tmp[++g] = order[i]; /* stable: the smallest index comes first */
        gid[order[i]] = g;
    }
    *k = g + 1;
    ai_status st = first ? planned_length(c, planned, *k) : AI_OK;
    if (!st && first) {
        /* unsorted: groups renumbered by first occurrence, found in item order */
        int64_t next = 0;
        for (int64_t gg = 0; gg < *k; gg++)
            order[gg] = -1;
        for (int64_t i = 0; i < n; i++) {
            int64_t at = gid[i];
            if (!sorted && order[at] < 0)
                order[at] = next++;
            group[i] = sorted ? at : order[at];
        }
        for (int64_t gg = 0; gg < *k; gg++)
            first[sorted ? gg : order[gg]] = tmp[gg];
    }
    free(order);
    return st;
}

static ai_status unique_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    unique_items u = {0};
    int axis = 0;
    bool sorted = false;
    int64_t k = 0;
    ai_status st = unique_setup(c, &u, &axis, &sorted);
    if (st || (st = unique_run(c, &u, sorted, 0, &k, NULL, NULL)))
        return st;
    const ai_tensor *x = c->in[0];
    if (axis < 0) {
        ai_set_meta(&out[0], x->dtype, 1, &k);
    } else {
        ai_set_meta(&out[0], x->dtype, x->ndim, x->shape);
        out[0].shape[axis] = k;
    }
    for (int j = 1; j < c->n_out; j++)
        ai_set_meta(&out[j], AI_I64, 1, j == 2 ? &u.n : &k);
    *ws = sizeof(int64_t) * (size_t)(k + u.n);
    return AI_OK;
}

static ai_status unique_forward(ai_ctx *c)
{
    unique_items u = {0};
    int axis = 0;
    bool sorted = false;
    int64_t k = 0;
    ai_status st = unique_setup(c, &u, &axis, &sorted);
    if (st)
        return st;
    const int64_t planned = c->out[0]->shape[axis < 0 ? 0 : axis];
    int64_t *first = c->workspace, *group = first + planned;
    if ((st = unique_run(c, &u, sorted, planned, &k, first, group)))
        return st;
    const size_t es = ai_dtype_size(u.x->dtype), row = (size_t)u.inner * es;
    for (int64_t o = 0; row && o < u.outer; o++)
        for (int64_t g = 0; g < k; g++)
            memcpy((char *)c->out[0]->data + (size_t)(o * k + g) * row,
                   (const char *)u.x->data + (size_t)(o * u.n + first[g]) * row, row);
    int64_t *counts = c->n_out > 3 ? c->out[3]->data : NULL;
    for (int64_t g = 0; counts && g < k; g++)
        counts[g] = 0;
    for (int64_t i = 0; i < u.n; i++) {
        if (c->n_out > 2)
            ((int64_t *)c->out[2]->data)[i] = group[i];
        if (counts)
            counts[group[i]]++;
    }
    if (c->n_out > 1 && k)
        memcpy(c->out[1]->data, first, sizeof(int64_t) * (size_t)k);
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

/* (AI_OP_HALF: they read values as doubles and move bytes; their plan-time
 * evaluation sees the inputs as they are) */
OP(op_nonzero, "NonZero", 1, 1, 1, AI_OP_HALF | AI_OP_SHAPE_FROM_DATA, nonzero_shape,
   nonzero_forward, NULL)
OP(op_compress, "Compress", 2, 2, 1, AI_OP_HALF | AI_OP_SHAPE_FROM_DATA | AI_OP_BWD_NO_Y,
   compress_shape, compress_forward, compress_backward)
OP(op_unique, "Unique", 1, 1, 4, AI_OP_HALF | AI_OP_SHAPE_FROM_DATA, unique_shape,
   unique_forward, NULL)

const ai_op_def *const ai_ops_select[] = {&op_nonzero, &op_compress, &op_unique, NULL};
