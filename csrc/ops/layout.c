/*
 * layout.c — the blocked-channel layout's reorders (domain "aidge_interop";
 * the layout is described in kernels/conv.h, the recipe that inserts them
 * is block_channels in recipes.c):
 *
 *   BlockChannels    X (N, C, spatial...) -> Y (N, ceil(C / 8), spatial..., 8);
 *                    channel c in lane c % 8 of block c / 8, lanes past C zero
 *   UnblockChannels  X (N, ceil(C / 8), spatial..., 8) -> Y (N, C, spatial...);
 *                    attribute `channels` (C) required; padding lanes dropped
 *
 * float32 or float64. Each backward is the other's forward (padding lanes
 * get no gradient).
 */
#include <string.h>

#include "../graph.h"
#include "../kernels/conv.h"

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

static const ai_op_def op_block = {"BlockChannels", "aidge_interop", 1, 1, 1, 1,
                                   AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, NULL, block_shape,
                                   block_forward, block_backward};
static const ai_op_def op_unblock = {"UnblockChannels", "aidge_interop", 1, 1, 1, 1,
                                     AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, NULL, unblock_shape,
                                     unblock_forward, unblock_backward};

const ai_op_def *const ai_ops_layout[] = {&op_block, &op_unblock, NULL};
