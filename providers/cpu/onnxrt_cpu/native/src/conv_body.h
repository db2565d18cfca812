/* The convolution kernels for one element type: included by conv.c once per type
 * with T, SFX(name), GEMM (the BLAS product of that type) and CONV_QUANT (1 where T
 * is float: the 8-bit QLinearConv goes through this type's product) defined. */

/* The first input value of group ``gi`` of image ``i`` (8-bit values for QLinearConv). */
static const void *SFX(x_group)(const conv_job *job, Py_ssize_t i, Py_ssize_t gi)
{
    const conv_geometry *g = job->g;
    size_t elem = job->quant ? 1 : sizeof(T);
    return (const char *)job->x + (size_t)((i * g->c + gi * (g->c / g->groups)) * g->h * g->w) * elem;
}

/* The im2col of :c:func:`im2col.h`, from the job's input type. */
static void SFX(gather)(const conv_job *job, const void *xg, Py_ssize_t p0, Py_ssize_t len, Py_ssize_t k0,
                        Py_ssize_t k1, T *cols, Py_ssize_t ld)
{
#if CONV_QUANT
    if (job->quant) {
        if (job->x_signed)
            im2col_s8(job->g, xg, p0, len, k0, k1, cols, ld, (float)job->xzp);
        else
            im2col_u8(job->g, xg, p0, len, k0, k1, cols, ld, (float)job->xzp);
        return;
    }
#endif
    SFX(im2col)(job->g, xg, p0, len, k0, k1, cols, ld, (T)0);
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
#if CONV_QUANT
    if (job->quant) {
        /* the exact accumulator into a tile, requantized into the 8-bit output */
        float *tile = (float *)scratch(2, (size_t)((r1 - r0) * len) * sizeof(float));
        if (!tile || GEMM(r1 - r0, len, job->k, (const T *)job->w + ch0 * job->k, job->k, b, ldb, tile, len) < 0)
            return -1;
        const float *bias = job->b;
        for (Py_ssize_t r = 0; r < r1 - r0; r++)
            requantize_row(tile + r * len, len, bias ? bias[ch0 + r] : 0.0f, job->mult[job->mult_n > 1 ? ch0 + r : 0],
                           (float)job->yzp, job->y_signed, (char *)job->y + (i * g->m + ch0 + r) * L + p0);
        return 0;
    }
#endif
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
    const void *xg = SFX(x_group)(job, i, gi);
    const T *b;
    Py_ssize_t ldb;
    (void)cg;
    if (job->pointwise) {
        b = (const T *)xg + p0;
        ldb = L;
    } else {
        T *cols = (T *)scratch(0, (size_t)(job->k * len) * sizeof(T));
        if (!cols) {
            job->failed = 1;
            return;
        }
        SFX(gather)(job, xg, p0, len, 0, job->k, cols, len);
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
    const Py_ssize_t L = g->oh * g->ow;
    Py_ssize_t k0 = t * job->krows, k1 = k0 + job->krows < job->k ? k0 + job->krows : job->k;
    SFX(gather)(job, SFX(x_group)(job, job->image, job->group), 0, L, k0, k1, (T *)job->shared + k0 * L, L);
}

/* A task of row mode: a block of output rows of the current image and group, all columns. */
static void SFX(conv_rows)(void *arg, Py_ssize_t t)
{
    conv_job *job = arg;
    const conv_geometry *g = job->g;
    const Py_ssize_t L = g->oh * g->ow, mg = g->m / g->groups;
    Py_ssize_t r0 = t * job->rows, r1 = r0 + job->rows < mg ? r0 + job->rows : mg;
    const T *b = job->pointwise ? (const T *)SFX(x_group)(job, job->image, job->group) : (const T *)job->shared;
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
