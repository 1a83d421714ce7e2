/*
 * layout.c — the blocked-channel layout's reorders (domain "aidge_interop";
 * the layout is described in kernels/conv.h, the recipe that inserts them
 * is block_channels in recipes.c):
 *
 *   BlockChannels    X (N, C, spatial...) -> Y (N, ceil(C / 8), spatial..., 8);
 *                    channel c in lane c % 8 of block c / 8, lanes past C zero
 *   UnblockChannels  X (N, ceil(C / 8), spatial..., 8) -> Y (N, C, spatial...);
 *                    attribute `channels` (C) required; padding lanes dropped
 *   BlockedGlobalAveragePool
 *                    X (N, ceil(C / 8), spatial..., 8) -> Y (N, C, 1...): the
 *                    mean of each channel over its positions (GlobalAveragePool
 *                    of the unblocked X, without unblocking the whole of it);
 *                    attribute `channels` (C) required
 *
 * float32 or float64. Each reorder's backward is the other's forward
 * (padding lanes get no gradient); the mean's spreads dY / S.
 */
#include <string.h>

#include "../graph.h"
#include "../kernels/conv.h"
#include "../kernels/simd.h"
#include "../parallel.h"

enum { B = AI_CONV_BLOCK };

/* plain tensor p's data (N, C, S) <-> blocked (N, ceil(C / 8), S, 8) */
static void reorder(void *blocked, void *plain, const ai_tensor *p, bool to_blocked, bool add)
{
    int64_t S = 1;
    for (int d = 2; d < p->ndim; d++)
        S *= p->shape[d];
    ai_channels_reorder(blocked, plain, p->shape[0], p->shape[1], S, ai_dtype_size(p->dtype),
                        to_blocked, add);
}

static ai_status check_float(const ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    return AI_OK;
}

static ai_status block_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_tensor *x = c->in[0];
    ai_status st = check_float(c);
    if (st)
        return st;
    if (x->ndim < 2 || x->ndim + 1 > AI_MAX_DIMS)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank %d; (N, C, spatial...) "
                             "expected", x->ndim);
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim + 1;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    out[0].shape[1] = (x->shape[1] + B - 1) / B;
    out[0].shape[x->ndim] = B;
    return AI_OK;
}

static ai_status unblock_channels(const ai_ctx *c, int64_t *C)
{
    const ai_tensor *x = c->in[0];
    ai_status st = ai_attr_int(c->node, "channels", -1, C);
    if (st)
        return st;
    if (*C < 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "attribute 'channels' (>= 0) is required");
    if (x->ndim < 3 || x->shape[x->ndim - 1] != B || x->shape[1] != (*C + B - 1) / B)
        return ai_node_error(c->node, AI_ERR_VALUE, "input of rank %d: (N, %lld, spatial..., "
                             "%d) expected for %lld channels", x->ndim,
                             (long long)((*C + B - 1) / B), B, (long long)*C);
    return AI_OK;
}

static ai_status unblock_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_tensor *x = c->in[0];
    int64_t C;
    ai_status st = check_float(c);
    if (st || (st = unblock_channels(c, &C)))
        return st;
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim - 1;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * (size_t)(x->ndim - 1));
    out[0].shape[1] = C;
    return AI_OK;
}

static ai_status block_forward(ai_ctx *c)
{
    reorder(c->out[0]->data, c->in[0]->data, c->in[0], true, false);
    return AI_OK;
}

static ai_status block_backward(ai_ctx *c)
{
    if (c->din[0])
        reorder(c->dout[0]->data, c->din[0]->data, c->din[0], false, true);
    return AI_OK;
}

static ai_status unblock_forward(ai_ctx *c)
{
    reorder(c->in[0]->data, c->out[0]->data, c->out[0], false, false);
    return AI_OK;
}

/* dx (blocked) += dy blocked; its padding lanes get nothing */
static ai_status unblock_backward(ai_ctx *c)
{
    if (c->din[0])
        reorder(c->din[0]->data, c->dout[0]->data, c->out[0], true, true);
    return AI_OK;
}

static ai_status block_mean_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    ai_status st = unblock_shape(c, out, ws, state);
    for (int d = 2; !st && d < out[0].ndim; d++)
        out[0].shape[d] = 1;
    return st;
}

typedef struct {
    void *y;
    const void *x; /* forward: x blocked, y (N, C); backward: dx blocked, dy */
    int64_t C, CB, S;
    bool f64;
} block_mean_job;

/* positions of one block summed in 4 interleaved partial sums per lane, so
 * that the adds do not wait on each other */
#define BLOCK_MEAN(T)                                                              \
    for (int64_t nb = lo; nb < hi; nb++) {                                         \
        const T *x = (const T *)j->x + nb * j->S * B;                              \
        T part[4][B] = {{0}};                                                      \
        int64_t s = 0;                                                             \
        for (; s + 4 <= j->S; s += 4)                                              \
            for (int k = 0; k < 4; k++)                                            \
                for (int l = 0; l < B; l++)                                        \
                    part[k][l] += x[(s + k) * B + l];                              \
        for (; s < j->S; s++)                                                      \
            for (int l = 0; l < B; l++)                                            \
                part[0][l] += x[s * B + l];                                        \
        const int64_t n = nb / j->CB, c0 = nb % j->CB * B;                         \
        T *y = (T *)j->y + n * j->C + c0;                                          \
        for (int l = 0; l < B && c0 + l < j->C; l++)                               \
            y[l] = ((part[0][l] + part[1][l]) + (part[2][l] + part[3][l])) / (T)j->S; \
    }
#define BLOCK_MEAN_BACKWARD(T)                                                     \
    for (int64_t nb = lo; nb < hi; nb++) {                                         \
        const int64_t n = nb / j->CB, c0 = nb % j->CB * B;                         \
        const T *dy = (const T *)j->x + n * j->C + c0;                             \
        T *dx = (T *)j->y + nb * j->S * B, g[B] = {0};                             \
        for (int l = 0; l < B && c0 + l < j->C; l++)                               \
            g[l] = dy[l] / (T)j->S;                                                \
        for (int64_t s = 0; s < j->S; s++)                                         \
            for (int l = 0; l < B; l++)                                            \
                dx[s * B + l] += g[l];                                             \
    }

AI_VECTOR_CLONES static void block_mean_range(void *ctx, int64_t lo, int64_t hi)
{
    const block_mean_job *j = ctx;
    if (j->f64) {
        BLOCK_MEAN(double)
    } else {
        BLOCK_MEAN(float)
    }
}

AI_VECTOR_CLONES static void block_mean_backward_range(void *ctx, int64_t lo, int64_t hi)
{
    const block_mean_job *j = ctx;
    if (j->f64) {
        BLOCK_MEAN_BACKWARD(double)
    } else {
        BLOCK_MEAN_BACKWARD(float)
    }
}
#undef BLOCK_MEAN
#undef BLOCK_MEAN_BACKWARD

/* fn over the (image, block) pairs of blocked x (forward: y = its means;
 * backward: y = dx, x = dy) */
static void block_mean_run(const ai_tensor *xb, const ai_tensor *mean, void *y, const void *x,
                           ai_range_fn fn)
{
    int64_t S = 1;
    for (int d = 2; d < xb->ndim - 1; d++)
        S *= xb->shape[d];
    block_mean_job j = {y, x, mean->shape[1], xb->shape[1], S, xb->dtype == AI_F64};
    ai_parallel_for(xb->shape[0] * j.CB, ai_grain_of(S * B), fn, &j);
}

static ai_status block_mean_forward(ai_ctx *c)
{
    block_mean_run(c->in[0], c->out[0], c->out[0]->data, c->in[0]->data, block_mean_range);
    return AI_OK;
}

static ai_status block_mean_backward(ai_ctx *c)
{
    if (c->din[0])
        block_mean_run(c->in[0], c->out[0], c->din[0]->data, c->dout[0]->data,
                       block_mean_backward_range);
    return AI_OK;
}

static const ai_op_def op_block = {"BlockChannels", "aidge_interop", 1, 1, 1, 1,
                                   AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, NULL, block_shape,
                                   block_forward, block_backward};
static const ai_op_def op_unblock = {"UnblockChannels", "aidge_interop", 1, 1, 1, 1,
                                     AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, NULL, unblock_shape,
                                     unblock_forward, unblock_backward};

static const ai_op_def op_block_mean = {"BlockedGlobalAveragePool", "aidge_interop", 1, 1, 1, 1,
                                        AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, NULL, block_mean_shape,
                                        block_mean_forward, block_mean_backward};

const ai_op_def *const ai_ops_layout[] = {&op_block, &op_unblock, &op_block_mean, NULL};
