/*
 * loss.c — the loss operators: NegativeLogLikelihoodLoss and
 * SoftmaxCrossEntropyLoss (float32 and float64), so that a graph can hold
 * its loss and train through it.
 *
 * Both read an input X of shape (N, C, d1..dk), seen here as (N, C, D), and
 * integer targets T of shape (N, d1..dk), seen as (N, D), with an optional
 * per-class weight W (C). Per position (n, d) with t = T[n, d]:
 *   loss[n, d] = -W[t] * P[n, t, d]   (W[t] = 1 without weights)
 * where P is X itself (NegativeLogLikelihoodLoss) or log_softmax(X) along C
 * (SoftmaxCrossEntropyLoss, whose optional second output is P). A position
 * whose target equals the ignore_index attribute gives 0 and weighs 0.
 * reduction: "none" gives loss (N, d1..dk); "sum" its sum; "mean" (the
 * default) its sum divided by the sum of W[t] over the positions not
 * ignored (their count without weights), as ONNX defines it. A target
 * outside [0, C) that is not the ignore_index is an error.
 *
 * Sums and log_softmax are computed in double. Backward adds into the
 * gradients of X and W (never of the targets); SoftmaxCrossEntropyLoss
 * keeps P (its second output, or node state when it has none) for it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"

typedef enum { LOSS_NONE, LOSS_SUM, LOSS_MEAN } loss_reduction;

typedef struct {
    loss_reduction reduction;
    bool has_ignore;
    int64_t ignore_index;
} loss_params;

static ai_status loss_init(ai_node *n)
{
    loss_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    static const char *const reductions[] = {"none", "sum", "mean"}; /* loss_reduction */
    int r;
    ai_status st = ai_attr_choice(n, "reduction", "mean", reductions, 3, &r);
    if (st)
        return st;
    p->reduction = (loss_reduction)r;
    p->has_ignore = ai_node_attr(n, "ignore_index") != NULL;
    return ai_attr_int(n, "ignore_index", 0, &p->ignore_index);
}

static bool is_sce(const ai_ctx *c)
{
    return strcmp(c->node->op_type, "SoftmaxCrossEntropyLoss") == 0;
}

/* X as (N, C, D). */
typedef struct {
    int64_t N, C, D;
} loss_dims;

static loss_dims dims_of(const ai_tensor *x)
{
    loss_dims d = {x->shape[0], x->shape[1], 1};
    for (int i = 2; i < x->ndim; i++)
        d.D *= x->shape[i];
    return d;
}

static void add_d(ai_tensor *t, int64_t i, double v)
{
    if (t->dtype == AI_F32)
        ((float *)t->data)[i] += (float)v;
    else
        ((double *)t->data)[i] += v;
}

static int64_t target_at(const ai_tensor *t, int64_t i)
{
    return t->dtype == AI_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

static ai_status loss_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0], *t = c->in[1], *w = c->in[2];
    const char *xname = is_sce(c) ? "scores" : "input";
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(n, AI_ERR_TYPE, "%s is %s; float32 or float64 expected", xname,
                             ai_dtype_name(x->dtype));
    if (t->dtype != AI_I32 && t->dtype != AI_I64)
        return ai_node_error(n, AI_ERR_TYPE, "target is %s; int32 or int64 expected",
                             ai_dtype_name(t->dtype));
    if (x->ndim < 2)
        return ai_node_error(n, AI_ERR_VALUE, "%s has rank %d; (N, C, d1..dk) expected", xname,
                             x->ndim);
    bool match = t->ndim == x->ndim - 1 && t->shape[0] == x->shape[0];
    for (int i = 1; match && i < t->ndim; i++)
        match = t->shape[i] == x->shape[i + 1];
    if (!match)
        return ai_node_error(n, AI_ERR_VALUE,
                             "target's shape does not match %s's without its class axis 1",
                             xname);
    if (w && (w->dtype != x->dtype || w->ndim != 1 || w->shape[0] != x->shape[1]))
        return ai_node_error(n, AI_ERR_VALUE,
                             "weight must be a 1-D %s tensor of the %lld classes",
                             ai_dtype_name(x->dtype), (long long)x->shape[1]);
    const loss_params *p = n->params;
    out[0].dtype = x->dtype;
    out[0].ndim = p->reduction == LOSS_NONE ? t->ndim : 0;
    memcpy(out[0].shape, t->shape, sizeof out[0].shape);
    if (is_sce(c)) {
        if (c->n_out > 1) {
            out[1].dtype = x->dtype;
            out[1].ndim = x->ndim;
            memcpy(out[1].shape, x->shape, sizeof out[1].shape);
        } else { /* log_prob kept for backward */
            *state = (size_t)ai_tensor_numel(x) * ai_dtype_size(x->dtype);
        }
    }
    return AI_OK;
}

/* P: X itself, or the log_softmax SoftmaxCrossEntropyLoss's forward kept. */
static ai_tensor logp_of(const ai_ctx *c)
{
    if (!is_sce(c))
        return *c->in[0];
    if (c->n_out > 1)
        return *c->out[1];
    ai_tensor p = *c->in[0];
    p.data = c->state;
    return p;
}

/* P = log_softmax(X) along C, in double. */
static void log_softmax(ai_tensor *p, const ai_tensor *x, loss_dims d)
{
    for (int64_t n = 0; n < d.N; n++)
        for (int64_t j = 0; j < d.D; j++) {
            const int64_t base = n * d.C * d.D + j;
            double mx = -INFINITY, sum = 0;
            for (int64_t k = 0; k < d.C; k++) {
                const double v = ai_float_at(x, base + k * d.D);
                mx = v > mx || v != v ? v : mx;
            }
            for (int64_t k = 0; k < d.C; k++)
                sum += exp(ai_float_at(x, base + k * d.D) - mx);
            const double lse = mx + log(sum);
            for (int64_t k = 0; k < d.C; k++)
                ai_float_set(p, base + k * d.D, ai_float_at(x, base + k * d.D) - lse);
        }
}

/* The target t of position i and its weight W[t]; t = -1 and weight 0 when
 * the position is ignored. Errors name a target out of range. */
static ai_status weight_of(const ai_ctx *c, int64_t i, int64_t *t, double *w)
{
    const loss_params *p = c->node->params;
    *t = target_at(c->in[1], i);
    if (p->has_ignore && *t == p->ignore_index) {
        *t = -1;
        *w = 0;
        return AI_OK;
    }
    const int64_t C = c->in[0]->shape[1];
    if (*t < 0 || *t >= C)
        return ai_node_error(c->node, AI_ERR_INDEX,
                             "target %lld at flat position %lld is not a class in [0, %lld)",
                             (long long)*t, (long long)i, (long long)C);
    *w = c->in[2] ? ai_float_at(c->in[2], *t) : 1.0;
    return AI_OK;
}

/* The mean's divisor: the sum of W[t] over the positions not ignored. */
static ai_status mean_divisor(const ai_ctx *c, int64_t positions, double *den)
{
    *den = 0;
    for (int64_t i = 0; i < positions; i++) {
        int64_t t;
        double w;
        ai_status st = weight_of(c, i, &t, &w);
        if (st)
            return st;
        *den += w;
    }
    return AI_OK;
}

static ai_status loss_forward(ai_ctx *c)
{
    const loss_params *p = c->node->params;
    const loss_dims d = dims_of(c->in[0]);
    ai_tensor lp = logp_of(c);
    if (is_sce(c))
        log_softmax(&lp, c->in[0], d);
    double total = 0, den = 0;
    for (int64_t n = 0; n < d.N; n++)
        for (int64_t j = 0; j < d.D; j++) {
            const int64_t i = n * d.D + j;
            int64_t t;
            double w;
            ai_status st = weight_of(c, i, &t, &w);
            if (st)
                return st;
            const double l = t < 0 ? 0 : -w * ai_float_at(&lp, (n * d.C + t) * d.D + j);
            if (p->reduction == LOSS_NONE)
                ai_float_set(c->out[0], i, l);
            total += l;
            den += w;
        }
    if (p->reduction != LOSS_NONE)
        ai_float_set(c->out[0], 0, p->reduction == LOSS_SUM ? total : total / den);
    return AI_OK;
}

/* dX[n, t, d] += -W[t] g (NLL), dX += W[t] g (softmax - onehot(t)) (SCE), plus
 * SCE's log_prob gradient dP - softmax sum_C(dP); dW[t] += -(P[n, t, d] + m) g
 * (m: the mean loss, through the divisor; 0 for the other reductions); with
 * g = dloss[n, d] (none), dloss (sum) or dloss / divisor (mean). */
static ai_status loss_backward(ai_ctx *c)
{
    const loss_params *p = c->node->params;
    const loss_dims d = dims_of(c->in[0]);
    const ai_tensor lp = logp_of(c);
    ai_tensor *dx = c->din[0], *dw = c->din[2];
    const bool sce = is_sce(c);
    if (dx && c->din_assign[0])
        memset(dx->data, 0, ai_tensor_nbytes(dx));
    double scale = p->reduction == LOSS_NONE ? 0 : ai_float_at(c->dout[0], 0), mean = 0;
    if (p->reduction == LOSS_MEAN) {
        double den;
        ai_status st = mean_divisor(c, d.N * d.D, &den);
        if (st)
            return st;
        scale /= den;
        mean = ai_float_at(c->out[0], 0);
    }
    for (int64_t n = 0; n < d.N; n++)
        for (int64_t j = 0; j < d.D; j++) {
            const int64_t i = n * d.D + j, base = n * d.C * d.D + j;
            int64_t t;
            double w;
            ai_status st = weight_of(c, i, &t, &w);
            if (st)
                return st;
            const double g = p->reduction == LOSS_NONE ? ai_float_at(c->dout[0], i) : scale;
            if (dw && t >= 0)
                add_d(dw, t, -(ai_float_at(&lp, base + t * d.D) + mean) * g);
            if (!dx)
                continue;
            if (!sce) {
                if (t >= 0)
                    add_d(dx, base + t * d.D, -w * g);
                continue;
            }
            double dp_sum = 0; /* sum over C of log_prob's gradient */
            if (c->n_out > 1)
                for (int64_t k = 0; k < d.C; k++)
                    dp_sum += ai_float_at(c->dout[1], base + k * d.D);
            for (int64_t k = 0; k < d.C; k++) {
                const int64_t e = base + k * d.D;
                const double sm = exp(ai_float_at(&lp, e));
                double v = t < 0 ? 0 : w * g * (sm - (k == t));
                if (c->n_out > 1)
                    v += ai_float_at(c->dout[1], e) - sm * dp_sum;
                add_d(dx, e, v);
            }
        }
    return AI_OK;
}

static const ai_op_def op_nll = {"NegativeLogLikelihoodLoss", "", 2, 3, 1, 1,
                                 AI_OP_GRAD_ASSIGN(1), loss_init, loss_shape, loss_forward,
                                 loss_backward};
static const ai_op_def op_sce = {"SoftmaxCrossEntropyLoss", "", 2, 3, 1, 2, AI_OP_GRAD_ASSIGN(1),
                                 loss_init, loss_shape, loss_forward, loss_backward};

const ai_op_def *const ai_ops_loss[] = {&op_nll, &op_sce, NULL};
