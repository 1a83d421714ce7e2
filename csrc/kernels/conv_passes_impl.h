/*
 * conv_passes_impl.h — the passes of conv_passes.c, written once for the
 * element type T (SFX: _f32, _f64); conv_passes.c includes it once per type
 * and this file undefines T and SFX. Not a public header.
 */

/* y (N, M, S): y[n, m, :] = b[m], or 0 without bias; planes [nm0, nm1). */
AI_VECTOR_CLONES static void FN(fill_bias_range)(void *ctx, int64_t nm0, int64_t nm1)
{
    const FN(cols_job) *j = ctx;
    for (int64_t nm = nm0; nm < nm1; nm++) {
        T *y = j->dst + nm * j->S;
        const T v = j->src ? j->src[nm % j->M] : 0;
        for (int64_t s = 0; s < j->S; s++)
            y[s] = v;
    }
}

void FN(fill_bias)(T *y, const T *b, int64_t N, int64_t M, int64_t S)
{
    FN(cols_job) j = {.dst = y, .src = b, .N = N, .M = M, .S = S};
    ai_parallel_for(N * M, ai_grain_of(S), FN(fill_bias_range), &j);
}

/* The epilogue on plane y (n elements) of output channel m of M, vectorised
 * (the depthwise kernels' plane loops are not). */
AI_VECTOR_CLONES void FN(ep_plane)(T *y, int64_t n, const ai_conv_epilogue *ep,
                                          int64_t m, int64_t M)
{
    FN(ep_apply)(y, y, n, NULL, ep, m, M);
}


/* Planes [m0, m1) of one image y (M, S) of a forward (an ep_job): + b[m]
 * (when b), then the epilogue. */
AI_VECTOR_CLONES void FN(ep_range)(void *ctx, int64_t m0, int64_t m1)
{
    const FN(ep_job) *j = ctx;
    for (int64_t m = m0; m < m1; m++)
        FN(ep_apply)(j->y + m * j->S, j->y + m * j->S, j->S, j->b ? j->b + m : NULL, j->ep, m,
                     j->M);
}


/* db[m] += sum of dy (N, M, S) over s, then n, for m in [m0, m1): one sum
 * per (n, m) plane in 8 partial sums (they vectorise), added in the order of n. */
AI_VECTOR_CLONES static void FN(bias_backward_range)(void *ctx, int64_t m0, int64_t m1)
{
    const FN(cols_job) *j = ctx;
    const int64_t S = j->S;
    for (int64_t m = m0; m < m1; m++)
        for (int64_t n = 0; n < j->N; n++) {
            const T *dy = j->src + (n * j->M + m) * S;
            T p[8] = {0};
            int64_t s = 0;
            for (; s + 8 <= S; s += 8)
                for (int l = 0; l < 8; l++)
                    p[l] += dy[s + l];
            for (; s < S; s++)
                p[s % 8] += dy[s];
            j->dst[m] += ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
        }
}

/* Split by output channel: each db[m] is summed on one thread. */
void FN(bias_backward)(T *db, const T *dy, int64_t N, int64_t M, int64_t S)
{
    FN(cols_job) j = {.dst = db, .src = dy, .N = N, .M = M, .S = S};
    ai_parallel_for(M, ai_grain_of(N * S), FN(bias_backward_range), &j);
}

/* dst (cols, rows) = src (rows, cols)^T, or += with `add`; in tiles (the
 * branch outside the element loops: a plain copy when not adding). Rows of
 * dst are ldd apart, rows of src lds apart. */
AI_VECTOR_CLONES void FN(transpose)(T *dst, int64_t ldd, const T *src, int64_t lds,
                                           int64_t rows, int64_t cols, bool add)
{
    for (int64_t i0 = 0; i0 < rows; i0 += 16)
        for (int64_t j0 = 0; j0 < cols; j0 += 16) {
            const int64_t i1 = i0 + 16 < rows ? i0 + 16 : rows;
            const int64_t j1 = j0 + 16 < cols ? j0 + 16 : cols;
            int64_t i = i0, j = j0;
#ifdef AI_HAVE_TRANSPOSE8 /* whole 8 x 8 blocks of float by shuffles */
            for (; sizeof(T) == 4 && i + 8 <= i1; i += 8)
                for (j = j0; j + 8 <= j1; j += 8) {
                    const float *s[8];
                    for (int r = 0; r < 8; r++)
                        s[r] = (const float *)src + (i + r) * lds + j;
                    transpose8_from_f32((float *)dst + j * ldd + i, ldd, s, add);
                }
#endif
            /* what is left: the rows past i, the columns past j above it */
#define TRANSPOSE_REST(OP)                                                             \
    do {                                                                               \
        for (int64_t jj = j0; jj < j1; jj++)                                           \
            for (int64_t ii = i; ii < i1; ii++)                                        \
                dst[jj * ldd + ii] OP src[ii * lds + jj];                              \
        for (int64_t jj = j; jj < j1; jj++)                                            \
            for (int64_t ii = i0; ii < i; ii++)                                        \
                dst[jj * ldd + ii] OP src[ii * lds + jj];                              \
    } while (0)
            if (add)
                TRANSPOSE_REST(+=);
            else
                TRANSPOSE_REST(=);
#undef TRANSPOSE_REST
        }
}

#undef T
#undef SFX
