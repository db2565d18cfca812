/* The stride phases of a padded plane, for one element type: included once per type
 * with T and SFX(name) defined.
 *
 * A window's taps over a padded plane read, for stride s, every s-th value; split
 * into its s_h x s_w phases (``x[py::sh, px::sw]``), every tap reads one contiguous
 * run of one phase instead, at a fixed offset (phase_offset). A kernel computes its
 * output on the phases' row pitch in long contiguous passes, then crops it to the
 * output width (the depthwise convolution and the pools do). */

/* Write plane ``src`` [h, w] into the phases ``phases`` (``nph`` of ``l->plane``
 * elements); the padding is not written, so it keeps what the caller filled it with
 * once (zeros, or a reduction's identity). The copies are loops, not memcpy: most rows
 * are a few dozen values, shorter than a call costs. */
NATIVE_CLONES static void SFX(phase_fill)(const window_geometry *g, const phase_layout *l, const T *restrict src,
                                       T *restrict phases)
{
    const Py_ssize_t sh = g->sh, sw = g->sw, pl = g->pl;
    const Py_ssize_t c_lo = pl, c_hi = pl + g->w < l->wn ? pl + g->w : l->wn;
    const Py_ssize_t r_lo = g->pt, r_hi = g->pt + g->h < l->hn ? g->pt + g->h : l->hn;
    const Py_ssize_t len = c_hi - c_lo;
    if (len <= 0)
        return;
    for (Py_ssize_t r = r_lo; r < r_hi; r++) {
        const T *restrict row = src + (r - g->pt) * g->w;
        T *restrict base = phases + (r % sh) * sw * l->plane + (r / sh) * l->pq;
        if (sw == 1) {
            T *restrict d = base + c_lo;
            for (Py_ssize_t k = 0; k < len; k++)
                d[k] = row[k];
        } else if (sw == 2) {
            /* both column phases in one pass: a loop GCC vectorizes with permutes */
            Py_ssize_t pairs = len / 2;
            T *restrict de = base + (c_lo & 1) * l->plane + c_lo / 2;
            T *restrict dd = base + (1 - (c_lo & 1)) * l->plane + c_lo / 2 + (c_lo & 1);
            for (Py_ssize_t k = 0; k < pairs; k++) {
                de[k] = row[2 * k];
                dd[k] = row[2 * k + 1];
            }
            if (len & 1)
                de[pairs] = row[2 * pairs];
        } else {
            for (Py_ssize_t px = 0; px < sw; px++) {
                Py_ssize_t c0 = c_lo + ((px - c_lo) % sw + sw) % sw;
                const T *restrict r0 = row + (c0 - pl);
                T *restrict d0 = base + px * l->plane + c0 / sw;
                for (Py_ssize_t k = 0, cnt = c0 < c_hi ? (c_hi - c0 + sw - 1) / sw : 0; k < cnt; k++)
                    d0[k] = r0[k * sw];
            }
        }
    }
}

