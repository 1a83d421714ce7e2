/*
 * packed.c — the graph's packed copies of its weights, for the float32
 * products that read a constant weight as op(B) (FusedMatMul, Gemm) and
 * the blocked convs of the fused inference graph (FusedConv with y_blocked:
 * the blocked tiles' weights by blocks of output channels, Winograd's U).
 *
 * gemm_tiles.c packs B into panels at every call; ONNX Runtime packs a
 * constant weight once per session. Here a weight is packed at the first
 * product that reads it and the copy kept while the weights' values stay
 * what they were. The engine cannot see every write to them: an
 * AidgeModule's parameters are the engine's memory, written in place by
 * torch (optimizers, load_state_dict, `p.add_()` under no_grad). So the
 * caller declares a version of the values (ai_graph.weights_version: the
 * torch bridge gives the sum of its tensors' version counters, which
 * every in-place write bumps) and a copy is read only at the version it
 * was packed at; a graph with no version (-1) reads none. A training
 * forward reads none either (BatchNorm writes its buffers), nor does one
 * whose input is a copy of the value (not its memory).
 *
 * Memory: one copy per weight and layout read (a product's: N rounded up
 * to 64 columns; a conv's: output channels rounded up to 8, Winograd's
 * 16 / 9 of the weight), made when first read and kept with the graph: at most one
 * more copy of the weights the products read (Graph.memory_stats()'s
 * "packed_weights_bytes"). A new version repacks in place.
 */
#include <stdlib.h>

#include "graph.h"
#include "kernels/gemm.h"

typedef struct ai_packed {
    int value;        /* the weight's value index */
    int layout;       /* the reader's (ai_packed_layout) */
    int64_t N, K;     /* the reader's sizes */
    int64_t size;     /* floats */
    const void *src;  /* the memory packed */
    int64_t version;  /* ai_graph.weights_version when packed */
    float *data;
} ai_packed;

const float *ai_packed_layout(ai_ctx *c, int slot, int layout, int64_t N, int64_t K,
                              int64_t size, ai_pack_fn *pack, const void *arg)
{
    ai_graph *g = c->g;
    const int vi = c->node->in[slot];
    if (g->training || vi < 0)
        return NULL;
    const ai_value *v = &g->values[vi];
    if ((v->kind != AI_VAL_PARAM && v->kind != AI_VAL_BUFFER && v->kind != AI_VAL_CONST) ||
        v->producer >= 0 || !v->data || v->data->data != c->in[slot]->data ||
        c->in[slot]->dtype != AI_F32)
        return NULL;
    if (g->weights_version < 0) {
        g->weights_packable = true;
        return NULL;
    }
    ai_packed *e = NULL;
    for (int i = 0; i < g->n_packed && !e; i++)
        if (g->packed[i].value == vi && g->packed[i].layout == layout)
            e = &g->packed[i];
    if (e && e->src == v->data->data && e->N == N && e->K == K && e->size == size &&
        e->version == g->weights_version)
        return e->data;
    if (!e) {
        ai_packed *grown = realloc(g->packed, sizeof *grown * (size_t)(g->n_packed + 1));
        if (!grown)
            return NULL;
        g->packed = grown;
        e = &g->packed[g->n_packed++];
        *e = (ai_packed){.value = vi, .layout = layout};
    }
    if (!e->data || e->size != size) {
        free(e->data);
        e->size = 0;
        /* aligned_alloc: a multiple of the alignment */
        e->data = aligned_alloc(64, (sizeof(float) * (size_t)size + 63) / 64 * 64);
        if (!e->data)
            return NULL;
        e->size = size;
    }
    e->N = N, e->K = K;
    e->version = -1; /* until packed */
    pack(arg, c->in[slot]->data, e->data);
    e->src = v->data->data;
    e->version = g->weights_version;
    return e->data;
}

typedef struct {
    bool tb;
    int64_t N, K;
} gemm_pack_arg;

static void gemm_pack(const void *arg, const float *w, float *dst)
{
    const gemm_pack_arg *a = arg;
    ai_gemm_tiles_pack(a->tb, a->N, a->K, w, a->tb ? a->K : a->N, dst);
}

const float *ai_packed_weight(ai_ctx *c, int slot, bool tb, int64_t N, int64_t K)
{
    const gemm_pack_arg a = {tb, N, K};
    return ai_packed_layout(c, slot, tb ? AI_PACK_GEMM_BT : AI_PACK_GEMM_B, N, K,
                            ai_gemm_tiles_packed_size(N, K), gemm_pack, &a);
}

void ai_packed_clear(ai_graph *g)
{
    for (int i = 0; i < g->n_packed; i++)
        free(g->packed[i].data);
    free(g->packed);
    g->packed = NULL;
    g->n_packed = 0;
}

int64_t ai_packed_bytes(const ai_graph *g)
{
    int64_t bytes = 0;
    for (int i = 0; i < g->n_packed; i++)
        bytes += (int64_t)sizeof(float) * g->packed[i].size;
    return bytes;
}
