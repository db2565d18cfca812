/* Elementwise kernels: activations over whole arrays, and a per-channel affine map
 * (inference BatchNormalization), in one pass each, split over the pool.
 *
 * numpy makes one pass over memory per operation (Sigmoid is four: negative, exp,
 * add, divide; Gelu nineteen), on one thread. Here every element is finished in registers. The
 * exponential is Cephes' single-precision one (a degree-6 polynomial on the reduced
 * argument, within 1-2 ulp), written branch-free so that GCC vectorizes it for each
 * instruction set of NATIVE_CLONES; numpy's own vectorized exp is also within a few
 * ulp of the true value, so results agree with the numpy paths to float32 rounding.
 */
#include "native.h"
#include "vmath.h"

#include <math.h>

enum { OP_RELU = 1, OP_CLIP = 2, OP_SIGMOID = 3, OP_SWISH = 4, OP_GELU = 5 };

/* Elements per chunk of the pool: large enough that a hand-over is a few percent. */
#define CHUNK (1 << 15)

/* tanh(u) as (1 - e) / (1 + e) with e = exp(-2 |u|), the sign restored: within a few
 * ulp of 1 in absolute terms (relative accuracy is lost near 0, where Gelu adds 1 to
 * it anyway). */
static inline float tanh_f32(float u)
{
    float a = u < 0 ? -u : u;
    float e = exp_f32(-2.0f * a);
    float t = (1.0f - e) / (1.0f + e);
    return u < 0 ? -t : t;
}

/* Gelu's erf form, 0.5 x (1 + erf(x / sqrt 2)), as the numpy path computes it in
 * float32 (onnxrt_cpu.kernels.activation): erf(x / sqrt 2) as tanh(x P(x^2)), P of
 * degree 6 fitted there, within 5.7e-7 of the exact Gelu; beyond |x| = 5.5 the
 * argument of tanh passes 9.08 and tanh is +-1. */
static inline float gelu_f32(float x)
{
    float z = x * x;
    float p = 1.7563152978619428e-09f;
    p = p * z - 1.322680920256349e-07f;
    p = p * z + 3.9647985920779445e-06f;
    p = p * z - 5.530645896847896e-05f;
    p = p * z - 3.259441598169052e-05f;
    p = p * z + 0.03633308413099426f;
    p = p * z + 0.7978849415467002f;
    float t = tanh_f32(x * p) + 1.0f;
    /* halved before x multiplies it, so that x near float's maximum does not overflow */
    return (t * 0.5f) * x;
}

/* ``y = x + b`` for one row (BiasGelu's bias, added in the same pass as the op). */
static inline void add_row_f32(const float *restrict x, const float *restrict b, float *restrict y, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        y[i] = x[i] + b[i];
}

/* y may be x (BiasGelu maps its biased rows in place): no restrict here, so the
 * compiler checks the overlap instead of assuming none. */
NATIVE_CLONES static void unary_f32(const float *x, float *y, Py_ssize_t n, int op, float alpha,
                                    float beta)
{
    switch (op) {
    case OP_RELU:
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = x[i] < 0 ? 0.0f : x[i];
        break;
    case OP_CLIP:
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = x[i] < alpha ? alpha : x[i];
            y[i] = v > beta ? beta : v;
        }
        break;
    case OP_SIGMOID:
        /* 1 / (1 + exp(-x)), as the numpy path: exp overflows to inf only where the
         * result is below the smallest normal, and 1 / inf is then 0 */
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + exp_f32(-x[i]));
        break;
    case OP_SWISH: /* x * sigmoid(alpha x) as x / (1 + exp(-alpha x)) */
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = x[i] / (1.0f + exp_f32(-alpha * x[i]));
        break;
    default: /* OP_GELU */
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = gelu_f32(x[i]);
        break;
    }
}

typedef struct {
    const void *x, *a, *s;
    void *y;
    Py_ssize_t n, c, inner, itemsize;
    int op;
    double alpha, beta;
} ew_job;

/* A chunk of CHUNK elements; with a bias (``a``, one value per position of the last
 * axis, ``inner`` long), a chunk of whole rows, each row biased into y and then
 * mapped there in place, while it is in cache. */
static void unary_task(void *arg, Py_ssize_t t)
{
    ew_job *job = arg;
    if (!job->a) {
        Py_ssize_t i0 = t * CHUNK, i1 = i0 + CHUNK < job->n ? i0 + CHUNK : job->n;
        unary_f32((const float *)job->x + i0, (float *)job->y + i0, i1 - i0, job->op, (float)job->alpha,
                  (float)job->beta);
        return;
    }
    Py_ssize_t rows = job->n / job->inner, per = job->inner >= CHUNK ? 1 : CHUNK / job->inner;
    Py_ssize_t r1 = (t + 1) * per < rows ? (t + 1) * per : rows;
    for (Py_ssize_t r = t * per; r < r1; r++) {
        const float *x = (const float *)job->x + r * job->inner;
        float *y = (float *)job->y + r * job->inner;
        add_row_f32(x, (const float *)job->a, y, job->inner);
        unary_f32(y, y, job->inner, job->op, (float)job->alpha, (float)job->beta);
    }
}

PyDoc_STRVAR(unary_doc,
"unary(x, y, op, alpha, beta, threads, bias=None)\n\n"
"y = op(x) over float32 arrays of one size: op 1 Relu, 2 Clip to [alpha, beta],\n"
"3 Sigmoid, 4 x * sigmoid(alpha * x) (Swish, SiLU, QuickGelu), 5 Gelu (erf form).\n"
"y may be x. With a float32 bias (one value per position of the last axis) the op\n"
"applies to x + bias (BiasGelu). Runs on\n"
"up to threads threads, without the GIL.");

static PyObject *unary(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo, *bo = Py_None;
    int op, threads;
    double alpha, beta;
    if (!PyArg_ParseTuple(args, "OOiddi|O:unary", &xo, &yo, &op, &alpha, &beta, &threads, &bo))
        return NULL;
    if (op < OP_RELU || op > OP_GELU) {
        PyErr_Format(PyExc_ValueError, "unary: unknown op %d", op);
        return NULL;
    }
    nbuf x, y, b;
    x.held = y.held = b.held = 0;
    ew_job job = {NULL, NULL, NULL, NULL, 0, 0, 0, 4, op, alpha, beta};
    Py_ssize_t tasks;
    if (nb_get(xo, &x, 'f', 4, 0, 0, 0, "unary: x") < 0)
        goto done;
    job.x = x.view.buf;
    job.n = x.view.len / 4;
    if (nb_get(yo, &y, 'f', 4, job.n, 1, 0, "unary: y") < 0 || nb_get(bo, &b, 'f', 4, 1, 0, 1, "unary: bias") < 0)
        goto done;
    job.y = y.view.buf;
    tasks = (job.n + CHUNK - 1) / CHUNK;
    if (b.held) {
        job.a = b.view.buf;
        job.inner = b.view.len / 4;
        if (job.n % job.inner) {
            PyErr_Format(PyExc_ValueError, "unary: %zd elements are not rows of the bias's %zd", job.n, job.inner);
            goto done;
        }
        Py_ssize_t per = job.inner >= CHUNK ? 1 : CHUNK / job.inner;
        tasks = (job.n / job.inner + per - 1) / per;
    }
    Py_BEGIN_ALLOW_THREADS
    pool_run(unary_task, &job, tasks, threads);
    Py_END_ALLOW_THREADS
done:
    nb_release(&x);
    nb_release(&y);
    nb_release(&b);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

#define AFFINE(T, SFX)                                                                                         \
    NATIVE_CLONES static void affine_##SFX(const T *restrict x, T *restrict y, Py_ssize_t n, T a, T s)        \
    {                                                                                                         \
        for (Py_ssize_t i = 0; i < n; i++)                                                                    \
            y[i] = x[i] * a + s;                                                                              \
    }
AFFINE(float, f32)
AFFINE(double, f64)

/* A chunk of whole planes (or of one plane's elements, when planes are large). */
static void affine_task(void *arg, Py_ssize_t t)
{
    ew_job *job = arg;
    Py_ssize_t planes = job->n / job->inner;
    Py_ssize_t per = job->inner >= CHUNK ? 1 : CHUNK / job->inner; /* planes a chunk */
    Py_ssize_t parts = job->inner >= CHUNK ? (job->inner + CHUNK - 1) / CHUNK : 1;
    Py_ssize_t p0 = (t / parts) * per, p1 = p0 + per < planes ? p0 + per : planes;
    Py_ssize_t e0 = (t % parts) * CHUNK, e1 = parts > 1 ? (e0 + CHUNK < job->inner ? e0 + CHUNK : job->inner)
                                                        : job->inner;
    for (Py_ssize_t p = p0; p < p1; p++) {
        Py_ssize_t ch = p % job->c, off = p * job->inner + e0;
        if (job->itemsize == 4)
            affine_f32((const float *)job->x + off, (float *)job->y + off, e1 - e0, ((const float *)job->a)[ch],
                       ((const float *)job->s)[ch]);
        else
            affine_f64((const double *)job->x + off, (double *)job->y + off, e1 - e0,
                       ((const double *)job->a)[ch], ((const double *)job->s)[ch]);
    }
}

PyDoc_STRVAR(channel_affine_doc,
"channel_affine(x, a, s, y, c, inner, threads)\n\n"
"y = x * a[ch] + s[ch] over x viewed as [outer, c, inner],\n"
"float32 or float64, all alike; y may be x. Runs on up to threads threads, without\n"
"the GIL.");

static PyObject *channel_affine(PyObject *self, PyObject *args)
{
    PyObject *xo, *ao, *so, *yo;
    Py_ssize_t c, inner;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOnni:channel_affine", &xo, &ao, &so, &yo, &c, &inner, &threads))
        return NULL;
    if (c < 1 || inner < 1) {
        PyErr_SetString(PyExc_ValueError, "channel_affine: invalid channels or inner size");
        return NULL;
    }
    Py_ssize_t itemsize = nb_float_size(xo, "channel_affine: x");
    if (itemsize < 0)
        return NULL;
    nbuf x, a, s, y;
    x.held = a.held = s.held = y.held = 0;
    ew_job job = {NULL, NULL, NULL, NULL, 0, c, inner, itemsize, 0, 0, 0};
    if (nb_get(xo, &x, 'f', itemsize, 0, 0, 0, "channel_affine: x") < 0 ||
        nb_get(ao, &a, 'f', itemsize, c, 0, 0, "channel_affine: a") < 0 ||
        nb_get(so, &s, 'f', itemsize, c, 0, 0, "channel_affine: s") < 0)
        goto done;
    job.n = x.view.len / itemsize;
    if (job.n % (c * inner)) {
        PyErr_Format(PyExc_ValueError, "channel_affine: x holds %zd elements, not a multiple of %zd x %zd", job.n,
                     c, inner);
        goto done;
    }
    if (nb_get(yo, &y, 'f', itemsize, job.n, 1, 0, "channel_affine: y") < 0)
        goto done;
    job.x = x.view.buf;
    job.a = a.view.buf;
    job.s = s.view.buf;
    job.y = y.view.buf;
    {
        Py_ssize_t planes = job.n / inner;
        Py_ssize_t tasks = inner >= CHUNK ? planes * ((inner + CHUNK - 1) / CHUNK)
                                          : (planes + CHUNK / inner - 1) / (CHUNK / inner);
        Py_BEGIN_ALLOW_THREADS
        pool_run(affine_task, &job, tasks, threads);
        Py_END_ALLOW_THREADS
    }
done:
    nb_release(&x);
    nb_release(&a);
    nb_release(&s);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- Row normalizations: LayerNormalization and RMS normalization, with or without a
 * skip (Skip[Simplified]LayerNormalization, EmbedLayerNormalization's sum) ------------ */

typedef struct {
    const float *x, *skip, *bias, *gamma, *beta;
    float *y, *sum, *mean, *inv;
    Py_ssize_t rows, h, per;
    float eps;
    int center; /* subtract the mean (LayerNormalization) or not (RMS) */
} norm_job;

/* The sum of v[0..h) and of (v - shift)^2 over sixteen float32 partial sums, then the
 * rest. GCC does not vectorize the lanes of a plain array here (it may not reorder a
 * float sum), so the lanes are a generic vector: one AVX-512 register, two AVX ones or
 * four SSE ones, whichever the clone targets. */
typedef float f32x16 __attribute__((vector_size(64)));

/* sixteen floats read at any float's alignment (a cast, not a function: a function
 * returning a 512-bit vector has an ABI of its own in the clones without AVX-512) */
typedef float f32x16u __attribute__((vector_size(64), aligned(4), may_alias));
#define load16(p) (*(const f32x16u *)(p))

typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

/* The lanes added as a tree, halves onto halves: four dependent adds, not fifteen. */
static inline __attribute__((always_inline)) float lanes_total(f32x16 part)
{
    const f32x8 a = __builtin_shufflevector(part, part, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(part, part, 8, 9, 10, 11, 12, 13, 14, 15);
    const f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline __attribute__((always_inline)) float row_sum16(const float *restrict v, Py_ssize_t h)
{
    /* two chains of vector adds, so that one's latency hides behind the other's */
    f32x16 p0 = {0}, p1 = {0};
    Py_ssize_t i = 0;
    for (; i + 32 <= h; i += 32) {
        p0 += load16(v + i);
        p1 += load16(v + i + 16);
    }
    if (i + 16 <= h) {
        p0 += load16(v + i);
        i += 16;
    }
    float t = lanes_total(p0 + p1);
    for (; i < h; i++)
        t += v[i];
    return t;
}

static inline __attribute__((always_inline)) float row_sq16(const float *restrict v, Py_ssize_t h, float shift)
{
    f32x16 p0 = {0}, p1 = {0};
    Py_ssize_t i = 0;
    for (; i + 32 <= h; i += 32) {
        const f32x16 d0 = load16(v + i) - shift, d1 = load16(v + i + 16) - shift;
        p0 += d0 * d0;
        p1 += d1 * d1;
    }
    if (i + 16 <= h) {
        const f32x16 d = load16(v + i) - shift;
        p0 += d * d;
        i += 16;
    }
    float t = lanes_total(p0 + p1);
    for (; i < h; i++) {
        const float d = v[i] - shift;
        t += d * d;
    }
    return t;
}

/* One row: s = x (+ skip + bias); mean = sum(s) / h where centred (else 0); var =
 * mean((s - mean)^2); inv = 1 / sqrt(var + eps); y = ((s - mean) * inv) * gamma (+
 * beta), each step in the numpy path's order. */
NATIVE_CLONES static void norm_row(const norm_job *j, Py_ssize_t r)
{
    const Py_ssize_t h = j->h;
    const float *restrict x = j->x + r * h;
    float *restrict y = j->y + r * h;
    float *restrict s = j->sum ? j->sum + r * h : y; /* the sum, kept where asked for */
    if (j->skip) {
        const float *restrict k = j->skip + r * h;
        if (j->bias)
            for (Py_ssize_t i = 0; i < h; i++)
                s[i] = (x[i] + k[i]) + j->bias[i];
        else
            for (Py_ssize_t i = 0; i < h; i++)
                s[i] = x[i] + k[i];
    } else {
        s = (float *)x; /* read only: y is written from it below */
    }
    const float mean = j->center ? row_sum16(s, h) * (1.0f / (float)h) : 0.0f;
    const float var = row_sq16(s, h, mean) * (1.0f / (float)h);
    const float inv = 1.0f / sqrtf(var + j->eps);
    if (j->mean)
        j->mean[r] = mean;
    if (j->inv)
        j->inv[r] = inv;
    if (j->beta)
        for (Py_ssize_t c = 0; c < h; c++)
            y[c] = ((s[c] - mean) * inv) * j->gamma[c] + j->beta[c];
    else
        for (Py_ssize_t c = 0; c < h; c++)
            y[c] = ((s[c] - mean) * inv) * j->gamma[c];
}

static void norm_task(void *arg, Py_ssize_t t)
{
    norm_job *j = arg;
    Py_ssize_t r1 = (t + 1) * j->per < j->rows ? (t + 1) * j->per : j->rows;
    for (Py_ssize_t r = t * j->per; r < r1; r++)
        norm_row(j, r);
}

PyDoc_STRVAR(row_norm_doc,
"row_norm(x, skip, bias, gamma, beta, y, sum, mean, inv, eps, center, threads)\n\n"
"Normalization of the rows of x [rows, h] (float32): s = x + skip + bias (skip\n"
"[rows, h] and bias [h] each or None); where center, m = mean(s), else m = 0;\n"
"y = (s - m) / sqrt(mean((s - m)^2) + eps) * gamma + beta (beta [h] or None). sum\n"
"(receives s, [rows, h]), mean (receives m, [rows]) and inv (receives 1 / sqrt(...),\n"
"[rows]) each or None. Runs on up to threads threads, without the GIL.");

static PyObject *row_norm(PyObject *self, PyObject *args)
{
    PyObject *xo, *ko, *bo, *go, *beo, *yo, *so, *mo, *io;
    double eps;
    int center, threads;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOdpi:row_norm", &xo, &ko, &bo, &go, &beo, &yo, &so, &mo, &io, &eps,
                          &center, &threads))
        return NULL;
    nbuf x, k, b, g, be, y, sm, mn, iv;
    x.held = k.held = b.held = g.held = be.held = y.held = sm.held = mn.held = iv.held = 0;
    norm_job j;
    memset(&j, 0, sizeof(j));
    j.eps = (float)eps;
    j.center = center;
    if (nb_get(go, &g, 'f', 4, 1, 0, 0, "row_norm: gamma") < 0)
        goto done;
    j.h = g.view.len / 4;
    if (nb_get(xo, &x, 'f', 4, j.h, 0, 0, "row_norm: x") < 0)
        goto done;
    if (x.view.len / 4 % j.h) {
        PyErr_Format(PyExc_ValueError, "row_norm: x holds %zd values, not rows of %zd", x.view.len / 4, j.h);
        goto done;
    }
    j.rows = x.view.len / 4 / j.h;
    if (nb_get(ko, &k, 'f', 4, j.rows * j.h, 0, 1, "row_norm: skip") < 0 ||
        nb_get(bo, &b, 'f', 4, j.h, 0, 1, "row_norm: bias") < 0 ||
        nb_get(beo, &be, 'f', 4, j.h, 0, 1, "row_norm: beta") < 0 ||
        nb_get(yo, &y, 'f', 4, j.rows * j.h, 1, 0, "row_norm: y") < 0 ||
        nb_get(so, &sm, 'f', 4, j.rows * j.h, 1, 1, "row_norm: sum") < 0 ||
        nb_get(mo, &mn, 'f', 4, j.rows, 1, 1, "row_norm: mean") < 0 ||
        nb_get(io, &iv, 'f', 4, j.rows, 1, 1, "row_norm: inv") < 0)
        goto done;
    if (b.held && !k.held) {
        PyErr_SetString(PyExc_ValueError, "row_norm: a bias needs a skip");
        goto done;
    }
    j.x = x.view.buf;
    j.skip = k.held ? k.view.buf : NULL;
    j.bias = b.held ? b.view.buf : NULL;
    j.gamma = g.view.buf;
    j.beta = be.held ? be.view.buf : NULL;
    j.y = y.view.buf;
    j.sum = sm.held ? sm.view.buf : NULL;
    j.mean = mn.held ? mn.view.buf : NULL;
    j.inv = iv.held ? iv.view.buf : NULL;
    j.per = j.h >= CHUNK ? 1 : CHUNK / j.h;
    if (j.rows) {
        Py_BEGIN_ALLOW_THREADS
        pool_run(norm_task, &j, (j.rows + j.per - 1) / j.per, threads);
        Py_END_ALLOW_THREADS
    }
done:
    nb_release(&x);
    nb_release(&k);
    nb_release(&b);
    nb_release(&g);
    nb_release(&be);
    nb_release(&y);
    nb_release(&sm);
    nb_release(&mn);
    nb_release(&iv);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- MatMulNBits' int8 rounding of A ------------------------------------------------ */

/* Each row's blocks of ``block`` values rounded as onnxruntime's int8 path rounds A: to
 * the nearest (ties to even) multiple of max|a| / 127 of the block, the codes a * (127 /
 * max|a|), every operation in float32 as the numpy path (_int8_blocks) does it. */
NATIVE_CLONES static void int8_blocks_row(const float *restrict a, float *restrict y, Py_ssize_t k, Py_ssize_t block)
{
    for (Py_ssize_t b0 = 0; b0 < k; b0 += block) {
        Py_ssize_t n = b0 + block < k ? block : k - b0;
        float scale;
        const float inv = int8_block_factor(a + b0, n, &scale);
        for (Py_ssize_t i = 0; i < n; i++)
            y[b0 + i] = rintf(a[b0 + i] * inv) * scale;
    }
}

PyDoc_STRVAR(int8_blocks_doc,
"int8_blocks(a, y, k, block)\n\n"
"MatMulNBits' rounding of A (float32 rows of k values) to int8 per block of block\n"
"values, into y: the nearest multiple of the block's max|a| / 127, ties to even.");

static PyObject *int8_blocks(PyObject *self, PyObject *args)
{
    PyObject *ao, *yo;
    Py_ssize_t k, block;
    if (!PyArg_ParseTuple(args, "OOnn:int8_blocks", &ao, &yo, &k, &block))
        return NULL;
    if (k < 1 || block < 1) {
        PyErr_SetString(PyExc_ValueError, "int8_blocks: k and block must be positive");
        return NULL;
    }
    nbuf a, y;
    a.held = y.held = 0;
    if (nb_get(ao, &a, 'f', 4, 0, 0, 0, "int8_blocks: a") < 0)
        return NULL;
    Py_ssize_t n = a.view.len / 4;
    if (n % k) {
        PyErr_Format(PyExc_ValueError, "int8_blocks: a holds %zd values, not rows of %zd", n, k);
        nb_release(&a);
        return NULL;
    }
    if (nb_get(yo, &y, 'f', 4, n, 1, 0, "int8_blocks: y") < 0) {
        nb_release(&a);
        return NULL;
    }
    const float *src = a.view.buf;
    float *dst = y.view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n / k; r++)
        int8_blocks_row(src + r * k, dst + r * k, k, block);
    Py_END_ALLOW_THREADS
    nb_release(&a);
    nb_release(&y);
    Py_RETURN_NONE;
}

/* ---- A table of every pair of 8-bit codes (QLinearAdd, QLinearMul) ---------------- */

typedef struct {
    const uint8_t *a, *b, *table;
    uint8_t *out;
    Py_ssize_t n;
} pair_job;

static void pair_task(void *arg, Py_ssize_t t)
{
    const pair_job *j = arg;
    const Py_ssize_t i0 = t * CHUNK, i1 = i0 + CHUNK < j->n ? i0 + CHUNK : j->n;
    const uint8_t *restrict a = j->a, *restrict b = j->b, *restrict table = j->table;
    uint8_t *restrict out = j->out;
    for (Py_ssize_t i = i0; i < i1; i++)
        out[i] = table[(size_t)a[i] << 8 | b[i]];
}

PyDoc_STRVAR(pair_lookup_doc,
"pair_lookup(a, b, table, out, threads)\n\n"
"out[i] = table[a[i] << 8 | b[i]] over the raw bytes of the 8-bit arrays a and b (n\n"
"values each, int8 or uint8) into the 8-bit out (n values); table holds 65536 bytes.\n"
"One pass where numpy takes three (the index, its second byte, the gather); runs on up\n"
"to threads threads, without the GIL.");

static PyObject *pair_lookup(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo, *to, *oo;
    int threads, sa, sb, st, so;
    if (!PyArg_ParseTuple(args, "OOOOi:pair_lookup", &ao, &bo, &to, &oo, &threads))
        return NULL;
    if (nb_int8_kind(ao, &sa, "pair_lookup: a") < 0 || nb_int8_kind(bo, &sb, "pair_lookup: b") < 0 ||
        nb_int8_kind(to, &st, "pair_lookup: table") < 0 || nb_int8_kind(oo, &so, "pair_lookup: out") < 0)
        return NULL;
    nbuf a, b, t, o;
    a.held = b.held = t.held = o.held = 0;
    if (nb_get(ao, &a, sa ? 'i' : 'u', 1, 0, 0, 0, "pair_lookup: a") < 0)
        goto done;
    const Py_ssize_t n = a.view.len;
    if (nb_get(bo, &b, sb ? 'i' : 'u', 1, n, 0, 0, "pair_lookup: b") < 0 ||
        nb_get(to, &t, st ? 'i' : 'u', 1, 65536, 0, 0, "pair_lookup: table") < 0 ||
        nb_get(oo, &o, so ? 'i' : 'u', 1, n, 1, 0, "pair_lookup: out") < 0)
        goto done;
    if (b.view.len != n || o.view.len != n) {
        PyErr_Format(PyExc_ValueError, "pair_lookup: a holds %zd values, b %zd and out %zd", n, b.view.len,
                     o.view.len);
        goto done;
    }
    pair_job j = {a.view.buf, b.view.buf, t.view.buf, o.view.buf, n};
    if (n) {
        Py_BEGIN_ALLOW_THREADS
        pool_run(pair_task, &j, (n + CHUNK - 1) / CHUNK, threads);
        Py_END_ALLOW_THREADS
    }
done:
    nb_release(&a);
    nb_release(&b);
    nb_release(&t);
    nb_release(&o);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- Hard activations (HardSigmoid, HardSwish and their Add/Clip/Mul/Div spellings) --- */

/* Modes of ``hard``: multiply by x (a HardSwish, a HardSigmoid otherwise), divide by the
 * factor (else multiply), apply the factor before the multiplication by x (else after). */
enum { HARD_GATE = 1, HARD_DIV = 2, HARD_FACTOR_FIRST = 4 };

typedef struct {
    const float *x;
    float *y;
    Py_ssize_t n;
    float scale, shift, lo, hi, factor;
    int mode;
} hard_job;

/* Each step rounded on its own, in the order the numpy path (and the spelled graph)
 * takes them: a fused multiply-add of x * scale + shift would round once, not twice,
 * and differ in the last bit, so contraction is off here. A comparison select clips,
 * as the Clip kernel does: NaN passes through. x * 1 and x / 1 are exact, so a factor
 * of 1 changes nothing. */
#define HARD_LOOP(GATED, DIVIDE, FIRST)                                                                         \
    for (Py_ssize_t i = 0; i < n; i++) {                                                                      \
        const float v = x[i];                                                                                 \
        float t = v * scale;                                                                                  \
        t = t + shift;                                                                                        \
        t = t < lo ? lo : t;                                                                                  \
        t = t > hi ? hi : t;                                                                                  \
        if (FIRST)                                                                                            \
            t = DIVIDE ? t / factor : t * factor;                                                             \
        if (GATED)                                                                                            \
            t = v * t;                                                                                        \
        if (!(FIRST))                                                                                         \
            t = DIVIDE ? t / factor : t * factor;                                                             \
        y[i] = t;                                                                                             \
    }

/* y may be x. */
NATIVE_CLONES __attribute__((optimize("fp-contract=off"))) static void
hard_f32(const float *x, float *y, Py_ssize_t n, float scale, float shift, float lo, float hi, float factor, int mode)
{
    switch (mode & 7) {
    case 0: HARD_LOOP(0, 0, 0) break;
    case HARD_GATE: HARD_LOOP(1, 0, 0) break;
    case HARD_DIV: HARD_LOOP(0, 1, 0) break;
    case HARD_GATE | HARD_DIV: HARD_LOOP(1, 1, 0) break;
    case HARD_FACTOR_FIRST: HARD_LOOP(0, 0, 1) break;
    case HARD_FACTOR_FIRST | HARD_GATE: HARD_LOOP(1, 0, 1) break;
    case HARD_FACTOR_FIRST | HARD_DIV: HARD_LOOP(0, 1, 1) break;
    default: HARD_LOOP(1, 1, 1) break;
    }
}

static void hard_task(void *arg, Py_ssize_t t)
{
    const hard_job *j = arg;
    const Py_ssize_t i0 = t * CHUNK, i1 = i0 + CHUNK < j->n ? i0 + CHUNK : j->n;
    hard_f32(j->x + i0, j->y + i0, i1 - i0, j->scale, j->shift, j->lo, j->hi, j->factor, j->mode);
}

PyDoc_STRVAR(hard_doc,
"hard(x, y, mode, scale, shift, lo, hi, factor, threads)\n\n"
"y = clip(x * scale + shift, lo, hi) over float32 arrays of one size, each step\n"
"rounded to float32 on its own (no fused multiply-add); then, by the bits of mode,\n"
"multiplied by x (1: HardSwish, else HardSigmoid) and multiplied by factor, or divided\n"
"by it (2), after the multiplication by x or before it (4). y may be x. Runs on up to\n"
"threads threads, without the GIL.");

static PyObject *hard(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    int mode, threads;
    double scale, shift, lo, hi, factor;
    if (!PyArg_ParseTuple(args, "OOidddddi:hard", &xo, &yo, &mode, &scale, &shift, &lo, &hi, &factor, &threads))
        return NULL;
    if (mode < 0 || mode > 7) {
        PyErr_Format(PyExc_ValueError, "hard: unknown mode %d", mode);
        return NULL;
    }
    nbuf x, y;
    x.held = y.held = 0;
    if (nb_get(xo, &x, 'f', 4, 0, 0, 0, "hard: x") < 0)
        return NULL;
    hard_job j = {x.view.buf, NULL, x.view.len / 4, (float)scale, (float)shift, (float)lo, (float)hi,
                  (float)factor, mode};
    if (nb_get(yo, &y, 'f', 4, j.n, 1, 0, "hard: y") < 0) {
        nb_release(&x);
        return NULL;
    }
    j.y = y.view.buf;
    if (j.n) {
        Py_BEGIN_ALLOW_THREADS
        pool_run(hard_task, &j, (j.n + CHUNK - 1) / CHUNK, threads);
        Py_END_ALLOW_THREADS
    }
    nb_release(&x);
    nb_release(&y);
    Py_RETURN_NONE;
}

/* ---- Binary arithmetic on large float32 arrays: two of one size, or one and a value
 * per plane of it (a squeeze-and-excitation block's channel scale, [N, C, H, W] *
 * [N, C, 1, 1]; a per-channel bias) ------------------------------------------------- */

enum { BIN_ADD = 0, BIN_SUB = 1, BIN_MUL = 2, BIN_DIV = 3 };

typedef struct {
    const float *a, *b;
    float *y;
    Py_ssize_t n, planes, inner; /* inner 0: b is a's size */
    int op, b_first;
} binary_job;

/* y may be a or b: no restrict. One IEEE operation per element, numpy's values. */
#define BIN_LOOP(EXPR)                                                                                        \
    for (Py_ssize_t i = 0; i < n; i++)                                                                        \
        y[i] = EXPR;

NATIVE_CLONES static void binary_run_f32(const float *a, const float *b, float *y, Py_ssize_t n, int op)
{
    switch (op) {
    case BIN_ADD: BIN_LOOP(a[i] + b[i]) break;
    case BIN_SUB: BIN_LOOP(a[i] - b[i]) break;
    case BIN_MUL: BIN_LOOP(a[i] * b[i]) break;
    default: BIN_LOOP(a[i] / b[i]) break;
    }
}

NATIVE_CLONES static void binary_value_f32(const float *a, float s, float *y, Py_ssize_t n, int op, int s_first)
{
    switch (op * 2 + (s_first != 0)) {
    case BIN_ADD * 2: BIN_LOOP(a[i] + s) break;
    case BIN_ADD * 2 + 1: BIN_LOOP(s + a[i]) break;
    case BIN_SUB * 2: BIN_LOOP(a[i] - s) break;
    case BIN_SUB * 2 + 1: BIN_LOOP(s - a[i]) break;
    case BIN_MUL * 2: BIN_LOOP(a[i] * s) break;
    case BIN_MUL * 2 + 1: BIN_LOOP(s * a[i]) break;
    case BIN_DIV * 2: BIN_LOOP(a[i] / s) break;
    default: BIN_LOOP(s / a[i]) break;
    }
}

/* Chunks of about CHUNK elements: whole planes where planes are small, pieces of one
 * where they are large (as channel_affine splits them). */
static void binary_task(void *arg, Py_ssize_t t)
{
    const binary_job *j = arg;
    if (!j->inner) {
        const Py_ssize_t i0 = t * CHUNK, i1 = i0 + CHUNK < j->n ? i0 + CHUNK : j->n;
        binary_run_f32(j->a + i0, j->b + i0, j->y + i0, i1 - i0, j->op);
        return;
    }
    const Py_ssize_t per = j->inner >= CHUNK ? 1 : CHUNK / j->inner;
    const Py_ssize_t parts = j->inner >= CHUNK ? (j->inner + CHUNK - 1) / CHUNK : 1;
    const Py_ssize_t p0 = (t / parts) * per, p1 = p0 + per < j->planes ? p0 + per : j->planes;
    const Py_ssize_t e0 = parts > 1 ? (t % parts) * CHUNK : 0;
    const Py_ssize_t e1 = parts > 1 ? (e0 + CHUNK < j->inner ? e0 + CHUNK : j->inner) : j->inner;
    for (Py_ssize_t p = p0; p < p1; p++)
        binary_value_f32(j->a + p * j->inner + e0, j->b[p], j->y + p * j->inner + e0, e1 - e0, j->op, j->b_first);
}

PyDoc_STRVAR(binary_doc,
"binary(a, b, y, op, inner, b_first, threads)\n\n"
"y = a op b over float32 arrays, op 0 add, 1 subtract, 2 multiply, 3 divide. inner 0:\n"
"b is a's size. inner > 0: a is viewed as [planes, inner] and b holds one value per\n"
"plane, b op a where b_first. y (a's size) may be a or b. One IEEE operation per\n"
"element: numpy's values. Runs on up to threads threads, without the GIL.");

static PyObject *binary(PyObject *self, PyObject *args)
{
    PyObject *ao, *bo, *yo;
    Py_ssize_t inner;
    int op, b_first, threads;
    if (!PyArg_ParseTuple(args, "OOOinpi:binary", &ao, &bo, &yo, &op, &inner, &b_first, &threads))
        return NULL;
    if (op < BIN_ADD || op > BIN_DIV || inner < 0) {
        PyErr_Format(PyExc_ValueError, "binary: unknown op %d or negative inner %zd", op, inner);
        return NULL;
    }
    nbuf a, b, y;
    a.held = b.held = y.held = 0;
    binary_job j = {NULL, NULL, NULL, 0, 0, inner, op, b_first};
    if (nb_get(ao, &a, 'f', 4, 0, 0, 0, "binary: a") < 0)
        goto done;
    j.n = a.view.len / 4;
    if (inner && j.n % inner) {
        PyErr_Format(PyExc_ValueError, "binary: a holds %zd elements, not planes of %zd", j.n, inner);
        goto done;
    }
    j.planes = inner ? j.n / inner : 0;
    if (nb_get(bo, &b, 'f', 4, inner ? j.planes : j.n, 0, 0, "binary: b") < 0 ||
        nb_get(yo, &y, 'f', 4, j.n, 1, 0, "binary: y") < 0)
        goto done;
    j.a = a.view.buf;
    j.b = b.view.buf;
    j.y = y.view.buf;
    if (j.n) {
        const Py_ssize_t tasks = !inner ? (j.n + CHUNK - 1) / CHUNK
                                 : inner >= CHUNK ? j.planes * ((inner + CHUNK - 1) / CHUNK)
                                                  : (j.planes + CHUNK / inner - 1) / (CHUNK / inner);
        Py_BEGIN_ALLOW_THREADS
        pool_run(binary_task, &j, tasks, threads);
        Py_END_ALLOW_THREADS
    }
done:
    nb_release(&a);
    nb_release(&b);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef elementwise_methods[] = {
    {"hard", hard, METH_VARARGS, hard_doc},
    {"binary", binary, METH_VARARGS, binary_doc},
    {"row_norm", row_norm, METH_VARARGS, row_norm_doc},
    {"pair_lookup", pair_lookup, METH_VARARGS, pair_lookup_doc},
    {"int8_blocks", int8_blocks, METH_VARARGS, int8_blocks_doc},
    {"unary", unary, METH_VARARGS, unary_doc},
    {"channel_affine", channel_affine, METH_VARARGS, channel_affine_doc},
    {NULL, NULL, 0, NULL},
};
