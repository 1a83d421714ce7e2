/*
 * tensor.c — strided, typed tensors over reference-counted storage.
 *
 * A tensor is a view: dtype, shape, element strides and a pointer to its
 * first element, plus a reference to the storage that owns (or borrows) the
 * memory. Several tensors may share one storage; the memory goes away with
 * the last of them.
 */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "aidge.h"

/* ---------------------------------------------------------------- dtypes */

static const struct {
    const char *name;
    size_t size;
    bool is_float, is_unsigned, storage;
} dtype_info[] = {
    [AI_F32] = {"float32", 4, true, false, false},
    [AI_F64] = {"float64", 8, true, false, false},
    [AI_F16] = {"float16", 2, true, false, false},
    [AI_I8] = {"int8", 1, false, false, false},
    [AI_U8] = {"uint8", 1, false, true, false},
    [AI_I16] = {"int16", 2, false, false, false},
    [AI_I32] = {"int32", 4, false, false, false},
    [AI_I64] = {"int64", 8, false, false, false},
    [AI_BOOL] = {"bool", 1, false, true, false},
    [AI_BF16] = {"bfloat16", 2, true, false, false},
    [AI_U16] = {"uint16", 2, false, true, false},
    [AI_U32] = {"uint32", 4, false, true, false},
    [AI_U64] = {"uint64", 8, false, true, false},
    [AI_F8E4M3FN] = {"float8_e4m3fn", 1, true, false, true},
    [AI_F8E4M3FNUZ] = {"float8_e4m3fnuz", 1, true, false, true},
    [AI_F8E5M2] = {"float8_e5m2", 1, true, false, true},
    [AI_F8E5M2FNUZ] = {"float8_e5m2fnuz", 1, true, false, true},
    [AI_F8E8M0] = {"float8_e8m0fnu", 1, true, false, true},
    [AI_I4] = {"int4", 1, false, false, true},
    [AI_U4] = {"uint4", 1, false, true, true},
    [AI_I2] = {"int2", 1, false, false, true},
    [AI_U2] = {"uint2", 1, false, true, true},
    [AI_F4E2M1] = {"float4_e2m1fn", 1, true, false, true},
};
_Static_assert(sizeof dtype_info / sizeof dtype_info[0] == AI_DTYPE_COUNT,
               "one entry per dtype");

static bool dtype_valid(ai_dtype dt) { return (unsigned)dt < AI_DTYPE_COUNT; }

size_t ai_dtype_size(ai_dtype dt) { return dtype_valid(dt) ? dtype_info[dt].size : 0; }

const char *ai_dtype_name(ai_dtype dt) { return dtype_valid(dt) ? dtype_info[dt].name : "?"; }

bool ai_dtype_is_float(ai_dtype dt) { return dtype_valid(dt) && dtype_info[dt].is_float; }

bool ai_dtype_is_half(ai_dtype dt) { return dt == AI_F16 || dt == AI_BF16; }

bool ai_dtype_is_unsigned(ai_dtype dt) { return dtype_valid(dt) && dtype_info[dt].is_unsigned; }

bool ai_dtype_is_storage(ai_dtype dt) { return dtype_valid(dt) && dtype_info[dt].storage; }

ai_status ai_dtype_from_name(const char *name, ai_dtype *out)
{
    for (int i = 0; i < AI_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (ai_dtype)i;
            return AI_OK;
        }
    }
    return ai_error(AI_ERR_TYPE, "unknown dtype '%s'", name);
}

/* ---------------------------------------------------------------- float16 */

float ai_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            uint32_t e = 0;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                e++;
            }
            bits = sign | ((127u - 14u - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t ai_f32_to_f16(float f)
{
    const uint32_t f32_inf = 255u << 23;
    const uint32_t f16_overflow = (127u + 16u) << 23; /* 2^16 */
    const uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= f16_overflow) {
        o = x > f32_inf ? 0x7e00u : 0x7c00u; /* NaN stays NaN, else inf */
    } else if (x < (113u << 23)) {
        /* result is subnormal or zero: let the FPU round, adding a magic
         * number that aligns the half's last mantissa bit with the float's */
        float fx, magic;
        memcpy(&fx, &x, sizeof fx);
        memcpy(&magic, &magic_bits, sizeof magic);
        fx += magic;
        uint32_t r;
        memcpy(&r, &fx, sizeof r);
        o = (uint16_t)(r - magic_bits);
    } else {
        uint32_t mant_odd = (x >> 13) & 1u;
        x += ((uint32_t)(15 - 127) << 23) + 0xfffu; /* rebias, round half */
        x += mant_odd;                              /* ... to even */
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* ---------------------------------------------------------------- bfloat16 */

float ai_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t ai_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncating could make it inf */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u); /* round half to even (overflow gives inf) */
    return (uint16_t)(x >> 16);
}

void ai_half_to_f32(ai_dtype dtype, const uint16_t *src, float *dst, int64_t n)
{
    if (dtype == AI_BF16)
        for (int64_t i = 0; i < n; i++)
            dst[i] = ai_bf16_to_f32(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = ai_f16_to_f32(src[i]);
}

void ai_f32_to_half(ai_dtype dtype, const float *src, uint16_t *dst, int64_t n)
{
    if (dtype == AI_BF16)
        for (int64_t i = 0; i < n; i++)
            dst[i] = ai_f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = ai_f32_to_f16(src[i]);
}

/* ---------------------------------------------------------------- small floats */

/* The minifloats: exponent and mantissa bits, bias, largest finite value
 * and what the format keeps for NaN and infinity. */
enum { MF_IEEE, MF_FN, MF_FNUZ, MF_NONE };
static const struct {
    int ebits, mbits, bias, kind;
    double max;
} minifloat[] = {
    [AI_F8E4M3FN] = {4, 3, 7, MF_FN, 448.0},      /* NaN: S.1111.111, no inf */
    [AI_F8E4M3FNUZ] = {4, 3, 8, MF_FNUZ, 240.0},  /* NaN: 0x80, no inf, no -0 */
    [AI_F8E5M2] = {5, 2, 15, MF_IEEE, 57344.0},   /* IEEE: inf and NaNs */
    [AI_F8E5M2FNUZ] = {5, 2, 16, MF_FNUZ, 57344.0},
    [AI_F4E2M1] = {2, 1, 1, MF_NONE, 6.0},        /* no inf, no NaN */
};

double ai_small_float_to_f64(uint8_t bits, ai_dtype dt)
{
    if (dt == AI_F8E8M0) /* 2^(e - 127); 0xff is NaN */
        return bits == 0xff ? NAN : ldexp(1.0, (int)bits - 127);
    const int e = minifloat[dt].ebits, m = minifloat[dt].mbits, kind = minifloat[dt].kind;
    const unsigned emask = (1u << e) - 1, mmask = (1u << m) - 1;
    const bool neg = (bits >> (e + m)) & 1u;
    const unsigned exp = (bits >> m) & emask, mant = bits & mmask;
    double v;
    if (kind == MF_FNUZ && bits == 0x80)
        return NAN;
    if (kind == MF_FN && exp == emask && mant == mmask)
        v = NAN;
    else if (kind == MF_IEEE && exp == emask)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp((double)mant, 1 - minifloat[dt].bias - m);
    else
        v = ldexp((double)(mant | (1u << m)), (int)exp - minifloat[dt].bias - m);
    return neg ? -v : v;
}

/* float8 E8M0 from float32 bits, as onnx.numpy_helper.to_float8e8m0: the
 * exponent, rounded by the mantissa; NaN and inf give NaN (0xff) */
static uint8_t to_e8m0(float f, ai_convert_mode mode)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    unsigned exp = (b >> 23) & 0xffu;
    if (exp == 0xffu)
        return 0xff;
    bool up = false;
    if (mode.e8m0_round == AI_ROUND_NEAREST)
        up = (b & 0x400000u) && ((b & 0x200000u) || (b & 0x1fffffu) || exp > 0);
    else if (mode.e8m0_round == AI_ROUND_UP)
        up = (b & 0x7fffffu) != 0;
    if (up && !(mode.saturate && exp == 0xfeu))
        exp++;
    return (uint8_t)exp;
}

uint8_t ai_f64_to_small_float(double v, ai_dtype dt, ai_convert_mode mode)
{
    if (dt == AI_F8E8M0)
        return to_e8m0((float)v, mode);
    const int e = minifloat[dt].ebits, m = minifloat[dt].mbits, kind = minifloat[dt].kind;
    const int emin = 1 - minifloat[dt].bias;
    const unsigned sign = signbit(v) ? 1u << (e + m) : 0;
    const unsigned max_code = ((1u << (e + m)) - 1) - (kind == MF_FN ? 1 : 0) -
                              (kind == MF_IEEE ? (1u << m) : 0);
    /* what a value beyond the largest finite one becomes */
    const unsigned overflow = mode.saturate || kind == MF_NONE ? sign | max_code
                              : kind == MF_IEEE              ? sign | ((1u << (e + m)) - (1u << m))
                              : kind == MF_FN                ? sign | 0x7fu
                                                             : 0x80u;
    if (isnan(v)) /* ml_dtypes gives float4 E2M1's NaN the bits of -0 */
        return (uint8_t)(kind == MF_FNUZ ? 0x80u : kind == MF_NONE ? sign ^ 0x8u
                         : kind == MF_FN ? sign | 0x7fu : sign | 0x7eu);
    double a = fabs(v);
    if (isinf(a))
        return (uint8_t)(kind == MF_IEEE && !mode.saturate ? sign | ((1u << (e + m)) - (1u << m))
                                                          : overflow);
    int ex;
    frexp(a, &ex); /* a = f 2^ex, f in [0.5, 1) */
    int q = (ex - 1 < emin ? emin : ex - 1) - m; /* the value of the last mantissa bit */
    double r = ldexp(rint(ldexp(a, -q)), q);  /* rounded to nearest even */
    if (r > minifloat[dt].max)
        return (uint8_t)overflow;
    if (r == 0)
        return (uint8_t)(kind == MF_FNUZ ? 0 : sign);
    frexp(r, &ex);
    unsigned code;
    if (ex - 1 < emin)
        code = (unsigned)ldexp(r, m - emin); /* subnormal: the mantissa alone */
    else
        code = ((unsigned)(ex - 1 + minifloat[dt].bias) << m) |
               ((unsigned)ldexp(r, m - (ex - 1)) & ((1u << m) - 1));
    return (uint8_t)(sign | code);
}

/* ---------------------------------------------------------------- storage */

struct ai_storage {
    void *ptr;
    size_t nbytes;
    atomic_long refcount;
    bool owned;
    ai_release_fn release;
    void *ctx;
};

static atomic_llong live_tensors, live_storages, owned_bytes;

int64_t ai_debug_live_tensors(void) { return (int64_t)atomic_load(&live_tensors); }
int64_t ai_debug_live_storages(void) { return (int64_t)atomic_load(&live_storages); }
int64_t ai_debug_owned_bytes(void) { return (int64_t)atomic_load(&owned_bytes); }

/* A zeroed header. malloc + memset, not calloc: glibc's calloc bypasses its
 * per-thread cache (tcache) while free fills it, so headers allocated per
 * call (a wrapped module's every forward and backward allocates and frees
 * a few) always took _int_malloc's slow path, and the cache chunks they left
 * were consolidated at torch's next large request (malloc_consolidate):
 * about 1 us of a small wrapped backward (benchmarks/results/overhead.md). */
static void *(*volatile zero_fill)(void *, int, size_t) = memset; /* (a plain memset
                                      after malloc is compiled into calloc again) */
static void *zalloc(size_t n)
{
    void *p = malloc(n);
    if (p)
        zero_fill(p, 0, n);
    return p;
}

static ai_storage *storage_new_owned(size_t nbytes, bool zero)
{
    ai_storage *s = zalloc(sizeof *s);
    if (!s)
        return NULL;
    if (nbytes > 0) {
        size_t rounded = (nbytes + AI_ALIGN - 1) / AI_ALIGN * AI_ALIGN;
        s->ptr = aligned_alloc(AI_ALIGN, rounded);
        if (!s->ptr) {
            free(s);
            return NULL;
        }
        if (zero)
            memset(s->ptr, 0, rounded);
    }
    s->nbytes = nbytes;
    s->owned = true;
    atomic_init(&s->refcount, 1);
    atomic_fetch_add(&live_storages, 1);
    atomic_fetch_add(&owned_bytes, (long long)nbytes);
    return s;
}

static void storage_decref(ai_storage *s)
{
    if (!s || atomic_fetch_sub(&s->refcount, 1) != 1)
        return;
    if (s->owned) {
        free(s->ptr);
        atomic_fetch_sub(&owned_bytes, (long long)s->nbytes);
    } else if (s->release) {
        s->release(s->ctx);
    }
    atomic_fetch_sub(&live_storages, 1);
    free(s);
}

/* ---------------------------------------------------------------- shapes */

ai_status ai_shape_check(int ndim, const int64_t *shape, size_t itemsize,
                         int64_t *numel_out)
{
    if (ndim < 0 || ndim > AI_MAX_DIMS)
        return ai_error(AI_ERR_VALUE, "rank %d is out of range (0 to %d)", ndim,
                        AI_MAX_DIMS);
    int64_t numel = 1;
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ai_error(AI_ERR_VALUE, "dimension %d is negative (%lld)", i,
                            (long long)shape[i]);
        if (shape[i] == 0)
            empty = true;
    }
    /* the product of the non-zero dimensions must fit, empty or not, so that
     * no later computation on this shape can overflow */
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0)
            continue;
        if (numel > INT64_MAX / shape[i])
            return ai_error(AI_ERR_NOMEM, "shape has more than 2^63 elements");
        numel *= shape[i];
    }
    if (itemsize && (uint64_t)numel > (uint64_t)PTRDIFF_MAX / itemsize)
        return ai_error(AI_ERR_NOMEM, "shape needs more than %lld bytes",
                        (long long)PTRDIFF_MAX);
    *numel_out = empty ? 0 : numel;
    return AI_OK;
}

void ai_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

int64_t ai_tensor_numel(const ai_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t ai_tensor_nbytes(const ai_tensor *t)
{
    return (size_t)ai_tensor_numel(t) * ai_dtype_size(t->dtype);
}

bool ai_tensor_is_contiguous(const ai_tensor *t)
{
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 0)
            return true;
        if (t->shape[i] != 1 && t->strides[i] != expected)
            return false;
        expected *= t->shape[i];
    }
    return true;
}

static int64_t abs64(int64_t v) { return v < 0 ? -v : v; }

bool ai_tensor_overlaps(const ai_tensor *t)
{
    /* Sufficient test: sorted by |stride|, each stride must step over the
     * whole span of the smaller ones. Layouts that interleave without
     * overlapping are reported too; none is produced by numpy or torch. */
    int idx[AI_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0)
            return false;
        if (t->shape[i] > 1)
            idx[n++] = i;
    }
    for (int i = 1; i < n; i++) { /* insertion sort by |stride| */
        int k = idx[i], j = i - 1;
        while (j >= 0 && abs64(t->strides[idx[j]]) > abs64(t->strides[k])) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = k;
    }
    int64_t span = 1; /* elements covered by the dimensions so far */
    for (int i = 0; i < n; i++) {
        int64_t st = abs64(t->strides[idx[i]]);
        if (st < span)
            return true;
        span = st * (t->shape[idx[i]] - 1) + span;
    }
    return false;
}

/* ---------------------------------------------------------------- create */

static ai_tensor *tensor_alloc(void)
{
    ai_tensor *t = zalloc(sizeof *t);
    if (t)
        atomic_fetch_add(&live_tensors, 1);
    return t;
}

void ai_tensor_free(ai_tensor *t)
{
    if (!t)
        return;
    storage_decref(t->storage);
    atomic_fetch_sub(&live_tensors, 1);
    free(t);
}

static ai_status tensor_new(ai_tensor **out, ai_dtype dtype, int ndim, const int64_t *shape,
                            bool zero)
{
    *out = NULL;
    if (!dtype_valid(dtype))
        return ai_error(AI_ERR_TYPE, "invalid dtype %d", (int)dtype);
    int64_t numel;
    ai_status st = ai_shape_check(ndim, shape, ai_dtype_size(dtype), &numel);
    if (st)
        return st;
    ai_tensor *t = tensor_alloc();
    if (!t)
        return ai_error(AI_ERR_NOMEM, "out of memory for a tensor header");
    t->storage = storage_new_owned((size_t)numel * ai_dtype_size(dtype), zero);
    if (!t->storage) {
        ai_tensor_free(t);
        return ai_error(AI_ERR_NOMEM, "out of memory allocating %lld bytes",
                        (long long)numel * (long long)ai_dtype_size(dtype));
    }
    t->dtype = dtype;
    t->ndim = ndim;
    if (ndim > 0)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    ai_contiguous_strides(ndim, shape, t->strides);
    t->data = t->storage->ptr;
    *out = t;
    return AI_OK;
}

ai_status ai_tensor_new(ai_tensor **out, ai_dtype dtype, int ndim, const int64_t *shape)
{
    return tensor_new(out, dtype, ndim, shape, true);
}

ai_status ai_tensor_new_uninit(ai_tensor **out, ai_dtype dtype, int ndim,
                               const int64_t *shape)
{
    return tensor_new(out, dtype, ndim, shape, false);
}

ai_status ai_tensor_borrow(ai_tensor **out, void *data, ai_dtype dtype,
                           int ndim, const int64_t *shape,
                           const int64_t *strides, int flags,
                           bool allow_overlap, ai_release_fn release,
                           void *ctx)
{
    *out = NULL;
    ai_status st = AI_OK;
    int64_t numel = 0;
    ai_tensor *t = NULL;
    ai_storage *s = NULL;

    if (!dtype_valid(dtype)) {
        st = ai_error(AI_ERR_TYPE, "invalid dtype %d", (int)dtype);
        goto error;
    }
    if ((st = ai_shape_check(ndim, shape, ai_dtype_size(dtype), &numel)))
        goto error;
    if (numel > 0 && !data) {
        st = ai_error(AI_ERR_VALUE, "NULL data for a non-empty tensor");
        goto error;
    }
    if (!(t = tensor_alloc()) || !(s = zalloc(sizeof *s))) {
        st = ai_error(AI_ERR_NOMEM, "out of memory for a tensor header");
        goto error;
    }
    t->dtype = dtype;
    t->ndim = ndim;
    t->flags = flags & AI_TENSOR_READONLY;
    if (ndim > 0)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    if (strides) {
        /* the byte span must be addressable: |stride| * (dim - 1) summed */
        int64_t span = 0;
        for (int i = 0; i < ndim && numel > 0; i++) {
            int64_t a = abs64(strides[i]);
            if (strides[i] == INT64_MIN ||
                (shape[i] > 1 && a > (INT64_MAX - span) / (shape[i] - 1))) {
                st = ai_error(AI_ERR_VALUE, "stride %lld of dimension %d overflows",
                              (long long)strides[i], i);
                goto error;
            }
            span += a * (shape[i] - 1);
        }
        if (numel > 0 && (uint64_t)span > (uint64_t)PTRDIFF_MAX / ai_dtype_size(dtype)) {
            st = ai_error(AI_ERR_VALUE, "strides span more than the address space");
            goto error;
        }
        memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
    } else {
        ai_contiguous_strides(ndim, shape, t->strides);
    }
    if (!allow_overlap && ai_tensor_overlaps(t)) {
        st = ai_error(AI_ERR_VALUE,
                      "strides address some elements more than once "
                      "(overlapping memory, e.g. a broadcast or expanded view)");
        goto error;
    }
    s->ptr = data;
    s->owned = false;
    s->release = release;
    s->ctx = ctx;
    atomic_init(&s->refcount, 1);
    atomic_fetch_add(&live_storages, 1);
    t->storage = s;
    t->data = numel > 0 ? data : NULL;
    *out = t;
    return AI_OK;

error:
    free(s);
    if (t)
        ai_tensor_free(t);
    if (release)
        release(ctx);
    return st;
}

ai_status ai_tensor_share(ai_tensor **out, const ai_tensor *src)
{
    ai_tensor *t = tensor_alloc();
    *out = NULL;
    if (!t)
        return ai_error(AI_ERR_NOMEM, "out of memory for a tensor header");
    *t = *src;
    atomic_fetch_add(&src->storage->refcount, 1);
    *out = t;
    return AI_OK;
}

void ai_tensor_reshare(ai_tensor *dst, const ai_tensor *src)
{
    atomic_fetch_add(&src->storage->refcount, 1); /* first: src may share dst's storage */
    storage_decref(dst->storage);
    *dst = *src;
}

bool ai_tensor_unshared(const ai_tensor *t)
{
    return t->storage && t->storage->owned && atomic_load(&t->storage->refcount) == 1;
}

ai_status ai_tensor_clone(ai_tensor **out, const ai_tensor *src)
{
    ai_status st = ai_tensor_new(out, src->dtype, src->ndim, src->shape);
    if (st)
        return st;
    if ((st = ai_tensor_copy(*out, src))) {
        ai_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

/* ---------------------------------------------------------------- copy */

static int64_t load_i(const char *p, ai_dtype dt);

static double load_f(const char *p, ai_dtype dt)
{
    switch (dt) {
    case AI_F32: { float v; memcpy(&v, p, 4); return v; }
    case AI_F64: { double v; memcpy(&v, p, 8); return v; }
    case AI_F16: { uint16_t v; memcpy(&v, p, 2); return ai_f16_to_f32(v); }
    case AI_BF16: { uint16_t v; memcpy(&v, p, 2); return ai_bf16_to_f32(v); }
    case AI_U64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    case AI_F8E4M3FN:
    case AI_F8E4M3FNUZ:
    case AI_F8E5M2:
    case AI_F8E5M2FNUZ:
    case AI_F8E8M0:
    case AI_F4E2M1: return ai_small_float_to_f64(*(const uint8_t *)p, dt);
    default: break;
    }
    return (double)load_i(p, dt);
}

/* integers (uint64 as its two's complement bits) */
static int64_t load_i(const char *p, ai_dtype dt)
{
    switch (dt) {
    case AI_I8: return *(const int8_t *)p;
    case AI_U8: return *(const uint8_t *)p;
    case AI_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case AI_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case AI_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case AI_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case AI_I64:
    case AI_U64: { int64_t v; memcpy(&v, p, 8); return v; }
    case AI_BOOL: return *(const uint8_t *)p != 0;
    case AI_I4: { int v = *(const uint8_t *)p & 0xf; return v >= 8 ? v - 16 : v; }
    case AI_U4: return *(const uint8_t *)p & 0xf;
    case AI_I2: { int v = *(const uint8_t *)p & 0x3; return v >= 2 ? v - 4 : v; }
    case AI_U2: return *(const uint8_t *)p & 0x3;
    default: return 0;
    }
}

/* float -> integer without undefined behaviour: NaN gives 0, out-of-range
 * values saturate (C leaves both undefined; numpy and torch differ). */
static int64_t f_to_i64(double v)
{
    if (v != v)
        return 0;
    if (v >= 9223372036854775807.0)
        return INT64_MAX;
    if (v <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

/* like ai_tensor_get_flat, but exact for int64 (floats saturate, NaN gives 0) */
int64_t ai_tensor_get_flat_i64(const ai_tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->strides[d];
        i /= t->shape[d];
    }
    const char *p = (const char *)t->data + off * (int64_t)ai_dtype_size(t->dtype);
    return ai_dtype_is_float(t->dtype) ? f_to_i64(load_f(p, t->dtype)) : load_i(p, t->dtype);
}

static void store_f(char *p, ai_dtype dt, double v, ai_convert_mode mode);

static void store_i(char *p, ai_dtype dt, int64_t v, ai_convert_mode mode)
{
    /* integer narrowing wraps modulo 2^bits, as numpy and torch do */
    const uint64_t u = (uint64_t)v;
    switch (dt) {
    case AI_I8:
    case AI_U8: *(uint8_t *)p = (uint8_t)u; break;
    case AI_I16:
    case AI_U16: { uint16_t w = (uint16_t)u; memcpy(p, &w, 2); break; }
    case AI_I32:
    case AI_U32: { uint32_t w = (uint32_t)u; memcpy(p, &w, 4); break; }
    case AI_I64:
    case AI_U64: memcpy(p, &v, 8); break;
    case AI_BOOL: *(uint8_t *)p = v != 0; break;
    case AI_I4:
    case AI_U4: *(uint8_t *)p = (uint8_t)(u & 0xfu); break;
    case AI_I2:
    case AI_U2: *(uint8_t *)p = (uint8_t)(u & 0x3u); break;
    default: store_f(p, dt, (double)v, mode); break; /* the floats */
    }
}

static void store_f(char *p, ai_dtype dt, double v, ai_convert_mode mode)
{
    switch (dt) {
    case AI_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case AI_F64: memcpy(p, &v, 8); break;
    case AI_F16: { uint16_t h = ai_f32_to_f16((float)v); memcpy(p, &h, 2); break; }
    case AI_BF16: { uint16_t h = ai_f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
    case AI_BOOL: *(uint8_t *)p = v != 0; break;
    case AI_F8E4M3FN:
    case AI_F8E4M3FNUZ:
    case AI_F8E5M2:
    case AI_F8E5M2FNUZ:
    case AI_F8E8M0:
    case AI_F4E2M1: *(uint8_t *)p = ai_f64_to_small_float(v, dt, mode); break;
    case AI_U64:
        if (v >= 9223372036854775808.0 && v < 18446744073709551616.0) {
            uint64_t w = (uint64_t)v;
            memcpy(p, &w, 8);
            break;
        }
        store_i(p, dt, f_to_i64(v), mode);
        break;
    case AI_I4:
    case AI_U4:
    case AI_I2:
    case AI_U2: {
        /* as ml_dtypes (the ONNX reference): truncated, 0 when out of range
         * (ONNX leaves it undefined) */
        const int bits = dt == AI_I4 || dt == AI_U4 ? 4 : 2;
        const bool sgn = dt == AI_I4 || dt == AI_I2;
        const double lo = sgn ? -ldexp(1, bits - 1) : 0, hi = ldexp(1, bits - sgn) - 1;
        const double t = trunc(v);
        store_i(p, dt, t >= lo && t <= hi ? (int64_t)t : 0, mode);
        break;
    }
    default: store_i(p, dt, f_to_i64(v), mode); break;
    }
}

double ai_tensor_get_flat(const ai_tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->strides[d];
        i /= t->shape[d];
    }
    return load_f((const char *)t->data + off * (int64_t)ai_dtype_size(t->dtype),
                  t->dtype);
}

/* The next index of src's first `nd` dims (idx, the last fastest), *sp and
 * *dp moved with it by the strides of src and dst (elements of ss and ds
 * bytes). */
static inline void next_index(int64_t *idx, int nd, const ai_tensor *src, const ai_tensor *dst,
                              const char **sp, char **dp, int64_t ss, int64_t ds)
{
    for (int d = nd - 1; d >= 0; d--) {
        *sp += src->strides[d] * ss;
        *dp += dst->strides[d] * ds;
        if (++idx[d] < src->shape[d])
            return;
        *sp -= src->strides[d] * ss * src->shape[d];
        *dp -= dst->strides[d] * ds * dst->shape[d];
        idx[d] = 0;
    }
}

/* A same-type copy of 4- or 8-byte elements, a row (the last dim) at a
 * time: a memcpy where both rows are contiguous, else a typed strided loop
 * (an expanded source, stride 0, is a fill). The element-wise walk below
 * took 6.6 ns an element: 0.87 ms to copy a gradient expanded from a
 * scalar over 131072 floats (loss.sum().backward() into a graph). */
static ai_status copy_rows(ai_tensor *dst, const ai_tensor *src, int64_t es)
{
    const int nd = src->ndim, last = nd - 1;
    const int64_t inner = src->shape[last], rows = ai_tensor_numel(src) / inner;
    const int64_t s1 = src->strides[last], d1 = dst->strides[last];
    int64_t idx[AI_MAX_DIMS] = {0};
    const char *sp = src->data;
    char *dp = dst->data;
    for (int64_t r = 0; r < rows; r++) {
        if (s1 == 1 && d1 == 1) {
            memcpy(dp, sp, (size_t)(inner * es));
        } else if (s1 == 0 && d1 == 1 && es == 4) { /* a fill (vectorised) */
            uint32_t v;
            memcpy(&v, sp, 4);
            for (int64_t i = 0; i < inner; i++)
                memcpy(dp + i * 4, &v, 4);
        } else if (es == 4) { /* (fixed-size memcpy: one move, any alignment) */
            for (int64_t i = 0; i < inner; i++)
                memcpy(dp + i * d1 * 4, sp + i * s1 * 4, 4);
        } else {
            for (int64_t i = 0; i < inner; i++)
                memcpy(dp + i * d1 * 8, sp + i * s1 * 8, 8);
        }
        next_index(idx, last, src, dst, &sp, &dp, es, es); /* the next row */
    }
    return AI_OK;
}

ai_status ai_tensor_copy(ai_tensor *dst, const ai_tensor *src)
{
    return ai_tensor_convert(dst, src, AI_CONVERT_DEFAULT);
}

/* int32 to float32, rounded to nearest as the element loop's int64 (one
 * rounding of the same integer); SSE2's cvtdq2ps, vectorised */
static void i32_to_f32(const int32_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)src[i];
}

ai_status ai_tensor_convert(ai_tensor *dst, const ai_tensor *src, ai_convert_mode mode)
{
    if (dst->ndim != src->ndim)
        return ai_error(AI_ERR_VALUE, "copy between ranks %d and %d", src->ndim,
                        dst->ndim);
    for (int i = 0; i < src->ndim; i++)
        if (dst->shape[i] != src->shape[i])
            return ai_error(AI_ERR_VALUE,
                            "copy between shapes that differ in dimension %d "
                            "(%lld vs %lld)", i, (long long)src->shape[i],
                            (long long)dst->shape[i]);
    if (dst->flags & AI_TENSOR_READONLY)
        return ai_error(AI_ERR_VALUE, "copy into a read-only tensor");
    int64_t n = ai_tensor_numel(src);
    if (n == 0)
        return AI_OK;
    const int64_t ss = (int64_t)ai_dtype_size(src->dtype);
    const int64_t ds = (int64_t)ai_dtype_size(dst->dtype);
    if (src->dtype == dst->dtype && ai_tensor_is_contiguous(src) &&
        ai_tensor_is_contiguous(dst)) {
        memmove(dst->data, src->data, (size_t)(n * ss));
        return AI_OK;
    }
    if (ai_tensor_is_contiguous(src) && ai_tensor_is_contiguous(dst)) {
        if (ai_dtype_is_half(src->dtype) && dst->dtype == AI_F32) {
            ai_half_to_f32(src->dtype, src->data, dst->data, n);
            return AI_OK;
        }
        if (src->dtype == AI_F32 && ai_dtype_is_half(dst->dtype)) {
            ai_f32_to_half(dst->dtype, src->data, dst->data, n);
            return AI_OK;
        }
        if (src->dtype == AI_I32 && dst->dtype == AI_F32) { /* MatMulInteger's, dynamic */
            i32_to_f32(src->data, dst->data, n);
            return AI_OK;
        }
    }
    const bool same = src->dtype == dst->dtype;
    /* integers convert exactly through int64, except uint64 into a float */
    const bool int_src = !ai_dtype_is_float(src->dtype) &&
                         !(src->dtype == AI_U64 && ai_dtype_is_float(dst->dtype));
    const int nd = src->ndim;
    int64_t idx[AI_MAX_DIMS] = {0};
    const char *sp = src->data;
    char *dp = dst->data;
    if (same && (ss == 4 || ss == 8))
        return copy_rows(dst, src, ss);
    for (int64_t k = 0; k < n; k++) {
        if (same)
            memcpy(dp, sp, (size_t)ss);
        else if (int_src)
            store_i(dp, dst->dtype, load_i(sp, src->dtype), mode);
        else
            store_f(dp, dst->dtype, load_f(sp, src->dtype), mode);
        next_index(idx, nd, src, dst, &sp, &dp, ss, ds);
    }
    return AI_OK;
}
