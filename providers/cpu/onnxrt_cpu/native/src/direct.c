/* Direct convolution for layers with few output channels or a short reduction (the
 * stems of CNNs: 3 input channels, 8 to 64 outputs), where im2col and a BLAS product
 * of [M, C * taps] x [C * taps, positions] run far below peak (a product of 8 rows
 * reached 15 GMAC/s where wide ones reach 45).
 *
 * Every input plane of an image is written into the stride phases of its padded map
 * (phases.h), so each tap of each input channel reads one contiguous run; the output
 * is computed on the phases' row pitch, four output channels by four vectors of
 * positions at a time (sixteen accumulators in registers: each input vector loaded
 * serves four channels), then cropped to the output width with the bias, the
 * residual and Relu/Clip. Tasks are bands of output rows of one image. */
#include "native.h"

#define T float
#define SFX(name) name##_f32
#include "epilogue.h"
#include "phases.h"
#undef T
#undef SFX
#include "requant.h"

typedef float dvec __attribute__((vector_size(64), aligned(4)));
#define DLANES 16
#define DBLOCK (4 * DLANES)

typedef struct {
    const window_geometry *g;
    Py_ssize_t m, mpad;
    const void *x;              /* float32, or 8-bit for QLinearConv */
    const float *w, *b, *z;     /* w: [mpad, C * taps], rows past m zero */
    void *y;                    /* float32, or 8-bit for QLinearConv */
    float *phases;              /* every input channel's, of the current image */
    const Py_ssize_t *offs;
    phase_layout l;
    Py_ssize_t image, rows, cblock;
    int act, failed;
    float lo, hi;
    /* QLinearConv: x and y 8-bit, x centred on xzp as it is written into the phases
     * (exact in float32, as the caller checked), rows requantized with mult */
    int quant, x_signed, y_signed;
    float xzp, yzp;
    const float *mult;
    Py_ssize_t mult_n;
} direct_job;

/* Output channels m0 .. m0 + 3, positions p0 <= p < p1 on the pitch (p1 - p0 a
 * multiple of DBLOCK, reading at most PHASE_SLACK past the phases' spans). */
NATIVE_CLONES static void direct_block(const direct_job *job, Py_ssize_t m0, Py_ssize_t p0, Py_ssize_t p1,
                                       float *restrict out, Py_ssize_t ld)
{
    const window_geometry *g = job->g;
    const Py_ssize_t taps = g->kh * g->kw, nph = g->sh * g->sw, k = g->c * taps;
    const float *w0 = job->w + m0 * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
    for (Py_ssize_t p = p0; p < p1; p += DBLOCK) {
        const dvec zero = {0};
        dvec a[4][4];
        for (int j = 0; j < 4; j++)
            for (int v = 0; v < 4; v++)
                a[j][v] = zero;
        for (Py_ssize_t c = 0; c < g->c; c++) {
            const float *base = job->phases + c * nph * job->l.plane + p;
            for (Py_ssize_t t = 0; t < taps; t++) {
                const dvec *s = (const dvec *)(base + job->offs[t]);
                const dvec s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
                const Py_ssize_t at = c * taps + t;
                const float k0 = w0[at], k1 = w1[at], k2 = w2[at], k3 = w3[at];
                a[0][0] += k0 * s0, a[0][1] += k0 * s1, a[0][2] += k0 * s2, a[0][3] += k0 * s3;
                a[1][0] += k1 * s0, a[1][1] += k1 * s1, a[1][2] += k1 * s2, a[1][3] += k1 * s3;
                a[2][0] += k2 * s0, a[2][1] += k2 * s1, a[2][2] += k2 * s2, a[2][3] += k2 * s3;
                a[3][0] += k3 * s0, a[3][1] += k3 * s1, a[3][2] += k3 * s2, a[3][3] += k3 * s3;
            }
        }
        for (int j = 0; j < 4; j++) {
            dvec *o = (dvec *)(out + j * ld + (p - p0));
            o[0] = a[j][0], o[1] = a[j][1], o[2] = a[j][2], o[3] = a[j][3];
        }
    }
}

/* A block of input channels of the current image written into their phases. */
static void direct_fill_task(void *arg, Py_ssize_t t)
{
    direct_job *job = arg;
    const window_geometry *g = job->g;
    Py_ssize_t c0 = t * job->cblock, c1 = c0 + job->cblock < g->c ? c0 + job->cblock : g->c;
    const Py_ssize_t nph = g->sh * g->sw;
    for (Py_ssize_t c = c0; c < c1; c++) {
        float *ph = job->phases + c * nph * job->l.plane;
        if (!job->quant) {
            phase_fill_f32(g, &job->l, (const float *)job->x + (job->image * g->c + c) * g->h * g->w, ph);
            continue;
        }
        /* the 8-bit plane centred on its zero point into the phases: its padding,
         * the zero point itself, is then 0 as the zeroed phases hold it */
        const size_t at = (size_t)((job->image * g->c + c) * g->h * g->w);
        for (Py_ssize_t r = 0; r < job->l.hn; r++) {
            Py_ssize_t iy = r - g->pt;
            if (iy < 0 || iy >= g->h)
                continue;
            float *base = ph + (r % g->sh) * g->sw * job->l.plane + (r / g->sh) * job->l.pq;
            for (Py_ssize_t col = g->pl; col < g->pl + g->w && col < job->l.wn; col++) {
                Py_ssize_t ix = col - g->pl;
                float v = job->x_signed ? (float)((const int8_t *)job->x)[at + iy * g->w + ix]
                                        : (float)((const uint8_t *)job->x)[at + iy * g->w + ix];
                base[(col % g->sw) * job->l.plane + col / g->sw] = v - job->xzp;
            }
        }
    }
}

/* A band of output rows of the current image, every output channel. */
static void direct_rows_task(void *arg, Py_ssize_t t)
{
    direct_job *job = arg;
    const window_geometry *g = job->g;
    Py_ssize_t r0 = t * job->rows, r1 = r0 + job->rows < g->oh ? r0 + job->rows : g->oh;
    Py_ssize_t p0 = r0 * job->l.pq, p1 = r1 * job->l.pq;
    Py_ssize_t ld = (p1 - p0 + DBLOCK - 1) / DBLOCK * DBLOCK;
    float *out = scratch(0, (size_t)(4 * ld) * sizeof(float));
    if (!out) {
        job->failed = 1;
        return;
    }
    const Py_ssize_t plane_out = g->oh * g->ow;
    for (Py_ssize_t m0 = 0; m0 < job->m; m0 += 4) {
        direct_block(job, m0, p0, p0 + ld, out, ld);
        for (Py_ssize_t j = 0; j < 4 && m0 + j < job->m; j++) {
            Py_ssize_t oc = m0 + j;
            float bias = job->b ? job->b[oc] : 0.0f;
            for (Py_ssize_t r = r0; r < r1; r++) {
                Py_ssize_t at = (job->image * job->m + oc) * plane_out + r * g->ow;
                const float *row = out + j * ld + (r - r0) * job->l.pq;
                if (job->quant)
                    requantize_row(row, g->ow, bias, job->mult[job->mult_n > 1 ? oc : 0], job->yzp, job->y_signed,
                                   (char *)job->y + at);
                else
                    finish_row_f32((float *)job->y + at, row, g->ow, bias, job->z ? job->z + at : NULL, job->act,
                                   job->lo, job->hi);
            }
        }
    }
}

/* Plan and run ``job`` (geometry, buffers, weights set; ``wsrc`` the [m, C * taps]
 * weight) without the GIL: -1 with an exception where memory runs out or the input's
 * phases would pass the limit (the caller falls back to im2col, in bounded tiles). */
static int direct_execute(direct_job *job, const float *wsrc, int threads)
{
    const window_geometry *g = job->g;
    const Py_ssize_t taps = g->kh * g->kw, k = g->c * taps, nph = g->sh * g->sw;
    phase_layout_of(g, &job->l);
    double need = (double)g->c * (double)nph * (double)job->l.plane * 4.0;
    if (need > 256.0 * 1024 * 1024) {
        PyErr_Format(PyExc_MemoryError, "direct2d: %.0f bytes of input phases exceed the limit", need);
        return -1;
    }
    job->mpad = (job->m + 3) / 4 * 4;
    float *wpad = calloc((size_t)(job->mpad * k), sizeof(float));
    float *phases = malloc((size_t)(g->c * nph * job->l.plane + DBLOCK) * sizeof(float));
    Py_ssize_t *offs = malloc((size_t)taps * sizeof(Py_ssize_t));
    if (!wpad || !phases || !offs) {
        free(wpad);
        free(phases);
        free(offs);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(wpad, wsrc, (size_t)(job->m * k) * sizeof(float));
    for (Py_ssize_t ky = 0; ky < g->kh; ky++)
        for (Py_ssize_t kx = 0; kx < g->kw; kx++)
            offs[ky * g->kw + kx] = phase_offset(g, &job->l, ky, kx);
    job->w = wpad;
    job->phases = phases;
    job->offs = offs;
    /* bands of about 2048 positions, at least two a thread where the map allows */
    job->rows = 2048 / job->l.pq;
    if (job->rows < 1)
        job->rows = 1;
    if (threads > 1 && (g->oh + job->rows - 1) / job->rows < 2 * threads) {
        job->rows = (g->oh + 2 * threads - 1) / (2 * threads);
        if (job->rows < 1)
            job->rows = 1;
    }
    job->cblock = (g->c + 2 * threads - 1) / (2 * threads);
    Py_BEGIN_ALLOW_THREADS
    /* the padding, once: every plane writes the same inner parts of its phases */
    memset(phases, 0, (size_t)(g->c * nph * job->l.plane + DBLOCK) * sizeof(float));
    for (job->image = 0; job->image < g->n && !job->failed; job->image++) {
        pool_run(direct_fill_task, job, (g->c + job->cblock - 1) / job->cblock, threads);
        pool_run(direct_rows_task, job, (g->oh + job->rows - 1) / job->rows, threads);
    }
    Py_END_ALLOW_THREADS
    free(wpad);
    free(phases);
    free(offs);
    if (job->failed) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The window and output channels of a ConvGeometry ``go`` the direct kernels take
 * (group 1), or -1 with the error set naming ``who``. */
static int direct_geometry_get(PyObject *go, window_geometry *g, Py_ssize_t *m, const char *who)
{
    conv_geometry cg;
    if (conv_geometry_get(go, &cg, who) < 0)
        return -1;
    if (cg.groups != 1) {
        PyErr_Format(PyExc_ValueError, "%s: invalid geometry (groups %zd, the direct kernels take 1)", who, cg.groups);
        return -1;
    }
    *g = (window_geometry){cg.n, cg.c, cg.h, cg.w, cg.kh, cg.kw, cg.sh, cg.sw, cg.dh, cg.dw, cg.pt, cg.pl, cg.oh,
                           cg.ow};
    *m = cg.m;
    return 0;
}

static int direct_geometry_ok(const window_geometry *g, Py_ssize_t m, const char *who)
{
    if (g->n < 0 || g->c < 1 || g->h < 1 || g->w < 1 || m < 1 || g->kh < 1 || g->kw < 1 || g->sh < 1 ||
        g->sw < 1 || g->dh < 1 || g->dw < 1 || g->pt < 0 || g->pl < 0 || g->oh < 1 || g->ow < 1) {
        PyErr_Format(PyExc_ValueError, "%s: invalid geometry", who);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(direct2d_doc,
"direct2d(x, w, b, z, y, geometry, act, lo, hi, threads)\n\n"
"Direct convolution of x [N, C, H, W] (float32, group 1) with w [M, C * kh * kw], plus\n"
"the bias b [M] and the residual z (y's shape), each or None, then the activation act\n"
"(0 none, 1 Relu, 2 Clip to [lo, hi], 3-8 as conv2d's),\n"
"into y [N, M, OH, OW]. geometry is a\n"
"ConvGeometry of groups 1, pads at least 0, zero padding.\n"
"Runs on up to threads threads, without the GIL.");

static PyObject *direct2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *zo, *yo, *go;
    window_geometry g;
    Py_ssize_t m;
    int act, threads;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "OOOOOOiddi:direct2d", &xo, &wo, &bo, &zo, &yo, &go, &act, &lo, &hi, &threads) ||
        direct_geometry_get(go, &g, &m, "direct2d") < 0)
        return NULL;
    if (!direct_geometry_ok(&g, m, "direct2d"))
        return NULL;
    if (act < ACT_NONE || act > ACT_LAST) {
        PyErr_SetString(PyExc_ValueError, "direct2d: invalid activation");
        return NULL;
    }
    const Py_ssize_t k = g.c * g.kh * g.kw, out = g.n * m * g.oh * g.ow;
    nbuf x, w, b, z, y;
    x.held = w.held = b.held = z.held = y.held = 0;
    direct_job job;
    memset(&job, 0, sizeof(job));
    job.g = &g;
    job.m = m;
    job.act = act;
    job.lo = (float)lo;
    job.hi = (float)hi;
    if (nb_get(xo, &x, 'f', 4, g.n * g.c * g.h * g.w, 0, 0, "direct2d: x") < 0 ||
        nb_get(wo, &w, 'f', 4, m * k, 0, 0, "direct2d: w") < 0 ||
        nb_get(bo, &b, 'f', 4, m, 0, 1, "direct2d: b") < 0 ||
        nb_get(zo, &z, 'f', 4, out, 0, 1, "direct2d: z") < 0 ||
        nb_get(yo, &y, 'f', 4, out, 1, 0, "direct2d: y") < 0)
        goto done;
    job.x = x.view.buf;
    job.b = b.held ? b.view.buf : NULL;
    job.z = z.held ? z.view.buf : NULL;
    job.y = y.view.buf;
    direct_execute(&job, w.view.buf, threads);
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

PyDoc_STRVAR(qdirect2d_doc,
"qdirect2d(x, w, b, mult, y, geometry, x_zero_point, y_zero_point, threads)\n\n"
"QLinearConv by the direct kernel: the 8-bit x [N, C, H, W] centred on x_zero_point,\n"
"the centred float32 weight w [M, C * kh * kw], the float32 bias b [M] or None, into\n"
"the 8-bit y [N, M, OH, OW], requantized as qconv2d does (mult float32 [M] or [1]).\n"
"The caller checks every partial sum stays below 2**24. geometry as direct2d's.");

static PyObject *qdirect2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *mo, *yo, *go;
    window_geometry g;
    Py_ssize_t m;
    int threads, xzp, yzp;
    if (!PyArg_ParseTuple(args, "OOOOOOiii:qdirect2d", &xo, &wo, &bo, &mo, &yo, &go, &xzp, &yzp, &threads) ||
        direct_geometry_get(go, &g, &m, "qdirect2d") < 0)
        return NULL;
    if (!direct_geometry_ok(&g, m, "qdirect2d"))
        return NULL;
    const Py_ssize_t k = g.c * g.kh * g.kw, out = g.n * m * g.oh * g.ow;
    direct_job job;
    memset(&job, 0, sizeof(job));
    job.g = &g;
    job.m = m;
    job.quant = 1;
    job.xzp = (float)xzp;
    job.yzp = (float)yzp;
    if (nb_int8_kind(xo, &job.x_signed, "qdirect2d: x") < 0 || nb_int8_kind(yo, &job.y_signed, "qdirect2d: y") < 0)
        return NULL;
    nbuf x, w, b, mult, y;
    x.held = w.held = b.held = mult.held = y.held = 0;
    if (nb_get(xo, &x, job.x_signed ? 'i' : 'u', 1, g.n * g.c * g.h * g.w, 0, 0, "qdirect2d: x") < 0 ||
        nb_get(wo, &w, 'f', 4, m * k, 0, 0, "qdirect2d: w") < 0 ||
        nb_get(bo, &b, 'f', 4, m, 0, 1, "qdirect2d: b") < 0 ||
        (job.mult_n = nb_get_ratio(mo, &mult, m, "qdirect2d")) < 0 ||
        nb_get(yo, &y, job.y_signed ? 'i' : 'u', 1, out, 1, 0, "qdirect2d: y") < 0)
        goto done;
    job.x = x.view.buf;
    job.b = b.held ? b.view.buf : NULL;
    job.mult = mult.view.buf;
    job.y = y.view.buf;
    direct_execute(&job, w.view.buf, threads);
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

PyMethodDef direct_methods[] = {
    {"direct2d", direct2d, METH_VARARGS, direct2d_doc},
    {"qdirect2d", qdirect2d, METH_VARARGS, qdirect2d_doc},
    {NULL, NULL, 0, NULL},
};
