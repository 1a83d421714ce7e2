/*
 * signal.c — the signal operators: DFT, STFT, MelWeightMatrix and the
 * windows HannWindow, HammingWindow, BlackmanWindow.
 *
 * A complex tensor is a real one whose last dimension holds (real,
 * imaginary); a real signal has a last dimension of 1. Transforms run on
 * one line at a time in float64 (float32 tensors are widened): a radix-2
 * FFT when the length is a power of two, Bluestein's chirp-z transform (a
 * circular convolution by radix-2 FFTs of a power-of-two length >= 2n - 1)
 * otherwise, so every length costs O(n log n).
 *
 *   DFT   y = post(F(pre(x))): pre reads the first dft_length values along
 *         the axis (zero-padded), and for the IRFFT (onesided, inverse) the
 *         first dft_length / 2 + 1 then fills the rest by conjugate
 *         symmetry; F is the DFT (e^{-2 pi i kn/N}) or the inverse DFT
 *         (e^{+2 pi i kn/N} / N); post keeps dft_length / 2 + 1 bins
 *         (onesided forward) or the real part (IRFFT).
 *   STFT  y[b, f] = DFT(window * signal[b, f * frame_step : ... + frame_length])
 *
 * DFT and STFT are linear, and backward applies the adjoint of each step in
 * reverse: the adjoint of the DFT is the unnormalised inverse DFT (F^H), of
 * the inverse DFT the forward DFT over N, of a truncation a zero-padding
 * and back, of taking the real part a real embedding, of the conjugate-
 * symmetric fill the sum dX[k] += conj(dY[N - k]). STFT's window gets
 * sum over frames of Re(conj(g) * frame), g = F^H(dy). The scalars
 * (dft_length, axis, frame_step, frame_length) set shapes: they must be
 * known when the graph is planned, and get no gradient.
 *
 * The windows and MelWeightMatrix compute their values as ONNX's reference
 * does (onnx/reference/ops/op_*_window.py, op_mel_weight_matrix.py), in
 * float64, then cast to output_datatype.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---------------------------------------------------------------- FFT */

/* A transform of length n and direction sign (-1 forward, +1 inverse,
 * unnormalised) run in place on split real and imaginary arrays. */
typedef struct {
    int64_t n, m;         /* length; m: the power-of-two length of the radix-2 pass */
    int sign;
    double *tw_re, *tw_im; /* e^{sign 2 pi i k / m}, k < m / 2 */
    /* Bluestein (n not a power of two): chirp c[k] = e^{sign pi i k^2 / n},
     * the FFT of b[j] = conj(c[j]) (j in (-n, n), wrapped mod m), and
     * scratch of length m */
    double *c_re, *c_im, *b_re, *b_im, *w_re, *w_im;
} fft_plan;

static bool is_pow2(int64_t n) { return n > 0 && !(n & (n - 1)); }

static void fft_pow2(const fft_plan *p, double *re, double *im)
{
    const int64_t m = p->m;
    for (int64_t i = 1, j = 0; i < m; i++) { /* bit reversal */
        int64_t bit = m >> 1;
        for (; j & bit; bit >>= 1)
            j ^= bit;
        j |= bit;
        if (i < j) {
            double t = re[i]; re[i] = re[j]; re[j] = t;
            t = im[i]; im[i] = im[j]; im[j] = t;
        }
    }
    for (int64_t len = 2; len <= m; len <<= 1) {
        const int64_t half = len >> 1, step = m / len;
        for (int64_t s = 0; s < m; s += len)
            for (int64_t k = 0; k < half; k++) {
                const double wr = p->tw_re[k * step], wi = p->tw_im[k * step];
                double *ar = re + s + k, *ai = im + s + k;
                double *br = ar + half, *bi = ai + half;
                const double tr = *br * wr - *bi * wi, ti = *br * wi + *bi * wr;
                *br = *ar - tr;
                *bi = *ai - ti;
                *ar += tr;
                *ai += ti;
            }
    }
}

static void fft_plan_free(fft_plan *p)
{
    free(p->tw_re);
    memset(p, 0, sizeof *p);
}

static ai_status fft_plan_init(fft_plan *p, int64_t n, int sign)
{
    memset(p, 0, sizeof *p);
    p->n = n;
    p->sign = sign;
    p->m = n;
    const bool blue = !is_pow2(n);
    if (blue)
        for (p->m = 1; p->m < 2 * n - 1; p->m <<= 1) {
        }
    const int64_t m = p->m;
    /* one allocation: twiddles (m/2 each), then for Bluestein the chirp (n
     * each), b (m each), scratch (m each) */
    const size_t count = (size_t)(m / 2 + 1) * 2 + (blue ? (size_t)n * 2 + (size_t)m * 4 : 0);
    double *mem = malloc(count * sizeof(double));
    if (!mem)
        return ai_error(AI_ERR_NOMEM, "out of memory for a DFT of length %lld", (long long)n);
    p->tw_re = mem;
    p->tw_im = mem + m / 2 + 1;
    for (int64_t k = 0; k < m / 2; k++) {
        p->tw_re[k] = cos(2 * M_PI * (double)k / (double)m);
        p->tw_im[k] = sign * sin(2 * M_PI * (double)k / (double)m);
    }
    if (!blue)
        return AI_OK;
    double *q = p->tw_im + m / 2 + 1;
    p->c_re = q; q += n;
    p->c_im = q; q += n;
    p->b_re = q; q += m;
    p->b_im = q; q += m;
    p->w_re = q; q += m;
    p->w_im = q;
    for (int64_t k = 0; k < n; k++) {
        /* k^2 mod 2n keeps the angle small (exact for n < 2^31) */
        const int64_t k2 = (int64_t)(((unsigned __int128)k * (unsigned __int128)k) %
                                     (unsigned __int128)(2 * n));
        p->c_re[k] = cos(M_PI * (double)k2 / (double)n);
        p->c_im[k] = sign * sin(M_PI * (double)k2 / (double)n);
    }
    memset(p->b_re, 0, sizeof(double) * (size_t)m * 2);
    for (int64_t k = 0; k < n; k++) {
        p->b_re[k] = p->c_re[k];
        p->b_im[k] = -p->c_im[k];
        if (k) {
            p->b_re[m - k] = p->c_re[k];
            p->b_im[m - k] = -p->c_im[k];
        }
    }
    fft_pow2(p, p->b_re, p->b_im);
    return AI_OK;
}

/* re, im (length n) <- their transform */
static void fft_run(fft_plan *p, double *re, double *im)
{
    if (p->m == p->n) {
        fft_pow2(p, re, im);
        return;
    }
    const int64_t n = p->n, m = p->m;
    double *wr = p->w_re, *wi = p->w_im;
    for (int64_t k = 0; k < n; k++) { /* a = x c */
        wr[k] = re[k] * p->c_re[k] - im[k] * p->c_im[k];
        wi[k] = re[k] * p->c_im[k] + im[k] * p->c_re[k];
    }
    memset(wr + n, 0, sizeof(double) * (size_t)(m - n));
    memset(wi + n, 0, sizeof(double) * (size_t)(m - n));
    fft_pow2(p, wr, wi);
    for (int64_t k = 0; k < m; k++) { /* A B, conjugated: the inverse as a forward pass */
        const double r = wr[k] * p->b_re[k] - wi[k] * p->b_im[k];
        const double i = wr[k] * p->b_im[k] + wi[k] * p->b_re[k];
        wr[k] = r;
        wi[k] = -i;
    }
    fft_pow2(p, wr, wi);
    for (int64_t k = 0; k < n; k++) { /* X = c conj(that) / m */
        const double r = wr[k] / (double)m, i = -wi[k] / (double)m;
        re[k] = r * p->c_re[k] - i * p->c_im[k];
        im[k] = r * p->c_im[k] + i * p->c_re[k];
    }
}

/* ---------------------------------------------------------------- helpers */

static ai_status float_input(const ai_ctx *c, int i, const char *what)
{
    const ai_dtype dt = c->in[i]->dtype;
    if (dt != AI_F32 && dt != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "%s is %s; float32 or float64 expected",
                             what, ai_dtype_name(dt));
    return AI_OK;
}

/* The complex-parts dimension of input i (its last): 1 real, 2 complex. */
static ai_status parts_of(const ai_ctx *c, int i, const char *what, int64_t *parts)
{
    const ai_tensor *x = c->in[i];
    *parts = x->ndim ? x->shape[x->ndim - 1] : 0;
    if (*parts != 1 && *parts != 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "%s's last dimension is %lld; 1 (real) "
                             "or 2 (real, imaginary) expected", what,
                             x->ndim ? (long long)*parts : -1LL);
    return AI_OK;
}

/* Input i, an optional integer scalar: *out = dflt when absent. */
static ai_status opt_int(const ai_ctx *c, int i, const char *name, int64_t dflt, int64_t *out)
{
    *out = dflt;
    if (i >= c->n_in || !c->in[i])
        return AI_OK;
    return ai_ctx_int_scalar(c, i, name, out);
}

/* ---------------------------------------------------------------- DFT */

typedef struct {
    int64_t outer, inner; /* elements before the axis, between it and the parts */
    int64_t len_in, parts_in, len_out, parts_out;
    int64_t n;            /* dft_length */
    int64_t n_read;       /* values read along the axis: min(len_in, n or n/2+1) */
    bool inverse, onesided;
} dft_geom;

static ai_status dft_geometry(const ai_ctx *c, dft_geom *g, int *axis_out)
{
    const ai_node *nd = c->node;
    const ai_tensor *x = c->in[0];
    ai_status st;
    int64_t inverse, onesided, axis;
    if ((st = float_input(c, 0, "input")) || (st = ai_attr_int(nd, "inverse", 0, &inverse)) ||
        (st = ai_attr_int(nd, "onesided", 0, &onesided)))
        return st;
    if (nd->opset < 20)
        st = ai_attr_int(nd, "axis", 1, &axis);
    else
        st = opt_int(c, 2, "axis", -2, &axis);
    if (st || (st = parts_of(c, 0, "input", &g->parts_in)))
        return st;
    const int r = x->ndim;
    if (r < 2 || axis < -r || axis > r - 2 || axis == -1)
        return ai_node_error(nd, AI_ERR_VALUE, "axis %lld is out of range for an input of "
                             "rank %d: [-%d, -2] or [0, %d] (the last dimension holds the "
                             "complex parts)", (long long)axis, r, r, r - 2);
    const int a = (int)(axis < 0 ? axis + r : axis);
    g->inverse = inverse != 0;
    g->onesided = onesided != 0;
    g->len_in = x->shape[a];
    const bool irfft = g->inverse && g->onesided;
    if ((st = opt_int(c, 1, "dft_length", irfft ? 2 * (g->len_in - 1) : g->len_in, &g->n)))
        return st;
    if (g->n < 1)
        return ai_node_error(nd, AI_ERR_VALUE, "dft_length is %lld%s; at least 1 expected",
                             (long long)g->n, c->in[1] ? "" : " (from the input's length)");
    const int64_t read = irfft ? g->n / 2 + 1 : g->n;
    g->n_read = g->len_in < read ? g->len_in : read;
    g->len_out = g->onesided && !g->inverse ? g->n / 2 + 1 : g->n;
    g->parts_out = irfft ? 1 : 2;
    g->outer = 1;
    g->inner = 1;
    for (int d = 0; d < a; d++)
        g->outer *= x->shape[d];
    for (int d = a + 1; d < r - 1; d++)
        g->inner *= x->shape[d];
    *axis_out = a;
    return AI_OK;
}

static ai_status dft_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    *state = sizeof(dft_geom); /* forward keeps its geometry for backward */
    dft_geom g;
    int a = 0;
    ai_status st = dft_geometry(c, &g, &a);
    if (st)
        return st;
    const ai_tensor *x = c->in[0];
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    out[0].shape[a] = g.len_out;
    out[0].shape[x->ndim - 1] = g.parts_out;
    return AI_OK;
}

/* One pass over every line: forward (x -> y) or its adjoint (dy -> dx,
 * accumulated). */
static ai_status dft_run(const ai_ctx *c, const dft_geom *g, const ai_tensor *src,
                         ai_tensor *dst, bool adjoint)
{
    const int64_t n = g->n, m = g->n / 2 + 1;
    const bool irfft = g->inverse && g->onesided;
    /* the adjoint of F (sign s, scale) is F with sign -s, same scale */
    const int sign = (g->inverse ? 1 : -1) * (adjoint ? -1 : 1);
    const double scale = g->inverse ? 1.0 / (double)n : 1.0;
    const int64_t src_len = adjoint ? g->len_out : g->len_in;
    const int64_t src_parts = adjoint ? g->parts_out : g->parts_in;
    const int64_t dst_len = adjoint ? g->len_in : g->len_out;
    const int64_t dst_parts = adjoint ? g->parts_in : g->parts_out;
    const int64_t n_load = adjoint ? g->len_out : g->n_read;
    const int64_t n_store = adjoint ? g->n_read : g->len_out;
    fft_plan p;
    ai_status st = fft_plan_init(&p, n, sign);
    if (st)
        return ai_node_error(c->node, st, "%s", ai_last_error());
    double *re = malloc(sizeof(double) * (size_t)n * 2);
    if (!re) {
        fft_plan_free(&p);
        return ai_error(AI_ERR_NOMEM, "out of memory");
    }
    double *im = re + n;
    for (int64_t o = 0; o < g->outer; o++)
        for (int64_t i = 0; i < g->inner; i++) {
            const int64_t s0 = o * src_len * g->inner + i, d0 = o * dst_len * g->inner + i;
            memset(re, 0, sizeof(double) * (size_t)n * 2);
            for (int64_t k = 0; k < n_load; k++) {
                const int64_t at = (s0 + k * g->inner) * src_parts;
                re[k] = ai_float_at(src, at);
                im[k] = src_parts == 2 ? ai_float_at(src, at + 1) : 0.0;
            }
            if (irfft && !adjoint) /* the conjugate-symmetric rest */
                for (int64_t k = 1; k < m && n - k >= m; k++) {
                    re[n - k] = re[k];
                    im[n - k] = -im[k];
                }
            fft_run(&p, re, im);
            if (irfft && adjoint)
                for (int64_t k = 1; k < m && n - k >= m; k++) {
                    re[k] += re[n - k];
                    im[k] -= im[n - k];
                }
            for (int64_t k = 0; k < n_store; k++) {
                const int64_t at = (d0 + k * g->inner) * dst_parts;
                if (adjoint) {
                    ai_float_set(dst, at, ai_float_at(dst, at) + re[k] * scale);
                    if (dst_parts == 2)
                        ai_float_set(dst, at + 1, ai_float_at(dst, at + 1) + im[k] * scale);
                } else {
                    ai_float_set(dst, at, re[k] * scale);
                    if (dst_parts == 2)
                        ai_float_set(dst, at + 1, im[k] * scale);
                }
            }
        }
    free(re);
    fft_plan_free(&p);
    return AI_OK;
}

static ai_status dft_forward(ai_ctx *c)
{
    dft_geom g;
    int a = 0;
    ai_status st = dft_geometry(c, &g, &a);
    if (st)
        return st;
    *(dft_geom *)c->state = g;
    return dft_run(c, &g, c->in[0], c->out[0], false);
}

static ai_status dft_backward(ai_ctx *c)
{
    if (!c->din[0])
        return AI_OK;
    return dft_run(c, (const dft_geom *)c->state, c->dout[0], c->din[0], true);
}

/* ---------------------------------------------------------------- STFT */

typedef struct {
    int64_t batch, len, parts; /* signal [batch][len][parts] */
    int64_t step, flen, frames, bins;
} stft_geom;

static ai_status stft_geometry(const ai_ctx *c, stft_geom *g)
{
    const ai_node *nd = c->node;
    const ai_tensor *x = c->in[0], *w = c->n_in > 2 ? c->in[2] : NULL;
    ai_status st;
    int64_t onesided;
    if ((st = float_input(c, 0, "signal")) || (st = ai_attr_int(nd, "onesided", 1, &onesided)))
        return st;
    if (x->ndim != 3)
        return ai_node_error(nd, AI_ERR_VALUE, "signal has rank %d; [batch, length, 1 or 2] "
                             "expected", x->ndim);
    if ((st = parts_of(c, 0, "signal", &g->parts)) ||
        (st = ai_ctx_int_scalar(c, 1, "frame_step", &g->step)))
        return st;
    g->batch = x->shape[0];
    g->len = x->shape[1];
    if (w) {
        if (w->ndim != 1)
            return ai_node_error(nd, AI_ERR_VALUE, "window has rank %d; 1 expected", w->ndim);
        if (w->dtype != x->dtype)
            return ai_node_error(nd, AI_ERR_TYPE, "window is %s and signal %s",
                                 ai_dtype_name(w->dtype), ai_dtype_name(x->dtype));
    }
    if ((st = opt_int(c, 3, "frame_length", w ? w->shape[0] : g->len, &g->flen)))
        return st;
    if (w && w->shape[0] != g->flen)
        return ai_node_error(nd, AI_ERR_VALUE, "window has %lld values and frame_length is "
                             "%lld; they must be equal", (long long)w->shape[0],
                             (long long)g->flen);
    if (g->step < 1)
        return ai_node_error(nd, AI_ERR_VALUE, "frame_step is %lld; at least 1 expected",
                             (long long)g->step);
    if (g->flen < 1 || g->flen > g->len)
        return ai_node_error(nd, AI_ERR_VALUE, "frame_length is %lld for a signal of length "
                             "%lld; 1 to the signal's length expected", (long long)g->flen,
                             (long long)g->len);
    g->frames = (g->len - g->flen) / g->step + 1;
    g->bins = onesided ? g->flen / 2 + 1 : g->flen;
    return AI_OK;
}

static ai_status stft_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    stft_geom g;
    ai_status st = stft_geometry(c, &g);
    if (st)
        return st;
    out[0].dtype = c->in[0]->dtype;
    out[0].ndim = 4;
    out[0].shape[0] = g.batch;
    out[0].shape[1] = g.frames;
    out[0].shape[2] = g.bins;
    out[0].shape[3] = 2;
    return AI_OK;
}

/* Forward (adjoint false): y = DFT(w * frame). Adjoint: g = F^H(dy) per
 * frame, dx += w g, dw += Re(conj(g) frame). */
static ai_status stft_run(ai_ctx *c, bool adjoint)
{
    stft_geom g;
    ai_status st = stft_geometry(c, &g);
    if (st)
        return st;
    const ai_tensor *x = c->in[0], *w = c->n_in > 2 ? c->in[2] : NULL;
    ai_tensor *dx = adjoint ? c->din[0] : NULL, *dw = adjoint && w ? c->din[2] : NULL;
    if (adjoint && !dx && !dw)
        return AI_OK;
    const int64_t n = g.flen, P = g.parts;
    fft_plan p;
    if ((st = fft_plan_init(&p, n, adjoint ? 1 : -1)))
        return ai_node_error(c->node, st, "%s", ai_last_error());
    double *re = malloc(sizeof(double) * (size_t)n * 2);
    if (!re) {
        fft_plan_free(&p);
        return ai_error(AI_ERR_NOMEM, "out of memory");
    }
    double *im = re + n;
    for (int64_t b = 0; b < g.batch; b++)
        for (int64_t f = 0; f < g.frames; f++) {
            const int64_t x0 = (b * g.len + f * g.step) * P;
            const int64_t y0 = (b * g.frames + f) * g.bins * 2;
            memset(re, 0, sizeof(double) * (size_t)n * 2);
            for (int64_t t = 0; t < (adjoint ? g.bins : n); t++) {
                if (adjoint) {
                    re[t] = ai_float_at(c->dout[0], y0 + 2 * t);
                    im[t] = ai_float_at(c->dout[0], y0 + 2 * t + 1);
                    continue;
                }
                const double wt = w ? ai_float_at(w, t) : 1.0;
                re[t] = wt * ai_float_at(x, x0 + t * P);
                im[t] = P == 2 ? wt * ai_float_at(x, x0 + t * P + 1) : 0.0;
            }
            fft_run(&p, re, im);
            for (int64_t t = 0; t < (adjoint ? n : g.bins); t++) {
                if (!adjoint) {
                    ai_float_set(c->out[0], y0 + 2 * t, re[t]);
                    ai_float_set(c->out[0], y0 + 2 * t + 1, im[t]);
                    continue;
                }
                const double wt = w ? ai_float_at(w, t) : 1.0;
                const int64_t at = x0 + t * P;
                if (dx) {
                    ai_float_set(dx, at, ai_float_at(dx, at) + wt * re[t]);
                    if (P == 2)
                        ai_float_set(dx, at + 1, ai_float_at(dx, at + 1) + wt * im[t]);
                }
                if (dw)
                    ai_float_set(dw, t, ai_float_at(dw, t) + re[t] * ai_float_at(x, at) +
                                 (P == 2 ? im[t] * ai_float_at(x, at + 1) : 0.0));
            }
        }
    free(re);
    fft_plan_free(&p);
    return AI_OK;
}

static ai_status stft_forward(ai_ctx *c) { return stft_run(c, false); }
static ai_status stft_backward(ai_ctx *c) { return stft_run(c, true); }

/* ---------------------------------------------------------------- generated */

/* The output dtype of a generator: attribute output_datatype (ONNX code,
 * default 1 = float32), one the engine stores. */
static ai_status output_dtype(const ai_node *nd, ai_dtype *dt)
{
    int64_t code;
    ai_status st = ai_attr_int(nd, "output_datatype", 1, &code);
    if (st)
        return st;
    if (!ai_dtype_from_onnx(code, dt) || *dt == AI_BOOL)
        return ai_node_error(nd, AI_ERR_NOT_IMPLEMENTED, "output_datatype %lld is not a "
                             "dtype the engine computes windows in (float32, float64, "
                             "float16, integers)", (long long)code);
    return AI_OK;
}

/* t[i] = v in t's dtype (integers truncate toward zero, as numpy's astype) */
static void store_value(ai_tensor *t, int64_t i, double v)
{
    switch (t->dtype) {
    case AI_F32: ((float *)t->data)[i] = (float)v; break;
    case AI_F64: ((double *)t->data)[i] = v; break;
    case AI_F16: ((uint16_t *)t->data)[i] = ai_f32_to_f16((float)v); break;
    case AI_I8: ((int8_t *)t->data)[i] = (int8_t)v; break;
    case AI_U8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    case AI_I16: ((int16_t *)t->data)[i] = (int16_t)v; break;
    case AI_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    default: ((int64_t *)t->data)[i] = (int64_t)v; break;
    }
}

typedef enum { WINDOW_HANN, WINDOW_HAMMING, WINDOW_BLACKMAN } window_kind;

static ai_status window_size(const ai_ctx *c, int64_t *size)
{
    ai_status st = ai_ctx_int_scalar(c, 0, "size", size);
    if (!st && *size < 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "size is %lld; at least 0 expected",
                             (long long)*size);
    return st;
}

static ai_status window_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    ai_status st = output_dtype(c->node, &out[0].dtype);
    if (!st)
        st = window_size(c, &out[0].shape[0]);
    out[0].ndim = 1;
    return st;
}

/* w[k] = a0 - a1 cos(2 pi k / N) + a2 cos(4 pi k / N), N = size (periodic)
 * or size - 1 (symmetric) */
static ai_status window_forward(ai_ctx *c, window_kind kind)
{
    static const double coef[3][3] = {
        {0.5, 0.5, 0.0}, {25.0 / 46.0, 21.0 / 46.0, 0.0}, {0.42, 0.5, 0.08}};
    int64_t size, periodic;
    ai_status st = window_size(c, &size);
    if (st || (st = ai_attr_int(c->node, "periodic", 1, &periodic)))
        return st;
    const double N = (double)(periodic ? size : size - 1);
    const double *a = coef[kind];
    for (int64_t k = 0; k < size; k++)
        store_value(c->out[0], k, a[0] - a[1] * cos(2 * M_PI * (double)k / N) +
                                      a[2] * cos(4 * M_PI * (double)k / N));
    return AI_OK;
}

static ai_status hann_forward(ai_ctx *c) { return window_forward(c, WINDOW_HANN); }
static ai_status hamming_forward(ai_ctx *c) { return window_forward(c, WINDOW_HAMMING); }
static ai_status blackman_forward(ai_ctx *c) { return window_forward(c, WINDOW_BLACKMAN); }

/* MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
 * upper_edge_hertz): [dft_length / 2 + 1, num_mel_bins] */
static ai_status mel_sizes(const ai_ctx *c, int64_t *mels, int64_t *dft_len)
{
    ai_status st;
    if ((st = ai_ctx_int_scalar(c, 0, "num_mel_bins", mels)) ||
        (st = ai_ctx_int_scalar(c, 1, "dft_length", dft_len)))
        return st;
    if (*mels < 1 || *dft_len < 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "num_mel_bins is %lld and dft_length "
                             "%lld; at least 1 each expected", (long long)*mels,
                             (long long)*dft_len);
    return AI_OK;
}

static ai_status mel_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int64_t mels, dft_len;
    ai_status st = output_dtype(c->node, &out[0].dtype);
    if (st || (st = mel_sizes(c, &mels, &dft_len)))
        return st;
    out[0].ndim = 2;
    out[0].shape[0] = dft_len / 2 + 1;
    out[0].shape[1] = mels;
    return AI_OK;
}

static ai_status mel_forward(ai_ctx *c)
{
    int64_t mels, dft_len, rate;
    ai_status st = mel_sizes(c, &mels, &dft_len);
    if (st || (st = ai_ctx_int_scalar(c, 2, "sample_rate", &rate)))
        return st;
    for (int k = 3; k < 5; k++)
        if (ai_tensor_numel(c->in[k]) != 1 || !ai_dtype_is_float(c->in[k]->dtype))
            return ai_node_error(c->node, AI_ERR_VALUE, "%s must be one float",
                                 k == 3 ? "lower_edge_hertz" : "upper_edge_hertz");
    if (rate < 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "sample_rate is %lld; at least 1 "
                             "expected", (long long)rate);
    const double lo = ai_tensor_get_flat(c->in[3], 0), hi = ai_tensor_get_flat(c->in[4], 0);
    const int64_t bins = dft_len / 2 + 1;
    int64_t *edge = malloc(sizeof(int64_t) * (size_t)(mels + 2));
    if (!edge)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    const double lo_mel = 2595 * log1p(lo / 700) / log(10.0);
    const double hi_mel = 2595 * log1p(hi / 700) / log(10.0);
    const double step = (hi_mel - lo_mel) / (double)(mels + 2);
    for (int64_t i = 0; i < mels + 2; i++) { /* the bands' edges as spectrogram bins */
        const double hz = 700 * expm1(((double)i * step + lo_mel) / 2595 * log(10.0));
        edge[i] = (int64_t)floor((double)(dft_len + 1) * hz / (double)rate);
    }
    ai_tensor *y = c->out[0];
    for (int64_t i = 0; i < bins * mels; i++)
        store_value(y, i, 0.0);
    for (int64_t i = 0; i < mels; i++) {
        const int64_t l = edge[i], ctr = edge[i + 1], h = edge[i + 2];
        if (l < 0 || ctr >= bins || h > bins || ctr < l || h < ctr) {
            free(edge);
            return ai_node_error(c->node, AI_ERR_VALUE, "mel band %lld spans spectrogram "
                                 "bins %lld to %lld, outside 0 to %lld: check "
                                 "lower_edge_hertz (%g), upper_edge_hertz (%g) and "
                                 "sample_rate (%lld)", (long long)i, (long long)l,
                                 (long long)h, (long long)(bins - 1), lo, hi, (long long)rate);
        }
        if (ctr == l)
            store_value(y, ctr * mels + i, 1.0);
        for (int64_t j = l; ctr > l && j <= ctr; j++)
            store_value(y, j * mels + i, (double)(j - l) / (double)(ctr - l));
        for (int64_t j = ctr; j < h; j++)
            store_value(y, j * mels + i, (double)(h - j) / (double)(h - ctr));
    }
    free(edge);
    return AI_OK;
}

/* DFT backward reads neither its inputs nor its output (the geometry is
 * in its state); STFT backward reads the signal (the window's gradient)
 * and the window. */
static const ai_op_def op_dft = {"DFT", "", 1, 3, 1, 1,
                                 AI_OP_SHAPE_FROM_VALUES | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
                                 NULL, dft_shape, dft_forward, dft_backward};
static const ai_op_def op_stft = {"STFT", "", 2, 4, 1, 1,
                                  AI_OP_SHAPE_FROM_VALUES | AI_OP_BWD_NO_Y, NULL, stft_shape,
                                  stft_forward, stft_backward};
static const ai_op_def op_mel = {"MelWeightMatrix", "", 5, 5, 1, 1, AI_OP_SHAPE_FROM_VALUES,
                                 NULL, mel_shape, mel_forward, NULL};
static const ai_op_def op_hann = {"HannWindow", "", 1, 1, 1, 1, AI_OP_SHAPE_FROM_VALUES, NULL,
                                  window_shape, hann_forward, NULL};
static const ai_op_def op_hamming = {"HammingWindow", "", 1, 1, 1, 1, AI_OP_SHAPE_FROM_VALUES,
                                     NULL, window_shape, hamming_forward, NULL};
static const ai_op_def op_blackman = {"BlackmanWindow", "", 1, 1, 1, 1,
                                      AI_OP_SHAPE_FROM_VALUES, NULL, window_shape,
                                      blackman_forward, NULL};

const ai_op_def *const ai_ops_signal[] = {&op_dft, &op_stft, &op_mel, &op_hann, &op_hamming,
                                          &op_blackman, NULL};
