/*
 * conv_internal_impl.h — the typed half of conv_internal.h, written once for
 * the element type T (name suffix SFX: _f32, _f64); conv_internal.h includes
 * it once per type and this file undefines T and SFX. Not a public header.
 */

AI_VEC_DECL(FN(vec), T);

/* The operands of one im2col, col2im, fill_bias or bias_backward pass on
 * the thread pool. */
typedef struct {
    const conv_geom *g;
    T *dst;
    const T *src;
    int64_t N, M, S;
} FN(cols_job);


/* dst[0, n) = src[0, n) + *bias (when bias), then the epilogue ep (NULL:
 * none) of output channel m of M; dst may be src. */
static inline void FN(ep_apply)(T *dst, const T *src, int64_t n, const T *bias,
                                const ai_conv_epilogue *ep, int64_t m, int64_t M)
{
    const T *ab = ep ? ep->ab : NULL;
    const bool relu = ep && ep->relu;
    const T a = ab ? ab[m] : 1, c = ab ? ab[M + m] : 0, bv = bias ? *bias : 0;
    if (!ab && !relu) { /* the bias alone */
        for (int64_t e = 0; e < n; e++)
            dst[e] = bias ? src[e] + bv : src[e];
        return;
    }
    for (int64_t e = 0; e < n; e++) {
        T v = bias ? src[e] + bv : src[e];
        v = ab ? v * a + c : v;
        dst[e] = relu && !(v > 0 || v != v) ? 0 : v;
    }
}


/* Planes [m0, m1) of one image y (M, S) of a forward: + b[m] (when b), then
 * the epilogue. */
typedef struct {
    T *y;
    const T *b;
    const ai_conv_epilogue *ep;
    int64_t M, S;
} FN(ep_job);

/* *r = v[c, c + VL), zeros past M (and without v); a whole vector is one
 * load (lanes stored one by one and read back as a vector stall the load) */
static inline void FN(lane_vec)(FN(vec) *r, const T *v, int64_t c, int64_t M)
{
    enum { VL = AI_VEC_LANES(T) };
    if (v && c + VL <= M) {
        memcpy(r, v + c, sizeof *r);
        return;
    }
    T l[VL] = {0};
    for (int i = 0; v && i < VL && c + i < M; i++)
        l[i] = v[c + i];
    memcpy(r, l, sizeof *r);
}


/* conv_passes.c: passes over whole planes that several families run */
void FN(fill_bias)(T *y, const T *b, int64_t N, int64_t M, int64_t S);
void FN(ep_plane)(T *y, int64_t n, const ai_conv_epilogue *ep, int64_t m, int64_t M);
void FN(ep_range)(void *ctx, int64_t m0, int64_t m1);
void FN(bias_backward)(T *db, const T *dy, int64_t N, int64_t M, int64_t S);
void FN(transpose)(T *dst, int64_t ldd, const T *src, int64_t lds, int64_t rows, int64_t cols,
                   bool add);
/* conv_im2col.c */
void FN(im2col_rows)(T *col, const T *img, const conv_geom *g, int64_t r0, int64_t r1,
                     int64_t ld);
void FN(gemm_image)(const ai_conv_params *p, const conv_geom *g, T *y, const T *x, const T *w,
                    const T *b, T *ws, const ai_conv_epilogue *ep, int64_t n, bool bias);
/* conv_depthwise.c */
void FN(phase_planes_fill)(const phase_planes *d, T *buf, const T *src, bool zeroed);

#undef T
#undef SFX
