/*
 * attention_impl.h — the row-block loops of Attention (ops/attention.c) for
 * one element type, included once per type with REAL (float or double),
 * SFX(name) (name_f32 or name_f64), GEMM (ai_gemm_f32 or ai_gemm_f64) and
 * EXP.
 *
 * A block is rows [r0, r1) of one (batch, query head) plane. Its scores
 * S (n x kmax, leading dimension Tk) are one GEMM, biased and turned into
 * probabilities in place (kept in the node's state when a backward
 * follows); kmax is Tk, or under is_causal the last key the block's last
 * row sees (the keys after it are never computed).
 */

/* The bias (mask, causal, padding) of each row of the scores S (n x kmax,
 * rows ld apart) of rows r0 .. r0 + n. */
AI_WIDE_CLONES static void SFX(att_bias)(const att_info *a, const att_plane *pl, int64_t r0,
                                         int64_t n, int64_t kmax, REAL *S, int64_t ld)
{
    for (int64_t i = 0; i < n; i++) {
        REAL *s = S + i * ld;
        const int64_t row = r0 + i;
        if (a->mask) {
            const int64_t base = pl->mask_off + row * a->mask_st[2];
            const int64_t lm = kmax < a->Lm ? kmax : a->Lm, st = a->mask_st[3];
            if (a->mask_bool) {
                const uint8_t *m = (const uint8_t *)a->mask + base;
                for (int64_t j = 0; j < lm; j++)
                    s[j] = m[j * st] ? s[j] : (REAL)-INFINITY;
            } else if (st == 1) { /* (vectorised) */
                const REAL *m = (const REAL *)a->mask + base;
                for (int64_t j = 0; j < lm; j++)
                    s[j] += m[j];
            } else {
                const REAL *m = (const REAL *)a->mask + base;
                for (int64_t j = 0; j < lm; j++)
                    s[j] += m[j * st];
            }
            for (int64_t j = lm; j < kmax; j++) /* past the mask's keys (ONNX padding) */
                s[j] = (REAL)-INFINITY;
        }
        if (a->causal)
            for (int64_t j = row + 1 < kmax ? row + 1 : kmax; j < kmax; j++)
                s[j] = (REAL)-INFINITY;
    }
}

/* S = scale Q_blk K^T (rows Tk apart), then the bias. K is (Tk, D), or (D,
 * Tk) with kt; rows a->ldq, a->ldk apart (operands. gradients and Y
 * alike: att_info). */
static void SFX(att_scores)(const att_info *a, const att_plane *pl, int64_t r0, int64_t n,
                            int64_t kmax, REAL *S)
{
    const int64_t Tk = a->Tk, D = a->D;
    const REAL *q = (const REAL *)pl->q + r0 * a->ldq;
    if (a->kt)
        GEMM(false, false, n, kmax, D, (REAL)a->scale, q, a->ldq, pl->k, a->ldk, 0, S, Tk);
    else
        GEMM(false, true, n, kmax, D, (REAL)a->scale, q, a->ldq, pl->k, a->ldk, 0, S, Tk);
    SFX(att_bias)(a, pl, r0, n, kmax, S, Tk);
}

/* Softmax of each row of S in place (a row every key of which is masked:
 * 0, or NaN without masked_zero, as a Softmax of -inf gives). The max and
 * the sum in 16 lanes (vectorised), the sum's lanes added in double. */
AI_WIDE_CLONES static void SFX(att_softmax)(const att_info *a, int64_t n, int64_t kmax, REAL *S,
                                            int64_t ld)
{
    for (int64_t i = 0; i < n; i++) {
        REAL *s = S + i * ld;
        REAL m16[16];
        for (int l = 0; l < 16; l++)
            m16[l] = (REAL)-INFINITY;
        int64_t j = 0;
        for (; j + 16 <= kmax; j += 16)
            for (int l = 0; l < 16; l++)
                m16[l] = s[j + l] > m16[l] ? s[j + l] : m16[l];
        for (; j < kmax; j++)
            m16[0] = s[j] > m16[0] ? s[j] : m16[0];
        REAL mx = m16[0];
        for (int l = 1; l < 16; l++)
            mx = m16[l] > mx ? m16[l] : mx;
        if (mx == (REAL)-INFINITY) {
            const REAL fill = a->masked_zero ? 0 : (REAL)NAN;
            for (j = 0; j < kmax; j++)
                s[j] = fill;
            continue;
        }
        REAL s16[16] = {0};
        for (j = 0; j + 16 <= kmax; j += 16)
            for (int l = 0; l < 16; l++) {
                s[j + l] = EXP(s[j + l] - mx);
                s16[l] += s[j + l];
            }
        for (; j < kmax; j++) {
            s[j] = EXP(s[j] - mx);
            s16[0] += s[j];
        }
        double sum = 0;
        for (int l = 0; l < 16; l++)
            sum += s16[l];
        const REAL inv = (REAL)(1 / sum);
        for (j = 0; j < kmax; j++)
            s[j] *= inv;
    }
}

/* Y_blk = P V for rows [r0, r0 + n) of a plane, P kept in pl->p when a
 * backward follows (0 past kmax); S: n x Tk scratch. */
static void SFX(att_forward_block)(const att_info *a, const att_plane *pl, int64_t r0, int64_t n,
                                   REAL *S)
{
    const int64_t kmax = att_kmax(a, r0 + n);
    SFX(att_scores)(a, pl, r0, n, kmax, S);
    SFX(att_softmax)(a, n, kmax, S, a->Tk);
    if (pl->p)
        for (int64_t i = 0; i < n; i++) {
            REAL *dst = (REAL *)pl->p + (r0 + i) * a->Tk;
            memcpy(dst, S + i * a->Tk, (size_t)kmax * sizeof(REAL));
            memset(dst + kmax, 0, (size_t)(a->Tk - kmax) * sizeof(REAL));
        }
    GEMM(false, false, n, a->Dv, kmax, 1, S, a->Tk, pl->v, a->ldv, 0,
         (REAL *)pl->y + r0 * a->ldy, a->ldy);
}

/* dS = P (dP - rowsum(P dP)) in place of dP (rows ld apart; P's Tk) for
 * rows r0 .. r0 + n, the mask's gradient (dS) into pl->dmask. */
AI_WIDE_CLONES static void SFX(att_dsoftmax)(const att_info *a, const att_plane *pl, int64_t r0,
                                             int64_t n, int64_t kmax, const REAL *P, REAL *dP,
                                             int64_t ld)
{
    const int64_t Tk = a->Tk;
    for (int64_t i = 0; i < n; i++) {
        const REAL *p = P + i * Tk;
        REAL *dp = dP + i * ld;
        REAL d16[16] = {0};
        int64_t j = 0;
        for (; j + 16 <= kmax; j += 16)
            for (int l = 0; l < 16; l++)
                d16[l] += p[j + l] * dp[j + l];
        for (; j < kmax; j++)
            d16[0] += p[j] * dp[j];
        double dot = 0;
        for (int l = 0; l < 16; l++)
            dot += d16[l];
        const REAL di = (REAL)dot;
        for (j = 0; j < kmax; j++)
            dp[j] = p[j] * (dp[j] - di);
        if (pl->dmask) { /* (rows, Lm): the bias's gradient, 0 past kmax */
            REAL *dm = (REAL *)pl->dmask + (r0 + i) * a->Lm;
            const int64_t lm = kmax < a->Lm ? kmax : a->Lm;
            for (j = 0; j < lm; j++)
                dm[j] = a->mask_bool ? 0 : dp[j];
            for (j = lm; j < a->Lm; j++)
                dm[j] = 0;
        }
    }
}

/* dK's and dV's keys past kmax set to 0 (where the block writes them, not
 * adds to them) */
static void SFX(att_zero_past)(const att_info *a, const att_plane *pl, int64_t kmax, bool dk,
                               bool dv)
{
    const int64_t Tk = a->Tk;
    if (dk && kmax < Tk) {
        if (a->kt) /* dK (D, Tk) */
            for (int64_t d = 0; d < a->D; d++)
                memset((REAL *)pl->dk + d * a->ldk + kmax, 0, (size_t)(Tk - kmax) * sizeof(REAL));
        else
            for (int64_t t = kmax; t < Tk; t++)
                memset((REAL *)pl->dk + t * a->ldk, 0, (size_t)a->D * sizeof(REAL));
    }
    if (dv && kmax < Tk)
        for (int64_t t = kmax; t < Tk; t++)
            memset((REAL *)pl->dv + t * a->ldv, 0, (size_t)a->Dv * sizeof(REAL));
}

/* The gradients of one row block from the P the forward kept: dP = dY V^T,
 * dS = P (dP - rowsum(P dP)), dV += P^T dY, dQ += scale dS K,
 * dK += scale dS^T Q, the mask's dS into pl->dmask. dP: n x Tk scratch.
 * With a->assign[0] dQ's rows are written, not added to; with
 * a->assign[1..2] dK and dV are written by the first block of their
 * group's first head (`first_kv`), keys past its kmax set to 0. */
static void SFX(att_backward_block)(const att_info *a, const att_plane *pl, int64_t r0,
                                    int64_t n, bool first_kv, REAL *dP)
{
    const int64_t Tk = a->Tk, D = a->D, Dv = a->Dv, ldq = a->ldq, ldk = a->ldk, ldv = a->ldv;
    const int64_t kmax = att_kmax(a, r0 + n);
    const REAL scale = (REAL)a->scale;
    const REAL *q = (const REAL *)pl->q + r0 * ldq, *dy = (const REAL *)pl->dy + r0 * a->ldy;
    const REAL *P = (const REAL *)pl->p + r0 * Tk;
    const REAL beta_q = a->assign[0] ? 0 : 1;
    const REAL beta_k = a->assign[1] && first_kv ? 0 : 1, beta_v = a->assign[2] && first_kv ? 0 : 1;
    SFX(att_zero_past)(a, pl, kmax, beta_k == 0, beta_v == 0);
    GEMM(false, true, n, kmax, Dv, 1, dy, a->ldy, pl->v, ldv, 0, dP, Tk);
    if (pl->dv)
        GEMM(true, false, kmax, Dv, n, 1, P, Tk, dy, a->ldy, beta_v, pl->dv, ldv);
    SFX(att_dsoftmax)(a, pl, r0, n, kmax, P, dP, Tk);
    if (pl->dq) {
        REAL *dq = (REAL *)pl->dq + r0 * ldq;
        if (a->kt)
            GEMM(false, true, n, D, kmax, scale, dP, Tk, pl->k, ldk, beta_q, dq, ldq);
        else
            GEMM(false, false, n, D, kmax, scale, dP, Tk, pl->k, ldk, beta_q, dq, ldq);
    }
    if (pl->dk) {
        if (a->kt)
            GEMM(true, false, D, kmax, n, scale, q, ldq, dP, Tk, beta_k, pl->dk, ldk);
        else
            GEMM(true, false, kmax, D, n, scale, dP, Tk, q, ldq, beta_k, pl->dk, ldk);
    }
}
