/*
 * generate.c — operators whose output is generated from scalars: Range.
 *
 * Range(start, limit, delta) is the 1-D sequence start, start + delta, ...
 * up to limit (excluded): max(ceil((limit - start) / delta), 0) elements,
 * in the inputs' dtype (float32, float64, int16, int32, int64). Its length
 * depends on the inputs' values, so they must be known when the graph is
 * planned: constants, or values folded from input shapes (positions
 * `torch.arange(x.shape[1])` with a dynamic sequence length). No gradient
 * flows to the scalars (torch.arange is not differentiable).
 */
#include <math.h>
#include <string.h>

#include "../graph.h"

/* The three scalars; integers widened to int64, floats to double. */
typedef struct {
    bool flt;
    double f[3];
    int64_t i[3];
} range_args;

static ai_status range_args_of(const ai_ctx *c, bool at_plan, range_args *r)
{
    static const char *names[3] = {"start", "limit", "delta"};
    const ai_dtype dt = c->in[0]->dtype;
    if (dt != AI_F32 && dt != AI_F64 && dt != AI_I16 && dt != AI_I32 && dt != AI_I64)
        return ai_node_error(c->node, AI_ERR_TYPE, "Range takes float32, float64, int16, "
                             "int32 or int64 scalars, not %s", ai_dtype_name(dt));
    r->flt = ai_dtype_is_float(dt);
    for (int k = 0; k < 3; k++) {
        const ai_tensor *t = at_plan ? ai_ctx_const(c, k) : c->in[k];
        if (c->in[k]->dtype != dt)
            return ai_node_error(c->node, AI_ERR_TYPE, "Range's %s is %s, start is %s",
                                 names[k], ai_dtype_name(c->in[k]->dtype), ai_dtype_name(dt));
        if (ai_tensor_numel(c->in[k]) != 1)
            return ai_node_error(c->node, AI_ERR_VALUE, "Range's %s has %lld elements; a "
                                 "scalar expected", names[k],
                                 (long long)ai_tensor_numel(c->in[k]));
        if (!t)
            return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                                 "Range's %s must be known when the graph is planned (a "
                                 "constant or a value computed from input shapes): its "
                                 "output's length depends on it", names[k]);
        r->f[k] = ai_tensor_get_flat(t, 0);
        r->i[k] = r->flt ? 0 : ai_tensor_get_flat_i64(t, 0);
    }
    if (r->flt ? r->f[2] == 0 || isnan(r->f[2]) : r->i[2] == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "Range's delta is zero");
    return AI_OK;
}

static ai_status range_length(const ai_ctx *c, const range_args *r, int64_t *n)
{
    if (r->flt) {
        double len = ceil((r->f[1] - r->f[0]) / r->f[2]);
        if (!(len < 0x1p62)) /* also NaN and infinite bounds */
            return ai_node_error(c->node, AI_ERR_VALUE, "Range from %g to %g by %g has no "
                                 "finite length", r->f[0], r->f[1], r->f[2]);
        *n = len > 0 ? (int64_t)len : 0;
        return AI_OK;
    }
    /* in 128 bits: limit - start may overflow int64 */
    __int128 span = (__int128)r->i[1] - r->i[0], d = r->i[2];
    __int128 q = span / d + ((span % d != 0) && ((span > 0) == (d > 0)));
    *n = q > 0 ? (int64_t)(q < ((__int128)1 << 62) ? q : ((__int128)1 << 62)) : 0;
    return AI_OK;
}

static ai_status range_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    range_args r = {0};
    ai_status st = range_args_of(c, true, &r);
    if (!st)
        st = range_length(c, &r, &out[0].shape[0]);
    out[0].dtype = c->in[0]->dtype;
    out[0].ndim = 1;
    return st;
}

/* Values as ONNX's reference (numpy.arange) computes them: in the output's
 * dtype, start + i * step, where step = (start + delta) - start. */
static ai_status range_forward(ai_ctx *c)
{
    range_args r = {0};
    ai_status st = range_args_of(c, false, &r);
    ai_tensor *y = c->out[0];
    const int64_t n = ai_tensor_numel(y);
    if (st)
        return st;
    switch (y->dtype) {
    case AI_F32: {
        const float s = (float)r.f[0], d = (float)((float)(s + (float)r.f[2]) - s);
        for (int64_t i = 0; i < n; i++)
            ((float *)y->data)[i] = s + (float)i * d;
        break;
    }
    case AI_F64: {
        const double s = r.f[0], d = (s + r.f[2]) - s;
        for (int64_t i = 0; i < n; i++)
            ((double *)y->data)[i] = s + (double)i * d;
        break;
    }
    /* integers: exact; every value lies between start and limit, so it fits */
    case AI_I16:
        for (int64_t i = 0; i < n; i++)
            ((int16_t *)y->data)[i] = (int16_t)(r.i[0] + i * r.i[2]);
        break;
    case AI_I32:
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)y->data)[i] = (int32_t)(r.i[0] + i * r.i[2]);
        break;
    default:
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)y->data)[i] = r.i[0] + i * r.i[2];
    }
    return AI_OK;
}

static const ai_op_def op_range = {"Range", "", 3, 3, 1, 1, AI_OP_SHAPE_FROM_VALUES, NULL,
                                   range_shape, range_forward, NULL};

const ai_op_def *const ai_ops_generate[] = {&op_range, NULL};
