/*
 * plan.h — a graph planned for one set of input shapes: shapes of every
 * value, folded constants, the schedule, the memory plan (one arena for
 * activations and their gradients, reused by liveness), per-node state and
 * workspace. Internal to the engine.
 */
#ifndef AI_PLAN_H
#define AI_PLAN_H

#include "graph.h"

struct ai_plan {
    int n_inputs;
    int64_t *in_shapes;   /* key: AI_MAX_DIMS + 1 per input (ndim, dims) */
    bool need_backward;
    bool input_grads;     /* the graph inputs' gradients are computed */
    bool keep_all;
    bool training;

    int n_values;
    ai_meta *meta;        /* per value */
    ai_tensor **folded;   /* per value: constant computed at plan time */
    ai_tensor **known;    /* per value: not constant, but its value for this plan,
                           * computed at plan time for a node whose output shape
                           * depends on it (AI_OP_SHAPE_FROM_DATA) */
    ai_tensor **act;      /* per value: arena view (activations) */
    ai_tensor **gradv;    /* per value: arena view (gradients of non-params) */
    bool *needs_grad;     /* per value */
    bool *grad_reaches;   /* per value: on a differentiable path to a graph output
                           * (an input read only through integer casts, comparisons
                           * or its shape gets no gradient, None in Python, as in torch) */
    bool *fresh;          /* per value: a graph output given a new tensor per forward */
    bool *grad_borrow;    /* per value: a graph output whose gradient backward may read
                           * from the caller's tensor (ai_graph_backward) */
    bool *grad_ready;     /* per value, during backward: zeroed already */
    int *def_step, *last_step; /* per value, forward steps */
    bool *kept;           /* per value: kept to the end of backward (or keep_all) */
    bool outputs_read;    /* a backward that runs reads a fresh output's memory */
    bool inputs_read;     /* a backward that runs reads a graph input (the caller's memory) */
    bool poison_dead;     /* AIDGE_INTEROP_POISON_DEAD: NaN into the values that die */

    /* views (plan.c): per value, the value whose arena buffer it shares, its
     * own and its gradient's (-1: a buffer of its own); per node, which
     * passes are views and do not run (VIEW_FORWARD, VIEW_BACKWARD) */
    int *view_of, *grad_view_of;
    unsigned char *view_node;
    /* gradients that are dy (plan.c): per graph input value, the graph
     * output whose gradient the caller gives may be its gradient (-1: none);
     * per value, whether it is, in the current backward */
    int *pass_out;
    bool *passed;
    int *poison_at;       /* per value with poison_dead: the forward step its buffer dies at */

    int n_sched;
    int *sched;           /* node indices run by forward */
    void **state;         /* per node */
    size_t *state_size;   /* per node */

    ai_tensor *arena;     /* uint8 storage shared by the views */
    ai_tensor *state_mem;
    ai_tensor *zeros;     /* a zero buffer for gradients that do not flow */
    void *workspace;
    size_t arena_bytes, workspace_bytes, state_bytes;
    ai_tensor **bound;    /* per graph input: the tensor bound at forward */
    /* half precision (plan.c): per node, a half_mode, and the offset of its
     * float32 copies in the workspace (after the operator's own); per value,
     * the float32 copy of a half constant that a converted node reads */
    unsigned char *half_mode;
    size_t *scratch_at;
    ai_tensor **wide;
    bool forward_done;
};

void ai_plan_free(ai_plan *p);

#endif
