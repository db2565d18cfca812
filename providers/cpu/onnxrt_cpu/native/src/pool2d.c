/* MaxPool and AveragePool over 2-D maps, by one of four kernels (pool2d_body.h):
 *
 * - MaxPool of one-row windows that tile every input row (plcmos's 1 x 4 of stride
 *   4): all planes as one flat row, one pass;
 * - MaxPool of 2 x 2 windows of stride 2 inside the input: one pass over each pair
 *   of input rows;
 * - planes past ROWS_MIN_PLANE_BYTES: output row by output row, the window's input
 *   rows reduced into one and split into its column phases, no copy of the plane;
 * - smaller planes: each plane written into the stride phases of its padded map
 *   (phases.h), every tap one contiguous fold over the whole plane in cache.
 *
 * Work is shared out on the pool in chunks of planes, rows or outputs. The numpy
 * path of ``onnxrt_cpu.kernels.pool`` makes one pass over memory per tap or axis.
 *
 * One session alternating the kernels, two threads, medians (the machine shared):
 * 32 x 498 x 257 by 1 x 4 / 4, rows 0.9-1.2 ms against phases 2.7-3.5; 64 x 496 x 64
 * the same window flat 0.17 ms, phases 2.0-2.3; 128 x 494 x 16 flat 0.04 ms, phases
 * 1.3-2.7; 2 x 2 / 2 over 24 x 72 x 32 5 us, phases 18; but 3 x 3 / 2 over 64 x 112 x
 * 112 (50 KB planes) rows 212 us, phases 199, and 3 x 3 / 1 over 32 x 56 x 56 rows
 * 81, phases 70: the phases keep the small planes. */
#include "native.h"

#include <math.h>

enum { POOL_MAX = 0, POOL_AVERAGE = 1 };

/* Smallest plane (bytes) pooled by output rows rather than through its phases. */
#define ROWS_MIN_PLANE_BYTES 65536.0

typedef struct {
    const window_geometry *g;
    const void *x, *div;
    void *y;
    Py_ssize_t planes, chunk;
    int mode, failed;
} pool_job;

typedef int32_t int_t_f32;
typedef int64_t int_t_f64;

#define T float
#define SFX(name) name##_f32
#include "phases.h"
#include "pool2d_body.h"
#undef T
#undef SFX
#define T double
#define SFX(name) name##_f64
#include "phases.h"
#include "pool2d_body.h"
#undef T
#undef SFX

PyDoc_STRVAR(pool2d_doc,
"pool2d(x, y, geometry, mode, div, threads)\n\n"
"MaxPool (mode 0) or AveragePool (mode 1) of x [N, C, H, W] into y [N, C, OH, OW].\n"
"geometry is a WindowGeometry (n, c, h, w, kh, kw, sh, sw, dh, dw, pad_top, pad_left,\n"
"oh, ow); taps outside the input are left out of every window (a window with none\n"
"gives -inf or 0 / div). AveragePool divides by div [OH * OW] (the counts the attributes ask\n"
"for); MaxPool takes None. NaN propagates as in numpy's maximum. float32 or float64,\n"
"all alike. Runs on up to threads threads, without the GIL.");

static PyObject *pool2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo, *divo, *go;
    window_geometry g;
    int mode, threads;
    if (!PyArg_ParseTuple(args, "OOOiOi:pool2d", &xo, &yo, &go, &mode, &divo, &threads) ||
        window_geometry_get(go, &g, "pool2d") < 0)
        return NULL;
    if (g.n < 0 || g.c < 0 || g.h < 1 || g.w < 1 || g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 ||
        g.dw < 1 || g.pt < 0 || g.pl < 0 || g.oh < 0 || g.ow < 0 || (mode != POOL_MAX && mode != POOL_AVERAGE) ||
        (mode == POOL_AVERAGE) != (divo != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "pool2d: invalid geometry, mode or divisor");
        return NULL;
    }
    Py_ssize_t itemsize = nb_float_size(xo, "pool2d: x");
    if (itemsize < 0)
        return NULL;
    nbuf x, y, div;
    x.held = y.held = div.held = 0;
    pool_job job = {&g, NULL, NULL, NULL, g.n * g.c, 8, mode, 0};
    if (nb_get(xo, &x, 'f', itemsize, g.n * g.c * g.h * g.w, 0, 0, "pool2d: x") < 0 ||
        nb_get(yo, &y, 'f', itemsize, g.n * g.c * g.oh * g.ow, 1, 0, "pool2d: y") < 0 ||
        nb_get(divo, &div, 'f', itemsize, g.oh * g.ow, 0, 1, "pool2d: div") < 0)
        goto done;
    job.x = x.view.buf;
    job.y = y.view.buf;
    job.div = div.held ? div.view.buf : NULL;
    if (g.oh == 0 || g.ow == 0 || job.planes == 0)
        goto done;
    pool_task task;
    Py_ssize_t count;
    if (mode == POOL_MAX && g.kh == 1 && g.sh == 1 && g.pt == 0 && g.pl == 0 && g.oh == g.h && g.w == g.ow * g.sw &&
        (g.ow - 1) * g.sw + (g.kw - 1) * g.dw < g.w) {
        /* one-row windows tiling every row: all planes as one row (chunks of outputs) */
        job.chunk = 16384;
        count = job.planes * g.oh * g.ow;
        task = itemsize == 4 ? pool_flat_task_f32 : pool_flat_task_f64;
    } else if (mode == POOL_MAX && g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.dh == 1 && g.dw == 1 &&
               g.pt == 0 && g.pl == 0 && 2 * g.oh <= g.h && 2 * g.ow <= g.w) {
        /* 2 x 2 windows of stride 2 inside the input (chunks of output rows) */
        job.chunk = (16384 + g.ow - 1) / g.ow;
        count = job.planes * g.oh;
        task = itemsize == 4 ? pool_2x2_task_f32 : pool_2x2_task_f64;
    } else if ((double)g.h * (double)g.w * (double)itemsize > ROWS_MIN_PLANE_BYTES) {
        /* planes past the cache: by output rows, no copy of the plane (chunks of rows) */
        job.chunk = (16384 + g.ow - 1) / g.ow;
        count = job.planes * g.oh;
        task = itemsize == 4 ? pool_rows_task_f32 : pool_rows_task_f64;
    } else {
        /* chunks of a few planes: at least about 32k outputs each, or the hand-over costs more */
        job.chunk = (32768 + g.oh * g.ow - 1) / (g.oh * g.ow);
        count = job.planes;
        task = itemsize == 4 ? pool_task_f32 : pool_task_f64;
    }
    Py_BEGIN_ALLOW_THREADS
    pool_run(task, &job, (count + job.chunk - 1) / job.chunk, threads);
    Py_END_ALLOW_THREADS
    if (job.failed)
        PyErr_NoMemory();
done:
    nb_release(&x);
    nb_release(&y);
    nb_release(&div);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef pool2d_methods[] = {
    {"pool2d", pool2d, METH_VARARGS, pool2d_doc},
    {NULL, NULL, 0, NULL},
};
