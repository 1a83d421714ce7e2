/*
 * pool.c — pooling: parameter checks, output sizes, the window geometry, and
 * the kernels of pool_impl.h instantiated for float32 and float64.
 */
#include "pool.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "../parallel.h"
#include "simd.h"

/* Largest attribute or size accepted: keeps every formula below in int64. */
#define MAX_ATTR INT64_C(0x7fffffff)

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/*
 * The geometry, always 3-D: 1-D and 2-D pools get leading spatial dims of
 * size 1 (kernel 1, stride 1, no pad).
 */
typedef struct {
    int64_t in[3], out[3], k[3], s[3], d[3], pb[3], pe[3];
    int64_t in_size, out_size; /* products of in, out */
} pool_geom;

static pool_geom pool_geom_of(const ai_pool_params *p)
{
    pool_geom g = {.in_size = 1, .out_size = 1};
    for (int i = 0; i < 3; i++) {
        int d = i - (3 - p->nsp); /* spatial dim of p; < 0 for an added one */
        bool real = d >= 0;
        g.in[i] = real ? p->in[d] : 1;
        g.out[i] = real ? p->out[d] : 1;
        g.k[i] = real ? p->kernel[d] : 1;
        g.s[i] = real ? p->stride[d] : 1;
        g.d[i] = real ? p->dilation[d] : 1;
        g.pb[i] = real ? p->pad_begin[d] : 0;
        g.pe[i] = real ? p->pad_end[d] : 0;
        g.in_size *= g.in[i];
        g.out_size *= g.out[i];
    }
    return g;
}

/* Window o along dim i: its input positions lo, lo + d, ... < hi (n of
 * them), and its size clipped to the padded input (count_include_pad). */
typedef struct {
    int64_t lo, hi, n, padded;
} pool_win;

static pool_win pool_win_of(const pool_geom *g, int i, int64_t o)
{
    int64_t d = g->d[i], start = o * g->s[i] - g->pb[i];
    pool_win w;
    w.lo = start < 0 ? start + (-start + d - 1) / d * d : start;
    w.hi = min64(start + (g->k[i] - 1) * d + 1, g->in[i]);
    w.n = w.hi > w.lo ? (w.hi - w.lo + d - 1) / d : 0;
    w.padded = min64(g->k[i], (g->in[i] + g->pe[i] - start + d - 1) / d);
    return w;
}

static ai_status check_attrs(const ai_pool_params *p)
{
    if (p->nsp < 1 || p->nsp > 3)
        return ai_error(AI_ERR_VALUE, "pooling: %d spatial dims, expected 1 to 3",
                        p->nsp);
    if (p->N < 0 || p->N > MAX_ATTR || p->C < 1 || p->C > MAX_ATTR)
        return ai_error(AI_ERR_VALUE, "pooling: batch size %" PRId64 " or channels %"
                        PRId64 " out of range", p->N, p->C);
    const struct { const char *name; const int64_t *v; int64_t lo; } attrs[] = {
        {"input size", p->in, 1},       {"kernel", p->kernel, 1},
        {"stride", p->stride, 1},       {"dilation", p->dilation, 1},
        {"pad_begin", p->pad_begin, 0}, {"pad_end", p->pad_end, 0}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        for (int d = 0; d < p->nsp; d++)
            if (attrs[i].v[d] < attrs[i].lo || attrs[i].v[d] > MAX_ATTR)
                return ai_error(AI_ERR_VALUE,
                                "pooling: %s %" PRId64 " along spatial dim %d out of"
                                " range [%" PRId64 ", 2^31)", attrs[i].name,
                                attrs[i].v[d], d, attrs[i].lo);
    return AI_OK;
}

/* The output size along spatial dim d of parameters that pass check_attrs.
 * With ceil_mode the last window may run past the padded input. */
static ai_status expected_out(const ai_pool_params *p, int d, int64_t *out)
{
    int64_t extent = p->dilation[d] * (p->kernel[d] - 1) + 1; /* dilated kernel */
    int64_t padded = p->in[d] + p->pad_begin[d] + p->pad_end[d];
    int64_t s = p->stride[d], room = padded - extent + (p->ceil_mode ? s - 1 : 0);
    if (room < 0)
        return ai_error(AI_ERR_VALUE,
                        "pooling: dilated kernel extent %" PRId64 " leaves no output for"
                        " padded input size %" PRId64 " along spatial dim %d", extent,
                        padded, d);
    *out = room / s + 1;
    /* with ceil_mode, the last window starts inside the input or left padding */
    if (p->ceil_mode && (*out - 1) * s >= p->in[d] + p->pad_begin[d])
        --*out;
    return AI_OK;
}

ai_status ai_pool_check(const ai_pool_params *p)
{
    ai_status st = check_attrs(p);
    if (st != AI_OK)
        return st;
    int64_t xs = p->N * p->C, ys = xs; /* both < 2^62 */
    for (int d = 0; d < p->nsp; d++) {
        int64_t out = 0;
        if ((st = expected_out(p, d, &out)) != AI_OK)
            return st;
        if (p->out[d] != out)
            return ai_error(AI_ERR_VALUE, "pooling: output size %" PRId64 " along"
                            " spatial dim %d, expected %" PRId64, p->out[d], d, out);
        if (xs > INT64_MAX / 8 / p->in[d] || ys > INT64_MAX / 8 / out)
            return ai_error(AI_ERR_NOMEM, "pooling: tensor sizes overflow");
        xs *= p->in[d];
        ys *= out;
    }
    pool_geom g = pool_geom_of(p);
    for (int i = 3 - p->nsp; i < 3; i++)
        for (int64_t o = 0; o < g.out[i]; o++)
            if (pool_win_of(&g, i, o).n == 0)
                return ai_error(AI_ERR_VALUE, "pooling: window %" PRId64 " along spatial"
                                " dim %d covers only padding", o, i - (3 - p->nsp));
    return AI_OK;
}

ai_status ai_pool_infer_out(ai_pool_params *p)
{
    ai_status st = check_attrs(p);
    for (int d = 0; st == AI_OK && d < p->nsp; d++)
        st = expected_out(p, d, &p->out[d]);
    return st != AI_OK ? st : ai_pool_check(p);
}

/* One pooling pass over planes: `out` is y or dx, `in` is x or dy, idx the
 * maxima; p is NULL for the global pools, whose geometry is one (S) plane
 * pooled to one output. */
enum { POOL_MAX, POOL_MAX_BWD, POOL_AVG, POOL_AVG_BWD, POOL_GLOBAL_MAX, POOL_GLOBAL_AVG,
       POOL_GLOBAL_AVG_BWD };

typedef struct {
    int kind;
    const ai_pool_params *p;
    pool_geom g;
    void *out;
    int64_t *idx;
    const void *in;
} pool_job;

static pool_geom global_geom(int64_t S)
{
    return (pool_geom){.in = {1, 1, S}, .out = {1, 1, 1}, .k = {1, 1, S}, .s = {1, 1, 1},
                       .d = {1, 1, 1}, .in_size = S, .out_size = 1};
}

/* Splits the NC planes between threads: a grain of about AI_GRAIN_ELEMS
 * elements read and written. */
static void pool_run(pool_job *j, int64_t NC, ai_range_fn fn)
{
    ai_parallel_for(NC, ai_grain_of(j->g.in_size + j->g.out_size), fn, j);
}

#define AI_CAT_(a, b) a##b
#define AI_CAT(a, b) AI_CAT_(a, b)
#define FN(name) AI_CAT(name, SFX)

/* Whether each window of p is its whole input plane, unpadded and undilated
 * (one output per plane): the global pools' kernels then apply, with the
 * same divisor (the plane's size). */
static bool pool_whole_plane(const ai_pool_params *p)
{
    for (int d = 0; d < p->nsp; d++)
        if (p->kernel[d] != p->in[d] || p->dilation[d] != 1 || p->pad_begin[d] != 0 ||
            p->pad_end[d] != 0 || p->out[d] != 1)
            return false;
    return true;
}

/* The vector registers of maxpool_inside (GCC's vector extensions): MP_LANES
 * values, the integers of the same width (compare masks, tap offsets), and
 * the even lanes of two vectors (a stride-2 row). */
#if defined(__GNUC__) && !defined(__clang__)
#define MP_LANES 8
#define MP_MAX_OFFSET INT32_MAX
AI_VEC_DECL(mp_vec_f32, float);
typedef int32_t mp_int_f32;
typedef int32_t mp_ivec_f32 __attribute__((vector_size(32)));
typedef double mp_vec_f64 __attribute__((vector_size(64), aligned(8), may_alias));
typedef int64_t mp_int_f64;
typedef int64_t mp_ivec_f64 __attribute__((vector_size(64)));
typedef int64_t mp_lvec __attribute__((vector_size(64))); /* MP_LANES flat indices */
#define MP_IOTA ((mp_lvec){0, 1, 2, 3, 4, 5, 6, 7})
#define mp_even_f32(a, b) __builtin_shuffle((a), (b), (mp_ivec_f32){0, 2, 4, 6, 8, 10, 12, 14})
#define mp_even_f64(a, b) __builtin_shuffle((a), (b), (mp_ivec_f64){0, 2, 4, 6, 8, 10, 12, 14})
#endif

/* MaxPool 2 x 2 at stride 2 with every window inside the input (undilated,
 * unpadded), float32, AVX-512: 16 outputs of a row per vector, the four
 * taps the even and odd lanes of the two input rows' 32 values, visited in
 * maxpool_inside's scan order with its tie and NaN rule (the same maxima
 * and positions). The generic kernel ran these (LeNet's pools) at 1.4-4.8
 * ns an output: one tap at a time through its loops, 8 lanes, the short
 * rows' tails one by one. Rows of at most 8 outputs go two at a time (the
 * two rows' outputs are consecutive in y: one vector, lanes [0, n2) the
 * first row's, [n2, 2 n2) the second's), and every vector is stored under
 * a mask: one row of 5 outputs a vector and 5 scalar stores took LeNet's
 * second pool (16 x 16 planes of 10 x 10) 3 times ONNX Runtime's. */
#if defined(AI_AVX512_KERNEL) && defined(MP_LANES)
#define HAVE_MAXPOOL2X2_V16
#include <immintrin.h>
typedef int32_t mp16_ivec __attribute__((vector_size(64)));

static bool maxpool2x2_case(const pool_geom *g)
{
    return g->k[0] == 1 && g->k[1] == 2 && g->k[2] == 2 && g->s[1] == 2 && g->s[2] == 2 &&
           g->in_size <= INT32_MAX && ai_cpu_avx512();
}

/* one tap: where t beats the running maximum (greater, or NaN), take it */
#define MP16_TAKE(t, off)                                                                 \
    {                                                                                     \
        const mp16_ivec take = ((t) > best) | ((t) != (t));                               \
        best = (ai_vec16_f32)(((mp16_ivec)(t) & take) | ((mp16_ivec)best & ~take));       \
        at = (((mp16_ivec){0} + (off)) & take) | (at & ~take);                            \
    }

/* The four taps of 16 outputs, in scan order: the even and odd lanes of
 * the top rows' values (a, c) and of the bottom rows' (b, d) that sel and
 * sel + 1 pick; their maxima stored under the mask of the first n lanes,
 * and their positions (row0 + 2 o2 on lanes before split, row1 + 2 (o2 - split)
 * after) */
AI_AVX512_KERNEL static inline void maxpool2x2_taps(ai_vec16_f32 a, ai_vec16_f32 b,
                                                    ai_vec16_f32 c, ai_vec16_f32 d,
                                                    mp16_ivec sel, int32_t w, int64_t n,
                                                    float *y, int64_t *idx, int64_t row0,
                                                    int64_t row1, int64_t split)
{
    const ai_vec16_f32 t00 = __builtin_shuffle(a, c, sel), t01 = __builtin_shuffle(a, c, sel + 1),
                       t10 = __builtin_shuffle(b, d, sel), t11 = __builtin_shuffle(b, d, sel + 1);
    /* the first tap against -inf: taken unless it is -inf, which leaves the
     * same value and position */
    ai_vec16_f32 best = t00;
    mp16_ivec at = {0};
    MP16_TAKE(t01, 1)
    MP16_TAKE(t10, w)
    MP16_TAKE(t11, w + 1)
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << n) - 1), (__m512)best);
    if (idx)
        for (int64_t l = 0; l < n; l++)
            idx[l] = (l < split ? row0 + 2 * l : row1 + 2 * (l - split)) + at[l];
}

AI_AVX512_KERNEL AI_SHORT_LOOPS static void maxpool2x2_v16(const pool_geom *g, int64_t nc0,
                                                           int64_t nc1, int64_t NC, float *y,
                                                           int64_t *idx, const float *x)
{
    const mp16_ivec ev = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const int64_t in2 = g->in[2], n2 = g->out[2];
    const int32_t w = (int32_t)in2;
    const int64_t xn = NC * g->in_size; /* x's floats */
    /* two rows at once: the first n2 even lanes of the first row's values,
     * then of the second's (the lanes past 2 n2 are not stored) */
    const bool pairs = n2 <= 8;
    mp16_ivec sel2 = ev;
    for (int l = 0; l < 16; l++)
        sel2[l] = l < n2 ? 2 * l : 16 + 2 * (l - (int)n2);
    for (int64_t nc = nc0; nc < nc1; nc++)
        for (int64_t o0 = 0; o0 < g->out[0]; o0++)
            for (int64_t o1 = 0; o1 < g->out[1]; o1++) {
                const int64_t row = (o0 * g->s[0] * g->in[1] + 2 * o1) * in2;
                const int64_t o = (nc * g->out[0] + o0) * g->out[1] * n2 + o1 * n2;
                const int64_t at0 = nc * g->in_size + row; /* the row's first tap */
                _Alignas(64) float pad[4][32];
                if (pairs && o1 + 1 < g->out[1]) { /* rows o1 and o1 + 1 */
                    const float *p[4];
                    for (int r = 0; r < 4; r++)
                        p[r] = x + at0 + r * in2;
                    if (at0 + 3 * in2 + 16 > xn) /* the end of x: the rows' values alone */
                        for (int r = 0; r < 4; r++) {
                            for (int64_t i = 0; i < 16; i++)
                                pad[r][i] = i < 2 * n2 ? p[r][i] : 0.0f;
                            p[r] = pad[r];
                        }
                    maxpool2x2_taps(*(const ai_vec16_f32 *)p[0], *(const ai_vec16_f32 *)p[1],
                                    *(const ai_vec16_f32 *)p[2], *(const ai_vec16_f32 *)p[3],
                                    sel2, w, 2 * n2, y + o, idx ? idx + o : NULL, row,
                                    row + 2 * in2, n2);
                    o1++;
                    continue;
                }
                for (int64_t o2 = 0; o2 < n2; o2 += 16) {
                    const int64_t n = n2 - o2 < 16 ? n2 - o2 : 16;
                    const float *p0 = x + at0 + 2 * o2, *p1 = p0 + in2;
                    if (at0 + 2 * o2 + in2 + 32 > xn) { /* the end of x: the rows' last values */
                        for (int64_t i = 0; i < 32; i++) {
                            pad[0][i] = i < 2 * n ? p0[i] : 0.0f;
                            pad[1][i] = i < 2 * n ? p1[i] : 0.0f;
                        }
                        p0 = pad[0];
                        p1 = pad[1];
                    }
                    maxpool2x2_taps(*(const ai_vec16_f32 *)p0, *(const ai_vec16_f32 *)p1,
                                    *(const ai_vec16_f32 *)(p0 + 16),
                                    *(const ai_vec16_f32 *)(p1 + 16), ev, w, n, y + o + o2,
                                    idx ? idx + o + o2 : NULL, row + 2 * o2, 0, 16);
                }
            }
}
#undef MP16_TAKE
#endif

/* AveragePool 2 x 2 at stride 2 (along the last two dims; 1 along a third)
 * with every window inside the input, undilated and unpadded, so that the
 * divisor is 4 with or without count_include_pad: pool_impl.h's
 * avgpool2x2 kernels, whole rows by plain loops that vectorise, where the
 * reference (avgpool_range, avgpool_backward_range) finds each window's
 * bounds and divisor output by output. ai_set_fast_kernels(false) runs the
 * reference, which the tests compare with. */
static bool avgpool2x2_case(const pool_geom *g)
{
    for (int i = 0; i < 3; i++)
        if (g->pb[i] != 0 || g->pe[i] != 0 || g->d[i] != 1)
            return false;
    return g->k[0] == 1 && g->k[1] == 2 && g->k[2] == 2 && g->s[1] == 2 && g->s[2] == 2 &&
           2 * g->out[1] <= g->in[1] && 2 * g->out[2] <= g->in[2] && ai_fast_kernels();
}

#define T float
#define SFX _f32
#include "pool_impl.h"

#define T double
#define SFX _f64
#include "pool_impl.h"
