/*
 * conv.c — Conv and ConvTranspose (conv.h): parameter checks, output sizes,
 * workspace size, and the dispatcher, the one place that picks the kernel
 * family for each pass of a convolution.
 *
 * The families (conv_internal.h) each take the shapes they are fast on and
 * decline the others:
 *   conv_pointwise.c     1x1 convolutions
 *   conv_blocked.c       direct, output channels in vector lanes (and NCHWc chains)
 *   conv_winograd.c      3x3 stride 1 by Winograd F(2x2, 3x3): NCHWc chains, and
 *                        NCHW convs (forward, input gradient) between reorders
 *   conv_direct.c        direct, on zero-padded stride-phase planes
 *   conv_shifted_gemm.c  stride 1, one GEMM per kernel tap
 *   conv_depthwise.c     one input channel per group
 *   conv_im2col.c        im2col + GEMM: everything else, and ConvTranspose
 * For each pass the dispatcher tries them in a fixed order; the first that
 * takes the shape computes it. The order is the rule: a kernel sits before
 * the ones it beats on the shapes it takes.
 */
#include <inttypes.h>

#include "conv_internal.h"

/* Largest attribute or size accepted: keeps every formula below in int64. */
#define MAX_ATTR INT64_C(0x7fffffff)

static ai_status check_attrs(const ai_conv_params *p, bool transposed)
{
    const char *op = transposed ? "ConvTranspose" : "Conv";
    if (p->nsp < 1 || p->nsp > 3)
        return ai_error(AI_ERR_VALUE, "%s: %d spatial dims, expected 1 to 3", op,
                        p->nsp);
    const struct { const char *name; int64_t v, lo; } counts[] = {
        {"batch size", p->N, 0}, {"input channels", p->C, 1},
        {"output channels", p->M, 1}, {"group", p->group, 1}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i].v < counts[i].lo || counts[i].v > MAX_ATTR)
            return ai_error(AI_ERR_VALUE, "%s: %s %" PRId64 " out of range [%" PRId64
                            ", 2^31)", op, counts[i].name, counts[i].v, counts[i].lo);
    if (p->C % p->group || p->M % p->group)
        return ai_error(AI_ERR_VALUE,
                        "%s: group %" PRId64 " must divide input channels %" PRId64
                        " and output channels %" PRId64, op, p->group, p->C, p->M);
    const struct { const char *name; const int64_t *v; int64_t lo; } attrs[] = {
        {"input size", p->in, 1},         {"kernel", p->kernel, 1},
        {"stride", p->stride, 1},         {"dilation", p->dilation, 1},
        {"pad_begin", p->pad_begin, 0},   {"pad_end", p->pad_end, 0},
        {"output_padding", p->output_padding, 0}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        for (int d = 0; d < p->nsp; d++)
            if (attrs[i].v[d] < attrs[i].lo || attrs[i].v[d] > MAX_ATTR)
                return ai_error(AI_ERR_VALUE,
                                "%s: %s %" PRId64 " along spatial dim %d out of range [%"
                                PRId64 ", 2^31)", op, attrs[i].name, attrs[i].v[d], d,
                                attrs[i].lo);
    for (int d = 0; d < p->nsp; d++) {
        int64_t opad = p->output_padding[d];
        if (!transposed && opad != 0)
            return ai_error(AI_ERR_VALUE, "Conv: output_padding must be 0 (is %" PRId64
                            " along spatial dim %d)", opad, d);
        if (transposed && opad >= p->stride[d] && opad >= p->dilation[d])
            return ai_error(AI_ERR_VALUE,
                            "ConvTranspose: output_padding %" PRId64 " along spatial dim %d"
                            " must be smaller than stride %" PRId64 " or dilation %" PRId64,
                            opad, d, p->stride[d], p->dilation[d]);
    }
    return AI_OK;
}

/* The output size along spatial dim d of parameters that pass check_attrs. */
static ai_status expected_out(const ai_conv_params *p, bool transposed, int d,
                              int64_t *out)
{
    int64_t extent = p->dilation[d] * (p->kernel[d] - 1) + 1; /* dilated kernel */
    int64_t pads = p->pad_begin[d] + p->pad_end[d];
    if (!transposed) {
        if (p->in[d] + pads < extent)
            return ai_error(AI_ERR_VALUE,
                            "Conv: dilated kernel extent %" PRId64 " exceeds padded input"
                            " size %" PRId64 " along spatial dim %d", extent,
                            p->in[d] + pads, d);
        *out = (p->in[d] + pads - extent) / p->stride[d] + 1;
    } else {
        *out = p->stride[d] * (p->in[d] - 1) + p->output_padding[d] + extent - pads;
        if (*out < 1)
            return ai_error(AI_ERR_VALUE,
                            "ConvTranspose: pads %" PRId64 " + %" PRId64 " leave output"
                            " size %" PRId64 " along spatial dim %d", p->pad_begin[d],
                            p->pad_end[d], *out, d);
    }
    return AI_OK;
}

/* *acc *= v unless the product could not be counted in bytes of float64. */
static bool mul_fits(int64_t *acc, int64_t v)
{
    if (v != 0 && *acc > INT64_MAX / 8 / v)
        return false;
    *acc *= v;
    return true;
}

static ai_status check(const ai_conv_params *p, bool transposed)
{
    const char *op = transposed ? "ConvTranspose" : "Conv";
    ai_status st = check_attrs(p, transposed);
    for (int d = 0; st == AI_OK && d < p->nsp; d++) {
        int64_t out = 0;
        st = expected_out(p, transposed, d, &out);
        if (st == AI_OK && p->out[d] != out)
            return ai_error(AI_ERR_VALUE, "%s: output size %" PRId64 " along spatial dim"
                            " %d, expected %" PRId64, op, p->out[d], d, out);
    }
    if (st != AI_OK)
        return st;
    /* x, y, w and the im2col columns must be countable in bytes */
    int64_t xs = p->N, ys = p->N, ws = p->M, cols = transposed ? p->M : p->C;
    bool ok = mul_fits(&xs, p->C) && mul_fits(&ys, p->M) && mul_fits(&ws, p->C);
    cols /= p->group;
    ws /= p->group;
    for (int d = 0; ok && d < p->nsp; d++)
        ok = mul_fits(&xs, p->in[d]) && mul_fits(&ys, p->out[d]) &&
             mul_fits(&ws, p->kernel[d]) && mul_fits(&cols, p->kernel[d]) &&
             mul_fits(&cols, transposed ? p->in[d] : p->out[d]);
    return ok ? AI_OK : ai_error(AI_ERR_NOMEM, "%s: tensor sizes overflow", op);
}

static ai_status infer_out(ai_conv_params *p, bool transposed)
{
    ai_status st = check_attrs(p, transposed);
    for (int d = 0; st == AI_OK && d < p->nsp; d++)
        st = expected_out(p, transposed, d, &p->out[d]);
    return st != AI_OK ? st : check(p, transposed);
}

ai_status ai_conv_check(const ai_conv_params *p) { return check(p, false); }
ai_status ai_convtranspose_check(const ai_conv_params *p) { return check(p, true); }
ai_status ai_conv_infer_out(ai_conv_params *p) { return infer_out(p, false); }
ai_status ai_convtranspose_infer_out(ai_conv_params *p) { return infer_out(p, true); }

/*
 * The geometry of im2col/col2im, always 3-D: 1-D and 2-D convs get leading
 * spatial dims of size 1 (kernel 1, stride 1, no pad). `img` is the image
 * side (Conv: x, ConvTranspose: y), `grid` the side whose positions index the
 * columns (Conv: y, ConvTranspose: x).
 */
conv_geom conv_geom_of(const ai_conv_params *p, bool transposed)
{
    conv_geom g = {.img_size = 1, .grid_size = 1, .ksize = 1, .pointwise = true};
    for (int i = 0; i < 3; i++) {
        int d = i - (3 - p->nsp); /* spatial dim of p; < 0 for an added one */
        bool real = d >= 0;
        g.img[i] = !real ? 1 : transposed ? p->out[d] : p->in[d];
        g.grid[i] = !real ? 1 : transposed ? p->in[d] : p->out[d];
        g.k[i] = real ? p->kernel[d] : 1;
        g.s[i] = real ? p->stride[d] : 1;
        g.d[i] = real ? p->dilation[d] : 1;
        g.p[i] = real ? p->pad_begin[d] : 0;
        g.img_size *= g.img[i];
        g.grid_size *= g.grid[i];
        g.ksize *= g.k[i];
        g.pointwise = g.pointwise && g.k[i] == 1 && g.s[i] == 1 && g.p[i] == 0 &&
                      g.img[i] == g.grid[i];
    }
    return g;
}

/* The largest workspace of the kernels that may run on p, for any pass. */
static size_t workspace_bytes(const ai_conv_params *p, ai_dtype dtype, bool transposed)
{
    const conv_geom g = conv_geom_of(p, transposed);
    int64_t e = im2col_workspace(p, &g, dtype, transposed);
    if (!transposed) {
        const int64_t family[] = {
            pointwise_workspace(p, &g, dtype), blocked_workspace(p, &g, dtype),
            direct_workspace(p, &g, dtype),    shifted_gemm_workspace(p, &g),
            depthwise_workspace(p, &g),        winograd_workspace(p, dtype),
        };
        for (size_t i = 0; i < sizeof family / sizeof family[0]; i++)
            e = family[i] > e ? family[i] : e;
    }
    return (size_t)e * ai_dtype_size(dtype);
}

size_t ai_conv_workspace_bytes(const ai_conv_params *p, ai_dtype dtype)
{
    return workspace_bytes(p, dtype, false);
}

size_t ai_convtranspose_workspace_bytes(const ai_conv_params *p, ai_dtype dtype)
{
    return workspace_bytes(p, dtype, true);
}

/*
 * The forward: the first kernel that takes the shape computes y (each
 * checks its own conditions; in short, and f32 = float32 only):
 */
static bool (*const forward_kernels[])(const conv_call *) = {
    pointwise_direct_forward,        /* f32, 1x1 stride 1 unpadded, one group, C <= 256 */
    winograd_forward,                /* f32 fast kernels, 2 dims, 3x3 stride 1, one group,
                                      * >= 16 channels in and out, planes of >= 16 tiles */
    blocked_forward,                 /* f32, one group, <= 2 dims, strided or output rows
                                      * under 16, M >= 16, C K <= 640 */
    direct_forward,                  /* f32, one group, <= 2 dims, kernel over 1x1 */
    shifted_gemm_forward,            /* stride 1, <= 2 dims, >= 8 channels per group */
    depthwise_narrow_forward,        /* f32 AVX-512, depthwise, M = C, stride 1,
                                      * planes under 16 wide, as wide as the output */
    depthwise_channels_last_forward, /* depthwise, M = C, <= 2 dims, strided or
                                      * at most 256 outputs */
    depthwise_forward,               /* every other depthwise conv */
    pointwise_batched_forward,       /* 1x1, one group, N > 1, planes of <= 64 */
    pointwise_images_forward,        /* 1x1, one group, N > 1, small GEMMs, > 1 thread */
    im2col_forward,                  /* any */
};

static void conv_forward(conv_call *c)
{
    for (size_t i = 0; !forward_kernels[i](c); i++)
        ;
}

/* With assign_dx, dx is written (=), not added to; dx and dw may then be one
 * buffer (a value that is both x and w): zeroed once, then added to. */
static bool zero_dx_if_shared(const conv_call *c)
{
    if (!c->assign_dx || !c->dx || c->dx != c->dw)
        return c->assign_dx;
    int64_t n = c->p->N * c->p->C; /* dx has x's shape */
    for (int d = 0; d < c->p->nsp; d++)
        n *= c->p->in[d];
    memset(c->dx, 0, ai_dtype_size(c->dtype) * (size_t)n);
    return false;
}

/*
 * The backward: dx and dw are computed by the first kernel that takes
 * them, alone or together (a kernel clears c->dx, c->dw as it computes
 * them); then db.
 */
static void conv_backward(conv_call *c)
{
    c->assign_dx = zero_dx_if_shared(c);
    if (c->dx)
        (void)(winograd_input_grad(c)         /* winograd_forward's shapes, the dx conv's */
               || direct_input_grad(c));      /* f32, stride 1, one group, kernel over 1x1 */
    if (c->dw && !c->dx)                      /* the weight gradient alone */
        (void)(pointwise_weight_grad_im2col(c) /* f32, one group, C K of 8 (16) to 256, M >= 32 */
               || direct_weight_grad(c));     /* f32, direct_forward's shapes, large grids */
    if (c->dx || c->dw)
        pointwise_batched_backward(c);        /* pointwise_batched_forward's shapes */
    if (c->dw && c->dx != c->dw)
        pointwise_weight_grad(c);             /* f32, 1x1, one group, small GEMMs */
    if (c->dx && c->assign_dx)
        pointwise_input_grad(c);              /* f32, the same shapes */
    if (c->dx || c->dw)
        pointwise_images_backward(c);         /* 1x1, one group, N > 1, small GEMMs */
    if (c->dx || c->dw)
        shifted_gemm_backward(c);             /* shifted_gemm_forward's shapes */
    if (c->dx && c->dx != c->dw)
        depthwise_narrow_input_grad(c);       /* depthwise_narrow_forward's, planes of >= 64,
                                               * where channels-last would take them */
    if (c->dx || c->dw)
        depthwise_channels_last_backward(c);  /* depthwise, M = C, <= 2 dims, pads inside,
                                               * not the smallest planes */
    if (c->dx || c->dw)
        depthwise_backward(c);                /* every other depthwise conv */
    if (c->dx || c->dw)
        im2col_backward(c);                   /* any other */
    if (c->db && c->dtype == AI_F32)
        bias_backward_f32(c->db, c->dy, c->p->N, c->p->M, c->g->grid_size);
    else if (c->db)
        bias_backward_f64(c->db, c->dy, c->p->N, c->p->M, c->g->grid_size);
}

#define CONV_CALL(dt, transposed)                                                      \
    const conv_geom g = conv_geom_of(p, transposed);                                   \
    conv_call c = {.p = p, .g = &g, .dtype = dt, .ws = workspace}

void ai_conv_forward_f32(const ai_conv_params *p, float *y, const float *x, const float *w,
                         const float *b, float *workspace, const ai_conv_epilogue *ep)
{
    CONV_CALL(AI_F32, false);
    c.y = y, c.x = x, c.w = w, c.b = b, c.ep = ep;
    conv_forward(&c);
}

void ai_conv_forward_f64(const ai_conv_params *p, double *y, const double *x,
                         const double *w, const double *b, double *workspace,
                         const ai_conv_epilogue *ep)
{
    CONV_CALL(AI_F64, false);
    c.y = y, c.x = x, c.w = w, c.b = b, c.ep = ep;
    conv_forward(&c);
}

void ai_conv_backward_f32(const ai_conv_params *p, float *dx, float *dw, float *db,
                          const float *dy, const float *x, const float *w, float *workspace,
                          bool assign_dx)
{
    CONV_CALL(AI_F32, false);
    c.dx = dx, c.dw = dw, c.db = db, c.dy = dy, c.x = x, c.w = w, c.assign_dx = assign_dx;
    conv_backward(&c);
}

void ai_conv_backward_f64(const ai_conv_params *p, double *dx, double *dw, double *db,
                          const double *dy, const double *x, const double *w,
                          double *workspace, bool assign_dx)
{
    CONV_CALL(AI_F64, false);
    c.dx = dx, c.dw = dw, c.db = db, c.dy = dy, c.x = x, c.w = w, c.assign_dx = assign_dx;
    conv_backward(&c);
}

/* ConvTranspose: im2col's kernels alone (conv_im2col.c) */
static void convtranspose_backward(conv_call *c)
{
    c->assign_dx = zero_dx_if_shared(c);
    if (c->dx || c->dw)
        im2col_transposed_backward(c);
    if (c->db && c->dtype == AI_F32)
        bias_backward_f32(c->db, c->dy, c->p->N, c->p->M, c->g->img_size);
    else if (c->db)
        bias_backward_f64(c->db, c->dy, c->p->N, c->p->M, c->g->img_size);
}

void ai_convtranspose_forward_f32(const ai_conv_params *p, float *y, const float *x,
                                  const float *w, const float *b, float *workspace)
{
    CONV_CALL(AI_F32, true);
    c.y = y, c.x = x, c.w = w, c.b = b;
    im2col_transposed_forward(&c);
}

void ai_convtranspose_forward_f64(const ai_conv_params *p, double *y, const double *x,
                                  const double *w, const double *b, double *workspace)
{
    CONV_CALL(AI_F64, true);
    c.y = y, c.x = x, c.w = w, c.b = b;
    im2col_transposed_forward(&c);
}

void ai_convtranspose_backward_f32(const ai_conv_params *p, float *dx, float *dw, float *db,
                                   const float *dy, const float *x, const float *w,
                                   float *workspace, bool assign_dx)
{
    CONV_CALL(AI_F32, true);
    c.dx = dx, c.dw = dw, c.db = db, c.dy = dy, c.x = x, c.w = w, c.assign_dx = assign_dx;
    convtranspose_backward(&c);
}

void ai_convtranspose_backward_f64(const ai_conv_params *p, double *dx, double *dw,
                                   double *db, const double *dy, const double *x,
                                   const double *w, double *workspace, bool assign_dx)
{
    CONV_CALL(AI_F64, true);
    c.dx = dx, c.dw = dw, c.db = db, c.dy = dy, c.x = x, c.w = w, c.assign_dx = assign_dx;
    convtranspose_backward(&c);
}

/* ---------------------------------------------------- blocked channels (conv.h) */

bool ai_conv_blocked_fast(int64_t C, int64_t M, int64_t group, int64_t ksize)
{
    return (group == 1 && C * ksize <= BLOCKED_MAX_TAPS) ||
           (group == C && M == C && ksize <= DW_PAD_MAX_TAPS);
}

/* The blocked forward's kernel for p, in this order: */
typedef enum {
    BLOCKED_WINOGRAD,  /* conv_winograd.c: 3x3 stride 1, blocked x, >= 16 channels in and out */
    BLOCKED_PATCHES,   /* conv_blocked.c: NCHW x (a first conv), at most 64 taps, M >= 32:
                        * 64 channels per broadcast, 0.93-0.97 of the direct tiles' time */
    BLOCKED_TILES,     /* conv_blocked.c: one group, at most 640 taps, planes that fit */
    BLOCKED_DEPTHWISE, /* conv_depthwise.c: depthwise, M = C, padded planes that fit */
    BLOCKED_FALLBACK,  /* the NCHW forward between reorders: any other 2-D conv */
} blocked_kernel;

/* With `fast` false (ai_set_fast_kernels(false): their references, the
 * direct tiles) the Winograd and patch kernels are passed over. */
static blocked_kernel blocked_kernel_of(const ai_conv_params *p, const conv_geom *g, bool xb,
                                        bool fast)
{
    if (fast && winograd_chain_accepts(p, g, xb))
        return BLOCKED_WINOGRAD;
    if (fast && p->nsp == 2 && patch_chain_accepts(p, g, xb))
        return BLOCKED_PATCHES;
    if (p->nsp == 2 && blocked_chain_accepts(p, g, xb))
        return BLOCKED_TILES;
    if (p->nsp == 2 && depthwise_blocked_accepts(p, g))
        return BLOCKED_DEPTHWISE;
    return BLOCKED_FALLBACK;
}

/* the larger of the Winograd kernel's workspace and the other one's: the
 * fast kernels may be switched off between a plan and its forward */
size_t ai_conv_blocked_workspace_bytes(const ai_conv_params *p, bool x_blocked)
{
    const conv_geom g = conv_geom_of(p, false);
    const size_t winograd = (size_t)winograd_chain_workspace(p, &g, x_blocked) * sizeof(float);
    size_t other;
    switch (blocked_kernel_of(p, &g, x_blocked, false)) {
    case BLOCKED_TILES:
        other = (size_t)blocked_chain_workspace(p, &g, x_blocked) * sizeof(float);
        break;
    case BLOCKED_DEPTHWISE:
        other = (size_t)depthwise_blocked_workspace(p, &g) * sizeof(float);
        break;
    default: /* x and y as NCHW, then the NCHW conv's */
        other = (size_t)(p->N * (p->C * g.img_size + p->M * g.grid_size)) * sizeof(float) +
                ai_conv_workspace_bytes(p, AI_F32);
    }
    return winograd > other ? winograd : other;
}

int64_t ai_conv_blocked_packed_size(const ai_conv_params *p, bool x_blocked, int *layout)
{
    const conv_geom g = conv_geom_of(p, false);
    switch (blocked_kernel_of(p, &g, x_blocked, ai_fast_kernels())) {
    case BLOCKED_WINOGRAD:
        *layout = 2;
        return winograd_chain_packed_elems(p);
    case BLOCKED_PATCHES:
    case BLOCKED_TILES:
        *layout = 1;
        return blocked_chain_packed_elems(p, &g);
    default:
        *layout = 0;
        return 0;
    }
}

void ai_conv_blocked_pack(const ai_conv_params *p, bool x_blocked, const float *w, float *wp)
{
    const conv_geom g = conv_geom_of(p, false);
    if (blocked_kernel_of(p, &g, x_blocked, ai_fast_kernels()) == BLOCKED_WINOGRAD)
        winograd_chain_pack(p, w, wp);
    else
        blocked_chain_pack(p, &g, w, wp);
}

void ai_conv_forward_blocked_f32(const ai_conv_params *p, float *y, const float *x,
                                 const float *w, const float *wp, const float *b, float *ws,
                                 const ai_conv_epilogue *ep, bool x_blocked, const float *r)
{
    const conv_geom g = conv_geom_of(p, false);
    const blocked_kernel k = blocked_kernel_of(p, &g, x_blocked, ai_fast_kernels());
    if (k == BLOCKED_WINOGRAD) {
        winograd_chain_forward(p, y, x, w, wp, b, ws, ep, r); /* r in registers */
        return;
    }
    if (k == BLOCKED_PATCHES) {
        patch_chain_forward(p, y, x, w, wp, b, ws, ep, r); /* r in registers */
        return;
    }
    if (k == BLOCKED_TILES) {
        blocked_chain_forward(p, y, x, w, wp, b, ws, ep, x_blocked, r); /* r in registers */
        return;
    }
    if (r) { /* the other kernels: the conv and affine, then y = relu(y + r) in a pass */
        const ai_conv_epilogue e = {ep ? ep->ab : NULL, false};
        ai_conv_forward_blocked_f32(p, y, x, w, NULL, b, ws, &e, x_blocked, NULL);
        const int64_t blocks = (p->M + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK;
        blocked_add_residual(y, r, p->N * blocks * AI_CONV_BLOCK * g.grid_size, ep && ep->relu);
        return;
    }
    if (k == BLOCKED_DEPTHWISE) {
        depthwise_blocked_forward(p, y, x, w, b, ws, ep, x_blocked);
        return;
    }
    /* the NCHW conv between reorders (planes too large for the slots, too many
     * taps, groups) */
    float *xs = ws, *ys = xs + p->N * p->C * g.img_size, *rest = ys + p->N * p->M * g.grid_size;
    if (x_blocked)
        ai_channels_reorder((float *)x, xs, p->N, p->C, g.img_size, sizeof(float), false, false);
    ai_conv_forward_f32(p, ys, x_blocked ? xs : x, w, b, rest, ep);
    ai_channels_reorder(y, ys, p->N, p->M, g.grid_size, sizeof(float), true, false);
}
