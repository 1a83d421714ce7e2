/*
 * qlinear.c — ONNX's quantization operators, bit for bit as ONNX defines
 * them (onnx.reference): rounding half to even (rint in the default
 * rounding mode), saturation to the range of the output's integer type.
 *
 *   QuantizeLinear(x, scale[, zp])      y = saturate(rint(x / scale) + zp)
 *   DequantizeLinear(x, scale[, zp])    y = (x - zp) * scale
 *       per-tensor (one scale), per-axis (`axis`, a 1-D scale) or blocked
 *       (`block_size`: the scale has x's shape but ceil(dim / block_size)
 *       along the axis); Quantize's output type is zp's, else
 *       `output_dtype`, else uint8; `precision` sets the type the division
 *       is computed in; `saturate` only concerns float8 outputs.
 *   DynamicQuantizeLinear(x) -> y, scale, zp   uint8 over [min(x, 0), max(x, 0)]
 *   MatMulInteger(a, b[, a_zp, b_zp])   int32 (a - a_zp) @ (b - b_zp), a_zp
 *       per tensor or per row of a, b_zp per tensor or per column of b
 *   ConvInteger(x, w[, x_zp, w_zp])     int32 conv(x - x_zp, w - w_zp), w_zp
 *       per tensor or per output channel; Conv's attributes
 *   QLinearMatMul(a, as, azp, b, bs, bzp, ys, yzp)
 *       y = saturate(rint(acc * (as bs / ys) + yzp)), acc the int32 product
 *       as in MatMulInteger; bs, bzp per tensor or per column
 *   QLinearConv(x, xs, xzp, w, ws, wzp, ys, yzp[, B])
 *       the same with acc = conv(x - xzp, w - wzp) + B; ws, wzp per tensor
 *       or per output channel
 *   QGemm, QLinearAdd, QLinearGlobalAveragePool (com.microsoft): ONNX
 *       Runtime's, for its QOperator format (below)
 *
 * Precision, as the reference computes: the division of QuantizeLinear in
 * the type numpy promotes x and scale to (float16 / float16 in float16,
 * with float32 in float32, int32 or float64 in float64) or in `precision`;
 * Dequantize's product in float32 (float64 for a float64 scale or an
 * int32 x, where x - zp is exact: the reference rounds x to float32 first,
 * which differs only past 2^24), rounded to the output type; the
 * requantization multiplier of the QLinear operators in the scales' type,
 * its product with the accumulator in float64. A value past the integer
 * range saturates (numpy's int32 cast in the reference wraps values beyond
 * 2^31; ONNX says saturate); NaN gives the type's minimum, as the
 * reference does.
 *
 * The integer products run on the int8 kernels where the CPU has them
 * ("on the int8 kernels", "MatMulInteger on the int8 kernels" below), else
 * on the float64 GEMM and convolution kernels:
 * on integers below 2^53 every sum is exact, in whatever order they add;
 * on the float32 ones, twice as fast, where the operands' magnitudes keep
 * every partial sum below 2^24 (8-bit products of up to a few hundred
 * taps, the common case).
 *
 * Quantized tensors: int8, uint8, int16 (DequantizeLinear also int32),
 * dispatched by q_range, q_get and q_set: a new quantized storage type is a
 * case in each. Gradients: DequantizeLinear's to its scale (sum of
 * (x - zp) dy); QuantizeLinear refuses a gradient to x (its output is
 * integer: no straight-through estimator), and the others have none
 * (integer outputs; DynamicQuantizeLinear refuses one to x).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/conv.h"
#include "../kernels/gemm.h"
#include "../kernels/qkernels.h"
#include "../kernels/simd.h"
#include "matmul.h"
#include "spatial.h"

/* ---------------------------------------------------------------- element access */

/* The range of quantized integer type dt; false when dt is not one. */
static bool q_range(ai_dtype dt, int64_t *lo, int64_t *hi)
{
    switch (dt) {
    case AI_I8: *lo = INT8_MIN, *hi = INT8_MAX; return true;
    case AI_U8: *lo = 0, *hi = UINT8_MAX; return true;
    case AI_I16: *lo = INT16_MIN, *hi = INT16_MAX; return true;
    case AI_I32: *lo = INT32_MIN, *hi = INT32_MAX; return true;
    case AI_U16: *lo = 0, *hi = UINT16_MAX; return true;
    case AI_I4: *lo = -8, *hi = 7; return true;
    case AI_U4: *lo = 0, *hi = 15; return true;
    case AI_I2: *lo = -2, *hi = 1; return true;
    case AI_U2: *lo = 0, *hi = 3; return true;
    default: return false;
    }
}

/* The 8- and 4-bit floats QuantizeLinear gives and DequantizeLinear takes
 * (their values converted by ONNX's rules, tensor.c) */
static bool q_small_float(ai_dtype dt)
{
    return dt == AI_F8E4M3FN || dt == AI_F8E4M3FNUZ || dt == AI_F8E5M2 ||
           dt == AI_F8E5M2FNUZ || dt == AI_F4E2M1;
}

/* Element i of a quantized tensor (NULL: the zero point 0). */
static int64_t q_get(const ai_tensor *t, int64_t i)
{
    if (!t)
        return 0;
    switch (t->dtype) {
    case AI_I8: return ((const int8_t *)t->data)[i];
    case AI_U8: return ((const uint8_t *)t->data)[i];
    case AI_I16: return ((const int16_t *)t->data)[i];
    case AI_I32: return ((const int32_t *)t->data)[i];
    default: return ai_tensor_get_flat_i64(t, i); /* uint16, the 4- and 2-bit types */
    }
}

/* Stores v, already in the range of t's type. */
static void q_set(ai_tensor *t, int64_t i, int64_t v)
{
    switch (t->dtype) {
    case AI_I8: ((int8_t *)t->data)[i] = (int8_t)v; break;
    case AI_U8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    case AI_I16: ((int16_t *)t->data)[i] = (int16_t)v; break;
    case AI_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case AI_U16: ((uint16_t *)t->data)[i] = (uint16_t)v; break;
    case AI_I4:
    case AI_U4: ((uint8_t *)t->data)[i] = (uint8_t)(v & 0xf); break; /* (one a byte) */
    default: ((uint8_t *)t->data)[i] = (uint8_t)(v & 0x3); break;    /* int2, uint2 */
    }
}

/* Element i of a quantized tensor as a number (NULL: 0); the small floats
 * by their value. */
static double q_value(const ai_tensor *t, int64_t i)
{
    return t && q_small_float(t->dtype) ? ai_tensor_get_flat(t, i) : (double)q_get(t, i);
}

/* rint(v) (half to even) saturated to [lo, hi]; NaN gives lo. (Saturating
 * first is the same for integer bounds, and rint, unlike nearbyint, does
 * not save and restore the floating-point environment: many times faster.) */
static int64_t q_saturate(double v, int64_t lo, int64_t hi)
{
    if (!(v >= (double)lo))
        return lo;
    return v > (double)hi ? hi : (int64_t)rint(v);
}

static bool is_float_dtype(ai_dtype dt)
{
    return dt == AI_F32 || dt == AI_F64 || ai_dtype_is_half(dt);
}

/* Element i of a float16/bfloat16/32/64 or int32 tensor. */
static double f_get(const ai_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case AI_F16: return ai_f16_to_f32(((const uint16_t *)t->data)[i]);
    case AI_BF16: return ai_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case AI_F32: return ((const float *)t->data)[i];
    case AI_F64: return ((const double *)t->data)[i];
    default: return ((const int32_t *)t->data)[i];
    }
}

/* v rounded to float type dt (one rounding from double: exact for what
 * these operators compute, see round_to's callers). */
static double round_to(ai_dtype dt, double v)
{
    if (dt == AI_F32)
        return (float)v;
    if (dt == AI_F16)
        return ai_f16_to_f32(ai_f32_to_f16((float)v));
    if (dt == AI_BF16)
        return ai_bf16_to_f32(ai_f32_to_bf16((float)v));
    return v;
}

static void f_set(ai_tensor *t, int64_t i, double v)
{
    if (t->dtype == AI_F16)
        ((uint16_t *)t->data)[i] = ai_f32_to_f16((float)v);
    else if (t->dtype == AI_BF16)
        ((uint16_t *)t->data)[i] = ai_f32_to_bf16((float)v);
    else
        ai_float_set(t, i, v);
}

/* The type numpy computes a binary float operation of a and b in. */
static ai_dtype promote(ai_dtype a, ai_dtype b)
{
    if (a == AI_F64 || b == AI_F64 || !is_float_dtype(a) || !is_float_dtype(b))
        return AI_F64;
    return a == b ? a : AI_F32;
}

static ai_status need_float(const ai_node *n, const char *what, const ai_tensor *t)
{
    if (!is_float_dtype(t->dtype))
        return ai_node_error(n, AI_ERR_TYPE,
                             "%s is %s; float16, bfloat16, float32 or float64 expected", what,
                             ai_dtype_name(t->dtype));
    return AI_OK;
}

/* x must be int8 or uint8 (the QLinear and Integer operators' inputs). */
static ai_status need_8bit(const ai_node *n, const char *what, const ai_tensor *t)
{
    if (t->dtype != AI_I8 && t->dtype != AI_U8)
        return ai_node_error(n, AI_ERR_TYPE, "%s is %s; int8 or uint8 expected", what,
                             ai_dtype_name(t->dtype));
    return AI_OK;
}

/* A zero point: x's type, `count` values (or one) in a tensor of rank <= 1. */
static ai_status check_zero_point(const ai_node *n, const char *what, const ai_tensor *zp,
                                  ai_dtype dt, int64_t count, const char *per)
{
    if (!zp)
        return AI_OK;
    if (zp->dtype != dt)
        return ai_node_error(n, AI_ERR_TYPE, "%s is %s; %s (its input's type) expected", what,
                             ai_dtype_name(zp->dtype), ai_dtype_name(dt));
    int64_t k = ai_tensor_numel(zp);
    if (zp->ndim > 1 || (k != 1 && k != count))
        return ai_node_error(n, AI_ERR_VALUE, "%s has shape of %lld values; a scalar%s%s "
                             "expected", what, (long long)k, per ? " or one value per " : "",
                             per ? per : "");
    return AI_OK;
}

/* A scale: float, `count` values (or one, per tensor) in rank <= 1. */
static ai_status check_scale(const ai_node *n, const char *what, const ai_tensor *s,
                             int64_t count, const char *per)
{
    ai_status st = need_float(n, what, s);
    if (st)
        return st;
    int64_t k = ai_tensor_numel(s);
    if (s->ndim > 1 || (k != 1 && k != count))
        return ai_node_error(n, AI_ERR_VALUE, "%s has %lld values; a scalar%s%s expected",
                             what, (long long)k, per ? " or one value per " : "",
                             per ? per : "");
    return AI_OK;
}

/* ------------------------------------------------ QuantizeLinear, DequantizeLinear */

typedef struct {
    int64_t axis, block_size, output_dtype, precision; /* 0: not given */
    int64_t saturate; /* the 8- and 4-bit float outputs: clamp (1) or inf/NaN (0) */
} qdq_attrs;

static ai_status qdq_init(ai_node *n)
{
    qdq_attrs *a = calloc(1, sizeof *a);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    ai_status st;
    if ((st = ai_attr_int(n, "axis", 1, &a->axis)) ||
        (st = ai_attr_int(n, "block_size", 0, &a->block_size)) ||
        (st = ai_attr_int(n, "output_dtype", 0, &a->output_dtype)) ||
        (st = ai_attr_int(n, "precision", 0, &a->precision)) ||
        (st = ai_attr_int(n, "saturate", 1, &a->saturate)))
        return st;
    if (a->block_size < 0)
        return ai_node_error(n, AI_ERR_VALUE, "block_size is %lld; must be >= 0",
                             (long long)a->block_size);
    if (a->saturate != 0 && a->saturate != 1)
        return ai_node_error(n, AI_ERR_VALUE, "saturate is %lld; 0 or 1 expected",
                             (long long)a->saturate);
    return AI_OK;
}

/* Where element (o, a, i) of x, read as (outer, dim, inner) around the
 * axis, finds its scale and zero point: o so + (a / block) sa + i si. */
typedef struct {
    int64_t outer, dim, inner, block, so, sa, si;
} qdq_layout;

static ai_status qdq_layout_of(const ai_ctx *c, qdq_layout *l)
{
    const ai_node *n = c->node;
    const qdq_attrs *a = n->params;
    const ai_tensor *x = c->in[0], *s = c->in[1], *zp = c->n_in > 2 ? c->in[2] : NULL;
    ai_status st;
    if ((st = need_float(n, "the scale", s)))
        return st;
    const bool one = ai_tensor_numel(s) == 1; /* per tensor: any shape of one element */
    if (zp && (one ? ai_tensor_numel(zp) != 1
                   : zp->ndim != s->ndim || memcmp(zp->shape, s->shape,
                                                   sizeof(int64_t) * s->ndim)))
        return ai_node_error(n, AI_ERR_VALUE, "the zero point's shape differs from the "
                             "scale's");
    *l = (qdq_layout){1, 1, 1, 1, 0, 0, 0};
    for (int d = 0; d < x->ndim; d++)
        l->outer *= x->shape[d];
    if (one)
        return AI_OK;
    int axis;
    if ((st = ai_norm_axis(n, a->axis, x->ndim, &axis)))
        return st;
    l->outer = l->inner = 1;
    for (int d = 0; d < axis; d++)
        l->outer *= x->shape[d];
    for (int d = axis + 1; d < x->ndim; d++)
        l->inner *= x->shape[d];
    l->dim = x->shape[axis];
    if (!a->block_size) {
        if (s->ndim != 1 || s->shape[0] != l->dim)
            return ai_node_error(n, AI_ERR_VALUE, "the scale has %lld values in %d dims; one, "
                                 "or %lld (x's dim %d, the axis) in a 1-D tensor expected",
                                 (long long)ai_tensor_numel(s), s->ndim, (long long)l->dim,
                                 axis);
        l->sa = 1;
        return AI_OK;
    }
    /* (ceil without the overflow of dim + block_size - 1) */
    const int64_t blocks = l->dim / a->block_size + (l->dim % a->block_size != 0);
    bool ok = s->ndim == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++)
        ok = s->shape[d] == (d == axis ? blocks : x->shape[d]);
    if (!ok)
        return ai_node_error(n, AI_ERR_VALUE, "blocked quantization: the scale must have x's "
                             "shape but %lld (ceil(%lld / block_size %lld)) along axis %d",
                             (long long)blocks, (long long)l->dim, (long long)a->block_size,
                             axis);
    l->block = a->block_size;
    l->so = blocks * l->inner;
    l->sa = l->inner;
    l->si = 1;
    return AI_OK;
}

/* The output type of QuantizeLinear: zp's, else output_dtype, else uint8. */
static ai_status quantize_out_dtype(const ai_ctx *c, ai_dtype *out)
{
    const ai_node *n = c->node;
    const qdq_attrs *a = n->params;
    const ai_tensor *zp = c->n_in > 2 ? c->in[2] : NULL;
    ai_dtype dt = AI_U8;
    if (a->output_dtype && !ai_dtype_from_onnx(a->output_dtype, &dt))
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "output_dtype %lld (ONNX data type) "
                             "is not an engine type", (long long)a->output_dtype);
    if (zp && a->output_dtype && zp->dtype != dt)
        return ai_node_error(n, AI_ERR_TYPE, "output_dtype is %s but the zero point is %s",
                             ai_dtype_name(dt), ai_dtype_name(zp->dtype));
    if (zp)
        dt = zp->dtype;
    int64_t lo = 0, hi = 0;
    if ((!q_range(dt, &lo, &hi) || dt == AI_I32) && !q_small_float(dt))
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "quantizing to %s is not supported "
                             "(8-, 16-, 4- and 2-bit integers, the 8- and 4-bit floats)",
                             ai_dtype_name(dt));
    *out = dt;
    return AI_OK;
}

/* The type QuantizeLinear divides in: `precision`, else numpy's promotion. */
static ai_status quantize_precision(const ai_ctx *c, ai_dtype *out)
{
    const qdq_attrs *a = c->node->params;
    *out = promote(c->in[0]->dtype, c->in[1]->dtype);
    if (a->precision && (!ai_dtype_from_onnx(a->precision, out) || !is_float_dtype(*out)))
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "precision %lld (ONNX data "
                             "type) is not supported (float16, float32 or float64)",
                             (long long)a->precision);
    return AI_OK;
}

static ai_status quantize_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_tensor *x = c->in[0];
    qdq_layout l;
    ai_dtype dt = AI_U8, prec = AI_F32;
    ai_status st;
    if (!is_float_dtype(x->dtype) && x->dtype != AI_I32)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float16, float32, float64 "
                             "or int32 expected", ai_dtype_name(x->dtype));
    if ((st = qdq_layout_of(c, &l)) || (st = quantize_out_dtype(c, &dt)) ||
        (st = quantize_precision(c, &prec)))
        return st;
    out[0].dtype = dt;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * x->ndim);
    return AI_OK;
}

/* The common case in a branch-free loop: float32 x and scale, per
 * tensor, 8-bit y: the float32 quotient q (as the general loop), then
 * rint(q) + zp, saturated (q clamped to [lo - zp, hi - zp] first: the same
 * for integer bounds), NaN to the minimum. */
static void quantize_f32_to_8bit(const ai_tensor *x, float scale, double zp, ai_tensor *y)
{
    int64_t lo = 0, hi = 0;
    q_range(y->dtype, &lo, &hi);
    const double dlo = (double)lo - zp, dhi = (double)hi - zp;
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: v + magic - magic = rint(v) */
    const float *xv = x->data;
    const int64_t n = ai_tensor_numel(x);
    for (int64_t i = 0; i < n; i++) {
        double v = (double)(xv[i] / scale);
        v = !(v >= dlo) ? dlo : v > dhi ? dhi : v;
        const int q = (int)((v + magic) - magic + zp);
        if (y->dtype == AI_U8)
            ((uint8_t *)y->data)[i] = (uint8_t)q;
        else
            ((int8_t *)y->data)[i] = (int8_t)q;
    }
}

static ai_status quantize_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *s = c->in[1], *zp = c->n_in > 2 ? c->in[2] : NULL;
    ai_tensor *y = c->out[0];
    qdq_layout l;
    ai_dtype prec;
    int64_t lo = 0, hi = 0;
    ai_status st;
    if ((st = qdq_layout_of(c, &l)) || (st = quantize_precision(c, &prec)))
        return st;
    const bool small = q_small_float(y->dtype);
    const qdq_attrs *qa = c->node->params;
    const ai_convert_mode mode = {qa->saturate != 0, AI_ROUND_UP};
    q_range(y->dtype, &lo, &hi);
    if (x->dtype == AI_F32 && s->dtype == AI_F32 && prec == AI_F32 && ai_tensor_numel(s) == 1 &&
        (y->dtype == AI_I8 || y->dtype == AI_U8)) {
        quantize_f32_to_8bit(x, *(const float *)s->data, (double)q_get(zp, 0), y);
        return AI_OK;
    }
    int64_t e = 0;
    for (int64_t o = 0; o < l.outer; o++)
        for (int64_t a = 0; a < l.dim; a++) {
            const int64_t s0 = o * l.so + a / l.block * l.sa;
            for (int64_t i = 0; i < l.inner; i++, e++) {
                const int64_t k = s0 + i * l.si;
                /* the quotient of two values of `prec`, rounded once to it */
                double q = round_to(prec, round_to(prec, f_get(x, e)) /
                                              round_to(prec, f_get(s, k)));
                if (small) /* x / scale + zp converted, rounding to nearest even */
                    ((uint8_t *)y->data)[e] =
                        ai_f64_to_small_float(q + q_value(zp, k), y->dtype, mode);
                else
                    q_set(y, e, q_saturate(rint(q) + (double)q_get(zp, k), lo, hi));
            }
        }
    return AI_OK;
}

/* The output is integer: no gradient reaches x (nor the scale: y is
 * piecewise constant in it). */
static ai_status quantize_backward(ai_ctx *c)
{
    if (c->din[0])
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "QuantizeLinear is not "
                             "differentiable (integer output; the straight-through estimator "
                             "of fake quantization is not implemented)");
    return AI_OK;
}

static ai_status dequantize_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_node *n = c->node;
    const qdq_attrs *a = n->params;
    const ai_tensor *x = c->in[0], *zp = c->n_in > 2 ? c->in[2] : NULL;
    qdq_layout l;
    int64_t lo = 0, hi = 0;
    ai_status st;
    if (!q_range(x->dtype, &lo, &hi) && !q_small_float(x->dtype))
        return ai_node_error(n, AI_ERR_TYPE, "input is %s; an 8-, 16-, 32-, 4- or 2-bit "
                             "integer or an 8- or 4-bit float expected",
                             ai_dtype_name(x->dtype));
    if (zp && zp->dtype != x->dtype)
        return ai_node_error(n, AI_ERR_TYPE, "the zero point is %s; %s (x's type) expected",
                             ai_dtype_name(zp->dtype), ai_dtype_name(x->dtype));
    if ((st = qdq_layout_of(c, &l)))
        return st;
    ai_dtype dt = c->in[1]->dtype;
    if (a->output_dtype && (!ai_dtype_from_onnx(a->output_dtype, &dt) || !is_float_dtype(dt)))
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "output_dtype %lld (ONNX data type) "
                             "is not supported (float16, float32 or float64)",
                             (long long)a->output_dtype);
    out[0].dtype = dt;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * x->ndim);
    return AI_OK;
}

static ai_status dequantize_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *s = c->in[1], *zp = c->n_in > 2 ? c->in[2] : NULL;
    ai_tensor *y = c->out[0];
    qdq_layout l;
    ai_status st = qdq_layout_of(c, &l);
    if (st)
        return st;
    /* (x - zp) * scale in float32, then y's type; in float64 for a float64
     * scale or an int32 x (numpy's promotions in the reference) */
    const ai_dtype prec = s->dtype == AI_F64 || x->dtype == AI_I32 ? AI_F64 : AI_F32;
    if ((x->dtype == AI_I8 || x->dtype == AI_U8) && s->dtype == AI_F32 && y->dtype == AI_F32 &&
        ai_tensor_numel(s) == 1) { /* the common case, per tensor: one float32 product */
        const float sc = *(const float *)s->data, z = (float)q_get(zp, 0);
        float *yv = y->data;
        const int64_t n = ai_tensor_numel(x);
        if (x->dtype == AI_I8)
            for (int64_t i = 0; i < n; i++)
                yv[i] = ((float)((const int8_t *)x->data)[i] - z) * sc;
        else
            for (int64_t i = 0; i < n; i++)
                yv[i] = ((float)((const uint8_t *)x->data)[i] - z) * sc;
        return AI_OK;
    }
    int64_t e = 0;
    for (int64_t o = 0; o < l.outer; o++)
        for (int64_t a = 0; a < l.dim; a++) {
            const int64_t s0 = o * l.so + a / l.block * l.sa;
            for (int64_t i = 0; i < l.inner; i++, e++) {
                const int64_t k = s0 + i * l.si;
                double d = round_to(prec, q_value(x, e) - q_value(zp, k));
                f_set(y, e, round_to(y->dtype, round_to(prec, d * f_get(s, k))));
            }
        }
    return AI_OK;
}

/* dscale[k] += sum of (x - zp) dy over the elements of scale k. */
static ai_status dequantize_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *zp = c->n_in > 2 ? c->in[2] : NULL, *dy = c->dout[0];
    ai_tensor *ds = c->din[1];
    if (!ds)
        return AI_OK;
    if (ds->dtype != AI_F32 && ds->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "the scale's gradient in %s is "
                             "not supported", ai_dtype_name(ds->dtype));
    qdq_layout l;
    ai_status st = qdq_layout_of(c, &l);
    if (st)
        return st;
    int64_t e = 0;
    for (int64_t o = 0; o < l.outer; o++)
        for (int64_t a = 0; a < l.dim; a++) {
            const int64_t s0 = o * l.so + a / l.block * l.sa;
            for (int64_t i = 0; i < l.inner; i++, e++) {
                const int64_t k = s0 + i * l.si;
                ai_float_set(ds, k, ai_float_at(ds, k) +
                             (q_value(x, e) - q_value(zp, k)) * f_get(dy, e));
            }
        }
    return AI_OK;
}

/* ---------------------------------------------------------------- DynamicQuantizeLinear */

static ai_status dynamic_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_F32)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 expected",
                             ai_dtype_name(x->dtype));
    out[0].dtype = AI_U8;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * x->ndim);
    out[1] = (ai_meta){.dtype = AI_F32, .ndim = 0};
    out[2] = (ai_meta){.dtype = AI_U8, .ndim = 0};
    return AI_OK;
}

/* The range of x extended to 0: NaNs skipped (no comparison holds); the
 * same minimum and maximum in any order (a -0 never replaces the starting
 * +0), so the AVX2 lanes' (vminps / vmaxps: v < lo ? v : lo and
 * v > hi ? v : hi, the scalar loop's) are the scalar loop's. */
static void range_plain(const float *x, int64_t n, float *lo, float *hi)
{
    for (int64_t i = 0; i < n; i++) {
        *lo = x[i] < *lo ? x[i] : *lo;
        *hi = x[i] > *hi ? x[i] : *hi;
    }
}

/* y = saturate(rint(x / scale) + zp) in float32 (every value an integer of
 * magnitude below 2^24 or infinite: the sum is exact), NaN to 0. */
static void quantize_plain(const float *x, int64_t n, float scale, float zp, uint8_t *y)
{
    for (int64_t i = 0; i < n; i++) {
        float v = rintf(x[i] / scale) + zp;
        v = v > 0.0f ? v : 0.0f;
        y[i] = (uint8_t)(int32_t)(v < 255.0f ? v : 255.0f);
    }
}

#if defined(AI_AVX512_KERNEL)
#include <immintrin.h>
#define DQ_AVX2 __attribute__((target("arch=x86-64-v3")))

/* the AVX2 lanes, on the int8 kernels' AVX2 path and up (ai_q_set_path: the
 * tests compare both) */
static DQ_AVX2 void range_avx2(const float *x, int64_t n, float *lo, float *hi)
{
    __m256 l[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, h[2] = {l[0], l[1]};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int t = 0; t < 2; t++) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * t);
            l[t] = _mm256_min_ps(v, l[t]);
            h[t] = _mm256_max_ps(v, h[t]);
        }
    float lanes[16];
    _mm256_storeu_ps(lanes, _mm256_min_ps(l[0], l[1]));
    _mm256_storeu_ps(lanes + 8, _mm256_max_ps(h[0], h[1]));
    *lo = 0.0f, *hi = 0.0f;
    range_plain(lanes, 16, lo, hi);
    range_plain(x + i, n - i, lo, hi);
}

/* quantize_plain's: vroundps of the current mode (rint), vmaxps(v, 0) (NaN
 * to 0), vminps(v, 255), then packed */
static DQ_AVX2 void quantize_avx2(const float *x, int64_t n, float scale, float zp,
                                   uint8_t *y)
{
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zp);
    const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i q[2];
        for (int t = 0; t < 2; t++) {
            __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * t), s),
                                       _MM_FROUND_CUR_DIRECTION);
            v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(v, z), zero), top);
            q[t] = _mm256_cvttps_epi32(v);
        }
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(q[0], q[1]), 0xd8);
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm_packus_epi16(_mm256_castsi256_si128(w),
                                          _mm256_extracti128_si256(w, 1)));
    }
    quantize_plain(x + i, n - i, scale, zp, y + i);
}
#endif

static void dynamic_range(const float *x, int64_t n, float *lo, float *hi)
{
#if defined(AI_AVX512_KERNEL)
    if (ai_q_path() >= AI_Q_AVX2) {
        range_avx2(x, n, lo, hi);
        return;
    }
#endif
    *lo = 0.0f, *hi = 0.0f;
    range_plain(x, n, lo, hi);
}

static void dynamic_quantize(const float *x, int64_t n, float scale, float zp, uint8_t *y)
{
#if defined(AI_AVX512_KERNEL)
    if (ai_q_path() >= AI_Q_AVX2) {
        quantize_avx2(x, n, scale, zp, y);
        return;
    }
#endif
    quantize_plain(x, n, scale, zp, y);
}

/* All in float32, as ONNX's function body: scale = (max - min) / 255 over
 * x's range extended to 0, zp = rint(clamp(-min / scale, 0, 255)). */
static ai_status dynamic_forward(ai_ctx *c)
{
    const int64_t count = ai_tensor_numel(c->in[0]);
    float lo, hi;
    dynamic_range(c->in[0]->data, count, &lo, &hi);
    const float scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
    const float zp = rintf(fminf(fmaxf(0.0f - lo / scale, 0.0f), 255.0f));
    dynamic_quantize(c->in[0]->data, count, scale, zp, c->out[0]->data);
    *(float *)c->out[1]->data = scale;
    *(uint8_t *)c->out[2]->data = (uint8_t)zp;
    return AI_OK;
}

static ai_status dynamic_backward(ai_ctx *c)
{
    if (c->din[0])
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "DynamicQuantizeLinear is not "
                             "differentiable");
    return AI_OK;
}

/* ---------------------------------------------------------------- integer products */

/* The int32 accumulators of the QLinear and Integer operators: the inputs
 * less their zero points in float64 in the workspace, multiplied by the
 * float64 GEMM (kernels/gemm.h): every product and partial sum is an
 * integer far below 2^53, so exact in any order; then wrapped to int32 as
 * the reference's int32 product does. */

/* dst[e] = src[e] - zp[e's index in zp], zp per tensor (NULL: 0) or per
 * element of a (outer, count, inner) view (count values). */
static void minus_zero_point(double *dst, const ai_tensor *src, const ai_tensor *zp,
                             int64_t outer, int64_t count, int64_t inner)
{
    const bool per = zp && ai_tensor_numel(zp) > 1;
    int64_t e = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < count; k++) {
            const int64_t z = q_get(zp, per ? k : 0);
            for (int64_t i = 0; i < inner; i++, e++)
                dst[e] = (double)(q_get(src, e) - z);
        }
}

/* Float32 runs them twice as fast, exactly too where every partial sum is
 * an integer below 2^24: a sum of products of row i of A and column j of B
 * is at most max|a| * sum_k |b_kj| in magnitude, whatever the order. The
 * operands are then converted in place (to_f32). */
#define F32_EXACT 16777216.0 /* 2^24 */

static double max_abs(const double *v, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double a = fabs(v[i]);
        m = a > m ? a : m;
    }
    return m;
}

/* Whether products of rows of a (na values) by the `rows` rows of `len`
 * values of bt are exact in float32. */
static bool exact_in_f32(const double *a, int64_t na, const double *bt, int64_t rows,
                         int64_t len)
{
    double l1 = 0;
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t k = 0; k < len; k++)
            s += fabs(bt[r * len + k]);
        l1 = s > l1 ? s : l1;
    }
    return max_abs(a, na) * l1 < F32_EXACT;
}

/* The n doubles at v as floats at the same address (each float is written
 * at or before the double it comes from, which has then been read). */
static float *to_f32(double *v, int64_t n)
{
    float *f = (float *)v;
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)v[i];
    return f;
}

/* y (M, N) = a (M, K) @ bt (N, K)^T on integers held in float64: exact. */
static void gemm_exact(int64_t M, int64_t N, int64_t K, const double *a, const double *bt,
                       double *y)
{
    ai_gemm_f64(false, true, M, N, K, 1.0, a, K, bt, K, 0.0, y, N);
}

/* dst[i] = src[i] (an exact integer) wrapped to int32; from float32 (f32)
 * or float64 values. */
static void wrap_int32(int32_t *dst, const double *src, int64_t n, bool f32)
{
    const float *f = (const float *)src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (int32_t)(uint32_t)(f32 ? (int64_t)f[i] : (int64_t)src[i]);
}

/* Input slots of the two matrix products. */
typedef struct {
    int a, a_zp, b, b_zp;
} mm_slots;

static const mm_slots MATMUL_INTEGER = {0, 2, 1, 3}, QLINEAR_MATMUL = {0, 2, 3, 5};

static const ai_tensor *in_or_null(const ai_ctx *c, int i) { return i < c->n_in ? c->in[i] : NULL; }

static ai_status mm_check(const ai_ctx *c, mm_slots s, ai_mm_dims *d, size_t *ws)
{
    const ai_node *n = c->node;
    const ai_tensor *a = c->in[s.a], *b = c->in[s.b];
    ai_status st;
    if ((st = need_8bit(n, "A", a)) || (st = need_8bit(n, "B", b)) ||
        (st = ai_matmul_dims(n, a, b, d)) ||
        (st = check_zero_point(n, "A's zero point", in_or_null(c, s.a_zp), a->dtype, d->M,
                               "row of A")) ||
        (st = check_zero_point(n, "B's zero point", in_or_null(c, s.b_zp), b->dtype, d->N,
                               "column of B")))
        return st;
    /* A and B transposed in float64, their product, then as int32 */
    *ws = sizeof(double) * (size_t)(ai_tensor_numel(a) + ai_tensor_numel(b) +
                                    d->count * d->M * d->N) +
          sizeof(int32_t) * (size_t)(d->count * d->M * d->N);
    return AI_OK;
}

static void mm_meta(const ai_ctx *c, mm_slots s, const ai_mm_dims *d, ai_dtype dt,
                    ai_meta *out)
{
    out->dtype = dt;
    out->ndim = d->nb;
    memcpy(out->shape, d->batch, sizeof(int64_t) * (size_t)d->nb);
    if (c->in[s.a]->ndim >= 2)
        out->shape[out->ndim++] = d->M;
    if (c->in[s.b]->ndim >= 2)
        out->shape[out->ndim++] = d->N;
}

/* The matrices of t: the product of its batch dims. */
static int64_t matrices(const ai_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim - 2; d++)
        n *= t->shape[d];
    return n;
}

/* The int32 products of every output matrix into the workspace (returned). */
static int32_t *mm_accumulate(const ai_ctx *c, mm_slots s, const ai_mm_dims *d)
{
    const ai_tensor *a = c->in[s.a], *b = c->in[s.b];
    const int64_t M = d->M, N = d->N, K = d->K, na = matrices(a), nbm = matrices(b);
    double *A = c->workspace, *Bt = A + na * M * K, *Yd = Bt + nbm * K * N;
    int32_t *Y = (int32_t *)(Yd + d->count * M * N);
    minus_zero_point(A, a, in_or_null(c, s.a_zp), na, M, K);
    const ai_tensor *bzp = in_or_null(c, s.b_zp);
    const bool per = bzp && ai_tensor_numel(bzp) > 1;
    for (int64_t m = 0; m < nbm; m++) /* B's matrices, transposed: rows are columns */
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++)
                Bt[(m * N + j) * K + k] = (double)(q_get(b, (m * K + k) * N + j) -
                                                   q_get(bzp, per ? j : 0));
    const bool f32 = exact_in_f32(A, na * M * K, Bt, nbm * N, K);
    const float *A32 = f32 ? to_f32(A, na * M * K) : NULL;
    const float *B32 = f32 ? to_f32(Bt, nbm * N * K) : NULL;
    for (int64_t i = 0; i < d->count; i++) {
        int64_t ia, ib;
        ai_matmul_batch(d, i, &ia, &ib);
        if (f32)
            ai_gemm_f32(false, true, M, N, K, 1.0f, A32 + ia * M * K, K, B32 + ib * N * K, K,
                        0.0f, (float *)Yd + i * M * N, N);
        else
            gemm_exact(M, N, K, A + ia * M * K, Bt + ib * N * K, Yd + i * M * N);
    }
    wrap_int32(Y, Yd, d->count * M * N, f32);
    return Y;
}

/* The requantization of QLinearMatMul / QLinearConv: the inputs at
 * (x_scale, x_zp, w_scale, w_zp, y_scale, y_zp); w's per `per` (columns
 * of B, output channels of W: `count`). */
typedef struct {
    int xs, xzp, ws, wzp, ys, yzp;
} rq_slots;

/* the same slots in QLinearMatMul and QLinearConv */
static const rq_slots QLINEAR_RQ = {1, 2, 4, 5, 6, 7};

/* Checks the scales and y's zero point; *dt: y's type. */
static ai_status rq_check(const ai_ctx *c, rq_slots s, int64_t count, const char *per,
                          ai_dtype *dt)
{
    const ai_node *n = c->node;
    const ai_tensor *yzp = c->in[s.yzp];
    ai_status st;
    if ((st = check_scale(n, "the input's scale", c->in[s.xs], 1, NULL)) ||
        (st = check_scale(n, "the weight's scale", c->in[s.ws], count, per)) ||
        (st = check_scale(n, "y's scale", c->in[s.ys], 1, NULL)))
        return st;
    *dt = yzp ? yzp->dtype : c->in[0]->dtype;
    if (yzp && ((st = check_zero_point(n, "y's zero point", yzp, yzp->dtype, 1, NULL)) ||
                (st = need_8bit(n, "y's zero point", yzp))))
        return st;
    return AI_OK;
}

/* y[e] = saturate(rint(acc[e] * (xs ws[k] / ys) + yzp)), k the weight
 * scale of e in a (outer, count, inner) view; the multiplier in the
 * scales' type, the rest in float64, as the reference. */
static void requantize(const ai_ctx *c, rq_slots s, const int32_t *acc, int64_t outer,
                       int64_t count, int64_t inner)
{
    const ai_tensor *xs = c->in[s.xs], *ws = c->in[s.ws], *ys = c->in[s.ys];
    const ai_tensor *yzp = c->in[s.yzp];
    ai_tensor *y = c->out[0];
    const ai_dtype prec = promote(promote(xs->dtype, ws->dtype), ys->dtype);
    const bool per = ai_tensor_numel(ws) > 1;
    const double zp = (double)q_get(yzp, 0);
    int64_t lo = 0, hi = 0, e = 0;
    q_range(y->dtype, &lo, &hi);
    const double dlo = (double)lo, dhi = (double)hi;
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: v + magic - magic = rint(v) */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < count; k++) {
            const double mult = round_to(prec, round_to(prec, f_get(xs, 0) *
                                                                  f_get(ws, per ? k : 0)) /
                                                   f_get(ys, 0));
            /* the common case in branch-free loops (a finite multiplier: no NaN) */
            if ((y->dtype == AI_U8 || y->dtype == AI_I8) && isfinite(mult)) {
                const int32_t *a = acc + e;
                if (y->dtype == AI_U8) {
                    uint8_t *u8 = (uint8_t *)y->data + e;
                    for (int64_t i = 0; i < inner; i++) {
                        double v = (double)a[i] * mult + zp;
                        v = v < dlo ? dlo : v;
                        v = v > dhi ? dhi : v;
                        u8[i] = (uint8_t)(int)((v + magic) - magic);
                    }
                } else {
                    int8_t *i8 = (int8_t *)y->data + e;
                    for (int64_t i = 0; i < inner; i++) {
                        double v = (double)a[i] * mult + zp;
                        v = v < dlo ? dlo : v;
                        v = v > dhi ? dhi : v;
                        i8[i] = (int8_t)(int)((v + magic) - magic);
                    }
                }
                e += inner;
                continue;
            }
            for (int64_t i = 0; i < inner; i++, e++)
                q_set(y, e, q_saturate((double)acc[e] * mult + zp, lo, hi));
        }
}

/* ---------------------------------------------------------------- on the int8 kernels */

/* QLinearConv, QLinearMatMul (by a constant matrix) and QGemm run on the
 * int8 kernels of the quantized operators (kernels/qkernels.h: VNNI, AVX2
 * or plain C, as QConv and QGemm of ops/quant.c) wherever they give the
 * reference's integers exactly:
 *   - the weight less its zero point is int8 (w' = w - wzp in [-128, 127]);
 *     x enters as int8 x8 (x, or x - 128 = x ^ 0x80 for uint8) and its zero
 *     point z8 alike; the bias absorbs it: acc = B + sum (x8 - z8) w' =
 *     (B - z8 sum w') + sum x8 w', in wrapping int32 arithmetic as the
 *     reference's int32. A padded convolution pads with x's zero point: x8
 *     is then copied into planes padded with z8 (unless z8 = 0 for int8).
 *   - the multiplier (xs ws / ys in the scales' type, as `requantize`) is
 *     M / 2^e, M an int32, 0 <= e <= 43: the reference's float64
 *     rint(acc mult + zp) (the sum rounds, ties to even) is then the
 *     kernels' integer rounding of (acc M + zp 2^e) / 2^e (aik_rq.half_even
 *     and zero_point): acc M is exact in float64 where |acc| M < 2^53
 *     (checked with |acc| <= |B| + max|x8 - z8| sum|w'|, or 2^31 as
 *     wrapped), and adding zp is exact within the output's range where
 *     e <= 43.
 *   - the output: int8 with zero point zp, or uint8 as int8 y - 128 (zero
 *     point zp - 128), turned to uint8 after (^ 0x80).
 * Taken on the VNNI and AVX2 paths: plain C is slower than the float path
 * above (a 3x3 conv of 32 -> 64 channels on 32x32 uint8, batch 8, 1 thread,
 * AMD EPYC: VNNI 1.1 ms, AVX2 2.8-3.0 ms, the float path 12.6 ms with or
 * without AVX-512, plain C ~260 ms). Elsewhere, and on ai_q_set_path below
 * AI_Q_AVX2, the float path (their twin, tests/test_qlinear_fast.py). */
#define FAST_PATH AI_Q_AVX2

#define FAST_ALIGN(b) (((b) + 63) & ~(size_t)63)

/* The kernels' operands: w' (m, k) int8, the biases, the requantizations. */
typedef struct {
    int8_t *w;
    int32_t *bias;
    aik_rq *rq;
} fast_rows;

static size_t fast_rows_bytes(int64_t m, int64_t k)
{
    return FAST_ALIGN((size_t)(m * k)) + FAST_ALIGN(sizeof(int32_t) * (size_t)m) +
           FAST_ALIGN(sizeof(aik_rq) * (size_t)m);
}

static fast_rows fast_rows_at(void *mem, int64_t m, int64_t k)
{
    char *b = mem;
    fast_rows f = {(int8_t *)b, (int32_t *)(b + FAST_ALIGN((size_t)(m * k))), NULL};
    f.rq = (aik_rq *)((char *)f.bias + FAST_ALIGN(sizeof(int32_t) * (size_t)m));
    return f;
}

/* mult = M / 2^e with M an int32 > 0 and 0 <= e <= 43 (module comment). */
static bool split_multiplier(double mult, int32_t *M, int32_t *e)
{
    if (!(mult > 0) || !isfinite(mult))
        return false;
    int ex;
    int64_t m = (int64_t)ldexp(frexp(mult, &ex), 53); /* mult = m / 2^(53 - ex), exactly */
    int64_t s = 53 - (int64_t)ex;
    while (!(m & 1) && s > 0)
        m >>= 1, s--;
    if (m > INT32_MAX || s < 0 || s > 43)
        return false;
    *M = (int32_t)m, *e = (int32_t)s;
    return true;
}

/* The 8-bit x enters as int8: x8 = x (int8) or x ^ 0x80 (uint8). */
static int64_t to_x8(const ai_tensor *t, int64_t v) { return t->dtype == AI_U8 ? v - 128 : v; }

/* A QLinear operator's view for the kernels: w' row r, column j at
 * w[r sr + j sk] (less wzp[r] or wzp), the bias of row r at bias[r] (or
 * bias[0], one value; NULL: none), the multipliers mult[r]. */
typedef struct {
    const ai_tensor *x, *xzp, *w, *wzp, *bias;
    ai_tensor *y;
    const ai_tensor *yzp;
    int64_t m, k, sr, sk;
    const double *mult;
} fast_view;

/* Fills f (fast_rows_at) from v; false where the kernels are not exact. */
static bool fast_prepare(const fast_view *v, fast_rows *f)
{
    const int64_t z8 = to_x8(v->x, q_get(v->xzp, 0));
    const int64_t xmax = 127 - z8 > z8 + 128 ? 127 - z8 : z8 + 128; /* max |x8 - z8| */
    const bool w_per = v->wzp && ai_tensor_numel(v->wzp) > 1;
    const bool b_per = v->bias && ai_tensor_numel(v->bias) > 1;
    const int64_t yzp8 = v->y->dtype == AI_U8 ? q_get(v->yzp, 0) - 128 : q_get(v->yzp, 0);
    for (int64_t r = 0; r < v->m; r++) {
        const int64_t z = q_get(v->wzp, w_per ? r : 0);
        int64_t sum = 0, l1 = 0;
        for (int64_t j = 0; j < v->k; j++) {
            const int64_t wv = q_get(v->w, r * v->sr + j * v->sk) - z;
            if (wv < INT8_MIN || wv > INT8_MAX)
                return false;
            f->w[r * v->k + j] = (int8_t)wv;
            sum += wv, l1 += wv < 0 ? -wv : wv;
        }
        const int64_t b = v->bias ? q_get(v->bias, b_per ? r : 0) : 0;
        double bound = (double)(b < 0 ? -b : b) + (double)xmax * (double)l1;
        bound = bound < 2147483648.0 ? bound : 2147483648.0;
        int32_t M, e;
        if (!split_multiplier(v->mult[r], &M, &e) || bound * (double)M >= 9007199254740992.0)
            return false;
        f->bias[r] = (int32_t)(uint32_t)(uint64_t)(b - z8 * sum); /* wrapping, as the sums */
        f->rq[r] = (aik_rq){M, (int16_t)e, INT8_MIN, INT8_MAX, (int16_t)yzp8, 1};
    }
    return true;
}

/* The multipliers of `requantize` (the scales' type), m of them, into out. */
static void fast_multipliers(const ai_ctx *c, rq_slots s, int64_t m, double *out)
{
    const ai_tensor *xs = c->in[s.xs], *ws = c->in[s.ws], *ys = c->in[s.ys];
    const ai_dtype prec = promote(promote(xs->dtype, ws->dtype), ys->dtype);
    const bool per = ai_tensor_numel(ws) > 1;
    for (int64_t k = 0; k < m; k++)
        out[k] = round_to(prec, round_to(prec, f_get(xs, 0) * f_get(ws, per ? k : 0)) /
                                    f_get(ys, 0));
}

/* The node state of the fast path: a header (FAST_* below), the operands
 * (fast_rows), the multipliers of this forward and those the operands were
 * made with, the kernels' weight pack. Operands made from constant
 * integers (weights, biases, zero points) are kept while the multipliers
 * stay the same (the float scales are parameters of the graph, which a
 * forward may change); a node they do not fit is marked until then. */
enum { FAST_UNKNOWN, FAST_KEPT, FAST_REFUSED };
#define FAST_HEAD 64

static size_t fast_state_bytes(int64_t m, int64_t k, size_t kernel_state)
{
    return FAST_HEAD + fast_rows_bytes(m, k) + 2 * sizeof(double) * (size_t)m + kernel_state;
}

/* Where this forward's m multipliers go in the state (fast_view.mult). */
static double *fast_mult_area(const ai_ctx *c, int64_t m, int64_t k)
{
    return (double *)((char *)c->state + FAST_HEAD + fast_rows_bytes(m, k));
}

/* The operands in the state, made now or kept; false: the float path.
 * `consts`: whether the integers they come from are constants of the plan. */
static bool fast_operands(const ai_ctx *c, const fast_view *v, bool consts, fast_rows *f,
                          void **kernel_state)
{
    int64_t *head = c->state;
    char *mem = (char *)c->state + FAST_HEAD;
    const size_t mb = sizeof(double) * (size_t)v->m;
    double *kept = (double *)(mem + fast_rows_bytes(v->m, v->k)) + v->m;
    *f = fast_rows_at(mem, v->m, v->k);
    *kernel_state = (char *)kept + mb;
    if (consts && *head != FAST_UNKNOWN && !memcmp(kept, v->mult, mb))
        return *head == FAST_KEPT;
    const bool ok = fast_prepare(v, f);
    if (consts) {
        *head = ok ? FAST_KEPT : FAST_REFUSED;
        memcpy(kept, v->mult, mb);
    }
    return ok;
}

/* u8 output: the int8 y - 128 the kernels wrote, as uint8 */
static void fast_flip(ai_tensor *y)
{
    if (y->dtype != AI_U8)
        return;
    uint8_t *u = y->data;
    for (int64_t i = 0, n = ai_tensor_numel(y); i < n; i++)
        u[i] ^= 0x80;
}

/* x as int8 (x8) at dst: a copy ^ 0x80 of a uint8 x */
static const int8_t *fast_x8(const ai_tensor *x, int8_t *dst)
{
    if (x->dtype == AI_I8)
        return x->data;
    const uint8_t *u = x->data;
    for (int64_t i = 0, n = ai_tensor_numel(x); i < n; i++)
        dst[i] = (int8_t)(u[i] ^ 0x80);
    return dst;
}

/* whether the node's inputs of the n slots are constants of the plan (or absent) */
static bool consts_in(const ai_ctx *c, const int *slots, int n)
{
    for (int i = 0; i < n; i++)
        if (slots[i] < c->n_in && c->in[slots[i]] && !ai_ctx_const(c, slots[i]))
            return false;
    return true;
}

/* A matrix product y (n, m) = x8 (n, k) w'^T on ai_qfc; false: not taken. */
static bool fast_fc(ai_ctx *c, const fast_view *v, int64_t n, bool consts, void *ws)
{
    if (ai_q_path() < FAST_PATH || v->m > INT32_MAX || v->k > INT32_MAX ||
        (v->y->dtype != AI_I8 && v->y->dtype != AI_U8))
        return false;
    fast_rows f;
    void *kstate;
    if (!fast_operands(c, v, consts, &f, &kstate))
        return false;
    int8_t *copy = ws;
    const int8_t *x8 = fast_x8(v->x, copy);
    size_t kws, kst;
    ai_qfc_sizes(n, (int32_t)v->k, (int32_t)v->m, &kws, &kst);
    ai_qfc(n, (int32_t)v->k, (int32_t)v->m, x8, f.w, f.bias, f.rq, v->y->data, kstate, consts,
           (char *)ws + FAST_ALIGN((size_t)ai_tensor_numel(v->x)));
    fast_flip(v->y);
    return true;
}

static size_t fast_fc_ws(int64_t n, int64_t k, int64_t m, size_t *state)
{
    size_t kws = 0, kst = 0;
    if (k <= INT32_MAX && m <= INT32_MAX)
        ai_qfc_sizes(n, (int32_t)k, (int32_t)m, &kws, &kst);
    *state = fast_state_bytes(m, k, kst);
    return FAST_ALIGN((size_t)(n * k)) + kws;
}

/* Matrix `i` of t's batch as a (rows, cols) tensor (a view of its data). */
static ai_tensor mm_slice(const ai_tensor *t, int64_t i, int64_t rows, int64_t cols)
{
    ai_tensor s = *t;
    s.ndim = 2;
    s.shape[0] = rows, s.shape[1] = cols;
    s.data = (char *)t->data + (size_t)(i * rows * cols) * ai_dtype_size(t->dtype);
    return s;
}

/* QLinearMatMul: by a B without batch (a constant weight), a's rows
 * (n = numel / K) times B's columns; with batches of B (a product of two
 * activations, attention's), each output matrix on its own, B packed at
 * run time (on VNNI that is still faster than the float path: the
 * benchmark of docs/quantization.md). */
static bool fast_matmul(ai_ctx *c, const ai_mm_dims *d)
{
    const ai_tensor *a = c->in[0], *b = c->in[3];
    if (ai_q_path() < FAST_PATH || !d->M || !d->K)
        return false;
    double *mult = fast_mult_area(c, d->N, d->K);
    fast_multipliers(c, QLINEAR_RQ, d->N, mult);
    if (d->b_shared) {
        const fast_view v = {a, in_or_null(c, 2), b, in_or_null(c, 5), NULL, c->out[0],
                             in_or_null(c, 7), d->N, d->K, 1, d->N, mult};
        static const int ints[] = {2, 3, 5, 7}; /* the zero points, B */
        return fast_fc(c, &v, ai_tensor_numel(a) / d->K, consts_in(c, ints, 4), c->workspace);
    }
    for (int64_t i = 0; i < d->count; i++) {
        int64_t ia, ib;
        ai_matmul_batch(d, i, &ia, &ib);
        const ai_tensor as = mm_slice(a, ia, d->M, d->K), bs = mm_slice(b, ib, d->K, d->N);
        ai_tensor ys = mm_slice(c->out[0], i, d->M, d->N);
        const fast_view v = {&as, in_or_null(c, 2), &bs, in_or_null(c, 5), NULL, &ys,
                             in_or_null(c, 7), d->N, d->K, 1, d->N, mult};
        if (!fast_fc(c, &v, d->M, false, c->workspace))
            return false; /* (the float path then writes every matrix) */
    }
    return true;
}

/* The rows of A the int8 kernels take at once: all of them by a B without
 * batch, else one matrix's. */
static int64_t fast_mm_rows(const ai_tensor *a, const ai_mm_dims *d)
{
    return !d->K ? 0 : d->b_shared ? ai_tensor_numel(a) / d->K : d->M;
}

/* ---------------------------------------------------------------- MatMulInteger on the int8 kernels */

/* MatMulInteger on the int8 kernels' int32 store (ai_qfc_i32): exact
 * integers, wrapping as the reference's int32, for every operand type:
 *   - B's column r enters as int8 w'[r] = B[:, r] - o_r, the offset o_r its
 *     zero point where every value then fits int8, else 128 for uint8 B
 *     (B - 128 always fits) or 0 for int8 B; d_r = o_r - bzp_r.
 *   - A enters as x8 (a, or a - 128 for uint8) and the kernels' store adds
 *     u_i W_r, u_i = -(azp_i as x8), W_r = sum_k w'[r][k]: then
 *     sum_k x8 w' - z8_i W_r = sum_k (a - azp_i) w'[r].
 *   - a d_r != 0 (an offset that is not the zero point) adds
 *     d_r (sum_k a_ik - K azp_i) after (a pass over y).
 * ONNX Runtime's dynamic quantization (uint8 A, int8 B with zero point 0,
 * or per-channel) needs no pass after. Taken from INT_PATH on: on VNNI, and
 * on AVX2, where the int8 kernels beat the float path for an int32 result
 * (no requantization to make them slower; docs/quantization.md); on plain
 * C and ai_q_set_path below, the float path. */
#define INT_PATH AI_Q_AVX2

/* The state: a header (made: 1), w' (N, K), W, d, the kernels' pack. */
typedef struct {
    int8_t *w;
    int32_t *sum, *d;
    void *kernel;
} int_rows;

static int_rows int_rows_at(void *state, int64_t n, int64_t k)
{
    char *b = (char *)state + FAST_HEAD;
    int_rows r = {(int8_t *)b, NULL, NULL, NULL};
    r.sum = (int32_t *)(b + FAST_ALIGN((size_t)(n * k)));
    r.d = (int32_t *)((char *)r.sum + FAST_ALIGN(sizeof(int32_t) * (size_t)n));
    r.kernel = (char *)r.d + FAST_ALIGN(sizeof(int32_t) * (size_t)n);
    return r;
}

/* w', W and d (above) of matrix b (K, N); true where some d_r != 0. */
static bool int_weights(const ai_tensor *b, const ai_tensor *bzp, int64_t K, int64_t N,
                        const int_rows *f)
{
    const bool per = bzp && ai_tensor_numel(bzp) > 1;
    bool any_d = false;
    for (int64_t r = 0; r < N; r++) {
        const int64_t z = q_get(bzp, per ? r : 0);
        int64_t off = z;
        for (int64_t k = 0; k < K && off == z; k++) {
            const int64_t v = q_get(b, k * N + r) - z;
            if (v < INT8_MIN || v > INT8_MAX)
                off = b->dtype == AI_U8 ? 128 : 0;
        }
        uint32_t sum = 0;
        for (int64_t k = 0; k < K; k++) {
            const int8_t v = (int8_t)(q_get(b, k * N + r) - off);
            f->w[r * K + k] = v;
            sum += (uint32_t)(int32_t)v;
        }
        f->sum[r] = (int32_t)sum;
        f->d[r] = (int32_t)(off - z);
        any_d |= off != z;
    }
    return any_d;
}

static size_t int_state_bytes(int64_t n, int64_t k)
{
    size_t kws = 0, kst = 0;
    if (k <= INT32_MAX && n <= INT32_MAX)
        ai_qfc_sizes(1, (int32_t)k, (int32_t)n, &kws, &kst);
    return FAST_HEAD + FAST_ALIGN((size_t)(n * k)) + 2 * FAST_ALIGN(sizeof(int32_t) * (size_t)n) +
           kst;
}

/* The workspace: A as x8, u, then the kernels'. */
static size_t int_ws_bytes(const ai_tensor *a, const ai_mm_dims *d)
{
    const int64_t rows = d->K ? ai_tensor_numel(a) / d->K : 0, n = fast_mm_rows(a, d);
    size_t kws = 0, kst = 0;
    if (d->K <= INT32_MAX && d->N <= INT32_MAX)
        ai_qfc_sizes(n, (int32_t)d->K, (int32_t)d->N, &kws, &kst);
    return FAST_ALIGN((size_t)ai_tensor_numel(a)) + FAST_ALIGN(sizeof(int32_t) * (size_t)rows) +
           kws;
}

static bool fast_matmul_integer(ai_ctx *c, const ai_mm_dims *d)
{
    const ai_tensor *a = c->in[0], *b = c->in[1], *azp = in_or_null(c, 2);
    const ai_tensor *bzp = in_or_null(c, 3);
    const int64_t M = d->M, N = d->N, K = d->K;
    if (ai_q_path() < INT_PATH || !M || !N || !K || K > INT32_MAX || N > INT32_MAX)
        return false;
    static const int ints[] = {1, 3}; /* B, its zero point */
    const bool consts = d->b_shared && consts_in(c, ints, 2);
    int64_t *made = c->state;
    const int_rows f = int_rows_at(c->state, N, K);
    bool any_d = consts && *made ? *made == 2 : false;
    if (d->b_shared && !(consts && *made)) {
        any_d = int_weights(b, bzp, K, N, &f);
        *made = consts ? 1 + any_d : 0;
    }
    /* x8, and u_i = -z8_i (NULL: all 0) */
    const int64_t rows = ai_tensor_numel(a) / K;
    char *ws = c->workspace;
    const int8_t *x8 = fast_x8(a, (int8_t *)ws);
    ws += FAST_ALIGN((size_t)ai_tensor_numel(a));
    int32_t *u = (int32_t *)ws;
    ws += FAST_ALIGN(sizeof(int32_t) * (size_t)rows);
    const bool a_per = azp && ai_tensor_numel(azp) > 1;
    bool any_u = false;
    for (int64_t i = 0; i < rows; i++) {
        u[i] = (int32_t)-to_x8(a, q_get(azp, a_per ? i % M : 0));
        any_u |= u[i] != 0;
    }
    int32_t *y = c->out[0]->data;
    if (d->b_shared) {
        ai_qfc_i32(rows, (int32_t)K, (int32_t)N, x8, f.w, NULL, any_u ? u : NULL, f.sum, y,
                   f.kernel, consts, ws);
    } else {
        for (int64_t i = 0; i < d->count; i++) {
            int64_t ia, ib;
            ai_matmul_batch(d, i, &ia, &ib);
            const ai_tensor bs = mm_slice(b, ib, K, N);
            any_d = int_weights(&bs, bzp, K, N, &f);
            ai_qfc_i32(M, (int32_t)K, (int32_t)N, x8 + ia * M * K, f.w, NULL,
                       any_u ? u : NULL, f.sum, y + i * M * N, f.kernel, false, ws);
            if (any_d) /* d_r (sum_k a_ik - K azp_i), rows of matrix ia */
                for (int64_t r = 0; r < M; r++) {
                    uint32_t t = 0;
                    for (int64_t k = 0; k < K; k++)
                        t += (uint32_t)q_get(a, (ia * M + r) * K + k);
                    t -= (uint32_t)K * (uint32_t)q_get(azp, a_per ? r : 0);
                    int32_t *yr = y + (i * M + r) * N;
                    for (int64_t j = 0; j < N; j++)
                        yr[j] = (int32_t)((uint32_t)yr[j] + t * (uint32_t)f.d[j]);
                }
        }
        return true;
    }
    if (any_d)
        for (int64_t r = 0; r < rows; r++) {
            uint32_t t = 0;
            for (int64_t k = 0; k < K; k++)
                t += (uint32_t)q_get(a, r * K + k);
            t -= (uint32_t)K * (uint32_t)q_get(azp, a_per ? r % M : 0);
            for (int64_t j = 0; j < N; j++)
                y[r * N + j] = (int32_t)((uint32_t)y[r * N + j] + t * (uint32_t)f.d[j]);
        }
    return true;
}

/* The 2-D window of a Conv of 1 or 2 spatial dims; false: past int32. */
static bool fast_window(const ai_conv_params *p, aik_window *w)
{
    if (p->nsp > 2)
        return false;
    const int o = p->nsp - 1; /* the last spatial dim: the window's columns */
    const int64_t v[] = {p->N, p->C, p->nsp == 2 ? p->in[0] : 1, p->in[o], p->M,
                         p->nsp == 2 ? p->out[0] : 1, p->out[o],
                         p->nsp == 2 ? p->kernel[0] : 1, p->kernel[o],
                         p->nsp == 2 ? p->stride[0] : 1, p->stride[o],
                         p->nsp == 2 ? p->dilation[0] : 1, p->dilation[o],
                         p->nsp == 2 ? p->pad_begin[0] : 0, p->pad_begin[o], p->group,
                         (p->nsp == 2 ? p->in[0] + p->pad_begin[0] + p->pad_end[0] : 1) *
                             (p->in[o] + p->pad_begin[o] + p->pad_end[o]) * p->N * p->C};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] < 0 || v[i] > INT32_MAX)
            return false;
    *w = (aik_window){(int32_t)v[0], (int32_t)v[1], (int32_t)v[2], (int32_t)v[3],
                      (int32_t)v[4], (int32_t)v[5], (int32_t)v[6], (int32_t)v[7],
                      (int32_t)v[8], (int32_t)v[9], (int32_t)v[10], (int32_t)v[11],
                      (int32_t)v[12], (int32_t)v[13], (int32_t)v[14], (int32_t)v[15], 0};
    return true;
}

/* The window over x padded explicitly (its planes hp x wp, no padding left). */
static aik_window fast_padded(const ai_conv_params *p, const aik_window *w)
{
    aik_window q = *w;
    q.h = w->h + (p->nsp == 2 ? (int32_t)(p->pad_begin[0] + p->pad_end[0]) : 0);
    q.w = w->w + (int32_t)(p->pad_begin[p->nsp - 1] + p->pad_end[p->nsp - 1]);
    q.pt = q.pl = 0;
    return q;
}

/* The workspace (and *state) of QLinearConv's fast path, either window. */
static size_t fast_conv_ws(const ai_conv_params *p, size_t *state)
{
    aik_window w;
    *state = 0;
    if (!fast_window(p, &w))
        return 0;
    const aik_window q = fast_padded(p, &w);
    size_t ws0, st0, ws1, st1;
    ai_qconv_sizes(&w, &ws0, &st0);
    ai_qconv_sizes(&q, &ws1, &st1);
    *state = fast_state_bytes(p->M, p->C / p->group * w.kh * w.kw, st0 > st1 ? st0 : st1);
    return FAST_ALIGN((size_t)q.n * q.c * q.h * q.w) + (ws0 > ws1 ? ws0 : ws1);
}

/* x as the kernels' x8 with zero point z8: x itself (int8, z8 = 0), else
 * a copy (^ 0x80 for uint8) in planes padded with z8 (*win then the padded
 * window) at *ws, which moves past it. */
static const int8_t *fast_conv_x8(const ai_conv_params *p, const ai_tensor *x, int8_t z8,
                                  aik_window *win, char **ws)
{
    if (x->dtype == AI_I8 && z8 == 0)
        return x->data;
    const aik_window q = fast_padded(p, win);
    int8_t *d = (int8_t *)*ws;
    const int8_t flip = x->dtype == AI_U8 ? (int8_t)0x80 : 0;
    memset(d, z8, (size_t)q.n * q.c * q.h * q.w);
    for (int64_t plane = 0; plane < (int64_t)q.n * q.c; plane++)
        for (int32_t r = 0; r < win->h; r++) {
            const int8_t *src = (const int8_t *)x->data + (plane * win->h + r) * win->w;
            int8_t *dst = d + (plane * q.h + r + win->pt) * q.w + win->pl;
            for (int32_t t = 0; t < win->w; t++)
                dst[t] = (int8_t)(src[t] ^ flip);
        }
    *win = q;
    *ws += FAST_ALIGN((size_t)q.n * q.c * q.h * q.w);
    return d;
}

static bool fast_conv(ai_ctx *c, const ai_conv_params *p)
{
    const ai_tensor *x = c->in[0], *xzp = in_or_null(c, 2);
    aik_window win;
    if (ai_q_path() < FAST_PATH || !fast_window(p, &win))
        return false;
    const int64_t k = (int64_t)(win.c / win.group) * win.kh * win.kw;
    double *mult = fast_mult_area(c, p->M, k);
    fast_multipliers(c, QLINEAR_RQ, p->M, mult);
    const fast_view v = {x, xzp, c->in[3], in_or_null(c, 5), in_or_null(c, 8), c->out[0],
                         in_or_null(c, 7), p->M, k, k, 1, mult};
    static const int ints[] = {2, 3, 5, 7, 8}; /* the zero points, w, B */
    const bool consts = consts_in(c, ints, 5);
    fast_rows f;
    void *kstate;
    if (!fast_operands(c, &v, consts, &f, &kstate))
        return false;
    char *ws = c->workspace;
    const int8_t *x8 = fast_conv_x8(p, x, (int8_t)to_x8(x, q_get(xzp, 0)), &win, &ws);
    ai_qconv(&win, x8, f.w, f.bias, f.rq, c->out[0]->data, kstate, consts, ws);
    fast_flip(c->out[0]);
    return true;
}

/* ConvInteger on the int8 kernels' int32 store (ai_qconv_i32), on the
 * VNNI and AVX2 paths (FAST_PATH, as QLinearConv: a 3x3 convolution of 32
 * -> 64 channels on 32x32 uint8, batch 8, 1 thread, takes 0.26x the float
 * path's time on VNNI, 0.64x on AVX2; a 1x1 one of 64 -> 64 on 16x16 0.3x
 * and 0.5x), where w - w_zp fits int8 (ONNX Runtime's int8 weights with
 * zero point 0 do; else the float path): x as x8 in planes padded with its
 * zero point z8 (fast_conv_x8), the bias -z8 sum w' per output channel, so
 * acc = sum (x8 - z8) w' = sum (x - x_zp)(w - w_zp), wrapping as the
 * reference's int32. The state: a header (FAST_*), w' (M, k), the biases,
 * the kernels' pack; kept while w and both zero points are constants. */
static bool fast_conv_integer(ai_ctx *c, const ai_conv_params *p)
{
    const ai_tensor *x = c->in[0], *w = c->in[1], *xzp = in_or_null(c, 2);
    const ai_tensor *wzp = in_or_null(c, 3);
    aik_window win;
    if (ai_q_path() < FAST_PATH || !fast_window(p, &win))
        return false;
    const int64_t M = p->M, k = (int64_t)(win.c / win.group) * win.kh * win.kw;
    static const int ints[] = {1, 2, 3}; /* w, the zero points */
    const bool consts = consts_in(c, ints, 3);
    int64_t *head = c->state;
    int8_t *wq = (int8_t *)((char *)c->state + FAST_HEAD);
    int32_t *bias = (int32_t *)((char *)wq + FAST_ALIGN((size_t)(M * k)));
    void *kstate = (char *)bias + FAST_ALIGN(sizeof(int32_t) * (size_t)M);
    const int8_t z8 = (int8_t)to_x8(x, q_get(xzp, 0));
    if (!consts || *head == FAST_UNKNOWN) {
        const bool per = wzp && ai_tensor_numel(wzp) > 1;
        bool ok = true;
        for (int64_t r = 0; r < M && ok; r++) {
            const int64_t z = q_get(wzp, per ? r : 0);
            uint32_t sum = 0;
            for (int64_t j = 0; j < k && ok; j++) {
                const int64_t v = q_get(w, r * k + j) - z;
                ok = v >= INT8_MIN && v <= INT8_MAX;
                wq[r * k + j] = (int8_t)v;
                sum += (uint32_t)(int32_t)v;
            }
            bias[r] = (int32_t)(0u - (uint32_t)(int32_t)z8 * sum);
        }
        if (consts)
            *head = ok ? FAST_KEPT : FAST_REFUSED;
        if (!ok)
            return false;
    } else if (*head == FAST_REFUSED) {
        return false;
    }
    char *ws = c->workspace;
    const int8_t *x8 = fast_conv_x8(p, x, z8, &win, &ws);
    ai_qconv_i32(&win, x8, wq, bias, c->out[0]->data, kstate, consts, ws);
    return true;
}

static ai_status matmul_integer_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    ai_mm_dims d;
    ai_status st = mm_check(c, MATMUL_INTEGER, &d, ws);
    if (st)
        return st;
    mm_meta(c, MATMUL_INTEGER, &d, AI_I32, out);
    const size_t fast = int_ws_bytes(c->in[0], &d); /* the int8 kernels' */
    *ws = fast > *ws ? fast : *ws;
    *state = int_state_bytes(d.N, d.K);
    return AI_OK;
}

static ai_status matmul_integer_forward(ai_ctx *c)
{
    ai_mm_dims d;
    size_t ws;
    ai_status st = mm_check(c, MATMUL_INTEGER, &d, &ws);
    if (st)
        return st;
    if (fast_matmul_integer(c, &d))
        return AI_OK;
    const int32_t *acc = mm_accumulate(c, MATMUL_INTEGER, &d);
    if (ai_tensor_numel(c->out[0])) /* (an empty product: no data to copy) */
        memcpy(c->out[0]->data, acc, sizeof(int32_t) * (size_t)ai_tensor_numel(c->out[0]));
    return AI_OK;
}

static ai_status qlinear_matmul_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    ai_mm_dims d;
    ai_dtype dt;
    ai_status st;
    if ((st = mm_check(c, QLINEAR_MATMUL, &d, ws)) ||
        (st = rq_check(c, QLINEAR_RQ, d.N, "column of B", &dt)))
        return st;
    if (c->in[2] && ai_tensor_numel(c->in[2]) > 1)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "a per-row zero point of A is "
                             "not supported (its scale is per tensor)");
    mm_meta(c, QLINEAR_MATMUL, &d, dt, out);
    /* the int8 kernels' (fast_matmul) */
    const size_t fast = fast_fc_ws(fast_mm_rows(c->in[0], &d), d.K, d.N, state);
    *ws = fast > *ws ? fast : *ws;
    return AI_OK;
}

static ai_status qlinear_matmul_forward(ai_ctx *c)
{
    ai_mm_dims d;
    size_t ws;
    ai_status st = mm_check(c, QLINEAR_MATMUL, &d, &ws);
    if (st)
        return st;
    if (fast_matmul(c, &d))
        return AI_OK;
    const int32_t *acc = mm_accumulate(c, QLINEAR_MATMUL, &d);
    requantize(c, QLINEAR_RQ, acc, d.count * d.M, d.N, 1);
    return AI_OK;
}

/* ---------------------------------------------------------------- integer convolutions */

/* ConvInteger (x, w, x_zp, w_zp) and QLinearConv (x, xs, xzp, w, ws, wzp,
 * ys, yzp, B): the slots of x, w, their zero points and the bias. */
typedef struct {
    int x, x_zp, w, w_zp, b;
} conv_slots;

static const conv_slots CONV_INTEGER = {0, 2, 1, 3, -1}, QLINEAR_CONV = {0, 2, 3, 5, 8};

/* The convolution runs in float64 (or float32, where exact_in_f32) on the
 * inputs less their zero points, with the float kernels (kernels/conv.h,
 * whichever algorithm they pick): every product and partial sum is an
 * exact integer, so the sums are exact in any order; the int32 bias is
 * added after, wrapping as ONNX's int32 does. The workspace: the kernels'
 * scratch (aligned, for either type), x, w and y in float64, then the
 * int32 accumulator. */
static size_t conv_scratch(const ai_conv_params *p)
{
    const size_t f32 = ai_conv_workspace_bytes(p, AI_F32);
    const size_t f64 = ai_conv_workspace_bytes(p, AI_F64);
    return ((f32 > f64 ? f32 : f64) + AI_ALIGN - 1) / AI_ALIGN * AI_ALIGN;
}

static ai_status conv_check(const ai_ctx *c, conv_slots s, ai_conv_params *p, size_t *ws)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[s.x], *w = c->in[s.w];
    const ai_tensor *b = s.b >= 0 ? in_or_null(c, s.b) : NULL;
    ai_status st;
    if ((st = need_8bit(n, "the input", x)) || (st = need_8bit(n, "the weight", w)))
        return st;
    if (b && b->dtype != AI_I32)
        return ai_node_error(n, AI_ERR_TYPE, "the bias is %s; int32 expected",
                             ai_dtype_name(b->dtype));
    if ((st = ai_conv_geometry(n, x, w, b, p)) ||
        (st = check_zero_point(n, "the input's zero point", in_or_null(c, s.x_zp), x->dtype,
                               1, NULL)) ||
        (st = check_zero_point(n, "the weight's zero point", in_or_null(c, s.w_zp), w->dtype,
                               p->M, "output channel")))
        return st;
    int64_t ysize = p->N * p->M;
    for (int d = 0; d < p->nsp; d++)
        ysize *= p->out[d];
    *ws = conv_scratch(p) + sizeof(double) * (size_t)(ai_tensor_numel(x) +
                                                      ai_tensor_numel(w) + ysize) +
          sizeof(int32_t) * (size_t)ysize;
    return AI_OK;
}

static void conv_meta(const ai_conv_params *p, ai_dtype dt, ai_meta *out)
{
    out->dtype = dt;
    out->ndim = p->nsp + 2;
    out->shape[0] = p->N;
    out->shape[1] = p->M;
    memcpy(out->shape + 2, p->out, sizeof(int64_t) * (size_t)p->nsp);
}

/* The int32 convolution into the workspace (returned). */
static int32_t *conv_accumulate(const ai_ctx *c, conv_slots s, const ai_conv_params *p)
{
    const ai_tensor *x = c->in[s.x], *w = c->in[s.w], *y = c->out[0];
    const ai_tensor *b = s.b >= 0 ? in_or_null(c, s.b) : NULL;
    const ai_tensor *xzp = in_or_null(c, s.x_zp), *wzp = in_or_null(c, s.w_zp);
    const int64_t nx = ai_tensor_numel(x), nw = ai_tensor_numel(w), ny = ai_tensor_numel(y);
    const int64_t taps = p->M ? nw / p->M : 0;
    const int64_t plane = p->N > 0 && p->M > 0 ? ny / (p->N * p->M) : 0;
    double *X = (double *)((char *)c->workspace + conv_scratch(p)), *W = X + nx, *Yd = W + nw;
    int32_t *Y = (int32_t *)(Yd + ny);
    minus_zero_point(X, x, xzp, 1, 1, nx);
    minus_zero_point(W, w, wzp, 1, p->M, taps);
    const bool f32 = exact_in_f32(X, nx, W, p->M, taps);
    const float *Yf = (const float *)Yd;
    if (f32)
        ai_conv_forward_f32(p, (float *)Yd, to_f32(X, nx), to_f32(W, nw), NULL, c->workspace,
                            NULL);
    else
        ai_conv_forward_f64(p, Yd, X, W, NULL, c->workspace, NULL);
    for (int64_t i = 0, e = 0; i < p->N * p->M; i++) { /* planes (n, m) */
        const int64_t bias = b ? q_get(b, i % p->M) : 0;
        for (int64_t k = 0; k < plane; k++, e++)
            Y[e] = (int32_t)(uint32_t)((f32 ? (int64_t)Yf[e] : (int64_t)Yd[e]) + bias);
    }
    return Y;
}

static ai_status conv_integer_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    ai_conv_params p;
    ai_status st = conv_check(c, CONV_INTEGER, &p, ws);
    if (st)
        return st;
    conv_meta(&p, AI_I32, out);
    const size_t fast = fast_conv_ws(&p, state); /* the int8 kernels' (fast_conv_integer) */
    *ws = fast > *ws ? fast : *ws;
    return AI_OK;
}

static ai_status conv_integer_forward(ai_ctx *c)
{
    ai_conv_params p;
    size_t ws;
    ai_status st = conv_check(c, CONV_INTEGER, &p, &ws);
    if (st)
        return st;
    if (fast_conv_integer(c, &p))
        return AI_OK;
    const int32_t *acc = conv_accumulate(c, CONV_INTEGER, &p);
    memcpy(c->out[0]->data, acc, sizeof(int32_t) * (size_t)ai_tensor_numel(c->out[0]));
    return AI_OK;
}

static ai_status qlinear_conv_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    ai_conv_params p;
    ai_dtype dt;
    ai_status st;
    if ((st = conv_check(c, QLINEAR_CONV, &p, ws)) ||
        (st = rq_check(c, QLINEAR_RQ, p.M, "output channel", &dt)))
        return st;
    conv_meta(&p, dt, out);
    const size_t fast = fast_conv_ws(&p, state); /* the int8 kernels' (fast_conv) */
    *ws = fast > *ws ? fast : *ws;
    return AI_OK;
}

static ai_status qlinear_conv_forward(ai_ctx *c)
{
    ai_conv_params p;
    size_t ws;
    ai_status st = conv_check(c, QLINEAR_CONV, &p, &ws);
    if (st)
        return st;
    if (fast_conv(c, &p))
        return AI_OK;
    const int32_t *acc = conv_accumulate(c, QLINEAR_CONV, &p);
    const int64_t planes = p.N * p.M;
    requantize(c, QLINEAR_RQ, acc, p.N, p.M, planes ? ai_tensor_numel(c->out[0]) / planes : 0);
    return AI_OK;
}

/* ---------------------------------------------------------------- QGemm (com.microsoft) */

/* ONNX Runtime's QGemm, which its quantizer writes for Gemm (QOperator
 * format): A (M, K) or transA, B (K, N) or transB, int8/uint8;
 *   acc = (A - a_zp) (B - b_zp) + C        int32; C broadcast to (M, N)
 *   y   = saturate(rint(acc * m_j + y_zp))  with y_scale and y_zp, else
 *   y   = acc * m_j                         float32
 * m_j = alpha a_scale b_scale[j] (/ y_scale) in float32, as ONNX Runtime;
 * b_scale, b_zp per tensor or per column. There is no ONNX definition: the
 * float output is ONNX Runtime's float32 product; the quantized one rounds
 * the exact acc m_j + y_zp, as QLinearMatMul (and so the int8 kernels,
 * fast_gemm), where ONNX Runtime rounds its float32 product, then adds
 * y_zp: the two differ by one where that product rounds across (or onto)
 * a tie, and on ties with an odd y_zp. */

typedef struct {
    double alpha;
    int64_t trans_a, trans_b;
} qgemm_attrs;

static ai_status qgemm_init(ai_node *n)
{
    qgemm_attrs *a = calloc(1, sizeof *a);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    ai_status st;
    if ((st = ai_attr_float(n, "alpha", 1.0, &a->alpha)) ||
        (st = ai_attr_int(n, "transA", 0, &a->trans_a)) ||
        (st = ai_attr_int(n, "transB", 0, &a->trans_b)))
        return st;
    return AI_OK;
}

static ai_status qgemm_check(const ai_ctx *c, int64_t *M, int64_t *N, int64_t *K, size_t *ws)
{
    const ai_node *n = c->node;
    const qgemm_attrs *at = n->params;
    const ai_tensor *a = c->in[0], *b = c->in[3], *bias = in_or_null(c, 6);
    const ai_tensor *ys = in_or_null(c, 7), *yzp = in_or_null(c, 8);
    ai_status st;
    if ((st = need_8bit(n, "A", a)) || (st = need_8bit(n, "B", b)))
        return st;
    if (a->ndim != 2 || b->ndim != 2)
        return ai_node_error(n, AI_ERR_VALUE, "A and B must be matrices (ranks %d and %d)",
                             a->ndim, b->ndim);
    *M = a->shape[at->trans_a ? 1 : 0], *K = a->shape[at->trans_a ? 0 : 1];
    *N = b->shape[at->trans_b ? 0 : 1];
    const int64_t kb = b->shape[at->trans_b ? 1 : 0];
    if (kb != *K)
        return ai_node_error(n, AI_ERR_VALUE, "inner dimensions differ: A has %lld columns, B "
                             "has %lld rows", (long long)*K, (long long)kb);
    if ((st = check_scale(n, "A's scale", c->in[1], 1, NULL)) ||
        (st = check_zero_point(n, "A's zero point", c->in[2], a->dtype, 1, NULL)) ||
        (st = check_scale(n, "B's scale", c->in[4], *N, "column of B")) ||
        (st = check_zero_point(n, "B's zero point", c->in[5], b->dtype, *N, "column of B")) ||
        (ys && (st = check_scale(n, "y's scale", ys, 1, NULL))) ||
        (yzp && (st = need_8bit(n, "y's zero point", yzp))) ||
        (yzp && (st = check_zero_point(n, "y's zero point", yzp, yzp->dtype, 1, NULL))))
        return st;
    if (!ys != !yzp)
        return ai_node_error(n, AI_ERR_VALUE, "y_scale and y_zero_point go together (without "
                             "them the output is float32)");
    if (bias) {
        const int64_t b0 = bias->ndim == 2 ? bias->shape[0] : 1;
        const int64_t b1 = bias->ndim >= 1 ? bias->shape[bias->ndim - 1] : 1;
        if (bias->dtype != AI_I32)
            return ai_node_error(n, AI_ERR_TYPE, "C is %s; int32 expected",
                                 ai_dtype_name(bias->dtype));
        if (bias->ndim > 2 || (b0 != 1 && b0 != *M) || (b1 != 1 && b1 != *N))
            return ai_node_error(n, AI_ERR_VALUE, "C does not broadcast to (%lld, %lld)",
                                 (long long)*M, (long long)*N);
    }
    *ws = sizeof(double) * (size_t)(*M * *K + *N * *K + *M * *N) +
          sizeof(int32_t) * (size_t)(*M * *N);
    return AI_OK;
}

/* m_j into m (N values) */
static void qgemm_multipliers(const ai_ctx *c, int64_t N, double *m)
{
    const qgemm_attrs *at = c->node->params;
    const ai_tensor *as = c->in[1], *bs = c->in[4], *ys = in_or_null(c, 7);
    const bool s_per = ai_tensor_numel(bs) > 1;
    for (int64_t j = 0; j < N; j++) {
        float v = (float)at->alpha * (float)f_get(as, 0) * (float)f_get(bs, s_per ? j : 0);
        m[j] = ys ? v / (float)f_get(ys, 0) : v;
    }
}

/* The int8 kernels (fast_fc) for A not transposed, an 8-bit output and C
 * one value per column (or none). */
static bool fast_gemm(ai_ctx *c, int64_t M, int64_t N, int64_t K)
{
    const qgemm_attrs *at = c->node->params;
    const ai_tensor *bias = in_or_null(c, 6);
    if (at->trans_a || !in_or_null(c, 8) ||
        (bias && ai_tensor_numel(bias) != 1 &&
         (bias->shape[bias->ndim - 1] != N || (bias->ndim == 2 && bias->shape[0] != 1))))
        return false;
    double *mult = fast_mult_area(c, N, K);
    qgemm_multipliers(c, N, mult);
    const fast_view v = {c->in[0], c->in[2], c->in[3], c->in[5], bias, c->out[0],
                         in_or_null(c, 8), N, K, at->trans_b ? K : 1, at->trans_b ? 1 : N,
                         mult};
    static const int ints[] = {2, 3, 5, 6, 8}; /* the zero points, B, C */
    return fast_fc(c, &v, M, consts_in(c, ints, 5), c->workspace);
}

static ai_status qgemm_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    int64_t M, N, K;
    ai_status st = qgemm_check(c, &M, &N, &K, ws);
    if (st)
        return st;
    const ai_tensor *yzp = in_or_null(c, 8);
    out[0] = (ai_meta){.dtype = yzp ? yzp->dtype : AI_F32, .ndim = 2, .shape = {M, N}};
    const size_t fast = fast_fc_ws(M, K, N, state);
    *ws = fast > *ws ? fast : *ws;
    return AI_OK;
}

static ai_status qgemm_forward(ai_ctx *c)
{
    const qgemm_attrs *at = c->node->params;
    int64_t M, N, K;
    size_t ws;
    ai_status st = qgemm_check(c, &M, &N, &K, &ws);
    if (st)
        return st;
    if (fast_gemm(c, M, N, K))
        return AI_OK;
    const ai_tensor *a = c->in[0], *b = c->in[3], *azp = c->in[2], *bzp = c->in[5];
    const ai_tensor *bias = in_or_null(c, 6), *yzp = in_or_null(c, 8);
    double *A = c->workspace, *Bt = A + M * K, *accd = Bt + N * K;
    int32_t *acc = (int32_t *)(accd + M * N);
    const bool b_per = ai_tensor_numel(bzp) > 1;
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++)
            A[i * K + k] = (double)(q_get(a, at->trans_a ? k * M + i : i * K + k) -
                                    q_get(azp, 0));
    for (int64_t j = 0; j < N; j++)
        for (int64_t k = 0; k < K; k++)
            Bt[j * K + k] = (double)(q_get(b, at->trans_b ? j * K + k : k * N + j) -
                                     q_get(bzp, b_per ? j : 0));
    const bool f32 = exact_in_f32(A, M * K, Bt, N, K);
    if (f32)
        ai_gemm_f32(false, true, M, N, K, 1.0f, to_f32(A, M * K), K, to_f32(Bt, N * K), K, 0.0f,
                    (float *)accd, N);
    else
        gemm_exact(M, N, K, A, Bt, accd);
    wrap_int32(acc, accd, M * N, f32);
    ai_tensor *y = c->out[0];
    int64_t lo = 0, hi = 0;
    q_range(y->dtype, &lo, &hi);
    double *mult = fast_mult_area(c, N, K);
    qgemm_multipliers(c, N, mult);
    for (int64_t j = 0; j < N; j++) {
        const float m = (float)mult[j];
        for (int64_t i = 0; i < M; i++) {
            int32_t v = acc[i * N + j];
            if (bias) { /* C is (), (N,), (1, N), (M, 1) or (M, N) */
                const int64_t rows = bias->ndim == 2 ? bias->shape[0] : 1;
                const int64_t cols = bias->ndim >= 1 ? bias->shape[bias->ndim - 1] : 1;
                const int64_t k = (rows > 1 ? i : 0) * cols + (cols > 1 ? j : 0);
                v = (int32_t)((uint32_t)v + (uint32_t)q_get(bias, k));
            }
            if (yzp)
                q_set(y, i * N + j, q_saturate((double)v * m + (double)q_get(yzp, 0), lo, hi));
            else
                ((float *)y->data)[i * N + j] = (float)v * m;
        }
    }
    return AI_OK;
}

/* ------------------------------------------------ QLinearAdd, QLinearGlobalAveragePool */

/* ONNX Runtime's com.microsoft QLinearAdd and QLinearGlobalAveragePool
 * (its QOperator format: residual additions, global pools), defined in
 * float64 (the reference, ai_q_set_path(AI_Q_REFERENCE)):
 *   QLinearAdd(a, as, azp, b, bs, bzp, cs, czp)   numpy broadcasting
 *       c = saturate(rint((as (a - azp) + bs (b - bzp)) / cs) + czp)
 *   QLinearGlobalAveragePool(x, xs, xzp, ys, yzp), channels_last 0 or 1
 *       y = saturate(rint((sum(x) - xzp count) (xs / ys / count)) + yzp)
 * and, on the other paths, the same integers on the int8 kernels
 * (kernels/qkernels.h): QLinearAdd as P = A a + B b + C0 in int64 with
 * the definition itself for the values within about 2^-21 of a tie
 * (ai_qladd: where it applies, positive finite scales of ratio as / cs,
 * bs / cs in [2^-22, 2^14]), over runs of the output where a and b are
 * each contiguous or one value; the pool's sums in integers (exact), then
 * the same float64 requantization. ONNX Runtime computes them in float32
 * or fixed point (MLAS: 22-bit multipliers of as / cs and bs / cs rounded
 * to float32 first, fused multiply-adds on AVX2): within one quantum. */

static ai_status qlinear_add_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_node *n = c->node;
    const ai_tensor *a = c->in[0], *b = c->in[3];
    ai_status st;
    if ((st = need_8bit(n, "A", a)) ||
        (b->dtype != a->dtype &&
         (st = ai_node_error(n, AI_ERR_TYPE, "B is %s; A's %s expected",
                             ai_dtype_name(b->dtype), ai_dtype_name(a->dtype)))) ||
        (st = check_scale(n, "A's scale", c->in[1], 1, NULL)) ||
        (st = check_zero_point(n, "A's zero point", in_or_null(c, 2), a->dtype, 1, NULL)) ||
        (st = check_scale(n, "B's scale", c->in[4], 1, NULL)) ||
        (st = check_zero_point(n, "B's zero point", in_or_null(c, 5), a->dtype, 1, NULL)) ||
        (st = check_scale(n, "C's scale", c->in[6], 1, NULL)) ||
        (st = check_zero_point(n, "C's zero point", in_or_null(c, 7), a->dtype, 1, NULL)))
        return st;
    out[0].dtype = a->dtype;
    return ai_broadcast_shape(n, a->ndim, a->shape, b->ndim, b->shape, &out[0].ndim,
                              out[0].shape);
}

/* The output in runs of `inner` elements along which a and b each step by
 * 1 or stay (their trailing dims from some dim on: all of the output's, or
 * all broadcast), on ai_qladd_run; false where the integers do not apply. */
static bool fast_add(ai_ctx *c, const int64_t *sa, const int64_t *sb)
{
    const ai_tensor *a = c->in[0], *b = c->in[3];
    ai_tensor *y = c->out[0];
    ai_qladd p;
    if (ai_q_path() < AI_Q_PLAIN ||
        !ai_qladd_init(&p, f_get(c->in[1], 0), (double)q_get(in_or_null(c, 2), 0),
                       f_get(c->in[4], 0), (double)q_get(in_or_null(c, 5), 0),
                       f_get(c->in[6], 0), (double)q_get(in_or_null(c, 7), 0),
                       y->dtype == AI_U8))
        return false;
    const int nd = y->ndim;
    int t = nd;       /* the run: dims t.. */
    bool fa = true, fb = true, za = true, zb = true; /* a, b: contiguous / broadcast there */
    for (int64_t step = 1; t > 0; t--) {
        const int d = t - 1;
        const bool ca = fa && (y->shape[d] == 1 || sa[d] == step);
        const bool ca0 = za && (y->shape[d] == 1 || sa[d] == 0);
        const bool cb = fb && (y->shape[d] == 1 || sb[d] == step);
        const bool cb0 = zb && (y->shape[d] == 1 || sb[d] == 0);
        if (!(ca || ca0) || !(cb || cb0))
            break;
        fa = ca, za = ca0, fb = cb, zb = cb0;
        step *= y->shape[d];
    }
    int64_t inner = 1;
    for (int d = t; d < nd; d++)
        inner *= y->shape[d];
    const int64_t count = ai_tensor_numel(y);
    const int64_t ia_step = fa ? 1 : 0, ib_step = fb ? 1 : 0; /* (a dim of 1: both) */
    int64_t idx[AI_MAX_DIMS] = {0}, ia = 0, ib = 0;
    const uint8_t *pa = a->data, *pb = b->data;
    for (int64_t e = 0; e < count && inner > 0; e += inner) {
        ai_qladd_run(&p, inner, pa + ia, ia_step, pb + ib, ib_step, (uint8_t *)y->data + e);
        for (int d = t - 1; d >= 0; d--) { /* the next run, and its offsets in a, b */
            ia += sa[d], ib += sb[d];
            if (++idx[d] < y->shape[d])
                break;
            ia -= sa[d] * idx[d], ib -= sb[d] * idx[d];
            idx[d] = 0;
        }
    }
    return true;
}

static ai_status qlinear_add_forward(ai_ctx *c)
{
    const ai_tensor *a = c->in[0], *b = c->in[3];
    ai_tensor *y = c->out[0];
    const int nd = y->ndim;
    int64_t sa[AI_MAX_DIMS], sb[AI_MAX_DIMS], idx[AI_MAX_DIMS] = {0}, ia = 0, ib = 0;
    ai_broadcast_strides(a->ndim, a->shape, nd, y->shape, sa);
    ai_broadcast_strides(b->ndim, b->shape, nd, y->shape, sb);
    if (fast_add(c, sa, sb))
        return AI_OK;
    const double ra = f_get(c->in[1], 0), za = (double)q_get(in_or_null(c, 2), 0);
    const double rb = f_get(c->in[4], 0), zb = (double)q_get(in_or_null(c, 5), 0);
    const double cs = f_get(c->in[6], 0), zc = (double)q_get(in_or_null(c, 7), 0);
    int64_t lo = 0, hi = 0;
    q_range(y->dtype, &lo, &hi);
    const int64_t count = ai_tensor_numel(y);
    for (int64_t e = 0; e < count; e++) {
        double v = (ra * ((double)q_get(a, ia) - za) + rb * ((double)q_get(b, ib) - zb)) / cs;
        q_set(y, e, q_saturate(rint(v) + zc, lo, hi));
        for (int d = nd - 1; d >= 0; d--) { /* the next index, and its offsets in a, b */
            ia += sa[d], ib += sb[d];
            if (++idx[d] < y->shape[d])
                break;
            ia -= sa[d] * idx[d], ib -= sb[d] * idx[d];
            idx[d] = 0;
        }
    }
    return AI_OK;
}

static ai_status global_pool_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0];
    int64_t last;
    ai_status st;
    if ((st = ai_attr_int(n, "channels_last", 0, &last)) || (st = need_8bit(n, "X", x)) ||
        (st = check_scale(n, "X's scale", c->in[1], 1, NULL)) ||
        (st = check_zero_point(n, "X's zero point", in_or_null(c, 2), x->dtype, 1, NULL)) ||
        (st = check_scale(n, "Y's scale", c->in[3], 1, NULL)) ||
        (st = check_zero_point(n, "Y's zero point", in_or_null(c, 4), x->dtype, 1, NULL)))
        return st;
    if (last != 0 && last != 1)
        return ai_node_error(n, AI_ERR_VALUE, "channels_last is %lld; 0 or 1 expected",
                             (long long)last);
    if (x->ndim < 3)
        return ai_node_error(n, AI_ERR_VALUE, "X has rank %d; (N, C, spatial...) expected",
                             x->ndim);
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    *ws = sizeof(int64_t) * (size_t)(x->shape[0] * x->shape[last ? x->ndim - 1 : 1]); /* sums */
    for (int d = 0; d < x->ndim; d++) /* the spatial dims become 1 */
        out[0].shape[d] = d == 0 || d == (last ? x->ndim - 1 : 1) ? x->shape[d] : 1;
    return AI_OK;
}

static ai_status global_pool_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    ai_tensor *y = c->out[0];
    int64_t last;
    ai_status st = ai_attr_int(c->node, "channels_last", 0, &last);
    if (st)
        return st;
    const int64_t N = x->shape[0], C = x->shape[last ? x->ndim - 1 : 1];
    const int64_t S = N > 0 && C > 0 ? ai_tensor_numel(x) / (N * C) : 0;
    const double zx = (double)q_get(in_or_null(c, 2), 0), zy = (double)q_get(in_or_null(c, 4), 0);
    const double m = f_get(c->in[1], 0) / f_get(c->in[3], 0) / (double)S;
    int64_t lo = 0, hi = 0, *sums = c->workspace;
    q_range(y->dtype, &lo, &hi);
    if (ai_q_path() >= AI_Q_PLAIN) /* the sums on the kernels */
        ai_qsums(N, C, S, last, x->dtype == AI_U8, x->data, sums);
    else
        for (int64_t i = 0; i < N; i++)
            for (int64_t ch = 0; ch < C; ch++) {
                int64_t sum = 0; /* over x[i][ch][...] or x[i][...][ch] */
                for (int64_t k = 0; k < S; k++)
                    sum += q_get(x, last ? (i * S + k) * C + ch : (i * C + ch) * S + k);
                sums[i * C + ch] = sum;
            }
    for (int64_t i = 0; i < N * C; i++)
        q_set(y, i, q_saturate(rint(((double)sums[i] - zx * (double)S) * m) + zy, lo, hi));
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

/* (AI_OP_HALF: Quantize and Dequantize compute in numpy's precision of
 * their float16/bfloat16 inputs, not the plan's float32 copies) */
static const ai_op_def op_quantize_linear = {"QuantizeLinear", "", 2, 3, 1, 1,
                                             AI_OP_HALF | AI_OP_ANY_DTYPE | AI_OP_BWD_NO_X |
                                                 AI_OP_BWD_NO_Y,
                                             qdq_init,
                                             quantize_shape, quantize_forward,
                                             quantize_backward};
static const ai_op_def op_dequantize_linear = {"DequantizeLinear", "", 2, 3, 1, 1,
                                               AI_OP_HALF | AI_OP_ANY_DTYPE | AI_OP_BWD_NO_Y,
                                               qdq_init,
                                               dequantize_shape,
                                               dequantize_forward, dequantize_backward};
static const ai_op_def op_dynamic_quantize_linear = {"DynamicQuantizeLinear", "", 1, 1, 3, 3,
                                                     AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, NULL,
                                                     dynamic_shape, dynamic_forward,
                                                     dynamic_backward};
static const ai_op_def op_matmul_integer = {"MatMulInteger", "", 2, 4, 1, 1, 0, NULL,
                                            matmul_integer_shape, matmul_integer_forward,
                                            NULL};
static const ai_op_def op_qlinear_matmul = {"QLinearMatMul", "", 8, 8, 1, 1, 0, NULL,
                                            qlinear_matmul_shape, qlinear_matmul_forward,
                                            NULL};
static const ai_op_def op_conv_integer = {"ConvInteger", "", 2, 4, 1, 1, 0, ai_conv_init,
                                          conv_integer_shape, conv_integer_forward, NULL};
static const ai_op_def op_qlinear_conv = {"QLinearConv", "", 8, 9, 1, 1, 0, ai_conv_init,
                                          qlinear_conv_shape, qlinear_conv_forward, NULL};
static const ai_op_def op_qgemm = {"QGemm", "com.microsoft", 6, 9, 1, 1, 0, qgemm_init,
                                   qgemm_shape, qgemm_forward, NULL};
static const ai_op_def op_qlinear_add = {"QLinearAdd", "com.microsoft", 7, 8, 1, 1, 0, NULL,
                                         qlinear_add_shape, qlinear_add_forward, NULL};
static const ai_op_def op_qlinear_global_average_pool = {
    "QLinearGlobalAveragePool", "com.microsoft", 5, 5, 1, 1, 0, NULL, global_pool_shape,
    global_pool_forward, NULL};

const ai_op_def *const ai_ops_qlinear[] = {
    &op_quantize_linear, &op_dequantize_linear, &op_dynamic_quantize_linear,
    &op_matmul_integer, &op_qlinear_matmul, &op_conv_integer, &op_qlinear_conv, &op_qgemm,
    &op_qlinear_add, &op_qlinear_global_average_pool, NULL,
};
