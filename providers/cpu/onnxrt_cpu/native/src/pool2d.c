/* MaxPool and AveragePool over 2-D maps: each plane written into the stride phases of
 * its padded map (phases.h), every tap one contiguous fold over the whole plane in
 * cache, planes shared out on the pool. The numpy path of ``onnxrt_cpu.kernels.pool``
 * makes one pass over memory per tap or axis. */
#include "native.h"

#include <math.h>

enum { POOL_MAX = 0, POOL_AVERAGE = 1 };

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
    /* chunks of a few planes: at least about 32k outputs each, or the hand-over costs more */
    job.chunk = (32768 + g.oh * g.ow - 1) / (g.oh * g.ow);
    Py_BEGIN_ALLOW_THREADS
    pool_run(itemsize == 4 ? pool_task_f32 : pool_task_f64, &job, (job.planes + job.chunk - 1) / job.chunk,
             threads);
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
