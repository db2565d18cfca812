/* 2-D convolution as im2col and BLAS products, in tiles that stay in cache.
 *
 * Column mode: each task takes an image, a group and a chunk of output positions,
 * gathers the chunk's columns (im2col) into its thread's scratch, multiplies the
 * group's weight rows with them into the output (BLAS, one thread) and finishes the
 * tile (bias, residual, activation) while it is in cache. A 1x1 convolution with
 * stride 1 and no padding multiplies the input directly. Row mode, for maps too
 * small to give every thread column chunks (7x7, 14x14 layers with hundreds of
 * channels): the whole im2col once, shared, then blocks of output rows per task.
 * The numpy path (``onnxrt_cpu.conv.bands``) gathers the same columns with
 * numpy copies and splits products over Python threads.
 */
#include "native.h"

#include <math.h>

enum { MODE_COLUMNS = 0, MODE_ROWS = 1 };

typedef struct {
    const conv_geometry *g;
    const void *x, *w, *b, *z;
    void *y, *shared;
    Py_ssize_t k;       /* columns of the weight: cg * kh * kw */
    Py_ssize_t cols;    /* column mode: positions per chunk */
    Py_ssize_t chunks;  /* column mode: chunks per image and group */
    Py_ssize_t rows;    /* row mode: output rows per task */
    Py_ssize_t krows;   /* row mode: im2col rows per gather task */
    Py_ssize_t image, group;
    int mode, pointwise, act, failed;
    double lo, hi;
    /* QLinearConv: 8-bit input centred on its zero point in the gather (exact in
     * float32, as the caller checked), each tile requantized into the 8-bit output */
    int quant, x_signed, y_signed;
    double xzp, yzp;
    const float *mult; /* [mult_n]: x_scale * w_scale / y_scale, per channel or one */
    Py_ssize_t mult_n;
} conv_job;

/* Bytes of one column chunk's gathered columns and output tile: about the L2 cache
 * of one core, so that the product reads what the gather wrote and the epilogue what
 * the product wrote; but at least MIN_COLS columns, since narrower products run far
 * below BLAS's peak. ResNet-18's 3x3 layers (64 x 56 x 56 to 512 x 7 x 7, one
 * thread, OpenBLAS's AVX-512 kernels): 192 KiB and 16 columns 2.8-4.2 ms a layer,
 * 1 MiB and 64 columns 2.6-2.9 ms, the product alone in one call 2.3-2.9 ms; 2 and 4
 * MiB no better. */
#define TILE_BYTES (1024 * 1024)
#define MIN_COLS 64

/* Most bytes of gathered columns a call may hold (the caller falls back to a path
 * that gathers in bounded bands). */
#define SCRATCH_LIMIT (256.0 * 1024 * 1024)

#define IM_SRC float
#define IM_DST float
#define IM_NAME im2col_f32
#define IM_LOAD(v) (v)
#include "im2col.h"
#define IM_SRC double
#define IM_DST double
#define IM_NAME im2col_f64
#define IM_LOAD(v) (v)
#include "im2col.h"
#define IM_SRC uint8_t
#define IM_DST float
#define IM_NAME im2col_u8
#define IM_LOAD(v) ((float)(v) - zp)
#include "im2col.h"
#define IM_SRC int8_t
#define IM_DST float
#define IM_NAME im2col_s8
#define IM_LOAD(v) ((float)(v) - zp)
#include "im2col.h"

#include "requant.h"

#define T float
#define SFX(name) name##_f32
#define GEMM gemm_f32
#define CONV_QUANT 1
#include "epilogue.h"
#include "conv_body.h"
#undef T
#undef SFX
#undef GEMM
#undef CONV_QUANT
#define T double
#define SFX(name) name##_f64
#define GEMM gemm_f64
#define CONV_QUANT 0
#include "epilogue.h"
#include "conv_body.h"
#undef T
#undef SFX
#undef GEMM
#undef CONV_QUANT

/* Choose the mode and the chunk sizes: column chunks of about TILE_BYTES, but as
 * many as the threads can share evenly (a 96 x 112 x 112 expansion in five chunks on
 * two threads waited for the fifth); where the columns cannot give every thread a
 * chunk, row mode. */
static void conv_plan(conv_job *job, Py_ssize_t itemsize, int threads)
{
    const conv_geometry *g = job->g;
    const Py_ssize_t L = g->oh * g->ow, mg = g->m / g->groups, images = g->n * g->groups;
    Py_ssize_t per_col = (job->pointwise ? 0 : job->k) + mg;
    Py_ssize_t cols = TILE_BYTES / (itemsize * (per_col > 0 ? per_col : 1));
    cols = cols < MIN_COLS ? MIN_COLS : cols / 16 * 16;
    Py_ssize_t chunks = (L + cols - 1) / cols;
    if (threads > 1 && images * chunks < 4 * threads) {
        Py_ssize_t tasks = (images * chunks + threads - 1) / threads * threads;
        Py_ssize_t want = (tasks + images - 1) / images;
        Py_ssize_t even = ((L + want - 1) / want + 15) / 16 * 16;
        if (even < cols)
            cols = even;
    }
    if (cols > L)
        cols = L;
    job->cols = cols;
    job->chunks = (L + cols - 1) / cols;
    job->mode = MODE_COLUMNS;
    /* Row mode where the columns cannot give every thread a chunk, or where a few
     * column chunks would each repack more weight rows than their columns hold:
     * every product call packs its operands (576 x 96 x 14 x 14 on two threads, two
     * column chunks 221 us, row blocks 160 us; onnxruntime 153 us). */
    if (threads > 1 && mg >= 32 && images == 1 &&
        (job->chunks < threads || (job->chunks < 4 * threads && mg > L))) {
        job->mode = MODE_ROWS;
        Py_ssize_t rows = (mg + 2 * threads - 1) / (2 * threads);
        job->rows = rows < 16 ? 16 : (rows + 7) / 8 * 8;
        job->krows = (job->k + 2 * threads - 1) / (2 * threads);
    }
}

/* Whether the geometry describes a convolution these kernels take; else a ValueError
 * naming the function ``who``. */
static int conv_geometry_ok(const conv_geometry *g, const char *who)
{
    if (g->n < 0 || g->c < 1 || g->h < 1 || g->w < 1 || g->m < 1 || g->groups < 1 || g->c % g->groups ||
        g->m % g->groups || g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 ||
        g->pt < 0 || g->pl < 0 || g->oh < 1 || g->ow < 1) {
        PyErr_Format(PyExc_ValueError, "%s: invalid geometry", who);
        return 0;
    }
    if (!blas_ready()) {
        PyErr_Format(PyExc_RuntimeError, "%s: no BLAS products were handed over (set_blas)", who);
        return 0;
    }
    return 1;
}

/* Plan and run ``job`` (its buffers set) on up to ``threads`` threads without the
 * GIL: -1 with MemoryError where its gathered columns would pass SCRATCH_LIMIT (a
 * hostile model's huge kernel over a large map; the caller falls back to a path that
 * gathers in bounded bands) or memory runs out. */
static int conv_execute(conv_job *job, Py_ssize_t itemsize, int threads, const char *who)
{
    const conv_geometry *g = job->g;
    if (g->n == 0)
        return 0;
    conv_plan(job, itemsize, threads);
    double need = (double)job->k * (double)(job->mode == MODE_ROWS ? g->oh * g->ow : job->cols) * (double)itemsize;
    if (!job->pointwise && need > SCRATCH_LIMIT) {
        PyErr_Format(PyExc_MemoryError, "%s: %.0f bytes of gathered columns exceed the %.0f-byte limit", who, need,
                     (double)SCRATCH_LIMIT);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    if (job->mode == MODE_ROWS && !job->pointwise) {
        job->shared = scratch(1, (size_t)(job->k * g->oh * g->ow) * (size_t)itemsize);
        if (!job->shared)
            job->failed = 1;
    }
    if (!job->failed) {
        if (itemsize == 4)
            conv_run_f32(job, threads);
        else
            conv_run_f64(job, threads);
    }
    Py_END_ALLOW_THREADS
    if (job->failed) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(conv2d_doc,
"conv2d(x, w, b, z, y, geometry, act, lo, hi, threads)\n\n"
"Convolution of x [N, C, H, W] with w [M, C / groups * kh * kw] (each group's rows\n"
"together), plus the bias b [M] and the residual z (y's shape), each or None, then the\n"
"activation act (0 none, 1 Relu, 2 Clip to [lo, hi], 3 LeakyRelu of alpha lo, 4 HardSigmoid,\n"
"5 HardSwish of alpha lo and beta hi, 6 x * clip(x + lo, 0, hi) / hi,\n"
"7 Sigmoid, 8 x * sigmoid(lo * x)), into y [N, M, OH, OW].\n"
"geometry is a ConvGeometry (n, c, h, w, m, groups, kh, kw, sh, sw, dh, dw, pad_top,\n"
"pad_left, oh, ow); pads are at least 0, the padding value is 0. float32 or float64, all alike. Needs\n"
"set_blas; runs on up to threads threads, without the GIL.");

static PyObject *conv2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *zo, *yo, *go;
    conv_geometry g;
    int act, threads;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "OOOOOOiddi:conv2d", &xo, &wo, &bo, &zo, &yo, &go, &act, &lo, &hi, &threads) ||
        conv_geometry_get(go, &g, "conv2d") < 0)
        return NULL;
    if (act < ACT_NONE || act > ACT_LAST) {
        PyErr_SetString(PyExc_ValueError, "conv2d: invalid geometry or activation");
        return NULL;
    }
    if (!conv_geometry_ok(&g, "conv2d"))
        return NULL;
    Py_ssize_t itemsize = nb_float_size(xo, "conv2d: x");
    if (itemsize < 0)
        return NULL;
    const Py_ssize_t K = g.c / g.groups * g.kh * g.kw, out = g.n * g.m * g.oh * g.ow;
    nbuf x, w, b, z, y;
    x.held = w.held = b.held = z.held = y.held = 0;
    conv_job job;
    memset(&job, 0, sizeof(job));
    job.g = &g;
    job.k = K;
    job.act = act;
    job.lo = lo;
    job.hi = hi;
    job.pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.oh == g.h &&
                    g.ow == g.w;
    if (nb_get(xo, &x, 'f', itemsize, g.n * g.c * g.h * g.w, 0, 0, "conv2d: x") < 0 ||
        nb_get(wo, &w, 'f', itemsize, g.m * K, 0, 0, "conv2d: w") < 0 ||
        nb_get(bo, &b, 'f', itemsize, g.m, 0, 1, "conv2d: b") < 0 ||
        nb_get(zo, &z, 'f', itemsize, out, 0, 1, "conv2d: z") < 0 ||
        nb_get(yo, &y, 'f', itemsize, out, 1, 0, "conv2d: y") < 0)
        goto done;
    job.x = x.view.buf;
    job.w = w.view.buf;
    job.b = b.held ? b.view.buf : NULL;
    job.z = z.held ? z.view.buf : NULL;
    job.y = y.view.buf;
    conv_execute(&job, itemsize, threads, "conv2d");
done:
    nb_release(&x);
    nb_release(&w);
    nb_release(&b);
    nb_release(&z);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(qconv2d_doc,
"qconv2d(x, w, b, mult, y, geometry, x_zero_point, y_zero_point, threads)\n\n"
"QLinearConv of the 8-bit x [N, C, H, W] (int8 or uint8) with the centred float32\n"
"weight w [M, C / groups * kh * kw] (w - its zero point), the float32 bias b [M] (the\n"
"int32 bias, or None), into the 8-bit y [N, M, OH, OW] (int8 or uint8): the input\n"
"centred on x_zero_point, the products exact in float32 (the caller checks every\n"
"partial sum stays below 2**24), then (acc + b) * mult (float32 [M] or [1]: x_scale *\n"
"w_scale / y_scale) rounded half to even, plus y_zero_point, saturated. geometry as\n"
"conv2d's. Needs set_blas; runs on up to threads threads, without the GIL.");

static PyObject *qconv2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *mo, *yo, *go;
    conv_geometry g;
    int threads, xzp, yzp;
    if (!PyArg_ParseTuple(args, "OOOOOOiii:qconv2d", &xo, &wo, &bo, &mo, &yo, &go, &xzp, &yzp, &threads) ||
        conv_geometry_get(go, &g, "qconv2d") < 0)
        return NULL;
    if (!conv_geometry_ok(&g, "qconv2d"))
        return NULL;
    const Py_ssize_t K = g.c / g.groups * g.kh * g.kw, out = g.n * g.m * g.oh * g.ow;
    nbuf x, w, b, mult, y;
    x.held = w.held = b.held = mult.held = y.held = 0;
    conv_job job;
    memset(&job, 0, sizeof(job));
    job.g = &g;
    job.k = K;
    job.quant = 1;
    job.xzp = xzp;
    job.yzp = yzp;
    if (nb_int8_kind(xo, &job.x_signed, "qconv2d: x") < 0 || nb_int8_kind(yo, &job.y_signed, "qconv2d: y") < 0)
        return NULL;
    if (nb_get(xo, &x, job.x_signed ? 'i' : 'u', 1, g.n * g.c * g.h * g.w, 0, 0, "qconv2d: x") < 0 ||
        nb_get(wo, &w, 'f', 4, g.m * K, 0, 0, "qconv2d: w") < 0 ||
        nb_get(bo, &b, 'f', 4, g.m, 0, 1, "qconv2d: b") < 0 ||
        (job.mult_n = nb_get_ratio(mo, &mult, g.m, "qconv2d")) < 0 ||
        nb_get(yo, &y, job.y_signed ? 'i' : 'u', 1, out, 1, 0, "qconv2d: y") < 0)
        goto done;
    job.x = x.view.buf;
    job.w = w.view.buf;
    job.b = b.held ? b.view.buf : NULL;
    job.mult = mult.view.buf;
    job.y = y.view.buf;
    conv_execute(&job, 4, threads, "qconv2d");
done:
    nb_release(&x);
    nb_release(&w);
    nb_release(&b);
    nb_release(&mult);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef conv_methods[] = {
    {"conv2d", conv2d, METH_VARARGS, conv2d_doc},
    {"qconv2d", qconv2d, METH_VARARGS, qconv2d_doc},
    {NULL, NULL, 0, NULL},
};
