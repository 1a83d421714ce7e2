/*
 * sequence.c — operators over a time axis whose length varies per batch
 * element: ReverseSequence.
 *
 * ReverseSequence(input, sequence_lens; batch_axis = 1, time_axis = 0):
 * for batch element b, the first sequence_lens[b] steps along time_axis are
 * reversed, the rest copied. It is a permutation of the elements that is
 * its own inverse, so backward applies it to dY (a data-movement family:
 * movement.h).
 */
#include <string.h>

#include "movement.h"

static ai_status rs_setup(const ai_ctx *c, int *batch, int *time)
{
    const ai_tensor *x = c->in[0], *lens = c->in[1];
    int64_t b, t;
    ai_status st = ai_attr_int(c->node, "batch_axis", 1, &b);
    if (st || (st = ai_attr_int(c->node, "time_axis", 0, &t)))
        return st;
    if (x->ndim < 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank %d; >= 2 expected",
                             x->ndim);
    if ((b != 0 && b != 1) || (t != 0 && t != 1) || b == t)
        return ai_node_error(c->node, AI_ERR_VALUE, "batch_axis %lld and time_axis %lld "
                             "must be 0 and 1 in some order", (long long)b, (long long)t);
    *batch = (int)b;
    *time = (int)t;
    if ((lens->dtype != AI_I64 && lens->dtype != AI_I32) || lens->ndim != 1 ||
        lens->shape[0] != x->shape[b])
        return ai_node_error(c->node, AI_ERR_VALUE, "sequence_lens must be int32 or int64 of "
                             "shape [%lld] (the batch axis)", (long long)x->shape[b]);
    return AI_OK;
}

static ai_status rs_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int b = 0, t = 0;
    ai_status st = rs_setup(c, &b, &t);
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
}

/* dst = src with each batch's sequence reversed (add: dst += that, float) */
static ai_status rs_run(const ai_ctx *c, int batch, int time, const ai_tensor *src,
                        ai_tensor *dst, bool add)
{
    const ai_tensor *x = c->in[0], *lens = c->in[1];
    const int64_t T = x->shape[time], inner = ai_shape_prod(x->shape, 2, x->ndim);
    const size_t es = ai_dtype_size(src->dtype);
    for (int64_t i = 0; i < lens->shape[0]; i++) {
        const int64_t len = ai_tensor_get_flat_i64(lens, i);
        if (len < 0 || len > T)
            return ai_node_error(c->node, AI_ERR_VALUE, "sequence_lens[%lld] is %lld; 0 to "
                                 "%lld (the time axis) expected", (long long)i,
                                 (long long)len, (long long)T);
    }
    for (int64_t i0 = 0; i0 < x->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < x->shape[1]; i1++) {
            const int64_t b = batch ? i1 : i0, t = time ? i1 : i0;
            const int64_t len = ai_tensor_get_flat_i64(lens, b);
            const int64_t s = t < len ? len - 1 - t : t; /* source step */
            const int64_t from = ((time ? i0 * T + s : s * x->shape[1] + i1)) * inner;
            const int64_t to = (i0 * x->shape[1] + i1) * inner;
            if (!add) {
                memcpy((char *)dst->data + (size_t)to * es,
                       (const char *)src->data + (size_t)from * es, (size_t)inner * es);
                continue;
            }
            for (int64_t k = 0; k < inner; k++)
                ai_float_set(dst, to + k, ai_float_at(dst, to + k) + ai_float_at(src, from + k));
        }
    return AI_OK;
}

static ai_status rs_forward(ai_ctx *c)
{
    int b = 0, t = 0;
    ai_status st = rs_setup(c, &b, &t);
    return st ? st : rs_run(c, b, t, c->in[0], c->out[0], false);
}

static ai_status rs_backward(ai_ctx *c)
{
    int b = 0, t = 0;
    ai_status st = rs_setup(c, &b, &t);
    if (st || !c->din[0] || (st = ai_check_grad_dtype(c, c->din[0])))
        return st;
    return rs_run(c, b, t, c->dout[0], c->din[0], !c->din_assign[0]);
}

OP(op_reverse_sequence, "ReverseSequence", 2, 2, 1,
   ASSIGN1 | AI_OP_BWD_NO_Y, rs_shape, rs_forward, rs_backward)

const ai_op_def *const ai_ops_sequence[] = {&op_reverse_sequence, NULL};
