/*
 * norm.c — normalisations: BatchNormalization, LayerNormalization,
 * InstanceNormalization, Softmax, LogSoftmax, Hardmax, LpNormalization,
 * MeanVarianceNormalization, LRN (float32 and float64).
 *
 * Statistics (means, variances, softmax sums) accumulate in double whatever
 * the tensor type; forward saves in node state what backward needs (mean
 * and 1/sqrt(var + eps) per channel or row), backward adds into the input
 * gradients.
 *
 * BatchNormalization uses batch statistics when the graph trains (wrap()'s
 * train()) or its training_mode attribute is 1. Training: batch statistics over (N, spatial), the
 * biased variance normalises, the running statistics (inputs 3 and 4,
 * updated in place when they are buffers or parameters) take the unbiased
 * one: running = running * momentum + batch * (1 - momentum) (ONNX's
 * momentum, torch's is 1 - momentum). Backward goes through the batch
 * statistics. Eval: the running statistics, fixed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/fastmath.h"
#include "../kernels/rows.h"
#include "../kernels/simd.h"
#include "../parallel.h"

static ai_status float_input(const ai_ctx *c)
{
    ai_dtype dt = c->in[0]->dtype;
    if (dt != AI_F32 && dt != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(dt));
    return AI_OK;
}

static void copy_meta(ai_meta *m, const ai_tensor *t)
{
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof m->shape);
}

/* ---------------------------------------------------------------- BatchNormalization */

typedef struct {
    double eps, momentum;
    int64_t training_mode; /* the node asks for batch statistics itself */
} bn_params;

/* Saved by forward: which statistics normalised, per channel mean and
 * 1/sqrt(var + eps). */
typedef struct {
    bool batch_stats;
    double stats[]; /* mean[C], invstd[C] */
} bn_state;

/* X is (N, C, S): S is the product of the spatial dimensions. */
typedef struct {
    int64_t N, C, S;
} bn_dims;

static bn_dims bn_dims_of(const ai_tensor *x)
{
    bn_dims d = {x->shape[0], x->shape[1], 1};
    for (int i = 2; i < x->ndim; i++)
        d.S *= x->shape[i];
    return d;
}

static ai_status bn_init(ai_node *n)
{
    bn_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    ai_status st = ai_attr_float(n, "epsilon", 1e-5, &p->eps);
    if (!st)
        st = ai_attr_int(n, "training_mode", 0, &p->training_mode);
    return st ? st : ai_attr_float(n, "momentum", 0.9, &p->momentum);
}

/* Batch statistics when the graph trains or the node says training_mode=1. */
static bool bn_training(const ai_ctx *c)
{
    return c->training || ((const bn_params *)c->node->params)->training_mode;
}

static ai_status bn_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    static const char *names[] = {"X", "scale", "B", "input_mean", "input_var"};
    ai_status st = float_input(c);
    if (st)
        return st;
    const ai_tensor *x = c->in[0];
    if (x->ndim < 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "X must have rank >= 2 (N, C, ...), got %d",
                             x->ndim);
    bn_dims d = bn_dims_of(x);
    for (int k = 1; k < 5; k++) {
        const ai_tensor *t = c->in[k];
        if (!t)
            return ai_node_error(c->node, AI_ERR_VALUE, "input %s is missing", names[k]);
        if (t->dtype != x->dtype)
            return ai_node_error(c->node, AI_ERR_TYPE, "%s is %s, X is %s", names[k],
                                 ai_dtype_name(t->dtype), ai_dtype_name(x->dtype));
        if (t->ndim != 1 || t->shape[0] != d.C)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "%s must have shape (%lld) (the channels of X)", names[k],
                                 (long long)d.C);
    }
    if (bn_training(c) && d.N * d.S <= 1)
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "training needs more than 1 value per channel, X has %lld",
                             (long long)(d.N * d.S));
    copy_meta(&out[0], x);
    for (int k = 1; k < c->n_out; k++)
        copy_meta(&out[k], c->in[k + 2]);
    *state = sizeof(bn_state) + 2 * (size_t)d.C * sizeof(double);
    *ws = 2 * (size_t)d.C * sizeof(double);    /* forward: variances; backward: sums */
    return AI_OK;
}

/* The kernels work on one channel (training: statistics, sums, then its
 * planes) or on a range of (n, c) planes [p0, p1) (eval's forward), so that
 * the thread pool can split them; a channel's sums run over n in order
 * whatever the split. */
#define SUM8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))
/* OUT = the sum over I in [0, H) of EXPR (double) in 8 partial sums: 8
 * independent chains (they vectorise; the error grows 8x slower), added by SUM8. */
#define SUM8_OF(OUT, H, I, EXPR)                                                           \
    do {                                                                                   \
        double p_[8] = {0};                                                                \
        int64_t b_ = 0;                                                                    \
        for (; b_ + 8 <= (H); b_ += 8)                                                     \
            for (int l_ = 0; l_ < 8; l_++) {                                               \
                const int64_t I = b_ + l_;                                                 \
                p_[l_] += (EXPR);                                                          \
            }                                                                              \
        for (int64_t I = b_; I < (H); I++)                                                 \
            p_[I - b_] += (EXPR);                                                          \
        OUT = SUM8(p_);                                                                    \
    } while (0)
/* OUTA, OUTB (double) = the sums over I in [B0, B0 + S) of EXPRA and EXPRB (of
 * the data's type T), in blocks of at most 512 terms: 32 partial sums in T per
 * block (four AVX2 vectors of float per sum, independent chains: 16 terms
 * each), the rest of the block in chunks of 8 into the first 8 lanes, the
 * last terms one by one; folded to 8 and to one in T, the blocks added in
 * double. A lane sums at most 16 + 4 terms. The error is that of such short
 * sums, at full vector width (double lanes convert every term and run at
 * half width: measured 1.6x slower on 125-value planes, 6x on 2304). For one
 * sum pass 0 as EXPRB: its chains are dead code. */
#define BLOCK_SUM2_OF(OUTA, OUTB, B0, S, I, T, EXPRA, EXPRB)                               \
    do {                                                                                   \
        double oa_ = 0, ob_ = 0;                                                           \
        int64_t b_ = (B0);                                                                 \
        const int64_t end_ = (B0) + (S);                                                   \
        while (b_ < end_) {                                                                \
            T pa_[32] = {0}, pb_[32] = {0}, qa_[8], qb_[8];                                \
            const int64_t e_ = b_ + 512 <= end_ ? b_ + 512 : end_;                         \
            for (; b_ + 32 <= e_; b_ += 32)                                                \
                for (int l_ = 0; l_ < 32; l_++) {                                          \
                    const int64_t I = b_ + l_;                                             \
                    pa_[l_] += (EXPRA);                                                    \
                    pb_[l_] += (EXPRB);                                                    \
                }                                                                          \
            for (; b_ + 8 <= e_; b_ += 8)                                                  \
                for (int l_ = 0; l_ < 8; l_++) {                                           \
                    const int64_t I = b_ + l_;                                             \
                    pa_[l_] += (EXPRA);                                                    \
                    pb_[l_] += (EXPRB);                                                    \
                }                                                                          \
            for (int l_ = 0; b_ < e_; b_++, l_++) {                                        \
                const int64_t I = b_;                                                      \
                pa_[l_] += (EXPRA);                                                        \
                pb_[l_] += (EXPRB);                                                        \
            }                                                                              \
            for (int l_ = 0; l_ < 8; l_++) {                                               \
                qa_[l_] = (pa_[l_] + pa_[l_ + 8]) + (pa_[l_ + 16] + pa_[l_ + 24]);         \
                qb_[l_] = (pb_[l_] + pb_[l_ + 8]) + (pb_[l_ + 16] + pb_[l_ + 24]);         \
            }                                                                              \
            oa_ += SUM8(qa_);                                                              \
            ob_ += SUM8(qb_);                                                              \
        }                                                                                  \
        OUTA = oa_;                                                                        \
        OUTB = ob_;                                                                        \
    } while (0)
/* OUTA, OUTB (double) = the sums of EXPRA and EXPRB over the values of one
 * channel: N planes of S values, plane n at I in [FIRST + n STRIDE, + S).
 * Planes of BN_SMALL_S values or more: BLOCK_SUM2_OF per plane, the planes
 * added in double. Smaller ones (late layers: 3x3, 6x6, 25x5 maps), where
 * that per-plane zeroing and folding would cost more than the sums: per
 * position sums over groups of 16 planes (a lane sums 16 terms, vectorised
 * along the plane), BLOCK_SUM2_OF over the positions, groups added in double. */
#define BN_SMALL_S 128
#define CHANNEL_SUM2_OF(OUTA, OUTB, N, S, FIRST, STRIDE, I, T, EXPRA, EXPRB)               \
    do {                                                                                   \
        double ca_ = 0, cb_ = 0, ga_, gb_;                                                 \
        if ((S) < BN_SMALL_S) {                                                            \
            T aa_[BN_SMALL_S], ab_[BN_SMALL_S];                                            \
            for (int64_t g_ = 0; g_ < (N); g_ += 16) {                                     \
                const int64_t ge_ = g_ + 16 < (N) ? g_ + 16 : (N);                         \
                for (int64_t s_ = 0; s_ < (S); s_++)                                       \
                    aa_[s_] = ab_[s_] = 0;                                                 \
                for (int64_t n_ = g_; n_ < ge_; n_++) {                                    \
                    const int64_t o_ = (FIRST) + n_ * (STRIDE);                            \
                    for (int64_t s_ = 0; s_ < (S); s_++) {                                 \
                        const int64_t I = o_ + s_;                                         \
                        aa_[s_] += (EXPRA);                                                \
                        ab_[s_] += (EXPRB);                                                \
                    }                                                                      \
                }                                                                          \
                BLOCK_SUM2_OF(ga_, gb_, 0, S, j_, T, aa_[j_], ab_[j_]);                    \
                ca_ += ga_;                                                                \
                cb_ += gb_;                                                                \
            }                                                                              \
        } else {                                                                           \
            for (int64_t n_ = 0; n_ < (N); n_++) {                                         \
                BLOCK_SUM2_OF(ga_, gb_, (FIRST) + n_ * (STRIDE), S, I, T, EXPRA, EXPRB);   \
                ca_ += ga_;                                                                \
                cb_ += gb_;                                                                \
            }                                                                              \
        }                                                                                  \
        OUTA = ca_;                                                                        \
        OUTB = cb_;                                                                        \
    } while (0)
#define CHANNEL_SUM_OF(OUT, N, S, FIRST, STRIDE, I, T, EXPR)                               \
    do {                                                                                   \
        double unused_;                                                                    \
        CHANNEL_SUM2_OF(OUT, unused_, N, S, FIRST, STRIDE, I, T, EXPR, (T)0);              \
        (void)unused_;                                                                     \
    } while (0)
/* Training works channel by channel (a thread takes a range of channels):
 * the statistics or the backward's sums, then the channel's N planes, while
 * they are still in cache. The per-channel kernels have an AVX-512 clone
 * (AI_WIDE_CLONES: the same values, the partial sums are explicit): per
 * node profile, batch 16, 1 thread, alternating builds, BatchNorm's
 * backward KWS 0.83-1.08 ms -> 0.65-0.85 per step, MobileNet 4.2-4.4 ->
 * 3.6-3.7, ResNet-8 1.03-1.17 -> 0.96-1.06; forward MobileNet 2.4-2.6 ->
 * 1.95-2.07 (KWS, ResNet-8 within noise). */
#define DEFINE_BN_KERNELS(SUF, T)                                                          \
    /* mean, var (biased) of channel ch of x (N,C,S), CHANNEL_SUM_OF. The mean sums        \
     * x - sh (sh: the channel's first value), so that a large offset does not grow        \
     * the float sums; the variance sums (x - mt)^2 about the mean rounded to T            \
     * (exact differences where x is near it) and corrects:                                \
     * sum (x - m)^2 = sum (x - mt)^2 - cnt (m - mt)^2. */                                 \
    AI_WIDE_CLONES static void bn_stats_##SUF(double *mean, double *var, const T *x,       \
                                              bn_dims d, int64_t ch)                       \
    {                                                                                      \
        const double cnt = (double)(d.N * d.S);                                            \
        const int64_t first = ch * d.S, stride = d.C * d.S;                                \
        const T sh = x[first]; /* sums of x - sh: small where x is near it */              \
        double m, v;                                                                       \
        CHANNEL_SUM_OF(m, d.N, d.S, first, stride, i, T, x[i] - sh);                       \
        m = (double)sh + m / cnt;                                                          \
        const T mt = (T)m;                                                                 \
        CHANNEL_SUM_OF(v, d.N, d.S, first, stride, i, T, (x[i] - mt) * (x[i] - mt));       \
        const double dm = m - (double)mt;                                                  \
        *mean = m;                                                                         \
        *var = fmax(v / cnt - dm * dm, 0.0);                                               \
    }                                                                                      \
    /* y = (x - mean) * a + b, x - mean as (x - mt) + dm: exact where x is near the        \
     * rounded mean; planes [p0, p1) (fixed statistics) */                                 \
    AI_WIDE_CLONES static void bn_forward_##SUF(T *y, const T *x, const double *mean,      \
                                                const double *invstd, const T *scale,      \
                                                const T *bias, bn_dims d, int64_t p0,      \
                                                int64_t p1)                                \
    {                                                                                      \
        for (int64_t pl = p0; pl < p1; pl++) {                                             \
            const int64_t ch = pl % d.C, off = pl * d.S;                                   \
            const T m = (T)mean[ch], dm = (T)((double)m - mean[ch]);                       \
            const T a = (T)(invstd[ch] * scale[ch]), b = bias[ch];                         \
            for (int64_t s = 0; s < d.S; s++)                                              \
                y[off + s] = ((x[off + s] - m) + dm) * a + b;                              \
        }                                                                                  \
    }                                                                                      \
    /* the same on the N planes of channel ch */                                           \
    AI_WIDE_CLONES static void bn_channel_forward_##SUF(T *y, const T *x, double mean,     \
                                                        double invstd, T scale, T bias,    \
                                                        bn_dims d, int64_t ch)             \
    {                                                                                      \
        const T m = (T)mean, dm = (T)((double)m - mean), a = (T)(invstd * scale);          \
        for (int64_t n = 0; n < d.N; n++) {                                                \
            const int64_t off = (n * d.C + ch) * d.S;                                      \
            for (int64_t s = 0; s < d.S; s++)                                              \
                y[off + s] = ((x[off + s] - m) + dm) * a + bias;                           \
        }                                                                                  \
    }                                                                                      \
    /* *sdy = sum dy, *sdyx = sum dy * (x - mean) over channel ch (one CHANNEL_SUM2_OF),   \
     * about the mean rounded to T, then corrected:                                        \
     * sum dy (x - m) = sum dy (x - mt) - (m - mt) sum dy. */                              \
    AI_WIDE_CLONES static void bn_sums_##SUF(double *sdy, double *sdyx, const T *dy,       \
                                             const T *x, double mean, bn_dims d,           \
                                             int64_t ch)                                   \
    {                                                                                      \
        const T mt = (T)mean;                                                              \
        double sa, sb;                                                                     \
        CHANNEL_SUM2_OF(sa, sb, d.N, d.S, ch * d.S, d.C * d.S, i, T, dy[i],                \
                        dy[i] * (x[i] - mt));                                              \
        *sdy = sa;                                                                         \
        *sdyx = sb - (mean - (double)mt) * sa;                                             \
    }                                                                                      \
    /* dx += scale * invstd * (dy - sdy/cnt - (x - mean) * invstd^2 * sdyx/cnt) with batch \
     * statistics, dx += scale * invstd * dy with fixed ones (= with assign), on the N     \
     * planes of channel ch */                                                             \
    AI_WIDE_CLONES static void bn_backward_##SUF(T *dx, const T *dy, const T *x,           \
                                                 double mean, double invstd, T scale,      \
                                                 double sdy, double sdyx,                  \
                                                 bool batch_stats, bool assign,            \
                                                 bn_dims d, int64_t ch)                    \
    {                                                                                      \
        const double cnt = (double)(d.N * d.S);                                            \
        const T m = (T)mean, dm = (T)((double)m - mean);                                   \
        const T w = (T)(invstd * scale);                                                   \
        const T gm = (T)(batch_stats ? sdy / cnt : 0);                                     \
        const T k = (T)(batch_stats ? sdyx * invstd * invstd / cnt : 0);                   \
        for (int64_t n = 0; n < d.N; n++) {                                                \
            const int64_t off = (n * d.C + ch) * d.S;                                      \
            if (assign)                                                                    \
                for (int64_t s = 0; s < d.S; s++)                                          \
                    dx[off + s] = (dy[off + s] - gm - ((x[off + s] - m) + dm) * k) * w;    \
            else                                                                           \
                for (int64_t s = 0; s < d.S; s++)                                          \
                    dx[off + s] += (dy[off + s] - gm - ((x[off + s] - m) + dm) * k) * w;   \
        }                                                                                  \
    }

/* X of shape (N, C) (S = 1, BatchNorm1d after a Linear): a plane is one value,
 * so the kernels above would pay their per-plane setup for every element.
 * These take the channels [c0, c1) of every row n instead: the loops over
 * channels vectorise, the sums run over n in order (double). */
#define DEFINE_BN_ROW_KERNELS(SUF, T)                                                      \
    AI_VECTOR_CLONES static void bn_rows_stats_##SUF(double *mean, double *var,            \
                                                     const T *x, bn_dims d, int64_t c0,    \
                                                     int64_t c1)                           \
    {                                                                                      \
        for (int64_t ch = c0; ch < c1; ch++)                                               \
            mean[ch] = var[ch] = 0;                                                        \
        for (int64_t n = 0; n < d.N; n++) {                                                \
            const T *xr = x + n * d.C;                                                     \
            for (int64_t ch = c0; ch < c1; ch++)                                           \
                mean[ch] += xr[ch];                                                        \
        }                                                                                  \
        for (int64_t ch = c0; ch < c1; ch++)                                               \
            mean[ch] /= (double)d.N;                                                       \
        for (int64_t n = 0; n < d.N; n++) {                                                \
            const T *xr = x + n * d.C;                                                     \
            for (int64_t ch = c0; ch < c1; ch++)                                           \
                var[ch] += (xr[ch] - mean[ch]) * (xr[ch] - mean[ch]);                      \
        }                                                                                  \
        for (int64_t ch = c0; ch < c1; ch++)                                               \
            var[ch] /= (double)d.N;                                                        \
    }                                                                                      \
    AI_VECTOR_CLONES static void bn_rows_forward_##SUF(T *y, const T *x, const double *mean, \
                                                       const double *invstd,               \
                                                       const T *scale, const T *bias,      \
                                                       bn_dims d, int64_t c0, int64_t c1)  \
    {                                                                                      \
        for (int64_t n = 0; n < d.N; n++) {                                                \
            const T *xr = x + n * d.C;                                                     \
            T *yr = y + n * d.C;                                                           \
            for (int64_t ch = c0; ch < c1; ch++)                                           \
                yr[ch] = (T)((xr[ch] - mean[ch]) * (invstd[ch] * scale[ch]) + bias[ch]);   \
        }                                                                                  \
    }                                                                                      \
    AI_VECTOR_CLONES static void bn_rows_sums_##SUF(double *sdy, double *sdyx, const T *dy, \
                                                    const T *x, const double *mean,        \
                                                    bn_dims d, int64_t c0, int64_t c1)     \
    {                                                                                      \
        for (int64_t ch = c0; ch < c1; ch++)                                               \
            sdy[ch] = sdyx[ch] = 0;                                                        \
        for (int64_t n = 0; n < d.N; n++) {                                                \
            const T *dr = dy + n * d.C, *xr = x + n * d.C;                                 \
            for (int64_t ch = c0; ch < c1; ch++) {                                         \
                sdy[ch] += dr[ch];                                                         \
                sdyx[ch] += dr[ch] * (xr[ch] - mean[ch]);                                  \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    AI_VECTOR_CLONES static void bn_rows_backward_##SUF(                                   \
        T *dx, const T *dy, const T *x, const double *mean, const double *invstd,          \
        const T *scale, const double *sdy, const double *sdyx, bool batch_stats,           \
        bool assign, bn_dims d, int64_t c0, int64_t c1)                                    \
    {                                                                                      \
        const double cnt = (double)d.N, gs = batch_stats ? 1.0 : 0.0;                      \
        for (int64_t n = 0; n < d.N; n++) {                                                \
            const T *dr = dy + n * d.C, *xr = x + n * d.C;                                 \
            T *dxr = dx + n * d.C;                                                         \
            for (int64_t ch = c0; ch < c1; ch++) {                                         \
                const double is = invstd[ch];                                              \
                const T v = (T)((dr[ch] - gs * sdy[ch] / cnt -                             \
                                 (xr[ch] - mean[ch]) * (gs * sdyx[ch] * is * is / cnt)) *  \
                                (is * scale[ch]));                                         \
                dxr[ch] = assign ? v : dxr[ch] + v;                                        \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_BN_KERNELS(f32, float)
DEFINE_BN_KERNELS(f64, double)
DEFINE_BN_ROW_KERNELS(f32, float)
DEFINE_BN_ROW_KERNELS(f64, double)

/* BatchNormalization on the thread pool. Training: one job over channels,
 * each channel's statistics (or backward sums) and then its N planes; eval:
 * one job over the (n, c) planes. */
typedef struct {
    bool f64, batch_stats, assign; /* assign: backward writes dx, not += */
    bn_dims d;
    double eps;
    const void *x, *dy, *scale, *bias;
    void *out;                 /* y or dx (NULL: no dx) */
    double *mean, *invstd;     /* forward: written in training */
    double *var, *sdy, *sdyx;  /* per channel: the batch variance, backward's sums */
} bn_job;

static void bn_forward_planes_range(void *ctx, int64_t lo, int64_t hi)
{
    const bn_job *j = ctx;
    if (j->f64)
        bn_forward_f64(j->out, j->x, j->mean, j->invstd, j->scale, j->bias, j->d, lo, hi);
    else
        bn_forward_f32(j->out, j->x, j->mean, j->invstd, j->scale, j->bias, j->d, lo, hi);
}

/* Forward with fixed statistics of channels [lo, hi) of X (N, C). */
static void bn_rows_forward_range(void *ctx, int64_t lo, int64_t hi)
{
    const bn_job *j = ctx;
    if (j->f64)
        bn_rows_forward_f64(j->out, j->x, j->mean, j->invstd, j->scale, j->bias, j->d, lo, hi);
    else
        bn_rows_forward_f32(j->out, j->x, j->mean, j->invstd, j->scale, j->bias, j->d, lo, hi);
}

/* Training forward of channels [lo, hi): mean, var, invstd, then y. */
static void bn_train_forward_range(void *ctx, int64_t lo, int64_t hi)
{
    const bn_job *j = ctx;
    if (j->d.S == 1) {
        if (j->f64)
            bn_rows_stats_f64(j->mean, j->var, j->x, j->d, lo, hi);
        else
            bn_rows_stats_f32(j->mean, j->var, j->x, j->d, lo, hi);
        for (int64_t ch = lo; ch < hi; ch++)
            j->invstd[ch] = 1.0 / sqrt(j->var[ch] + j->eps);
        bn_rows_forward_range(ctx, lo, hi);
        return;
    }
    for (int64_t ch = lo; ch < hi; ch++) {
        if (j->f64)
            bn_stats_f64(&j->mean[ch], &j->var[ch], j->x, j->d, ch);
        else
            bn_stats_f32(&j->mean[ch], &j->var[ch], j->x, j->d, ch);
        j->invstd[ch] = 1.0 / sqrt(j->var[ch] + j->eps);
        if (j->f64)
            bn_channel_forward_f64(j->out, j->x, j->mean[ch], j->invstd[ch],
                                   ((const double *)j->scale)[ch],
                                   ((const double *)j->bias)[ch], j->d, ch);
        else
            bn_channel_forward_f32(j->out, j->x, j->mean[ch], j->invstd[ch],
                                   ((const float *)j->scale)[ch],
                                   ((const float *)j->bias)[ch], j->d, ch);
    }
}

/* Backward of channels [lo, hi): the sums, then dx. */
static void bn_backward_range(void *ctx, int64_t lo, int64_t hi)
{
    const bn_job *j = ctx;
    if (j->d.S == 1) {
        if (j->f64)
            bn_rows_sums_f64(j->sdy, j->sdyx, j->dy, j->x, j->mean, j->d, lo, hi);
        else
            bn_rows_sums_f32(j->sdy, j->sdyx, j->dy, j->x, j->mean, j->d, lo, hi);
        if (j->out && j->f64)
            bn_rows_backward_f64(j->out, j->dy, j->x, j->mean, j->invstd, j->scale, j->sdy,
                                 j->sdyx, j->batch_stats, j->assign, j->d, lo, hi);
        else if (j->out)
            bn_rows_backward_f32(j->out, j->dy, j->x, j->mean, j->invstd, j->scale, j->sdy,
                                 j->sdyx, j->batch_stats, j->assign, j->d, lo, hi);
        return;
    }
    for (int64_t ch = lo; ch < hi; ch++) {
        if (j->f64)
            bn_sums_f64(&j->sdy[ch], &j->sdyx[ch], j->dy, j->x, j->mean[ch], j->d, ch);
        else
            bn_sums_f32(&j->sdy[ch], &j->sdyx[ch], j->dy, j->x, j->mean[ch], j->d, ch);
        if (!j->out)
            continue;
        if (j->f64)
            bn_backward_f64(j->out, j->dy, j->x, j->mean[ch], j->invstd[ch],
                            ((const double *)j->scale)[ch], j->sdy[ch], j->sdyx[ch],
                            j->batch_stats, j->assign, j->d, ch);
        else
            bn_backward_f32(j->out, j->dy, j->x, j->mean[ch], j->invstd[ch],
                            ((const float *)j->scale)[ch], j->sdy[ch], j->sdyx[ch],
                            j->batch_stats, j->assign, j->d, ch);
    }
}

/* Over channels (N*S elements each) or planes (S each). */
static void bn_run(bn_job *j, bool channels, ai_range_fn fn)
{
    if (channels)
        ai_parallel_for(j->d.C, ai_grain_of(j->d.N * j->d.S), fn, j);
    else
        ai_parallel_for(j->d.N * j->d.C, ai_grain_of(j->d.S), fn, j);
}

/* Running statistics are updated in place when they are state of the
 * graph (buffers, or parameters when imported as such). */
static bool bn_writable(const ai_ctx *c, int k)
{
    ai_value_kind kind = c->g->values[c->node->in[k]].kind;
    return kind == AI_VAL_BUFFER || kind == AI_VAL_PARAM;
}

static ai_status bn_forward(ai_ctx *c)
{
    const bn_params *p = c->node->params;
    const ai_tensor *x = c->in[0];
    ai_tensor *rm = c->in[3], *rv = c->in[4];
    const bn_dims d = bn_dims_of(x);
    bn_state *sv = c->state;
    double *mean = sv->stats, *invstd = mean + d.C, *var = c->workspace;
    sv->batch_stats = bn_training(c);
    bn_job j = {.f64 = x->dtype == AI_F64, .d = d, .eps = p->eps, .x = x->data,
                .scale = c->in[1]->data, .bias = c->in[2]->data, .out = c->out[0]->data,
                .mean = mean, .invstd = invstd, .var = var};
    if (!sv->batch_stats) {
        for (int64_t ch = 0; ch < d.C; ch++) {
            mean[ch] = ai_float_at(rm, ch);
            invstd[ch] = 1.0 / sqrt(ai_float_at(rv, ch) + p->eps);
        }
        for (int k = 1; k < c->n_out; k++)
            memcpy(c->out[k]->data, c->in[k + 2]->data, ai_tensor_nbytes(c->in[k + 2]));
        if (d.S == 1)
            bn_run(&j, true, bn_rows_forward_range);
        else
            bn_run(&j, false, bn_forward_planes_range);
        return AI_OK;
    }
    bn_run(&j, true, bn_train_forward_range);
    const double cnt = (double)(d.N * d.S), mom = p->momentum;
    const bool update_m = bn_writable(c, 3), update_v = bn_writable(c, 4);
    for (int64_t ch = 0; ch < d.C; ch++) {
        double new_m = mom * ai_float_at(rm, ch) + (1 - mom) * mean[ch];
        double new_v = mom * ai_float_at(rv, ch) + (1 - mom) * var[ch] * cnt / (cnt - 1);
        if (update_m)
            ai_float_set(rm, ch, new_m);
        if (update_v)
            ai_float_set(rv, ch, new_v);
        if (c->n_out > 1)
            ai_float_set(c->out[1], ch, new_m);
        if (c->n_out > 2)
            ai_float_set(c->out[2], ch, new_v);
    }
    return AI_OK;
}

static ai_status bn_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *dy = c->dout[0];
    const bn_dims d = bn_dims_of(x);
    bn_state *sv = c->state;
    double *mean = sv->stats, *invstd = mean + d.C;
    double *sdy = c->workspace, *sdyx = sdy + d.C;
    bn_job j = {.f64 = x->dtype == AI_F64, .batch_stats = sv->batch_stats,
                .assign = c->din_assign[0], .d = d, .x = x->data, .dy = dy->data,
                .scale = c->in[1]->data, .out = c->din[0] ? c->din[0]->data : NULL,
                .mean = mean, .invstd = invstd, .sdy = sdy, .sdyx = sdyx};
    bn_run(&j, true, bn_backward_range);
    for (int64_t ch = 0; ch < d.C; ch++) {
        if (c->din[1])
            ai_float_set(c->din[1], ch, (c->din_assign[1] ? 0 : ai_float_at(c->din[1], ch)) +
                                            sdyx[ch] * invstd[ch]);
        if (c->din[2])
            ai_float_set(c->din[2], ch,
                         (c->din_assign[2] ? 0 : ai_float_at(c->din[2], ch)) + sdy[ch]);
    }
    return AI_OK;
}

/* no gradient flows to the running statistics (inputs 3, 4): they are not
 * assigned; backward reads x, the scale and its state, not the outputs */
static const ai_op_def op_batchnorm = {"BatchNormalization", "", 5, 5, 1, 3,
                                       AI_OP_NO_FOLD | AI_OP_GRAD_ASSIGN(3) | AI_OP_BWD_NO_Y,
                                       bn_init, bn_shape, bn_forward, bn_backward};

/* ---------------------------------------------------------------- LayerNormalization */

typedef struct {
    int64_t axis;
    double eps;
    ai_dtype stash; /* dtype of the Mean and InvStdDev outputs */
} ln_params;

static ai_status ln_init(ai_node *n)
{
    ln_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    int64_t stash;
    ai_status st;
    if ((st = ai_attr_int(n, "axis", -1, &p->axis)) ||
        (st = ai_attr_float(n, "epsilon", 1e-5, &p->eps)) ||
        (st = ai_attr_int(n, "stash_type", 1, &stash)))
        return st;
    if (stash != 1 && stash != 11)
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED,
                             "stash_type %lld is not supported (1: float, 11: double)",
                             (long long)stash);
    p->stash = stash == 1 ? AI_F32 : AI_F64;
    return AI_OK;
}

/* X is (R, H): R rows (dimensions before axis) of H normalised values. */
static void ln_dims(const ai_ctx *c, int *axis, int64_t *R, int64_t *H)
{
    const ln_params *p = c->node->params;
    const ai_tensor *x = c->in[0];
    *axis = (int)(p->axis < 0 ? p->axis + x->ndim : p->axis);
    *R = *H = 1;
    for (int i = 0; i < x->ndim; i++)
        *(i < *axis ? R : H) *= x->shape[i];
}

static const ai_tensor *ln_bias(const ai_ctx *c)
{
    return c->n_in > 2 ? c->in[2] : NULL;
}

/* Backward splits the rows into this many chunks for the thread pool (a
 * function of the shape alone: the same sums at any thread count), each at
 * least AI_GRAIN_ELEMS values, at most LN_CHUNKS, and their workspace at most
 * 2 LN_CHUNK_SUMS doubles (one chunk where a row is longer): each chunk sums
 * its rows' dScale and dB terms in its own workspace, added in chunk order
 * after. */
#define LN_CHUNKS 16
#define LN_CHUNK_SUMS (INT64_C(1) << 17)
static int64_t ln_chunks(int64_t R, int64_t H)
{
    int64_t n = R * H / AI_GRAIN_ELEMS;
    if (H > 0 && n > LN_CHUNK_SUMS / H)
        n = LN_CHUNK_SUMS / H;
    return n < 1 ? 1 : n > LN_CHUNKS ? LN_CHUNKS : n;
}

static ai_status ln_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    const ln_params *p = c->node->params;
    const ai_tensor *x = c->in[0];
    int axis;
    ai_status st = float_input(c);
    if (st || (st = ai_norm_axis(c->node, p->axis, x->ndim, &axis)))
        return st;
    if (x->ndim == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "X must have rank >= 1");
    int64_t R, H;
    ln_dims(c, &axis, &R, &H);
    const int nn = x->ndim - axis; /* rank of the normalised shape */
    for (int k = 1; k < c->n_in; k++) {
        const ai_tensor *t = c->in[k];
        if (!t)
            continue;
        if (t->dtype != x->dtype)
            return ai_node_error(c->node, AI_ERR_TYPE, "%s is %s, X is %s",
                                 k == 1 ? "Scale" : "B", ai_dtype_name(t->dtype),
                                 ai_dtype_name(x->dtype));
        bool ok = t->ndim <= nn && ai_tensor_numel(t) == H;
        for (int i = 0; ok && i < t->ndim; i++)
            ok = t->shape[t->ndim - 1 - i] == x->shape[x->ndim - 1 - i];
        if (!ok)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "%s must have the shape of X's last %d dimension%s",
                                 k == 1 ? "Scale" : "B", nn, nn == 1 ? "" : "s");
    }
    copy_meta(&out[0], x);
    for (int k = 1; k < c->n_out; k++) {
        copy_meta(&out[k], x);
        out[k].dtype = p->stash;
        for (int i = axis; i < x->ndim; i++)
            out[k].shape[i] = 1;
    }
    *state = 2 * (size_t)R * sizeof(double); /* mean, invstd per row */
    /* backward: dScale, dB sums; float32: and its blocks' column sums */
    *ws = 2 * (size_t)(H * ln_chunks(R, H)) * (sizeof(double) + sizeof(float));
    return AI_OK;
}

/* M, IS (double) = the mean and 1 / sqrt(biased variance + EPS) of row XR
 * (H values): two passes of 8 partial sums (LayerNormalization's and
 * InstanceNormalization's row statistics). */
#define ROW_MEAN_INVSTD(M, IS, XR, H, EPS)                                                 \
    do {                                                                                   \
        double v_;                                                                         \
        SUM8_OF(M, H, h_, (double)(XR)[h_]);                                               \
        M /= (double)(H);                                                                  \
        SUM8_OF(v_, H, h_, ((XR)[h_] - M) * ((XR)[h_] - M));                               \
        IS = 1.0 / sqrt(v_ / (double)(H) + (EPS));                                         \
    } while (0)

#define DEFINE_LN_KERNELS(SUF, T)                                                          \
    /* per row: mean, invstd (double sums); y = (x - mean) * invstd * scale + bias in T */ \
    AI_VECTOR_CLONES static void ln_forward_##SUF(T *y, double *mean, double *invstd,      \
                                                  const T *x, const T *scale,              \
                                                  const T *bias, double eps, int64_t R,    \
                                                  int64_t H)                               \
    {                                                                                      \
        for (int64_t r = 0; r < R; r++) {                                                  \
            const T *xr = x + r * H;                                                       \
            T *yr = y + r * H;                                                             \
            double m, is;                                                                  \
            ROW_MEAN_INVSTD(m, is, xr, H, eps);                                            \
            mean[r] = m;                                                                   \
            invstd[r] = is;                                                                \
            const T mt = (T)m, dm = (T)((double)mt - m), ist = (T)is;                      \
            if (bias)                                                                      \
                for (int64_t h = 0; h < H; h++)                                            \
                    yr[h] = ((xr[h] - mt) + dm) * ist * scale[h] + bias[h];                \
            else                                                                           \
                for (int64_t h = 0; h < H; h++)                                            \
                    yr[h] = ((xr[h] - mt) + dm) * ist * scale[h];                          \
        }                                                                                  \
    }                                                                                      \
    /* With xhat = (x - mean) * invstd, g = dy * scale, per row:                           \
     * dx += invstd * (g - mean(g) - xhat * mean(g * xhat))                                \
     *       + dmean / H - dinvstd * invstd^2 * xhat / H;                                  \
     * dscale[h] += dy * xhat, dbias[h] += dy (double sums, as the row sums; the           \
     * elementwise terms in T, as torch); dx = with assign. Float64's kernel and the        \
     * reference twin of float32's (ln_backward_fast_f32). */                              \
    AI_WIDE_CLONES static void ln_backward_##SUF(T *dx, bool assign, double *dscale,       \
                                                 double *dbias, const T *dy, const T *x,   \
                                                 const T *scale, const double *mean,       \
                                                 const double *invstd,                     \
                                                 const ai_tensor *dmean,                   \
                                                 const ai_tensor *dinvstd, int64_t r0,     \
                                                 int64_t r1, int64_t H)                    \
    {                                                                                      \
        for (int64_t r = r0; r < r1; r++) {                                                \
            const T *xr = x + r * H, *dyr = dy + r * H;                                    \
            const double m = mean[r], is = invstd[r];                                      \
            const T mt = (T)m, dmt = (T)((double)mt - m), ist = (T)is;                     \
            if (dscale)                                                                    \
                for (int64_t h = 0; h < H; h++) {                                          \
                    dscale[h] += dyr[h] * (((xr[h] - mt) + dmt) * ist);                    \
                    dbias[h] += dyr[h];                                                    \
                }                                                                          \
            if (!dx)                                                                       \
                continue;                                                                  \
            double a, b;                                                                   \
            SUM8_OF(a, H, h, dyr[h] * scale[h]);                                           \
            SUM8_OF(b, H, h, dyr[h] * scale[h] * (((xr[h] - mt) + dmt) * ist));            \
            a /= (double)H;                                                                \
            b /= (double)H;                                                                \
            const T dm = (T)(dmean ? ai_float_at(dmean, r) / (double)H : 0);                     \
            const T di = (T)(dinvstd ? ai_float_at(dinvstd, r) * is * is / (double)H : 0);       \
            const T at = (T)a, bt = (T)b;                                                  \
            T *dxr = dx + r * H;                                                           \
            for (int64_t h = 0; h < H; h++) {                                              \
                const T xh = ((xr[h] - mt) + dmt) * ist;                                   \
                const T v = ist * (dyr[h] * scale[h] - at - xh * bt) + dm - di * xh;       \
                dxr[h] = assign ? v : dxr[h] + v;                                          \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_LN_KERNELS(f32, float)
DEFINE_LN_KERNELS(f64, double)

/* float32 backward (ln_backward_fast_f32): per row, with d = x - mt (mt: the
 * mean rounded to float; d is exact near it) and g = dy scale, one pass sums
 * a = sum g and b' = sum g d (one AI_VEC_DECL vector of float lanes per sum
 * and block of LN_ROW_BLOCK values, the blocks added in double) and, where
 * dScale or dB is asked for, the column sums of dy xhat and dy over blocks
 * of up to LN_COL_ROWS rows in float (cs, cb: H floats each; xhat = d invstd
 * + c, c = (mt - mean) invstd), added to dscale, dbias in double after each
 * block. Then, the row still in cache,
 *   dx = invstd g + k d + e,  k = -invstd (invstd b + dinvstd / H),
 *   e = k (mt - mean) + dmean / H - invstd a
 * with a = a / H and b = invstd (b' / H - (mean - mt) a): the reference's
 * terms regrouped, the per-row constants in double, 6 operations a value
 * (the reference's 11: 1.3x torch's time with its sums in double, 64 x 64
 * rows of 128, 1 thread; this one 0.8x). Blocks of rows start at r0 (a
 * chunk's first row): the sums do not depend on the threads. Its reference
 * twin, with the formulas as written there and double sums: ln_backward_f32,
 * run when ai_fast_kernels() is false. */
#define LN_ROW_BLOCK 512
#define LN_COL_ROWS 16
AI_VEC_DECL(ln_vf, float);
#define LN_LANES AI_VEC_LANES(float)

static inline __attribute__((always_inline)) float ln_lane_sum(ln_vf v)
{
    float t[LN_LANES], s = 0;
    memcpy(t, &v, sizeof t);
    for (int l = 0; l < LN_LANES; l++)
        s += t[l];
    return s;
}

/* the row's a = sum g and b' = sum g d (rows) and its terms of the column
 * sums (cols); rows and cols are constants where it is inlined */
static inline __attribute__((always_inline)) void
ln_row_sums_f32(double *a, double *b, float *restrict cs, float *restrict cb, bool rows,
                bool cols, const float *restrict dyr, const float *restrict xr,
                const float *restrict scale, float mt, float ist, float c, int64_t H)
{
    double oa = 0, ob = 0;
    int64_t h = 0;
    while (h < H) {
        ln_vf pa = {0}, pb = {0};
        float ta = 0, tb = 0;
        const int64_t e = h + LN_ROW_BLOCK < H ? h + LN_ROW_BLOCK : H;
        for (; h + LN_LANES <= e; h += LN_LANES) {
            const ln_vf dv = *(const ln_vf *)(dyr + h), d = *(const ln_vf *)(xr + h) - mt;
            const ln_vf g = dv * *(const ln_vf *)(scale + h);
            if (rows) {
                pa += g;
                pb += g * d;
            }
            if (cols) {
                *(ln_vf *)(cs + h) += dv * (d * ist + c);
                *(ln_vf *)(cb + h) += dv;
            }
        }
        for (; h < e; h++) {
            const float d = xr[h] - mt, g = dyr[h] * scale[h];
            if (rows) {
                ta += g;
                tb += g * d;
            }
            if (cols) {
                cs[h] += dyr[h] * (d * ist + c);
                cb[h] += dyr[h];
            }
        }
        if (rows) {
            oa += (double)ln_lane_sum(pa) + ta;
            ob += (double)ln_lane_sum(pb) + tb;
        }
    }
    *a = oa;
    *b = ob;
}

AI_WIDE_CLONES static void ln_backward_fast_f32(float *restrict dx, bool assign,
                                                double *restrict dscale,
                                                double *restrict dbias, float *restrict cs,
                                                float *restrict cb, const float *dy,
                                                const float *x, const float *scale,
                                                const double *mean, const double *invstd,
                                                const ai_tensor *dmean,
                                                const ai_tensor *dinvstd, int64_t r0,
                                                int64_t r1, int64_t H)
{
    const bool cols = dscale != NULL;
    if (!dx && !cols)
        return;
    const double inv_h = 1.0 / (double)H;
    for (int64_t rb = r0; rb < r1; rb += LN_COL_ROWS) {
        const int64_t re = rb + LN_COL_ROWS < r1 ? rb + LN_COL_ROWS : r1;
        if (cols)
            for (int64_t h = 0; h < H; h++)
                cs[h] = cb[h] = 0;
        for (int64_t r = rb; r < re; r++) {
            const float *xr = x + r * H, *dyr = dy + r * H;
            const double m = mean[r], is = invstd[r];
            const float mt = (float)m, ist = (float)is, c = (float)(((double)mt - m) * is);
            double a, b;
            if (!dx) {
                ln_row_sums_f32(&a, &b, cs, cb, false, true, dyr, xr, scale, mt, ist, c, H);
                continue;
            }
            if (cols)
                ln_row_sums_f32(&a, &b, cs, cb, true, true, dyr, xr, scale, mt, ist, c, H);
            else
                ln_row_sums_f32(&a, &b, cs, cb, true, false, dyr, xr, scale, mt, ist, c, H);
            a *= inv_h;
            b = is * (b * inv_h - (m - (double)mt) * a);
            const double di = dinvstd ? ai_float_at(dinvstd, r) * is * is * inv_h : 0;
            const double k = -is * (is * b + di);
            const float kt = (float)k;
            const float et = (float)(k * ((double)mt - m) +
                                     (dmean ? ai_float_at(dmean, r) * inv_h : 0) - is * a);
            float *dxr = dx + r * H;
            int64_t h = 0;
            if (assign) {
                for (; h + LN_LANES <= H; h += LN_LANES)
                    *(ln_vf *)(dxr + h) =
                        ist * (*(const ln_vf *)(dyr + h) * *(const ln_vf *)(scale + h)) +
                        kt * (*(const ln_vf *)(xr + h) - mt) + et;
                for (; h < H; h++)
                    dxr[h] = ist * (dyr[h] * scale[h]) + kt * (xr[h] - mt) + et;
            } else {
                for (; h + LN_LANES <= H; h += LN_LANES)
                    *(ln_vf *)(dxr + h) +=
                        ist * (*(const ln_vf *)(dyr + h) * *(const ln_vf *)(scale + h)) +
                        kt * (*(const ln_vf *)(xr + h) - mt) + et;
                for (; h < H; h++)
                    dxr[h] += ist * (dyr[h] * scale[h]) + kt * (xr[h] - mt) + et;
            }
        }
        if (cols)
            for (int64_t h = 0; h < H; h++) {
                dscale[h] += cs[h];
                dbias[h] += cb[h];
            }
    }
}

/* The forward's rows [lo, hi) on the pool: each row its own statistics and
 * outputs, the same values at any thread count. */
typedef struct {
    void *y;
    double *mean, *invstd;
    const void *x, *scale, *bias;
    double eps;
    int64_t H;
    bool f64;
} ln_job;

static void ln_forward_range(void *ctx, int64_t lo, int64_t hi)
{
    const ln_job *j = ctx;
    const int64_t H = j->H;
    if (j->f64)
        ln_forward_f64((double *)j->y + lo * H, j->mean + lo, j->invstd + lo,
                       (const double *)j->x + lo * H, j->scale, j->bias, j->eps, hi - lo, H);
    else
        ln_forward_f32((float *)j->y + lo * H, j->mean + lo, j->invstd + lo,
                       (const float *)j->x + lo * H, j->scale, j->bias, j->eps, hi - lo, H);
}

static ai_status ln_forward(ai_ctx *c)
{
    const ln_params *p = c->node->params;
    const ai_tensor *x = c->in[0], *bias = ln_bias(c);
    int axis;
    int64_t R, H;
    ln_dims(c, &axis, &R, &H);
    double *mean = c->state, *invstd = mean + R;
    ln_job j = {c->out[0]->data, mean, invstd, x->data, c->in[1]->data,
                bias ? bias->data : NULL, p->eps, H, x->dtype == AI_F64};
    ai_parallel_for(R, ai_grain_of(H), ln_forward_range, &j);
    for (int64_t r = 0; r < R; r++) {
        if (c->n_out > 1)
            ai_float_set(c->out[1], r, mean[r]);
        if (c->n_out > 2)
            ai_float_set(c->out[2], r, invstd[r]);
    }
    return AI_OK;
}

/* Backward's chunks [lo, hi) of rows on the pool (ln_chunks): dx of their
 * rows, and their dScale, dB sums in the chunk's own workspace. */
typedef struct {
    void *dx;
    bool assign, sums, f64, reference;
    double *ws; /* chunk k: dScale sums at 2 H k, dB sums at 2 H k + H */
    float *cols; /* float32, chunk k: its block's column sums at 2 H k, 2 H k + H */
    const void *dy, *x, *scale;
    const double *mean, *invstd;
    const ai_tensor *dmean, *dinvstd;
    int64_t R, H, rows; /* rows per chunk (the last: the rest) */
} ln_back_job;

static void ln_backward_range(void *ctx, int64_t lo, int64_t hi)
{
    const ln_back_job *j = ctx;
    const int64_t H = j->H;
    for (int64_t k = lo; k < hi; k++) {
        const int64_t r0 = k * j->rows, r1 = r0 + j->rows < j->R ? r0 + j->rows : j->R;
        double *gs = j->sums ? j->ws + 2 * H * k : NULL, *gb = gs ? gs + H : NULL;
        if (gs)
            memset(gs, 0, 2 * (size_t)H * sizeof(double));
        if (j->f64)
            ln_backward_f64(j->dx, j->assign, gs, gb, j->dy, j->x, j->scale, j->mean,
                            j->invstd, j->dmean, j->dinvstd, r0, r1, H);
        else if (j->reference)
            ln_backward_f32(j->dx, j->assign, gs, gb, j->dy, j->x, j->scale, j->mean,
                            j->invstd, j->dmean, j->dinvstd, r0, r1, H);
        else
            ln_backward_fast_f32(j->dx, j->assign, gs, gb, j->cols + 2 * H * k,
                                 j->cols + 2 * H * k + H, j->dy, j->x, j->scale, j->mean,
                                 j->invstd, j->dmean, j->dinvstd, r0, r1, H);
    }
}

static ai_status ln_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    int axis;
    int64_t R, H;
    ln_dims(c, &axis, &R, &H);
    if (H == 0) /* nothing to compute, and no workspace */
        return AI_OK;
    ai_tensor *dscale = c->din[1], *dbias = ln_bias(c) ? c->din[2] : NULL;
    const int64_t chunks = ln_chunks(R, H);
    double *ws = c->workspace;
    ln_back_job j = {.dx = c->din[0] ? c->din[0]->data : NULL, .assign = c->din_assign[0],
                     .sums = dscale || dbias, .f64 = x->dtype == AI_F64,
                     .reference = !ai_fast_kernels(), .ws = ws,
                     .cols = (float *)(ws + 2 * H * chunks),
                     .dy = c->dout[0]->data, .x = x->data, .scale = c->in[1]->data,
                     .mean = c->state, .invstd = (const double *)c->state + R,
                     .dmean = c->n_out > 1 ? c->dout[1] : NULL,
                     .dinvstd = c->n_out > 2 ? c->dout[2] : NULL, .R = R, .H = H,
                     .rows = R ? (R + chunks - 1) / chunks : 1};
    const int64_t used = (R + j.rows - 1) / j.rows; /* chunks with rows */
    ai_parallel_for(used, 1, ln_backward_range, &j);
    for (int64_t h = 0; j.sums && h < H; h++) {
        double gs = 0, gb = 0;
        for (int64_t k = 0; k < used; k++) { /* the chunks in order */
            gs += j.ws[2 * H * k + h];
            gb += j.ws[2 * H * k + H + h];
        }
        if (dscale)
            ai_float_set(dscale, h, (c->din_assign[1] ? 0 : ai_float_at(dscale, h)) + gs);
        if (dbias)
            ai_float_set(dbias, h, (c->din_assign[2] ? 0 : ai_float_at(dbias, h)) + gb);
    }
    return AI_OK;
}

static const ai_op_def op_layernorm = {"LayerNormalization", "", 2, 3, 1, 3,
                                       AI_OP_GRAD_ASSIGN(3), ln_init, ln_shape, ln_forward,
                                       ln_backward};

/* ---------------------------------------------------------------- InstanceNormalization */

/* X (N, C, spatial...) as R = N C rows of H values, each normalised by its own
 * mean and biased variance, then scaled and shifted per channel c = r % C
 * (torch's instance_norm and group_norm, which exports as Reshape,
 * InstanceNormalization, Reshape). State: mean and invstd per row;
 * backward's workspace: sum(dy) and sum(dy xhat) per row, added per channel
 * in n's order after the rows (the same values at any thread count). */
typedef struct {
    double eps;
} in_params;

static ai_status in_init(ai_node *n)
{
    in_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    return ai_attr_float(n, "epsilon", 1e-5, &p->eps);
}

static void in_dims(const ai_tensor *x, int64_t *R, int64_t *C, int64_t *H)
{
    *C = x->shape[1];
    *R = x->shape[0] * x->shape[1];
    *H = 1;
    for (int i = 2; i < x->ndim; i++)
        *H *= x->shape[i];
}

static ai_status in_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    const ai_tensor *x = c->in[0];
    ai_status st = float_input(c);
    if (st)
        return st;
    if (x->ndim < 3)
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "input has rank %d; (N, C, D1, ...) of rank >= 3 expected",
                             x->ndim);
    for (int k = 1; k <= 2; k++) {
        const ai_tensor *t = c->in[k];
        if (t->dtype != x->dtype)
            return ai_node_error(c->node, AI_ERR_TYPE, "%s is %s, input is %s",
                                 k == 1 ? "scale" : "B", ai_dtype_name(t->dtype),
                                 ai_dtype_name(x->dtype));
        if (t->ndim != 1 || t->shape[0] != x->shape[1])
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "%s must have shape (C,) = (%lld,)", k == 1 ? "scale" : "B",
                                 (long long)x->shape[1]);
    }
    int64_t R, C, H;
    in_dims(x, &R, &C, &H);
    copy_meta(&out[0], x);
    *state = 2 * (size_t)R * sizeof(double); /* mean, invstd per row */
    *ws = 2 * (size_t)R * sizeof(double);    /* backward: sum(dy), sum(dy xhat) per row */
    return AI_OK;
}

#define DEFINE_IN_KERNELS(SUF, T)                                                          \
    /* rows [r0, r1): mean, invstd (double sums); y = (x - mean) invstd s + b in T */      \
    AI_VECTOR_CLONES static void in_forward_##SUF(T *y, double *mean, double *invstd,      \
                                                  const T *x, const T *scale,              \
                                                  const T *bias, double eps, int64_t r0,   \
                                                  int64_t r1, int64_t C, int64_t H)        \
    {                                                                                      \
        for (int64_t r = r0; r < r1; r++) {                                                \
            const T *xr = x + r * H;                                                       \
            T *yr = y + r * H;                                                             \
            double m, is;                                                                  \
            ROW_MEAN_INVSTD(m, is, xr, H, eps);                                            \
            mean[r] = m;                                                                   \
            invstd[r] = is;                                                                \
            const T mt = (T)m, dm = (T)((double)mt - m), ist = (T)is;                      \
            const T sc = scale[r % C], b = bias[r % C];                                    \
            for (int64_t h = 0; h < H; h++)                                                \
                yr[h] = ((xr[h] - mt) + dm) * ist * sc + b;                                \
        }                                                                                  \
    }                                                                                      \
    /* rows [r0, r1), with xhat = (x - mean) invstd, g = dy s:                             \
     * dx (+)= invstd (g - mean(g) - xhat mean(g xhat)); sdy[r] = sum(dy),                 \
     * sdx[r] = sum(dy xhat) (double) */                                                   \
    AI_VECTOR_CLONES static void in_backward_##SUF(T *dx, bool assign, double *sdy,        \
                                                   double *sdx, const T *dy, const T *x,   \
                                                   const T *scale, const double *mean,     \
                                                   const double *invstd, int64_t r0,       \
                                                   int64_t r1, int64_t C, int64_t H)       \
    {                                                                                      \
        for (int64_t r = r0; r < r1; r++) {                                                \
            const T *xr = x + r * H, *dyr = dy + r * H;                                    \
            const double m = mean[r], is = invstd[r];                                      \
            const T mt = (T)m, dmt = (T)((double)mt - m), ist = (T)is;                     \
            double a, b;                                                                   \
            SUM8_OF(a, H, h, (double)dyr[h]);                                              \
            SUM8_OF(b, H, h, dyr[h] * (((xr[h] - mt) + dmt) * ist));                       \
            sdy[r] = a;                                                                    \
            sdx[r] = b;                                                                    \
            if (!dx)                                                                       \
                continue;                                                                  \
            const T sc = scale[r % C];                                                     \
            const T at = (T)(a * (double)sc / (double)H);                                  \
            const T bt = (T)(b * (double)sc / (double)H);                                  \
            T *dxr = dx + r * H;                                                           \
            for (int64_t h = 0; h < H; h++) {                                              \
                const T xh = ((xr[h] - mt) + dmt) * ist;                                   \
                const T v = ist * (dyr[h] * sc - at - xh * bt);                            \
                dxr[h] = assign ? v : dxr[h] + v;                                          \
            }                                                                              \
        }                                                                                  \
    }

DEFINE_IN_KERNELS(f32, float)
DEFINE_IN_KERNELS(f64, double)

typedef struct {
    void *y, *dx;
    double *mean, *invstd, *sdy, *sdx;
    const void *x, *dy, *scale, *bias;
    double eps;
    int64_t C, H;
    bool f64, assign;
} in_job;

static void in_forward_range(void *ctx, int64_t lo, int64_t hi)
{
    const in_job *j = ctx;
    if (j->f64)
        in_forward_f64(j->y, j->mean, j->invstd, j->x, j->scale, j->bias, j->eps, lo, hi, j->C,
                       j->H);
    else
        in_forward_f32(j->y, j->mean, j->invstd, j->x, j->scale, j->bias, j->eps, lo, hi, j->C,
                       j->H);
}

static void in_backward_range(void *ctx, int64_t lo, int64_t hi)
{
    const in_job *j = ctx;
    if (j->f64)
        in_backward_f64(j->dx, j->assign, j->sdy, j->sdx, j->dy, j->x, j->scale, j->mean,
                        j->invstd, lo, hi, j->C, j->H);
    else
        in_backward_f32(j->dx, j->assign, j->sdy, j->sdx, j->dy, j->x, j->scale, j->mean,
                        j->invstd, lo, hi, j->C, j->H);
}

static ai_status in_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    int64_t R, C, H;
    in_dims(x, &R, &C, &H);
    double *mean = c->state;
    in_job j = {.y = c->out[0]->data, .mean = mean, .invstd = mean + R, .x = x->data,
                .scale = c->in[1]->data, .bias = c->in[2]->data,
                .eps = ((const in_params *)c->node->params)->eps, .C = C, .H = H,
                .f64 = x->dtype == AI_F64};
    ai_parallel_for(R, ai_grain_of(H), in_forward_range, &j);
    return AI_OK;
}

static ai_status in_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    int64_t R, C, H;
    in_dims(x, &R, &C, &H);
    double *mean = c->state, *sdy = c->workspace;
    in_job j = {.dx = c->din[0] ? c->din[0]->data : NULL, .mean = mean, .invstd = mean + R,
                .sdy = sdy, .sdx = sdy + R, .x = x->data, .dy = c->dout[0]->data,
                .scale = c->in[1]->data, .C = C, .H = H, .f64 = x->dtype == AI_F64,
                .assign = c->din_assign[0]};
    ai_parallel_for(R, ai_grain_of(H), in_backward_range, &j);
    ai_tensor *dscale = c->din[1], *dbias = c->din[2];
    for (int64_t ch = 0; ch < C; ch++) {
        double gs = 0, gb = 0;
        for (int64_t r = ch; r < R; r += C) {
            gs += j.sdx[r];
            gb += sdy[r];
        }
        if (dscale)
            ai_float_set(dscale, ch, (c->din_assign[1] ? 0 : ai_float_at(dscale, ch)) + gs);
        if (dbias)
            ai_float_set(dbias, ch, (c->din_assign[2] ? 0 : ai_float_at(dbias, ch)) + gb);
    }
    return AI_OK;
}

static const ai_op_def op_instancenorm = {"InstanceNormalization", "", 3, 3, 1, 1,
                                          AI_OP_GRAD_ASSIGN(3), in_init, in_shape, in_forward,
                                          in_backward};

/* ---------------------------------------------------------------- Softmax, LogSoftmax */

/* X is (outer, L, inner), normalised along L. Opset >= 13: L is the axis
 * (default -1). Before: X is coerced to 2-D at axis (default 1) and
 * normalised along the flattened trailing dimensions (inner = 1). */
typedef struct {
    int64_t outer, L, inner;
} sm_dims;

static ai_status sm_dims_of(const ai_ctx *c, sm_dims *d)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0];
    const bool coerce = n->opset < 13;
    int64_t a;
    int axis;
    ai_status st = ai_attr_int(n, "axis", coerce ? 1 : -1, &a);
    if (st || (st = ai_norm_axis(n, a, x->ndim, &axis)))
        return st;
    d->outer = d->L = d->inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < axis)
            d->outer *= x->shape[i];
        else if (i == axis || coerce)
            d->L *= x->shape[i];
        else
            d->inner *= x->shape[i];
    }
    return AI_OK;
}

static ai_status sm_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    sm_dims d;
    ai_status st = float_input(c);
    if (st || (st = sm_dims_of(c, &d)))
        return st;
    copy_meta(&out[0], c->in[0]);
    *ws = 2 * (size_t)d.inner * sizeof(double); /* max and sum per column */
    return AI_OK;
}

#define DEFINE_SM_KERNELS(SUF, T, EXPF)                                                    \
    /* softmax: y = exp(x - max) / sum; log: y = x - max - log(sum) */                     \
    AI_WIDE_CLONES static void sm_forward_##SUF(T *y, const T *x, bool log_, double *mx,   \
                                                double *sum, sm_dims d, int64_t i0,        \
                                                int64_t i1)                                \
    {                                                                                      \
        const int64_t L = d.L, I = d.inner;                                                \
        for (int64_t o = 0; o < d.outer; o++) {                                            \
            const T *xo = x + o * L * I;                                                   \
            T *yo = y + o * L * I;                                                         \
            for (int64_t i = i0; i < i1; i++) {                                            \
                mx[i] = -INFINITY;                                                         \
                sum[i] = 0;                                                                \
            }                                                                              \
            for (int64_t l = 0; l < L; l++)                                                \
                for (int64_t i = i0; i < i1; i++) {                                        \
                    const double v = xo[l * I + i];                                        \
                    mx[i] = (v > mx[i] || v != v) && mx[i] == mx[i] ? v : mx[i];           \
                }                                                                          \
            for (int64_t l = 0; l < L; l++)                                                \
                for (int64_t i = i0; i < i1; i++) {                                        \
                    const T e = EXPF(xo[l * I + i] - (T)mx[i]);                            \
                    sum[i] += e;                                                           \
                    if (!log_)                                                             \
                        yo[l * I + i] = e;                                                 \
                }                                                                          \
            for (int64_t i = i0; i < i1; i++) /* once per column */                        \
                sum[i] = log_ ? mx[i] + log(sum[i]) : 1.0 / sum[i];                        \
            for (int64_t l = 0; l < L; l++)                                                \
                for (int64_t i = i0; i < i1; i++)                                          \
                    yo[l * I + i] = log_ ? (T)(xo[l * I + i] - sum[i])                     \
                                         : (T)(yo[l * I + i] * sum[i]);                    \
        }                                                                                  \
    }                                                                                      \
    /* softmax: dx += y * (dy - sum(dy * y)); log: dx += dy - exp(y) * sum(dy); dx = with  \
     * assign */                                                                           \
    AI_VECTOR_CLONES static void sm_backward_##SUF(T *dx, const T *dy, const T *y,         \
                                                   bool log_, bool assign, double *sum,    \
                                                   sm_dims d, int64_t i0, int64_t i1)      \
    {                                                                                      \
        const int64_t L = d.L, I = d.inner;                                                \
        for (int64_t o = 0; o < d.outer; o++) {                                            \
            const T *dyo = dy + o * L * I, *yo = y + o * L * I;                            \
            T *dxo = dx + o * L * I;                                                       \
            for (int64_t i = i0; i < i1; i++)                                              \
                sum[i] = 0;                                                                \
            for (int64_t l = 0; l < L; l++)                                                \
                for (int64_t i = i0; i < i1; i++)                                          \
                    sum[i] += log_ ? (double)dyo[l * I + i]                                \
                                   : (double)dyo[l * I + i] * yo[l * I + i];               \
            for (int64_t l = 0; l < L; l++)                                                \
                for (int64_t i = i0; i < i1; i++) {                                        \
                    const int64_t k = l * I + i;                                           \
                    const T g = log_ ? (T)(dyo[k] - EXPF(yo[k]) * sum[i])                  \
                                     : (T)(yo[k] * (dyo[k] - sum[i]));                     \
                    dxo[k] = assign ? g : dxo[k] + g;                                      \
                }                                                                          \
        }                                                                                  \
    }

DEFINE_SM_KERNELS(f32, float, ai_expf)
DEFINE_SM_KERNELS(f64, double, exp)

/* The same along contiguous rows (inner == 1, the usual last axis), in loops
 * that vectorise: 8 lanes for the max and for the double sums (SUM8_OF),
 * whatever the thread count. A NaN is skipped by the max but
 * makes the sum, hence the whole row, NaN. The strided kernels above
 * compute the same with one chain per column (tests/test_ops_kernels_47.py
 * runs both against torch). Where AVX-512 runs, float32's forward and
 * LogSoftmax's backward run kernels/rows.c's 16-lane kernels instead, and
 * these are their reference. */
#define DEFINE_SM_ROW_KERNELS(SUF, T, EXPF)                                                \
    AI_WIDE_CLONES static void sm_rows_forward_##SUF(T *y, const T *x, bool log_,          \
                                                     int64_t R, int64_t L)                 \
    {                                                                                      \
        for (int64_t r = 0; r < R; r++) {                                                  \
            const T *xr = x + r * L;                                                       \
            T *yr = y + r * L;                                                             \
            T m8[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,                         \
                       -INFINITY, -INFINITY, -INFINITY, -INFINITY};                        \
            int64_t l = 0;                                                                 \
            for (; l + 8 <= L; l += 8)                                                     \
                for (int k = 0; k < 8; k++)                                                \
                    m8[k] = xr[l + k] > m8[k] ? xr[l + k] : m8[k];                         \
            for (; l < L; l++)                                                             \
                m8[0] = xr[l] > m8[0] ? xr[l] : m8[0];                                     \
            T m = m8[0];                                                                   \
            for (int k = 1; k < 8; k++)                                                    \
                m = m8[k] > m ? m8[k] : m;                                                 \
            for (l = 0; l < L; l++) /* y holds exp(x - max) until the last pass */         \
                yr[l] = EXPF(xr[l] - m);                                                   \
            double sum;                                                                    \
            SUM8_OF(sum, L, i_, yr[i_]);                                                   \
            if (log_) { /* (x - max) - log(sum) in T, like torch */                        \
                const T ls = (T)log(sum);                                                  \
                for (l = 0; l < L; l++)                                                    \
                    yr[l] = (xr[l] - m) - ls;                                              \
            } else { /* times the inverse, in T, like torch */                             \
                const T inv = (T)(1.0 / sum);                                              \
                for (l = 0; l < L; l++)                                                    \
                    yr[l] *= inv;                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    /* softmax: dx += y (dy - sum(dy y)); log: dx += dy - exp(y) sum(dy); the sums in      \
     * double, the rest in T, like torch */                                                \
    AI_WIDE_CLONES static void sm_rows_backward_##SUF(T *dx, const T *dy, const T *y,      \
                                                      bool log_, bool assign, int64_t R,   \
                                                      int64_t L)                           \
    {                                                                                      \
        for (int64_t r = 0; r < R; r++) {                                                  \
            const T *dyr = dy + r * L, *yr = y + r * L;                                    \
            T *dxr = dx + r * L;                                                           \
            double s;                                                                      \
            if (log_)                                                                      \
                SUM8_OF(s, L, i_, (double)dyr[i_]);                                        \
            else                                                                           \
                SUM8_OF(s, L, i_, (double)dyr[i_] * yr[i_]);                               \
            const T sum = (T)s;                                                            \
            if (log_ && assign)                                                            \
                for (int64_t l = 0; l < L; l++)                                            \
                    dxr[l] = dyr[l] - EXPF(yr[l]) * sum;                                   \
            else if (log_)                                                                 \
                for (int64_t l = 0; l < L; l++)                                            \
                    dxr[l] += dyr[l] - EXPF(yr[l]) * sum;                                  \
            else if (assign)                                                               \
                for (int64_t l = 0; l < L; l++)                                            \
                    dxr[l] = yr[l] * (dyr[l] - sum);                                       \
            else                                                                           \
                for (int64_t l = 0; l < L; l++)                                            \
                    dxr[l] += yr[l] * (dyr[l] - sum);                                      \
        }                                                                                  \
    }

DEFINE_SM_ROW_KERNELS(f32, float, ai_expf)
DEFINE_SM_ROW_KERNELS(f64, double, exp)

static bool sm_is_log(const ai_ctx *c)
{
    return strcmp(c->node->op_type, "LogSoftmax") == 0;
}

/* A Softmax pass on the thread pool: over rows when inner == 1, else over
 * the inner columns, each with its own max and sum in the workspace. */
typedef struct {
    bool f64, log_, backward, assign; /* assign: backward writes dx, not += */
    sm_dims d;
    const void *x, *dy; /* x: forward's input, or backward's saved output */
    void *out;          /* y or dx */
    double *mx, *sum;
} sm_job;

static void sm_range(void *ctx, int64_t lo, int64_t hi)
{
    const sm_job *j = ctx;
    const int64_t L = j->d.L;
    const bool rows = j->d.inner == 1;
    const size_t off = rows ? (size_t)(lo * L) : 0;
    if (rows && !j->f64 && !j->backward) {
        float *y = (float *)j->out + off;
        const float *x = (const float *)j->x + off;
        if (!ai_softmax_rows_v16(y, x, j->log_, hi - lo, L))
            sm_rows_forward_f32(y, x, j->log_, hi - lo, L);
    } else if (rows && !j->backward)
        sm_rows_forward_f64((double *)j->out + off, (const double *)j->x + off, j->log_, hi - lo,
                            L);
    else if (rows && !j->f64) {
        float *dx = (float *)j->out + off;
        const float *dy = (const float *)j->dy + off, *y = (const float *)j->x + off;
        if (!(j->log_ ? ai_logsoftmax_backward_rows_v16(dx, dy, y, j->assign, hi - lo, L)
                      : ai_softmax_backward_rows_v16(dx, dy, y, j->assign, hi - lo, L)))
            sm_rows_backward_f32(dx, dy, y, j->log_, j->assign, hi - lo, L);
    } else if (rows)
        sm_rows_backward_f64((double *)j->out + off, (const double *)j->dy + off,
                             (const double *)j->x + off, j->log_, j->assign, hi - lo, L);
    else if (!j->f64 && !j->backward)
        sm_forward_f32(j->out, j->x, j->log_, j->mx, j->sum, j->d, lo, hi);
    else if (!j->backward)
        sm_forward_f64(j->out, j->x, j->log_, j->mx, j->sum, j->d, lo, hi);
    else if (!j->f64)
        sm_backward_f32(j->out, j->dy, j->x, j->log_, j->assign, j->sum, j->d, lo, hi);
    else
        sm_backward_f64(j->out, j->dy, j->x, j->log_, j->assign, j->sum, j->d, lo, hi);
}

static ai_status sm_run(ai_ctx *c, bool backward)
{
    sm_job j = {.f64 = c->in[0]->dtype == AI_F64, .log_ = sm_is_log(c),
                .backward = backward, .assign = backward && c->din_assign[0]};
    ai_status st = sm_dims_of(c, &j.d);
    if (st)
        return st;
    j.x = backward ? c->out[0]->data : c->in[0]->data;
    j.dy = backward ? c->dout[0]->data : NULL;
    j.out = backward ? c->din[0]->data : c->out[0]->data;
    j.mx = c->workspace;
    j.sum = backward ? j.mx : j.mx + j.d.inner;
    const int64_t items = j.d.inner == 1 ? j.d.outer : j.d.inner;
    const int64_t per_item = j.d.inner == 1 ? j.d.L : j.d.outer * j.d.L;
    ai_parallel_for(items, ai_grain_of(per_item), sm_range, &j);
    return AI_OK;
}

static ai_status sm_forward(ai_ctx *c) { return sm_run(c, false); }

static ai_status sm_backward(ai_ctx *c) { return sm_run(c, true); }

static const ai_op_def op_softmax = {"Softmax", "", 1, 1, 1, 1, AI_OP_GRAD_ASSIGN(1), NULL,
                                     sm_shape, sm_forward, sm_backward};
static const ai_op_def op_logsoftmax = {"LogSoftmax", "", 1, 1, 1, 1, AI_OP_GRAD_ASSIGN(1),
                                        NULL, sm_shape, sm_forward, sm_backward};

/* ---------------------------------------------------------------- Hardmax */

/* 1 at the first largest value along the axis (NaN counts as the largest,
 * as in ArgMax), 0 elsewhere; the axes of Softmax (opset < 13: the input
 * coerced to 2-D at `axis`). No gradient: it is piecewise constant. */
static ai_status hardmax_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    ai_tensor *y = c->out[0];
    sm_dims d;
    ai_status st = sm_dims_of(c, &d);
    if (st)
        return st;
    for (int64_t o = 0; o < d.outer; o++)
        for (int64_t i = 0; i < d.inner; i++) {
            const int64_t base = o * d.L * d.inner + i;
            int64_t best = 0;
            for (int64_t l = 0; l < d.L; l++) {
                const double v = ai_float_at(x, base + l * d.inner);
                const double b = ai_float_at(x, base + best * d.inner);
                if (b == b && (v != v || v > b))
                    best = l;
                ai_float_set(y, base + l * d.inner, 0);
            }
            if (d.L)
                ai_float_set(y, base + best * d.inner, 1);
        }
    return AI_OK;
}

/* ---------------------------------------------------------------- LpNormalization */

/* y = x / ||x||_p along `axis` (default -1), p 1 or 2; a zero norm gives 0
 * (ONNX's reference, and torch.nn.functional.normalize with eps 0 apart
 * from its 0/0). Backward, with n the norm and g = sum(dy * x) along the
 * axis: p = 2: dx = dy / n - x * g / n^3; p = 1: dx = dy / n - sign(x) * g /
 * n^2; 0 where n = 0. */
static ai_status lpnorm_dims(const ai_ctx *c, sm_dims *d, int64_t *p)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0];
    int64_t a;
    int axis;
    ai_status st = ai_attr_int(n, "axis", -1, &a);
    if (!st)
        st = ai_attr_int(n, "p", 2, p);
    if (st)
        return st;
    if (*p != 1 && *p != 2)
        return ai_node_error(n, AI_ERR_VALUE, "p = %lld; 1 or 2 expected", (long long)*p);
    if ((st = ai_norm_axis(n, a, x->ndim, &axis)))
        return st;
    d->outer = d->L = d->inner = 1;
    for (int i = 0; i < x->ndim; i++)
        *(i < axis ? &d->outer : i == axis ? &d->L : &d->inner) *= x->shape[i];
    return AI_OK;
}

static ai_status lpnorm_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    sm_dims d;
    int64_t p;
    ai_status st = float_input(c);
    if (st || (st = lpnorm_dims(c, &d, &p)))
        return st;
    copy_meta(&out[0], c->in[0]);
    return AI_OK;
}

static double lp_norm(const ai_tensor *x, int64_t base, int64_t L, int64_t inner, int64_t p)
{
    double s = 0;
    for (int64_t l = 0; l < L; l++) {
        const double v = ai_float_at(x, base + l * inner);
        s += p == 1 ? fabs(v) : v * v;
    }
    return p == 1 ? s : sqrt(s);
}

static ai_status lpnorm_forward(ai_ctx *c)
{
    sm_dims d;
    int64_t p;
    ai_status st = lpnorm_dims(c, &d, &p);
    if (st)
        return st;
    const ai_tensor *x = c->in[0];
    for (int64_t o = 0; o < d.outer; o++)
        for (int64_t i = 0; i < d.inner; i++) {
            const int64_t base = o * d.L * d.inner + i;
            const double nrm = lp_norm(x, base, d.L, d.inner, p);
            for (int64_t l = 0; l < d.L; l++) {
                const int64_t k = base + l * d.inner;
                ai_float_set(c->out[0], k, nrm == 0 ? 0 : ai_float_at(x, k) / nrm);
            }
        }
    return AI_OK;
}

static ai_status lpnorm_backward(ai_ctx *c)
{
    ai_tensor *dx = c->din[0];
    if (!dx)
        return AI_OK;
    sm_dims d;
    int64_t p;
    ai_status st = lpnorm_dims(c, &d, &p);
    if (st)
        return st;
    const ai_tensor *x = c->in[0], *dy = c->dout[0];
    const bool assign = c->din_assign[0];
    for (int64_t o = 0; o < d.outer; o++)
        for (int64_t i = 0; i < d.inner; i++) {
            const int64_t base = o * d.L * d.inner + i;
            const double nrm = lp_norm(x, base, d.L, d.inner, p);
            double g = 0;
            for (int64_t l = 0; l < d.L; l++)
                g += ai_float_at(dy, base + l * d.inner) * ai_float_at(x, base + l * d.inner);
            for (int64_t l = 0; l < d.L; l++) {
                const int64_t k = base + l * d.inner;
                const double v = ai_float_at(x, k);
                const double dir = p == 1 ? (v > 0) - (v < 0) : v / nrm;
                const double gk = nrm == 0 ? 0 : (ai_float_at(dy, k) - dir * g / nrm) / nrm;
                ai_float_set(dx, k, assign ? gk : ai_float_at(dx, k) + gk);
            }
        }
    return AI_OK;
}

/* ---------------------------------------------------------------- MeanVarianceNormalization */

/* y = (x - mean) / (sqrt(var) + 1e-9) over `axes` (default 0, 2, 3), the
 * biased variance: ONNX's function body. Groups are the positions on the
 * other axes; gstride gives an element's group (0 on the reduced axes).
 * Backward, with s = sqrt(var) + 1e-9 and xc = x - mean per group of n:
 * dx = (dy - mean(dy)) / s - xc * mean(dy * xc) / (s^2 sqrt(var)), the last
 * term 0 where var is 0 (xc is 0 there). Workspace: 3 doubles per group. */
#define MVN_EPS 1e-9

typedef struct {
    int64_t groups, count;
    int64_t gstride[AI_MAX_DIMS];
} mvn_dims;

static ai_status mvn_dims_of(const ai_ctx *c, mvn_dims *d)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0];
    static const int64_t dflt[] = {0, 2, 3};
    const int64_t *axes;
    int64_t len;
    ai_status st = ai_attr_ints(n, "axes", &axes, &len);
    if (st)
        return st;
    if (len < 0) {
        axes = dflt;
        len = 3;
    }
    bool reduced[AI_MAX_DIMS] = {false};
    for (int64_t i = 0; i < len; i++) {
        int a;
        if ((st = ai_norm_axis(n, axes[i], x->ndim, &a)))
            return st;
        if (reduced[a])
            return ai_node_error(n, AI_ERR_VALUE, "axis %d appears twice in axes", a);
        reduced[a] = true;
    }
    d->groups = d->count = 1;
    for (int i = x->ndim - 1; i >= 0; i--) {
        d->gstride[i] = reduced[i] ? 0 : d->groups;
        *(reduced[i] ? &d->count : &d->groups) *= x->shape[i];
    }
    return AI_OK;
}

/* Steps idx (the position of flat element k) to k + 1 and gi to its group. */
static void mvn_next(const ai_tensor *x, const mvn_dims *d, int64_t *idx, int64_t *gi)
{
    for (int i = x->ndim - 1; i >= 0; i--) {
        *gi += d->gstride[i];
        if (++idx[i] < x->shape[i])
            return;
        *gi -= d->gstride[i] * x->shape[i];
        idx[i] = 0;
    }
}

/* for each element k of x, with gi its group */
#define MVN_LOOP(x, d)                                                                     \
    for (int64_t k = 0, gi = 0, n_ = ai_tensor_numel(x), idx_[AI_MAX_DIMS] = {0}; k < n_;  \
         k++, mvn_next(x, d, idx_, &gi))

static ai_status mvn_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    mvn_dims d;
    ai_status st = float_input(c);
    if (st || (st = mvn_dims_of(c, &d)))
        return st;
    copy_meta(&out[0], c->in[0]);
    *ws = 3 * (size_t)d.groups * sizeof(double);
    return AI_OK;
}

/* mean[g] and sd[g] = sqrt(var) of each group. */
static void mvn_stats(const ai_tensor *x, const mvn_dims *d, double *mean, double *sd)
{
    memset(mean, 0, (size_t)d->groups * sizeof(double));
    memset(sd, 0, (size_t)d->groups * sizeof(double));
    MVN_LOOP(x, d)
        mean[gi] += ai_float_at(x, k);
    for (int64_t g = 0; g < d->groups; g++)
        mean[g] /= (double)d->count;
    MVN_LOOP(x, d) {
        const double v = ai_float_at(x, k) - mean[gi];
        sd[gi] += v * v;
    }
    for (int64_t g = 0; g < d->groups; g++)
        sd[g] = sqrt(sd[g] / (double)d->count);
}

static ai_status mvn_forward(ai_ctx *c)
{
    mvn_dims d;
    ai_status st = mvn_dims_of(c, &d);
    if (st)
        return st;
    const ai_tensor *x = c->in[0];
    if (d.groups == 0) /* an empty x: no workspace */
        return AI_OK;
    double *mean = c->workspace, *sd = mean + d.groups;
    mvn_stats(x, &d, mean, sd);
    MVN_LOOP(x, &d)
        ai_float_set(c->out[0], k, (ai_float_at(x, k) - mean[gi]) / (sd[gi] + MVN_EPS));
    return AI_OK;
}

static ai_status mvn_backward(ai_ctx *c)
{
    ai_tensor *dx = c->din[0];
    if (!dx)
        return AI_OK;
    mvn_dims d;
    ai_status st = mvn_dims_of(c, &d);
    if (st)
        return st;
    const ai_tensor *x = c->in[0], *dy = c->dout[0];
    const bool assign = c->din_assign[0];
    if (d.groups == 0) /* an empty x: no workspace */
        return AI_OK;
    double *mean = c->workspace, *sd = mean + d.groups, *mdy = sd + d.groups;
    mvn_stats(x, &d, mean, sd);
    /* the mean's part: mdy holds mean(dy) */
    memset(mdy, 0, (size_t)d.groups * sizeof(double));
    MVN_LOOP(x, &d)
        mdy[gi] += ai_float_at(dy, k);
    for (int64_t g = 0; g < d.groups; g++)
        mdy[g] /= (double)d.count;
    MVN_LOOP(x, &d) {
        const double gk = (ai_float_at(dy, k) - mdy[gi]) / (sd[gi] + MVN_EPS);
        ai_float_set(dx, k, assign ? gk : ai_float_at(dx, k) + gk);
    }
    /* the variance's part: mdy holds mean(dy * xc) / (s^2 sqrt(var)) */
    memset(mdy, 0, (size_t)d.groups * sizeof(double));
    MVN_LOOP(x, &d)
        mdy[gi] += ai_float_at(dy, k) * (ai_float_at(x, k) - mean[gi]);
    for (int64_t g = 0; g < d.groups; g++) {
        const double s = sd[g] + MVN_EPS;
        mdy[g] = sd[g] == 0 ? 0 : mdy[g] / (double)d.count / (s * s * sd[g]);
    }
    MVN_LOOP(x, &d)
        ai_float_set(dx, k, ai_float_at(dx, k) - (ai_float_at(x, k) - mean[gi]) * mdy[gi]);
    return AI_OK;
}

/* ---------------------------------------------------------------- LRN */

/* LRN over channels of X (N, C, D...), in double: with the window
 * W(c) = [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to [0, C),
 *   d_c = bias + alpha / size * sum_{k in W(c)} x_k^2,   y_c = x_c d_c^-beta.
 * Backward: dx_j += dy_j d_j^-beta
 *                 - 2 beta alpha / size x_j sum_{c: j in W(c)} dy_c x_c d_c^(-beta-1).
 * Work splits by n; the workspace holds d and the sum's terms for one
 * (n, position) column per n. */
typedef struct {
    double alpha, beta, bias;
    int64_t size;
} lrn_params;

static ai_status lrn_init(ai_node *n)
{
    lrn_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    ai_status st;
    if ((st = ai_attr_float(n, "alpha", 1e-4, &p->alpha)) ||
        (st = ai_attr_float(n, "beta", 0.75, &p->beta)) ||
        (st = ai_attr_float(n, "bias", 1.0, &p->bias)) ||
        (st = ai_attr_int(n, "size", 0, &p->size)))
        return st;
    if (p->size < 1)
        return ai_node_error(n, AI_ERR_VALUE, "size is %lld; a positive size is required",
                             (long long)p->size);
    return AI_OK;
}

static ai_status lrn_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    ai_status st = float_input(c);
    if (st)
        return st;
    if (c->in[0]->ndim < 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank %d; (N, C, ...) expected",
                             c->in[0]->ndim);
    copy_meta(&out[0], c->in[0]);
    *ws = 2 * (size_t)(c->in[0]->shape[0] * c->in[0]->shape[1]) * sizeof(double);
    return AI_OK;
}

typedef struct {
    const lrn_params *p;
    double *work;
    const ai_tensor *x, *dy;
    ai_tensor *y, *dx;
    int64_t C, S; /* channels, positions per channel */
} lrn_job;

static void lrn_range(void *ctx, int64_t lo, int64_t hi)
{
    const lrn_job *j = ctx;
    const lrn_params *p = j->p;
    const int64_t C = j->C, S = j->S, before = (p->size - 1) / 2, after = p->size / 2;
    for (int64_t n = lo; n < hi; n++)
        for (int64_t s = 0; s < S; s++) {
            double *d = j->work + n * 2 * C, *t = d + C;
            const int64_t base = n * C * S + s;
            for (int64_t ch = 0; ch < C; ch++) {
                double sum = 0;
                /* (the window clipped first: size may be far beyond C) */
                const int64_t k0 = ch - before < 0 ? 0 : ch - before;
                const int64_t k1 = after >= C - ch ? C - 1 : ch + after;
                for (int64_t k = k0; k <= k1; k++) {
                    const double v = ai_float_at(j->x, base + k * S);
                    sum += v * v;
                }
                d[ch] = p->bias + p->alpha / (double)p->size * sum;
            }
            if (!j->dx) {
                for (int64_t ch = 0; ch < C; ch++)
                    ai_float_set(j->y, base + ch * S,
                                 ai_float_at(j->x, base + ch * S) * pow(d[ch], -p->beta));
                continue;
            }
            for (int64_t ch = 0; ch < C; ch++) /* dy_c x_c d_c^(-beta-1) */
                t[ch] = ai_float_at(j->dy, base + ch * S) * ai_float_at(j->x, base + ch * S) *
                        pow(d[ch], -p->beta - 1);
            for (int64_t k = 0; k < C; k++) {
                double sum = 0; /* over the c whose window holds k */
                const int64_t c0 = k - after < 0 ? 0 : k - after;
                const int64_t c1 = before >= C - k ? C - 1 : k + before;
                for (int64_t ch = c0; ch <= c1; ch++)
                    sum += t[ch];
                const double xk = ai_float_at(j->x, base + k * S);
                const double g = ai_float_at(j->dy, base + k * S) * pow(d[k], -p->beta) -
                                 2 * p->beta * p->alpha / (double)p->size * xk * sum;
                ai_float_set(j->dx, base + k * S, ai_float_at(j->dx, base + k * S) + g);
            }
        }
}

static ai_status lrn_run(ai_ctx *c, bool backward)
{
    const ai_tensor *x = c->in[0];
    lrn_job j = {.p = c->node->params, .work = c->workspace, .x = x, .C = x->shape[1], .S = 1};
    for (int d = 2; d < x->ndim; d++)
        j.S *= x->shape[d];
    if (backward) {
        if (!(j.dx = c->din[0]))
            return AI_OK;
        j.dy = c->dout[0];
    } else {
        j.y = c->out[0];
    }
    ai_parallel_for(x->shape[0], ai_grain_of(j.C * j.S * 8), lrn_range, &j);
    return AI_OK;
}

static ai_status lrn_forward(ai_ctx *c)
{
    return lrn_run(c, false);
}

static ai_status lrn_backward(ai_ctx *c)
{
    return lrn_run(c, true);
}

static const ai_op_def op_hardmax = {"Hardmax", "", 1, 1, 1, 1, 0, NULL, sm_shape,
                                     hardmax_forward, NULL};
static const ai_op_def op_lpnorm = {"LpNormalization", "", 1, 1, 1, 1,
                                    AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_Y, NULL, lpnorm_shape,
                                    lpnorm_forward, lpnorm_backward};
/* backward reads x (not y) */
static const ai_op_def op_lrn = {"LRN", "", 1, 1, 1, 1, AI_OP_BWD_NO_Y, lrn_init, lrn_shape,
                                 lrn_forward, lrn_backward};
static const ai_op_def op_mvn = {"MeanVarianceNormalization", "", 1, 1, 1, 1,
                                 AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_Y, NULL, mvn_shape,
                                 mvn_forward, mvn_backward};

const ai_op_def *const ai_ops_norm[] = {&op_batchnorm, &op_layernorm, &op_instancenorm,
                                        &op_softmax, &op_logsoftmax, &op_hardmax,
                                        &op_lpnorm, &op_mvn, &op_lrn, NULL};
