/*
 * aidge.h — public C API of the aidge_interop engine core.
 *
 * The core is plain C11 and knows nothing of Python: the CPython binding
 * (python/) and the C unit tests (tests/) are its two clients.
 *
 * Conventions
 *   - Every fallible function returns an ai_status. On failure a message is
 *     left in a thread-local buffer (ai_last_error()); nothing is printed and
 *     the process is never terminated.
 *   - Strides are counted in elements, not bytes, and may be negative or
 *     zero. A tensor's `data` points at its element (0, ..., 0).
 *   - Memory lives in a reference-counted ai_storage: owned (allocated here,
 *     64-byte aligned) or borrowed (someone else's memory, with a release
 *     callback that runs when the last tensor using it is freed).
 */
#ifndef AIDGE_H
#define AIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum {
    AI_OK = 0,
    AI_ERR_VALUE,           /* bad value: shape, stride, attribute, argument */
    AI_ERR_TYPE,            /* bad or unsupported dtype */
    AI_ERR_NOMEM,           /* allocation failed or size overflow */
    AI_ERR_NOT_IMPLEMENTED, /* valid but unsupported (operator, dtype, mode) */
    AI_ERR_INDEX,           /* index out of range */
    AI_ERR_RUNTIME,         /* anything else */
    AI_STATUS_COUNT
} ai_status;

/* Sets the thread's error message (printf-style) and returns `status`. */
ai_status ai_error(ai_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* The last message set on this thread ("" if none). */
const char *ai_last_error(void);
const char *ai_status_name(ai_status status);

/* ---------------------------------------------------------------- dtypes */

typedef enum {
    AI_F32 = 0,
    AI_F64,
    AI_F16,
    AI_I8,
    AI_U8,
    AI_I16,
    AI_I32,
    AI_I64,
    AI_BOOL,
    AI_BF16,
    AI_U16,
    AI_U32,
    AI_U64,
    /* the 8-bit floats of ONNX (and ml_dtypes / torch): sign, exponent and
     * mantissa bits, "FN" without infinities, "UZ" with a single NaN (0x80)
     * and no -0; E8M0 an unsigned power of two (MX scales) */
    AI_F8E4M3FN,
    AI_F8E4M3FNUZ,
    AI_F8E5M2,
    AI_F8E5M2FNUZ,
    AI_F8E8M0,
    /* the sub-byte types, one element per byte (unpacked, as ml_dtypes
     * stores them): the value in the low bits, two's complement for the
     * signed ones, the high bits zero */
    AI_I4,
    AI_U4,
    AI_I2,
    AI_U2,
    AI_F4E2M1,
    AI_DTYPE_COUNT
} ai_dtype;

size_t ai_dtype_size(ai_dtype dtype);       /* 0 for an invalid dtype */
const char *ai_dtype_name(ai_dtype dtype);  /* "float32", ...; "?" if invalid */
/* Looks a dtype up by name ("float32", ...); AI_ERR_TYPE if unknown. */
ai_status ai_dtype_from_name(const char *name, ai_dtype *out);
bool ai_dtype_is_float(ai_dtype dtype);
/* float16 or bfloat16: stored in 16 bits, computed in float32 (plan.c) */
bool ai_dtype_is_half(ai_dtype dtype);
/* uint8/16/32/64, uint4, uint2 (and bool) */
bool ai_dtype_is_unsigned(ai_dtype dtype);
/* The types kept and converted but not computed on (Cast first): the 8- and
 * 4-bit floats and the 4- and 2-bit integers. */
bool ai_dtype_is_storage(ai_dtype dtype);

/* How a conversion to an 8-bit float treats what the format cannot hold
 * (ONNX Cast's attributes): `saturate` clamps to the largest finite value
 * (else infinity or NaN, by the format); `e8m0_round` rounds to float8 E8M0
 * up (ONNX's default), down or to the nearest. */
typedef enum { AI_ROUND_UP = 0, AI_ROUND_DOWN, AI_ROUND_NEAREST } ai_round_mode;
typedef struct {
    bool saturate;
    ai_round_mode e8m0_round;
} ai_convert_mode;
#define AI_CONVERT_DEFAULT ((ai_convert_mode){true, AI_ROUND_UP})

/* A value of a small float type (float8 formats, float4 E2M1) from its bits,
 * and back, rounding to nearest even (E8M0: per mode.e8m0_round). */
double ai_small_float_to_f64(uint8_t bits, ai_dtype dtype);
uint8_t ai_f64_to_small_float(double v, ai_dtype dtype, ai_convert_mode mode);

/* IEEE 754 binary16 <-> binary32, round to nearest even. */
float ai_f16_to_f32(uint16_t h);
uint16_t ai_f32_to_f16(float f);
/* bfloat16 (the top half of a binary32) <-> binary32: exact one way, round
 * to nearest even the other; NaN stays NaN (quiet, its sign kept). */
float ai_bf16_to_f32(uint16_t h);
uint16_t ai_f32_to_bf16(float f);
/* n elements of a half dtype (AI_F16 or AI_BF16) to float32 and back */
void ai_half_to_f32(ai_dtype dtype, const uint16_t *src, float *dst, int64_t n);
void ai_f32_to_half(ai_dtype dtype, const float *src, uint16_t *dst, int64_t n);

/* ---------------------------------------------------------------- storage */

#define AI_MAX_DIMS 32
#define AI_ALIGN 64

typedef void (*ai_release_fn)(void *ctx);

typedef struct ai_storage ai_storage;

/* ---------------------------------------------------------------- tensor */

enum { AI_TENSOR_READONLY = 1 };

typedef struct ai_tensor {
    ai_dtype dtype;
    int ndim;
    int flags;                     /* AI_TENSOR_READONLY */
    int64_t shape[AI_MAX_DIMS];
    int64_t strides[AI_MAX_DIMS];  /* in elements */
    void *data;                    /* element (0, ..., 0); NULL if empty */
    ai_storage *storage;           /* shared, reference-counted */
} ai_tensor;

/* A new contiguous tensor owning zero-filled memory. */
ai_status ai_tensor_new(ai_tensor **out, ai_dtype dtype, int ndim,
                        const int64_t *shape);
/* The same with uninitialised memory, for a result written in full next. */
ai_status ai_tensor_new_uninit(ai_tensor **out, ai_dtype dtype, int ndim,
                               const int64_t *shape);

/*
 * A tensor over memory the caller owns. `strides` may be NULL (contiguous).
 * `release(ctx)` runs exactly once, when the last tensor sharing this memory
 * is freed — also when this call fails. `release` may be NULL.
 * Validates dtype, rank, shape (>= 0, no overflow) and, unless
 * `allow_overlap`, that no two indices address the same element.
 */
ai_status ai_tensor_borrow(ai_tensor **out, void *data, ai_dtype dtype,
                           int ndim, const int64_t *shape,
                           const int64_t *strides, int flags,
                           bool allow_overlap, ai_release_fn release,
                           void *ctx);

/* A new tensor sharing `src`'s storage (same shape, strides and data). */
ai_status ai_tensor_share(ai_tensor **out, const ai_tensor *src);
/* `dst` becomes a view of `src`'s storage, as ai_tensor_share makes one, in
 * the header it already has: its previous storage loses a reference. */
void ai_tensor_reshare(ai_tensor *dst, const ai_tensor *src);
/* True when `t` holds the only reference to memory of its own: no other
 * tensor (nor a view exported from one) reads or writes it. */
bool ai_tensor_unshared(const ai_tensor *t);

/* A new contiguous tensor owning a copy of `src`'s values. */
ai_status ai_tensor_clone(ai_tensor **out, const ai_tensor *src);

/* Copies values between tensors of equal shape, converting dtypes by ONNX
 * Cast's rules (AI_CONVERT_DEFAULT). */
ai_status ai_tensor_copy(ai_tensor *dst, const ai_tensor *src);
/* The same with the conversion to 8-bit floats chosen. */
ai_status ai_tensor_convert(ai_tensor *dst, const ai_tensor *src, ai_convert_mode mode);

void ai_tensor_free(ai_tensor *t); /* NULL is a no-op */

int64_t ai_tensor_numel(const ai_tensor *t);
size_t ai_tensor_nbytes(const ai_tensor *t); /* numel * itemsize */
bool ai_tensor_is_contiguous(const ai_tensor *t);
/* True when two different indices can address the same element. */
bool ai_tensor_overlaps(const ai_tensor *t);
/* Value of the element at flat (row-major) position i, as a double. */
double ai_tensor_get_flat(const ai_tensor *t, int64_t i);
/* The same, exact for int64 (floats saturate, NaN gives 0). */
int64_t ai_tensor_get_flat_i64(const ai_tensor *t, int64_t i);

/* Checks shape/strides and returns numel; AI_ERR_VALUE / AI_ERR_NOMEM. */
ai_status ai_shape_check(int ndim, const int64_t *shape, size_t itemsize,
                         int64_t *numel_out);
/* Row-major strides (in elements) for `shape`. */
void ai_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* Diagnostics: live tensors and bytes of owned storage in this process. */
int64_t ai_debug_live_tensors(void);
int64_t ai_debug_live_storages(void);
int64_t ai_debug_owned_bytes(void);

/* ---------------------------------------------------------------- compare */

/* Closeness of two tensors (compare.c), the torch.testing.assert_close rule:
 * a pair is close when equal (so inf == inf), when both are NaN and
 * `equal_nan`, or when |actual - expected| is finite and
 * <= atol + rtol * |expected|. The greatest differences are taken over the
 * mismatched elements if any, else over all; indices are flat (row-major),
 * -1 for an empty tensor. */
typedef struct {
    int64_t numel;
    int64_t mismatches;
    double max_abs_diff;
    int64_t max_abs_index;
    double max_rel_diff; /* |actual - expected| / |expected| */
    int64_t max_rel_index;
} ai_compare_result;

/* One pass over both tensors, any strides. Same shape and dtype required,
 * and rtol, atol >= 0 (AI_ERR_VALUE otherwise). */
ai_status ai_compare(const ai_tensor *actual, const ai_tensor *expected, double rtol,
                     double atol, bool equal_nan, ai_compare_result *out);

#ifdef __cplusplus
}
#endif
#endif /* AIDGE_H */
