/*
 * conv_internal.h — what the convolution dispatcher (conv.c) and the kernel
 * families (conv_<family>.c) share; not a public header.
 *
 *   conv_geom       every conv seen as 3-D im2col geometry (image side, grid side)
 *   conv_call       one call as the dispatcher hands it to a family
 *   phase_planes    zero-padded stride-phase planes (direct and depthwise kernels)
 *   vectors, the epilogue in registers, 8 x 8 transposes: inline, for the hot loops
 *   each family's entry points: <family>_<pass>(const conv_call *) returns false
 *   when the family does not take the shape (the dispatcher then tries the
 *   next one); <family>_workspace() the elements it needs (0 if none)
 *
 * The typed helpers (ep_apply, fill_bias, transpose, ...) are declared per
 * element type by conv_internal_impl.h: name_f32, name_f64.
 */
#ifndef AI_CONV_INTERNAL_H
#define AI_CONV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../parallel.h"
#include "conv.h"
#include "gemm.h"
#include "simd.h"

#define AI_CAT_(a, b) a##b
#define AI_CAT(a, b) AI_CAT_(a, b)
#define FN(name) AI_CAT(name, SFX)

/*
 * The geometry of im2col/col2im, always 3-D: 1-D and 2-D convs get leading
 * spatial dims of size 1 (kernel 1, stride 1, no pad). `img` is the image
 * side (Conv: x, ConvTranspose: y), `grid` the side whose positions index the
 * columns (Conv: y, ConvTranspose: x).
 */
typedef struct {
    int64_t img[3], grid[3], k[3], s[3], d[3], p[3];
    int64_t img_size, grid_size, ksize; /* products of img, grid, k */
    bool pointwise; /* columns == image: 1x1 kernel, stride 1, no padding */
} conv_geom;


conv_geom conv_geom_of(const ai_conv_params *p, bool transposed);

/* Row r = (c, k0, k1, k2) of the columns reads image plane c, at position
 * grid_position * stride + off in each dim. */
typedef struct {
    int64_t plane, off[3];
} conv_tap;

static inline conv_tap conv_tap_of(const conv_geom *g, int64_t r)
{
    int64_t k[3] = {r / (g->k[1] * g->k[2]) % g->k[0], r / g->k[2] % g->k[1],
                    r % g->k[2]};
    conv_tap t = {.plane = r / g->ksize * g->img_size};
    for (int i = 0; i < 3; i++)
        t.off[i] = k[i] * g->d[i] - g->p[i];
    return t;
}

/* One input channel per group (depthwise, any channel multiplier): the direct
 * kernels of conv_depthwise.c, no columns. (One group is a plain conv.) */
static inline bool conv_is_depthwise(const ai_conv_params *p)
{
    return p->C == p->group && p->group > 1;
}

/* The output positions [*lo, *hi) of a grid dim of size `grid` whose input
 * position o * s + off lies in [0, img). */
static inline void tap_range(int64_t off, int64_t s, int64_t img, int64_t grid, int64_t *lo,
                      int64_t *hi)
{
    *lo = off >= 0 ? 0 : (-off + s - 1) / s;
    *hi = img - 1 - off < 0 ? 0 : (img - 1 - off) / s + 1;
    *hi = *hi < grid ? *hi : grid;
    *lo = *lo < *hi ? *lo : *hi;
}

/* ------------------------------------------------------------ phase planes */

/*
 * Depthwise forward (any stride) and input gradient (stride 1) of 1 or 2
 * spatial dims through zero-padded planes: a source plane (x, or dy for the
 * input gradient) is copied once into `s1 * s2` stride-phase planes of R1
 * rows of R2, phase (a, b) holding padded[i s1 + a][j s2 + b]. Output row o1
 * then reads tap k's values contiguously from base[k] + o1 R2 on: each
 * output row is a sum of K contiguous rows, with no bounds in the loops (the
 * pads are zeros). The forward taps are k d (padded by the conv's pads);
 * the input gradient is the stride-1 correlation of dy, padded by
 * P = (K - 1) d - p, with taps p + P - k d, in the same tap order.
 * Each of at most DW_PAD_SLOTS threads' ranges has its own slot of `size`
 * elements in the workspace. The weight gradient (any stride) reads the
 * same planes of x; narrow rows and stride-1 same-width planes have the
 * flat forms below.
 */
#define DW_PAD_MAX_TAPS 64
#define DW_PAD_SLOTS 32
#define DW_PAD_LANES 16 /* outputs per row chunk; rows are read this far past their end */
typedef struct {
    int64_t H, W, G1, G2; /* source plane, output plane */
    int64_t P1, P2, s1, s2, R1, R2;
    int64_t size;         /* elements of a slot: the phase planes and a tail */
    int64_t K, base[DW_PAD_MAX_TAPS];
} phase_planes;


/* The phase planes of Conv geometry g's source planes (x; dy with `dx`, for
 * stride 1), taps and sizes; false for 3 spatial dims, too many taps, or
 * pads much larger than the image (conv_depthwise.c). */
bool phase_planes_of(const conv_geom *g, bool dx, phase_planes *d);

/* ------------------------------------------------- vectors and the epilogue */

AI_VEC_DECL(conv_vec8, float);
#ifdef AI_AVX512_KERNEL /* 16 floats (the AVX-512 kernels) */
typedef ai_vec16_f32 conv_vec16;
/* VEC_NO_CONTRACT for them: GCC 12 rebuilt a 64-byte __builtin_assoc_barrier
 * lane by lane (20 shuffles per vector); an empty asm keeps the product
 * unfused as well */
#define VEC16_NO_CONTRACT(v)     \
    ({                           \
        __typeof__(v) nc_ = (v); \
        __asm__("" : "+v"(nc_)); \
        nc_;                     \
    })
#endif
#if defined(__GNUC__)
/* VEC_NO_CONTRACT(v): v rounded as computed, not fused with the add that
 * follows into an FMA (AI_GEMM_CLONES functions contract a * b + c; the
 * epilogues must round as ep_apply does) */
#if defined(__has_builtin)
#if __has_builtin(__builtin_assoc_barrier)
#define VEC_NO_CONTRACT(v) __builtin_assoc_barrier(v)
#endif
#endif
#endif
#ifndef VEC_NO_CONTRACT
#define VEC_NO_CONTRACT(v) (v)
#endif
/* The forward epilogue on vector t in registers (any width), as ep_apply
 * computes it: t a + c (rounded twice) when `ab`, then max(t, 0) keeping
 * NaN when `relu`; a and c vectors or scalars. */
#define VEC_EPILOGUE(t, ab, a, c, relu) VEC_EPILOGUE_NC(t, ab, a, c, relu, VEC_NO_CONTRACT)
#define VEC_EPILOGUE_NC(t, ab, a, c, relu, NO_CONTRACT)                                    \
    do {                                                                                   \
        if (ab)                                                                            \
            (t) = NO_CONTRACT((t) * (a)) + (c);                                            \
        if (relu)                                                                          \
            (t) = (__typeof__(t))((__typeof__((t) <= 0))(t) & ~((t) <= 0)); /* NaN kept */ \
    } while (0)

/* dst (8 rows ldd apart) = the 8 x 8 block of src (rows lds apart)
 * transposed: 8 loads, 24 shuffles, 8 stores (the element loops of
 * transpose cost 4-5x as much). Where there are vector shuffles. */
#ifdef AI_HAVE_TRANSPOSE8
/* row i of the block to d[i] (8 rows anywhere) */
static inline __attribute__((always_inline)) void transpose8_to_f32(float *const d[8],
                                                                    const float *src,
                                                                    int64_t lds)
{
    conv_vec8 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = *(const conv_vec8 *)(src + i * lds);
    ai_transpose8_f32(r);
    for (int i = 0; i < 8; i++)
        *(conv_vec8 *)d[i] = r[i];
}

/* the block of rows s[i] (8 rows anywhere) to dst (rows ldd apart), or
 * added to it */
static inline __attribute__((always_inline)) void transpose8_from_f32(float *dst, int64_t ldd,
                                                                      const float *const s[8],
                                                                      bool add)
{
    conv_vec8 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = *(const conv_vec8 *)s[i];
    ai_transpose8_f32(r);
    for (int i = 0; i < 8; i++) {
        conv_vec8 *d = (conv_vec8 *)(dst + i * ldd);
        if (add)
            *d = *d + r[i];
        else
            *d = r[i];
    }
}

static inline __attribute__((always_inline)) void transpose8_f32(float *dst, int64_t ldd,
                                                                 const float *src, int64_t lds)
{
    float *d[8];
    for (int i = 0; i < 8; i++)
        d[i] = dst + i * ldd;
    transpose8_to_f32(d, src, lds);
}
#endif


/* Slots for `jobs` jobs: one per part of the pool (ai_parallel_parts), at
 * most `max_slots` (the workspace's), at most one per job. */
static inline int64_t n_slots_of(int64_t jobs, int64_t max_slots)
{
    const int64_t nt = ai_parallel_parts(), n = jobs < max_slots ? jobs : max_slots;
    return n > nt ? nt : n;
}


/* ------------------------------------------------------------ the families */

/* One convolution call. Forward: y = conv(x, w) + b, then the epilogue ep.
 * Backward: dx, dw, db accumulate (dx assigned with assign_dx); a kernel
 * that computes dx or dw sets it to NULL here, so the next ones skip it. */
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    ai_dtype dtype;
    void *y, *dx, *dw, *db;
    const void *x, *w, *b, *dy;
    void *ws;
    const ai_conv_epilogue *ep;
    bool assign_dx;
} conv_call;

/* conv_pointwise.c: 1x1 convolutions */
bool pointwise_direct_forward(const conv_call *c);
bool pointwise_batched_forward(const conv_call *c);
bool pointwise_images_forward(const conv_call *c);
bool pointwise_batched_backward(conv_call *c);
bool pointwise_images_backward(conv_call *c);
bool pointwise_input_grad(conv_call *c);
bool pointwise_weight_grad(conv_call *c);
bool pointwise_weight_grad_im2col(conv_call *c);
int64_t pointwise_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype);

/* conv_direct.c: direct convolution on stride-phase planes */
bool direct_forward(const conv_call *c);
bool direct_input_grad(conv_call *c);
/* q: the Conv whose forward is the input gradient of stride-1 Conv p (dy
 * padded by (k - 1) d - pad, w transposed and flipped); false when a pad
 * exceeds (k - 1) d or a stride is over 1 */
bool direct_input_grad_params(const ai_conv_params *p, ai_conv_params *q);
bool direct_weight_grad(conv_call *c);
int64_t direct_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype);
int64_t direct_input_grad_workspace(const ai_conv_params *p, ai_dtype dtype);

/* conv_blocked.c: direct convolution with output channels in vector lanes */
#define BLOCKED_MAX_TAPS 640
bool blocked_forward(const conv_call *c);
int64_t blocked_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype);
bool blocked_chain_accepts(const ai_conv_params *p, const conv_geom *g, bool x_blocked);
int64_t blocked_chain_workspace(const ai_conv_params *p, const conv_geom *g, bool x_blocked);
/* wp: w packed by blocked_chain_pack (the blocked and patch tiles' layout),
 * or NULL: packed into ws at the call */
int64_t blocked_chain_packed_elems(const ai_conv_params *p, const conv_geom *g);
void blocked_chain_pack(const ai_conv_params *p, const conv_geom *g, const float *w, float *wp);
void blocked_chain_forward(const ai_conv_params *p, float *y, const float *x, const float *w,
                           const float *wp, const float *b, float *ws,
                           const ai_conv_epilogue *ep, bool x_blocked, const float *r);
void blocked_add_residual(float *y, const float *r, int64_t n, bool relu);
bool patch_chain_accepts(const ai_conv_params *p, const conv_geom *g, bool x_blocked);
void patch_chain_forward(const ai_conv_params *p, float *y, const float *x, const float *w,
                         const float *wp, const float *b, float *ws,
                         const ai_conv_epilogue *ep, const float *r);

/* conv_winograd.c: 3x3 stride-1 convs of the blocked chains, Winograd F(2x2, 3x3) */
bool winograd_chain_accepts(const ai_conv_params *p, const conv_geom *g, bool x_blocked);
int64_t winograd_chain_workspace(const ai_conv_params *p, const conv_geom *g, bool x_blocked);
/* wp: U made by winograd_chain_pack, or NULL: made in ws at the call */
int64_t winograd_chain_packed_elems(const ai_conv_params *p);
void winograd_chain_pack(const ai_conv_params *p, const float *w, float *wp);
void winograd_chain_forward(const ai_conv_params *p, float *y, const float *x, const float *w,
                            const float *wp, const float *b, float *ws,
                            const ai_conv_epilogue *ep, const float *r);
/* NCHW x and y: f32 with the fast kernels on, the chain's shapes, planes of enough tiles */
bool winograd_forward(const conv_call *c);
bool winograd_input_grad(conv_call *c);
int64_t winograd_workspace(const ai_conv_params *p, ai_dtype dtype);

/* conv_shifted_gemm.c: stride-1 convolution as one GEMM per kernel tap */
bool shifted_gemm_accepts(const ai_conv_params *p, const conv_geom *g);
bool shifted_gemm_forward(const conv_call *c);
bool shifted_gemm_backward(conv_call *c);
int64_t shifted_gemm_workspace(const ai_conv_params *p, const conv_geom *g);

/* conv_depthwise.c: one input channel per group */
bool depthwise_narrow_forward(const conv_call *c);
bool depthwise_channels_last_forward(const conv_call *c);
bool depthwise_forward(const conv_call *c);
bool depthwise_narrow_input_grad(conv_call *c);
bool depthwise_channels_last_backward(conv_call *c);
bool depthwise_backward(conv_call *c);
int64_t depthwise_workspace(const ai_conv_params *p, const conv_geom *g);
bool depthwise_blocked_accepts(const ai_conv_params *p, const conv_geom *g);
int64_t depthwise_blocked_workspace(const ai_conv_params *p, const conv_geom *g);
void depthwise_blocked_forward(const ai_conv_params *p, float *y, const float *x,
                               const float *w, const float *b, float *ws,
                               const ai_conv_epilogue *ep, bool x_blocked);

/* conv_im2col.c: im2col (col2im) + GEMM, the general case; ConvTranspose */
bool im2col_forward(const conv_call *c);
bool im2col_backward(conv_call *c);
void im2col_transposed_forward(const conv_call *c);
void im2col_transposed_backward(conv_call *c);
int64_t im2col_workspace(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype,
                         bool transposed);

/* the typed helpers: float32, then float64 */
#define T float
#define SFX _f32
#include "conv_internal_impl.h"
#define T double
#define SFX _f64
#include "conv_internal_impl.h"

#endif
