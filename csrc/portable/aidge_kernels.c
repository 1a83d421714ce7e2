/*
 * aidge_kernels.c — see aidge_kernels.h. Plain loops over NCHW: these are
 * the reference kernels (the engine's quantized operators and every C
 * export run them), written to be read and ported, not to be fast.
 */
#include "aidge_kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* One body for both types: TACC is the accumulator, OUT(acc, oc) the stored value. */
#define AIK_CONV2D(TX, TACC, OUT)                                                        \
    const int32_t cg = p->c / p->group, mg = p->m / p->group;                            \
    for (int32_t n = 0; n < p->n; n++)                                                   \
        for (int32_t m = 0; m < p->m; m++) {                                             \
            const int32_t g = m / mg;                                                    \
            const TX *wm = w + (int64_t)m * cg * p->kh * p->kw;                          \
            TX *ym = y + ((int64_t)n * p->m + m) * p->oh * p->ow;                        \
            for (int32_t oy = 0; oy < p->oh; oy++)                                       \
                for (int32_t ox = 0; ox < p->ow; ox++) {                                 \
                    TACC acc = bias ? (TACC)bias[m] : (TACC)0;                           \
                    for (int32_t ci = 0; ci < cg; ci++) {                                \
                        const TX *xc = x + ((int64_t)n * p->c + (int64_t)g * cg + ci) *  \
                                               p->h * p->w;                              \
                        const TX *wc = wm + (int64_t)ci * p->kh * p->kw;                 \
                        for (int32_t ky = 0; ky < p->kh; ky++) {                         \
                            const int32_t iy = oy * p->sh - p->pt + ky * p->dh;          \
                            if (iy < 0 || iy >= p->h)                                    \
                                continue;                                                \
                            for (int32_t kx = 0; kx < p->kw; kx++) {                     \
                                const int32_t ix = ox * p->sw - p->pl + kx * p->dw;      \
                                if (ix < 0 || ix >= p->w)                                \
                                    continue;                                            \
                                acc += (TACC)xc[(int64_t)iy * p->w + ix] *               \
                                       (TACC)wc[ky * p->kw + kx];                        \
                            }                                                            \
                        }                                                                \
                    }                                                                    \
                    ym[(int64_t)oy * p->ow + ox] = OUT(acc, m);                          \
                }                                                                        \
        }

/* OUT(acc, oc): the value stored for output channel oc */
#define AIK_RQ(acc, oc) ((int8_t)aik_requant((acc), &rq[oc]))
#define AIK_CLAMPF(acc, oc) ((acc) < lo ? lo : (acc) > hi ? hi : (acc))

void aik_conv2d_i8(const aik_window *p, const int8_t *x, const int8_t *w,
                   const int32_t *bias, const aik_rq *rq, int8_t *y)
{
    AIK_CONV2D(int8_t, int32_t, AIK_RQ)
}

void aik_conv2d_f32(const aik_window *p, const float *x, const float *w, const float *bias,
                    float lo, float hi, float *y)
{
    AIK_CONV2D(float, float, AIK_CLAMPF)
}

#define AIK_FC(TX, TACC, OUT)                                                            \
    for (int64_t i = 0; i < n; i++)                                                      \
        for (int32_t j = 0; j < m; j++) {                                                \
            const TX *xi = x + i * k, *wj = w + (int64_t)j * k;                          \
            TACC acc = bias ? (TACC)bias[j] : (TACC)0;                                   \
            for (int32_t t = 0; t < k; t++)                                              \
                acc += (TACC)xi[t] * (TACC)wj[t];                                        \
            y[i * m + j] = OUT(acc, j);                                                  \
        }

void aik_fc_i8(int64_t n, int32_t k, int32_t m, const int8_t *x, const int8_t *w,
               const int32_t *bias, const aik_rq *rq, int8_t *y)
{
    AIK_FC(int8_t, int32_t, AIK_RQ)
}

void aik_fc_f32(int64_t n, int32_t k, int32_t m, const float *x, const float *w,
                const float *bias, float lo, float hi, float *y)
{
    AIK_FC(float, float, AIK_CLAMPF)
}

/* Pools: BODY sees the window through `first` (no valid element yet), v
 * (the element), and fills `acc` / `count`. */
#define AIK_POOL2D(TX, TACC, INIT, BODY, OUT)                                            \
    for (int64_t nc = 0; nc < (int64_t)p->n * p->c; nc++) {                              \
        const TX *xc = x + nc * p->h * p->w;                                             \
        TX *yc = y + nc * p->oh * p->ow;                                                 \
        for (int32_t oy = 0; oy < p->oh; oy++)                                           \
            for (int32_t ox = 0; ox < p->ow; ox++) {                                     \
                TACC acc = INIT;                                                         \
                int32_t count = 0;                                                       \
                for (int32_t ky = 0; ky < p->kh; ky++) {                                 \
                    const int32_t iy = oy * p->sh - p->pt + ky * p->dh;                  \
                    for (int32_t kx = 0; kx < p->kw; kx++) {                             \
                        const int32_t ix = ox * p->sw - p->pl + kx * p->dw;              \
                        if (iy < 0 || iy >= p->h || ix < 0 || ix >= p->w)                \
                            continue;                                                    \
                        const TX v = xc[(int64_t)iy * p->w + ix];                        \
                        BODY;                                                            \
                        count++;                                                         \
                    }                                                                    \
                }                                                                        \
                if (p->count_include_pad) /* windows lie inside the padded input */     \
                    count = p->kh * p->kw;                                               \
                yc[(int64_t)oy * p->ow + ox] = OUT;                                      \
            }                                                                            \
    }

void aik_maxpool2d_i8(const aik_window *p, const int8_t *x, int8_t *y)
{
    AIK_POOL2D(int8_t, int32_t, INT8_MIN, if (v > acc) acc = v, (int8_t)acc)
}

void aik_maxpool2d_f32(const aik_window *p, const float *x, float *y)
{
    AIK_POOL2D(float, float, -INFINITY, if (v > acc || v != v) acc = v, acc)
}

/* floor(sum / count + 1/2) = floor((2 sum + count) / (2 count)) */
static int8_t avg_i8(int32_t sum, int32_t count)
{
    if (count <= 0)
        return 0;
    int64_t num = 2 * (int64_t)sum + count, den = 2 * (int64_t)count;
    int64_t q = num / den;
    if (num % den != 0 && num < 0)
        q -= 1;
    return (int8_t)q;
}

void aik_avgpool2d_i8(const aik_window *p, const int8_t *x, int8_t *y)
{
    AIK_POOL2D(int8_t, int32_t, 0, acc += v, avg_i8(acc, count))
}

void aik_avgpool2d_f32(const aik_window *p, const float *x, float *y)
{
    AIK_POOL2D(float, float, 0.0f, acc += v, count > 0 ? acc / (float)count : 0.0f)
}

void aik_add_i8(int64_t n, const int8_t *a, int32_t ma, const int8_t *b, int32_t mb,
                int32_t shift, int32_t lo, int32_t hi, int8_t *y)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t v = aik_round_shift((int64_t)a[i] * ma + (int64_t)b[i] * mb, shift);
        y[i] = (int8_t)(v < lo ? lo : v > hi ? hi : v);
    }
}

void aik_add_f32(int64_t n, const float *a, const float *b, float *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

void aik_requant_i8(int64_t n, const int8_t *x, const aik_rq *rq, int8_t *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = (int8_t)aik_requant(x[i], rq);
}

void aik_clip_i8(int64_t n, const int8_t *x, int32_t lo, int32_t hi, int8_t *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = (int8_t)(x[i] < lo ? lo : x[i] > hi ? hi : x[i]);
}

void aik_clip_f32(int64_t n, const float *x, float lo, float hi, float *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i]; /* NaN passes, like torch.clamp */
}

void aik_concat(int64_t outer, int32_t k, const void *const *inputs,
                const int64_t *inner_bytes, void *y)
{
    unsigned char *dst = y;
    for (int64_t o = 0; o < outer; o++)
        for (int32_t i = 0; i < k; i++) {
            memcpy(dst, (const unsigned char *)inputs[i] + o * inner_bytes[i],
                   (size_t)inner_bytes[i]);
            dst += inner_bytes[i];
        }
}

int aik_check_i8(const char *layer, const int8_t *got, const int8_t *ref, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            printf("aidge_cmp: layer %s differs at element %lld: got %d, expected %d\n", layer,
                   (long long)i, got[i], ref[i]);
            return 1;
        }
    return 0;
}

int aik_check_f32(const char *layer, const float *got, const float *ref, int64_t n,
                  double atol, double rtol)
{
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (g != g && r != r)
            continue;
        if (!(fabs(g - r) <= atol + rtol * fabs(r))) {
            printf("aidge_cmp: layer %s differs at element %lld: got %.9g, expected %.9g\n",
                   layer, (long long)i, g, r);
            return 1;
        }
    }
    return 0;
}
