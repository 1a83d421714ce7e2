/*
 * reshape.c — Reshape, Flatten, Squeeze, Unsqueeze: the same bytes under
 * another shape. Forward copies them, backward passes the gradient through
 * (a data-movement family: movement.h); where the memory plan makes the
 * output a view of the input (AI_OP_VIEW, plan.c), neither runs.
 */
#include "movement.h"

/* ---------------------------------------------------------------- flat copies */

/* Reshape, Flatten, Squeeze, Unsqueeze: same bytes, another shape. */
static ai_status flat_forward(ai_ctx *c)
{
    ai_copy_elems(c->out[0]->data, c->in[0]->data, ai_tensor_numel(c->in[0]),
                  ai_dtype_size(c->in[0]->dtype));
    return AI_OK;
}

static ai_status flat_backward(ai_ctx *c)
{
    ai_status st = ai_check_grad_dtype(c, c->din[0]);
    if (!st)
        ai_accumulate(c->din[0], c->dout[0], c->din_assign[0]);
    return st;
}

/* ---------------------------------------------------------------- Reshape */

static ai_status reshape_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_node *node = c->node;
    const ai_tensor *x = c->in[0];
    int64_t allowzero, s[AI_MAX_DIMS];
    int n;
    ai_status st = ai_attr_int(node, "allowzero", 0, &allowzero);
    if (!st)
        st = ai_ints_input(c, 1, 1, "shape", s, AI_MAX_DIMS, &n);
    if (st)
        return st;
    if (n < 0)
        return ai_node_error(node, AI_ERR_VALUE, "the shape input is missing");
    int infer = -1;
    int64_t known = 1;
    bool has_zero = false;
    for (int i = 0; i < n; i++) {
        if (s[i] == 0 && !allowzero) {
            if (i >= x->ndim)
                return ai_node_error(node, AI_ERR_VALUE,
                                     "shape[%d] = 0 copies input dimension %d, but the input "
                                     "has rank %d", i, i, x->ndim);
            s[i] = x->shape[i];
        }
        has_zero |= s[i] == 0;
        if (s[i] == -1) {
            if (infer >= 0)
                return ai_node_error(node, AI_ERR_VALUE, "shape has more than one -1");
            infer = i;
        } else if (s[i] < 0) {
            return ai_node_error(node, AI_ERR_VALUE, "shape[%d] = %lld is negative", i,
                                 (long long)s[i]);
        } else {
            if (s[i] && known > INT64_MAX / s[i])
                return ai_node_error(node, AI_ERR_VALUE,
                                     "shape has more than 2^63 elements (shape[%d] = %lld)",
                                     i, (long long)s[i]);
            known *= s[i];
        }
    }
    int64_t numel = ai_tensor_numel(x);
    if (infer >= 0) {
        if (has_zero && allowzero)
            return ai_node_error(node, AI_ERR_VALUE,
                                 "with allowzero=1 the shape cannot hold both 0 and -1");
        if (known == 0 || numel % known)
            return ai_node_error(node, AI_ERR_VALUE,
                                 "cannot infer the -1 dimension: %lld elements into blocks "
                                 "of %lld", (long long)numel, (long long)known);
        s[infer] = numel / known;
        known *= s[infer];
    }
    if (known != numel)
        return ai_node_error(node, AI_ERR_VALUE,
                             "cannot reshape %lld elements into a shape of %lld",
                             (long long)numel, (long long)known);
    return ai_set_meta(&out[0], x->dtype, n, s);
}

/* ---------------------------------------------------------------- Flatten */

static ai_status flatten_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    int64_t axis;
    ai_status st = ai_attr_int(c->node, "axis", 1, &axis);
    if (st)
        return st;
    if (axis < -x->ndim || axis > x->ndim)
        return ai_node_error(c->node, AI_ERR_VALUE, "axis %lld is out of range for rank %d",
                             (long long)axis, x->ndim);
    if (axis < 0)
        axis += x->ndim;
    int64_t s[2] = {ai_shape_prod(x->shape, 0, (int)axis),
                    ai_shape_prod(x->shape, (int)axis, x->ndim)};
    return ai_set_meta(&out[0], x->dtype, 2, s);
}

/* ---------------------------------------------------------------- Squeeze / Unsqueeze */

static ai_status squeeze_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    int64_t axes[AI_MAX_DIMS], s[AI_MAX_DIMS];
    bool drop[AI_MAX_DIMS];
    int n, nd = 0;
    ai_status st = ai_ints_input(c, 1, 13, "axes", axes, AI_MAX_DIMS, &n);
    if (!st)
        st = ai_axes_flags(c->node, axes, n < 0 ? 0 : n, x->ndim, drop);
    if (st)
        return st;
    for (int d = 0; d < x->ndim; d++) {
        if (n <= 0) /* no axes, or an empty list (like onnxruntime): all 1s */
            drop[d] = x->shape[d] == 1;
        else if (drop[d] && x->shape[d] != 1)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "cannot squeeze axis %d of size %lld (size 1 expected)", d,
                                 (long long)x->shape[d]);
        if (!drop[d])
            s[nd++] = x->shape[d];
    }
    return ai_set_meta(&out[0], x->dtype, nd, s);
}

static ai_status unsqueeze_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    int64_t axes[AI_MAX_DIMS], s[AI_MAX_DIMS];
    bool add[AI_MAX_DIMS];
    int n;
    ai_status st = ai_ints_input(c, 1, 13, "axes", axes, AI_MAX_DIMS, &n);
    if (st)
        return st;
    if (n < 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "axes are missing");
    const int nd = x->ndim + n;
    if (nd > AI_MAX_DIMS)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "output rank %d exceeds %d", nd, AI_MAX_DIMS);
    if ((st = ai_axes_flags(c->node, axes, n, nd, add)))
        return st;
    for (int d = 0, k = 0; d < nd; d++)
        s[d] = add[d] ? 1 : x->shape[k++];
    return ai_set_meta(&out[0], x->dtype, nd, s);
}

/* ---------------------------------------------------------------- registry */

/* a copy, or a view where the memory plan can (AI_OP_VIEW): backward
 * passes dy through and reads no value */
#define FLAT (ASSIGN1 | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y | AI_OP_VIEW)
OP(op_reshape, "Reshape", 2, 2, 1, FLAT | AI_OP_HALF | AI_OP_ANY_DTYPE, reshape_shape,
   flat_forward, flat_backward)
OP(op_flatten, "Flatten", 1, 1, 1, FLAT | AI_OP_HALF | AI_OP_ANY_DTYPE, flatten_shape,
   flat_forward, flat_backward)
OP(op_squeeze, "Squeeze", 1, 2, 1, FLAT | AI_OP_HALF | AI_OP_ANY_DTYPE, squeeze_shape,
   flat_forward, flat_backward)
OP(op_unsqueeze, "Unsqueeze", 1, 2, 1, FLAT | AI_OP_HALF | AI_OP_ANY_DTYPE, unsqueeze_shape,
   flat_forward, flat_backward)

const ai_op_def *const ai_ops_reshape[] = {
    &op_reshape, &op_flatten, &op_squeeze, &op_unsqueeze, NULL,
};
