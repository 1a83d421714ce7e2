/*
 * rnn_impl.h — the loops of LSTM, GRU and RNN (ops/rnn.c) for one element
 * type, included once per type with REAL (float or double), SFX(name)
 * (name_f32 or name_f64), GEMM (ai_gemm_f32 or ai_gemm_f64), EXP and TANH.
 *
 * One direction at a time. Rows are batch entries; a step's gates are a
 * (B, G H) block of A, its states (B, H) blocks of hs and cs. The forward
 * saves, per time step t, the gates' pre-activations A[t] (after every
 * addition, peepholes included, before clip), the states entering and
 * leaving the step (hs, cs: T + 1 blocks, the step at time t reads block
 * t and writes t + 1 forward, reads t + 1 and writes t in reverse) and
 * GRU's recurrent term aux[t]: H R_h^T + Rb_h with linear_before_reset,
 * r * H without. The backward recomputes the activations from A.
 */

/* ---------------------------------------------------------------- activations */

/* y = f(x) over n, x clipped to [-clip, clip] first when clip > 0; y may be x */
AI_WIDE_CLONES static void SFX(act_forward)(const rnn_act *a, REAL clip, REAL *y,
                                            const REAL *x, int64_t n)
{
    if (clip > 0) {
        for (int64_t j = 0; j < n; j++)
            y[j] = x[j] < -clip ? -clip : x[j] > clip ? clip : x[j];
        x = y;
    }
    const REAL al = (REAL)a->alpha, be = (REAL)a->beta;
    switch (a->kind) {
    case ACT_SIGMOID:
        for (int64_t j = 0; j < n; j++)
            y[j] = 1 / (1 + EXP(-x[j]));
        break;
    case ACT_TANH:
        for (int64_t j = 0; j < n; j++)
            y[j] = TANH(x[j]);
        break;
    case ACT_RELU:
        for (int64_t j = 0; j < n; j++)
            y[j] = x[j] > 0 ? x[j] : 0;
        break;
    case ACT_AFFINE:
        for (int64_t j = 0; j < n; j++)
            y[j] = al * x[j] + be;
        break;
    case ACT_LEAKY_RELU:
        for (int64_t j = 0; j < n; j++)
            y[j] = x[j] >= 0 ? x[j] : al * x[j];
        break;
    case ACT_THRESHOLDED_RELU:
        for (int64_t j = 0; j < n; j++)
            y[j] = x[j] > al ? x[j] : 0;
        break;
    case ACT_SCALED_TANH:
        for (int64_t j = 0; j < n; j++)
            y[j] = al * TANH(be * x[j]);
        break;
    case ACT_HARD_SIGMOID:
        for (int64_t j = 0; j < n; j++) {
            const REAL v = al * x[j] + be;
            y[j] = v < 0 ? 0 : v > 1 ? 1 : v;
        }
        break;
    case ACT_ELU:
        for (int64_t j = 0; j < n; j++)
            y[j] = x[j] >= 0 ? x[j] : al * (EXP(x[j]) - 1);
        break;
    case ACT_SOFTSIGN:
        for (int64_t j = 0; j < n; j++)
            y[j] = x[j] / (1 + (x[j] < 0 ? -x[j] : x[j]));
        break;
    case ACT_SOFTPLUS: /* log(1 + e^x) = max(x, 0) + log(1 + e^-|x|) */
        for (int64_t j = 0; j < n; j++) {
            const REAL ax = x[j] < 0 ? -x[j] : x[j];
            y[j] = (x[j] > 0 ? x[j] : 0) + (REAL)log1p((double)EXP(-ax));
        }
        break;
    }
}

/* dx = dy * f'(x), x the pre-activation before clip, y = f(clip(x)); 0 where
 * clip cut x. dx may be dy. */
AI_WIDE_CLONES static void SFX(act_backward)(const rnn_act *a, REAL clip, REAL *dx,
                                             const REAL *dy, const REAL *x, const REAL *y,
                                             int64_t n)
{
    const REAL al = (REAL)a->alpha, be = (REAL)a->beta;
    switch (a->kind) {
    case ACT_SIGMOID:
        for (int64_t j = 0; j < n; j++)
            dx[j] = dy[j] * (y[j] * (1 - y[j]));
        break;
    case ACT_TANH:
        for (int64_t j = 0; j < n; j++)
            dx[j] = dy[j] * (1 - y[j] * y[j]);
        break;
    case ACT_RELU:
        for (int64_t j = 0; j < n; j++)
            dx[j] = x[j] > 0 ? dy[j] : 0;
        break;
    case ACT_AFFINE:
        for (int64_t j = 0; j < n; j++)
            dx[j] = dy[j] * al;
        break;
    case ACT_LEAKY_RELU:
        for (int64_t j = 0; j < n; j++)
            dx[j] = x[j] >= 0 ? dy[j] : dy[j] * al;
        break;
    case ACT_THRESHOLDED_RELU:
        for (int64_t j = 0; j < n; j++)
            dx[j] = x[j] > al ? dy[j] : 0;
        break;
    case ACT_SCALED_TANH:
        for (int64_t j = 0; j < n; j++) {
            const REAL t = TANH(be * x[j]);
            dx[j] = dy[j] * (al * be * (1 - t * t));
        }
        break;
    case ACT_HARD_SIGMOID:
        for (int64_t j = 0; j < n; j++) {
            const REAL u = al * x[j] + be;
            dx[j] = u > 0 && u < 1 ? dy[j] * al : 0;
        }
        break;
    case ACT_ELU:
        for (int64_t j = 0; j < n; j++)
            dx[j] = x[j] >= 0 ? dy[j] : dy[j] * (y[j] + al);
        break;
    case ACT_SOFTSIGN:
        for (int64_t j = 0; j < n; j++) {
            const REAL d = 1 + (x[j] < 0 ? -x[j] : x[j]);
            dx[j] = dy[j] / (d * d);
        }
        break;
    case ACT_SOFTPLUS:
        for (int64_t j = 0; j < n; j++)
            dx[j] = dy[j] / (1 + EXP(-x[j]));
        break;
    }
    if (clip > 0)
        for (int64_t j = 0; j < n; j++)
            dx[j] = x[j] < -clip || x[j] > clip ? 0 : dx[j];
}

/* ---------------------------------------------------------------- input projection */

/* A[t][b] (G H) = X[t][b] @ W^T: one GEMM over every
 * step, or one per batch entry in layout 1 (X is (B, T, I) there). */
static void SFX(project)(const rnn_dims *s, const REAL *x, const REAL *w, REAL *A)
{
    const int64_t GH = s->G * s->H;
    if (s->I == 0) /* no features: a product of nothing (not left to the GEMM) */
        memset(A, 0, (size_t)(s->T * s->B * GH) * sizeof(REAL));
    else if (!s->layout)
        GEMM(false, true, s->T * s->B, GH, s->I, 1, x, s->I, w, s->I, 0, A, GH);
    else
        for (int64_t b = 0; b < s->B; b++)
            GEMM(false, true, s->T, GH, s->I, 1, x + b * s->T * s->I, s->I, w, s->I, 0,
                 A + b * GH, s->B * GH);
}

/* dW += dA^T X, dX += dA W (either NULL: not wanted) */
static void SFX(project_backward)(const rnn_dims *s, const REAL *x, const REAL *w,
                                  const REAL *dA, REAL *dx, REAL *dw)
{
    const int64_t GH = s->G * s->H, I = s->I;
    const int64_t n = s->layout ? s->B : 1, rows = s->layout ? s->T : s->T * s->B;
    const int64_t lda = s->layout ? s->B * GH : GH;
    for (int64_t b = 0; b < n; b++) {
        const REAL *xb = x + b * s->T * I, *dAb = dA + b * GH;
        if (dw)
            GEMM(true, false, GH, I, rows, 1, dAb, lda, xb, I, 1, dw, I);
        if (dx)
            GEMM(false, false, rows, I, GH, 1, dAb, lda, w, I, 1, dx + b * s->T * I, I);
    }
}

/* ---------------------------------------------------------------- forward */

/* One direction: fills A, hs, cs, aux and then Y, Y_h, Y_c (the outputs
 * given). ws: scratch of rnn_ws_forward elements. */
static void SFX(rnn_forward_dir)(const rnn_params *p, const rnn_dims *s, const rnn_dir *io,
                                 REAL *ws)
{
    const int64_t T = s->T, B = s->B, H = s->H, G = s->G, GH = G * H, BH = B * H;
    const rnn_act *acts = p->acts[io->d];
    const REAL clip = (REAL)p->clip;
    const REAL *w = io->w, *r = io->r, *bias = io->bias, *P = io->p, *h0 = io->h0, *c0 = io->c0;
    REAL *A = io->A, *hs = io->hs, *cs = io->cs, *aux = io->aux;
    const bool rev = io->reverse;

    SFX(project)(s, io->x, w, A);
    if (bias) { /* Wb + Rb, GRU's Rb_h only without linear_before_reset */
        REAL *bsum = ws;
        for (int64_t j = 0; j < GH; j++)
            bsum[j] = bias[j] + (p->cell == CELL_GRU && p->lbr && j >= 2 * H ? 0 : bias[GH + j]);
        for (int64_t row = 0; row < T * B; row++)
            for (int64_t j = 0; j < GH; j++)
                A[row * GH + j] += bsum[j];
    }
    /* the initial states, into the block the first step reads */
    REAL *h_first = hs + (rev ? T : 0) * BH, *c_first = cs ? cs + (rev ? T : 0) * BH : NULL;
    for (int64_t b = 0; b < B; b++) {
        const int64_t o = state_offset(s, io->d, b);
        for (int64_t j = 0; j < H; j++) {
            h_first[b * H + j] = h0 ? h0[o + j] : 0;
            if (c_first)
                c_first[b * H + j] = c0 ? c0[o + j] : 0;
        }
    }
    const REAL *Pi = P, *Po = P ? P + H : NULL, *Pf = P ? P + 2 * H : NULL;
    for (int64_t step = 0; step < T; step++) {
        const int64_t t = rev ? T - 1 - step : step;
        const REAL *hin = hs + (rev ? t + 1 : t) * BH;
        REAL *hout = hs + (rev ? t : t + 1) * BH, *a = A + t * B * GH;
        if (p->cell != CELL_GRU) { /* every gate's recurrent term: one GEMM */
            GEMM(false, true, B, GH, H, 1, hin, H, r, H, 1, a, GH);
        } else { /* z and r; then H's term: its own GEMM, before or after r */
            REAL *ax = aux + t * BH;
            GEMM(false, true, B, 2 * H, H, 1, hin, H, r, H, 1, a, GH);
            if (p->lbr) {
                GEMM(false, true, B, H, H, 1, hin, H, r + 2 * H * H, H, 0, ax, H);
                if (bias)
                    for (int64_t b = 0; b < B; b++)
                        for (int64_t j = 0; j < H; j++)
                            ax[b * H + j] += bias[GH + 2 * H + j];
            } else {
                for (int64_t b = 0; b < B; b++) {
                    SFX(act_forward)(&acts[0], clip, ax + b * H, a + b * GH + H, H);
                    for (int64_t j = 0; j < H; j++)
                        ax[b * H + j] *= hin[b * H + j];
                }
                GEMM(false, true, B, H, H, 1, ax, H, r + 2 * H * H, H, 1, a + 2 * H, GH);
            }
        }
        for (int64_t b = 0; b < B; b++) {
            const REAL *hp = hin + b * H;
            REAL *hn = hout + b * H, *ab = a + b * GH;
            const REAL *cp = cs ? cs + (rev ? t + 1 : t) * BH + b * H : NULL;
            REAL *cn = cs ? cs + (rev ? t : t + 1) * BH + b * H : NULL;
            if (t >= io->len[b]) { /* past this entry's length: the state carries */
                memcpy(hn, hp, (size_t)H * sizeof(REAL));
                if (cn)
                    memcpy(cn, cp, (size_t)H * sizeof(REAL));
                continue;
            }
            if (p->cell == CELL_RNN) {
                SFX(act_forward)(&acts[0], clip, hn, ab, H);
            } else if (p->cell == CELL_LSTM) {
                REAL *gi = ws, *go = ws + H, *gf = ws + 2 * H, *gg = ws + 3 * H, *th = ws + 4 * H;
                if (P)
                    for (int64_t j = 0; j < H; j++) {
                        ab[j] += Pi[j] * cp[j];
                        ab[2 * H + j] += Pf[j] * cp[j];
                    }
                SFX(act_forward)(&acts[0], clip, gi, ab, H);
                if (p->input_forget)
                    for (int64_t j = 0; j < H; j++)
                        gf[j] = 1 - gi[j];
                else
                    SFX(act_forward)(&acts[0], clip, gf, ab + 2 * H, H);
                SFX(act_forward)(&acts[1], clip, gg, ab + 3 * H, H);
                for (int64_t j = 0; j < H; j++)
                    cn[j] = gf[j] * cp[j] + gi[j] * gg[j];
                if (P)
                    for (int64_t j = 0; j < H; j++)
                        ab[H + j] += Po[j] * cn[j];
                SFX(act_forward)(&acts[0], clip, go, ab + H, H);
                SFX(act_forward)(&acts[2], 0, th, cn, H);
                for (int64_t j = 0; j < H; j++)
                    hn[j] = go[j] * th[j];
            } else {
                REAL *z = ws, *rr = ws + H, *n = ws + 2 * H;
                SFX(act_forward)(&acts[0], clip, z, ab, H);
                if (p->lbr) {
                    const REAL *ax = aux + t * BH + b * H;
                    SFX(act_forward)(&acts[0], clip, rr, ab + H, H);
                    for (int64_t j = 0; j < H; j++)
                        ab[2 * H + j] += rr[j] * ax[j];
                }
                SFX(act_forward)(&acts[1], clip, n, ab + 2 * H, H);
                for (int64_t j = 0; j < H; j++) /* (1 - z) n + z H, as torch rounds it */
                    hn[j] = n[j] + z[j] * (hp[j] - n[j]);
            }
        }
    }
    /* outputs: Y zero past each entry's length; the final states */
    REAL *y = io->y, *yh = io->yh, *yc = io->yc;
    for (int64_t t = 0; y && t < T; t++)
        for (int64_t b = 0; b < B; b++) {
            REAL *yr = y + y_offset(s, t, io->d, b);
            if (t < io->len[b])
                memcpy(yr, hs + ((rev ? t : t + 1) * B + b) * H, (size_t)H * sizeof(REAL));
            else
                memset(yr, 0, (size_t)H * sizeof(REAL));
        }
    const REAL *h_last = hs + (rev ? 0 : T) * BH, *c_last = cs ? cs + (rev ? 0 : T) * BH : NULL;
    for (int64_t b = 0; b < B; b++) {
        const int64_t o = state_offset(s, io->d, b);
        if (yh)
            memcpy(yh + o, h_last + b * H, (size_t)H * sizeof(REAL));
        if (yc)
            memcpy(yc + o, c_last + b * H, (size_t)H * sizeof(REAL));
    }
}

/* ---------------------------------------------------------------- backward */

/* One direction, through time from the last step processed to the first:
 * adds into the gradients given (rnn_dir's d* pointers, NULL: not wanted).
 * ws: scratch of rnn_ws_backward elements. */
static void SFX(rnn_backward_dir)(const rnn_params *p, const rnn_dims *s, const rnn_dir *io,
                                  REAL *ws)
{
    const int64_t T = s->T, B = s->B, H = s->H, G = s->G, GH = G * H, BH = B * H;
    const rnn_act *acts = p->acts[io->d];
    const REAL clip = (REAL)p->clip;
    const REAL *r = io->r, *P = io->p, *A = io->A, *hs = io->hs, *cs = io->cs, *aux = io->aux;
    const bool rev = io->reverse, gru = p->cell == CELL_GRU;
    /* dA: every step's gate gradients; daux: GRU's (linear_before_reset)
     * gradient of H R_h^T + Rb_h; dh, dc: of the state leaving the step;
     * dh_in, dc_in: of the state entering it; sc: one row's scratch */
    REAL *dA = ws, *daux = dA + T * B * GH, *dh = daux + (gru && p->lbr ? T * BH : 0);
    REAL *dc = dh + BH, *dh_in = dc + BH, *dc_in = dh_in + BH, *sc = dc_in + BH;
    const REAL *Pi = P, *Po = P ? P + H : NULL, *Pf = P ? P + 2 * H : NULL;
    REAL *dp = io->dp, *dh0 = io->dh0, *dc0 = io->dc0, *dr = io->dr, *dbias = io->dbias;
    REAL *dPi = dp, *dPo = dp ? dp + H : NULL, *dPf = dp ? dp + 2 * H : NULL;
    const REAL *dyh = io->dyh, *dyc = io->dyc, *dy = io->dy;

    for (int64_t b = 0; b < B; b++) {
        const int64_t o = state_offset(s, io->d, b);
        for (int64_t j = 0; j < H; j++) {
            dh[b * H + j] = dyh ? dyh[o + j] : 0;
            dc[b * H + j] = dyc ? dyc[o + j] : 0;
        }
    }
    for (int64_t step = T - 1; step >= 0; step--) {
        const int64_t t = rev ? T - 1 - step : step;
        const REAL *hin = hs + (rev ? t + 1 : t) * BH, *hout = hs + (rev ? t : t + 1) * BH;
        const REAL *a = A + t * B * GH;
        REAL *da = dA + t * B * GH;
        for (int64_t b = 0; b < B; b++) {
            const REAL *ab = a + b * GH, *hp = hin + b * H, *hn = hout + b * H;
            REAL *dab = da + b * GH, *dhb = dh + b * H, *dcb = dc + b * H;
            REAL *dhi = dh_in + b * H, *dci = dc_in + b * H;
            if (t >= io->len[b]) { /* the state carried: so does its gradient */
                memset(dab, 0, (size_t)GH * sizeof(REAL));
                if (gru && p->lbr)
                    memset(daux + t * BH + b * H, 0, (size_t)H * sizeof(REAL));
                memcpy(dhi, dhb, (size_t)H * sizeof(REAL));
                memcpy(dci, dcb, (size_t)H * sizeof(REAL));
                continue;
            }
            if (dy) {
                const REAL *dyr = dy + y_offset(s, t, io->d, b);
                for (int64_t j = 0; j < H; j++)
                    dhb[j] += dyr[j];
            }
            if (p->cell == CELL_RNN) {
                SFX(act_backward)(&acts[0], clip, dab, dhb, ab, hn, H);
                memset(dhi, 0, (size_t)H * sizeof(REAL));
            } else if (p->cell == CELL_LSTM) {
                const REAL *cp = cs + (rev ? t + 1 : t) * BH + b * H;
                const REAL *cn = cs + (rev ? t : t + 1) * BH + b * H;
                REAL *gi = sc, *go = sc + H, *gf = sc + 2 * H, *gg = sc + 3 * H, *th = sc + 4 * H;
                REAL *t1 = sc + 5 * H, *dct = sc + 6 * H;
                REAL *dai = dab, *dao = dab + H, *daf = dab + 2 * H, *dag = dab + 3 * H;
                SFX(act_forward)(&acts[0], clip, gi, ab, H);
                if (p->input_forget)
                    for (int64_t j = 0; j < H; j++)
                        gf[j] = 1 - gi[j];
                else
                    SFX(act_forward)(&acts[0], clip, gf, ab + 2 * H, H);
                SFX(act_forward)(&acts[1], clip, gg, ab + 3 * H, H);
                SFX(act_forward)(&acts[0], clip, go, ab + H, H);
                SFX(act_forward)(&acts[2], 0, th, cn, H);
                /* h = o h(C): through o, then through C */
                for (int64_t j = 0; j < H; j++)
                    t1[j] = dhb[j] * th[j];
                SFX(act_backward)(&acts[0], clip, dao, t1, ab + H, go, H);
                for (int64_t j = 0; j < H; j++)
                    t1[j] = dhb[j] * go[j];
                SFX(act_backward)(&acts[2], 0, dct, t1, cn, th, H);
                for (int64_t j = 0; j < H; j++)
                    dct[j] += dcb[j] + (P ? dao[j] * Po[j] : 0);
                /* C = f C_prev + i c */
                for (int64_t j = 0; j < H; j++) {
                    dag[j] = dct[j] * gi[j];
                    t1[j] = dct[j] * gg[j]; /* of i */
                    daf[j] = dct[j] * cp[j];
                }
                SFX(act_backward)(&acts[1], clip, dag, dag, ab + 3 * H, gg, H);
                if (p->input_forget) { /* f = 1 - i */
                    for (int64_t j = 0; j < H; j++) {
                        t1[j] -= daf[j];
                        daf[j] = 0;
                    }
                } else {
                    SFX(act_backward)(&acts[0], clip, daf, daf, ab + 2 * H, gf, H);
                }
                SFX(act_backward)(&acts[0], clip, dai, t1, ab, gi, H);
                for (int64_t j = 0; j < H; j++)
                    dci[j] = dct[j] * gf[j] + (P ? dai[j] * Pi[j] + daf[j] * Pf[j] : 0);
                if (dPi)
                    for (int64_t j = 0; j < H; j++) {
                        dPi[j] += dai[j] * cp[j];
                        dPf[j] += daf[j] * cp[j];
                        dPo[j] += dao[j] * cn[j];
                    }
                memset(dhi, 0, (size_t)H * sizeof(REAL));
            } else { /* GRU: H = n + z (H_prev - n) */
                REAL *z = sc, *rr = sc + H, *n = sc + 2 * H, *t1 = sc + 3 * H;
                REAL *daz = dab, *dar = dab + H, *dan = dab + 2 * H;
                SFX(act_forward)(&acts[0], clip, z, ab, H);
                SFX(act_forward)(&acts[0], clip, rr, ab + H, H);
                SFX(act_forward)(&acts[1], clip, n, ab + 2 * H, H);
                for (int64_t j = 0; j < H; j++) {
                    t1[j] = dhb[j] * (1 - z[j]);
                    daz[j] = dhb[j] * (hp[j] - n[j]);
                    dhi[j] = dhb[j] * z[j];
                }
                SFX(act_backward)(&acts[1], clip, dan, t1, ab + 2 * H, n, H);
                SFX(act_backward)(&acts[0], clip, daz, daz, ab, z, H);
                if (p->lbr) { /* n's input: x_h + r aux */
                    const REAL *ax = aux + t * BH + b * H;
                    REAL *dax = daux + t * BH + b * H;
                    for (int64_t j = 0; j < H; j++) {
                        t1[j] = dan[j] * ax[j];
                        dax[j] = dan[j] * rr[j];
                    }
                    SFX(act_backward)(&acts[0], clip, dar, t1, ab + H, rr, H);
                }
            }
        }
        /* the recurrent products' gradient, for every row at once */
        if (p->cell != CELL_GRU) {
            GEMM(false, false, B, H, GH, 1, da, GH, r, H, 1, dh_in, H);
        } else {
            const REAL *rh = r + 2 * H * H;
            if (p->lbr) {
                GEMM(false, false, B, H, H, 1, daux + t * BH, H, rh, H, 1, dh_in, H);
            } else { /* n's input: x_h + (r H_prev) R_h^T: d(r H_prev) = dan R_h */
                REAL *drh = dc_in; /* (GRU has no C) */
                GEMM(false, false, B, H, H, 1, da + 2 * H, GH, rh, H, 0, drh, H);
                for (int64_t b = 0; b < B; b++) {
                    if (t >= io->len[b])
                        continue;
                    const REAL *ab = a + b * GH, *hp = hin + b * H;
                    REAL *rr = sc, *t1 = sc + H, *dhi = dh_in + b * H;
                    SFX(act_forward)(&acts[0], clip, rr, ab + H, H);
                    for (int64_t j = 0; j < H; j++) {
                        t1[j] = drh[b * H + j] * hp[j];
                        dhi[j] += drh[b * H + j] * rr[j];
                    }
                    SFX(act_backward)(&acts[0], clip, da + b * GH + H, t1, ab + H, rr, H);
                }
            }
            GEMM(false, false, B, H, 2 * H, 1, da, GH, r, H, 1, dh_in, H);
        }
        REAL *swap = dh;
        dh = dh_in;
        dh_in = swap;
        swap = dc;
        dc = dc_in;
        dc_in = swap;
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t o = state_offset(s, io->d, b);
        for (int64_t j = 0; j < H; j++) {
            if (dh0)
                dh0[o + j] += dh[b * H + j];
            if (dc0)
                dc0[o + j] += dc[b * H + j];
        }
    }
    /* the weights, over every step at once */
    SFX(project_backward)(s, io->x, io->w, dA, io->dx, io->dw);
    const REAL *hin_all = hs + (rev ? BH : 0); /* the states each step read, (T B, H) */
    if (dr) {
        if (!gru) {
            GEMM(true, false, GH, H, T * B, 1, dA, GH, hin_all, H, 1, dr, H);
        } else {
            GEMM(true, false, 2 * H, H, T * B, 1, dA, GH, hin_all, H, 1, dr, H);
            if (p->lbr)
                GEMM(true, false, H, H, T * B, 1, daux, H, hin_all, H, 1, dr + 2 * H * H, H);
            else
                GEMM(true, false, H, H, T * B, 1, dA + 2 * H, GH, aux, H, 1, dr + 2 * H * H,
                     H);
        }
    }
    if (dbias) {
        REAL *dwb = dbias, *drb = dbias + GH;
        for (int64_t row = 0; row < T * B; row++)
            for (int64_t j = 0; j < GH; j++) {
                const REAL g = dA[row * GH + j];
                dwb[j] += g;
                if (!(gru && j >= 2 * H))
                    drb[j] += g;
                else if (!p->lbr)
                    drb[j] += g;
                else
                    drb[j] += daux[row * H + j - 2 * H];
            }
    }
}
