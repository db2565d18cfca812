/* The depthwise kernels for one element type: included by depthwise.c once per type
 * with T (the element type) and SFX(name) (the name with the type's suffix) defined. */

/* A vector of 64 bytes (an AVX-512 register, two AVX2 ones or four SSE ones, by
 * GCC's vector extensions); the loads need no alignment. */
typedef T SFX(vec) __attribute__((vector_size(64), aligned(sizeof(T))));
#define LANES ((Py_ssize_t)(64 / sizeof(T)))

/* The flat path's product on the phases: ``out[p] = bias + sum_t wk[t] * phases[offs[t]
 * + p]`` for p < span, four vectors at a time. */
NATIVE_CLONES static void SFX(dw_plane)(const T *restrict phases, const Py_ssize_t *restrict offs,
                                        const T *restrict wk, Py_ssize_t taps, T bias, T *restrict out,
                                        Py_ssize_t span)
{
    for (Py_ssize_t p = 0; p < span; p += 4 * LANES) {
        SFX(vec) a0, a1, a2, a3;
        for (Py_ssize_t v = 0; v < LANES; v++)
            a0[v] = bias;
        a1 = a0;
        a2 = a0;
        a3 = a0;
        for (Py_ssize_t t = 0; t < taps; t++) {
            const SFX(vec) *s = (const SFX(vec) *)(phases + offs[t] + p);
            const T wt = wk[t];
            a0 += wt * s[0];
            a1 += wt * s[1];
            a2 += wt * s[2];
            a3 += wt * s[3];
        }
        SFX(vec) *o = (SFX(vec) *)(out + p);
        o[0] = a0;
        o[1] = a1;
        o[2] = a2;
        o[3] = a3;
    }
}

/* Rows of the flat product, on the phase pitch, cropped into the output with the
 * activation. */
static void SFX(dw_crop)(const T *src, T *dst, Py_ssize_t oh, Py_ssize_t ow, Py_ssize_t pq, int act, T lo, T hi)
{
    for (Py_ssize_t r = 0; r < oh; r++)
        SFX(finish_row)(dst + r * ow, src + r * pq, ow, (T)0, NULL, act, lo, hi);
}

/* The flat path over planes j0 <= j < j1: fill the phases, product, crop. */
static int SFX(dw_flat)(const window_geometry *g, const T *x, const T *w, const T *b, T *y, Py_ssize_t j0,
                        Py_ssize_t j1, int act, T lo, T hi)
{
    phase_layout l;
    phase_layout_of(g, &l);
    Py_ssize_t nph = g->sh * g->sw, taps = g->kh * g->kw;
    size_t elems = (size_t)(nph * l.plane + l.span + PHASE_SLACK), bytes = (elems * sizeof(T) + 63) & ~(size_t)63;
    T *scratch_ = (T *)scratch(0, bytes + (size_t)taps * sizeof(Py_ssize_t));
    if (!scratch_)
        return -1;
    /* the padding, once: the planes write the same inner parts of the phases */
    memset(scratch_, 0, elems * sizeof(T));
    T *out = scratch_ + nph * l.plane;
    Py_ssize_t *offs = (Py_ssize_t *)((char *)scratch_ + bytes);
    for (Py_ssize_t ky = 0; ky < g->kh; ky++)
        for (Py_ssize_t kx = 0; kx < g->kw; kx++)
            offs[ky * g->kw + kx] = phase_offset(g, &l, ky, kx);
    Py_ssize_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    for (Py_ssize_t j = j0; j < j1; j++) {
        Py_ssize_t ch = j % g->c;
        SFX(phase_fill)(g, &l, x + j * in_plane, scratch_);
        SFX(dw_plane)(scratch_, offs, w + ch * taps, taps, b ? b[ch] : (T)0, out, l.span);
        SFX(dw_crop)(out, y + j * out_plane, g->oh, g->ow, l.pq, act, lo, hi);
    }
    return 0;
}

/* The channels-last path's product for one block of LANES channels: ``pad`` [hp, wp,
 * LANES] (the block's padded map, channels innermost), ``wt`` [taps, LANES], ``bias_``
 * [LANES], ``out`` [oh, ow, LANES]. Four output positions at a time: independent
 * accumulators. */
NATIVE_CLONES static void SFX(dw_lanes)(const window_geometry *g, Py_ssize_t wp, const SFX(vec) *restrict pad,
                                        const SFX(vec) *restrict wt, const SFX(vec) *restrict bias_,
                                        SFX(vec) *restrict out)
{
    /* vectors cross into a cloned function by pointer only: by value, the baseline
     * caller and an AVX-512 clone would pass them differently */
    const SFX(vec) bias = *bias_;
    const Py_ssize_t kh = g->kh, kw = g->kw, sw = g->sw, ow = g->ow;
    for (Py_ssize_t oy = 0; oy < g->oh; oy++) {
        const SFX(vec) *restrict top = pad + oy * g->sh * wp;
        SFX(vec) *restrict o = out + oy * ow;
        Py_ssize_t ox = 0;
        for (; ox + 4 <= ow; ox += 4) {
            SFX(vec) a0 = bias, a1 = bias, a2 = bias, a3 = bias;
            for (Py_ssize_t ky = 0; ky < kh; ky++) {
                const SFX(vec) *restrict r = top + ky * g->dh * wp + ox * sw;
                for (Py_ssize_t kx = 0; kx < kw; kx++) {
                    SFX(vec) k = wt[ky * kw + kx];
                    const SFX(vec) *restrict s = r + kx * g->dw;
                    a0 += k * s[0];
                    a1 += k * s[sw];
                    a2 += k * s[2 * sw];
                    a3 += k * s[3 * sw];
                }
            }
            o[ox] = a0;
            o[ox + 1] = a1;
            o[ox + 2] = a2;
            o[ox + 3] = a3;
        }
        for (; ox < ow; ox++) {
            SFX(vec) a0 = bias;
            for (Py_ssize_t ky = 0; ky < kh; ky++) {
                const SFX(vec) *restrict r = top + ky * g->dh * wp + ox * sw;
                for (Py_ssize_t kx = 0; kx < kw; kx++)
                    a0 += wt[ky * kw + kx] * r[kx * g->dw];
            }
            o[ox] = a0;
        }
    }
}

/* The channels-last path over planes j0 <= j < j1, a block of up to LANES channels of
 * one image at a time: transpose the block into its padded map, product, transpose
 * back with the activation. For small maps, where the flat path's per-plane work
 * (rows of a few values, a partly wasted block) costs more than the transposes. */
static int SFX(dw_channels_last)(const window_geometry *g, const T *x, const T *w, const T *b, T *y,
                                 Py_ssize_t j0, Py_ssize_t j1, int act, T lo, T hi)
{
    const Py_ssize_t hp = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1;
    const Py_ssize_t wp = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1;
    const Py_ssize_t taps = g->kh * g->kw, in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    const Py_ssize_t r_hi = g->pt + g->h < hp ? g->h : hp - g->pt;
    const Py_ssize_t c_hi = g->pl + g->w < wp ? g->w : wp - g->pl;
    SFX(vec) *pad = (SFX(vec) *)scratch(0, (size_t)(hp * wp + out_plane + taps) * 64);
    if (!pad)
        return -1;
    memset(pad, 0, (size_t)(hp * wp) * 64);
    SFX(vec) *out = pad + hp * wp, *wt = out + out_plane;
    for (Py_ssize_t j = j0; j < j1;) {
        Py_ssize_t ch = j % g->c, count = LANES;
        if (count > g->c - ch)
            count = g->c - ch;
        if (count > j1 - j)
            count = j1 - j;
        SFX(vec) bias;
        for (Py_ssize_t k = 0; k < LANES; k++)
            bias[k] = (b && k < count) ? b[ch + k] : (T)0;
        for (Py_ssize_t t = 0; t < taps; t++)
            for (Py_ssize_t k = 0; k < LANES; k++)
                wt[t][k] = k < count ? w[(ch + k) * taps + t] : (T)0;
        /* lanes past count keep whatever the last full block left: their weights are
         * zero and their results are not written back */
        for (Py_ssize_t k = 0; k < count; k++) {
            const T *restrict src = x + (j + k) * in_plane;
            for (Py_ssize_t r = 0; r < r_hi; r++) {
                SFX(vec) *restrict d = pad + (r + g->pt) * wp + g->pl;
                const T *restrict s = src + r * g->w;
                for (Py_ssize_t i = 0; i < c_hi; i++)
                    d[i][k] = s[i];
            }
        }
        SFX(dw_lanes)(g, wp, pad, wt, &bias, out);
        for (Py_ssize_t k = 0; k < count; k++) {
            T *restrict dst = y + (j + k) * out_plane;
            for (Py_ssize_t p = 0; p < out_plane; p++)
                dst[p] = SFX(activate)(out[p][k], act, lo, hi);
        }
        j += count;
    }
    return 0;
}

#undef LANES
