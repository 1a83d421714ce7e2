/*
 * pool_impl.h — the pooling kernels, written once for the element type T.
 * pool.c includes it once per type after defining T and SFX (name suffix:
 * _f32, _f64); this file undefines them. Not a public header.
 *
 * Sizes: IS = prod(in), OS = prod(out), NC = N*C.
 */

/* Every kernel below works on the planes [nc0, nc1) of (NC, ...) tensors,
 * and the public functions split all NC planes on the thread pool
 * (pool_run): planes are independent, each one's arithmetic is the same on
 * any thread. */

/* dx (NC, S) += dy (NC, O) at the positions idx (NC, O): the backward of
 * both max pools. */
static void FN(scatter)(T *dx, const T *dy, const int64_t *idx, int64_t nc0, int64_t nc1,
                        int64_t O, int64_t S)
{
    dy += nc0 * O;
    idx += nc0 * O;
    for (int64_t nc = nc0; nc < nc1; nc++)
        for (int64_t o = 0; o < O; o++)
            dx[nc * S + *idx++] += *dy++;
}

/* y, idx (NC, out) = max of x (NC, in) over each window, and where it is;
 * backward needs idx. */
/* maxpool_inside when every window lies inside the input, undilated (no
 * window clipping), with the same scan and tie rule as maxpool_range: per
 * output, the window's taps (j0, j1, j2) in scan order update a running
 * maximum with selects (no unpredictable branch per element). With GCC the
 * outputs of a row go MP_LANES at a time through vector registers when the
 * stride along the row is 1 or 2 (the even lanes of two loads), the winning
 * tap's offset tracked per lane; the rest of a row one by one. */
static inline __attribute__((always_inline)) void
FN(maxpool_inside_body)(const pool_geom *g, int64_t nc0, int64_t nc1, int64_t NC, T *y,
                        int64_t *idx, const T *x, const bool want_idx)
{
    const int64_t in1 = g->in[1], in2 = g->in[2], n2 = g->out[2], s2 = g->s[2];
    const int64_t k0 = g->k[0], k1 = g->k[1], k2 = g->k[2];
    const int64_t last = ((k0 - 1) * in1 + k1 - 1) * in2 + k2 - 1; /* the last tap's offset */
    x += nc0 * g->in_size;
    y += nc0 * g->out_size;
    if (want_idx)
        idx += nc0 * g->out_size;
    for (int64_t nc = nc0; nc < nc1; nc++, x += g->in_size)
        for (int64_t o0 = 0; o0 < g->out[0]; o0++)
            for (int64_t o1 = 0; o1 < g->out[1]; o1++, y += n2) {
                const int64_t row = (o0 * g->s[0] * in1 + o1 * g->s[1]) * in2;
                int64_t o2 = 0;
#ifdef MP_LANES
                /* Vectors of MP_LANES outputs, the last one partial; a vector may
                 * read past its row (stride 2: one element past each window's last
                 * tap), into the rows or planes after it: only the last rows of
                 * the last plane, whose reads would leave x, go one by one. The
                 * winning taps' offsets must fit the lanes' integers. */
                const int64_t room = (NC - nc) * g->in_size - row - last - (s2 - 1);
                const bool vec = (s2 == 1 || s2 == 2) && g->in_size <= MP_MAX_OFFSET;
                for (; vec && o2 < n2 && (o2 + MP_LANES - 1) * s2 < room; o2 += MP_LANES) {
                    const T *xo = x + row + o2 * s2;
                    FN(mp_vec) best = (FN(mp_vec)){0} - (T)INFINITY;
                    FN(mp_ivec) at = {0};
                    for (int64_t j0 = 0; j0 < k0; j0++)
                        for (int64_t j1 = 0; j1 < k1; j1++)
                            for (int64_t j2 = 0; j2 < k2; j2++) {
                                const int64_t off = (j0 * in1 + j1) * in2 + j2;
                                const FN(mp_vec) *p = (const FN(mp_vec) *)(xo + off);
                                const FN(mp_vec) v = s2 == 1 ? p[0] : FN(mp_even)(p[0], p[1]);
                                const FN(mp_ivec) take = (v > best) | (v != v);
                                best = (FN(mp_vec))(((FN(mp_ivec))v & take) |
                                                    ((FN(mp_ivec))best & ~take));
                                if (want_idx)
                                    at = (((FN(mp_ivec)){0} + (FN(mp_int))off) & take) |
                                         (at & ~take);
                            }
                    if (o2 + MP_LANES <= n2) {
                        memcpy(y + o2, &best, sizeof best);
                        if (want_idx) {
                            const mp_lvec where = __builtin_convertvector(at, mp_lvec) +
                                                  (row + o2 * s2) + s2 * MP_IOTA;
                            memcpy(idx + o2, &where, sizeof where);
                        }
                        continue;
                    }
                    T lanes[MP_LANES];
                    memcpy(lanes, &best, sizeof lanes);
                    for (int64_t l = 0; l < n2 - o2; l++) {
                        y[o2 + l] = lanes[l];
                        if (want_idx)
                            idx[o2 + l] = row + (o2 + l) * s2 + at[l];
                    }
                }
#endif
                for (; o2 < n2; o2++) {
                    const T *xo = x + row + o2 * s2;
                    T best = -INFINITY;
                    int64_t at = 0;
                    for (int64_t j0 = 0; j0 < k0; j0++)
                        for (int64_t j1 = 0; j1 < k1; j1++)
                            for (int64_t j2 = 0; j2 < k2; j2++) {
                                const int64_t off = (j0 * in1 + j1) * in2 + j2;
                                const T v = xo[off];
                                const bool take = v > best || isnan(v);
                                best = take ? v : best;
                                at = take ? off : at;
                            }
                    y[o2] = best;
                    if (want_idx)
                        idx[o2] = row + o2 * s2 + at;
                }
                if (want_idx)
                    idx += n2;
            }
}

AI_VECTOR_CLONES static void FN(maxpool_inside)(const pool_geom *g, int64_t nc0, int64_t nc1,
                                                int64_t NC, T *y, int64_t *idx, const T *x)
{
    FN(maxpool_inside_body)(g, nc0, nc1, NC, y, idx, x, true);
}

/* the same maxima without their positions (a forward that keeps nothing
 * for backward) */
AI_VECTOR_CLONES static void FN(maxpool_inside_noidx)(const pool_geom *g, int64_t nc0,
                                                      int64_t nc1, int64_t NC, T *y,
                                                      const T *x)
{
    FN(maxpool_inside_body)(g, nc0, nc1, NC, y, NULL, x, false);
}

static void FN(maxpool_range)(const pool_geom *g, int64_t nc0, int64_t nc1, int64_t NC, T *y,
                              int64_t *idx, const T *x)
{
    bool inside = true;
    for (int i = 0; i < 3; i++)
        inside = inside && g->d[i] == 1 && g->pb[i] == 0 &&
                 (g->out[i] - 1) * g->s[i] + g->k[i] <= g->in[i];
#ifdef HAVE_MAXPOOL2X2_V16
    if (inside && sizeof(T) == sizeof(float) && maxpool2x2_case(g)) {
        maxpool2x2_v16(g, nc0, nc1, NC, (float *)y, idx, (const float *)x);
        return;
    }
#endif
    if (inside) {
        if (idx)
            FN(maxpool_inside)(g, nc0, nc1, NC, y, idx, x);
        else
            FN(maxpool_inside_noidx)(g, nc0, nc1, NC, y, x);
        return;
    }
    x += nc0 * g->in_size;
    y += nc0 * g->out_size;
    if (idx)
        idx += nc0 * g->out_size;
    for (int64_t nc = nc0; nc < nc1; nc++, x += g->in_size)
        for (int64_t o0 = 0; o0 < g->out[0]; o0++) {
            pool_win w0 = pool_win_of(g, 0, o0);
            for (int64_t o1 = 0; o1 < g->out[1]; o1++) {
                pool_win w1 = pool_win_of(g, 1, o1);
                for (int64_t o2 = 0; o2 < g->out[2]; o2++) {
                    pool_win w2 = pool_win_of(g, 2, o2);
                    T best = -INFINITY;
                    int64_t at = (w0.lo * g->in[1] + w1.lo) * g->in[2] + w2.lo;
                    for (int64_t i0 = w0.lo; i0 < w0.hi; i0 += g->d[0])
                        for (int64_t i1 = w1.lo; i1 < w1.hi; i1 += g->d[1])
                            for (int64_t i2 = w2.lo; i2 < w2.hi; i2 += g->d[2]) {
                                int64_t i = (i0 * g->in[1] + i1) * g->in[2] + i2;
                                if (x[i] > best || isnan(x[i])) {
                                    best = x[i];
                                    at = i;
                                }
                            }
                    *y++ = best;
                    if (idx)
                        *idx++ = at;
                }
            }
        }
}

/* The divisor of window (w0, w1, w2). */
static T FN(avg_divisor)(const ai_pool_params *p, pool_win w0, pool_win w1, pool_win w2)
{
    return p->count_include_pad ? (T)(w0.padded * w1.padded * w2.padded)
                                : (T)(w0.n * w1.n * w2.n);
}

/* y (NC, out) = mean of x (NC, in) over each window. */
static void FN(avgpool_range)(const ai_pool_params *p, const pool_geom *g, int64_t nc0,
                              int64_t nc1, T *y, const T *x)
{
    x += nc0 * g->in_size;
    y += nc0 * g->out_size;
    for (int64_t nc = nc0; nc < nc1; nc++, x += g->in_size)
        for (int64_t o0 = 0; o0 < g->out[0]; o0++) {
            pool_win w0 = pool_win_of(g, 0, o0);
            for (int64_t o1 = 0; o1 < g->out[1]; o1++) {
                pool_win w1 = pool_win_of(g, 1, o1);
                for (int64_t o2 = 0; o2 < g->out[2]; o2++) {
                    pool_win w2 = pool_win_of(g, 2, o2);
                    /* 4 partial sums along each row: no long chain of dependent adds */
                    const int64_t d2 = g->d[2], n2 = w2.n;
                    T a0 = 0, a1 = 0, a2 = 0, a3 = 0;
                    for (int64_t i0 = w0.lo; i0 < w0.hi; i0 += g->d[0])
                        for (int64_t i1 = w1.lo; i1 < w1.hi; i1 += g->d[1]) {
                            const T *xr = x + (i0 * g->in[1] + i1) * g->in[2] + w2.lo;
                            int64_t i = 0;
                            for (; i + 4 <= n2; i += 4) {
                                a0 += xr[i * d2];
                                a1 += xr[(i + 1) * d2];
                                a2 += xr[(i + 2) * d2];
                                a3 += xr[(i + 3) * d2];
                            }
                            for (; i < n2; i++)
                                a0 += xr[i * d2];
                        }
                    const T sum = (a0 + a1) + (a2 + a3);
                    *y++ = sum / FN(avg_divisor)(p, w0, w1, w2);
                }
            }
        }
}

/* dx (NC, in) += dy (NC, out) / divisor over each window. */
static void FN(avgpool_backward_range)(const ai_pool_params *p, const pool_geom *g,
                                       int64_t nc0, int64_t nc1, T *dx, const T *dy)
{
    dx += nc0 * g->in_size;
    dy += nc0 * g->out_size;
    for (int64_t nc = nc0; nc < nc1; nc++, dx += g->in_size)
        for (int64_t o0 = 0; o0 < g->out[0]; o0++) {
            pool_win w0 = pool_win_of(g, 0, o0);
            for (int64_t o1 = 0; o1 < g->out[1]; o1++) {
                pool_win w1 = pool_win_of(g, 1, o1);
                for (int64_t o2 = 0; o2 < g->out[2]; o2++) {
                    pool_win w2 = pool_win_of(g, 2, o2);
                    T grad = *dy++ / FN(avg_divisor)(p, w0, w1, w2);
                    for (int64_t i0 = w0.lo; i0 < w0.hi; i0 += g->d[0])
                        for (int64_t i1 = w1.lo; i1 < w1.hi; i1 += g->d[1])
                            for (int64_t i2 = w2.lo; i2 < w2.hi; i2 += g->d[2])
                                dx[(i0 * g->in[1] + i1) * g->in[2] + i2] += grad;
                }
            }
        }
}

/* avgpool_range where avgpool2x2_case holds: the same sum in the same
 * order (its tail loop's: from 0, the top row's two values, then the
 * bottom row's; the zero start turns a window of -0 into +0), divided by
 * 4. bench_ops's 8 x 32 x 32 x 32, 1 thread: 0.39 -> 0.02 ms. */
AI_WIDE_CLONES static void FN(avgpool2x2_range)(const pool_geom *g, int64_t nc0, int64_t nc1,
                                                T *y, const T *x)
{
    const int64_t W = g->in[2], n2 = g->out[2];
    for (int64_t nc = nc0; nc < nc1; nc++)
        for (int64_t o0 = 0; o0 < g->out[0]; o0++)
            for (int64_t o1 = 0; o1 < g->out[1]; o1++) {
                const T *x0 = x + nc * g->in_size + (o0 * g->s[0] * g->in[1] + 2 * o1) * W;
                const T *x1 = x0 + W;
                T *yr = y + ((nc * g->out[0] + o0) * g->out[1] + o1) * n2;
                for (int64_t o2 = 0; o2 < n2; o2++)
                    yr[o2] = (((((T)0 + x0[2 * o2]) + x0[2 * o2 + 1]) + x1[2 * o2]) +
                              x1[2 * o2 + 1]) / (T)4;
            }
}

/* avgpool_backward_range where avgpool2x2_case holds: each dx element of a
 * window gets dy / 4 (windows do not overlap) */
AI_WIDE_CLONES static void FN(avgpool2x2_backward_range)(const pool_geom *g, int64_t nc0,
                                                         int64_t nc1, T *dx, const T *dy)
{
    const int64_t W = g->in[2], n2 = g->out[2];
    for (int64_t nc = nc0; nc < nc1; nc++)
        for (int64_t o0 = 0; o0 < g->out[0]; o0++)
            for (int64_t o1 = 0; o1 < g->out[1]; o1++) {
                T *d0 = dx + nc * g->in_size + (o0 * g->s[0] * g->in[1] + 2 * o1) * W;
                T *d1 = d0 + W;
                const T *dyr = dy + ((nc * g->out[0] + o0) * g->out[1] + o1) * n2;
                for (int64_t o2 = 0; o2 < n2; o2++) {
                    const T v = dyr[o2] / (T)4;
                    d0[2 * o2] += v;
                    d0[2 * o2 + 1] += v;
                    d1[2 * o2] += v;
                    d1[2 * o2 + 1] += v;
                }
            }
}

/* y, idx (NC) = max of x (NC, S) over S, and where it is (MaxPool's rule). */
static void FN(global_max_range)(int64_t nc0, int64_t nc1, T *y, int64_t *idx, const T *x,
                                 int64_t S)
{
    for (int64_t nc = nc0; nc < nc1; nc++) {
        const T *xr = x + nc * S;
        T best = -INFINITY;
        int64_t at = 0;
        for (int64_t i = 0; i < S; i++)
            if (xr[i] > best || isnan(xr[i])) {
                best = xr[i];
                at = i;
            }
        y[nc] = best;
        if (idx)
            idx[nc] = at;
    }
}

/* y (NC) = mean of x (NC, S) over S. */
AI_VECTOR_CLONES static void FN(global_avg_range)(int64_t nc0, int64_t nc1, T *y, const T *x,
                                                  int64_t S)
{
    for (int64_t nc = nc0; nc < nc1; nc++) {
        const T *xr = x + nc * S;
        T part[8] = {0}; /* 8 partial sums: they vectorise */
        int64_t i = 0;
        for (; i + 8 <= S; i += 8)
            for (int l = 0; l < 8; l++)
                part[l] += xr[i + l];
        for (; i < S; i++)
            part[i % 8] += xr[i];
        y[nc] = (((part[0] + part[1]) + (part[2] + part[3])) +
                 ((part[4] + part[5]) + (part[6] + part[7]))) / (T)S;
    }
}

/* dx (NC, S) += dy (NC) / S. */
static void FN(global_avg_backward_range)(int64_t nc0, int64_t nc1, T *dx, const T *dy,
                                          int64_t S)
{
    for (int64_t nc = nc0; nc < nc1; nc++)
        for (int64_t i = 0; i < S; i++)
            dx[nc * S + i] += dy[nc] / (T)S;
}

static void FN(pool_range)(void *ctx, int64_t lo, int64_t hi)
{
    const pool_job *j = ctx;
    const pool_geom *g = &j->g;
    switch (j->kind) {
    case POOL_MAX:
        FN(maxpool_range)(g, lo, hi, j->p->N * j->p->C, j->out, j->idx, j->in);
        break;
    case POOL_MAX_BWD:
        FN(scatter)(j->out, j->in, j->idx, lo, hi, g->out_size, g->in_size);
        break;
    case POOL_AVG:
        if (avgpool2x2_case(g))
            FN(avgpool2x2_range)(g, lo, hi, j->out, j->in);
        else
            FN(avgpool_range)(j->p, g, lo, hi, j->out, j->in);
        break;
    case POOL_AVG_BWD:
        if (avgpool2x2_case(g))
            FN(avgpool2x2_backward_range)(g, lo, hi, j->out, j->in);
        else
            FN(avgpool_backward_range)(j->p, g, lo, hi, j->out, j->in);
        break;
    case POOL_GLOBAL_MAX: FN(global_max_range)(lo, hi, j->out, j->idx, j->in, g->in_size); break;
    case POOL_GLOBAL_AVG: FN(global_avg_range)(lo, hi, j->out, j->in, g->in_size); break;
    default: FN(global_avg_backward_range)(lo, hi, j->out, j->in, g->in_size); break;
    }
}

void FN(ai_maxpool_forward)(const ai_pool_params *p, T *y, int64_t *idx, const T *x)
{
    pool_run(&(pool_job){POOL_MAX, p, pool_geom_of(p), y, idx, x}, p->N * p->C, FN(pool_range));
}

/* dx (NC, in) += dy (NC, out) at the maxima idx (NC, out). */
void FN(ai_maxpool_backward)(const ai_pool_params *p, T *dx, const T *dy,
                             const int64_t *idx)
{
    pool_run(&(pool_job){POOL_MAX_BWD, p, pool_geom_of(p), dx, (int64_t *)idx, dy},
             p->N * p->C, FN(pool_range));
}

void FN(ai_avgpool_forward)(const ai_pool_params *p, T *y, const T *x)
{
    if (pool_whole_plane(p)) {
        FN(ai_global_avgpool_forward)(y, x, p->N * p->C, pool_geom_of(p).in_size);
        return;
    }
    pool_run(&(pool_job){POOL_AVG, p, pool_geom_of(p), y, NULL, x}, p->N * p->C,
             FN(pool_range));
}

void FN(ai_avgpool_backward)(const ai_pool_params *p, T *dx, const T *dy)
{
    if (pool_whole_plane(p)) {
        FN(ai_global_avgpool_backward)(dx, dy, p->N * p->C, pool_geom_of(p).in_size);
        return;
    }
    pool_run(&(pool_job){POOL_AVG_BWD, p, pool_geom_of(p), dx, NULL, dy}, p->N * p->C,
             FN(pool_range));
}

void FN(ai_global_maxpool_forward)(T *y, int64_t *idx, const T *x, int64_t NC, int64_t S)
{
    pool_run(&(pool_job){POOL_GLOBAL_MAX, NULL, global_geom(S), y, idx, x}, NC, FN(pool_range));
}

/* dx (NC, S) += dy (NC) at the maxima idx (NC). */
void FN(ai_global_maxpool_backward)(T *dx, const T *dy, const int64_t *idx, int64_t NC,
                                    int64_t S)
{
    pool_run(&(pool_job){POOL_MAX_BWD, NULL, global_geom(S), dx, (int64_t *)idx, dy}, NC,
             FN(pool_range));
}

void FN(ai_global_avgpool_forward)(T *y, const T *x, int64_t NC, int64_t S)
{
    pool_run(&(pool_job){POOL_GLOBAL_AVG, NULL, global_geom(S), y, NULL, x}, NC,
             FN(pool_range));
}

void FN(ai_global_avgpool_backward)(T *dx, const T *dy, int64_t NC, int64_t S)
{
    pool_run(&(pool_job){POOL_GLOBAL_AVG_BWD, NULL, global_geom(S), dx, NULL, dy}, NC,
             FN(pool_range));
}

#undef T
#undef SFX
