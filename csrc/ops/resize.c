/*
 * resize.c — Resize (opsets 10 to 19) and the deprecated Upsample (7, 9):
 * nearest, linear and cubic interpolation over any axes, forward and
 * backward; what torch's nn.Upsample and F.interpolate export (nearest,
 * bilinear, bicubic, trilinear, linear; align_corners or not; antialias).
 *
 * The output size is the `sizes` input, or floor(input * scale) with the
 * `scales` input (one of them, known at plan time: a constant, or a small
 * graph input read then, AI_OP_SHAPE_FROM_INPUTS; `axes` picks the dims
 * they describe, the others keep their size). Each output coordinate x
 * maps to v in the input by coordinate_transformation_mode, with the scale
 * given (scales) or out / in (sizes):
 *
 *   half_pixel            (x + 0.5) / scale - 0.5
 *   pytorch_half_pixel    the same, 0 where the output dim is 1
 *   align_corners         x (in - 1) / (out - 1), 0 where out is 1
 *   asymmetric            x / scale
 *   half_pixel_symmetric  half_pixel around the centre of the input
 *   tf_crop_and_resize    roi start * (in - 1) + x (end - start)(in - 1) / (out - 1);
 *                         outside [0, in - 1] the output is extrapolation_value
 *
 * Nearest takes input index nearest_mode(v) (round_prefer_floor,
 * round_prefer_ceil, floor, ceil) clamped to [0, in - 1]. Linear and cubic
 * take the k input indices nearest v (2 and 4; ties to the lower), weights
 * kernel(|i - v|) (the triangle; Keys' cubic with cubic_coeff_a), indices
 * clamped to the input: ONNX's edge padding, torch's formula.
 * exclude_outside gives indices outside the input weight 0 and normalises
 * the others; antialias, when downsampling by s < 1, widens the kernel to
 * kernel(|i - v| s) over 2/s (linear) or 4/s (cubic) taps, normalised.
 * Several axes nest as torch does: h0 (w0 a + w1 b) + h1 (w0 c + w1 d).
 * Upsample and Resize-10 take the scales only, asymmetric, nearest by floor
 * (ceil when downsampling, as ONNX Runtime); Upsample's scales are >= 1.
 *
 * Backward scatters dy with the same weights (each output element adds to
 * the input elements it read; an extrapolated one to none). Work splits by
 * the outer dims the resize leaves alone (N, C planes): the planes are
 * disjoint, the sums in the same order at any thread count. With sizes,
 * keep_aspect_ratio_policy not_larger or not_smaller takes one scale for
 * all axes (the smallest or largest of sizes / input).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../parallel.h"

enum { M_NEAREST, M_LINEAR, M_CUBIC };
enum { C_HALF_PIXEL, C_PYTORCH_HALF_PIXEL, C_ALIGN_CORNERS, C_ASYMMETRIC, C_HALF_SYMMETRIC,
       C_CROP, C_TF_HALF_PIXEL_FOR_NN };
/* N_SIMPLE: Upsample's and Resize-10's floor, ceil when downsampling (as
 * ONNX Runtime) */
enum { N_ROUND_FLOOR, N_ROUND_CEIL, N_FLOOR, N_CEIL, N_SIMPLE };

enum { P_STRETCH, P_NOT_LARGER, P_NOT_SMALLER };

typedef struct {
    int mode, coord, nearest, policy;
    bool legacy; /* Upsample, Resize-10: X and scales (or Upsample-7's attribute) */
    int64_t antialias, exclude_outside;
    double cubic_a, extrapolation;
    const double *scales_attr; /* Upsample-7 */
    int64_t n_scales_attr;
} resize_params;

static ai_status resize_init(ai_node *n)
{
    static const char *const modes[] = {"nearest", "linear", "cubic"};
    static const char *const coords[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                         "asymmetric", "half_pixel_symmetric",
                                         "tf_crop_and_resize", "tf_half_pixel_for_nn"};
    static const char *const nearests[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                           "ceil"};
    static const char *const policies[] = {"stretch", "not_larger", "not_smaller"};
    resize_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    ai_status st;
    p->legacy = strcmp(n->op_type, "Upsample") == 0 || n->opset < 11;
    if (p->legacy) {
        /* nearest or linear, asymmetric */
        if ((st = ai_attr_choice(n, "mode", "nearest", modes, 2, &p->mode)))
            return st;
        p->coord = C_ASYMMETRIC;
        p->nearest = N_SIMPLE;
        if (strcmp(n->op_type, "Upsample") == 0 && n->opset < 9) {
            if ((st = ai_attr_floats(n, "scales", &p->scales_attr, &p->n_scales_attr)))
                return st;
            if (p->n_scales_attr < 0)
                return ai_node_error(n, AI_ERR_VALUE, "the scales attribute is required");
        }
        return AI_OK;
    }
    if ((st = ai_attr_choice(n, "mode", "nearest", modes, 3, &p->mode)) ||
        (st = ai_attr_choice(n, "coordinate_transformation_mode", "half_pixel", coords, 7,
                             &p->coord)) ||
        (st = ai_attr_choice(n, "nearest_mode", "round_prefer_floor", nearests, 4,
                             &p->nearest)) ||
        (st = ai_attr_choice(n, "keep_aspect_ratio_policy", "stretch", policies, 3,
                             &p->policy)) ||
        (st = ai_attr_int(n, "antialias", 0, &p->antialias)) ||
        (st = ai_attr_int(n, "exclude_outside", 0, &p->exclude_outside)) ||
        (st = ai_attr_float(n, "cubic_coeff_a", -0.75, &p->cubic_a)) ||
        (st = ai_attr_float(n, "extrapolation_value", 0.0, &p->extrapolation)))
        return st;
    if ((p->antialias != 0 && p->antialias != 1) ||
        (p->exclude_outside != 0 && p->exclude_outside != 1))
        return ai_node_error(n, AI_ERR_VALUE, "antialias is %lld, exclude_outside %lld; 0 or 1 "
                             "expected", (long long)p->antialias,
                             (long long)p->exclude_outside);
    return AI_OK;
}

/* The output shape, each dim's scale and region of interest (roi: start
 * and end as fractions of the input, for tf_crop_and_resize). */
typedef struct {
    int nd;
    int64_t in[AI_MAX_DIMS], out[AI_MAX_DIMS];
    double scale[AI_MAX_DIMS], roi_lo[AI_MAX_DIMS], roi_hi[AI_MAX_DIMS];
} resize_plan;

/* Input i's value, known at plan time (a constant, or a small graph input
 * read then: AI_OP_SHAPE_FROM_INPUTS) or at run time; NULL if neither. */
static const ai_tensor *value_of(const ai_ctx *c, int i)
{
    const ai_tensor *t = ai_ctx_const(c, i);
    return t ? t : c->in[i]->data ? c->in[i] : NULL;
}

/* Upsample and Resize-10: a scale >= 1 (Upsample) for every dim. */
static ai_status legacy_plan_of(const ai_ctx *c, const resize_params *p, resize_plan *rp)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0], *t = NULL;
    int64_t count = p->n_scales_attr;
    if (!p->scales_attr) {
        if (c->n_in < 2 || !c->in[1])
            return ai_node_error(n, AI_ERR_VALUE, "the scales input is required");
        if (!(t = value_of(c, 1)))
            return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "scales input must be a constant");
        count = ai_tensor_numel(t);
    }
    if (count != x->ndim)
        return ai_node_error(n, AI_ERR_VALUE, "scales has %lld values; %d expected (the rank)",
                             (long long)count, x->ndim);
    const bool upsample = strcmp(n->op_type, "Upsample") == 0;
    for (int d = 0; d < x->ndim; d++) {
        const double s = t ? ai_tensor_get_flat(t, d) : p->scales_attr[d];
        if (!(s >= (upsample ? 1 : 0)) || !(s > 0) || !isfinite(s) ||
            floor((double)x->shape[d] * s) > (double)INT32_MAX)
            return ai_node_error(n, AI_ERR_VALUE, "scales[%d] is %g; %s expected", d, s,
                                 upsample ? ">= 1" : "> 0");
        rp->in[d] = x->shape[d];
        rp->out[d] = (int64_t)floor((double)x->shape[d] * s);
        rp->scale[d] = s;
        rp->roi_lo[d] = 0;
        rp->roi_hi[d] = 1;
    }
    return AI_OK;
}

static ai_status resize_plan_of(const ai_ctx *c, resize_plan *rp)
{
    const ai_node *n = c->node;
    const resize_params *p = n->params;
    const ai_tensor *x = c->in[0];
    rp->nd = x->ndim;
    if (p->legacy)
        return legacy_plan_of(c, p, rp);
    const ai_tensor *sc = c->n_in > 2 && c->in[2] && ai_tensor_numel(c->in[2]) ? c->in[2] : NULL;
    const ai_tensor *sz = c->n_in > 3 && c->in[3] && ai_tensor_numel(c->in[3]) ? c->in[3] : NULL;
    if (!sc == !sz)
        return ai_node_error(n, AI_ERR_VALUE, sc ? "both scales and sizes are given"
                                                 : "neither scales nor sizes is given");
    const int which = sc ? 2 : 3;
    const ai_tensor *t = value_of(c, which);
    if (!t)
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "%s input must be a constant",
                             sc ? "scales" : "sizes");
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
    if (sc ? !ai_dtype_is_float(t->dtype) : t->dtype != AI_I64)
        return ai_node_error(n, AI_ERR_TYPE, "%s is %s; %s expected", sc ? "scales" : "sizes",
                             ai_dtype_name(t->dtype), sc ? "float" : "int64");
    if (ai_tensor_numel(t) != na)
        return ai_node_error(n, AI_ERR_VALUE, "%s has %lld values; %lld expected (%s)",
                             sc ? "scales" : "sizes", (long long)ai_tensor_numel(t),
                             (long long)na, na == x->ndim ? "the rank" : "one per axis");
    const ai_tensor *roi = NULL;
    if (p->coord == C_CROP) {
        if (c->n_in < 2 || !c->in[1] || !(roi = value_of(c, 1)))
            return ai_node_error(n, AI_ERR_VALUE, "tf_crop_and_resize needs a constant roi");
        if (ai_tensor_numel(roi) != 2 * na)
            return ai_node_error(n, AI_ERR_VALUE, "roi has %lld values; %lld expected (starts, "
                                 "then ends)", (long long)ai_tensor_numel(roi),
                                 (long long)(2 * na));
    }
    for (int d = 0; d < x->ndim; d++) {
        rp->in[d] = rp->out[d] = x->shape[d];
        rp->scale[d] = 1.0;
        rp->roi_lo[d] = 0;
        rp->roi_hi[d] = 1;
    }
    for (int64_t i = 0; i < na; i++) {
        const int d = axes[i];
        if (roi) {
            rp->roi_lo[d] = ai_tensor_get_flat(roi, i);
            rp->roi_hi[d] = ai_tensor_get_flat(roi, na + i);
        }
        if (sc) {
            const double s = ai_tensor_get_flat(t, i);
            if (!(s > 0) || !isfinite(s))
                return ai_node_error(n, AI_ERR_VALUE, "scales[%lld] is %g; > 0 expected",
                                     (long long)i, s);
            rp->scale[d] = s;
            /* (tf_crop_and_resize too: ONNX Runtime and ONNX's reference
             * ignore the roi there, where the text scales it) */
            const double o = floor((double)x->shape[d] * s);
            if (!(o >= 0) || o > (double)INT32_MAX)
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
    if (sz && p->policy != P_STRETCH) {
        /* one scale for every axis, the smallest (not_larger) or largest
         * (not_smaller) of sizes / input; each size round(scale * input) */
        double s = rp->scale[axes[0]];
        for (int64_t i = 1; i < na; i++)
            s = p->policy == P_NOT_LARGER ? fmin(s, rp->scale[axes[i]])
                                          : fmax(s, rp->scale[axes[i]]);
        for (int64_t i = 0; i < na; i++) {
            rp->scale[axes[i]] = s;
            rp->out[axes[i]] = (int64_t)floor(s * (double)x->shape[axes[i]] + 0.5);
        }
    }
    return AI_OK;
}

/* One dim's table: for each output index, `taps` (input index, weight)
 * pairs; a first index of -1 marks an output that tf_crop_and_resize puts
 * outside the input (it takes extrapolation_value). */
typedef struct {
    int64_t i;
    double w;
} resize_tap;

/* The source coordinate of output index x; *outside for tf_crop_and_resize
 * outside the input. */
static double source_coord(const resize_params *p, const resize_plan *rp, int d, double x,
                           bool *outside)
{
    const double scale = rp->scale[d];
    const int64_t in = rp->in[d], out = rp->out[d];
    const double length = scale * (double)in; /* the output's length, before flooring */
    *outside = false;
    switch (p->coord) {
    case C_PYTORCH_HALF_PIXEL:
        return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case C_ALIGN_CORNERS:
        return out > 1 ? x * (double)(in - 1) / (double)(out - 1) : 0.0;
    case C_ASYMMETRIC:
        return x / scale;
    case C_TF_HALF_PIXEL_FOR_NN: /* Resize-11 */
        return (x + 0.5) / scale;
    case C_HALF_SYMMETRIC: {
        const double adj = (double)out / length, centre = (double)in / 2;
        return centre * (1 - adj) + (x + 0.5) / scale - 0.5;
    }
    case C_CROP: {
        const double lo = rp->roi_lo[d], hi = rp->roi_hi[d];
        const double v = out > 1 ? lo * (double)(in - 1) +
                                       x * (hi - lo) * (double)(in - 1) / (double)(out - 1)
                                 : 0.5 * (lo + hi) * (double)(in - 1);
        *outside = !(v >= 0 && v <= (double)(in - 1));
        return v;
    }
    default:
        return (x + 0.5) / scale - 0.5;
    }
}

static int64_t nearest_index(int mode, double v, double scale)
{
    const double f = floor(v);
    switch (mode) {
    case N_FLOOR: return (int64_t)f;
    case N_CEIL: return (int64_t)ceil(v);
    case N_SIMPLE: return (int64_t)(scale < 1 ? ceil(v) : f);
    case N_ROUND_CEIL: return (int64_t)(v - f >= 0.5 ? f + 1 : f);
    default: return (int64_t)(v - f > 0.5 ? f + 1 : f);
    }
}

/* The interpolation kernel at distance x >= 0. */
static double kernel_at(const resize_params *p, double x)
{
    if (p->mode == M_LINEAR)
        return x < 1 ? 1 - x : 0;
    const double a = p->cubic_a;
    if (x <= 1)
        return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2)
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0;
}

/* Taps per output index of dim d: 1 (nearest), 2 (linear), 4 (cubic); with
 * antialias, downsampling by s < 1 stretches the kernel by 1 / s. */
static int64_t taps_of(const resize_params *p, const resize_plan *rp, int d)
{
    if (p->mode == M_NEAREST)
        return 1;
    const double reach = p->mode == M_LINEAR ? 1 : 2;
    if (!p->antialias || rp->scale[d] >= 1 || !(rp->scale[d] > 0))
        return 2 * (int64_t)reach; /* (scale 0: sizes 0, no output to take taps) */
    return 2 - 2 * ((int64_t)floor(-reach / rp->scale[d]) + 1);
}

/* ONNX's rule: the `k` input indices nearest to v (ties to the lower),
 * weights kernel((index - v) * s) (normalised with antialias; with
 * exclude_outside those outside the input are 0, the others normalised),
 * indices then clamped to the input (its edge values repeat). */
static void make_taps(const resize_params *p, const resize_plan *rp, int d, resize_tap *tap)
{
    const int64_t in = rp->in[d], out = rp->out[d], k = taps_of(p, rp, d);
    const double s = p->antialias && rp->scale[d] < 1 ? rp->scale[d] : 1;
    for (int64_t o = 0; o < out; o++) {
        bool outside;
        const double v = source_coord(p, rp, d, (double)o, &outside);
        resize_tap *t = tap + o * k;
        if (outside || !isfinite(v)) {
            for (int64_t j = 0; j < k; j++)
                t[j] = (resize_tap){j ? 0 : -1, 0.0};
            continue;
        }
        if (p->mode == M_NEAREST) {
            int64_t i = nearest_index(p->nearest, v, rp->scale[d]);
            t[0] = (resize_tap){i < 0 ? 0 : (i > in - 1 ? in - 1 : i), 1.0};
            continue;
        }
        const double f = floor(v);
        const int64_t start = (int64_t)f - k / 2 + (v == f ? 0 : 1);
        double sum = 0;
        for (int64_t j = 0; j < k; j++) {
            const int64_t i = start + j;
            double w = kernel_at(p, fabs((double)i - v) * s);
            if (p->exclude_outside && (i < 0 || i >= in))
                w = 0;
            sum += w;
            t[j] = (resize_tap){i < 0 ? 0 : (i > in - 1 ? in - 1 : i), w};
        }
        if ((p->antialias || p->exclude_outside) && sum != 0)
            for (int64_t j = 0; j < k; j++)
                t[j].w /= sum;
    }
}

/* The dims a resize touches: first..nd-1 (the outer ones keep size and map
 * to themselves), with their taps in the node state. */
typedef struct {
    const resize_plan *rp;
    const resize_tap *tap[AI_MAX_DIMS];
    int64_t taps[AI_MAX_DIMS];    /* taps per output index */
    int64_t xstride[AI_MAX_DIMS]; /* the input's contiguous strides */
    int first;
    bool crop, f64, assign;
    double extrapolation;
    int64_t in_block, out_block; /* elements per outer index */
    const void *src;             /* forward: x; backward: dy */
    void *dst;                   /* forward: y; backward: dx */
} resize_job;

/* Forward: the value at output multi-index (from dim d on) of one outer
 * block, dims nested as torch does: h0 (w0 a + w1 b) + h1 (w0 c + w1 d).
 * Backward scatters g with the same weights. */
#define DEFINE_RESIZE_KERNELS(SUF, T)                                                      \
    /* the last dim: k taps at x + off */                                                  \
    static inline T leaf_##SUF(const resize_tap *t, int64_t k, const T *x, int64_t off)    \
    {                                                                                      \
        if (k == 1) /* nearest: weight 1 */                                                \
            return x[off + t[0].i];                                                        \
        if (k == 2) /* linear */                                                           \
            return (T)t[0].w * x[off + t[0].i] + (T)t[1].w * x[off + t[1].i];              \
        T v = 0;                                                                           \
        for (int64_t m = 0; m < k; m++)                                                    \
            v += (T)t[m].w * x[off + t[m].i];                                              \
        return v;                                                                          \
    }                                                                                      \
    static T gather_##SUF(const resize_job *j, const T *x, int d, const int64_t *oi,       \
                          int64_t off)                                                     \
    {                                                                                      \
        const int last = j->rp->nd - 1;                                                    \
        const int64_t k = j->taps[d];                                                      \
        const resize_tap *t = j->tap[d] + oi[d] * k;                                       \
        if (d == last)                                                                     \
            return leaf_##SUF(t, k, x, off);                                               \
        const int64_t stride = j->xstride[d];                                              \
        if (d + 1 == last) { /* the leaf inline: one call per output element */            \
            const int64_t kl = j->taps[last];                                              \
            const resize_tap *tl = j->tap[last] + oi[last] * kl;                           \
            if (k == 1)                                                                    \
                return leaf_##SUF(tl, kl, x, off + t[0].i * stride);                       \
            if (k == 2)                                                                    \
                return (T)t[0].w * leaf_##SUF(tl, kl, x, off + t[0].i * stride) +          \
                       (T)t[1].w * leaf_##SUF(tl, kl, x, off + t[1].i * stride);           \
            T v = 0;                                                                       \
            for (int64_t m = 0; m < k; m++)                                                \
                v += (T)t[m].w * leaf_##SUF(tl, kl, x, off + t[m].i * stride);             \
            return v;                                                                      \
        }                                                                                  \
        if (k == 1)                                                                        \
            return gather_##SUF(j, x, d + 1, oi, off + t[0].i * stride);                   \
        T v = 0;                                                                           \
        for (int64_t m = 0; m < k; m++)                                                    \
            v += (T)t[m].w * gather_##SUF(j, x, d + 1, oi, off + t[m].i * stride);         \
        return v;                                                                          \
    }                                                                                      \
    /* the last dim: g spread over k taps at dx + off */                                   \
    static inline void spread_##SUF(const resize_tap *t, int64_t k, T *dx, int64_t off,    \
                                    T g)                                                   \
    {                                                                                      \
        if (k == 1) /* nearest: weight 1 */                                                \
            dx[off + t[0].i] += g;                                                         \
        else                                                                               \
            for (int64_t m = 0; m < k; m++)                                                \
                dx[off + t[m].i] += (T)t[m].w * g;                                         \
    }                                                                                      \
    static void scatter_##SUF(const resize_job *j, T *dx, int d, const int64_t *oi,        \
                              int64_t off, T g)                                            \
    {                                                                                      \
        const int last = j->rp->nd - 1;                                                    \
        const int64_t k = j->taps[d];                                                      \
        const resize_tap *t = j->tap[d] + oi[d] * k;                                       \
        if (d == last) {                                                                   \
            spread_##SUF(t, k, dx, off, g);                                                \
            return;                                                                        \
        }                                                                                  \
        const int64_t stride = j->xstride[d];                                              \
        if (d + 1 == last) { /* the leaf inline: one call per output element */            \
            const int64_t kl = j->taps[last];                                              \
            const resize_tap *tl = j->tap[last] + oi[last] * kl;                           \
            for (int64_t m = 0; m < k; m++)                                                \
                spread_##SUF(tl, kl, dx, off + t[m].i * stride, k == 1 ? g : (T)t[m].w * g); \
            return;                                                                        \
        }                                                                                  \
        for (int64_t m = 0; m < k; m++)                                                    \
            scatter_##SUF(j, dx, d + 1, oi, off + t[m].i * stride,                         \
                          k == 1 ? g : (T)t[m].w * g);                                     \
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
            bool outside = false; /* tf_crop_and_resize: extrapolation_value */            \
            for (int d = j->first; j->crop && d <= last; d++)                              \
                outside |= j->tap[d][oi[d] * j->taps[d]].i < 0;                            \
            if (backward && !outside)                                                      \
                scatter_##SUF(j, dst, j->first, oi, 0, src[o]);                            \
            else if (!backward)                                                            \
                dst[o] = outside ? (T)j->extrapolation                                     \
                                 : gather_##SUF(j, src, j->first, oi, 0);                  \
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

static size_t taps_bytes(const resize_params *p, const resize_plan *rp)
{
    size_t n = 0;
    for (int d = 0; d < rp->nd; d++)
        n += (size_t)(rp->out[d] * taps_of(p, rp, d));
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
    *state = taps_bytes(c->node->params, &rp);
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
    j->crop = p->coord == C_CROP;
    j->extrapolation = p->extrapolation;
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
        j->taps[d] = taps_of(p, rp, d);
        t += rp->out[d] * j->taps[d];
    }
    /* outer dims: same size, each output index its own input index (one
     * tap of weight 1, the others 0) */
    j->first = 0;
    while (j->first < rp->nd - 1 && rp->in[j->first] == rp->out[j->first]) {
        const int64_t k = j->taps[j->first];
        bool identity = true;
        for (int64_t o = 0; o < rp->out[j->first] && identity; o++)
            for (int64_t m = 0; m < k && identity; m++) {
                const resize_tap *t = &j->tap[j->first][o * k + m];
                identity = t->i >= 0 && (t->w == 0 || (t->w == 1 && t->i == o));
            }
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
        if (c->din_assign[0] && ai_tensor_numel(c->din[0]))
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

#define RESIZE_OP(VAR, NAME, MAX_IN)                                                      \
    static const ai_op_def VAR = {NAME, "", 1, MAX_IN, 1, 1,                              \
                                  AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y |  \
                                      AI_OP_SHAPE_FROM_INPUTS,                            \
                                  resize_init, resize_shape, resize_forward, resize_backward};

RESIZE_OP(op_resize, "Resize", 4)
RESIZE_OP(op_upsample, "Upsample", 2)

const ai_op_def *const ai_ops_resize[] = {&op_resize, &op_upsample, NULL};
