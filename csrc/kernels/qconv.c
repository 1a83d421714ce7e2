/*
 * qconv.c — QConv and QGemm on the int8 GEMM (qgemm.c), threaded over
 * jobs with a workspace slot per part.
 *
 *   depthwise (c = m = group), stride 1: direct, each plane padded once;
 *       the taps run over the padded plane as one contiguous line (the
 *       columns past each output row are computed and dropped), int32
 *       accumulators, then the requantizing store row by row; small
 *       planes on VNNI with VBMI: from registers by byte permutations;
 *       AVX2: an int16 plane, the taps in pairs by vpmaddwd
 *   pointwise (1x1, stride 1, no padding): the input's rows are the panel's
 *   row stride 1: "shifted planes", one per input channel and kernel column
 *       kx, made once per image: S[ci][kx][r][ox] = u(row r - pt, column
 *       ox sw + kx dw - pl), the padded rows cut to the ow positions that
 *       column kx reads. Tap (ci, ky, kx) of output position j = oy ow + ox
 *       is then S[ci][kx] at j + ky dh ow: every tap is a contiguous run of
 *       positions, so the panel takes the c kh kw taps densely (k rounded up
 *       to 4 once, not each kernel row), 16 positions of 4 taps at a time
 *       by a 4 x 16 byte transpose
 *   larger row strides, kw >= 2, column stride <= 4: row panels (below)
 *   otherwise: im2col rows (0 in the padding) for a chunk of output
 *       positions, packed into a panel
 *   QGemm: x's rows packed as the panel's columns (4 bytes at a time), the
 *       outputs stored transposed (y[j m + r])
 * ai_qconv_i32 and ai_qfc_i32 (ConvInteger, MatMulInteger) store the int32
 * accumulators instead of requantizing them.
 * The weight pack (qgemm.c) is made at the first forward of a plan and kept
 * in the node's state when the weights and bias are constants.
 */
#include <string.h>

#include "../parallel.h"
#include "qkernels.h"
#include "simd.h"
#ifdef AI_AVX512_KERNEL
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Parts of a job list: each has a workspace slot. */
#define Q_SLOTS 8
/* Output positions per im2col chunk: its panel stays within Q_CHUNK_BYTES. */
#define Q_CHUNK_BYTES 32768

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

static bool is_depthwise(const aik_window *p)
{
    return p->group == p->c && p->m == p->c && p->sh == 1 && p->sw == 1;
}

static bool is_pointwise(const aik_window *p)
{
    return p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && p->pt == 0 &&
           p->pl == 0 && p->oh == p->h && p->ow == p->w;
}

/* Row panels: the taps of a kernel row padded to kw4 (a multiple of 4), so
 * that the 4 bytes of one output position at 4 consecutive k are 4
 * consecutive bytes of a padded input row (stride in columns <= 4, no
 * column dilation): the panel is copied from the padded input, 4 bytes per
 * position, or 16 positions of one row by 4 byte shuffles, instead of an
 * im2col. Taken where the padding of kw to kw4 adds at most as many
 * products as there are (kw >= 2). */
static bool is_rowpack(const aik_window *p)
{
    return p->dw == 1 && p->sw <= 4 && p->kw >= 2;
}

/* Shifted planes (above): any kernel with row stride 1 that is not
 * pointwise; kw planes per channel of hp x ow bytes instead of an im2col's
 * kh kw. Preferred to the row panels: the same packing work per 4 taps,
 * but no taps of padding and no blocks split across output rows (LeNet's
 * 5x5 convolutions: 0.6x the time, ResNet-8's 3x3 of stride 1: 0.75x). */
static bool is_shifted(const aik_window *p)
{
    return p->sh == 1 && !is_pointwise(p);
}

typedef struct {
    bool shifted;
    bool rowpack;
    int32_t k;     /* the panel's reduction: channels per group x taps (padded) */
    int32_t kw4;   /* rowpack: kw rounded up to 4 */
    int32_t hp, wp; /* rowpack: the padded input planes; shifted: hp x ow each */
    int64_t chunk; /* output positions per job */
    int64_t chunks;
    size_t rows_bytes, panel_bytes, slot_bytes;
} conv_geom;

static conv_geom conv_geometry(const aik_window *p)
{
    conv_geom g;
    const int64_t os = (int64_t)p->oh * p->ow;
    const int32_t cg = p->c / p->group;
    g.shifted = is_shifted(p);
    g.rowpack = !g.shifted && is_rowpack(p);
    g.kw4 = (p->kw + 3) & ~3;
    g.k = cg * p->kh * (g.rowpack ? g.kw4 : p->kw);
    g.hp = (p->oh - 1) * p->sh + (p->kh - 1) * p->dh + 1;
    g.wp = g.shifted ? p->ow : (p->ow - 1) * p->sw + g.kw4;
    const int64_t kp = (g.k + 3) & ~3;
    g.chunk = Q_CHUNK_BYTES / kp / 64 * 64;
    if (g.chunk < 64)
        g.chunk = 64;
    if (g.chunk > os)
        g.chunk = os;
    g.chunks = os ? (os + g.chunk - 1) / g.chunk : 0;
    /* rowpack: the padded planes, and 16 bytes for the shuffles' loads;
     * shifted: the planes, 16 bytes for the loads of a last partial block,
     * then each tap's offset (k rounded up to 4) */
    g.rows_bytes = g.shifted ? ALIGN64((size_t)cg * p->kw * g.hp * g.wp + 16) +
                                   ALIGN64(sizeof(int64_t) * (size_t)kp)
                   : g.rowpack ? ALIGN64((size_t)cg * g.hp * g.wp + 16)
                   : is_pointwise(p) ? 0
                                     : ALIGN64((size_t)g.k * (size_t)g.chunk);
    g.panel_bytes = ALIGN64(ai_qpanel_bytes(g.k, g.chunk));
    g.slot_bytes = g.rows_bytes + g.panel_bytes;
    return g;
}

/* depthwise: the padded plane (int8) and the int32 accumulators */
/* depthwise: the padded plane (int8, or u8 on the VNNI path) with DW_SLACK
 * bytes past its end, the VNNI path's 4-byte windows of it (as many
 * positions; the AVX2 path's int16 plane there), the int32 accumulators
 * (16 past the last, the vector paths' full vectors) */
#define DW_SLACK 48
static void dw_geometry(const aik_window *p, int32_t *hp, int32_t *wp, size_t *slot)
{
    *hp = p->oh - 1 + p->dh * (p->kh - 1) + 1;
    *wp = p->ow - 1 + p->dw * (p->kw - 1) + 1;
    const size_t plane = (size_t)*hp * *wp;
    *slot = ALIGN64(plane + DW_SLACK) + ALIGN64(4 * (plane + DW_SLACK)) +
            ALIGN64(sizeof(int32_t) * ((size_t)p->oh * *wp + 16));
}

void ai_qconv_sizes(const aik_window *p, size_t *ws_bytes, size_t *state_bytes)
{
    if (is_depthwise(p)) {
        int32_t hp, wp;
        size_t slot;
        dw_geometry(p, &hp, &wp, &slot);
        *ws_bytes = Q_SLOTS * slot;
        *state_bytes = 0;
        return;
    }
    const conv_geom g = conv_geometry(p);
    *ws_bytes = Q_SLOTS * g.slot_bytes;
    *state_bytes = 64 + ai_qweights_bytes(p->m, g.k);
}

/* The weight pack in `state`: a header (whether it is made) then the pack. */
static void weights_of(ai_qweights *q, void *state, bool const_weights, int32_t m, int32_t k,
                       int32_t seg, int32_t seg_pad, const int8_t *w, const int32_t *bias)
{
    int64_t *made = state;
    if (const_weights && *made) {
        memcpy(q, made + 1, sizeof *q);
        return;
    }
    ai_qweights_pack(q, (char *)state + 64, m, k, seg, seg_pad, w, bias);
    if (const_weights) {
        memcpy(made + 1, q, sizeof *q);
        *made = 1;
    }
}

static int64_t n_slots_of(int64_t jobs)
{
    int64_t s = ai_parallel_parts();
    s = s > Q_SLOTS ? Q_SLOTS : s;
    return jobs < s ? jobs : s;
}

/* ---------------------------------------------------------------- im2col + GEMM */

typedef struct {
    const aik_window *p;
    conv_geom g;
    const int8_t *x;
    const ai_qweights *q;
    const aik_rq *rq;
    int8_t *y;
    char *ws;
    int64_t jobs, n_slots;
    int32_t *y32; /* ai_qconv_i32's */
} conv_job;

/* rows (k, cols) of the chunk [p0, p0 + cols) of group input xg */
AI_SHORT_LOOPS static void im2col_rows(const aik_window *p, const int8_t *xg, int64_t p0,
                                       int64_t cols, int8_t *rows)
{
    const int32_t cg = p->c / p->group;
    int8_t *dst = rows;
    for (int32_t ci = 0; ci < cg; ci++) {
        const int8_t *xc = xg + (int64_t)ci * p->h * p->w;
        for (int32_t ky = 0; ky < p->kh; ky++)
            for (int32_t kx = 0; kx < p->kw; kx++, dst += cols) {
                int32_t oy = (int32_t)(p0 / p->ow), ox = (int32_t)(p0 % p->ow);
                for (int64_t j = 0; j < cols; ox = 0, oy++) {
                    const int32_t run = (int32_t)(p->ow - ox < cols - j ? p->ow - ox : cols - j);
                    const int32_t iy = oy * p->sh - p->pt + ky * p->dh;
                    int8_t *d = dst + j;
                    j += run;
                    if (iy < 0 || iy >= p->h) {
                        for (int32_t t = 0; t < run; t++)
                            d[t] = 0;
                        continue;
                    }
                    const int8_t *xr = xc + (int64_t)iy * p->w;
                    const int32_t ix0 = ox * p->sw - p->pl + kx * p->dw;
                    if (p->sw == 1) { /* loops, not calls: runs are a row or less */
                        int32_t a = -ix0, b = p->w - ix0;
                        a = a < 0 ? 0 : a > run ? run : a;
                        b = b < a ? a : b > run ? run : b;
                        for (int32_t t = 0; t < a; t++)
                            d[t] = 0;
                        for (int32_t t = a; t < b; t++)
                            d[t] = xr[ix0 + t];
                        for (int32_t t = b; t < run; t++)
                            d[t] = 0;
                    } else {
                        for (int32_t t = 0; t < run; t++) {
                            const int32_t ix = ix0 + t * p->sw;
                            d[t] = ix >= 0 && ix < p->w ? xr[ix] : 0;
                        }
                    }
                }
            }
    }
}

/* ---------------------------------------------------------------- shifted planes */

/* The shifted planes of the cg input channels of group input xg (u = x ^
 * 0x80, 128 in the padding) and 16 bytes of 128 after them. */
AI_SHORT_LOOPS static void shifted_planes(const aik_window *p, const conv_geom *g,
                                          const int8_t *xg, uint8_t *dst)
{
    const int32_t cg = p->c / p->group, ow = p->ow;
    uint8_t *d = dst;
    for (int32_t ci = 0; ci < cg; ci++) {
        const int8_t *xc = xg + (int64_t)ci * p->h * p->w;
        for (int32_t kx = 0; kx < p->kw; kx++) {
            /* positions [a, b) read columns inside the input */
            const int32_t ix0 = kx * p->dw - p->pl;
            int32_t a = 0, b = ow;
            while (a < ow && ix0 + (int64_t)a * p->sw < 0)
                a++;
            while (b > a && ix0 + (int64_t)(b - 1) * p->sw >= p->w)
                b--;
            for (int32_t r = 0; r < g->hp; r++, d += ow) {
                const int32_t iy = r - p->pt;
                if (iy < 0 || iy >= p->h) {
                    for (int32_t t = 0; t < ow; t++)
                        d[t] = 0x80;
                    continue;
                }
                const int8_t *xr = xc + (int64_t)iy * p->w + ix0;
                for (int32_t t = 0; t < a; t++)
                    d[t] = 0x80;
                if (p->sw == 1)
                    for (int32_t t = a; t < b; t++)
                        d[t] = (uint8_t)(xr[t] ^ 0x80);
                else
                    for (int32_t t = a; t < b; t++)
                        d[t] = (uint8_t)(xr[(int64_t)t * p->sw] ^ 0x80);
                for (int32_t t = b; t < ow; t++)
                    d[t] = 0x80;
            }
        }
    }
    for (int t = 0; t < 16; t++) /* what a last partial block loads past the end */
        d[t] = 0x80;
}

#ifdef AI_AVX512_KERNEL
/* shifted_planes for column stride 1 and ow <= 64: a row by one masked
 * load and one or two masked stores */
__attribute__((target("arch=x86-64-v4"))) static void
shifted_planes_avx512(const aik_window *p, const conv_geom *g, const int8_t *xg, uint8_t *dst)
{
    const int32_t cg = p->c / p->group, ow = p->ow;
    const __m512i f = _mm512_set1_epi8((char)0x80);
    const __mmask64 all = ow == 64 ? ~(__mmask64)0 : ((__mmask64)1 << ow) - 1;
    uint8_t *d = dst;
    for (int32_t ci = 0; ci < cg; ci++) {
        const int8_t *xc = xg + (int64_t)ci * p->h * p->w;
        for (int32_t kx = 0; kx < p->kw; kx++) {
            const int32_t ix0 = kx * p->dw - p->pl;
            const int32_t a = ix0 < 0 ? (-ix0 < ow ? -ix0 : ow) : 0;
            const int32_t b = p->w - ix0 < a ? a : p->w - ix0 > ow ? ow : p->w - ix0;
            const __mmask64 in = b - a == 64 ? ~(__mmask64)0 : ((__mmask64)1 << (b - a)) - 1;
            for (int32_t r = 0; r < g->hp; r++, d += ow) {
                const int32_t iy = r - p->pt;
                if (iy < 0 || iy >= p->h || a == b) {
                    _mm512_mask_storeu_epi8(d, all, f);
                    continue;
                }
                /* 128 in the lanes past b - a */
                const __m512i v = _mm512_xor_si512(
                    _mm512_maskz_loadu_epi8(in, xc + (int64_t)iy * p->w + ix0 + a), f);
                if (a == 0) {
                    _mm512_mask_storeu_epi8(d, all, v);
                    continue;
                }
                _mm512_mask_storeu_epi8(d, all, f);
                _mm512_mask_storeu_epi8(d + a, in, v);
            }
        }
    }
    _mm_storeu_si128((__m128i *)d, _mm512_castsi512_si128(f));
}
#endif

/* off[k]: where tap k (ci, ky, kx, the weights' order) reads position 0 of
 * the shifted planes; -1 for the taps past k (u = 128). */
static void shifted_offsets(const aik_window *p, const conv_geom *g, int64_t *off)
{
    const int32_t cg = p->c / p->group, ow = p->ow;
    const int64_t plane = (int64_t)g->hp * ow;
    int32_t k = 0;
    for (int32_t ci = 0; ci < cg; ci++)
        for (int32_t ky = 0; ky < p->kh; ky++)
            for (int32_t kx = 0; kx < p->kw; kx++)
                off[k++] = ((int64_t)ci * p->kw + kx) * plane + (int64_t)ky * p->dh * ow;
    for (; k < ((g->k + 3) & ~3); k++)
        off[k] = -1;
}

/* The panel of positions [p0, p0 + cols) from the shifted planes: per
 * block and 4 taps, 16 bytes of each tap's run, transposed to 4 bytes per
 * position (the columns past cols read what follows: computed, not stored). */
static void shifted_panel(const conv_geom *g, const uint8_t *planes, const int64_t *off,
                          int64_t p0, int64_t cols, uint8_t *panel)
{
    const int32_t kp = (g->k + 3) & ~3;
    for (int64_t b = 0; b < (cols + 15) / 16; b++) {
        uint8_t *dst = panel + b * 16 * kp;
        const uint8_t *src = planes + p0 + b * 16;
        for (int32_t kb = 0; kb < kp; kb += 4, dst += 64) {
#ifdef __SSE2__
            __m128i r[4];
            for (int t = 0; t < 4; t++)
                r[t] = off[kb + t] >= 0
                           ? _mm_loadu_si128((const __m128i *)(src + off[kb + t]))
                           : _mm_set1_epi8((char)0x80);
            ai_qpanel_block(dst, r);
#else
            for (int j = 0; j < 16; j++)
                for (int t = 0; t < 4; t++)
                    dst[4 * j + t] = off[kb + t] >= 0 ? src[off[kb + t] + j] : 0x80;
#endif
        }
    }
}

/* The cg input planes of a group as u = x ^ 0x80, padded (u = 128) to
 * hp x wp: row r, column t hold input (r - pt, t - pl). */
AI_SHORT_LOOPS static void pad_planes(const aik_window *p, const conv_geom *g, const int8_t *xg,
                                      uint8_t *dst)
{
    const int32_t cg = p->c / p->group;
    for (int32_t ci = 0; ci < cg; ci++) {
        const int8_t *xc = xg + (int64_t)ci * p->h * p->w;
        for (int32_t r = 0; r < g->hp; r++, dst += g->wp) {
            const int32_t iy = r - p->pt;
            int32_t a = iy < 0 || iy >= p->h ? g->wp : p->pl, b = p->pl + p->w;
            b = b > g->wp ? g->wp : b < a ? a : b;
            const int64_t at = (int64_t)iy * p->w - p->pl;
            for (int32_t t = 0; t < a; t++)
                dst[t] = 0x80;
            for (int32_t t = a; t < b; t++)
                dst[t] = (uint8_t)(xc[at + t] ^ 0x80);
            for (int32_t t = b; t < g->wp; t++)
                dst[t] = 0x80;
        }
    }
    for (int t = 0; t < 16; t++) /* what the shuffles load past the end */
        dst[t] = 0x80;
}

#ifdef AI_AVX512_KERNEL
/* 16 positions of one output row, stride sw <= 4 in columns: position i's
 * 4 bytes at src + i sw, as 4 byte shuffles of 16-byte loads */
__attribute__((target("arch=x86-64-v3"))) static void
shuffle16(const aik_window *p, const conv_geom *g, int64_t at, const uint8_t *planes,
          uint8_t *dst)
{
    int8_t m[16];
    for (int i = 0; i < 16; i++)
        m[i] = (int8_t)(i / 4 * p->sw + i % 4);
    const __m128i mask = _mm_loadu_si128((const __m128i *)m);
    const int32_t cg = p->c / p->group;
    for (int32_t ci = 0; ci < cg; ci++)
        for (int32_t ky = 0; ky < p->kh; ky++) {
            const uint8_t *row = planes + ((int64_t)ci * g->hp + (int64_t)ky * p->dh) * g->wp + at;
            for (int32_t kx = 0; kx < g->kw4; kx += 4, dst += 64)
                for (int q = 0; q < 4; q++)
                    _mm_storeu_si128((__m128i *)(dst + 16 * q),
                                     _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(
                                                          row + kx + 4 * q * p->sw)),
                                                      mask));
        }
}

/* A full block across output rows: each group of 4 positions in one row
 * by a byte shuffle, the others 4 bytes at a time (at: each position's
 * first byte in a plane). */
__attribute__((target("arch=x86-64-v3"))) static void
shuffle_groups(const aik_window *p, const conv_geom *g, const int64_t *at, int64_t j0,
               const uint8_t *planes, uint8_t *dst)
{
    int8_t m[16];
    for (int i = 0; i < 16; i++)
        m[i] = (int8_t)(i / 4 * p->sw + i % 4);
    const __m128i mask = _mm_loadu_si128((const __m128i *)m);
    bool one_row[4];
    for (int q = 0; q < 4; q++)
        one_row[q] = (j0 + 4 * q) / p->ow == (j0 + 4 * q + 3) / p->ow;
    const int32_t cg = p->c / p->group;
    for (int32_t ci = 0; ci < cg; ci++)
        for (int32_t ky = 0; ky < p->kh; ky++) {
            const uint8_t *row = planes + ((int64_t)ci * g->hp + (int64_t)ky * p->dh) * g->wp;
            for (int32_t kx = 0; kx < g->kw4; kx += 4, dst += 64)
                for (int q = 0; q < 4; q++) {
                    if (one_row[q]) {
                        _mm_storeu_si128((__m128i *)(dst + 16 * q),
                                         _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(
                                                              row + at[4 * q] + kx)),
                                                          mask));
                        continue;
                    }
                    for (int i = 4 * q; i < 4 * q + 4; i++)
                        memcpy(dst + 4 * i, row + at[i] + kx, 4);
                }
        }
}
#endif

/* The panel of positions [p0, p0 + cols) from the padded planes. */
AI_SHORT_LOOPS static void rowpack_panel(const aik_window *p, const conv_geom *g,
                                         const uint8_t *planes, int64_t p0, int64_t cols,
                                         uint8_t *panel)
{
    const int32_t cg = p->c / p->group, kp = (g->k + 3) & ~3;
    for (int64_t b = 0; b < (cols + 15) / 16; b++) {
        uint8_t *dst = panel + b * 16 * kp;
        const int64_t j0 = p0 + b * 16;
        const int n = cols - b * 16 < 16 ? (int)(cols - b * 16) : 16;
#ifdef AI_AVX512_KERNEL
        const int64_t oy = j0 / p->ow, ox = j0 % p->ow;
        if (n == 16 && ox + 16 <= p->ow && ai_q_path() >= AI_Q_AVX2) {
            shuffle16(p, g, oy * p->sh * g->wp + ox * p->sw, planes, dst);
            continue;
        }
#endif
        int64_t at[16] = {0}; /* each position's first byte in a plane */
        for (int i = 0; i < n; i++) {
            const int64_t jj = j0 + i;
            at[i] = jj / p->ow * p->sh * g->wp + jj % p->ow * p->sw;
        }
#ifdef AI_AVX512_KERNEL
        if (n == 16 && ai_q_path() >= AI_Q_AVX2) {
            shuffle_groups(p, g, at, j0, planes, dst);
            continue;
        }
#endif
        for (int32_t ci = 0; ci < cg; ci++)
            for (int32_t ky = 0; ky < p->kh; ky++) {
                const uint8_t *row =
                    planes + ((int64_t)ci * g->hp + (int64_t)ky * p->dh) * g->wp;
                for (int32_t kx = 0; kx < g->kw4; kx += 4, dst += 64) {
                    if (n == 16) /* (a loop the compiler unrolls) */
                        for (int i = 0; i < 16; i++)
                            memcpy(dst + 4 * i, row + at[i] + kx, 4);
                    else
                        for (int i = 0; i < 16; i++) {
                            uint32_t v = 0x80808080u; /* past the end: x = 0 */
                            if (i < n)
                                memcpy(&v, row + at[i] + kx, 4);
                            memcpy(dst + 4 * i, &v, 4);
                        }
                }
            }
    }
}

static void conv_range(void *ctx, int64_t lo, int64_t hi)
{
    const conv_job *j = ctx;
    const aik_window *p = j->p;
    const conv_geom *g = &j->g;
    const int32_t cg = p->c / p->group, mg = p->m / p->group;
    const int64_t os = (int64_t)p->oh * p->ow;
    for (int64_t s = lo; s < hi; s++) {
        int8_t *rows = (int8_t *)j->ws + s * g->slot_bytes;
        uint8_t *panel = (uint8_t *)rows + g->rows_bytes;
        int64_t padded = -1; /* shifted, rowpack: the image and group in `rows` */
        for (int64_t job = s * j->jobs / j->n_slots; job < (s + 1) * j->jobs / j->n_slots;
             job++) {
            const int64_t chunk = job % g->chunks, ng = job / g->chunks;
            const int32_t gi = (int32_t)(ng % p->group);
            const int64_t n = ng / p->group;
            const int64_t p0 = chunk * g->chunk;
            const int64_t cols = os - p0 < g->chunk ? os - p0 : g->chunk;
            const int8_t *xg = j->x + (n * p->c + (int64_t)gi * cg) * p->h * p->w;
            if (g->shifted) {
                int64_t *off = (int64_t *)(rows + g->rows_bytes) - ((g->k + 3) & ~3);
                if (padded != ng) {
#ifdef AI_AVX512_KERNEL
                    if (p->sw == 1 && p->ow <= 64 && ai_q_path() >= AI_Q_VNNI)
                        shifted_planes_avx512(p, g, xg, (uint8_t *)rows);
                    else
#endif
                        shifted_planes(p, g, xg, (uint8_t *)rows);
                    if (padded < 0)
                        shifted_offsets(p, g, off);
                }
                padded = ng;
                shifted_panel(g, (const uint8_t *)rows, off, p0, cols, panel);
            } else if (g->rowpack) {
                if (padded != ng)
                    pad_planes(p, g, xg, (uint8_t *)rows);
                padded = ng;
                rowpack_panel(p, g, (const uint8_t *)rows, p0, cols, panel);
            } else if (is_pointwise(p)) {
                ai_qpack_rows(g->k, cols, xg + p0, os, panel);
            } else {
                im2col_rows(p, xg, p0, cols, rows);
                ai_qpack_rows(g->k, cols, rows, cols, panel);
            }
            ai_qweights qg = *j->q;
            qg.m = mg;
            qg.cb += (int64_t)gi * mg;
            qg.w8 += (int64_t)gi * mg * qg.kp;
            qg.w16 += (int64_t)gi * mg * qg.kp;
            const int64_t at = (n * p->m + (int64_t)gi * mg) * os + p0;
            if (j->y32) {
                const ai_qi32 o = {j->y32 + at, os, 1, NULL, NULL};
                ai_qgemm_i32(&qg, cols, panel, &o);
            } else {
                ai_qgemm(&qg, cols, panel, j->rq + (int64_t)gi * mg, j->y + at, os, 1);
            }
        }
    }
}

/* ---------------------------------------------------------------- depthwise */

typedef struct {
    const aik_window *p;
    const int8_t *x, *w;
    const int32_t *bias;
    const aik_rq *rq;
    int8_t *y;
    char *ws;
    int32_t hp, wp;
    size_t slot;
    int64_t jobs, n_slots;
    bool vnni; /* dw_plane_vnni */
    bool avx2; /* dw_plane_avx2 */
    const struct dw_small *small; /* dw_plane_small */
    int32_t *y32; /* ai_qconv_i32's */
} dw_job;

/*
 * Small planes (VNNI and VBMI, h w <= 128, oh ow <= 128): no padded plane,
 * no windows in memory. The input plane sits in two registers and every
 * 16 outputs and 4 taps of a kernel row take their 64 bytes from it by
 * one two-register byte permutation (vpermi2b), zeroed in the padding
 * (then u = 128), then one vpdpbusd; outputs in their own order, stored
 * 16 at a time. The permutations depend on the geometry only: made once
 * per call. DS-CNN's depthwise layers (25 x 5) are of this kind.
 */
#ifdef AI_AVX512_KERNEL
#define DW_SMALL_BLOCKS 8 /* 128 outputs */
#define DW_SMALL_TAPS 16  /* kernel rows x groups of 4 taps */
struct dw_small {
    int32_t n_taps, kw4;
    uint8_t idx[DW_SMALL_BLOCKS][DW_SMALL_TAPS][64]; /* byte of the input plane */
    uint64_t keep[DW_SMALL_BLOCKS][DW_SMALL_TAPS];   /* 0: padding, tap past kw */
};

static bool dw_small_fits(const aik_window *p)
{
    return (int64_t)p->h * p->w <= 128 && (int64_t)p->oh * p->ow <= 16 * DW_SMALL_BLOCKS &&
           p->kh * ((p->kw + 3) / 4) <= DW_SMALL_TAPS;
}

static void dw_small_tables(const aik_window *p, struct dw_small *t)
{
    const int64_t os = (int64_t)p->oh * p->ow;
    t->kw4 = (p->kw + 3) & ~3;
    t->n_taps = p->kh * (t->kw4 / 4);
    memset(t->keep, 0, sizeof t->keep);
    for (int64_t b = 0; b < (os + 15) / 16; b++)
        for (int32_t tp = 0; tp < t->n_taps; tp++) {
            const int32_t ky = tp / (t->kw4 / 4), g = tp % (t->kw4 / 4);
            for (int l = 0; l < 64; l++) {
                const int64_t j = 16 * b + l / 4;
                const int32_t kx = 4 * g + l % 4;
                const int32_t iy = (int32_t)(j / p->ow) + ky * p->dh - p->pt;
                const int32_t ix = (int32_t)(j % p->ow) + kx * p->dw - p->pl;
                const bool in = j < os && kx < p->kw && iy >= 0 && iy < p->h && ix >= 0 &&
                                ix < p->w;
                t->idx[b][tp][l] = in ? (uint8_t)(iy * p->w + ix) : 0;
                t->keep[b][tp] |= (uint64_t)in << l;
            }
        }
}
#endif

AI_VECTOR_CLONES AI_SHORT_LOOPS
static void dw_plane(const dw_job *j, int64_t plane, int8_t *xpad, int32_t *acc)
{
    /* locals: the int8 stores may alias any memory, not these */
    const aik_window win = *j->p, *p = &win;
    const int32_t c = (int32_t)(plane % p->c), hp = j->hp, wp = j->wp;
    const int8_t *xc = j->x + plane * p->h * p->w;
    /* the padded plane: rows -pt .. hp - pt - 1, columns -pl .. wp - pl - 1 */
    for (int32_t r = 0; r < hp; r++) {
        const int32_t iy = r - p->pt;
        int8_t *d = xpad + (int64_t)r * wp;
        const int64_t at = (int64_t)iy * p->w - p->pl;
        int32_t a = iy < 0 || iy >= p->h ? wp : p->pl, b = p->pl + p->w;
        b = b > wp ? wp : b < a ? a : b;
        for (int32_t t = 0; t < a; t++)
            d[t] = 0;
        for (int32_t t = a; t < b; t++)
            d[t] = xc[at + t];
        for (int32_t t = b; t < wp; t++)
            d[t] = 0;
    }
    const int64_t len = (int64_t)(p->oh - 1) * wp + p->ow;
    const int32_t b0 = j->bias ? j->bias[c] : 0;
    for (int64_t i = 0; i < len; i++)
        acc[i] = b0;
    const int8_t *w = j->w + (int64_t)c * p->kh * p->kw;
    for (int32_t ky = 0; ky < p->kh; ky++)
        for (int32_t kx = 0; kx < p->kw; kx++) {
            const int32_t wv = w[ky * p->kw + kx];
            const int8_t *src = xpad + (int64_t)ky * p->dh * wp + (int64_t)kx * p->dw;
            for (int64_t i = 0; i < len; i++)
                acc[i] += wv * src[i];
        }
}

#ifdef AI_AVX512_KERNEL
/*
 * The VNNI depthwise plane (no column dilation): u, the padded plane as
 * u8 (x ^ 0x80); win[4 i + t] = u[i + t], the 4-byte window at each flat
 * position (16 at a time by byte shuffles); the taps of a kernel row go 4
 * at a time (kw padded to kw4 with zero weights): acc[i] = cb + sum over
 * rows ky and groups g of dot4(win[i + ky dh wp + 4 g], w4[ky][g]), one
 * vpdpbusd per 16 positions, row and group. cb = bias - 128 sum(w).
 */
__attribute__((target("arch=x86-64-v4,avx512vnni"))) static void
dw_plane_vnni(const dw_job *j, int64_t plane, uint8_t *u, uint8_t *win, int32_t *acc)
{
    const aik_window win_p = *j->p, *p = &win_p;
    const int32_t c = (int32_t)(plane % p->c), hp = j->hp, wp = j->wp;
    const int32_t kw4 = (p->kw + 3) & ~3;
    const int8_t *xc = j->x + plane * p->h * p->w;
    const int64_t n_u = (int64_t)hp * wp;
    const __m128i f = _mm_set1_epi8((char)0x80);
    for (int32_t r = 0; r < hp && wp <= 16; r++) { /* narrow planes: a row a store */
        const int32_t iy = r - p->pt;
        const int32_t nb = p->w < wp - p->pl ? p->w : wp - p->pl;
        const __mmask16 mk = (__mmask16)((1u << nb) - 1);
        uint8_t *d = u + (int64_t)r * wp; /* the 16 bytes spill into the next row */
        _mm_storeu_si128((__m128i *)d, f);
        if (iy >= 0 && iy < p->h)
            _mm_mask_storeu_epi8(d + p->pl, mk,
                                 _mm_xor_si128(_mm_maskz_loadu_epi8(mk, xc + (int64_t)iy * p->w),
                                               f));
    }
    for (int32_t r = 0; r < hp && wp > 16; r++) {
        const int32_t iy = r - p->pt;
        uint8_t *d = u + (int64_t)r * wp;
        int32_t a = iy < 0 || iy >= p->h ? wp : p->pl, b = p->pl + p->w;
        b = b > wp ? wp : b < a ? a : b;
        const int64_t at = (int64_t)iy * p->w - p->pl;
        for (int32_t t = 0; t < a; t++)
            d[t] = 0x80;
        for (int32_t t = a; t < b; t++)
            d[t] = (uint8_t)(xc[at + t] ^ 0x80);
        for (int32_t t = b; t < wp; t++)
            d[t] = 0x80;
    }
    for (int t = 0; t < DW_SLACK; t++)
        u[n_u + t] = 0x80;
    const __m128i mask = _mm_setr_epi8(0, 1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5, 3, 4, 5, 6);
    for (int64_t i = 0; i < n_u + DW_SLACK - 16; i += 4) /* the loads stay in u */
        _mm_storeu_si128((__m128i *)(win + 4 * i),
                         _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(u + i)), mask));
    const int8_t *w = j->w + (int64_t)c * p->kh * p->kw;
    int32_t w4[64];
    uint32_t sum = 0;
    for (int32_t ky = 0; ky < p->kh; ky++)
        for (int32_t g = 0; g < kw4 / 4; g++) {
            int8_t v[4];
            for (int t = 0; t < 4; t++) {
                const int32_t kx = 4 * g + t;
                v[t] = kx < p->kw ? w[ky * p->kw + kx] : 0;
                sum += (uint32_t)(int32_t)v[t];
            }
            memcpy(&w4[ky * (kw4 / 4) + g], v, 4);
        }
    const int32_t cb = (int32_t)((j->bias ? (uint32_t)j->bias[c] : 0u) - 128u * sum);
    const int64_t len = (int64_t)(p->oh - 1) * wp + p->ow;
    const int n_taps = p->kh * (kw4 / 4); /* groups of 4 taps: their windows' offsets */
    int64_t off[64];
    __m512i wv[64];
    for (int32_t ky = 0; ky < p->kh; ky++)
        for (int32_t g = 0; g < kw4 / 4; g++) {
            off[ky * (kw4 / 4) + g] = 4 * ((int64_t)ky * p->dh * wp + 4 * g);
            wv[ky * (kw4 / 4) + g] = _mm512_set1_epi32(w4[ky * (kw4 / 4) + g]);
        }
    if (n_taps == 3) /* 3 x 3 and 3 x 4 kernels, unrolled */
        for (int64_t i = 0; i < len; i += 16) {
            const uint8_t *s = win + 4 * i;
            __m512i a = _mm512_dpbusd_epi32(_mm512_set1_epi32(cb),
                                            _mm512_loadu_si512(s + off[0]), wv[0]);
            a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(s + off[1]), wv[1]);
            a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(s + off[2]), wv[2]);
            _mm512_storeu_si512(acc + i, a);
        }
    else
        for (int64_t i = 0; i < len; i += 16) {
            __m512i a = _mm512_set1_epi32(cb);
            for (int t = 0; t < n_taps; t++)
                a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(win + 4 * i + off[t]), wv[t]);
            _mm512_storeu_si512(acc + i, a);
        }
}
#endif

#ifdef AI_AVX512_KERNEL
/*
 * The AVX2 depthwise plane: the padded plane widened to int16 (x itself, 0
 * in the padding: no offset), the taps in pairs (an odd last one with a
 * zero partner); per 16 positions and pair, the two taps' runs interleaved
 * (vpunpck[lh]wd) and one vpmaddwd each against the pair's weights, the
 * sums in the unpacks' order (positions 0-3 and 8-11, 4-7 and 12-15) until
 * the last pair. DW_PAIRS pairs per pass over the positions, the sums kept
 * in acc between passes.
 */
#define DW_PAIRS 16
__attribute__((target("arch=x86-64-v3"))) static void
dw_plane_avx2(const dw_job *j, int64_t plane, int16_t *u, int32_t *acc)
{
    const aik_window win_p = *j->p, *p = &win_p;
    const int32_t c = (int32_t)(plane % p->c), hp = j->hp, wp = j->wp;
    const int64_t hw = (int64_t)p->h * p->w;
    const int8_t *xc = j->x + plane * hw;
    /* zeros, then the input rows from the top, 16 columns at a time (the
     * last ones with zeros past the row where the 16 bytes are in the
     * plane: over the padding and the rows still to come), and 16 zeros
     * past the end for the loads of the last positions */
    for (int64_t i = 0; i < (int64_t)hp * wp + 16; i += 16)
        _mm256_storeu_si256((__m256i *)(u + i), _mm256_setzero_si256());
    const int32_t nb = p->w < wp - p->pl ? p->w : wp - p->pl; /* columns kept */
    const __m256i lane = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int32_t iy = 0; iy < p->h && iy + p->pt < hp; iy++) {
        int16_t *d = u + (int64_t)(iy + p->pt) * wp + p->pl;
        const int8_t *src = xc + (int64_t)iy * p->w;
        int32_t t = 0;
        for (; t + 16 <= nb; t += 16) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(src + t));
            _mm256_storeu_si256((__m256i *)(d + t), _mm256_cvtepi8_epi16(v));
        }
        if (t < nb && (int64_t)iy * p->w + t + 16 <= hw) {
            const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(src + t)));
            const __m256i keep = _mm256_cmpgt_epi16(_mm256_set1_epi16((int16_t)(nb - t)), lane);
            _mm256_storeu_si256((__m256i *)(d + t), _mm256_and_si256(v, keep));
        } else
            for (; t < nb; t++)
                d[t] = src[t];
    }
    const int64_t len = (int64_t)(p->oh - 1) * wp + p->ow;
    const int32_t n_taps = p->kh * p->kw;
    const int8_t *w = j->w + (int64_t)c * n_taps;
    const __m256i bias = _mm256_set1_epi32(j->bias ? j->bias[c] : 0);
    for (int32_t t0 = 0; t0 < n_taps; t0 += 2 * DW_PAIRS) {
        const int np = n_taps - t0 < 2 * DW_PAIRS ? (n_taps - t0 + 1) / 2 : DW_PAIRS;
        const bool first = t0 == 0, last = t0 + 2 * np >= n_taps;
        int64_t off[2 * DW_PAIRS];
        uint16_t wt[2 * DW_PAIRS];
        int32_t ky = t0 / p->kw, kx = t0 % p->kw; /* tap t0 + e */
        for (int e = 0; e < 2 * np; e++) {
            const bool in = t0 + e < n_taps; /* else a copy of the last, weight 0 */
            off[e] = in ? (int64_t)ky * p->dh * wp + (int64_t)kx * p->dw : off[e - 1];
            wt[e] = (uint16_t)(in ? w[t0 + e] : 0);
            if (++kx == p->kw)
                kx = 0, ky++;
        }
        __m256i wv[DW_PAIRS];
        for (int e = 0; e < np; e++)
            wv[e] = _mm256_set1_epi32((int32_t)(wt[2 * e] | (uint32_t)wt[2 * e + 1] << 16));
        for (int64_t i = 0; i < len; i += 16) {
            __m256i lo = first ? bias : _mm256_loadu_si256((const __m256i *)(acc + i));
            __m256i hi = first ? bias : _mm256_loadu_si256((const __m256i *)(acc + i + 8));
            for (int e = 0; e < np; e++) {
                const __m256i a = _mm256_loadu_si256((const __m256i *)(u + i + off[2 * e]));
                const __m256i b = _mm256_loadu_si256((const __m256i *)(u + i + off[2 * e + 1]));
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), wv[e]));
                hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), wv[e]));
            }
            if (last) { /* the positions in order */
                const __m256i t = lo;
                lo = _mm256_permute2x128_si256(t, hi, 0x20);
                hi = _mm256_permute2x128_si256(t, hi, 0x31);
            }
            _mm256_storeu_si256((__m256i *)(acc + i), lo);
            _mm256_storeu_si256((__m256i *)(acc + i + 8), hi);
        }
    }
}
#endif

#ifdef AI_AVX512_KERNEL
__attribute__((target("arch=x86-64-v4,avx512vnni,avx512vbmi"))) static void
dw_plane_small(const dw_job *j, int64_t plane, int32_t *acc)
{
    const aik_window *p = j->p;
    const struct dw_small *t = j->small;
    const int32_t c = (int32_t)(plane % p->c), hw = p->h * p->w;
    const int64_t os = (int64_t)p->oh * p->ow;
    const int8_t *xc = j->x + plane * hw;
    const __m512i lo = _mm512_maskz_loadu_epi8(hw >= 64 ? ~(__mmask64)0
                                                        : ((__mmask64)1 << hw) - 1, xc);
    const __m512i hi = hw > 64 ? _mm512_maskz_loadu_epi8(hw == 128 ? ~(__mmask64)0
                                                                   : ((__mmask64)1 << (hw - 64)) - 1,
                                                         xc + 64)
                               : _mm512_setzero_si512();
    const int8_t *w = j->w + (int64_t)c * p->kh * p->kw;
    __m512i wv[DW_SMALL_TAPS];
    uint32_t sum = 0;
    for (int32_t tp = 0; tp < t->n_taps; tp++) {
        const int32_t ky = tp / (t->kw4 / 4), g = tp % (t->kw4 / 4);
        int8_t v[4];
        for (int e = 0; e < 4; e++) {
            const int32_t kx = 4 * g + e;
            v[e] = kx < p->kw ? w[ky * p->kw + kx] : 0;
            sum += (uint32_t)(int32_t)v[e];
        }
        int32_t w4;
        memcpy(&w4, v, 4);
        wv[tp] = _mm512_set1_epi32(w4);
    }
    const int32_t cb = (int32_t)((j->bias ? (uint32_t)j->bias[c] : 0u) - 128u * sum);
    const __m512i f = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < (os + 15) / 16; b++) {
        __m512i a = _mm512_set1_epi32(cb);
        for (int32_t tp = 0; tp < t->n_taps; tp++) {
            const __m512i u = _mm512_xor_si512(
                _mm512_maskz_permutex2var_epi8(t->keep[b][tp], lo,
                                               _mm512_loadu_si512(t->idx[b][tp]), hi),
                f);
            a = _mm512_dpbusd_epi32(a, u, wv[tp]);
        }
        _mm512_storeu_si512(acc + 16 * b, a);
    }
}
#endif

/* the plane's accumulators (rows of lda) requantized, or as they are */
static void dw_store(const dw_job *j, int64_t plane, const int32_t *acc, int64_t rows,
                     int64_t cols, int64_t lda)
{
    const int64_t os = (int64_t)j->p->oh * j->p->ow;
    if (!j->y32) {
        ai_q_store_rows(acc, rows, cols, lda, &j->rq[plane % j->p->c], j->y + plane * os);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        memcpy(j->y32 + plane * os + r * cols, acc + r * lda, sizeof(int32_t) * (size_t)cols);
}

static void dw_range(void *ctx, int64_t lo, int64_t hi)
{
    const dw_job *j = ctx;
    const aik_window *p = j->p;
    const size_t plane_bytes = (size_t)j->hp * j->wp;
    for (int64_t s = lo; s < hi; s++) {
        int8_t *xpad = (int8_t *)j->ws + s * j->slot;
        uint8_t *win = (uint8_t *)xpad + ALIGN64(plane_bytes + DW_SLACK);
        int32_t *acc = (int32_t *)(win + ALIGN64(4 * (plane_bytes + DW_SLACK)));
        for (int64_t plane = s * j->jobs / j->n_slots;
             plane < (s + 1) * j->jobs / j->n_slots; plane++) {
#ifdef AI_AVX512_KERNEL
            if (j->small) {
                dw_plane_small(j, plane, acc);
                dw_store(j, plane, acc, 1, (int64_t)p->oh * p->ow, (int64_t)p->oh * p->ow);
                continue;
            }
            if (j->vnni)
                dw_plane_vnni(j, plane, (uint8_t *)xpad, win, acc);
            else if (j->avx2)
                dw_plane_avx2(j, plane, (int16_t *)win, acc);
            else
#endif
                dw_plane(j, plane, xpad, acc);
            dw_store(j, plane, acc, p->oh, p->ow, j->wp);
        }
    }
}

/* ai_qconv (y32 NULL) or ai_qconv_i32 */
static void qconv_any(const aik_window *p, const int8_t *x, const int8_t *w, const int32_t *bias,
                      const aik_rq *rq, int8_t *y, int32_t *y32, void *state, bool const_weights,
                      void *ws)
{
    const int64_t os = (int64_t)p->oh * p->ow;
    if (os == 0 || p->n == 0 || p->m == 0)
        return;
    if (is_depthwise(p)) {
        dw_job j = {p, x, w, bias, rq, y, ws, 0, 0, 0, (int64_t)p->n * p->c, 0,
                    ai_q_path() >= AI_Q_VNNI && p->dw == 1 && p->kw <= 16 && p->kh <= 16,
                    ai_q_path() == AI_Q_AVX2, NULL, y32};
#ifdef AI_AVX512_KERNEL
        struct dw_small small;
        if (ai_q_path() >= AI_Q_VNNI && __builtin_cpu_supports("avx512vbmi") &&
            dw_small_fits(p)) {
            dw_small_tables(p, &small);
            j.small = &small;
        }
#endif
        dw_geometry(p, &j.hp, &j.wp, &j.slot);
        j.n_slots = n_slots_of(j.jobs);
        ai_parallel_for(j.n_slots, 1, dw_range, &j);
        return;
    }
    ai_qweights q;
    const conv_geom g = conv_geometry(p);
    const int32_t k = p->c / p->group * p->kh * p->kw;
    if (g.rowpack)
        weights_of(&q, state, const_weights, p->m, k, p->kw, g.kw4, w, bias);
    else
        weights_of(&q, state, const_weights, p->m, k, k, k, w, bias);
    conv_job j = {p, g, x, &q, rq, y, ws, (int64_t)p->n * p->group * g.chunks, 0, y32};
    j.n_slots = n_slots_of(j.jobs);
    ai_parallel_for(j.n_slots, 1, conv_range, &j);
}

void ai_qconv(const aik_window *p, const int8_t *x, const int8_t *w, const int32_t *bias,
              const aik_rq *rq, int8_t *y, void *state, bool const_weights, void *ws)
{
    qconv_any(p, x, w, bias, rq, y, NULL, state, const_weights, ws);
}

void ai_qconv_i32(const aik_window *p, const int8_t *x, const int8_t *w, const int32_t *bias,
                  int32_t *y, void *state, bool const_weights, void *ws)
{
    qconv_any(p, x, w, bias, NULL, NULL, y, state, const_weights, ws);
}

/* ---------------------------------------------------------------- QGemm */

/* Rows of x per job: a multiple of 16 (whole panel blocks). */
#define FC_ROWS 64

void ai_qfc_sizes(int64_t n, int32_t k, int32_t m, size_t *ws_bytes, size_t *state_bytes)
{
    const int64_t rows = n < FC_ROWS ? n : FC_ROWS;
    *ws_bytes = Q_SLOTS * ALIGN64(ai_qpanel_bytes(k, rows));
    *state_bytes = 64 + ai_qweights_bytes(m, k);
}

typedef struct {
    int64_t n;
    const int8_t *x;
    const ai_qweights *q;
    const aik_rq *rq;
    int8_t *y;
    char *ws;
    size_t slot;
    int64_t jobs, n_slots;
    int32_t *y32; /* ai_qfc_i32's (then u, v) */
    const int32_t *u, *v;
} fc_job;

/* panel of x's rows [i0, i0 + cols) (k each) */
AI_SHORT_LOOPS static void pack_x_rows(const int8_t *x, int32_t k, int64_t cols, uint8_t *xp)
{
    const int32_t kp = (k + 3) & ~3;
    for (int64_t b = 0; b < (cols + 15) / 16; b++)
        for (int j = 0; j < 16; j++) {
            uint8_t *d = xp + b * 16 * kp + j * 4;
            const int64_t i = b * 16 + j;
            const int8_t *xr = x + i * k;
            int32_t t = 0;
            if (i < cols)
                for (; t + 4 <= k; t += 4, d += 64) {
                    uint32_t v;
                    memcpy(&v, xr + t, 4);
                    v ^= 0x80808080u;
                    memcpy(d, &v, 4);
                }
            for (; t < kp; t += 4, d += 64)
                for (int e = 0; e < 4; e++)
                    d[e] = i < cols && t + e < k ? (uint8_t)(xr[t + e] ^ 0x80) : 0x80;
        }
}

static void fc_range(void *ctx, int64_t lo, int64_t hi)
{
    const fc_job *j = ctx;
    const int32_t k = j->q->k, m = j->q->m;
    for (int64_t s = lo; s < hi; s++) {
        uint8_t *panel = (uint8_t *)j->ws + s * j->slot;
        for (int64_t job = s * j->jobs / j->n_slots; job < (s + 1) * j->jobs / j->n_slots;
             job++) {
            const int64_t i0 = job * FC_ROWS;
            const int64_t cols = j->n - i0 < FC_ROWS ? j->n - i0 : FC_ROWS;
            pack_x_rows(j->x + i0 * k, k, cols, panel);
            if (j->y32) {
                const ai_qi32 o = {j->y32 + i0 * m, 1, m, j->u ? j->u + i0 : NULL, j->v};
                ai_qgemm_i32(j->q, cols, panel, &o);
            } else {
                ai_qgemm(j->q, cols, panel, j->rq, j->y + i0 * m, 1, m);
            }
        }
    }
}

void ai_qfc(int64_t n, int32_t k, int32_t m, const int8_t *x, const int8_t *w,
            const int32_t *bias, const aik_rq *rq, int8_t *y, void *state, bool const_weights,
            void *ws)
{
    if (n == 0 || m == 0)
        return;
    ai_qweights q;
    weights_of(&q, state, const_weights, m, k, k, k, w, bias);
    const int64_t rows = n < FC_ROWS ? n : FC_ROWS;
    fc_job j = {n, x, &q, rq, y, ws, ALIGN64(ai_qpanel_bytes(k, rows)),
                (n + FC_ROWS - 1) / FC_ROWS, 0, NULL, NULL, NULL};
    j.n_slots = n_slots_of(j.jobs);
    ai_parallel_for(j.n_slots, 1, fc_range, &j);
}

void ai_qfc_i32(int64_t n, int32_t k, int32_t m, const int8_t *x, const int8_t *w,
                const int32_t *bias, const int32_t *u, const int32_t *v, int32_t *y, void *state,
                bool const_weights, void *ws)
{
    if (n == 0 || m == 0)
        return;
    ai_qweights q;
    weights_of(&q, state, const_weights, m, k, k, k, w, bias);
    const int64_t rows = n < FC_ROWS ? n : FC_ROWS;
    fc_job j = {n, x, &q, NULL, NULL, ws, ALIGN64(ai_qpanel_bytes(k, rows)),
                (n + FC_ROWS - 1) / FC_ROWS, 0, y, u, v};
    j.n_slots = n_slots_of(j.jobs);
    ai_parallel_for(j.n_slots, 1, fc_range, &j);
}
