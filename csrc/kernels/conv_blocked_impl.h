/*
 * conv_blocked_impl.h — the channels-last direct conv's register tiles (blocked_tiles,
 * blocked_patch_tiles, blocked_pointwise_tiles; conv_blocked.c describes the kernel),
 * written once for a vector width.
 * conv_blocked.c includes it once per width after defining
 *   BLOCKED_V       the vector of floats (BLOCKED_VL lanes: 8, or 16 with AVX-512),
 *   BLOCKED_VL      its lanes,
 *   BLOCKED_SFX     the functions' name suffix,
 *   BLOCKED_ATTR    their attributes (target, contraction),
 *   BLOCKED_SHAPES(TILE)  the tiles by vectors left (nv): TILE(NV, PX) calls,
 *   BLOCKED_POINTWISE_SHAPES(TILE) (optional) the pointwise tiles; BLOCKED_SHAPES by default,
 *   BLOCKED_PATCH_PX, BLOCKED_PATCH_SHAPES(TILE)  the patch tiles' positions and, by
 *               vectors left (nv), their TILE(NV, BLOCKED_PATCH_PX) calls,
 *   BLOCKED_NO_CONTRACT(v)  v as computed, not fused into an FMA with what follows,
 *   BLOCKED_LOAD_BLOCKS(src, ld), BLOCKED_STORE_BLOCKS(dst, ld, t): a vector from
 *               or to consecutive 8-lane blocks of blocked data, ld apart;
 * this file undefines them. Each lane of a tile's accumulators sums its
 * taps in the same order at any width (FMAs in both): the widths' results
 * are the same bit for bit. Not a public header.
 */
#define BLOCKED_CAT_(a, b) a##b
#define BLOCKED_CAT(a, b) BLOCKED_CAT_(a, b)
#define BLOCKED_FN(name) BLOCKED_CAT(name, BLOCKED_SFX)

/* A tile's accumulators acc[PX][NV] (positions by vectors of channels m0
 * on) set to the bias */
#define BLOCKED_ACC_BIAS(NV, PX)                                               \
    for (int v = 0; v < (NV); v++) {                                           \
        const BLOCKED_V bv = *(const BLOCKED_V *)(bias + m0 + BLOCKED_VL * v); \
        for (int i = 0; i < (PX); i++)                                         \
            acc[i][v] = bv;                                                    \
    }
/* The accumulators into a blocked y, the first `valid` positions, with the epilogue:
 * yb is the image's output, p the tile's first position; with rb (the
 * image's residual, blocked like y) the residual is added after the
 * affine, before the Relu (as a separate Add and Relu would round). */
#define BLOCKED_STORE_BLOCKED(NV, PX, valid, p)                               \
    for (int v = 0; v < (NV); v++) {                                          \
        const BLOCKED_V av = *(const BLOCKED_V *)(ea + m0 + BLOCKED_VL * v);  \
        const BLOCKED_V cv = *(const BLOCKED_V *)(ec + m0 + BLOCKED_VL * v);  \
        const int64_t at = (((m0 + BLOCKED_VL * v) / 8) * OS + (p)) * 8;      \
        float *dst = yb + at;                                                 \
        for (int i = 0; i < (PX) && i < (valid); i++) {                       \
            BLOCKED_V t = acc[i][v];                                          \
            VEC_EPILOGUE_NC(t, ab, av, cv, relu && !rb, BLOCKED_NO_CONTRACT); \
            if (rb) {                                                         \
                t += BLOCKED_LOAD_BLOCKS(rb + at + 8 * i, OS * 8);            \
                VEC_EPILOGUE_NC(t, false, av, cv, relu, BLOCKED_NO_CONTRACT); \
            }                                                                 \
            BLOCKED_STORE_BLOCKS(dst + 8 * i, OS * 8, t);                     \
        }                                                                     \
    }

/* Positions [p0, p0 + np) of image n: the tiles into yt (np rows of M8),
 * or with yb (blocked y: the image's output, OS positions per block) into
 * it with the epilogue. */
BLOCKED_ATTR static void BLOCKED_FN(blocked_tiles)(const blocked_job *j, const float *xn,
                                                   int64_t p0, int64_t np, float *yt, float *yb)
{
    const blocked_geom *q = j->q;
    const int64_t K = q->K, M8 = q->M8, OS = j->OS;
    const float *bias = j->bias, *ea = bias + M8, *ec = ea + M8;
    const bool ab = j->ep && j->ep->ab, relu = j->ep && j->ep->relu;
    const float *rb = j->r && yb ? j->r + (yb - j->y) : NULL; /* the image's residual */
    int64_t base[BLOCKED_CHUNK + BLOCKED_PX_MAX];
    blocked_bases(q, p0, np, base);
    const int64_t cstep = q->s2 * q->xl; /* a column's step */
/* Taps [KLO, KHI) of a tile, position i's input at x + IDX(i) (IDX a table
 * lookup, or a constant step: no index registers, no spills) */
#define BLOCKED_TAPS_RANGE(NV, PX, X0, IDX, KLO, KHI)              \
    {                                                              \
        const float *wk = j->wp + m0 * K + (KLO) * bw;             \
        for (int64_t k = (KLO); k < (KHI); k++, wk += bw) {        \
            const float *xk = (X0) + q->off[k];                    \
            BLOCKED_V wv[NV];                                      \
            for (int v = 0; v < (NV); v++)                         \
                wv[v] = *(const BLOCKED_V *)(wk + BLOCKED_VL * v); \
            for (int i = 0; i < (PX); i++) {                       \
                const float a = xk[IDX(i)];                        \
                for (int v = 0; v < (NV); v++)                     \
                    acc[i][v] += a * wv[v];                        \
            }                                                      \
        }                                                          \
    }
#define BLOCKED_TAPS(NV, PX, X0, IDX) BLOCKED_TAPS_RANGE(NV, PX, X0, IDX, 0, K)
/* The same over kernel rows [k1lo, k1hi) of each input channel alone: the
 * taps of the other rows read the padded copy's zero rows for every
 * position of the tile. Each sum keeps its order, less terms that are +0
 * (a tile of a 3x3 conv on the first or last output row: a third of the
 * FMAs; 8x8 planes: 8% of all). */
#define BLOCKED_TAPS_ROWS(NV, PX, X0, IDX)                                            \
    {                                                                                 \
        for (int64_t kc = 0; kc < K; kc += q->kh * q->kw)                             \
            BLOCKED_TAPS_RANGE(NV, PX, X0, IDX, kc + k1lo * q->kw, kc + k1hi * q->kw) \
    }
/* TAPS with the constant step of a tile inside one output row, else the table */
#define BLOCKED_DISPATCH(TAPS, NV, PX)       \
    {                                        \
        if (row && cstep == 1)               \
            TAPS(NV, PX, x0, BLOCKED_STEP1)  \
        else if (row && cstep == 2)          \
            TAPS(NV, PX, x0, BLOCKED_STEP2)  \
        else if (row && cstep == 8)          \
            TAPS(NV, PX, x0, BLOCKED_STEP8)  \
        else if (row && cstep == 16)         \
            TAPS(NV, PX, x0, BLOCKED_STEP16) \
        else                                 \
            TAPS(NV, PX, xn, BLOCKED_TABLE)  \
    }
#define BLOCKED_TABLE(i) base[i0 + (i)]
#define BLOCKED_STEP1(i) (i)
#define BLOCKED_STEP2(i) ((i) * 2)
#define BLOCKED_STEP8(i) ((i) * 8)
#define BLOCKED_STEP16(i) ((i) * 16)
#define BLOCKED_TILE(NV, PX)                                                                      \
    for (int64_t i0 = 0; i0 < np; i0 += (PX)) {                                                   \
        BLOCKED_V acc[PX][NV];                                                                    \
        BLOCKED_ACC_BIAS(NV, PX)                                                                  \
        /* a whole tile inside one output row: its positions a column step                        \
         * apart, constant displacements when the step is a common one */                         \
        const bool row = i0 + (PX) <= np && base[i0 + (PX) - 1] - base[i0] == cstep * ((PX) - 1); \
        const float *x0 = xn + base[i0];                                                          \
        /* the kernel rows that read inside the image for some position: from                     \
         * the tile's last output row (the lowest first one) to its first */                      \
        int64_t k1lo = 0, k1hi = q->kh;                                                           \
        if (q->padded) {                                                                          \
            const int64_t oa = (p0 + i0) / q->G2;                                                 \
            const int64_t ob = (p0 + (i0 + (PX) <= np ? i0 + (PX) : np) - 1) / q->G2;             \
            while (k1lo < k1hi && ob * q->s1 + k1lo * q->d1 < q->pb1)                             \
                k1lo++;                                                                           \
            while (k1hi > k1lo && oa * q->s1 + (k1hi - 1) * q->d1 - q->pb1 >= q->H)               \
                k1hi--;                                                                           \
        }                                                                                         \
        if (k1lo > 0 || k1hi < q->kh)                                                             \
            BLOCKED_DISPATCH(BLOCKED_TAPS_ROWS, NV, PX)                                           \
        else                                                                                      \
            BLOCKED_DISPATCH(BLOCKED_TAPS, NV, PX)                                                \
        if (yb) { /* each vector of channels into its block, the epilogue first */                \
            BLOCKED_STORE_BLOCKED(NV, PX, np - i0, p0 + i0)                                       \
            continue;                                                                             \
        }                                                                                         \
        for (int i = 0; i < (PX); i++)                                                            \
            for (int v = 0; v < (NV); v++)                                                        \
                *(BLOCKED_V *)(yt + (i0 + i) * M8 + m0 + BLOCKED_VL * v) = acc[i][v];             \
    }
    for (int64_t m0 = 0; m0 < M8;) {
        const int64_t nv = (M8 - m0) / BLOCKED_VL, bw = blocked_block_width(M8, m0);
        BLOCKED_SHAPES(BLOCKED_TILE)
        m0 += bw;
    }
#undef BLOCKED_TILE
#undef BLOCKED_TAPS
#undef BLOCKED_TAPS_RANGE
#undef BLOCKED_TAPS_ROWS
#undef BLOCKED_DISPATCH
#undef BLOCKED_TABLE
#undef BLOCKED_STEP1
#undef BLOCKED_STEP2
#undef BLOCKED_STEP8
#undef BLOCKED_STEP16
}

/* The patch tiles (blocked_geom.patch: x not blocked, y blocked, at most
 * BLOCKED_PATCH_MAX_TAPS taps: a network's first conv): tiles of
 * BLOCKED_PATCH_PX positions by NV vectors of channels across the blocks
 * of the packed weights (4 vectors, 64 channels per broadcast at 16 lanes,
 * where blocked_tiles stops at one 32-channel block), each position's
 * input offset held for the whole tile, the kernel rows that read only
 * the padding skipped as blocked_tiles skips them: each lane sums the
 * same taps in the same order from the bias, bit for bit blocked_tiles'
 * sums. */
#define BLOCKED_PATCH_TILE(NV, PX)                                                   \
    {                                                                                \
        BLOCKED_V acc[PX][NV];                                                       \
        BLOCKED_ACC_BIAS(NV, PX)                                                     \
        const float *w0[NV]; /* vector v's weights at tap 0: its block's, its lane */ \
        int64_t wstep[NV];                                                           \
        for (int v = 0; v < (NV); v++) {                                             \
            const int64_t c = m0 + BLOCKED_VL * v, b0 = c / BLOCKED_MB * BLOCKED_MB; \
            w0[v] = j->wp + b0 * K + (c - b0);                                       \
            wstep[v] = blocked_block_width(M8, b0);                                  \
        }                                                                            \
        for (int64_t kc = 0; kc < K; kc += khw)                                      \
            for (int64_t k = kc + k1lo * q->kw; k < kc + k1hi * q->kw; k++) {        \
                const float *xk = xn + q->off[k];                                    \
                BLOCKED_V wv[NV];                                                    \
                for (int v = 0; v < (NV); v++)                                       \
                    wv[v] = *(const BLOCKED_V *)(w0[v] + k * wstep[v]);              \
                for (int i = 0; i < (PX); i++) {                                     \
                    const float a = xk[b[i]];                                        \
                    for (int v = 0; v < (NV); v++)                                   \
                        acc[i][v] += a * wv[v];                                      \
                }                                                                    \
            }                                                                        \
        BLOCKED_STORE_BLOCKED(NV, PX, np - i0, p0 + i0)                              \
        m0 += (NV) * BLOCKED_VL;                                                     \
    }
BLOCKED_ATTR static void BLOCKED_FN(blocked_patch_tiles)(const blocked_job *j, const float *xn,
                                                         int64_t p0, int64_t np, float *yb)
{
    enum { PX = BLOCKED_PATCH_PX };
    const blocked_geom *q = j->q;
    const int64_t K = q->K, M8 = q->M8, OS = j->OS, khw = q->kh * q->kw;
    const float *bias = j->bias, *ea = bias + M8, *ec = ea + M8;
    const bool ab = j->ep && j->ep->ab, relu = j->ep && j->ep->relu;
    const float *rb = j->r ? j->r + (yb - j->y) : NULL; /* the image's residual */
    int64_t base[BLOCKED_CHUNK + BLOCKED_PX_MAX];
    blocked_bases(q, p0, np, base);
    for (int64_t i0 = 0; i0 < np; i0 += PX) {
        int64_t b[PX]; /* the tile's positions (past np: the last again, not stored) */
        for (int i = 0; i < PX; i++)
            b[i] = base[i0 + i];
        /* the kernel rows that read inside the image for some position (as
         * in blocked_tiles) */
        int64_t k1lo = 0, k1hi = q->kh;
        if (q->padded) {
            const int64_t oa = (p0 + i0) / q->G2;
            const int64_t ob = (p0 + (i0 + PX <= np ? i0 + PX : np) - 1) / q->G2;
            while (k1lo < k1hi && ob * q->s1 + k1lo * q->d1 < q->pb1)
                k1lo++;
            while (k1hi > k1lo && oa * q->s1 + (k1hi - 1) * q->d1 - q->pb1 >= q->H)
                k1hi--;
        }
        for (int64_t m0 = 0; m0 < M8;) {
            const int64_t nv = (M8 - m0) / BLOCKED_VL;
            BLOCKED_PATCH_SHAPES(BLOCKED_PATCH_TILE)
        }
    }
}
#undef BLOCKED_PATCH_TILE

/* The same for a pointwise conv on blocked x (blocked_pointwise): the input channels
 * block by block, each tile position's value read at a fixed displacement
 * (positions are 8 floats apart): no tap table, no position table.
 * Positions past the last whole tile go one at a time. (Unrolling the 8
 * lanes of a block made GCC spill accumulators: slower.) */
#define BLOCKED_POINTWISE_TILE(NV, PX)                                  \
    for (; i0 + (PX) <= np; i0 += (PX)) {                               \
        BLOCKED_V acc[PX][NV];                                          \
        BLOCKED_ACC_BIAS(NV, PX)                                        \
        const float *xp = xn + (p0 + i0) * 8, *wk = j->wp + m0 * q->K;  \
        for (int64_t c0 = 0; c0 < C; c0 += 8, xp += plane) {            \
            const float *xl = xp, *xe = xp + (C - c0 < 8 ? C - c0 : 8); \
            for (; xl < xe; xl++, wk += bw) {                           \
                BLOCKED_V wv[NV];                                       \
                for (int v = 0; v < (NV); v++)                          \
                    wv[v] = *(const BLOCKED_V *)(wk + BLOCKED_VL * v);  \
                for (int i = 0; i < (PX); i++) {                        \
                    const float a = xl[8 * i];                          \
                    for (int v = 0; v < (NV); v++)                      \
                        acc[i][v] += a * wv[v];                         \
                }                                                       \
            }                                                           \
        }                                                               \
        BLOCKED_STORE_BLOCKED(NV, PX, PX, p0 + i0)                      \
    }

/* One image's tiles for channels m0 on (nv vectors of them): the widest
 * tile, then one position at a time. */
#define BLOCKED_POINTWISE_TILE_REST(NV, PX) \
    BLOCKED_POINTWISE_TILE(NV, PX)          \
    BLOCKED_POINTWISE_TILE(NV, 1)
#ifndef BLOCKED_POINTWISE_SHAPES
#define BLOCKED_POINTWISE_SHAPES BLOCKED_SHAPES
#endif
#define BLOCKED_POINTWISE_IMAGE() BLOCKED_POINTWISE_SHAPES(BLOCKED_POINTWISE_TILE_REST)

BLOCKED_ATTR static void BLOCKED_FN(blocked_pointwise_tiles)(const blocked_job *j, const float *x0,
                                                             float *y0, int64_t images, int64_t p0,
                                                             int64_t np)
{
    const blocked_geom *q = j->q;
    const int64_t C = j->p->C, M8 = q->M8, OS = j->OS, plane = OS * 8;
    const int64_t xstride = q->xc * OS, ystride = M8 * OS; /* an image */
    const float *bias = j->bias, *ea = bias + M8, *ec = ea + M8;
    const bool ep_ab = j->ep && j->ep->ab, ep_relu = j->ep && j->ep->relu;
    for (int64_t m0 = 0; m0 < M8;) {
        const int64_t nv = (M8 - m0) / BLOCKED_VL, bw = blocked_block_width(M8, m0);
        for (int64_t n = 0; n < images; n++) {
            const float *xn = x0 + n * xstride;
            float *yb = y0 + n * ystride;
            const float *rimg = j->r ? j->r + (yb - j->y) : NULL; /* the image's residual */
            int64_t i0 = 0;
            /* the epilogue's flags as constants in the common cases: with
             * them in variables, GCC keeps the accumulators on the stack and
             * tests each flag at each vector, which costs more than the FMAs
             * of a conv with few terms per output (8 -> 16). In
             * blocked_tiles the constants did not pay, so its flags stay in
             * variables (benchmarks/results/fused-inference.md). */
            if (!rimg && ep_ab && ep_relu) {
                const bool ab = true, relu = true;
                const float *const rb = NULL;
                BLOCKED_POINTWISE_IMAGE()
            } else if (!rimg && ep_ab) {
                const bool ab = true, relu = false;
                const float *const rb = NULL;
                BLOCKED_POINTWISE_IMAGE()
            } else {
                const bool ab = ep_ab, relu = ep_relu;
                const float *const rb = rimg;
                BLOCKED_POINTWISE_IMAGE()
            }
        }
        m0 += bw;
    }
}
#undef BLOCKED_POINTWISE_IMAGE
#undef BLOCKED_POINTWISE_TILE_REST
#undef BLOCKED_POINTWISE_TILE

#undef BLOCKED_ACC_BIAS
#undef BLOCKED_STORE_BLOCKED
#undef BLOCKED_FN
#undef BLOCKED_CAT
#undef BLOCKED_CAT_
#undef BLOCKED_V
#undef BLOCKED_VL
#undef BLOCKED_SFX
#undef BLOCKED_ATTR
#undef BLOCKED_SHAPES
#undef BLOCKED_PATCH_SHAPES
#undef BLOCKED_PATCH_PX
#undef BLOCKED_POINTWISE_SHAPES
#undef BLOCKED_LOAD_BLOCKS
#undef BLOCKED_NO_CONTRACT
#undef BLOCKED_STORE_BLOCKS
