/*
 * conv_depthwise_impl.h — the depthwise convolutions (conv_depthwise.c),
 * written once for the element type T: conv_depthwise.c includes it once
 * per type after defining T and SFX (_f32, _f64); this file undefines them.
 * Not a public header.
 *
 * Sizes: K = prod(kernel), IS = prod(x spatial), OS = prod(y spatial),
 * Mg = M/C output channels per input channel.
 */
/* The direct kernel of one depthwise plane pair, tap by tap: for each tap k
 * and each output position o whose input position i = o * s + off is inside
 * the image, in mode
 *   DW_FWD:  grid[o] += w[k] * img[i]         (forward: grid = y, img = x)
 *   DW_DX:   img[i]  += w[k] * grid[o]        (backward: grid = dy, img = dx)
 *   DW_DW:   w[k]    += sum_o grid[o] * img[i] (backward: grid = dy, img = x)
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

/* The phase planes of source plane src (phase_planes_of) into buf;
 * `zeroed`: buf holds an earlier plane's, so its pads and tail are zeros
 * already and only the values are copied. */
AI_VECTOR_CLONES AI_SHORT_LOOPS void FN(phase_planes_fill)(const phase_planes *d, T *buf,
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

/* dw_pad_rows for narrow planes (dw_pad_flat): the rows of R2
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

/* The copies of source plane src (same_planes_of) into slot buf;
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
                    FN(phase_planes_fill)(j->d, buf, j->img + i * IS, zeroed);
                zeroed = true;
            }
            for (int64_t m = c * Mg; m < (c + 1) * Mg; m++) {
                T *gm = j->grid + (n * M + m) * OS;
                T *dst = j->mode == DW_FWD ? gm : j->img + i * IS;
                if (j->mode == DW_DX) {
                    if (same)
                        FN(dw_same_fill)(&q, buf, gm, zeroed);
                    else
                        FN(phase_planes_fill)(j->d, buf, gm, zeroed);
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

/* dx plane (H, W) += the phases of dy plane buf (dx_phases_of, the
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
                    FN(phase_planes_fill)(j->d, buf, x, zeroed);
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

/* The depthwise forward channels-last (depthwise_channels_last_geom_of): y = conv(x, w) + b,
 * then the epilogue. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const depthwise_channels_last_geom *q;
    T *y, *ws;
    const T *x, *w, *b;
    const ai_conv_epilogue *ep;
    bool xb, yb; /* x, y in blocked channels (conv.h): read, written unit by unit */
    /* yb: the sums into the unit's block (depthwise_blocked_sums); with xb and
     * direct_sums, those read the unit's block of x itself (no padded copy) */
    void (*blocked_sums)(const void *job, T *yu, const T *xt, const T *wt, int64_t c);
    void (*direct_sums)(const void *job, T *yu, const T *xu, const T *wt, int64_t c);
} FN(depthwise_channels_last_job);

/* yt (OS, DEPTHWISE_CHANNELS_LAST_UNIT) for channels [c, c + DEPTHWISE_CHANNELS_LAST_UNIT): every
 * output position, DEPTHWISE_CHANNELS_LAST_NP at a time, the taps in order, then the epilogue (as
 * ep_apply). */
#define DEPTHWISE_CHANNELS_LAST_NP 8
AI_VECTOR_CLONES static void
FN(depthwise_channels_last_sums)(const FN(depthwise_channels_last_job) * j, T *yt, const T *xt,
                                 const T *wt, int64_t c)
{
    enum { VL = AI_VEC_LANES(T), L = DEPTHWISE_CHANNELS_LAST_UNIT };
    const conv_geom *g = j->g;
    const depthwise_channels_last_geom *q = j->q;
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
        for (int64_t o = 0, o1 = 0, o2 = 0; o < OS; o += DEPTHWISE_CHANNELS_LAST_NP) {
            const T *src[DEPTHWISE_CHANNELS_LAST_NP];
            for (int i = 0; i < DEPTHWISE_CHANNELS_LAST_NP;
                 i++) { /* positions past OS repeat the last */
                src[i] = xt + o1 * rs + o2 * cs + v;
                if (o + i + 1 < OS && ++o2 == G2)
                    o1++, o2 = 0;
            }
            FN(vec) acc[DEPTHWISE_CHANNELS_LAST_NP];
            for (int i = 0; i < DEPTHWISE_CHANNELS_LAST_NP; i++)
                acc[i] = bv;
#define DEPTHWISE_CHANNELS_LAST_TAPS(KK)                                \
    _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++)          \
    {                                                                   \
        const FN(vec) wk = *(const FN(vec) *)(wt + k * L + v);          \
        for (int i = 0; i < DEPTHWISE_CHANNELS_LAST_NP; i++)            \
            acc[i] = acc[i] + wk * *(const FN(vec) *)(src[i] + off[k]); \
    }
            if (K == 9)
                DEPTHWISE_CHANNELS_LAST_TAPS(9)
            else
                DEPTHWISE_CHANNELS_LAST_TAPS(K)
#undef DEPTHWISE_CHANNELS_LAST_TAPS
            if (ab)
                for (int i = 0; i < DEPTHWISE_CHANNELS_LAST_NP; i++)
                    acc[i] = acc[i] * av + tv;
            if (relu)
                for (int i = 0; i < DEPTHWISE_CHANNELS_LAST_NP; i++) {
#if defined(__GNUC__)
                    const __typeof__(acc[i] > 0) keep = (acc[i] > 0) | (acc[i] != acc[i]);
                    acc[i] = (FN(vec))((__typeof__(keep))acc[i] & keep);
#else
                    acc[i] = !(acc[i] > 0 || acc[i] != acc[i]) ? 0 : acc[i];
#endif
                }
            for (int i = 0; i < DEPTHWISE_CHANNELS_LAST_NP && o + i < OS; i++)
                *(FN(vec) *)(yt + (o + i) * L + v) = acc[i];
        }
    }
}

/* nc planes (nc, IS) of one image into the padded xt (rows ld apart):
 * position (i1, i2) to row (i1 + p1) Wp + i2 + p2, which must lie inside.
 * 8 positions by 8 channels at a time by shuffles. */
AI_VECTOR_CLONES static void FN(depthwise_channels_last_fill)(T *xt, int64_t ld, const T *xn,
                                                              int64_t nc, const conv_geom *g,
                                                              const depthwise_channels_last_geom *q)
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

/* The inverse of depthwise_channels_last_fill: x's plane xn (nc channels, IS apart) = xt's
 * positions inside the pads, or += with `add` (the depthwise backward's
 * dx); 8 positions at a time across rows, as the fill. */
AI_VECTOR_CLONES static void
FN(depthwise_channels_last_unfill)(T *xn, const T *xt, int64_t ld, int64_t nc, const conv_geom *g,
                                   const depthwise_channels_last_geom *q, bool add)
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

/* The units' weights (K, DEPTHWISE_CHANNELS_LAST_UNIT) after the slots, zeros past C: packed
 * once per call, not per unit and part of the pool's pass (on 6x6 and 3x3
 * planes the repacking outweighed the sums) */
static void FN(depthwise_channels_last_pack)(const FN(depthwise_channels_last_job) * j)
{
    enum { L = DEPTHWISE_CHANNELS_LAST_UNIT };
    const int64_t C = j->p->C, K = j->q->K;
    T *wt = j->ws + j->q->slots * j->q->slot;
    for (int64_t c = 0; c < j->q->units * L; c += L, wt += K * L) {
        memset(wt, 0, sizeof(T) * (size_t)(K * L));
        FN(transpose)(wt, L, j->w + c * K, K, C - c < L ? C - c : L, K, false);
    }
}

/* Slots [lo, hi): their share of the jobs (unit u, image n), u major */
static void FN(depthwise_channels_last_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(depthwise_channels_last_job) *j = ctx;
    const conv_geom *g = j->g;
    const depthwise_channels_last_geom *q = j->q;
    enum { L = DEPTHWISE_CHANNELS_LAST_UNIT };
    const int64_t C = j->p->C, N = j->p->N, K = q->K, IS = g->img_size, OS = g->grid_size;
    const int64_t H = g->img[1], W = g->img[2], p1 = g->p[1], p2 = g->p[2], XT = q->Hp * q->Wp;
    /* x's columns [i2lo, i2hi) and rows [i1lo, i1hi) land inside xt */
    const int64_t i2lo = p2 > 0 ? 0 : -p2, i2hi = q->Wp - p2 < W ? q->Wp - p2 : W;
    const int64_t i1lo = p1 > 0 ? 0 : -p1, i1hi = q->Hp - p1 < H ? q->Hp - p1 : H;
    const bool inside = p1 >= 0 && p2 >= 0 && H + p1 <= q->Hp && W + p2 <= q->Wp;
    /* with at least an image per slot, or per part of the pool's pass, a
     * slot takes its share of the images, every unit of them (units major):
     * a thread then reads the images the layer before wrote on the same
     * thread (their images), not half of them from the other core's cache,
     * which makes the copies into xt slow (a batch of 16 has fewer images
     * than slots but more than parts, hence "or per part") */
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
            const T *wt =
                j->ws + q->slots * q->slot + u * K * L; /* depthwise_channels_last_pack's */
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
                FN(depthwise_channels_last_fill)(xt, L, j->x + (n * C + c) * IS, nc, g, q);
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
            FN(depthwise_channels_last_sums)(j, yt, xt, wt, c);
            FN(transpose)(j->y + (n * C + c) * OS, OS, yt, L, OS, nc, false);
        }
    }
}

/* The depthwise forward channels-last where it applies; false otherwise. */
static bool FN(depthwise_channels_last_forward)(const ai_conv_params *p, T *y, const T *x,
                                                const T *w, const T *b, T *ws,
                                                const ai_conv_epilogue *ep)
{
    conv_geom g = conv_geom_of(p, false);
    depthwise_channels_last_geom q;
    if (!depthwise_channels_last_geom_of(p, &g, &q, false))
        return false;
    FN(depthwise_channels_last_job) j = {p, &g, &q, y, ws, x, w, b, ep, false, false, NULL, NULL};
    FN(depthwise_channels_last_pack)(&j);
    const int64_t per_slot =
        q.jobs / q.slots * DEPTHWISE_CHANNELS_LAST_UNIT * (g.img_size + g.grid_size * g.ksize);
    ai_parallel_for(q.slots, ai_grain_of(per_slot), FN(depthwise_channels_last_range), &j);
    return true;
}

/* The depthwise backward channels-last (depthwise_channels_last_backward_geom_of): a job
 * is one unit of DEPTHWISE_CHANNELS_LAST_UNIT channels over all N images, so that the weight
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
    const depthwise_channels_last_geom *q;
    T *dx, *dw, *ws;
    const T *dy, *x, *w;
    int64_t slots, slot;
    bool assign;
} FN(depthwise_channels_last_backward_job);

/* One image of a unit, vector by vector: the weight gradient's sums (added
 * to dsum), then dy's scatter into dxt. */
#define DEPTHWISE_CHANNELS_LAST_BACKWARD_BLOCK 256
AI_VECTOR_CLONES static void
FN(depthwise_channels_last_backward_image)(const FN(depthwise_channels_last_backward_job) * j,
                                           T *dxt, const T *xt, const T *dyt, const T *wt,
                                           double *dsum, int nc)
{
    enum { VL = AI_VEC_LANES(T), L = DEPTHWISE_CHANNELS_LAST_UNIT };
    const conv_geom *g = j->g;
    const depthwise_channels_last_geom *q = j->q;
    const int64_t K = q->K, G1 = g->grid[1], G2 = g->grid[2];
    const int64_t rs = g->s[1] * q->Wp * L, cs = g->s[2] * L; /* an output row, column */
    const int64_t rows = G2 < DEPTHWISE_CHANNELS_LAST_BACKWARD_BLOCK
                             ? DEPTHWISE_CHANNELS_LAST_BACKWARD_BLOCK / G2
                             : 1;
    int64_t off[DW_PAD_MAX_TAPS];
    for (int64_t k = 0; k < K; k++)
        off[k] = q->off[k] * L;
    for (int64_t v = 0; v < L && v < nc; v += VL) {
        /* the weight gradient's sums: float lanes over blocks of output rows
         * of about DEPTHWISE_CHANNELS_LAST_BACKWARD_BLOCK positions, added in double */
        for (int64_t r0 = 0; j->dw && r0 < G1; r0 += rows) {
            const int64_t r1 = r0 + rows < G1 ? r0 + rows : G1;
            FN(vec) acc[DW_PAD_MAX_TAPS];
            for (int64_t k = 0; k < K; k++)
                acc[k] = (FN(vec)){0};
#define DEPTHWISE_CHANNELS_LAST_BACKWARD_SUMS(KK)                               \
    for (int64_t o1 = r0; o1 < r1; o1++)                                        \
        for (int64_t o2 = 0; o2 < G2; o2++) {                                   \
            const FN(vec) d = *(const FN(vec) *)(dyt + (o1 * G2 + o2) * L + v); \
            const T *xs = xt + o1 * rs + o2 * cs + v;                           \
            _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++) acc[k] = \
                acc[k] + d * *(const FN(vec) *)(xs + off[k]);                   \
        }
            if (K == 9)
                DEPTHWISE_CHANNELS_LAST_BACKWARD_SUMS(9)
            else
                DEPTHWISE_CHANNELS_LAST_BACKWARD_SUMS(K)
#undef DEPTHWISE_CHANNELS_LAST_BACKWARD_SUMS
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
#define DEPTHWISE_CHANNELS_LAST_BACKWARD_SCATTER(KK)                   \
    for (int64_t o1 = 0, o = 0; o1 < G1; o1++)                         \
        for (int64_t o2 = 0; o2 < G2; o2++, o++) {                     \
            const FN(vec) d = *(const FN(vec) *)(dyt + o * L + v);     \
            T *ds = dxt + o1 * rs + o2 * cs + v;                       \
            _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++) \
            {                                                          \
                FN(vec) *t = (FN(vec) *)(ds + off[k]);                 \
                *t = *t + wk[k] * d;                                   \
            }                                                          \
        }
            if (K == 9)
                DEPTHWISE_CHANNELS_LAST_BACKWARD_SCATTER(9)
            else
                DEPTHWISE_CHANNELS_LAST_BACKWARD_SCATTER(K)
#undef DEPTHWISE_CHANNELS_LAST_BACKWARD_SCATTER
        }
    }
}

/* Slots [lo, hi): each its share of the units, all images of each */
static void FN(depthwise_channels_last_backward_range)(void *ctx, int64_t lo, int64_t hi)
{
    const FN(depthwise_channels_last_backward_job) *j = ctx;
    const conv_geom *g = j->g;
    const depthwise_channels_last_geom *q = j->q;
    enum { L = DEPTHWISE_CHANNELS_LAST_UNIT };
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
                    FN(depthwise_channels_last_fill)(xt, L, j->x + (n * C + c) * IS, nc, g, q);
                FN(transpose)(dyt, L, j->dy + (n * C + c) * OS, OS, nc, OS, false);
                if (j->dx)
                    memset(dxt, 0, sizeof(T) * (size_t)(XT * L));
                FN(depthwise_channels_last_backward_image)(j, dxt, xt, dyt, wt, dsum, nc);
                if (j->dx)
                    FN(depthwise_channels_last_unfill)
                    (j->dx + (n * C + c) * IS, dxt, L, nc, g, q, !j->assign);
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
static bool FN(depthwise_channels_last_backward)(const ai_conv_params *p, T *dx, T *dw, const T *dy,
                                                 const T *x, const T *w, T *ws, bool assign)
{
    conv_geom g = conv_geom_of(p, false);
    depthwise_channels_last_geom q;
    int64_t slots, slot;
    if (!depthwise_channels_last_backward_geom_of(p, &g, &q, &slots, &slot))
        return false;
    FN(depthwise_channels_last_backward_job)
    j = {p, &g, &q, dx, dw, ws, dy, x, w, slots, slot, assign};
    ai_parallel_for(slots, 1, FN(depthwise_channels_last_backward_range), &j);
    return true;
}

/* Depthwise conv (one input channel per group, Mg output channels each):
 * DW_FWD (where depthwise_channels_last_forward declines): grid = y, img = x; DW_DX: grid = dy,
 * img = dx; DW_DW: grid = dy, img = x, w = dw. Plane by plane through slots of `ws` (weight
 * gradient: same_planes or phase planes; strided input gradient: dx_phases; else phase planes, rows
 * or flat runs); small planes (depthwise_small_planes) and what none of them takes, channels-last;
 * else the plain per-plane kernels. Threads split the slots: every output element, dw included, is
 * computed by one thread in a fixed order. */
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
        const int64_t per_slot = (p->N ? per_channel / p->N : 0) * (p->N * p->C / pj.slots);
        ai_parallel_for(pj.slots, ai_grain_of(per_slot), FN(dw_dx_phases_range), &pj);
        return;
    }
    if (mode != DW_DW && dw_pad_of(p, &j.g, mode == DW_DX, &d)) {
        FN(dw_pad_job) pj = {mode, p, &d, dw_pad_slots(p), grid, img, w, ws, NULL, ep};
        const int64_t per_slot = (p->N ? per_channel / p->N : 0) * (p->N * p->C / pj.slots);
        ai_parallel_for(pj.slots, ai_grain_of(per_slot), FN(dw_pad_range), &pj);
        return;
    }
    if (!depthwise_channels_last(p, &j.g)) {
        if (mode == DW_DW)
            ai_parallel_for(p->M, ai_grain_of(per_channel), FN(dw_planes_range), &j);
        else
            ai_parallel_for(p->N * p->C, ai_grain_of(p->N ? per_channel / p->N : 0),
                            FN(dw_planes_range), &j);
        return;
    }
    ai_parallel_for((p->C + 15) / 16, ai_grain_of(16 * per_channel), FN(dw_last_range), &j);
}

static bool FN(channels_last_forward)(const conv_call *c)
{
    return conv_is_depthwise(c->p) &&
           FN(depthwise_channels_last_forward)(c->p, c->y, c->x, c->w, c->b, c->ws, c->ep);
}

static bool FN(planes_forward)(const conv_call *c)
{
    const ai_conv_params *p = c->p;
    if (!conv_is_depthwise(p))
        return false;
    const int64_t OS = c->g->grid_size;
    T *y = c->y;
    const T *b = c->b;
    if (dw_forward_reads_planes(p, c->g))
        FN(fill_bias)(y, b, p->N, p->M, OS);
    else /* the kernels read each plane's first element alone: filling
          * whole planes would be a pass over y for nothing */
        for (int64_t nm = 0; OS > 0 && nm < p->N * p->M; nm++)
            y[nm * OS] = b ? b[nm % p->M] : 0;
    /* the kernels only read x and w in this mode */
    FN(depthwise)(DW_FWD, p, y, (T *)c->x, (T *)c->w, c->ws, c->ep);
    return true;
}

static bool FN(channels_last_backward)(conv_call *c)
{
    if (!conv_is_depthwise(c->p) || !FN(depthwise_channels_last_backward)(
                                        c->p, c->dx, c->dw, c->dy, c->x, c->w, c->ws, c->assign_dx))
        return false;
    c->dx = c->dw = NULL;
    return true;
}

static bool FN(planes_backward)(conv_call *c)
{
    const ai_conv_params *p = c->p;
    if (!conv_is_depthwise(p))
        return false;
    if (c->dx && c->assign_dx) /* DW_DX adds overlapping windows */
        memset(c->dx, 0, sizeof(T) * (size_t)(p->N * p->C * c->g->img_size));
    /* dy, x and w are only read in these modes */
    if (c->dw)
        FN(depthwise)(DW_DW, p, (T *)c->dy, (T *)c->x, c->dw, c->ws, NULL);
    if (c->dx)
        FN(depthwise)(DW_DX, p, (T *)c->dy, c->dx, (T *)c->w, c->ws, NULL);
    c->dx = c->dw = NULL;
    return true;
}

#undef T
#undef SFX
