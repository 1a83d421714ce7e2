/*
 * conv_pointwise.c — 1x1 convolutions (stride 1, no padding, one group):
 * per image a product y (M, S) = w (M, C) @ x (C, S), with S the positions.
 *
 *   forward   float32, at most POINTWISE_DIRECT_MAX_C input channels: a register tile of
 *             POINTWISE_DIRECT_MR output channels by POINTWISE_DIRECT_NR positions reading x in
 * place, the weights packed once per call, the bias and the epilogue in registers
 * ("pointwise_direct"). Else by the GEMM library: small planes (at most PW_BATCH_MAX positions) as
 * one GEMM over the batch, xs (C, N S) gathered; small GEMMs on several threads image by image
 * (each on one thread); else a GEMM per image (conv_im2col.c). dx        dx = w^T @ dy: the forward
 * kernel on w^T (written, assign_dx), one GEMM over the batch, or image by image. dw        dw (M,
 * C) += sum over images of dy (M, S) @ x (C, S)^T by tiles of POINTWISE_WEIGHT_GRAD_MR rows by
 * vectors of columns ("pointwise_weight_grad"), images and positions summed in order; the same
 * tiles take the im2col columns of a model's first conv (its input needs no gradient).
 *
 * Each output element is summed on one thread in a fixed order: the same
 * values at any thread count.
 */
#include "conv_internal.h"

/*
 * Pointwise forwards on small planes (MobileNet's last blocks: 6x6 and 3x3)
 * take one GEMM for the whole batch: x's planes gathered side by side as
 * xs (C, N OS), ys (M, N OS) = w @ xs, then scattered into y with the bias
 * and the epilogue. The library packs w once instead of once per image,
 * and its tiles are not cut by planes of 9 or 36 columns. Planes of
 * PW_BATCH_MAX positions or fewer: on larger planes (KWS's 25x5) a GEMM
 * per image already has wide tiles and the gather and scatter cost more
 * than they save. The backward the same way (conv_pointwise_impl.h): dy
 * gathered once, dw += dys @ xs^T in one GEMM of depth N OS (not N GEMMs
 * of depth OS), dxs = w^T @ dys scattered into dx, under the same bound
 * (benchmarks/results/kernels-conv.md, "Pointwise convolutions").
 */
#define PW_BATCH_MAX 64
static bool pointwise_batched_accepts(const ai_conv_params *p, const conv_geom *g)
{
    return g->pointwise && p->group == 1 && p->N > 1 && g->grid_size <= PW_BATCH_MAX;
}

/*
 * On more than one thread, pointwise forwards whose GEMM per image is under
 * PW_IMAGE_FLOPS (the GEMMs then stay on one thread, gemm.c) split the
 * images across threads instead: each image's GEMM on one thread, the same
 * library call, so the same values, with no pool pass per image (each
 * GEMM in turn on one thread would leave the pool's other threads waking
 * and waiting around each pass). Their backward
 * (pointwise_small_images, at any thread count, so that the values do not depend on it):
 * dx image by image and dw by panels of 64 of its rows (each summed over
 * the images in order) in one pass of the pool (conv_pointwise_impl.h), for
 * the same reason.
 */
#define PW_IMAGE_FLOPS (INT64_C(1) << 21)
static bool pointwise_small_images(const ai_conv_params *p, const conv_geom *g)
{
    return g->pointwise && p->group == 1 && p->N > 1 &&
           2 * p->M * p->C * g->grid_size < PW_IMAGE_FLOPS;
}

static bool pointwise_images_accepts(const ai_conv_params *p, const conv_geom *g)
{
    return pointwise_small_images(p, g) && ai_get_num_threads() > 1;
}

/* ------------------------------------------------ pointwise direct kernel (pointwise_direct) */

/*
 * Direct float32 pointwise Conv ("pointwise_direct"): 1x1 kernel, stride 1, no padding,
 * one group, at most POINTWISE_DIRECT_MAX_C input channels. y (M, S) = w (M, C) @ x (C,
 * S) per image is a GEMM whose depth C is small (8 to 256 in the model
 * suite), and the library packs both operands at every call, image by image:
 * here the weights are packed once per forward, (M / POINTWISE_DIRECT_MR, C, POINTWISE_DIRECT_MR),
 * x not at all, and a register
 * tile of POINTWISE_DIRECT_MR output channels by POINTWISE_DIRECT_NR positions (12 accumulators: 2
 * vector loads of x, 6 broadcasts of weights, 12 FMAs per input channel)
 * reads x in place, its C rows of 16 positions staying in L1 while the tile
 * walks down the output channels. The bias, the epilogue (as ep_apply: no
 * multiply-add contracted) and Relu are applied in registers before the
 * store: no pass over y afterwards.
 * Planes of POINTWISE_DIRECT_SMALL_S positions or fewer (MobileNet's 6x6 and 3x3) take
 * their positions across the batch: a block's 16 positions may span
 * images, their C values copied into a panel (C, 16), and the tile's rows
 * scattered to their images (a GEMM per image would have blocks of 9 or 36
 * columns). A plane's last block, when shorter than 16, is read from a
 * zero-padded panel too.
 * The blocked-channel chains (below) do not come here: this is the NCHW
 * forward (training graphs, convs outside chains).
 * Workspace: the packed weights, and a panel and a tile per slot (thread).
 */
#define POINTWISE_DIRECT_MR 6
#define POINTWISE_DIRECT_NR 16
#define POINTWISE_DIRECT_MAX_C 256
#define POINTWISE_DIRECT_SMALL_S 64
#define POINTWISE_DIRECT_SLOTS 8
#define POINTWISE_DIRECT_WIDE 4 /* channel tiles of a 16-lane tile (AVX-512): 24 accumulators */

typedef struct {
    int64_t S, MT;     /* positions per plane, channel tiles */
    int64_t blocks;    /* position blocks of the batch */
    int64_t per_image; /* blocks per image (0: blocks span images) */
} pointwise_direct_geom;

static bool pointwise_direct_geom_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype,
                                     pointwise_direct_geom *q)
{
#if defined(__GNUC__)
    if (dtype != AI_F32 || !g->pointwise || p->group != 1 || p->N == 0 ||
        p->C > POINTWISE_DIRECT_MAX_C || g->grid_size == 0 || p->M == 0)
        return false;
    q->S = g->grid_size;
    q->MT = (p->M + POINTWISE_DIRECT_MR - 1) / POINTWISE_DIRECT_MR;
    if (q->S <= POINTWISE_DIRECT_SMALL_S) {
        q->per_image = 0;
        q->blocks = (p->N * q->S + POINTWISE_DIRECT_NR - 1) / POINTWISE_DIRECT_NR;
    } else {
        q->per_image = (q->S + POINTWISE_DIRECT_NR - 1) / POINTWISE_DIRECT_NR;
        q->blocks = p->N * q->per_image;
    }
    return true;
#else
    (void)p, (void)g, (void)dtype, (void)q;
    return false;
#endif
}

/* the packed weights (MT MR, C), then per slot a panel (C, NR) and a tile
 * (POINTWISE_DIRECT_WIDE MR, NR: the 16-lane kernel's; the 8-lane one uses MR rows) */
static int64_t pointwise_direct_elems(const ai_conv_params *p, const pointwise_direct_geom *q)
{
    return q->MT * POINTWISE_DIRECT_MR * p->C +
           POINTWISE_DIRECT_SLOTS * (p->C + POINTWISE_DIRECT_WIDE * POINTWISE_DIRECT_MR) *
               POINTWISE_DIRECT_NR;
}


#if defined(__GNUC__)

typedef struct {
    const ai_conv_params *p;
    const pointwise_direct_geom *q;
    const float *x, *wp, *b;
    const float *ab; /* the epilogue's factors (2 M), or NULL */
    bool relu;
    float *y, *slots;
    int64_t n_slots;
    int64_t step; /* output channels per tile call: POINTWISE_DIRECT_MR, or POINTWISE_DIRECT_WIDE
                     POINTWISE_DIRECT_MR (wide) */
} pointwise_direct_job;

/* Channels [m0, m0 + mr) by the NR positions of xs (C rows, ld apart) into
 * dst (mr rows, ldd apart; whole vectors), with the bias and the epilogue. */
AI_GEMM_CLONES static void pointwise_direct_tile(const pointwise_direct_job *j, int64_t m0, int mr,
                                                 const float *xs, int64_t ld, float *dst,
                                                 int64_t ldd)
{
    enum { NV = POINTWISE_DIRECT_NR / 8 };
    const int64_t C = j->p->C, M = j->p->M;
    const float *wp = j->wp + m0 * C;
    conv_vec8 acc[POINTWISE_DIRECT_MR][NV];
    for (int r = 0; r < POINTWISE_DIRECT_MR; r++)
        for (int v = 0; v < NV; v++)
            acc[r][v] = (conv_vec8){0};
    for (int64_t c = 0; c < C; c++, wp += POINTWISE_DIRECT_MR, xs += ld) {
        conv_vec8 xv[NV];
        for (int v = 0; v < NV; v++)
            xv[v] = *(const conv_vec8 *)(xs + 8 * v);
        for (int r = 0; r < POINTWISE_DIRECT_MR; r++)
            for (int v = 0; v < NV; v++)
                acc[r][v] += wp[r] * xv[v];
    }
    const float *const bias = j->b, *const ab = j->ab; /* (not reloaded after stores) */
    const bool relu = j->relu;
    for (int r = 0; r < mr; r++) {
        const int64_t m = m0 + r;
        for (int v = 0; v < NV; v++) {
            conv_vec8 t = acc[r][v];
            if (bias)
                t = t + bias[m];
            VEC_EPILOGUE(t, ab, ab[m], ab[M + m], relu);
            *(conv_vec8 *)(dst + r * ldd + 8 * v) = t;
        }
    }
}

#ifdef AI_AVX512_KERNEL
/* pointwise_direct_tile with 16-lane vectors (AVX-512): the NR = 16 positions are one
 * vector, so the tile takes POINTWISE_DIRECT_WIDE channel tiles (rows [m0, m0 + rows),
 * rows <= POINTWISE_DIRECT_WIDE POINTWISE_DIRECT_MR; the packed weights hold zero rows past M): the
 * same sums in the same order as the 8-lane tiles. */
AI_AVX512_KERNEL static void pointwise_direct_tile_v16(const pointwise_direct_job *j, int64_t m0,
                                                       int rows, const float *xs, int64_t ld,
                                                       float *dst, int64_t ldd)
{
    const int64_t C = j->p->C, M = j->p->M;
    const float *wp = j->wp + m0 * C;
    conv_vec16 acc[POINTWISE_DIRECT_WIDE * POINTWISE_DIRECT_MR];
#define POINTWISE_DIRECT_TILE_V16(NT)                                   \
    {                                                                   \
        for (int r = 0; r < (NT) * POINTWISE_DIRECT_MR; r++)            \
            acc[r] = (conv_vec16){0};                                   \
        const float *x = xs;                                            \
        for (int64_t c = 0; c < C; c++, x += ld) {                      \
            const conv_vec16 xv = *(const conv_vec16 *)x;               \
            for (int t = 0; t < (NT); t++)                              \
                for (int r = 0; r < POINTWISE_DIRECT_MR; r++)           \
                    acc[t * POINTWISE_DIRECT_MR + r] +=                 \
                        wp[(t * C + c) * POINTWISE_DIRECT_MR + r] * xv; \
        }                                                               \
    }
    const int nt = (rows + POINTWISE_DIRECT_MR - 1) / POINTWISE_DIRECT_MR;
    if (nt >= 4)
        POINTWISE_DIRECT_TILE_V16(4)
    else if (nt == 3)
        POINTWISE_DIRECT_TILE_V16(3)
    else if (nt == 2)
        POINTWISE_DIRECT_TILE_V16(2)
    else
        POINTWISE_DIRECT_TILE_V16(1)
#undef POINTWISE_DIRECT_TILE_V16
    const float *const bias = j->b, *const ab = j->ab;
    const bool relu = j->relu;
    for (int r = 0; r < rows; r++) {
        const int64_t m = m0 + r;
        conv_vec16 t = acc[r];
        if (bias)
            t = t + bias[m];
        VEC_EPILOGUE_NC(t, ab, ab[m], ab[M + m], relu, VEC16_NO_CONTRACT);
        *(conv_vec16 *)(dst + r * ldd) = t;
    }
}
/* Planes of at least 16 positions, image by image (AVX-512): a tile of
 * POINTWISE_DIRECT_MR channels by up to POINTWISE_DIRECT_WIDE vectors of positions at offsets o[]
 * of image n's plane (the last vector of a plane that is not a multiple of
 * 16 ends at its end, and recomputes lanes the one before it stored: the
 * same values). Per input channel NT vector loads and POINTWISE_DIRECT_MR broadcasts
 * for POINTWISE_DIRECT_MR NT FMAs, where the 24-by-16 tile took a broadcast per FMA.
 * The same sums, in the same order, as the tiles above. */
AI_AVX512_KERNEL static void pointwise_direct_tile_w64(const pointwise_direct_job *j, int64_t m0,
                                                       int rows, int64_t n, const int64_t *o,
                                                       int nt)
{
    const int64_t C = j->p->C, M = j->p->M, S = j->q->S;
    const float *wp = j->wp + m0 * C, *x = j->x + n * C * S;
    conv_vec16 acc[POINTWISE_DIRECT_MR][POINTWISE_DIRECT_WIDE];
#define POINTWISE_DIRECT_TILE_W64(NT)                                         \
    {                                                                         \
        for (int r = 0; r < POINTWISE_DIRECT_MR; r++)                         \
            for (int v = 0; v < (NT); v++)                                    \
                acc[r][v] = (conv_vec16){0};                                  \
        const float *xc = x;                                                  \
        for (int64_t c = 0; c < C; c++, xc += S, wp += POINTWISE_DIRECT_MR) { \
            conv_vec16 xv[NT];                                                \
            for (int v = 0; v < (NT); v++)                                    \
                xv[v] = *(const conv_vec16 *)(xc + o[v]);                     \
            for (int r = 0; r < POINTWISE_DIRECT_MR; r++)                     \
                for (int v = 0; v < (NT); v++)                                \
                    acc[r][v] += wp[r] * xv[v];                               \
        }                                                                     \
    }
    if (nt >= 4)
        POINTWISE_DIRECT_TILE_W64(4)
    else if (nt == 3)
        POINTWISE_DIRECT_TILE_W64(3)
    else if (nt == 2)
        POINTWISE_DIRECT_TILE_W64(2)
    else
        POINTWISE_DIRECT_TILE_W64(1)
#undef POINTWISE_DIRECT_TILE_W64
    const float *const bias = j->b, *const ab = j->ab;
    const bool relu = j->relu;
    for (int r = 0; r < rows; r++) {
        const int64_t m = m0 + r;
        for (int v = 0; v < nt; v++) {
            conv_vec16 t = acc[r][v];
            if (bias)
                t = t + bias[m];
            VEC_EPILOGUE_NC(t, ab, ab[m], ab[M + m], relu, VEC16_NO_CONTRACT);
            *(conv_vec16 *)(j->y + (n * M + m) * S + o[v]) = t;
        }
    }
}

/* items [lo, hi): blocks of POINTWISE_DIRECT_WIDE 16-position vectors, image by image */
static void pointwise_direct_range_w64(void *ctx, int64_t lo, int64_t hi)
{
    const pointwise_direct_job *j = ctx;
    const int64_t M = j->p->M, S = j->q->S,
                  per = (S + 16 * POINTWISE_DIRECT_WIDE - 1) / (16 * POINTWISE_DIRECT_WIDE);
    for (int64_t item = lo; item < hi; item++) {
        const int64_t n = item / per, s0 = item % per * 16 * POINTWISE_DIRECT_WIDE;
        int64_t o[POINTWISE_DIRECT_WIDE];
        int nt = 0;
        for (; nt < POINTWISE_DIRECT_WIDE && s0 + 16 * nt < S; nt++)
            o[nt] = s0 + 16 * nt + 16 <= S ? s0 + 16 * nt : S - 16;
        for (int64_t m0 = 0; m0 < M; m0 += POINTWISE_DIRECT_MR)
            pointwise_direct_tile_w64(
                j, m0, M - m0 < POINTWISE_DIRECT_MR ? (int)(M - m0) : POINTWISE_DIRECT_MR, n, o,
                nt);
    }
}
#endif


/* channels [m0, m0 + rows) by the tile of this CPU (rows <= j->step) */
static inline void pointwise_direct_tile_of(const pointwise_direct_job *j, int64_t m0, int rows,
                                            const float *xs, int64_t ld, float *dst, int64_t ldd)
{
#ifdef AI_AVX512_KERNEL
    if (j->step > POINTWISE_DIRECT_MR) {
        pointwise_direct_tile_v16(j, m0, rows, xs, ld, dst, ldd);
        return;
    }
#endif
    pointwise_direct_tile(j, m0, rows, xs, ld, dst, ldd);
}

/* Block blk's positions: their image n and plane offset s0 when they lie in
 * one image (else n = -1), their count; their x values in xs (ld apart),
 * in place or copied into `panel` (zero past the count). */
static int64_t pointwise_direct_block(const pointwise_direct_job *j, int64_t blk, float *panel,
                                      const float **xs, int64_t *ld, int64_t *n, int64_t *s0)
{
    const pointwise_direct_geom *q = j->q;
    const int64_t C = j->p->C, S = q->S;
    int64_t q0, nq;
    if (q->per_image) {
        *n = blk / q->per_image;
        *s0 = blk % q->per_image * POINTWISE_DIRECT_NR;
        q0 = *n * S + *s0;
        nq = S - *s0 < POINTWISE_DIRECT_NR ? S - *s0 : POINTWISE_DIRECT_NR;
    } else {
        q0 = blk * POINTWISE_DIRECT_NR;
        nq = j->p->N * S - q0 < POINTWISE_DIRECT_NR ? j->p->N * S - q0 : POINTWISE_DIRECT_NR;
        *n = q0 / S;
        *s0 = q0 % S;
        if (*s0 + nq > S)
            *n = -1;
    }
    if (*n >= 0 && nq == POINTWISE_DIRECT_NR) {
        *xs = j->x + *n * C * S + *s0;
        *ld = S;
        return nq;
    }
    for (int64_t i = 0; i < POINTWISE_DIRECT_NR; i++) { /* column i of the panel: position q0 + i */
        const int64_t qi = q0 + i, ni = qi / S, si = qi % S;
        const float *src = j->x + ni * C * S + si;
        if (i < nq)
            for (int64_t c = 0; c < C; c++)
                panel[c * POINTWISE_DIRECT_NR + i] = src[c * S];
        else
            for (int64_t c = 0; c < C; c++)
                panel[c * POINTWISE_DIRECT_NR + i] = 0;
    }
    *xs = panel;
    *ld = POINTWISE_DIRECT_NR;
    return nq;
}

/* Slots [lo, hi): each its share of the blocks, in order. */
static void pointwise_direct_range(void *ctx, int64_t lo, int64_t hi)
{
    const pointwise_direct_job *j = ctx;
    const pointwise_direct_geom *q = j->q;
    const int64_t C = j->p->C, M = j->p->M, S = q->S;
    for (int64_t s = lo; s < hi; s++) {
        float *panel = j->slots +
                       s * (C + POINTWISE_DIRECT_WIDE * POINTWISE_DIRECT_MR) * POINTWISE_DIRECT_NR,
              *tile = panel + C * POINTWISE_DIRECT_NR;
        for (int64_t blk = s * q->blocks / j->n_slots; blk < (s + 1) * q->blocks / j->n_slots;
             blk++) {
            const float *xs;
            int64_t ld, n, s0;
            const int64_t nq = pointwise_direct_block(j, blk, panel, &xs, &ld, &n, &s0);
            for (int64_t m0 = 0; m0 < M; m0 += j->step) {
                const int mr = M - m0 < j->step ? (int)(M - m0) : (int)j->step;
                if (n >= 0 && nq == POINTWISE_DIRECT_NR) { /* whole vectors into y */
                    pointwise_direct_tile_of(j, m0, mr, xs, ld, j->y + (n * M + m0) * S + s0, S);
                    continue;
                }
                pointwise_direct_tile_of(j, m0, mr, xs, ld, tile, POINTWISE_DIRECT_NR);
                const int64_t q0 = n >= 0 ? n * S + s0 : blk * POINTWISE_DIRECT_NR;
                for (int64_t i = 0; i < nq;) { /* runs of positions within one image */
                    const int64_t qi = q0 + i, ni = qi / S, si = qi % S;
                    const int64_t run = S - si < nq - i ? S - si : nq - i;
                    for (int r = 0; r < mr; r++)
                        memcpy(j->y + (ni * M + m0 + r) * S + si,
                               tile + r * POINTWISE_DIRECT_NR + i, sizeof(float) * (size_t)run);
                    i += run;
                }
            }
        }
    }
}
#endif

/* y = the pointwise conv p of x by w (M, C), or by w^T with `wt` (w then
 * (C, M): the input gradient of the conv p with C and M swapped). */
static bool pointwise_direct_run(const ai_conv_params *p, float *y, const float *x, const float *w,
                                 const float *b, float *ws, const ai_conv_epilogue *ep, bool wt)
{
    conv_geom g = conv_geom_of(p, false);
    pointwise_direct_geom q;
    if (!pointwise_direct_geom_of(p, &g, AI_F32, &q))
        return false;
#if defined(__GNUC__)
    const int64_t C = p->C, M = p->M;
    for (int64_t mt = 0; mt < q.MT; mt++) /* (MT, C, MR), zero rows past M */
        for (int64_t c = 0; c < C; c++)
            for (int r = 0; r < POINTWISE_DIRECT_MR; r++) {
                const int64_t m = mt * POINTWISE_DIRECT_MR + r;
                ws[(mt * C + c) * POINTWISE_DIRECT_MR + r] = m >= M ? 0
                                                             : wt   ? w[c * M + m]
                                                                    : w[m * C + c];
            }
    pointwise_direct_job j = {p,
                              &q,
                              x,
                              ws,
                              b,
                              ep ? ep->ab : NULL,
                              ep && ep->relu,
                              y,
                              ws + q.MT * POINTWISE_DIRECT_MR * C,
                              0,
                              ai_cpu_avx512() ? POINTWISE_DIRECT_WIDE * POINTWISE_DIRECT_MR
                                              : POINTWISE_DIRECT_MR};
#ifdef AI_AVX512_KERNEL
    if (j.step > POINTWISE_DIRECT_MR && q.per_image && q.S >= 16) {
        const int64_t per = (q.S + 16 * POINTWISE_DIRECT_WIDE - 1) / (16 * POINTWISE_DIRECT_WIDE);
        ai_parallel_for(p->N * per, 1, pointwise_direct_range_w64, &j);
        return true;
    }
#endif
    j.n_slots = n_slots_of(q.blocks, POINTWISE_DIRECT_SLOTS);
    ai_parallel_for(j.n_slots, 1, pointwise_direct_range, &j);
    return true;
#else
    (void)y, (void)x, (void)w, (void)b, (void)ws, (void)ep;
    return false;
#endif
}

/* ------------------------------------------ weight gradient by own tiles (pointwise_weight_grad)
 */
/*
 * dw (M, K) += dy (M, positions) @ cols^T summed over the images, where
 * cols (K, positions) are an image's x (a pointwise conv, K = C) or its
 * im2col (K = C times the kernel size), without the GEMM library, whose
 * calls per image ran well below its large-GEMM speed (KWS's 64 -> 64 on
 * 25x5, beta 1: 130 GF/s with its AVX-512 kernels, 93 with its AVX2 ones;
 * this kernel 185, 1 thread, AVX-512 Zen 5). The images go in chunks of
 * POINTWISE_WEIGHT_GRAD_CHUNK_ELEMS floats of xt: each image's cols transposed into xt
 * (positions, Kp: K rounded up to the vector, zeros past K), the chunk's
 * images on the pool; then a register tile of POINTWISE_WEIGHT_GRAD_MR rows of dw by
 * POINTWISE_WEIGHT_GRAD_NV vectors of its columns walks the positions of every image of the chunk
 * in order: per position NV vector loads of xt's row, MR broadcasts of dy
 * (MR rows read in order) and MR NV FMAs, the tile then added into dw.
 * Threads split the tiles: each dw element is summed on one thread, images
 * and positions in order, the same values at any thread count.
 * Taken for pointwise convs that pointwise_small_images takes (then the input gradient
 * runs on pointwise_direct, pointwise_input_grad_f32) and for convs of one group whose input needs
 * no gradient (a model's first conv), where K is at least a vector (fewer:
 * the vectors of xt's rows part empty) and at most POINTWISE_WEIGHT_GRAD_MAX_K; in the im2col form at least
 * two vectors and POINTWISE_WEIGHT_GRAD_IM2COL_MIN_M rows of dw (fewer rows leave the
 * tiles part empty), else the direct dw kernel (direct_weight_grad) stays
 * (benchmarks/results/kernels-conv.md, "Pointwise convolutions").
 */
#define POINTWISE_WEIGHT_GRAD_MR 6
#define POINTWISE_WEIGHT_GRAD_NV \
    2 /* vectors of 8 lanes: 12 accumulators (16 registers with AVX2) */
#define POINTWISE_WEIGHT_GRAD_NV16 \
    4 /* vectors of 16 lanes: 24 accumulators (32 registers with AVX-512) */
#define POINTWISE_WEIGHT_GRAD_MAX_K 256
#define POINTWISE_WEIGHT_GRAD_CHUNK_ELEMS \
    (INT64_C(1) << 17) /* xt's floats per chunk of images (512 KB) */
#define POINTWISE_WEIGHT_GRAD_IM2COL_MIN_M \
    32 /* the im2col form: rows of dw (fewer: the direct dw kernel) */

typedef struct {
    int L, nv;                /* lanes, vectors per tile */
    bool cols;                /* cols are x's im2col (else x itself) */
    int64_t K, Kp, S, chunk;  /* dw's columns, xt's row; positions; images per chunk */
    int64_t mt, cb;           /* tiles of dw's rows, of its columns */
} pointwise_weight_grad_geom;

/* the tiles of vectors of L lanes (16: the AVX-512 kernel); `cols`: the
 * im2col form (a conv that is not pointwise, its input needing no
 * gradient), else a pointwise conv that pointwise_small_images takes */
static bool pointwise_weight_grad_geom_of(const ai_conv_params *p, const conv_geom *g, int L,
                                          bool cols, pointwise_weight_grad_geom *q)
{
#if defined(__GNUC__)
    if (cols ? g->pointwise || p->group != 1 || p->N == 0 || g->grid_size == 0
             : !pointwise_small_images(p, g))
        return false;
    q->K = cols ? p->C * g->ksize : p->C;
    if (q->K < L || q->K > POINTWISE_WEIGHT_GRAD_MAX_K ||
        (cols && (p->M < POINTWISE_WEIGHT_GRAD_IM2COL_MIN_M || q->K < 2 * L)))
        return false;
    q->L = L;
    q->nv = L == 16 ? POINTWISE_WEIGHT_GRAD_NV16 : POINTWISE_WEIGHT_GRAD_NV;
    q->cols = cols;
    q->S = g->grid_size;
    q->Kp = (q->K + L - 1) / L * L;
    q->chunk = POINTWISE_WEIGHT_GRAD_CHUNK_ELEMS / (q->S * q->Kp);
    q->chunk = q->chunk < 1 ? 1 : q->chunk > p->N ? p->N : q->chunk;
    q->mt = (p->M + POINTWISE_WEIGHT_GRAD_MR - 1) / POINTWISE_WEIGHT_GRAD_MR;
    q->cb = (q->Kp + q->nv * L - 1) / (q->nv * L);
    return true;
#else
    (void)p, (void)g, (void)L, (void)cols, (void)q;
    return false;
#endif
}

/* a chunk's xt, then (im2col form) its images' cols */
static int64_t pointwise_weight_grad_geom_elems(const pointwise_weight_grad_geom *q)
{
    return q->chunk * q->S * (q->Kp + (q->cols ? q->K : 0));
}

/* The input gradient of a pointwise conv p that pointwise_small_images takes, dx = w^T dy
 * image by image: the forward of the conv with C and M swapped, by the
 * pointwise kernel (pointwise_direct) on w^T. */
static bool pointwise_input_grad_params(const ai_conv_params *p, ai_conv_params *q)
{
    const conv_geom g = conv_geom_of(p, false);
    if (!pointwise_small_images(p, &g))
        return false;
    *q = *p;
    q->C = p->M;
    q->M = p->C;
    return true;
}

/* the largest of pointwise_weight_grad's workspaces at either width (ai_set_avx512 may change
 * it after planning) and the input gradient's pointwise_direct workspace */
static int64_t pointwise_weight_grad_elems(const ai_conv_params *p, const conv_geom *g)
{
    int64_t e = 0;
    pointwise_weight_grad_geom q;
    for (int i = 0; i < 4; i++)
        if (pointwise_weight_grad_geom_of(p, g, i & 1 ? 16 : 8, i >= 2, &q) &&
            pointwise_weight_grad_geom_elems(&q) > e)
            e = pointwise_weight_grad_geom_elems(&q);
    ai_conv_params d;
    pointwise_direct_geom k;
    if (pointwise_input_grad_params(p, &d) && pointwise_direct_geom_of(&d, g, AI_F32, &k) &&
        pointwise_direct_elems(&d, &k) > e)
        e = pointwise_direct_elems(&d, &k);
    return e;
}

#if defined(__GNUC__)
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const pointwise_weight_grad_geom *q;
    const float *dy, *x; /* at the chunk's first image */
    float *dw, *xt, *cols;
    int64_t nb;          /* images in the chunk */
} pointwise_weight_grad_job;

static void pointwise_weight_grad_pack_range(void *ctx, int64_t lo, int64_t hi)
{
    const pointwise_weight_grad_job *j = ctx;
    const int64_t K = j->q->K, S = j->q->S, Kp = j->q->Kp;
    for (int64_t n = lo; n < hi; n++) {
        float *xt = j->xt + n * S * Kp;
        const float *src = j->x + n * j->p->C * j->g->img_size;
        if (j->q->cols) {
            float *cols = j->cols + n * K * S;
            im2col_rows_f32(cols, src, j->g, 0, K, S);
            src = cols;
        }
        transpose_f32(xt, Kp, src, S, K, S, false);
        for (int64_t s = 0; K < Kp && s < S; s++)
            memset(xt + s * Kp + K, 0, sizeof(float) * (size_t)(Kp - K));
    }
}

/* dw rows [m0, m0 + POINTWISE_WEIGHT_GRAD_MR) by columns [c0, c0 + NT L) (rows past M read row
 * M - 1; neither they nor columns past K are stored). V: the vector, L lanes. */
#define POINTWISE_WEIGHT_GRAD_TILE(V, L, NT)                                         \
    {                                                                                \
        V acc[POINTWISE_WEIGHT_GRAD_MR][NT];                                         \
        for (int r = 0; r < POINTWISE_WEIGHT_GRAD_MR; r++)                           \
            for (int v = 0; v < (NT); v++)                                           \
                acc[r][v] = (V){0};                                                  \
        for (int64_t n = 0; n < j->nb; n++) {                                        \
            const float *xt = j->xt + n * S * Kp + c0, *d[POINTWISE_WEIGHT_GRAD_MR]; \
            for (int r = 0; r < POINTWISE_WEIGHT_GRAD_MR; r++)                       \
                d[r] = j->dy + (n * M + (m0 + r < M ? m0 + r : M - 1)) * S;          \
            for (int64_t s = 0; s < S; s++, xt += Kp) {                              \
                V xv[NT];                                                            \
                for (int v = 0; v < (NT); v++)                                       \
                    xv[v] = *(const V *)(xt + v * (L));                              \
                for (int r = 0; r < POINTWISE_WEIGHT_GRAD_MR; r++) {                 \
                    const float dv = d[r][s];                                        \
                    for (int v = 0; v < (NT); v++)                                   \
                        acc[r][v] += dv * xv[v];                                     \
                }                                                                    \
            }                                                                        \
        }                                                                            \
        for (int r = 0; r < POINTWISE_WEIGHT_GRAD_MR && m0 + r < M; r++)             \
            for (int v = 0; v < (NT); v++)                                           \
                for (int i = 0; i < (L) && c0 + v * (L) + i < K; i++)                \
                    j->dw[(m0 + r) * K + c0 + v * (L) + i] += acc[r][v][i];          \
    }

#define POINTWISE_WEIGHT_GRAD_KERNEL(NAME, ATTR, V, L, NV)                            \
    ATTR static void NAME(const pointwise_weight_grad_job *j, int64_t m0, int64_t c0) \
    {                                                                                 \
        const int64_t M = j->p->M, K = j->q->K, S = j->q->S, Kp = j->q->Kp;           \
        const int64_t nt = (Kp - c0) / (L) < (NV) ? (Kp - c0) / (L) : (NV);           \
        if (nt >= (NV))                                                               \
            POINTWISE_WEIGHT_GRAD_TILE(V, L, NV)                                      \
        else if (nt == 3)                                                             \
            POINTWISE_WEIGHT_GRAD_TILE(V, L, 3)                                       \
        else if (nt == 2)                                                             \
            POINTWISE_WEIGHT_GRAD_TILE(V, L, 2)                                       \
        else                                                                          \
            POINTWISE_WEIGHT_GRAD_TILE(V, L, 1)                                       \
    }

POINTWISE_WEIGHT_GRAD_KERNEL(pointwise_weight_grad_tile, AI_GEMM_CLONES, conv_vec8, 8,
                             POINTWISE_WEIGHT_GRAD_NV)
#ifdef AI_AVX512_KERNEL
POINTWISE_WEIGHT_GRAD_KERNEL(pointwise_weight_grad_tile_v16, AI_AVX512_KERNEL, conv_vec16, 16,
                             POINTWISE_WEIGHT_GRAD_NV16)
#endif
#undef POINTWISE_WEIGHT_GRAD_KERNEL
#undef POINTWISE_WEIGHT_GRAD_TILE

static void pointwise_weight_grad_range(void *ctx, int64_t lo, int64_t hi)
{
    const pointwise_weight_grad_job *j = ctx;
    const pointwise_weight_grad_geom *q = j->q;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t m0 = t / q->cb * POINTWISE_WEIGHT_GRAD_MR, c0 = t % q->cb * q->nv * q->L;
#ifdef AI_AVX512_KERNEL
        if (q->L == 16) {
            pointwise_weight_grad_tile_v16(j, m0, c0);
            continue;
        }
#endif
        pointwise_weight_grad_tile(j, m0, c0);
    }
}
#endif

/* dw += the weight gradient of conv p where pointwise_weight_grad_geom_of takes it (`cols`: see
 * there); false where it declines. */
static bool pointwise_weight_grad_run(const ai_conv_params *p, float *dw, const float *dy,
                                      const float *x, float *ws, bool cols)
{
    const conv_geom g = conv_geom_of(p, false);
    pointwise_weight_grad_geom q;
    if (!pointwise_weight_grad_geom_of(p, &g, ai_cpu_avx512() ? 16 : 8, cols, &q))
        return false;
#if defined(__GNUC__)
    const int64_t xt_elems = q.chunk * q.S * q.Kp;
    for (int64_t n0 = 0; n0 < p->N; n0 += q.chunk) {
        pointwise_weight_grad_job j = {p,
                                       &g,
                                       &q,
                                       dy + n0 * p->M * q.S,
                                       x + n0 * p->C * g.img_size,
                                       dw,
                                       ws,
                                       ws + xt_elems,
                                       p->N - n0 < q.chunk ? p->N - n0 : q.chunk};
        ai_parallel_for(j.nb, 1, pointwise_weight_grad_pack_range, &j);
        ai_parallel_for(q.mt * q.cb, 1, pointwise_weight_grad_range, &j);
    }
    return true;
#else
    (void)dw, (void)dy, (void)x, (void)ws, (void)xt_elems;
    return false;
#endif
}

static bool pointwise_weight_grad_f32(const ai_conv_params *p, float *dw, const float *dy,
                                      const float *x, float *ws)
{
    return pointwise_weight_grad_run(p, dw, dy, x, ws, false);
}

/* the im2col form: only where the input needs no gradient (the caller's) */
static bool pointwise_weight_grad_im2col_f32(const ai_conv_params *p, float *dw, const float *dy,
                                             const float *x, float *ws)
{
    return pointwise_weight_grad_run(p, dw, dy, x, ws, true);
}

static bool pointwise_input_grad_f32(const ai_conv_params *p, float *dx, const float *dy,
                                     const float *w, float *ws)
{
    ai_conv_params q;
    return pointwise_input_grad_params(p, &q) &&
           pointwise_direct_run(&q, dx, dy, w, NULL, ws, NULL, true);
}

#define T float
#define SFX _f32
#define GEMM ai_gemm_f32
#include "conv_pointwise_impl.h"

#define T double
#define SFX _f64
#define GEMM ai_gemm_f64
#include "conv_pointwise_impl.h"

bool pointwise_direct_forward(const conv_call *c)
{
    return c->dtype == AI_F32 &&
           pointwise_direct_run(c->p, c->y, c->x, c->w, c->b, c->ws, c->ep, false);
}

bool pointwise_batched_forward(const conv_call *c)
{
    return c->dtype == AI_F32 ? batched_forward_f32(c) : batched_forward_f64(c);
}

bool pointwise_images_forward(const conv_call *c)
{
    return c->dtype == AI_F32 ? images_forward_f32(c) : images_forward_f64(c);
}

bool pointwise_batched_backward(conv_call *c)
{
    return c->dtype == AI_F32 ? batched_backward_f32(c) : batched_backward_f64(c);
}

bool pointwise_images_backward(conv_call *c)
{
    return c->dtype == AI_F32 ? images_backward_f32(c) : images_backward_f64(c);
}

bool pointwise_input_grad(conv_call *c)
{
    if (c->dtype != AI_F32 || !pointwise_input_grad_f32(c->p, c->dx, c->dy, c->w, c->ws))
        return false;
    c->dx = NULL;
    return true;
}

bool pointwise_weight_grad(conv_call *c)
{
    if (c->dtype != AI_F32 || !pointwise_weight_grad_f32(c->p, c->dw, c->dy, c->x, c->ws))
        return false;
    c->dw = NULL;
    return true;
}

bool pointwise_weight_grad_im2col(conv_call *c)
{
    if (c->dtype != AI_F32 || !pointwise_weight_grad_im2col_f32(c->p, c->dw, c->dy, c->x, c->ws))
        return false;
    c->dw = NULL;
    return true;
}

int64_t pointwise_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype)
{
    int64_t e = dtype == AI_F32 ? pointwise_weight_grad_elems(p, g) : 0;
    pointwise_direct_geom q;
    if (pointwise_direct_geom_of(p, g, dtype, &q) && pointwise_direct_elems(p, &q) > e)
        e = pointwise_direct_elems(p, &q);
    const int64_t batched =
        pointwise_batched_accepts(p, g) ? (p->C + p->M) * p->N * g->grid_size : 0;
    return batched > e ? batched : e;
}
