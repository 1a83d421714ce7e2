/*
 * graph.h — the engine's graph IR and the operator interface.
 *
 * A graph is a list of values (graph inputs, parameters, buffers, constants
 * and activations) and a list of nodes (operator applications) that read
 * and write values by index. It is built once (from ONNX, by the Python
 * importer) and then *planned* for a set of input shapes: shape inference,
 * constant folding (shape subgraphs), a schedule and a memory plan. Forward,
 * backward and SGD run on the current plan; new input shapes re-plan.
 *
 * Operators live in ops/, one file per family; each is an ai_op_def with
 * init (parse attributes), shape, forward and backward, registered in
 * ops/registry.c.
 */
#ifndef AI_GRAPH_H
#define AI_GRAPH_H

#include "aidge.h"

#define AI_MAX_IO 16 /* inputs or outputs of one node */

typedef enum {
    AI_VAL_INPUT,  /* graph input, bound at each forward */
    AI_VAL_PARAM,  /* trainable initializer: has a persistent gradient */
    AI_VAL_BUFFER, /* non-trainable state (BatchNorm running statistics) */
    AI_VAL_CONST,  /* constant initializer or Constant node output */
    AI_VAL_ACT,    /* computed by a node */
} ai_value_kind;

typedef struct {
    char *name;
    ai_value_kind kind;
    ai_dtype dtype;   /* known for inputs and initializers; inferred otherwise */
    ai_tensor *data;  /* PARAM/BUFFER/CONST: owned values */
    ai_tensor *grad;  /* PARAM: persistent gradient (accumulated) */
    int producer;     /* node index, -1 for inputs and initializers */
    int producer_slot;
} ai_value;

typedef enum {
    AI_ATTR_INT,
    AI_ATTR_FLOAT,
    AI_ATTR_INTS,
    AI_ATTR_FLOATS,
    AI_ATTR_STRING,
    AI_ATTR_TENSOR,
    AI_ATTR_GRAPH, /* a subgraph (Loop's body, If's branches), owned by the node */
} ai_attr_type;

typedef struct {
    char *name;
    ai_attr_type type;
    int64_t i;
    double f;
    int64_t n;       /* length of ints / floats */
    int64_t *ints;
    double *floats;
    char *s;
    ai_tensor *t;
    struct ai_graph *graph; /* AI_ATTR_GRAPH: shared by copies (ai_graph.refs) */
} ai_attr;

typedef struct ai_op_def ai_op_def;
typedef struct ai_plan ai_plan;

typedef struct {
    char *name;
    char *op_type;
    char *domain;
    int opset;
    const ai_op_def *op;
    int n_in, n_out;
    int in[AI_MAX_IO];  /* value indices; -1 for an absent optional input */
    int out[AI_MAX_IO];
    int n_attrs;
    ai_attr *attrs;
    void *params;       /* parsed attributes, owned (free()) */
    /* time spent in this node's kernels while ai_graph.profile is set */
    double prof_fwd_s, prof_bwd_s;
    int64_t prof_fwd_n, prof_bwd_n;
} ai_node;

typedef struct ai_graph {
    ai_value *values;
    int n_values, cap_values;
    ai_node *nodes;
    int n_nodes, cap_nodes;
    int *inputs, n_inputs;
    /* per input: the dims the model declares, [0] the rank (-1: not
     * declared), then each dim (-1: free) */
    int64_t (*input_dims)[AI_MAX_DIMS + 1];
    int *outputs, n_outputs;
    int *order;          /* topological order of nodes (finalize) */
    bool finalized;
    bool training;       /* BatchNorm batch statistics, Dropout active */
    bool input_grads;    /* compute gradients of the graph inputs */
    bool keep_intermediates; /* plan without buffer reuse */
    bool need_backward;  /* forward keeps what backward needs */
    bool profile;        /* time every node's forward and backward (ai_node.prof_*) */
    /* whether shapes need the values of small integer graph inputs (plan.c
     * plan_time_input): 0 not known yet (set by finalize), 1 no, 2 yes */
    int int_values_at_plan;
    uint64_t seed;       /* Dropout RNG */
    ai_plan *plan;
    /* A subgraph (the body of a Loop or a branch of an If, ops/control.c):
     * every integer or bool input is read when it is planned, as a constant
     * (it re-plans for each iteration's values anyway), and its inputs take
     * the dtypes of the values its node binds. */
    bool subgraph;
    int refs;            /* owners beyond the first (attribute copies) */
    /* tensors the node owning this subgraph kept from its last forward for
     * its backward (a Loop's carried values per iteration); freed with it */
    ai_tensor **saved;
    int n_saved, cap_saved;
    /* Packed weights (packed.c): the version of the initializers' values
     * that the caller declares, changed by it after every write to their
     * memory (-1, the default: not tracked, no packed copy is read); set
     * when a product would have read one had a version been declared; the
     * copies, dropped with the plan's finalization (ai_graph_unfinalize). */
    int64_t weights_version;
    bool weights_packable;
    struct ai_packed *packed;
    int n_packed;
} ai_graph;

/* ---------------------------------------------------------------- ops */

/* Everything a kernel sees. Tensors are contiguous. In shape inference,
 * in[i] has the input's dtype and shape; its data is NULL unless the value
 * is a constant (then use ai_ctx_const). */
typedef struct {
    ai_graph *g;
    const ai_node *node;
    int n_in, n_out;
    ai_tensor *in[AI_MAX_IO];   /* NULL for an absent optional input */
    ai_tensor *out[AI_MAX_IO];
    /* backward only: dout[i] is always a valid (maybe zero) gradient of a
     * float output; din[i] is NULL when input i needs no gradient, else an
     * accumulator: backward ADDS to it, unless din_assign[i] is set (only
     * for ops with AI_OP_GRAD_ASSIGN(n), i < n): then din[i] holds garbage
     * and backward must WRITE every element of it (never read it first).
     * The same tensor may be din of two slots (Mul(x, x)): then only the
     * first may be in assign mode, and backward must finish writing slot i
     * (at least element by element) before adding slot j > i into it. */
    ai_tensor *dout[AI_MAX_IO];
    ai_tensor *din[AI_MAX_IO];
    bool din_assign[AI_MAX_IO];
    void *state;     /* per-node state kept from forward to backward */
    void *workspace; /* scratch of the size asked by shape() */
    bool training;
    /* forward of a FusedConv's base Conv: the ai_conv_epilogue
     * (kernels/conv.h) it applies to its output; NULL otherwise */
    const void *epilogue;
    ai_plan *plan;   /* engine-private */
} ai_ctx;

/* Shape inference sets, for each output, dtype, ndim and shape. */
typedef struct {
    ai_dtype dtype;
    int ndim;
    int64_t shape[AI_MAX_DIMS];
} ai_meta;

enum {
    AI_OP_FOLD_ON_SHAPE = 1, /* output depends on input shapes only (Shape) */
    AI_OP_NO_FOLD = 2,       /* never constant-folded (Dropout: random) */
    /* What backward reads, for the memory plan of a training forward: a
     * value no backward reads is dead at its last forward use, as at
     * inference. Without the flags backward may read everything. */
    AI_OP_BWD_NO_X = 4, /* backward reads no input's data (shapes only) */
    AI_OP_BWD_NO_Y = 8, /* backward reads no output's data */
    /* the output's shape depends on the inputs' values (Range): a scalar
     * graph input feeding it is read when the graph is planned, and a new
     * value re-plans, as for the small integer inputs that set shapes */
    AI_OP_SHAPE_FROM_VALUES = 16,
    /* the node plans a subgraph with its inputs' values (Loop, If): every
     * integer or bool graph input that it depends on is read when the graph
     * is planned (a new value re-plans) */
    AI_OP_VALUES_AT_PLAN = 32,
    /* init checks which inputs may be empty (Loop: M and cond, before
     * variadic ones); otherwise finalize refuses an empty input below
     * min_in or of a variadic operator */
    AI_OP_EMPTY_INPUTS = 64,
    /* forward takes float16 and bfloat16 as they are: it moves bytes
     * (Reshape, Transpose, Gather...) or converts (Cast). Any other node
     * with a half input runs its float32 kernels on float32 copies (plan.c,
     * "half precision"), which also makes each float32 output a half one;
     * so an operator whose float output type an attribute sets (Cast,
     * EyeLike) must have this flag. Backward runs in float32 copies too,
     * unless the operator also has AI_OP_HALF_GRAD: its backward takes half
     * gradients as they are (Loop and If: their subgraphs convert node by
     * node). */
    AI_OP_HALF = 128,
    AI_OP_HALF_GRAD = 1 << 16, /* (bits 8 to 15 are AI_OP_GRAD_ASSIGN's) */
    /* the output's shape depends on the values of whole input tensors
     * (NonZero, Unique, Compress, NonMaxSuppression). shape() reads them
     * from c->in[k]->data, which the plan fills when it knows them:
     * constants, and the values computed from the graph inputs and
     * parameters these inputs depend on, which are then read when the
     * graph is planned (a new value re-plans). Unlike a folded value, a node so evaluated at
     * plan time still runs at forward (and backward): only the shape is
     * taken from the plan-time values. */
    AI_OP_SHAPE_FROM_DATA = 1 << 17,
    /* inputs after the first set the output's shape by their values, floats
     * included (Resize's roi, scales and sizes): a graph input of at most
     * AI_SHAPE_INPUT_MAX (plan.c) elements feeding one is read when the graph is
     * planned (a new value re-plans) */
    AI_OP_SHAPE_FROM_INPUTS = 1 << 18,
    /* The dtypes an operator takes beyond float16/32/64, int8/16/32/64,
     * uint8 and bool, checked before its shape function runs: */
    AI_OP_ANY_DTYPE = 1 << 19, /* every dtype: it moves or converts elements */
    AI_OP_UNSIGNED = 1 << 20,  /* uint16, uint32 and uint64 too */
    /* output 0 holds input 0's bytes as they are, under another shape
     * (Reshape, Flatten, Squeeze, Unsqueeze, Identity): the memory plan may
     * make it a view of the input's buffer, and the input's gradient a view
     * of the output's, instead of running the copies (plan.c, "views") */
    AI_OP_VIEW = 1 << 21,
};
/* Input k's gradient (k < 2) is output 0's gradient itself where the input
 * has the output's shape (Add's inputs, Sub's first): the memory plan may
 * make it the output's gradient buffer, or hand a graph input the caller's
 * output gradient, as torch's autograd does (plan.c, "gradients that are
 * dy"); backward then gets a NULL din[k]. Bits 22 and 23. */
#define AI_OP_GRAD_IS_DY(k) (1u << (22 + (k)))
/* "First writer assigns": backward can write (not add) the gradients of
 * inputs 0..n-1 when ai_ctx.din_assign says so, which saves the zeroing and
 * the read of a fresh gradient buffer. The engine sets din_assign[i] for the
 * first write of a non-parameter gradient in a backward pass; other slots,
 * and ops without this flag, get zeroed accumulators. */
#define AI_OP_GRAD_ASSIGN(n) ((unsigned)(n) << 8)
#define AI_OP_GRAD_ASSIGN_OF(flags) ((int)(((flags) >> 8) & 0xff))

struct ai_op_def {
    const char *name;   /* ONNX op_type */
    const char *domain; /* "" for ONNX, "aidge" for our own operators */
    int min_in, max_in, min_out, max_out;
    unsigned flags;
    /* Parses and checks attributes into node->params (may be NULL). */
    ai_status (*init)(ai_node *node);
    /* Infers out metas from c->in (shapes, dtypes, constant values);
     * may set *workspace and *state_bytes (zeroed per plan). */
    ai_status (*shape)(ai_ctx *c, ai_meta *out, size_t *workspace, size_t *state_bytes);
    /* Writes every element of every output: outputs come uninitialised
     * (arena memory, or a new tensor for a graph output). */
    ai_status (*forward)(ai_ctx *c);
    ai_status (*backward)(ai_ctx *c); /* NULL: no gradient flows through */
};

/* ---------------------------------------------------------------- helpers for ops */

/* packed.c: the packed copy (ai_gemm_tiles_pack) of input `slot`, a float32
 * initializer read as op(B) (K,N) by a product whose sizes take it
 * (ai_gemm_packs), for the weights' current version; NULL (use B as it is)
 * when the graph declares no version, in a training forward (it writes
 * BatchNorm's buffers), for a computed input, or out of memory. */
const float *ai_packed_weight(ai_ctx *c, int slot, bool trans_b, int64_t N, int64_t K);
/* The same for any reader: its layout (AI_PACK_*: one copy per weight and
 * layout), sizes (a new N or K repacks), the copy's floats, and `pack`,
 * which writes it from the weight w (`arg`: the reader's). */
enum { AI_PACK_GEMM_B, AI_PACK_GEMM_BT, AI_PACK_CONV_TILES, AI_PACK_CONV_WINOGRAD };
typedef void ai_pack_fn(const void *arg, const float *w, float *dst);
const float *ai_packed_layout(ai_ctx *c, int slot, int layout, int64_t N, int64_t K,
                              int64_t size, ai_pack_fn *pack, const void *arg);
/* Frees every packed copy; their bytes in total. */
void ai_packed_clear(ai_graph *g);
int64_t ai_packed_bytes(const ai_graph *g);

/* NULL if input i is absent or not a constant known at plan time. */
const ai_tensor *ai_ctx_const(const ai_ctx *c, int i);
/* Input i as one integer known at plan time (CumSum's axis, TopK's K,
 * Trilu's k); errors name the node and `name`. */
ai_status ai_ctx_int_scalar(const ai_ctx *c, int i, const char *name, int64_t *out);
/* The engine dtype of an ONNX TensorProto.DataType code (Cast's `to`,
 * EyeLike's `dtype`); false for a code that is not an engine dtype. */
bool ai_dtype_from_onnx(int64_t code, ai_dtype *out);

/* Attribute getters: AI_OK and the default when absent; AI_ERR_VALUE naming
 * the node and attribute when present with the wrong type. */
const ai_attr *ai_node_attr(const ai_node *n, const char *name);
ai_status ai_attr_int(const ai_node *n, const char *name, int64_t dflt, int64_t *out);
/* ai_attr_int, and AI_ERR_VALUE naming the attribute outside [lo, hi] */
ai_status ai_attr_int_in(const ai_node *n, const char *name, int64_t dflt, int64_t lo, int64_t hi,
                         int64_t *out);
/* A string attribute that must be one of names[0..count): *out = its index.
   The error names the node, the attribute, its value and the choices. */
ai_status ai_attr_choice(const ai_node *n, const char *name, const char *dflt,
                         const char *const *names, int count, int *out);
ai_status ai_attr_float(const ai_node *n, const char *name, double dflt, double *out);
/* *out points into the node (do not free); *len = -1 when absent. */
ai_status ai_attr_ints(const ai_node *n, const char *name, const int64_t **out, int64_t *len);
ai_status ai_attr_floats(const ai_node *n, const char *name, const double **out, int64_t *len);
ai_status ai_attr_string(const ai_node *n, const char *name, const char *dflt, const char **out);

/* Errors that name the node: "Conv node 'conv1': ...". */
ai_status ai_node_error(const ai_node *n, ai_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Normalises a possibly negative axis against rank; error names the node. */
ai_status ai_norm_axis(const ai_node *n, int64_t axis, int rank, int *out);

/* numpy broadcasting of two shapes into out (ndim and shape). */
ai_status ai_broadcast_shape(const ai_node *n, int na, const int64_t *a, int nb,
                             const int64_t *b, int *nout, int64_t *out);
/* Strides (in elements) that read a contiguous tensor of shape `in` as if
 * broadcast to `out` (0 on broadcast axes). */
void ai_broadcast_strides(int nin, const int64_t *in, int nout, const int64_t *out,
                          int64_t *strides);
/* dst (shape of a broadcast operand) += sum of src (full shape) over the
 * broadcast axes (= with `assign`). Same dtype (f32 or f64), both
 * contiguous. */
void ai_reduce_to(ai_tensor *dst, const ai_tensor *src, bool assign);

/* x[i] += y[i] (= with `assign`) over two equal-shaped contiguous f32/f64
 * tensors, on the thread pool (or two of one half type, added in float32). */
void ai_accumulate(ai_tensor *dst, const ai_tensor *src, bool assign);

/* Element i of a contiguous float32/float64 tensor, read or written as a
 * double (the per-element reference loops of norm.c and loss.c). */
static inline double ai_float_at(const ai_tensor *t, int64_t i)
{
    return t->dtype == AI_F32 ? ((const float *)t->data)[i] : ((const double *)t->data)[i];
}

static inline void ai_float_set(ai_tensor *t, int64_t i, double v)
{
    if (t->dtype == AI_F32)
        ((float *)t->data)[i] = (float)v;
    else
        ((double *)t->data)[i] = v;
}

/* Element i of a contiguous tensor of integers (8 to 64 bits, signed or
 * not, bool), widened to int64 (uint64: its bits), and written back
 * narrowed (wrapping, as numpy and torch). */
static inline int64_t ai_int_at(const ai_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case AI_I8: return ((const int8_t *)t->data)[i];
    case AI_U8:
    case AI_BOOL: return ((const uint8_t *)t->data)[i];
    case AI_I16: return ((const int16_t *)t->data)[i];
    case AI_U16: return ((const uint16_t *)t->data)[i];
    case AI_I32: return ((const int32_t *)t->data)[i];
    case AI_U32: return ((const uint32_t *)t->data)[i];
    default: return ((const int64_t *)t->data)[i];
    }
}

static inline void ai_int_set(ai_tensor *t, int64_t i, int64_t v)
{
    switch (ai_dtype_size(t->dtype)) {
    case 1: ((uint8_t *)t->data)[i] = t->dtype == AI_BOOL ? v != 0 : (uint8_t)v; break;
    case 2: ((uint16_t *)t->data)[i] = (uint16_t)v; break;
    case 4: ((uint32_t *)t->data)[i] = (uint32_t)v; break;
    default: ((int64_t *)t->data)[i] = v; break;
    }
}

/* The order of integers of dtype dt as int64: uint64 with its top bit
 * flipped (a < b unsigned iff key(a) < key(b) signed), the others as are. */
static inline int64_t ai_int_order_key(ai_dtype dt, int64_t v)
{
    return dt == AI_U64 ? (int64_t)((uint64_t)v ^ (UINT64_C(1) << 63)) : v;
}

#define AI_F32P(t) ((float *)(t)->data)
#define AI_F64P(t) ((double *)(t)->data)

/* ---------------------------------------------------------------- registry */

const ai_op_def *ai_op_find(const char *domain, const char *op_type);
/* The i-th registered operator, NULL past the last. */
const ai_op_def *ai_op_at(int i);

/* ---------------------------------------------------------------- graph API */

ai_status ai_graph_new(ai_graph **out);
/* Frees the graph, or drops one owner when it has several (refs). */
void ai_graph_free(ai_graph *g);

/* Adds a graph input (its shape comes with each forward). */
ai_status ai_graph_add_input(ai_graph *g, const char *name, ai_dtype dtype);
/* Declares input `name`'s rank and dims (-1: free), which forward then
 * checks, as ONNX Runtime does: a contradicting input is refused when the
 * graph is planned. */
ai_status ai_graph_set_input_dims(ai_graph *g, const char *name, int ndim,
                                  const int64_t *dims);
/* Adds an initializer; the graph takes ownership of `t` (also on failure). */
ai_status ai_graph_add_initializer(ai_graph *g, const char *name, ai_value_kind kind,
                                   ai_tensor *t);
/* Parameter `name`'s persistent gradient becomes `grad`'s memory (shared,
 * refcounted; same dtype and shape, contiguous, writable): two graphs of one
 * model (exported for other shapes) accumulate into one gradient. */
ai_status ai_graph_share_grad(ai_graph *g, const char *name, const ai_tensor *grad);
/* Adds a node. Input names "" are absent optional inputs. Attributes are
 * copied. */
ai_status ai_graph_add_node(ai_graph *g, const char *name, const char *domain,
                            const char *op_type, int opset, int n_in,
                            const char *const *inputs, int n_out,
                            const char *const *outputs, int n_attrs,
                            const ai_attr *attrs);
ai_status ai_graph_set_outputs(ai_graph *g, int n, const char *const *names);
/* Checks the graph (dangling values, cycles, unknown operators, operator
 * arity and attributes) and computes a topological order. */
ai_status ai_graph_finalize(ai_graph *g);

int ai_graph_find_value(const ai_graph *g, const char *name); /* -1 if none */

/* Runs forward. inputs[i] (any strides) binds graph input i; outputs[i]
 * receives a new owned tensor. Re-plans when input shapes changed. */
ai_status ai_graph_forward(ai_graph *g, int n_in, const ai_tensor *const *inputs,
                           int n_out, ai_tensor **outputs);
/* The output metas a forward with these inputs would give, without running
 * it or keeping a plan (g->plan is untouched). An input whose data is NULL
 * (and numel > 0) gives only its dtype and shape: an operator that needs its
 * value at plan time then fails with its own error. With `values`, values[i]
 * receives a new tensor holding output i when it is known at plan time
 * (folded or constant), else NULL. */
ai_status ai_graph_infer(ai_graph *g, int n_in, const ai_tensor *const *inputs,
                         ai_meta *out, ai_tensor **values);
/* Keeps a share of `t` in g->saved (a subgraph's owner, for its backward). */
ai_status ai_graph_save(ai_graph *g, const ai_tensor *t);
/* Frees what g->saved holds. */
void ai_graph_saved_clear(ai_graph *g);
/* Backward from gradients of the outputs (NULL = zero). Parameter gradients
 * accumulate into their value's grad; input_grads[i] (when the graph's
 * input_grads is set) receives a new owned tensor, or NULL. */
ai_status ai_graph_backward(ai_graph *g, int n_out, const ai_tensor *const *grad_outputs,
                            int n_in, ai_tensor **input_grads);

/* Whether the current plan's backward reads the memory of an output that
 * forward returned (a caller's in-place change to it would then change the
 * gradients); false without a plan or need_backward. */
bool ai_graph_backward_reads_outputs(const ai_graph *g);
/* Whether it reads a graph input's memory: the caller's tensor, which the
 * engine views (an in-place change to it between forward and backward
 * would change the gradients); false without a plan or need_backward. */
bool ai_graph_backward_reads_inputs(const ai_graph *g);

/* The value of `name` after the last forward, as a new tensor sharing the
 * plan's memory (AI_ERR_VALUE when its memory was reused since). */
ai_status ai_graph_intermediate(ai_graph *g, const char *name, ai_tensor **out);
/* Shape and dtype of a value in the current plan (false if not planned). */
bool ai_graph_value_meta(const ai_graph *g, int v, ai_meta *out);

typedef struct {
    size_t arena_bytes;     /* activations and their gradients */
    size_t workspace_bytes; /* scratch shared by all nodes */
    size_t state_bytes;     /* saved for backward (statistics, indices) */
    size_t param_bytes;     /* parameters, buffers, constants */
    size_t grad_bytes;      /* parameter gradients */
    int planned_nodes;      /* nodes run per forward (after folding) */
} ai_memory_stats;
ai_status ai_graph_memory_stats(const ai_graph *g, ai_memory_stats *out);

/* The memory limit of a plan, in bytes (process-wide). A plan that needs
 * more (one value, a node's workspace or state, or all of the plan's memory:
 * the arena, node state, workspace and the graph outputs of a forward) is
 * refused before anything is allocated, with AI_ERR_NOMEM naming the node
 * whose memory passes the limit. The default is 80% of the physical memory
 * (sysconf), no limit where that is unknown; ai_set_memory_limit(0) restores
 * it and AI_NO_MEMORY_LIMIT lifts the limit. A plan made before a change
 * stays. */
#define AI_NO_MEMORY_LIMIT SIZE_MAX
void ai_set_memory_limit(size_t bytes);
size_t ai_memory_limit(void);

/* Zeroes every parameter gradient. */
void ai_graph_zero_grad(ai_graph *g);

/* ---------------------------------------------------------------- editing (recipes.c) */

/* Reopens a finalized graph for editing: drops the plan, the order and the
 * parsed attributes. ai_graph_finalize checks and parses everything again;
 * the next forward re-plans. */
void ai_graph_unfinalize(ai_graph *g);
/* A new, not yet produced activation value named `base`, or `base` with a
 * suffix (":1", ":2"...) when that name is taken. */
ai_status ai_graph_new_value(ai_graph *g, const char *base, int *out);
/* Moves node `from` to position `to`, shifting the nodes between (producer
 * indices follow). */
void ai_graph_move_node(ai_graph *g, int from, int to);
/* Removes the nodes flagged in `remove` (one flag per node, may be NULL),
 * then every value no node, graph input or graph output uses any more.
 * Node order is kept. The graph must be unfinalized. */
ai_status ai_graph_compact(ai_graph *g, const bool *remove);
/* Sets (adds or replaces) a copy of attribute `a` on node `n`. */
ai_status ai_node_set_attr(ai_node *n, const ai_attr *a);
/* Removes attribute `name` from node `n` (no-op when absent). */
void ai_node_remove_attr(ai_node *n, const char *name);
/* Changes the operator of node `n` (checked at the next finalize). */
ai_status ai_node_set_op(ai_node *n, const char *domain, const char *op_type);

/* What a recipe did: one line per change (`node`: the node it concerns) and
 * one per candidate it left alone, with the reason. */
typedef struct {
    char *node;
    char *text;
} ai_recipe_entry;

typedef struct {
    ai_recipe_entry *done, *skipped;
    int n_done, n_skipped, cap_done, cap_skipped;
} ai_recipe_report;

void ai_recipe_report_free(ai_recipe_report *r);

/* Graph rewrites (recipes.c). Each works on a finalized graph, leaves it
 * finalized (re-planned at the next forward) and fills `report`; outputs
 * are unchanged up to float rounding.
 *   fuse_batchnorm   inference BatchNormalization after Conv/Gemm folded
 *                    into their weight and bias (computed in double);
 *                    AI_ERR_VALUE when the graph is in training mode
 *   remove_flatten   Flatten/Reshape feeding only Gemms: the Gemms become
 *                    aidge_interop.FusedGemm with flatten_axis
 *   fuse_activation  Conv/Gemm + Relu/Clip -> aidge_interop.FusedConv/FusedGemm
 *   batchnorm_epilogue  inference BatchNormalization after Conv/Gemm
 *                    applied by a FusedConv/FusedGemm to its output, from
 *                    the BatchNorm's own inputs at every forward (weights
 *                    untouched: they may be shared and keep changing)
 *   expand_metaops   undoes fuse_activation and batchnorm_epilogue (not
 *                    remove_flatten: a FusedGemm keeps its flatten_axis)
 *   restore_flatten  undoes remove_flatten: Flatten back before each
 *                    FusedGemm with flatten_axis (Gemm again when nothing
 *                    else is fused into it)
 *   constant_fold    nodes whose inputs are all constants -> constants
 *   block_channels   chains of float32 2-D convs (with the Adds and Relus
 *                    between them) run in blocked channels (kernels/conv.h):
 *                    FusedConv x_blocked/y_blocked, UnblockChannels where a
 *                    value is read in NCHW, a residual Add (+ Relu) into
 *                    the conv before it when the planned shapes are equal;
 *                    inference only (no backward)
 *   fuse_pad         a zero Pad of the spatial axes read only by Convs (as
 *                    their input): the Convs pad it themselves (pads)
 *   fuse_linear      MatMul of a 2-D weight, or of its Transpose, and the
 *                    Add of a bias vector after it -> aidge_interop.FusedMatMul
 *                    (transB, bias): exact, with backward
 *   fuse_gelu        0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) written
 *                    out in Mul, Add, Pow and Tanh nodes -> Gelu (approximate
 *                    "tanh"): one pass instead of eight, the same function
 *                    within float32 rounding (not bit for bit) */
ai_status ai_recipe_fuse_batchnorm(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_batchnorm_epilogue(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_remove_flatten(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_fuse_activation(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_expand_metaops(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_restore_flatten(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_constant_fold(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_block_channels(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_fuse_pad(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_fuse_linear(ai_graph *g, ai_recipe_report *report);
ai_status ai_recipe_fuse_gelu(ai_graph *g, ai_recipe_report *report);

/* ---------------------------------------------------------------- SGD */

typedef struct {
    double lr, momentum, dampening, weight_decay;
    bool nesterov, maximize;
} ai_sgd_config;

/* One torch.optim.SGD step on n parameters p with gradients g and momentum
 * buffers buf (same shapes; buf may be NULL when momentum == 0). `*started`
 * is false before the first step (torch initialises the buffer with the
 * first gradient). */
ai_status ai_sgd_step(const ai_sgd_config *cfg, int n, ai_tensor *const *p,
                      const ai_tensor *const *g, ai_tensor *const *buf, bool *started);
/* Zeroes n tensors, each contiguous and writable (an optimizer's
 * zero_grad, without a library whose threads then spin). */
ai_status ai_zero_tensors(int n, ai_tensor *const *t);

#endif
