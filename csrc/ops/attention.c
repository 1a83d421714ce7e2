/*
 * attention.c — scaled dot-product attention in one node, float32 and
 * float64 (half inputs run on float32 copies, plan.c):
 *
 *   Attention       ONNX (opset 23): Q (B, Hq, Tq, D), K (B, Hk, Tk, D),
 *                   V (B, Hk, Tk, Dv), optional attn_mask (bool: true takes
 *                   part; or float, added to the scores), broadcastable to
 *                   (B, Hq, Tq, Tk); Hq a multiple of Hk (grouped-query:
 *                   query head h reads key/value head h / (Hq / Hk)).
 *                   Attributes scale (default 1 / sqrt(D)) and is_causal
 *                   (query i sees keys j <= i). A mask shorter than Tk
 *                   masks the keys past it (ONNX pads it with -inf); a row
 *                   with every key masked gives 0. The 3-D forms
 *                   (q_num_heads), past_key/past_value, softcap and the
 *                   extra outputs are not taken here: the importer writes
 *                   such a node as its ONNX function body
 *                   (aidge_interop/onnx/functions.py).
 *   FusedAttention  domain "aidge_interop", written by the recipe
 *                   fuse_attention (onnx/attention.py) for MatMul(Q, Kt) [-> Mul or
 *                   Div by a scalar] [-> Add(mask)] -> Softmax(-1) ->
 *                   MatMul(., V): the same computation, with
 *                   k_transposed (K given as Kt (B, H, D, Tk)), rank 3
 *                   (N, T, D) or 4, the mask broadcast like Add's (last
 *                   dim 1 or Tk) and a fully masked row NaN, as Softmax
 *                   gives, or 0 with masked_zero. Attributes scale
 *                   (default 1 / sqrt(D)), k_transposed, is_causal,
 *                   masked_zero; bthd: Q, K, V as (B, T, H, D), the
 *                   projections' layout before the heads' Transposes
 *                   (rank 4, not with k_transposed), and y_bthd: Y as
 *                   (B, Tq, Hq, Dv); a plane's rows are then H D apart
 *                   (the GEMMs' leading dimensions): no Transpose copies
 *                   the operands, forward or backward.
 *
 * Y = softmax(scale Q K^T + bias) V row block by row block: a block's
 * scores (rows x Tk) are one product and stay in cache, its softmax runs
 * in place and one product multiplies it by V. The products: float32 with
 * head dims a multiple of the lanes on kernels/attn_tiles.c's register
 * tiles (no packing; K, V transposed once per plane), else the GEMMs of
 * kernels/gemm.h, the tiles' reference (attention_impl.h). Under is_causal a
 * block stops at the last key its last row sees. When a backward follows
 * the forward keeps P in the node's state (B Hq Tq Tk elements, what the
 * unfused graph keeps of its Softmax): recomputing it from the rows'
 * log-sum-exp instead cost a GEMM and an exp per score more, a training
 * step 10% slower than the unfused graph's (BERT, TransformerEncoder).
 * The backward: dP = dY V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K,
 * dK = scale dS^T Q, dV = P^T dY; a float mask's gradient is dS, summed
 * over its broadcast axes. A bool mask has none.
 *
 * Threads (ai_parallel_for): the forward over (batch, query head, row
 * block), the backward over (batch, key/value head), whose dK and dV
 * only its own query heads write.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/attn_tiles.h"
#include "../kernels/fastmath.h"
#include "../kernels/gemm.h"
#include "../kernels/simd.h"
#include "../parallel.h"

typedef struct {
    double scale; /* 0: 1 / sqrt(D) */
    bool causal, kt, fused, masked_zero, bthd, y_bthd;
} att_params;

/* One node's sizes and operands, the batch folded into (B, H) planes. */
typedef struct {
    int64_t B, Hq, Hk, Tq, Tk, D, Dv, Lm; /* Lm: the mask's keys (ONNX: <= Tk) */
    double scale;
    bool causal, kt, masked_zero, mask_bool, f64, bthd, y_bthd;
    /* row strides of Q (and dQ), K, V, Y (and dY): D, Tk or D, Dv, Dv; with
     * bthd Q's, K's, V's Hq D, Hk D, Hk Dv, with y_bthd Y's Hq Dv (a plane's
     * rows interleaved with the other heads') */
    int64_t ldq, ldk, ldv, ldy;
    const void *q, *k, *v, *mask;
    int64_t mask_st[4]; /* the mask's strides over (B, Hq, Tq, Lm), 0 where broadcast */
    void *y;
    void *p; /* the probabilities (B, Hq, Tq, Tk), kept when a backward follows */
    /* backward */
    const void *dy;
    void *dq, *dk, *dv, *dmask;
    bool assign[3]; /* dQ, dK, dV written, not added to (AI_OP_GRAD_ASSIGN) */
    int64_t rows; /* rows per block */
    /* float32 on attn_tiles.c's tiles: their lanes (0: the GEMMs of
     * attention_impl.h), the scratch's row stride (Tk rounded up to 16) */
    int lanes;
    int64_t ldt;
    atomic_bool nomem;
} att_info;

/* The operands of one (batch, query head) plane. */
typedef struct {
    const void *q, *k, *v, *dy;
    void *y, *p, *dq, *dk, *dv, *dmask;
    int64_t mask_off;
} att_plane;

static inline int64_t att_kmax(const att_info *a, int64_t row_end)
{
    return a->causal && row_end < a->Tk ? row_end : a->Tk;
}

#define REAL float
#define SFX(name) name##_f32
#define GEMM ai_gemm_f32
#define EXP ai_expf
#include "attention_impl.h"
#undef REAL
#undef SFX
#undef GEMM
#undef EXP

/* The float32 blocks on attn_tiles.c's tiles (a->lanes): the same steps
 * as att_forward_block_f32 and att_backward_block_f32, the scratch's rows
 * a->ldt apart, the products whose B is K^T (dP's: V^T) reading the
 * plane's K (V) transposed once into kT (vT: D or Dv x ldt, zero past Tk);
 * a block's scores are computed to kmax rounded up to 8 (attn_tiles.h),
 * its softmax by att_softmax_tiles. */
/* att_softmax_f32 on the tiles' scratch (rows ld apart, ld a multiple of
 * 16), each row written to P too (rows Tk apart, 0 past kmax) when P is
 * given, in the pass that normalises it: the keys from kmax to the next
 * multiple of 16 set to -inf (exp 0), so that the max and the
 * exponentials run whole groups of 16 lanes; the exponentials by
 * ai_expf_fma (FMAs: the tiles run only where the CPU has them). */
AI_WIDE_FMA_CLONES static void att_softmax_tiles(const att_info *a, int64_t n, int64_t kmax,
                                                 float *S, int64_t ld, float *P)
{
    const int64_t k16 = (kmax + 15) / 16 * 16, Tk = a->Tk;
    for (int64_t i = 0; i < n; i++) {
        float *s = S + i * ld, *p = P ? P + i * Tk : NULL;
        for (int64_t j = kmax; j < k16; j++)
            s[j] = -INFINITY;
        float m16[16];
        for (int l = 0; l < 16; l++)
            m16[l] = -INFINITY;
        for (int64_t j = 0; j < k16; j += 16)
            for (int l = 0; l < 16; l++)
                m16[l] = s[j + l] > m16[l] ? s[j + l] : m16[l];
        float mx = m16[0];
        for (int l = 1; l < 16; l++)
            mx = m16[l] > mx ? m16[l] : mx;
        float inv = 0;
        if (mx == -INFINITY) { /* every key masked */
            for (int64_t j = 0; j < kmax; j++)
                s[j] = a->masked_zero ? 0 : NAN;
            inv = 1;
        } else {
            float s16[16] = {0};
            for (int64_t j = 0; j < k16; j += 16)
                for (int l = 0; l < 16; l++) {
                    s[j + l] = ai_expf_fma(s[j + l] - mx);
                    s16[l] += s[j + l];
                }
            double sum = 0;
            for (int l = 0; l < 16; l++)
                sum += s16[l];
            inv = (float)(1 / sum);
        }
        if (p) {
            for (int64_t j = 0; j < kmax; j++)
                p[j] = s[j] = s[j] * inv;
            for (int64_t j = kmax; j < Tk; j++)
                p[j] = 0;
        } else {
            for (int64_t j = 0; j < kmax; j++)
                s[j] *= inv;
        }
    }
}

static void att_forward_block_tiles(const att_info *a, const att_plane *pl, int64_t r0, int64_t n,
                                    float *S, const float *kT)
{
    const int W = a->lanes;
    const int64_t kmax = att_kmax(a, r0 + n), ld = a->ldt;
    ai_attn_mm_f32(W, n, (kmax + 7) / 8 * 8, a->D, (float)a->scale,
                   (const float *)pl->q + r0 * a->ldq, a->ldq, 1, kT, ld, false, S, ld);
    att_bias_f32(a, pl, r0, n, kmax, S, ld);
    att_softmax_tiles(a, n, kmax, S, ld, pl->p ? (float *)pl->p + r0 * a->Tk : NULL);
    ai_attn_mm_f32(W, n, a->Dv, kmax, 1, S, ld, 1, pl->v, a->ldv, false,
                   (float *)pl->y + r0 * a->ldy, a->ldy);
}

static void att_backward_block_tiles(const att_info *a, const att_plane *pl, int64_t r0,
                                     int64_t n, bool first_kv, float *dP, const float *vT)
{
    const int W = a->lanes;
    const int64_t Tk = a->Tk, ld = a->ldt, ldq = a->ldq, ldy = a->ldy;
    const int64_t kmax = att_kmax(a, r0 + n);
    const float scale = (float)a->scale;
    const float *q = (const float *)pl->q + r0 * ldq, *dy = (const float *)pl->dy + r0 * ldy;
    const float *P = (const float *)pl->p + r0 * Tk;
    const bool add_k = !(a->assign[1] && first_kv), add_v = !(a->assign[2] && first_kv);
    att_zero_past_f32(a, pl, kmax, !add_k, !add_v);
    ai_attn_mm_f32(W, n, (kmax + 7) / 8 * 8, a->Dv, 1, dy, ldy, 1, vT, ld, false, dP, ld);
    if (pl->dv) /* P^T dY */
        ai_attn_mm_f32(W, kmax, a->Dv, n, 1, P, 1, Tk, dy, ldy, add_v, pl->dv, a->ldv);
    att_dsoftmax_f32(a, pl, r0, n, kmax, P, dP, ld);
    if (pl->dq)
        ai_attn_mm_f32(W, n, a->D, kmax, scale, dP, ld, 1, pl->k, a->ldk, !a->assign[0],
                       (float *)pl->dq + r0 * ldq, ldq);
    if (pl->dk) /* dS^T Q */
        ai_attn_mm_f32(W, kmax, a->D, n, scale, dP, 1, ld, q, ldq, add_k, pl->dk, a->ldk);
}

#define REAL double
#define SFX(name) name##_f64
#define GEMM ai_gemm_f64
#define EXP exp
#include "attention_impl.h"
#undef REAL
#undef SFX
#undef GEMM
#undef EXP

/* ---------------------------------------------------------------- attributes */

static ai_status att_init(ai_node *n)
{
    att_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    p->fused = strcmp(n->op_type, "FusedAttention") == 0;
    int64_t causal, kt = 0, masked_zero = 0, bthd = 0, y_bthd = 0;
    ai_status st;
    if ((st = ai_attr_float(n, "scale", 0, &p->scale)) ||
        (st = ai_attr_int(n, "is_causal", 0, &causal)) ||
        (p->fused && ((st = ai_attr_int(n, "k_transposed", 0, &kt)) ||
                      (st = ai_attr_int(n, "masked_zero", 0, &masked_zero)) ||
                      (st = ai_attr_int(n, "bthd", 0, &bthd)) ||
                      (st = ai_attr_int(n, "y_bthd", 0, &y_bthd)))))
        return st;
    p->causal = causal != 0;
    p->kt = kt != 0;
    p->bthd = bthd != 0;
    p->y_bthd = y_bthd != 0;
    if (p->bthd && p->kt)
        return ai_node_error(n, AI_ERR_VALUE, "bthd with k_transposed: K (B, Tk, Hk, D) is "
                             "not transposed");
    p->masked_zero = !p->fused || masked_zero != 0;
    for (int k = 4; k < n->n_in; k++) /* ONNX's past_key, past_value, nonpad_kv_seqlen */
        if (n->in[k] >= 0)
            return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "input %d (past key/value or "
                                 "nonpad_kv_seqlen) is not supported natively (the importer "
                                 "writes such a node as its ONNX function body)", k);
    if (p->fused)
        return AI_OK;
    for (int i = 0; i < n->n_attrs; i++) {
        const char *a = n->attrs[i].name;
        if (strcmp(a, "scale") && strcmp(a, "is_causal") && strcmp(a, "softmax_precision") &&
            strcmp(a, "qk_matmul_output_mode"))
            return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "attribute %s is not supported "
                                 "natively (the importer writes such a node as its ONNX "
                                 "function body)", a);
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- shapes */

/* Sizes from the input metas (c->in); the rank-3 form is (1, N, T, D). */
static ai_status att_sizes(const ai_ctx *c, att_info *a)
{
    const att_params *p = c->node->params;
    const ai_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2], *m = c->n_in > 3 ? c->in[3] : NULL;
    const ai_node *n = c->node;
    const int r = q->ndim;
    const bool rank3 = p->fused && !p->bthd && !p->y_bthd;
    if ((r != 4 && !(rank3 && r == 3)) || k->ndim != r || v->ndim != r)
        return ai_node_error(n, AI_ERR_VALUE, "Q, K, V of ranks %d, %d, %d; all %s expected",
                             q->ndim, k->ndim, v->ndim, rank3 ? "3 or all 4" : "4");
    if (q->dtype != AI_F32 && q->dtype != AI_F64)
        return ai_node_error(n, AI_ERR_TYPE, "Q is %s; float32 or float64 expected",
                             ai_dtype_name(q->dtype));
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return ai_node_error(n, AI_ERR_TYPE, "Q, K, V are %s, %s, %s; one float type expected",
                             ai_dtype_name(q->dtype), ai_dtype_name(k->dtype),
                             ai_dtype_name(v->dtype));
    const int o = 4 - r; /* (1, N, T, D) for rank 3 */
    const int ah = p->bthd ? 2 : 1 - o, at = p->bthd ? 1 : 2 - o; /* heads', rows' axes */
    a->B = o ? 1 : q->shape[0];
    a->Hq = q->shape[ah];
    a->Hk = k->shape[ah];
    a->Tq = q->shape[at];
    a->D = q->shape[3 - o];
    a->Tk = k->shape[p->kt ? 3 - o : at];
    const int64_t kd = k->shape[p->kt ? 2 - o : 3 - o];
    a->Dv = v->shape[3 - o];
    if ((!o && (k->shape[0] != a->B || v->shape[0] != a->B)) || v->shape[ah] != a->Hk ||
        kd != a->D || v->shape[at] != a->Tk || a->Hk == 0 || a->Hq % a->Hk != 0 ||
        (o && a->Hq != a->Hk))
        return ai_node_error(n, AI_ERR_VALUE, "Q %s, %s, V %s expected, Hq a multiple of Hk; "
                             "got (heads, rows, cols) Q (%lld, %lld, %lld), K (%lld, %lld, "
                             "%lld), V (%lld, %lld, %lld)",
                             p->bthd ? "(B, Tq, Hq, D)" : "(B, Hq, Tq, D)",
                             p->bthd ? "K (B, Tk, Hk, D)" : p->kt ? "Kt (B, Hk, D, Tk)" :
                             "K (B, Hk, Tk, D)", p->bthd ? "(B, Tk, Hk, Dv)" : "(B, Hk, Tk, Dv)",
                             (long long)a->Hq, (long long)a->Tq, (long long)a->D,
                             (long long)a->Hk, (long long)k->shape[p->kt ? 2 - o : at],
                             (long long)k->shape[3 - o], (long long)v->shape[ah],
                             (long long)v->shape[at], (long long)a->Dv);
    a->Lm = a->Tk;
    a->mask_bool = false;
    if (m) {
        if (m->dtype != AI_BOOL && m->dtype != q->dtype)
            return ai_node_error(n, AI_ERR_TYPE, "attn_mask is %s; bool or %s expected",
                                 ai_dtype_name(m->dtype), ai_dtype_name(q->dtype));
        a->mask_bool = m->dtype == AI_BOOL;
        if (!p->fused && m->ndim > 0)
            a->Lm = m->shape[m->ndim - 1];
        const int64_t target[4] = {a->B, a->Hq, a->Tq, a->Lm};
        bool ok = m->ndim <= r && a->Lm <= a->Tk;
        for (int d = 0; ok && d < m->ndim; d++) {
            const int64_t md = m->shape[m->ndim - 1 - d], td = target[3 - d];
            ok = md == 1 || md == td;
        }
        if (!ok)
            return ai_node_error(n, AI_ERR_VALUE, "attn_mask of rank %d does not broadcast to "
                                 "(B, H, Tq, Tk) = (%lld, %lld, %lld, %lld)%s", m->ndim,
                                 (long long)a->B, (long long)a->Hq, (long long)a->Tq,
                                 (long long)a->Tk, p->fused ? "" : " (its last dim at most Tk)");
    }
    a->scale = p->scale != 0 ? p->scale : 1 / sqrt((double)a->D);
    a->causal = p->causal;
    a->kt = p->kt;
    a->bthd = p->bthd;
    a->ldq = p->bthd ? a->Hq * a->D : a->D;
    a->ldk = p->bthd ? a->Hk * a->D : p->kt ? a->Tk : a->D;
    a->ldv = p->bthd ? a->Hk * a->Dv : a->Dv;
    a->y_bthd = p->y_bthd;
    a->ldy = p->y_bthd ? a->Hq * a->Dv : a->Dv;
    a->masked_zero = p->masked_zero;
    a->f64 = q->dtype == AI_F64;
    return AI_OK;
}

static ai_status att_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    att_info a;
    ai_status st = att_sizes(c, &a);
    if (st)
        return st;
    const ai_tensor *q = c->in[0];
    out[0].dtype = q->dtype;
    out[0].ndim = q->ndim;
    memcpy(out[0].shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
    /* (B, Hq, Tq, Dv), or (B, Tq, Hq, Dv) with y_bthd */
    const int64_t y4[4] = {a.B, a.y_bthd ? a.Tq : a.Hq, a.y_bthd ? a.Hq : a.Tq, a.Dv};
    if (q->ndim == 4)
        memcpy(out[0].shape, y4, sizeof y4);
    out[0].shape[q->ndim - 1] = a.Dv;
    if (c->g->need_backward) /* P */
        *state = (size_t)(a.B * a.Hq * a.Tq * a.Tk) * ai_dtype_size(q->dtype);
    return AI_OK;
}

/* ---------------------------------------------------------------- forward */

/* Operands and strides of a run; rows per block: a block's scores (rows x
 * Tk) about `block_bytes` (32 KiB forward, in L1; 64 KiB backward, whose
 * block also holds dP, in L2), 16 to 128 rows. The forward's smaller blocks
 * (one node, B 8, 4 heads, T 128, D 64, 1 thread: 2.5 -> 2.1 ms; T 145:
 * 2.4 -> 2.0 ms) keep each block's two GEMMs small enough for OpenBLAS's
 * small-matrix kernels, which skip the packing that 128-row blocks paid
 * per call, and under is_causal skip more of the keys no row sees. */
static ai_status att_bind(ai_ctx *c, att_info *a, int64_t block_bytes)
{
    ai_status st = att_sizes(c, a);
    if (st)
        return st;
    const ai_tensor *m = c->n_in > 3 ? c->in[3] : NULL;
    a->q = c->in[0]->data;
    a->k = c->in[1]->data;
    a->v = c->in[2]->data;
    a->mask = m ? m->data : NULL;
    if (m) {
        const int64_t target[4] = {a->B, a->Hq, a->Tq, a->Lm};
        ai_broadcast_strides(m->ndim, m->shape, 4, target, a->mask_st);
    }
    a->p = c->g->need_backward ? c->state : NULL;
    const int64_t per = block_bytes / (a->f64 ? 8 : 4) / (a->Tk > 0 ? a->Tk : 1);
    a->rows = per < 16 ? 16 : per > 128 ? 128 : per;
    if (a->rows > a->Tq)
        a->rows = a->Tq > 0 ? a->Tq : 1;
    const int w = a->f64 || a->kt ? 0 : ai_attn_lanes();
    a->lanes = w && a->D % w == 0 && a->Dv % w == 0 ? w : 0;
    a->ldt = a->lanes ? (a->Tk + 15) / 16 * 16 : a->Tk;
    atomic_init(&a->nomem, false);
    return AI_OK;
}

static att_plane att_plane_of(const att_info *a, int64_t b, int64_t h)
{
    const size_t es = a->f64 ? 8 : 4;
    const int64_t hk = h / (a->Hq / a->Hk), qp = b * a->Hq + h, kp = b * a->Hk + hk;
    /* element offsets of the plane's first row: (B, H, T, .) planes, or
     * with bthd (Y: y_bthd) batch b's rows and head h's columns of
     * (B, T, H, .) */
    const int64_t oq = a->bthd ? b * a->Tq * a->ldq + h * a->D : qp * a->Tq * a->D;
    const int64_t ok = a->bthd ? b * a->Tk * a->ldk + hk * a->D : kp * a->Tk * a->D;
    const int64_t ov = a->bthd ? b * a->Tk * a->ldv + hk * a->Dv : kp * a->Tk * a->Dv;
    const int64_t oy = a->y_bthd ? b * a->Tq * a->ldy + h * a->Dv : qp * a->Tq * a->Dv;
    att_plane pl = {
        .q = (const char *)a->q + (size_t)oq * es,
        .k = (const char *)a->k + (size_t)ok * es,
        .v = (const char *)a->v + (size_t)ov * es,
        .y = a->y ? (char *)a->y + (size_t)oy * es : NULL,
        .p = a->p ? (char *)a->p + (size_t)(qp * a->Tq * a->Tk) * es : NULL,
        .mask_off = b * a->mask_st[0] + h * a->mask_st[1],
    };
    if (a->dy) {
        pl.dy = (const char *)a->dy + (size_t)oy * es;
        pl.dq = a->dq ? (char *)a->dq + (size_t)oq * es : NULL;
        pl.dk = a->dk ? (char *)a->dk + (size_t)ok * es : NULL;
        pl.dv = a->dv ? (char *)a->dv + (size_t)ov * es : NULL;
        pl.dmask = a->dmask ? (char *)a->dmask + (size_t)(qp * a->Tq * a->Lm) * es : NULL;
    }
    return pl;
}

/* Parts of a job: each part runs items [p n / parts, (p + 1) n / parts) with
 * its own scratch. */
typedef struct {
    att_info *a;
    int64_t items, parts;
} att_job;

static void att_forward_range(void *ctx, int64_t lo, int64_t hi)
{
    const att_job *j = ctx;
    att_info *a = j->a;
    const size_t es = a->f64 ? 8 : 4;
    /* the scores; with the tiles the plane's K^T after them */
    void *S = malloc((size_t)(a->rows * a->ldt + (a->lanes ? a->D * a->ldt : 0)) * es + 1);
    if (!S) {
        atomic_store(&a->nomem, true);
        return;
    }
    float *kT = (float *)S + a->rows * a->ldt;
    const int64_t nb = (a->Tq + a->rows - 1) / a->rows;
    int64_t kt_plane = -1; /* whose K kT holds */
    for (int64_t p = lo; p < hi; p++)
        for (int64_t it = p * j->items / j->parts; it < (p + 1) * j->items / j->parts; it++) {
            const int64_t blk = it % nb, plane = it / nb;
            const att_plane pl = att_plane_of(a, plane / a->Hq, plane % a->Hq);
            const int64_t r0 = blk * a->rows, n = r0 + a->rows < a->Tq ? a->rows : a->Tq - r0;
            if (a->lanes) {
                const int64_t kp = plane / a->Hq * a->Hk + plane % a->Hq / (a->Hq / a->Hk);
                if (kp != kt_plane)
                    ai_attn_transpose_f32(a->lanes, a->Tk, a->D, pl.k, a->ldk, kT, a->ldt);
                kt_plane = kp;
                att_forward_block_tiles(a, &pl, r0, n, S, kT);
            } else if (a->f64)
                att_forward_block_f64(a, &pl, r0, n, S);
            else
                att_forward_block_f32(a, &pl, r0, n, S);
        }
    free(S);
}

static ai_status att_forward(ai_ctx *c)
{
    att_info a = {0};
    ai_status st = att_bind(c, &a, 32768);
    if (st)
        return st;
    a.y = c->out[0]->data;
    const int64_t items = a.B * a.Hq * ((a.Tq + a.rows - 1) / a.rows);
    if (items == 0 || a.Dv == 0)
        return AI_OK;
    if (a.Tk == 0) { /* no keys: every row masked */
        memset(a.y, 0, (size_t)(a.B * a.Hq * a.Tq * a.Dv) * (a.f64 ? 8 : 4));
        return AI_OK;
    }
    att_job j = {&a, items, items < ai_parallel_parts() ? items : ai_parallel_parts()};
    ai_parallel_for(j.parts, 1, att_forward_range, &j);
    if (atomic_load(&a.nomem))
        return ai_node_error(c->node, AI_ERR_NOMEM, "out of memory for the scores of %lld "
                             "rows x %lld keys", (long long)a.rows, (long long)a.Tk);
    return AI_OK;
}

/* ---------------------------------------------------------------- backward */

static void att_backward_range(void *ctx, int64_t lo, int64_t hi)
{
    const att_job *j = ctx;
    att_info *a = j->a;
    const size_t es = a->f64 ? 8 : 4;
    /* dP; with the tiles the plane's V^T after it */
    void *dP = malloc((size_t)(a->rows * a->ldt + (a->lanes ? a->Dv * a->ldt : 0)) * es + 1);
    if (!dP) {
        atomic_store(&a->nomem, true);
        return;
    }
    float *vT = (float *)dP + a->rows * a->ldt;
    const int64_t group = a->Hq / a->Hk;
    for (int64_t p = lo; p < hi; p++)
        for (int64_t it = p * j->items / j->parts; it < (p + 1) * j->items / j->parts; it++) {
            const int64_t b = it / a->Hk, hk = it % a->Hk;
            for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
                const att_plane pl = att_plane_of(a, b, h);
                if (a->lanes && h == hk * group)
                    ai_attn_transpose_f32(a->lanes, a->Tk, a->Dv, pl.v, a->ldv, vT, a->ldt);
                for (int64_t r0 = 0; r0 < a->Tq; r0 += a->rows) {
                    const int64_t n = r0 + a->rows < a->Tq ? a->rows : a->Tq - r0;
                    const bool first = h == hk * group && r0 == 0;
                    if (a->lanes)
                        att_backward_block_tiles(a, &pl, r0, n, first, dP, vT);
                    else if (a->f64)
                        att_backward_block_f64(a, &pl, r0, n, first, dP);
                    else
                        att_backward_block_f32(a, &pl, r0, n, first, dP);
                }
            }
        }
    free(dP);
}

static ai_status att_backward(ai_ctx *c)
{
    att_info a = {0};
    ai_status st = att_bind(c, &a, 65536);
    if (st)
        return st;
    if (!a.p)
        return ai_node_error(c->node, AI_ERR_RUNTIME, "backward without a forward that kept "
                             "the probabilities (need_backward)");
    a.dy = c->dout[0]->data;
    a.dq = c->din[0] ? c->din[0]->data : NULL;
    a.dk = c->din[1] ? c->din[1]->data : NULL;
    a.dv = c->din[2] ? c->din[2]->data : NULL;
    /* a gradient the kernel writes (first write, AI_OP_GRAD_ASSIGN) unless
     * it is another slot's too (Q and K one value: both add to it) or no
     * block runs: then zeroed here and added to */
    const bool runs = a.B * a.Hk > 0 && a.Tq > 0 && a.Tk > 0;
    for (int k = 0; k < 3; k++) {
        ai_tensor *d = c->din[k];
        bool shared = false;
        for (int o = 0; d && o < 3; o++)
            shared |= o != k && c->din[o] && c->din[o]->data == d->data;
        a.assign[k] = d && c->din_assign[k] && runs && !shared;
        if (d && c->din_assign[k] && !a.assign[k])
            memset(d->data, 0, ai_tensor_nbytes(d));
    }
    ai_tensor *dmask = NULL;
    if (c->n_in > 3 && c->din[3]) {
        const int64_t shape[4] = {a.B, a.Hq, a.Tq, a.Lm};
        if ((st = ai_tensor_new(&dmask, c->in[0]->dtype, 4, shape)))
            return st;
        a.dmask = dmask->data;
    }
    const int64_t items = a.B * a.Hk;
    if (runs) {
        att_job j = {&a, items, items < ai_parallel_parts() ? items : ai_parallel_parts()};
        ai_parallel_for(j.parts, 1, att_backward_range, &j);
    }
    if (atomic_load(&a.nomem)) {
        ai_tensor_free(dmask);
        return ai_node_error(c->node, AI_ERR_NOMEM, "out of memory for the scores of %lld "
                             "rows x %lld keys", (long long)a.rows, (long long)a.Tk);
    }
    if (dmask)
        ai_reduce_to(c->din[3], dmask, false);
    ai_tensor_free(dmask);
    return AI_OK;
}

/* dQ, dK, dV assigned on their first write; the mask's gradient added */
static const ai_op_def op_attention = {"Attention", "", 3, 7, 1, 1,
                                       AI_OP_GRAD_ASSIGN(3) | AI_OP_BWD_NO_Y, att_init,
                                       att_shape, att_forward, att_backward};
static const ai_op_def op_fused_attention = {"FusedAttention", "aidge_interop", 3, 4, 1, 1,
                                             AI_OP_GRAD_ASSIGN(3) | AI_OP_BWD_NO_Y, att_init,
                                             att_shape, att_forward, att_backward};

const ai_op_def *const ai_ops_attention[] = {&op_attention, &op_fused_attention, NULL};
