/* The pooling kernels for one element type: included by pool2d.c once per type with
 * T and SFX(name) defined, after phases.h. */

typedef T SFX(pvec) __attribute__((vector_size(64), aligned(sizeof(T))));
typedef SFX(int_t) SFX(pmask) __attribute__((vector_size(64)));
#define PLANES_LANES ((Py_ssize_t)(64 / sizeof(T)))

/* ``acc`` or ``v`` lane by lane, whichever is larger (a NaN in ``acc`` stays; NaNs of
 * ``v`` are collected in ``nan``): a compare and a blend, or one max instruction. */
static inline void SFX(vmax)(SFX(pvec) *acc, SFX(pvec) v, SFX(pmask) *nan)
{
    SFX(pmask) more = v > *acc;
    *acc = (SFX(pvec))(((SFX(pmask))v & more) | ((SFX(pmask))*acc & ~more));
    *nan |= v != v;
}

/* Every tap of one plane, on the phases: ``out`` (the output on the phases' pitch) is
 * the fold of each tap's contiguous run, in blocks of four vectors that stay in
 * registers through all taps. MaxPool propagates NaN as numpy's maximum does. */
NATIVE_CLONES static void SFX(pool_taps)(const T *phases, const Py_ssize_t *offs, Py_ssize_t taps, T *out,
                                         Py_ssize_t span, int mode)
{
    for (Py_ssize_t p = 0; p < span; p += 4 * PLANES_LANES) {
        const SFX(pvec) *s = (const SFX(pvec) *)(phases + offs[0] + p);
        SFX(pvec) a0 = s[0], a1 = s[1], a2 = s[2], a3 = s[3];
        if (mode == POOL_MAX) {
            SFX(pmask) n0 = a0 != a0, n1 = a1 != a1, n2 = a2 != a2, n3 = a3 != a3;
            for (Py_ssize_t t = 1; t < taps; t++) {
                s = (const SFX(pvec) *)(phases + offs[t] + p);
                SFX(vmax)(&a0, s[0], &n0);
                SFX(vmax)(&a1, s[1], &n1);
                SFX(vmax)(&a2, s[2], &n2);
                SFX(vmax)(&a3, s[3], &n3);
            }
            const SFX(pvec) q = {0};
            const SFX(pvec) nanv = q / q; /* lanes that saw a NaN are NaN */
            a0 = (SFX(pvec))(((SFX(pmask))nanv & n0) | ((SFX(pmask))a0 & ~n0));
            a1 = (SFX(pvec))(((SFX(pmask))nanv & n1) | ((SFX(pmask))a1 & ~n1));
            a2 = (SFX(pvec))(((SFX(pmask))nanv & n2) | ((SFX(pmask))a2 & ~n2));
            a3 = (SFX(pvec))(((SFX(pmask))nanv & n3) | ((SFX(pmask))a3 & ~n3));
        } else {
            for (Py_ssize_t t = 1; t < taps; t++) {
                s = (const SFX(pvec) *)(phases + offs[t] + p);
                a0 += s[0];
                a1 += s[1];
                a2 += s[2];
                a3 += s[3];
            }
        }
        SFX(pvec) *o = (SFX(pvec) *)(out + p);
        o[0] = a0;
        o[1] = a1;
        o[2] = a2;
        o[3] = a3;
    }
}

#undef PLANES_LANES

/* The output on the phases' pitch, cropped: rows of ``ow`` values, averages divided. */
NATIVE_CLONES static void SFX(pool_crop)(const T *restrict src, T *restrict dst, Py_ssize_t oh, Py_ssize_t ow,
                                         Py_ssize_t pq, const T *restrict div)
{
    for (Py_ssize_t r = 0; r < oh; r++) {
        const T *restrict s = src + r * pq;
        T *restrict d = dst + r * ow;
        if (div) {
            const T *restrict q = div + r * ow;
            for (Py_ssize_t i = 0; i < ow; i++)
                d[i] = s[i] / q[i];
        } else {
            for (Py_ssize_t i = 0; i < ow; i++)
                d[i] = s[i];
        }
    }
}

/* A chunk of planes: the phases' padding is the reduction's identity (-inf for
 * MaxPool, which never wins; 0 for AveragePool, whose divisor counts only what the
 * attributes count), set once; each plane fills the inside, folds every tap, crops. */
static void SFX(pool_task)(void *arg, Py_ssize_t t)
{
    pool_job *job = arg;
    const window_geometry *g = job->g;
    Py_ssize_t j0 = t * job->chunk, j1 = j0 + job->chunk < job->planes ? j0 + job->chunk : job->planes;
    phase_layout l;
    phase_layout_of(g, &l);
    const Py_ssize_t nph = g->sh * g->sw, taps = g->kh * g->kw;
    size_t elems = (size_t)(nph * l.plane + l.span + PHASE_SLACK), bytes = (elems * sizeof(T) + 63) & ~(size_t)63;
    T *work = (T *)scratch(0, bytes + (size_t)taps * sizeof(Py_ssize_t));
    if (!work) {
        job->failed = 1;
        return;
    }
    const T identity = job->mode == POOL_MAX ? -(T)INFINITY : (T)0;
    for (size_t i = 0; i < elems; i++)
        work[i] = identity;
    T *out = work + nph * l.plane;
    Py_ssize_t *offs = (Py_ssize_t *)((char *)work + bytes);
    for (Py_ssize_t ky = 0; ky < g->kh; ky++)
        for (Py_ssize_t kx = 0; kx < g->kw; kx++)
            offs[ky * g->kw + kx] = phase_offset(g, &l, ky, kx);
    for (Py_ssize_t j = j0; j < j1; j++) {
        SFX(phase_fill)(g, &l, (const T *)job->x + j * g->h * g->w, work);
        SFX(pool_taps)(work, offs, taps, out, l.span, job->mode);
        SFX(pool_crop)(out, (T *)job->y + j * g->oh * g->ow, g->oh, g->ow, l.pq,
                       job->mode == POOL_AVERAGE ? (const T *)job->div : NULL);
    }
}

/* ---- by output rows ------------------------------------------------------------
 * Each output row straight from the input: the window's rows inside the input
 * reduced into one row (a vectorized pass a row, none for a single row), that row
 * split into its column phases where the stride along the row passes 1 (so every
 * column tap reads a contiguous run), and the column taps folded into the output
 * row. No copy of the plane and no cropping: for the wide maps of audio models
 * (32 x 498 x 257 by 1 x 4 windows) the phase kernel above made three passes over a
 * plane that no longer fits in cache. */

/* ``a`` or ``b``, whichever is larger, a NaN in either winning (numpy's maximum). */
static inline T SFX(pmax)(T a, T b)
{
    return (b > a || b != b) ? b : a;
}

/* ``acc[i] = op(acc[i], src[i])`` for i < len: max, or + for AveragePool. */
static inline __attribute__((always_inline)) void SFX(pool_fold)(T *restrict acc, const T *restrict src, Py_ssize_t len, int mode)
{
    if (mode == POOL_MAX) {
        for (Py_ssize_t i = 0; i < len; i++)
            acc[i] = SFX(pmax)(acc[i], src[i]);
    } else {
        for (Py_ssize_t i = 0; i < len; i++)
            acc[i] += src[i];
    }
}

/* Row ``src`` (``len`` values) into the ``sw`` phases ``ph`` (``pq`` values each) from
 * padded column ``pl``: phase p holds padded columns p, p + sw, ... */
static inline __attribute__((always_inline)) void SFX(pool_split)(const T *restrict src, Py_ssize_t len, Py_ssize_t pl, Py_ssize_t sw,
                                          Py_ssize_t pq, T *restrict ph)
{
    if (sw == 1) {
        for (Py_ssize_t i = 0; i < len; i++)
            ph[pl + i] = src[i];
        return;
    }
    if (sw == 2) {
        const Py_ssize_t pairs = len / 2;
        T *restrict de = ph + (pl & 1) * pq + pl / 2;
        T *restrict dd = ph + (1 - (pl & 1)) * pq + pl / 2 + (pl & 1);
        for (Py_ssize_t j = 0; j < pairs; j++) {
            de[j] = src[2 * j];
            dd[j] = src[2 * j + 1];
        }
        if (len & 1)
            de[pairs] = src[2 * pairs];
        return;
    }
    if (sw == 4 && pl == 0) {
        const Py_ssize_t quads = len / 4;
        T *restrict d0 = ph, *restrict d1 = ph + pq, *restrict d2 = ph + 2 * pq, *restrict d3 = ph + 3 * pq;
        for (Py_ssize_t j = 0; j < quads; j++) {
            d0[j] = src[4 * j];
            d1[j] = src[4 * j + 1];
            d2[j] = src[4 * j + 2];
            d3[j] = src[4 * j + 3];
        }
        for (Py_ssize_t i = 4 * quads; i < len; i++)
            ph[(i % 4) * pq + i / 4] = src[i];
        return;
    }
    for (Py_ssize_t px = 0; px < sw; px++) {
        const Py_ssize_t c0 = pl + ((px - pl) % sw + sw) % sw; /* first padded column of the phase inside */
        T *restrict d = ph + px * pq + c0 / sw;
        const T *restrict s = src + (c0 - pl);
        for (Py_ssize_t j = 0, cnt = c0 < pl + len ? (pl + len - c0 + sw - 1) / sw : 0; j < cnt; j++)
            d[j] = s[j * sw];
    }
}

/* One output row: the fold of its column taps over the phases (or the reduced row
 * itself at stride 1), averages divided by ``div``. */
static inline __attribute__((always_inline)) void SFX(pool_columns)(const T *ph, Py_ssize_t pq, const window_geometry *g, T *restrict out,
                                            const T *restrict div, int mode)
{
    const Py_ssize_t ow = g->ow, sw = g->sw;
    for (Py_ssize_t kx = 0; kx < g->kw; kx++) {
        const Py_ssize_t rx = kx * g->dw;
        const T *restrict s = ph + (rx % sw) * pq + rx / sw;
        if (kx == 0) {
            for (Py_ssize_t i = 0; i < ow; i++)
                out[i] = s[i];
        } else if (mode == POOL_MAX) {
            for (Py_ssize_t i = 0; i < ow; i++)
                out[i] = SFX(pmax)(out[i], s[i]);
        } else {
            for (Py_ssize_t i = 0; i < ow; i++)
                out[i] += s[i];
        }
    }
    if (div)
        for (Py_ssize_t i = 0; i < ow; i++)
            out[i] /= div[i];
}

/* Output rows q0 <= q < q1 of the flattened [planes * oh] index space, with ``v`` a
 * row of scratch and ``ph`` the phases (their padding already the identity): one
 * clone, its row steps inlined, so a row of a few values costs no calls. */
NATIVE_CLONES static void SFX(pool_rows)(const pool_job *job, Py_ssize_t q0, Py_ssize_t q1, T *restrict v,
                                         T *restrict ph)
{
    const window_geometry *g = job->g;
    const Py_ssize_t sw = g->sw, wn = (g->ow - 1) * sw + (g->kw - 1) * g->dw + 1;
    const Py_ssize_t pq = (wn + sw - 1) / sw;
    /* the input columns inside the padded extent the taps read */
    const Py_ssize_t cols = g->pl + g->w < wn ? g->w : wn - g->pl;
    const int mode = job->mode;
    const T identity = mode == POOL_MAX ? -(T)INFINITY : (T)0;
    const T *div = mode == POOL_AVERAGE ? (const T *)job->div : NULL;
    /* a stride-1 row that needs no padding is read where it lies */
    const int in_place = sw == 1 && g->pl == 0 && wn <= g->w;
    Py_ssize_t j = q0 / g->oh, oy = q0 % g->oh;
    for (Py_ssize_t q = q0; q < q1; q++, oy++) {
        if (oy == g->oh) {
            oy = 0;
            j++;
        }
        const T *plane = (const T *)job->x + j * g->h * g->w;
        T *out = (T *)job->y + q * g->ow;
        const T *rdiv = div ? div + oy * g->ow : NULL;
        const T *first = NULL;
        int rows = 0;
        for (Py_ssize_t ky = 0; ky < g->kh; ky++) {
            const Py_ssize_t iy = oy * g->sh - g->pt + ky * g->dh;
            if (iy < 0 || iy >= g->h)
                continue;
            const T *row = plane + iy * g->w;
            if (rows == 0) {
                first = row;
            } else {
                if (rows == 1)
                    for (Py_ssize_t i = 0; i < cols; i++)
                        v[i] = first[i];
                SFX(pool_fold)(v, row, cols, mode);
            }
            rows++;
        }
        if (rows == 0 || cols <= 0) {
            /* a window wholly in the padding */
            for (Py_ssize_t i = 0; i < g->ow; i++)
                out[i] = rdiv ? identity / rdiv[i] : identity;
            continue;
        }
        const T *reduced = rows == 1 ? first : v;
        if (in_place) {
            SFX(pool_columns)(reduced, pq, g, out, rdiv, mode);
            continue;
        }
        SFX(pool_split)(reduced, cols, g->pl, sw, pq, ph);
        SFX(pool_columns)(ph, pq, g, out, rdiv, mode);
    }
}

/* A chunk of output rows: its scratch row and phases, the phases' padding set to
 * the identity once (every row writes the same inner columns). */
static void SFX(pool_rows_task)(void *arg, Py_ssize_t t)
{
    pool_job *job = arg;
    const window_geometry *g = job->g;
    const Py_ssize_t total = job->planes * g->oh;
    const Py_ssize_t q0 = t * job->chunk, q1 = q0 + job->chunk < total ? q0 + job->chunk : total;
    const Py_ssize_t sw = g->sw, wn = (g->ow - 1) * sw + (g->kw - 1) * g->dw + 1;
    const Py_ssize_t pq = (wn + sw - 1) / sw;
    const size_t vcount = (size_t)g->w;
    T *v = (T *)scratch(0, (vcount + (size_t)(sw * pq)) * sizeof(T));
    if (!v) {
        job->failed = 1;
        return;
    }
    T *ph = v + vcount;
    const T identity = job->mode == POOL_MAX ? -(T)INFINITY : (T)0;
    for (Py_ssize_t i = 0; i < sw * pq; i++)
        ph[i] = identity;
    SFX(pool_rows)(job, q0, q1, v, ph);
}

/* ---- whole planes as one row -----------------------------------------------------
 * MaxPool of one-row windows (kh 1, stride 1 down the rows, no padding) that tile
 * each input row exactly (w = ow * sw, the last window inside the row): output i of
 * the flattened [planes * oh * ow] outputs reads input sw * i + kx * dw of the
 * flattened input, so every plane is one long pass, whatever its rows' length
 * (plcmos's 1 x 4 windows over rows of 16: 494 rows of 4 outputs a plane). */
NATIVE_CLONES static void SFX(pool_flat)(const T *restrict x, T *restrict y, Py_ssize_t i0, Py_ssize_t i1,
                                         const window_geometry *g)
{
    const Py_ssize_t sw = g->sw, kw = g->kw, dw = g->dw;
    if (dw == 1 && kw == sw && sw == 2) {
        for (Py_ssize_t i = i0; i < i1; i++)
            y[i] = SFX(pmax)(x[2 * i], x[2 * i + 1]);
        return;
    }
    if (dw == 1 && kw == sw && sw == 4) {
        for (Py_ssize_t i = i0; i < i1; i++)
            y[i] = SFX(pmax)(SFX(pmax)(SFX(pmax)(x[4 * i], x[4 * i + 1]), x[4 * i + 2]), x[4 * i + 3]);
        return;
    }
    if (sw == 1) {
        for (Py_ssize_t i = i0; i < i1; i++)
            y[i] = x[i];
        for (Py_ssize_t kx = 1; kx < kw; kx++)
            SFX(pool_fold)(y + i0, x + i0 + kx * dw, i1 - i0, POOL_MAX);
        return;
    }
    for (Py_ssize_t i = i0; i < i1; i++) {
        T a = x[sw * i];
        for (Py_ssize_t kx = 1; kx < kw; kx++)
            a = SFX(pmax)(a, x[sw * i + kx * dw]);
        y[i] = a;
    }
}

static void SFX(pool_flat_task)(void *arg, Py_ssize_t t)
{
    pool_job *job = arg;
    const Py_ssize_t total = job->planes * job->g->oh * job->g->ow;
    const Py_ssize_t i0 = t * job->chunk, i1 = i0 + job->chunk < total ? i0 + job->chunk : total;
    SFX(pool_flat)((const T *)job->x, (T *)job->y, i0, i1, job->g);
}

/* ---- 2 x 2 windows of stride 2 ----------------------------------------------------
 * The most common MaxPool of audio and image networks, every window inside the
 * input: each output the larger of two column pairs of two input rows, one pass
 * over the rows with no buffer. */
NATIVE_CLONES static void SFX(pool_2x2)(const T *restrict x, T *restrict y, Py_ssize_t q0, Py_ssize_t q1,
                                        const window_geometry *g)
{
    const Py_ssize_t oh = g->oh, ow = g->ow, w = g->w, plane = g->h * w;
    Py_ssize_t j = q0 / oh, oy = q0 % oh;
    for (Py_ssize_t q = q0; q < q1; q++) {
        const T *restrict a = x + j * plane + 2 * oy * w, *restrict b = a + w;
        T *restrict d = y + q * ow;
        for (Py_ssize_t i = 0; i < ow; i++)
            d[i] = SFX(pmax)(SFX(pmax)(a[2 * i], a[2 * i + 1]), SFX(pmax)(b[2 * i], b[2 * i + 1]));
        if (++oy == oh) {
            oy = 0;
            j++;
        }
    }
}

static void SFX(pool_2x2_task)(void *arg, Py_ssize_t t)
{
    pool_job *job = arg;
    const Py_ssize_t total = job->planes * job->g->oh;
    const Py_ssize_t q0 = t * job->chunk, q1 = q0 + job->chunk < total ? q0 + job->chunk : total;
    SFX(pool_2x2)((const T *)job->x, (T *)job->y, q0, q1, job->g);
}
