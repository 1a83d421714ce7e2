/*
 * test_kernels.c — the conv and pooling kernels: each against a naive
 * direct-loop twin written here, float32 against float64, backward against
 * central finite differences (float64), accumulation (+=) into gradients,
 * parameter validation, and a few values taken from PyTorch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../aidge.h"
#include "../kernels/attn_tiles.h"
#include "../kernels/conv.h"
#include "../kernels/gemm.h"
#include "../kernels/pool.h"
#include "../kernels/simd.h"
#include "../parallel.h"
#include "ctest.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 1;

static double urand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return (double)(rng_state >> 11) * 0x1p-52 - 1;
}

static double *random_f64(int64_t n)
{
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = urand();
    return v;
}

static double *zeros_f64(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static float *zeros_f32(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static float *to_f32(const double *v, int64_t n)
{
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)v[i];
    return f;
}

static double *copy_f64(const double *v, int64_t n)
{
    double *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
    memcpy(c, v, (size_t)n * sizeof *c);
    return c;
}

static int64_t prod(int n, const int64_t *v)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= v[i];
    return p;
}

/* max |a - b| <= tol * (1 + max |b|); a is float64 or, with af, float32 */
static bool close_to(const double *a, const float *af, const double *b, int64_t n,
                     double tol)
{
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double ai = a ? a[i] : af[i];
        diff = fmax(diff, fabs(ai - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    if (diff <= tol * (1 + scale))
        return true;
    fprintf(stderr, "    greatest difference %.3g (up to %.3g allowed)\n", diff,
            tol * (1 + scale));
    return false;
}

static bool twice(const double *g2, const double *g1, int64_t n)
{
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    for (int64_t i = 0; i < n; i++)
        d[i] = 2 * g1[i];
    bool ok = close_to(g2, NULL, d, n, 1e-12);
    free(d);
    return ok;
}

/* Spatial sizes as 3-D with leading dims of size 1, for the naive loops. */
static void as3(int nsp, const int64_t *v, int64_t fill, int64_t out[3])
{
    for (int i = 0; i < 3; i++)
        out[i] = i < 3 - nsp ? fill : v[i - (3 - nsp)];
}

/* Flat offset of position i in a (sz0, sz1, sz2) block, or -1 outside. */
static int64_t at3(const int64_t sz[3], const int64_t i[3])
{
    for (int d = 0; d < 3; d++)
        if (i[d] < 0 || i[d] >= sz[d])
            return -1;
    return (i[0] * sz[1] + i[1]) * sz[2] + i[2];
}

/* Tap t of a (k0, k1, k2) kernel as 3 indices. */
static void tap3(const int64_t k[3], int64_t t, int64_t j[3])
{
    j[2] = t % k[2];
    j[1] = t / k[2] % k[1];
    j[0] = t / (k[2] * k[1]);
}

/*
 * Central differences of L(v) = sum(r * f(v)) against `grad`, perturbing v
 * in place; `eval` computes f's output y from the current inputs in ctx.
 */
typedef void (*eval_fn)(void *ctx, double *y);

static bool finite_differences(double *v, int64_t n, const double *grad, eval_fn eval,
                               void *ctx, double *y, const double *r, int64_t ny)
{
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double v0 = v[i], lp = 0, lm = 0;
        v[i] = v0 + h;
        eval(ctx, y);
        for (int64_t k = 0; k < ny; k++)
            lp += r[k] * y[k];
        v[i] = v0 - h;
        eval(ctx, y);
        for (int64_t k = 0; k < ny; k++)
            lm += r[k] * y[k];
        v[i] = v0;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - grad[i]) > 1e-6 * (1 + fabs(grad[i]))) {
            fprintf(stderr, "    element %lld: finite difference %.10g, gradient %.10g\n",
                    (long long)i, fd, grad[i]);
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------------- conv */

typedef struct {
    int nsp;
    int64_t N, C, M, group;
    int64_t in[3], kernel[3], stride[3], dilation[3], pb[3], pe[3];
    int64_t opad[3]; /* ConvTranspose only */
} conv_case;

/* stride or dilation 0 in a case means 1 */
static ai_conv_params conv_params_of(const conv_case *c, bool transposed)
{
    ai_conv_params p = {.nsp = c->nsp, .N = c->N, .C = c->C, .M = c->M, .group = c->group};
    for (int d = 0; d < c->nsp; d++) {
        p.in[d] = c->in[d];
        p.kernel[d] = c->kernel[d];
        p.stride[d] = c->stride[d] ? c->stride[d] : 1;
        p.dilation[d] = c->dilation[d] ? c->dilation[d] : 1;
        p.pad_begin[d] = c->pb[d];
        p.pad_end[d] = c->pe[d];
        p.output_padding[d] = transposed ? c->opad[d] : 0;
    }
    return p;
}

/* The naive twins: direct loops over outputs and taps. Sizes 3-D. */
typedef struct {
    int64_t x[3], y[3], k[3], s[3], d[3], p[3], xs, ys, ks;
} conv3;

static conv3 conv3_of(const ai_conv_params *p)
{
    conv3 g;
    as3(p->nsp, p->in, 1, g.x);
    as3(p->nsp, p->out, 1, g.y);
    as3(p->nsp, p->kernel, 1, g.k);
    as3(p->nsp, p->stride, 1, g.s);
    as3(p->nsp, p->dilation, 1, g.d);
    as3(p->nsp, p->pad_begin, 0, g.p);
    g.xs = prod(3, g.x);
    g.ys = prod(3, g.y);
    g.ks = prod(3, g.k);
    return g;
}

/* y[n, m, o] = b[m] + sum over c in m's group, taps j: w[m, c, j] x[n, c, o*s - p + j*d] */
static void naive_conv(const ai_conv_params *p, double *y, const double *x,
                       const double *w, const double *b)
{
    conv3 g = conv3_of(p);
    int64_t Cg = p->C / p->group, Mg = p->M / p->group;
    for (int64_t nm = 0; nm < p->N * p->M; nm++) {
        int64_t n = nm / p->M, m = nm % p->M;
        for (int64_t o = 0; o < g.ys; o++) {
            int64_t oi[3], j[3], i[3];
            tap3(g.y, o, oi);
            double acc = b ? b[m] : 0;
            for (int64_t c = 0; c < Cg; c++)
                for (int64_t t = 0; t < g.ks; t++) {
                    tap3(g.k, t, j);
                    for (int d = 0; d < 3; d++)
                        i[d] = oi[d] * g.s[d] - g.p[d] + j[d] * g.d[d];
                    int64_t xi = at3(g.x, i);
                    if (xi >= 0)
                        acc += w[(m * Cg + c) * g.ks + t] *
                               x[(n * p->C + m / Mg * Cg + c) * g.xs + xi];
                }
            y[nm * g.ys + o] = acc;
        }
    }
}

/* y = b, then each x[n, c, i] times w[c, mm, j] lands on y[n, m, i*s - p + j*d] */
static void naive_convtranspose(const ai_conv_params *p, double *y, const double *x,
                                const double *w, const double *b)
{
    conv3 g = conv3_of(p);
    int64_t Cg = p->C / p->group, Mg = p->M / p->group;
    for (int64_t nm = 0; nm < p->N * p->M; nm++)
        for (int64_t o = 0; o < g.ys; o++)
            y[nm * g.ys + o] = b ? b[nm % p->M] : 0;
    for (int64_t nc = 0; nc < p->N * p->C; nc++) {
        int64_t n = nc / p->C, c = nc % p->C;
        for (int64_t xi = 0; xi < g.xs; xi++) {
            int64_t i[3], j[3], o[3];
            tap3(g.x, xi, i);
            for (int64_t mm = 0; mm < Mg; mm++)
                for (int64_t t = 0; t < g.ks; t++) {
                    tap3(g.k, t, j);
                    for (int d = 0; d < 3; d++)
                        o[d] = i[d] * g.s[d] - g.p[d] + j[d] * g.d[d];
                    int64_t yo = at3(g.y, o);
                    if (yo >= 0)
                        y[(n * p->M + c / Cg * Mg + mm) * g.ys + yo] +=
                            x[nc * g.xs + xi] * w[(c * Mg + mm) * g.ks + t];
                }
        }
    }
}

typedef struct {
    ai_conv_params p;
    bool transposed;
    double *x, *w, *b, *ws;
} conv_ctx;

static void conv_eval(void *ctx, double *y)
{
    conv_ctx *c = ctx;
    if (c->transposed)
        ai_convtranspose_forward_f64(&c->p, y, c->x, c->w, c->b, c->ws);
    else
        ai_conv_forward_f64(&c->p, y, c->x, c->w, c->b, c->ws, NULL);
}

static void check_conv_case(const conv_case *cc, bool transposed)
{
    conv_ctx c = {.p = conv_params_of(cc, transposed), .transposed = transposed};
    ai_conv_params *p = &c.p;
    ai_status st = transposed ? ai_convtranspose_infer_out(p) : ai_conv_infer_out(p);
    CHECK_OK(st);
    if (st != AI_OK)
        return;
    void (*backward)(const ai_conv_params *, double *, double *, double *, const double *,
                     const double *, const double *, double *, bool) =
        transposed ? ai_convtranspose_backward_f64 : ai_conv_backward_f64;
    size_t (*ws_bytes)(const ai_conv_params *, ai_dtype) =
        transposed ? ai_convtranspose_workspace_bytes : ai_conv_workspace_bytes;
    int64_t nx = p->N * p->C * prod(p->nsp, p->in);
    int64_t ny = p->N * p->M * prod(p->nsp, p->out);
    int64_t nw = p->C * (p->M / p->group) * prod(p->nsp, p->kernel), nb = p->M;
    c.x = random_f64(nx);
    c.w = random_f64(nw);
    c.b = random_f64(nb);
    c.ws = ws_bytes(p, AI_F64) ? malloc(ws_bytes(p, AI_F64)) : NULL; /* exact: ASan checks */
    double *y = zeros_f64(ny), *yref = zeros_f64(ny), *dy = random_f64(ny);

    /* forward, with and without bias, against the naive twin */
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        double *b = with_bias ? c.b : NULL;
        (transposed ? naive_convtranspose : naive_conv)(p, yref, c.x, c.w, b);
        if (transposed)
            ai_convtranspose_forward_f64(p, y, c.x, c.w, b, c.ws);
        else
            ai_conv_forward_f64(p, y, c.x, c.w, b, c.ws, NULL);
        CHECK(close_to(y, NULL, yref, ny, 1e-12));
    }

    /* backward against central differences of sum(dy * y) */
    double *dx = zeros_f64(nx), *dw = zeros_f64(nw), *db = zeros_f64(nb);
    backward(p, dx, dw, db, dy, c.x, c.w, c.ws, false);
    CHECK(finite_differences(c.x, nx, dx, conv_eval, &c, y, dy, ny));
    CHECK(finite_differences(c.w, nw, dw, conv_eval, &c, y, dy, ny));
    CHECK(finite_differences(c.b, nb, db, conv_eval, &c, y, dy, ny));

    /* one gradient at a time gives the same; a second call adds it again */
    double *gx = zeros_f64(nx), *gw = zeros_f64(nw), *gb = zeros_f64(nb);
    backward(p, gx, NULL, NULL, dy, c.x, c.w, c.ws, false);
    backward(p, NULL, gw, NULL, dy, c.x, c.w, c.ws, false);
    backward(p, NULL, NULL, gb, dy, c.x, c.w, c.ws, false);
    CHECK(close_to(gx, NULL, dx, nx, 1e-12));
    CHECK(close_to(gw, NULL, dw, nw, 1e-12));
    CHECK(close_to(gb, NULL, db, nb, 1e-12));
    backward(p, gx, gw, gb, dy, c.x, c.w, c.ws, false);
    CHECK(twice(gx, dx, nx) && twice(gw, dw, nw) && twice(gb, db, nb));

    /* assign_dx overwrites a garbage dx (NaN: any read of it shows) */
    for (int64_t i = 0; i < nx; i++)
        gx[i] = NAN;
    backward(p, gx, NULL, NULL, dy, c.x, c.w, c.ws, true);
    CHECK(close_to(gx, NULL, dx, nx, 1e-12));
    for (int64_t i = 0; i < nx; i++)
        gx[i] = NAN;
    backward(p, gx, gw, NULL, dy, c.x, c.w, c.ws, true); /* dw still accumulates */
    CHECK(close_to(gx, NULL, dx, nx, 1e-12));
    for (int64_t i = 0; i < nw; i++) /* 3 dw: one more on top of 2 dw */
        gw[i] -= dw[i];
    CHECK(twice(gw, dw, nw));

    /* float32 against float64 */
    float *xf = to_f32(c.x, nx), *wf = to_f32(c.w, nw), *bf = to_f32(c.b, nb);
    float *dyf = to_f32(dy, ny), *yf = zeros_f32(ny);
    float *dxf = zeros_f32(nx), *dwf = zeros_f32(nw), *dbf = zeros_f32(nb);
    float *wsf = ws_bytes(p, AI_F32) ? malloc(ws_bytes(p, AI_F32)) : NULL;
    (transposed ? naive_convtranspose : naive_conv)(p, yref, c.x, c.w, c.b);
    if (transposed) {
        ai_convtranspose_forward_f32(p, yf, xf, wf, bf, wsf);
        ai_convtranspose_backward_f32(p, dxf, dwf, dbf, dyf, xf, wf, wsf, false);
    } else {
        ai_conv_forward_f32(p, yf, xf, wf, bf, wsf, NULL);
        ai_conv_backward_f32(p, dxf, dwf, dbf, dyf, xf, wf, wsf, false);
        /* dw alone (an input that needs no gradient: other kernels) */
        float *dwf1 = zeros_f32(nw);
        ai_conv_backward_f32(p, NULL, dwf1, NULL, dyf, xf, wf, wsf, false);
        CHECK(close_to(NULL, dwf1, dw, nw, 1e-5));
        free(dwf1);
        /* the epilogue in the forward: bitwise the passes it replaces */
        float *ye = zeros_f32(ny), *ab = zeros_f32(2 * p->M);
        for (int64_t m = 0; m < 2 * p->M; m++)
            ab[m] = m < p->M ? (float)(0.5 + 0.25 * (double)(m % 5)) - (m % 3 == 1 ? 2.0f : 0.0f)
                             : (float)(0.125 * (double)(m % 7) - 0.375);
        for (int relu = 0; relu < 2; relu++) {
            const ai_conv_epilogue ep = {ab, relu};
            ai_conv_forward_f32(p, ye, xf, wf, bf, wsf, &ep);
            int64_t S = ny / (p->N * p->M), bad = 0;
            for (int64_t i = 0; i < ny; i++) {
                const int64_t m = i / S % p->M;
                float v = yf[i] * ab[m] + ab[p->M + m];
                v = relu && !(v > 0) ? 0 : v;
                bad += memcmp(&v, &ye[i], sizeof v) != 0;
            }
            CHECK(bad == 0);
        }
        free(ye);
        free(ab);
    }
    CHECK(close_to(NULL, yf, yref, ny, 1e-5));
    CHECK(close_to(NULL, dxf, dx, nx, 1e-5));
    CHECK(close_to(NULL, dwf, dw, nw, 1e-5));
    CHECK(close_to(NULL, dbf, db, nb, 1e-5));

    free(xf), free(wf), free(bf), free(dyf), free(yf), free(dxf), free(dwf), free(dbf);
    free(wsf), free(gx), free(gw), free(gb), free(dx), free(dw), free(db);
    free(y), free(yref), free(dy), free(c.x), free(c.w), free(c.b), free(c.ws);
}

/* 1-D, 2-D, 3-D; groups, depthwise, stride 2, dilation 2, asymmetric pads,
 * 1x1, batch 2, odd sizes. opad is used by ConvTranspose only. */
static const conv_case conv_cases[] = {
    {.nsp = 1, .N = 1, .C = 2, .M = 3, .group = 1, .in = {7}, .kernel = {3}, .pb = {1},
     .pe = {1}},
    {.nsp = 1, .N = 2, .C = 2, .M = 2, .group = 1, .in = {9}, .kernel = {3}, .stride = {2},
     .dilation = {2}, .pb = {2}, .pe = {0}, .opad = {1}},
    {.nsp = 1, .N = 2, .C = 3, .M = 2, .group = 1, .in = {11}, .kernel = {4},
     .stride = {3}, .pb = {2}, .pe = {1}, .opad = {2}},
    {.nsp = 2, .N = 2, .C = 3, .M = 4, .group = 1, .in = {5, 6}, .kernel = {3, 3},
     .pb = {1, 1}, .pe = {1, 1}},
    {.nsp = 2, .N = 1, .C = 4, .M = 6, .group = 2, .in = {6, 5}, .kernel = {2, 3},
     .stride = {2, 1}, .dilation = {1, 2}, .pb = {1, 0}, .pe = {0, 2}, .opad = {1, 1}},
    {.nsp = 2, .N = 2, .C = 3, .M = 3, .group = 3, .in = {7, 7}, .kernel = {3, 3},
     .stride = {2, 2}, .pb = {1, 1}, .pe = {1, 1}, .opad = {1, 0}}, /* depthwise */
    {.nsp = 2, .N = 2, .C = 3, .M = 5, .group = 1, .in = {4, 5}, .kernel = {1, 1}},
    {.nsp = 2, .N = 1, .C = 4, .M = 2, .group = 2, .in = {4, 5}, .kernel = {1, 1}},
    {.nsp = 2, .N = 1, .C = 2, .M = 3, .group = 1, .in = {5, 3}, .kernel = {1, 1},
     .stride = {2, 2}, .opad = {1, 0}},
    {.nsp = 3, .N = 1, .C = 2, .M = 2, .group = 1, .in = {4, 5, 3}, .kernel = {2, 3, 2},
     .stride = {1, 2, 1}, .dilation = {2, 1, 1}, .pb = {1, 0, 1}, .pe = {0, 1, 1},
     .opad = {1, 1, 0}},
    {.nsp = 3, .N = 2, .C = 4, .M = 2, .group = 2, .in = {3, 3, 4}, .kernel = {2, 2, 2}},
    /* float32 pointwise backward without the GEMM library (the weight-
     * gradient tiles of conv_pointwise.c): input channels over a vector (a
     * part-filled last one), a partial row tile of dw; 1-D and 2-D planes
     * over 64 positions */
    {.nsp = 2, .N = 3, .C = 20, .M = 13, .group = 1, .in = {9, 11}, .kernel = {1, 1}},
    {.nsp = 1, .N = 2, .C = 70, .M = 7, .group = 1, .in = {67}, .kernel = {1}},
    /* float32 weight gradient alone by their im2col form: 36 and 40 columns
     * (a part-filled vector), strided, padded, 33 and 40 rows (a partial
     * row tile) */
    {.nsp = 2, .N = 3, .C = 3, .M = 33, .group = 1, .in = {12, 9}, .kernel = {4, 3},
     .stride = {2, 1}, .pb = {1, 0}, .pe = {2, 1}},
    {.nsp = 2, .N = 2, .C = 1, .M = 40, .group = 1, .in = {15, 8}, .kernel = {10, 4},
     .stride = {2, 2}},
};

TEST(conv_forward_backward_against_naive_and_finite_differences)
{
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
        check_conv_case(&conv_cases[i], false);
}

TEST(convtranspose_forward_backward_against_naive_and_finite_differences)
{
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
        check_conv_case(&conv_cases[i], true);
}

TEST(conv_output_sizes_and_workspace)
{
    ai_conv_params p = {.nsp = 2, .N = 1, .C = 4, .M = 6, .group = 2, .in = {10, 7},
                        .kernel = {3, 2}, .stride = {2, 3}, .dilation = {2, 1},
                        .pad_begin = {1, 0}, .pad_end = {2, 1}};
    CHECK_OK(ai_conv_infer_out(&p));
    /* floor((10 + 3 - 4 - 1) / 2) + 1, floor((7 + 1 - 1 - 1) / 3) + 1 */
    CHECK(p.out[0] == 5 && p.out[1] == 3);
    CHECK(ai_conv_workspace_bytes(&p, AI_F32) == 2 * 6 * 15 * sizeof(float));
    CHECK(ai_conv_workspace_bytes(&p, AI_F64) == 2 * 6 * 15 * sizeof(double));
    p.output_padding[0] = 1;
    CHECK_OK(ai_convtranspose_infer_out(&p));
    /* 2*9 + 1 + 5 - 3, 3*6 + 0 + 2 - 1 */
    CHECK(p.out[0] == 21 && p.out[1] == 19);
    CHECK(ai_convtranspose_workspace_bytes(&p, AI_F64) == 3 * 6 * 70 * sizeof(double));
    ai_conv_params pw = {.nsp = 1, .N = 1, .C = 2, .M = 2, .group = 1, .in = {5},
                         .kernel = {1}, .stride = {1}, .dilation = {3}};
    CHECK_OK(ai_conv_infer_out(&pw));
    CHECK(ai_conv_workspace_bytes(&pw, AI_F64) == 0); /* a GEMM in place */
    /* float32: the direct pointwise kernel's packed weights (one tile of 6
     * channels by 2) and 8 slots of a (2, 16) panel and a (24, 16) tile (4
     * channel tiles: the 16-lane kernel's) */
    CHECK(ai_conv_workspace_bytes(&pw, AI_F32) == (6 * 2 + 8 * (2 + 24) * 16) * sizeof(float));
    pw.pad_end[0] = 1; /* 1x1 but y is longer than x: columns needed */
    CHECK_OK(ai_conv_infer_out(&pw));
    CHECK(ai_conv_workspace_bytes(&pw, AI_F32) == 2 * 6 * sizeof(float));
}

static bool conv_error(ai_conv_params p, bool transposed, const char *needle)
{
    ai_status st = transposed ? ai_convtranspose_infer_out(&p) : ai_conv_infer_out(&p);
    if (st == AI_ERR_VALUE && strstr(ai_last_error(), needle))
        return true;
    fprintf(stderr, "    expected a value error with \"%s\", got %s: %s\n", needle,
            ai_status_name(st), ai_last_error());
    return false;
}

TEST(conv_invalid_parameters)
{
    const ai_conv_params ok = {.nsp = 2, .N = 1, .C = 4, .M = 6, .group = 2, .in = {5, 5},
                               .kernel = {3, 3}, .stride = {1, 1}, .dilation = {1, 1}};
    ai_conv_params p = ok;
    CHECK_OK(ai_conv_infer_out(&p));
    CHECK_OK(ai_conv_check(&p));
    p.out[1] = 4;
    CHECK(ai_conv_check(&p) == AI_ERR_VALUE && strstr(ai_last_error(), "output size 4"));
    p = ok, p.nsp = 4;
    CHECK(conv_error(p, false, "4 spatial dims"));
    p = ok, p.group = 3;
    CHECK(conv_error(p, false, "group 3 must divide input channels 4"));
    p = ok, p.M = 5;
    CHECK(conv_error(p, true, "group 2 must divide input channels 4 and output channels 5"));
    p = ok, p.group = 0;
    CHECK(conv_error(p, false, "group 0"));
    p = ok, p.stride[1] = 0;
    CHECK(conv_error(p, false, "stride 0 along spatial dim 1"));
    p = ok, p.dilation[0] = -1;
    CHECK(conv_error(p, true, "dilation -1 along spatial dim 0"));
    p = ok, p.kernel[0] = 0;
    CHECK(conv_error(p, false, "kernel 0"));
    p = ok, p.pad_end[1] = -2;
    CHECK(conv_error(p, false, "pad_end -2"));
    p = ok, p.kernel[1] = 6;
    CHECK(conv_error(p, false, "dilated kernel extent 6 exceeds padded input size 5"));
    p = ok, p.output_padding[0] = 1;
    CHECK(conv_error(p, false, "output_padding must be 0"));
    p = ok, p.stride[0] = 2, p.output_padding[0] = 2;
    CHECK(conv_error(p, true, "must be smaller than stride 2 or dilation 1"));
    p = ok, p.pad_begin[0] = 4, p.pad_end[0] = 4;
    CHECK(conv_error(p, true, "leave output size -1"));
    p = ok, p.N = INT64_C(1) << 30, p.C = p.M = INT64_C(1) << 30, p.group = 1;
    CHECK(ai_conv_infer_out(&p) == AI_ERR_NOMEM);
}

/* ------------------------------------------------------------------- pool */

typedef struct {
    int nsp;
    int64_t N, C, in[3], kernel[3], stride[3], dilation[3], pb[3], pe[3];
    bool ceil_mode;
} pool_case;

/* stride or dilation 0 in a case means 1 */
static ai_pool_params pool_params_of(const pool_case *c)
{
    ai_pool_params p = {.nsp = c->nsp, .N = c->N, .C = c->C, .ceil_mode = c->ceil_mode};
    for (int d = 0; d < c->nsp; d++) {
        p.in[d] = c->in[d];
        p.kernel[d] = c->kernel[d];
        p.stride[d] = c->stride[d] ? c->stride[d] : 1;
        p.dilation[d] = c->dilation[d] ? c->dilation[d] : 1;
        p.pad_begin[d] = c->pb[d];
        p.pad_end[d] = c->pe[d];
    }
    return p;
}

/* torch's pooling_output_shape_pad_lr */
static int64_t torch_pool_out(int64_t in, int64_t k, int64_t pb, int64_t pe, int64_t s,
                              int64_t d, bool ceil_mode)
{
    int64_t num = in + pb + pe - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (out - 1) * s >= in + pb)
        out--;
    return out;
}

typedef struct {
    int64_t x[3], y[3], k[3], s[3], d[3], pb[3], pe[3], xs, ys, ks;
} pool3;

static pool3 pool3_of(const ai_pool_params *p)
{
    pool3 g;
    as3(p->nsp, p->in, 1, g.x);
    as3(p->nsp, p->out, 1, g.y);
    as3(p->nsp, p->kernel, 1, g.k);
    as3(p->nsp, p->stride, 1, g.s);
    as3(p->nsp, p->dilation, 1, g.d);
    as3(p->nsp, p->pad_begin, 0, g.pb);
    as3(p->nsp, p->pad_end, 0, g.pe);
    g.xs = prod(3, g.x);
    g.ys = prod(3, g.y);
    g.ks = prod(3, g.k);
    return g;
}

/* Tap t of output o: its input position i; whether it lies before the
 * padded input's end; the flat input offset, or -1 in the padding. */
static int64_t pool_tap(const pool3 *g, int64_t o, int64_t t, bool *in_padded)
{
    int64_t oi[3], j[3], i[3];
    tap3(g->y, o, oi);
    tap3(g->k, t, j);
    *in_padded = true;
    for (int d = 0; d < 3; d++) {
        i[d] = oi[d] * g->s[d] - g->pb[d] + j[d] * g->d[d];
        *in_padded = *in_padded && i[d] < g->x[d] + g->pe[d];
    }
    return at3(g->x, i);
}

/* The naive twins: every tap of every window. */
static void naive_maxpool(const ai_pool_params *p, double *y, int64_t *idx, const double *x)
{
    pool3 g = pool3_of(p);
    for (int64_t nc = 0; nc < p->N * p->C; nc++, x += g.xs)
        for (int64_t o = 0; o < g.ys; o++) {
            double best = 0;
            int64_t at = -1;
            for (int64_t t = 0; t < g.ks; t++) {
                bool in_padded;
                int64_t i = pool_tap(&g, o, t, &in_padded);
                if (i >= 0 && (at < 0 || x[i] > best || isnan(x[i])))
                    best = x[i], at = i;
            }
            *y++ = best;
            *idx++ = at;
        }
}

static void naive_avgpool(const ai_pool_params *p, double *y, const double *x)
{
    pool3 g = pool3_of(p);
    for (int64_t nc = 0; nc < p->N * p->C; nc++, x += g.xs)
        for (int64_t o = 0; o < g.ys; o++) {
            double sum = 0;
            int64_t real = 0, padded = 0;
            for (int64_t t = 0; t < g.ks; t++) {
                bool in_padded;
                int64_t i = pool_tap(&g, o, t, &in_padded);
                padded += in_padded;
                if (i >= 0)
                    sum += x[i], real++;
            }
            *y++ = sum / (double)(p->count_include_pad ? padded : real);
        }
}

typedef struct {
    ai_pool_params p;
    double *x;
    int64_t *idx;
} pool_ctx;

static void maxpool_eval(void *ctx, double *y)
{
    pool_ctx *c = ctx;
    ai_maxpool_forward_f64(&c->p, y, c->idx, c->x);
}

static void avgpool_eval(void *ctx, double *y)
{
    pool_ctx *c = ctx;
    ai_avgpool_forward_f64(&c->p, y, c->x);
}

/* x = distinct values at least 1/n apart in shuffled order: no ties */
static double *distinct_f64(int64_t n)
{
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = (double)i / (double)n - 0.5;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)((urand() + 1) / 2 * (double)(i + 1));
        double t = v[i];
        v[i] = v[j], v[j] = t;
    }
    return v;
}

static void check_maxpool(pool_ctx *c, int64_t nx, int64_t ny)
{
    ai_pool_params *p = &c->p;
    double *y = zeros_f64(ny), *yref = zeros_f64(ny), *dy = random_f64(ny);
    int64_t *iref = calloc((size_t)ny, sizeof *iref);
    naive_maxpool(p, yref, iref, c->x);
    maxpool_eval(c, y);
    CHECK(memcmp(y, yref, (size_t)ny * sizeof *y) == 0);
    CHECK(memcmp(c->idx, iref, (size_t)ny * sizeof *iref) == 0);

    double *dx = zeros_f64(nx), *dx1;
    ai_maxpool_backward_f64(p, dx, dy, c->idx);
    CHECK(finite_differences(c->x, nx, dx, maxpool_eval, c, y, dy, ny));
    dx1 = copy_f64(dx, nx);
    ai_maxpool_backward_f64(p, dx, dy, c->idx);
    CHECK(twice(dx, dx1, nx));

    float *xf = to_f32(c->x, nx), *dyf = to_f32(dy, ny);
    float *yf = zeros_f32(ny), *dxf = zeros_f32(nx);
    int64_t *idxf = calloc((size_t)ny, sizeof *idxf);
    ai_maxpool_forward_f32(p, yf, idxf, xf);
    ai_maxpool_backward_f32(p, dxf, dyf, idxf);
    CHECK(memcmp(idxf, iref, (size_t)ny * sizeof *iref) == 0);
    CHECK(close_to(NULL, yf, yref, ny, 1e-6));
    CHECK(close_to(NULL, dxf, dx1, nx, 1e-6));
    float *yf1 = zeros_f32(ny); /* the maxima alone (no positions): the same */
    ai_maxpool_forward_f32(p, yf1, NULL, xf);
    CHECK(memcmp(yf1, yf, (size_t)ny * sizeof *yf) == 0);
    free(yf1);

    free(xf), free(dyf), free(yf), free(dxf), free(idxf);
    free(y), free(yref), free(dy), free(iref), free(dx), free(dx1);
}

static void check_avgpool(pool_ctx *c, int64_t nx, int64_t ny)
{
    ai_pool_params *p = &c->p;
    double *y = zeros_f64(ny), *yref = zeros_f64(ny), *dy = random_f64(ny);
    naive_avgpool(p, yref, c->x);
    avgpool_eval(c, y);
    CHECK(close_to(y, NULL, yref, ny, 1e-12));

    double *dx = zeros_f64(nx), *dx1;
    ai_avgpool_backward_f64(p, dx, dy);
    CHECK(finite_differences(c->x, nx, dx, avgpool_eval, c, y, dy, ny));
    dx1 = copy_f64(dx, nx);
    ai_avgpool_backward_f64(p, dx, dy);
    CHECK(twice(dx, dx1, nx));

    float *xf = to_f32(c->x, nx), *dyf = to_f32(dy, ny);
    float *yf = zeros_f32(ny), *dxf = zeros_f32(nx);
    ai_avgpool_forward_f32(p, yf, xf);
    ai_avgpool_backward_f32(p, dxf, dyf);
    CHECK(close_to(NULL, yf, yref, ny, 1e-5));
    CHECK(close_to(NULL, dxf, dx1, nx, 1e-5));

    free(xf), free(dyf), free(yf), free(dxf);
    free(y), free(yref), free(dy), free(dx), free(dx1);
}

static void check_pool_case(const pool_case *pc)
{
    pool_ctx c = {.p = pool_params_of(pc)};
    ai_pool_params *p = &c.p;
    CHECK_OK(ai_pool_infer_out(p));
    for (int d = 0; d < p->nsp; d++)
        CHECK(p->out[d] == torch_pool_out(p->in[d], p->kernel[d], p->pad_begin[d],
                                          p->pad_end[d], p->stride[d], p->dilation[d],
                                          p->ceil_mode));
    int64_t nx = p->N * p->C * prod(p->nsp, p->in);
    int64_t ny = p->N * p->C * prod(p->nsp, p->out);
    c.x = distinct_f64(nx);
    c.idx = calloc((size_t)ny, sizeof *c.idx);
    check_maxpool(&c, nx, ny);
    for (int cip = 0; cip < 2; cip++) {
        p->count_include_pad = cip;
        check_avgpool(&c, nx, ny);
    }
    free(c.x), free(c.idx);
}

/* ceil_mode with windows past the padded end, dilation 2, asymmetric pads.
 * AveragePool runs them too: with dilation (which torch's lacks) it divides
 * by the taps before the padded end, or by the taps on the input. */
static const pool_case pool_cases[] = {
    {.nsp = 1, .N = 1, .C = 2, .in = {10}, .kernel = {3}, .stride = {2}, .pb = {1},
     .pe = {1}, .ceil_mode = true},
    {.nsp = 1, .N = 2, .C = 1, .in = {9}, .kernel = {4}, .stride = {3}, .dilation = {2},
     .pb = {2}, .pe = {1}, .ceil_mode = true},
    {.nsp = 1, .N = 1, .C = 1, .in = {6}, .kernel = {3}, .stride = {3}, .pb = {1},
     .pe = {1}, .ceil_mode = true},
    {.nsp = 2, .N = 2, .C = 3, .in = {7, 6}, .kernel = {3, 2}, .stride = {2, 2},
     .pb = {1, 1}, .pe = {1, 0}, .ceil_mode = true},
    {.nsp = 2, .N = 1, .C = 2, .in = {8, 8}, .kernel = {2, 2}, .stride = {2, 2}},
    /* 2 x 2 at stride 2 (its AVX-512 kernel): rows of 17 outputs (a whole
     * vector and a partial one), odd sizes, the last plane read to its end */
    {.nsp = 2, .N = 2, .C = 3, .in = {7, 35}, .kernel = {2, 2}, .stride = {2, 2}},
    /* rows of at most 8 outputs, two at a time: an odd count of them (the
     * last alone), odd widths, 8 outputs (the whole vector) */
    {.nsp = 2, .N = 2, .C = 3, .in = {10, 10}, .kernel = {2, 2}, .stride = {2, 2}},
    {.nsp = 2, .N = 1, .C = 2, .in = {7, 3}, .kernel = {2, 2}, .stride = {2, 2}},
    {.nsp = 2, .N = 1, .C = 3, .in = {9, 16}, .kernel = {2, 2}, .stride = {2, 2}},
    {.nsp = 3, .N = 1, .C = 2, .in = {3, 5, 6}, .kernel = {1, 2, 2}, .stride = {2, 2, 2}},
    {.nsp = 2, .N = 1, .C = 2, .in = {6, 7}, .kernel = {3, 2}, .dilation = {2, 2},
     .pb = {1, 1}, .pe = {1, 1}},
    {.nsp = 2, .N = 1, .C = 1, .in = {5, 4}, .kernel = {1, 1}, .stride = {2, 2},
     .ceil_mode = true},
    {.nsp = 3, .N = 1, .C = 2, .in = {5, 4, 6}, .kernel = {2, 3, 2}, .stride = {2, 1, 2},
     .pb = {1, 1, 0}, .pe = {0, 1, 1}, .ceil_mode = true},
    {.nsp = 3, .N = 2, .C = 1, .in = {3, 4, 3}, .kernel = {2, 2, 2}, .dilation = {1, 2, 1}},
};

TEST(pool_forward_backward_against_naive_and_finite_differences)
{
    for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++)
        check_pool_case(&pool_cases[i]);
}

/* Values printed by torch 2.13 for the same calls. */
TEST(pool_matches_torch_values)
{
    ai_pool_params p = {.nsp = 1, .N = 1, .C = 1, .in = {7}, .kernel = {3}, .stride = {2},
                        .dilation = {1}, .pad_begin = {1}, .pad_end = {1}, .ceil_mode = true};
    double x[7] = {1, 2, 3, 4, 5, 6, 7}, y[4];
    /* F.avg_pool1d(arange(1, 8), 3, 2, 1, ceil_mode=True, count_include_pad=...) */
    CHECK_OK(ai_pool_infer_out(&p));
    CHECK(p.out[0] == 4);
    p.count_include_pad = true;
    ai_avgpool_forward_f64(&p, y, x);
    CHECK_CLOSE(y[0], 1, 1e-15);
    CHECK_CLOSE(y[1], 3, 1e-15);
    CHECK_CLOSE(y[2], 5, 1e-15);
    CHECK_CLOSE(y[3], 13.0 / 3, 1e-15);
    p.count_include_pad = false;
    ai_avgpool_forward_f64(&p, y, x);
    CHECK_CLOSE(y[0], 1.5, 1e-15);
    CHECK_CLOSE(y[3], 6.5, 1e-15);
    /* F.avg_pool1d(..., 3, 3, 1, ceil_mode=True): [1, 4, 4.3333] and [1.5, 4, 6.5] */
    p.stride[0] = 3, p.count_include_pad = true;
    CHECK_OK(ai_pool_infer_out(&p));
    CHECK(p.out[0] == 3);
    ai_avgpool_forward_f64(&p, y, x);
    CHECK_CLOSE(y[0], 1, 1e-15);
    CHECK_CLOSE(y[1], 4, 1e-15);
    CHECK_CLOSE(y[2], 13.0 / 3, 1e-15);
    /* F.max_pool1d(ones(4), 1, 2, 0, ceil_mode=True) has 2 outputs, not 3 */
    ai_pool_params q = {.nsp = 1, .N = 1, .C = 1, .in = {4}, .kernel = {1}, .stride = {2},
                        .dilation = {1}, .ceil_mode = true};
    CHECK_OK(ai_pool_infer_out(&q));
    CHECK(q.out[0] == 2);
    /* F.max_pool1d([1, nan, 2, nan], 4) -> nan at 3; [3, 1, 3, -inf], 2, 1 ->
     * 3, 3, 3 at 0, 2, 2; [-inf, -inf], 2 -> -inf at 0 */
    double a[4] = {1, NAN, 2, NAN}, b[4] = {3, 1, 3, -INFINITY}, c[2] = {-INFINITY, -INFINITY};
    int64_t idx[3];
    q.in[0] = 4, q.kernel[0] = 4, q.stride[0] = 1, q.ceil_mode = false;
    CHECK_OK(ai_pool_infer_out(&q));
    ai_maxpool_forward_f64(&q, y, idx, a);
    CHECK(isnan(y[0]) && idx[0] == 3);
    q.kernel[0] = 2;
    CHECK_OK(ai_pool_infer_out(&q));
    ai_maxpool_forward_f64(&q, y, idx, b);
    CHECK(y[0] == 3 && y[1] == 3 && y[2] == 3);
    CHECK(idx[0] == 0 && idx[1] == 2 && idx[2] == 2);
    q.in[0] = 2;
    CHECK_OK(ai_pool_infer_out(&q));
    ai_maxpool_forward_f64(&q, y, idx, c);
    CHECK(y[0] == -INFINITY && idx[0] == 0);
}

static bool pool_error(ai_pool_params p, const char *needle)
{
    ai_status st = ai_pool_infer_out(&p);
    if (st == AI_ERR_VALUE && strstr(ai_last_error(), needle))
        return true;
    fprintf(stderr, "    expected a value error with \"%s\", got %s: %s\n", needle,
            ai_status_name(st), ai_last_error());
    return false;
}

TEST(pool_invalid_parameters)
{
    const ai_pool_params ok = {.nsp = 2, .N = 1, .C = 3, .in = {5, 5}, .kernel = {2, 2},
                               .stride = {2, 2}, .dilation = {1, 1}};
    ai_pool_params p = ok;
    CHECK_OK(ai_pool_infer_out(&p));
    p.out[0] = 3;
    CHECK(ai_pool_check(&p) == AI_ERR_VALUE && strstr(ai_last_error(), "expected 2"));
    p = ok, p.nsp = 0;
    CHECK(pool_error(p, "0 spatial dims"));
    p = ok, p.C = 0;
    CHECK(pool_error(p, "channels 0"));
    p = ok, p.kernel[1] = 0;
    CHECK(pool_error(p, "kernel 0 along spatial dim 1"));
    p = ok, p.stride[0] = 0;
    CHECK(pool_error(p, "stride 0 along spatial dim 0"));
    p = ok, p.dilation[0] = 0;
    CHECK(pool_error(p, "dilation 0"));
    p = ok, p.pad_begin[0] = -1;
    CHECK(pool_error(p, "pad_begin -1"));
    p = ok, p.kernel[0] = 6;
    CHECK(pool_error(p, "dilated kernel extent 6 leaves no output"));
    /* taps at -1 and 2 of an input of 2: torch gives -inf with index 2 */
    p = ok, p.nsp = 1, p.in[0] = 2, p.stride[0] = 1, p.dilation[0] = 3, p.pad_begin[0] = 1;
    p.pad_end[0] = 1;
    CHECK(pool_error(p, "window 0 along spatial dim 0 covers only padding"));
}

TEST(global_pools)
{
    enum { NC = 6, S = 7 };
    double x[NC * S], y[NC], dy[NC], dx[NC * S] = {0}, ref[NC];
    int64_t idx[NC];
    for (int i = 0; i < NC * S; i++)
        x[i] = urand();
    for (int i = 0; i < NC; i++)
        dy[i] = urand();
    x[1 * S + 2] = x[1 * S + 5] = 3;      /* tie: the first wins */
    x[2 * S + 1] = x[2 * S + 4] = NAN;    /* NaN: the last one, as torch */
    for (int i = 0; i < S; i++)
        x[3 * S + i] = -INFINITY;         /* all -inf: the first */

    ai_global_maxpool_forward_f64(y, idx, x, NC, S);
    CHECK(y[1] == 3 && idx[1] == 2);
    CHECK(isnan(y[2]) && idx[2] == 4);
    CHECK(y[3] == -INFINITY && idx[3] == 0);
    for (int nc = 0; nc < NC; nc++)
        if (nc != 2)
            CHECK(x[nc * S + idx[nc]] == y[nc]);
    ai_global_maxpool_backward_f64(dx, dy, idx, NC, S);
    ai_global_maxpool_backward_f64(dx, dy, idx, NC, S);
    for (int i = 0; i < NC * S; i++)
        CHECK(dx[i] == (i % S == idx[i / S] ? 2 * dy[i / S] : 0));

    for (int nc = 0; nc < NC; nc++) {
        ref[nc] = 0;
        for (int i = 0; i < S; i++)
            x[nc * S + i] = urand(), ref[nc] += x[nc * S + i] / S;
    }
    ai_global_avgpool_forward_f64(y, x, NC, S);
    CHECK(close_to(y, NULL, ref, NC, 1e-14));
    memset(dx, 0, sizeof dx);
    ai_global_avgpool_backward_f64(dx, dy, NC, S);
    ai_global_avgpool_backward_f64(dx, dy, NC, S);
    for (int i = 0; i < NC * S; i++)
        CHECK_CLOSE(dx[i], 2 * dy[i / S] / S, 1e-15);

    float xf[NC * S], yf[NC], dyf[NC], dxf[NC * S] = {0};
    for (int i = 0; i < NC * S; i++)
        xf[i] = (float)x[i];
    for (int i = 0; i < NC; i++)
        dyf[i] = (float)dy[i];
    ai_global_avgpool_forward_f32(yf, xf, NC, S);
    CHECK(close_to(NULL, yf, ref, NC, 1e-6));
    ai_global_avgpool_backward_f32(dxf, dyf, NC, S);
    for (int i = 0; i < NC * S; i++)
        CHECK_CLOSE(dxf[i], dy[i / S] / S, 1e-6);
    ai_global_maxpool_forward_f32(yf, idx, xf, NC, S);
    memset(dxf, 0, sizeof dxf);
    ai_global_maxpool_backward_f32(dxf, dyf, idx, NC, S);
    for (int nc = 0; nc < NC; nc++) {
        CHECK(yf[nc] == xf[nc * S + idx[nc]] && dxf[nc * S + idx[nc]] == dyf[nc]);
        for (int i = 0; i < S; i++)
            CHECK(xf[nc * S + i] <= yf[nc]);
    }
}

/* ---------------------------------------------------------------- gemm */

/* C = alpha op(A) op(B) + beta C in float32 against a float64 sum, with
 * leading dimensions past the matrices' widths; C starts as NaN where beta
 * is 0 (its old values must not reach the result) */
static void check_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                           float beta)
{
    const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
    float *A = malloc(sizeof(float) * (size_t)((ta ? K : M) * lda));
    float *B = malloc(sizeof(float) * (size_t)((tb ? N : K) * ldb));
    float *C = malloc(sizeof(float) * (size_t)(M * ldc));
    double *want = malloc(sizeof(double) * (size_t)(M * N));
    for (int64_t i = 0; i < (ta ? K : M) * lda; i++)
        A[i] = (float)urand();
    for (int64_t i = 0; i < (tb ? N : K) * ldb; i++)
        B[i] = (float)urand();
    for (int64_t i = 0; i < M * ldc; i++)
        C[i] = beta == 0 ? NAN : (float)urand();
    double worst = 0, scale = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double sum = 0;
            for (int64_t k = 0; k < K; k++)
                sum += (double)(ta ? A[k * lda + m] : A[m * lda + k]) *
                       (double)(tb ? B[n * ldb + k] : B[k * ldb + n]);
            want[m * N + n] = alpha * sum + (beta == 0 ? 0 : beta * (double)C[m * ldc + n]);
            scale += fabs(sum);
        }
    ai_gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double d = fabs((double)C[m * ldc + n] - want[m * N + n]);
            if (isnan(d) || d > worst)
                worst = isnan(d) ? INFINITY : d;
        }
    /* float32 rounding of sums of K products of magnitude ~1/3 */
    const double tol = 1e-5 * (1 + scale / (double)(M * N)) * sqrt((double)K);
    CHECK(worst <= tol);
    if (!(worst <= tol))
        fprintf(stderr, "  gemm ta=%d tb=%d %lldx%lldx%lld: error %g\n", ta, tb,
                (long long)M, (long long)N, (long long)K, worst);
    free(A);
    free(B);
    free(C);
    free(want);
}

/* One row of C (the library's matrix-vector product), each transpose, with
 * beta 0 over NaN and beta 0.5; then, at 2 threads, a product split into row
 * panels of 8 whose last panel is one row of a transposed, strided A. */
TEST(gemm_f32_single_rows)
{
    for (int t = 0; t < 4; t++) {
        check_gemm_f32(t & 1, t & 2, 1, 16, 16, 1.0f, 0.0f);
        check_gemm_f32(t & 1, t & 2, 1, 37, 70, 0.5f, 0.5f);
        check_gemm_f32(t & 1, t & 2, 3, 5, 9, 2.0f, 0.0f);
    }
    const int threads = ai_get_num_threads();
    ai_set_num_threads(2);
    check_gemm_f32(true, false, 17, 4, 40000, 1.0f, 0.0f);
    check_gemm_f32(true, true, 17, 4, 40000, 1.0f, 0.5f);
    ai_set_num_threads(threads);
}

/* Products with M, N, K >= 128 of op(A) = A and (the weight gradient) of
 * op(A) = A^T with B as it is and N >= 2 M: gemm_tiles.c's AVX-512 kernel
 * where the CPU has it, the library where not (and with the wide kernels off),
 * against the float64 sum: a last tile of 1 row (133 = 22 x 6 + 1), a
 * partial panel of columns, 3 chunks of K of 434 (not a multiple of the
 * 16 x 16 transposes), B and B^T, beta 0 over NaN and beta 0.5. Then the
 * kernel's sums at 1, 2 and 3 threads: the same bits (the pool splits C
 * into panels of rows or columns). */
static void tiles_product(bool ta, bool tb, float *C, const float *A, const float *B)
{
    for (int64_t i = 0; i < 133 * 301; i++)
        C[i] = 0.25f;
    ai_gemm_f32(ta, tb, 133, 300, 1300, 0.5f, A, ta ? 134 : 1303, B, tb ? 1302 : 302, 0.5f, C,
                301);
}

TEST(gemm_f32_tiles)
{
    const bool wide = ai_cpu_avx512();
    const bool cases[3][2] = {{false, false}, {false, true}, {true, false}};
    for (int on = 0; on < 2; on++) {
        ai_set_avx512(on);
        for (int t = 0; t < 3; t++) {
            check_gemm_f32(cases[t][0], cases[t][1], 133, 300, 1300, 0.5f, 0.0f);
            check_gemm_f32(cases[t][0], cases[t][1], 133, 300, 1300, 1.0f, 0.5f);
        }
    }
    ai_set_avx512(wide);
    float *A = malloc(sizeof(float) * 1300 * 1303), *B = malloc(sizeof(float) * 1300 * 1303);
    float *C1 = malloc(sizeof(float) * 133 * 301), *Cn = malloc(sizeof(float) * 133 * 301);
    for (int64_t i = 0; i < 1300 * 1303; i++)
        A[i] = (float)urand();
    for (int64_t i = 0; i < 1300 * 1303; i++)
        B[i] = (float)urand();
    const int threads = ai_get_num_threads();
    for (int t = 0; t < 3; t++) {
        ai_set_num_threads(1);
        tiles_product(cases[t][0], cases[t][1], C1, A, B);
        for (int n = 2; n <= 3; n++) {
            ai_set_num_threads(n);
            tiles_product(cases[t][0], cases[t][1], Cn, A, B);
            CHECK(!wide || memcmp(C1, Cn, sizeof(float) * 133 * 301) == 0);
        }
    }
    ai_set_num_threads(threads);
    free(A);
    free(B);
    free(C1);
    free(Cn);
}

/* The product over a weight packed ahead (the engine's packed weights,
 * packed.c): the same bits as ai_gemm_f32 (gemm_tiles.c packing at every
 * call), B and B^T, beta 0 over NaN and 0.5, at 1, 2 and 3 threads (the
 * pool splits it into panels of 64 columns or of rows), the shapes of
 * gemm_f32_tiles and one split by rows (M > N). */
static void packed_case(bool tb, int64_t M, int64_t N, int64_t K, float beta)
{
    const int64_t lda = K + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
    float *A = malloc(sizeof(float) * (size_t)(M * lda));
    float *B = malloc(sizeof(float) * (size_t)((tb ? N : K) * ldb));
    float *bp = aligned_alloc(64, sizeof(float) * (size_t)ai_gemm_tiles_packed_size(N, K));
    float *C1 = malloc(sizeof(float) * (size_t)(M * ldc));
    float *C2 = malloc(sizeof(float) * (size_t)(M * ldc));
    for (int64_t i = 0; i < M * lda; i++)
        A[i] = (float)urand();
    for (int64_t i = 0; i < (tb ? N : K) * ldb; i++)
        B[i] = (float)urand();
    ai_gemm_tiles_pack(tb, N, K, B, ldb, bp);
    const int threads = ai_get_num_threads();
    for (int n = 1; n <= 3; n++) {
        ai_set_num_threads(n);
        for (int64_t i = 0; i < M * ldc; i++)
            C1[i] = C2[i] = beta == 0 ? NAN : 0.25f;
        ai_gemm_f32(false, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C1, ldc);
        ai_gemm_packed_f32(M, N, K, 0.5f, A, lda, bp, beta, C2, ldc);
        CHECK(memcmp(C1, C2, sizeof(float) * (size_t)(M * ldc)) == 0);
    }
    ai_set_num_threads(threads);
    free(A);
    free(B);
    free(bp);
    free(C1);
    free(C2);
}

TEST(gemm_f32_packed)
{
    if (!ai_gemm_packs(133, 300, 1300))
        return; /* no AVX-512: the engine never packs */
    for (int tb = 0; tb < 2; tb++) {
        packed_case(tb, 133, 300, 1300, 0.0f);
        packed_case(tb, 133, 300, 1300, 0.5f);
        packed_case(tb, 700, 200, 130, 0.0f);
    }
}

/* The attention node's tiles (attn_tiles.c) at each width the CPU runs:
 * C = alpha op(A) B (+ C) against the float64 sum, op(A) = A (rows rsa
 * apart) and A^T (rsa 1, csa its row stride), tiles of 1 to 6 rows and 1
 * to 4 vectors, N = 40 and 72 (with 16 lanes a last 8 columns on the
 * 8-lane tiles), C written over NaN or added to; the transposes exact,
 * zero past the source's rows. */
static void attn_mm_case(int lanes, bool at, int64_t m, int64_t nv, int64_t K, bool acc)
{
    const int64_t N = nv * 8, lda = (at ? m : K) + 3, ldb = N + 5, ldc = N + 2;
    float *A = malloc(sizeof(float) * (size_t)((at ? K : m) * lda));
    float *B = malloc(sizeof(float) * (size_t)(K * ldb));
    float *C = malloc(sizeof(float) * (size_t)(m * ldc));
    for (int64_t i = 0; i < (at ? K : m) * lda; i++)
        A[i] = (float)urand();
    for (int64_t i = 0; i < K * ldb; i++)
        B[i] = (float)urand();
    for (int64_t i = 0; i < m * ldc; i++)
        C[i] = acc ? (float)urand() : NAN;
    float *C0 = malloc(sizeof(float) * (size_t)(m * ldc));
    memcpy(C0, C, sizeof(float) * (size_t)(m * ldc));
    ai_attn_mm_f32(lanes, m, N, K, 0.5f, A, at ? 1 : lda, at ? lda : 1, B, ldb, acc, C, ldc);
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < N; j++) {
            double want = acc ? C0[i * ldc + j] : 0;
            for (int64_t k = 0; k < K; k++)
                want += 0.5 * A[at ? k * lda + i : i * lda + k] * B[k * ldb + j];
            const double err = fabs(C[i * ldc + j] - want);
            worst = err > worst || isnan(err) ? err : worst;
        }
    CHECK(worst <= 1e-5 * K);
    free(A);
    free(B);
    free(C);
    free(C0);
}

TEST(attn_tiles)
{
    const bool wide = ai_cpu_avx512();
    for (int on = 0; on < 2; on++) {
        ai_set_avx512(on);
        const int lanes = ai_attn_lanes();
        if (!lanes)
            continue;
        for (int at = 0; at < 2; at++)
            for (int64_t m = 1; m <= 13; m += 4)
                for (int64_t nv = 5; nv <= 9; nv += 4) {
                    attn_mm_case(lanes, at, m, nv, 37, false);
                    attn_mm_case(lanes, at, m, nv, 1, true);
                }
        const int64_t rows = 21, cols = 16, lds = 19, ldd = 32;
        float src[21 * 19], dst[16 * 32];
        for (int64_t i = 0; i < rows * lds; i++)
            src[i] = (float)urand();
        for (int64_t i = 0; i < cols * ldd; i++)
            dst[i] = NAN;
        ai_attn_transpose_f32(lanes, rows, cols, src, lds, dst, ldd);
        bool same = true;
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = 0; r < ldd; r++)
                same &= dst[c * ldd + r] == (r < rows ? src[r * lds + c] : 0);
        CHECK(same);
    }
    ai_set_avx512(wide);
}

const ctest_case kernel_cases[] = {
    CASE(gemm_f32_single_rows),
    CASE(gemm_f32_tiles),
    CASE(gemm_f32_packed),
    CASE(attn_tiles),
    CASE(conv_forward_backward_against_naive_and_finite_differences),
    CASE(convtranspose_forward_backward_against_naive_and_finite_differences),
    CASE(conv_output_sizes_and_workspace),
    CASE(conv_invalid_parameters),
    CASE(pool_forward_backward_against_naive_and_finite_differences),
    CASE(pool_matches_torch_values),
    CASE(pool_invalid_parameters),
    CASE(global_pools),
    {NULL, NULL},
};
