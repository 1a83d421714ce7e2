/*
 * training.c — the optimizers of ONNX's `ai.onnx.preview.training` domain:
 * Adagrad, Adam and Momentum. Each is one update step computed as a plain
 * forward ("inference-style": the graph gives the gradients as inputs),
 * with ONNX's reference formulas, in double.
 *
 * Inputs: R (learning rate, scalar), T (update count, int64 scalar), then n
 * tensors X, their n gradients G and their n optimizer states of each kind
 * (Adagrad: H; Momentum: V; Adam: V, H). Outputs: the n new X, then the
 * new states, kind by kind. No gradient flows through an update.
 */
#include <math.h>
#include <string.h>

#include "movement.h"

typedef enum { OPT_ADAGRAD, OPT_MOMENTUM, OPT_ADAM } opt_kind;

typedef struct {
    opt_kind kind;
    int states;      /* state tensors per X */
    int n;           /* number of X */
    double norm, eps, decay, alpha, beta, norm_post;
    bool nesterov;
} opt_args;

static ai_status opt_setup(const ai_ctx *c, opt_kind kind, opt_args *a)
{
    const ai_node *nd = c->node;
    ai_status st = AI_OK;
    a->kind = kind;
    a->states = kind == OPT_ADAM ? 2 : 1;
    const int per = 2 + a->states;
    a->n = (c->n_in - 2) / per;
    if (a->n < 1 || c->n_in != 2 + per * a->n || c->n_out != (1 + a->states) * a->n)
        return ai_node_error(nd, AI_ERR_VALUE, "%d inputs and %d outputs; R, T and %d "
                             "inputs and %d outputs per optimized tensor expected", c->n_in,
                             c->n_out, per, 1 + a->states);
    if (kind == OPT_MOMENTUM) {
        const char *mode;
        const char *req[3] = {"alpha", "beta", "norm_coefficient"};
        for (int i = 0; i < 3; i++)
            if (!ai_node_attr(nd, req[i]))
                return ai_node_error(nd, AI_ERR_VALUE, "attribute %s is required", req[i]);
        if ((st = ai_attr_float(nd, "alpha", 0, &a->alpha)) ||
            (st = ai_attr_float(nd, "beta", 0, &a->beta)) ||
            (st = ai_attr_float(nd, "norm_coefficient", 0, &a->norm)) ||
            (st = ai_attr_string(nd, "mode", "", &mode)))
            return st;
        if (strcmp(mode, "standard") && strcmp(mode, "nesterov"))
            return ai_node_error(nd, AI_ERR_VALUE, "mode is '%s'; standard or nesterov "
                                 "expected", mode);
        a->nesterov = mode[0] == 'n';
    } else if ((st = ai_attr_float(nd, "norm_coefficient", 0, &a->norm)) ||
               (st = ai_attr_float(nd, "epsilon", 1e-6, &a->eps)) ||
               (st = ai_attr_float(nd, "decay_factor", 0, &a->decay)) ||
               (st = ai_attr_float(nd, "alpha", 0.9, &a->alpha)) ||
               (st = ai_attr_float(nd, "beta", 0.999, &a->beta)) ||
               (st = ai_attr_float(nd, "norm_coefficient_post", 0, &a->norm_post))) {
        return st;
    }
    const ai_tensor *r = c->in[0], *t = c->in[1];
    if (!ai_dtype_is_float(r->dtype) || ai_tensor_numel(r) != 1 || t->dtype != AI_I64 ||
        ai_tensor_numel(t) != 1)
        return ai_node_error(nd, AI_ERR_VALUE, "R must be one float and T one int64");
    for (int i = 0; i < a->n; i++) {
        const ai_tensor *x = c->in[2 + i];
        if (x->dtype != AI_F32 && x->dtype != AI_F64)
            return ai_node_error(nd, AI_ERR_TYPE, "X %d is %s; float32 or float64 expected",
                                 i, ai_dtype_name(x->dtype));
        for (int k = 1; k < per; k++) {
            const ai_tensor *o = c->in[2 + k * a->n + i];
            bool same = o->dtype == x->dtype && o->ndim == x->ndim;
            for (int d = 0; same && d < x->ndim; d++)
                same = o->shape[d] == x->shape[d];
            if (!same)
                return ai_node_error(nd, AI_ERR_VALUE, "input %d must have the dtype and "
                                     "shape of X %d", 2 + k * a->n + i, i);
        }
    }
    return AI_OK;
}

static ai_status opt_shape_of(ai_ctx *c, opt_kind kind, ai_meta *out)
{
    opt_args a = {0};
    ai_status st = opt_setup(c, kind, &a);
    for (int j = 0; !st && j < c->n_out; j++) {
        const ai_tensor *x = c->in[2 + j % a.n];
        ai_set_meta(&out[j], x->dtype, x->ndim, x->shape);
    }
    return st;
}

/* One step for element e of tensor i. */
static void opt_step(const ai_ctx *c, const opt_args *a, double r, int64_t t, int i, int64_t e)
{
    const int n = a->n;
    const double x = ai_float_at(c->in[2 + i], e);
    const double g = a->norm * x + ai_float_at(c->in[2 + n + i], e);
    const double s1 = ai_float_at(c->in[2 + 2 * n + i], e);
    switch (a->kind) {
    case OPT_ADAGRAD: {
        const double h = s1 + g * g;
        ai_float_set(c->out[i], e, x - r / (1 + (double)t * a->decay) * g / (sqrt(h) + a->eps));
        ai_float_set(c->out[n + i], e, h);
        break;
    }
    case OPT_MOMENTUM: {
        const double v = a->alpha * s1 + (t > 0 ? a->beta : 1) * g;
        ai_float_set(c->out[i], e, x - r * (a->nesterov ? g + a->alpha * v : v));
        ai_float_set(c->out[n + i], e, v);
        break;
    }
    case OPT_ADAM: {
        const double h0 = ai_float_at(c->in[2 + 3 * n + i], e);
        const double v = a->alpha * s1 + (1 - a->alpha) * g;
        const double h = a->beta * h0 + (1 - a->beta) * g * g;
        const double ra = t > 0 ? r * sqrt(1 - pow(a->beta, (double)t)) /
                                      (1 - pow(a->alpha, (double)t))
                                : r;
        ai_float_set(c->out[i], e, (1 - a->norm_post) * (x - ra * (v / (sqrt(h) + a->eps))));
        ai_float_set(c->out[n + i], e, v);
        ai_float_set(c->out[2 * n + i], e, h);
        break;
    }
    }
}

static ai_status opt_forward_of(ai_ctx *c, opt_kind kind)
{
    opt_args a = {0};
    ai_status st = opt_setup(c, kind, &a);
    if (st)
        return st;
    const double r = ai_tensor_get_flat(c->in[0], 0);
    const int64_t t = ai_tensor_get_flat_i64(c->in[1], 0);
    for (int i = 0; i < a.n; i++)
        for (int64_t e = 0; e < ai_tensor_numel(c->in[2 + i]); e++)
            opt_step(c, &a, r, t, i, e);
    return AI_OK;
}

#define OPTIMIZER(VAR, NAME, KIND, MIN_IN, MAX_IN, MAX_OUT)                                 \
    static ai_status VAR##_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)      \
    {                                                                                     \
        (void)ws;                                                                         \
        (void)state;                                                                      \
        return opt_shape_of(c, KIND, out);                                                \
    }                                                                                     \
    static ai_status VAR##_forward(ai_ctx *c)                                             \
    {                                                                                     \
        return opt_forward_of(c, KIND);                                                   \
    }                                                                                     \
    static const ai_op_def VAR = {NAME, "ai.onnx.preview.training", MIN_IN, MAX_IN,      \
                                  MIN_IN - 3, MAX_OUT, 0, NULL, VAR##_shape,            \
                                  VAR##_forward, NULL};

/* at most AI_MAX_IO inputs: 4 tensors for Adagrad and Momentum, 3 for Adam */
OPTIMIZER(op_adagrad, "Adagrad", OPT_ADAGRAD, 5, 14, 8)
OPTIMIZER(op_momentum, "Momentum", OPT_MOMENTUM, 5, 14, 8)
OPTIMIZER(op_adam, "Adam", OPT_ADAM, 6, 14, 9)

const ai_op_def *const ai_ops_training[] = {&op_adagrad, &op_momentum, &op_adam, NULL};
