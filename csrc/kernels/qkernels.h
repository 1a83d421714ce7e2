/*
 * qkernels.h — the engine's fast int8 kernels (the quantized operators of
 * ops/quant.c): the same integers, bit for bit, as the portable reference
 * kernels of portable/aidge_kernels.h, which C exports ship.
 *
 * Products: int8 x int8 -> int32 as a GEMM with the CPU's integer dot
 * products. The activations enter as unsigned bytes u = x + 128 (x ^ 0x80)
 * and each output channel's bias absorbs the offset, cb = bias - 128 sum(w):
 * cb + sum(u w) = bias + sum(x w), exact in wrapping int32 arithmetic since
 * the true sum fits (ops/quant.c refuses accumulators that may overflow).
 *
 *   VNNI   AVX-512 vpdpbusd: 4 u8 x s8 products per int32 lane
 *   AVX2   vpmaddwd on the bytes widened to int16 (vpmaddubsw's int16
 *          pair sums would saturate at 255 * 127 * 2)
 *   PLAIN  the same packed layout in C loops
 * The requantization (ai_q_requant, the reference's aik_requant without its
 * division) is fused into the store, per output channel (rq[m]); the _i32
 * variants store the int32 accumulators instead (ONNX's MatMulInteger and
 * ConvInteger), the same inner loops.
 *
 * Packed activations ("panels"): blocks of 16 columns (output positions);
 * a block holds, for each group of 4 reduction indices k (kp / 4 of them,
 * kp = k rounded up to 4), 16 x 4 bytes: column j's u at k..k+3. Columns
 * past the end and k past k hold u = 128 (x = 0).
 */
#ifndef AI_QKERNELS_H
#define AI_QKERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../portable/aidge_kernels.h"

/* The kernel paths, slowest first. AI_Q_REFERENCE: the portable kernels
 * themselves (what ops/quant.c then calls). */
enum { AI_Q_REFERENCE, AI_Q_PLAIN, AI_Q_AVX2, AI_Q_VNNI };

/* The path in use: the best the CPU and the build have, or less after
 * ai_q_set_path (tests and benchmarks compare the paths). */
int ai_q_path(void);
/* Uses at most `path` (clamped to what the CPU has); returns the path now used. */
int ai_q_set_path(int path);

/* aik_requant without its division (GCC's >> of a negative int64 is
 * arithmetic, a floor): p = acc multiplier + zero point 2^s, then
 * floor(p / 2^s + 1/2), or half to even floor((p + 2^(s-1) - 1 + bit s of
 * p) / 2^s), clamped. */
static inline int8_t ai_q_requant(int32_t acc, const aik_rq *r)
{
    int64_t v = (int64_t)acc * r->multiplier + r->zero_point * ((int64_t)1 << r->shift);
    if (r->shift > 0)
        v = (v + ((int64_t)1 << (r->shift - 1)) - (r->half_even ? 1 - ((v >> r->shift) & 1) : 0))
            >> r->shift;
    return (int8_t)(v < r->lo ? r->lo : v > r->hi ? r->hi : v);
}

/* Weights packed once per plan: m rows of k int8, each padded to kp with
 * zeros (w8, and widened w16 for the AVX2 path), and cb (above). */
typedef struct {
    int32_t m, k, kp;
    int32_t *cb;
    int8_t *w8;
    int16_t *w16;
} ai_qweights;

size_t ai_qweights_bytes(int32_t m, int32_t k);
/* w (m, k), bias (m) or NULL; mem: ai_qweights_bytes(m, k / seg * seg_pad),
 * 64-byte aligned. Each row's segments of seg weights are padded with zeros
 * to seg_pad (the rows of taps of QConv's row panels); seg = seg_pad = k:
 * the rows as they are. */
void ai_qweights_pack(ai_qweights *q, void *mem, int32_t m, int32_t k, int32_t seg,
                      int32_t seg_pad, const int8_t *w, const int32_t *bias);

/* y[r ldr + j ldj] = requant(cb[r] + sum_k w[r][k] u[k][j], rq[r]) for the
 * rows r < q->m and columns j < cols of panel xp (ceil(cols / 16) blocks). */
void ai_qgemm(const ai_qweights *q, int64_t cols, const uint8_t *xp, const aik_rq *rq,
              int8_t *y, int64_t ldr, int64_t ldj);

/* The int32 store of ai_qgemm_i32: y[r ldr + j ldj] = acc + u[j] v[r] (u
 * NULL: acc), wrapping, for the panel's columns j (u indexed from its first). */
typedef struct {
    int32_t *y;
    int64_t ldr, ldj;
    const int32_t *u, *v;
} ai_qi32;

/* ai_qgemm with the int32 store instead of the requantization: no rq. */
void ai_qgemm_i32(const ai_qweights *q, int64_t cols, const uint8_t *xp, const ai_qi32 *o);

/* y[i cols + j] = requant(acc[i lda + j], r), i < rows, j < cols (AVX-512
 * on the VNNI path, AVX2 on the AVX2 path). */
void ai_q_store_rows(const int32_t *acc, int64_t rows, int64_t cols, int64_t lda,
                     const aik_rq *r, int8_t *y);

/* Bytes of the packed panel of `cols` columns of k rows. */
static inline size_t ai_qpanel_bytes(int32_t k, int64_t cols)
{
    return (size_t)((cols + 15) / 16) * 16 * (size_t)((k + 3) & ~3);
}

#ifdef __SSE2__
#include <emmintrin.h>
/* One 64-byte block of a panel: 16 columns of 4 rows r[0..3], each column's
 * 4 bytes together (the order vpdpbusd reads). */
static inline void ai_qpanel_block(uint8_t *dst, const __m128i r[4])
{
    const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpackhi_epi8(r[0], r[1]);
    const __m128i b0 = _mm_unpacklo_epi8(r[2], r[3]), b1 = _mm_unpackhi_epi8(r[2], r[3]);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi16(a0, b0));
    _mm_storeu_si128((__m128i *)(dst + 16), _mm_unpackhi_epi16(a0, b0));
    _mm_storeu_si128((__m128i *)(dst + 32), _mm_unpacklo_epi16(a1, b1));
    _mm_storeu_si128((__m128i *)(dst + 48), _mm_unpackhi_epi16(a1, b1));
}
#endif

/* Panel of `cols` columns from k rows of int8 (row i at rows + i * ld). */
void ai_qpack_rows(int32_t k, int64_t cols, const int8_t *rows, int64_t ld, uint8_t *xp);

/* Workspace and state of the operators (ops/quant.c). The weight pack of
 * QConv (not depthwise) and QGemm lives in the node's state: *state_bytes;
 * scratch per call: *ws_bytes. */
void ai_qconv_sizes(const aik_window *p, size_t *ws_bytes, size_t *state_bytes);
void ai_qfc_sizes(int64_t n, int32_t k, int32_t m, size_t *ws_bytes, size_t *state_bytes);

/* The operators. `state` (zeroed per plan) caches the weight pack when
 * `const_weights` (weight and bias constants of the plan); rq: m entries. */
void ai_qconv(const aik_window *p, const int8_t *x, const int8_t *w, const int32_t *bias,
              const aik_rq *rq, int8_t *y, void *state, bool const_weights, void *ws);
void ai_qfc(int64_t n, int32_t k, int32_t m, const int8_t *x, const int8_t *w,
            const int32_t *bias, const aik_rq *rq, int8_t *y, void *state, bool const_weights,
            void *ws);
/* ai_qconv with the int32 store: y = the accumulators (bias included), no rq. */
void ai_qconv_i32(const aik_window *p, const int8_t *x, const int8_t *w, const int32_t *bias,
                  int32_t *y, void *state, bool const_weights, void *ws);
/* ai_qfc with the int32 store: y[i m + r] = acc[i][r] + u[i] v[r] (u NULL:
 * acc; v: m values), acc = bias[r] + sum_k x[i][k] w[r][k] wrapping. */
void ai_qfc_i32(int64_t n, int32_t k, int32_t m, const int8_t *x, const int8_t *w,
                const int32_t *bias, const int32_t *u, const int32_t *v, int32_t *y, void *state,
                bool const_weights, void *ws);
void ai_qmaxpool(const aik_window *p, const int8_t *x, int8_t *y);
void ai_qavgpool(const aik_window *p, const int8_t *x, int8_t *y);
void ai_qadd(int64_t n, const int8_t *a, int32_t ma, const int8_t *b, int32_t mb,
             int32_t shift, int32_t lo, int32_t hi, int8_t *y);
void ai_qrequant(int64_t n, const int8_t *x, const aik_rq *rq, int8_t *y);

/* ONNX Runtime's QLinearAdd (ops/qlinear.c) in integers, bit for bit its
 * float64 definition c = clamp(rint(v) + cz), v = (as (a - az) + bs (b -
 * bz)) / cs, on uint8 (u8) or int8 operands and output:
 *   P = A a + B b + C0 (int64), A = round(as / cs 2^K), B = round(bs / cs
 *   2^K), C0 = cz 2^K + 2^(K-1) - A az - B bz, K = 30 - the exponent of
 *   the greater ratio (A, B < 2^30), in [16, 52];
 *   then P = 2^K (v + cz + 1/2) within 256 (the rounding of A and B, 1/2
 *   each per unit of |a - az| <= 255) and the float64 v within 2^-50 255
 *   (as + bs) / cs of the exact one: where the remainder r = P mod 2^K is
 *   in [D, 2^K - D], D = 512 + that error in units of 2^-K, both sit
 *   strictly between the same two integers and c = clamp(P >> K). Other
 *   values (r near 0: v within about 2^-21 of a tie k + 1/2, exact ties
 *   included) take the definition itself (`ai_qladd_exact`).
 * Paths: VNNI (AVX-512), AVX2 (4 int64 lanes, vpmuldq), plain C; the
 * reference is the definition on every element (ops/qlinear.c). */
typedef struct {
    int64_t A, B, C0, D;
    int32_t K, lo, hi;
    bool u8;
    double as, az, bs, bz, cs, cz; /* the definition's, for values near a tie */
} ai_qladd;

/* false where the integers do not apply (a scale not positive and finite,
 * K outside [16, 52]) */
bool ai_qladd_init(ai_qladd *p, double as, double az, double bs, double bz, double cs,
                   double cz, bool u8);
/* y[i] = c(a[i sa], b[i sb]), i < n; sa, sb: 1, or 0 (one value for all) */
void ai_qladd_run(const ai_qladd *p, int64_t n, const void *a, int64_t sa, const void *b,
                  int64_t sb, void *y);

/* sums[i c + ch] = the sum of the s values x[i][ch][...] (channels first)
 * or x[i][...][ch] (last), x (n, c, s) or (n, s, c) of uint8 (u8) or int8:
 * QLinearGlobalAveragePool's (ops/qlinear.c requantizes them). */
void ai_qsums(int64_t n, int64_t c, int64_t s, bool last, bool u8, const void *x,
              int64_t *sums);

/* The transformer operators (ops/quant_nonlinear.c, qrows.c): the integers
 * of aik_lookup_i8, aik_softmax_i8, aik_layernorm_i8 and aik_matmul_i8.
 * ai_qmatmul's workspace: ai_qmatmul_ws_bytes(m, k, n). */
void ai_qlookup(int64_t n, const int8_t *x, const int8_t *table, int8_t *y);
void ai_qsoftmax(int64_t rows, int32_t d, const int8_t *x, const int32_t *exp_table, int32_t q,
                 int32_t hi, int8_t *y);
void ai_qlayernorm(int64_t rows, int32_t d, const int8_t *x, const int32_t *gamma,
                   const int64_t *beta, int64_t eps, int32_t pre, int32_t lo, int32_t hi,
                   int8_t *y);
size_t ai_qmatmul_ws_bytes(int32_t m, int32_t k, int32_t n);
void ai_qmatmul(int64_t batch, int32_t m, int32_t k, int32_t n, const int8_t *a,
                const int8_t *b, const aik_rq *rq, int8_t *y, void *ws);

#endif
