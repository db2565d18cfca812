/* Direct convolution for layers with a short reduction (input channels times taps
 * at most 32: the first layers of audio and image networks, 1 or 3 input channels
 * into 16 to 128 outputs), where im2col makes a product of K = 9 or 27 rows that
 * is all overhead, and gathers columns as large as the output.
 *
 * A task is a band of output rows of one image. Its input rows (every channel's,
 * the padding included) are copied once into a small buffer, each row split into
 * its column phases for a stride along the row, so every tap of a band reads one
 * contiguous run. Each output row is then computed eight output channels by two
 * vectors of positions at a time (sixteen accumulators that start at the bias),
 * every input vector loaded serving eight channels, and written straight into the
 * output with the residual and the activation applied: one pass over the output,
 * nothing gathered and nothing cropped. */
#include "native.h"

#include <stdlib.h>

typedef float nvec __attribute__((vector_size(64), aligned(4)));
typedef int32_t nmask __attribute__((vector_size(64)));
#define NLANES 16
#define NMB 8 /* output channels a block */

/* The fused activations: epilogue.h's (ACT_NONE .. ACT_LAST, parameters p0 and p1 as
 * its lo and hi), the piecewise-linear ones on whole vectors, Sigmoid and SiLU lane
 * by lane through its activate_f32. */
#define T float
#define SFX(name) name##_f32
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* only activate_f32 is used here */
#include "epilogue.h"
#pragma GCC diagnostic pop
#undef T
#undef SFX

/* Longest reduction (input channels times taps) the kernel takes. */
#define NARROW_MAX_K 64

typedef struct {
    window_geometry g;
    Py_ssize_t m, k, mblocks;
    const float *x, *z;
    float *y;
    const float *w;    /* [mblocks][k][NMB], channels past m zero */
    const float *bias; /* [mblocks * NMB] */
    Py_ssize_t toff[NARROW_MAX_K];
    Py_ssize_t rows, bands, band_rows, pq, rowlen;
    int act, failed;
    float p0, p1;
} narrow_job;

static inline __attribute__((always_inline)) nvec nblend(nmask m, nvec a, nvec b)
{
    return (nvec)(((nmask)a & m) | ((nmask)b & ~m));
}

/* A piecewise-linear activation on one vector (not Sigmoid or SiLU); NaN stays NaN,
 * as in numpy's versions and epilogue.h's. */
static inline __attribute__((always_inline)) nvec nactivate(nvec v, int act, float p0, float p1)
{
    const nvec zero = {0};
    if (act == ACT_RELU)
        return nblend(v < zero, zero, v);
    if (act == ACT_CLIP) {
        const nvec lo = zero + p0, hi = zero + p1;
        v = nblend(v < lo, lo, v);
        return nblend(v > hi, hi, v);
    }
    if (act == ACT_LEAKY)
        return nblend(v >= zero, v, v * p0);
    if (act == ACT_HARD_SIGMOID || act == ACT_HARD_SWISH) {
        const nvec one = zero + 1.0f;
        nvec s = v * p0 + p1;
        s = nblend(s < zero, zero, s);
        s = nblend(s > one, one, s);
        return act == ACT_HARD_SWISH ? v * s : s;
    }
    if (act == ACT_HARD_SWISH_DIV) {
        const nvec hi = zero + p1;
        nvec s = v + p0;
        s = nblend(s < zero, zero, s);
        s = nblend(s > hi, hi, s);
        return v * s / hi;
    }
    return v;
}

/* Whether ``act`` is applied lane by lane (through exp) rather than on vectors. */
#define LANEWISE(act) ((act) == ACT_SIGMOID || (act) == ACT_SWISH)

/* One finished vector into ``dst`` (``count`` <= NLANES values), the residual
 * ``z`` (or NULL) added before the activation. */
static inline __attribute__((always_inline)) void nstore(float *dst, const float *z, nvec v, Py_ssize_t count, int act, float p0, float p1)
{
    if (count == NLANES && !LANEWISE(act)) {
        if (z)
            v += *(const nvec *)z;
        *(nvec *)dst = nactivate(v, act, p0, p1);
        return;
    }
    float tmp[NLANES];
    *(nvec *)tmp = v;
    if (z)
        for (Py_ssize_t i = 0; i < count; i++)
            tmp[i] += z[i];
    if (LANEWISE(act)) {
        for (Py_ssize_t i = 0; i < NLANES; i++)
            tmp[i] = activate_f32(tmp[i], act, p0, p1);
    } else {
        *(nvec *)tmp = nactivate(*(nvec *)tmp, act, p0, p1);
    }
    for (Py_ssize_t i = 0; i < count; i++)
        dst[i] = tmp[i];
}

/* Output row ``oy`` of image ``image``, the output channels of block ``mb``, from
 * ``base``: the band buffer at the row's first tap row. */
NATIVE_CLONES static void narrow_row(const narrow_job *job, const float *base, Py_ssize_t image, Py_ssize_t oy,
                                     Py_ssize_t mb)
{
    const Py_ssize_t k = job->k, ow = job->g.ow, plane = job->g.oh * ow, m = job->m;
    const int act = job->act;
    const float p0 = job->p0, p1 = job->p1;
    {
        const float *wb = job->w + mb * k * NMB;
        const float *bb = job->bias + mb * NMB;
        const Py_ssize_t valid = m - mb * NMB < NMB ? m - mb * NMB : NMB;
        const Py_ssize_t at = (image * m + mb * NMB) * plane + oy * ow;
        float *yb = job->y + at;
        const float *zb = job->z ? job->z + at : NULL;
        Py_ssize_t x0 = 0;
        for (; x0 + 2 * NLANES <= ow; x0 += 2 * NLANES) {
            nvec a[NMB][2];
            for (int j = 0; j < NMB; j++)
                a[j][0] = a[j][1] = (nvec){0} + bb[j];
            for (Py_ssize_t t = 0; t < k; t++) {
                const nvec *s = (const nvec *)(base + job->toff[t] + x0);
                const nvec s0 = s[0], s1 = s[1];
                const float *wt = wb + t * NMB;
                for (int j = 0; j < NMB; j++) {
                    a[j][0] += wt[j] * s0;
                    a[j][1] += wt[j] * s1;
                }
            }
            for (int j = 0; j < valid; j++) {
                float *d = yb + j * plane + x0;
                const float *z = zb ? zb + j * plane + x0 : NULL;
                nstore(d, z, a[j][0], NLANES, act, p0, p1);
                nstore(d + NLANES, z ? z + NLANES : NULL, a[j][1], NLANES, act, p0, p1);
            }
        }
        for (; x0 < ow; x0 += NLANES) {
            nvec a[NMB];
            for (int j = 0; j < NMB; j++)
                a[j] = (nvec){0} + bb[j];
            for (Py_ssize_t t = 0; t < k; t++) {
                const nvec s0 = *(const nvec *)(base + job->toff[t] + x0);
                const float *wt = wb + t * NMB;
                for (int j = 0; j < NMB; j++)
                    a[j] += wt[j] * s0;
            }
            const Py_ssize_t count = ow - x0 < NLANES ? ow - x0 : NLANES;
            for (int j = 0; j < valid; j++)
                nstore(yb + j * plane + x0, zb ? zb + j * plane + x0 : NULL, a[j], count, act, p0, p1);
        }
    }
}

/* The band's input rows, every channel, into ``buf``: padded row R of the band
 * (input row r0 * sh - pt + R) at ``(c * band_rows + R) * rowlen``, its column P
 * (input column P - pl) at phase P % sw, position P / sw; the padding zero. */
NATIVE_CLONES static void narrow_fill(const narrow_job *job, float *buf, Py_ssize_t image, Py_ssize_t r0)
{
    const window_geometry *g = &job->g;
    const Py_ssize_t sw = g->sw, pq = job->pq, rowlen = job->rowlen;
    for (Py_ssize_t c = 0; c < g->c; c++) {
        const float *src = job->x + (image * g->c + c) * g->h * g->w;
        for (Py_ssize_t r = 0; r < job->band_rows; r++) {
            float *d = buf + (c * job->band_rows + r) * rowlen;
            const Py_ssize_t iy = r0 * g->sh - g->pt + r;
            memset(d, 0, (size_t)rowlen * sizeof(float));
            if (iy < 0 || iy >= g->h)
                continue;
            const float *row = src + iy * g->w;
            /* input columns whose padded position lies inside the phases */
            Py_ssize_t cols = g->w;
            if (g->pl + cols > sw * pq)
                cols = sw * pq - g->pl;
            if (sw == 1) {
                for (Py_ssize_t i = 0; i < cols; i++)
                    d[g->pl + i] = row[i];
                continue;
            }
            if (sw == 2) {
                /* both column phases in one pass, a loop GCC vectorizes with permutes
                 * (as phases.h does) */
                const Py_ssize_t pl = g->pl, pairs = cols / 2;
                float *restrict de = d + (pl & 1) * pq + pl / 2;
                float *restrict dd = d + (1 - (pl & 1)) * pq + pl / 2 + (pl & 1);
                for (Py_ssize_t j = 0; j < pairs; j++) {
                    de[j] = row[2 * j];
                    dd[j] = row[2 * j + 1];
                }
                if (cols & 1)
                    de[pairs] = row[2 * pairs];
                continue;
            }
            /* phase px holds padded columns px, px + sw, ...: input columns from the
             * first of them at or past pl, every sw-th */
            for (Py_ssize_t px = 0; px < sw; px++) {
                const Py_ssize_t p0 = g->pl + ((px - g->pl) % sw + sw) % sw;
                float *restrict dp = d + px * pq + p0 / sw;
                const float *restrict sp = row + (p0 - g->pl);
                for (Py_ssize_t j = 0, cnt = p0 < g->pl + cols ? (g->pl + cols - p0 + sw - 1) / sw : 0; j < cnt; j++)
                    dp[j] = sp[j * sw];
            }
        }
    }
}

static void narrow_task(void *arg, Py_ssize_t t)
{
    narrow_job *job = arg;
    const window_geometry *g = &job->g;
    const Py_ssize_t image = t / job->bands, r0 = (t % job->bands) * job->rows;
    const Py_ssize_t r1 = r0 + job->rows < g->oh ? r0 + job->rows : g->oh;
    float *buf = scratch(0, (size_t)(g->c * job->band_rows * job->rowlen + NLANES) * sizeof(float));
    if (!buf) {
        job->failed = 1;
        return;
    }
    narrow_fill(job, buf, image, r0);
    /* a block of channels at a time down the band: eight output streams, each one
     * contiguous run of the band's rows, where all channels row by row wrote to as
     * many places as there are output channels */
    for (Py_ssize_t mb = 0; mb < job->mblocks; mb++)
        for (Py_ssize_t oy = r0; oy < r1; oy++)
            narrow_row(job, buf + (oy - r0) * g->sh * job->rowlen, image, oy, mb);
}

PyDoc_STRVAR(narrow_conv2d_doc,
"narrow_conv2d(x, w, b, z, y, geometry, act, p0, p1, threads)\n\n"
"Direct convolution of x [N, C, H, W] (float32, group 1) with w [M, C * kh * kw]\n"
"(C * kh * kw at most 64), plus the bias b [M] and the residual z (y's shape), each\n"
"or None, then the activation act with its parameters p0 and p1, numbered as the\n"
"other kernels' (0 none, 1 Relu, 2 Clip to [p0, p1], 3 LeakyRelu of slope p0, 4\n"
"HardSigmoid clip(p0 v + p1, 0, 1), 5 HardSwish v times that, 6 HardSwish as\n"
"v clip(v + p0, 0, p1) / p1, 7 Sigmoid, 8 v sigmoid(p0 v)); into y [N, M, OH, OW].\n"
"geometry is a ConvGeometry of groups 1, pads at least 0, zero padding.\n"
"Runs on up to threads threads, without the GIL.");

static PyObject *narrow_conv2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *zo, *yo, *go;
    int act, threads;
    double p0, p1;
    conv_geometry cg;
    if (!PyArg_ParseTuple(args, "OOOOOOiddi:narrow_conv2d", &xo, &wo, &bo, &zo, &yo, &go, &act, &p0, &p1,
                          &threads) ||
        conv_geometry_get(go, &cg, "narrow_conv2d") < 0)
        return NULL;
    if (cg.groups != 1 || cg.n < 0 || cg.c < 1 || cg.h < 1 || cg.w < 1 || cg.m < 1 || cg.kh < 1 || cg.kw < 1 ||
        cg.sh < 1 || cg.sw < 1 || cg.dh < 1 || cg.dw < 1 || cg.pt < 0 || cg.pl < 0 || cg.oh < 1 || cg.ow < 1) {
        PyErr_SetString(PyExc_ValueError, "narrow_conv2d: invalid geometry (groups 1, positive sizes, pads >= 0)");
        return NULL;
    }
    const Py_ssize_t k = cg.c * cg.kh * cg.kw;
    if (k > NARROW_MAX_K) {
        PyErr_Format(PyExc_ValueError, "narrow_conv2d: a reduction of %zd (input channels times taps) passes %d", k,
                     NARROW_MAX_K);
        return NULL;
    }
    if (act < ACT_NONE || act > ACT_LAST) {
        PyErr_SetString(PyExc_ValueError, "narrow_conv2d: invalid activation");
        return NULL;
    }
    narrow_job *job = calloc(1, sizeof(narrow_job));
    if (!job)
        return PyErr_NoMemory();
    job->g = (window_geometry){cg.n, cg.c, cg.h, cg.w, cg.kh, cg.kw, cg.sh, cg.sw, cg.dh, cg.dw, cg.pt, cg.pl, cg.oh,
                               cg.ow};
    job->m = cg.m;
    job->k = k;
    job->act = act;
    job->p0 = (float)p0;
    job->p1 = (float)p1;
    const Py_ssize_t out = cg.n * cg.m * cg.oh * cg.ow;
    nbuf x, w, b, z, y;
    x.held = w.held = b.held = z.held = y.held = 0;
    float *packed = NULL;
    if (nb_get(xo, &x, 'f', 4, cg.n * cg.c * cg.h * cg.w, 0, 0, "narrow_conv2d: x") < 0 ||
        nb_get(wo, &w, 'f', 4, cg.m * k, 0, 0, "narrow_conv2d: w") < 0 ||
        nb_get(bo, &b, 'f', 4, cg.m, 0, 1, "narrow_conv2d: b") < 0 ||
        nb_get(zo, &z, 'f', 4, out, 0, 1, "narrow_conv2d: z") < 0 ||
        nb_get(yo, &y, 'f', 4, out, 1, 0, "narrow_conv2d: y") < 0)
        goto done;
    if (cg.n == 0)
        goto done;
    job->mblocks = (cg.m + NMB - 1) / NMB;
    packed = calloc((size_t)(job->mblocks * NMB * (k + 1)), sizeof(float));
    if (!packed) {
        PyErr_NoMemory();
        goto done;
    }
    /* the weight as [block][tap][channel of the block]: one tap's eight weights adjacent */
    const float *wsrc = w.view.buf;
    for (Py_ssize_t oc = 0; oc < cg.m; oc++)
        for (Py_ssize_t t = 0; t < k; t++)
            packed[((oc / NMB) * k + t) * NMB + oc % NMB] = wsrc[oc * k + t];
    float *bias = packed + job->mblocks * NMB * k;
    if (b.held)
        memcpy(bias, b.view.buf, (size_t)cg.m * sizeof(float));
    job->w = packed;
    job->bias = bias;
    job->x = x.view.buf;
    job->z = z.held ? z.view.buf : NULL;
    job->y = y.view.buf;
    /* each phase row holds the padded columns the taps reach, and the whole vectors
     * past the last output a pass reads */
    const Py_ssize_t wn = (cg.ow - 1) * cg.sw + (cg.kw - 1) * cg.dw + 1;
    const Py_ssize_t reach = (cg.kw - 1) * cg.dw / cg.sw;
    Py_ssize_t pq = (wn + cg.sw - 1) / cg.sw, need = (cg.ow + NLANES - 1) / NLANES * NLANES + reach;
    job->pq = pq > need ? pq : need;
    job->rowlen = cg.sw * job->pq;
    for (Py_ssize_t c = 0, t = 0; c < cg.c; c++)
        for (Py_ssize_t ky = 0; ky < cg.kh; ky++)
            for (Py_ssize_t kx = 0; kx < cg.kw; kx++, t++) {
                const Py_ssize_t rx = kx * cg.dw;
                job->toff[t] = ky * cg.dh * job->rowlen + (rx % cg.sw) * job->pq + rx / cg.sw;
            }
    /* bands of about 8k outputs a channel, and at least two a thread where the map allows */
    job->rows = 8192 / cg.ow;
    if (job->rows < 1)
        job->rows = 1;
    if (threads > 1 && cg.n * ((cg.oh + job->rows - 1) / job->rows) < 2 * threads) {
        Py_ssize_t per = (2 * threads + cg.n - 1) / cg.n;
        job->rows = (cg.oh + per - 1) / per;
        if (job->rows < 1)
            job->rows = 1;
    }
    job->bands = (cg.oh + job->rows - 1) / job->rows;
    job->band_rows = (job->rows - 1) * cg.sh + (cg.kh - 1) * cg.dh + 1;
    for (Py_ssize_t c = 0; c < cg.c; c++) {
        /* the channel's taps read its own rows of the band */
        for (Py_ssize_t t = 0; t < cg.kh * cg.kw; t++)
            job->toff[c * cg.kh * cg.kw + t] += c * job->band_rows * job->rowlen;
    }
    if ((double)cg.c * (double)job->band_rows * (double)job->rowlen * 4.0 > 64.0 * 1024 * 1024) {
        PyErr_SetString(PyExc_MemoryError, "narrow_conv2d: a band's input rows pass 64 MiB");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    pool_run(narrow_task, job, cg.n * job->bands, threads);
    Py_END_ALLOW_THREADS
    if (job->failed)
        PyErr_NoMemory();
done:
    free(packed);
    free(job);
    nb_release(&x);
    nb_release(&w);
    nb_release(&b);
    nb_release(&z);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef narrow_conv_methods[] = {
    {"narrow_conv2d", narrow_conv2d, METH_VARARGS, narrow_conv2d_doc},
    {NULL, NULL, 0, NULL},
};
