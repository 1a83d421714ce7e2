/*
 * conv_im2col_impl.h — the im2col + GEMM convolution (conv_im2col.c),
 * written once for the element type T: conv_im2col.c includes it once per
 * type after defining T, SFX (_f32, _f64) and GEMM (ai_gemm_f32,
 * ai_gemm_f64); this file undefines them. Not a public header.
 *
 * Sizes: K = prod(kernel), IS = prod(x spatial), OS = prod(y spatial),
 * Cg = C/group, Mg = M/group. Grid side: Conv y, ConvTranspose x.
 */

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
 * of each plane, its own loop (on such a conv the general loop's per-row
 * bookkeeping costs more than the GEMM). */
AI_VECTOR_CLONES void FN(im2col_rows)(T *col, const T *img, const conv_geom *g,
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


/* Image n of the GEMM forward: its bias (with `bias`), each group's
 * product added to it (columns in ws: not used by pointwise convs), the
 * epilogue, while the image's planes are in cache. */
void FN(gemm_image)(const ai_conv_params *p, const conv_geom *g, T *y, const T *x,
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

/* The image groups of cols_groups_of (conv_im2col.c), in `parts` runs of
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

/* y (N, M, out) = conv(x (N, C, in), w (M, Cg, kernel)) + b (M).
 * Per batch item and group: y_g (Mg, OS) += w_g (Mg, Cg*K) @ cols(x_g) (Cg*K, OS). */
static bool FN(forward)(const conv_call *c)
{
    const ai_conv_params *p = c->p;
    const T *b = c->b;
    T *y = c->y;
    /* with an epilogue, the bias image by image (in cache for the epilogue) */
    if (!c->ep)
        FN(fill_bias)(y, b, p->N, p->M, c->g->grid_size);
    for (int64_t n = 0; n < p->N; n++)
        FN(gemm_image)(p, c->g, y, c->x, c->w, b, c->ws, c->ep, n, c->ep != NULL);
    return true;
}

/* dx (N, C, in) += w_g^T @ dy_g through col2im; dw (M, Cg, kernel) +=
 * dy_g @ cols(x_g)^T. Several small images of a one-group conv: in groups
 * on the pool (cols_groups_of); else image by image. */
static bool FN(backward)(conv_call *c)
{
    const ai_conv_params *p = c->p;
    const conv_geom *g = c->g;
    const int64_t Cg = p->C / p->group, Mg = p->M / p->group, rows = Cg * g->ksize;
    const int64_t IS = g->img_size, OS = g->grid_size;
    const T *dy = c->dy, *x = c->x, *w = c->w;
    T *dx = c->dx, *dw = c->dw, *ws = c->ws;
    const int64_t groups = cols_groups_of(p, g, c->dtype);
    if (groups)
        FN(cols_groups_backward)(p, g, groups, dx, dw, dy, x, w, ws, c->assign_dx);
    for (int64_t n = 0; !groups && n < p->N; n++)
        for (int64_t grp = 0; grp < p->group; grp++) {
            const T *dyg = dy + (n * p->M + grp * Mg) * OS;
            int64_t xoff = (n * p->C + grp * Cg) * IS;
            if (dw) {
                const T *col = FN(columns)(ws, x + xoff, Cg, g);
                GEMM(false, true, Mg, rows, OS, 1, dyg, OS, col, OS, 1,
                     dw + grp * Mg * rows, rows);
            }
            if (dx)
                FN(gemm_col2im)(dx + xoff, w + grp * Mg * rows, dyg, Mg, Cg, ws, g,
                                c->assign_dx);
        }
    c->dx = c->dw = NULL;
    return true;
}

/* y (N, M, out) = convtranspose(x (N, C, in), w (C, Mg, kernel)) + b (M).
 * Per batch item and group: y_g (Mg, OS) += col2im(w_g^T @ x_g), w_g (Cg, Mg*K),
 * x_g (Cg, IS). */
static void FN(transposed_forward)(const conv_call *c)
{
    const ai_conv_params *p = c->p;
    const conv_geom g = *c->g;
    T *y = c->y, *workspace = c->ws;
    const T *x = c->x, *w = c->w, *b = c->b;
    int64_t Cg = p->C / p->group, Mg = p->M / p->group, rows = Mg * g.ksize;
    int64_t IS = g.grid_size, OS = g.img_size;
    FN(fill_bias)(y, b, p->N, p->M, OS);
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t grp = 0; grp < p->group; grp++)
            FN(gemm_col2im)(y + (n * p->M + grp * Mg) * OS, w + grp * Cg * rows,
                            x + (n * p->C + grp * Cg) * IS, Cg, Mg, workspace, &g, false);
}

/* dx (N, C, in) += w_g @ cols(dy_g) (= with assign_dx); dw (C, Mg, kernel) +=
 * x_g @ cols(dy_g)^T. NULL gradients are skipped. */
static void FN(transposed_backward)(conv_call *c)
{
    const ai_conv_params *p = c->p;
    const conv_geom g = *c->g;
    T *dx = c->dx, *dw = c->dw, *workspace = c->ws;
    const T *dy = c->dy, *x = c->x, *w = c->w;
    int64_t Cg = p->C / p->group, Mg = p->M / p->group, rows = Mg * g.ksize;
    int64_t IS = g.grid_size, OS = g.img_size;
    const T beta_dx = c->assign_dx ? 0 : 1;
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
}

#undef T
#undef SFX
#undef GEMM
#undef FOR_COLUMN_ROWS
