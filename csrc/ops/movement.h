/*
 * movement.h — what the data-movement operator families share (defined in
 * movement.c): operators that move or pick data without arithmetic.
 *
 *   movement.c    the strided walk, and the operators that are one:
 *                 Transpose, Concat, Split, Slice, Expand, Tile,
 *                 DepthToSpace, SpaceToDepth
 *   reshape.c     Reshape, Flatten, Squeeze, Unsqueeze: same bytes, another shape
 *   index.c       Gather, GatherElements, Trilu: elements picked by index
 *   index_nd.c    GatherND, ScatterND: slices picked by index tuples
 *   scatter.c     ScatterElements, Scatter, TensorScatter: elements written by index
 *   pad.c         Pad
 *   from_shape.c  Shape, Size, ConstantOfShape: results that depend on a shape only
 *
 * Forward kernels copy bytes (ai_dtype_size), so they take every dtype:
 * int64 matters because shape subgraphs (Shape -> Gather -> Concat ->
 * Reshape) are constant-folded by running forward at plan time. Backward
 * takes float32/float64 and adds the output gradient back to where each
 * element came from (+=), or copies it there on the gradient's first write
 * when the walks cover the whole input (AI_OP_GRAD_ASSIGN).
 */
#ifndef AI_OPS_MOVEMENT_H
#define AI_OPS_MOVEMENT_H

#include "../graph.h"

/* out = (dt, shape[0..nd)); AI_OK */
ai_status ai_set_meta(ai_meta *m, ai_dtype dt, int nd, const int64_t *shape);
/* shape[from] * ... * shape[to - 1] */
int64_t ai_shape_prod(const int64_t *shape, int from, int to);
/* An integer list that is input `index` from opset `since` on and attribute
 * `name` before (at most `max` values). *n = -1 when absent. An input must
 * be a constant. */
ai_status ai_ints_input(const ai_ctx *c, int index, int since, const char *name,
                        int64_t *out, int max, int *n);
/* Normalises axes[0..n) against rank into flags[AI_MAX_DIMS] (no duplicates). */
ai_status ai_axes_flags(const ai_node *node, const int64_t *axes, int n, int rank,
                        bool *flags);
/* Gradients are float32/float64 only. */
ai_status ai_check_grad_dtype(const ai_ctx *c, const ai_tensor *g);

/* One row: n elements of es bytes, strides in elements. */
typedef void (*ai_row_fn)(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n,
                          size_t es);
/* dst[j sd] += src[j ss] for j < n (es: unused) */
void ai_row_add_f32(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n, size_t es);
void ai_row_add_f64(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n, size_t es);

/* dst[0..n) = src[0..n), n elements of es bytes, split between threads
 * from 2 AI_GRAIN_ELEMS elements (the pool, parallel.h) */
void ai_copy_elems(void *dst, const void *src, int64_t n, size_t es);

/* The reductions of the scatter operators (attribute `reduction`), parsed
 * and checked against the data (input 0) by ai_scatter_reduction (index_nd.c). */
enum { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };
extern const char *const ai_scatter_red_names[];
ai_status ai_scatter_reduction(const ai_ctx *c, int *red);
/* dst[j] op= src[j], j < n, in dtype dt (integers wrap; a NaN wins max and
 * min); nothing for RED_NONE */
void ai_scatter_reduce_row(int red, ai_dtype dt, void *dst, const void *src, int64_t n);

/* A registry entry of the default domain (one output unless MAX_OUT). */
#define OP(VAR, NAME, MIN_IN, MAX_IN, MAX_OUT, FLAGS, SHAPE, FWD, BWD)                  \
    static const ai_op_def VAR = {NAME, "", MIN_IN, MAX_IN, 1, MAX_OUT, FLAGS, NULL,     \
                                  SHAPE, FWD, BWD};
#define ASSIGN1 AI_OP_GRAD_ASSIGN(1) /* writes all of dx on a first write */

#endif
