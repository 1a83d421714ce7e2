/*
 * linalg.c — linear algebra on batches of square matrices: Det.
 *
 * Det(X): X is [..., M, M], Y [...] the determinant of each matrix, by LU
 * decomposition with partial pivoting in double. Backward is torch's
 * (linalg.det): dX = dY * adj(X)^T, the adjugate being det * inverse for an
 * invertible matrix and its cofactors otherwise (a singular matrix still has
 * a gradient: for rank M - 1 it is not zero).
 */
#include <math.h>
#include <string.h>

#include "movement.h"

/* The determinant of the m x m matrix a (row-major, destroyed; perm: m
 * scratch). With `inv`, also writes a's inverse there when the determinant
 * is not zero. */
static double lu_det(double *a, int64_t m, double *inv, int64_t *perm)
{
    double det = 1;
    for (int64_t i = 0; i < m; i++)
        perm[i] = i;
    for (int64_t k = 0; k < m; k++) {
        int64_t p = k;
        for (int64_t i = k + 1; i < m; i++)
            if (fabs(a[i * m + k]) > fabs(a[p * m + k]))
                p = i;
        if (a[p * m + k] == 0)
            return 0;
        if (p != k) {
            for (int64_t j = 0; j < m; j++) {
                double t = a[k * m + j];
                a[k * m + j] = a[p * m + j];
                a[p * m + j] = t;
            }
            int64_t t = perm[k];
            perm[k] = perm[p];
            perm[p] = t;
            det = -det;
        }
        det *= a[k * m + k];
        for (int64_t i = k + 1; i < m; i++) {
            const double f = a[i * m + k] / a[k * m + k];
            a[i * m + k] = f;
            for (int64_t j = k + 1; j < m; j++)
                a[i * m + j] -= f * a[k * m + j];
        }
    }
    /* inv's column j solves L U x = P e_j */
    for (int64_t j = 0; inv && j < m; j++) {
        double *x = inv + j * m; /* column j, written as row j, transposed below */
        for (int64_t i = 0; i < m; i++) {
            double s = perm[i] == j;
            for (int64_t k = 0; k < i; k++)
                s -= a[i * m + k] * x[k];
            x[i] = s;
        }
        for (int64_t i = m - 1; i >= 0; i--) {
            double s = x[i];
            for (int64_t k = i + 1; k < m; k++)
                s -= a[i * m + k] * x[k];
            x[i] = s / a[i * m + i];
        }
    }
    for (int64_t i = 0; inv && i < m; i++)
        for (int64_t j = i + 1; j < m; j++) {
            double t = inv[i * m + j];
            inv[i * m + j] = inv[j * m + i];
            inv[j * m + i] = t;
        }
    return det;
}

static ai_status det_setup(const ai_ctx *c, int64_t *m, int64_t *mats)
{
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "X is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    if (x->ndim < 2 || x->shape[x->ndim - 1] != x->shape[x->ndim - 2])
        return ai_node_error(c->node, AI_ERR_VALUE, "X must be [..., M, M] (square "
                             "matrices), rank %d given", x->ndim);
    *m = x->shape[x->ndim - 1];
    *mats = ai_shape_prod(x->shape, 0, x->ndim - 2);
    return AI_OK;
}

/* Workspace: three m x m matrices of double (X, its inverse, a minor),
 * then the m rows of a permutation. */
static ai_status det_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    int64_t m = 0, mats = 0;
    ai_status st = det_setup(c, &m, &mats);
    if (st)
        return st;
    *ws = (size_t)(3 * m * m) * sizeof(double) + (size_t)m * sizeof(int64_t);
    return ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim - 2, c->in[0]->shape);
}

static ai_status det_forward(ai_ctx *c)
{
    int64_t m = 0, mats = 0;
    ai_status st = det_setup(c, &m, &mats);
    double *a = c->workspace;
    int64_t *perm = (int64_t *)(a + 3 * m * m);
    for (int64_t b = 0; !st && b < mats; b++) {
        for (int64_t i = 0; i < m * m; i++)
            a[i] = ai_float_at(c->in[0], b * m * m + i);
        ai_float_set(c->out[0], b, lu_det(a, m, NULL, perm));
    }
    return st;
}

/* dX[b] += dY[b] * adj(X[b])^T, adj^T[i][j] = cofactor (i, j) */
static ai_status det_backward(ai_ctx *c)
{
    int64_t m = 0, mats = 0;
    ai_status st = det_setup(c, &m, &mats);
    ai_tensor *dx = c->din[0];
    if (st || !dx || (st = ai_check_grad_dtype(c, dx)))
        return st;
    double *a = c->workspace, *inv = a + m * m, *minor = inv + m * m;
    int64_t *perm = (int64_t *)(minor + m * m);
    for (int64_t b = 0; b < mats; b++) {
        const int64_t at = b * m * m;
        const double g = ai_float_at(c->dout[0], b);
        for (int64_t i = 0; i < m * m; i++)
            a[i] = ai_float_at(c->in[0], at + i);
        const double det = lu_det(a, m, inv, perm);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < m; j++) {
                double cof;
                if (det != 0) {
                    cof = det * inv[j * m + i]; /* adj = det * inv, transposed */
                } else {
                    int64_t k = 0;
                    for (int64_t r = 0; r < m; r++)
                        for (int64_t s = 0; s < m; s++)
                            if (r != i && s != j)
                                minor[k++] = ai_float_at(c->in[0], at + r * m + s);
                    cof = ((i + j) % 2 ? -1 : 1) * lu_det(minor, m - 1, NULL, perm);
                }
                ai_float_set(dx, at + i * m + j, ai_float_at(dx, at + i * m + j) + g * cof);
            }
    }
    return AI_OK;
}

static const ai_op_def op_det = {"Det", "", 1, 1, 1, 1, AI_OP_BWD_NO_Y, NULL, det_shape,
                                 det_forward, det_backward};

const ai_op_def *const ai_ops_linalg[] = {&op_det, NULL};
