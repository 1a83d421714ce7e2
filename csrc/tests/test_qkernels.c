/* test_qkernels.c — the fast int8 kernels (kernels/qkernels.h) against the
 * portable reference kernels, bit for bit, on every path the CPU has:
 * random convolutions (dense, grouped, depthwise, pointwise, strided,
 * dilated, padded), fully connected layers, pools, QAdd and Requantize, of
 * random and of extreme values; the transformer kernels (QLookup, QSoftmax,
 * QLayerNorm, QMatMul); ONNX Runtime's QLinearAdd against its float64
 * definition on every pair of bytes, QLinearGlobalAveragePool's sums
 * against plain ones. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/qkernels.h"
#include "../parallel.h"
#include "ctest.h"

static uint64_t rng_state = 88172645463325252u;

static int32_t rnd(int32_t lo, int32_t hi) /* in [lo, hi] */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (int32_t)(lo + (int64_t)(rng_state % (uint64_t)((int64_t)hi - lo + 1)));
}

/* extreme values (-128 and 127 mostly: the int16 pair sums of vpmaddubsw
 * would saturate; u = x + 128 of 0 and 255) where `extremes` is set */
static bool extremes;

static int8_t *rand_i8(int64_t n)
{
    static const int8_t edge[6] = {-128, 127, -128, 127, -127, 0};
    int8_t *v = malloc((size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = extremes ? edge[rnd(0, 5)] : (int8_t)rnd(-128, 127);
    return v;
}

static aik_rq rand_rq(void)
{
    const int32_t mults[3] = {1, rnd(1, 1 << 20), INT32_MAX};
    const int32_t m = mults[rnd(0, 2)];
    const int32_t shift = m == 1 ? rnd(0, 12) : m == INT32_MAX ? rnd(38, 44) : rnd(20, 32);
    /* also a zero point (ONNX's QLinear operators) and ties to even */
    const int16_t zp = (int16_t)(rnd(0, 2) ? 0 : rnd(-100, 100));
    return (aik_rq){m, (int16_t)shift, (int16_t)(rnd(0, 1) ? 0 : -128), 127, zp,
                    (int16_t)rnd(0, 1)};
}

/* a window of random geometry; false when a dimension comes out empty */
static bool rand_window(aik_window *p, int kind)
{
    memset(p, 0, sizeof *p);
    p->n = rnd(1, 3);
    p->group = kind == 1 ? rnd(1, 9) : kind == 2 ? rnd(2, 3) : 1;
    const int32_t cg = kind == 1 ? 1 : rnd(1, 12), mg = kind == 1 ? 1 : rnd(1, 21);
    p->c = p->group * cg, p->m = p->group * mg;
    const bool pw = kind == 3;
    p->kh = pw ? 1 : rnd(1, 6), p->kw = pw ? 1 : rnd(1, 6);
    p->sh = pw ? 1 : rnd(1, 2), p->sw = pw ? 1 : rnd(1, 3);
    p->dh = pw ? 1 : rnd(1, 2), p->dw = pw ? 1 : rnd(1, 2);
    p->h = rnd(1, 14), p->w = rnd(1, 20);
    const int32_t sph = p->dh * (p->kh - 1) + 1, spw = p->dw * (p->kw - 1) + 1;
    p->pt = pw ? 0 : rnd(0, sph - 1), p->pl = pw ? 0 : rnd(0, spw - 1);
    const int32_t pb = pw ? 0 : rnd(0, sph - 1), pr = pw ? 0 : rnd(0, spw - 1);
    if (p->h + p->pt + pb < sph || p->w + p->pl + pr < spw)
        return false;
    p->oh = (p->h + p->pt + pb - sph) / p->sh + 1;
    p->ow = (p->w + p->pl + pr - spw) / p->sw + 1;
    return true;
}

TEST(qconv_matches_reference_on_every_path)
{
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 180; t++) {
            aik_window p;
            extremes = t >= 120; /* 60 of extreme values */
            if (!rand_window(&p, t % 4))
                continue;
            const int32_t k = p.c / p.group * p.kh * p.kw;
            const int64_t nx = (int64_t)p.n * p.c * p.h * p.w, ny = (int64_t)p.n * p.m * p.oh * p.ow;
            int8_t *x = rand_i8(nx), *w = rand_i8((int64_t)p.m * k);
            int8_t *y = malloc((size_t)ny), *yr = malloc((size_t)ny);
            int32_t *b = malloc(sizeof(int32_t) * (size_t)p.m);
            aik_rq *rq = malloc(sizeof(aik_rq) * (size_t)p.m);
            const aik_rq r = rand_rq(); /* per tensor, or one per channel (odd t) */
            for (int32_t i = 0; i < p.m; i++)
                b[i] = rnd(-100000, 100000), rq[i] = t % 2 ? rand_rq() : r;
            size_t ws, st;
            ai_qconv_sizes(&p, &ws, &st);
            void *wsp = aligned_alloc(64, (ws + 63) / 64 * 64 + 64);
            void *stp = aligned_alloc(64, (st + 63) / 64 * 64 + 64);
            memset(stp, 0, st + 64);
            aik_conv2d_i8(&p, x, w, b, rq, yr);
            for (int again = 0; again < 2; again++) { /* the second from the cached pack */
                memset(y, 0x55, (size_t)ny);
                ai_qconv(&p, x, w, b, rq, y, stp, true, wsp);
                CHECK(memcmp(y, yr, (size_t)ny) == 0);
            }
            free(x), free(w), free(y), free(yr), free(b), free(rq), free(wsp), free(stp);
        }
    }
    extremes = false;
    ai_q_set_path(AI_Q_VNNI);
}

TEST(qfc_matches_reference_on_every_path)
{
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 30; t++) {
            extremes = t >= 20;
            const int64_t n = rnd(1, 140);
            const int32_t k = rnd(1, 200), m = rnd(1, 40);
            int8_t *x = rand_i8(n * k), *w = rand_i8((int64_t)m * k);
            int8_t *y = malloc((size_t)(n * m)), *yr = malloc((size_t)(n * m));
            int32_t *b = malloc(sizeof(int32_t) * (size_t)m);
            aik_rq *rq = malloc(sizeof(aik_rq) * (size_t)m);
            const aik_rq r = rand_rq(); /* per tensor, or one per channel (odd t) */
            for (int32_t i = 0; i < m; i++)
                b[i] = rnd(-100000, 100000), rq[i] = t % 2 ? rand_rq() : r;
            size_t ws, st;
            ai_qfc_sizes(n, k, m, &ws, &st);
            void *wsp = aligned_alloc(64, (ws + 63) / 64 * 64 + 64);
            void *stp = aligned_alloc(64, (st + 63) / 64 * 64 + 64);
            aik_fc_i8(n, k, m, x, w, b, rq, yr);
            ai_qfc(n, k, m, x, w, b, rq, y, stp, false, wsp);
            CHECK(memcmp(y, yr, (size_t)(n * m)) == 0);
            free(x), free(w), free(y), free(yr), free(b), free(rq), free(wsp), free(stp);
        }
    }
    extremes = false;
    ai_q_set_path(AI_Q_VNNI);
}

/* the int32 store of the convolutions (ConvInteger's): bias + the window
 * sums (x = 0 in the padding), against a direct loop */
TEST(qconv_i32_matches_direct_sums_on_every_path)
{
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 80; t++) {
            aik_window p;
            if (!rand_window(&p, t % 4))
                continue;
            const int32_t cg = p.c / p.group, mg = p.m / p.group, k = cg * p.kh * p.kw;
            const int64_t nx = (int64_t)p.n * p.c * p.h * p.w, os = (int64_t)p.oh * p.ow;
            const int64_t ny = (int64_t)p.n * p.m * os;
            int8_t *x = rand_i8(nx), *w = rand_i8((int64_t)p.m * k);
            int32_t *y = malloc(sizeof(int32_t) * (size_t)ny);
            int32_t *b = malloc(sizeof(int32_t) * (size_t)p.m);
            for (int32_t i = 0; i < p.m; i++)
                b[i] = rnd(-INT32_MAX, INT32_MAX);
            size_t ws, st;
            ai_qconv_sizes(&p, &ws, &st);
            void *wsp = aligned_alloc(64, (ws + 63) / 64 * 64 + 64);
            void *stp = aligned_alloc(64, (st + 63) / 64 * 64 + 64);
            memset(stp, 0, st + 64);
            ai_qconv_i32(&p, x, w, b, y, stp, false, wsp);
            bool same = true;
            for (int64_t e = 0; e < ny; e++) {
                const int64_t n = e / (p.m * os), m = e / os % p.m, oy = e % os / p.ow,
                              ox = e % p.ow, g = m / mg;
                int64_t sum = b[m];
                for (int32_t ci = 0; ci < cg; ci++)
                    for (int32_t ky = 0; ky < p.kh; ky++)
                        for (int32_t kx = 0; kx < p.kw; kx++) {
                            const int64_t iy = oy * p.sh - p.pt + ky * p.dh;
                            const int64_t ix = ox * p.sw - p.pl + kx * p.dw;
                            if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w)
                                continue;
                            sum += (int64_t)x[((n * p.c + g * cg + ci) * p.h + iy) * p.w + ix] *
                                   w[((m * cg + ci) * p.kh + ky) * p.kw + kx];
                        }
                same &= y[e] == (int32_t)(uint32_t)(uint64_t)sum;
            }
            CHECK(same);
            free(x), free(w), free(y), free(b), free(wsp), free(stp);
        }
    }
    ai_q_set_path(AI_Q_VNNI);
}

/* the int32 store (MatMulInteger's): bias + x w^T + u v^T in wrapping int32,
 * against the sums in int64 (large biases and u v wrap) */
TEST(qfc_i32_matches_reference_on_every_path)
{
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 20; t++) {
            const int64_t n = rnd(1, 140);
            const int32_t k = rnd(1, 200), m = rnd(1, 40);
            int8_t *x = rand_i8(n * k), *w = rand_i8((int64_t)m * k);
            int32_t *y = malloc(sizeof(int32_t) * (size_t)(n * m));
            int32_t *b = malloc(sizeof(int32_t) * (size_t)m);
            int32_t *v = malloc(sizeof(int32_t) * (size_t)m);
            int32_t *u = malloc(sizeof(int32_t) * (size_t)n);
            for (int32_t i = 0; i < m; i++)
                b[i] = rnd(-INT32_MAX, INT32_MAX), v[i] = rnd(-100000, 100000);
            for (int64_t i = 0; i < n; i++)
                u[i] = rnd(-100000, 100000);
            const bool with_u = t % 2;
            size_t ws, st;
            ai_qfc_sizes(n, k, m, &ws, &st);
            void *wsp = aligned_alloc(64, (ws + 63) / 64 * 64 + 64);
            void *stp = aligned_alloc(64, (st + 63) / 64 * 64 + 64);
            ai_qfc_i32(n, k, m, x, w, b, with_u ? u : NULL, v, y, stp, false, wsp);
            bool same = true;
            for (int64_t i = 0; i < n; i++)
                for (int32_t r = 0; r < m; r++) {
                    int64_t s = b[r] + (with_u ? (int64_t)u[i] * v[r] : 0);
                    for (int32_t e = 0; e < k; e++)
                        s += (int64_t)x[i * k + e] * w[(int64_t)r * k + e];
                    same &= y[i * m + r] == (int32_t)(uint32_t)(uint64_t)s;
                }
            CHECK(same);
            free(x), free(w), free(y), free(b), free(v), free(u), free(wsp), free(stp);
        }
    }
    ai_q_set_path(AI_Q_VNNI);
}

TEST(qpools_and_elementwise_match_reference)
{
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 40; t++) {
            aik_window p;
            if (!rand_window(&p, 0))
                continue;
            p.m = p.c, p.group = 1, p.count_include_pad = rnd(0, 1);
            /* windows of padding only are refused by ops/quant.c */
            if (p.pt >= p.kh || p.pl >= p.kw || p.dh > 1 || p.dw > 1)
                continue;
            const int64_t nx = (int64_t)p.n * p.c * p.h * p.w, ny = (int64_t)p.n * p.c * p.oh * p.ow;
            int8_t *x = rand_i8(nx), *y = malloc((size_t)ny), *yr = malloc((size_t)ny);
            ai_qmaxpool(&p, x, y);
            aik_maxpool2d_i8(&p, x, yr);
            CHECK(memcmp(y, yr, (size_t)ny) == 0);
            ai_qavgpool(&p, x, y);
            aik_avgpool2d_i8(&p, x, 0, yr);
            CHECK(memcmp(y, yr, (size_t)ny) == 0);
            free(x), free(y), free(yr);
        }
        for (int32_t w = 2; w <= 70; w += 17) { /* 2x2 max pools of stride 2 (LeNet's) */
            aik_window p;
            memset(&p, 0, sizeof p);
            p.n = 2, p.c = p.m = 3, p.group = 1, p.h = 13, p.w = w, p.kh = p.kw = 2;
            p.sh = p.sw = 2, p.dh = p.dw = 1, p.oh = 6, p.ow = w / 2;
            const int64_t nx = (int64_t)p.n * p.c * p.h * p.w, ny = (int64_t)p.n * p.c * p.oh * p.ow;
            int8_t *x = rand_i8(nx), *y = malloc((size_t)ny), *yr = malloc((size_t)ny);
            ai_qmaxpool(&p, x, y);
            aik_maxpool2d_i8(&p, x, yr);
            CHECK(memcmp(y, yr, (size_t)ny) == 0);
            free(x), free(y), free(yr);
        }
        for (int64_t n = 1; n < 80; n += 3) {
            extremes = n >= 40;
            int8_t *a = rand_i8(n), *b = rand_i8(n), *y = malloc((size_t)n), *yr = malloc((size_t)n);
            const int32_t ma = rnd(-INT32_MAX, INT32_MAX), mb = rnd(-INT32_MAX, INT32_MAX);
            const int32_t sh = rnd(25, 40);
            ai_qadd(n, a, ma, b, mb, sh, -128, 127, y);
            aik_add_i8(n, a, ma, b, n, mb, sh, -128, 127, 0, yr);
            CHECK(memcmp(y, yr, (size_t)n) == 0);
            const aik_rq r = rand_rq();
            ai_qrequant(n, a, &r, y);
            aik_requant_i8(n, a, &r, yr);
            CHECK(memcmp(y, yr, (size_t)n) == 0);
            free(a), free(b), free(y), free(yr);
        }
    }
    extremes = false;
    ai_q_set_path(AI_Q_VNNI);
}

/* ops/qlinear.c's definition of QLinearAdd */
static int32_t qladd_definition(double as, double az, double bs, double bz, double cs,
                                double cz, bool u8, int32_t a, int32_t b)
{
    const double v = rint((as * ((double)a - az) + bs * ((double)b - bz)) / cs) + cz;
    const double lo = u8 ? 0 : -128, hi = u8 ? 255 : 127;
    return v < lo ? (int32_t)lo : v > hi ? (int32_t)hi : (int32_t)v;
}

TEST(qlinear_add_matches_its_definition_on_every_path)
{
    /* all 65536 (a, b) of random scales and zero points, and of scales whose
     * ratios land on ties (powers of two: c = (a - az + b - bz) / 2 ...) */
    uint8_t *a = malloc(65536), *b = malloc(65536), *y = malloc(65536);
    for (int32_t i = 0; i < 65536; i++)
        a[i] = (uint8_t)(i >> 8), b[i] = (uint8_t)i;
    for (int t = 0; t < 12; t++) {
        const bool u8 = t & 1, ties = t % 4 >= 2;
        const double as = ties ? ldexp(1, rnd(-8, -4)) : (float)(rnd(1000, 1000000) * 1e-7);
        const double bs = ties ? ldexp(1, rnd(-8, -4)) : (float)(rnd(1000, 1000000) * 1e-7);
        const double cs = ties ? ldexp(1, rnd(-7, -3)) : (float)(rnd(1000, 1000000) * 1e-7);
        const double az = u8 ? rnd(0, 255) : rnd(-128, 127), bz = u8 ? rnd(0, 255) : rnd(-128, 127);
        const double cz = u8 ? rnd(0, 255) : rnd(-128, 127);
        ai_qladd p;
        if (!ai_qladd_init(&p, as, az, bs, bz, cs, cz, u8))
            continue; /* (ratios past [2^-22, 2^14]: ops/qlinear.c's loop) */
        for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
            if (ai_q_set_path(path) != path)
                continue;
            for (int sa = 0; sa <= 1; sa++) { /* a one value (the first) or all */
                memset(y, 0xa5, 65536);
                ai_qladd_run(&p, 65536 - t, a, sa, b, 1, y);
                for (int32_t i = 0; i < 65536 - t; i++) {
                    const int32_t va = u8 ? a[i * sa] : (int8_t)a[i * sa];
                    const int32_t vb = u8 ? b[i] : (int8_t)b[i];
                    const int32_t want = qladd_definition(as, az, bs, bz, cs, cz, u8, va, vb);
                    if ((u8 ? (int32_t)y[i] : (int32_t)(int8_t)y[i]) != want) {
                        CHECK(false);
                        break;
                    }
                }
            }
        }
    }
    ai_q_set_path(AI_Q_VNNI);
    ai_qladd p;
    CHECK(ai_qladd_init(&p, 0.02, 0, 0.03, 0, 0.04, 0, false)); /* ratios 1/2, 3/4 */
    CHECK(!ai_qladd_init(&p, 0.02, 0, 0.03, 0, 0, 0, false));   /* cs = 0 */
    CHECK(!ai_qladd_init(&p, 1e5, 0, 1, 0, 1, 0, false));        /* ratio past 2^14 */
    free(a), free(b), free(y);
}

TEST(qlinear_global_pool_sums_match_plain_ones)
{
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 30; t++) {
            const int64_t n = rnd(1, 3), c = rnd(1, 9), s = rnd(1, 300);
            const bool last = t & 1, u8 = t & 2;
            int8_t *x = rand_i8(n * c * s);
            int64_t *sums = malloc(sizeof(int64_t) * (size_t)(n * c));
            ai_qsums(n, c, s, last, u8, x, sums);
            for (int64_t i = 0; i < n; i++)
                for (int64_t ch = 0; ch < c; ch++) {
                    int64_t want = 0;
                    for (int64_t k = 0; k < s; k++) {
                        const int8_t v = x[last ? (i * s + k) * c + ch : (i * c + ch) * s + k];
                        want += u8 ? (uint8_t)v : v;
                    }
                    CHECK(sums[i * c + ch] == want);
                }
            free(x), free(sums);
        }
    }
    ai_q_set_path(AI_Q_VNNI);
}

/* QLookup, QSoftmax, QLayerNorm, QMatMul (kernels/qrows.c), at 1 and 2 threads */
TEST(qtransformer_kernels_match_reference_on_every_path)
{
    int32_t exp_table[256];
    int8_t table[256];
    for (int i = 0; i < 256; i++) /* decreasing, from 2^30 */
        exp_table[i] = i ? exp_table[i - 1] - rnd(0, exp_table[i - 1] / 8) : INT32_C(1) << 30,
        table[i] = (int8_t)rnd(-128, 127);
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 24; t++) {
            ai_set_num_threads(1 + t % 2);
            const int64_t rows = rnd(1, t % 4 ? 40 : 3000);
            const int32_t d = rnd(1, t % 3 ? 40 : 800);
            const int64_t n = rows * d;
            int8_t *x = rand_i8(n), *y = malloc((size_t)n), *yr = malloc((size_t)n);
            if (t % 5 == 0)
                memset(x, rnd(-128, 127), (size_t)d); /* a constant row */
            ai_qlookup(n, x, table, y);
            aik_lookup_i8(n, x, table, yr);
            CHECK(memcmp(y, yr, (size_t)n) == 0);
            const int32_t q = rnd(127, 128), hi = rnd(90, 127);
            ai_qsoftmax(rows, d, x, exp_table, q, hi, y);
            aik_softmax_i8(rows, d, x, exp_table, q, hi, yr);
            CHECK(memcmp(y, yr, (size_t)n) == 0);
            int32_t *gamma = malloc(sizeof(int32_t) * (size_t)d);
            int64_t *beta = malloc(sizeof(int64_t) * (size_t)d);
            for (int32_t i = 0; i < d; i++) {
                gamma[i] = rnd(-(1 << 24), 1 << 24);
                beta[i] = (int64_t)rnd(-(1 << 30), 1 << 30) * 1024;
            }
            const int32_t pre = rnd(0, 6);
            const int64_t eps = rnd(0, 1) ? rnd(0, 1 << 20) : (int64_t)rnd(0, 1 << 20) << 30;
            ai_qlayernorm(rows, d, x, gamma, beta, eps, pre, -127, 127, y);
            aik_layernorm_i8(rows, d, x, gamma, beta, eps, pre, -127, 127, yr);
            CHECK(memcmp(y, yr, (size_t)n) == 0);
            free(x), free(y), free(yr), free(gamma), free(beta);

            const int64_t batch = rnd(1, 12);
            const int32_t m = rnd(1, 70), k = rnd(1, 90), nn = rnd(1, 80);
            int8_t *a = rand_i8(batch * m * k), *b = rand_i8(batch * k * nn);
            int8_t *c = malloc((size_t)(batch * m * nn)), *cr = malloc((size_t)(batch * m * nn));
            const aik_rq r = rand_rq();
            void *ws = aligned_alloc(64, (ai_qmatmul_ws_bytes(m, k, nn) + 63) / 64 * 64);
            ai_qmatmul(batch, m, k, nn, a, b, &r, c, ws);
            aik_matmul_i8(batch, m, k, nn, a, b, &r, cr);
            CHECK(memcmp(c, cr, (size_t)(batch * m * nn)) == 0);
            free(a), free(b), free(c), free(cr), free(ws);
        }
    }
    ai_set_num_threads(1);
    ai_q_set_path(AI_Q_VNNI);
}

const ctest_case qkernel_cases[] = {
    CASE(qconv_matches_reference_on_every_path),
    CASE(qfc_matches_reference_on_every_path),
    CASE(qfc_i32_matches_reference_on_every_path),
    CASE(qconv_i32_matches_direct_sums_on_every_path),
    CASE(qpools_and_elementwise_match_reference),
    CASE(qlinear_add_matches_its_definition_on_every_path),
    CASE(qlinear_global_pool_sums_match_plain_ones),
    CASE(qtransformer_kernels_match_reference_on_every_path),
    {NULL, NULL},
};
