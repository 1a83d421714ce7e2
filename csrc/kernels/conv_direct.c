/*
 * conv_direct.c — direct float32 convolution on zero-padded stride-phase
 * planes (phase_planes): one group, 1 or 2 spatial dims, a kernel larger
 * than 1x1, any stride. Tap k of an output row reads a contiguous run of
 * the planes, so a register tile of DIRECT_MR output channels by DIRECT_NR grid
 * positions sums every (channel, tap) with two vector loads and a few
 * broadcasts per step; no operand is thin whatever the channel count, which
 * is where im2col's GEMMs lose (the few-channel convs of small models).
 *
 *   forward   y (N, M, G1, G2) = sum over c, k of w[m][c][k] * planes[c][j + base[k]] + b
 *   dx        stride 1: the forward of the conv of dy by w transposed and
 *             flipped, padded by (k - 1) d - pad (direct_input_grad_params)
 *   dw        dw[m][c][k] += sum over images n and grid positions j of
 *             dy[n][m][j] * planes[n][c][j + base[k]]
 *
 * The output is computed on the grid "G1 rows of R2" (the last R2 - G2
 * positions of each row are junk, not stored). Threads split grid blocks,
 * or images (each in a slot of the workspace), or (channel tile, c) pairs
 * of dw: each output element is summed on one thread, in a fixed order.
 */
#include "conv_internal.h"

/*
 * Direct float32 Conv of 1 or 2 spatial dims, one group, a kernel larger
 * than 1x1 (those are GEMMs), any stride: image n's C planes are copied into
 * zero-padded stride-phase planes (phase_planes above: tap k of an output
 * row is a contiguous run from base[k] on), and the output is computed on
 * the grid "G1 rows of R2" (the last R2 - G2 of each row are junk, not
 * stored). A register tile of DIRECT_MR output channels by DIRECT_NR grid positions
 * (8 vector accumulators) runs over every (c, k): per step 2 vector loads,
 * 4 broadcasts of weights packed (M / DIRECT_MR, C, K, DIRECT_MR), 8 FMAs. No
 * operand is thin, whatever C is: this beats im2col and the per-tap GEMMs
 * on the few-channel convs of small models. Threads split grid blocks.
 * The tile is 4 x 16, not wider: a 4 x 24 tile (12 accumulators) with its 3
 * loads and a broadcast takes every AVX2 register, and GCC's code then moves
 * registers around; 16-wide blocks also leave less junk (grids of 80 are 5
 * blocks, not 4 of 24).
 * Workspace: the packed weights and the planes of one image (of `slots`
 * images for image-parallel runs, below). The input gradient
 * of a stride-1 conv is the same kernel on dy (direct_input_grad_params).
 */
#define DIRECT_MR 4
#define DIRECT_NR 16 /* <= 2 * DW_PAD_LANES: what a block reads past a plane's end */
typedef struct {
    phase_planes ph;
    int64_t L, MT; /* grid positions, channel tiles */
    int64_t slots; /* images' planes in the workspace: > 1 for image-parallel runs */
} direct_geom;

/* On more than one thread, with 2 or more images per thread, each thread
 * takes whole images (planes, blocks, epilogue) in a slot of its own, up to
 * DIRECT_SLOTS slots of at most DIRECT_SLOT_ELEMS each: no pool pass per image and
 * per step. Small grids gain most (KWS's 1 -> 64 stem, 25x5: one image is
 * 10 blocks, too little work to pay for three pool passes). */
#define DIRECT_SLOTS 8
#define DIRECT_SLOT_ELEMS (INT64_C(1) << 16)

static bool direct_geom_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype,
                           direct_geom *dc)
{
    if (dtype != AI_F32 || p->group != 1 || g->ksize == 1 || p->N == 0 ||
        !phase_planes_of(g, false, &dc->ph))
        return false;
    dc->L = dc->ph.G1 * dc->ph.R2;
    dc->MT = (p->M + DIRECT_MR - 1) / DIRECT_MR;
    dc->slots = p->N > 1 && p->C * dc->ph.size <= DIRECT_SLOT_ELEMS
                    ? (p->N < DIRECT_SLOTS ? p->N : DIRECT_SLOTS)
                    : 1;
    return true;
}

static int64_t direct_elems(const ai_conv_params *p, const direct_geom *dc)
{
    return dc->MT * DIRECT_MR * p->C * dc->ph.K + dc->slots * p->C * dc->ph.size;
}

/* The Conv whose forward is the input gradient of stride-1 Conv p: dy (M
 * channels) padded by (k - 1) d - pad on each side, with the weights
 * transposed and flipped. False when a pad exceeds (k - 1) d. */
bool direct_input_grad_params(const ai_conv_params *p, ai_conv_params *q)
{
    *q = *p;
    q->C = p->M;
    q->M = p->C;
    for (int i = 0; i < p->nsp; i++) {
        const int64_t span = (p->kernel[i] - 1) * p->dilation[i];
        if (p->stride[i] != 1 || p->pad_begin[i] > span || p->pad_end[i] > span)
            return false;
        q->in[i] = p->out[i];
        q->out[i] = p->in[i];
        q->pad_begin[i] = span - p->pad_begin[i];
        q->pad_end[i] = span - p->pad_end[i];
    }
    return true;
}

static int64_t direct_input_grad_elems(const ai_conv_params *p, ai_dtype dtype)
{
    ai_conv_params q;
    direct_geom dc;
    if (!direct_input_grad_params(p, &q))
        return 0;
    conv_geom g = conv_geom_of(&q, false);
    return direct_geom_of(&q, &g, dtype, &dc) ? direct_elems(&q, &dc) : 0;
}


/* The direct weight gradient works on chunks of images: per image, its
 * phase planes and its dy laid on the grid (junk columns zero, rows padded:
 * the last vector reads past L). A chunk has enough images for DW_CHUNK_GRID
 * grid positions (the sums across lanes are done once per chunk), within
 * DW_CHUNK_ELEMS elements, at least one (on small grids such as LeNet's
 * 10x10 this beats im2col and a GEMM per image). When the shifted GEMMs
 * apply (8 or more input channels) they win on grids under DW_MIN_GRID,
 * and the kernel declines those. The lanes are summed once per chunk:
 * DW_CHUNK_GRID positions make that a small part of the work, and larger
 * chunks are no faster (benchmarks/results/kernels-conv.md, "Direct weight
 * gradient"). */
#define DW_MIN_GRID 256
#define DW_CHUNK_GRID 4096
#define DW_CHUNK_ELEMS (INT64_C(1) << 18) /* 1 MiB of float32 */
static int64_t direct_weight_grad_image_elems(const ai_conv_params *p, const direct_geom *dc)
{
    return p->C * dc->ph.size + (p->M + 1) / 2 * 2 * (dc->L + DIRECT_NR); /* (rows in pairs) */
}

static int64_t direct_weight_grad_images(const ai_conv_params *p, const direct_geom *dc)
{
    int64_t nb = (DW_CHUNK_GRID + dc->L - 1) / dc->L;
    const int64_t fit = DW_CHUNK_ELEMS / direct_weight_grad_image_elems(p, dc);
    nb = nb > fit ? fit : nb;
    return nb < 1 ? 1 : nb > p->N ? p->N : nb;
}

static int64_t direct_weight_grad_elems(const ai_conv_params *p, const direct_geom *dc)
{
    return direct_weight_grad_images(p, dc) * direct_weight_grad_image_elems(p, dc);
}


typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const direct_geom *dc;
    const float *x, *b, *wp;
    float *planes, *y;
    bool add;    /* y += instead of y = */
    bool zeroed; /* the planes hold an earlier image's: their pads are zeros */
} direct_job;

/* Channels [lo, hi) of image x into their phase planes. */
static void direct_pad_range(void *ctx, int64_t lo, int64_t hi)
{
    const direct_job *j = ctx;
    for (int64_t c = lo; c < hi; c++)
        phase_planes_fill_f32(&j->dc->ph, j->planes + c * j->dc->ph.size, j->x + c * j->g->img_size,
                        j->zeroed);
}

/* Block blk's valid grid positions, row segment by segment: offset in the
 * tile, offset in a y plane, length; returns their number */
static inline __attribute__((always_inline)) int64_t direct_segments(const direct_geom *dc,
                                                                     int64_t blk,
                                                                     int64_t seg_t[DIRECT_NR + 1],
                                                                     int64_t seg_y[DIRECT_NR + 1],
                                                                     int64_t seg_n[DIRECT_NR + 1])
{
    const int64_t R2 = dc->ph.R2, G2 = dc->ph.G2, j0 = blk * DIRECT_NR;
    const int64_t jn = dc->L - j0 < DIRECT_NR ? dc->L - j0 : DIRECT_NR;
    int64_t nseg = 0;
    for (int64_t t = 0, o1 = j0 / R2, o2 = j0 % R2; t < jn; o1++, o2 = 0) {
        const int64_t seg = R2 - o2 < jn - t ? R2 - o2 : jn - t;
        if (G2 > o2) {
            seg_t[nseg] = t;
            seg_y[nseg] = o1 * G2 + o2;
            seg_n[nseg++] = G2 - o2 < seg ? G2 - o2 : seg;
        }
        t += seg;
    }
    return nseg;
}

/* Rows [0, rows) of a block's tile (DIRECT_NR positions per row) into y's
 * planes at channel m0 by its segments (y += with `add`) */
static inline __attribute__((always_inline)) void
direct_store_segments(const direct_job *j, int64_t m0, int rows, const float (*tile)[DIRECT_NR],
                      int64_t nseg, const int64_t *seg_t, const int64_t *seg_y,
                      const int64_t *seg_n)
{
    const int64_t OS = j->g->grid_size;
    for (int64_t s = 0; s < nseg; s++)
        for (int r = 0; r < rows; r++) {
            float *dst = j->y + (m0 + r) * OS + seg_y[s];
            const float *src = &tile[r][seg_t[s]];
            if (j->add)
                for (int64_t i = 0; i < seg_n[s]; i++)
                    dst[i] += src[i];
            else
                for (int64_t i = 0; i < seg_n[s]; i++)
                    dst[i] = src[i];
        }
}

AI_GEMM_CLONES AI_SHORT_LOOPS static void direct_block_range(void *ctx, int64_t lo, int64_t hi)
{
    const direct_job *j = ctx;
    const direct_geom *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, PS = dc->ph.size;
    const int64_t OS = j->g->grid_size;
    enum { VL = 8, NV = DIRECT_NR / 8 };
    for (int64_t blk = lo; blk < hi; blk++) {
        const int64_t j0 = blk * DIRECT_NR;
        int64_t seg_t[DIRECT_NR + 1], seg_y[DIRECT_NR + 1], seg_n[DIRECT_NR + 1];
        const int64_t nseg = direct_segments(dc, blk, seg_t, seg_y, seg_n);
        const bool whole = nseg == 1 && seg_n[0] == DIRECT_NR; /* one run inside a row */
        for (int64_t mt = 0; mt < dc->MT; mt++) {
            conv_vec8 acc[DIRECT_MR][NV];
            for (int r = 0; r < DIRECT_MR; r++) {
                const float bias = j->b && mt * DIRECT_MR + r < M ? j->b[mt * DIRECT_MR + r] : 0.0f;
                for (int v = 0; v < NV; v++)
                    acc[r][v] = (conv_vec8){0} + bias;
            }
            const float *wp = j->wp + mt * C * K * DIRECT_MR;
            /* the channels' taps; a 3x3, 5x5 or 3-tap kernel unrolled (a
             * constant tap count: no loop overhead per tap) */
#define DIRECT_CHANNELS(KK)                                                          \
    for (int64_t c = 0; c < C; c++) {                                                \
        const float *xc = j->planes + c * PS + j0;                                   \
        _Pragma("GCC unroll 32") for (int64_t k = 0; k < (KK); k++, wp += DIRECT_MR) \
        {                                                                            \
            const float *xs = xc + dc->ph.base[k];                                   \
            conv_vec8 xv[NV];                                                        \
            for (int v = 0; v < NV; v++)                                             \
                xv[v] = *(const conv_vec8 *)(xs + v * VL);                           \
            for (int r = 0; r < DIRECT_MR; r++)                                      \
                for (int v = 0; v < NV; v++)                                         \
                    acc[r][v] += wp[r] * xv[v];                                      \
        }                                                                            \
    }
            if (K == 9)
                DIRECT_CHANNELS(9)
            else if (K == 3)
                DIRECT_CHANNELS(3)
            else if (K == 25)
                DIRECT_CHANNELS(25)
            else
                DIRECT_CHANNELS(K)
#undef DIRECT_CHANNELS
            const int rows = M - mt * DIRECT_MR < DIRECT_MR ? (int)(M - mt * DIRECT_MR) : DIRECT_MR;
            if (whole) { /* whole vectors into y */
                for (int r = 0; r < rows; r++) {
                    conv_vec8 *dst = (conv_vec8 *)(j->y + (mt * DIRECT_MR + r) * OS + seg_y[0]);
                    for (int v = 0; v < NV; v++) {
                        if (j->add)
                            acc[r][v] += dst[v];
                        dst[v] = acc[r][v];
                    }
                }
                continue;
            }
            float tile[DIRECT_MR][DIRECT_NR];
            memcpy(tile, acc, sizeof tile);
            direct_store_segments(j, mt * DIRECT_MR, rows, (const float(*)[DIRECT_NR])tile, nseg,
                                  seg_t, seg_y, seg_n);
        }
    }
}

#ifdef AI_AVX512_KERNEL
/* direct_block_range with 16-lane vectors (AVX-512): a block's DIRECT_NR = 16
 * positions are one vector, and a tile takes 2 blocks by 2 channel tiles
 * (8 channels by 32 positions: 16 of the 32 registers accumulate), fewer
 * at the ends. Each output sums its (c, k) terms in the same order, with
 * FMAs, as the 8-lane tiles: the same values bit for bit. */
AI_AVX512_KERNEL AI_SHORT_LOOPS static void direct_block_range_v16(void *ctx, int64_t lo,
                                                                   int64_t hi)
{
    const direct_job *j = ctx;
    const direct_geom *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, PS = dc->ph.size;
    const int64_t OS = j->g->grid_size, WT = C * K * DIRECT_MR; /* a channel tile's weights */
    /* NM channel tiles (mt on) by NB blocks (blk on) */
#define DIRECT_TILE_V16(NM, NB)                                                                    \
    {                                                                                              \
        conv_vec16 acc[(NM) * DIRECT_MR][NB];                                                      \
        for (int r = 0; r < (NM) * DIRECT_MR; r++) {                                               \
            const int64_t m = mt * DIRECT_MR + r;                                                  \
            const float bias = j->b && m < M ? j->b[m] : 0.0f;                                     \
            for (int b = 0; b < (NB); b++)                                                         \
                acc[r][b] = (conv_vec16){0} + bias;                                                \
        }                                                                                          \
        const float *wp = j->wp + mt * WT;                                                         \
        for (int64_t c = 0; c < C; c++) {                                                          \
            const float *xc = j->planes + c * PS + blk * DIRECT_NR;                                \
            _Pragma("GCC unroll 9") for (int64_t k = 0; k < K; k++, wp += DIRECT_MR)               \
            {                                                                                      \
                const float *xs = xc + dc->ph.base[k];                                             \
                conv_vec16 xv[NB];                                                                 \
                for (int b = 0; b < (NB); b++)                                                     \
                    xv[b] = *(const conv_vec16 *)(xs + b * DIRECT_NR);                             \
                for (int t = 0; t < (NM); t++)                                                     \
                    for (int r = 0; r < DIRECT_MR; r++)                                            \
                        for (int b = 0; b < (NB); b++)                                             \
                            acc[t * DIRECT_MR + r][b] += wp[t * WT + r] * xv[b];                   \
            }                                                                                      \
        }                                                                                          \
        const int64_t left = M - mt * DIRECT_MR;                                                   \
        const int rows = left < (NM) * DIRECT_MR ? (int)left : (NM) * DIRECT_MR;                   \
        for (int b = 0; b < (NB); b++) {                                                           \
            int64_t seg_t[DIRECT_NR + 1], seg_y[DIRECT_NR + 1], seg_n[DIRECT_NR + 1];              \
            const int64_t nseg = direct_segments(dc, blk + b, seg_t, seg_y, seg_n);                \
            if (nseg == 1 && seg_n[0] == DIRECT_NR) { /* one run inside a row */                   \
                for (int r = 0; r < rows; r++) {                                                   \
                    conv_vec16 *dst = (conv_vec16 *)(j->y + (mt * DIRECT_MR + r) * OS + seg_y[0]); \
                    if (j->add)                                                                    \
                        acc[r][b] += *dst;                                                         \
                    *dst = acc[r][b];                                                              \
                }                                                                                  \
                continue;                                                                          \
            }                                                                                      \
            float tile[(NM) * DIRECT_MR][DIRECT_NR];                                               \
            for (int r = 0; r < (NM) * DIRECT_MR; r++)                                             \
                *(conv_vec16 *)tile[r] = acc[r][b];                                                \
            direct_store_segments(j, mt *DIRECT_MR, rows, (const float(*)[DIRECT_NR])tile, nseg,   \
                                  seg_t, seg_y, seg_n);                                            \
        }                                                                                          \
    }
    for (int64_t blk = lo; blk < hi; blk += 2)
        for (int64_t mt = 0; mt < dc->MT; mt += 2) {
            if (blk + 1 < hi && mt + 1 < dc->MT)
                DIRECT_TILE_V16(2, 2)
            else if (blk + 1 < hi)
                DIRECT_TILE_V16(1, 2)
            else if (mt + 1 < dc->MT)
                DIRECT_TILE_V16(2, 1)
            else
                DIRECT_TILE_V16(1, 1)
        }
#undef DIRECT_TILE_V16
}
#endif

/* the block kernel of this CPU */
static void (*direct_blocks_fn(void))(void *, int64_t, int64_t)
{
#ifdef AI_AVX512_KERNEL
    if (ai_cpu_avx512())
        return direct_block_range_v16;
#endif
    return direct_block_range;
}

/* Slots [lo, hi) of an image-parallel run (direct_geom_of): each its share of
 * the images, in its own planes, one thread each pass. */
typedef struct {
    const direct_job *j; /* x, y, planes: of the batch, the first slot */
    const ai_conv_epilogue *ep;
    int64_t blocks;
} direct_images_job;

static void direct_images_range(void *ctx, int64_t lo, int64_t hi)
{
    const direct_images_job *ij = ctx;
    const direct_job *b = ij->j;
    const int64_t N = b->p->N, C = b->p->C, M = b->p->M, slots = b->dc->slots;
    const int64_t IS = b->g->img_size, OS = b->g->grid_size;
    for (int64_t s = lo; s < hi; s++)
        for (int64_t n = s * N / slots; n < (s + 1) * N / slots; n++) {
            direct_job j = *b;
            j.x = b->x + n * C * IS;
            j.y = b->y + n * M * OS;
            j.planes = b->planes + s * C * b->dc->ph.size;
            j.zeroed = n > s * N / slots;
            direct_pad_range(&j, 0, C);
            direct_blocks_fn()(&j, 0, ij->blocks);
            if (ij->ep) {
                ep_job_f32 e = {j.y, NULL, ij->ep, M, OS};
                ep_range_f32(&e, 0, M);
            }
        }
}

/* y = conv(x, w) + b (y += conv(x, w) with `add`) by the direct kernel, the
 * weights packed from w (M, C, K), or from wt (C, M, K) transposed and
 * flipped when `flip`; false when it does not apply. */
static bool direct_run(const ai_conv_params *p, float *y, const float *x, const float *w, bool flip,
                       const float *b, bool add, float *ws, const ai_conv_epilogue *ep)
{
    conv_geom g = conv_geom_of(p, false);
    direct_geom dc;
    if (!direct_geom_of(p, &g, AI_F32, &dc))
        return false;
    const int64_t C = p->C, M = p->M, K = dc.ph.K;
    float *wp = ws, *planes = ws + dc.MT * DIRECT_MR * C * K;
    for (int64_t mt = 0; mt < dc.MT; mt++) /* (M/MR, C, K, MR), zero rows past M */
        for (int64_t c = 0; c < C; c++)
            for (int64_t k = 0; k < K; k++)
                for (int r = 0; r < DIRECT_MR; r++) {
                    const int64_t m = mt * DIRECT_MR + r;
                    wp[((mt * C + c) * K + k) * DIRECT_MR + r] =
                        m >= M ? 0
                        : flip ? w[(c * M + m) * K + K - 1 - k]
                               : w[(m * C + c) * K + k];
                }
    const int64_t blocks = (dc.L + DIRECT_NR - 1) / DIRECT_NR;
    const int nt = ai_get_num_threads();
    if (dc.slots > 1 && nt > 1 && p->N >= 2 * nt) {
        direct_job j = {p, &g, &dc, x, b, wp, planes, y, add, false};
        direct_images_job ij = {&j, ep, blocks};
        ai_parallel_for(dc.slots, 1, direct_images_range, &ij);
        return true;
    }
    for (int64_t n = 0; n < p->N; n++) {
        direct_job j = {
            p, &g, &dc, x + n * C * g.img_size, b, wp, planes, y + n * M * g.grid_size, add, n > 0};
        ai_parallel_for(C, ai_grain_of(dc.ph.size), direct_pad_range, &j);
        ai_parallel_for(blocks, ai_grain_of(DIRECT_NR * M * C * K / 8), direct_blocks_fn(), &j);
        if (ep) { /* the image's planes while they are in cache (not per
                   * register tile: a call per tile, and a tile whose
                   * address escapes lives in memory) */
            ep_job_f32 e = {y + n * M * g.grid_size, NULL, ep, M, g.grid_size};
            ai_parallel_for(M, ai_grain_of(g.grid_size), ep_range_f32, &e);
        }
    }
    return true;
}

/* dx += (= with `assign`) the input gradient of stride-1 Conv p by the
 * direct kernel. */
static bool direct_input_grad_f32(const ai_conv_params *p, float *dx, const float *dy,
                                  const float *w, float *ws, bool assign)
{
    ai_conv_params q;
    return direct_input_grad_params(p, &q) &&
           direct_run(&q, dx, dy, w, true, NULL, !assign, ws, NULL);
}

/*
 * The weight gradient of a direct conv: dw[m][c][k] += sum over the images n
 * and grid positions j of dy[n][m][j] * planes[n][c][j + base[k]] (dy laid
 * on the grid "G1 rows of R2" with its junk columns zero; any stride: the
 * forward's indexing of the stride-phase planes, transposed), a chunk
 * of images at a time. A register tile of DIRECT_MR output channels by DW_KR
 * taps of one input channel: per step 4 + 3 vector loads and 12 FMAs into
 * 12 vector partial sums, over the whole grid of every image of the chunk,
 * then summed across lanes into dw. Threads split (channel tile, c) pairs:
 * each dw element is summed on one thread, images in order.
 */
#define DW_KR 3
typedef struct {
    const ai_conv_params *p;
    const direct_geom *dc;
    const float *planes, *dyg;
    float *dw;
    int64_t ld, nb; /* dyg row stride, images in the chunk */
} direct_weight_grad_job;

AI_GEMM_CLONES static void direct_weight_grad_range(void *ctx, int64_t lo, int64_t hi)
{
    const direct_weight_grad_job *j = ctx;
    const direct_geom *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, nvec = (dc->L + 7) / 8;
    const int64_t PS = dc->ph.size, groups = (K + DW_KR - 1) / DW_KR;
    /* the partial sums of every tap group, kept across the images of the chunk
     * (an image's plane and dy rows stay in cache for all its tap groups) */
    conv_vec8 sums[(DW_PAD_MAX_TAPS + DW_KR - 1) / DW_KR][DIRECT_MR][DW_KR];
    for (int64_t item = lo; item < hi; item++) {
        const int64_t mt = item / C, c = item % C;
        memset(sums, 0, sizeof(sums[0]) * (size_t)groups);
        for (int64_t n = 0; n < j->nb; n++) {
            const float *xc = j->planes + (n * C + c) * PS;
            const float *dm[DIRECT_MR];
            for (int r = 0; r < DIRECT_MR; r++) /* rows past M read row 0: computed, not stored */
                dm[r] =
                    j->dyg + (n * M + (mt * DIRECT_MR + r < M ? mt * DIRECT_MR + r : 0)) * j->ld;
            for (int64_t grp = 0; grp < groups; grp++) {
                int64_t off[DW_KR];
                for (int q = 0; q < DW_KR; q++) { /* taps past K repeat the last: not stored */
                    const int64_t k = grp * DW_KR + q;
                    off[q] = dc->ph.base[k < K ? k : K - 1];
                }
                conv_vec8 acc[DIRECT_MR][DW_KR];
                memcpy(acc, sums[grp], sizeof acc);
                for (int64_t v = 0; v < nvec; v++) {
                    conv_vec8 xv[DW_KR], dv[DIRECT_MR];
                    for (int q = 0; q < DW_KR; q++)
                        xv[q] = *(const conv_vec8 *)(xc + off[q] + 8 * v);
                    for (int r = 0; r < DIRECT_MR; r++)
                        dv[r] = *(const conv_vec8 *)(dm[r] + 8 * v);
                    for (int r = 0; r < DIRECT_MR; r++)
                        for (int q = 0; q < DW_KR; q++)
                            acc[r][q] += dv[r] * xv[q];
                }
                memcpy(sums[grp], acc, sizeof acc);
            }
        }
        for (int64_t grp = 0; grp < groups; grp++)
            for (int r = 0; r < DIRECT_MR && mt * DIRECT_MR + r < M; r++)
                for (int q = 0; q < DW_KR && grp * DW_KR + q < K; q++) {
                    float lanes[8];
                    memcpy(lanes, &sums[grp][r][q], sizeof lanes);
                    j->dw[((mt * DIRECT_MR + r) * C + c) * K + grp * DW_KR + q] +=
                        ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                        ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
                }
    }
}

#ifdef AI_AVX512_KERNEL
/* direct_weight_grad_range with 16-lane vectors (AVX-512): dy's rows in pairs, 8
 * positions of one row then the same 8 of the other (direct_weight_grad_f32 lays dyg
 * so when this kernel runs), times x's 8 positions broadcast to both
 * halves. Each half is the 8-lane kernel's accumulator of its row and tap,
 * summed over the same images and positions in the same order (the same
 * values bit for bit), in half the FMAs; a pass takes up to DIRECT_DW_V16_TAPS taps
 * (2 x 9 accumulators, 2 + 9 loads per step). */
#define DIRECT_DW_V16_TAPS 9
static inline __attribute__((always_inline)) void
direct_weight_grad_v16_steps(ai_vec16_f32 acc[2][DIRECT_DW_V16_TAPS], const float *d0,
                             const float *d1, const float *xc, const int64_t *off, int64_t nv,
                             const int nt)
{
    for (int64_t v = 0; v < nv; v++) {
        const ai_vec16_f32 a = *(const ai_vec16_f32 *)(d0 + 16 * v);
        const ai_vec16_f32 b = *(const ai_vec16_f32 *)(d1 + 16 * v);
        for (int q = 0; q < nt; q++) {
            const conv_vec8 h = *(const conv_vec8 *)(xc + off[q] + 8 * v);
            const ai_vec16_f32 xv = __builtin_shufflevector(h, h, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1,
                                                            2, 3, 4, 5, 6, 7);
            acc[0][q] += a * xv;
            acc[1][q] += b * xv;
        }
    }
}

AI_AVX512_KERNEL static void direct_weight_grad_range_v16(void *ctx, int64_t lo, int64_t hi)
{
    const direct_weight_grad_job *j = ctx;
    const direct_geom *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, nv = (dc->L + 7) / 8;
    const int64_t PS = dc->ph.size, MP = (M + 1) / 2, ld = 2 * j->ld; /* a pair's row */
    const int64_t groups = (K + DIRECT_DW_V16_TAPS - 1) / DIRECT_DW_V16_TAPS,
                  per = (K + groups - 1) / groups;
    /* the partial sums of every tap group, kept across the images of the chunk */
    ai_vec16_f32 sums[(DW_PAD_MAX_TAPS + DIRECT_DW_V16_TAPS - 1) / DIRECT_DW_V16_TAPS][2]
                     [DIRECT_DW_V16_TAPS];
    for (int64_t item = lo; item < hi; item++) {
        const int64_t mt = item / C, c = item % C;
        /* the tile's 2 pairs of rows; a pair past M reads pair 0: computed, not stored */
        const int64_t p0 = 2 * mt, p1 = 2 * mt + 1 < MP ? 2 * mt + 1 : 0;
        memset(sums, 0, sizeof(sums[0]) * (size_t)groups);
        for (int64_t n = 0; n < j->nb; n++) {
            const float *xc = j->planes + (n * C + c) * PS;
            const float *d0 = j->dyg + (n * MP + p0) * ld, *d1 = j->dyg + (n * MP + p1) * ld;
            for (int64_t grp = 0; grp < groups; grp++) {
                const int64_t k0 = grp * per;
                const int nt = (int)(K - k0 < per ? K - k0 : per);
                int64_t off[DIRECT_DW_V16_TAPS];
                for (int q = 0; q < nt; q++)
                    off[q] = dc->ph.base[k0 + q];
                switch (nt) { /* (constant tap counts: the tap loop unrolled) */
                case 9:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 9);
                    break;
                case 8:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 8);
                    break;
                case 7:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 7);
                    break;
                case 6:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 6);
                    break;
                case 5:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 5);
                    break;
                case 4:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 4);
                    break;
                case 3:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 3);
                    break;
                case 2:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 2);
                    break;
                default:
                    direct_weight_grad_v16_steps(sums[grp], d0, d1, xc, off, nv, 1);
                    break;
                }
            }
        }
        for (int64_t grp = 0; grp < groups; grp++) {
            const int64_t k0 = grp * per, nt = K - k0 < per ? K - k0 : per;
            for (int r = 0; r < DIRECT_MR && mt * DIRECT_MR + r < M; r++)
                for (int64_t q = 0; q < nt; q++) {
                    float lanes[16];
                    memcpy(lanes, &sums[grp][r / 2][q], sizeof lanes);
                    const float *l = lanes + 8 * (r % 2);
                    j->dw[((mt * DIRECT_MR + r) * C + c) * K + k0 + q] +=
                        ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
                }
        }
    }
}
#endif

/* dy's planes (rows [lo, hi) of the chunk: image i, channel m) on the grid
 * "G1 rows of R2" in dyg, rows ld apart; with `pairs` (direct_weight_grad_range_v16)
 * rows m and m + 1 (m even) share a row of 2 ld, in turns of 8 positions */
typedef struct {
    const direct_geom *dc;
    float *dyg;
    const float *dy; /* the chunk's first image */
    int64_t M, M2, ld;
    bool pairs;
} dyg_job;

static void dyg_fill_range(void *ctx, int64_t lo, int64_t hi)
{
    const dyg_job *j = ctx;
    const int64_t R2 = j->dc->ph.R2, G1 = j->dc->ph.G1, G2 = j->dc->ph.G2;
    for (int64_t row = lo; row < hi; row++) {
        const int64_t i = row / j->M, m = row % j->M;
        const float *src = j->dy + row * G1 * G2;
        if (!j->pairs) {
            for (int64_t o1 = 0; o1 < G1; o1++)
                memcpy(j->dyg + (i * j->M + m) * j->ld + o1 * R2, src + o1 * G2,
                       sizeof(float) * (size_t)G2);
            continue;
        }
        float *d = j->dyg + (i * j->M2 + m - m % 2) * j->ld + 8 * (m % 2);
        /* grid position e lands at e / 8 * 16 + e % 8 = e + (e & ~7); whole
         * turns of 8 (at 2 e) in one move, the rest value by value (a
         * memcpy call per run cost more than the copy: KWS's rows are 5) */
        for (int64_t o1 = 0; o1 < G1; o1++) {
            const float *s = src + o1 * G2;
            int64_t o2 = 0, e = o1 * R2;
            for (; o2 < G2 && (e & 7); o2++, e++)
                d[e + (e & ~INT64_C(7))] = s[o2];
            for (; o2 + 8 <= G2; o2 += 8, e += 8)
                memcpy(d + 2 * e, s + o2, 8 * sizeof(float));
            for (; o2 < G2; o2++, e++)
                d[e + (e & ~INT64_C(7))] = s[o2];
        }
    }
}

/* dw += the weight gradient of Conv p by the direct kernel. Taken where the
 * input gradient is not wanted or went through direct_input_grad (else the GEMM paths
 * compute both in one pass): a model's first conv, strided ones included (MobileNet's
 * 3 -> 8, stride 2, 96x96). */
static bool direct_weight_grad_f32(const ai_conv_params *p, float *dw, const float *dy,
                                   const float *x, float *ws)
{
    conv_geom g = conv_geom_of(p, false);
    direct_geom dc;
    if (!direct_geom_of(p, &g, AI_F32, &dc) ||
        dc.L * direct_weight_grad_images(p, &dc) < DW_MIN_GRID ||
        (dc.L < DW_MIN_GRID && shifted_gemm_accepts(p, &g)))
        return false;
    const int64_t C = p->C, M = p->M, G1 = dc.ph.G1, G2 = dc.ph.G2;
    const int64_t ld = dc.L + DIRECT_NR, nb = direct_weight_grad_images(p, &dc),
                  M2 = (M + 1) / 2 * 2;
    float *planes = ws, *dyg = ws + nb * C * dc.ph.size;
    void (*range)(void *, int64_t, int64_t) = direct_weight_grad_range;
    bool pairs = false; /* dyg's rows in pairs, 8 positions of each in turn */
#ifdef AI_AVX512_KERNEL
    if (ai_cpu_avx512())
        range = direct_weight_grad_range_v16, pairs = true;
#endif
    memset(dyg, 0, sizeof(float) * (size_t)(nb * M2 * ld)); /* junk columns and tails */
    for (int64_t n0 = 0; n0 < p->N; n0 += nb) {
        const int64_t cnt = p->N - n0 < nb ? p->N - n0 : nb;
        for (int64_t i = 0; i < cnt; i++) {
            direct_job pj = {p,
                             &g,
                             &dc,
                             x + (n0 + i) * C * g.img_size,
                             NULL,
                             NULL,
                             planes + i * C * dc.ph.size,
                             NULL,
                             false,
                             n0 > 0};
            ai_parallel_for(C, ai_grain_of(dc.ph.size), direct_pad_range, &pj);
        }
        dyg_job dj = {&dc, dyg, dy + n0 * M * G1 * G2, M, M2, ld, pairs};
        ai_parallel_for(cnt * M, ai_grain_of(dc.L), dyg_fill_range, &dj);
        direct_weight_grad_job j = {p, &dc, planes, dyg, dw, ld, cnt};
        ai_parallel_for(dc.MT * C, ai_grain_of(DIRECT_MR * dc.ph.K * dc.L * cnt), range, &j);
    }
    return true;
}

bool direct_forward(const conv_call *c)
{
    return c->dtype == AI_F32 &&
           direct_run(c->p, c->y, c->x, c->w, false, c->b, false, c->ws, c->ep);
}

bool direct_input_grad(conv_call *c)
{
    if (c->dtype != AI_F32 || !direct_input_grad_f32(c->p, c->dx, c->dy, c->w, c->ws, c->assign_dx))
        return false;
    c->dx = NULL;
    return true;
}

/* Taken where the input gradient is not wanted or went through
 * direct_input_grad (else the GEMM paths compute both in one pass). */
bool direct_weight_grad(conv_call *c)
{
    if (c->dtype != AI_F32 || !direct_weight_grad_f32(c->p, c->dw, c->dy, c->x, c->ws))
        return false;
    c->dw = NULL;
    return true;
}

int64_t direct_input_grad_workspace(const ai_conv_params *p, ai_dtype dtype)
{
    return direct_input_grad_elems(p, dtype);
}

/* the forward's, the weight gradient's, the input gradient's */
int64_t direct_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype)
{
    direct_geom dc;
    int64_t e = direct_geom_of(p, g, dtype, &dc) ? direct_elems(p, &dc) : 0;
    if (e && direct_weight_grad_elems(p, &dc) > e)
        e = direct_weight_grad_elems(p, &dc);
    const int64_t dx = direct_input_grad_elems(p, dtype);
    return dx > e ? dx : e;
}
