/*
 * pool_impl.h — the pooling kernels, written once for the element type T.
 * pool.c includes it once per type after defining T and SFX (name suffix:
 * _f32, _f64); this file undefines them. Not a public header.
 *
 * Sizes: IS = prod(in), OS = prod(out), NC = N*C.
 */

/* dx (NC, S) += dy (NC, O) at the positions idx (NC, O): the backward of
 * both max pools. */
static void FN(scatter)(T *dx, const T *dy, const int64_t *idx, int64_t NC, int64_t O,
                        int64_t S)
{
    for (int64_t nc = 0; nc < NC; nc++, dx += S)
        for (int64_t o = 0; o < O; o++)
            dx[*idx++] += *dy++;
}

/* y, idx (NC, out) = max of x (NC, in) over each window, and where it is;
 * backward needs idx. */
void FN(ai_maxpool_forward)(const ai_pool_params *p, T *y, int64_t *idx, const T *x)
{
    pool_geom g = pool_geom_of(p);
    for (int64_t nc = 0; nc < p->N * p->C; nc++, x += g.in_size)
        for (int64_t o0 = 0; o0 < g.out[0]; o0++) {
            pool_win w0 = pool_win_of(&g, 0, o0);
            for (int64_t o1 = 0; o1 < g.out[1]; o1++) {
                pool_win w1 = pool_win_of(&g, 1, o1);
                for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
                    pool_win w2 = pool_win_of(&g, 2, o2);
                    T best = -INFINITY;
                    int64_t at = (w0.lo * g.in[1] + w1.lo) * g.in[2] + w2.lo;
                    for (int64_t i0 = w0.lo; i0 < w0.hi; i0 += g.d[0])
                        for (int64_t i1 = w1.lo; i1 < w1.hi; i1 += g.d[1])
                            for (int64_t i2 = w2.lo; i2 < w2.hi; i2 += g.d[2]) {
                                int64_t i = (i0 * g.in[1] + i1) * g.in[2] + i2;
                                if (x[i] > best || isnan(x[i])) {
                                    best = x[i];
                                    at = i;
                                }
                            }
                    *y++ = best;
                    *idx++ = at;
                }
            }
        }
}

/* dx (NC, in) += dy (NC, out) at the maxima idx (NC, out). */
void FN(ai_maxpool_backward)(const ai_pool_params *p, T *dx, const T *dy,
                             const int64_t *idx)
{
    pool_geom g = pool_geom_of(p);
    FN(scatter)(dx, dy, idx, p->N * p->C, g.out_size, g.in_size);
}

/* The divisor of window (w0, w1, w2). */
static T FN(avg_divisor)(const ai_pool_params *p, pool_win w0, pool_win w1, pool_win w2)
{
    return p->count_include_pad ? (T)(w0.padded * w1.padded * w2.padded)
                                : (T)(w0.n * w1.n * w2.n);
}

/* y (NC, out) = mean of x (NC, in) over each window. */
void FN(ai_avgpool_forward)(const ai_pool_params *p, T *y, const T *x)
{
    pool_geom g = pool_geom_of(p);
    for (int64_t nc = 0; nc < p->N * p->C; nc++, x += g.in_size)
        for (int64_t o0 = 0; o0 < g.out[0]; o0++) {
            pool_win w0 = pool_win_of(&g, 0, o0);
            for (int64_t o1 = 0; o1 < g.out[1]; o1++) {
                pool_win w1 = pool_win_of(&g, 1, o1);
                for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
                    pool_win w2 = pool_win_of(&g, 2, o2);
                    T sum = 0;
                    for (int64_t i0 = w0.lo; i0 < w0.hi; i0 += g.d[0])
                        for (int64_t i1 = w1.lo; i1 < w1.hi; i1 += g.d[1])
                            for (int64_t i2 = w2.lo; i2 < w2.hi; i2 += g.d[2])
                                sum += x[(i0 * g.in[1] + i1) * g.in[2] + i2];
                    *y++ = sum / FN(avg_divisor)(p, w0, w1, w2);
                }
            }
        }
}

/* dx (NC, in) += dy (NC, out) / divisor over each window. */
void FN(ai_avgpool_backward)(const ai_pool_params *p, T *dx, const T *dy)
{
    pool_geom g = pool_geom_of(p);
    for (int64_t nc = 0; nc < p->N * p->C; nc++, dx += g.in_size)
        for (int64_t o0 = 0; o0 < g.out[0]; o0++) {
            pool_win w0 = pool_win_of(&g, 0, o0);
            for (int64_t o1 = 0; o1 < g.out[1]; o1++) {
                pool_win w1 = pool_win_of(&g, 1, o1);
                for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
                    pool_win w2 = pool_win_of(&g, 2, o2);
                    T grad = *dy++ / FN(avg_divisor)(p, w0, w1, w2);
                    for (int64_t i0 = w0.lo; i0 < w0.hi; i0 += g.d[0])
                        for (int64_t i1 = w1.lo; i1 < w1.hi; i1 += g.d[1])
                            for (int64_t i2 = w2.lo; i2 < w2.hi; i2 += g.d[2])
                                dx[(i0 * g.in[1] + i1) * g.in[2] + i2] += grad;
                }
            }
        }
}

/* y, idx (NC) = max of x (NC, S) over S, and where it is (MaxPool's rule). */
void FN(ai_global_maxpool_forward)(T *y, int64_t *idx, const T *x, int64_t NC, int64_t S)
{
    for (int64_t nc = 0; nc < NC; nc++, x += S) {
        T best = -INFINITY;
        int64_t at = 0;
        for (int64_t i = 0; i < S; i++)
            if (x[i] > best || isnan(x[i])) {
                best = x[i];
                at = i;
            }
        y[nc] = best;
        idx[nc] = at;
    }
}

/* dx (NC, S) += dy (NC) at the maxima idx (NC). */
void FN(ai_global_maxpool_backward)(T *dx, const T *dy, const int64_t *idx, int64_t NC,
                                    int64_t S)
{
    FN(scatter)(dx, dy, idx, NC, 1, S);
}

/* y (NC) = mean of x (NC, S) over S. */
void FN(ai_global_avgpool_forward)(T *y, const T *x, int64_t NC, int64_t S)
{
    for (int64_t nc = 0; nc < NC; nc++, x += S) {
        T sum = 0;
        for (int64_t i = 0; i < S; i++)
            sum += x[i];
        y[nc] = sum / (T)S;
    }
}

/* dx (NC, S) += dy (NC) / S. */
void FN(ai_global_avgpool_backward)(T *dx, const T *dy, int64_t NC, int64_t S)
{
    for (int64_t nc = 0; nc < NC; nc++, dx += S)
        for (int64_t i = 0; i < S; i++)
            dx[i] += dy[nc] / (T)S;
}

#undef T
#undef SFX
