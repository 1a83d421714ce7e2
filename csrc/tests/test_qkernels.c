/* test_qkernels.c — the fast int8 kernels (kernels/qkernels.h) against the
 * portable reference kernels, bit for bit, on every path the CPU has:
 * random convolutions (dense, grouped, depthwise, pointwise, strided,
 * dilated, padded), fully connected layers, pools, QAdd and Requantize;
 * the transformer kernels (QLookup, QSoftmax, QLayerNorm, QMatMul). */
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

static int8_t *rand_i8(int64_t n)
{
    int8_t *v = malloc((size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = (int8_t)rnd(-128, 127);
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
        for (int t = 0; t < 120; t++) {
            aik_window p;
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
    ai_q_set_path(AI_Q_VNNI);
}

TEST(qfc_matches_reference_on_every_path)
{
    for (int path = AI_Q_PLAIN; path <= AI_Q_VNNI; path++) {
        if (ai_q_set_path(path) != path)
            continue;
        for (int t = 0; t < 20; t++) {
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
        for (int64_t n = 1; n < 40; n += 3) {
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
    CASE(qpools_and_elementwise_match_reference),
    CASE(qtransformer_kernels_match_reference_on_every_path),
    {NULL, NULL},
};
