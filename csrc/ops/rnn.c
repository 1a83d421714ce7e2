/*
 * rnn.c — the recurrent layers of ONNX: LSTM, GRU and RNN, float32 and
 * float64, a loop over time in C, forward and backward through time.
 *
 * Inputs X, W, R, B, sequence_lens, initial_h (and LSTM's initial_c, P);
 * outputs Y, Y_h (and LSTM's Y_c). Per direction (forward, reverse, or
 * both), the gates' input projection of every time step is one GEMM up
 * front (X W^T, plus the biases), then each step adds its recurrent
 * projection with one GEMM (H R^T; GRU: one for z and r, one for h) and
 * applies the gates row by row (rnn_impl.h). The backward runs the steps
 * in reverse, one GEMM per step for the state's gradient, then the
 * weights' gradients over every step at once (dW = dA^T X, dR = dA^T H).
 *
 * The ONNX attributes: direction, layout 0 (X (T, B, I)) or 1 (B, T, I),
 * hidden_size (or R's), activations with activation_alpha/beta (every
 * function ONNX lists; alpha and beta are consumed in order by the
 * functions that take them, the operator's default otherwise, as ONNX
 * Runtime does), clip (on the gates' pre-activations, not on LSTM's cell
 * before h), input_forget (LSTM: f = 1 - i), linear_before_reset (GRU).
 * sequence_lens: an entry's steps past its length leave its state as it
 * is and give zeros in Y; Y_h, Y_c are the states after its last step
 * (reverse: after step 0, the first step it runs being its last valid).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/fastmath.h"
#include "../kernels/gemm.h"
#include "../kernels/simd.h"

enum { CELL_RNN, CELL_GRU, CELL_LSTM };

typedef enum {
    ACT_SIGMOID, ACT_TANH, ACT_RELU, ACT_AFFINE, ACT_LEAKY_RELU, ACT_THRESHOLDED_RELU,
    ACT_SCALED_TANH, ACT_HARD_SIGMOID, ACT_ELU, ACT_SOFTSIGN, ACT_SOFTPLUS,
} act_kind;

typedef struct {
    act_kind kind;
    double alpha, beta;
} rnn_act;

/* name, whether it takes alpha and beta, and ONNX's defaults */
static const struct {
    const char *name;
    act_kind kind;
    bool has_alpha, has_beta;
    double alpha, beta;
} ACTIVATIONS[] = {
    {"Sigmoid", ACT_SIGMOID, false, false, 0, 0},
    {"Tanh", ACT_TANH, false, false, 0, 0},
    {"Relu", ACT_RELU, false, false, 0, 0},
    {"Affine", ACT_AFFINE, true, true, 1.0, 0.0},
    {"LeakyRelu", ACT_LEAKY_RELU, true, false, 0.01, 0},
    {"ThresholdedRelu", ACT_THRESHOLDED_RELU, true, false, 1.0, 0},
    {"ScaledTanh", ACT_SCALED_TANH, true, true, 1.0, 1.0},
    {"HardSigmoid", ACT_HARD_SIGMOID, true, true, 0.2, 0.5},
    {"Elu", ACT_ELU, true, false, 1.0, 0},
    {"Softsign", ACT_SOFTSIGN, false, false, 0, 0},
    {"Softplus", ACT_SOFTPLUS, false, false, 0, 0},
};

typedef struct {
    int cell, G, n_act;  /* gates, activations per direction (f, g, h) */
    int D;               /* directions */
    bool reverse;        /* direction "reverse" (bidirectional: the second) */
    int64_t hidden;      /* hidden_size, -1: from R */
    int layout;
    bool lbr, input_forget;
    double clip;         /* 0: none */
    rnn_act acts[2][3];
} rnn_params;

/* sizes of one run */
typedef struct {
    int64_t T, B, I, H, G, D;
    int layout;
} rnn_dims;

/* One direction's operands, already offset to direction d (w, r, bias, p
 * and the state; dw, dr, dbias, dp), or whole (x, h0, c0, y, yh, yc and
 * their gradients: the offsets below pick the direction). */
typedef struct {
    int d;
    bool reverse;
    const int64_t *len;
    const void *x, *w, *r, *bias, *h0, *c0, *p;
    void *A, *hs, *cs, *aux;
    void *y, *yh, *yc;
    const void *dy, *dyh, *dyc;
    void *dx, *dw, *dr, *dbias, *dh0, *dc0, *dp;
} rnn_dir;

/* element offset of direction d, entry b in initial_h, Y_h, ... */
static inline int64_t state_offset(const rnn_dims *s, int64_t d, int64_t b)
{
    return (s->layout ? b * s->D + d : d * s->B + b) * s->H;
}

/* element offset of (t, d, b) in Y: (T, D, B, H), layout 1 (B, T, D, H) */
static inline int64_t y_offset(const rnn_dims *s, int64_t t, int64_t d, int64_t b)
{
    return (s->layout ? (b * s->T + t) * s->D + d : (t * s->D + d) * s->B + b) * s->H;
}

#define REAL float
#define SFX(name) name##_f32
#define GEMM ai_gemm_f32
#define EXP ai_expf
#define TANH ai_tanhf
#include "rnn_impl.h"
#undef REAL
#undef SFX
#undef GEMM
#undef EXP
#undef TANH

#define REAL double
#define SFX(name) name##_f64
#define GEMM ai_gemm_f64
#define EXP exp
#define TANH tanh
#include "rnn_impl.h"
#undef REAL
#undef SFX
#undef GEMM
#undef EXP
#undef TANH

/* ---------------------------------------------------------------- attributes */

/* ONNX Runtime reads activation names case-insensitively */
static bool same_name(const char *a, const char *b)
{
    for (; *a && tolower((unsigned char)*a) == tolower((unsigned char)*b); a++, b++)
        ;
    return !*a && !*b;
}

static ai_status rnn_init_cell(ai_node *n, int cell)
{
    rnn_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    p->cell = cell;
    p->G = cell == CELL_LSTM ? 4 : cell == CELL_GRU ? 3 : 1;
    p->n_act = cell == CELL_LSTM ? 3 : cell == CELL_GRU ? 2 : 1;
    const char *dir, *acts;
    int64_t layout, lbr, input_forget;
    ai_status st;
    if ((st = ai_attr_string(n, "direction", "forward", &dir)) ||
        (st = ai_attr_int(n, "hidden_size", -1, &p->hidden)) ||
        (st = ai_attr_int(n, "layout", 0, &layout)) ||
        (st = ai_attr_int(n, "linear_before_reset", 0, &lbr)) ||
        (st = ai_attr_int(n, "input_forget", 0, &input_forget)) ||
        (st = ai_attr_float(n, "clip", 0, &p->clip)) ||
        (st = ai_attr_string(n, "activations", NULL, &acts)))
        return st;
    if (strcmp(dir, "forward") && strcmp(dir, "reverse") && strcmp(dir, "bidirectional"))
        return ai_node_error(n, AI_ERR_VALUE,
                             "direction '%s' is not forward, reverse or bidirectional", dir);
    p->D = strcmp(dir, "bidirectional") ? 1 : 2;
    p->reverse = strcmp(dir, "reverse") == 0;
    if (ai_node_attr(n, "hidden_size") && p->hidden < 1)
        return ai_node_error(n, AI_ERR_VALUE, "hidden_size %lld is not positive",
                             (long long)p->hidden);
    if (layout != 0 && layout != 1)
        return ai_node_error(n, AI_ERR_VALUE, "layout %lld is not 0 or 1", (long long)layout);
    p->layout = (int)layout;
    p->lbr = lbr != 0;
    p->input_forget = input_forget != 0;
    if (ai_node_attr(n, "clip") && !(p->clip > 0))
        return ai_node_error(n, AI_ERR_VALUE, "clip %g is not positive", p->clip);

    /* activations: "f,g,h" per direction (the importer joins ONNX's list) */
    static const char *const defaults[] = {"Sigmoid", "Tanh", "Tanh"};
    const double *alphas, *betas;
    int64_t n_alpha, n_beta, ia = 0, ib = 0;
    if ((st = ai_attr_floats(n, "activation_alpha", &alphas, &n_alpha)) ||
        (st = ai_attr_floats(n, "activation_beta", &betas, &n_beta)))
        return st;
    const char *cur = acts;
    const int total = p->D * p->n_act;
    for (int k = 0; k < total; k++) {
        char name[32] = "";
        if (!acts) { /* RNN's default is Tanh; LSTM's and GRU's begin with Sigmoid */
            strcpy(name, cell == CELL_RNN ? "Tanh" : defaults[k % p->n_act]);
        } else {
            if (!*cur)
                return ai_node_error(n, AI_ERR_VALUE,
                                     "activations '%s' names %d functions; %s with %d "
                                     "direction%s takes %d", acts, k, n->op_type, p->D,
                                     p->D > 1 ? "s" : "", total);
            const char *end = strchr(cur, ',');
            const size_t len = end ? (size_t)(end - cur) : strlen(cur);
            if (len >= sizeof name)
                return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "activation '%.*s' is not one "
                                     "of ONNX's recurrent activations", (int)len, cur);
            memcpy(name, cur, len);
            cur = end ? end + 1 : cur + len;
        }
        size_t a = 0;
        while (a < sizeof ACTIVATIONS / sizeof ACTIVATIONS[0] &&
               !same_name(ACTIVATIONS[a].name, name))
            a++;
        if (a == sizeof ACTIVATIONS / sizeof ACTIVATIONS[0])
            return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED,
                                 "activation '%s' is not one of ONNX's recurrent activations "
                                 "(Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, "
                                 "ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)", name);
        rnn_act *act = &p->acts[k / p->n_act][k % p->n_act];
        act->kind = ACTIVATIONS[a].kind;
        act->alpha = ACTIVATIONS[a].alpha;
        act->beta = ACTIVATIONS[a].beta;
        if (ACTIVATIONS[a].has_alpha && ia < n_alpha)
            act->alpha = alphas[ia++];
        if (ACTIVATIONS[a].has_beta && ib < n_beta)
            act->beta = betas[ib++];
    }
    if (acts && *cur)
        return ai_node_error(n, AI_ERR_VALUE, "activations '%s' names more than the %d "
                             "functions %s with %d direction%s takes", acts, total, n->op_type,
                             p->D, p->D > 1 ? "s" : "");
    return AI_OK;
}

static ai_status lstm_init(ai_node *n) { return rnn_init_cell(n, CELL_LSTM); }
static ai_status gru_init(ai_node *n) { return rnn_init_cell(n, CELL_GRU); }
static ai_status rnn_init(ai_node *n) { return rnn_init_cell(n, CELL_RNN); }

/* ---------------------------------------------------------------- shape */

enum { IN_X, IN_W, IN_R, IN_B, IN_LENS, IN_H0, IN_C0, IN_P };

static const ai_tensor *input(const ai_ctx *c, int k)
{
    return k < c->n_in ? c->in[k] : NULL;
}

static void dims_of(const ai_ctx *c, rnn_dims *s)
{
    const rnn_params *p = c->node->params;
    const ai_tensor *x = c->in[IN_X];
    s->layout = p->layout;
    s->T = x->shape[p->layout ? 1 : 0];
    s->B = x->shape[p->layout ? 0 : 1];
    s->I = x->shape[2];
    s->H = c->in[IN_R]->shape[2];
    s->G = p->G;
    s->D = p->D;
}

/* a * b * ..., saturating at SIZE_MAX (the plan then refuses it as over
 * its memory limit) */
static size_t sat_mul(size_t a, size_t b)
{
    return a && b > SIZE_MAX / a ? SIZE_MAX : a * b;
}

static size_t sat_add(size_t a, size_t b)
{
    return b > SIZE_MAX - a ? SIZE_MAX : a + b;
}

/* what one run keeps for its backward, in elements: A, hs, cs, aux */
static void state_parts(const rnn_params *p, const rnn_dims *s, size_t part[4])
{
    const size_t TB = sat_mul((size_t)s->T, (size_t)s->B), BH = sat_mul((size_t)s->B, (size_t)s->H);
    part[0] = sat_mul(sat_mul(TB, (size_t)(s->G * s->H)), (size_t)s->D);
    part[1] = sat_mul(sat_mul((size_t)s->T + 1, BH), (size_t)s->D);
    part[2] = p->cell == CELL_LSTM ? part[1] : 0;
    part[3] = p->cell == CELL_GRU ? sat_mul(sat_mul(TB, (size_t)s->H), (size_t)s->D) : 0;
}

/* scratch of one direction, in elements: forward, and backward (dA,
 * daux, four (B, H) blocks, one row's seven H) */
static size_t ws_elements(const rnn_params *p, const rnn_dims *s, bool backward)
{
    const size_t GH = (size_t)(s->G * s->H), H = (size_t)s->H;
    size_t fwd = GH > 5 * H ? GH : 5 * H;
    if (!backward)
        return fwd;
    const size_t TB = sat_mul((size_t)s->T, (size_t)s->B), BH = sat_mul((size_t)s->B, H);
    size_t n = sat_mul(TB, GH);
    if (p->cell == CELL_GRU && p->lbr)
        n = sat_add(n, sat_mul(TB, H));
    n = sat_add(sat_add(n, sat_mul(4, BH)), 7 * H);
    return n > fwd ? n : fwd;
}

static ai_status expect_shape(const ai_ctx *c, int k, const char *name, int ndim,
                              const int64_t *want)
{
    const ai_tensor *t = input(c, k);
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == want[i];
    if (ok)
        return AI_OK;
    char got[128] = "", wanted[128] = "";
    for (int i = 0; i < t->ndim; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                 (long long)t->shape[i]);
    for (int i = 0; i < ndim; i++)
        snprintf(wanted + strlen(wanted), sizeof wanted - strlen(wanted), "%s%lld", i ? ", " : "",
                 (long long)want[i]);
    return ai_node_error(c->node, AI_ERR_VALUE, "%s (input %d) has shape (%s), expected (%s)",
                         name, k, got, wanted);
}

static ai_status rnn_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    const rnn_params *p = c->node->params;
    const ai_tensor *x = c->in[IN_X], *w = c->in[IN_W], *r = c->in[IN_R];
    const ai_dtype dt = x->dtype;
    if (dt != AI_F32 && dt != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "X is %s; float32 or float64 expected",
                             ai_dtype_name(dt));
    static const char *const names[] = {"X", "W", "R", "B", "sequence_lens", "initial_h",
                                        "initial_c", "P"};
    for (int k = 1; k < c->n_in; k++)
        if (c->in[k] && k != IN_LENS && c->in[k]->dtype != dt)
            return ai_node_error(c->node, AI_ERR_TYPE, "%s (input %d) is %s, X is %s",
                                 names[k], k, ai_dtype_name(c->in[k]->dtype),
                                 ai_dtype_name(dt));
    if (x->ndim != 3 || w->ndim != 3 || r->ndim != 3)
        return ai_node_error(c->node, AI_ERR_VALUE, "X, W and R must be 3-D, got ranks %d, "
                             "%d and %d", x->ndim, w->ndim, r->ndim);
    if (p->hidden > 0 && r->shape[2] != p->hidden)
        return ai_node_error(c->node, AI_ERR_VALUE, "R has shape (%lld, %lld, %lld), expected "
                             "its last dimension to be hidden_size %lld", (long long)r->shape[0],
                             (long long)r->shape[1], (long long)r->shape[2],
                             (long long)p->hidden);
    rnn_dims s;
    dims_of(c, &s);
    if (s.H < 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "hidden size %lld (R's last dimension) "
                             "is not positive", (long long)s.H);
    const int64_t GH = s.G * s.H;
    ai_status st;
    const int64_t wd[3] = {s.D, GH, s.I}, rd[3] = {s.D, GH, s.H}, bd[2] = {s.D, 2 * GH};
    const int64_t hd[3] = {p->layout ? s.B : s.D, p->layout ? s.D : s.B, s.H};
    const int64_t ld[1] = {s.B}, pd[2] = {s.D, 3 * s.H};
    if ((st = expect_shape(c, IN_W, "W", 3, wd)) || (st = expect_shape(c, IN_R, "R", 3, rd)) ||
        (input(c, IN_B) && (st = expect_shape(c, IN_B, "B", 2, bd))) ||
        (input(c, IN_LENS) && (st = expect_shape(c, IN_LENS, "sequence_lens", 1, ld))) ||
        (input(c, IN_H0) && (st = expect_shape(c, IN_H0, "initial_h", 3, hd))) ||
        (input(c, IN_C0) && (st = expect_shape(c, IN_C0, "initial_c", 3, hd))) ||
        (input(c, IN_P) && (st = expect_shape(c, IN_P, "P", 2, pd))))
        return st;
    const ai_tensor *lens = input(c, IN_LENS);
    if (lens && lens->dtype != AI_I32 && lens->dtype != AI_I64)
        return ai_node_error(c->node, AI_ERR_TYPE, "sequence_lens is %s; int32 expected",
                             ai_dtype_name(lens->dtype));
    for (int k = 0; k < c->n_out; k++) {
        out[k].dtype = dt;
        out[k].ndim = 3;
        memcpy(out[k].shape, hd, sizeof hd);
    }
    out[0].ndim = 4;
    const int64_t yd[4] = {s.T, s.D, s.B, s.H}, yd1[4] = {s.B, s.T, s.D, s.H};
    memcpy(out[0].shape, p->layout ? yd1 : yd, sizeof yd);

    const size_t es = ai_dtype_size(dt);
    size_t part[4], total = 0;
    state_parts(p, &s, part);
    for (int k = 0; k < 4; k++)
        total = sat_add(total, sat_mul(part[k], es));
    *state = total;
    *ws = sat_add(sat_mul((size_t)s.B, sizeof(int64_t)),
                  sat_mul(ws_elements(p, &s, c->g->need_backward), es));
    return AI_OK;
}

/* ---------------------------------------------------------------- forward, backward */

/* sequence_lens into len (B entries), checked: 0 <= length <= T */
static ai_status read_lengths(const ai_ctx *c, const rnn_dims *s, int64_t *len)
{
    const ai_tensor *l = input(c, IN_LENS);
    for (int64_t b = 0; b < s->B; b++) {
        len[b] = !l ? s->T : l->dtype == AI_I32 ? ((const int32_t *)l->data)[b]
                                                 : ((const int64_t *)l->data)[b];
        if (len[b] < 0 || len[b] > s->T)
            return ai_node_error(c->node, AI_ERR_VALUE, "sequence_lens[%lld] = %lld is outside "
                                 "[0, %lld] (the sequence length)", (long long)b,
                                 (long long)len[b], (long long)s->T);
    }
    return AI_OK;
}

static const void *at(const ai_tensor *t, int64_t elems, size_t es)
{
    return t ? (const char *)t->data + (size_t)elems * es : NULL;
}

static void *at_mut(ai_tensor *t, int64_t elems, size_t es)
{
    return t ? (char *)t->data + (size_t)elems * es : NULL;
}

/* the direction d operands of this run; state from c->state */
static void dir_of(const ai_ctx *c, const rnn_dims *s, int d, const int64_t *len, rnn_dir *io)
{
    const rnn_params *p = c->node->params;
    const size_t es = ai_dtype_size(c->in[IN_X]->dtype);
    const int64_t GH = s->G * s->H;
    memset(io, 0, sizeof *io);
    io->d = d;
    io->reverse = p->reverse || d == 1;
    io->len = len;
    io->x = c->in[IN_X]->data;
    io->w = at(c->in[IN_W], d * GH * s->I, es);
    io->r = at(c->in[IN_R], d * GH * s->H, es);
    io->bias = at(input(c, IN_B), d * 2 * GH, es);
    io->h0 = at(input(c, IN_H0), 0, es);
    io->c0 = p->cell == CELL_LSTM ? at(input(c, IN_C0), 0, es) : NULL;
    io->p = p->cell == CELL_LSTM ? at(input(c, IN_P), d * 3 * s->H, es) : NULL;
    size_t part[4];
    state_parts(p, s, part);
    char *st = c->state;
    io->A = st + part[0] / (size_t)s->D * (size_t)d * es;
    st += part[0] * es;
    io->hs = st + part[1] / (size_t)s->D * (size_t)d * es;
    st += part[1] * es;
    io->cs = part[2] ? st + part[2] / (size_t)s->D * (size_t)d * es : NULL;
    st += part[2] * es;
    io->aux = part[3] ? st + part[3] / (size_t)s->D * (size_t)d * es : NULL;
}

static ai_status rnn_forward(ai_ctx *c)
{
    const rnn_params *p = c->node->params;
    rnn_dims s;
    dims_of(c, &s);
    int64_t *len = c->workspace;
    ai_status st = read_lengths(c, &s, len);
    if (st || s.B == 0) /* no entries: every output is empty */
        return st;
    void *ws = len + s.B;
    for (int d = 0; d < s.D; d++) {
        rnn_dir io;
        dir_of(c, &s, d, len, &io);
        io.y = c->out[0]->data;
        io.yh = c->n_out > 1 ? c->out[1]->data : NULL;
        io.yc = p->cell == CELL_LSTM && c->n_out > 2 ? c->out[2]->data : NULL;
        if (c->in[IN_X]->dtype == AI_F32)
            rnn_forward_dir_f32(p, &s, &io, ws);
        else
            rnn_forward_dir_f64(p, &s, &io, ws);
    }
    return AI_OK;
}

static ai_status rnn_backward(ai_ctx *c)
{
    const rnn_params *p = c->node->params;
    rnn_dims s;
    dims_of(c, &s);
    int64_t *len = c->workspace;
    ai_status st = read_lengths(c, &s, len);
    if (st || s.B == 0) /* no entries: no gradient to add */
        return st;
    void *ws = len + s.B;
    const size_t es = ai_dtype_size(c->in[IN_X]->dtype);
    const int64_t GH = s.G * s.H;
    ai_tensor *const *din = c->din;
    for (int d = 0; d < s.D; d++) {
        rnn_dir io;
        dir_of(c, &s, d, len, &io);
        io.dy = c->dout[0]->data;
        io.dyh = c->n_out > 1 ? c->dout[1]->data : NULL;
        io.dyc = p->cell == CELL_LSTM && c->n_out > 2 ? c->dout[2]->data : NULL;
        io.dx = at_mut(din[IN_X], 0, es);
        io.dw = at_mut(din[IN_W], d * GH * s.I, es);
        io.dr = at_mut(din[IN_R], d * GH * s.H, es);
        io.dbias = c->n_in > IN_B ? at_mut(din[IN_B], d * 2 * GH, es) : NULL;
        io.dh0 = c->n_in > IN_H0 ? at_mut(din[IN_H0], 0, es) : NULL;
        if (p->cell == CELL_LSTM) {
            io.dc0 = c->n_in > IN_C0 ? at_mut(din[IN_C0], 0, es) : NULL;
            io.dp = c->n_in > IN_P ? at_mut(din[IN_P], d * 3 * s.H, es) : NULL;
        }
        if (c->in[IN_X]->dtype == AI_F32)
            rnn_backward_dir_f32(p, &s, &io, ws);
        else
            rnn_backward_dir_f64(p, &s, &io, ws);
    }
    return AI_OK;
}

/* backward reads the inputs and its state, not the outputs */
static const ai_op_def op_lstm = {"LSTM", "", 3, 8, 1, 3, AI_OP_BWD_NO_Y,
                                  lstm_init, rnn_shape, rnn_forward, rnn_backward};
static const ai_op_def op_gru = {"GRU", "", 3, 6, 1, 2, AI_OP_BWD_NO_Y,
                                 gru_init, rnn_shape, rnn_forward, rnn_backward};
static const ai_op_def op_rnn = {"RNN", "", 3, 6, 1, 2, AI_OP_BWD_NO_Y,
                                 rnn_init, rnn_shape, rnn_forward, rnn_backward};

const ai_op_def *const ai_ops_rnn[] = {&op_lstm, &op_gru, &op_rnn, NULL};
