/*
 * compare.c — closeness of two tensors, the torch.testing.assert_close rule,
 * in one pass over both buffers (any strides).
 *
 * An element pair is close when
 *     actual == expected                        (so +inf == +inf)
 *  or both are NaN and equal_nan
 *  or |actual - expected| is finite and <= atol + rtol * |expected|.
 * Differences are computed in double precision; integer differences are
 * exact before their rounding to double.
 *
 * The greatest absolute and relative differences are taken over the
 * mismatched elements when there are any — the figures assert_close prints —
 * and over all elements otherwise (how close a passing pair came). A NaN
 * difference is the greatest; ties keep the first flat index.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "aidge.h"

typedef struct {
    double diff, rel;
    int64_t diff_index, rel_index;
} maxima;

typedef struct {
    double rtol, atol;
    bool equal_nan;
    int64_t mismatches;
    maxima all, mismatched;
} compare_state;

static bool greater(double v, double current)
{
    return isnan(v) ? !isnan(current) : v > current;
}

static void track(maxima *m, double diff, double rel, int64_t i)
{
    if (m->diff_index < 0 || greater(diff, m->diff)) {
        m->diff = diff;
        m->diff_index = i;
    }
    if (m->rel_index < 0 || greater(rel, m->rel)) {
        m->rel = rel;
        m->rel_index = i;
    }
}

/* One element pair: `equal` when a == e exactly, `both_nan` when both are
 * NaN, `diff` = |a - e| (NaN when either is), `e` the expected value. */
static inline void account(compare_state *s, bool equal, bool both_nan, double diff,
                           double e, int64_t i)
{
    if (equal || (both_nan && s->equal_nan)) {
        track(&s->all, 0.0, 0.0, i); /* no inf - inf = NaN for equal infinities */
        return;
    }
    /* not equal: diff > 0 or NaN, so diff / |e| is never 0 / 0 */
    double rel = diff / fabs(e);
    if (isfinite(diff) && diff <= s->atol + s->rtol * fabs(e)) {
        track(&s->all, diff, rel, i);
    } else {
        s->mismatches++;
        track(&s->mismatched, diff, rel, i);
    }
}

static inline void account_float(compare_state *s, double a, double e, int64_t i)
{
    account(s, a == e, isnan(a) && isnan(e), fabs(a - e), e, i);
}

static inline void account_int(compare_state *s, int64_t a, int64_t e, int64_t i)
{
    /* exact |a - e| in uint64 (a - e may overflow int64), then rounded */
    uint64_t d = a >= e ? (uint64_t)a - (uint64_t)e : (uint64_t)e - (uint64_t)a;
    account(s, a == e, false, (double)d, (double)e, i);
}

static inline void account_uint(compare_state *s, uint64_t a, uint64_t e, int64_t i)
{
    account(s, a == e, false, (double)(a >= e ? a - e : e - a), (double)e, i);
}

static double half(uint16_t h) { return ai_f16_to_f32(h); }
static double bhalf(uint16_t h) { return ai_bf16_to_f32(h); }
static uint64_t as_u64(uint64_t v) { return v; }
static int64_t low4(uint8_t v) { return (v & 0xf) >= 8 ? (v & 0xf) - 16 : v & 0xf; }
static int64_t low2(uint8_t v) { return (v & 0x3) >= 2 ? (v & 0x3) - 4 : v & 0x3; }
static int64_t low4u(uint8_t v) { return v & 0xf; }
static int64_t low2u(uint8_t v) { return v & 0x3; }
static int64_t as_i64(int64_t v) { return v; }

/* One row of `n` elements, `sa` / `se` bytes apart, first flat index `i0`. */
#define ROW(T, ACCOUNT, CONV)                                                  \
    for (int64_t k = 0; k < n; k++) {                                          \
        T va, ve;                                                              \
        memcpy(&va, pa + k * sa, sizeof va);                                   \
        memcpy(&ve, pe + k * se, sizeof ve);                                   \
        ACCOUNT(s, CONV(va), CONV(ve), i0 + k);                                \
    }

static void compare_row(compare_state *s, ai_dtype dt, const char *pa, const char *pe,
                        int64_t sa, int64_t se, int64_t n, int64_t i0)
{
    switch (dt) {
    case AI_F32: ROW(float, account_float, (double)) break;
    case AI_F64: ROW(double, account_float, (double)) break;
    case AI_F16: ROW(uint16_t, account_float, half) break;
    case AI_BF16: ROW(uint16_t, account_float, bhalf) break;
    case AI_I8: ROW(int8_t, account_int, as_i64) break;
    case AI_U8: ROW(uint8_t, account_int, as_i64) break;
    case AI_I16: ROW(int16_t, account_int, as_i64) break;
    case AI_I32: ROW(int32_t, account_int, as_i64) break;
    case AI_I64: ROW(int64_t, account_int, as_i64) break;
    case AI_BOOL: ROW(uint8_t, account_int, as_i64) break;
    case AI_U16: ROW(uint16_t, account_int, as_i64) break;
    case AI_U32: ROW(uint32_t, account_int, as_i64) break;
    case AI_U64: ROW(uint64_t, account_uint, as_u64) break;
    case AI_I4: ROW(uint8_t, account_int, low4) break;
    case AI_U4: ROW(uint8_t, account_int, low4u) break;
    case AI_I2: ROW(uint8_t, account_int, low2) break;
    case AI_U2: ROW(uint8_t, account_int, low2u) break;
    default: /* the small floats, one byte each */
        for (int64_t k = 0; k < n; k++)
            account_float(s, ai_small_float_to_f64((uint8_t)pa[k * sa], dt),
                          ai_small_float_to_f64((uint8_t)pe[k * se], dt), i0 + k);
        break;
    }
}
#undef ROW

static void format_shape(char *buf, size_t size, const ai_tensor *t)
{
    size_t len = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < t->ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "",
                                (long long)t->shape[i]);
    if (len < size)
        snprintf(buf + len, size - len, t->ndim == 1 ? ",)" : ")");
}

ai_status ai_compare(const ai_tensor *actual, const ai_tensor *expected, double rtol,
                     double atol, bool equal_nan, ai_compare_result *out)
{
    if (!(rtol >= 0.0) || !(atol >= 0.0)) /* also rejects NaN */
        return ai_error(AI_ERR_VALUE, "compare: rtol and atol must be >= 0, got rtol=%g, "
                        "atol=%g", rtol, atol);
    if (actual->dtype != expected->dtype)
        return ai_error(AI_ERR_VALUE,
                        "compare: dtypes differ: actual is %s, expected is %s",
                        ai_dtype_name(actual->dtype), ai_dtype_name(expected->dtype));
    bool same_shape = actual->ndim == expected->ndim;
    for (int i = 0; same_shape && i < actual->ndim; i++)
        same_shape = actual->shape[i] == expected->shape[i];
    if (!same_shape) {
        char sa[160], se[160];
        format_shape(sa, sizeof sa, actual);
        format_shape(se, sizeof se, expected);
        return ai_error(AI_ERR_VALUE, "compare: shapes differ: actual is %s, expected is %s",
                        sa, se);
    }
    if (!ai_dtype_size(actual->dtype))
        return ai_error(AI_ERR_TYPE, "compare: invalid dtype %d", (int)actual->dtype);

    compare_state s = {.rtol = rtol, .atol = atol, .equal_nan = equal_nan,
                       .all = {.diff_index = -1, .rel_index = -1},
                       .mismatched = {.diff_index = -1, .rel_index = -1}};
    const int64_t n = ai_tensor_numel(actual);
    const int nd = actual->ndim;
    const int64_t isz = (int64_t)ai_dtype_size(actual->dtype);
    /* the last dimension is a row; an odometer walks the others */
    const int64_t row = nd ? actual->shape[nd - 1] : 1;
    const int64_t ra = nd ? actual->strides[nd - 1] * isz : 0;
    const int64_t re = nd ? expected->strides[nd - 1] * isz : 0;
    const char *pa = actual->data, *pe = expected->data;
    int64_t idx[AI_MAX_DIMS] = {0};
    for (int64_t i0 = 0; i0 < n; i0 += row) {
        compare_row(&s, actual->dtype, pa, pe, ra, re, row, i0);
        for (int d = nd - 2; d >= 0; d--) {
            pa += actual->strides[d] * isz;
            pe += expected->strides[d] * isz;
            if (++idx[d] < actual->shape[d])
                break;
            pa -= actual->strides[d] * isz * actual->shape[d];
            pe -= expected->strides[d] * isz * expected->shape[d];
            idx[d] = 0;
        }
    }
    const maxima *m = s.mismatches ? &s.mismatched : &s.all;
    *out = (ai_compare_result){
        .numel = n,
        .mismatches = s.mismatches,
        .max_abs_diff = m->diff_index < 0 ? 0.0 : m->diff,
        .max_abs_index = m->diff_index,
        .max_rel_diff = m->rel_index < 0 ? 0.0 : m->rel,
        .max_rel_index = m->rel_index,
    };
    return AI_OK;
}
