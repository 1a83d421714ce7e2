/*
 * resize.c — Resize (opset >= 11): nearest and linear interpolation over any
 * axes, forward and backward; what torch's nn.Upsample and F.interpolate
 * export (nearest, bilinear, trilinear, linear; align_corners or not).
 *
 * The output size is the `sizes` input, or floor(input * scale) with the
 * `scales` input (one of them, a constant at plan time; `axes` picks the
 * dims they describe, the others keep their size). Each output coordinate x
 * maps to x_in in the input by coordinate_transformation_mode, with the
 * scale given (scales) or out / in (sizes):
 *
 *   half_pixel            (x + 0.5) / scale - 0.5
 *   pytorch_half_pixel    the same, 0 where the output dim is 1
 *   align_corners         x (in - 1) / (out - 1), 0 where out is 1
 *   asymmetric            x / scale
 *   half_pixel_symmetric  half_pixel around the centre of the input
 *
 * Nearest takes input index nearest_mode(x_in) (round_prefer_floor,
 * round_prefer_ceil, floor, ceil) clamped to [0, in - 1]. Linear clamps x_in
 * to [0, in - 1] and mixes i0 = floor(x_in) and i0 + 1 with weights 1 - l,
 * l (l = x_in - i0; at the edge both are in - 1): ONNX's edge padding gives
 * the same values, torch's kernels the same formula. Several axes nest as
 * torch does: h0 (w0 a + w1 b) + h1 (w0 c + w1 d).
 *
 * Backward scatters dy with the same weights (each output element adds to
 * the input elements it read). Work splits by the outer dims the resize
 * leaves alone (N, C planes): the planes are disjoint, the sums in the same
 * order at any thread count. With sizes, keep_aspect_ratio_policy not_larger
 * or not_smaller takes one scale for all axes (the smallest or largest of
 * sizes / input). cubic, tf_crop_and_resize and antialias are refused,
 * naming the value.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../parallel.h"

enum { M_NEAREST, M_LINEAR };
enum { C_HALF_PIXEL, C_PYTORCH_HALF_PIXEL, C_ALIGN_CORNERS, C_ASYMMETRIC, C_HALF_SYMMETRIC };
enum { N_ROUND_FLOOR, N_ROUND_CEIL, N_FLOOR, N_CEIL };

enum { P_STRETCH, P_NOT_LARGER, P_NOT_SMALLER };

typedef struct {
    int mode, coord, nearest, policy;
} resize_params;

static ai_status pick(const ai_node *n, const char *attr, const char *dflt,
                      const char *const *names, int count, int *out)
{
    const char *s;
    ai_status st = ai_attr_string(n, attr, dflt, &s);
    if (st)
        return st;
    for (int k = 0; k < count; k++)
        if (strcmp(s, names[k]) == 0) {
            *out = k;
            return AI_OK;
        }
    return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "%s '%s' is not supported", attr, s);
}

static ai_status resize_init(ai_node *n)
{
    static const char *const modes[] = {"nearest", "linear"};
    static const char *const coords[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                         "asymmetric", "half_pixel_symmetric"};
    static const char *const nearests[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                           "ceil"};
    static const char *const policies[] = {"stretch", "not_larger", "not_smaller"};
    resize_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    if (n->opset < 11)
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED,
                             "Resize of opset %d is not supported (11 and later)", n->opset);
    int64_t antialias;
    ai_status st;
    if ((st = pick(n, "mode", "nearest", modes, 2, &p->mode)) ||
        (st = pick(n, "coordinate_transformation_mode", "half_pixel", coords, 5, &p->coord)) ||
        (st = pick(n, "nearest_mode", "round_prefer_floor", nearests, 4, &p->nearest)) ||
        (st = pick(n, "keep_aspect_ratio_policy", "stretch", policies, 3, &p->policy)) ||
        (st = ai_attr_int(n, "antialias", 0, &antialias)))
        return st;
    if (antialias)
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "antialias=1 is not supported");
    return AI_OK;
}

/* The output shape and each dim's scale, from the constant scales or sizes. */
typedef struct {
    int nd;
    int64_t in[AI_MAX_DIMS], out[AI_MAX_DIMS];
    double scale[AI_MAX_DIMS];
} resize_plan;

static ai_status resize_plan_of(const ai_ctx *c, resize_plan *rp)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0];
    const ai_tensor *sc = c->n_in > 2 && c->in[2] && ai_tensor_numel(c->in[2]) ? c->in[2] : NULL;
    const ai_tensor *sz = c->n_in > 3 && c->in[3] && ai_tensor_numel(c->in[3]) ? c->in[3] : NULL;
    if (!sc == !sz)
        return ai_node_error(n, AI_ERR_VALUE, sc ? "both scales and sizes are given"
                                                 : "neither scales nor sizes is given");
    const int which = sc ? 2 : 3;
    const ai_tensor *t = ai_ctx_const(c, which); /* at plan time; at run time the input */
    if (!t && !(t = c->in[which]->data ? c->in[which] : NULL))
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "%s input must be a constant",
                             sc ? "scales" : "sizes");
    rp->nd = x->ndim;
    int axes[AI_MAX_DIMS];
    const int64_t *av;
    int64_t na;
    ai_status st = ai_attr_ints(n, "axes", &av, &na);
    if (st)
        return st;
    if (na < 0) {
        na = x->ndim;
        for (int d = 0; d < x->ndim; d++)
            axes[d] = d;
    } else {
        if (na > x->ndim)
            return ai_node_error(n, AI_ERR_VALUE, "axes has %lld values for rank %d",
                                 (long long)na, x->ndim);
        for (int64_t i = 0; i < na; i++)
            if ((st = ai_norm_axis(n, av[i], x->ndim, &axes[i])))
                return st;
    }
    if (ai_tensor_numel(t) != na)
        return ai_node_error(n, AI_ERR_VALUE, "%s has %lld values; %lld expected (%s)",
                             sc ? "scales" : "sizes", (long long)ai_tensor_numel(t),
                             (long long)na, na == x->ndim ? "the rank" : "one per axis");
    for (int d = 0; d < x->ndim; d++) {
        rp->in[d] = rp->out[d] = x->shape[d];
        rp->scale[d] = 1.0;
    }
    for (int64_t i = 0; i < na; i++) {
        const int d = axes[i];
        if (sc) {
            const double s = ai_tensor_get_flat(t, i);
            if (!(s > 0) || !isfinite(s))
                return ai_node_error(n, AI_ERR_VALUE, "scales[%lld] is %g; > 0 expected",
                                     (long long)i, s);
            rp->scale[d] = s;
            const double o = floor((double)x->shape[d] * s);
            if (o > (double)INT32_MAX)
                return ai_node_error(n, AI_ERR_VALUE, "scales[%lld] = %g gives %g elements",
                                     (long long)i, s, o);
            rp->out[d] = (int64_t)o;
        } else {
            const int64_t o = ai_tensor_get_flat_i64(t, i);
            if (o < 0)
                return ai_node_error(n, AI_ERR_VALUE, "sizes[%lld] is %lld", (long long)i,
                                     (long long)o);
            rp->out[d] = o;
            rp->scale[d] = x->shape[d] ? (double)o / (double)x->shape[d] : 1.0;
        }
        if (rp->out[d] > 0 && x->shape[d] == 0)
            return ai_node_error(n, AI_ERR_VALUE, "input dim %d is 0; cannot resize it to %lld",
                                 d, (long long)rp->out[d]);
    }
    const int policy = ((const resize_params *)n->params)->policy;
    if (sz && policy != P_STRETCH) {
        /* one scale for every axis, the smallest (not_larger) or largest
         * (not_smaller) of sizes / input; each size round(scale * input) */
        double s = rp->scale[axes[0]];
        for (int64_t i = 1; i < na; i++)
            s = policy == P_NOT_LARGER ? fmin(s, rp->scale[axes[i]]) : fmax(s, rp->scale[axes[i]]);
        for (int64_t i = 0; i < na; i++) {
            rp->scale[axes[i]] = s;
            rp->out[axes[i]] = (int64_t)floor(s * (double)x->shape[axes[i]] + 0.5);
        }
    }
    return AI_OK;
}

/* One dim's table: for each output index, input indices i0, i1 and weights
 * w0, w1 (nearest: w1 = 0, i1 = i0). */
typedef struct {
    int64_t i0, i1;
    double w0, w1;
} resize_tap;

static double source_coord(const resize_params *p, double x, double scale, int64_t in,
                           int64_t out)
{
    switch (p->coord) {
    case C_PYTORCH_HALF_PIXEL:
        return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case C_ALIGN_CORNERS:
        return out > 1 ? x * (double)(in - 1) / (double)(out - 1) : 0.0;
    case C_ASYMMETRIC:
        return x / scale;
    case C_HALF_SYMMETRIC: {
        const double adj = (double)out / (scale * (double)in), centre = (double)in / 2;
        return centre * (1 - adj) + (x + 0.5) / scale - 0.5;
    }
    default:
        return (x + 0.5) / scale - 0.5;
    }
}

static int64_t nearest_index(int mode, double v)
{
    const double f = floor(v);
    switch (mode) {
    case N_FLOOR: return (int64_t)f;
    case N_CEIL: return (int64_t)ceil(v);
    case N_ROUND_CEIL: return (int64_t)(v - f >= 0.5 ? f + 1 : f);
    default: return (int64_t)(v - f > 0.5 ? f + 1 : f);
    }
}

static void make_taps(const resize_params *p, const resize_plan *rp, int d, resize_tap *tap)
{
    const int64_t in = rp->in[d], out = rp->out[d];
    for (int64_t o = 0; o < out; o++) {
        double v = source_coord(p, (double)o, rp->scale[d], in, out);
        resize_tap t;
        if (p->mode == M_NEAREST) {
            int64_t i = nearest_index(p->nearest, v);
            i = i < 0 ? 0 : (i > in - 1 ? in - 1 : i);
            t = (resize_tap){i, i, 1.0, 0.0};
        } else {
            v = v < 0 ? 0 : (v > (double)(in - 1) ? (double)(in - 1) : v);
            const int64_t i0 = (int64_t)v;
            const double l = v - (double)i0;
            t = (resize_tap){i0, i0 < in - 1 ? i0 + 1 : i0, 1.0 - l, l};
        }
        tap[o] = t;
    }
}

/* The dims a resize touches: first..nd-1 (the outer ones keep size and map
 * to themselves), with their taps in the node state. */
typedef struct {
    const resize_plan *rp;
    const resize_tap *tap[AI_MAX_DIMS];
    int64_t xstride[AI_MAX_DIMS]; /* the input's contiguous strides */
    int first;
    bool nearest, f64, assign;
    int64_t in_block, out_block; /* elements per outer index */
    const void *src;             /* forward: x; backward: dy */
    void *dst;                   /* forward: y; backward: dx */
} resize_job;

/* Forward: the value at output multi-index (from dim d on) of one outer block. */
#define DEFINE_RESIZE_KERNELS(SUF, T)                                                      \
    static T gather_##SUF(const resize_job *j, const T *x, int d, const int64_t *oi,       \
                          int64_t off)                                                     \
    {                                                                                      \
        const resize_tap *t = &j->tap[d][oi[d]];                                           \
        const int64_t stride = j->xstride[d];                                              \
        if (d == j->rp->nd - 1) {                                                          \
            if (j->nearest)                                                                \
                return x[off + t->i0];                                                     \
            return (T)t->w0 * x[off + t->i0] + (T)t->w1 * x[off + t->i1];                  \
        }                                                                                  \
        const T a = gather_##SUF(j, x, d + 1, oi, off + t->i0 * stride);                   \
        if (j->nearest)                                                                    \
            return a;                                                                      \
        const T b = gather_##SUF(j, x, d + 1, oi, off + t->i1 * stride);                   \
        return (T)t->w0 * a + (T)t->w1 * b;                                                \
    }                                                                                      \
    static void scatter_##SUF(const resize_job *j, T *dx, int d, const int64_t *oi,        \
                              int64_t off, T g)                                            \
    {                                                                                      \
        const resize_tap *t = &j->tap[d][oi[d]];                                           \
        const int64_t stride = j->xstride[d];                                              \
        if (j->nearest) {                                                                  \
            if (d == j->rp->nd - 1)                                                        \
                dx[off + t->i0] += g;                                                      \
            else                                                                           \
                scatter_##SUF(j, dx, d + 1, oi, off + t->i0 * stride, g);                  \
            return;                                                                        \
        }                                                                                  \
        if (d == j->rp->nd - 1) {                                                          \
            dx[off + t->i0] += (T)t->w0 * g;                                               \
            dx[off + t->i1] += (T)t->w1 * g;                                               \
            return;                                                                        \
        }                                                                                  \
        scatter_##SUF(j, dx, d + 1, oi, off + t->i0 * stride, (T)t->w0 * g);               \
        scatter_##SUF(j, dx, d + 1, oi, off + t->i1 * stride, (T)t->w1 * g);               \
    }                                                                                      \
    static void run_##SUF(const resize_job *j, bool backward, int64_t b)                   \
    {                                                                                      \
        const T *src = (const T *)j->src + b * (backward ? j->out_block : j->in_block);    \
        T *dst = (T *)j->dst + b * (backward ? j->in_block : j->out_block);                \
        if (backward && j->assign)                                                         \
            memset(dst, 0, (size_t)j->in_block * sizeof(T));                               \
        int64_t oi[AI_MAX_DIMS] = {0};                                                     \
        const int last = j->rp->nd - 1;                                                    \
        for (int64_t o = 0; o < j->out_block; o++) {                                       \
            if (backward)                                                                  \
                scatter_##SUF(j, dst, j->first, oi, 0, src[o]);                            \
            else                                                                           \
                dst[o] = gather_##SUF(j, src, j->first, oi, 0);                            \
            for (int d = last; d >= j->first; d--) {                                       \
                if (++oi[d] < j->rp->out[d])                                               \
                    break;                                                                 \
                oi[d] = 0;                                                                 \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_RESIZE_KERNELS(f32, float)
DEFINE_RESIZE_KERNELS(f64, double)

static void resize_fwd_range(void *ctx, int64_t lo, int64_t hi)
{
    const resize_job *j = ctx;
    for (int64_t b = lo; b < hi; b++)
        j->f64 ? run_f64(j, false, b) : run_f32(j, false, b);
}

static void resize_bwd_range(void *ctx, int64_t lo, int64_t hi)
{
    const resize_job *j = ctx;
    for (int64_t b = lo; b < hi; b++)
        j->f64 ? run_f64(j, true, b) : run_f32(j, true, b);
}

static size_t taps_bytes(const resize_plan *rp)
{
    size_t n = 0;
    for (int d = 0; d < rp->nd; d++)
        n += (size_t)rp->out[d];
    return n * sizeof(resize_tap);
}

static ai_status resize_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    if (x->ndim == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank 0");
    resize_plan rp;
    ai_status st = resize_plan_of(c, &rp);
    if (st)
        return st;
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, rp.out, sizeof rp.out);
    *state = taps_bytes(&rp);
    return AI_OK;
}

/* The job over c's tensors; builds the taps into the state (forward). */
static ai_status resize_job_of(ai_ctx *c, resize_job *j, resize_plan *rp, bool build)
{
    const resize_params *p = c->node->params;
    ai_status st = resize_plan_of(c, rp);
    if (st)
        return st;
    memset(j, 0, sizeof *j);
    j->rp = rp;
    j->nearest = p->mode == M_NEAREST;
    j->f64 = c->in[0]->dtype == AI_F64;
    resize_tap *t = c->state;
    int64_t stride = 1;
    for (int d = rp->nd - 1; d >= 0; d--) {
        j->xstride[d] = stride;
        stride *= rp->in[d];
    }
    for (int d = 0; d < rp->nd; d++) {
        if (build)
            make_taps(p, rp, d, t);
        j->tap[d] = t;
        t += rp->out[d];
    }
    /* outer dims: same size, each output index its own input index */
    j->first = 0;
    while (j->first < rp->nd - 1 && rp->in[j->first] == rp->out[j->first] &&
           rp->scale[j->first] == 1.0) {
        bool identity = true;
        for (int64_t o = 0; o < rp->out[j->first] && identity; o++)
            identity = j->tap[j->first][o].i0 == o && j->tap[j->first][o].w1 == 0;
        if (!identity)
            break;
        j->first++;
    }
    j->in_block = j->out_block = 1;
    for (int d = j->first; d < rp->nd; d++) {
        j->in_block *= rp->in[d];
        j->out_block *= rp->out[d];
    }
    return AI_OK;
}

static int64_t outer_count(const resize_plan *rp, int first)
{
    int64_t n = 1;
    for (int d = 0; d < first; d++)
        n *= rp->out[d];
    return n;
}

static ai_status resize_forward(ai_ctx *c)
{
    resize_job j;
    resize_plan rp;
    ai_status st = resize_job_of(c, &j, &rp, true);
    if (st)
        return st;
    if (ai_tensor_numel(c->out[0]) == 0)
        return AI_OK;
    j.src = c->in[0]->data;
    j.dst = c->out[0]->data;
    ai_parallel_for(outer_count(&rp, j.first), ai_grain_of(j.out_block * 4), resize_fwd_range,
                    &j);
    return AI_OK;
}

static ai_status resize_backward(ai_ctx *c)
{
    if (!c->din[0])
        return AI_OK;
    resize_job j;
    resize_plan rp;
    ai_status st = resize_job_of(c, &j, &rp, false);
    if (st)
        return st;
    if (ai_tensor_numel(c->out[0]) == 0) {
        if (c->din_assign[0])
            memset(c->din[0]->data, 0,
                   (size_t)ai_tensor_numel(c->din[0]) * ai_dtype_size(c->din[0]->dtype));
        return AI_OK;
    }
    j.src = c->dout[0]->data;
    j.dst = c->din[0]->data;
    j.assign = c->din_assign[0];
    ai_parallel_for(outer_count(&rp, j.first), ai_grain_of(j.out_block * 4), resize_bwd_range,
                    &j);
    return AI_OK;
}

static const ai_op_def op_resize = {"Resize", "", 1, 4, 1, 1,
                                    AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
                                    resize_init, resize_shape, resize_forward, resize_backward};

const ai_op_def *const ai_ops_resize[] = {&op_resize, NULL};
