/*
 * conv_shifted_gemm.c — stride-1 convolution as one GEMM per kernel tap, on
 * zero-padded planes: no im2col. Taken for stride-1 convs of 1 or 2 spatial
 * dims with at least SHIFTED_GEMM_MIN_CG input channels per group, where each
 * tap's GEMM is thick enough to run at the library's speed.
 *
 *   forward   grid (M, span) = sum over taps k of W_k (M, Cg) @ planes[off_k:]
 *   dx        dplanes[off_k:] += W_k^T @ grid(dy), for each tap k
 *   dw        dW_k (M, Cg) += grid(dy) @ planes[off_k:]^T, for each tap k
 *
 * W_k = w[:, :, k]; planes (Cg, span): x's padded planes side by side.
 */
#include "conv_internal.h"

/*
 * Stride-1 Conv of 1 or 2 spatial dims as "shifted GEMMs", without im2col.
 * The images are zero-padded into planes of Q1 rows of Q2 (the padded height
 * and width) and a zero tail, `nb` images side by side in one row per
 * channel (`span` = nb * PS elements). On the output grid "out1 rows of Q2"
 * (the last Q2 - out2 of each row are junk), kernel tap k = (k1, k2) reads
 * the padded planes from offset off_k = k1 d1 Q2 + k2 d2 on: its operand is
 * a view, and the conv is one GEMM per tap, W_k (M, C) @ planes,
 * accumulated. The junk columns cost (Q2 - out2) / Q2 more flops; a few
 * input channels per group make each GEMM too thin, so those convs keep
 * im2col. (Strided convs split into stride-phase planes the same way are
 * no faster than im2col: each tap's GEMM gets 1/stride^2 of the
 * columns with the same thin K.)
 */
typedef struct {
    int64_t Q1, Q2, PS, L; /* padded rows and row, plane + tail, grid of one image */
    int64_t nb, span;      /* images per chunk, elements per channel row */
    int64_t cb; /* grid columns per block: every tap's GEMM on a block that stays in cache */
} shifted_gemm_geom;

#ifndef SHIFTED_GEMM_MIN_CG
#define SHIFTED_GEMM_MIN_CG 8 /* fewer input channels per group: im2col */
#endif
#ifndef SHIFTED_GEMM_BLOCK
#define SHIFTED_GEMM_BLOCK 65536 /* elements of an output block: 256 KiB of float32 */
#endif

static bool shifted_gemm_geom_of(const ai_conv_params *p, const conv_geom *g, shifted_gemm_geom *sh)
{
    int64_t Cg = p->C / p->group;
    if (g->pointwise || conv_is_depthwise(p) || g->img[0] != 1 || Cg < SHIFTED_GEMM_MIN_CG ||
        p->N == 0 || g->s[1] != 1 || g->s[2] != 1)
        return false;
    int64_t tail = (g->k[2] - 1) * g->d[2]; /* largest shift along a row */
    sh->Q1 = g->grid[1] + (g->k[1] - 1) * g->d[1];
    sh->Q2 = g->grid[2] + tail;
    /* planes at most twice the output's sides: the products below fit int64 */
    if (sh->Q1 > 2 * g->grid[1] || sh->Q2 > 2 * g->grid[2])
        return false;
    sh->PS = sh->Q1 * sh->Q2 + tail;
    sh->L = g->grid[1] * sh->Q2;
    if (2 * sh->L > 3 * g->grid_size) /* more than 1.5x the flops of im2col */
        return false;
    int64_t rows = p->C > p->M ? p->C : p->M;
    if (sh->PS > (INT64_C(1) << 40) / (2 * rows)) /* leave the huge to im2col */
        return false;
    /* images per chunk: buffers of about 2^20 elements, at least one image */
    sh->nb = (INT64_C(1) << 20) / (sh->PS * rows);
    sh->nb = sh->nb < 1 ? 1 : sh->nb > p->N ? p->N : sh->nb;
    sh->span = sh->nb * sh->PS;
    int64_t cg_mg = Cg > p->M / p->group ? Cg : p->M / p->group;
    sh->cb = (SHIFTED_GEMM_BLOCK / cg_mg + 15) / 16 * 16;
    return true;
}

/* Elements of the shifted-GEMM workspace: padded x and padded dx (C, span),
 * the output grid (M, span), the weights and their gradient per tap (K, M, Cg). */
static int64_t shifted_gemm_elems(const ai_conv_params *p, const conv_geom *g,
                                  const shifted_gemm_geom *sh)
{
    return (2 * p->C + p->M) * sh->span + 2 * g->ksize * p->M * (p->C / p->group);
}

#define T float
#define SFX _f32
#define GEMM ai_gemm_f32
#include "conv_shifted_gemm_impl.h"

#define T double
#define SFX _f64
#define GEMM ai_gemm_f64
#include "conv_shifted_gemm_impl.h"

bool shifted_gemm_accepts(const ai_conv_params *p, const conv_geom *g)
{
    shifted_gemm_geom sh;
    return shifted_gemm_geom_of(p, g, &sh);
}

bool shifted_gemm_forward(const conv_call *c)
{
    return c->dtype == AI_F32 ? forward_f32(c) : forward_f64(c);
}

bool shifted_gemm_backward(conv_call *c)
{
    return c->dtype == AI_F32 ? backward_f32(c) : backward_f64(c);
}

int64_t shifted_gemm_workspace(const ai_conv_params *p, const conv_geom *g)
{
    shifted_gemm_geom sh;
    return shifted_gemm_geom_of(p, g, &sh) ? shifted_gemm_elems(p, g, &sh) : 0;
}
