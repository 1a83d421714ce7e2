/*
 * skinny_impl.h — gemm.c's skinny float32 kernel (its comment describes it),
 * written once for a vector width. gemm.c includes it after defining
 *   SK_FN    the function's name,   SK_ATTR  its attributes,
 *   SK_V     the vector of floats,  SK_VL    its lanes (16 / SK_VL vectors
 *            hold a column of the copy of A),
 *   SK_TNR   the tile's columns;
 * this file undefines them. Each element of C sums its terms in the same
 * order at any width (FMAs in the vector clones): the same values. Not a
 * public header.
 */
#define SK_NV (SK_MR / SK_VL)
/* column k of the copy of A times row k of the panel of B, into the tile's
 * first `cols` columns */
#define SK_STEP(cols)                                                              \
    {                                                                              \
        SK_V a[SK_NV];                                                             \
        for (int v = 0; v < SK_NV; v++)                                            \
            a[v] = *(const SK_V *)(at + k * SK_MR + v * SK_VL);                    \
        for (int r = 0; r < (cols); r++) {                                         \
            const float b = bp[k * bk + r * bn];                                   \
            for (int v = 0; v < SK_NV; v++)                                        \
                acc[r][v] += b * a[v];                                             \
        }                                                                          \
    }

SK_ATTR static void SK_FN(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                                     int64_t ldb, float beta, float *C, int64_t ldc)
{
    _Alignas(64) float at[SK_KC * SK_MR];
    const int64_t ak = ta ? lda : 1; /* op(A)[m, k] = A[m am + k ak], am = ta ? 1 : lda */
    const int64_t bk = tb ? 1 : ldb, bn = tb ? ldb : 1; /* op(B)[k, n] = B[k bk + n bn] */
    for (int64_t k0 = 0; k0 < K; k0 += SK_KC) {
        const int64_t kc = K - k0 < SK_KC ? K - k0 : SK_KC;
        const float cb = k0 ? 1.0f : beta; /* what C is scaled by before adding */
        sk_copy_a(at, ta, M, kc, alpha, A + k0 * ak, lda);
        for (int64_t n0 = 0; n0 < N; n0 += SK_TNR) {
            const int nr = N - n0 < SK_TNR ? (int)(N - n0) : SK_TNR;
            const float *bp = B + k0 * bk + n0 * bn;
            SK_V acc[SK_TNR][SK_NV];
            for (int r = 0; r < SK_TNR; r++)
                for (int v = 0; v < SK_NV; v++)
                    acc[r][v] = (SK_V){0};
            /* Software prefetch, a cache line of B per row or column every 16
             * k. B^T: its panel is SK_TNR short rows, too short for the
             * hardware prefetcher to ramp up on (weights not in cache ran from
             * L3 at its latency): the next panel's rows are fetched a panel
             * ahead (Anomaly's eval forward 0.63 -> 0.47 ms, batch 16). B:
             * the rows 16 k ahead in this panel (training, 2%). */
            const bool ahead = tb && n0 + 2 * SK_TNR <= N;
            if (nr == SK_TNR)
                for (int64_t k1 = 0; k1 < kc; k1 += 16) {
                    if (ahead)
                        for (int r = 0; r < SK_TNR; r++)
                            __builtin_prefetch(bp + (SK_TNR + r) * bn + k1);
                    else if (!tb)
                        for (int64_t k = k1 + 16; k < k1 + 32 && k < K - k0; k++)
                            __builtin_prefetch(bp + k * bk);
                    for (int64_t k = k1; k < kc && k < k1 + 16; k++)
                        SK_STEP(SK_TNR)
                }
            else
                for (int64_t k = 0; k < kc; k++)
                    SK_STEP(nr)
#if SK_TNR == 8 && SK_VL == 16 && defined(AI_HAVE_TRANSPOSE8)
            /* a whole tile: its 8 columns of 16 rows transposed in two 8 x 8
             * blocks, each row's 8 values one store (the same values as
             * the element loop below) */
            if (nr == 8) {
                for (int64_t m0 = 0; m0 < M; m0 += 8) {
                    ai_vec8_f32 t[8];
                    for (int r = 0; r < 8; r++)
                        memcpy(&t[r], (const float *)&acc[r][0] + m0, sizeof t[r]);
                    ai_transpose8_f32(t);
                    for (int64_t i = 0; i < 8 && m0 + i < M; i++) {
                        float *c = C + (m0 + i) * ldc + n0;
                        ai_vec8_f32 v = t[i];
                        if (cb != 0) {
                            ai_vec8_f32 old;
                            memcpy(&old, c, sizeof old);
                            v = v + cb * old;
                        }
                        memcpy(c, &v, sizeof v);
                    }
                }
                continue;
            }
#endif
            for (int r = 0; r < nr; r++) {
                float t[SK_MR];
                memcpy(t, acc[r], sizeof t);
                for (int64_t m = 0; m < M; m++) {
                    float *c = C + m * ldc + n0 + r;
                    *c = cb == 0 ? t[m] : t[m] + cb * *c; /* beta 0: C not read */
                }
            }
        }
    }
}
#undef SK_STEP
#undef SK_NV
#undef SK_FN
#undef SK_ATTR
#undef SK_V
#undef SK_VL
#undef SK_TNR
