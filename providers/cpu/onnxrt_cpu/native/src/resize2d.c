/* Resize of the last two axes of float32 maps (nearest, linear, cubic, antialias:
 * any number of taps per axis), separable like the numpy path of
 * ``onnxrt_cpu.kernels.image``: per axis a table of source indices and weights
 * ``[out, taps]`` computed once per shape in Python.
 *
 * The numpy path makes one pass over memory per tap and axis (a take, a multiply and
 * an add, each writing a whole tensor); here every output row is made in one go:
 *
 * - rows first (order 0): the row's taps blended into one input-width row (a
 *   contiguous loop), then its columns gathered from that row;
 * - columns first (order 1): the source rows a block of output rows reads are each
 *   resampled along the columns once into scratch, then blended row by row.
 *
 * Each order does the numpy path's arithmetic in its order, in float32 (x * w per
 * tap, summed tap by tap), so results are the same values. An output row whose
 * source rows and weights are those of the row before is a copy of it (nearest
 * upsampling by an integer factor). Work is shared out in blocks of output rows of
 * one plane. */
#include "native.h"

#include <string.h>

typedef struct {
    const float *x;
    float *y;
    const Py_ssize_t *iy, *ix;
    const float *wy, *wx; /* NULL: one tap, a copy */
    Py_ssize_t h, w, oh, ow, ty, tx, block, blocks;
    Py_ssize_t factor; /* columns a copy of each source column factor times in order, or 0 */
    int order, failed;
} resize_job;

/* Whether output row r reads the same source rows with the same weights as row r - 1. */
static inline int same_row(const resize_job *j, Py_ssize_t r)
{
    if (r == 0)
        return 0;
    const Py_ssize_t t = j->ty;
    for (Py_ssize_t k = 0; k < t; k++) {
        if (j->iy[r * t + k] != j->iy[(r - 1) * t + k])
            return 0;
        if (j->wy && j->wy[r * t + k] != j->wy[(r - 1) * t + k])
            return 0;
    }
    return 1;
}

/* Columns of one row: out[c] = sum_k src[ix[c, k]] * wx[c, k] (tap by tap). */
static inline void columns(const resize_job *j, const float *restrict src, float *restrict out)
{
    const Py_ssize_t ow = j->ow, t = j->tx;
    const Py_ssize_t *restrict ix = j->ix;
    const float *restrict wx = j->wx;
    if (j->factor == 2) {
        for (Py_ssize_t c = 0; c < j->w; c++) {
            const float v = src[c];
            out[2 * c] = v;
            out[2 * c + 1] = v;
        }
    } else if (j->factor) {
        const Py_ssize_t f = j->factor;
        for (Py_ssize_t c = 0; c < j->w; c++) {
            const float v = src[c];
            for (Py_ssize_t r = 0; r < f; r++)
                out[c * f + r] = v;
        }
    } else if (!wx) {
        for (Py_ssize_t c = 0; c < ow; c++)
            out[c] = src[ix[c]];
    } else if (t == 2) {
        for (Py_ssize_t c = 0; c < ow; c++) {
            float a = src[ix[2 * c]] * wx[2 * c];
            float b = src[ix[2 * c + 1]] * wx[2 * c + 1];
            out[c] = a + b;
        }
    } else {
        for (Py_ssize_t c = 0; c < ow; c++) {
            float acc = src[ix[c * t]] * wx[c * t];
            for (Py_ssize_t k = 1; k < t; k++) {
                float term = src[ix[c * t + k]] * wx[c * t + k];
                acc = acc + term;
            }
            out[c] = acc;
        }
    }
}

/* Rows: out[i] = sum_k rows[k][i] * wy[k] over n values (tap by tap). */
static inline void blend(const float *const *rows, const float *wy, Py_ssize_t t, Py_ssize_t n,
                         float *restrict out)
{
    if (!wy) {
        memcpy(out, rows[0], (size_t)n * sizeof(float));
        return;
    }
    if (t == 2) {
        const float *restrict a = rows[0], *restrict b = rows[1];
        const float wa = wy[0], wb = wy[1];
        for (Py_ssize_t i = 0; i < n; i++) {
            float u = a[i] * wa;
            float v = b[i] * wb;
            out[i] = u + v;
        }
        return;
    }
    {
        const float *restrict a = rows[0];
        const float wa = wy[0];
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = a[i] * wa;
    }
    for (Py_ssize_t k = 1; k < t; k++) {
        const float *restrict a = rows[k];
        const float wa = wy[k];
        for (Py_ssize_t i = 0; i < n; i++) {
            float term = a[i] * wa;
            out[i] = out[i] + term;
        }
    }
}

#define MAX_TAPS 64

static void resize_task(void *ctx, Py_ssize_t index)
{
    resize_job *j = ctx;
    const Py_ssize_t plane = index / j->blocks, b = index % j->blocks;
    const Py_ssize_t r0 = b * j->block, r1 = r0 + j->block < j->oh ? r0 + j->block : j->oh;
    const Py_ssize_t h = j->h, w = j->w, ow = j->ow, t = j->ty;
    const float *x = j->x + plane * h * w;
    float *y = j->y + plane * j->oh * ow;
    const float *rows[MAX_TAPS];
    if (j->order == 0) {
        float *tmp = j->wy ? scratch(0, (size_t)w * sizeof(float)) : NULL;
        if (j->wy && !tmp) {
            j->failed = 1;
            return;
        }
        for (Py_ssize_t r = r0; r < r1; r++) {
            if (r > r0 && same_row(j, r)) {
                memcpy(y + r * ow, y + (r - 1) * ow, (size_t)ow * sizeof(float));
                continue;
            }
            if (!j->wy) {
                columns(j, x + j->iy[r] * w, y + r * ow);
                continue;
            }
            for (Py_ssize_t k = 0; k < t; k++)
                rows[k] = x + j->iy[r * t + k] * w;
            blend(rows, j->wy + r * t, t, w, tmp);
            columns(j, tmp, y + r * ow);
        }
        return;
    }
    /* columns first: resample the block's source rows lo..hi once each */
    Py_ssize_t lo = h, hi = -1;
    for (Py_ssize_t i = r0 * t; i < r1 * t; i++) {
        const Py_ssize_t s = j->iy[i];
        lo = s < lo ? s : lo;
        hi = s > hi ? s : hi;
    }
    float *tmp = scratch(0, (size_t)(hi - lo + 1) * (size_t)ow * sizeof(float));
    if (!tmp) {
        j->failed = 1;
        return;
    }
    for (Py_ssize_t s = lo; s <= hi; s++)
        columns(j, x + s * w, tmp + (s - lo) * ow);
    for (Py_ssize_t r = r0; r < r1; r++) {
        if (r > r0 && same_row(j, r)) {
            memcpy(y + r * ow, y + (r - 1) * ow, (size_t)ow * sizeof(float));
            continue;
        }
        for (Py_ssize_t k = 0; k < t; k++)
            rows[k] = tmp + (j->iy[r * t + k] - lo) * ow;
        blend(rows, j->wy ? j->wy + r * t : NULL, t, ow, y + r * ow);
    }
}

PyDoc_STRVAR(resize2d_doc,
"resize2d(x, y, planes, h, w, oh, ow, iy, wy, ty, ix, wx, tx, order, threads)\n\n"
"Resample float32 x [planes, h, w] into y [planes, oh, ow]: output row r reads source\n"
"rows iy[r, :ty] (int64 [oh, ty], in range) with weights wy [oh, ty] (float32), output\n"
"column c reads iy's row's columns ix[c, :tx] with weights wx [ow, tx]; wy or wx None\n"
"(with one tap) copies. order 0 blends rows first, 1 columns first: the order the numpy\n"
"path resamples the axes in. Runs on up to threads threads, without the GIL.");

static PyObject *resize2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo, *iyo, *wyo, *ixo, *wxo;
    Py_ssize_t planes, h, w, oh, ow, ty, tx;
    int order, threads;
    if (!PyArg_ParseTuple(args, "OOnnnnnOOnOOnii:resize2d", &xo, &yo, &planes, &h, &w, &oh, &ow, &iyo, &wyo, &ty,
                          &ixo, &wxo, &tx, &order, &threads))
        return NULL;
    if (planes < 0 || h < 1 || w < 1 || oh < 0 || ow < 0 || ty < 1 || tx < 1 || ty > MAX_TAPS ||
        (order != 0 && order != 1) || (wyo == Py_None && ty != 1) || (wxo == Py_None && tx != 1)) {
        PyErr_SetString(PyExc_ValueError, "resize2d: invalid geometry, taps or order");
        return NULL;
    }
    nbuf x, y, iy, wy, ix, wx;
    x.held = y.held = iy.held = wy.held = ix.held = wx.held = 0;
    if (nb_get(xo, &x, 'f', 4, planes * h * w, 0, 0, "resize2d: x") < 0 ||
        nb_get(yo, &y, 'f', 4, planes * oh * ow, 1, 0, "resize2d: y") < 0 ||
        nb_get(iyo, &iy, 'i', 8, oh * ty, 0, 0, "resize2d: iy") < 0 ||
        nb_get(wyo, &wy, 'f', 4, oh * ty, 0, 1, "resize2d: wy") < 0 ||
        nb_get(ixo, &ix, 'i', 8, ow * tx, 0, 0, "resize2d: ix") < 0 ||
        nb_get(wxo, &wx, 'f', 4, ow * tx, 0, 1, "resize2d: wx") < 0)
        goto done;
    resize_job job = {x.view.buf, y.view.buf, iy.view.buf, ix.view.buf, wy.held ? wy.view.buf : NULL,
                      wx.held ? wx.view.buf : NULL, h, w, oh, ow, ty, tx, 0, 0, 0, order, 0};
    /* indices are checked here, once, so the loops need not */
    for (Py_ssize_t i = 0; i < oh * ty; i++)
        if (job.iy[i] < 0 || job.iy[i] >= h) {
            PyErr_SetString(PyExc_ValueError, "resize2d: row index out of range");
            goto done;
        }
    for (Py_ssize_t i = 0; i < ow * tx; i++)
        if (job.ix[i] < 0 || job.ix[i] >= w) {
            PyErr_SetString(PyExc_ValueError, "resize2d: column index out of range");
            goto done;
        }
    if (planes == 0 || oh == 0 || ow == 0)
        goto done;
    if (!job.wx && ow % w == 0 && ow > w) {
        job.factor = ow / w;
        for (Py_ssize_t c = 0; c < ow && job.factor; c++)
            if (job.ix[c] != c / job.factor)
                job.factor = 0;
    }
    /* blocks of about 32k outputs, at least 8 rows (columns first recomputes the
     * source rows a block shares with the next) */
    job.block = (32768 + ow - 1) / ow;
    if (job.block < 8)
        job.block = 8;
    if (job.block > oh)
        job.block = oh;
    job.blocks = (oh + job.block - 1) / job.block;
    Py_BEGIN_ALLOW_THREADS
    pool_run(resize_task, &job, planes * job.blocks, threads);
    Py_END_ALLOW_THREADS
    if (job.failed)
        PyErr_NoMemory();
done:
    nb_release(&x);
    nb_release(&y);
    nb_release(&iy);
    nb_release(&wy);
    nb_release(&ix);
    nb_release(&wx);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef resize2d_methods[] = {
    {"resize2d", resize2d, METH_VARARGS, resize2d_doc},
    {NULL, NULL, 0, NULL},
};
