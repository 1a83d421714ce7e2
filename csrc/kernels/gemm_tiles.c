/*
 * gemm_tiles.c — gemm.c's float32 products on AVX-512 CPUs at the sizes of
 * a transformer's Linear layers (M, N, K >= 128: ai_gemm_tiles_take, which
 * gemm.c asks once for the whole product): op(A) = A, the forward x W^T
 * and the input gradient dY W; and op(A) = A^T with B as it is and N >=
 * 2 M, the weight gradient dY^T X of a layer at least twice as wide in as
 * out (a transformer's second MLP layer).
 *
 * A register tile of TL_MR = 6 rows by TL_NR = 64 columns of C (24 of the
 * 32 vector registers): per k, four vectors of the packed B and a
 * broadcast of A per row, 24 FMAs (6 x 64 and 8 x 32 ran best of the
 * tiles of 6 to 14 rows by 32 to 64 columns a prototype tried). A not
 * transposed is read in place (rows of a row-major matrix); A^T is packed
 * per K chunk into panels of 6 rows, a row of 6 floats per k (6 contiguous
 * floats of A: copies). B, which OpenBLAS packs at every call too, is
 * packed here per block of TL_NC columns (TL_NC_AT with A^T) by the K
 * chunk, TL_NR-wide panels a row of 64 floats per k (B^T, torch's Linear
 * weight: 16 x 16 transposes in registers), zero past N. K runs in chunks
 * of at most TL_KC, all of the same length but the last (ceil(K /
 * chunks)): a block of B (<= 640 KB) stays in the 1 MB L2 while the tiles
 * of A's rows go by.
 *
 * Each element of C is the sum, chunk after chunk, of its chunk's terms in
 * k order, by FMAs: the same sum whatever part of C a call computes, so
 * the engine's split of a product between threads (gemm.c) does not
 * change a bit. alpha scales each chunk's sum as it is added to C.
 *
 * Measured against OpenBLAS (SkylakeX kernels) on an AMD EPYC (Zen 4),
 * one thread, thread CPU time, at the Linear shapes of benchmarks/run.py's
 * transformers (M 512-1024 rows, K and N 256-1536): x W^T at 1.00-1.11 of
 * its speed (B^T packed through the transposes; 0.98-1.06 when they were
 * a loop over stages), dY W at 1.05-1.10. dY^T X (580 or 1024 rows, a
 * shared machine, benchmarks/results/kernels-gemm.md): 0.91-0.98 of
 * OpenBLAS's time where N = 4 M (384 x 1536, 256 x 1024), 0.96-1.10 where
 * N = M (the attention projections), 0.97-1.04 where M > N (fc1's 1536 x
 * 384: A's packed panels, M x kc, come back from L3 for each block of B):
 * those stay with the library, as does A^T B^T (1.02-1.22). MLAS (ONNX
 * Runtime) packs a constant weight once per session; this packs at every
 * call, and the engine's packed weights (packed.c) hold B packed ahead,
 * whole (ai_gemm_tiles_pack), for ai_gemm_tiles_packed_f32.
 */
#include "gemm.h"

#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define TL_MR AI_GEMM_TILE_ROWS /* 6 */
#define TL_NV (AI_GEMM_TILE_COLS / 16) /* vectors of 16 per row of the tile: 4 */
#define TL_NR (16 * TL_NV)
#define TL_KC 640
#define TL_NC 256
/* with op(A) = A^T: BERT's 256 x 256 x 1024 weight gradient took 1.21-1.27
 * of OpenBLAS's time with blocks of 256 columns, 0.96-0.98 with 128 */
#define TL_NC_AT 128

bool ai_gemm_tiles_take(bool ta, bool tb, int64_t M, int64_t N, int64_t K)
{
#ifdef AI_AVX512_KERNEL
    return (!ta || (!tb && N >= 2 * M)) && M >= 128 && N >= 128 && K >= 128 && ai_cpu_avx512();
#else
    (void)ta, (void)tb, (void)M, (void)N, (void)K;
    return false;
#endif
}

#ifdef AI_AVX512_KERNEL
typedef int32_t tl_idx16 __attribute__((vector_size(64)));

/* r[i] becomes column i of the 16 x 16 block whose rows are r[] (exact):
 * stage d pairs rows d apart, exchanging blocks of d lanes (written out
 * stage by stage: as a loop over the stages GCC kept the rows in memory,
 * and B^T products ran 3-7% slower) */
AI_AVX512_KERNEL static inline __attribute__((always_inline)) void tl_transpose16(
    ai_vec16_f32 r[16])
{
    const tl_idx16 lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const tl_idx16 hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    const tl_idx16 lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const tl_idx16 hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const tl_idx16 lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const tl_idx16 hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const tl_idx16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const tl_idx16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    ai_vec16_f32 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], lo1);
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi1);
    }
    for (int i = 0; i < 16; i += 4)
        for (int h = 0; h < 2; h++) {
            r[i + h] = __builtin_shuffle(t[i + h], t[i + h + 2], lo2);
            r[i + h + 2] = __builtin_shuffle(t[i + h], t[i + h + 2], hi2);
        }
    for (int i = 0; i < 16; i += 8)
        for (int h = 0; h < 4; h++) {
            t[i + h] = __builtin_shuffle(r[i + h], r[i + h + 4], lo4);
            t[i + h + 4] = __builtin_shuffle(r[i + h], r[i + h + 4], hi4);
        }
    for (int h = 0; h < 8; h++) {
        r[h] = __builtin_shuffle(t[h], t[h + 8], lo8);
        r[h + 8] = __builtin_shuffle(t[h], t[h + 8], hi8);
    }
}

/* Columns n0 .. n0 + nb of op(B), rows k0 .. k0 + kc, as panels of TL_NR:
 * bp[p kc TL_NR + k TL_NR + j] = op(B)[k0 + k, n0 + p TL_NR + j], 0 past nb */
AI_AVX512_KERNEL static void tl_pack_b(bool tb, int64_t n0, int64_t nb, int64_t k0, int64_t kc,
                                       const float *B, int64_t ldb, float *bp)
{
    for (int64_t p = 0; p * TL_NR < nb; p++) {
        float *dst = bp + p * kc * TL_NR;
        const int64_t nc = nb - p * TL_NR < TL_NR ? nb - p * TL_NR : TL_NR;
        int64_t k = 0;
        if (!tb) { /* op(B)[k, n] = B[k ldb + n]: rows of 64 copied */
            const float *src = B + k0 * ldb + n0 + p * TL_NR;
            if (nc == TL_NR)
                for (; k < kc; k++)
                    for (int v = 0; v < TL_NV; v++)
                        *(ai_vec16_f32 *)(dst + k * TL_NR + 16 * v) =
                            *(const ai_vec16_f32 *)(src + k * ldb + 16 * v);
            for (; k < kc; k++)
                for (int j = 0; j < TL_NR; j++)
                    dst[k * TL_NR + j] = j < nc ? src[k * ldb + j] : 0.0f;
            continue;
        }
        /* op(B)[k, n] = B[n ldb + k]: 16 x 16 blocks transposed */
        const float *src = B + (n0 + p * TL_NR) * ldb + k0;
        if (nc == TL_NR)
            for (; k + 16 <= kc; k += 16)
                for (int v = 0; v < TL_NV; v++) {
                    ai_vec16_f32 r[16];
                    for (int j = 0; j < 16; j++)
                        r[j] = *(const ai_vec16_f32 *)(src + (16 * v + j) * ldb + k);
                    tl_transpose16(r);
                    for (int j = 0; j < 16; j++)
                        *(ai_vec16_f32 *)(dst + (k + j) * TL_NR + 16 * v) = r[j];
                }
        for (; k < kc; k++)
            for (int j = 0; j < TL_NR; j++)
                dst[k * TL_NR + j] = j < nc ? src[j * ldb + k] : 0.0f;
    }
}

typedef float tl_vec8 __attribute__((vector_size(32), aligned(sizeof(float)), may_alias));
#define TL_PACK_K 16

/* Rows 0 .. M of op(A) = A^T, columns k0 .. k0 + kc, as panels of TL_MR
 * rows: ap[p kc TL_MR + k TL_MR + i] = A[(k0 + k) lda + p TL_MR + i], 0 past
 * M; of these, columns kb0 .. kb1 of the chunk (a piece of the packing: the
 * whole chunk is 0 .. kc). Each k's TL_MR values are contiguous in A:
 * copied 8 at a time where the 2 past them are still in A's row, each
 * copy's last 2 overwritten by the next k's (never past kb1: another
 * thread may be writing the next piece). TL_PACK_K rows of A at a time
 * across all panels: panel by panel down the whole chunk, each k a line
 * (and a page) of its own, the copy of a 1536 x 580 chunk took 0.42-0.72
 * ms (6-10% of its product), 0.13-0.15 this way (8 rows: 0.14-0.43, 32:
 * 0.26-0.33; thread CPU time, A not in cache) */
AI_AVX512_KERNEL static void tl_pack_at(int64_t M, int64_t k0, int64_t kc, int64_t kb0,
                                        int64_t kb1, const float *A, int64_t lda, float *ap)
{
    for (int64_t kb = kb0; kb < kb1; kb += TL_PACK_K) {
        const int64_t ke = kb1 - kb < TL_PACK_K ? kb1 : kb + TL_PACK_K;
        for (int64_t p = 0; p * TL_MR < M; p++) {
            float *dst = ap + p * kc * TL_MR;
            const float *src = A + k0 * lda + p * TL_MR;
            const int64_t mr = M - p * TL_MR < TL_MR ? M - p * TL_MR : TL_MR;
            int64_t k = kb;
            if (p * TL_MR + 8 <= M)
                for (; k < ke && k + 1 < kb1; k++)
                    *(tl_vec8 *)(dst + k * TL_MR) = *(const tl_vec8 *)(src + k * lda);
            for (; k < ke; k++)
                for (int i = 0; i < TL_MR; i++)
                    dst[k * TL_MR + i] = i < mr ? src[k * lda + i] : 0.0f;
        }
    }
}

/* C[0..mr, 0..nc] = cb C + alpha (A[0..mr, 0..kc] bp) over one panel, A's
 * element (i, k) at A[i rs + k ks] (rows in place: rs = lda, ks = 1; a
 * panel of tl_pack_at: 1, TL_MR); cb 0 not reading C (beta 0: C may hold
 * NaN) */
AI_AVX512_KERNEL static inline __attribute__((always_inline)) void tl_tile(
    int mr, int64_t kc, const float *A, int64_t rs, int64_t ks, const float *bp, float *C,
    int64_t ldc, int64_t nc, float alpha, float cb)
{
    ai_vec16_f32 acc[TL_MR][TL_NV];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < TL_NV; v++)
            acc[i][v] = (ai_vec16_f32){0};
    for (int64_t k = 0; k < kc; k++) {
        ai_vec16_f32 b[TL_NV];
        for (int v = 0; v < TL_NV; v++)
            b[v] = *(const ai_vec16_f32 *)(bp + k * TL_NR + 16 * v);
        for (int i = 0; i < mr; i++) {
            const float a = A[i * rs + k * ks];
            for (int v = 0; v < TL_NV; v++)
                acc[i][v] += a * b[v];
        }
    }
    for (int i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        if (nc == TL_NR) {
            for (int v = 0; v < TL_NV; v++) {
                ai_vec16_f32 *cv = (ai_vec16_f32 *)(c + 16 * v);
                if (cb == 0)
                    *cv = alpha * acc[i][v];
                else
                    *cv = alpha * acc[i][v] + cb * *cv;
            }
        } else {
            float t[TL_NR];
            memcpy(t, acc[i], sizeof t);
            for (int64_t j = 0; j < nc; j++)
                c[j] = cb == 0 ? alpha * t[j] : alpha * t[j] + cb * c[j];
        }
    }
}

/* the tile for mr = 1 .. TL_MR rows, each with its accumulators in
 * registers (inlined where the strides are constants) */
AI_AVX512_KERNEL static inline __attribute__((always_inline)) void tl_tile_rows(
    int mr, int64_t kc, const float *A, int64_t rs, int64_t ks, const float *bp, float *C,
    int64_t ldc, int64_t nc, float alpha, float cb)
{
    switch (mr) {
#define TL_ROWS(r)                                                                        \
    case r:                                                                               \
        tl_tile(r, kc, A, rs, ks, bp, C, ldc, nc, alpha, cb);                             \
        break;
        TL_ROWS(1) TL_ROWS(2) TL_ROWS(3) TL_ROWS(4) TL_ROWS(5) TL_ROWS(6)
#undef TL_ROWS
    }
}

/* One block of op(B) against every row of A: C[0..M, 0..nb] = cb C + alpha
 * (A[0..M, 0..kc] bp), bp the block's panels one after the other */
AI_AVX512_KERNEL static void tl_block(int64_t M, int64_t nb, int64_t kc, float alpha, float cb,
                                      const float *A, int64_t lda, const float *bp, float *C,
                                      int64_t ldc)
{
    for (int64_t m0 = 0; m0 < M; m0 += TL_MR) {
        const int mr = M - m0 < TL_MR ? (int)(M - m0) : TL_MR;
        for (int64_t p = 0; p * TL_NR < nb; p++) {
            const int64_t nc = nb - p * TL_NR < TL_NR ? nb - p * TL_NR : TL_NR;
            tl_tile_rows(mr, kc, A + m0 * lda, lda, 1, bp + p * kc * TL_NR,
                         C + m0 * ldc + p * TL_NR, ldc, nc, alpha, cb);
        }
    }
}

/* The same over op(A) = A^T packed by tl_pack_at: ap the chunk's panels */
AI_AVX512_KERNEL static void tl_block_at(int64_t M, int64_t nb, int64_t kc, float alpha,
                                         float cb, const float *ap, const float *bp, float *C,
                                         int64_t ldc)
{
    for (int64_t m0 = 0; m0 < M; m0 += TL_MR) {
        const int mr = M - m0 < TL_MR ? (int)(M - m0) : TL_MR;
        for (int64_t p = 0; p * TL_NR < nb; p++) {
            const int64_t nc = nb - p * TL_NR < TL_NR ? nb - p * TL_NR : TL_NR;
            tl_tile_rows(mr, kc, ap + m0 * kc, 1, TL_MR, bp + p * kc * TL_NR,
                         C + m0 * ldc + p * TL_NR, ldc, nc, alpha, cb);
        }
    }
}

/* K's chunk length: the chunks are all of it but the last */
static int64_t tl_chunk(int64_t K)
{
    const int64_t chunks = (K + TL_KC - 1) / TL_KC;
    return (K + chunks - 1) / chunks;
}

/* M rounded up to whole panels of TL_MR rows */
static int64_t tl_rows(int64_t M)
{
    return (M + TL_MR - 1) / TL_MR * TL_MR;
}

AI_AVX512_KERNEL bool ai_gemm_tiles_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                        float alpha, const float *A, int64_t lda,
                                        const float *B, int64_t ldb, float beta, float *C,
                                        int64_t ldc)
{
    const int64_t kcm = tl_chunk(K);
    const int64_t ncb = ta ? TL_NC_AT : TL_NC;
    float *bp = aligned_alloc(64, sizeof(float) * (size_t)(kcm * TL_NC));
    /* aligned_alloc's size: a multiple of its alignment, 16 floats */
    float *ap = ta ? aligned_alloc(64, sizeof(float) * (size_t)((kcm * tl_rows(M) + 15) / 16 * 16))
                   : NULL;
    if (!bp || (ta && !ap)) {
        free(bp);
        free(ap);
        return false;
    }
    for (int64_t k0 = 0; k0 < K; k0 += kcm) {
        const int64_t kc = K - k0 < kcm ? K - k0 : kcm;
        const float cb = k0 ? 1.0f : beta;
        if (ta)
            tl_pack_at(M, k0, kc, 0, kc, A, lda, ap);
        for (int64_t n0 = 0; n0 < N; n0 += ncb) {
            const int64_t nb = N - n0 < ncb ? N - n0 : ncb;
            tl_pack_b(tb, n0, nb, k0, kc, B, ldb, bp);
            if (ta)
                tl_block_at(M, nb, kc, alpha, cb, ap, bp, C + n0, ldc);
            else
                tl_block(M, nb, kc, alpha, cb, A + k0, lda, bp, C + n0, ldc);
        }
    }
    free(ap);
    free(bp);
    return true;
}

/*
 * The whole of op(B) packed once, for a weight that many products read (a
 * Linear's, through the engine's cache of packed weights, packed.c), or
 * for a product split between threads (gemm.c: packed once, its panels
 * read by every part): chunk after chunk of K, each the panels of all N
 * columns (N rounded up to TL_NR, zero past N), the layout that
 * ai_gemm_tiles_f32 packs a block of at a time; op(A) = A^T likewise,
 * chunk after chunk, the panels of all M rows. A product over them makes
 * the same sums, bit for bit.
 */
int64_t ai_gemm_tiles_packed_size(int64_t N, int64_t K)
{
    return K * ((N + TL_NR - 1) / TL_NR * TL_NR);
}

int64_t ai_gemm_tiles_packed_at_size(int64_t M, int64_t K)
{
    return (K * tl_rows(M) + 15) / 16 * 16; /* aligned_alloc's: whole 64 bytes */
}

AI_AVX512_KERNEL void ai_gemm_tiles_pack_panels(bool tb, int64_t N, int64_t K, const float *B,
                                                int64_t ldb, float *bp, int64_t p0, int64_t p1)
{
    const int64_t kcm = tl_chunk(K), np = (N + TL_NR - 1) / TL_NR * TL_NR;
    for (int64_t k0 = 0; k0 < K; k0 += kcm) {
        const int64_t kc = K - k0 < kcm ? K - k0 : kcm;
        for (int64_t n0 = p0 * TL_NR; n0 < p1 * TL_NR && n0 < N; n0 += TL_NR)
            tl_pack_b(tb, n0, N - n0 < TL_NR ? N - n0 : TL_NR, k0, kc, B, ldb,
                      bp + k0 * np + n0 * kc);
    }
}

void ai_gemm_tiles_pack(bool tb, int64_t N, int64_t K, const float *B, int64_t ldb, float *bp)
{
    ai_gemm_tiles_pack_panels(tb, N, K, B, ldb, bp, 0, (N + TL_NR - 1) / TL_NR);
}

AI_AVX512_KERNEL void ai_gemm_tiles_pack_at(int64_t M, int64_t K, const float *A, int64_t lda,
                                            float *ap, int64_t k_lo, int64_t k_hi)
{
    const int64_t kcm = tl_chunk(K), mp = tl_rows(M);
    for (int64_t k0 = k_lo / kcm * kcm; k0 < k_hi; k0 += kcm) {
        const int64_t kc = K - k0 < kcm ? K - k0 : kcm;
        tl_pack_at(M, k0, kc, k_lo > k0 ? k_lo - k0 : 0, k_hi < k0 + kc ? k_hi - k0 : kc, A,
                   lda, ap + k0 * mp);
    }
}

AI_AVX512_KERNEL void ai_gemm_tiles_packed_f32(int64_t M, int64_t N, int64_t K, float alpha,
                                               const float *A, int64_t lda, const float *bp,
                                               int64_t ldp, int64_t n0, float beta, float *C,
                                               int64_t ldc)
{
    const int64_t kcm = tl_chunk(K), np = (ldp + TL_NR - 1) / TL_NR * TL_NR;
    for (int64_t k0 = 0; k0 < K; k0 += kcm) {
        const int64_t kc = K - k0 < kcm ? K - k0 : kcm;
        for (int64_t j = 0; j < N; j += TL_NC)
            tl_block(M, N - j < TL_NC ? N - j : TL_NC, kc, alpha, k0 ? 1.0f : beta, A + k0,
                     lda, bp + k0 * np + (n0 + j) * kc, C + j, ldc);
    }
}

AI_AVX512_KERNEL void ai_gemm_tiles_packed_at_f32(int64_t M, int64_t N, int64_t K, float alpha,
                                                  const float *ap, const float *bp,
                                                  int64_t ldp, int64_t n0, float beta, float *C,
                                                  int64_t ldc)
{
    const int64_t kcm = tl_chunk(K), np = (ldp + TL_NR - 1) / TL_NR * TL_NR, mp = tl_rows(M);
    for (int64_t k0 = 0; k0 < K; k0 += kcm) {
        const int64_t kc = K - k0 < kcm ? K - k0 : kcm;
        for (int64_t j = 0; j < N; j += TL_NC_AT)
            tl_block_at(M, N - j < TL_NC_AT ? N - j : TL_NC_AT, kc, alpha, k0 ? 1.0f : beta,
                        ap + k0 * mp, bp + k0 * np + (n0 + j) * kc, C + j, ldc);
    }
}
#else
bool ai_gemm_tiles_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc)
{
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B,
        (void)ldb, (void)beta, (void)C, (void)ldc;
    return false;
}

int64_t ai_gemm_tiles_packed_size(int64_t N, int64_t K)
{
    (void)N, (void)K;
    return 0;
}

int64_t ai_gemm_tiles_packed_at_size(int64_t M, int64_t K)
{
    (void)M, (void)K;
    return 0;
}

void ai_gemm_tiles_pack_panels(bool tb, int64_t N, int64_t K, const float *B, int64_t ldb,
                               float *bp, int64_t p0, int64_t p1)
{
    (void)tb, (void)N, (void)K, (void)B, (void)ldb, (void)bp, (void)p0, (void)p1;
}

void ai_gemm_tiles_pack(bool tb, int64_t N, int64_t K, const float *B, int64_t ldb, float *bp)
{
    (void)tb, (void)N, (void)K, (void)B, (void)ldb, (void)bp;
}

void ai_gemm_tiles_pack_at(int64_t M, int64_t K, const float *A, int64_t lda, float *ap,
                           int64_t k_lo, int64_t k_hi)
{
    (void)M, (void)K, (void)A, (void)lda, (void)ap, (void)k_lo, (void)k_hi;
}

void ai_gemm_tiles_packed_f32(int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                              int64_t lda, const float *bp, int64_t ldp, int64_t n0,
                              float beta, float *C, int64_t ldc)
{
    (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)bp, (void)ldp, (void)n0,
        (void)beta, (void)C, (void)ldc;
}

void ai_gemm_tiles_packed_at_f32(int64_t M, int64_t N, int64_t K, float alpha, const float *ap,
                                 const float *bp, int64_t ldp, int64_t n0, float beta, float *C,
                                 int64_t ldc)
{
    (void)M, (void)N, (void)K, (void)alpha, (void)ap, (void)bp, (void)ldp, (void)n0,
        (void)beta, (void)C, (void)ldc;
}
#endif
