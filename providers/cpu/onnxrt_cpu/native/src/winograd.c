/* 3x3 stride-1 convolution by Winograd's minimal filtering, F(2x2, 3x3).
 *
 * Each 2x2 block of outputs is computed from the 4x4 block of input around it: the
 * input block is transformed (V = B^T d B, additions only), multiplied element by
 * element with the weight's transform (U = G g G^T, made once per session), summed
 * over the input channels, and transformed back (Y = A^T m A, additions only). The
 * sums over channels are 16 matrix products, one per element of the 4x4 transform:
 * [M, C] x [C, tiles]. They hold 16 multiply-adds per 4 outputs where the direct
 * convolution holds 36: 2.25 times fewer. The transforms' coefficients are 0, +-1 and
 * +-1/2 (in U), so the rounding is that of a few more additions (the results agree
 * with the direct convolution to about 1e-6 relative).
 *
 * Work is split into tasks of whole tile rows of one image: each task transforms its
 * rows' input blocks channel by channel (from a zero-padded copy of the input rows it
 * reads), runs the 16 products and writes its outputs with the bias, the residual and
 * Relu/Clip, everything in cache. */
#include "native.h"

#define T float
#define SFX(name) name##_f32
#include "epilogue.h"
#undef T
#undef SFX

typedef struct {
    Py_ssize_t n, c, h, w, m, pt, pl, oh, ow;
} wino_geometry;

typedef struct {
    const wino_geometry *g;
    const float *x, *u, *b, *z;
    float *y;
    Py_ssize_t th, tw, rows; /* tile rows and columns of a map; tile rows a task */
    Py_ssize_t tasks_per_image;
    /* shared mode: the image's whole input transform (``shared``), then blocks of
     * ``mrows`` output channels a task; ``cblock`` channels a transform task */
    float *shared;
    Py_ssize_t image, mrows, cblock;
    int act, failed;
    float lo, hi;
} wino_job;

/* Tile rows per task: about this many tiles, so that a task's transforms (16 x C and
 * 16 x M values a tile) stay within the L2 cache while its products are long enough
 * for BLAS. */
#ifndef WINO_TILES
#define WINO_TILES 256
#endif

/* The input transform of the tiles of tile rows ty0 <= ty < ty1, channels c0 <= ch <
 * c1, one channel at a time: the input rows they read are copied, zero-padded, into their even and odd
 * columns (``pad``), so that tile tx's four columns are even[tx], odd[tx],
 * even[tx + 1] and odd[tx + 1], and every step below is a contiguous, vectorized
 * pass over the tiles of a row; the 16 values of each tile are stored as
 * v[e][ch][t] (e the transform's element, t the tile within the task). */
NATIVE_CLONES static void wino_input(const wino_job *job, const float *restrict x, Py_ssize_t ty0, Py_ssize_t ty1,
                                     Py_ssize_t c0, Py_ssize_t c1, float *restrict pad, float *restrict v)
{
    const wino_geometry *g = job->g;
    const Py_ssize_t tw = job->tw, tiles = (ty1 - ty0) * tw, half = tw + 1, prow = 2 * (ty1 - ty0) + 2;
    const Py_ssize_t se = g->c * tiles; /* from one element of the transform to the next */
    for (Py_ssize_t ch = c0; ch < c1; ch++) {
        const float *plane = x + ch * g->h * g->w;
        /* input rows 2 ty0 - pt .. 2 ty1 + 1 - pt, columns -pl .. 2 tw + 1 - pl */
        for (Py_ssize_t r = 0; r < prow; r++) {
            float *even = pad + 2 * r * half, *odd = even + half;
            Py_ssize_t iy = 2 * ty0 + r - g->pt;
            if (iy < 0 || iy >= g->h) {
                for (Py_ssize_t k = 0; k < half; k++)
                    even[k] = odd[k] = 0.0f;
                continue;
            }
            const float *src = plane + iy * g->w;
            for (Py_ssize_t k = 0; k < half; k++) {
                Py_ssize_t c0 = 2 * k - g->pl, c1 = c0 + 1;
                even[k] = c0 >= 0 && c0 < g->w ? src[c0] : 0.0f;
                odd[k] = c1 >= 0 && c1 < g->w ? src[c1] : 0.0f;
            }
        }
        for (Py_ssize_t ty = 0; ty < ty1 - ty0; ty++) {
            const float *e0 = pad + 2 * (2 * ty) * half, *e1 = e0 + 2 * half, *e2 = e1 + 2 * half, *e3 = e2 + 2 * half;
            const float *o0 = e0 + half, *o1 = e1 + half, *o2 = e2 + half, *o3 = e3 + half;
            float *vt = v + ch * tiles + ty * tw;
            for (Py_ssize_t tx = 0; tx < tw; tx++) {
                /* t = B^T d per column (d0 - d2, d1 + d2, d2 - d1, d1 - d3), for the
                 * four columns a = even[tx], b = odd[tx], c = even[tx + 1], d = odd[tx + 1] */
                float a0 = e0[tx] - e2[tx], a1 = e1[tx] + e2[tx], a2 = e2[tx] - e1[tx], a3 = e1[tx] - e3[tx];
                float b0 = o0[tx] - o2[tx], b1 = o1[tx] + o2[tx], b2 = o2[tx] - o1[tx], b3 = o1[tx] - o3[tx];
                float c0 = e0[tx + 1] - e2[tx + 1], c1 = e1[tx + 1] + e2[tx + 1], c2 = e2[tx + 1] - e1[tx + 1],
                      c3 = e1[tx + 1] - e3[tx + 1];
                float d0 = o0[tx + 1] - o2[tx + 1], d1 = o1[tx + 1] + o2[tx + 1], d2 = o2[tx + 1] - o1[tx + 1],
                      d3 = o1[tx + 1] - o3[tx + 1];
                /* V = t B per row: a - c, b + c, c - b, b - d */
                vt[tx] = a0 - c0;
                vt[tx + se] = b0 + c0;
                vt[tx + 2 * se] = c0 - b0;
                vt[tx + 3 * se] = b0 - d0;
                vt[tx + 4 * se] = a1 - c1;
                vt[tx + 5 * se] = b1 + c1;
                vt[tx + 6 * se] = c1 - b1;
                vt[tx + 7 * se] = b1 - d1;
                vt[tx + 8 * se] = a2 - c2;
                vt[tx + 9 * se] = b2 + c2;
                vt[tx + 10 * se] = c2 - b2;
                vt[tx + 11 * se] = b2 - d2;
                vt[tx + 12 * se] = a3 - c3;
                vt[tx + 13 * se] = b3 + c3;
                vt[tx + 14 * se] = c3 - b3;
                vt[tx + 15 * se] = b3 - d3;
            }
        }
    }
}

/* The output transform of a task's tiles, output channels m0 <= oc < m1:
 * mo[e][oc - m0][t] back to 2x2 blocks, a tile row
 * at a time into two output rows (``rows``, 2 tw wide: the blocks' left and right
 * values interleaved), then cut to the output's width with the bias, the residual and
 * the activation. */
NATIVE_CLONES static void wino_output(const wino_job *job, Py_ssize_t image, Py_ssize_t ty0, Py_ssize_t ty1,
                                      Py_ssize_t m0, Py_ssize_t m1, const float *restrict mo, float *restrict rows)
{
    const wino_geometry *g = job->g;
    const Py_ssize_t tw = job->tw, tiles = (ty1 - ty0) * tw, se = (m1 - m0) * tiles;
    float *top = rows, *bottom = rows + 2 * tw;
    for (Py_ssize_t oc = m0; oc < m1; oc++) {
        const float bias = job->b ? job->b[oc] : 0.0f;
        float *yc = job->y + (image * g->m + oc) * g->oh * g->ow;
        const float *zc = job->z ? job->z + (image * g->m + oc) * g->oh * g->ow : NULL;
        for (Py_ssize_t ty = 0; ty < ty1 - ty0; ty++) {
            const float *m = mo + (oc - m0) * tiles + ty * tw;
            for (Py_ssize_t tx = 0; tx < tw; tx++) {
                /* s = A^T m per column (m0 + m1 + m2, m1 - m2 - m3), then Y = s A */
                float s00 = m[tx] + m[tx + 4 * se] + m[tx + 8 * se];
                float s01 = m[tx + se] + m[tx + 5 * se] + m[tx + 9 * se];
                float s02 = m[tx + 2 * se] + m[tx + 6 * se] + m[tx + 10 * se];
                float s03 = m[tx + 3 * se] + m[tx + 7 * se] + m[tx + 11 * se];
                float s10 = m[tx + 4 * se] - m[tx + 8 * se] - m[tx + 12 * se];
                float s11 = m[tx + 5 * se] - m[tx + 9 * se] - m[tx + 13 * se];
                float s12 = m[tx + 6 * se] - m[tx + 10 * se] - m[tx + 14 * se];
                float s13 = m[tx + 7 * se] - m[tx + 11 * se] - m[tx + 15 * se];
                top[2 * tx] = s00 + s01 + s02;
                top[2 * tx + 1] = s01 - s02 - s03;
                bottom[2 * tx] = s10 + s11 + s12;
                bottom[2 * tx + 1] = s11 - s12 - s13;
            }
            Py_ssize_t oy = 2 * (ty0 + ty);
            for (int i = 0; i < 2 && oy + i < g->oh; i++) {
                Py_ssize_t at = (oy + i) * g->ow;
                finish_row_f32(yc + at, i ? bottom : top, g->ow, bias, zc ? zc + at : NULL, job->act, job->lo,
                               job->hi);
            }
        }
    }
}

/* Tile-rows mode: a task transforms its tile rows of one image, multiplies and
 * writes them. */
static void wino_task(void *arg, Py_ssize_t t)
{
    wino_job *job = arg;
    const wino_geometry *g = job->g;
    Py_ssize_t image = t / job->tasks_per_image, part = t % job->tasks_per_image;
    Py_ssize_t ty0 = part * job->rows, ty1 = ty0 + job->rows < job->th ? ty0 + job->rows : job->th;
    Py_ssize_t tiles = (ty1 - ty0) * job->tw;
    size_t pad_n = (size_t)((2 * (ty1 - ty0) + 2) * 2 * (job->tw + 1));
    float *pad = scratch(0, (pad_n + (size_t)(16 * g->c * tiles)) * sizeof(float));
    float *mo = scratch(1, (size_t)(16 * g->m * tiles + 4 * job->tw) * sizeof(float));
    if (!pad || !mo) {
        job->failed = 1;
        return;
    }
    float *v = pad + ((pad_n + 15) & ~(size_t)15);
    wino_input(job, job->x + image * g->c * g->h * g->w, ty0, ty1, 0, g->c, pad, v);
    for (int e = 0; e < 16; e++)
        if (gemm_f32(g->m, tiles, g->c, job->u + (size_t)e * g->m * g->c, g->c, v + (size_t)e * g->c * tiles, tiles,
                     mo + (size_t)e * g->m * tiles, tiles) < 0) {
            job->failed = 1;
            return;
        }
    wino_output(job, image, ty0, ty1, 0, g->m, mo, mo + (size_t)16 * g->m * tiles);
}

/* Shared mode, first step: a block of channels of the current image's transform. */
static void wino_gather_task(void *arg, Py_ssize_t t)
{
    wino_job *job = arg;
    const wino_geometry *g = job->g;
    Py_ssize_t c0 = t * job->cblock, c1 = c0 + job->cblock < g->c ? c0 + job->cblock : g->c;
    float *pad = scratch(0, (size_t)((2 * job->th + 2) * 2 * (job->tw + 1)) * sizeof(float));
    if (!pad) {
        job->failed = 1;
        return;
    }
    wino_input(job, job->x + job->image * g->c * g->h * g->w, 0, job->th, c0, c1, pad, job->shared);
}

/* Shared mode, second step: a block of output channels, every tile of the image. */
static void wino_rows_task(void *arg, Py_ssize_t t)
{
    wino_job *job = arg;
    const wino_geometry *g = job->g;
    Py_ssize_t m0 = t * job->mrows, m1 = m0 + job->mrows < g->m ? m0 + job->mrows : g->m;
    Py_ssize_t tiles = job->th * job->tw;
    float *mo = scratch(1, (size_t)(16 * (m1 - m0) * tiles + 4 * job->tw) * sizeof(float));
    if (!mo) {
        job->failed = 1;
        return;
    }
    for (int e = 0; e < 16; e++)
        if (gemm_f32(m1 - m0, tiles, g->c, job->u + ((size_t)e * g->m + m0) * g->c, g->c,
                     job->shared + (size_t)e * g->c * tiles, tiles, mo + (size_t)e * (m1 - m0) * tiles, tiles) < 0) {
            job->failed = 1;
            return;
        }
    wino_output(job, job->image, 0, job->th, m0, m1, mo, mo + (size_t)16 * (m1 - m0) * tiles);
}

PyDoc_STRVAR(winograd3x3_doc,
"winograd3x3(x, u, b, z, y, geometry, act, lo, hi, threads)\n\n"
"3x3 convolution with stride 1 and dilation 1 of x [N, C, H, W] (float32) by F(2x2, 3x3):\n"
"u [16, M, C] is the weight's transform G g G^T (element e = 4 i + j at u[e]), b [M]\n"
"the bias and z (y's shape) the residual, each or None, then the activation act (0\n"
"none, 1 Relu, 2 Clip to [lo, hi], 3-8 as conv2d's), into\n"
"y [N, M, OH, OW]. geometry is a ConvGeometry\n"
"of groups 1 and a 3x3 kernel of stride and dilation 1, pads at least 0, zero padding. Needs set_blas; runs on up\n"
"to threads threads, without the GIL.");

static PyObject *winograd3x3(PyObject *self, PyObject *args)
{
    PyObject *xo, *uo, *bo, *zo, *yo, *go;
    conv_geometry cg;
    int act, threads;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "OOOOOOiddi:winograd3x3", &xo, &uo, &bo, &zo, &yo, &go, &act, &lo, &hi, &threads) ||
        conv_geometry_get(go, &cg, "winograd3x3") < 0)
        return NULL;
    if (cg.groups != 1 || cg.kh != 3 || cg.kw != 3 || cg.sh != 1 || cg.sw != 1 || cg.dh != 1 || cg.dw != 1) {
        PyErr_SetString(PyExc_ValueError, "winograd3x3: invalid geometry (groups 1, 3x3, stride and dilation 1)");
        return NULL;
    }
    wino_geometry g = {cg.n, cg.c, cg.h, cg.w, cg.m, cg.pt, cg.pl, cg.oh, cg.ow};
    if (g.n < 0 || g.c < 1 || g.h < 1 || g.w < 1 || g.m < 1 || g.pt < 0 || g.pl < 0 || g.oh < 1 || g.ow < 1 ||
        act < ACT_NONE || act > ACT_LAST) {
        PyErr_SetString(PyExc_ValueError, "winograd3x3: invalid geometry or activation");
        return NULL;
    }
    if (!blas_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "winograd3x3: no BLAS products were handed over (set_blas)");
        return NULL;
    }
    const Py_ssize_t out = g.n * g.m * g.oh * g.ow;
    nbuf x, u, b, z, y;
    x.held = u.held = b.held = z.held = y.held = 0;
    wino_job job;
    memset(&job, 0, sizeof(job));
    job.g = &g;
    job.act = act;
    job.lo = (float)lo;
    job.hi = (float)hi;
    if (nb_get(xo, &x, 'f', 4, g.n * g.c * g.h * g.w, 0, 0, "winograd3x3: x") < 0 ||
        nb_get(uo, &u, 'f', 4, 16 * g.m * g.c, 0, 0, "winograd3x3: u") < 0 ||
        nb_get(bo, &b, 'f', 4, g.m, 0, 1, "winograd3x3: b") < 0 ||
        nb_get(zo, &z, 'f', 4, out, 0, 1, "winograd3x3: z") < 0 ||
        nb_get(yo, &y, 'f', 4, out, 1, 0, "winograd3x3: y") < 0)
        goto done;
    job.x = x.view.buf;
    job.u = u.view.buf;
    job.b = b.held ? b.view.buf : NULL;
    job.z = z.held ? z.view.buf : NULL;
    job.y = y.view.buf;
    job.th = (g.oh + 1) / 2;
    job.tw = (g.ow + 1) / 2;
    job.rows = WINO_TILES / job.tw;
    if (job.rows < 1)
        job.rows = 1;
    job.tasks_per_image = (job.th + job.rows - 1) / job.rows;
    /* Shared mode where the tile rows cannot give every thread two tasks of at least
     * WINO_TILES / 2 tiles: narrower products run far below BLAS's peak, so the
     * threads split the output channels of one image's whole transform instead. */
    int shared = threads > 1 && g.n * job.tasks_per_image < 2 * threads && g.m >= 32;
    if (g.n) {
        Py_BEGIN_ALLOW_THREADS
        if (!shared) {
            pool_run(wino_task, &job, g.n * job.tasks_per_image, threads);
        } else {
            Py_ssize_t tiles = job.th * job.tw;
            job.shared = scratch(2, (size_t)(16 * g.c * tiles) * sizeof(float));
            job.cblock = (g.c + 2 * threads - 1) / (2 * threads);
            job.mrows = (g.m + 2 * threads - 1) / (2 * threads);
            job.mrows = (job.mrows + 7) / 8 * 8;
            if (!job.shared)
                job.failed = 1;
            for (job.image = 0; job.image < g.n && !job.failed; job.image++) {
                pool_run(wino_gather_task, &job, (g.c + job.cblock - 1) / job.cblock, threads);
                pool_run(wino_rows_task, &job, (g.m + job.mrows - 1) / job.mrows, threads);
            }
        }
        Py_END_ALLOW_THREADS
        if (job.failed)
            PyErr_NoMemory();
    }
done:
    nb_release(&x);
    nb_release(&u);
    nb_release(&b);
    nb_release(&z);
    nb_release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef winograd_methods[] = {
    {"winograd3x3", winograd3x3, METH_VARARGS, winograd3x3_doc},
    {NULL, NULL, 0, NULL},
};
