/*
 * attention_impl.h — the row-block loops of Attention (ops/attention.c) for
 * one element type, included once per type with REAL (float or double),
 * SFX(name) (name_f32 or name_f64), GEMM (ai_gemm_f32 or ai_gemm_f64) and
 * EXP.
 *
 * A block is rows [r0, r1) of one (batch, query head) plane. Its scores
 * S (n x kmax, leading dimension Tk) are one GEMM, biased and turned into
 * probabilities in place; kmax is Tk, or under is_causal the last key the
 * block's last row sees (the keys after it are never computed).
 */

/* S = scale Q_blk K^T, then the bias (mask, causal, padding) of each row.
 * K is (Tk, D), or (D, Tk) with kt. */
static void SFX(att_scores)(const att_info *a, const att_plane *pl, int64_t r0, int64_t n,
                            int64_t kmax, REAL *S)
{
    const int64_t Tk = a->Tk, D = a->D;
    const REAL *q = (const REAL *)pl->q + r0 * D;
    if (a->kt)
        GEMM(false, false, n, kmax, D, (REAL)a->scale, q, D, pl->k, Tk, 0, S, Tk);
    else
        GEMM(false, true, n, kmax, D, (REAL)a->scale, q, D, pl->k, D, 0, S, Tk);
    for (int64_t i = 0; i < n; i++) {
        REAL *s = S + i * Tk;
        const int64_t row = r0 + i;
        if (a->mask) {
            const int64_t base = pl->mask_off + row * a->mask_st[2];
            const int64_t lm = kmax < a->Lm ? kmax : a->Lm, st = a->mask_st[3];
            if (a->mask_bool) {
                const uint8_t *m = (const uint8_t *)a->mask + base;
                for (int64_t j = 0; j < lm; j++)
                    s[j] = m[j * st] ? s[j] : (REAL)-INFINITY;
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

/* Softmax of each row of S in place; lse[i] = log(sum exp(S_i)) (-inf for a
 * row every key of which is masked: its P is 0, or NaN without
 * masked_zero, as a Softmax of -inf gives). */
static void SFX(att_softmax)(const att_info *a, int64_t n, int64_t kmax, REAL *S, double *lse)
{
    for (int64_t i = 0; i < n; i++) {
        REAL *s = S + i * a->Tk;
        REAL mx = (REAL)-INFINITY;
        for (int64_t j = 0; j < kmax; j++)
            mx = s[j] > mx ? s[j] : mx;
        if (mx == (REAL)-INFINITY) {
            const REAL fill = a->masked_zero ? 0 : (REAL)NAN;
            for (int64_t j = 0; j < kmax; j++)
                s[j] = fill;
            lse[i] = -INFINITY;
            continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < kmax; j++) {
            s[j] = EXP(s[j] - mx);
            sum += s[j];
        }
        const REAL inv = (REAL)(1 / sum);
        for (int64_t j = 0; j < kmax; j++)
            s[j] *= inv;
        lse[i] = (double)mx + log(sum);
    }
}

/* P again from the scores and the saved lse (as the forward's softmax). */
static void SFX(att_probs)(const att_info *a, int64_t n, int64_t kmax, REAL *S, const double *lse)
{
    for (int64_t i = 0; i < n; i++) {
        REAL *s = S + i * a->Tk;
        if (lse[i] == -INFINITY) {
            const REAL fill = a->masked_zero ? 0 : (REAL)NAN;
            for (int64_t j = 0; j < kmax; j++)
                s[j] = fill;
            continue;
        }
        const REAL l = (REAL)lse[i];
        for (int64_t j = 0; j < kmax; j++)
            s[j] = EXP(s[j] - l);
    }
}

/* Y_blk = P V for rows [r0, r0 + n) of a plane; S: n x Tk scratch. */
static void SFX(att_forward_block)(const att_info *a, const att_plane *pl, int64_t r0, int64_t n,
                                   REAL *S, double *lse)
{
    const int64_t kmax = att_kmax(a, r0 + n);
    SFX(att_scores)(a, pl, r0, n, kmax, S);
    SFX(att_softmax)(a, n, kmax, S, lse + r0);
    GEMM(false, false, n, a->Dv, kmax, 1, S, a->Tk, pl->v, a->Dv, 0, (REAL *)pl->y + r0 * a->Dv,
         a->Dv);
}

/* The gradients of one row block: dP = dY V^T, dS = P (dP - rowsum(P dP)),
 * dV += P^T dY, dQ += scale dS K, dK += scale dS^T Q, the mask's dS into
 * pl->dmask. S and dP: n x Tk scratch each. */
static void SFX(att_backward_block)(const att_info *a, const att_plane *pl, int64_t r0,
                                    int64_t n, REAL *S, REAL *dP)
{
    const int64_t Tk = a->Tk, D = a->D, Dv = a->Dv;
    const int64_t kmax = att_kmax(a, r0 + n);
    const REAL scale = (REAL)a->scale;
    const REAL *q = (const REAL *)pl->q + r0 * D, *dy = (const REAL *)pl->dy + r0 * Dv;
    SFX(att_scores)(a, pl, r0, n, kmax, S);
    SFX(att_probs)(a, n, kmax, S, pl->lse + r0);
    GEMM(false, true, n, kmax, Dv, 1, dy, Dv, pl->v, Dv, 0, dP, Tk);
    if (pl->dv)
        GEMM(true, false, kmax, Dv, n, 1, S, Tk, dy, Dv, 1, pl->dv, Dv);
    for (int64_t i = 0; i < n; i++) {
        REAL *p = S + i * Tk, *dp = dP + i * Tk;
        double dot = 0;
        for (int64_t j = 0; j < kmax; j++)
            dot += (double)p[j] * dp[j];
        const REAL di = (REAL)dot;
        for (int64_t j = 0; j < kmax; j++)
            dp[j] = p[j] * (dp[j] - di);
        if (pl->dmask) { /* (rows, Lm): the bias's gradient, 0 past kmax */
            REAL *dm = (REAL *)pl->dmask + (r0 + i) * a->Lm;
            const int64_t lm = kmax < a->Lm ? kmax : a->Lm;
            for (int64_t j = 0; j < lm; j++)
                dm[j] = a->mask_bool ? 0 : dp[j];
            for (int64_t j = lm; j < a->Lm; j++)
                dm[j] = 0;
        }
    }
    if (pl->dq) {
        REAL *dq = (REAL *)pl->dq + r0 * D;
        if (a->kt)
            GEMM(false, true, n, D, kmax, scale, dP, Tk, pl->k, Tk, 1, dq, D);
        else
            GEMM(false, false, n, D, kmax, scale, dP, Tk, pl->k, D, 1, dq, D);
    }
    if (pl->dk) {
        if (a->kt)
            GEMM(true, false, D, kmax, n, scale, q, D, dP, Tk, 1, pl->dk, Tk);
        else
            GEMM(true, false, kmax, D, n, scale, dP, Tk, q, D, 1, pl->dk, D);
    }
}
