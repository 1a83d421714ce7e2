/*
 * conv_integer.c — the integer convolution of ConvInteger and QLinearConv
 * (ops/qlinear.c): int32 operands (zero points already subtracted), 1 to 3
 * spatial dims, groups, any stride, dilation and padding.
 *
 *   y[n][m][o...] = b[m] + sum over c < C/group, k... of
 *                   x[n][g C/group + c][o s - pad_begin + k d] * w[m][c][k...]
 *   (g = m / (M/group); taps in the padding read 0)
 *
 * Direct loops, the reference and the only kernel (quantized models are
 * small, and each sum is exact: int64, wrapped to int32 as ONNX's int32
 * output does). Threads split the (n, m) output planes.
 */
#include "../parallel.h"
#include "conv.h"

typedef struct {
    const ai_conv_params *p;
    int32_t *y;
    const int32_t *x, *w, *b;
} conv_i32_job;

static void conv_i32_planes(void *ctx, int64_t lo, int64_t hi)
{
    const conv_i32_job *j = ctx;
    const ai_conv_params *p = j->p;
    /* spatial dims padded to 3 with size-1 axes */
    int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1},
            d[3] = {1, 1, 1}, pb[3] = {0, 0, 0};
    for (int a = 0; a < p->nsp; a++)
        in[a] = p->in[a], out[a] = p->out[a], k[a] = p->kernel[a], s[a] = p->stride[a],
        d[a] = p->dilation[a], pb[a] = p->pad_begin[a];
    const int64_t cg = p->C / p->group, mg = p->M / p->group;
    const int64_t in_plane = in[0] * in[1] * in[2], out_plane = out[0] * out[1] * out[2];
    const int64_t taps = k[0] * k[1] * k[2];
    for (int64_t nm = lo; nm < hi; nm++) {
        const int64_t n = nm / p->M, m = nm % p->M, g = m / mg;
        const int32_t *xg = j->x + (n * p->C + g * cg) * in_plane;
        const int32_t *wm = j->w + m * cg * taps;
        int32_t *y = j->y + nm * out_plane;
        for (int64_t o0 = 0; o0 < out[0]; o0++)
            for (int64_t o1 = 0; o1 < out[1]; o1++)
                for (int64_t o2 = 0; o2 < out[2]; o2++) {
                    int64_t acc = j->b ? j->b[m] : 0;
                    for (int64_t c = 0; c < cg; c++) {
                        const int32_t *xc = xg + c * in_plane, *wc = wm + c * taps;
                        for (int64_t k0 = 0; k0 < k[0]; k0++) {
                            const int64_t i0 = o0 * s[0] - pb[0] + k0 * d[0];
                            if (i0 < 0 || i0 >= in[0])
                                continue;
                            for (int64_t k1 = 0; k1 < k[1]; k1++) {
                                const int64_t i1 = o1 * s[1] - pb[1] + k1 * d[1];
                                if (i1 < 0 || i1 >= in[1])
                                    continue;
                                for (int64_t k2 = 0; k2 < k[2]; k2++) {
                                    const int64_t i2 = o2 * s[2] - pb[2] + k2 * d[2];
                                    if (i2 >= 0 && i2 < in[2])
                                        acc += (int64_t)xc[(i0 * in[1] + i1) * in[2] + i2] *
                                               wc[(k0 * k[1] + k1) * k[2] + k2];
                                }
                            }
                        }
                    }
                    y[(o0 * out[1] + o1) * out[2] + o2] = (int32_t)(uint32_t)acc;
                }
    }
}

void ai_conv_forward_i32(const ai_conv_params *p, int32_t *y, const int32_t *x,
                         const int32_t *w, const int32_t *b)
{
    conv_i32_job j = {p, y, x, w, b};
    ai_parallel_for(p->N * p->M, 1, conv_i32_planes, &j);
}
