/*
 * quant.c — the integer operators of quantized graphs (ONNX domain
 * "aidge_interop.quant", written by aidge_interop.quantize). int8
 * activations and weights, int32 biases and accumulators; every output is
 * requantized with the attributes `multiplier`, `shift`, `out_min`,
 * `out_max` (see portable/aidge_kernels.h for the exact arithmetic); QConv
 * and QGemm may give `multiplier` and `shift` as one int per output channel
 * (per-channel weight scales; a single int applies to every channel). The
 * fast kernels (kernels/qkernels.h) give the integers of the portable ones
 * that C exports run, so an export computes what the engine computes, bit
 * for bit; ai_q_set_path(AI_Q_REFERENCE) runs the portable ones themselves.
 * Inference only: no backward.
 *
 *   QConv(x, w[, b])   Conv attributes strides, dilations, pads, group;
 *                      1 or 2 spatial dims; explicit pads (no auto_pad)
 *   QGemm(x, w[, b])   x (N, K), w (M, K): y = x w^T + b
 *   QAdd(a, b)         b of a's shape or of its last axes; multiplier_a,
 *                      multiplier_b, shift
 *   Requantize(x)      int8 -> int8 with another scale or clamp
 *   QMaxPool(x), QAveragePool(x)   kernel_shape, strides, dilations, pads;
 *                      QAveragePool: count_include_pad, rounding half up
 * `half_even` = 1 (quantize(rounding="half_even")) on QConv, QGemm, QAdd,
 * Requantize and QAveragePool rounds ties to the even neighbour instead, as
 * ONNX's QuantizeLinear (QAdd and QAveragePool then on the portable loops).
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/qkernels.h"
#include "../portable/aidge_kernels.h"
#include "spatial.h"

typedef struct {
    int64_t ma, mb; /* QAdd */
    int64_t half_even; /* ties to even (quantize(rounding="half_even")), else up */
    int64_t group, count_include_pad;
    ai_int_list kernel_shape, strides, dilations, pads;
    int32_t n_rq;   /* 1 (per tensor) or one per output channel (QConv, QGemm) */
    aik_rq rq_attr[]; /* n_rq entries, as the attributes give them */
} q_attrs;

/* `multiplier` or `shift`: one int, or (QConv, QGemm) a list of one int per
 * output channel: *v points to *len values (*len = 1 for an int). */
static ai_status read_rq_values(const ai_node *n, const char *name, int64_t dflt, int64_t lo,
                                int64_t hi, int64_t *one, const int64_t **v, int64_t *len)
{
    const ai_attr *at = ai_node_attr(n, name);
    if (!at || at->type != AI_ATTR_INTS) {
        *v = one, *len = 1;
        return ai_attr_int_in(n, name, dflt, lo, hi, one);
    }
    if (strcmp(n->op_type, "QConv") != 0 && strcmp(n->op_type, "QGemm") != 0)
        return ai_node_error(n, AI_ERR_VALUE, "%s must be one int (only QConv and QGemm take "
                             "one per output channel)", name);
    if (at->n < 1 || at->n > INT32_MAX)
        return ai_node_error(n, AI_ERR_VALUE, "%s has %lld values; one per output channel "
                             "expected", name, (long long)at->n);
    for (int64_t i = 0; i < at->n; i++)
        if (at->ints[i] < lo || at->ints[i] > hi)
            return ai_node_error(n, AI_ERR_VALUE, "%s[%lld] is %lld; must be in [%lld, %lld]",
                                 name, (long long)i, (long long)at->ints[i], (long long)lo,
                                 (long long)hi);
    *v = at->ints, *len = at->n;
    return AI_OK;
}

static ai_status q_init(ai_node *n)
{
    int64_t bits, mult1, shift1, lo, hi, n_mult, n_shift;
    const int64_t *mult, *shift;
    ai_status st;
    if ((st = ai_attr_int_in(n, "nb_bits", 8, 2, 8, &bits)) ||
        (st = read_rq_values(n, "multiplier", 1, 1, INT32_MAX, &mult1, &mult, &n_mult)) ||
        (st = read_rq_values(n, "shift", 0, 0, 62, &shift1, &shift, &n_shift)))
        return st;
    if (n_mult > 1 && n_shift > 1 && n_mult != n_shift)
        return ai_node_error(n, AI_ERR_VALUE, "multiplier has %lld values and shift %lld; "
                             "one per output channel each (or one int)", (long long)n_mult,
                             (long long)n_shift);
    const int64_t n_rq = n_mult > n_shift ? n_mult : n_shift;
    q_attrs *a = calloc(1, sizeof *a + sizeof(aik_rq) * (size_t)n_rq);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    if ((st = ai_attr_int_in(n, "out_min", -(INT64_C(1) << (bits - 1)), -(INT64_C(1) << (bits - 1)),
                         (INT64_C(1) << (bits - 1)) - 1, &lo)) ||
        (st = ai_attr_int_in(n, "out_max", (INT64_C(1) << (bits - 1)) - 1, lo,
                         (INT64_C(1) << (bits - 1)) - 1, &hi)) ||
        (st = ai_attr_int_in(n, "multiplier_a", 1, -INT32_MAX, INT32_MAX, &a->ma)) ||
        (st = ai_attr_int_in(n, "multiplier_b", 1, -INT32_MAX, INT32_MAX, &a->mb)) ||
        (st = ai_attr_int_in(n, "group", 1, 1, INT32_MAX, &a->group)) ||
        (st = ai_attr_int_in(n, "count_include_pad", 0, 0, 1, &a->count_include_pad)) ||
        (st = ai_attr_int_in(n, "half_even", 0, 0, 1, &a->half_even)) ||
        (st = ai_read_int_list(n, "kernel_shape", 2, 1, &a->kernel_shape)) ||
        (st = ai_read_int_list(n, "strides", 2, 1, &a->strides)) ||
        (st = ai_read_int_list(n, "dilations", 2, 1, &a->dilations)) ||
        (st = ai_read_int_list(n, "pads", 4, 0, &a->pads)))
        return st;
    a->n_rq = (int32_t)n_rq;
    for (int64_t i = 0; i < n_rq; i++)
        a->rq_attr[i] = (aik_rq){(int32_t)mult[n_mult > 1 ? i : 0],
                                 (int16_t)shift[n_shift > 1 ? i : 0], (int16_t)lo, (int16_t)hi, 0,
                                 (int16_t)a->half_even};
    return AI_OK;
}

/* The workspace of QConv and QGemm starts with the requantization of each
 * output channel (m entries); the fast kernels' scratch follows. */
#define RQ_BYTES(m) (((size_t)(m) * sizeof(aik_rq) + 63) & ~(size_t)63)

/* Whether the weight (and bias) are constants of the plan: the fast kernels
 * then pack them once, at the first forward. */
static bool const_weights(const ai_ctx *c)
{
    return ai_ctx_const(c, 1) && (c->n_in < 3 || !c->in[2] || ai_ctx_const(c, 2));
}

/* QConv and QGemm with m output channels: per-channel attributes must have
 * m values. */
static ai_status check_rq_count(const ai_ctx *c, int64_t m)
{
    const q_attrs *a = c->node->params;
    if (a->n_rq != 1 && a->n_rq != m)
        return ai_node_error(c->node, AI_ERR_VALUE, "multiplier and shift have %d values "
                             "for %lld output channels", a->n_rq, (long long)m);
    return AI_OK;
}

/* The m requantizations (rq[oc]) the kernels take: the per-channel
 * attributes, or m copies of the per-tensor one at the workspace's start. */
static const aik_rq *rq_per_channel(const ai_ctx *c, int32_t m)
{
    const q_attrs *a = c->node->params;
    if (a->n_rq == m)
        return a->rq_attr;
    aik_rq *rq = c->workspace;
    for (int32_t i = 0; i < m; i++)
        rq[i] = a->rq_attr[0];
    return rq;
}

static ai_status need_dtype(const ai_node *n, const char *what, const ai_tensor *t,
                            ai_dtype want)
{
    if (t->dtype != want)
        return ai_node_error(n, AI_ERR_TYPE, "%s is %s; %s expected", what,
                             ai_dtype_name(t->dtype), ai_dtype_name(want));
    return AI_OK;
}

static bool is_conv(const ai_node *n) { return strcmp(n->op_type, "QConv") == 0; }

/* The window of QConv / QMaxPool / QAveragePool from the input (N, C, [H,] W),
 * the attributes and, for QConv, the weight (M, C/group, [kh,] kw). */
static ai_status window_setup(const ai_ctx *c, aik_window *p)
{
    const ai_node *n = c->node;
    const q_attrs *a = n->params;
    const ai_tensor *x = c->in[0];
    ai_status st;
    memset(p, 0, sizeof *p);
    if ((st = need_dtype(n, "input", x, AI_I8)))
        return st;
    if (x->ndim != 3 && x->ndim != 4)
        return ai_node_error(n, AI_ERR_VALUE, "input has rank %d; (N, C, W) or (N, C, H, W) "
                             "expected", x->ndim);
    const int nsp = x->ndim - 2;
    for (int d = 0; d < x->ndim; d++)
        if (x->shape[d] > INT32_MAX)
            return ai_node_error(n, AI_ERR_VALUE, "input dim %d is too large", d);
    p->n = (int32_t)x->shape[0];
    p->c = (int32_t)x->shape[1];
    p->h = nsp == 2 ? (int32_t)x->shape[2] : 1;
    p->w = (int32_t)x->shape[x->ndim - 1];
    int64_t k[2], s[2], dl[2], pads[4];
    if (is_conv(n)) {
        const ai_tensor *w = c->in[1], *b = c->n_in > 2 ? c->in[2] : NULL;
        if ((st = need_dtype(n, "weight", w, AI_I8)) ||
            (b && (st = need_dtype(n, "bias", b, AI_I32))))
            return st;
        if (w->ndim != x->ndim)
            return ai_node_error(n, AI_ERR_VALUE, "weight has rank %d; %d expected", w->ndim,
                                 x->ndim);
        p->group = (int32_t)a->group;
        if (p->c % p->group || w->shape[0] % p->group || w->shape[1] * p->group != p->c)
            return ai_node_error(n, AI_ERR_VALUE, "input has %d channels, the weight %lld x "
                                 "%lld, group %d: inconsistent", p->c,
                                 (long long)w->shape[0], (long long)w->shape[1], p->group);
        if (w->shape[0] > INT32_MAX)
            return ai_node_error(n, AI_ERR_VALUE, "too many output channels");
        p->m = (int32_t)w->shape[0];
        if (b && (b->ndim != 1 || b->shape[0] != p->m))
            return ai_node_error(n, AI_ERR_VALUE, "bias must have shape (%d,)", p->m);
        for (int d = 0; d < nsp; d++)
            k[d] = w->shape[2 + d];
        if (a->kernel_shape.n >= 0) {
            int64_t ks[2];
            if ((st = ai_spatial_list(n, "kernel_shape", &a->kernel_shape, nsp, 1, ks)))
                return st;
            for (int d = 0; d < nsp; d++)
                if (ks[d] != k[d])
                    return ai_node_error(n, AI_ERR_VALUE, "kernel_shape does not match the "
                                         "weight");
        }
    } else {
        p->m = p->c;
        p->group = 1;
        if (a->kernel_shape.n < 0)
            return ai_node_error(n, AI_ERR_VALUE, "kernel_shape is required");
        if ((st = ai_spatial_list(n, "kernel_shape", &a->kernel_shape, nsp, 1, k)))
            return st;
    }
    if ((st = ai_spatial_list(n, "strides", &a->strides, nsp, 1, s)) ||
        (st = ai_spatial_list(n, "dilations", &a->dilations, nsp, 1, dl)))
        return st;
    if (a->pads.n >= 0 && a->pads.n != 2 * nsp)
        return ai_node_error(n, AI_ERR_VALUE, "pads has %lld values for %d spatial dims",
                             (long long)a->pads.n, nsp);
    for (int d = 0; d < 2 * nsp; d++)
        pads[d] = a->pads.n < 0 ? 0 : a->pads.v[d];
    int64_t in_sz[2] = {p->h, p->w}, out_sz[2] = {1, 1};
    const int off = 2 - nsp; /* 1-D: the width is dim 1 of the 2-D window */
    int64_t kk[2] = {1, 1}, ss[2] = {1, 1}, dd[2] = {1, 1}, pb[2] = {0, 0};
    for (int d = 0; d < nsp; d++) {
        kk[off + d] = k[d], ss[off + d] = s[d], dd[off + d] = dl[d];
        pb[off + d] = pads[d];
        int64_t span = dl[d] * (k[d] - 1) + 1, padded = in_sz[off + d] + pads[d] + pads[nsp + d];
        if (pads[d] >= span || pads[nsp + d] >= span)
            return ai_node_error(n, AI_ERR_VALUE, "pads must be smaller than the window");
        if (padded < span)
            return ai_node_error(n, AI_ERR_VALUE, "the window (%lld) is larger than the "
                                 "padded input (%lld)", (long long)span, (long long)padded);
        out_sz[off + d] = (padded - span) / s[d] + 1;
    }
    p->oh = (int32_t)out_sz[0], p->ow = (int32_t)out_sz[1];
    p->kh = (int32_t)kk[0], p->kw = (int32_t)kk[1];
    p->sh = (int32_t)ss[0], p->sw = (int32_t)ss[1];
    p->dh = (int32_t)dd[0], p->dw = (int32_t)dd[1];
    p->pt = (int32_t)pb[0], p->pl = (int32_t)pb[1];
    p->count_include_pad = (int32_t)a->count_include_pad;
    return AI_OK;
}

/* The int32 accumulator of k products of int8 (|x w| <= 128 * 128) plus the
 * bias never overflows, or the node is refused. */
static ai_status check_accumulator(const ai_ctx *c, int64_t k)
{
    const ai_node *n = c->node;
    const bool has_bias = c->n_in > 2 && c->in[2];
    const ai_tensor *bias = has_bias ? ai_ctx_const(c, 2) : NULL;
    int64_t bmax = has_bias && !bias ? INT32_MAX : 0; /* computed bias: assume the worst */
    if (bias) {
        const int32_t *b = bias->data;
        for (int64_t i = 0; i < ai_tensor_numel(bias); i++) {
            int64_t v = b[i] < 0 ? -(int64_t)b[i] : b[i];
            bmax = v > bmax ? v : bmax;
        }
    }
    if (k > (INT32_MAX - bmax) / (128 * 128))
        return ai_node_error(n, AI_ERR_VALUE, "%lld products per output plus a bias of up to "
                             "%lld may overflow the int32 accumulator", (long long)k,
                             (long long)bmax);
    return AI_OK;
}

/* Pools: every window sees at least one element of the input (dilation
 * can make a window fall entirely in the padding). */
static ai_status check_windows(const ai_node *n, const aik_window *p)
{
    const int32_t size[2] = {p->h, p->w}, out[2] = {p->oh, p->ow}, k[2] = {p->kh, p->kw};
    const int32_t s[2] = {p->sh, p->sw}, d[2] = {p->dh, p->dw}, pad[2] = {p->pt, p->pl};
    for (int a = 0; a < 2; a++)
        for (int32_t o = 0; o < out[a]; o++) {
            bool seen = false;
            for (int32_t j = 0; j < k[a] && !seen; j++) {
                int64_t i = (int64_t)o * s[a] - pad[a] + (int64_t)j * d[a];
                seen = i >= 0 && i < size[a];
            }
            if (!seen)
                return ai_node_error(n, AI_ERR_VALUE, "window %d of spatial axis %d covers "
                                     "only padding", o, a);
        }
    return AI_OK;
}

static ai_status window_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    aik_window p;
    ai_status st = window_setup(c, &p);
    if (st)
        return st;
    if (is_conv(c->node)) {
        if (!(st = check_accumulator(c, (int64_t)(p.c / p.group) * p.kh * p.kw)) &&
            !(st = check_rq_count(c, p.m))) {
            ai_qconv_sizes(&p, ws, state);
            *ws += RQ_BYTES(p.m);
        }
    } else
        st = check_windows(c->node, &p);
    if (st)
        return st;
    const int nsp = c->in[0]->ndim - 2;
    out[0].dtype = AI_I8;
    out[0].ndim = c->in[0]->ndim;
    out[0].shape[0] = p.n, out[0].shape[1] = p.m;
    if (nsp == 2)
        out[0].shape[2] = p.oh;
    out[0].shape[out[0].ndim - 1] = p.ow;
    return AI_OK;
}

static ai_status window_forward(ai_ctx *c)
{
    aik_window p;
    ai_status st = window_setup(c, &p);
    if (st)
        return st;
    const int8_t *x = c->in[0]->data;
    int8_t *y = c->out[0]->data;
    const char *op = c->node->op_type;
    const bool fast = ai_q_path() != AI_Q_REFERENCE;
    if (is_conv(c->node)) {
        const int32_t *b = c->n_in > 2 && c->in[2] ? c->in[2]->data : NULL;
        const aik_rq *rq = rq_per_channel(c, p.m);
        if (fast)
            ai_qconv(&p, x, c->in[1]->data, b, rq, y, c->state, const_weights(c),
                     (char *)c->workspace + RQ_BYTES(p.m));
        else
            aik_conv2d_i8(&p, x, c->in[1]->data, b, rq, y);
    } else if (strcmp(op, "QMaxPool") == 0) {
        (fast ? ai_qmaxpool : aik_maxpool2d_i8)(&p, x, y);
    } else {
        const q_attrs *a = c->node->params;
        if (fast && !a->half_even) /* (ties to even: the portable kernel) */
            ai_qavgpool(&p, x, y);
        else
            aik_avgpool2d_i8(&p, x, (int32_t)a->half_even, y);
    }
    return AI_OK;
}

static ai_status gemm_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0], *w = c->in[1], *b = c->n_in > 2 ? c->in[2] : NULL;
    ai_status st;
    if ((st = need_dtype(n, "input", x, AI_I8)) || (st = need_dtype(n, "weight", w, AI_I8)) ||
        (b && (st = need_dtype(n, "bias", b, AI_I32))))
        return st;
    if (x->ndim != 2 || w->ndim != 2 || x->shape[1] != w->shape[1])
        return ai_node_error(n, AI_ERR_VALUE, "input (N, K) and weight (M, K) expected");
    if (w->shape[0] > INT32_MAX || w->shape[1] > INT32_MAX)
        return ai_node_error(n, AI_ERR_VALUE, "the weight is too large");
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return ai_node_error(n, AI_ERR_VALUE, "bias must have shape (%lld,)",
                             (long long)w->shape[0]);
    if ((st = check_accumulator(c, w->shape[1])) || (st = check_rq_count(c, w->shape[0])))
        return st;
    ai_qfc_sizes(x->shape[0], (int32_t)w->shape[1], (int32_t)w->shape[0], ws, state);
    *ws += RQ_BYTES(w->shape[0]);
    out[0].dtype = AI_I8;
    out[0].ndim = 2;
    out[0].shape[0] = x->shape[0];
    out[0].shape[1] = w->shape[0];
    return AI_OK;
}

static ai_status gemm_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *w = c->in[1];
    const int32_t k = (int32_t)w->shape[1], m = (int32_t)w->shape[0];
    const int32_t *b = c->n_in > 2 && c->in[2] ? c->in[2]->data : NULL;
    const aik_rq *rq = rq_per_channel(c, m);
    if (ai_q_path() != AI_Q_REFERENCE)
        ai_qfc(x->shape[0], k, m, x->data, w->data, b, rq, c->out[0]->data, c->state,
               const_weights(c), (char *)c->workspace + RQ_BYTES(m));
    else
        aik_fc_i8(x->shape[0], k, m, x->data, w->data, b, rq, c->out[0]->data);
    return AI_OK;
}

static ai_status elementwise_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_node *n = c->node;
    ai_status st;
    for (int i = 0; i < c->n_in; i++)
        if ((st = need_dtype(n, i ? "input 1" : "input 0", c->in[i], AI_I8)))
            return st;
    if (c->n_in == 2) {
        const ai_tensor *a = c->in[0], *b = c->in[1];
        if (b->ndim > a->ndim ||
            memcmp(a->shape + a->ndim - b->ndim, b->shape, sizeof(int64_t) * b->ndim))
            return ai_node_error(n, AI_ERR_VALUE, "input 1 must have the shape of input 0 "
                                 "or of its last axes (it repeats over the leading ones)");
    }
    out[0].dtype = AI_I8;
    out[0].ndim = c->in[0]->ndim;
    memcpy(out[0].shape, c->in[0]->shape, sizeof(int64_t) * c->in[0]->ndim);
    return AI_OK;
}

static ai_status add_forward(ai_ctx *c)
{
    const q_attrs *a = c->node->params;
    const int64_t n = ai_tensor_numel(c->in[0]), nb = ai_tensor_numel(c->in[1]);
    const aik_rq *r = a->rq_attr;
    if (ai_q_path() != AI_Q_REFERENCE && nb == n && !a->half_even) /* (the fast one: same
                                                                     * shapes, ties up) */
        ai_qadd(n, c->in[0]->data, (int32_t)a->ma, c->in[1]->data, (int32_t)a->mb, r->shift,
                r->lo, r->hi, c->out[0]->data);
    else
        aik_add_i8(n, c->in[0]->data, (int32_t)a->ma, c->in[1]->data, nb, (int32_t)a->mb,
                   r->shift, r->lo, r->hi, (int32_t)a->half_even, c->out[0]->data);
    return AI_OK;
}

static ai_status requantize_forward(ai_ctx *c)
{
    const q_attrs *a = c->node->params;
    (ai_q_path() != AI_Q_REFERENCE ? ai_qrequant : aik_requant_i8)(
        ai_tensor_numel(c->in[0]), c->in[0]->data, a->rq_attr, c->out[0]->data);
    return AI_OK;
}

#define Q_OP(var, name, min_in, max_in, shape, forward) \
    static const ai_op_def var = {name, "aidge_interop.quant", min_in, max_in, 1, 1, 0, \
                                  q_init, shape, forward, NULL};
Q_OP(op_qconv, "QConv", 2, 3, window_shape, window_forward)
Q_OP(op_qgemm, "QGemm", 2, 3, gemm_shape, gemm_forward)
Q_OP(op_qadd, "QAdd", 2, 2, elementwise_shape, add_forward)
Q_OP(op_requantize, "Requantize", 1, 1, elementwise_shape, requantize_forward)
Q_OP(op_qmaxpool, "QMaxPool", 1, 1, window_shape, window_forward)
Q_OP(op_qavgpool, "QAveragePool", 1, 1, window_shape, window_forward)

const ai_op_def *const ai_ops_quant[] = {
    &op_qconv, &op_qgemm, &op_qadd, &op_requantize, &op_qmaxpool, &op_qavgpool, NULL,
};
