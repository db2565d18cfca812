/* The convolution kernels for one element type: included by conv.c once per type
 * with T, SFX(name) and GEMM (the BLAS product of that type) defined. */

/* Rows k0 <= k < k1 of the im2col of output positions p0 <= p < p0 + len of one
 * group's input ``xg`` [cg, h, w] into ``cols`` (row k at ``cols + (k - k0) * ld``);
 * taps in the padding read zero. */
NATIVE_CLONES static void SFX(im2col)(const conv_geometry *g, const T *restrict xg, Py_ssize_t p0, Py_ssize_t len,
                                      Py_ssize_t k0, Py_ssize_t k1, T *restrict cols, Py_ssize_t ld)
{
    const Py_ssize_t taps = g->kh * g->kw, sw = g->sw, w = g->w;
    for (Py_ssize_t k = k0; k < k1; k++) {
        Py_ssize_t ci = k / taps, r = k % taps, ky = r / g->kw, kx = r % g->kw;
        const T *plane = xg + ci * g->h * w;
        T *restrict d = cols + (k - k0) * ld;
        Py_ssize_t oy = p0 / g->ow, ox = p0 % g->ow, left = len;
        while (left > 0) {
            Py_ssize_t n = g->ow - ox < left ? g->ow - ox : left;
            Py_ssize_t iy = oy * g->sh - g->pt + ky * g->dh;
            if (iy < 0 || iy >= g->h) {
                for (Py_ssize_t j = 0; j < n; j++)
                    d[j] = 0;
            } else {
                const T *restrict row = plane + iy * w;
                Py_ssize_t ix0 = ox * sw - g->pl + kx * g->dw;
                Py_ssize_t ja = ix0 >= 0 ? 0 : (-ix0 + sw - 1) / sw;
                Py_ssize_t jb = ix0 >= w ? 0 : (w - 1 - ix0) / sw + 1;
                if (ja > n)
                    ja = n;
                if (jb > n)
                    jb = n;
                if (jb < ja)
                    jb = ja;
                for (Py_ssize_t j = 0; j < ja; j++)
                    d[j] = 0;
                if (sw == 1) {
                    const T *restrict s = row + ix0;
                    for (Py_ssize_t j = ja; j < jb; j++)
                        d[j] = s[j];
                } else if (sw == 2) {
                    const T *restrict s = row + ix0;
                    for (Py_ssize_t j = ja; j < jb; j++)
                        d[j] = s[2 * j];
                } else {
                    for (Py_ssize_t j = ja; j < jb; j++)
                        d[j] = row[ix0 + j * sw];
                }
                for (Py_ssize_t j = jb; j < n; j++)
                    d[j] = 0;
            }
            d += n;
            left -= n;
            ox = 0;
            oy++;
        }
    }
}

/* Rows r0 <= r < r1 of group ``gi``'s output of image ``i``, columns p0 <= p < p0 +
 * len: the product of the weight rows with ``b`` (``ldb`` apart), then the bias, the
 * residual and the activation on the tile while it is in cache. */
static int SFX(conv_tile)(const conv_job *job, Py_ssize_t i, Py_ssize_t gi, Py_ssize_t r0, Py_ssize_t r1,
                          Py_ssize_t p0, Py_ssize_t len, const T *b, Py_ssize_t ldb)
{
    const conv_geometry *g = job->g;
    const Py_ssize_t mg = g->m / g->groups, L = g->oh * g->ow;
    const Py_ssize_t ch0 = gi * mg + r0;
    T *y = (T *)job->y + (i * g->m + ch0) * L + p0;
    if (GEMM(r1 - r0, len, job->k, (const T *)job->w + ch0 * job->k, job->k, b, ldb, y, L) < 0)
        return -1;
    const T *bias = job->b, *z = job->z;
    if (!bias && !z && job->act == ACT_NONE)
        return 0;
    for (Py_ssize_t r = 0; r < r1 - r0; r++)
        SFX(finish_row)(y + r * L, y + r * L, len, bias ? bias[ch0 + r] : (T)0,
                        z ? z + (i * g->m + ch0 + r) * L + p0 : NULL, job->act, (T)job->lo, (T)job->hi);
    return 0;
}

/* A task of column mode: image, group and column chunk, every row of the group. */
static void SFX(conv_columns)(void *arg, Py_ssize_t t)
{
    conv_job *job = arg;
    const conv_geometry *g = job->g;
    const Py_ssize_t L = g->oh * g->ow, cg = g->c / g->groups, mg = g->m / g->groups;
    Py_ssize_t chunk = t % job->chunks, rest = t / job->chunks, gi = rest % g->groups, i = rest / g->groups;
    Py_ssize_t p0 = chunk * job->cols, len = p0 + job->cols < L ? job->cols : L - p0;
    const T *xg = (const T *)job->x + (i * g->c + gi * cg) * g->h * g->w;
    const T *b;
    Py_ssize_t ldb;
    if (job->pointwise) {
        b = xg + p0;
        ldb = L;
    } else {
        T *cols = (T *)scratch(0, (size_t)(job->k * len) * sizeof(T));
        if (!cols) {
            job->failed = 1;
            return;
        }
        SFX(im2col)(g, xg, p0, len, 0, job->k, cols, len);
        b = cols;
        ldb = len;
    }
    if (SFX(conv_tile)(job, i, gi, 0, mg, p0, len, b, ldb) < 0)
        job->failed = 1;
}

/* A task of row mode's im2col: rows of the shared columns of the current image and group. */
static void SFX(conv_gather)(void *arg, Py_ssize_t t)
{
    conv_job *job = arg;
    const conv_geometry *g = job->g;
    const Py_ssize_t L = g->oh * g->ow, cg = g->c / g->groups;
    Py_ssize_t k0 = t * job->krows, k1 = k0 + job->krows < job->k ? k0 + job->krows : job->k;
    const T *xg = (const T *)job->x + (job->image * g->c + job->group * cg) * g->h * g->w;
    SFX(im2col)(g, xg, 0, L, k0, k1, (T *)job->shared + k0 * L, L);
}

/* A task of row mode: a block of output rows of the current image and group, all columns. */
static void SFX(conv_rows)(void *arg, Py_ssize_t t)
{
    conv_job *job = arg;
    const conv_geometry *g = job->g;
    const Py_ssize_t L = g->oh * g->ow, cg = g->c / g->groups, mg = g->m / g->groups;
    Py_ssize_t r0 = t * job->rows, r1 = r0 + job->rows < mg ? r0 + job->rows : mg;
    const T *b = job->pointwise ? (const T *)job->x + (job->image * g->c + job->group * cg) * g->h * g->w
                                : (const T *)job->shared;
    if (SFX(conv_tile)(job, job->image, job->group, r0, r1, 0, L, b, L) < 0)
        job->failed = 1;
}

static void SFX(conv_run)(conv_job *job, int threads)
{
    const conv_geometry *g = job->g;
    if (job->mode == MODE_COLUMNS) {
        pool_run(SFX(conv_columns), job, g->n * g->groups * job->chunks, threads);
        return;
    }
    const Py_ssize_t L = g->oh * g->ow, mg = g->m / g->groups;
    for (job->image = 0; job->image < g->n; job->image++)
        for (job->group = 0; job->group < g->groups; job->group++) {
            if (!job->pointwise)
                pool_run(SFX(conv_gather), job, (job->k + job->krows - 1) / job->krows, threads);
            pool_run(SFX(conv_rows), job, (mg + job->rows - 1) / job->rows, threads);
            (void)L;
        }
}
