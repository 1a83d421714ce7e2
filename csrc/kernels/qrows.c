/*
 * qrows.c — the fast int8 transformer kernels (ops/quant_nonlinear.c):
 * QLookup, QSoftmax, QLayerNorm and QMatMul, the same integers, bit for bit,
 * as their portable twins aik_lookup_i8, aik_softmax_i8, aik_layernorm_i8
 * and aik_matmul_i8 (portable/aidge_kernels.c, what C exports run).
 *
 *   lookup     a byte gather; on VNNI with VBMI 64 bytes at a time by two
 *              128-byte permutations (vpermi2b) and a blend on the top bit
 *   softmax    rows threaded; on AVX-512 (the VNNI path) 16 values at a
 *              time, the row's one divisor 2 sum: each quotient from a
 *              double reciprocal, then corrected by one step each way, in
 *              doubles that hold the integers exactly; else the reference
 *              loop on each thread's rows
 *   layernorm  rows threaded; round_shift by arithmetic shifts instead of
 *              divisions, the integer square root from a double one,
 *              corrected to the exact floor
 *   matmul     each product of the batch on the int8 GEMM (qgemm.c): a
 *              (m, k) packed as its weights, b (k, n) as its panel, the
 *              requantization fused into the store; products threaded
 *
 * Threads split whole rows or whole products: a row's integers do not
 * depend on the split.
 */
#include <math.h>
#include <string.h>

#include "../parallel.h"
#include "qkernels.h"
#include "simd.h"
#ifdef AI_AVX512_KERNEL
#include <immintrin.h>
#define QR_X86 1
#endif

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

/* ---------------------------------------------------------------- lookup */

typedef struct {
    const int8_t *x, *table;
    int8_t *y;
    bool vbmi;
} lookup_job;

#ifdef QR_X86
__attribute__((target("arch=x86-64-v4,avx512vbmi"))) static void
lookup_vbmi(int64_t n, const int8_t *x, const int8_t *table, int8_t *y)
{
    /* u = x + 128 (x ^ 0x80): entries 0..127 from t0:t1, 128..255 from t2:t3 */
    const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
    const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
    const __m512i s = _mm512_set1_epi8((char)0x80);
    for (int64_t i = 0; i < n; i += 64) {
        const __mmask64 m = n - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (n - i)) - 1;
        const __m512i u = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + i), s);
        const __m512i lo = _mm512_permutex2var_epi8(t0, u, t1);
        const __m512i hi = _mm512_permutex2var_epi8(t2, u, t3);
        _mm512_mask_storeu_epi8(y + i, m,
                                _mm512_mask_blend_epi8(_mm512_movepi8_mask(u), lo, hi));
    }
}
#endif

static void lookup_range(void *ctx, int64_t lo, int64_t hi)
{
    const lookup_job *j = ctx;
#ifdef QR_X86
    if (j->vbmi) {
        lookup_vbmi(hi - lo, j->x + lo, j->table, j->y + lo);
        return;
    }
#endif
    aik_lookup_i8(hi - lo, j->x + lo, j->table, j->y + lo);
}

void ai_qlookup(int64_t n, const int8_t *x, const int8_t *table, int8_t *y)
{
    lookup_job j = {x, table, y, false};
#ifdef QR_X86
    j.vbmi = ai_q_path() >= AI_Q_VNNI && __builtin_cpu_supports("avx512vbmi");
#endif
    ai_parallel_for(n, 4 * AI_GRAIN_ELEMS, lookup_range, &j);
}

/* ---------------------------------------------------------------- softmax */

/* A softmax or layernorm value costs about 16 elementwise ones (gathers,
 * int64 or double arithmetic): rows split across threads from 16 times
 * fewer values than AI_GRAIN_ELEMS (a ViT's attention: 17 x 17 per head) */
#define ROW_COST 16

typedef struct {
    int32_t d, q, hi;
    const int8_t *x;
    const int32_t *e;
    int8_t *y;
} softmax_job;

#ifdef QR_X86
/* 16 values at a time: the row's int8 widened to int32, its exp_table
 * entries gathered (once: kept for the quotients in rows of at most EBUF
 * values). v = floor(num / den), num = 2 e q + sum < 2^53 and den = 2 sum,
 * as doubles exactly; num / den <= q + 1/2 < 129, so the estimate's
 * relative error of 2^-52 is under 1: its floor is v, v - 1 or v + 1, and
 * v den < 2^53 is exact for the checks. Sums from 2^44 (rows past 16384
 * values): the reference. */
#define EBUF 1024
__attribute__((target("arch=x86-64-v4"))) static void softmax_rows_avx512(const softmax_job *j,
                                                                          int64_t lo,
                                                                          int64_t hi)
{
    const int32_t d = j->d;
    const __m512d q2 = _mm512_set1_pd(2.0 * j->q), one = _mm512_set1_pd(1.0);
    const __m512d top = _mm512_set1_pd(j->hi);
    int32_t ebuf[EBUF];
    for (int64_t r = lo; r < hi; r++) {
        const int8_t *x = j->x + r * d;
        int8_t *y = j->y + r * d;
        __m512i mxv = _mm512_set1_epi32(INT8_MIN);
        for (int32_t i = 0; i < d; i += 16) {
            const __mmask16 m = d - i >= 16 ? 0xFFFF : (__mmask16)((1u << (d - i)) - 1);
            const __m512i xv = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, x + i));
            mxv = _mm512_mask_max_epi32(mxv, m, mxv, xv);
        }
        const __m512i mx = _mm512_set1_epi32(_mm512_reduce_max_epi32(mxv));
        __m512d sv = _mm512_setzero_pd();
        for (int32_t i = 0; i < d; i += 16) {
            const __mmask16 m = d - i >= 16 ? 0xFFFF : (__mmask16)((1u << (d - i)) - 1);
            const __m512i k = _mm512_sub_epi32(
                mx, _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, x + i)));
            const __m512i ev = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, k,
                                                           j->e, 4);
            if (d <= EBUF)
                _mm512_storeu_si512(ebuf + i, ev);
            sv = _mm512_add_pd(sv, _mm512_cvtepi32_pd(_mm512_castsi512_si256(ev)));
            sv = _mm512_add_pd(sv, _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(ev, 1)));
        }
        const double sum = _mm512_reduce_add_pd(sv);
        if (sum >= 0x1p44) {
            aik_softmax_i8(1, d, x, j->e, j->q, j->hi, y);
            continue;
        }
        const __m512d sumv = _mm512_set1_pd(sum), den = _mm512_set1_pd(2 * sum),
                      inv = _mm512_set1_pd(1.0 / (2 * sum));
        for (int32_t i = 0; i < d; i += 16) {
            const __mmask16 m = d - i >= 16 ? 0xFFFF : (__mmask16)((1u << (d - i)) - 1);
            const __m512i ev =
                d <= EBUF ? _mm512_loadu_si512(ebuf + i)
                          : _mm512_mask_i32gather_epi32(
                                _mm512_setzero_si512(), m,
                                _mm512_sub_epi32(mx, _mm512_cvtepi8_epi32(
                                                         _mm_maskz_loadu_epi8(m, x + i))),
                                j->e, 4);
            __m256i h[2];
            for (int t = 0; t < 2; t++) {
                const __m512d num = _mm512_add_pd(
                    _mm512_mul_pd(_mm512_cvtepi32_pd(t ? _mm512_extracti64x4_epi64(ev, 1)
                                                       : _mm512_castsi512_si256(ev)),
                                  q2),
                    sumv);
                __m512d v = _mm512_roundscale_pd(_mm512_mul_pd(num, inv),
                                                 _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                v = _mm512_mask_sub_pd(v, _mm512_cmp_pd_mask(_mm512_mul_pd(v, den), num,
                                                             _CMP_GT_OQ),
                                       v, one);
                v = _mm512_mask_add_pd(
                    v, _mm512_cmp_pd_mask(_mm512_mul_pd(_mm512_add_pd(v, one), den), num,
                                          _CMP_LE_OQ),
                    v, one);
                h[t] = _mm512_cvttpd_epi32(_mm512_min_pd(v, top));
            }
            const __m512i v32 = _mm512_inserti64x4(_mm512_castsi256_si512(h[0]), h[1], 1);
            _mm_mask_storeu_epi8(y + i, m, _mm512_cvtepi32_epi8(v32));
        }
    }
}
#endif

static void softmax_rows(void *ctx, int64_t lo, int64_t hi)
{
    const softmax_job *j = ctx;
#ifdef QR_X86
    if (ai_q_path() >= AI_Q_VNNI) {
        softmax_rows_avx512(j, lo, hi);
        return;
    }
#endif
    /* scalar, the reference's int64 divisions are as fast as any exact
     * quotient from doubles (AMD EPYC: 265 against 192 us, rows of 17) */
    aik_softmax_i8(hi - lo, j->d, j->x + lo * j->d, j->e, j->q, j->hi, j->y + lo * j->d);
}

void ai_qsoftmax(int64_t rows, int32_t d, const int8_t *x, const int32_t *exp_table, int32_t q,
                 int32_t hi, int8_t *y)
{
    softmax_job j = {d, q, hi, x, exp_table, y};
    ai_parallel_for(rows, ai_grain_of(ROW_COST * (int64_t)d), softmax_rows, &j);
}

/* ---------------------------------------------------------------- layernorm */

/* floor(sqrt(v)), v < 2^62: the double square root is within 1 of it */
static uint64_t isqrt_u64(uint64_t v)
{
    uint64_t r = (uint64_t)sqrt((double)v);
    while (r * r > v)
        r--;
    while ((r + 1) * (r + 1) <= v)
        r++;
    return r;
}

typedef struct {
    int32_t d, pre, lo, hi;
    int64_t eps;
    const int8_t *x;
    const int32_t *gamma;
    const int64_t *beta;
    int8_t *y;
} layernorm_job;

AI_WIDE_CLONES static void layernorm_range(void *ctx, int64_t lo, int64_t hi)
{
    const layernorm_job *j = ctx;
    const int32_t d = j->d, pre = j->pre, ylo = j->lo, yhi = j->hi;
    const int32_t *restrict gamma = j->gamma;
    const int64_t *restrict beta = j->beta;
    for (int64_t r = lo; r < hi; r++) {
        const int8_t *restrict x = j->x + r * d;
        int8_t *restrict y = j->y + r * d;
        int32_t sum = 0; /* |sum| <= 128 d <= 2^21 (ops: d <= 2^14) */
        for (int32_t i = 0; i < d; i++)
            sum += x[i];
        int64_t s2 = 0;
        for (int32_t i = 0; i < d; i++) {
            const int64_t c = (int64_t)d * x[i] - sum;
            s2 += c * c;
        }
        /* as the reference: 1 / sqrt(T) = 2^k m / 2^61 */
        int64_t m = 0;
        int32_t shift = 1;
        if (s2 > 0) {
            const uint64_t t = ((uint64_t)s2 << (2 * pre)) + (uint64_t)j->eps;
            const int32_t bits = 64 - __builtin_clzll(t);
            const int32_t k = (62 - bits) / 2;
            m = (int64_t)(((uint64_t)1 << 61) / isqrt_u64(t << (2 * k)));
            shift = 37 - pre - k; /* >= 7 */
        }
        /* aik_round_shift(v, s) = floor((v + 2^(s-1)) / 2^s): an arithmetic
         * shift (GCC's >> of a negative int64 is a floor) */
        const int64_t half = (int64_t)1 << (shift - 1);
        for (int32_t i = 0; i < d; i++) {
            const int64_t z = (((int64_t)d * x[i] - sum) * m + half) >> shift;
            const int64_t v = (z * gamma[i] + beta[i] + ((int64_t)1 << 39)) >> 40;
            y[i] = (int8_t)(v < ylo ? ylo : v > yhi ? yhi : v);
        }
    }
}

void ai_qlayernorm(int64_t rows, int32_t d, const int8_t *x, const int32_t *gamma,
                   const int64_t *beta, int64_t eps, int32_t pre, int32_t lo, int32_t hi,
                   int8_t *y)
{
    layernorm_job j = {d, pre, lo, hi, eps, x, gamma, beta, y};
    ai_parallel_for(rows, ai_grain_of(ROW_COST * (int64_t)d), layernorm_range, &j);
}

/* ---------------------------------------------------------------- matmul */

/* Workspace slots (one per part of the batch) */
#define QM_SLOTS 8

static size_t slot_bytes(int32_t m, int32_t k, int32_t n)
{
    return ALIGN64(ai_qweights_bytes(m, k)) + ALIGN64(ai_qpanel_bytes(k, n));
}

size_t ai_qmatmul_ws_bytes(int32_t m, int32_t k, int32_t n)
{
    return ALIGN64(sizeof(aik_rq) * (size_t)m) + QM_SLOTS * slot_bytes(m, k, n);
}

/* a (m, k) as GEMM weights (qkernels.h's layout, ai_qweights_pack with no
 * bias and whole rows, without its per-element divisions) */
static void pack_a(ai_qweights *q, void *mem, int32_t m, int32_t k, const int8_t *a)
{
    const int32_t kp = (k + 3) & ~3;
    char *b = mem;
    q->m = m, q->k = k, q->kp = kp;
    q->cb = (int32_t *)b;
    q->w8 = (int8_t *)(b + ALIGN64(sizeof(int32_t) * (size_t)m));
    q->w16 = (int16_t *)(b + ALIGN64(sizeof(int32_t) * (size_t)m) + ALIGN64((size_t)m * kp));
    for (int32_t r = 0; r < m; r++) {
        const int8_t *ar = a + (int64_t)r * k;
        int8_t *w8 = q->w8 + (int64_t)r * kp;
        int16_t *w16 = q->w16 + (int64_t)r * kp;
        int32_t sum = 0;
        for (int32_t i = 0; i < k; i++) {
            w8[i] = ar[i];
            w16[i] = ar[i];
            sum += ar[i];
        }
        for (int32_t i = k; i < kp; i++)
            w8[i] = 0, w16[i] = 0;
        /* -128 sum(a), wrapping as ai_qweights_pack's */
        q->cb[r] = (int32_t)(0u - 128u * (uint32_t)sum);
    }
}

typedef struct {
    int32_t m, k, n;
    const int8_t *a, *b;
    const aik_rq *rq;
    int8_t *y;
    char *ws;
    int64_t batch, n_slots;
} matmul_job;

static void matmul_range(void *ctx, int64_t lo, int64_t hi)
{
    const matmul_job *j = ctx;
    const int64_t sa = (int64_t)j->m * j->k, sb = (int64_t)j->k * j->n,
                  sy = (int64_t)j->m * j->n;
    const size_t wbytes = ALIGN64(ai_qweights_bytes(j->m, j->k));
    for (int64_t s = lo; s < hi; s++) {
        char *slot = j->ws + (size_t)s * slot_bytes(j->m, j->k, j->n);
        uint8_t *panel = (uint8_t *)(slot + wbytes);
        for (int64_t t = s * j->batch / j->n_slots; t < (s + 1) * j->batch / j->n_slots; t++) {
            ai_qweights q;
            pack_a(&q, slot, j->m, j->k, j->a + t * sa);
            ai_qpack_rows(j->k, j->n, j->b + t * sb, j->n, panel);
            ai_qgemm(&q, j->n, panel, j->rq, j->y + t * sy, j->n, 1);
        }
    }
}

void ai_qmatmul(int64_t batch, int32_t m, int32_t k, int32_t n, const int8_t *a,
                const int8_t *b, const aik_rq *rq, int8_t *y, void *ws)
{
    if (batch == 0 || m == 0 || n == 0)
        return;
    aik_rq *rqm = ws; /* the GEMM's requantization per row: m copies */
    for (int32_t i = 0; i < m; i++)
        rqm[i] = *rq;
    int64_t slots = ai_parallel_parts();
    slots = slots > QM_SLOTS ? QM_SLOTS : slots;
    matmul_job j = {m, k, n, a, b, rqm, y, (char *)ws + ALIGN64(sizeof(aik_rq) * (size_t)m),
                    batch, batch < slots ? batch : slots};
    ai_parallel_for(j.n_slots, 1, matmul_range, &j);
}
