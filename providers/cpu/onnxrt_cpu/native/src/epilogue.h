/* Epilogues shared by the kernels, for one element type: included once per type with
 * T and SFX(name) defined (see depthwise.c). */

/* ``v < lo ? lo : v`` keeps NaN, as numpy's maximum and clip do. */
static inline T SFX(activate)(T v, int act, T lo, T hi)
{
    if (act == ACT_RELU)
        return v < 0 ? (T)0 : v;
    if (act == ACT_CLIP) {
        v = v < lo ? lo : v;
        return v > hi ? hi : v;
    }
    return v;
}

/* ``dst[i] = act(src[i] + bias + (z ? z[i] : 0))`` for i < len (dst may be src). */
NATIVE_CLONES static void SFX(finish_row)(T *dst, const T *src, Py_ssize_t len, T bias, const T *restrict z,
                                          int act, T lo, T hi)
{
    if (z) {
        for (Py_ssize_t i = 0; i < len; i++)
            dst[i] = src[i] + bias + z[i];
    } else {
        for (Py_ssize_t i = 0; i < len; i++)
            dst[i] = src[i] + bias;
    }
    if (act == ACT_RELU) {
        for (Py_ssize_t i = 0; i < len; i++)
            dst[i] = dst[i] < 0 ? (T)0 : dst[i];
    } else if (act == ACT_CLIP) {
        for (Py_ssize_t i = 0; i < len; i++) {
            T v = dst[i] < lo ? lo : dst[i];
            dst[i] = v > hi ? hi : v;
        }
    }
}
