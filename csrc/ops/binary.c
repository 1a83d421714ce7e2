/*
 * binary.c — elementwise operators of several tensors with numpy
 * broadcasting: Add, Sub, Mul, Div, Pow, Min, Max, Mod, PRelu, Sum, Mean,
 * BitwiseAnd, BitwiseOr, BitwiseXor, BitShift, Equal, Less, Greater,
 * LessOrEqual, GreaterOrEqual, And, Or, Xor, Where.
 *
 * Arithmetic takes float32/float64 (with gradients) and integers of every
 * width (no gradients; results wrap around like numpy and torch). Backward forms the elementwise gradient in the
 * output's shape and sums it over the broadcast axes into each input
 * (ai_reduce_to); when an input has the output's shape it accumulates
 * directly, or on the gradient's first write (AI_OP_GRAD_ASSIGN) the
 * gradient kernel writes straight into it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/simd.h"
#include "../parallel.h"

/* MOD: Mod with fmod = 0, the remainder takes the divisor's sign (numpy.mod,
 * torch.remainder, Python's %); FMOD: fmod = 1, the dividend's (C, torch.fmod).
 * BIT_AND to SHIFT_RIGHT: integers only (SHIFT_RIGHT is BitShift's "RIGHT"). */
enum { ADD, SUB, MUL, DIV, POW, MIN, MAX, MOD, FMOD, PRELU, BIT_AND, BIT_OR, BIT_XOR,
       SHIFT_LEFT, SHIFT_RIGHT, EQUAL, LESS, GREATER, LESS_EQUAL, GREATER_EQUAL, AND, OR, XOR,
       WHERE, SUM, MEAN };

typedef struct {
    int kind;
} binary_params;

/* ---------------------------------------------------------------- iteration */

/* Calls fn(o, a, b, c, n, sa, sb, sc, ctx) for each innermost row of the
 * output, where sa/sb/sc are the inner strides (0 or 1) of the operands. */
typedef struct {
    int nd;
    int64_t shape[AI_MAX_DIMS];
    int64_t st[3][AI_MAX_DIMS]; /* strides of up to three operands */
} bcast;

/* The output's dims with each operand's strides; adjacent dims that every
 * operand walks as one (same shape, both broadcast) merge, so the innermost
 * rows are as long as possible (a same-shape operation is a single row). */
static void bcast_init(bcast *b, const ai_tensor *out, const ai_tensor *const *ins, int n)
{
    int64_t st[3][AI_MAX_DIMS] = {{0}};
    for (int k = 0; k < n; k++)
        ai_broadcast_strides(ins[k]->ndim, ins[k]->shape, out->ndim, out->shape, st[k]);
    memset(b, 0, sizeof *b);
    for (int d = 0; d < out->ndim; d++) {
        bool merge = b->nd > 0;
        for (int k = 0; k < 3 && merge; k++)
            merge = b->st[k][b->nd - 1] == st[k][d] * out->shape[d];
        if (merge) {
            b->shape[b->nd - 1] *= out->shape[d];
        } else {
            b->shape[b->nd] = out->shape[d];
            b->nd++;
        }
        for (int k = 0; k < 3; k++)
            b->st[k][b->nd - 1] = st[k][d];
    }
}

/* BODY for each innermost row, or the part of it, that holds output elements
 * [LO, HI): `inner` elements from output offset ro, operand offsets ra, rb,
 * rc (inner strides sa, sb, sc). Ranges of one output split between threads
 * visit each element once, with the same operands. */
#define BCAST_LOOP(B, LO, HI, ...)                                                   \
    do {                                                                             \
        int64_t idx_[AI_MAX_DIMS] = {0}, oa_ = 0, ob_ = 0, oc_ = 0;                  \
        const int64_t full_ = (B)->nd ? (B)->shape[(B)->nd - 1] : 1;                 \
        const int64_t sa = (B)->nd ? (B)->st[0][(B)->nd - 1] : 0;                    \
        const int64_t sb = (B)->nd ? (B)->st[1][(B)->nd - 1] : 0;                    \
        const int64_t sc = (B)->nd ? (B)->st[2][(B)->nd - 1] : 0;                    \
        (void)sc;                                                                    \
        if (full_ <= 0 || (LO) >= (HI))                                              \
            break;                                                                   \
        int64_t row_ = (LO) / full_;                                                 \
        for (int d_ = (B)->nd - 2; d_ >= 0; d_--) {                                  \
            idx_[d_] = row_ % (B)->shape[d_];                                        \
            row_ /= (B)->shape[d_];                                                  \
            oa_ += idx_[d_] * (B)->st[0][d_];                                        \
            ob_ += idx_[d_] * (B)->st[1][d_];                                        \
            oc_ += idx_[d_] * (B)->st[2][d_];                                        \
        }                                                                            \
        for (int64_t o_ = (LO) - (LO) % full_; o_ < (HI); o_ += full_) {             \
            const int64_t j0_ = (LO) > o_ ? (LO) - o_ : 0;                           \
            const int64_t inner = ((HI) - o_ < full_ ? (HI) - o_ : full_) - j0_;      \
            const int64_t ro = o_ + j0_, ra = oa_ + j0_ * sa, rb = ob_ + j0_ * sb;   \
            const int64_t rc = oc_ + j0_ * sc;                                       \
            (void)rc;                                                                \
            __VA_ARGS__;                                                             \
            for (int d_ = (B)->nd - 2; d_ >= 0; d_--) {                              \
                oa_ += (B)->st[0][d_];                                               \
                ob_ += (B)->st[1][d_];                                               \
                oc_ += (B)->st[2][d_];                                               \
                if (++idx_[d_] < (B)->shape[d_])                                     \
                    break;                                                           \
                oa_ -= (B)->st[0][d_] * (B)->shape[d_];                              \
                ob_ -= (B)->st[1][d_] * (B)->shape[d_];                              \
                oc_ -= (B)->st[2][d_] * (B)->shape[d_];                              \
                idx_[d_] = 0;                                                        \
            }                                                                        \
        }                                                                            \
    } while (0)

/* Elements of the output. */
static int64_t bcast_total(const bcast *b)
{
    int64_t n = 1;
    for (int d = 0; d < b->nd; d++)
        n *= b->shape[d];
    return n;
}

/* ---------------------------------------------------------------- forward */

/* numpy.mod of floats: fmod's remainder moved to the divisor's sign, a zero
 * remainder signed like the divisor; x mod 0 is NaN */
#define DEFINE_PY_MOD(NAME, T, FMOD, COPYSIGN)                                       \
    static inline T NAME(T a, T b)                                                   \
    {                                                                                \
        T m = FMOD(a, b);                                                            \
        if (b == 0)                                                                  \
            return m;                                                                \
        if (m != 0)                                                                  \
            return (b < 0) != (m < 0) ? m + b : m;                                   \
        return COPYSIGN((T)0, b);                                                    \
    }
DEFINE_PY_MOD(py_modf, float, fmodf, copysignf)
DEFINE_PY_MOD(py_mod, double, fmod, copysign)

#define ARITH(T, KIND, A, B)                                                         \
    ((KIND) == ADD ? (A) + (B)                                                       \
     : (KIND) == SUB ? (A) - (B)                                                     \
     : (KIND) == MUL ? (A) * (B)                                                     \
     : (KIND) == MIN ? ((A) < (B) || (A) != (A) ? (A) : (B))                         \
     : (KIND) == MAX ? ((A) > (B) || (A) != (A) ? (A) : (B))                         \
     : (KIND) == MOD ? _Generic((A), float: py_modf, default: py_mod)((A), (B))    \
     : (KIND) == FMOD ? _Generic((A), float: fmodf, default: fmod)((A), (B))       \
     : (KIND) == PRELU ? ((A) > 0 ? (A) : (B) * (A))                                 \
                     : (A))

/* STMT for j in [0, inner) with a_ = pa[j * sa], b_ = pb[j * sb]: the
 * contiguous and scalar-operand cases as their own loops, which vectorise. */
#define BINARY_ROW(T, STMT)                                                           \
    do {                                                                             \
        if (sa == 1 && sb == 1) {                                                    \
            for (int64_t j = 0; j < inner; j++) {                                    \
                const T a_ = pa[j], b_ = pb[j];                                      \
                STMT;                                                                \
            }                                                                        \
        } else if (sa == 1 && sb == 0) {                                             \
            const T b_ = pb[0];                                                      \
            for (int64_t j = 0; j < inner; j++) {                                    \
                const T a_ = pa[j];                                                  \
                STMT;                                                                \
            }                                                                        \
        } else {                                                                     \
            for (int64_t j = 0; j < inner; j++) {                                    \
                const T a_ = pa[j * sa], b_ = pb[j * sb];                            \
                STMT;                                                                \
            }                                                                        \
        }                                                                            \
    } while (0)

/* Whole rows [r0, r1) of a 2-D iteration (b->nd == 2: rows of W, each
 * operand's row stride sa0/sb0 and inner stride sa/sb, 0 or 1): a tight
 * loop, for the short rows of a broadcast (a (32,) bias on (4096, 32): the
 * general loop's bookkeeping per row made Add 1.7-2x slower than torch). */
#define BINARY_ROWS(T, STMT)                                                         \
    for (int64_t r = r0; r < r1; r++) {                                              \
        const T *pa = x0 + r * sa0, *pb = x1 + r * sb0;                              \
        T *po = y + r * W;                                                           \
        const int64_t inner = W;                                                     \
        BINARY_ROW(T, STMT);                                                         \
    }

#define DEFINE_FLOAT_FWD(NAME, T, POWF)                                              \
    AI_VECTOR_CLONES static void NAME##_general(const bcast *b, int kind, T *y,        \
                                              const T *x0, const T *x1, int64_t lo,  \
                                              int64_t hi)                            \
    {                                                                                \
        BCAST_LOOP(b, lo, hi, {                                                      \
            const T *pa = x0 + ra, *pb = x1 + rb;                                    \
            T *po = y + ro;                                                          \
            switch (kind) {                                                          \
            case DIV:                                                                \
                BINARY_ROW(T, po[j] = a_ / b_);                                       \
                break;                                                               \
            case POW: /* exponent 2 or 3 along the row: products, as torch and   \
                         * ONNX Runtime compute them (GPT-2's tanh GELU: x^3) */      \
                if (sb == 0 && (pb[0] == 2 || pb[0] == 3)) {                         \
                    if (pb[0] == 2)                                                  \
                        for (int64_t j = 0; j < inner; j++)                          \
                            po[j] = pa[j * sa] * pa[j * sa];                         \
                    else                                                             \
                        for (int64_t j = 0; j < inner; j++)                          \
                            po[j] = pa[j * sa] * pa[j * sa] * pa[j * sa];            \
                    break;                                                           \
                }                                                                    \
                for (int64_t j = 0; j < inner; j++)                                  \
                    po[j] = POWF(pa[j * sa], pb[j * sb]);                            \
                break;                                                               \
            case ADD:                                                                \
                BINARY_ROW(T, po[j] = a_ + b_);                                       \
                break;                                                               \
            case SUB:                                                                \
                BINARY_ROW(T, po[j] = a_ - b_);                                       \
                break;                                                               \
            case MUL:                                                                \
                BINARY_ROW(T, po[j] = a_ * b_);                                       \
                break;                                                               \
            default:                                                                 \
                for (int64_t j = 0; j < inner; j++)                                  \
                    po[j] = ARITH(T, kind, pa[j * sa], pb[j * sb]);                  \
            }                                                                        \
        });                                                                          \
    }                                                                                \
    AI_VECTOR_CLONES static void NAME(const bcast *b, int kind, T *y, const T *x0,   \
                                      const T *x1, int64_t lo, int64_t hi)           \
    {                                                                                \
        if (b->nd == 2 && kind <= DIV && b->shape[1] > 0) {                          \
            const int64_t W = b->shape[1], sa0 = b->st[0][0], sb0 = b->st[1][0];     \
            const int64_t sa = b->st[0][1], sb = b->st[1][1];                        \
            const int64_t r0 = (lo + W - 1) / W, r1 = hi / W; /* whole rows */      \
            if (r0 < r1) {                                                           \
                if (lo < r0 * W)                                                     \
                    NAME##_general(b, kind, y, x0, x1, lo, r0 * W);                 \
                switch (kind) {                                                      \
                case ADD: BINARY_ROWS(T, po[j] = a_ + b_); break;                    \
                case SUB: BINARY_ROWS(T, po[j] = a_ - b_); break;                    \
                case MUL: BINARY_ROWS(T, po[j] = a_ * b_); break;                    \
                default: BINARY_ROWS(T, po[j] = a_ / b_); break;                     \
                }                                                                    \
                if (r1 * W < hi)                                                     \
                    NAME##_general(b, kind, y, x0, x1, r1 * W, hi);                 \
                return;                                                              \
            }                                                                        \
        }                                                                            \
        NAME##_general(b, kind, y, x0, x1, lo, hi);                                  \
    }

DEFINE_FLOAT_FWD(fwd_f32, float, powf)
DEFINE_FLOAT_FWD(fwd_f64, double, pow)

/* integer arithmetic: Div truncates toward zero like ONNX (and C) */
static int64_t int_pow(int64_t a, int64_t e)
{
    if (e < 0)
        return a == 1 ? 1 : (a == -1 ? (e % 2 ? -1 : 1) : 0);
    uint64_t r = 1, base = (uint64_t)a;
    while (e) {
        if (e & 1)
            r *= base;
        base *= base;
        e >>= 1;
    }
    return (int64_t)r;
}

/* Integer elements of any width, widened to int64 / narrowed with wrap-around. */
static int64_t int_get(const void *data, ai_dtype dt, int64_t i)
{
    switch (dt) {
    case AI_I8: return ((const int8_t *)data)[i];
    case AI_U8: return ((const uint8_t *)data)[i];
    case AI_I16: return ((const int16_t *)data)[i];
    case AI_I32: return ((const int32_t *)data)[i];
    case AI_U16: return ((const uint16_t *)data)[i];
    case AI_U32: return ((const uint32_t *)data)[i];
    default: return ((const int64_t *)data)[i]; /* int64, uint64 (its bits) */
    }
}

static void int_set(void *data, ai_dtype dt, int64_t i, int64_t v)
{
    switch (dt) {
    case AI_I8: ((int8_t *)data)[i] = (int8_t)(uint8_t)(uint64_t)v; break;
    case AI_U8: ((uint8_t *)data)[i] = (uint8_t)(uint64_t)v; break;
    case AI_I16: ((int16_t *)data)[i] = (int16_t)(uint16_t)(uint64_t)v; break;
    case AI_I32: ((int32_t *)data)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case AI_U16: ((uint16_t *)data)[i] = (uint16_t)(uint64_t)v; break;
    case AI_U32: ((uint32_t *)data)[i] = (uint32_t)(uint64_t)v; break;
    default: ((int64_t *)data)[i] = v; break;
    }
}

static ai_status fwd_int(const ai_node *node, const bcast *b, int kind, ai_tensor *y,
                         const ai_tensor *x0, const ai_tensor *x1)
{
    const ai_dtype dt = y->dtype;
    /* uint64 in int64: the bits wrap alike; division, order and right
     * shifts read them unsigned (the narrower unsigned types widen to
     * non-negative values) */
    const bool u64 = dt == AI_U64;
    ai_status st = AI_OK;
    BCAST_LOOP(b, 0, bcast_total(b), {
        for (int64_t j = 0; j < inner; j++) {
            int64_t u = int_get(x0->data, dt, ra + j * sa);
            int64_t v = int_get(x1->data, dt, rb + j * sb);
            int64_t r;
            if (kind == DIV) {
                if (v == 0) {
                    st = ai_node_error(node, AI_ERR_VALUE, "integer division by zero");
                    r = 0;
                } else if (u64) {
                    r = (int64_t)((uint64_t)u / (uint64_t)v);
                } else {
                    r = (u == INT64_MIN && v == -1) ? INT64_MIN : u / v;
                }
            } else if (kind == MOD || kind == FMOD) {
                if (v == 0) {
                    st = ai_node_error(node, AI_ERR_VALUE, "integer modulo by zero");
                    r = 0;
                } else if (u64) {
                    r = (int64_t)((uint64_t)u % (uint64_t)v);
                } else {
                    r = v == -1 ? 0 : u % v; /* C: the sign of u (INT64_MIN % -1 is UB) */
                    if (kind == MOD && r != 0 && (r < 0) != (v < 0))
                        r += v; /* Python: the sign of v */
                }
            } else if (kind == PRELU) {
                r = u < 0 ? (int64_t)((uint64_t)u * (uint64_t)v) : u;
            } else if (kind == POW) {
                r = int_pow(u, v);
            } else if (kind == BIT_AND || kind == BIT_OR || kind == BIT_XOR) {
                r = kind == BIT_AND ? (u & v) : kind == BIT_OR ? (u | v) : (u ^ v);
            } else if (kind == SHIFT_LEFT || kind == SHIFT_RIGHT) {
                /* ONNX: a shift < 0 or >= the width leaves the sign fill alone
                 * (-1 for a negative x shifted right, else 0); right shifts are
                 * arithmetic (u8 widens to a non-negative value) */
                if ((uint64_t)v >= 8 * (uint64_t)ai_dtype_size(dt))
                    r = kind == SHIFT_RIGHT && u < 0 && !u64 ? -1 : 0;
                else if (kind == SHIFT_LEFT)
                    r = (int64_t)((uint64_t)u << v); /* narrowed by int_set */
                else if (u64)
                    r = (int64_t)((uint64_t)u >> v);
                else
                    r = u < 0 ? ~(~u >> v) : u >> v;
            } else { /* wrap around, never undefined behaviour */
                r = kind == ADD   ? (int64_t)((uint64_t)u + (uint64_t)v)
                    : kind == SUB ? (int64_t)((uint64_t)u - (uint64_t)v)
                    : kind == MUL ? (int64_t)((uint64_t)u * (uint64_t)v)
                    : u64 ? ((kind == MIN) == ((uint64_t)u < (uint64_t)v) ? u : v)
                    : kind == MIN ? (u < v ? u : v)
                                  : (u > v ? u : v);
            }
            int_set(y->data, dt, ro + j, r);
        }
    });
    return st;
}

/* NaN compares false, as in ONNX, numpy and torch: LessOrEqual is not Not(Greater). */
#define compare(kind, u, v)                                                              \
    ((kind) == EQUAL ? (u) == (v) : (kind) == LESS ? (u) < (v) : (kind) == GREATER ? (u) > (v) \
     : (kind) == LESS_EQUAL ? (u) <= (v) : (u) >= (v))

static ai_status compare_fwd(const bcast *b, int kind, ai_tensor *y, const ai_tensor *x0,
                             const ai_tensor *x1)
{
    uint8_t *o = y->data;
    const size_t isz = ai_dtype_size(x0->dtype);
    const char *pa = x0->data, *pb = x1->data;
    const bool flt = ai_dtype_is_float(x0->dtype);
    BCAST_LOOP(b, 0, bcast_total(b), {
        for (int64_t j = 0; j < inner; j++) {
            const char *ea = pa + (ra + j * sa) * (int64_t)isz;
            const char *eb = pb + (rb + j * sb) * (int64_t)isz;
            bool r;
            if (flt) {
                ai_tensor ta = {.dtype = x0->dtype, .data = (void *)ea};
                ai_tensor tb = {.dtype = x0->dtype, .data = (void *)eb};
                double u = ai_tensor_get_flat(&ta, 0), v = ai_tensor_get_flat(&tb, 0);
                r = compare(kind, u, v);
            } else if (kind >= AND) { /* bool */
                const bool u = *ea != 0, v = *eb != 0;
                r = kind == AND ? u && v : kind == OR ? u || v : u != v;
            } else {
                int64_t u = 0, v = 0;
                memcpy(&u, ea, isz); /* little-endian integers widen by copying */
                memcpy(&v, eb, isz);
                if (x0->dtype == AI_U64) {
                    const uint64_t uu = (uint64_t)u, uv = (uint64_t)v;
                    r = compare(kind, uu, uv);
                } else {
                    if (isz < 8 && !ai_dtype_is_unsigned(x0->dtype)) {
                        int shift = 64 - 8 * (int)isz; /* sign-extend */
                        u = (int64_t)((uint64_t)u << shift) >> shift;
                        v = (int64_t)((uint64_t)v << shift) >> shift;
                    }
                    r = compare(kind, u, v);
                }
            }
            o[ro + j] = r;
        }
    });
    return AI_OK;
}

/* Where's forward on output elements [lo, hi), ISZ bytes each (a constant
 * in the 4- and 8-byte instances: each copy is one move). */
#define DEFINE_WHERE(NAME, ISZ)                                                      \
    static void NAME(const bcast *b, char *o, const uint8_t *pc, const char *pa,    \
                     const char *pb, size_t isz, int64_t lo, int64_t hi)            \
    {                                                                                \
        (void)isz;                                                                   \
        /* operands: st[0] = condition, st[1] = x, st[2] = y */                      \
        BCAST_LOOP(b, lo, hi, {                                                      \
            for (int64_t j = 0; j < inner; j++) {                                    \
                const char *src = pc[ra + j * sa] ? pa + (rb + j * sb) * (int64_t)(ISZ) \
                                                  : pb + (rc + j * sc) * (int64_t)(ISZ); \
                memcpy(o + (ro + j) * (int64_t)(ISZ), src, ISZ);                     \
            }                                                                        \
        });                                                                          \
    }

DEFINE_WHERE(where_4, 4)
DEFINE_WHERE(where_8, 8)
DEFINE_WHERE(where_n, isz)

/* Where's forward on the thread pool, split by output element ranges (each
 * element a copy: the same values at any thread count). */
typedef struct {
    const bcast *b;
    char *o;
    const uint8_t *pc;
    const char *pa, *pb;
    size_t isz;
} where_job;

static void where_range(void *ctx, int64_t lo, int64_t hi)
{
    const where_job *j = ctx;
    if (j->isz == 4)
        where_4(j->b, j->o, j->pc, j->pa, j->pb, j->isz, lo, hi);
    else if (j->isz == 8)
        where_8(j->b, j->o, j->pc, j->pa, j->pb, j->isz, lo, hi);
    else
        where_n(j->b, j->o, j->pc, j->pa, j->pb, j->isz, lo, hi);
}

static ai_status where_fwd(const bcast *b, ai_tensor *y, const ai_tensor *cnd,
                           const ai_tensor *x0, const ai_tensor *x1)
{
    where_job j = {b, y->data, cnd->data, x0->data, x1->data, ai_dtype_size(y->dtype)};
    ai_parallel_for(bcast_total(b), AI_GRAIN_ELEMS, where_range, &j);
    return AI_OK;
}

/* g[i] = dy * d(out)/d(input `which`), in the output's shape. Mul, Div and
 * Sub's second input: rows of BINARY_ROW (the same products, vectorised).
 * Pow's base: dy * (e * x^(e - 1)) in torch's order; an exponent of 2 or 3
 * along the row as products (torch's x.pow(1) and x.pow(2): x and x * x),
 * vectorised: powf per element made GPT-2's tanh GELU (x^3) backward 40 ms
 * of 1M elements, a fifth of its training step's backward. */
#define DEFINE_GRAD(NAME, T, POWF, LOGF)                                             \
    AI_VECTOR_CLONES static void NAME(const bcast *b, int kind, int which, T *g,     \
                                      const T *dy, const T *x0, const T *x1,         \
                                      const T *y, const uint8_t *cnd, int64_t lo,    \
                                      int64_t hi)                                    \
    {                                                                                \
        BCAST_LOOP(b, lo, hi, {                                                      \
            const T *pa = x0 ? x0 + ra : NULL, *pb = x1 ? x1 + rb : NULL;            \
            const T *pd = dy + ro;                                                   \
            T *po = g + ro;                                                          \
            if (kind == MUL && which)                                                \
                BINARY_ROW(T, (void)b_; po[j] = pd[j] * a_);                           \
            else if (kind == MUL)                                                    \
                BINARY_ROW(T, (void)a_; po[j] = pd[j] * b_);                           \
            else if (kind == DIV && which)                                           \
                BINARY_ROW(T, po[j] = -pd[j] * ((a_ / b_) / b_));                     \
            else if (kind == DIV)                                                    \
                BINARY_ROW(T, (void)a_; po[j] = pd[j] / b_);                           \
            else if (kind == SUB && which)                                           \
                for (int64_t j = 0; j < inner; j++)                                  \
                    po[j] = -pd[j];                                                  \
            else if (kind == POW && !which && sb == 0 && pb[0] == 2)                 \
                for (int64_t j = 0; j < inner; j++) /* torch: dy * (2 * x) */        \
                    po[j] = pd[j] * (pb[0] * pa[j * sa]);                            \
            else if (kind == POW && !which && sb == 0 && pb[0] == 3)                 \
                for (int64_t j = 0; j < inner; j++) /* torch: dy * (3 * (x * x)) */  \
                    po[j] = pd[j] * (pb[0] * (pa[j * sa] * pa[j * sa]));             \
            else                                                                     \
            for (int64_t j = 0; j < inner; j++) {                                    \
                T d = dy[ro + j], r;                                                 \
                if (kind == WHERE) {                                                 \
                    bool t = cnd[ra + j * sa] != 0;                                  \
                    g[ro + j] = (which == 0) == t ? d : (T)0;                         \
                    continue;                                                        \
                }                                                                    \
                T a = x0[ra + j * sa], bb = x1[rb + j * sb];                         \
                switch (kind) {                                                      \
                case ADD: r = d; break;                                              \
                case SUB: r = which ? -d : d; break;                                 \
                case MUL: r = which ? d * a : d * bb; break;                         \
                case DIV: r = which ? -d * ((a / bb) / bb) : d / bb; break;          \
                case MOD: /* torch.remainder: d/dx1 = -floor(x0 / x1) */             \
                    r = which ? -d * (T)floor((double)(a / bb)) : d;                 \
                    break;                                                           \
                case FMOD: /* torch.fmod: d/dx1 = -trunc(x0 / x1) */                 \
                    r = which ? -d * (T)trunc((double)(a / bb)) : d;                 \
                    break;                                                           \
                case PRELU: /* torch.prelu: dy where x > 0; else slope dy, x dy */    \
                    r = a > 0 ? (which ? (T)0 : d) : (which ? a * d : bb * d);       \
                    break;                                                           \
                case POW:                                                            \
                    if (!which)                                                      \
                        r = bb == 0 ? (T)0 : d * (bb * POWF(a, bb - 1));             \
                    else                                                             \
                        r = (a == 0 && bb >= 0) ? (T)0 : d * y[ro + j] * LOGF(a);    \
                    break;                                                           \
                case MIN:                                                            \
                case MAX: {                                                          \
                    T self = which ? bb : a, other = which ? a : bb;                 \
                    bool wins = kind == MAX ? self > other : self < other;           \
                    r = self == other ? d / 2 : (wins || self != self ? d : (T)0);   \
                    break;                                                           \
                }                                                                    \
                default: r = 0;                                                      \
                }                                                                    \
                g[ro + j] = r;                                                       \
            }                                                                        \
        });                                                                          \
    }

DEFINE_GRAD(grad_f32, float, powf, logf)
DEFINE_GRAD(grad_f64, double, pow, log)

/* A float forward (which < 0) or gradient job, split by output element
 * ranges on the thread pool. */
typedef struct {
    const bcast *b;
    int kind, which;
    bool f64;
    void *out;
    const void *dy, *x0, *x1, *y;
    const uint8_t *cnd;
} binary_job;

static void binary_range(void *ctx, int64_t lo, int64_t hi)
{
    const binary_job *j = ctx;
    if (j->which < 0 && j->f64)
        fwd_f64(j->b, j->kind, j->out, j->x0, j->x1, lo, hi);
    else if (j->which < 0)
        fwd_f32(j->b, j->kind, j->out, j->x0, j->x1, lo, hi);
    else if (j->f64)
        grad_f64(j->b, j->kind, j->which, j->out, j->dy, j->x0, j->x1, j->y, j->cnd, lo, hi);
    else
        grad_f32(j->b, j->kind, j->which, j->out, j->dy, j->x0, j->x1, j->y, j->cnd, lo, hi);
}

static void binary_run(binary_job *j)
{
    ai_parallel_for(bcast_total(j->b), AI_GRAIN_ELEMS, binary_range, j);
}

/* ---------------------------------------------------------------- shape */

static ai_status binary_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const binary_params *p = c->node->params;
    const int kind = p->kind;
    const int first = kind == WHERE ? 1 : 0;
    const ai_tensor *a = c->in[first], *b = c->in[first + 1];
    if (kind == WHERE && c->in[0]->dtype != AI_BOOL)
        return ai_node_error(c->node, AI_ERR_TYPE, "condition is %s; bool expected",
                             ai_dtype_name(c->in[0]->dtype));
    if (kind >= AND && kind <= XOR && (a->dtype != AI_BOOL || b->dtype != AI_BOOL))
        return ai_node_error(c->node, AI_ERR_TYPE, "inputs are %s and %s; bool expected",
                             ai_dtype_name(a->dtype), ai_dtype_name(b->dtype));
    if (a->dtype != b->dtype && kind != POW)
        return ai_node_error(c->node, AI_ERR_TYPE, "inputs have different dtypes (%s and %s)",
                             ai_dtype_name(a->dtype), ai_dtype_name(b->dtype));
    ai_dtype dt = a->dtype;
    if (kind >= BIT_AND && kind <= SHIFT_RIGHT && (ai_dtype_is_float(dt) || dt == AI_BOOL))
        return ai_node_error(c->node, AI_ERR_TYPE, "dtype %s is not supported (integers)",
                             ai_dtype_name(dt));
    bool arith = kind <= SHIFT_RIGHT;
    if (arith && (ai_dtype_is_half(dt) || dt == AI_BOOL))
        return ai_node_error(c->node, AI_ERR_TYPE,
                             "dtype %s is not supported (float32, float64 and integers)",
                             ai_dtype_name(dt));
    int nd;
    int64_t shape[AI_MAX_DIMS];
    ai_status st = ai_broadcast_shape(c->node, a->ndim, a->shape, b->ndim, b->shape, &nd, shape);
    if (st)
        return st;
    if (kind == WHERE) {
        const ai_tensor *cn = c->in[0];
        int nd2;
        int64_t s2[AI_MAX_DIMS];
        if ((st = ai_broadcast_shape(c->node, cn->ndim, cn->shape, nd, shape, &nd2, s2)))
            return st;
        nd = nd2;
        memcpy(shape, s2, sizeof shape);
    }
    if (kind == PRELU && (nd != a->ndim || memcmp(shape, a->shape, sizeof *shape * (size_t)nd)))
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "slope of rank %d does not broadcast to X's shape (rank %d)",
                             b->ndim, a->ndim);
    out[0].dtype = (kind >= EQUAL && kind <= XOR) ? AI_BOOL : dt;
    out[0].ndim = nd;
    memcpy(out[0].shape, shape, sizeof shape);
    /* backward scratch: one output-shaped gradient */
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    *ws = (size_t)n * ai_dtype_size(dt);
    return AI_OK;
}

/* Pow's exponent may have another dtype than the base: convert it. */
static ai_status pow_exponent(ai_ctx *c, ai_tensor **tmp)
{
    *tmp = NULL;
    if (c->in[1]->dtype == c->in[0]->dtype)
        return AI_OK;
    ai_status st = ai_tensor_new(tmp, c->in[0]->dtype, c->in[1]->ndim, c->in[1]->shape);
    if (!st && (st = ai_tensor_copy(*tmp, c->in[1])) == AI_OK)
        c->in[1] = *tmp;
    return st;
}

static ai_status binary_backward(ai_ctx *c);
static ai_status binary_forward(ai_ctx *c);

/* Pow of an integer base to a float exponent: in float64, the result
 * converted to the base's dtype (truncated, as numpy's astype). */
static ai_status pow_int_float(ai_ctx *c)
{
    ai_tensor *x = c->in[0], *y = c->out[0], *x64 = NULL, *y64 = NULL;
    ai_status st;
    if (!(st = ai_tensor_new(&x64, AI_F64, x->ndim, x->shape)) && !(st = ai_tensor_copy(x64, x)) &&
        !(st = ai_tensor_new(&y64, AI_F64, y->ndim, y->shape))) {
        c->in[0] = x64;
        c->out[0] = y64;
        st = binary_forward(c);
        c->in[0] = x;
        c->out[0] = y;
        if (!st)
            st = ai_tensor_copy(y, y64);
    }
    ai_tensor_free(x64);
    ai_tensor_free(y64);
    return st;
}

static ai_status binary_forward(ai_ctx *c)
{
    const int kind = ((const binary_params *)c->node->params)->kind;
    bcast b;
    if (kind == POW && !ai_dtype_is_float(c->in[0]->dtype) && ai_dtype_is_float(c->in[1]->dtype))
        return pow_int_float(c);
    if (kind == POW && c->in[1]->dtype != c->in[0]->dtype) {
        ai_tensor *tmp, *orig = c->in[1];
        ai_status st = pow_exponent(c, &tmp);
        if (!st)
            st = binary_forward(c);
        c->in[1] = orig;
        ai_tensor_free(tmp);
        return st;
    }
    if (kind == WHERE) {
        bcast_init(&b, c->out[0], (const ai_tensor *const *)c->in, 3);
        return where_fwd(&b, c->out[0], c->in[0], c->in[1], c->in[2]);
    }
    bcast_init(&b, c->out[0], (const ai_tensor *const *)c->in, 2);
    if (kind >= EQUAL)
        return compare_fwd(&b, kind, c->out[0], c->in[0], c->in[1]);
    if (!ai_dtype_is_float(c->out[0]->dtype))
        return fwd_int(c->node, &b, kind, c->out[0], c->in[0], c->in[1]);
    binary_job j = {.b = &b, .kind = kind, .which = -1, .f64 = c->out[0]->dtype == AI_F64,
                    .out = c->out[0]->data, .x0 = c->in[0]->data, .x1 = c->in[1]->data};
    binary_run(&j);
    return AI_OK;
}

/* ---------------------------------------------------------------- backward */

static ai_status binary_backward(ai_ctx *c)
{
    const int kind = ((const binary_params *)c->node->params)->kind;
    if (kind >= EQUAL && kind != WHERE)
        return AI_OK;
    const int first = kind == WHERE ? 1 : 0;
    if (kind == POW && c->in[1]->dtype != c->in[0]->dtype) {
        ai_tensor *tmp, *orig = c->in[1], *dexp = c->din[1];
        ai_status st = pow_exponent(c, &tmp);
        c->din[1] = NULL; /* no gradient for an exponent of another dtype */
        if (!st)
            st = binary_backward(c);
        c->in[1] = orig;
        c->din[1] = dexp;
        ai_tensor_free(tmp);
        return st;
    }
    bcast b;
    const ai_tensor *ops[3] = {c->in[0], c->in[1], kind == WHERE ? c->in[2] : c->in[0]};
    bcast_init(&b, c->out[0], ops, kind == WHERE ? 3 : 2);
    for (int which = 0; which < 2; which++) {
        ai_tensor *din = c->din[first + which];
        if (!din)
            continue;
        const bool direct = din->ndim == c->out[0]->ndim &&
                            ai_tensor_numel(din) == ai_tensor_numel(c->out[0]);
        const bool assign = c->din_assign[first + which];
        ai_tensor g = *c->out[0];
        g.dtype = din->dtype;
        if (kind == ADD || (kind == SUB && which == 0)) { /* the gradient is dy itself */
            g.data = c->dout[0]->data;
            if (direct)
                ai_accumulate(din, &g, assign);
            else
                ai_reduce_to(din, &g, assign);
            continue;
        }
        g.data = direct && assign ? din->data : c->workspace;
        const void *x0 = kind == WHERE ? NULL : c->in[0]->data;
        const void *x1 = kind == WHERE ? NULL : c->in[1]->data;
        const uint8_t *cnd = kind == WHERE ? c->in[0]->data : NULL;
        binary_job j = {.b = &b, .kind = kind, .which = which, .f64 = din->dtype == AI_F64,
                        .out = g.data, .dy = c->dout[0]->data, .x0 = x0, .x1 = x1,
                        .y = c->out[0]->data, .cnd = cnd};
        binary_run(&j);
        if (direct && !assign)
            ai_accumulate(din, &g, false);
        else if (!direct)
            ai_reduce_to(din, &g, assign);
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- n-ary Min / Max */

/* Min and Max with other than two inputs, Sum and Mean: each output element
 * reads every input through its broadcast strides. Min/Max backward gives dy
 * to the inputs equal to the result, split evenly among ties (two inputs:
 * torch's maximum rule); Sum gives dy to every input, Mean dy / n (floats
 * only, the sum in double divided once). */
static ai_status nary_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    ai_dtype dt = c->in[0]->dtype;
    int nd = c->in[0]->ndim;
    int64_t shape[AI_MAX_DIMS];
    memcpy(shape, c->in[0]->shape, sizeof shape);
    for (int k = 1; k < c->n_in; k++) {
        if (c->in[k]->dtype != dt)
            return ai_node_error(c->node, AI_ERR_TYPE, "inputs have different dtypes (%s and %s)",
                                 ai_dtype_name(dt), ai_dtype_name(c->in[k]->dtype));
        int64_t s2[AI_MAX_DIMS];
        ai_status st = ai_broadcast_shape(c->node, nd, shape, c->in[k]->ndim, c->in[k]->shape,
                                          &nd, s2);
        if (st)
            return st;
        memcpy(shape, s2, sizeof shape);
    }
    const bool mean = ((const binary_params *)c->node->params)->kind == MEAN;
    if (ai_dtype_is_half(dt) || dt == AI_BOOL || (mean && !ai_dtype_is_float(dt)))
        return ai_node_error(c->node, AI_ERR_TYPE, "dtype %s is not supported",
                             ai_dtype_name(dt));
    out[0].dtype = dt;
    out[0].ndim = nd;
    memcpy(out[0].shape, shape, sizeof shape);
    return AI_OK;
}

/* Offset in input k of output element i. */
static int64_t nary_offset(const ai_tensor *out, const int64_t *strides, int64_t i)
{
    int64_t off = 0;
    for (int d = out->ndim - 1; d >= 0; d--) {
        off += (i % out->shape[d]) * strides[d];
        i /= out->shape[d];
    }
    return off;
}

static double nary_get(const ai_tensor *t, int64_t off)
{
    switch (t->dtype) {
    case AI_F32: return ((const float *)t->data)[off];
    case AI_F64: return ((const double *)t->data)[off];
    case AI_U64: return (double)(uint64_t)int_get(t->data, t->dtype, off);
    default: return (double)int_get(t->data, t->dtype, off);
    }
}

static ai_status nary_forward(ai_ctx *c)
{
    const int kind = ((const binary_params *)c->node->params)->kind;
    const bool is_max = kind == MAX;
    ai_tensor *y = c->out[0];
    int64_t st[AI_MAX_IO][AI_MAX_DIMS];
    for (int k = 0; k < c->n_in; k++)
        ai_broadcast_strides(c->in[k]->ndim, c->in[k]->shape, y->ndim, y->shape, st[k]);
    const int64_t n = ai_tensor_numel(y);
    if (kind == SUM || kind == MEAN) {
        for (int64_t i = 0; i < n; i++) {
            double acc = 0;
            int64_t iacc = 0;
            for (int k = 0; k < c->n_in; k++) {
                int64_t off = nary_offset(y, st[k], i);
                if (ai_dtype_is_float(y->dtype))
                    acc += nary_get(c->in[k], off);
                else
                    iacc = (int64_t)((uint64_t)iacc + (uint64_t)int_get(c->in[k]->data,
                                                                         y->dtype, off));
            }
            if (kind == MEAN)
                acc /= c->n_in;
            if (y->dtype == AI_F32)
                ((float *)y->data)[i] = (float)acc;
            else if (y->dtype == AI_F64)
                ((double *)y->data)[i] = acc;
            else
                int_set(y->data, y->dtype, i, iacc);
        }
        return AI_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        int best_i = 0;
        double best = nary_get(c->in[0], nary_offset(y, st[0], i));
        for (int k = 1; k < c->n_in && best == best; k++) { /* a NaN wins */
            double v = nary_get(c->in[k], nary_offset(y, st[k], i));
            if (v != v || (is_max ? v > best : v < best)) {
                best = v;
                best_i = k;
            }
        }
        const ai_tensor *src = c->in[best_i];
        const size_t isz = ai_dtype_size(y->dtype);
        memcpy((char *)y->data + i * (int64_t)isz,
               (const char *)src->data + nary_offset(y, st[best_i], i) * (int64_t)isz, isz);
    }
    return AI_OK;
}

static ai_status nary_backward(ai_ctx *c)
{
    const ai_tensor *y = c->out[0];
    int64_t st[AI_MAX_IO][AI_MAX_DIMS];
    for (int k = 0; k < c->n_in; k++)
        ai_broadcast_strides(c->in[k]->ndim, c->in[k]->shape, y->ndim, y->shape, st[k]);
    const int64_t n = ai_tensor_numel(y);
    const int kind = ((const binary_params *)c->node->params)->kind;
    const bool sum = kind == SUM || kind == MEAN;
    for (int64_t i = 0; i < n; i++) {
        const double yv = nary_get(y, i);
        const double dy = nary_get(c->dout[0], i) / (kind == MEAN ? c->n_in : 1);
        if (sum) {
            for (int k = 0; k < c->n_in; k++) {
                if (!c->din[k])
                    continue;
                int64_t off = nary_offset(y, st[k], i);
                if (c->din[k]->dtype == AI_F32)
                    ((float *)c->din[k]->data)[off] += (float)dy;
                else
                    ((double *)c->din[k]->data)[off] += dy;
            }
            continue;
        }
        int ties = 0;
        for (int k = 0; k < c->n_in; k++) {
            double v = nary_get(c->in[k], nary_offset(y, st[k], i));
            ties += v == yv || (v != v && yv != yv);
        }
        for (int k = 0; k < c->n_in; k++) {
            if (!c->din[k])
                continue;
            int64_t off = nary_offset(y, st[k], i);
            double v = nary_get(c->in[k], off);
            if (!(v == yv || (v != v && yv != yv)))
                continue;
            if (c->din[k]->dtype == AI_F32)
                ((float *)c->din[k]->data)[off] += (float)(dy / ties);
            else
                ((double *)c->din[k]->data)[off] += dy / ties;
        }
    }
    return AI_OK;
}

/* Two-input Min/Max take the fast broadcasting path. */
static bool pairwise(const ai_ctx *c)
{
    const int kind = ((const binary_params *)c->node->params)->kind;
    return c->n_in == 2 && kind != SUM && kind != MEAN;
}

static ai_status minmax_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    return pairwise(c) ? binary_shape(c, out, ws, state) : nary_shape(c, out, ws, state);
}

static ai_status minmax_forward(ai_ctx *c)
{
    return pairwise(c) ? binary_forward(c) : nary_forward(c);
}

static ai_status minmax_backward(ai_ctx *c)
{
    return pairwise(c) ? binary_backward(c) : nary_backward(c);
}

static ai_status binary_init(ai_node *n)
{
    /* by kind; FMOD is Mod with fmod = 1, SHIFT_RIGHT BitShift "RIGHT" */
    static const char *names[] = {"Add",  "Sub",   "Mul",     "Div", "Pow", "Min",
                                  "Max",  "Mod",   NULL,      "PRelu", "BitwiseAnd",
                                  "BitwiseOr", "BitwiseXor", "BitShift", NULL, "Equal", "Less",
                                  "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
                                  "Xor", "Where", "Sum", "Mean"};
    binary_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    for (int k = 0; k <= MEAN; k++)
        if (names[k] && strcmp(n->op_type, names[k]) == 0)
            p->kind = k;
    int64_t fmod = 0;
    ai_status st = p->kind == MOD ? ai_attr_int(n, "fmod", 0, &fmod) : AI_OK;
    if (!st && fmod != 0 && fmod != 1)
        return ai_node_error(n, AI_ERR_VALUE, "fmod is %lld; 0 or 1 expected", (long long)fmod);
    if (fmod)
        p->kind = FMOD;
    const char *dir;
    if (!st && p->kind == SHIFT_LEFT && (st = ai_attr_string(n, "direction", "", &dir)) == AI_OK) {
        if (strcmp(dir, "RIGHT") == 0)
            p->kind = SHIFT_RIGHT;
        else if (strcmp(dir, "LEFT") != 0)
            return ai_node_error(n, AI_ERR_VALUE, "direction='%s'; 'LEFT' or 'RIGHT' expected",
                                 dir);
    }
    return st;
}

#define BINARY_OP(VAR, NAME, NIN, FLAGS, BWD)                                           \
    static const ai_op_def VAR = {NAME, "", NIN, NIN, 1, 1, FLAGS, binary_init,           \
                                  binary_shape, binary_forward, BWD};

/* Pow assigns its base's gradient only: an exponent of another dtype gets
 * none. The gradients of Add and Sub are dy and -dy: their backward reads
 * no value; those of Mul, Div, Mod and PRelu read the inputs, not the
 * output (Pow's exponent gradient alone reads y): the output need not stay
 * for backward, and the torch bridge need not save it. */
#define BWD_NONE (AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y)
#define UNS AI_OP_UNSIGNED
#define DY_ADD (AI_OP_GRAD_IS_DY(0) | AI_OP_GRAD_IS_DY(1))
#define X_ONLY (AI_OP_GRAD_ASSIGN(2) | AI_OP_BWD_NO_Y)
BINARY_OP(op_add, "Add", 2, AI_OP_GRAD_ASSIGN(2) | BWD_NONE | UNS | DY_ADD, binary_backward)
BINARY_OP(op_sub, "Sub", 2, AI_OP_GRAD_ASSIGN(2) | BWD_NONE | UNS | AI_OP_GRAD_IS_DY(0),
          binary_backward)
BINARY_OP(op_mul, "Mul", 2, X_ONLY | UNS, binary_backward)
BINARY_OP(op_div, "Div", 2, X_ONLY | UNS, binary_backward)
BINARY_OP(op_pow, "Pow", 2, AI_OP_GRAD_ASSIGN(1) | UNS, binary_backward)
BINARY_OP(op_mod, "Mod", 2, X_ONLY | UNS, binary_backward)
BINARY_OP(op_prelu, "PRelu", 2, X_ONLY, binary_backward)
static const ai_op_def op_min = {"Min", "", 1, AI_MAX_IO, 1, 1, UNS, binary_init, minmax_shape,
                                 minmax_forward, minmax_backward};
static const ai_op_def op_max = {"Max", "", 1, AI_MAX_IO, 1, 1, UNS, binary_init, minmax_shape,
                                 minmax_forward, minmax_backward};
static const ai_op_def op_sum = {"Sum", "", 1, AI_MAX_IO, 1, 1, UNS, binary_init, minmax_shape,
                                 minmax_forward, minmax_backward};
static const ai_op_def op_mean = {"Mean", "", 1, AI_MAX_IO, 1, 1, UNS, binary_init, minmax_shape,
                                  minmax_forward, minmax_backward};
BINARY_OP(op_bitwise_and, "BitwiseAnd", 2, UNS, NULL)
BINARY_OP(op_bitwise_or, "BitwiseOr", 2, UNS, NULL)
BINARY_OP(op_bitwise_xor, "BitwiseXor", 2, UNS, NULL)
BINARY_OP(op_bit_shift, "BitShift", 2, UNS, NULL)
BINARY_OP(op_equal, "Equal", 2, UNS, NULL)
BINARY_OP(op_less, "Less", 2, UNS, NULL)
BINARY_OP(op_greater, "Greater", 2, UNS, NULL)
BINARY_OP(op_less_equal, "LessOrEqual", 2, UNS, NULL)
BINARY_OP(op_greater_equal, "GreaterOrEqual", 2, UNS, NULL)
BINARY_OP(op_and, "And", 2, 0, NULL)
BINARY_OP(op_or, "Or", 2, 0, NULL)
BINARY_OP(op_xor, "Xor", 2, 0, NULL)
BINARY_OP(op_where, "Where", 3, AI_OP_GRAD_ASSIGN(3) | AI_OP_ANY_DTYPE, binary_backward)

const ai_op_def *const ai_ops_binary[] = {
    &op_add, &op_sub, &op_mul, &op_div, &op_pow, &op_min, &op_max, &op_mod, &op_prelu,
    &op_sum, &op_equal, &op_less, &op_greater, &op_less_equal, &op_greater_equal, &op_and,
    &op_or, &op_xor, &op_where, &op_mean, &op_bitwise_and, &op_bitwise_or, &op_bitwise_xor,
    &op_bit_shift, NULL,
};
