/*
 * fused.c — the engine's fused operators (domain "aidge_interop"), written by
 * the recipes (recipes.c) and undone by expand_metaops (the fusions) and
 * restore_flatten (the Flatten):
 *
 *   FusedConv   Conv, then an activation, in one node
 *   FusedGemm   [Flatten,] Gemm, then an activation, in one node
 *
 * Attributes: those of the base operator, plus
 *   activation         "Relu", "Clip" or "" (none; the default)
 *   activation_params  floats (min, max) of Clip
 *   flatten_axis       FusedGemm: A of any rank is read as the 2-D
 *                      (prod(shape[:axis]), prod(shape[axis:])), like ONNX
 *                      Flatten; absent: A must be 2-D, as for Gemm
 *   x_blocked,         FusedConv, 0 or 1: X, Y in blocked channels (NCHWc8,
 *   y_blocked          kernels/conv.h; recipe block_channels): Y (N, ceil(M
 *                      / 8), H, W, 8); X (N, ceil(C / 8), H, W, 8) with
 *                      x_blocked, else NCHW. float32, 2-D, y_blocked
 *                      whenever x_blocked; no backward
 *   bn_epsilon         present: inputs 3..6 are an inference
 *                      BatchNormalization's scale, bias, mean and variance
 *                      (one value per output channel, axis 1), applied to
 *                      the base's output before the activation (recipe
 *                      batchnorm_epilogue); such a node has no backward
 *   activation_node, activation_input, flatten_node, flatten_output,
 *   bn_node, bn_input  names of the nodes and values the recipe removed
 *                      (strings; expand_metaops and restore_flatten give
 *                      them back)
 *
 * Each is a wrapper around its base operator's own shape, forward and
 * backward (same kernels, same numbers): forward runs the base into the
 * output and applies the activation in place; a Conv base applies the
 * BatchNorm epilogue and Relu itself as it writes each output plane
 * (ai_conv_epilogue, kernels/conv.h: bitwise the same as the pass). Backward is exact: Relu's
 * mask is read from the output (the gradient passes unless y <= 0: where x > 0
 * or is NaN, as torch's Relu and the engine's pass it); Clip's mask
 * (min <= x <= max, inclusive like torch.clamp and the engine's Clip) is
 * kept as one byte per element in the node's state, since the output
 * cannot tell x == min from x < min. The masked output gradient goes
 * to the base backward through the first part of the workspace.
 * The BatchNorm epilogue (y = y s + (bias - mean s) per channel, s = scale
 * / sqrt(var + eps) computed in double at every forward from the inputs'
 * current values) shares that pass with the activation; its per-channel
 * factors use the same first part of the workspace.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/conv.h"
#include "../kernels/simd.h"
#include "../parallel.h"
#include "spatial.h"

enum { ACT_NONE, ACT_RELU, ACT_CLIP };

typedef struct {
    const ai_op_def *base;
    int act;
    double lo, hi;
    int64_t flatten_axis; /* -1: none */
    bool bn;              /* inputs 3..6: a BatchNorm epilogue */
    bool conv;            /* the base is Conv (else Gemm) */
    bool xb, yb;          /* x_blocked, y_blocked */
    bool res;             /* residual: input 7 added before the activation */
    double eps;
} fused_info;

/* The registry's Conv or Gemm, looked up once (every forward reads the
 * node's attributes again: the registry's linear search by name was a
 * hundred string compares per node and call). */
static const ai_op_def *base_op(bool gemm)
{
    static _Atomic(const ai_op_def *) cache[2]; /* the table is constant: relaxed is enough */
    const ai_op_def *op = atomic_load_explicit(&cache[gemm], memory_order_relaxed);
    if (!op) {
        op = ai_op_find("", gemm ? "Gemm" : "Conv");
        atomic_store_explicit(&cache[gemm], op, memory_order_relaxed);
    }
    return op;
}

static ai_status fused_read(const ai_node *n, fused_info *f)
{
    const char *act;
    const double *params;
    int64_t n_params;
    bool gemm = strcmp(n->op_type, "FusedGemm") == 0;
    f->conv = !gemm;
    ai_status st;
    f->base = base_op(gemm);
    if ((st = ai_attr_string(n, "activation", "", &act)) ||
        (st = ai_attr_floats(n, "activation_params", &params, &n_params)) ||
        (st = ai_attr_int(n, "flatten_axis", -1, &f->flatten_axis)) ||
        (st = ai_attr_float(n, "bn_epsilon", 0, &f->eps)))
        return st;
    int64_t xb, yb, res;
    if ((st = ai_attr_int(n, "x_blocked", 0, &xb)) || (st = ai_attr_int(n, "y_blocked", 0, &yb)) ||
        (st = ai_attr_int(n, "residual", 0, &res)))
        return st;
    f->xb = xb != 0;
    f->yb = yb != 0;
    f->res = res != 0;
    if (f->res && (!f->yb || n->n_in != 8 || n->in[7] < 0))
        return ai_node_error(n, AI_ERR_VALUE, "residual: a FusedConv with y_blocked and the "
                             "residual as input 7 (inputs 3 to 6 the BatchNorm's or absent) "
                             "expected");
    if ((f->xb || f->yb) && gemm)
        return ai_node_error(n, AI_ERR_VALUE, "x_blocked and y_blocked are FusedConv's");
    if (f->xb && !f->yb)
        return ai_node_error(n, AI_ERR_VALUE, "x_blocked without y_blocked is not supported");
    f->bn = ai_node_attr(n, "bn_epsilon") != NULL;
    const int n_in = n->n_in - f->res; /* without the residual */
    if (f->bn && n_in != 7)
        return ai_node_error(n, AI_ERR_VALUE, "with bn_epsilon, 7 inputs expected (X, W, B "
                             "or '', scale, bias, mean, var), got %d", n_in);
    for (int k = 3; !f->bn && k < n_in; k++)
        if (k >= 3 + 4 * f->res || n->in[k] >= 0)
            return ai_node_error(n, AI_ERR_VALUE, "%d inputs: more than 3 only with bn_epsilon "
                                 "(or absent before a residual)", n->n_in);
    if (!act[0]) {
        f->act = ACT_NONE;
    } else if (!strcmp(act, "Relu")) {
        f->act = ACT_RELU;
    } else if (!strcmp(act, "Clip")) {
        f->act = ACT_CLIP;
        if (n_params != 2)
            return ai_node_error(n, AI_ERR_VALUE, "activation Clip needs activation_params "
                                 "(min, max), got %lld values", (long long)n_params);
        f->lo = params[0];
        f->hi = params[1];
    } else {
        return ai_node_error(n, AI_ERR_VALUE, "activation '%s'; 'Relu', 'Clip' or '' "
                             "expected", act);
    }
    if (f->res && f->act == ACT_CLIP)
        return ai_node_error(n, AI_ERR_VALUE, "residual: activation Relu or none expected");
    if (f->flatten_axis != -1 && (!gemm || f->flatten_axis < 0))
        return ai_node_error(n, AI_ERR_VALUE, "flatten_axis %lld: only FusedGemm takes one, "
                             ">= 0", (long long)f->flatten_axis);
    return AI_OK;
}

static ai_status fused_init(ai_node *n)
{
    fused_info f;
    ai_status st = fused_read(n, &f);
    return st ? st : f.base->init(n); /* the base operator's params */
}

/* *view = t read as 2-D at flatten_axis (t itself when there is no axis). */
static ai_status flat_view(const ai_node *n, const fused_info *f, const ai_tensor *t,
                           ai_tensor *view, const ai_tensor **out)
{
    *out = t;
    if (!t || f->flatten_axis < 0)
        return AI_OK;
    if (f->flatten_axis > t->ndim)
        return ai_node_error(n, AI_ERR_VALUE, "flatten_axis %lld is out of range for rank %d",
                             (long long)f->flatten_axis, t->ndim);
    int64_t rows = 1, cols = 1;
    for (int d = 0; d < t->ndim; d++)
        *(d < f->flatten_axis ? &rows : &cols) *= t->shape[d];
    *view = *t;
    view->ndim = 2;
    view->shape[0] = rows;
    view->shape[1] = cols;
    ai_contiguous_strides(2, view->shape, view->strides);
    *out = view;
    return AI_OK;
}

/* Bytes of a tensor, rounded up to the alignment. */
static size_t scratch_bytes(ai_dtype dtype, int ndim, const int64_t *shape)
{
    size_t n = ai_dtype_size(dtype);
    for (int d = 0; d < ndim; d++)
        n *= (size_t)shape[d];
    return (n + AI_ALIGN - 1) / AI_ALIGN * AI_ALIGN;
}

/* Bytes of the BatchNorm epilogue's factors as double (M scales, M shifts);
 * their float copy follows. */
static size_t bn_factor_bytes(int64_t M)
{
    return scratch_bytes(AI_F64, 1, (int64_t[]){2 * M});
}

/* Bytes of the workspace's head, before the base's: the masked output
 * gradient (the output's size), or the BatchNorm factors, whichever is
 * larger. */
static size_t head_bytes(const fused_info *f, ai_dtype dtype, int ndim, const int64_t *shape,
                         int64_t M)
{
    size_t head = scratch_bytes(dtype, ndim, shape);
    if (f->bn && M >= 0) {
        const size_t factors = bn_factor_bytes(M) + scratch_bytes(AI_F32, 1, (int64_t[]){2 * M});
        head = head > factors ? head : factors;
    }
    return head;
}

/* The output's channels (BatchNorm factors): a Conv's weight's first dim
 * (its output may be blocked), else the output's dim 1; -1 when none. */
static int64_t out_channels(const ai_ctx *c, const fused_info *f, int ndim, const int64_t *shape)
{
    if (f->conv && c->in[1] && c->in[1]->ndim >= 1)
        return c->in[1]->shape[0];
    return ndim >= 2 ? shape[1] : -1;
}

/* *view = blocked x (N, ceil(C / 8), H, W, 8) read as (N, C, H, W), C from
 * the weight and group. */
static ai_status unblocked_view(const ai_ctx *c, ai_tensor *view)
{
    const ai_tensor *x = c->in[0], *w = c->in[1];
    int64_t group;
    ai_status st = ai_attr_int(c->node, "group", 1, &group);
    if (st)
        return st;
    if (x->ndim != 5 || x->shape[4] != AI_CONV_BLOCK || w->ndim != 4)
        return ai_node_error(c->node, AI_ERR_VALUE, "x_blocked: a 2-D conv with X of shape "
                             "(N, ceil(C / 8), H, W, 8) expected, got rank %d", x->ndim);
    const int64_t C = w->shape[1] * group;
    if (x->shape[1] != (C + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK)
        return ai_node_error(c->node, AI_ERR_VALUE, "x_blocked: X has %lld channel blocks; "
                             "the weight's %lld channels make %lld", (long long)x->shape[1],
                             (long long)C, (long long)((C + 7) / 8));
    *view = *x;
    view->ndim = 4;
    view->shape[1] = C;
    ai_contiguous_strides(4, view->shape, view->strides);
    return AI_OK;
}

/* The context of the base operator: A flattened (x blocked: read as
 * NCHW), the workspace after the head (head_bytes). */
static ai_status base_ctx(const ai_ctx *c, const fused_info *f, ai_ctx *b, ai_tensor *views)
{
    const ai_tensor *v;
    *b = *c;
    b->n_in = c->n_in < 3 ? c->n_in : 3; /* the BatchNorm inputs are the epilogue's */
    ai_status st = f->xb ? unblocked_view(c, &views[0])
                         : flat_view(c->node, f, c->in[0], &views[0], &v);
    if (st)
        return st;
    if (f->xb)
        v = &views[0];
    b->in[0] = (ai_tensor *)v;
    if (c->din[0]) {
        flat_view(c->node, f, c->din[0], &views[1], &v);
        b->din[0] = (ai_tensor *)v;
    }
    if (c->out[0]) /* not in shape inference */
        b->workspace = (char *)c->workspace +
                       head_bytes(f, c->out[0]->dtype, c->out[0]->ndim, c->out[0]->shape,
                                  out_channels(c, f, c->out[0]->ndim, c->out[0]->shape));
    return AI_OK;
}

/* Blocked y: the base's (N, M, H, W) output meta made (N, ceil(M / 8), H,
 * W, 8); the workspace the blocked kernels need. */
static ai_status blocked_shape(const ai_ctx *b, const fused_info *f, ai_meta *out, size_t *ws)
{
    ai_conv_params p;
    ai_status st = ai_conv_params_of(b, &p);
    if (st)
        return st;
    if (out[0].dtype != AI_F32 || p.nsp != 2)
        return ai_node_error(b->node, AI_ERR_VALUE, "y_blocked: a float32 2-D conv "
                             "expected, got %s with %d spatial dims",
                             ai_dtype_name(out[0].dtype), p.nsp);
    *ws = ai_conv_blocked_workspace_bytes(&p, f->xb);
    out[0].ndim = 5;
    out[0].shape[1] = (p.M + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK;
    out[0].shape[4] = AI_CONV_BLOCK;
    return AI_OK;
}

static ai_status fused_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    fused_info f;
    ai_ctx b;
    ai_tensor views[2];
    ai_status st = fused_read(c->node, &f);
    if (st || (st = base_ctx(c, &f, &b, views)) || (st = f.base->shape(&b, out, ws, state)))
        return st;
    if (f.act != ACT_NONE && !ai_dtype_is_float(out[0].dtype))
        return ai_node_error(c->node, AI_ERR_TYPE, "the activation takes float outputs");
    const int64_t M = out_channels(c, &f, out[0].ndim, out[0].shape);
    if (f.yb && (st = blocked_shape(&b, &f, out, ws)))
        return st;
    if (f.res) {
        const ai_tensor *r = c->in[7];
        bool same = r->dtype == AI_F32 && r->ndim == out[0].ndim;
        for (int d = 0; same && d < r->ndim; d++)
            same = r->shape[d] == out[0].shape[d];
        if (!same)
            return ai_node_error(c->node, AI_ERR_VALUE, "the residual (input 7) must be float32 "
                                 "with the blocked output's shape (no broadcasting), got %s "
                                 "of rank %d", ai_dtype_name(r->dtype), r->ndim);
    }
    if (f.bn) {
        for (int k = 3; k < 7; k++)
            if (!c->in[k] || !ai_dtype_is_float(c->in[k]->dtype) ||
                ai_tensor_numel(c->in[k]) != M)
                return ai_node_error(c->node, AI_ERR_VALUE, "BatchNorm epilogue input %d: %lld "
                                     "float values expected (the output's channels)", k,
                                     (long long)M);
    }
    const size_t scratch = head_bytes(&f, out[0].dtype, out[0].ndim, out[0].shape, M);
    *ws += scratch; /* [masked output gradient or BN factors | the base's workspace] */
    if (f.act == ACT_CLIP)
        *state = scratch / ai_dtype_size(out[0].dtype); /* one byte per element */
    return AI_OK;
}

#define DEFINE_ACTIVATE(SUF, T)                                                         \
    AI_VECTOR_CLONES static void activate_##SUF(T *y, uint8_t *mask, int64_t i0,         \
                                                int64_t i1, int act, T lo, T hi)         \
    {                                                                                   \
        if (act == ACT_RELU) {                                                          \
            for (int64_t i = i0; i < i1; i++)                                           \
                y[i] = (y[i] > 0 || y[i] != y[i]) ? y[i] : 0; /* NaN passes */          \
            return;                                                                     \
        }                                                                               \
        for (int64_t i = i0; i < i1; i++) {                                             \
            T x = y[i], v = x < lo ? lo : x; /* NaN passes, like Clip */                \
            mask[i] = x >= lo && x <= hi;                                               \
            y[i] = v > hi ? hi : v;                                                     \
        }                                                                               \
    }                                                                                   \
    /* g = dy where the gradient passes, else 0 */                                      \
    static void mask_grad_##SUF(T *g, const T *dy, const T *y, const uint8_t *mask,      \
                                int64_t n, int act)                                     \
    {                                                                                   \
        for (int64_t i = 0; i < n; i++)                                                 \
            g[i] = (act == ACT_RELU ? !(y[i] <= 0) : mask[i] != 0) ? dy[i] : 0;         \
    }

/* y = y a[m] + b[m] over output elements [i0, i1), channel m of plane
 * i / S (M channels); ab holds a then b, as T (rounded once per forward). */
#define DEFINE_AFFINE(SUF, T)                                                           \
    AI_VECTOR_CLONES static void affine_##SUF(T *y, int64_t i0, int64_t i1, int64_t S,   \
                                              int64_t M, const T *ab)                   \
    {                                                                                   \
        int64_t plane = i0 / S, m = plane % M;                                          \
        for (int64_t i = i0; i < i1; plane++, m = m + 1 == M ? 0 : m + 1) {            \
            const int64_t end = (plane + 1) * S < i1 ? (plane + 1) * S : i1;            \
            const T a = ab[m], b = ab[M + m];                                           \
            for (; i < end; i++)                                                        \
                y[i] = y[i] * a + b;                                                    \
        }                                                                               \
    }

/* The same for S = 1 (a Gemm's (N, M) output): rows of M channels, the
 * factors a then b as T (2 M), vectorised along the row. */
#define DEFINE_AFFINE_ROWS(SUF, T)                                                      \
    AI_VECTOR_CLONES static void affine_rows_##SUF(T *y, int64_t i0, int64_t i1,         \
                                                   int64_t M, const T *ab)              \
    {                                                                                   \
        for (int64_t i = i0; i < i1;) {                                                 \
            const int64_t m0 = i % M, n = M - m0 < i1 - i ? M - m0 : i1 - i;            \
            T *yr = y + i;                                                              \
            const T *a = ab + m0, *b = ab + M + m0;                                     \
            for (int64_t k = 0; k < n; k++)                                             \
                yr[k] = yr[k] * a[k] + b[k];                                            \
            i += n;                                                                     \
        }                                                                               \
    }

DEFINE_ACTIVATE(f32, float)
DEFINE_ACTIVATE(f64, double)
DEFINE_AFFINE(f32, float)
DEFINE_AFFINE(f64, double)
DEFINE_AFFINE_ROWS(f32, float)
DEFINE_AFFINE_ROWS(f64, double)

typedef struct {
    ai_tensor *y;
    uint8_t *mask;
    const fused_info *f;
    const double *ab; /* BatchNorm epilogue factors, or NULL */
    float *abf;       /* the same rounded to float (float32 output) */
    int64_t S, M;     /* with ab: plane size and channels */
} activate_job;

/* The epilogue in place over output elements [lo, hi): the BatchNorm
 * factors, then the activation (one pass, on the pool). */
static void activate_range(void *ctx, int64_t lo, int64_t hi)
{
    const activate_job *j = ctx;
    const bool f32 = j->y->dtype == AI_F32;
    if (j->ab && j->S == 1 && f32)
        affine_rows_f32(j->y->data, lo, hi, j->M, j->abf);
    else if (j->ab && j->S == 1)
        affine_rows_f64(j->y->data, lo, hi, j->M, j->ab);
    else if (j->ab && f32)
        affine_f32(j->y->data, lo, hi, j->S, j->M, j->abf);
    else if (j->ab)
        affine_f64(j->y->data, lo, hi, j->S, j->M, j->ab);
    if (j->f->act == ACT_NONE)
        return;
    if (f32)
        activate_f32(j->y->data, j->mask, lo, hi, j->f->act, (float)j->f->lo, (float)j->f->hi);
    else
        activate_f64(j->y->data, j->mask, lo, hi, j->f->act, j->f->lo, j->f->hi);
}

/* Channel m of a BatchNorm input; `flat`: contiguous float32 or float64,
 * read directly (ai_tensor_get_flat divides per index). */
static double channel_value(const ai_tensor *t, bool flat, int64_t m)
{
    if (!flat)
        return ai_tensor_get_flat(t, m);
    return t->dtype == AI_F32 ? ((const float *)t->data)[m] : ((const double *)t->data)[m];
}

/* bn_factors on contiguous float32 inputs, a vector of channels at a time
 * (the same correctly rounded sqrt and division as the scalar loop: the
 * same values; one sqrt and division after another, they were 4% of
 * Anomaly's eval forward) */
AI_WIDE_CLONES static void bn_factors_f32(const float *scale, const float *bias,
                                          const float *mean, const float *var, double eps,
                                          int64_t M, double *ab)
{
    for (int64_t m = 0; m < M; m++) {
        const double a = (double)scale[m] / sqrt((double)var[m] + eps);
        ab[m] = a;
        ab[M + m] = (double)bias[m] - (double)mean[m] * a;
    }
}

/* The BatchNorm epilogue's factors into ab (2 M doubles): a = scale /
 * sqrt(var + eps), b = bias - mean a, from the inputs' current values; and
 * as float into abf when not NULL. */
static void bn_factors(const ai_ctx *c, double eps, int64_t M, double *ab, float *abf)
{
    bool flat[7], f32 = true;
    for (int k = 3; k < 7; k++) {
        flat[k] = ai_tensor_is_contiguous(c->in[k]) &&
                  (c->in[k]->dtype == AI_F32 || c->in[k]->dtype == AI_F64);
        f32 = f32 && flat[k] && c->in[k]->dtype == AI_F32;
    }
    if (f32)
        bn_factors_f32(c->in[3]->data, c->in[4]->data, c->in[5]->data, c->in[6]->data, eps, M,
                       ab);
    else
        for (int64_t m = 0; m < M; m++) {
            const double a = channel_value(c->in[3], flat[3], m) /
                             sqrt(channel_value(c->in[6], flat[6], m) + eps);
            ab[m] = a;
            ab[M + m] = channel_value(c->in[4], flat[4], m) -
                        channel_value(c->in[5], flat[5], m) * a;
        }
    for (int64_t i = 0; abf && i < 2 * M; i++)
        abf[i] = (float)ab[i];
}

typedef struct {
    const ai_conv_params *p;
    bool xb;
} conv_pack_arg;

/* a blocked conv's weights in its kernel's layout (packed.c keeps them) */
static void conv_pack(const void *arg, const float *w, float *wp)
{
    const conv_pack_arg *a = arg;
    ai_conv_blocked_pack(a->p, a->xb, w, wp);
}

static ai_status fused_forward(ai_ctx *c)
{
    fused_info f;
    ai_ctx b;
    ai_tensor views[2];
    ai_status st = fused_read(c->node, &f);
    if (st || (st = base_ctx(c, &f, &b, views)))
        return st;
    activate_job j = {c->out[0], c->state, &f, NULL, NULL, 1, 1};
    if (f.bn) {
        const ai_tensor *y = c->out[0];
        j.M = out_channels(c, &f, y->ndim, y->shape);
        for (int d = 2; d < y->ndim; d++)
            j.S *= y->shape[d];
        /* the masked gradient's part (no backward here), sized for them: the
         * base's workspace follows it */
        j.ab = c->workspace;
        if (y->dtype == AI_F32)
            j.abf = (float *)((char *)c->workspace + bn_factor_bytes(j.M));
        bn_factors(c, f.eps, j.M, c->workspace, j.abf);
    }
    /* a Conv applies the BatchNorm and Relu itself, plane by plane as it
     * writes them (in cache, the same arithmetic); Clip keeps its mask pass */
    const bool in_conv = f.conv && f.act != ACT_CLIP &&
                         (f.bn || f.act == ACT_RELU);
    ai_conv_epilogue ep = {j.abf ? (const void *)j.abf : (const void *)j.ab,
                           f.act == ACT_RELU};
    b.epilogue = in_conv ? &ep : NULL;
    if (f.yb) { /* the blocked kernels apply the epilogue as they store */
        ai_conv_params p;
        if ((st = ai_conv_params_of(&b, &p)))
            return st;
        const ai_tensor *bias = b.n_in > 2 ? b.in[2] : NULL;
        int layout;
        const int64_t size = ai_conv_blocked_packed_size(&p, f.xb, &layout);
        const conv_pack_arg a = {&p, f.xb};
        const int kind = layout == 2 ? AI_PACK_CONV_WINOGRAD : AI_PACK_CONV_TILES;
        const float *wp = size ? ai_packed_layout(c, 1, kind, p.M, p.C, size, conv_pack, &a)
                               : NULL; /* NULL: packed at the call */
        ai_conv_forward_blocked_f32(&p, c->out[0]->data, c->in[0]->data, b.in[1]->data, wp,
                                    bias ? bias->data : NULL, b.workspace, &ep, f.xb,
                                    f.res ? c->in[7]->data : NULL);
        j.ab = NULL; /* Clip alone is left, on the whole blocks (padding lanes too) */
        if (f.act == ACT_CLIP)
            ai_parallel_for(ai_tensor_numel(c->out[0]), AI_GRAIN_ELEMS, activate_range, &j);
        return AI_OK;
    }
    if ((st = f.base->forward(&b)))
        return st;
    if (!in_conv && (f.act != ACT_NONE || f.bn))
        ai_parallel_for(ai_tensor_numel(c->out[0]), AI_GRAIN_ELEMS, activate_range, &j);
    return AI_OK;
}

static ai_status fused_backward(ai_ctx *c)
{
    fused_info f;
    ai_ctx b;
    ai_tensor views[2], g;
    ai_status st = fused_read(c->node, &f);
    if (st || (st = base_ctx(c, &f, &b, views)))
        return st;
    if (f.yb)
        return ai_node_error(c->node, AI_ERR_VALUE, "blocked channels (y_blocked) are "
                             "inference-only: no backward");
    if (f.bn)
        return ai_node_error(c->node, AI_ERR_VALUE, "a BatchNorm epilogue (bn_epsilon) is "
                             "inference-only: no backward (expand_metaops gives the "
                             "BatchNormalization back)");
    if (f.act != ACT_NONE) {
        const int64_t n = ai_tensor_numel(c->out[0]);
        g = *c->dout[0];
        ai_contiguous_strides(g.ndim, g.shape, g.strides);
        g.data = c->workspace;
        if (n && c->out[0]->dtype == AI_F32)
            mask_grad_f32(g.data, c->dout[0]->data, c->out[0]->data, c->state, n, f.act);
        else if (n)
            mask_grad_f64(g.data, c->dout[0]->data, c->out[0]->data, c->state, n, f.act);
        b.dout[0] = &g;
    }
    return f.base->backward(&b);
}

static const ai_op_def op_fused_conv = {"FusedConv", "aidge_interop", 2, 8, 1, 1, 0,
                                        fused_init, fused_shape, fused_forward,
                                        fused_backward};
static const ai_op_def op_fused_gemm = {"FusedGemm", "aidge_interop", 2, 7, 1, 1, 0,
                                        fused_init, fused_shape, fused_forward,
                                        fused_backward};

const ai_op_def *const ai_ops_fused[] = {&op_fused_conv, &op_fused_gemm, NULL};
