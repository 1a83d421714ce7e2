/*
 * quant_nonlinear.c — the nonlinear integer operators of quantized graphs
 * (ONNX domain "aidge_interop.quant", written by aidge_interop.quantize for
 * transformers): int8 in and out, integer arithmetic only, on the portable
 * kernels that C exports run (portable/aidge_kernels.h has the formulas,
 * docs/quantization.md the error bounds). Inference only: no backward.
 *
 *   QLookup(x, table)            y = table[x + 128]; table int8 (256,)
 *                                (Sigmoid, Tanh, GELU)
 *   QSoftmax(x, exp_table)       over the last axis; exp_table int32 (256,),
 *                                attributes q (y = round(q p)), out_max
 *   QLayerNorm(x, gamma, beta)   over the last axis (d); gamma int32 (d,),
 *                                beta int64 (d,); attributes eps, pre_shift,
 *                                out_min, out_max
 *   QMatMul(a, b)                (..., m, k) x (..., k, n), same leading
 *                                dims; multiplier, shift, out_min, out_max,
 *                                half_even (ties to even, else up)
 *
 * The forwards run the fast kernels of kernels/qrows.c (the same integers),
 * or the portable ones after ai_q_set_path(AI_Q_REFERENCE).
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/qkernels.h"
#include "../portable/aidge_kernels.h"

typedef struct {
    aik_rq rq;
    int64_t q, eps, pre;
} qn_attrs;

static ai_status qn_init(ai_node *n)
{
    qn_attrs *a = calloc(1, sizeof *a);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    int64_t mult, shift, lo, hi, even;
    ai_status st;
    if ((st = ai_attr_int_in(n, "multiplier", 1, 1, INT32_MAX, &mult)) ||
        (st = ai_attr_int_in(n, "shift", 0, 0, 62, &shift)) ||
        (st = ai_attr_int_in(n, "out_min", -128, -128, 127, &lo)) ||
        (st = ai_attr_int_in(n, "out_max", 127, lo, 127, &hi)) ||
        (st = ai_attr_int_in(n, "q", 127, 1, 128, &a->q)) ||
        (st = ai_attr_int_in(n, "eps", 0, 0, INT64_C(1) << 61, &a->eps)) ||
        (st = ai_attr_int_in(n, "pre_shift", 0, 0, 30, &a->pre)) ||
        (st = ai_attr_int_in(n, "half_even", 0, 0, 1, &even)))
        return st;
    a->rq = (aik_rq){(int32_t)mult, (int16_t)shift, (int16_t)lo, (int16_t)hi, 0, (int16_t)even};
    return AI_OK;
}

static ai_status need(const ai_node *n, const char *what, const ai_tensor *t, ai_dtype want,
                      int ndim, int64_t len)
{
    if (t->dtype != want)
        return ai_node_error(n, AI_ERR_TYPE, "%s is %s; %s expected", what,
                             ai_dtype_name(t->dtype), ai_dtype_name(want));
    if (ndim >= 0 && (t->ndim != ndim || (ndim == 1 && t->shape[0] != len)))
        return ai_node_error(n, AI_ERR_VALUE, "%s must have shape (%lld,)", what,
                             (long long)len);
    return AI_OK;
}

static int64_t last_dim(const ai_tensor *x) { return x->ndim ? x->shape[x->ndim - 1] : 1; }

static ai_status same_shape(ai_ctx *c, ai_meta *out)
{
    out[0].dtype = AI_I8;
    out[0].ndim = c->in[0]->ndim;
    memcpy(out[0].shape, c->in[0]->shape, sizeof(int64_t) * c->in[0]->ndim);
    return AI_OK;
}

static ai_status lookup_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    ai_status st;
    if ((st = need(c->node, "input", c->in[0], AI_I8, -1, 0)) ||
        (st = need(c->node, "table", c->in[1], AI_I8, 1, 256)))
        return st;
    return same_shape(c, out);
}

static ai_status lookup_forward(ai_ctx *c)
{
    (ai_q_path() != AI_Q_REFERENCE ? ai_qlookup : aik_lookup_i8)(
        ai_tensor_numel(c->in[0]), c->in[0]->data, c->in[1]->data, c->out[0]->data);
    return AI_OK;
}

/* e_0 = 2^30 >= every entry >= 0: the row sums are positive, at least 2^30 */
static ai_status check_exp_table(const ai_node *n, const int32_t *e)
{
    for (int i = 0; i < 256; i++)
        if (e[i] < 0 || e[i] > e[0] || e[0] != (INT32_C(1) << 30))
            return ai_node_error(n, AI_ERR_VALUE, "exp_table must start at 2^30 and "
                                 "hold values in [0, 2^30]");
    return AI_OK;
}

static ai_status softmax_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_node *n = c->node;
    ai_status st;
    if ((st = need(n, "input", c->in[0], AI_I8, -1, 0)) ||
        (st = need(n, "exp_table", c->in[1], AI_I32, 1, 256)))
        return st;
    if (last_dim(c->in[0]) > INT32_MAX)
        return ai_node_error(n, AI_ERR_VALUE, "the last axis is too long");
    const ai_tensor *t = ai_ctx_const(c, 1);
    if (t && (st = check_exp_table(n, t->data)))
        return st;
    return same_shape(c, out);
}

static ai_status softmax_forward(ai_ctx *c)
{
    const qn_attrs *a = c->node->params;
    const ai_tensor *x = c->in[0];
    const int64_t d = last_dim(x), numel = ai_tensor_numel(x);
    if (numel == 0)
        return AI_OK;
    const int32_t *e = c->in[1]->data;
    ai_status st;
    if (!ai_ctx_const(c, 1) && (st = check_exp_table(c->node, e)))
        return st;
    (ai_q_path() != AI_Q_REFERENCE ? ai_qsoftmax : aik_softmax_i8)(
        numel / d, (int32_t)d, x->data, e, (int32_t)a->q, a->rq.hi, c->out[0]->data);
    return AI_OK;
}

static ai_status layernorm_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_node *n = c->node;
    const qn_attrs *a = n->params;
    const int64_t d = last_dim(c->in[0]);
    ai_status st;
    if ((st = need(n, "input", c->in[0], AI_I8, -1, 0)) ||
        (st = need(n, "gamma", c->in[1], AI_I32, 1, d)) ||
        (st = need(n, "beta", c->in[2], AI_I64, 1, d)))
        return st;
    /* sum c^2 <= 255^2 d^3, shifted by 2 pre_shift bits, plus eps: below 2^62 */
    if (d > (INT64_C(1) << 14))
        return ai_node_error(n, AI_ERR_VALUE, "the last axis (%lld) is longer than 16384",
                             (long long)d);
    const int64_t s2max = 65025 * d * d * d;
    if (a->pre > 0 && s2max > (INT64_MAX >> 1 >> (2 * a->pre)))
        return ai_node_error(n, AI_ERR_VALUE, "pre_shift %lld overflows for rows of %lld",
                             (long long)a->pre, (long long)d);
    if ((s2max << (2 * a->pre)) > (INT64_C(1) << 62) - a->eps)
        return ai_node_error(n, AI_ERR_VALUE, "eps + (sum c^2 << 2 pre_shift) may reach 2^62");
    const ai_tensor *b = ai_ctx_const(c, 2);
    if (b) {
        const int64_t *v = b->data;
        for (int64_t i = 0; i < d; i++)
            if (v[i] > (INT64_C(1) << 61) || v[i] < -(INT64_C(1) << 61))
                return ai_node_error(n, AI_ERR_VALUE, "beta must lie in [-2^61, 2^61]");
    } else {
        return ai_node_error(n, AI_ERR_VALUE, "beta must be a constant");
    }
    return same_shape(c, out);
}

static ai_status layernorm_forward(ai_ctx *c)
{
    const qn_attrs *a = c->node->params;
    const ai_tensor *x = c->in[0];
    const int64_t d = last_dim(x), numel = ai_tensor_numel(x);
    if (numel == 0)
        return AI_OK;
    (ai_q_path() != AI_Q_REFERENCE ? ai_qlayernorm : aik_layernorm_i8)(
        numel / d, (int32_t)d, x->data, c->in[1]->data, c->in[2]->data, a->eps,
        (int32_t)a->pre, a->rq.lo, a->rq.hi, c->out[0]->data);
    return AI_OK;
}

static ai_status matmul_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0], *w = c->in[1];
    ai_status st;
    if ((st = need(n, "input 0", x, AI_I8, -1, 0)) || (st = need(n, "input 1", w, AI_I8, -1, 0)))
        return st;
    if (x->ndim < 2 || x->ndim != w->ndim ||
        memcmp(x->shape, w->shape, sizeof(int64_t) * (x->ndim - 2)) ||
        x->shape[x->ndim - 1] != w->shape[w->ndim - 2])
        return ai_node_error(n, AI_ERR_VALUE, "inputs (..., m, k) and (..., k, n) with the "
                             "same leading dims expected");
    const int64_t m = x->shape[x->ndim - 2], k = x->shape[x->ndim - 1],
                  nn = w->shape[w->ndim - 1];
    if (m > INT32_MAX || nn > INT32_MAX || k > INT32_MAX / (128 * 128))
        return ai_node_error(n, AI_ERR_VALUE, "%lld products per output may overflow the "
                             "int32 accumulator", (long long)k);
    out[0].dtype = AI_I8;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * x->ndim);
    out[0].shape[x->ndim - 1] = nn;
    *ws = ai_qmatmul_ws_bytes((int32_t)m, (int32_t)k, (int32_t)nn);
    return AI_OK;
}

static ai_status matmul_forward(ai_ctx *c)
{
    const qn_attrs *a = c->node->params;
    const ai_tensor *x = c->in[0], *w = c->in[1];
    const int64_t m = x->shape[x->ndim - 2], k = x->shape[x->ndim - 1],
                  nn = w->shape[w->ndim - 1];
    int64_t batch = 1;
    for (int d = 0; d < x->ndim - 2; d++)
        batch *= x->shape[d];
    if (ai_q_path() != AI_Q_REFERENCE)
        ai_qmatmul(batch, (int32_t)m, (int32_t)k, (int32_t)nn, x->data, w->data, &a->rq,
                   c->out[0]->data, c->workspace);
    else
        aik_matmul_i8(batch, (int32_t)m, (int32_t)k, (int32_t)nn, x->data, w->data, &a->rq,
                      c->out[0]->data);
    return AI_OK;
}

#define QN_OP(var, name, n_in, shape, forward) \
    static const ai_op_def var = {name, "aidge_interop.quant", n_in, n_in, 1, 1, 0, \
                                  qn_init, shape, forward, NULL};
QN_OP(op_qlookup, "QLookup", 2, lookup_shape, lookup_forward)
QN_OP(op_qsoftmax, "QSoftmax", 2, softmax_shape, softmax_forward)
QN_OP(op_qlayernorm, "QLayerNorm", 3, layernorm_shape, layernorm_forward)
QN_OP(op_qmatmul, "QMatMul", 2, matmul_shape, matmul_forward)

const ai_op_def *const ai_ops_quant_nonlinear[] = {
    &op_qlookup, &op_qsoftmax, &op_qlayernorm, &op_qmatmul, NULL,
};
