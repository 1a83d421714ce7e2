/*
 * conv_blocked.c — direct float32 convolution with the output channels in
 * the vector lanes ("blocked": channels-last tiles), and the blocked-channel
 * layout (NCHWc8, conv.h) of the fused inference graph's conv chains.
 * Every output position reads its own input values by offset: no phase
 * planes, no junk columns, any stride, any row width. So it takes the NCHW
 * forward of one-group convs that are strided or have output rows narrower
 * than 16 (with at least BLOCKED_MIN_M output channels), where the plane-wise
 * direct kernel (conv_direct.c) wastes its blocks; and every one-group conv
 * of a blocked chain, whose output it stores as the tiles hold it.
 *
 *   forward   y[m][o] = b[m] + sum over taps t = (c, k1, k2) of w[m][t] * x[o s + off[t]]
 *             a tile: PX positions by NV vectors of output channels
 *
 * Forward only: the backward of these shapes runs in the other families.
 * The tiles are conv_blocked_impl.h, compiled for 8 lanes and, where GCC
 * targets AVX-512, 16; each lane sums its taps in the same order at both
 * widths. Also here: ai_channels_reorder (NCHW <-> blocked).
 */
#include "conv_internal.h"

/*
 * Direct float32 Conv, channels-last tiles ("blocked"), 1 or 2 spatial dims,
 * one group, not a plain GEMM (a 1x1 kernel strided or padded is taken), at
 * most BLOCKED_MAX_TAPS taps (channel, kernel position), strided or with output
 * rows narrower than 16:
 * the convs whose grids the plane-by-plane direct kernel (direct_forward) covers
 * badly (phase planes, junk columns, 16-wide blocks on 5-wide rows). The
 * output channels are in the vector lanes, and every output position reads
 * its own input values by offset: no phase planes, no junk, any stride, any
 * row width. A register tile of PX output positions by NV vectors of output
 * channels (12 accumulators) runs over the taps: per tap NV vector loads of
 * the weights and one broadcast per position. The weights are packed by
 * blocks of BLOCKED_MB output channels (the last block narrower), each block
 * (K, its width) in one run: a tile's weights are contiguous (packed
 * (K, M8), a tile's rows would be M8 floats apart and fall on a few L1
 * sets). A job is BLOCKED_CHUNK positions of one image: its tile rows land
 * in a (positions, M8) buffer, which is transposed into y's planes (8 x 8 blocks), the epilogue
 * applied there. A padding conv reads its image from zero-padded copies of
 * its planes, made by the thread that takes the image's first job (in cache
 * for the next ones). A tile skips the kernel rows that read only the
 * copy's zero rows for all its positions (conv_blocked_impl.h: a 3x3 tile on the
 * first or last output row does two thirds of the FMAs; the sums are
 * unchanged).
 * The shapes left to direct_forward are those where these tiles do not
 * win (benchmarks/results/kernels-conv.md, "Channels-last tiles"): stride 1
 * on rows of 16 or more, where the plane kernel's blocks are full; more
 * than BLOCKED_MAX_TAPS taps, where a tile's weights no longer stay in L2;
 * fewer than BLOCKED_MIN_M output channels.
 * Workspace: the packed weights and bias, and BLOCKED_SLOTS slots (one per
 * part of a pool pass), each a position buffer and room for an image's
 * padded planes.
 */
#define BLOCKED_CHUNK 96
#define BLOCKED_PX_MAX 16 /* positions of the widest tile (one vector of channels, 16 lanes) */
#define BLOCKED_SLOTS 8
#define BLOCKED_MIN_M 16
#define BLOCKED_SLOT_PLANES (INT64_C(1) << 17) /* elements of an image's padded planes */
typedef struct {
    int64_t H, W, Hp, Wp, pb1, pb2, s1, s2, G2; /* plane, padded plane, grid row */
    int64_t M8, K, chunks;                  /* channels in vectors, taps, jobs/image */
    int64_t kh, kw, d1;                     /* kernel rows, columns, row dilation */
    int64_t imgs;                           /* images per job (1, or more for pw) */
    int64_t xl;                             /* x's lanes: 1 (NCHW) or 8 (blocked) */
    int64_t xc;                             /* x's channels as stored: C, or C8 blocked */
    bool padded;                            /* x is read from padded copies */
    bool yb;                                /* y in blocked channels */
    bool pw; /* pointwise on blocked x: blocked_pointwise_tiles */
    bool patch; /* few taps, x not blocked, y blocked: blocked_patch_tiles */
    int64_t off[BLOCKED_MAX_TAPS]; /* tap (c, k1, k2) in the padded planes */
} blocked_geom;

/* Output channels per block of the packed weights: the widest tile's */
#define BLOCKED_MB 32

/* The width of the block of the packed weights that starts at channel m0:
 * the channels of the tile that starts there. */
static inline int64_t blocked_block_width(int64_t M8, int64_t m0)
{
    return M8 - m0 < BLOCKED_MB ? M8 - m0 : BLOCKED_MB;
}

/* `blocked`: the blocked-channel forward (conv.h), x blocked when `xb`: any
 * stride, any width, pointwise too, any number of output channels (its
 * tiles are stored as they are, no transposes). */
static bool blocked_geom_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype,
                            blocked_geom *q, bool blocked, bool xb)
{
    if (dtype != AI_F32 || p->group != 1 || p->nsp > 2 || p->N == 0 ||
        p->C * g->ksize > BLOCKED_MAX_TAPS || g->grid_size == 0 ||
        (!blocked && (g->pointwise || p->M < BLOCKED_MIN_M ||
                      (g->s[1] == 1 && g->s[2] == 1 && g->grid[2] >= 16))))
        return false;
    const int o = 3 - p->nsp; /* p's dim d is g's dim d + o */
    int64_t pe[3] = {0, 0, 0};
    for (int d = 0; d < p->nsp; d++)
        pe[d + o] = p->pad_end[d];
    q->H = g->img[1];
    q->W = g->img[2];
    q->pb1 = g->p[1];
    q->pb2 = g->p[2];
    q->Hp = q->H + q->pb1 + pe[1];
    q->Wp = q->W + q->pb2 + pe[2];
    q->padded = q->Hp != q->H || q->Wp != q->W;
    q->yb = blocked;
    q->pw = blocked && xb && g->pointwise;
    q->patch = false; /* blocked_run's choice */
    q->xl = blocked && xb ? AI_CONV_BLOCK : 1;
    q->xc = q->xl == 1 ? p->C : (p->C + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK * AI_CONV_BLOCK;
    q->s1 = g->s[1];
    q->s2 = g->s[2];
    q->G2 = g->grid[2];
    q->M8 = (p->M + 7) / 8 * 8;
    q->K = p->C * g->ksize;
    q->kh = g->k[1];
    q->kw = g->k[2];
    q->d1 = g->d[1];
    q->chunks = (g->grid_size + BLOCKED_CHUNK - 1) / BLOCKED_CHUNK;
    q->imgs = 1;
    if (q->pw && g->grid_size < BLOCKED_CHUNK) {
        /* images of a job: at most a chunk's positions, the jobs a multiple
         * of the slots (n_slots_of: 16 images of 3x3 in 2 slots go 8 + 8,
         * not 10 + 6) and as even as they go */
        const int64_t most = BLOCKED_CHUNK / g->grid_size, parts = ai_parallel_parts();
        const int64_t nt = parts < BLOCKED_SLOTS ? parts : BLOCKED_SLOTS;
        int64_t jobs = (p->N + most - 1) / most;
        jobs = (jobs + nt - 1) / nt * nt;
        jobs = jobs < p->N ? jobs : p->N;
        q->imgs = (p->N + jobs - 1) / jobs;
    }
    if (q->padded && q->xc * q->Hp * q->Wp > BLOCKED_SLOT_PLANES)
        return false; /* the slots' planes would make a large workspace */
    int64_t t = 0;
    for (int64_t c = 0; c < p->C; c++) /* channel c: plane c, or lane c % 8 of block c / 8 */
        for (int64_t k1 = 0; k1 < g->k[1]; k1++)
            for (int64_t k2 = 0; k2 < g->k[2]; k2++)
                q->off[t++] = ((c / q->xl * q->Hp + k1 * g->d[1]) * q->Wp + k2 * g->d[2]) * q->xl +
                              c % q->xl;
    return true;
}

/* elements of a slot: its image's padded planes (when the conv pads), its
 * positions' buffer */
static int64_t blocked_slot_elems(const blocked_geom *q)
{
    return (q->padded ? q->xc * q->Hp * q->Wp : 0) + (BLOCKED_CHUNK + BLOCKED_PX_MAX) * q->M8;
}

/* the packed weights, bias and epilogue factors (blocked y), the slots */
static int64_t blocked_elems(const blocked_geom *q)
{
    return (q->K + 3) * q->M8 + BLOCKED_SLOTS * blocked_slot_elems(q);
}


typedef struct {
    const ai_conv_params *p;
    const blocked_geom *q;
    const float *x;
    const float *wp;   /* blocks of BLOCKED_MB channels, each (K, width) */
    const float *bias; /* the bias, the epilogue's a and c (M8 each) */
    float *y, *slots;
    const ai_conv_epilogue *ep;
    int64_t OS, jobs, n_slots;
    const float *r; /* blocked y: a residual added before the Relu, or NULL */
    bool wide;      /* the 16-lane tiles (AVX-512, channels a multiple of 16) */
} blocked_job;

/* Image x's planes into zero-padded copies at dst (blocked x: its blocks,
 * each position a run of 8 lanes). */
static void blocked_pad_image(const blocked_geom *q, float *dst, const float *x)
{
    const int64_t L = q->xl, Wp = q->Wp * L, W = q->W * L, pb2 = q->pb2 * L;
    const int64_t tail = Wp - pb2 - W, bottom = q->Hp - q->pb1 - q->H;
    for (int64_t c = 0; c < q->xc / L; c++, dst += q->Hp * Wp, x += q->H * W) {
        memset(dst, 0, sizeof(float) * (size_t)(q->pb1 * Wp));
        for (int64_t r = 0; r < q->H; r++) {
            float *row = dst + (q->pb1 + r) * Wp;
            memset(row, 0, sizeof(float) * (size_t)pb2);
            memcpy(row + pb2, x + r * W, sizeof(float) * (size_t)W);
            memset(row + pb2 + W, 0, sizeof(float) * (size_t)tail);
        }
        memset(dst + (q->pb1 + q->H) * Wp, 0, sizeof(float) * (size_t)(bottom * Wp));
    }
}

/* Position p0 + i's first input in the (padded) planes for i < np, rows
 * and columns counted (a division per position was a sixth of the stem's
 * time); past np, up to BLOCKED_PX_MAX more, the last again (computed,
 * not stored). */
static void blocked_bases(const blocked_geom *q, int64_t p0, int64_t np, int64_t *base)
{
    const int64_t rs = q->s1 * q->Wp * q->xl, cstep = q->s2 * q->xl; /* a row's, a column's step */
    int64_t o2 = p0 % q->G2, at = (p0 / q->G2 * q->s1 * q->Wp + o2 * q->s2) * q->xl;
    for (int64_t i = 0; i < np; i++) {
        base[i] = at;
        if (++o2 < q->G2) {
            at += cstep;
        } else {
            o2 = 0;
            at += rs - (q->G2 - 1) * cstep;
        }
    }
    for (int64_t i = np; i < np + BLOCKED_PX_MAX; i++)
        base[i] = base[np - 1];
}

/* The patch tiles' taps at most: a first conv's (1 to 3 channels, 10x4 to 4x4
 * kernels); beyond, the direct tiles */
#define BLOCKED_PATCH_MAX_TAPS 64

/* The tiles at 8 lanes (AVX2 or baseline clones), and at 16 where GCC can
 * target AVX-512: taken (blocked_job.wide) when the CPU has it and the output
 * channels are a multiple of 16: twice the channels per load and per FMA,
 * the same sums (benchmarks/results/fused-inference.md). */
#define BLOCKED_V conv_vec8
#define BLOCKED_VL 8
#define BLOCKED_SFX _v8
#define BLOCKED_ATTR AI_GEMM_CLONES
#define BLOCKED_SHAPES(TILE) \
    if (nv >= 4) {           \
        TILE(4, 3)           \
    } else if (nv == 3) {    \
        TILE(3, 4)           \
    } else if (nv == 2) {    \
        TILE(2, 6)           \
    } else {                 \
        TILE(1, 12)          \
    }
/* patch tiles of 3 positions by up to 4 vectors (one block): 12 accumulators */
#define BLOCKED_PATCH_PX 3
#define BLOCKED_PATCH_SHAPES(TILE) \
    if (nv >= 4) {                 \
        TILE(4, 3)                 \
    } else if (nv == 3) {          \
        TILE(3, 3)                 \
    } else if (nv == 2) {          \
        TILE(2, 3)                 \
    } else {                       \
        TILE(1, 3)                 \
    }
#define BLOCKED_NO_CONTRACT VEC_NO_CONTRACT
#define BLOCKED_LOAD_BLOCKS(src, ld) (*(const conv_vec8 *)(src))
#define BLOCKED_STORE_BLOCKS(dst, ld, t) (*(conv_vec8 *)(dst) = (t))
#include "conv_blocked_impl.h"
#ifdef AI_AVX512_KERNEL
#define BLOCKED_V conv_vec16
#define BLOCKED_VL 16
#define BLOCKED_SFX _v16
#define BLOCKED_ATTR AI_AVX512_KERNEL
/* 3x3 tiles of 8 or 16 positions (rows of 32, 16, 8 whole); pointwise ones
 * of 12 and 16 (24 and 16 accumulators of the 32 registers), the rest by
 * 4, then one at a time (a 125-position image had 5 single positions of 29
 * after its 12-position tiles: 2 FMAs per 3 loads) */
#define BLOCKED_SHAPES(TILE) \
    if (nv >= 2) {           \
        TILE(2, 8)           \
    } else {                 \
        TILE(1, 16)          \
    }
#define BLOCKED_POINTWISE_SHAPES(TILE) \
    if (nv >= 2) {                     \
        BLOCKED_POINTWISE_TILE(2, 12)  \
        TILE(2, 4)                     \
    } else {                           \
        BLOCKED_POINTWISE_TILE(1, 16)  \
        TILE(1, 4)                     \
    }
/* patch tiles of 6 positions by 4 vectors (64 channels): 24 accumulators */
#define BLOCKED_PATCH_PX 6
#define BLOCKED_PATCH_SHAPES(TILE) \
    if (nv >= 4) {                 \
        TILE(4, 6)                 \
    } else if (nv >= 2) {          \
        TILE(2, 6)                 \
    } else {                       \
        TILE(1, 6)                 \
    }
#define BLOCKED_NO_CONTRACT VEC16_NO_CONTRACT
#define BLOCKED_LOAD_BLOCKS(src, ld)                                                             \
    __builtin_shufflevector(*(const conv_vec8 *)(src), *(const conv_vec8 *)((src) + (ld)), 0, 1, \
                            2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define BLOCKED_STORE_BLOCKS(dst, ld, t)                                                 \
    do {                                                                                 \
        *(conv_vec8 *)(dst) = __builtin_shufflevector((t), (t), 0, 1, 2, 3, 4, 5, 6, 7); \
        *(conv_vec8 *)((dst) + (ld)) =                                                   \
            __builtin_shufflevector((t), (t), 8, 9, 10, 11, 12, 13, 14, 15);             \
    } while (0)
#include "conv_blocked_impl.h"
#endif

/* yt (np rows of M8) into positions [p0, p0 + np) of y's M planes (OS
 * apart), then the epilogue on them. */
AI_VECTOR_CLONES static void blocked_store(const blocked_job *j, float *yn, int64_t p0, int64_t np,
                                           const float *yt)
{
    const int64_t M = j->p->M, M8 = j->q->M8, OS = j->OS;
    int64_t m = 0;
#ifdef AI_HAVE_TRANSPOSE8
    for (; m + 8 <= M; m += 8) {
        int64_t i = 0;
        for (; i + 8 <= np; i += 8)
            transpose8_f32(yn + m * OS + p0 + i, OS, yt + i * M8 + m, M8);
        for (; i < np; i++)
            for (int r = 0; r < 8; r++)
                yn[(m + r) * OS + p0 + i] = yt[i * M8 + m + r];
    }
#endif
    for (; m < M; m++)
        for (int64_t i = 0; i < np; i++)
            yn[m * OS + p0 + i] = yt[i * M8 + m];
    if (j->ep)
        for (m = 0; m < M; m++)
            ep_apply_f32(yn + m * OS + p0, yn + m * OS + p0, np, NULL, j->ep, m, M);
}

/* Slots [lo, hi): each its share of the jobs (image, chunk), in order. */
static void blocked_range(void *ctx, int64_t lo, int64_t hi)
{
    const blocked_job *j = ctx;
    const blocked_geom *q = j->q;
    const int64_t M = q->yb ? q->M8 : j->p->M, OS = j->OS;
    for (int64_t s = lo; s < hi; s++) {
        float *yt = j->slots + s * blocked_slot_elems(q), *planes = yt;
        if (q->padded)
            yt += q->xc * q->Hp * q->Wp;
        for (int64_t job = s * j->jobs / j->n_slots, padded = -1;
             job < (s + 1) * j->jobs / j->n_slots; job++) {
            const int64_t n = job / q->chunks * q->imgs, p0 = job % q->chunks * BLOCKED_CHUNK;
            const int64_t np = OS - p0 < BLOCKED_CHUNK ? OS - p0 : BLOCKED_CHUNK;
            const float *xn = j->x + n * q->xc * q->H * q->W;
            if (q->pw) { /* its images, each channel tile over all of them */
                const int64_t n1 = n + q->imgs < j->p->N ? n + q->imgs : j->p->N;
#ifdef AI_AVX512_KERNEL
                if (j->wide)
                    blocked_pointwise_tiles_v16(j, xn, j->y + n * M * OS, n1 - n, p0, np);
                else
#endif
                    blocked_pointwise_tiles_v8(j, xn, j->y + n * M * OS, n1 - n, p0, np);
                continue;
            }
            if (q->padded && padded != n) {
                blocked_pad_image(q, planes, xn);
                padded = n;
            }
            float *yn = j->y + n * M * OS;
            if (q->patch) {
#ifdef AI_AVX512_KERNEL
                if (j->wide)
                    blocked_patch_tiles_v16(j, q->padded ? planes : xn, p0, np, yn);
                else
#endif
                    blocked_patch_tiles_v8(j, q->padded ? planes : xn, p0, np, yn);
                continue;
            }
#ifdef AI_AVX512_KERNEL
            if (j->wide)
                blocked_tiles_v16(j, q->padded ? planes : xn, p0, np, yt, q->yb ? yn : NULL);
            else
#endif
                blocked_tiles_v8(j, q->padded ? planes : xn, p0, np, yt, q->yb ? yn : NULL);
            if (!q->yb)
                blocked_store(j, yn, p0, np, yt);
        }
    }
}

typedef struct {
    float *wp;
    const float *w;
    int64_t K, M, M8;
} pack_job;

/* Blocks [lo, hi) of BLOCKED_MB output channels of w (M, K) into wp, each
 * (K, its width), zero past M: on the pool, the weights of a wide conv are
 * 256 KB and more. */
static void pack_range(void *ctx, int64_t lo, int64_t hi)
{
    const pack_job *j = ctx;
    for (int64_t b = lo; b < hi; b++) {
        const int64_t m0 = b * BLOCKED_MB, bw = blocked_block_width(j->M8, m0);
        const int64_t rows = j->M - m0 < bw ? j->M - m0 : bw;
        float *d = j->wp + m0 * j->K;
        transpose_f32(d, bw, j->w + m0 * j->K, j->K, rows, j->K, false);
        for (int64_t k = 0; rows < bw && k < j->K; k++)
            memset(d + k * bw + rows, 0, sizeof(float) * (size_t)(bw - rows));
    }
}

/* w (M, C, kernel) = (M, K) packed into wp, (K, M8) floats */
static void blocked_pack(float *wp, const float *w, int64_t K, int64_t M, int64_t M8)
{
    pack_job pj = {wp, w, K, M, M8};
    ai_parallel_for((M8 + BLOCKED_MB - 1) / BLOCKED_MB, ai_grain_of(BLOCKED_MB * K), pack_range,
                    &pj);
}

/* y = conv(x, w) + b by the blocked tiles (blocked_geom_of's `blocked` and
 * `xb`), w read packed from wp (blocked_chain_pack's) or, where wp is NULL,
 * packed into the workspace first. */
static bool blocked_run(const ai_conv_params *p, float *y, const float *x, const float *w,
                        const float *wp, const float *b, float *ws, const ai_conv_epilogue *ep,
                        bool blocked, bool xb, const float *r, bool patch)
{
    conv_geom g = conv_geom_of(p, false);
    blocked_geom q;
    if (!blocked_geom_of(p, &g, AI_F32, &q, blocked, xb))
        return false;
    q.patch = patch;
    const int64_t K = q.K, M = p->M, M8 = q.M8;
    if (!wp) {
        blocked_pack(ws, w, K, M, M8);
        wp = ws;
    }
    const float *ab = ep ? ep->ab : NULL;
    for (int64_t m = 0; m < M8; m++) { /* the bias, the epilogue's factors */
        ws[K * M8 + m] = b && m < M ? b[m] : 0;
        ws[(K + 1) * M8 + m] = ab && m < M ? ab[m] : 0;
        ws[(K + 2) * M8 + m] = ab && m < M ? ab[M + m] : 0;
    }
    blocked_job j = {p, &q, x, wp, ws + K * M8, y, ws + (K + 3) * M8, ep, g.grid_size,
                     (p->N + q.imgs - 1) / q.imgs * q.chunks, 0, r,
                     M8 % 16 == 0 && ai_cpu_avx512()};
    j.n_slots = n_slots_of(j.jobs, BLOCKED_SLOTS);
    ai_parallel_for(j.n_slots, 1, blocked_range, &j);
    return true;
}


typedef struct {
    char *blocked;
    const char *plain; /* (N, C, S) */
    int64_t C, CB, S;  /* channels, blocks, positions */
    size_t es;         /* element size */
    bool to_blocked;   /* plain -> blocked, else blocked -> plain */
    bool add;          /* add into the destination, else write */
} reorder_job;

/* Blocks [lo, hi) of the batch (n CB + cb): 8 channel planes of S
 * positions <-> S runs of 8 lanes (float32: 8 x 8 transposes). */
AI_VECTOR_CLONES static void reorder_range(void *ctx, int64_t lo, int64_t hi)
{
    enum { B = AI_CONV_BLOCK };
    const reorder_job *j = ctx;
    const size_t es = j->es;
    for (int64_t nb = lo; nb < hi; nb++) {
        const int64_t n = nb / j->CB, c0 = nb % j->CB * B;
        const int64_t nc = j->C - c0 < B ? j->C - c0 : B;
        char *blk = j->blocked + (size_t)(nb * j->S * B) * es;
        char *plane = (char *)j->plain + (size_t)((n * j->C + c0) * j->S) * es;
        if (j->to_blocked && !j->add && nc < B)
            memset(blk, 0, (size_t)(j->S * B) * es);
        int64_t s0 = 0;
#ifdef AI_HAVE_TRANSPOSE8
        for (; es == sizeof(float) && nc == B && !j->add && s0 + 8 <= j->S; s0 += 8) {
            float *b = (float *)blk + s0 * B, *q = (float *)plane + s0;
            if (j->to_blocked)
                transpose8_f32(b, B, q, j->S);
            else
                transpose8_f32(q, j->S, b, B);
        }
#endif
        for (int64_t l = 0; l < nc && s0 < j->S; l++) {
            char *pl = plane + (size_t)(l * j->S) * es;
            if (es == sizeof(float)) {
                float *b = (float *)blk + l, *q = (float *)pl;
                for (int64_t s = s0; s < j->S; s++)
                    if (j->to_blocked)
                        b[s * B] = j->add ? b[s * B] + q[s] : q[s];
                    else
                        q[s] = j->add ? q[s] + b[s * B] : b[s * B];
            } else {
                double *b = (double *)blk + l, *q = (double *)pl;
                for (int64_t s = s0; s < j->S; s++)
                    if (j->to_blocked)
                        b[s * B] = j->add ? b[s * B] + q[s] : q[s];
                    else
                        q[s] = j->add ? q[s] + b[s * B] : b[s * B];
            }
        }
    }
}

void ai_channels_reorder(void *blocked, void *plain, int64_t N, int64_t C, int64_t S,
                         size_t elem_size, bool to_blocked, bool add)
{
    reorder_job j = {blocked, plain, C, (C + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK, S, elem_size,
                     to_blocked, add};
    ai_parallel_for(N * j.CB, ai_grain_of(S * AI_CONV_BLOCK), reorder_range, &j);
}


typedef struct {
    float *y;
    const float *r;
    bool relu;
} residual_job;

/* y[lo, hi) += r, then the Relu (NaN passes) */
AI_VECTOR_CLONES static void residual_range(void *ctx, int64_t lo, int64_t hi)
{
    const residual_job *j = ctx;
    float *y = j->y;
    const float *r = j->r;
    for (int64_t i = lo; i < hi; i++) {
        const float t = y[i] + r[i];
        y[i] = j->relu && !(t > 0 || t != t) ? 0 : t;
    }
}


void blocked_add_residual(float *y, const float *r, int64_t n, bool relu)
{
    residual_job j = {y, r, relu};
    ai_parallel_for(n, AI_GRAIN_ELEMS, residual_range, &j);
}

bool blocked_forward(const conv_call *c)
{
    return c->dtype == AI_F32 &&
           blocked_run(c->p, c->y, c->x, c->w, NULL, c->b, c->ws, c->ep, false, false, NULL,
                       false);
}

int64_t blocked_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype)
{
    blocked_geom q;
    return blocked_geom_of(p, g, dtype, &q, false, false) ? blocked_elems(&q) : 0;
}

bool blocked_chain_accepts(const ai_conv_params *p, const conv_geom *g, bool x_blocked)
{
    blocked_geom q;
    return blocked_geom_of(p, g, AI_F32, &q, true, x_blocked);
}

int64_t blocked_chain_workspace(const ai_conv_params *p, const conv_geom *g, bool x_blocked)
{
    blocked_geom q;
    return blocked_geom_of(p, g, AI_F32, &q, true, x_blocked) ? blocked_elems(&q) : 0;
}

/* the packed weights of the blocked and patch tiles, (K, M8) floats */
int64_t blocked_chain_packed_elems(const ai_conv_params *p, const conv_geom *g)
{
    return p->C * g->ksize * ((p->M + 7) / 8 * 8);
}

void blocked_chain_pack(const ai_conv_params *p, const conv_geom *g, const float *w, float *wp)
{
    blocked_pack(wp, w, p->C * g->ksize, p->M, (p->M + 7) / 8 * 8);
}

/* the residual r (or NULL) added in registers */
void blocked_chain_forward(const ai_conv_params *p, float *y, const float *x, const float *w,
                           const float *wp, const float *b, float *ws,
                           const ai_conv_epilogue *ep, bool x_blocked, const float *r)
{
    blocked_run(p, y, x, w, wp, b, ws, ep, true, x_blocked, r, false);
}

/* The patch tiles: NCHW x, at most BLOCKED_PATCH_MAX_TAPS taps, at least
 * 32 output channels (two or four vectors of 16 per broadcast) */
bool patch_chain_accepts(const ai_conv_params *p, const conv_geom *g, bool x_blocked)
{
    return !x_blocked && p->C * g->ksize <= BLOCKED_PATCH_MAX_TAPS && p->M >= 32 &&
           blocked_chain_accepts(p, g, false);
}

/* its workspace: blocked_chain_workspace's (the same geometry, slots and packed weights) */
void patch_chain_forward(const ai_conv_params *p, float *y, const float *x, const float *w,
                         const float *wp, const float *b, float *ws,
                         const ai_conv_epilogue *ep, const float *r)
{
    blocked_run(p, y, x, w, wp, b, ws, ep, true, false, r, true);
}
