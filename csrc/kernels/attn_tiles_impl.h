/*
 * attn_tiles_impl.h — attn_tiles.c's tiles for one vector width, included
 * with AT_W (lanes), AT_VEC (the vector type), AT_MR (rows of a tile),
 * AT_NV (vectors of a tile's row), AT_TGT (target attribute) and SFX(name).
 */

/* Rows i0 .. i0 + mr of C, vectors 0 .. nv of the tile's columns: MR x NV
 * accumulators in registers; per k, nv loads of B's row and a broadcast of
 * a(i, k) per row. */
static inline __attribute__((always_inline)) AT_TGT void SFX(at_tile)(
    const int mr, const int nv, int64_t K, float alpha, const float *A, int64_t rsa, int64_t csa,
    const float *B, int64_t ldb, bool acc, float *C, int64_t ldc)
{
    AT_VEC c[AT_MR][AT_NV];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++)
            c[i][v] = (AT_VEC){0};
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * ldb, *a = A + k * csa;
        AT_VEC bv[AT_NV];
        for (int v = 0; v < nv; v++)
            bv[v] = *(const AT_VEC *)(b + v * AT_W);
        for (int i = 0; i < mr; i++) {
            const float ai = a[i * rsa];
            for (int v = 0; v < nv; v++)
                c[i][v] += ai * bv[v];
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) {
            AT_VEC *cp = (AT_VEC *)(C + i * ldc + v * AT_W);
            *cp = acc ? *cp + alpha * c[i][v] : alpha * c[i][v];
        }
}

AT_TGT static void SFX(at_mm)(int64_t m, int64_t N, int64_t K, float alpha, const float *A,
                              int64_t rsa, int64_t csa, const float *B, int64_t ldb, bool acc,
                              float *C, int64_t ldc)
{
    const int64_t nvec = N / AT_W;
    for (int64_t v0 = 0; v0 < nvec; v0 += AT_NV) {
        const int nv = nvec - v0 < AT_NV ? (int)(nvec - v0) : AT_NV;
        const float *b = B + v0 * AT_W;
        for (int64_t i0 = 0; i0 < m; i0 += AT_MR) {
            const int mr = m - i0 < AT_MR ? (int)(m - i0) : AT_MR;
            const float *a = A + i0 * rsa;
            float *c = C + i0 * ldc + v0 * AT_W;
#define AT_CASE(R, V) \
    case (R) * 8 + (V): \
        SFX(at_tile)(R, V, K, alpha, a, rsa, csa, b, ldb, acc, c, ldc); \
        break;
            switch (mr * 8 + nv) {
                AT_CASES
            }
#undef AT_CASE
        }
    }
}

/* 8 x 8 blocks through ai_transpose8_f32, the rows' tail one by one */
AT_TGT static void SFX(at_transpose)(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                     float *dst, int64_t ldd)
{
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8)
        for (int64_t c = 0; c < cols; c += 8) {
            ai_vec8_f32 t[8];
            for (int i = 0; i < 8; i++)
                t[i] = *(const ai_vec8_f32 *)(src + (r + i) * lds + c);
            ai_transpose8_f32(t);
            for (int i = 0; i < 8; i++)
                *(ai_vec8_f32 *)(dst + (c + i) * ldd + r) = t[i];
        }
    for (int64_t c = 0; c < cols; c++) {
        float *d = dst + c * ldd;
        for (int64_t i = r; i < rows; i++)
            d[i] = src[i * lds + c];
        for (int64_t i = rows; i < ldd; i++)
            d[i] = 0;
    }
}
