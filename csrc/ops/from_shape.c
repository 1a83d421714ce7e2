/*
 * from_shape.c — operators whose result depends on a shape only, not on
 * any element: Shape and Size (of the input; folded at plan time) and
 * ConstantOfShape (a tensor of that shape, filled with one value), EyeLike
 * (ones on a diagonal of a 2-D input's shape). No backward (a data-movement
 * family: movement.h).
 */
#include <string.h>

#include "movement.h"

/* ---------------------------------------------------------------- Shape */

/* dims [start, end) of the input's shape (opset 15 attributes), clamped. */
static int64_t clamp_dim(int64_t i, int64_t r)
{
    i = i < 0 ? i + r : i;
    return i < 0 ? 0 : (i > r ? r : i);
}

static ai_status shape_range(const ai_ctx *c, int64_t *start, int64_t *end)
{
    const int64_t r = c->in[0]->ndim;
    ai_status st = ai_attr_int(c->node, "start", 0, start);
    ai_status st_end = ai_attr_int(c->node, "end", r, end);
    *start = clamp_dim(*start, r);
    *end = clamp_dim(*end, r);
    if (*end < *start)
        *end = *start;
    return st ? st : st_end;
}

static ai_status shape_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int64_t start, end;
    ai_status st = shape_range(c, &start, &end);
    int64_t len = end - start;
    return st ? st : ai_set_meta(&out[0], AI_I64, 1, &len);
}

/* Runs at plan time on the input's shape alone (AI_OP_FOLD_ON_SHAPE). */
static ai_status shape_forward(ai_ctx *c)
{
    int64_t start, end;
    ai_status st = shape_range(c, &start, &end);
    for (int64_t i = start; !st && i < end; i++)
        ((int64_t *)c->out[0]->data)[i - start] = c->in[0]->shape[i];
    return st;
}

/* ---------------------------------------------------------------- ConstantOfShape */

static ai_status cos_value(const ai_ctx *c, const ai_tensor **value)
{
    const ai_attr *a = ai_node_attr(c->node, "value");
    *value = NULL;
    if (!a)
        return AI_OK;
    if (a->type != AI_ATTR_TENSOR || ai_tensor_numel(a->t) != 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "attribute 'value' must be a one-element "
                             "tensor");
    *value = a->t;
    return AI_OK;
}

static ai_status cos_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *value;
    int64_t s[AI_MAX_DIMS];
    int n;
    ai_status st = cos_value(c, &value);
    if (!st)
        st = ai_ints_input(c, 0, 1, "shape", s, AI_MAX_DIMS, &n);
    if (st)
        return st;
    for (int i = 0; i < n; i++)
        if (s[i] < 0)
            return ai_node_error(c->node, AI_ERR_VALUE, "shape[%d] = %lld is negative", i,
                                 (long long)s[i]);
    return ai_set_meta(&out[0], value ? value->dtype : AI_F32, n, s);
}

static ai_status cos_forward(ai_ctx *c)
{
    const ai_tensor *value;
    ai_status st = cos_value(c, &value);
    ai_tensor *y = c->out[0];
    const size_t es = ai_dtype_size(y->dtype);
    const int64_t n = ai_tensor_numel(y);
    if (st || n == 0)
        return st;
    if (!value) {
        memset(y->data, 0, (size_t)n * es); /* the default: float32 zeros */
        return AI_OK;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)y->data + (size_t)i * es, value->data, es);
    return AI_OK;
}

/* ---------------------------------------------------------------- Size */

/* Size: the number of elements, an int64 scalar (folded from the shape). */
static ai_status size_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)c;
    (void)ws;
    (void)state;
    out[0].dtype = AI_I64;
    out[0].ndim = 0;
    return AI_OK;
}

static ai_status size_forward(ai_ctx *c)
{
    *(int64_t *)c->out[0]->data = ai_tensor_numel(c->in[0]);
    return AI_OK;
}

/* ---------------------------------------------------------------- EyeLike */

/* Zeros of the 2-D input's shape, ones on the k-th diagonal (k > 0 above
 * the main one); the dtype attribute (an ONNX code), or the input's. Folded
 * at plan time: only the input's shape counts. */
static ai_status eye_args(const ai_ctx *c, ai_dtype *dt, int64_t *k)
{
    int64_t code;
    ai_status st = ai_attr_int(c->node, "k", 0, k);
    if (!st)
        st = ai_attr_int(c->node, "dtype", -1, &code);
    if (st)
        return st;
    *dt = c->in[0]->dtype;
    if (code != -1 && !ai_dtype_from_onnx(code, dt))
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "dtype %lld is not an engine data type", (long long)code);
    if (ai_dtype_is_storage(*dt))
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "dtype %s is not supported",
                             ai_dtype_name(*dt));
    return AI_OK;
}

static ai_status eye_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    ai_dtype dt;
    int64_t k;
    ai_status st = eye_args(c, &dt, &k);
    if (st)
        return st;
    if (x->ndim != 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank %d; 2 expected", x->ndim);
    return ai_set_meta(&out[0], dt, 2, x->shape);
}

static ai_status eye_forward(ai_ctx *c)
{
    ai_tensor *y = c->out[0];
    ai_dtype dt;
    int64_t k;
    ai_status st = eye_args(c, &dt, &k);
    if (st || ai_tensor_numel(y) == 0)
        return st;
    double one64 = 1;
    char one[8];
    ai_tensor src = {.dtype = AI_F64, .data = &one64}, dst = {.dtype = dt, .data = one};
    if ((st = ai_tensor_copy(&dst, &src))) /* 1 in y's dtype */
        return st;
    const size_t es = ai_dtype_size(dt);
    const int64_t rows = y->shape[0], cols = y->shape[1];
    memset(y->data, 0, ai_tensor_nbytes(y));
    for (int64_t i = k < 0 ? -k : 0; i < rows && i + k < cols; i++)
        memcpy((char *)y->data + (size_t)(i * cols + i + k) * es, one, es);
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

OP(op_shape, "Shape", 1, 1, 1, AI_OP_FOLD_ON_SHAPE | AI_OP_HALF | AI_OP_ANY_DTYPE, shape_shape, shape_forward,
   NULL)
OP(op_constant_of_shape, "ConstantOfShape", 1, 1, 1, AI_OP_HALF, cos_shape, cos_forward, NULL)
OP(op_size, "Size", 1, 1, 1, AI_OP_FOLD_ON_SHAPE | AI_OP_HALF | AI_OP_ANY_DTYPE, size_shape, size_forward,
   NULL)
OP(op_eye_like, "EyeLike", 1, 1, 1, AI_OP_HALF | AI_OP_FOLD_ON_SHAPE | AI_OP_UNSIGNED, eye_shape, eye_forward,
   NULL)

const ai_op_def *const ai_ops_from_shape[] = {&op_shape, &op_constant_of_shape, &op_size,
                                              &op_eye_like, NULL};
