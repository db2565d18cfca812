/* The time loop of com.microsoft DynamicQuantizeLSTM's emulation
 * (``onnxrt_cpu.kernels.contrib_quant_lstm``, ``DynamicQuantizeLSTM._steps``): the
 * unchecked pass with one exact float32 product a step.
 *
 * Every direction and every group of ``fr`` batch rows is a recurrence of its own
 * (a group's hidden state is quantized with its own range, and a row's gates read
 * only its own state), so each (direction, group) runs all its steps as one task of
 * the pool, with no hand-over between steps. A step does what the numpy loop's calls
 * do, in float32 and in the same order, each operation rounded once: the group's
 * range with 0 included, ``scale = (top - bottom) / 255``, ``rint(h / scale)``, the
 * product with the centred R (integer values whose sums are exact in float32, so any
 * order of summation gives the same), ``* (scale * R scale)``, ``+`` the input gates
 * (X's product ``* scale + bias``, read at the direction's step), ``1 / (1 + exp(x))``
 * on the (negated) sigmoid gates, ``tanh``, the cell and the output, the ragged
 * masks. Where the CPU runs the x86-64-v3 or v4 clones (AVX2 and FMA), ``exp`` and
 * ``tanh`` are numpy's own float32 algorithms for those CPUs, with the same fused
 * multiply-adds, and the loop gives numpy's results bit for bit; elsewhere they are
 * the C library's ``expf`` and ``tanhf``, which numpy calls there too. */
#include "native.h"

#include <math.h>
#include <stdlib.h>

/* ---- the recurrent product ----------------------------------------------------- */

/* ``acc[r, c] = sum_j q[r, j] w[j, c]`` for r < rows, c < cols, j < k: integer values
 * whose sums are exact in float32 (the caller's condition), so the order of summation
 * and fused multiply-adds change nothing. Defined before the pragma below, which
 * keeps every other multiplication and addition apart. Blocks of four rows by two
 * vectors of columns, eight accumulators: as many products in flight as two
 * fused-multiply-add pipes of four cycles' latency take (one vector of columns, four
 * accumulators, ran at half that rate); rows past the blocks one at a time, by eight
 * vectors. In vectors of the clone's width: 64 bytes (AVX-512), 32 (AVX2), 16 (the
 * baseline); GCC splits a vector wider than the registers poorly (64 bytes on AVX2:
 * 10 times slower). ``[8, 48] x [48, 192]``, the tagger's product, AMD EPYC: 1.27 us
 * with 64-byte vectors, 1.35 with 32. */
#define QL_PRODUCT(NAME, BYTES)                                                                                      \
    typedef float NAME##_vec __attribute__((vector_size(BYTES), aligned(4)));                                        \
    NATIVE_CLONES static void NAME(const float *restrict q, Py_ssize_t k, const float *restrict w,                   \
                                   Py_ssize_t cols, Py_ssize_t rows, float *restrict acc)                            \
    {                                                                                                                \
        typedef NAME##_vec vec;                                                                                      \
        const Py_ssize_t L = BYTES / 4;                                                                              \
        Py_ssize_t r = 0;                                                                                            \
        for (; r + 4 <= rows; r += 4) {                                                                              \
            const float *q0 = q + r * k, *q1 = q0 + k, *q2 = q1 + k, *q3 = q2 + k;                                   \
            float *o0 = acc + r * cols, *o1 = o0 + cols, *o2 = o1 + cols, *o3 = o2 + cols;                           \
            Py_ssize_t c = 0;                                                                                        \
            for (; c + 2 * L <= cols; c += 2 * L) {                                                                  \
                vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};                  \
                for (Py_ssize_t j = 0; j < k; j++) {                                                                 \
                    const vec u = *(const vec *)(w + j * cols + c), v = *(const vec *)(w + j * cols + c + L);        \
                    a0 += q0[j] * u;                                                                                 \
                    a1 += q1[j] * u;                                                                                 \
                    a2 += q2[j] * u;                                                                                 \
                    a3 += q3[j] * u;                                                                                 \
                    b0 += q0[j] * v;                                                                                 \
                    b1 += q1[j] * v;                                                                                 \
                    b2 += q2[j] * v;                                                                                 \
                    b3 += q3[j] * v;                                                                                 \
                }                                                                                                    \
                *(vec *)(o0 + c) = a0;                                                                               \
                *(vec *)(o0 + c + L) = b0;                                                                           \
                *(vec *)(o1 + c) = a1;                                                                               \
                *(vec *)(o1 + c + L) = b1;                                                                           \
                *(vec *)(o2 + c) = a2;                                                                               \
                *(vec *)(o2 + c + L) = b2;                                                                           \
                *(vec *)(o3 + c) = a3;                                                                               \
                *(vec *)(o3 + c + L) = b3;                                                                           \
            }                                                                                                        \
            for (; c < cols; c++) {                                                                                  \
                float s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                                \
                for (Py_ssize_t j = 0; j < k; j++) {                                                                 \
                    const float u = w[j * cols + c];                                                                 \
                    s0 += q0[j] * u;                                                                                 \
                    s1 += q1[j] * u;                                                                                 \
                    s2 += q2[j] * u;                                                                                 \
                    s3 += q3[j] * u;                                                                                 \
                }                                                                                                    \
                o0[c] = s0;                                                                                          \
                o1[c] = s1;                                                                                          \
                o2[c] = s2;                                                                                          \
                o3[c] = s3;                                                                                          \
            }                                                                                                        \
        }                                                                                                            \
        for (; r < rows; r++) {                                                                                      \
            const float *q0 = q + r * k;                                                                             \
            float *o0 = acc + r * cols;                                                                              \
            Py_ssize_t c = 0;                                                                                        \
            for (; c + 8 * L <= cols; c += 8 * L) {                                                                  \
                vec a[8] = {{0}};                                                                                    \
                for (Py_ssize_t j = 0; j < k; j++)                                                                   \
                    for (int v = 0; v < 8; v++)                                                                      \
                        a[v] += q0[j] * *(const vec *)(w + j * cols + c + v * L);                                    \
                for (int v = 0; v < 8; v++)                                                                          \
                    *(vec *)(o0 + c + v * L) = a[v];                                                                 \
            }                                                                                                        \
            for (; c + L <= cols; c += L) {                                                                          \
                vec a0 = {0};                                                                                        \
                for (Py_ssize_t j = 0; j < k; j++)                                                                   \
                    a0 += q0[j] * *(const vec *)(w + j * cols + c);                                                  \
                *(vec *)(o0 + c) = a0;                                                                               \
            }                                                                                                        \
            for (; c < cols; c++) {                                                                                  \
                float s0 = 0;                                                                                        \
                for (Py_ssize_t j = 0; j < k; j++)                                                                   \
                    s0 += q0[j] * w[j * cols + c];                                                                   \
                o0[c] = s0;                                                                                          \
            }                                                                                                        \
        }                                                                                                            \
    }

QL_PRODUCT(qlstm_product64, 64)
QL_PRODUCT(qlstm_product32, 32)
QL_PRODUCT(qlstm_product16, 16)

typedef void (*ql_product_fn)(const float *, Py_ssize_t, const float *, Py_ssize_t, Py_ssize_t, float *);

/* From here on a product and a sum are two operations, each rounded, as numpy's
 * calls compute them: no contraction into fused multiply-adds (GCC contracts by
 * default outside ISO C modes, Clang within an expression); the fused ones numpy's
 * exp and tanh compute are written as fmaf. And no floating-point exception is
 * looked at (numpy's calls ignore them too), which lets GCC turn the selects of exp,
 * tanh and the range into vector blends for AVX2 (with trapping math it keeps their
 * comparisons as branches there, and the loops scalar); values are unchanged. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#include "npymath.h"

#define QL_INLINE NPY_INLINE

/* The range of h[0 .. n) with 0 in it, ``[bottom, top]``, NaN both where a value is
 * NaN, as numpy's minimum and maximum reduce it: sixteen lanes apart (vectorized),
 * then across. */
QL_INLINE void ql_range(const float *h, Py_ssize_t n, float *bottom, float *top)
{
    float lo[16], hi[16];
    int32_t nan[16];
    for (int l = 0; l < 16; l++) {
        lo[l] = hi[l] = 0.0f;
        nan[l] = 0;
    }
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            const float v = h[i + l];
            hi[l] = v > hi[l] ? v : hi[l];
            lo[l] = v < lo[l] ? v : lo[l];
            nan[l] |= v != v;
        }
    for (int l = 0; i < n; i++, l++) {
        const float v = h[i];
        hi[l] = v > hi[l] ? v : hi[l];
        lo[l] = v < lo[l] ? v : lo[l];
        nan[l] |= v != v;
    }
    float b = 0.0f, t = 0.0f;
    int any = 0;
    for (int l = 0; l < 16; l++) {
        t = hi[l] > t ? hi[l] : t;
        b = lo[l] < b ? lo[l] : b;
        any |= nan[l];
    }
    *bottom = any ? NAN : b;
    *top = any ? NAN : t;
}

/* ---- the time loop ------------------------------------------------------------- */

typedef struct {
    const float *r;       /* [D, H, 4H]: centred R, the sigmoid gates' columns negated */
    const float *rs;      /* [D, 4H]: R's scales per column (per direction: column 0's) */
    const float *gxa;     /* [seq, batch, D, 4H]: the product of X's codes and W */
    const float *gs;      /* [D, 4H]: its scales (X's scale times W's, signed) */
    const float *gb;      /* [D, 4H]: the bias, or NULL */
    const int64_t *lens;  /* [batch]: ragged lengths, or NULL */
    const float *masks;   /* [seq, rows] or NULL */
    float *ys;            /* [seq + 1, D, rows, H]: ys[0] the initial state */
    float *cell;          /* [D, rows, H] */
    float *scales;        /* [seq, D, groups] */
    float *ranges;        /* [2, seq, D, groups]: bottoms, tops */
    float *last_cell;     /* [D, rows, H] with masks */
    Py_ssize_t seq, batch, dirs, rows, hid, fr, groups;
    int reversed, per_direction, zero_start, failed;
    ql_product_fn product;
    int numpy_math; /* exp and tanh by numpy's own algorithms, else the C library's */
} qlstm_job;

/* Every step of direction d's group g (rows g * fr .. g * fr + fr). ``q`` holds the
 * group's codes, ``acc`` its gates, ``mult`` a step's multipliers of the product,
 * ``coef`` a row's tanh coefficients. */
NATIVE_CLONES static void qlstm_group(const qlstm_job *j, Py_ssize_t d, Py_ssize_t g, float *restrict q,
                                      float *restrict acc, float *restrict mult, float *restrict coef)
{
    const Py_ssize_t hid = j->hid, h4 = 4 * hid, fr = j->fr, n = fr * hid, row0 = g * fr;
    const Py_ssize_t dg = d * j->groups + g, per_step = j->dirs * j->groups;
    const float *w = j->r + d * hid * h4, *rs = j->rs + d * h4, *gs = j->gs + d * h4;
    const float *gb = j->gb ? j->gb + d * h4 : NULL;
    const int reversed = (j->reversed >> d) & 1;
    float *cell = j->cell + (d * j->rows + row0) * hid;
    float *last = j->last_cell ? j->last_cell + (d * j->rows + row0) * hid : NULL;
    for (Py_ssize_t t = 0; t < j->seq; t++) {
        const float *h = j->ys + ((t * j->dirs + d) * j->rows + row0) * hid;
        float *y = j->ys + (((t + 1) * j->dirs + d) * j->rows + row0) * hid;
        float scale, top = 0.0f, bottom = 0.0f;
        if (t == 0 && j->zero_start) {
            /* a zero state: scale 1, and a zero product */
            scale = 1.0f;
            memset(acc, 0, (size_t)(fr * h4) * sizeof(float));
        } else {
            ql_range(h, n, &bottom, &top);
            scale = top - bottom;
            scale = scale / 255.0f;
            for (Py_ssize_t i = 0; i < n; i++)
                q[i] = rintf(h[i] / scale);
            j->product(q, hid, w, h4, fr, acc);
        }
        j->scales[t * per_step + dg] = scale;
        j->ranges[t * per_step + dg] = bottom;
        j->ranges[(j->seq + t) * per_step + dg] = top;
        for (Py_ssize_t c = 0; c < h4; c++)
            mult[c] = scale * rs[j->per_direction ? 0 : c];
        for (Py_ssize_t r = 0; r < fr; r++) {
            float *a = acc + r * h4;
            const Py_ssize_t row = row0 + r;
            /* the input gates: X's product at this direction's step (the reverse
             * direction runs each row's valid steps backwards) scaled, and the bias */
            if (row < j->batch) {
                Py_ssize_t ts = t;
                if (reversed) {
                    const Py_ssize_t len = j->lens ? (Py_ssize_t)j->lens[row] : j->seq;
                    ts = t < len ? len - 1 - t : t;
                }
                const float *x = j->gxa + ((ts * j->batch + row) * j->dirs + d) * h4;
                if (gb) {
                    for (Py_ssize_t c = 0; c < h4; c++) {
                        const float v = a[c] * mult[c];
                        float gate = x[c] * gs[c];
                        gate = gate + gb[c];
                        a[c] = v + gate;
                    }
                } else {
                    for (Py_ssize_t c = 0; c < h4; c++) {
                        const float v = a[c] * mult[c];
                        const float gate = x[c] * gs[c];
                        a[c] = v + gate;
                    }
                }
            } else {
                /* a padding row of the last group: no inputs, a state that stays zero */
                for (Py_ssize_t c = 0; c < h4; c++) {
                    const float v = a[c] * mult[c];
                    a[c] = v + 0.0f;
                }
            }
            /* the gates o, f, i: 1 / (1 + exp(-x)), their inputs negated already */
            if (j->numpy_math)
                for (Py_ssize_t c = 0; c < 3 * hid; c++)
                    a[c] = npy_exp(a[c]);
            else
                for (Py_ssize_t c = 0; c < 3 * hid; c++)
                    a[c] = expf(a[c]);
            for (Py_ssize_t c = 0; c < 3 * hid; c++) {
                const float e = a[c] + 1.0f;
                a[c] = 1.0f / e;
            }
            float *cg = a + 3 * hid, *cr = cell + r * hid, *yr = y + r * hid;
            const float *o = a, *f = a + hid, *in = a + 2 * hid;
            npy_tanh_of(j->numpy_math, cg, cg, hid, coef);
            for (Py_ssize_t i = 0; i < hid; i++) {
                const float fc = f[i] * cr[i];
                const float ic = in[i] * cg[i];
                cr[i] = fc + ic;
            }
            npy_tanh_of(j->numpy_math, cr, yr, hid, coef);
            for (Py_ssize_t i = 0; i < hid; i++)
                yr[i] = o[i] * yr[i];
            if (j->masks) {
                const float m = j->masks[t * j->rows + row];
                for (Py_ssize_t i = 0; i < hid; i++)
                    yr[i] = yr[i] * m;
                if (m > 0)
                    memcpy(last + r * hid, cr, (size_t)hid * sizeof(float));
            }
        }
    }
}

static void qlstm_task(void *arg, Py_ssize_t i)
{
    qlstm_job *j = arg;
    const Py_ssize_t h4 = 4 * j->hid;
    float *q = scratch(0, (size_t)(j->fr * j->hid) * sizeof(float));
    float *acc = scratch(1, (size_t)(j->fr * h4 + h4 + 8 * j->hid) * sizeof(float));
    if (!q || !acc) {
        j->failed = 1;
        return;
    }
    qlstm_group(j, i / j->groups, i % j->groups, q, acc, acc + j->fr * h4, acc + j->fr * h4 + h4);
}

PyDoc_STRVAR(qlstm_steps_doc,
"qlstm_steps(r, r_scale, per_direction, gxa, gx_scale, bias, lens, reversed, ys, cell,\n"
"            scales, ranges, masks, last_cell, (seq, batch, dirs, rows, hid, fr),\n"
"            zero_start, threads)\n\n"
"The unchecked time loop of DynamicQuantizeLSTM's emulation with one exact float32\n"
"product a step (DynamicQuantizeLSTM._steps, careful=False, exact=True), every\n"
"direction at once. float32, C-contiguous: r [D, H, 4H] (centred, the sigmoid gates'\n"
"columns negated), r_scale [D, 4H] (column 0 alone read where per_direction); the\n"
"input gates gxa [seq, batch, D, 4H] * gx_scale [D, 4H] + bias [D, 4H] (or None), the\n"
"directions whose bit is set in reversed running backwards over each row's valid steps\n"
"(lens [batch], int64, ragged; or None: all seq steps); ys [seq + 1, D, rows, H]\n"
"(ys[0] the initial state; the steps write the rest), cell [D, rows, H] (in and out),\n"
"scales [seq, D, rows / fr] and ranges [2, seq, D, rows / fr] (written), masks [seq,\n"
"rows] and last_cell [D, rows, H] (ragged lengths) or both None. zero_start: ys[0] is\n"
"zero. Rows from batch to rows are padding (no inputs). Each direction's groups of fr\n"
"rows share out over up to threads threads, without the GIL.");

static PyObject *qlstm_steps(PyObject *self, PyObject *args)
{
    PyObject *ro, *rso, *gxao, *gso, *gbo, *lenso, *yso, *cello, *scaleso, *rangeso, *maskso, *lasto;
    qlstm_job j;
    int threads;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "OOpOOOOiOOOOOO(nnnnnn)pi:qlstm_steps", &ro, &rso, &j.per_direction, &gxao, &gso,
                          &gbo, &lenso, &j.reversed, &yso, &cello, &scaleso, &rangeso, &maskso, &lasto, &j.seq,
                          &j.batch, &j.dirs, &j.rows, &j.hid, &j.fr, &j.zero_start, &threads))
        return NULL;
    if (j.seq < 0 || j.batch < 1 || j.dirs < 1 || j.dirs > 2 || j.rows < j.batch || j.hid < 1 || j.fr < 1 ||
        j.rows % j.fr != 0 || j.hid > PY_SSIZE_T_MAX / 64 / j.hid ||
        j.seq + 1 > PY_SSIZE_T_MAX / 64 / j.dirs / j.rows / j.hid) {
        PyErr_SetString(PyExc_ValueError, "qlstm_steps: invalid sizes (batch <= rows, fr must divide rows)");
        return NULL;
    }
    if ((maskso == Py_None) != (lasto == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "qlstm_steps: masks and last_cell come together");
        return NULL;
    }
    j.groups = j.rows / j.fr;
    const int level = npy_clone_level();
    j.product = level == 4 ? qlstm_product64 : level == 3 ? qlstm_product32 : qlstm_product16;
    j.numpy_math = level >= 3;
    const Py_ssize_t h4 = 4 * j.hid, state = j.dirs * j.rows * j.hid, steps = j.seq * j.dirs * j.groups;
    nbuf r, rs, gxa, gs, gb, lens, ys, cell, scales, ranges, masks, last;
    r.held = rs.held = gxa.held = gs.held = gb.held = lens.held = ys.held = cell.held = 0;
    scales.held = ranges.held = masks.held = last.held = 0;
    if (nb_get(ro, &r, 'f', 4, j.dirs * j.hid * h4, 0, 0, "qlstm_steps: r") < 0 ||
        nb_get(rso, &rs, 'f', 4, j.dirs * h4, 0, 0, "qlstm_steps: r_scale") < 0 ||
        nb_get(gxao, &gxa, 'f', 4, j.seq * j.batch * j.dirs * h4, 0, 0, "qlstm_steps: gxa") < 0 ||
        nb_get(gso, &gs, 'f', 4, j.dirs * h4, 0, 0, "qlstm_steps: gx_scale") < 0 ||
        nb_get(gbo, &gb, 'f', 4, j.dirs * h4, 0, 1, "qlstm_steps: bias") < 0 ||
        nb_get(lenso, &lens, 'i', 8, j.batch, 0, 1, "qlstm_steps: lens") < 0 ||
        nb_get(yso, &ys, 'f', 4, (j.seq + 1) * state, 1, 0, "qlstm_steps: ys") < 0 ||
        nb_get(cello, &cell, 'f', 4, state, 1, 0, "qlstm_steps: cell") < 0 ||
        nb_get(scaleso, &scales, 'f', 4, steps, 1, 0, "qlstm_steps: scales") < 0 ||
        nb_get(rangeso, &ranges, 'f', 4, 2 * steps, 1, 0, "qlstm_steps: ranges") < 0 ||
        nb_get(maskso, &masks, 'f', 4, j.seq * j.rows, 0, 1, "qlstm_steps: masks") < 0 ||
        nb_get(lasto, &last, 'f', 4, state, 1, 1, "qlstm_steps: last_cell") < 0)
        goto done;
    j.lens = lens.held ? lens.view.buf : NULL;
    for (Py_ssize_t i = 0; j.lens && i < j.batch; i++)
        if (j.lens[i] < 0 || j.lens[i] > j.seq) {
            PyErr_Format(PyExc_ValueError, "qlstm_steps: lens[%zd] = %lld lies outside [0, %zd]", i,
                         (long long)j.lens[i], j.seq);
            goto done;
        }
    j.r = r.view.buf;
    j.rs = rs.view.buf;
    j.gxa = gxa.view.buf;
    j.gs = gs.view.buf;
    j.gb = gb.held ? gb.view.buf : NULL;
    j.ys = ys.view.buf;
    j.cell = cell.view.buf;
    j.scales = scales.view.buf;
    j.ranges = ranges.view.buf;
    j.masks = masks.held ? masks.view.buf : NULL;
    j.last_cell = last.held ? last.view.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    pool_run(qlstm_task, &j, j.dirs * j.groups, threads);
    Py_END_ALLOW_THREADS
    if (j.failed)
        PyErr_NoMemory();
done:
    nb_release(&r);
    nb_release(&rs);
    nb_release(&gxa);
    nb_release(&gs);
    nb_release(&gb);
    nb_release(&lens);
    nb_release(&ys);
    nb_release(&cell);
    nb_release(&scales);
    nb_release(&ranges);
    nb_release(&masks);
    nb_release(&last);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- exp and tanh alone, for the tests ----------------------------------------- */

NATIVE_CLONES static void qlstm_map(const float *restrict x, float *restrict y, Py_ssize_t n, int which,
                                    int numpy_math, float *restrict coef)
{
    if (which == 1) {
        npy_tanh_of(numpy_math, x, y, n, coef);
    } else if (numpy_math) {
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = npy_exp(x[i]);
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = expf(x[i]);
    }
}

static PyObject *qlstm_activation(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    const char *name;
    if (!PyArg_ParseTuple(args, "OOs:qlstm_activation", &xo, &yo, &name))
        return NULL;
    int which = strcmp(name, "exp") == 0 ? 0 : strcmp(name, "tanh") == 0 ? 1 : -1;
    if (which < 0) {
        PyErr_SetString(PyExc_ValueError, "qlstm_activation: the function is 'exp' or 'tanh'");
        return NULL;
    }
    nbuf x, y;
    x.held = y.held = 0;
    if (nb_get(xo, &x, 'f', 4, 0, 0, 0, "qlstm_activation: x") < 0)
        return NULL;
    Py_ssize_t n = x.view.len / 4;
    if (nb_get(yo, &y, 'f', 4, n, 1, 0, "qlstm_activation: y") < 0) {
        nb_release(&x);
        return NULL;
    }
    float *coef = which == 1 ? malloc((size_t)(8 * n + 1) * sizeof(float)) : NULL;
    if (which == 1 && !coef) {
        nb_release(&x);
        nb_release(&y);
        return PyErr_NoMemory();
    }
    const int numpy_math = npy_clone_level() >= 3;
    Py_BEGIN_ALLOW_THREADS
    qlstm_map(x.view.buf, y.view.buf, n, which, numpy_math, coef);
    Py_END_ALLOW_THREADS
    free(coef);
    nb_release(&x);
    nb_release(&y);
    return PyBool_FromLong(numpy_math);
}

PyMethodDef qlstm_methods[] = {
    {"qlstm_steps", qlstm_steps, METH_VARARGS, qlstm_steps_doc},
    {"qlstm_activation", qlstm_activation, METH_VARARGS,
     "qlstm_activation(x, y, name) -> bool\n\ny = exp(x) or tanh(x) (name 'exp' or 'tanh'), float32, as qlstm_steps computes\n"
     "them; True where that is by numpy's own algorithms for AVX2 and AVX-512 (this CPU runs\n"
     "the x86-64-v3 or v4 clones), False where by the C library's expf and tanhf."},
    {NULL, NULL, 0, NULL},
};
