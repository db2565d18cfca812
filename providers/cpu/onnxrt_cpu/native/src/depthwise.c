/* Depthwise 2-D convolution (one input channel per output channel).
 *
 * Each plane is first written into the stride phases of its padded map (``x[p::s]``
 * along each axis, zeros in the padding), so that every kernel tap reads one
 * contiguous run of one phase: the output is computed on the phase's row pitch in
 * blocks that stay in registers through all taps, then cropped to the output width
 * with the activation applied. The numpy path (``onnxrt_cpu.conv.depthwise``) does
 * the same with one copy per tap and a batched product.
 */
#include "native.h"

#define T float
#define SFX(name) name##_f32
#include "epilogue.h"
#include "phases.h"
#include "depthwise_body.h"
#undef T
#undef SFX
#define T double
#define SFX(name) name##_f64
#include "epilogue.h"
#include "phases.h"
#include "depthwise_body.h"
#undef T
#undef SFX

/* Up to this many input positions a plane takes the channels-last path (single
 * layers of MobileNetV2, one thread: 960 x 7 x 7 88 -> 51 us, 576 x 14 x 14 with
 * stride 2 103 -> 55 us; but 192 x 28 x 28 with stride 2 75 -> 124 us, whose
 * transposes cost more than the flat path's waste). */
#define DW_CHANNELS_LAST_MAX 256

/* Planes per chunk of the pool: whole vectors of channels for the channels-last path. */
#define DW_CHUNK 16

typedef struct {
    const window_geometry *g;
    Py_ssize_t itemsize, planes, chunk;
    const void *x, *w, *b;
    void *y;
    int act, failed;
    double lo, hi;
} dw_job;

static void dw_task(void *arg, Py_ssize_t i)
{
    dw_job *job = arg;
    const window_geometry *g = job->g;
    Py_ssize_t j0 = i * job->chunk, j1 = j0 + job->chunk < job->planes ? j0 + job->chunk : job->planes;
    int last = g->h * g->w <= DW_CHANNELS_LAST_MAX, rc;
    if (job->itemsize == 4)
        rc = (last ? dw_channels_last_f32 : dw_flat_f32)(g, job->x, job->w, job->b, job->y, j0, j1, job->act,
                                                         (float)job->lo, (float)job->hi);
    else
        rc = (last ? dw_channels_last_f64 : dw_flat_f64)(g, job->x, job->w, job->b, job->y, j0, j1, job->act,
                                                         job->lo, job->hi);
    if (rc < 0)
        job->failed = 1;
}

PyDoc_STRVAR(depthwise2d_doc,
"depthwise2d(x, w, b, y, geometry, act, lo, hi, threads)\n\n"
"Depthwise convolution of x [N, C, H, W] with w [C, kh * kw] and the bias b [C] (or\n"
"None) into y [N, C, OH, OW], then the activation act (0 none, 1 Relu, 2 Clip to\n"
"[lo, hi], 3-8 as conv2d's). geometry is a WindowGeometry (n, c, h, w, kh, kw, sh, sw, dh, dw, pad_top,\n"
"pad_left, oh, ow); the pads are at least 0 and the padding value is 0. float32 or float64, all\n"
"alike. Runs on up to threads threads, without the GIL.");

static PyObject *depthwise2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *yo, *go;
    window_geometry g;
    int act, threads;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "OOOOOiddi:depthwise2d", &xo, &wo, &bo, &yo, &go, &act, &lo, &hi, &threads) ||
        window_geometry_get(go, &g, "depthwise2d") < 0)
        return NULL;
    if (g.n < 0 || g.c < 1 || g.h < 1 || g.w < 1 || g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 ||
        g.dw < 1 || g.pt < 0 || g.pl < 0 || g.oh < 1 || g.ow < 1 || act < ACT_NONE || act > ACT_LAST) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: invalid geometry or activation");
        return NULL;
    }
    Py_ssize_t itemsize = nb_float_size(xo, "depthwise2d: x");
    if (itemsize < 0)
        return NULL;
    nbuf x, w, b, y;
    x.held = w.held = b.held = y.held = 0;
    dw_job job = {&g, itemsize, g.n * g.c, DW_CHUNK, NULL, NULL, NULL, NULL, act, 0, lo, hi};
    if (nb_get(xo, &x, 'f', itemsize, g.n * g.c * g.h * g.w, 0, 0, "depthwise2d: x") < 0 ||
        nb_get(wo, &w, 'f', itemsize, g.c * g.kh * g.kw, 0, 0, "depthwise2d: w") < 0 ||
        nb_get(bo, &b, 'f', itemsize, g.c, 0, 1, "depthwise2d: b") < 0 ||
        nb_get(yo, &y, 'f', itemsize, g.n * g.c * g.oh * g.ow, 1, 0, "depthwise2d: y") < 0)
        goto done;
    job.x = x.view.buf;
    job.w = w.view.buf;
    job.b = b.held ? b.view.buf : NULL;
    job.y = y.view.buf;
    Py_BEGIN_ALLOW_THREADS
    pool_run(dw_task, &job, (job.planes + job.chunk - 1) / job.chunk, threads);
    Py_END_ALLOW_THREADS
    if (job.failed)
        PyErr_NoMemory();
done:
    nb_release(&x);
    nb_release(&w);
    nb_release(&b);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef depthwise_methods[] = {
    {"depthwise2d", depthwise2d, METH_VARARGS, depthwise2d_doc},
    {NULL, NULL, 0, NULL},
};
