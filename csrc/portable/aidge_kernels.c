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

/* floor(sum / count + 1/2) = floor((2 sum + count) / (2 count)); with
 * half_even a tie goes to the even neighbour */
static int8_t avg_i8(int32_t sum, int32_t count, int32_t half_even)
{
    if (count <= 0)
        return 0;
    int64_t q = sum / count, r = sum % count; /* to floor: r in [0, count) */
    if (r < 0)
        q -= 1, r += count;
    if (2 * r > count || (2 * r == count && (!half_even || q % 2 != 0)))
        q += 1;
    return (int8_t)q;
}

void aik_avgpool2d_i8(const aik_window *p, const int8_t *x, int32_t half_even, int8_t *y)
{
    AIK_POOL2D(int8_t, int32_t, 0, acc += v, avg_i8(acc, count, half_even))
}

void aik_avgpool2d_f32(const aik_window *p, const float *x, float *y)
{
    AIK_POOL2D(float, float, 0.0f, acc += v, count > 0 ? acc / (float)count : 0.0f)
}

void aik_add_i8(int64_t n, const int8_t *a, int32_t ma, const int8_t *b, int64_t nb,
                int32_t mb, int32_t shift, int32_t lo, int32_t hi, int32_t half_even, int8_t *y)
{
    for (int64_t i = 0, j = 0; i < n; i++, j = j + 1 == nb ? 0 : j + 1) {
        const int64_t s = (int64_t)a[i] * ma + (int64_t)b[j] * mb;
        const int64_t v = half_even ? aik_round_shift_even(s, shift) : aik_round_shift(s, shift);
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

void aik_lookup_i8(int64_t n, const int8_t *x, const int8_t *table, int8_t *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = table[x[i] + 128];
}

void aik_softmax_i8(int64_t rows, int32_t d, const int8_t *x, const int32_t *exp_table,
                    int32_t q, int32_t hi, int8_t *y)
{
    for (int64_t r = 0; r < rows; r++, x += d, y += d) {
        int32_t mx = INT8_MIN;
        for (int32_t i = 0; i < d; i++)
            mx = x[i] > mx ? x[i] : mx;
        int64_t sum = 0; /* >= exp_table[0] = 2^30 */
        for (int32_t i = 0; i < d; i++)
            sum += exp_table[mx - x[i]];
        for (int32_t i = 0; i < d; i++) {
            int64_t v = (2 * (int64_t)exp_table[mx - x[i]] * q + sum) / (2 * sum);
            y[i] = (int8_t)(v > hi ? hi : v);
        }
    }
}

/* floor(sqrt(v)), digit by digit */
static uint64_t isqrt_u64(uint64_t v)
{
    uint64_t r = 0, bit = (uint64_t)1 << 62;
    while (bit > v)
        bit >>= 2;
    for (; bit; bit >>= 2) {
        if (v >= r + bit) {
            v -= r + bit;
            r = (r >> 1) + bit;
        } else {
            r >>= 1;
        }
    }
    return r;
}

void aik_layernorm_i8(int64_t rows, int32_t d, const int8_t *x, const int32_t *gamma,
                      const int64_t *beta, int64_t eps, int32_t pre, int32_t lo, int32_t hi,
                      int8_t *y)
{
    for (int64_t r = 0; r < rows; r++, x += d, y += d) {
        int64_t sum = 0, s2 = 0;
        for (int32_t i = 0; i < d; i++)
            sum += x[i];
        for (int32_t i = 0; i < d; i++) {
            const int64_t c = (int64_t)d * x[i] - sum;
            s2 += c * c;
        }
        /* 1 / sqrt(T) = 2^k m / 2^61, r in [2^30, 2^31) */
        int64_t m = 0;
        int32_t shift = 0;
        if (s2 > 0) {
            const uint64_t t = ((uint64_t)s2 << (2 * pre)) + (uint64_t)eps;
            int32_t bits = 0;
            while (bits < 64 && (t >> bits) != 0)
                bits++;
            const int32_t k = (62 - bits) / 2;
            m = (int64_t)(((uint64_t)1 << 61) / isqrt_u64(t << (2 * k)));
            shift = 37 - pre - k; /* >= 7: T >= 2^(2 pre + 1) when s2 > 0 */
        }
        for (int32_t i = 0; i < d; i++) {
            const int64_t z = m ? aik_round_shift(((int64_t)d * x[i] - sum) * m, shift) : 0;
            int64_t v = aik_round_shift(z * gamma[i] + beta[i], 40);
            y[i] = (int8_t)(v < lo ? lo : v > hi ? hi : v);
        }
    }
}

void aik_matmul_i8(int64_t batch, int32_t m, int32_t k, int32_t n, const int8_t *a,
                   const int8_t *b, const aik_rq *rq, int8_t *y)
{
    for (int64_t t = 0; t < batch; t++, a += (int64_t)m * k, b += (int64_t)k * n,
                                        y += (int64_t)m * n)
        for (int32_t i = 0; i < m; i++)
            for (int32_t j = 0; j < n; j++) {
                int32_t acc = 0;
                for (int32_t p = 0; p < k; p++)
                    acc += (int32_t)a[(int64_t)i * k + p] * (int32_t)b[(int64_t)p * n + j];
                y[(int64_t)i * n + j] = (int8_t)aik_requant(acc, rq);
            }
}

void aik_transpose(int32_t ndim, const int64_t *shape, const int32_t *perm, int32_t size,
                   const void *x, void *y)
{
    int64_t stride[8], idx[8], total = 1, off = 0;
    for (int32_t i = ndim - 1; i >= 0; i--) {
        stride[i] = total;
        total *= shape[i];
        idx[i] = 0;
    }
    const unsigned char *src = x;
    unsigned char *dst = y;
    for (int64_t t = 0; t < total; t++) {
        memcpy(dst + t * size, src + off * size, (size_t)size);
        for (int32_t i = ndim - 1; i >= 0; i--) { /* next output index */
            off += stride[perm[i]];
            if (++idx[i] < shape[perm[i]])
                break;
            off -= stride[perm[i]] * shape[perm[i]];
            idx[i] = 0;
        }
    }
}

void aik_gather(int64_t outer, int64_t len, int32_t count, const int64_t *idx,
                int64_t inner_bytes, const void *x, void *y)
{
    const unsigned char *src = x;
    unsigned char *dst = y;
    for (int64_t o = 0; o < outer; o++)
        for (int32_t j = 0; j < count; j++, dst += inner_bytes)
            memcpy(dst, src + (o * len + idx[j]) * inner_bytes, (size_t)inner_bytes);
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
