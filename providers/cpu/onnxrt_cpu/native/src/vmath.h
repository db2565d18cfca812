/* Branch-free single-precision functions that GCC vectorizes inside the loops of each
 * NATIVE_CLONES clone: Cephes' exp (a degree-6 polynomial on the reduced argument,
 * within 1-2 ulp). */
#ifndef ONNXRT_CPU_VMATH_H
#define ONNXRT_CPU_VMATH_H

#include <stdint.h>
#include <string.h>

static inline float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* exp(x) for float32: inf past 88.72, zero (through the subnormals) below -103.97,
 * NaN for NaN. 2^n is applied as two factors so that n from -150 to 128 needs no
 * special case. */
static inline float exp_f32(float x)
{
    const float lo = -104.0f, hi = 89.0f;
    float xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    /* n = rint(x / ln 2) by the 1.5 * 2^23 trick: no rounding instruction needed */
    const float shifter = 12582912.0f;
    float fn = (xc * 1.44269504088896341f + shifter) - shifter;
    float r = xc - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    int32_t n = (int32_t)fn;
    int32_t n1 = n / 2, n2 = n - n1;
    float s1 = bits_to_float((uint32_t)(n1 + 127) << 23), s2 = bits_to_float((uint32_t)(n2 + 127) << 23);
    float e = p * s1 * s2;
    return x != x ? x : e;
}

#endif
