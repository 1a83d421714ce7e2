/*
 * matmul.h — the numpy-matmul geometry of MatMul (ops/matmul.c), which the
 * integer products of ops/qlinear.c share.
 */
#ifndef AI_OPS_MATMUL_H
#define AI_OPS_MATMUL_H

#include "../graph.h"

/* Y[b] (M,N) = A[b] (M,K) @ B[b] (K,N) for b over the broadcast batch shape;
 * sa/sb give, per batch dimension, the step in matrices of A and B (0 where
 * that operand is broadcast). */
typedef struct {
    int nb;
    int64_t batch[AI_MAX_DIMS], sa[AI_MAX_DIMS], sb[AI_MAX_DIMS];
    int64_t count; /* matrices in Y */
    int64_t M, N, K;
    bool b_shared; /* B has no batch (all batches use one B) */
} ai_mm_dims;

/* The geometry of a @ b (shapes only); errors name the node. */
ai_status ai_matmul_dims(const ai_node *node, const ai_tensor *a, const ai_tensor *b,
                         ai_mm_dims *d);
/* Matrix indices of A and B used by output matrix i. */
void ai_matmul_batch(const ai_mm_dims *d, int64_t i, int64_t *ia, int64_t *ib);

#endif
