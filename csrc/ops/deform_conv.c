/*
 * deform_conv.c — DeformConv (opset 19, 22): a 2-D convolution whose
 * kernel taps sample X at learned offsets, each scaled by a mask
 * (torchvision.ops.deform_conv2d; ONNX's reference computes the same).
 *
 *   X [N, C, H, W], W [OC, C / group, kh, kw], offset [N, og * kh * kw * 2,
 *   oh, ow] ((dy, dx) per tap of each of the og offset groups), B [OC]?,
 *   mask [N, og * kh * kw, oh, ow]? (1 when absent) -> Y [N, OC, oh, ow]
 *
 * Tap (ki, kj) of output (i, j) reads X at (i * sh - pad_top + ki * dh +
 * dy, j * sw - pad_left + kj * dw + dx), bilinearly, corners outside X
 * reading 0. Per image, the samples times the mask form the columns
 * (C * kh * kw rows of oh * ow, the workspace), and Y is W times them per
 * group. Backward: dW and dB from the columns; the columns' gradient goes
 * to X (the bilinear weights), to the mask (the samples) and to the
 * offsets (the samples' derivative along y and x).
 */
#include <math.h>
#include <string.h>

#include "movement.h"

typedef struct {
    int64_t N, C, H, W, OC, kh, kw, oh, ow, group, og;
    int64_t s[2], d[2], pad[4];
} dc_geom;

static ai_status dc_ints(const ai_ctx *c, const char *name, int64_t dflt, int64_t *out, int n)
{
    const int64_t *v;
    int64_t len;
    ai_status st = ai_attr_ints(c->node, name, &v, &len);
    if (st)
        return st;
    if (len >= 0 && len != n)
        return ai_node_error(c->node, AI_ERR_VALUE, "%s has %lld values; %d expected", name,
                             (long long)len, n);
    for (int i = 0; i < n; i++)
        out[i] = len < 0 ? dflt : v[i];
    return AI_OK;
}

static ai_status dc_setup(const ai_ctx *c, dc_geom *g)
{
    const ai_tensor *x = c->in[0], *w = c->in[1], *off = c->in[2];
    const ai_tensor *b = c->n_in > 3 ? c->in[3] : NULL, *m = c->n_in > 4 ? c->in[4] : NULL;
    ai_status st;
    if (x->ndim != 4)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "X has rank %d; only 2-D "
                             "deformable convolutions ([N, C, H, W]) are supported", x->ndim);
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "X is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    for (int i = 1; i < c->n_in; i++)
        if (c->in[i] && c->in[i]->dtype != x->dtype)
            return ai_node_error(c->node, AI_ERR_TYPE, "input %d is %s, X %s", i,
                                 ai_dtype_name(c->in[i]->dtype), ai_dtype_name(x->dtype));
    if ((st = ai_attr_int(c->node, "group", 1, &g->group)) ||
        (st = ai_attr_int(c->node, "offset_group", 1, &g->og)) ||
        (st = dc_ints(c, "strides", 1, g->s, 2)) || (st = dc_ints(c, "dilations", 1, g->d, 2)) ||
        (st = dc_ints(c, "pads", 0, g->pad, 4)))
        return st;
    g->N = x->shape[0], g->C = x->shape[1], g->H = x->shape[2], g->W = x->shape[3];
    if (w->ndim != 4)
        return ai_node_error(c->node, AI_ERR_VALUE, "W has rank %d; 4 expected", w->ndim);
    g->OC = w->shape[0], g->kh = w->shape[2], g->kw = w->shape[3];
    int64_t ks[2] = {-1, -1};
    if ((st = dc_ints(c, "kernel_shape", -1, ks, 2)))
        return st;
    if ((ks[0] >= 0 && ks[0] != g->kh) || (ks[1] >= 0 && ks[1] != g->kw))
        return ai_node_error(c->node, AI_ERR_VALUE, "kernel_shape differs from W's");
    if (g->group < 1 || g->og < 1 || g->C != w->shape[1] * g->group || g->OC % g->group ||
        g->C % g->og)
        return ai_node_error(c->node, AI_ERR_VALUE, "X has %lld channels, W is [%lld, %lld, "
                             "...], group %lld and offset_group %lld: C = W.shape[1] * group, "
                             "OC divisible by group, C by offset_group expected",
                             (long long)g->C, (long long)g->OC, (long long)w->shape[1],
                             (long long)g->group, (long long)g->og);
    for (int i = 0; i < 2; i++)
        if (g->s[i] < 1 || g->d[i] < 1 || g->pad[i] < 0 || g->pad[i + 2] < 0 ||
            g->d[i] > INT32_MAX || g->pad[i] > INT32_MAX || g->pad[i + 2] > INT32_MAX)
            return ai_node_error(c->node, AI_ERR_VALUE, "strides and dilations must be "
                                 "positive, pads not negative, dilations and pads below 2^31");
    g->oh = (g->H + g->pad[0] + g->pad[2] - ((g->kh - 1) * g->d[0] + 1)) / g->s[0] + 1;
    g->ow = (g->W + g->pad[1] + g->pad[3] - ((g->kw - 1) * g->d[1] + 1)) / g->s[1] + 1;
    if (g->oh < 1 || g->ow < 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "the dilated kernel (%lld x %lld) is larger "
                             "than the padded input (%lld x %lld)",
                             (long long)((g->kh - 1) * g->d[0] + 1),
                             (long long)((g->kw - 1) * g->d[1] + 1),
                             (long long)(g->H + g->pad[0] + g->pad[2]),
                             (long long)(g->W + g->pad[1] + g->pad[3]));
    const int64_t taps = g->og * g->kh * g->kw;
    if (off->ndim != 4 || off->shape[0] != g->N || off->shape[1] != taps * 2 ||
        off->shape[2] != g->oh || off->shape[3] != g->ow)
        return ai_node_error(c->node, AI_ERR_VALUE, "offset must be [%lld, %lld, %lld, %lld]",
                             (long long)g->N, (long long)taps * 2, (long long)g->oh,
                             (long long)g->ow);
    if (m && (m->ndim != 4 || m->shape[0] != g->N || m->shape[1] != taps ||
              m->shape[2] != g->oh || m->shape[3] != g->ow))
        return ai_node_error(c->node, AI_ERR_VALUE, "mask must be [%lld, %lld, %lld, %lld]",
                             (long long)g->N, (long long)taps, (long long)g->oh,
                             (long long)g->ow);
    if (b && (b->ndim != 1 || b->shape[0] != g->OC))
        return ai_node_error(c->node, AI_ERR_VALUE, "B must be [%lld]", (long long)g->OC);
    return AI_OK;
}

/* Columns: C * kh * kw rows of oh * ow doubles; twice for backward. */
static ai_status dc_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    dc_geom g = {0};
    ai_status st = dc_setup(c, &g);
    if (st)
        return st;
    *ws = (size_t)(g.C * g.kh * g.kw * g.oh * g.ow) * sizeof(double) * 2;
    const int64_t s[4] = {g.N, g.OC, g.oh, g.ow};
    return ai_set_meta(&out[0], c->in[0]->dtype, 4, s);
}

/* The bilinear sample of an H x W plane at (y, x): its four corners
 * (offsets in the plane; -1 outside, reading 0), their weights, and the
 * fractions of y and x (for the derivative). */
typedef struct {
    int64_t at[4];
    double w[4], ly, lx;
} dc_sample;

static void dc_bilinear(const dc_geom *g, double y, double x, dc_sample *s)
{
    const double y0 = floor(y), x0 = floor(x);
    s->ly = y - y0;
    s->lx = x - x0;
    const double wy[2] = {1 - s->ly, s->ly}, wx[2] = {1 - s->lx, s->lx};
    for (int k = 0; k < 4; k++) {
        const double yy = y0 + (k >> 1), xx = x0 + (k & 1);
        const bool in = yy >= 0 && yy < (double)g->H && xx >= 0 && xx < (double)g->W;
        s->at[k] = in ? (int64_t)yy * g->W + (int64_t)xx : -1;
        s->w[k] = wy[k >> 1] * wx[k & 1];
    }
}

static double dc_corner(const ai_tensor *x, int64_t base, const dc_sample *s, int k)
{
    return s->at[k] < 0 ? 0 : ai_float_at(x, base + s->at[k]);
}

/* Where tap (ki, kj) of output (i, j) of image n, channel ch samples. */
static void dc_where(const ai_ctx *c, const dc_geom *g, int64_t n, int64_t ch, int64_t ki,
                     int64_t kj, int64_t i, int64_t j, int64_t *off_at, int64_t *mask_at,
                     double *y, double *x)
{
    const int64_t grp = ch / (g->C / g->og), tap = (grp * g->kh + ki) * g->kw + kj;
    const int64_t plane = g->oh * g->ow, pix = i * g->ow + j;
    *off_at = ((n * g->og * g->kh * g->kw + tap) * 2) * plane + pix;
    *mask_at = (n * g->og * g->kh * g->kw + tap) * plane + pix;
    *y = (double)(i * g->s[0] - g->pad[0] + ki * g->d[0]) + ai_float_at(c->in[2], *off_at);
    *x = (double)(j * g->s[1] - g->pad[1] + kj * g->d[1]) +
         ai_float_at(c->in[2], *off_at + plane);
}

static double dc_mask(const ai_ctx *c, int64_t at)
{
    return c->n_in > 4 && c->in[4] ? ai_float_at(c->in[4], at) : 1;
}

/* col[(ch, ki, kj), (i, j)] = mask * X[n, ch] sampled at the tap */
static void dc_columns(const ai_ctx *c, const dc_geom *g, int64_t n, double *col)
{
    int64_t r = 0;
    for (int64_t ch = 0; ch < g->C; ch++)
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++, r++)
                for (int64_t i = 0; i < g->oh; i++)
                    for (int64_t j = 0; j < g->ow; j++) {
                        int64_t oa, ma;
                        double y, x, v = 0;
                        dc_sample s;
                        dc_where(c, g, n, ch, ki, kj, i, j, &oa, &ma, &y, &x);
                        dc_bilinear(g, y, x, &s);
                        for (int k = 0; k < 4; k++)
                            v += s.w[k] * dc_corner(c->in[0], (n * g->C + ch) * g->H * g->W,
                                                    &s, k);
                        col[r * g->oh * g->ow + i * g->ow + j] = v * dc_mask(c, ma);
                    }
}

static ai_status dc_forward(ai_ctx *c)
{
    dc_geom g = {0};
    ai_status st = dc_setup(c, &g);
    if (st)
        return st;
    const ai_tensor *w = c->in[1], *b = c->n_in > 3 ? c->in[3] : NULL;
    double *col = c->workspace;
    const int64_t P = g.oh * g.ow, K = g.C / g.group * g.kh * g.kw, ocg = g.OC / g.group;
    for (int64_t n = 0; n < g.N; n++) {
        dc_columns(c, &g, n, col);
        for (int64_t oc = 0; oc < g.OC; oc++) {
            const double *cg = col + (oc / ocg) * K * P;
            for (int64_t p = 0; p < P; p++) {
                double acc = b ? ai_float_at(b, oc) : 0;
                for (int64_t k = 0; k < K; k++)
                    acc += ai_float_at(w, oc * K + k) * cg[k * P + p];
                ai_float_set(c->out[0], (n * g.OC + oc) * P + p, acc);
            }
        }
    }
    return AI_OK;
}

static ai_status dc_backward(ai_ctx *c)
{
    dc_geom g = {0};
    ai_status st = dc_setup(c, &g);
    if (st)
        return st;
    for (int i = 0; i < c->n_in; i++)
        if (c->din[i] && (st = ai_check_grad_dtype(c, c->din[i])))
            return st;
    const ai_tensor *x = c->in[0], *w = c->in[1], *dy = c->dout[0];
    ai_tensor *dx = c->din[0], *dw = c->din[1], *doff = c->din[2];
    ai_tensor *db = c->n_in > 3 ? c->din[3] : NULL, *dm = c->n_in > 4 ? c->din[4] : NULL;
    const int64_t P = g.oh * g.ow, K = g.C / g.group * g.kh * g.kw, ocg = g.OC / g.group;
    double *col = c->workspace, *dcol = col + g.C * g.kh * g.kw * P;
    for (int64_t n = 0; n < g.N; n++) {
        if (dw)
            dc_columns(c, &g, n, col);
        memset(dcol, 0, sizeof(double) * (size_t)(g.C * g.kh * g.kw * P));
        for (int64_t oc = 0; oc < g.OC; oc++) {
            const int64_t grp = oc / ocg;
            for (int64_t p = 0; p < P; p++) {
                const double gy = ai_float_at(dy, (n * g.OC + oc) * P + p);
                if (db)
                    ai_float_set(db, oc, ai_float_at(db, oc) + gy);
                for (int64_t k = 0; k < K; k++) {
                    if (dw)
                        ai_float_set(dw, oc * K + k, ai_float_at(dw, oc * K + k) +
                                                         gy * col[(grp * K + k) * P + p]);
                    dcol[(grp * K + k) * P + p] += gy * ai_float_at(w, oc * K + k);
                }
            }
        }
        if (!dx && !doff && !dm)
            continue;
        int64_t r = 0;
        for (int64_t ch = 0; ch < g.C; ch++)
            for (int64_t ki = 0; ki < g.kh; ki++)
                for (int64_t kj = 0; kj < g.kw; kj++, r++)
                    for (int64_t p = 0; p < P; p++) {
                        const double gc = dcol[r * P + p];
                        int64_t oa, ma;
                        double yy, xx;
                        dc_sample s;
                        dc_where(c, &g, n, ch, ki, kj, p / g.ow, p % g.ow, &oa, &ma, &yy, &xx);
                        dc_bilinear(&g, yy, xx, &s);
                        const int64_t base = (n * g.C + ch) * g.H * g.W;
                        const double m = dc_mask(c, ma);
                        double v[4], val = 0;
                        for (int k = 0; k < 4; k++) {
                            v[k] = dc_corner(x, base, &s, k);
                            val += s.w[k] * v[k];
                            if (dx && s.at[k] >= 0)
                                ai_float_set(dx, base + s.at[k], ai_float_at(dx, base + s.at[k]) +
                                                                     gc * m * s.w[k]);
                        }
                        if (dm)
                            ai_float_set(dm, ma, ai_float_at(dm, ma) + gc * val);
                        if (doff) {
                            const double dvy = (1 - s.lx) * (v[2] - v[0]) + s.lx * (v[3] - v[1]);
                            const double dvx = (1 - s.ly) * (v[1] - v[0]) + s.ly * (v[3] - v[2]);
                            ai_float_set(doff, oa, ai_float_at(doff, oa) + gc * m * dvy);
                            ai_float_set(doff, oa + P, ai_float_at(doff, oa + P) + gc * m * dvx);
                        }
                    }
    }
    return AI_OK;
}

OP(op_deform_conv, "DeformConv", 3, 5, 1, AI_OP_BWD_NO_Y, dc_shape, dc_forward, dc_backward)

const ai_op_def *const ai_ops_deform_conv[] = {&op_deform_conv, NULL};
