/*
 * conv_impl.h — the Conv / ConvTranspose kernels, written once for the
 * element type T. conv.c includes it once per type after defining T, SFX
 * (name suffix: _f32, _f64) and GEMM (ai_gemm_f32, ai_gemm_f64); this file
 * undefines them. Not a public header.
 *
 * Sizes: K = prod(kernel), IS = prod(x spatial), OS = prod(y spatial),
 * Cg = C/group, Mg = M/group. Grid side: Conv y, ConvTranspose x.
 *
 * Threads: besides the GEMMs (gemm.c), im2col, col2im, fill_bias,
 * bias_backward and the depthwise kernels split their work on the engine's
 * pool by output rows, planes or channels, never inside a sum: results do
 * not depend on the thread count.
 */
#include "../parallel.h"

/* For row r in [R0, R1) of the columns (rows LD apart) and each grid row
 * (o0, o1), calls BODY with `rowp` (the grid row's columns, grid[2] long),
 * `src` (the image row's element for o2 = 0: src[o2 * s2] for o2 in
 * [lo2, hi2)), or src NULL when the row lies in the padding; [lo2, hi2) are
 * the grid positions inside. */
#define FOR_COLUMN_ROWS(R0, R1, IMG, COL, LD, BODY)                                    \
    for (int64_t r = (R0); r < (R1); r++) {                                            \
        conv_tap t = conv_tap_of(g, r);                                                \
        int64_t lo[3], hi[3];                                                          \
        for (int i = 0; i < 3; i++)                                                    \
            tap_range(t.off[i], g->s[i], g->img[i], g->grid[i], &lo[i], &hi[i]);       \
        const int64_t lo2 = lo[2], hi2 = hi[2], s2 = g->s[2];                          \
        (void)s2;                                                                      \
        for (int64_t o0 = 0; o0 < g->grid[0]; o0++)                                    \
            for (int64_t o1 = 0; o1 < g->grid[1]; o1++) {                              \
                T *rowp = (COL) + r * (LD) + (o0 * g->grid[1] + o1) * g->grid[2];      \
                bool in = o0 >= lo[0] && o0 < hi[0] && o1 >= lo[1] && o1 < hi[1];      \
                T *src = !in ? NULL                                                    \
                             : (IMG) + t.plane +                                       \
                                   ((o0 * g->s[0] + t.off[0]) * g->img[1] +            \
                                    o1 * g->s[1] + t.off[1]) * g->img[2] + t.off[2];   \
                BODY;                                                                  \
            }                                                                          \
    }

/* The operands of one im2col, col2im, fill_bias or bias_backward pass on
 * the thread pool. */
typedef struct {
    const conv_geom *g;
    T *dst;
    const T *src;
    int64_t N, M, S;
} FN(cols_job);

/* Whether every column of a 1x1 kernel reads inside the image (no pad at
 * the start, none reached at the end): im2col is then a plain subsampling. */
static inline bool FN(im2col_subsamples)(const conv_geom *g)
{
    bool inside = g->ksize == 1;
    for (int i = 0; i < 3 && inside; i++)
        inside = g->p[i] == 0 && (g->grid[i] - 1) * g->s[i] < g->img[i];
    return inside;
}

/* col (C*K, grid; rows ld apart) = the patches of img (C, image); padding
 * reads 0. Rows [r0, r1) of the columns. A 1x1 kernel that reads no
 * padding (a strided 1x1 conv: ResNet's shortcuts) is a plain subsampling
 * of each plane, its own loop (the general one's per-row bookkeeping made it cost more than
 * the GEMM: 16 -> 32, stride 2, 32x32, batch 16, im2col 28% of the conv). */
AI_VECTOR_CLONES static void FN(im2col_rows)(T *col, const T *img, const conv_geom *g,
                                             int64_t r0, int64_t r1, int64_t ld)
{
    if (FN(im2col_subsamples)(g)) {
        const int64_t G1 = g->grid[1], G2 = g->grid[2], s2 = g->s[2];
        for (int64_t r = r0; r < r1; r++) /* row r: channel r */
            for (int64_t o0 = 0; o0 < g->grid[0]; o0++)
                for (int64_t o1 = 0; o1 < G1; o1++) {
                    const T *src = img + r * g->img_size +
                                   (o0 * g->s[0] * g->img[1] + o1 * g->s[1]) * g->img[2];
                    T *dst = col + r * ld + (o0 * G1 + o1) * G2;
                    for (int64_t j = 0; j < G2; j++)
                        dst[j] = src[j * s2];
                }
        return;
    }
    FOR_COLUMN_ROWS(r0, r1, (T *)img, col, ld, {
        if (!src) {
            memset(rowp, 0, sizeof(T) * (size_t)g->grid[2]);
            continue;
        }
        for (int64_t j = 0; j < lo2; j++)
            rowp[j] = 0;
        if (s2 == 1)
            memcpy(rowp + lo2, src + lo2, sizeof(T) * (size_t)(hi2 - lo2));
        else
            for (int64_t j = lo2; j < hi2; j++)
                rowp[j] = src[j * s2];
        for (int64_t j = hi2; j < g->grid[2]; j++)
            rowp[j] = 0;
    });
}

static void FN(im2col_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(cols_job) *j = ctx;
    FN(im2col_rows)(j->dst, j->src, j->g, lo, hi, j->g->grid_size);
}

/* Split by column rows: each writes its own row. */
static void FN(im2col)(T *col, const T *img, int64_t C, const conv_geom *g)
{
    FN(cols_job) j = {.g = g, .dst = col, .src = img};
    ai_parallel_for(C * g->ksize, ai_grain_of(g->grid_size), FN(im2col_range), &j);
}

/* img (C, image) += the columns col (C*K, grid; rows ld apart) summed back
 * onto the image: the adjoint of im2col. Channels [c0, c1), that is rows
 * [c0*K, c1*K). */
AI_VECTOR_CLONES static void FN(col2im_channels)(T *img, const T *col, const conv_geom *g,
                                                 int64_t c0, int64_t c1, int64_t ld)
{
    FOR_COLUMN_ROWS(c0 * g->ksize, c1 * g->ksize, img, (T *)col, ld, {
        if (!src)
            continue;
        if (s2 == 1)
            for (int64_t j = lo2; j < hi2; j++)
                src[j] += rowp[j];
        else
            for (int64_t j = lo2; j < hi2; j++)
                src[j * s2] += rowp[j];
    });
}

static void FN(col2im_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(cols_job) *j = ctx;
    FN(col2im_channels)(j->dst, j->src, j->g, lo, hi, j->g->grid_size);
}

/* Split by channels: the rows of one channel add into its plane alone, in
 * the serial order. */
static void FN(col2im)(T *img, const T *col, int64_t C, const conv_geom *g)
{
    FN(cols_job) j = {.g = g, .dst = img, .src = col};
    ai_parallel_for(C, ai_grain_of(g->ksize * g->grid_size), FN(col2im_range), &j);
}

/* The columns of img (C, image): img itself for a pointwise conv, else
 * im2col'd into ws. */
static const T *FN(columns)(T *ws, const T *img, int64_t C, const conv_geom *g)
{
    if (g->pointwise)
        return img;
    FN(im2col)(ws, img, C, g);
    return ws;
}

/* img (C, image) += col2im(A^T @ B) (= with `assign`), A (kdim, C*K), B
 * (kdim, grid); the product goes through ws, or straight into img for a
 * pointwise conv. */
static void FN(gemm_col2im)(T *img, const T *A, const T *B, int64_t kdim, int64_t C,
                            T *ws, const conv_geom *g, bool assign)
{
    int64_t rows = C * g->ksize, cols = g->grid_size;
    if (g->pointwise) {
        GEMM(true, false, rows, cols, kdim, 1, A, rows, B, cols, assign ? 0 : 1, img, cols);
        return;
    }
    GEMM(true, false, rows, cols, kdim, 1, A, rows, B, cols, 0, ws, cols);
    if (assign) /* col2im adds overlapping windows */
        memset(img, 0, sizeof(T) * (size_t)(C * g->img_size));
    FN(col2im)(img, ws, C, g);
}

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

static void FN(fill_bias)(T *y, const T *b, int64_t N, int64_t M, int64_t S)
{
    FN(cols_job) j = {.dst = y, .src = b, .N = N, .M = M, .S = S};
    ai_parallel_for(N * M, ai_grain_of(S), FN(fill_bias_range), &j);
}

/* dst[0, n) = src[0, n) + *bias (when bias), then the epilogue ep (NULL:
 * none) of output channel m of M; dst may be src. */
static inline void FN(ep_apply)(T *dst, const T *src, int64_t n, const T *bias,
                                const ai_conv_epilogue *ep, int64_t m, int64_t M)
{
    const T *ab = ep ? ep->ab : NULL;
    const bool relu = ep && ep->relu;
    const T a = ab ? ab[m] : 1, c = ab ? ab[M + m] : 0, bv = bias ? *bias : 0;
    if (!ab && !relu) { /* the bias alone */
        for (int64_t e = 0; e < n; e++)
            dst[e] = bias ? src[e] + bv : src[e];
        return;
    }
    for (int64_t e = 0; e < n; e++) {
        T v = bias ? src[e] + bv : src[e];
        v = ab ? v * a + c : v;
        dst[e] = relu && !(v > 0 || v != v) ? 0 : v;
    }
}

/* The epilogue on plane y (n elements) of output channel m of M, vectorised
 * (the depthwise kernels' plane loops are not). */
AI_VECTOR_CLONES static void FN(ep_plane)(T *y, int64_t n, const ai_conv_epilogue *ep,
                                          int64_t m, int64_t M)
{
    FN(ep_apply)(y, y, n, NULL, ep, m, M);
}

/* pw_batched (conv.c): planes [lo, hi) of x (N, C, S) into xs (C, N S) */
static void FN(pw_gather_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(cols_job) *j = ctx;
    for (int64_t nc = lo; nc < hi; nc++) {
        const int64_t n = nc / j->M, c = nc % j->M;
        memcpy(j->dst + (c * j->N + n) * j->S, j->src + nc * j->S, sizeof(T) * (size_t)j->S);
    }
}

/* planes [lo, hi) of y (N, M, S) from ys (M, N S), + b[m] (when b), the
 * epilogue */
typedef struct {
    T *y;
    const T *ys, *b;
    const ai_conv_epilogue *ep;
    int64_t N, M, S;
} FN(pw_scatter_job);

AI_VECTOR_CLONES static void FN(pw_scatter_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(pw_scatter_job) *j = ctx;
    for (int64_t nm = lo; nm < hi; nm++) {
        const int64_t n = nm / j->M, m = nm % j->M;
        FN(ep_apply)(j->y + nm * j->S, j->ys + (m * j->N + n) * j->S, j->S,
                     j->b ? j->b + m : NULL, j->ep, m, j->M);
    }
}

/* pw_batched's backward: planes [lo, hi) of dx (N, C, S) from dxs (C, N S),
 * written (assign) or added */
typedef struct {
    T *dx;
    const T *dxs;
    int64_t N, C, S;
    bool assign;
} FN(pw_scatter_dx_job);

AI_VECTOR_CLONES static void FN(pw_scatter_dx_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(pw_scatter_dx_job) *j = ctx;
    for (int64_t nc = lo; nc < hi; nc++) {
        const int64_t n = nc / j->C, c = nc % j->C;
        T *d = j->dx + nc * j->S;
        const T *s = j->dxs + (c * j->N + n) * j->S;
        if (j->assign)
            memcpy(d, s, sizeof(T) * (size_t)j->S);
        else
            for (int64_t i = 0; i < j->S; i++)
                d[i] += s[i];
    }
}

/* Planes [m0, m1) of one image y (M, S) of a forward: + b[m] (when b), then
 * the epilogue. */
typedef struct {
    T *y;
    const T *b;
    const ai_conv_epilogue *ep;
    int64_t M, S;
} FN(ep_job);

AI_VECTOR_CLONES static void FN(ep_range)(void *ctx, int64_t m0, int64_t m1)
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
static void FN(bias_backward)(T *db, const T *dy, int64_t N, int64_t M, int64_t S)
{
    FN(cols_job) j = {.dst = db, .src = dy, .N = N, .M = M, .S = S};
    ai_parallel_for(M, ai_grain_of(N * S), FN(bias_backward_range), &j);
}

/* The direct kernel of one depthwise plane pair, tap by tap: for each tap k
 * and each output position o whose input position i = o * s + off is inside
 * the image, in mode
 *   DW_FWD:  grid[o] += w[k] * img[i]         (forward: grid = y, img = x)
 *   DW_DX:   img[i]  += w[k] * grid[o]        (backward: grid = dy, img = dx)
 *   DW_DW:   w[k]    += sum_o grid[o] * img[i] (backward: grid = dy, img = x)
 * (modes defined in conv.c)
 * Rows along the last dim are contiguous on the grid side; with stride 1 on
 * the image side too, so the inner loops vectorise. */
AI_VECTOR_CLONES static void FN(dw_plane)(int mode, T *grid, T *img, T *w, const conv_geom *g)
{
    for (int64_t r = 0; r < g->ksize; r++) {
        conv_tap t = conv_tap_of(g, r);
        int64_t lo[3], hi[3];
        for (int i = 0; i < 3; i++)
            tap_range(t.off[i], g->s[i], g->img[i], g->grid[i], &lo[i], &hi[i]);
        const T wk = w[r];
        const int64_t s2 = g->s[2], n2 = hi[2] - lo[2];
        T acc[8] = {0};
        for (int64_t o0 = lo[0]; o0 < hi[0]; o0++)
            for (int64_t o1 = lo[1]; o1 < hi[1]; o1++) {
                T *gr = grid + (o0 * g->grid[1] + o1) * g->grid[2] + lo[2];
                T *im = img + ((o0 * g->s[0] + t.off[0]) * g->img[1] + o1 * g->s[1] +
                               t.off[1]) * g->img[2] + lo[2] * s2 + t.off[2];
                if (mode == DW_FWD && s2 == 1)
                    for (int64_t j = 0; j < n2; j++)
                        gr[j] += wk * im[j];
                else if (mode == DW_FWD)
                    for (int64_t j = 0; j < n2; j++)
                        gr[j] += wk * im[j * s2];
                else if (mode == DW_DX && s2 == 1)
                    for (int64_t j = 0; j < n2; j++)
                        im[j] += wk * gr[j];
                else if (mode == DW_DX)
                    for (int64_t j = 0; j < n2; j++)
                        im[j * s2] += wk * gr[j];
                else { /* 8 partial sums: vectorises, and the error grows 8x slower */
                    int64_t j = 0;
                    if (s2 == 1)
                        for (; j + 8 <= n2; j += 8)
                            for (int l = 0; l < 8; l++)
                                acc[l] += gr[j + l] * im[j + l];
                    for (; j < n2; j++)
                        acc[j % 8] += gr[j] * im[j * s2];
                }
            }
        if (mode == DW_DW)
            w[r] += ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                    ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
}

/* dw_plane in channels-last form, for one input channel per output channel:
 * grid (OS, ld), img (IS, ld), w (K, ld), channels innermost, so the inner
 * loops run over the C channels (of ld) whatever the image width. Same
 * modes, same order of operations per element (tap by tap, positions in
 * order) as dw_plane for DW_FWD and DW_DX. */
AI_VECTOR_CLONES static void FN(dw_channels_last)(int mode, T *grid, T *img, T *w,
                                                  int64_t C, int64_t ld, const conv_geom *g)
{
    for (int64_t r = 0; r < g->ksize; r++) {
        conv_tap t = conv_tap_of(g, r);
        int64_t lo[3], hi[3];
        for (int i = 0; i < 3; i++)
            tap_range(t.off[i], g->s[i], g->img[i], g->grid[i], &lo[i], &hi[i]);
        T *wr = w + r * ld;
        for (int64_t o0 = lo[0]; o0 < hi[0]; o0++)
            for (int64_t o1 = lo[1]; o1 < hi[1]; o1++)
                for (int64_t o2 = lo[2]; o2 < hi[2]; o2++) {
                    T *gr = grid + ((o0 * g->grid[1] + o1) * g->grid[2] + o2) * ld;
                    T *im = img + (((o0 * g->s[0] + t.off[0]) * g->img[1] + o1 * g->s[1] +
                                    t.off[1]) * g->img[2] + o2 * g->s[2] + t.off[2]) * ld;
                    if (mode == DW_FWD)
                        for (int64_t c = 0; c < C; c++)
                            gr[c] += wr[c] * im[c];
                    else if (mode == DW_DX)
                        for (int64_t c = 0; c < C; c++)
                            im[c] += wr[c] * gr[c];
                    else
                        for (int64_t c = 0; c < C; c++)
                            wr[c] += gr[c] * im[c];
                }
    }
}

/* dst (cols, rows) = src (rows, cols)^T, or += with `add`; in tiles (the
 * branch outside the element loops: a plain copy when not adding). Rows of
 * dst are ldd apart, rows of src lds apart. */
AI_VECTOR_CLONES static void FN(transpose)(T *dst, int64_t ldd, const T *src, int64_t lds,
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

/* One depthwise pass on the thread pool (see depthwise). */
typedef struct {
    int mode;
    const ai_conv_params *p;
    conv_geom g;
    T *grid, *img, *w, *ws;
    const ai_conv_epilogue *ep; /* DW_FWD: applied to each plane once computed */
} FN(dw_job);

/* Plane by plane. DW_FWD, DW_DX: (n, c) pairs [lo, hi), each with the Mg
 * output planes of input plane c, in order (DW_DX adds them into plane
 * (n, c) alone). DW_DW: output channels [lo, hi), each over n in order, so
 * every dw[m] is summed on one thread as serially. */
static void FN(dw_planes_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(dw_job) *j = ctx;
    const ai_conv_params *p = j->p;
    const int64_t C = p->C, M = p->M, Mg = M / p->group, K = j->g.ksize;
    const int64_t IS = j->g.img_size, OS = j->g.grid_size;
    for (int64_t i = lo; i < hi; i++) {
        if (j->mode == DW_DW) {
            for (int64_t n = 0; n < p->N; n++)
                FN(dw_plane)(DW_DW, j->grid + (n * M + i) * OS, j->img + (n * C + i / Mg) * IS,
                             j->w + i * K, &j->g);
            continue;
        }
        const int64_t n = i / C, c = i % C;
        for (int64_t m = c * Mg; m < (c + 1) * Mg; m++) {
            T *plane = j->grid + (n * M + m) * OS;
            FN(dw_plane)(j->mode, plane, j->img + i * IS, j->w + m * K, &j->g);
            if (j->mode == DW_FWD && j->ep)
                FN(ep_plane)(plane, OS, j->ep, m, M);
        }
    }
}

/* Channels-last, channels [16 lo, 16 hi) (units of 16 apart in cache lines):
 * each thread transposes its channels into and out of its own columns of the
 * shared buffers gt (OS, C), it (IS, C), wt (K, C), and handles every image
 * for them. */
static void FN(dw_last_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(dw_job) *j = ctx;
    const int mode = j->mode;
    const int64_t C = j->p->C, K = j->g.ksize, IS = j->g.img_size, OS = j->g.grid_size;
    const int64_t c0 = lo * 16, nc = (hi * 16 < C ? hi * 16 : C) - c0;
    T *gt = j->ws + c0, *it = j->ws + OS * C + c0, *wt = j->ws + (OS + IS) * C + c0;
    if (mode == DW_DW)
        for (int64_t k = 0; k < K; k++)
            memset(wt + k * C, 0, sizeof(T) * (size_t)nc);
    else
        FN(transpose)(wt, C, j->w + c0 * K, K, nc, K, false);
    for (int64_t n = 0; n < j->p->N; n++) {
        T *gn = j->grid + (n * C + c0) * OS, *in = j->img + (n * C + c0) * IS;
        if (mode == DW_FWD) /* y holds only the bias (fill_bias): plane c is b[c] */
            for (int64_t o = 0; o < OS; o++)
                for (int64_t c = 0; c < nc; c++)
                    gt[o * C + c] = gn[c * OS];
        else
            FN(transpose)(gt, C, gn, OS, nc, OS, false);
        if (mode == DW_DX)
            for (int64_t i = 0; i < IS; i++)
                memset(it + i * C, 0, sizeof(T) * (size_t)nc);
        else
            FN(transpose)(it, C, in, IS, nc, IS, false);
        FN(dw_channels_last)(mode, gt, it, wt, nc, C, &j->g);
        if (mode == DW_FWD) {
            FN(transpose)(gn, OS, gt, C, OS, nc, false);
            for (int64_t c = 0; j->ep && c < nc; c++)
                FN(ep_plane)(gn + c * OS, OS, j->ep, c0 + c, C);
        } else if (mode == DW_DX)
            FN(transpose)(in, IS, it, C, IS, nc, true);
    }
    if (mode == DW_DW)
        FN(transpose)(j->w + c0 * K, K, wt, C, K, nc, true);
}

/* The phase planes of source plane src (phase_planes in conv.c) into buf;
 * `zeroed`: buf holds an earlier plane's, so its pads and tail are zeros
 * already and only the values are copied. */
AI_VECTOR_CLONES AI_SHORT_LOOPS static void FN(dw_pad_fill)(const phase_planes *d, T *buf,
                                                            const T *src, bool zeroed)
{
    const int64_t s2 = d->s2, PS = d->R1 * d->R2;
    /* phase b's columns j: source column j s2 + b - P2 in [0, W) (divisions
     * hoisted: per row they were most of a stride-2 fill) */
    int64_t jlo[DW_PAD_MAX_TAPS], jhi[DW_PAD_MAX_TAPS];
    for (int64_t b = 0; b < s2; b++) {
        int64_t hi = (d->W + d->P2 - b + s2 - 1) / s2;
        jhi[b] = hi < d->R2 ? hi : d->R2;
        jlo[b] = d->P2 - b > 0 ? (d->P2 - b + s2 - 1) / s2 : 0;
        jlo[b] = jlo[b] < jhi[b] ? jlo[b] : jhi[b];
    }
    for (int64_t a = 0; a < d->s1; a++)
        for (int64_t i = 0; i < d->R1; i++) {
            const int64_t r = i * d->s1 + a - d->P1;
            T *rows = buf + a * s2 * PS + i * d->R2; /* phase (a, b)'s row: + b PS */
            if (r < 0 || r >= d->H) {
                for (int64_t b = 0; b < s2 && !zeroed; b++)
                    memset(rows + b * PS, 0, sizeof(T) * (size_t)d->R2);
                continue;
            }
            for (int64_t b = 0; b < s2; b++) {
                T *row = rows + b * PS;
                const int64_t lo = jlo[b], hi = jhi[b];
                if (!zeroed) {
                    for (int64_t j = 0; j < lo; j++)
                        row[j] = 0;
                    for (int64_t j = hi; j < d->R2; j++)
                        row[j] = 0;
                }
                if (s2 == 2)
                    continue;
                T *restrict to = row + lo;
                const T *restrict from = src + r * d->W + b - d->P2 + lo * s2;
                if (s2 == 1)
                    for (int64_t j = 0; j < hi - lo; j++)
                        to[j] = from[j];
                else
                    for (int64_t j = 0; j < hi - lo; j++)
                        to[j] = from[j * s2];
            }
            if (s2 != 2)
                continue;
            /* stride 2: column j of phases 0 and 1 reads source columns 2j - P2
             * and 2j + 1 - P2, one pass over the source row deinterleaves both */
            const T *sr = src + r * d->W - d->P2;
            const int64_t lo = jlo[0] > jlo[1] ? jlo[0] : jlo[1];
            const int64_t hi = jhi[0] < jhi[1] ? jhi[0] : jhi[1];
            for (int64_t b = 0; b < 2; b++) { /* the columns only one phase has */
                for (int64_t j = jlo[b]; j < jhi[b] && j < lo; j++)
                    rows[b * PS + j] = sr[2 * j + b];
                for (int64_t j = hi > jlo[b] ? hi : jlo[b]; j < jhi[b]; j++)
                    rows[b * PS + j] = sr[2 * j + b];
            }
            if (hi > lo)
                FN(deinterleave)(rows + lo, rows + PS + lo, sr + 2 * lo, hi - lo);
        }
    if (!zeroed)
        memset(buf + d->s1 * s2 * PS, 0, sizeof(T) * (size_t)(d->R2 + 2 * DW_PAD_LANES));
}

/* dst (G1, G2) += sum over taps k, in order, of w[k] * the tap's rows of buf
 * (`uniform`: dst holds dst[0] everywhere, a forward's bias, not read):
 * each element gets its taps one by one, as dw_plane adds them. Blocks of
 * DW_ROWS output rows by DW_PAD_LANES outputs (then by one vector), so that
 * 2 DW_ROWS sums are in flight at once (one row's two vectors alone waited
 * on the adds' latency: 24x24 planes ran at a third of the FMA rate); the
 * last rows and a short last chunk one row at a time, through a local copy. */
#define DW_ROWS 4
AI_VEC_DECL(FN(vec), T);

/* One row's outputs [o2, o2 + n), n <= DW_PAD_LANES, of dw_pad_rows: dr and
 * br are the output row and its buf row (`uniform`: the sums start from b0,
 * dr is not read); a short chunk through a copy. */
static inline void FN(dw_row_chunk)(const phase_planes *d, T *dr, const T *br, const T *w,
                                    int64_t o2, int64_t n, bool uniform, T b0)
{
    enum { L = DW_PAD_LANES, VL = AI_VEC_LANES(T), NV = DW_PAD_LANES / AI_VEC_LANES(T) };
    T tail[L] = {0};
    T *out = n == L ? dr + o2 : tail;
    if (n < L && !uniform)
        memcpy(tail, dr + o2, sizeof(T) * (size_t)n);
    const FN(vec) init = (FN(vec)){0} + b0;
    FN(vec) acc[NV];
    for (int v = 0; v < NV; v++)
        acc[v] = uniform ? init : *(const FN(vec) *)(out + v * VL);
    for (int64_t k = 0; k < d->K; k++) {
        const T wk = w[k], *src = br + d->base[k] + o2;
        for (int v = 0; v < NV; v++)
            acc[v] += wk * *(const FN(vec) *)(src + v * VL);
    }
    for (int v = 0; v < NV; v++)
        *(FN(vec) *)(out + v * VL) = acc[v];
    if (n < L)
        memcpy(dr + o2, tail, sizeof(T) * (size_t)n);
}

/* DW_ROWS rows from o1 by NVB vectors from o2, in registers */
#define DW_ROWS_BLOCK(NVB)                                                               \
    {                                                                                    \
        FN(vec) acc[DW_ROWS][NVB];                                                       \
        for (int r = 0; r < DW_ROWS; r++)                                                \
            for (int v = 0; v < (NVB); v++)                                              \
                acc[r][v] = uniform ? init                                               \
                                    : *(const FN(vec) *)(dst + (o1 + r) * G2 + o2 + v * VL); \
        for (int64_t k = 0; k < K; k++) {                                                \
            const T wk = w[k], *src = buf + d->base[k] + o1 * R2 + o2;                   \
            for (int r = 0; r < DW_ROWS; r++)                                            \
                for (int v = 0; v < (NVB); v++)                                          \
                    acc[r][v] += wk * *(const FN(vec) *)(src + r * R2 + v * VL);         \
        }                                                                                \
        for (int r = 0; r < DW_ROWS; r++)                                                \
            for (int v = 0; v < (NVB); v++)                                              \
                *(FN(vec) *)(dst + (o1 + r) * G2 + o2 + v * VL) = acc[r][v];             \
    }

AI_VECTOR_CLONES static void FN(dw_pad_rows)(const phase_planes *d, T *dst, const T *buf,
                                             const T *w, bool uniform)
{
    enum { L = DW_PAD_LANES, VL = AI_VEC_LANES(T), NV = DW_PAD_LANES / AI_VEC_LANES(T) };
    const int64_t K = d->K, G1 = d->G1, G2 = d->G2, R2 = d->R2;
    const T b0 = dst[0]; /* with `uniform`, before any output is written */
    const FN(vec) init = (FN(vec)){0} + b0;
    int64_t o1 = 0;
    for (; o1 + DW_ROWS <= G1; o1 += DW_ROWS) {
        int64_t o2 = 0;
        for (; o2 + L <= G2; o2 += L)
            DW_ROWS_BLOCK(NV)
        for (; o2 + VL <= G2; o2 += VL)
            DW_ROWS_BLOCK(1)
        for (int r = 0; r < DW_ROWS && o2 < G2; r++) /* the rows' last outputs */
            FN(dw_row_chunk)(d, dst + (o1 + r) * G2, buf + (o1 + r) * R2, w, o2, G2 - o2,
                             uniform, b0);
    }
    for (; o1 < G1; o1++)
        for (int64_t o2 = 0; o2 < G2; o2 += L)
            FN(dw_row_chunk)(d, dst + o1 * G2, buf + o1 * R2, w, o2,
                             G2 - o2 < L ? G2 - o2 : L, uniform, b0);
}
#undef DW_ROWS_BLOCK

/* dw_pad_rows for narrow planes (dw_pad_flat in conv.c): the rows of R2
 * positions taken as one flat run, since position f = o1 R2 + o2 of every
 * tap reads buf at base[k] + f (the phase planes' rows are R2 apart); the
 * R2 - G2 positions past each row's end are computed and dropped. Blocks
 * of rows go through `tmp` in that flat layout (DW_FLAT_MAX elements and a
 * chunk): dst's values in (`uniform`: all equal to dst[0], a forward's
 * bias, not read), the sums out, each element summed as in dw_pad_rows. */
AI_VECTOR_CLONES AI_SHORT_LOOPS static void FN(dw_pad_flat)(const phase_planes *d, T *dst,
                                                            const T *buf, const T *w,
                                                            bool uniform)
{
    enum { VL = AI_VEC_LANES(T), NV = 4, L = NV * VL };
    T tmp[DW_FLAT_MAX + L];
    const int64_t K = d->K, G1 = d->G1, G2 = d->G2, R2 = d->R2, rows = DW_FLAT_MAX / R2;
    const FN(vec) init = (FN(vec)){0} + dst[0];
    for (int64_t r0 = 0; r0 < G1; r0 += rows) {
        const int64_t nr = G1 - r0 < rows ? G1 - r0 : rows, F = nr * R2;
        T *dr = dst + r0 * G2;
        const T *br = buf + r0 * R2;
        if (!uniform)
            for (int64_t i = 0; i < nr; i++)
                for (int64_t o2 = 0; o2 < G2; o2++)
                    tmp[i * R2 + o2] = dr[i * G2 + o2];
        for (int64_t f = 0; f < F; f += L) {
            FN(vec) acc[NV];
            for (int v = 0; v < NV; v++)
                acc[v] = uniform ? init : *(const FN(vec) *)(tmp + f + v * VL);
            for (int64_t k = 0; k < K; k++) {
                const T wk = w[k], *src = br + d->base[k] + f;
                for (int v = 0; v < NV; v++)
                    acc[v] += wk * *(const FN(vec) *)(src + v * VL);
            }
            for (int v = 0; v < NV; v++)
                *(FN(vec) *)(tmp + f + v * VL) = acc[v];
        }
        for (int64_t i = 0; i < nr; i++)
            for (int64_t o2 = 0; o2 < G2; o2++)
                dr[i * G2 + o2] = tmp[i * R2 + o2];
    }
}

/* The copies of source plane src (same_planes in conv.c) into slot buf;
 * `zeroed`: buf holds an earlier plane's, whose zeros are in place. */
AI_SHORT_LOOPS static void FN(dw_same_fill)(const same_planes *q, T *buf, const T *src,
                                            bool zeroed)
{
    if (!zeroed)
        memset(buf, 0, sizeof(T) * (size_t)(q->copies * q->plane));
    for (int64_t c = 0; c < q->copies; c++) {
        T *to = buf + c * q->plane + q->start;
        const int64_t dv = c - q->P, lo = dv > 0 ? 0 : q->W + dv, hi = dv > 0 ? dv : q->W;
        memcpy(to, src, sizeof(T) * (size_t)(q->H * q->W));
        for (int64_t j = lo; j < hi; j++) /* the columns only wrapped reads reach */
            for (int64_t r = 0; r < q->H; r++)
                to[r * q->W + j] = 0;
    }
}

/* dst (G1, W) += sum over taps k, in order, of w[k] * the tap's run of the
 * slot buf, in chunks of vectors (`uniform`: dst holds dst[0] everywhere, a
 * forward's bias, not read). A last partial chunk goes through a copy. */
AI_VECTOR_CLONES static void FN(dw_same_plane)(const same_planes *q, T *dst, const T *buf,
                                               const T *w, bool uniform)
{
    enum { VL = AI_VEC_LANES(T), NV = 4, L = NV * VL };
    const int64_t K = q->K, F = q->G1 * q->W;
    const FN(vec) init = (FN(vec)){0} + dst[0];
    for (int64_t f = 0; f < F; f += L) {
        const int64_t n = F - f < L ? F - f : L;
        T tail[L];
        T *out = n == L ? dst + f : tail;
        if (n < L)
            for (int64_t i = 0; i < n; i++)
                tail[i] = dst[f + i];
        FN(vec) acc[NV];
        for (int v = 0; v < NV; v++)
            acc[v] = uniform ? init : *(const FN(vec) *)(out + v * VL);
        for (int64_t k = 0; k < K; k++) {
            const T wk = w[k], *src = buf + q->off[k] + f;
            for (int v = 0; v < NV; v++)
                acc[v] += wk * *(const FN(vec) *)(src + v * VL);
        }
        for (int v = 0; v < NV; v++)
            *(FN(vec) *)(out + v * VL) = acc[v];
        if (n < L)
            for (int64_t i = 0; i < n; i++)
                dst[f + i] = tail[i];
    }
}

/* dw[k] += sum over positions f of dy[f] * the tap's run of slot buf (x's
 * copies): the weight gradient on same_planes. Taps in blocks of
 * DW_SAME_TAPS vector partial sums, chunks of NV vectors then single
 * vectors, lanes summed at the end; the last partial vector in scalars
 * (lanes past the plane would multiply dy's zeros by x values another tap
 * reads, Inf included). */
#define DW_SAME_TAPS 9
AI_VECTOR_CLONES static void FN(dw_same_grad)(const same_planes *q, T *dw, const T *dy,
                                              const T *buf)
{
    enum { VL = AI_VEC_LANES(T), NV = 4, L = NV * VL };
    const int64_t K = q->K, F = q->G1 * q->W, full = F / L * L, vfull = F / VL * VL;
    for (int64_t k0 = 0; k0 < K; k0 += DW_SAME_TAPS) {
        const int64_t nk = K - k0 < DW_SAME_TAPS ? K - k0 : DW_SAME_TAPS;
        FN(vec) acc[DW_SAME_TAPS];
        for (int64_t kk = 0; kk < DW_SAME_TAPS; kk++)
            acc[kk] = (FN(vec)){0};
        for (int64_t f = 0; f < full; f += L) {
            FN(vec) g[NV];
            for (int v = 0; v < NV; v++)
                g[v] = *(const FN(vec) *)(dy + f + v * VL);
            for (int64_t kk = 0; kk < nk; kk++) {
                const T *src = buf + q->off[k0 + kk] + f;
                for (int v = 0; v < NV; v++)
                    acc[kk] += g[v] * *(const FN(vec) *)(src + v * VL);
            }
        }
        for (int64_t f = full; f < vfull; f += VL) {
            const FN(vec) g = *(const FN(vec) *)(dy + f);
            for (int64_t kk = 0; kk < nk; kk++)
                acc[kk] += g * *(const FN(vec) *)(buf + q->off[k0 + kk] + f);
        }
        for (int64_t kk = 0; kk < nk; kk++) {
            const T *src = buf + q->off[k0 + kk];
            T sum = 0, tail = 0;
            for (int i = 0; i < VL; i++)
                sum += acc[kk][i];
            for (int64_t f = vfull; f < F; f++)
                tail += dy[f] * src[f];
            dw[k0 + kk] += sum + tail;
        }
    }
}

typedef struct {
    int mode; /* DW_FWD or DW_DX */
    const ai_conv_params *p;
    const phase_planes *d;
    int64_t slots;
    T *grid, *img, *w, *ws;
    const dx_phases *x; /* dw_dx_phases_range */
    const ai_conv_epilogue *ep; /* DW_FWD: applied to each plane once computed */
} FN(dw_pad_job);

/* Slots [lo, hi), each with its share of the (n, c) planes and its own
 * buffer. DW_FWD: pad x plane (n, c), then its Mg output planes. DW_DX:
 * into dx plane (n, c), the Mg dy planes of its group in order. */
static void FN(dw_pad_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(dw_pad_job) *j = ctx;
    const ai_conv_params *p = j->p;
    const int64_t C = p->C, M = p->M, Mg = M / C, NC = p->N * C, K = j->d->K;
    const int64_t IS = j->mode == DW_FWD ? j->d->H * j->d->W : j->d->G1 * j->d->G2;
    const int64_t OS = j->mode == DW_FWD ? j->d->G1 * j->d->G2 : j->d->H * j->d->W;
    const bool flat = dw_pad_flat(j->d);
    same_planes q;
    const bool same = dw_same(j->d, false, &q);
    for (int64_t s = lo; s < hi; s++) {
        T *buf = j->ws + s * (same ? q.copies * q.plane : j->d->size);
        bool zeroed = false; /* the slot's pads, once for all its planes */
        for (int64_t i = s * NC / j->slots; i < (s + 1) * NC / j->slots; i++) {
            const int64_t n = i / C, c = i % C;
            if (j->mode == DW_FWD) {
                if (same)
                    FN(dw_same_fill)(&q, buf, j->img + i * IS, zeroed);
                else
                    FN(dw_pad_fill)(j->d, buf, j->img + i * IS, zeroed);
                zeroed = true;
            }
            for (int64_t m = c * Mg; m < (c + 1) * Mg; m++) {
                T *gm = j->grid + (n * M + m) * OS;
                T *dst = j->mode == DW_FWD ? gm : j->img + i * IS;
                if (j->mode == DW_DX) {
                    if (same)
                        FN(dw_same_fill)(&q, buf, gm, zeroed);
                    else
                        FN(dw_pad_fill)(j->d, buf, gm, zeroed);
                    zeroed = true;
                }
                /* a forward's y planes hold their bias alone (fill_bias) */
                if (same)
                    FN(dw_same_plane)(&q, dst, buf, j->w + m * K, j->mode == DW_FWD);
                else if (flat)
                    FN(dw_pad_flat)(j->d, dst, buf, j->w + m * K, j->mode == DW_FWD);
                else
                    FN(dw_pad_rows)(j->d, dst, buf, j->w + m * K, j->mode == DW_FWD);
                if (j->mode == DW_FWD && j->ep)
                    FN(ep_plane)(dst, OS, j->ep, m, M);
            }
        }
    }
}

/* dw[k] += sum over output positions (o1, o2) of dy[o1][o2] * tap k's value
 * in the phase planes buf (x's): the weight gradient at any stride, row by
 * row. Taps in blocks of DW_SAME_TAPS vector partial sums over each row's
 * whole vectors, its last few positions in scalars (never a lane past the
 * row: those would read x values the tap does not), lanes summed at the end. */
AI_VECTOR_CLONES static void FN(dw_pad_grad)(const phase_planes *d, T *dw, const T *dy,
                                             const T *buf)
{
    enum { VL = AI_VEC_LANES(T) };
    const int64_t K = d->K, G1 = d->G1, G2 = d->G2, R2 = d->R2, vfull = G2 / VL * VL;
    for (int64_t k0 = 0; k0 < K; k0 += DW_SAME_TAPS) {
        const int64_t nk = K - k0 < DW_SAME_TAPS ? K - k0 : DW_SAME_TAPS;
        FN(vec) acc[DW_SAME_TAPS];
        T tail[DW_SAME_TAPS] = {0};
        for (int64_t kk = 0; kk < DW_SAME_TAPS; kk++)
            acc[kk] = (FN(vec)){0};
        for (int64_t o1 = 0; o1 < G1; o1++) {
            const T *g = dy + o1 * G2, *br = buf + o1 * R2;
            for (int64_t o2 = 0; o2 < vfull; o2 += VL) {
                const FN(vec) gv = *(const FN(vec) *)(g + o2);
                for (int64_t kk = 0; kk < nk; kk++)
                    acc[kk] += gv * *(const FN(vec) *)(br + d->base[k0 + kk] + o2);
            }
            for (int64_t kk = 0; kk < nk; kk++)
                for (int64_t o2 = vfull; o2 < G2; o2++)
                    tail[kk] += g[o2] * br[d->base[k0 + kk] + o2];
        }
        for (int64_t kk = 0; kk < nk; kk++) {
            T sum = 0;
            for (int i = 0; i < VL; i++)
                sum += acc[kk][i];
            dw[k0 + kk] += sum + tail[kk];
        }
    }
}

/* dx plane (H, W) += the phases of dy plane buf (dx_phases in conv.c, the
 * margins filled), with weights w. */
AI_VECTOR_CLONES AI_SHORT_LOOPS static void FN(dw_dx_phases)(const dx_phases *x, T *dx,
                                                             const T *buf, const T *w)
{
    enum { VL = AI_VEC_LANES(T), NV = DX_PH_LANES / AI_VEC_LANES(T) };
    int64_t off[DW_PAD_MAX_TAPS];
    T wt[DW_PAD_MAX_TAPS];
    for (int64_t a = 0; a < x->s1; a++)
        for (int64_t b = 0; b < x->s2; b++) {
            int64_t nt = 0; /* this phase's taps, in order */
            for (int64_t k = 0; k < x->K; k++)
                if (x->u[k] - floor_div(x->u[k], x->s1) * x->s1 == a &&
                    x->v[k] - floor_div(x->v[k], x->s2) * x->s2 == b) {
                    off[nt] = (x->top - floor_div(x->u[k], x->s1)) * x->R2 + x->left -
                              floor_div(x->v[k], x->s2);
                    wt[nt++] = w[k];
                }
            const int64_t Ha = (x->H - a + x->s1 - 1) / x->s1;
            const int64_t Wb = (x->W - b + x->s2 - 1) / x->s2;
            if (nt == 0 || Ha <= 0 || Wb <= 0)
                continue;
            for (int64_t i = 0; i < Ha; i++) {
                T *dr = dx + (a + x->s1 * i) * x->W + b;
                const T *br = buf + i * x->R2;
                for (int64_t j0 = 0; j0 < Wb; j0 += DX_PH_LANES) {
                    FN(vec) acc[NV];
                    for (int v = 0; v < NV; v++)
                        acc[v] = (FN(vec)){0};
                    for (int64_t t = 0; t < nt; t++)
                        for (int v = 0; v < NV; v++)
                            acc[v] += wt[t] * *(const FN(vec) *)(br + off[t] + j0 + v * VL);
                    T sums[DX_PH_LANES];
                    for (int v = 0; v < NV; v++)
                        *(FN(vec) *)(sums + v * VL) = acc[v];
                    const int64_t n = Wb - j0 < DX_PH_LANES ? Wb - j0 : DX_PH_LANES;
                    for (int64_t jj = 0; jj < n; jj++)
                        dr[(j0 + jj) * x->s2] += sums[jj];
                }
            }
        }
}

/* Slots [lo, hi) of the strided depthwise input gradient: each with its
 * share of the (n, c) dx planes and its own buffer; the Mg dy planes of a
 * group in order. */
static void FN(dw_dx_phases_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(dw_pad_job) *j = ctx;
    const ai_conv_params *p = j->p;
    const dx_phases x = *j->x;
    const int64_t C = p->C, M = p->M, Mg = M / C, NC = p->N * C, K = x.K;
    const int64_t IS = x.H * x.W, OS = x.G1 * x.G2;
    for (int64_t s = lo; s < hi; s++) {
        T *buf = j->ws + s * x.size;
        memset(buf, 0, sizeof(T) * (size_t)x.size); /* the margins, once for the slot */
        for (int64_t i = s * NC / j->slots; i < (s + 1) * NC / j->slots; i++) {
            const int64_t n = i / C, c = i % C;
            for (int64_t m = c * Mg; m < (c + 1) * Mg; m++) {
                const T *gm = j->grid + (n * M + m) * OS;
                for (int64_t r = 0; r < x.G1; r++) {
                    T *restrict to = buf + (x.top + r) * x.R2 + x.left;
                    const T *restrict from = gm + r * x.G2;
                    for (int64_t q = 0; q < x.G2; q++)
                        to[q] = from[q];
                }
                FN(dw_dx_phases)(&x, j->img + i * IS, buf, j->w + m * K);
            }
        }
    }
}

/* The weight gradient on same_planes (else on phase planes): slots [lo,
 * hi), each with its share of the channels and its own buffer; a channel's
 * images in order, so that every dw[m] is summed as serially. */
static void FN(dw_same_dw_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(dw_pad_job) *j = ctx;
    const ai_conv_params *p = j->p;
    const int64_t C = p->C, M = p->M, Mg = M / C, K = j->d->K;
    const int64_t IS = j->d->H * j->d->W, OS = j->d->G1 * j->d->G2;
    same_planes q;
    const bool same = dw_same(j->d, true, &q);
    for (int64_t s = lo; s < hi; s++) {
        T *buf = j->ws + s * (same ? q.copies * q.plane : j->d->size);
        for (int64_t c = s * C / j->slots; c < (s + 1) * C / j->slots; c++)
            for (int64_t n = 0; n < p->N; n++) {
                const T *x = j->img + (n * C + c) * IS;
                const bool zeroed = n > 0 || c > s * C / j->slots;
                if (same)
                    FN(dw_same_fill)(&q, buf, x, zeroed);
                else
                    FN(dw_pad_fill)(j->d, buf, x, zeroed);
                for (int64_t m = c * Mg; m < (c + 1) * Mg; m++) {
                    const T *dy = j->grid + (n * M + m) * OS;
                    if (same)
                        FN(dw_same_grad)(&q, j->w + m * K, dy, buf);
                    else
                        FN(dw_pad_grad)(j->d, j->w + m * K, dy, buf);
                }
            }
    }
}

/* The depthwise forward channels-last (dwl_of in conv.c): y = conv(x, w) + b,
 * then the epilogue. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const dwl_geom *q;
    T *y, *ws;
    const T *x, *w, *b;
    const ai_conv_epilogue *ep;
    bool xb, yb; /* x, y in blocked channels (conv.h): read, written unit by unit */
    /* yb: the sums into the unit's block (dwb_sums in conv.c); with xb and
     * direct_sums, those read the unit's block of x itself (no padded copy) */
    void (*blocked_sums)(const void *job, T *yu, const T *xt, const T *wt, int64_t c);
    void (*direct_sums)(const void *job, T *yu, const T *xu, const T *wt, int64_t c);
} FN(dwl_job);

/* *r = v[c, c + VL), zeros past M (and without v); a whole vector is one
 * load (lanes stored one by one and read back as a vector stall the load) */
static inline void FN(lane_vec)(FN(vec) *r, const T *v, int64_t c, int64_t M)
{
    enum { VL = AI_VEC_LANES(T) };
    if (v && c + VL <= M) {
        memcpy(r, v + c, sizeof *r);
        return;
    }
    T l[VL] = {0};
    for (int i = 0; v && i < VL && c + i < M; i++)
        l[i] = v[c + i];
    memcpy(r, l, sizeof *r);
}

/* yt (OS, DWL_UNIT) for channels [c, c + DWL_UNIT): every output position,
 * DWL_NP at a time, the taps in order, then the epilogue (as ep_apply). */
#define DWL_NP 8
AI_VECTOR_CLONES static void FN(dwl_sums)(const FN(dwl_job) *j, T *yt, const T *xt,
                                          const T *wt, int64_t c)
{
    enum { VL = AI_VEC_LANES(T), L = DWL_UNIT };
    const conv_geom *g = j->g;
    const dwl_geom *q = j->q;
    const int64_t K = q->K, OS = g->grid_size, G2 = g->grid[2], M = j->p->M;
    const int64_t rs = g->s[1] * q->Wp * L, cs = g->s[2] * L; /* an output row, column */
    const T *ab = j->ep ? j->ep->ab : NULL;
    const bool relu = j->ep && j->ep->relu;
    int64_t off[DW_PAD_MAX_TAPS];
    for (int64_t k = 0; k < K; k++)
        off[k] = q->off[k] * L;
    for (int64_t v = 0; v < L; v += VL) {
        FN(vec) bv, av, tv; /* bias, scale, shift of the lanes (0 past M) */
        FN(lane_vec)(&bv, j->b, c + v, M);
        FN(lane_vec)(&av, ab, c + v, M);
        FN(lane_vec)(&tv, ab ? ab + M : NULL, c + v, M);
        for (int64_t o = 0, o1 = 0, o2 = 0; o < OS; o += DWL_NP) {
            const T *src[DWL_NP];
            for (int i = 0; i < DWL_NP; i++) { /* positions past OS repeat the last */
                src[i] = xt + o1 * rs + o2 * cs + v;
                if (o + i + 1 < OS && ++o2 == G2)
                    o1++, o2 = 0;
            }
            FN(vec) acc[DWL_NP];
            for (int i = 0; i < DWL_NP; i++)
                acc[i] = bv;
#define DWL_TAPS(KK)                                                                   \
    _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++) {                       \
        const FN(vec) wk = *(const FN(vec) *)(wt + k * L + v);                         \
        for (int i = 0; i < DWL_NP; i++)                                               \
            acc[i] = acc[i] + wk * *(const FN(vec) *)(src[i] + off[k]);                \
    }
            if (K == 9)
                DWL_TAPS(9)
            else
                DWL_TAPS(K)
#undef DWL_TAPS
            if (ab)
                for (int i = 0; i < DWL_NP; i++)
                    acc[i] = acc[i] * av + tv;
            if (relu)
                for (int i = 0; i < DWL_NP; i++) {
#if defined(__GNUC__)
                    const __typeof__(acc[i] > 0) keep = (acc[i] > 0) | (acc[i] != acc[i]);
                    acc[i] = (FN(vec))((__typeof__(keep))acc[i] & keep);
#else
                    acc[i] = !(acc[i] > 0 || acc[i] != acc[i]) ? 0 : acc[i];
#endif
                }
            for (int i = 0; i < DWL_NP && o + i < OS; i++)
                *(FN(vec) *)(yt + (o + i) * L + v) = acc[i];
        }
    }
}

/* nc planes (nc, IS) of one image into the padded xt (rows ld apart):
 * position (i1, i2) to row (i1 + p1) Wp + i2 + p2, which must lie inside.
 * 8 positions by 8 channels at a time by shuffles. */
AI_VECTOR_CLONES static void FN(dwl_fill)(T *xt, int64_t ld, const T *xn, int64_t nc,
                                          const conv_geom *g, const dwl_geom *q)
{
    const int64_t IS = g->img_size, W = g->img[2], Wp = q->Wp;
    T *row = xt + (g->p[1] * Wp + g->p[2]) * ld; /* position (i1, 0)'s row of xt */
    int64_t f = 0, i2 = 0; /* position f = (i1, i2) */
#ifdef AI_HAVE_TRANSPOSE8
    for (; sizeof(T) == 4 && nc == 8 && f + 8 <= IS; f += 8) {
        float *d[8];
        for (int i = 0; i < 8; i++, i2++) {
            if (i2 == W)
                i2 = 0, row += Wp * ld;
            d[i] = (float *)(row + i2 * ld);
        }
        transpose8_to_f32(d, (const float *)xn + f, IS);
    }
#endif
    for (; f < IS; f++, i2++) {
        if (i2 == W)
            i2 = 0, row += Wp * ld;
        for (int64_t c = 0; c < nc; c++)
            row[i2 * ld + c] = xn[c * IS + f];
    }
}

/* The inverse of dwl_fill: x's plane xn (nc channels, IS apart) = xt's
 * positions inside the pads, or += with `add` (the depthwise backward's
 * dx); 8 positions at a time across rows, as the fill. */
AI_VECTOR_CLONES static void FN(dwl_unfill)(T *xn, const T *xt, int64_t ld, int64_t nc,
                                            const conv_geom *g, const dwl_geom *q, bool add)
{
    const int64_t IS = g->img_size, W = g->img[2], Wp = q->Wp;
    const T *row = xt + (g->p[1] * Wp + g->p[2]) * ld; /* position (i1, 0)'s row of xt */
    int64_t f = 0, i2 = 0; /* position f = (i1, i2) */
#ifdef AI_HAVE_TRANSPOSE8
    for (; sizeof(T) == 4 && nc == 8 && f + 8 <= IS; f += 8) {
        const float *s[8];
        for (int i = 0; i < 8; i++, i2++) {
            if (i2 == W)
                i2 = 0, row += Wp * ld;
            s[i] = (const float *)(row + i2 * ld);
        }
        transpose8_from_f32((float *)xn + f, IS, s, add);
    }
#endif
    for (; f < IS; f++, i2++) {
        if (i2 == W)
            i2 = 0, row += Wp * ld;
        for (int64_t c = 0; c < nc; c++)
            xn[c * IS + f] = add ? xn[c * IS + f] + row[i2 * ld + c] : row[i2 * ld + c];
    }
}

/* The units' weights (K, DWL_UNIT) after the slots, zeros past C: packed
 * once per call (per unit and part of the pool's pass, MobileNet's
 * depthwise convs on 6x6 and 3x3 planes had been slower at 2 threads than
 * at 1) */
static void FN(dwl_pack)(const FN(dwl_job) *j)
{
    enum { L = DWL_UNIT };
    const int64_t C = j->p->C, K = j->q->K;
    T *wt = j->ws + j->q->slots * j->q->slot;
    for (int64_t c = 0; c < j->q->units * L; c += L, wt += K * L) {
        memset(wt, 0, sizeof(T) * (size_t)(K * L));
        FN(transpose)(wt, L, j->w + c * K, K, C - c < L ? C - c : L, K, false);
    }
}

/* Slots [lo, hi): their share of the jobs (unit u, image n), u major */
static void FN(dwl_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(dwl_job) *j = ctx;
    const conv_geom *g = j->g;
    const dwl_geom *q = j->q;
    enum { L = DWL_UNIT };
    const int64_t C = j->p->C, N = j->p->N, K = q->K, IS = g->img_size, OS = g->grid_size;
    const int64_t H = g->img[1], W = g->img[2], p1 = g->p[1], p2 = g->p[2], XT = q->Hp * q->Wp;
    /* x's columns [i2lo, i2hi) and rows [i1lo, i1hi) land inside xt */
    const int64_t i2lo = p2 > 0 ? 0 : -p2, i2hi = q->Wp - p2 < W ? q->Wp - p2 : W;
    const int64_t i1lo = p1 > 0 ? 0 : -p1, i1hi = q->Hp - p1 < H ? q->Hp - p1 : H;
    const bool inside = p1 >= 0 && p2 >= 0 && H + p1 <= q->Hp && W + p2 <= q->Wp;
    /* with at least an image per slot, or per part of the pool's pass, a
     * slot takes its share of the images, every unit of them (units major):
     * a thread then reads the images the layer before wrote on the same
     * thread (their images), not half of them from the other core's cache
     * (KWS's blocked depthwise convs, 2 threads, had spent twice the
     * 1-thread share in the copies into xt; batch 16 has fewer images than
     * slots but more than parts: KWS's eval at 2 threads 0.88-0.90 of the
     * split by units, MobileNet's 0.95-0.98, same-process A/B) */
    const bool by_image = N >= q->slots || N >= ai_parallel_parts();
    /* slots [lo, hi) run as one, in the first one's buffers: their images,
     * or their runs of jobs, are consecutive (a unit's pads set once per
     * thread, not once per slot) */
    {
        T *xt = j->ws + lo * q->slot, *yt = xt + XT * L;
        const int64_t n0 = by_image ? lo * N / q->slots : 0;
        const int64_t ns = by_image ? hi * N / q->slots - n0 : N; /* images per unit */
        const int64_t j0 = by_image ? 0 : lo * q->jobs / q->slots;
        const int64_t j1 = by_image ? q->units * ns : hi * q->jobs / q->slots;
        for (int64_t job = j0, u = -1; job < j1; job++) {
            const int64_t c = job / ns * L, n = n0 + job % ns, nc = C - c < L ? C - c : L;
            if (job / ns != u) { /* a new unit: zero pads (and lanes past C) */
                u = job / ns;
                /* the fill writes every position inside (all lanes when
                 * the unit is whole): the pads alone */
                dw_zero_pads(xt, sizeof(T), L, q->Hp, q->Wp, H, W, p1, p2, inside && nc == L);
            }
            const T *wt = j->ws + q->slots * q->slot + u * K * L; /* dwl_pack's */
            const int64_t units = q->units;
            if (j->xb && j->direct_sums) {
                j->direct_sums(j, j->y + (n * units + u) * OS * L,
                               j->x + (n * units + u) * IS * L, wt, c);
                continue;
            }
            if (j->xb) { /* the unit's (H, W, L) block: its rows copied */
                const T *xu = j->x + (n * units + u) * IS * L;
                for (int64_t i1 = i1lo; i1 < i1hi && i2lo < i2hi; i1++)
                    memcpy(xt + ((i1 + p1) * q->Wp + i2lo + p2) * L, xu + (i1 * W + i2lo) * L,
                           sizeof(T) * (size_t)((i2hi - i2lo) * L));
            } else if (inside) {
                FN(dwl_fill)(xt, L, j->x + (n * C + c) * IS, nc, g, q);
            } else {
                const T *xn = j->x + (n * C + c) * IS;
                for (int64_t i1 = i1lo; i1 < i1hi && i2lo < i2hi; i1++)
                    FN(transpose)(xt + ((i1 + p1) * q->Wp + i2lo + p2) * L, L,
                                  xn + i1 * W + i2lo, IS, nc, i2hi - i2lo, false);
            }
            if (j->yb) { /* straight into the unit's (OS, L) block */
                j->blocked_sums(j, j->y + (n * units + u) * OS * L, xt, wt, c);
                continue;
            }
            FN(dwl_sums)(j, yt, xt, wt, c);
            FN(transpose)(j->y + (n * C + c) * OS, OS, yt, L, OS, nc, false);
        }
    }
}

/* The depthwise forward channels-last where it applies; false otherwise. */
static bool FN(dwl_forward)(const ai_conv_params *p, T *y, const T *x, const T *w, const T *b,
                            T *ws, const ai_conv_epilogue *ep)
{
    conv_geom g = conv_geom_of(p, false);
    dwl_geom q;
    if (!dwl_of(p, &g, &q, false))
        return false;
    FN(dwl_job) j = {p, &g, &q, y, ws, x, w, b, ep, false, false, NULL, NULL};
    FN(dwl_pack)(&j);
    const int64_t per_slot = q.jobs / q.slots * DWL_UNIT * (g.img_size + g.grid_size * g.ksize);
    ai_parallel_for(q.slots, ai_grain_of(per_slot), FN(dwl_range), &j);
    return true;
}

/* The depthwise backward channels-last (dwl_backward_of in conv.c): a job
 * is one unit of DWL_UNIT channels over all N images, so that the weight
 * gradient's sums run over images and positions in one order whatever the
 * threads. Per image: x's unit into xt as in the forward, dy's into dyt
 * (OS, unit); then for every output position o and tap k, the weight
 * gradient's sum k gets dy[o] x[o s + off k] (vector registers over a
 * block of rows, the blocks added in double) and the padded dxt gets w[k] dy[o] at
 * o s + off k; dxt's inside goes back into dx's planes, written or added.
 * A slot holds xt, dxt (Hp Wp positions), dyt (OS) and wt (K), by units. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const dwl_geom *q;
    T *dx, *dw, *ws;
    const T *dy, *x, *w;
    int64_t slots, slot;
    bool assign;
} FN(dwlb_job);

/* One image of a unit, vector by vector: the weight gradient's sums (added
 * to dsum), then dy's scatter into dxt. */
#define DWLB_BLOCK 256
AI_VECTOR_CLONES static void FN(dwlb_image)(const FN(dwlb_job) *j, T *dxt, const T *xt,
                                            const T *dyt, const T *wt, double *dsum, int nc)
{
    enum { VL = AI_VEC_LANES(T), L = DWL_UNIT };
    const conv_geom *g = j->g;
    const dwl_geom *q = j->q;
    const int64_t K = q->K, G1 = g->grid[1], G2 = g->grid[2];
    const int64_t rs = g->s[1] * q->Wp * L, cs = g->s[2] * L; /* an output row, column */
    const int64_t rows = G2 < DWLB_BLOCK ? DWLB_BLOCK / G2 : 1;
    int64_t off[DW_PAD_MAX_TAPS];
    for (int64_t k = 0; k < K; k++)
        off[k] = q->off[k] * L;
    for (int64_t v = 0; v < L && v < nc; v += VL) {
        /* the weight gradient's sums: float lanes over blocks of output rows
         * of about DWLB_BLOCK positions, added in double */
        for (int64_t r0 = 0; j->dw && r0 < G1; r0 += rows) {
            const int64_t r1 = r0 + rows < G1 ? r0 + rows : G1;
            FN(vec) acc[DW_PAD_MAX_TAPS];
            for (int64_t k = 0; k < K; k++)
                acc[k] = (FN(vec)){0};
#define DWLB_SUMS(KK)                                                                  \
    for (int64_t o1 = r0; o1 < r1; o1++)                                               \
        for (int64_t o2 = 0; o2 < G2; o2++) {                                          \
            const FN(vec) d = *(const FN(vec) *)(dyt + (o1 * G2 + o2) * L + v);        \
            const T *xs = xt + o1 * rs + o2 * cs + v;                                  \
            _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++)                 \
                acc[k] = acc[k] + d * *(const FN(vec) *)(xs + off[k]);                 \
        }
            if (K == 9)
                DWLB_SUMS(9)
            else
                DWLB_SUMS(K)
#undef DWLB_SUMS
            for (int64_t k = 0; k < K; k++) {
                T lanes[VL];
                memcpy(lanes, &acc[k], sizeof lanes);
                for (int l = 0; l < VL && v + l < nc; l++)
                    dsum[k * L + v + l] += (double)lanes[l];
            }
        }
        if (j->dx) {
            FN(vec) wk[DW_PAD_MAX_TAPS];
            for (int64_t k = 0; k < K; k++)
                wk[k] = *(const FN(vec) *)(wt + k * L + v);
#define DWLB_SCATTER(KK)                                                               \
    for (int64_t o1 = 0, o = 0; o1 < G1; o1++)                                         \
        for (int64_t o2 = 0; o2 < G2; o2++, o++) {                                     \
            const FN(vec) d = *(const FN(vec) *)(dyt + o * L + v);                     \
            T *ds = dxt + o1 * rs + o2 * cs + v;                                       \
            _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++) {               \
                FN(vec) *t = (FN(vec) *)(ds + off[k]);                                 \
                *t = *t + wk[k] * d;                                                   \
            }                                                                          \
        }
            if (K == 9)
                DWLB_SCATTER(9)
            else
                DWLB_SCATTER(K)
#undef DWLB_SCATTER
        }
    }
}

/* Slots [lo, hi): each its share of the units, all images of each */
static void FN(dwlb_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(dwlb_job) *j = ctx;
    const conv_geom *g = j->g;
    const dwl_geom *q = j->q;
    enum { L = DWL_UNIT };
    const int64_t C = j->p->C, N = j->p->N, K = q->K, IS = g->img_size, OS = g->grid_size;
    const int64_t XT = q->Hp * q->Wp;
    double dsum[DW_PAD_MAX_TAPS * L];
    for (int64_t s = lo; s < hi; s++) {
        T *xt = j->ws + s * j->slot, *dxt = xt + XT * L, *dyt = dxt + XT * L, *wt = dyt + OS * L;
        for (int64_t u = s * q->units / j->slots; u < (s + 1) * q->units / j->slots; u++) {
            const int64_t c = u * L;
            const int nc = (int)(C - c < L ? C - c : L);
            memset(dsum, 0, sizeof(double) * (size_t)(K * L));
            memset(xt, 0, sizeof(T) * (size_t)(XT * L)); /* pads and lanes past C */
            memset(dyt, 0, sizeof(T) * (size_t)(OS * L));
            memset(wt, 0, sizeof(T) * (size_t)(K * L));
            FN(transpose)(wt, L, j->w + c * K, K, nc, K, false);
            for (int64_t n = 0; n < N; n++) {
                if (j->dw) /* (the input gradient needs no x) */
                    FN(dwl_fill)(xt, L, j->x + (n * C + c) * IS, nc, g, q);
                FN(transpose)(dyt, L, j->dy + (n * C + c) * OS, OS, nc, OS, false);
                if (j->dx)
                    memset(dxt, 0, sizeof(T) * (size_t)(XT * L));
                FN(dwlb_image)(j, dxt, xt, dyt, wt, dsum, nc);
                if (j->dx)
                    FN(dwl_unfill)(j->dx + (n * C + c) * IS, dxt, L, nc, g, q, !j->assign);
            }
            if (j->dw)
                for (int ch = 0; ch < nc; ch++)
                    for (int64_t k = 0; k < K; k++)
                        j->dw[(c + ch) * K + k] += (T)dsum[k * L + ch];
        }
    }
}

/* The depthwise backward channels-last where it applies (dx and/or dw; NULL
 * skips one); false otherwise. */
static bool FN(dwl_backward)(const ai_conv_params *p, T *dx, T *dw, const T *dy, const T *x,
                             const T *w, T *ws, bool assign)
{
    conv_geom g = conv_geom_of(p, false);
    dwl_geom q;
    int64_t slots, slot;
    if (!dwl_backward_of(p, &g, &q, &slots, &slot))
        return false;
    FN(dwlb_job) j = {p, &g, &q, dx, dw, ws, dy, x, w, slots, slot, assign};
    ai_parallel_for(slots, 1, FN(dwlb_range), &j);
    return true;
}

/* Depthwise conv (one input channel per group, Mg output channels each):
 * DW_FWD (where dwl_forward declines): grid = y, img = x; DW_DX: grid = dy,
 * img = dx; DW_DW: grid = dy, img = x, w = dw. Plane by plane through slots of `ws` (weight gradient:
 * same_planes or phase planes; strided input gradient: dx_phases; else
 * phase planes, rows or flat runs); small planes (depthwise_small_planes)
 * and what none of them takes, channels-last; else the plain per-plane
 * kernels. Threads split the slots: every output
 * element, dw included, is computed by one thread in a fixed order. */
static void FN(depthwise)(int mode, const ai_conv_params *p, T *grid, T *img, T *w, T *ws,
                          const ai_conv_epilogue *ep)
{
    FN(dw_job) j = {mode, p, conv_geom_of(p, false), grid, img, w, ws, ep};
    const int64_t per_channel = p->N * (j.g.img_size + j.g.grid_size * (p->M / p->C)) *
                                j.g.ksize;
    if (depthwise_small_planes(p, &j.g)) {
        ai_parallel_for((p->C + 15) / 16, ai_grain_of(16 * per_channel), FN(dw_last_range), &j);
        return;
    }
    phase_planes d;
    if (mode == DW_DW && dw_pad_of(p, &j.g, false, &d)) {
        FN(dw_pad_job) pj = {mode, p, &d, p->C < DW_PAD_SLOTS ? p->C : DW_PAD_SLOTS,
                             grid, img, w, ws, NULL, NULL};
        const int64_t per_slot = per_channel * (p->C / pj.slots);
        ai_parallel_for(pj.slots, ai_grain_of(per_slot), FN(dw_same_dw_range), &pj);
        return;
    }
    dx_phases x;
    if (mode == DW_DX && dx_phases_of(&j.g, &x)) {
        FN(dw_pad_job) pj = {mode, p, NULL, dw_pad_slots(p), grid, img, w, ws, &x, NULL};
        const int64_t per_slot = per_channel / p->N * (p->N * p->C / pj.slots);
        ai_parallel_for(pj.slots, ai_grain_of(per_slot), FN(dw_dx_phases_range), &pj);
        return;
    }
    if (mode != DW_DW && dw_pad_of(p, &j.g, mode == DW_DX, &d)) {
        FN(dw_pad_job) pj = {mode, p, &d, dw_pad_slots(p), grid, img, w, ws, NULL, ep};
        const int64_t per_slot = per_channel / p->N * (p->N * p->C / pj.slots);
        ai_parallel_for(pj.slots, ai_grain_of(per_slot), FN(dw_pad_range), &pj);
        return;
    }
    if (!depthwise_channels_last(p, &j.g)) {
        if (mode == DW_DW)
            ai_parallel_for(p->M, ai_grain_of(per_channel), FN(dw_planes_range), &j);
        else
            ai_parallel_for(p->N * p->C, ai_grain_of(per_channel / p->N), FN(dw_planes_range),
                            &j);
        return;
    }
    ai_parallel_for((p->C + 15) / 16, ai_grain_of(16 * per_channel), FN(dw_last_range), &j);
}

/* The shifted-GEMM conv (conv_shift_of in conv.c). Buffers in ws: xp (C,
 * span) padded x, grid (M, span), dxp (C, span) padded dx, wt and dwt (K, M,
 * Cg) with wt[k][m][c] = w[m][c][k]. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const conv_shift *sh;
    int64_t Cg, Mg;
    T *xp, *grid, *dxp, *wt, *dwt;
} FN(shift_bufs);

static FN(shift_bufs) FN(shift_bufs_of)(const ai_conv_params *p, const conv_geom *g,
                                        const conv_shift *sh, T *ws)
{
    FN(shift_bufs) s = {.p = p, .g = g, .sh = sh, .Cg = p->C / p->group,
                        .Mg = p->M / p->group, .xp = ws};
    s.grid = s.xp + p->C * sh->span;
    s.dxp = s.grid + p->M * sh->span;
    s.wt = s.dxp + p->C * sh->span;
    s.dwt = s.wt + g->ksize * p->M * s.Cg;
    return s;
}

/* A chunk of images n0 .. n0+cnt of the shifted conv, for the pool's ranges. */
typedef struct {
    const FN(shift_bufs) *s;
    const T *src, *b;
    const ai_conv_epilogue *ep; /* forward: applied to y's values as they are stored */
    T *dst;
    int64_t n0, cnt, cols;
    bool add;    /* shift_pad_range direction: planes src added into the image dst */
    bool assign; /* with add: copied (=) instead */
} FN(shift_job);

/* Planes [lo, hi) of the chunk's (image, channel) planes: src (N, C, image)
 * into the interiors of the padded planes dst (C, span) (the padding is left
 * as it is: zero), or with `add` the interiors of the padded planes src into
 * dst (N, C, image) +=. */
static void FN(shift_pad_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(shift_job) *j = ctx;
    const FN(shift_bufs) *s = j->s;
    const conv_geom *g = s->g;
    int64_t C = s->p->C, W = g->img[2];
    for (int64_t ic = lo; ic < hi; ic++) {
        int64_t i = ic / C, c = ic % C;
        T *image = (T *)(j->add ? j->dst : j->src) + ((j->n0 + i) * C + c) * g->img_size;
        T *plane = (T *)(j->add ? j->src : j->dst) + c * s->sh->span + i * s->sh->PS +
                   g->p[1] * s->sh->Q2 + g->p[2];
        for (int64_t i1 = 0; i1 < g->img[1]; i1++, image += W, plane += s->sh->Q2)
            if (!j->add)
                memcpy(plane, image, sizeof(T) * (size_t)W);
            else if (j->assign)
                memcpy(image, plane, sizeof(T) * (size_t)W);
            else
                for (int64_t e = 0; e < W; e++)
                    image[e] += plane[e];
    }
}

static void FN(shift_pad)(FN(shift_job) *j)
{
    int64_t planes = j->cnt * j->s->p->C;
    ai_parallel_for(planes, 1 + (1 << 14) / j->s->g->img_size, FN(shift_pad_range), j);
}

/* The operand of tap k for group grp: its padded plane rows, from off_k on. */
static T *FN(shift_operand)(const FN(shift_bufs) *s, T *planes, int64_t grp, int64_t k)
{
    const conv_geom *g = s->g;
    return planes + grp * s->Cg * s->sh->span + k / g->k[2] * g->d[1] * s->sh->Q2 +
           k % g->k[2] * g->d[2];
}

/* Columns [c0, c1) of the output grid of group grp (all its taps), then
 * their valid positions into y (+ bias): the block is still in cache. */
static void FN(shift_fwd_block)(const FN(shift_job) *j, int64_t grp, int64_t c0, int64_t c1)
{
    const FN(shift_bufs) *s = j->s;
    const conv_shift *sh = s->sh;
    const conv_geom *g = s->g;
    int64_t M = s->p->M, Cg = s->Cg, Mg = s->Mg, span = sh->span;
    for (int64_t k = 0; k < g->ksize; k++)
        GEMM(false, false, Mg, c1 - c0, Cg, 1, s->wt + (k * M + grp * Mg) * Cg, Cg,
             FN(shift_operand)(s, s->xp, grp, k) + c0, span, k ? 1 : 0,
             s->grid + grp * Mg * span + c0, span);
    for (int64_t col = c0; col < c1;) { /* one grid row segment at a time */
        int64_t i = col / sh->PS, rem = col - i * sh->PS;
        int64_t o1 = rem / sh->Q2, o2 = rem % sh->Q2;
        int64_t seg = sh->Q2 - o2 < c1 - col ? sh->Q2 - o2 : c1 - col;
        seg = seg < sh->PS - rem ? seg : sh->PS - rem; /* the plane's tail ends a row */
        int64_t n = o1 < g->grid[1] && o2 < g->grid[2]
                        ? (g->grid[2] - o2 < seg ? g->grid[2] - o2 : seg) : 0;
        for (int64_t m = grp * Mg; m < (grp + 1) * Mg && n > 0; m++) {
            const T bias = j->b ? j->b[m] : 0, *gr = s->grid + m * span + col;
            T *yr = j->dst + ((j->n0 + i) * M + m) * g->grid_size + o1 * g->grid[2] + o2;
            FN(ep_apply)(yr, gr, n, &bias, j->ep, m, M);
        }
        col += seg;
    }
}

static void FN(shift_fwd_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(shift_job) *j = ctx;
    int64_t cb = j->s->sh->cb, blocks = (j->cols + cb - 1) / cb;
    for (int64_t item = lo; item < hi; item++) {
        int64_t grp = item / blocks, c0 = item % blocks * cb;
        FN(shift_fwd_block)(j, grp, c0, c0 + cb < j->cols ? c0 + cb : j->cols);
    }
}

static void FN(shift_forward)(const ai_conv_params *p, const conv_geom *g,
                              const conv_shift *sh, T *y, const T *x, const T *w,
                              const T *b, T *ws, const ai_conv_epilogue *ep)
{
    FN(shift_bufs) s = FN(shift_bufs_of)(p, g, sh, ws);
    int64_t K = g->ksize, M = p->M, Cg = s.Cg;
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t k = 0; k < K; k++)
                s.wt[(k * M + m) * Cg + c] = w[(m * Cg + c) * K + k];
    memset(s.xp, 0, sizeof(T) * (size_t)(p->C * sh->span));
    for (int64_t n0 = 0; n0 < p->N; n0 += sh->nb) {
        FN(shift_job) j = {.s = &s, .src = x, .b = b, .ep = ep, .dst = s.xp, .n0 = n0,
                           .cnt = p->N - n0 < sh->nb ? p->N - n0 : sh->nb};
        j.cols = (j.cnt - 1) * sh->PS + sh->L;
        FN(shift_pad)(&j);
        j.dst = y;
        ai_parallel_for(p->group * ((j.cols + sh->cb - 1) / sh->cb), 1, FN(shift_fwd_range),
                        &j);
    }
}

/* dx += conv's data gradient (= with assign_dx), dw += its weight gradient
 * (either may be NULL): per tap, dxp[off_k:] += W_k^T @ grid(dy), dW_k +=
 * grid(dy) @ xp[off_k:]^T; the junk columns of grid(dy) are zero, so they add
 * nothing. */
static void FN(shift_backward)(const ai_conv_params *p, const conv_geom *g,
                               const conv_shift *sh, T *dx, T *dw, const T *dy,
                               const T *x, const T *w, T *ws, bool assign_dx)
{
    FN(shift_bufs) s = FN(shift_bufs_of)(p, g, sh, ws);
    int64_t K = g->ksize, M = p->M, Cg = s.Cg, Mg = s.Mg, OS = g->grid_size;
    size_t planes = sizeof(T) * (size_t)(p->C * sh->span);
    for (int64_t m = 0; dx && m < M; m++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t k = 0; k < K; k++)
                s.wt[(k * M + m) * Cg + c] = w[(m * Cg + c) * K + k];
    if (dw) {
        memset(s.dwt, 0, sizeof(T) * (size_t)(K * M * Cg));
        memset(s.xp, 0, planes);
    }
    memset(s.grid, 0, sizeof(T) * (size_t)(M * sh->span));
    for (int64_t n0 = 0; n0 < p->N; n0 += sh->nb) {
        int64_t cnt = p->N - n0 < sh->nb ? p->N - n0 : sh->nb;
        int64_t cols = (cnt - 1) * sh->PS + sh->L;
        for (int64_t i = 0; i < cnt; i++)
            for (int64_t m = 0; m < M; m++) {
                const T *dr = dy + ((n0 + i) * M + m) * OS;
                T *gr = s.grid + m * sh->span + i * sh->PS;
                for (int64_t o1 = 0; o1 < g->grid[1]; o1++, dr += g->grid[2], gr += sh->Q2)
                    memcpy(gr, dr, sizeof(T) * (size_t)g->grid[2]);
            }
        if (dw) {
            FN(shift_job) j = {.s = &s, .src = x, .dst = s.xp, .n0 = n0, .cnt = cnt};
            FN(shift_pad)(&j);
            for (int64_t grp = 0; grp < p->group; grp++)
                for (int64_t k = 0; k < K; k++)
                    GEMM(false, true, Mg, Cg, cols, 1, s.grid + grp * Mg * sh->span,
                         sh->span, FN(shift_operand)(&s, s.xp, grp, k), sh->span, 1,
                         s.dwt + (k * M + grp * Mg) * Cg, Cg);
        }
        if (dx) {
            memset(s.dxp, 0, planes);
            for (int64_t grp = 0; grp < p->group; grp++)
                for (int64_t c0 = 0; c0 < cols; c0 += sh->cb)
                    for (int64_t k = 0; k < K; k++)
                        GEMM(true, false, Cg, cols - c0 < sh->cb ? cols - c0 : sh->cb, Mg, 1,
                             s.wt + (k * M + grp * Mg) * Cg, Cg,
                             s.grid + grp * Mg * sh->span + c0, sh->span, 1,
                             FN(shift_operand)(&s, s.dxp, grp, k) + c0, sh->span);
            FN(shift_job) j = {.s = &s, .src = s.dxp, .dst = dx, .n0 = n0, .cnt = cnt,
                               .add = true, .assign = assign_dx};
            FN(shift_pad)(&j);
        }
    }
    for (int64_t m = 0; dw && m < M; m++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t k = 0; k < K; k++)
                dw[(m * Cg + c) * K + k] += s.dwt[(k * M + m) * Cg + c];
}

/* Image n of the GEMM forward: its bias (with `bias`), each group's
 * product added to it (columns in ws: not used by pointwise convs), the
 * epilogue, while the image's planes are in cache. */
static void FN(gemm_image)(const ai_conv_params *p, const conv_geom *g, T *y, const T *x,
                           const T *w, const T *b, T *ws, const ai_conv_epilogue *ep,
                           int64_t n, bool bias)
{
    const int64_t Cg = p->C / p->group, Mg = p->M / p->group, rows = Cg * g->ksize;
    const int64_t OS = g->grid_size;
    T *yn = y + n * p->M * OS;
    if (bias)
        FN(fill_bias)(yn, b, 1, p->M, OS);
    for (int64_t grp = 0; grp < p->group; grp++) {
        const T *col = FN(columns)(ws, x + (n * p->C + grp * Cg) * g->img_size, Cg, g);
        GEMM(false, false, Mg, OS, rows, 1, w + grp * Mg * rows, rows, col, OS, 1,
             yn + grp * Mg * OS, OS);
    }
    if (ep) {
        FN(ep_job) j = {yn, NULL, ep, p->M, OS};
        ai_parallel_for(p->M, ai_grain_of(OS), FN(ep_range), &j);
    }
}

/* Pointwise forwards, image by image on the pool (pw_images in conv.c):
 * nested in a range, each image's passes and GEMM run on its thread. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    T *y;
    const T *x, *w, *b;
    const ai_conv_epilogue *ep;
} FN(pw_images_job);

static void FN(pw_images_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(pw_images_job) *j = ctx;
    for (int64_t n = lo; n < hi; n++)
        FN(gemm_image)(j->p, j->g, j->y, j->x, j->w, j->b, NULL, j->ep, n, true);
}

/* The pointwise backward of pw_small (conv.c) in one pass of the pool:
 * its items are the weight gradient's panels of PW_DW_ROWS rows, each
 * summed over the images in order (split by output elements, never inside
 * a sum: the same values at any thread count), then dx image by image
 * (each image's GEMM on its thread). Panels of 64 rows, not 32: KWS's
 * 64 -> 64 on 25x5 (C harness, 1 thread) 186-200 us against 212-247, its
 * training step 0.98 of the time (same-process A/B); at 2 threads the
 * other thread takes the images' dx meanwhile (in two passes, the weight
 * gradient in one 64-row panel would leave it idle). Panels of 16 rows,
 * which the skinny GEMM takes, had made KWS's step 5% slower at 1 thread. */
#define PW_DW_ROWS 64
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    T *dx, *dw;
    const T *dy, *x, *w;
    int64_t panels; /* items [0, panels): dw's panels; then dx's images */
    bool assign_dx;
} FN(pw_images_bwd_job);

static void FN(pw_images_bwd_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(pw_images_bwd_job) *j = ctx;
    const int64_t C = j->p->C, M = j->p->M, S = j->g->grid_size;
    for (int64_t item = lo; item < hi; item++) {
        if (item < j->panels) {
            const int64_t m0 = item * PW_DW_ROWS;
            const int64_t rows = M - m0 < PW_DW_ROWS ? M - m0 : PW_DW_ROWS;
            for (int64_t n = 0; n < j->p->N; n++)
                GEMM(false, true, rows, C, S, 1, j->dy + (n * M + m0) * S, S,
                     j->x + n * C * S, S, 1, j->dw + m0 * C, C);
            continue;
        }
        const int64_t n = item - j->panels;
        GEMM(true, false, C, S, M, 1, j->w, C, j->dy + n * M * S, S, j->assign_dx ? 0 : 1,
             j->dx + n * C * S, S);
    }
}

/* y (N, M, out) = conv(x (N, C, in), w (M, Cg, kernel)) + b (M).
 * Per batch item and group: y_g (Mg, OS) += w_g (Mg, Cg*K) @ cols(x_g) (Cg*K, OS). */
void FN(ai_conv_forward)(const ai_conv_params *p, T *y, const T *x, const T *w,
                         const T *b, T *workspace, const ai_conv_epilogue *ep)
{
    conv_geom g = conv_geom_of(p, false);
    const int64_t OS = g.grid_size;
    conv_shift sh;
    if (FN(dconv_forward)(p, y, x, w, b, workspace, ep))
        return;
    if (conv_shift_of(p, &g, &sh)) {
        FN(shift_forward)(p, &g, &sh, y, x, w, b, workspace, ep);
        return;
    }
    if (conv_depthwise(p)) { /* the kernels only read x and w in this mode */
        if (FN(dwn_forward)(p, y, x, w, b, ep) || FN(dwl_forward)(p, y, x, w, b, workspace, ep))
            return;
        if (dw_forward_reads_planes(p, &g))
            FN(fill_bias)(y, b, p->N, p->M, OS);
        else /* the kernels read each plane's first element alone (MobileNet eval: the
              * whole planes' fill was 1.2% of the time) */
            for (int64_t nm = 0; OS > 0 && nm < p->N * p->M; nm++)
                y[nm * OS] = b ? b[nm % p->M] : 0;
        FN(depthwise)(DW_FWD, p, y, (T *)x, (T *)w, workspace, ep);
        return;
    }
    if (pw_batched(p, &g)) {
        const int64_t NS = p->N * OS;
        T *xs = workspace, *ys = workspace + p->C * NS;
        FN(cols_job) gj = {.dst = xs, .src = x, .N = p->N, .M = p->C, .S = OS};
        ai_parallel_for(p->N * p->C, ai_grain_of(OS), FN(pw_gather_range), &gj);
        GEMM(false, false, p->M, NS, p->C, 1, w, p->C, xs, NS, 0, ys, NS);
        FN(pw_scatter_job) sj = {y, ys, b, ep, p->N, p->M, OS};
        ai_parallel_for(p->N * p->M, ai_grain_of(OS), FN(pw_scatter_range), &sj);
        return;
    }
    if (pw_images(p, &g)) {
        FN(pw_images_job) j = {p, &g, y, x, w, b, ep};
        ai_parallel_for(p->N, 1, FN(pw_images_range), &j);
        return;
    }
    /* with an epilogue, the bias image by image (in cache for the epilogue) */
    if (!ep)
        FN(fill_bias)(y, b, p->N, p->M, OS);
    for (int64_t n = 0; n < p->N; n++)
        FN(gemm_image)(p, &g, y, x, w, b, workspace, ep, n, ep != NULL);
}

/* The image groups of cols_groups_of (conv.c), in `parts` runs of
 * consecutive groups (one at one thread): workspace slots of columns (C K,
 * OS), one per run, then one weight gradient (M, C K) per group. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    T *dx, *dw, *ws;
    const T *dy, *x, *w;
    int64_t groups, parts;
    bool assign_dx;
} FN(cols_groups_job);

static void FN(cols_groups_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(cols_groups_job) *j = ctx;
    const ai_conv_params *p = j->p;
    const conv_geom *g = j->g;
    const int64_t OS = g->grid_size, IS = g->img_size, rows = p->C * g->ksize;
    for (int64_t q = lo; q < hi; q++) {
        T *cols = j->ws + q * rows * OS;
        for (int64_t u = q * j->groups / j->parts; u < (q + 1) * j->groups / j->parts; u++) {
            T *dwg = j->ws + j->groups * rows * OS + u * p->M * rows;
            const int64_t n0 = u * p->N / j->groups, n1 = (u + 1) * p->N / j->groups;
            for (int64_t n = n0; n < n1; n++) {
                const T *dyn = j->dy + n * p->M * OS;
                if (j->dw) {
                    FN(im2col_rows)(cols, j->x + n * p->C * IS, g, 0, rows, OS);
                    GEMM(false, true, p->M, rows, OS, 1, dyn, OS, cols, OS, n == n0 ? 0 : 1,
                         dwg, rows);
                }
                if (j->dx) {
                    T *dxn = j->dx + n * p->C * IS;
                    GEMM(true, false, rows, OS, p->M, 1, j->w, rows, dyn, OS, 0, cols, OS);
                    if (j->assign_dx) /* col2im adds overlapping windows */
                        memset(dxn, 0, sizeof(T) * (size_t)(p->C * IS));
                    FN(col2im_channels)(dxn, cols, g, 0, p->C, OS);
                }
            }
        }
    }
}

/* dw elements [lo, hi) += each group's, in group order */
static void FN(cols_groups_sum_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(cols_groups_job) *j = ctx;
    const int64_t rows = j->p->C * j->g->ksize, size = j->p->M * rows;
    const T *dwg = j->ws + j->groups * rows * j->g->grid_size;
    for (int64_t u = 0; u < j->groups; u++)
        for (int64_t e = lo; e < hi; e++)
            j->dw[e] += dwg[u * size + e];
}

static void FN(cols_groups_backward)(const ai_conv_params *p, const conv_geom *g,
                                     int64_t groups, T *dx, T *dw, const T *dy, const T *x,
                                     const T *w, T *ws, bool assign_dx)
{
    const int64_t parts = ai_parallel_parts() < groups ? ai_parallel_parts() : groups;
    FN(cols_groups_job) j = {p, g, dx, dw, ws, dy, x, w, groups, parts, assign_dx};
    ai_parallel_for(parts, 1, FN(cols_groups_range), &j);
    if (dw)
        ai_parallel_for(p->M * p->C * g->ksize, ai_grain_of(groups), FN(cols_groups_sum_range),
                        &j);
}

/* With assign_dx, dx is written (=), not added to; dx and dw may then be one
 * buffer (a value that is both x and w): zeroed once, then added to. */
static bool FN(zero_dx_if_shared)(const ai_conv_params *p, T *dx, const T *dw, bool assign_dx)
{
    if (!assign_dx || !dx || dx != dw)
        return assign_dx;
    int64_t n = p->N * p->C; /* dx has x's shape */
    for (int d = 0; d < p->nsp; d++)
        n *= p->in[d];
    memset(dx, 0, sizeof(T) * (size_t)n);
    return false;
}

/* dx (N, C, in) += w_g^T @ dy_g through col2im; dw (M, Cg, kernel) +=
 * dy_g @ cols(x_g)^T; db (M) += sum of dy. NULL gradients are skipped. */
void FN(ai_conv_backward)(const ai_conv_params *p, T *dx, T *dw, T *db, const T *dy,
                          const T *x, const T *w, T *workspace, bool assign_dx)
{
    conv_geom g = conv_geom_of(p, false);
    int64_t Cg = p->C / p->group, Mg = p->M / p->group, rows = Cg * g.ksize;
    int64_t IS = g.img_size, OS = g.grid_size;
    conv_shift sh;
    assign_dx = FN(zero_dx_if_shared)(p, dx, dw, assign_dx);
    if (dx && FN(dconv_dx)(p, dx, dy, w, workspace, assign_dx))
        dx = NULL; /* done: the paths below compute dw and db alone */
    if (dw && !dx && FN(pwb_cols_dw)(p, dw, dy, x, workspace))
        dw = NULL;
    if (dw && !dx && FN(dconv_dw)(p, dw, dy, x, workspace))
        dw = NULL; /* (with dx left to them, they compute both in one pass) */
    if ((dx || dw) && pw_batched(p, &g)) { /* as the forward: one GEMM per gradient */
        const int64_t NS = p->N * OS;
        T *dys = workspace, *xs = workspace + p->M * NS; /* xs: then dx's (C, N OS) */
        FN(cols_job) gj = {.dst = dys, .src = dy, .N = p->N, .M = p->M, .S = OS};
        ai_parallel_for(p->N * p->M, ai_grain_of(OS), FN(pw_gather_range), &gj);
        if (dw) {
            FN(cols_job) xj = {.dst = xs, .src = x, .N = p->N, .M = p->C, .S = OS};
            ai_parallel_for(p->N * p->C, ai_grain_of(OS), FN(pw_gather_range), &xj);
            GEMM(false, true, p->M, p->C, NS, 1, dys, NS, xs, NS, 1, dw, p->C);
        }
        if (dx) {
            GEMM(true, false, p->C, NS, p->M, 1, w, p->C, dys, NS, 0, xs, NS);
            FN(pw_scatter_dx_job) sj = {dx, xs, p->N, p->C, OS, assign_dx};
            ai_parallel_for(p->N * p->C, ai_grain_of(OS), FN(pw_scatter_dx_range), &sj);
        }
        dx = dw = NULL; /* done: db below */
    }
    if (dw && dx != dw && FN(pwb_dw)(p, dw, dy, x, workspace))
        dw = NULL; /* done: dx (and db) below */
    if (dx && assign_dx && FN(pwb_dx)(p, dx, dy, w, workspace))
        dx = NULL;
    if ((dx || dw) && pw_small(p, &g)) {
        const int64_t panels = dw ? (p->M + PW_DW_ROWS - 1) / PW_DW_ROWS : 0;
        FN(pw_images_bwd_job) j = {p, &g, dx, dw, dy, x, w, panels, assign_dx};
        if (dx == dw) { /* one buffer (zeroed above): the two sums in turn */
            ai_parallel_for(panels, 1, FN(pw_images_bwd_range), &j);
            j.panels = 0;
        }
        ai_parallel_for(j.panels + (dx ? p->N : 0), 1, FN(pw_images_bwd_range), &j);
        dx = dw = NULL; /* done: db below */
    }
    if (conv_shift_of(p, &g, &sh)) {
        if (dx || dw)
            FN(shift_backward)(p, &g, &sh, dx, dw, dy, x, w, workspace, assign_dx);
        if (db)
            FN(bias_backward)(db, dy, p->N, p->M, OS);
        return;
    }
    if (conv_depthwise(p) && dx && dx != dw && FN(dwn_dx)(p, dx, dy, w, assign_dx))
        dx = NULL; /* done: dw below */
    if (conv_depthwise(p) && (dx || dw) &&
        FN(dwl_backward)(p, dx, dw, dy, x, w, workspace, assign_dx))
        dx = dw = NULL; /* done: db below */
    if (conv_depthwise(p) && dx && assign_dx) /* DW_DX adds overlapping windows */
        memset(dx, 0, sizeof(T) * (size_t)(p->N * p->C * IS));
    if (conv_depthwise(p)) { /* dy, x and w are only read in these modes */
        if (dw)
            FN(depthwise)(DW_DW, p, (T *)dy, (T *)x, dw, workspace, NULL);
        if (dx)
            FN(depthwise)(DW_DX, p, (T *)dy, dx, (T *)w, workspace, NULL);
    }
    const int64_t groups =
        (dx || dw) && !conv_depthwise(p) ? cols_groups_of(p, &g, sizeof(T) == 4 ? AI_F32 : AI_F64)
                                         : 0;
    if (groups) {
        FN(cols_groups_backward)(p, &g, groups, dx, dw, dy, x, w, workspace, assign_dx);
        dx = dw = NULL; /* done: db below */
    }
    for (int64_t n = 0; n < p->N && !conv_depthwise(p) && (dx || dw); n++)
        for (int64_t grp = 0; grp < p->group; grp++) {
            const T *dyg = dy + (n * p->M + grp * Mg) * OS;
            int64_t xoff = (n * p->C + grp * Cg) * IS;
            if (dw) {
                const T *col = FN(columns)(workspace, x + xoff, Cg, &g);
                GEMM(false, true, Mg, rows, OS, 1, dyg, OS, col, OS, 1,
                     dw + grp * Mg * rows, rows);
            }
            if (dx)
                FN(gemm_col2im)(dx + xoff, w + grp * Mg * rows, dyg, Mg, Cg, workspace, &g,
                                assign_dx);
        }
    if (db)
        FN(bias_backward)(db, dy, p->N, p->M, OS);
}

/* y (N, M, out) = convtranspose(x (N, C, in), w (C, Mg, kernel)) + b (M).
 * Per batch item and group: y_g (Mg, OS) += col2im(w_g^T @ x_g), w_g (Cg, Mg*K),
 * x_g (Cg, IS). */
void FN(ai_convtranspose_forward)(const ai_conv_params *p, T *y, const T *x,
                                  const T *w, const T *b, T *workspace)
{
    conv_geom g = conv_geom_of(p, true);
    int64_t Cg = p->C / p->group, Mg = p->M / p->group, rows = Mg * g.ksize;
    int64_t IS = g.grid_size, OS = g.img_size;
    FN(fill_bias)(y, b, p->N, p->M, OS);
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t grp = 0; grp < p->group; grp++)
            FN(gemm_col2im)(y + (n * p->M + grp * Mg) * OS, w + grp * Cg * rows,
                            x + (n * p->C + grp * Cg) * IS, Cg, Mg, workspace, &g, false);
}

/* dx (N, C, in) += w_g @ cols(dy_g) (= with assign_dx); dw (C, Mg, kernel) +=
 * x_g @ cols(dy_g)^T; db (M) += sum of dy. NULL gradients are skipped. */
void FN(ai_convtranspose_backward)(const ai_conv_params *p, T *dx, T *dw, T *db,
                                   const T *dy, const T *x, const T *w, T *workspace,
                                   bool assign_dx)
{
    conv_geom g = conv_geom_of(p, true);
    int64_t Cg = p->C / p->group, Mg = p->M / p->group, rows = Mg * g.ksize;
    int64_t IS = g.grid_size, OS = g.img_size;
    const T beta_dx = FN(zero_dx_if_shared)(p, dx, dw, assign_dx) ? 0 : 1;
    for (int64_t n = 0; (dx || dw) && n < p->N; n++)
        for (int64_t grp = 0; grp < p->group; grp++) {
            const T *col = FN(columns)(workspace, dy + (n * p->M + grp * Mg) * OS, Mg, &g);
            int64_t xoff = (n * p->C + grp * Cg) * IS;
            if (dx)
                GEMM(false, false, Cg, IS, rows, 1, w + grp * Cg * rows, rows, col, IS,
                     beta_dx, dx + xoff, IS);
            if (dw)
                GEMM(false, true, Cg, rows, IS, 1, x + xoff, IS, col, IS, 1,
                     dw + grp * Cg * rows, rows);
        }
    if (db)
        FN(bias_backward)(db, dy, p->N, p->M, OS);
}

#undef T
#undef SFX
#undef GEMM
#undef FOR_COLUMN_ROWS
