/*
 * conv_pointwise_impl.h — the pointwise convolutions through the GEMM
 * library (conv_pointwise.c), written once for the element type T:
 * conv_pointwise.c includes it once per type after defining T, SFX (_f32,
 * _f64) and GEMM; this file undefines them. Not a public header.
 */
/* pointwise_batched_accepts (conv_pointwise.c): planes [lo, hi) of x (N, C, S) into xs (C, N S) */
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

/* pointwise_batched_accepts's backward: planes [lo, hi) of dx (N, C, S) from dxs (C, N S),
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

/* Pointwise forwards, image by image on the pool (pointwise_images_accepts in conv_pointwise.c):
 * nested in a range, each image's passes and GEMM run on its thread. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    T *y;
    const T *x, *w, *b;
    const ai_conv_epilogue *ep;
} FN(pointwise_images_job);

static void FN(pointwise_images_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(pointwise_images_job) *j = ctx;
    for (int64_t n = lo; n < hi; n++)
        FN(gemm_image)(j->p, j->g, j->y, j->x, j->w, j->b, NULL, j->ep, n, true);
}

/* The pointwise backward of pointwise_small_images (conv_pointwise.c) in one pass of the pool:
 * its items are the weight gradient's panels of PW_DW_ROWS rows, each
 * summed over the images in order (split by output elements, never inside
 * a sum: the same values at any thread count), then dx image by image
 * (each image's GEMM on its thread). Panels of 64 rows (panels of 32, or
 * of 16 for the skinny GEMM, were slower: benchmarks/results/threads.md);
 * at 2 threads the other thread takes the images' dx meanwhile (in two
 * passes, the weight gradient in one 64-row panel would leave it idle). */
#define PW_DW_ROWS 64
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    T *dx, *dw;
    const T *dy, *x, *w;
    int64_t panels; /* items [0, panels): dw's panels; then dx's images */
    bool assign_dx;
} FN(pointwise_images_backward_job);

static void FN(pointwise_images_backward_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(pointwise_images_backward_job) *j = ctx;
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

static bool FN(batched_forward)(const conv_call *c)
{
    const ai_conv_params *p = c->p;
    if (!pointwise_batched_accepts(p, c->g))
        return false;
    const int64_t OS = c->g->grid_size, NS = p->N * OS;
    T *xs = c->ws, *ys = xs + p->C * NS;
    FN(cols_job) gj = {.dst = xs, .src = c->x, .N = p->N, .M = p->C, .S = OS};
    ai_parallel_for(p->N * p->C, ai_grain_of(OS), FN(pw_gather_range), &gj);
    GEMM(false, false, p->M, NS, p->C, 1, c->w, p->C, xs, NS, 0, ys, NS);
    FN(pw_scatter_job) sj = {c->y, ys, c->b, c->ep, p->N, p->M, OS};
    ai_parallel_for(p->N * p->M, ai_grain_of(OS), FN(pw_scatter_range), &sj);
    return true;
}

static bool FN(images_forward)(const conv_call *c)
{
    if (!pointwise_images_accepts(c->p, c->g))
        return false;
    FN(pointwise_images_job) j = {c->p, c->g, c->y, c->x, c->w, c->b, c->ep};
    ai_parallel_for(c->p->N, 1, FN(pointwise_images_range), &j);
    return true;
}

/* as the forward: one GEMM per gradient */
static bool FN(batched_backward)(conv_call *c)
{
    const ai_conv_params *p = c->p;
    if (!pointwise_batched_accepts(p, c->g))
        return false;
    const int64_t OS = c->g->grid_size, NS = p->N * OS;
    T *dx = c->dx, *dw = c->dw, *dys = c->ws, *xs = dys + p->M * NS; /* xs: then dx's (C, N OS) */
    FN(cols_job) gj = {.dst = dys, .src = c->dy, .N = p->N, .M = p->M, .S = OS};
    ai_parallel_for(p->N * p->M, ai_grain_of(OS), FN(pw_gather_range), &gj);
    if (dw) {
        FN(cols_job) xj = {.dst = xs, .src = c->x, .N = p->N, .M = p->C, .S = OS};
        ai_parallel_for(p->N * p->C, ai_grain_of(OS), FN(pw_gather_range), &xj);
        GEMM(false, true, p->M, p->C, NS, 1, dys, NS, xs, NS, 1, dw, p->C);
    }
    if (dx) {
        GEMM(true, false, p->C, NS, p->M, 1, c->w, p->C, dys, NS, 0, xs, NS);
        FN(pw_scatter_dx_job) sj = {dx, xs, p->N, p->C, OS, c->assign_dx};
        ai_parallel_for(p->N * p->C, ai_grain_of(OS), FN(pw_scatter_dx_range), &sj);
    }
    c->dx = c->dw = NULL;
    return true;
}

static bool FN(images_backward)(conv_call *c)
{
    const ai_conv_params *p = c->p;
    if (!pointwise_small_images(p, c->g))
        return false;
    T *dx = c->dx, *dw = c->dw;
    const int64_t panels = dw ? (p->M + PW_DW_ROWS - 1) / PW_DW_ROWS : 0;
    FN(pointwise_images_backward_job)
    j = {p, c->g, dx, dw, c->dy, c->x, c->w, panels, c->assign_dx};
    if (dx == dw) { /* one buffer (zeroed by the dispatcher): the two sums in turn */
        ai_parallel_for(panels, 1, FN(pointwise_images_backward_range), &j);
        j.panels = 0;
    }
    ai_parallel_for(j.panels + (dx ? p->N : 0), 1, FN(pointwise_images_backward_range), &j);
    c->dx = c->dw = NULL;
    return true;
}

#undef T
#undef SFX
#undef GEMM
