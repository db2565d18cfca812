/* numpy's own AVX2/AVX-512 float32 exp and tanh, ported to C so that a compiled loop
 * gives numpy's results bit for bit (the DynamicQuantizeLSTM and recurrent-layer time
 * loops, qlstm.c and rnn.c). Included by each after it turns off the contraction of
 * products and sums into fused multiply-adds (the fused ones numpy computes are
 * written as fmaf). */
#ifndef ONNXRT_CPU_NPYMATH_H
#define ONNXRT_CPU_NPYMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define NPY_INLINE static inline __attribute__((always_inline))

/* Which clone of NATIVE_CLONES this CPU runs: 4 (x86-64-v4), 3 (x86-64-v3), else 0
 * (numpy's algorithms above are those of its AVX2 and AVX-512 loops; on a CPU without
 * them the loops take the C library's functions, as numpy's scalar loops do). */
static int npy_clone_level(void)
{
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 12
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") ? 4 : __builtin_cpu_supports("x86-64-v3") ? 3 : 0;
#else
    return 0;
#endif
}

NPY_INLINE uint32_t npy_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

NPY_INLINE float npy_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* numpy's AVX2/AVX-512 float32 exp (``simd_exp_FLOAT`` in
 * numpy/_core/src/umath/loops_exponent_log.dispatch.c.src): Cody-Waite reduction by
 * k ln 2, a rational minimax approximation P5 / Q2 on the remainder, the exponent
 * added; at most 2.52 ulp from exp. Above xmax infinity, below xmin zero, NaN NaN. The
 * scaling by 2^k is exact or, for results below the normal range, one correctly
 * rounded product (numpy's AVX2 division by a power of two, AVX-512's scalef). */
NPY_INLINE float npy_exp(float x)
{
    const int nan = x != x, over = x >= 88.72283935546875f, under = x <= -103.97208404541015625f;
    const float v = (nan | over | under) ? 0.0f : x;
    const float magic = 0x1.800000p+23f;
    float quad = v * 1.442695040888963407359924681001892137f;
    quad = quad + magic; /* round to nearest */
    quad = quad - magic;
    float r = fmaf(quad, -6.93145752e-1f, v);
    r = fmaf(quad, -1.42860677e-6f, r);
    r = fmaf(quad, 0.0f, r);
    float num = fmaf(5.082762527590693718096e-04f, r, 6.757896990527504603057e-03f);
    num = fmaf(num, r, 5.114512081637298353406e-02f);
    num = fmaf(num, r, 2.473615434895520810817e-01f);
    num = fmaf(num, r, 7.257664613233124478488e-01f);
    num = fmaf(num, r, 9.999999999980870924916e-01f);
    float den = fmaf(2.159509375685829852307e-02f, r, -2.742335390411667452936e-01f);
    den = fmaf(den, r, 1.0f);
    const float poly = num / den;
    const int32_t k = (int32_t)quad, ka = k > -125 ? k : -125;
    float e = npy_float(npy_bits(poly) + ((uint32_t)ka << 23)) * npy_float((uint32_t)(127 + k - ka) << 23);
    e = nan ? NAN : e;
    e = over ? INFINITY : e;
    return under ? 0.0f : e;
}

/* numpy's float32 tanh where it has fused multiply-adds (``simd_tanh_f32`` in
 * numpy/_core/src/umath/loops_hyperbolic.dispatch.cpp.src, from Intel's SVML): 32
 * intervals of |x|, on each a polynomial of degree 6 in |x| - b. Rows b, c0 .. c6. */
static const uint32_t npy_tanh_lut[8][32] = {
    {0x0,        0x3d700000, 0x3d900000, 0x3db00000, 0x3dd00000, 0x3df00000, 0x3e100000, 0x3e300000,
     0x3e500000, 0x3e700000, 0x3e900000, 0x3eb00000, 0x3ed00000, 0x3ef00000, 0x3f100000, 0x3f300000,
     0x3f500000, 0x3f700000, 0x3f900000, 0x3fb00000, 0x3fd00000, 0x3ff00000, 0x40100000, 0x40300000,
     0x40500000, 0x40700000, 0x40900000, 0x40b00000, 0x40d00000, 0x40f00000, 0x41100000, 0x0},
    {0x0,        0x3d6fb9c9, 0x3d8fc35f, 0x3daf9169, 0x3dcf49ab, 0x3deee849, 0x3e0f0ee8, 0x3e2e4984,
     0x3e4d2f8e, 0x3e6bb32e, 0x3e8c51cd, 0x3ea96163, 0x3ec543f1, 0x3edfd735, 0x3f028438, 0x3f18abf0,
     0x3f2bc480, 0x3f3bec1c, 0x3f4f2e5b, 0x3f613c53, 0x3f6ce37d, 0x3f743c4f, 0x3f7a5feb, 0x3f7dea85,
     0x3f7f3b3d, 0x3f7fb78c, 0x3f7fefd4, 0x3f7ffdd0, 0x3f7fffb4, 0x3f7ffff6, 0x3f7fffff, 0x3f800000},
    {0x3f800000, 0x3f7f1f84, 0x3f7ebd11, 0x3f7e1e5f, 0x3f7d609f, 0x3f7c842d, 0x3f7b00e5, 0x3f789580,
     0x3f75b8ad, 0x3f726fd9, 0x3f6cc59b, 0x3f63fb92, 0x3f59ff97, 0x3f4f11d7, 0x3f3d7573, 0x3f24f360,
     0x3f0cbfe7, 0x3eec1a69, 0x3eb0a801, 0x3e6753a2, 0x3e132f1a, 0x3db7e7d3, 0x3d320845, 0x3c84d3d4,
     0x3bc477b7, 0x3b10d3da, 0x3a01601e, 0x388c1a3b, 0x3717b0da, 0x35a43bce, 0x338306c6, 0x0},
    {0xb0343c7b, 0xbd6ee69d, 0xbd8f0da7, 0xbdae477d, 0xbdcd2a1f, 0xbdeba80d, 0xbe0c443b, 0xbe293cf3,
     0xbe44f282, 0xbe5f3651, 0xbe81c7c0, 0xbe96d7ca, 0xbea7fb8e, 0xbeb50e9e, 0xbec12efe, 0xbec4be92,
     0xbebce070, 0xbead510e, 0xbe8ef7d6, 0xbe4b8704, 0xbe083237, 0xbdaf7449, 0xbd2e1ec4, 0xbc83bf06,
     0xbbc3e0b5, 0xbb10aadc, 0xba0157db, 0xb88c18f2, 0xb717b096, 0xb5a43bae, 0xb383012c, 0x0},
    {0xbeaaaaa5, 0xbeab0612, 0xbea7f01f, 0xbea4e120, 0xbea387b7, 0xbea15962, 0xbe9d57f7, 0xbe976b5a,
     0xbe90230d, 0xbe880dff, 0xbe7479b3, 0xbe4c3d88, 0xbe212482, 0xbdeb8cba, 0xbd5e78ad, 0x3c6b5e6e,
     0x3d839143, 0x3dc21ee1, 0x3de347af, 0x3dcbec96, 0x3d99ef2d, 0x3d542ea1, 0x3cdde701, 0x3c2cca67,
     0x3b81cb27, 0x3ac073a1, 0x39ac3032, 0x383a94d9, 0x36ca081d, 0x355abd4c, 0x332b3cb6, 0x0},
    {0xb76dd6b9, 0xbe1c276d, 0x3c1dcf2f, 0x3dc1a78d, 0x3d96f985, 0x3da2b61b, 0x3dc13397, 0x3dd2f670,
     0x3df48a0a, 0x3e06c5a8, 0x3e1a3aba, 0x3e27c405, 0x3e2e78d0, 0x3e2c3e44, 0x3e1d3097, 0x3df4a8f4,
     0x3da38508, 0x3d31416a, 0x3b562657, 0xbcaeeac9, 0xbcce9419, 0xbcaaeac4, 0xbc49e7d0, 0xbba71ddd,
     0xbb003b0e, 0xba3f9a05, 0xb92c08a7, 0xb7ba9232, 0xb64a0b0f, 0xb4dac169, 0xb2ab78ac, 0x0},
    {0x3e0910e9, 0x43761143, 0x4165ecdc, 0xc190f756, 0xc08c097d, 0xc02ba813, 0xbf7f6bda, 0x3f2b1dc0,
     0x3ece105d, 0x3f426a94, 0xbadb0dc4, 0x3da43b17, 0xbd51ab88, 0xbcaea23d, 0xbd3b6d8d, 0xbd6caaad,
     0xbd795bed, 0xbd5fddda, 0xbd038f3b, 0xbc1cad63, 0x3abb4766, 0x3b95f10b, 0x3b825873, 0x3afaea66,
     0x3a49f878, 0x39996bf3, 0x388f3e6c, 0x371bb0e3, 0x35a8a5e6, 0x34369b17, 0x322487b0, 0x0},
    {0xbc0e2f66, 0x460bda12, 0x43d638ef, 0xc3e11c3e, 0xc2baa4e9, 0xc249da2d, 0xc1859b82, 0x40dd5b57,
     0x40494640, 0x40c730a8, 0xbf0f160e, 0x3e30e76f, 0xbea81387, 0xbdb26a1c, 0xbd351e57, 0xbb4c01a0,
     0x3c1d7bfb, 0x3c722cd1, 0x3c973f1c, 0x3c33a31b, 0x3b862ef4, 0x3a27b3d0, 0xba3b5907, 0xba0efc22,
     0xb97f9f0f, 0xb8c8af50, 0xb7bdddfb, 0xb64f2950, 0xb4e085b1, 0xb3731dfa, 0xb15a1f04, 0x0},
};

/* The column of x's interval in the table (from its exponent and two leading
 * mantissa bits): 0 below |x| = 0.0546875, then a quarter binade each, 31 from 10 on
 * (where tanh rounds to 1: its coefficients are 1, 0, ...). */
NPY_INLINE int32_t npy_tanh_interval(uint32_t u)
{
    int32_t i = (int32_t)(u & 0x7fe00000u) - 0x3d400000;
    i = i > 0 ? i : 0;
    i = i < 0x3e00000 ? i : 0x3e00000;
    return i >> 21;
}

/* The polynomial on x's interval, from its coefficients b, c0 .. c6. */
NPY_INLINE float npy_tanh_poly(float x, float b, float c0, float c1, float c2, float c3, float c4, float c5, float c6)
{
    const uint32_t u = npy_bits(x);
    const float y = fabsf(x) - b;
    float r = fmaf(c6, y, c5);
    r = fmaf(r, y, c4);
    r = fmaf(r, y, c3);
    r = fmaf(r, y, c2);
    r = fmaf(r, y, c1);
    r = fmaf(r, y, c0);
    r = (int32_t)(u & 0x7fe00000u) <= 0x7f000000 ? r : 1.0f; /* past the last interval, and infinities: 1 */
    r = npy_float(npy_bits(r) | (u & 0x80000000u));
    return x != x ? NAN : r;
}

typedef float npy_v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t npy_i8 __attribute__((vector_size(32), aligned(4)));

/* Row ``k`` of the table at eight intervals: two two-table permutes and a select
 * (AVX-512's vpermt2ps, AVX2's vpermps and blends), where a gather of eight values
 * took four times as long (AMD EPYC). Compilers without GCC's __builtin_shuffle read
 * the eight values one by one. */
NPY_INLINE void npy_tanh_lookup(int k, const npy_i8 *idx, float *out)
{
#if !defined(__GNUC__) || defined(__clang__)
    for (int l = 0; l < 8; l++)
        out[l] = npy_float(npy_tanh_lut[k][(*idx)[l]]);
#else
    npy_v8 t0, t1, t2, t3;
    memcpy(&t0, npy_tanh_lut[k], sizeof t0);
    memcpy(&t1, npy_tanh_lut[k] + 8, sizeof t1);
    memcpy(&t2, npy_tanh_lut[k] + 16, sizeof t2);
    memcpy(&t3, npy_tanh_lut[k] + 24, sizeof t3);
    const npy_i8 low = *idx & 15, high = (*idx & 16) != 0;
    const npy_v8 a = __builtin_shuffle(t0, t1, low), b = __builtin_shuffle(t2, t3, low);
    const npy_i8 c = ((npy_i8)a & ~high) | ((npy_i8)b & high);
    memcpy(out, &c, sizeof c);
#endif
}

/* ``y[i] = tanh(x[i])`` for i < n (y may be x), ``coef`` scratch for 8 n values: the
 * coefficients of every value looked up eight at a time, then the polynomials in one
 * vectorized loop. */
NPY_INLINE void npy_tanh_n(const float *x, float *y, Py_ssize_t n, float *restrict coef)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        npy_i8 u;
        memcpy(&u, x + i, sizeof u);
        npy_i8 idx = (u & 0x7fe00000) - 0x3d400000;
        idx &= idx > 0;
        const npy_i8 below = idx < 0x3e00000;
        idx = (idx & below) | (0x3e00000 & ~below);
        idx >>= 21;
        for (int k = 0; k < 8; k++)
            npy_tanh_lookup(k, &idx, coef + k * n + i);
    }
    for (; i < n; i++) {
        const int32_t idx = npy_tanh_interval(npy_bits(x[i]));
        for (int k = 0; k < 8; k++)
            coef[k * n + i] = npy_float(npy_tanh_lut[k][idx]);
    }
    for (i = 0; i < n; i++)
        y[i] = npy_tanh_poly(x[i], coef[i], coef[n + i], coef[2 * n + i], coef[3 * n + i], coef[4 * n + i],
                            coef[5 * n + i], coef[6 * n + i], coef[7 * n + i]);
}

/* ``y = tanh(x)`` by numpy's algorithm (``numpy_math``) or the C library's. */
NPY_INLINE void npy_tanh_of(int numpy_math, const float *x, float *y, Py_ssize_t n, float *restrict coef)
{
    if (numpy_math)
        npy_tanh_n(x, y, n, coef);
    else
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = tanhf(x[i]);
}

#endif
