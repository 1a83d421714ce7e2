/*
 * conv_shifted_gemm_impl.h — the shifted-GEMM convolution
 * (conv_shifted_gemm.c), written once for the element type T:
 * conv_shifted_gemm.c includes it once per type after defining T, SFX
 * (_f32, _f64) and GEMM; this file undefines them. Not a public header.
 */
/* The shifted-GEMM conv (shifted_gemm_geom_of in conv_shifted_gemm.c). Buffers in ws: xp (C,
 * span) padded x, grid (M, span), dxp (C, span) padded dx, wt and dwt (K, M,
 * Cg) with wt[k][m][c] = w[m][c][k]. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const shifted_gemm_geom *sh;
    int64_t Cg, Mg;
    T *xp, *grid, *dxp, *wt, *dwt;
} FN(shift_bufs);

static FN(shift_bufs) FN(shift_bufs_of)(const ai_conv_params *p, const conv_geom *g,
                                        const shifted_gemm_geom *sh, T *ws)
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
    const shifted_gemm_geom *sh = s->sh;
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
                              const shifted_gemm_geom *sh, T *y, const T *x, const T *w, const T *b,
                              T *ws, const ai_conv_epilogue *ep)
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
                               const shifted_gemm_geom *sh, T *dx, T *dw, const T *dy, const T *x,
                               const T *w, T *ws, bool assign_dx)
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

static bool FN(forward)(const conv_call *c)
{
    shifted_gemm_geom sh;
    if (!shifted_gemm_geom_of(c->p, c->g, &sh))
        return false;
    FN(shift_forward)(c->p, c->g, &sh, c->y, c->x, c->w, c->b, c->ws, c->ep);
    return true;
}

static bool FN(backward)(conv_call *c)
{
    shifted_gemm_geom sh;
    if (!shifted_gemm_geom_of(c->p, c->g, &sh))
        return false;
    FN(shift_backward)(c->p, c->g, &sh, c->dx, c->dw, c->dy, c->x, c->w, c->ws, c->assign_dx);
    c->dx = c->dw = NULL;
    return true;
}

#undef T
#undef SFX
#undef GEMM
