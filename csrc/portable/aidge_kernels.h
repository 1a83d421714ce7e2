/*
 * aidge_kernels.h — portable reference kernels of the quantized (int8) and
 * float32 layers: the engine runs its quantized operators on them and
 * aidge_interop.export_c copies them, unchanged, into every exported C
 * project. C99, libc only, no allocation, NCHW layout.
 *
 * Integer semantics (the same everywhere, documented in docs/quantization.md):
 *   acc    = bias + sum(x * w)                       int32 accumulator
 *   y      = clamp(round_shift(acc * multiplier + zero_point * 2^shift, shift), lo, hi)
 *   round_shift(v, s) = floor(v / 2^s + 1/2)         rounding half up, or
 *                       half to even (half_even: ONNX's rounding)
 * Convolutions and fully connected layers requantize each output channel
 * with its own aik_rq (per-channel weight scales); a per-tensor layer
 * passes m copies of one.
 * Average pools divide with the same rounding: floor(sum / count + 1/2)
 * (or ties to even).
 */
#ifndef AIDGE_KERNELS_H
#define AIDGE_KERNELS_H

#include <stdint.h>

/* Requantization of an accumulator to the output's integer range. */
typedef struct {
    int32_t multiplier; /* 1 (or a power of two) with single-shift scaling */
    int16_t shift;      /* right shift, 0..62 */
    int16_t lo, hi;     /* output clamp: the int range, or [0, hi] for a fused ReLU */
    int16_t zero_point; /* added before the rounding, as onnx.reference's QLinearConv and
                         * QLinearMatMul round (acc m + zp); 0 in quantize's graphs */
    int16_t half_even;  /* ties: 0 up, 1 to the even neighbour */
} aik_rq;

/* A 2-D window over NCHW (1-D layers use h = kh = 1). */
typedef struct {
    int32_t n, c, h, w;      /* input */
    int32_t m, oh, ow;       /* output channels (pools: m = c) and size */
    int32_t kh, kw;          /* kernel */
    int32_t sh, sw;          /* strides */
    int32_t dh, dw;          /* dilations */
    int32_t pt, pl;          /* padding before (top, left); after is implied by oh, ow */
    int32_t group;           /* convolutions: groups (c and m divisible) */
    int32_t count_include_pad; /* average pools */
} aik_window;

/* floor(v / 2^s + 1/2) for any sign, 0 <= s <= 62 (s == 0: v). */
static inline int64_t aik_round_shift(int64_t v, int32_t s)
{
    if (s <= 0)
        return v;
    const int64_t d = (int64_t)1 << s;
    const int64_t t = v + (d >> 1);
    int64_t q = t / d; /* C truncates toward zero */
    if (t % d != 0 && t < 0)
        q -= 1;
    return q;
}

/* v / 2^s rounded half to even, for any sign, 0 <= s <= 62 (s == 0: v). */
static inline int64_t aik_round_shift_even(int64_t v, int32_t s)
{
    if (s <= 0)
        return v;
    const int64_t d = (int64_t)1 << s;
    int64_t q = v / d, r = v % d; /* C truncates toward zero: to floor, r in [0, d) */
    if (r < 0)
        q -= 1, r += d;
    if (r > d / 2 || (r == d / 2 && q % 2 != 0))
        q += 1;
    return q;
}

static inline int32_t aik_requant(int64_t acc, const aik_rq *r)
{
    const int64_t p = acc * (int64_t)r->multiplier + r->zero_point * ((int64_t)1 << r->shift);
    const int64_t v = r->half_even ? aik_round_shift_even(p, r->shift)
                                   : aik_round_shift(p, r->shift);
    return (int32_t)(v < r->lo ? r->lo : v > r->hi ? r->hi : v);
}

/* Convolutions: w is (m, c / group, kh, kw), bias (m) or NULL; rq is an
 * array of m requantizations, rq[oc] for output channel oc. */
void aik_conv2d_i8(const aik_window *p, const int8_t *x, const int8_t *w,
                   const int32_t *bias, const aik_rq *rq, int8_t *y);
void aik_conv2d_f32(const aik_window *p, const float *x, const float *w, const float *bias,
                    float lo, float hi, float *y);

/* Fully connected: y (n, m) = x (n, k) . w (m, k)^T + bias (m) or NULL;
 * rq is an array of m requantizations, rq[j] for output column j. */
void aik_fc_i8(int64_t n, int32_t k, int32_t m, const int8_t *x, const int8_t *w,
               const int32_t *bias, const aik_rq *rq, int8_t *y);
void aik_fc_f32(int64_t n, int32_t k, int32_t m, const float *x, const float *w,
                const float *bias, float lo, float hi, float *y);

/* Pools (p->m unused). Max pools ignore padding. */
void aik_maxpool2d_i8(const aik_window *p, const int8_t *x, int8_t *y);
void aik_maxpool2d_f32(const aik_window *p, const float *x, float *y);
void aik_avgpool2d_i8(const aik_window *p, const int8_t *x, int32_t half_even, int8_t *y);
void aik_avgpool2d_f32(const aik_window *p, const float *x, float *y);

/* Elementwise over n values. add_i8: y = clamp(round_shift(a*ma + b*mb, shift)); b
 * holds nb values repeated over a (nb == n: same shapes; a constant that
 * broadcasts over the leading axes otherwise). half_even (here and in
 * avgpool2d_i8): ties to the even neighbour, else up. */
void aik_add_i8(int64_t n, const int8_t *a, int32_t ma, const int8_t *b, int64_t nb,
                int32_t mb, int32_t shift, int32_t lo, int32_t hi, int32_t half_even, int8_t *y);
void aik_add_f32(int64_t n, const float *a, const float *b, float *y);
void aik_requant_i8(int64_t n, const int8_t *x, const aik_rq *rq, int8_t *y);
void aik_clip_i8(int64_t n, const int8_t *x, int32_t lo, int32_t hi, int8_t *y);
void aik_clip_f32(int64_t n, const float *x, float lo, float hi, float *y);

/* Concatenation of k inputs along one axis: `outer` blocks, input i gives
 * inner_bytes[i] bytes per block. */
void aik_concat(int64_t outer, int32_t k, const void *const *inputs,
                const int64_t *inner_bytes, void *y);

/* Integer nonlinear layers (docs/quantization.md gives their error bounds).
 * lookup_i8: y = table[x + 128] (Sigmoid, Tanh, GELU: the function rounded
 * at each of the 256 int8 inputs). */
void aik_lookup_i8(int64_t n, const int8_t *x, const int8_t *table, int8_t *y);
/* Softmax over rows of d values: e_i = exp_table[max - x_i] (round(2^30 *
 * exp(-k s_in)), k = 0..255), y_i = min(floor((2 e_i q + sum) / (2 sum)), hi):
 * round(q e_i / sum), the output scale 1 / q. */
void aik_softmax_i8(int64_t rows, int32_t d, const int8_t *x, const int32_t *exp_table,
                    int32_t q, int32_t hi, int8_t *y);
/* LayerNorm over rows of d values: c_i = d x_i - sum x, T = (sum c_i^2 << 2 pre)
 * + eps, z_i = c_i 2^pre / sqrt(T) in Q24 (integer square root), y_i =
 * clamp(round_shift(z_i gamma_i + beta_i, 24 + 16), lo, hi). */
void aik_layernorm_i8(int64_t rows, int32_t d, const int8_t *x, const int32_t *gamma,
                      const int64_t *beta, int64_t eps, int32_t pre, int32_t lo, int32_t hi,
                      int8_t *y);
/* Batched product of two activations: y (batch, m, n) = a (batch, m, k) b
 * (batch, k, n), int32 accumulators requantized. */
void aik_matmul_i8(int64_t batch, int32_t m, int32_t k, int32_t n, const int8_t *a,
                   const int8_t *b, const aik_rq *rq, int8_t *y);

/* Data movement of elements of `size` bytes. transpose: y = x with its axes
 * permuted (y axis i is x axis perm[i]; ndim <= 8). gather: along one axis
 * of `len` elements (outer blocks of inner_bytes each), y takes the slices
 * idx[0..count). */
void aik_transpose(int32_t ndim, const int64_t *shape, const int32_t *perm, int32_t size,
                   const void *x, void *y);
void aik_gather(int64_t outer, int64_t len, int32_t count, const int64_t *idx,
                int64_t inner_bytes, const void *x, void *y);

/* Layer checks of exported programs: 0 when equal (floats: within
 * |got - ref| <= atol + rtol * |ref|), else prints the first mismatch and
 * returns 1. */
int aik_check_i8(const char *layer, const int8_t *got, const int8_t *ref, int64_t n);
int aik_check_f32(const char *layer, const float *got, const float *ref, int64_t n,
                  double atol, double rtol);

#endif
