/* QLinearConv's requantization of one row of its exact float32 accumulator, shared by
 * the im2col (conv.c) and direct (direct.c) convolutions. */
#ifndef ONNXRT_CPU_REQUANT_H
#define ONNXRT_CPU_REQUANT_H

#include <math.h>
#include <stdint.h>

/* dst[i] = saturate(rint((acc[i] + bias) * mult) + zp) into int8 (``y_signed``) or
 * uint8, as onnxruntime does and the numpy path: the sum and the product in float32
 * with the scale ratio formed in float32, rounded half to even. */
NATIVE_CLONES static void requantize_row(const float *restrict acc, Py_ssize_t n, float bias, float mult, float zp,
                                         int y_signed, void *dst)
{
    const float lo = y_signed ? -128.0f : 0.0f, hi = y_signed ? 127.0f : 255.0f;
    if (y_signed) {
        int8_t *restrict d = dst;
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = rintf((acc[i] + bias) * mult) + zp;
            v = v < lo ? lo : v;
            d[i] = (int8_t)(v > hi ? hi : v);
        }
    } else {
        uint8_t *restrict d = dst;
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = rintf((acc[i] + bias) * mult) + zp;
            v = v < lo ? lo : v;
            d[i] = (uint8_t)(v > hi ? hi : v);
        }
    }
}

#endif
