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
