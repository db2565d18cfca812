/* im2col for one source and destination type: included by conv.c with IM_SRC,
 * IM_DST, IM_NAME and IM_LOAD(v) (the conversion of one value, which may use ``zp``)
 * defined; the float paths copy, the 8-bit ones centre on the input's zero point. */

/* Rows k0 <= k < k1 of the im2col of output positions p0 <= p < p0 + len of one
 * group's input ``xg`` [cg, h, w] into ``cols`` (row k at ``cols + (k - k0) * ld``),
 * each value ``IM_LOAD(v)``; taps in the padding read zero. */
NATIVE_CLONES static void IM_NAME(const conv_geometry *g, const IM_SRC *restrict xg, Py_ssize_t p0,
                                  Py_ssize_t len, Py_ssize_t k0, Py_ssize_t k1, IM_DST *restrict cols, Py_ssize_t ld,
                                  IM_DST zp)
{
    const Py_ssize_t taps = g->kh * g->kw, sw = g->sw, w = g->w;
    for (Py_ssize_t k = k0; k < k1; k++) {
        Py_ssize_t ci = k / taps, r = k % taps, ky = r / g->kw, kx = r % g->kw;
        const IM_SRC *plane = xg + ci * g->h * w;
        IM_DST *restrict d = cols + (k - k0) * ld;
        Py_ssize_t oy = p0 / g->ow, ox = p0 % g->ow, left = len;
        while (left > 0) {
            Py_ssize_t n = g->ow - ox < left ? g->ow - ox : left;
            Py_ssize_t iy = oy * g->sh - g->pt + ky * g->dh;
            if (iy < 0 || iy >= g->h) {
                for (Py_ssize_t j = 0; j < n; j++)
                    d[j] = 0;
            } else {
                const IM_SRC *restrict row = plane + iy * w;
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
                    const IM_SRC *restrict s = row + ix0;
                    for (Py_ssize_t j = ja; j < jb; j++)
                        d[j] = IM_LOAD(s[j]);
                } else if (sw == 2) {
                    const IM_SRC *restrict s = row + ix0;
                    for (Py_ssize_t j = ja; j < jb; j++)
                        d[j] = IM_LOAD(s[2 * j]);
                } else {
                    for (Py_ssize_t j = ja; j < jb; j++)
                        d[j] = IM_LOAD(row[ix0 + j * sw]);
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


#undef IM_SRC
#undef IM_DST
#undef IM_NAME
#undef IM_LOAD
