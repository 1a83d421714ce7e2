/*
 * conv_winograd_impl.h — the Winograd conv's products and output transform
 * (winograd_tiles; conv_winograd.c describes the kernel), written once for a
 * vector width. conv_winograd.c includes it once per width after defining
 *   WINO_V, WINO_VL, WINO_SFX, WINO_ATTR   the vector, its lanes, the name
 *               suffix, the functions' attributes (target, contraction),
 *   WINO_SHAPES(TILE)   the tiles by vectors left (nv): TILE(NV, PX) calls,
 *   WINO_NO_CONTRACT(v), WINO_LOAD_BLOCKS(src, ld), WINO_STORE_BLOCKS(dst, ld, t):
 *               as conv_blocked.c's BLOCKED_ ones;
 * this file undefines them. Each lane sums its terms in the same order at
 * any width (FMAs in the products, adds alone in the transform): the
 * widths' results are the same bit for bit. Not a public header.
 */
#define WINO_CAT_(a, b) a##b
#define WINO_CAT(a, b) WINO_CAT_(a, b)
#define WINO_FN(name) WINO_CAT(name, WINO_SFX)

/* Tile t's 2 x 2 outputs of the WINO_VL channels from ch on: Y = A^T m A
 * (m: its 16 products, WINOGRAD_MB floats apart), then the bias, the
 * epilogue and the residual as the blocked tiles apply them, stored into
 * blocked y where inside the output plane. */
static inline __attribute__((always_inline)) void WINO_FN(winograd_output)(
    const winograd_geom *q, const float *m, int64_t t, int64_t ch, const float *bias,
    const float *ea, const float *ec, bool ab, bool relu, float *yb, const float *rb, int64_t OS)
{
    WINO_V s[2][4];
    for (int b = 0; b < 4; b++) {
        const WINO_V m0 = *(const WINO_V *)(m + b * WINOGRAD_MB),
                     m1 = *(const WINO_V *)(m + (4 + b) * WINOGRAD_MB),
                     m2 = *(const WINO_V *)(m + (8 + b) * WINOGRAD_MB),
                     m3 = *(const WINO_V *)(m + (12 + b) * WINOGRAD_MB);
        s[0][b] = m0 + m1 + m2;
        s[1][b] = m1 - m2 - m3;
    }
    const int64_t r0 = t / q->TW * 2, c0 = t % q->TW * 2;
    const WINO_V bv = *(const WINO_V *)(bias + ch), av = *(const WINO_V *)(ea + ch),
                 cv = *(const WINO_V *)(ec + ch);
    for (int a = 0; a < 2 && r0 + a < q->Ho; a++)
        for (int b = 0; b < 2 && c0 + b < q->Wo; b++) {
            WINO_V y = b == 0 ? s[a][0] + s[a][1] + s[a][2] : s[a][1] - s[a][2] - s[a][3];
            y += bv;
            VEC_EPILOGUE_NC(y, ab, av, cv, relu && !rb, WINO_NO_CONTRACT);
            const int64_t at = (ch / 8 * OS + (r0 + a) * q->Wo + c0 + b) * 8;
            if (rb) {
                y += WINO_LOAD_BLOCKS(rb + at, OS * 8);
                VEC_EPILOGUE_NC(y, false, av, cv, relu, WINO_NO_CONTRACT);
            }
            WINO_STORE_BLOCKS(yb + at, OS * 8, y);
        }
}

/* Tiles [0, nt) of a job (their transformed inputs in vt) for all output
 * channels: per block of WINO_MB channels and group of PX tiles, the 16
 * products (acc[PX][NV] over the C input channels) into mb, then each tile's
 * 2 x 2 outputs (A^T m A, the bias, the epilogue, the residual) into the
 * image's blocked y yb. */
WINO_ATTR static void WINO_FN(winograd_tiles)(const winograd_job *j, const float *vt, float *mb,
                                              int64_t t0, int64_t nt, float *yb)
{
    const winograd_geom *q = j->q;
    const int64_t C = q->C, C8 = q->C8, M8 = q->M8, OS = q->Ho * q->Wo;
    const float *bias = j->bias, *ea = bias + M8, *ec = ea + M8;
    const bool ab = j->ep && j->ep->ab, relu = j->ep && j->ep->relu;
    const float *rb = j->r ? j->r + (yb - j->y) : NULL; /* the image's residual */
#define WINO_TILE(NV, PX)                                                             \
    for (int64_t i0 = 0; i0 < nt; i0 += (PX)) {                                       \
        for (int e = 0; e < 16; e++) {                                                \
            WINO_V acc[PX][NV];                                                       \
            for (int i = 0; i < (PX); i++)                                            \
                for (int v = 0; v < (NV); v++)                                        \
                    acc[i][v] = (WINO_V){0};                                          \
            const float *uk = ue + e * C * bw;                                        \
            for (int64_t c0 = 0; c0 < C; c0 += 8) {                                   \
                const float *vk = vt + ((e * C8 + c0) * WINOGRAD_ROWS + i0 * 8);      \
                const float *ve = vk + (C - c0 < 8 ? C - c0 : 8);                     \
                for (; vk < ve; vk++, uk += bw) {                                     \
                    WINO_V wv[NV];                                                    \
                    for (int v = 0; v < (NV); v++)                                    \
                        wv[v] = *(const WINO_V *)(uk + WINO_VL * v);                  \
                    for (int i = 0; i < (PX); i++) {                                  \
                        const float a = vk[8 * i];                                    \
                        for (int v = 0; v < (NV); v++)                                \
                            acc[i][v] += a * wv[v];                                   \
                    }                                                                 \
                }                                                                     \
            }                                                                         \
            for (int i = 0; i < (PX); i++)                                            \
                for (int v = 0; v < (NV); v++)                                        \
                    *(WINO_V *)(mb + (i * 16 + e) * WINOGRAD_MB + WINO_VL * v) = acc[i][v]; \
        }                                                                             \
        for (int i = 0; i < (PX) && i0 + i < nt; i++)                                 \
            for (int v = 0; v < (NV); v++)                                            \
                WINO_FN(winograd_output)(q, mb + i * 16 * WINOGRAD_MB + WINO_VL * v,  \
                                         t0 + i0 + i, m0 + WINO_VL * v, bias, ea, ec, \
                                         ab, relu, yb, rb, OS);                       \
    }
    for (int64_t m0 = 0; m0 < M8;) {
        const int64_t nv = (M8 - m0) / WINO_VL, bw = winograd_block_width(M8, m0);
        const float *ue = j->u + 16 * C * m0;
        WINO_SHAPES(WINO_TILE)
        m0 += bw;
    }
#undef WINO_TILE
}

#undef WINO_FN
#undef WINO_CAT
#undef WINO_CAT_
#undef WINO_V
#undef WINO_VL
#undef WINO_SFX
#undef WINO_ATTR
#undef WINO_SHAPES
#undef WINO_NO_CONTRACT
#undef WINO_LOAD_BLOCKS
#undef WINO_STORE_BLOCKS
