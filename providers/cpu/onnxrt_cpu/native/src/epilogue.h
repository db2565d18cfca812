/* Epilogues shared by the kernels, for one element type: included once per type with
 * T and SFX(name) defined (see depthwise.c).
 *
 * The fused activations (``act``) beyond native.h's Relu and Clip, with their two
 * parameters in ``lo`` and ``hi``: LeakyRelu (alpha in lo), HardSigmoid
 * (max(0, min(1, alpha x + beta)), alpha and beta in lo and hi) and HardSwish (x times
 * HardSigmoid with the alpha and beta in lo and hi, 1/6 and 1/2 for ONNX's), and
 * HardSwish as PaddlePaddle's exports spell it, ``x * clip(x + lo, 0, hi) / hi``
 * (offset 3, threshold 6), in that order, so that the fused result is the unfused
 * graph's bit for bit; Sigmoid, and x * sigmoid(alpha x) (SiLU, QuickGelu; alpha in
 * lo) as x / (1 + exp(-alpha x)), float32 through vmath.h's exp as the compiled
 * elementwise kernels compute them. Applied
 * on each tile while it is in cache, where numpy's activation after the kernel is one
 * more pass over the whole output, with temporaries (LeakyRelu on 64 x 498 x 64: about
 * 3 ms). */
#ifndef ONNXRT_EPILOGUE_ACTS
#define ONNXRT_EPILOGUE_ACTS
#include "vmath.h"
enum {
    ACT_LEAKY = 3,
    ACT_HARD_SIGMOID = 4,
    ACT_HARD_SWISH = 5,
    ACT_HARD_SWISH_DIV = 6,
    ACT_SIGMOID = 7,
    ACT_SWISH = 8,
    ACT_LAST = ACT_SWISH
};
#endif

/* exp in T: vmath.h's for float32 (the compiled elementwise kernels' own), libm's
 * for float64. */
static inline T SFX(act_exp)(T x)
{
    return sizeof(T) == sizeof(float) ? (T)exp_f32((float)x) : (T)exp((double)x);
}

/* ``v < lo ? lo : v`` keeps NaN, as numpy's maximum and clip do; so do the
 * comparisons of the others (NaN >= 0 is false: LeakyRelu gives NaN * alpha). */
static inline T SFX(activate)(T v, int act, T lo, T hi)
{
    if (act == ACT_RELU)
        return v < 0 ? (T)0 : v;
    if (act == ACT_CLIP) {
        v = v < lo ? lo : v;
        return v > hi ? hi : v;
    }
    if (act == ACT_LEAKY)
        return v >= 0 ? v : v * lo;
    if (act == ACT_HARD_SIGMOID || act == ACT_HARD_SWISH) {
        T s = v * lo + hi;
        s = s < 0 ? (T)0 : s;
        s = s > 1 ? (T)1 : s;
        return act == ACT_HARD_SWISH ? v * s : s;
    }
    if (act == ACT_HARD_SWISH_DIV) {
        T s = v + lo;
        s = s < 0 ? (T)0 : s;
        s = s > hi ? hi : s;
        return v * s / hi;
    }
    if (act == ACT_SIGMOID)
        return (T)1 / ((T)1 + SFX(act_exp)(-v));
    if (act == ACT_SWISH)
        return v / ((T)1 + SFX(act_exp)(-lo * v));
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
    } else if (act == ACT_LEAKY) {
        for (Py_ssize_t i = 0; i < len; i++)
            dst[i] = dst[i] >= 0 ? dst[i] : dst[i] * lo;
    } else if (act == ACT_HARD_SIGMOID) {
        for (Py_ssize_t i = 0; i < len; i++) {
            T s = dst[i] * lo + hi;
            s = s < 0 ? (T)0 : s;
            dst[i] = s > 1 ? (T)1 : s;
        }
    } else if (act == ACT_HARD_SWISH) {
        for (Py_ssize_t i = 0; i < len; i++) {
            T v = dst[i], s = v * lo + hi;
            s = s < 0 ? (T)0 : s;
            s = s > 1 ? (T)1 : s;
            dst[i] = v * s;
        }
    } else if (act == ACT_HARD_SWISH_DIV) {
        for (Py_ssize_t i = 0; i < len; i++) {
            T v = dst[i], s = v + lo;
            s = s < 0 ? (T)0 : s;
            s = s > hi ? hi : s;
            dst[i] = v * s / hi;
        }
    } else if (act == ACT_SIGMOID) {
        for (Py_ssize_t i = 0; i < len; i++)
            dst[i] = (T)1 / ((T)1 + SFX(act_exp)(-dst[i]));
    } else if (act == ACT_SWISH) {
        for (Py_ssize_t i = 0; i < len; i++)
            dst[i] = dst[i] / ((T)1 + SFX(act_exp)(-lo * dst[i]));
    }
}
