/*
 * conv_winograd.c — 3x3 stride-1 float32 convolutions of the blocked chains
 * (NCHWc8 in and out, conv.h), and NCHW ones between reorders (training
 * forwards, input gradients; at the end), by Winograd's F(2x2, 3x3): each 2 x 2 tile of
 * outputs from the 4 x 4 input values around it in 16 products per input
 * channel instead of 36 multiply-adds (2.25x fewer), the transforms being
 * additions alone:
 *
 *   U = G g G^T   (per output and input channel; per call, on the pool)
 *   V = B^T d B   (per tile and input channel, 8 channels a vector)
 *   m[e] = sum over c of U[e][c] V[e][c]     (16 products e, FMAs)
 *   y = A^T m A + b, then the epilogue, the residual, as the blocked tiles
 *
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
 *   A^T = [1 1 1 0; 0 1 -1 -1]
 *
 * The products are the blocked tiles' register tiles (PX tiles by NV
 * vectors of output channels; conv_winograd_impl.h, 8 and 16 lanes, the
 * same sums), the transformed inputs a job's tiles in the workspace. The
 * values differ from the direct sums by rounding only: the transforms add
 * at most 4 terms, with factors 1 and 1/2 (exact). A job is WINOGRAD_TILES
 * tiles of one image; each output is computed by one job in a fixed order,
 * so the values do not depend on the thread count. Taken where the direct
 * tiles do the most multiply-adds per output: at least WINOGRAD_MIN_C input
 * and output channels (benchmarks/results/suite-ort.md: ResNet-8's 16, 32
 * and 64-channel 3x3 convs).
 * Workspace: the transformed weights U (by blocks of WINOGRAD_MB output
 * channels, each (16, C, width)), the bias and epilogue factors, and
 * WINOGRAD_SLOTS slots of a job's transformed inputs and products.
 */
#include "conv_internal.h"

#define WINOGRAD_TILES 32  /* tiles of a job */
#define WINOGRAD_PX_MAX 16 /* tiles of the widest register tile */
#define WINOGRAD_ROWS (WINOGRAD_TILES + WINOGRAD_PX_MAX) /* a product's rows of inputs */
#define WINOGRAD_MB 32     /* output channels per block of U */
#define WINOGRAD_SLOTS 8
#define WINOGRAD_MIN_C 16

typedef struct {
    int64_t H, W, Ho, Wo, pb1, pb2; /* input plane, output plane, pads before */
    int64_t TW, T, chunks;          /* tiles per row, per image, jobs per image */
    int64_t C, C8, M, M8;           /* channels, as stored (multiples of 8) */
} winograd_geom;

static bool winograd_geom_of(const ai_conv_params *p, const conv_geom *g, bool xb,
                             winograd_geom *q)
{
    if (!xb || p->nsp != 2 || p->group != 1 || p->N == 0 || p->C < WINOGRAD_MIN_C ||
        p->M < WINOGRAD_MIN_C || g->grid_size == 0)
        return false;
    for (int i = 1; i < 3; i++)
        if (g->k[i] != 3 || g->s[i] != 1 || g->d[i] != 1)
            return false;
    q->H = g->img[1];
    q->W = g->img[2];
    q->Ho = g->grid[1];
    q->Wo = g->grid[2];
    q->pb1 = g->p[1];
    q->pb2 = g->p[2];
    q->TW = (q->Wo + 1) / 2;
    q->T = (q->Ho + 1) / 2 * q->TW;
    q->chunks = (q->T + WINOGRAD_TILES - 1) / WINOGRAD_TILES;
    q->C = p->C;
    q->C8 = (p->C + 7) / 8 * 8;
    q->M = p->M;
    q->M8 = (p->M + 7) / 8 * 8;
    return true;
}

static int64_t winograd_slot_elems(const winograd_geom *q)
{
    return 16 * WINOGRAD_ROWS * q->C8 + WINOGRAD_PX_MAX * 16 * WINOGRAD_MB;
}

static int64_t winograd_elems(const winograd_geom *q)
{
    return (16 * q->C + 3) * q->M8 + WINOGRAD_SLOTS * winograd_slot_elems(q);
}

/* The width of U's block that starts at output channel m0 */
static inline int64_t winograd_block_width(int64_t M8, int64_t m0)
{
    return M8 - m0 < WINOGRAD_MB ? M8 - m0 : WINOGRAD_MB;
}

typedef struct {
    const winograd_geom *q;
    const float *x, *r; /* r: a residual added before the Relu, or NULL */
    const float *u;     /* U */
    const float *bias;  /* the bias, the epilogue's a and c */
    float *y, *slots;
    const ai_conv_epilogue *ep;
    int64_t jobs, n_slots;
    bool wide; /* the 16-lane tiles (AVX-512, output channels a multiple of 16) */
} winograd_job;

typedef struct {
    const winograd_geom *q;
    const float *w; /* (M, C, 3, 3); with `flip`, (C, M, 3, 3) read transposed and flipped */
    float *u;
    bool flip;
} winograd_weights_job;

/* Blocks [lo, hi) of U: output channels m of the block, input channels c,
 * U[e][c][m] = (G g G^T)[e], zero past M */
static void winograd_weights_range(void *ctx, int64_t lo, int64_t hi)
{
    const winograd_weights_job *j = ctx;
    const winograd_geom *q = j->q;
    const int64_t C = q->C;
    for (int64_t blk = lo; blk < hi; blk++) {
        const int64_t m0 = blk * WINOGRAD_MB, bw = winograd_block_width(q->M8, m0);
        float *u = j->u + 16 * C * m0;
        for (int64_t m = m0; m < m0 + bw; m++)
            for (int64_t c = 0; c < C; c++) {
                float t[4][3], v[16] = {0}, gf[9];
                const float *g = j->w + (m * C + c) * 9;
                if (j->flip && m < q->M) { /* the input gradient's kernel */
                    for (int k = 0; k < 9; k++)
                        gf[k] = j->w[(c * q->M + m) * 9 + 8 - k];
                    g = gf;
                }
                for (int k = 0; k < 3 && m < q->M; k++) { /* G g: rows */
                    const float s = g[k] + g[6 + k];
                    t[0][k] = g[k];
                    t[1][k] = 0.5f * (s + g[3 + k]);
                    t[2][k] = 0.5f * (s - g[3 + k]);
                    t[3][k] = g[6 + k];
                }
                for (int a = 0; a < 4 && m < q->M; a++) { /* (G g) G^T: columns */
                    const float s = t[a][0] + t[a][2];
                    v[4 * a] = t[a][0];
                    v[4 * a + 1] = 0.5f * (s + t[a][1]);
                    v[4 * a + 2] = 0.5f * (s - t[a][1]);
                    v[4 * a + 3] = t[a][2];
                }
                for (int e = 0; e < 16; e++)
                    u[(e * C + c) * bw + m - m0] = v[e];
            }
    }
}

/* Tiles [t0, t0 + nt) of image xn (blocked, C8 / 8 blocks of H x W x 8) into
 * vt: V[e] of tile t0 + i, channels c0 to c0 + 7, at vt + ((e C8 + c0)
 * WINOGRAD_ROWS + 8 i) (a product's tiles 8 floats apart), the input
 * outside the plane zero; tiles from nt to the next multiple of
 * WINOGRAD_PX_MAX zeros (the last register tile reads them). */
AI_WIDE_CLONES static void winograd_inputs(const winograd_geom *q, const float *xn, int64_t t0,
                                           int64_t nt, float *vt)
{
    const int64_t C8 = q->C8, ld = C8 * WINOGRAD_ROWS; /* V[e] to V[e + 1] */
    for (int64_t i = 0; i < nt; i++) {
        const int64_t r0 = (t0 + i) / q->TW * 2 - q->pb1, c0 = (t0 + i) % q->TW * 2 - q->pb2;
        const bool inside = r0 >= 0 && r0 + 4 <= q->H && c0 >= 0 && c0 + 4 <= q->W;
        bool in[4][4];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                in[a][b] = r0 + a >= 0 && r0 + a < q->H && c0 + b >= 0 && c0 + b < q->W;
        const int64_t at = (r0 * q->W + c0) * 8; /* the window's first value, maybe outside */
/* row a of B^T d from the two input rows it reads (loaded again per row,
 * from L1: the 16 inputs and 16 sums would not fit the registers), then
 * row a of (B^T d) B; D(r, b) the input at row r, column b of the window */
#define WINOGRAD_ROW(D, a, r0, op, r1)                           \
    {                                                            \
        conv_vec8 t[4];                                          \
        for (int b = 0; b < 4; b++)                              \
            t[b] = D(r0, b) op D(r1, b);                         \
        *(conv_vec8 *)(v + (4 * (a)) * ld) = t[0] - t[2];        \
        *(conv_vec8 *)(v + (4 * (a) + 1) * ld) = t[1] + t[2];    \
        *(conv_vec8 *)(v + (4 * (a) + 2) * ld) = t[2] - t[1];    \
        *(conv_vec8 *)(v + (4 * (a) + 3) * ld) = t[1] - t[3];    \
    }
#define WINOGRAD_BLOCKS(D)                                                    \
    for (int64_t cb = 0; cb < C8; cb += 8) {                                  \
        const float *xc = xn + cb * q->H * q->W + at;                         \
        float *v = vt + cb * WINOGRAD_ROWS + 8 * i;                           \
        WINOGRAD_ROW(D, 0, 0, -, 2)                                           \
        WINOGRAD_ROW(D, 1, 1, +, 2)                                           \
        WINOGRAD_ROW(D, 2, 2, -, 1)                                           \
        WINOGRAD_ROW(D, 3, 1, -, 3)                                           \
    }
#define WINOGRAD_IN(r, b) (*(const conv_vec8 *)(xc + ((r) * q->W + (b)) * 8))
#define WINOGRAD_EDGE(r, b) (in[r][b] ? WINOGRAD_IN(r, b) : (conv_vec8){0})
        if (inside)
            WINOGRAD_BLOCKS(WINOGRAD_IN)
        else
            WINOGRAD_BLOCKS(WINOGRAD_EDGE)
#undef WINOGRAD_EDGE
#undef WINOGRAD_IN
#undef WINOGRAD_BLOCKS
#undef WINOGRAD_ROW
    }
    const int64_t end = (nt + WINOGRAD_PX_MAX - 1) / WINOGRAD_PX_MAX * WINOGRAD_PX_MAX;
    for (int64_t eb = 0; eb < 16 * C8 && end > nt; eb += 8)
        memset(vt + eb * WINOGRAD_ROWS + 8 * nt, 0, sizeof(float) * (size_t)(8 * (end - nt)));
}

/* The products and output transform at 8 lanes (AVX2 or baseline clones),
 * and at 16 where GCC can target AVX-512: the blocked tiles' shapes */
#define WINO_V conv_vec8
#define WINO_VL 8
#define WINO_SFX _v8
#define WINO_ATTR AI_GEMM_CLONES
#define WINO_SHAPES(TILE) \
    if (nv >= 4) {        \
        TILE(4, 3)        \
    } else if (nv == 3) { \
        TILE(3, 4)        \
    } else if (nv == 2) { \
        TILE(2, 6)        \
    } else {              \
        TILE(1, 12)       \
    }
#define WINO_NO_CONTRACT VEC_NO_CONTRACT
#define WINO_LOAD_BLOCKS(src, ld) (*(const conv_vec8 *)(src))
#define WINO_STORE_BLOCKS(dst, ld, t) (*(conv_vec8 *)(dst) = (t))
#include "conv_winograd_impl.h"
#ifdef AI_AVX512_KERNEL
#define WINO_V conv_vec16
#define WINO_VL 16
#define WINO_SFX _v16
#define WINO_ATTR AI_AVX512_KERNEL
#define WINO_SHAPES(TILE) \
    if (nv >= 2) {        \
        TILE(2, 8)        \
    } else {              \
        TILE(1, 16)       \
    }
#define WINO_NO_CONTRACT VEC16_NO_CONTRACT
#define WINO_LOAD_BLOCKS(src, ld)                                                                \
    __builtin_shufflevector(*(const conv_vec8 *)(src), *(const conv_vec8 *)((src) + (ld)), 0, 1, \
                            2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define WINO_STORE_BLOCKS(dst, ld, t)                                                    \
    do {                                                                                 \
        *(conv_vec8 *)(dst) = __builtin_shufflevector((t), (t), 0, 1, 2, 3, 4, 5, 6, 7); \
        *(conv_vec8 *)((dst) + (ld)) =                                                   \
            __builtin_shufflevector((t), (t), 8, 9, 10, 11, 12, 13, 14, 15);             \
    } while (0)
#include "conv_winograd_impl.h"
#endif

/* Slots [lo, hi): each its share of the jobs (image, chunk of tiles), in order */
static void winograd_range(void *ctx, int64_t lo, int64_t hi)
{
    const winograd_job *j = ctx;
    const winograd_geom *q = j->q;
    for (int64_t s = lo; s < hi; s++) {
        float *vt = j->slots + s * winograd_slot_elems(q), *mb = vt + 16 * WINOGRAD_ROWS * q->C8;
        for (int64_t job = s * j->jobs / j->n_slots; job < (s + 1) * j->jobs / j->n_slots;
             job++) {
            const int64_t n = job / q->chunks, t0 = job % q->chunks * WINOGRAD_TILES;
            const int64_t nt = q->T - t0 < WINOGRAD_TILES ? q->T - t0 : WINOGRAD_TILES;
            winograd_inputs(q, j->x + n * q->C8 * q->H * q->W, t0, nt, vt);
            float *yb = j->y + n * q->M8 * q->Ho * q->Wo;
#ifdef AI_AVX512_KERNEL
            if (j->wide)
                winograd_tiles_v16(j, vt, mb, t0, nt, yb);
            else
#endif
                winograd_tiles_v8(j, vt, mb, t0, nt, yb);
        }
    }
}

bool winograd_chain_accepts(const ai_conv_params *p, const conv_geom *g, bool x_blocked)
{
    winograd_geom q;
    return winograd_geom_of(p, g, x_blocked, &q);
}

int64_t winograd_chain_workspace(const ai_conv_params *p, const conv_geom *g, bool x_blocked)
{
    winograd_geom q;
    return winograd_geom_of(p, g, x_blocked, &q) ? winograd_elems(&q) : 0;
}

/* U of w (flipped: of w transposed and flipped), made on the pool */
static void winograd_weights(const winograd_geom *q, const float *w, bool flip, float *u)
{
    winograd_weights_job j = {q, w, u, flip};
    ai_parallel_for((q->M8 + WINOGRAD_MB - 1) / WINOGRAD_MB,
                    ai_grain_of(WINOGRAD_MB * 16 * q->C), winograd_weights_range, &j);
}

int64_t winograd_chain_packed_elems(const ai_conv_params *p)
{
    return 16 * p->C * ((p->M + 7) / 8 * 8);
}

void winograd_chain_pack(const ai_conv_params *p, const float *w, float *wp)
{
    const conv_geom g = conv_geom_of(p, false);
    winograd_geom q;
    if (winograd_geom_of(p, &g, true, &q))
        winograd_weights(&q, w, false, wp);
}

void winograd_chain_forward(const ai_conv_params *p, float *y, const float *x, const float *w,
                            const float *wp, const float *b, float *ws,
                            const ai_conv_epilogue *ep, const float *r)
{
    const conv_geom g = conv_geom_of(p, false);
    winograd_geom q;
    if (!winograd_geom_of(p, &g, true, &q))
        return;
    const int64_t M8 = q.M8;
    if (!wp) {
        winograd_weights(&q, w, false, ws);
        wp = ws;
    }
    float *bias = ws + 16 * q.C * M8;
    const float *ab = ep ? ep->ab : NULL;
    for (int64_t m = 0; m < M8; m++) { /* the bias, the epilogue's factors */
        bias[m] = b && m < q.M ? b[m] : 0;
        bias[M8 + m] = ab && m < q.M ? ab[m] : 0;
        bias[2 * M8 + m] = ab && m < q.M ? ab[q.M + m] : 0;
    }
    winograd_job j = {&q, x, r, wp, bias, y, ws + (16 * q.C + 3) * M8, ep, 0, 0,
                      M8 % 16 == 0 && ai_cpu_avx512()};
    j.jobs = p->N * q.chunks;
    j.n_slots = n_slots_of(j.jobs, WINOGRAD_SLOTS);
    ai_parallel_for(j.n_slots, 1, winograd_range, &j);
}

/*
 * NCHW x and y (training forwards, eval forwards outside the fused
 * inference graph) and the input gradient of those convs (the stride-1
 * conv of dy by w transposed and flipped, direct_input_grad_params): the
 * chain kernel on groups of images, each group's x reordered into blocked
 * channels and its y back (8 x 8 transposes), U made once per call. A
 * group holds at most WINOGRAD_GROUP_ELEMS floats of x and y (at least one
 * image), so that its planes stay in cache between the reorders and the
 * products. Taken on output planes of at least WINOGRAD_NCHW_MIN_TILES
 * tiles, or of 9 where the blocked tiles do not take the conv (more than
 * BLOCKED_MAX_TAPS taps): on fewer, the register tiles of 8 or 16 tiles
 * run part empty and the blocked or direct tiles win (64 -> 64 channels,
 * batch 16, 1 thread: 8x8 planes 0.75-0.79 of the blocked tiles' time, 6x6
 * 1.00, 5x5 1.23, 3x3 1.72; 128 -> 128 channels on 6x6 0.82-0.84 of the
 * direct tiles', on 3x3 1.36; benchmarks/results/kernels-conv.md). The reference
 * twin is the direct kernel (ai_set_fast_kernels(false)).
 */
#define WINOGRAD_GROUP_ELEMS (INT64_C(1) << 18)
#define WINOGRAD_NCHW_MIN_TILES 16

static bool winograd_nchw_geom(const ai_conv_params *p, winograd_geom *q)
{
    const conv_geom g = conv_geom_of(p, false);
    return winograd_geom_of(p, &g, true, q) &&
           (q->T >= WINOGRAD_NCHW_MIN_TILES || (q->T >= 9 && p->C * 9 > BLOCKED_MAX_TAPS));
}

static int64_t winograd_group(const winograd_geom *q, int64_t N)
{
    const int64_t per = q->C8 * q->H * q->W + q->M8 * q->Ho * q->Wo;
    const int64_t n = WINOGRAD_GROUP_ELEMS / per;
    return n < 1 ? 1 : n > N ? N : n;
}

static int64_t winograd_nchw_elems(const ai_conv_params *p)
{
    winograd_geom q;
    if (!winograd_nchw_geom(p, &q))
        return 0;
    return winograd_chain_packed_elems(p) +
           winograd_group(&q, p->N) * (q.C8 * q.H * q.W + q.M8 * q.Ho * q.Wo) + winograd_elems(&q);
}

/* y = conv(x, w) + b then the epilogue (y += conv(x, w) with `add`), w
 * read transposed and flipped with `flip`; false where not taken */
static bool winograd_nchw(const ai_conv_params *p, float *y, const float *x, const float *w,
                          bool flip, const float *b, bool add, float *ws,
                          const ai_conv_epilogue *ep)
{
    winograd_geom q;
    if (!ai_fast_kernels() || !winograd_nchw_geom(p, &q))
        return false;
    const int64_t IS = q.H * q.W, OS = q.Ho * q.Wo, group = winograd_group(&q, p->N);
    float *u = ws, *xb = u + winograd_chain_packed_elems(p), *yb = xb + group * q.C8 * IS;
    float *rest = yb + group * q.M8 * OS;
    winograd_weights(&q, w, flip, u);
    for (int64_t n0 = 0; n0 < p->N; n0 += group) {
        ai_conv_params pg = *p;
        pg.N = p->N - n0 < group ? p->N - n0 : group;
        ai_channels_reorder(xb, (float *)x + n0 * p->C * IS, pg.N, p->C, IS, sizeof(float), true,
                            false);
        winograd_chain_forward(&pg, yb, xb, w, u, b, rest, ep, NULL);
        ai_channels_reorder(yb, y + n0 * p->M * OS, pg.N, p->M, OS, sizeof(float), false, add);
    }
    return true;
}

bool winograd_forward(const conv_call *c)
{
    return c->dtype == AI_F32 &&
           winograd_nchw(c->p, c->y, c->x, c->w, false, c->b, false, c->ws, c->ep);
}

bool winograd_input_grad(conv_call *c)
{
    ai_conv_params q;
    if (c->dtype != AI_F32 || !direct_input_grad_params(c->p, &q) ||
        !winograd_nchw(&q, c->dx, c->dy, c->w, true, NULL, !c->assign_dx, c->ws, NULL))
        return false;
    c->dx = NULL;
    return true;
}

int64_t winograd_workspace(const ai_conv_params *p, ai_dtype dtype)
{
    ai_conv_params q;
    if (dtype != AI_F32)
        return 0;
    const int64_t f = winograd_nchw_elems(p);
    const int64_t dx = direct_input_grad_params(p, &q) ? winograd_nchw_elems(&q) : 0;
    return f > dx ? f : dx;
}
