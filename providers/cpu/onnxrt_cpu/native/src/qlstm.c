/* The time loop of com.microsoft DynamicQuantizeLSTM's emulation
 * (``onnxrt_cpu.kernels.contrib_quant_lstm``, ``DynamicQuantizeLSTM._steps``): the
 * unchecked pass with one exact float32 product a step.
 *
 * Every direction and every group of ``fr`` batch rows is a recurrence of its own
 * (a group's hidden state is quantized with its own range, and a row's gates read
 * only its own state), so each (direction, group) runs all its steps as one task of
 * the pool, with no hand-over between steps. A step does what the numpy loop's calls
 * do, in float32 and in the same order, each operation rounded once: the group's
 * range with 0 included, ``scale = (top - bottom) / 255``, ``rint(h / scale)``, the
 * product with the centred R (integer values whose sums are exact in float32, so any
 * order of summation gives the same), ``* (scale * R scale)``, ``+`` the input gates
 * (X's product ``* scale + bias``, read at the direction's step), ``1 / (1 + exp(x))``
 * on the (negated) sigmoid gates, ``tanh``, the cell and the output, the ragged
 * masks. Where the CPU runs the x86-64-v3 or v4 clones (AVX2 and FMA), ``exp`` and
 * ``tanh`` are numpy's own float32 algorithms for those CPUs, with the same fused
 * multiply-adds, and the loop gives numpy's results bit for bit; elsewhere they are
 * the C library's ``expf`` and ``tanhf``, which numpy calls there too. */
#include "native.h"

#include <math.h>
#include <stdlib.h>

/* ---- the recurrent product ----------------------------------------------------- */

/* ``acc[r, c] = sum_j q[r, j] w[j, c]`` for r < rows, c < cols, j < k: integer values
 * whose sums are exact in float32 (the caller's condition), so the order of summation
 * and fused multiply-adds change nothing. Defined before the pragma below, which
 * keeps every other multiplication and addition apart. Blocks of four rows by two
 * vectors of columns, eight accumulators: as many products in flight as two
 * fused-multiply-add pipes of four cycles' latency take (one vector of columns, four
 * accumulators, ran at half that rate); rows past the blocks one at a time, by eight
 * vectors. In vectors of the clone's width: 64 bytes (AVX-512), 32 (AVX2), 16 (the
 * baseline); GCC splits a vector wider than the registers poorly (64 bytes on AVX2:
 * 10 times slower). ``[8, 48] x [48, 192]``, the tagger's product, AMD EPYC: 1.27 us
 * with 64-byte vectors, 1.35 with 32. */
#define QL_PRODUCT(NAME, BYTES)                                                                                      \
    typedef float NAME##_vec __attribute__((vector_size(BYTES), aligned(4)));                                        \
    NATIVE_CLONES static void NAME(const float *restrict q, Py_ssize_t k, const float *restrict w,                   \
                                   Py_ssize_t cols, Py_ssize_t rows, float *restrict acc)                            \
    {                                                                                                                \
        typedef NAME##_vec vec;                                                                                      \
        const Py_ssize_t L = BYTES / 4;                                                                              \
        Py_ssize_t r = 0;                                                                                            \
        for (; r + 4 <= rows; r += 4) {                                                                              \
            const float *q0 = q + r * k, *q1 = q0 + k, *q2 = q1 + k, *q3 = q2 + k;                                   \
            float *o0 = acc + r * cols, *o1 = o0 + cols, *o2 = o1 + cols, *o3 = o2 + cols;                           \
            Py_ssize_t c = 0;                                                                                        \
            for (; c + 2 * L <= cols; c += 2 * L) {                                                                  \
                vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};                  \
                for (Py_ssize_t j = 0; j < k; j++) {                                                                 \
                    const vec u = *(const vec *)(w + j * cols + c), v = *(const vec *)(w + j * cols + c + L);        \
                    a0 += q0[j] * u;                                                                                 \
                    a1 += q1[j] * u;                                                                                 \
                    a2 += q2[j] * u;                                                                                 \
                    a3 += q3[j] * u;                                                                                 \
                    b0 += q0[j] * v;                                                                                 \
                    b1 += q1[j] * v;                                                                                 \
                    b2 += q2[j] * v;                                                                                 \
                    b3 += q3[j] * v;                                                                                 \
                }                                                                                                    \
                *(vec *)(o0 + c) = a0;                                                                               \
                *(vec *)(o0 + c + L) = b0;                                                                           \
                *(vec *)(o1 + c) = a1;                                                                               \
                *(vec *)(o1 + c + L) = b1;                                                                           \
                *(vec *)(o2 + c) = a2;                                                                               \
                *(vec *)(o2 + c + L) = b2;                                                                           \
                *(vec *)(o3 + c) = a3;                                                                               \
                *(vec *)(o3 + c + L) = b3;                                                                           \
            }                                                                                                        \
            for (; c < cols; c++) {                                                                                  \
                float s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                                                \
                for (Py_ssize_t j = 0; j < k; j++) {                                                                 \
                    const float u = w[j * cols + c];                                                                 \
                    s0 += q0[j] * u;                                                                                 \
                    s1 += q1[j] * u;                                                                                 \
                    s2 += q2[j] * u;                                                                                 \
                    s3 += q3[j] * u;                                                                                 \
                }                                                                                                    \
                o0[c] = s0;                                                                                          \
                o1[c] = s1;                                                                                          \
                o2[c] = s2;                                                                                          \
                o3[c] = s3;                                                                                          \
            }                                                                                                        \
        }                                                                                                            \
        for (; r < rows; r++) {                                                                                      \
            const float *q0 = q + r * k;                                                                             \
            float *o0 = acc + r * cols;                                                                              \
            Py_ssize_t c = 0;                                                                                        \
            for (; c + 8 * L <= cols; c += 8 * L) {                                                                  \
                vec a[8] = {{0}};                                                                                    \
                for (Py_ssize_t j = 0; j < k; j++)                                                                   \
                    for (int v = 0; v < 8; v++)                                                                      \
                        a[v] += q0[j] * *(const vec *)(w + j * cols + c + v * L);                                    \
                for (int v = 0; v < 8; v++)                                                                          \
                    *(vec *)(o0 + c + v * L) = a[v];                                                                 \
            }                                                                                                        \
            for (; c + L <= cols; c += L) {                                                                          \
                vec a0 = {0};                                                                                        \
                for (Py_ssize_t j = 0; j < k; j++)                                                                   \
                    a0 += q0[j] * *(const vec *)(w + j * cols + c);                                                  \
                *(vec *)(o0 + c) = a0;                                                                               \
            }                                                                                                        \
            for (; c < cols; c++) {                                                                                  \
                float s0 = 0;                                                                                        \
                for (Py_ssize_t j = 0; j < k; j++)                                                                   \
                    s0 += q0[j] * w[j * cols + c];                                                                   \
                o0[c] = s0;                                                                                          \
            }                                                                                                        \
        }                                                                                                            \
    }

QL_PRODUCT(qlstm_product64, 64)
QL_PRODUCT(qlstm_product32, 32)
QL_PRODUCT(qlstm_product16, 16)

typedef void (*ql_product_fn)(const float *, Py_ssize_t, const float *, Py_ssize_t, Py_ssize_t, float *);

/* Which clone of NATIVE_CLONES this CPU runs: 4 (x86-64-v4), 3 (x86-64-v3), else 0. */
static int ql_level(void)
{
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 12
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") ? 4 : __builtin_cpu_supports("x86-64-v3") ? 3 : 0;
#else
    return 0;
#endif
}

/* From here on a product and a sum are two operations, each rounded, as numpy's
 * calls compute them: no contraction into fused multiply-adds (GCC contracts by
 * default outside ISO C modes, Clang within an expression); the fused ones numpy's
 * exp and tanh compute are written as fmaf. And no floating-point exception is
 * looked at (numpy's calls ignore them too), which lets GCC turn the selects of exp,
 * tanh and the range into vector blends for AVX2 (with trapping math it keeps their
 * comparisons as branches there, and the loops scalar); values are unchanged. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

/* ---- numpy's float32 exp and tanh ---------------------------------------------- */

#define QL_INLINE static inline __attribute__((always_inline))

QL_INLINE uint32_t ql_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

QL_INLINE float ql_float(uint32_t u)
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
QL_INLINE float ql_exp(float x)
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
    float e = ql_float(ql_bits(poly) + ((uint32_t)ka << 23)) * ql_float((uint32_t)(127 + k - ka) << 23);
    e = nan ? NAN : e;
    e = over ? INFINITY : e;
    return under ? 0.0f : e;
}

/* numpy's float32 tanh where it has fused multiply-adds (``simd_tanh_f32`` in
 * numpy/_core/src/umath/loops_hyperbolic.dispatch.cpp.src, from Intel's SVML): 32
 * intervals of |x|, on each a polynomial of degree 6 in |x| - b. Rows b, c0 .. c6. */
static const uint32_t ql_tanh_lut[8][32] = {
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
QL_INLINE int32_t ql_tanh_interval(uint32_t u)
{
    int32_t i = (int32_t)(u & 0x7fe00000u) - 0x3d400000;
    i = i > 0 ? i : 0;
    i = i < 0x3e00000 ? i : 0x3e00000;
    return i >> 21;
}

/* The polynomial on x's interval, from its coefficients b, c0 .. c6. */
QL_INLINE float ql_tanh_poly(float x, float b, float c0, float c1, float c2, float c3, float c4, float c5, float c6)
{
    const uint32_t u = ql_bits(x);
    const float y = fabsf(x) - b;
    float r = fmaf(c6, y, c5);
    r = fmaf(r, y, c4);
    r = fmaf(r, y, c3);
    r = fmaf(r, y, c2);
    r = fmaf(r, y, c1);
    r = fmaf(r, y, c0);
    r = (int32_t)(u & 0x7fe00000u) <= 0x7f000000 ? r : 1.0f; /* past the last interval, and infinities: 1 */
    r = ql_float(ql_bits(r) | (u & 0x80000000u));
    return x != x ? NAN : r;
}

typedef float ql_v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t ql_i8 __attribute__((vector_size(32), aligned(4)));

/* Row ``k`` of the table at eight intervals: two two-table permutes and a select
 * (AVX-512's vpermt2ps, AVX2's vpermps and blends), where a gather of eight values
 * took four times as long (AMD EPYC). Compilers without GCC's __builtin_shuffle read
 * the eight values one by one. */
QL_INLINE void ql_tanh_lookup(int k, const ql_i8 *idx, float *out)
{
#if !defined(__GNUC__) || defined(__clang__)
    for (int l = 0; l < 8; l++)
        out[l] = ql_float(ql_tanh_lut[k][(*idx)[l]]);
#else
    ql_v8 t0, t1, t2, t3;
    memcpy(&t0, ql_tanh_lut[k], sizeof t0);
    memcpy(&t1, ql_tanh_lut[k] + 8, sizeof t1);
    memcpy(&t2, ql_tanh_lut[k] + 16, sizeof t2);
    memcpy(&t3, ql_tanh_lut[k] + 24, sizeof t3);
    const ql_i8 low = *idx & 15, high = (*idx & 16) != 0;
    const ql_v8 a = __builtin_shuffle(t0, t1, low), b = __builtin_shuffle(t2, t3, low);
    const ql_i8 c = ((ql_i8)a & ~high) | ((ql_i8)b & high);
    memcpy(out, &c, sizeof c);
#endif
}

/* ``y[i] = tanh(x[i])`` for i < n (y may be x), ``coef`` scratch for 8 n values: the
 * coefficients of every value looked up eight at a time, then the polynomials in one
 * vectorized loop. */
QL_INLINE void ql_tanh_n(const float *x, float *y, Py_ssize_t n, float *restrict coef)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        ql_i8 u;
        memcpy(&u, x + i, sizeof u);
        ql_i8 idx = (u & 0x7fe00000) - 0x3d400000;
        idx &= idx > 0;
        const ql_i8 below = idx < 0x3e00000;
        idx = (idx & below) | (0x3e00000 & ~below);
        idx >>= 21;
        for (int k = 0; k < 8; k++)
            ql_tanh_lookup(k, &idx, coef + k * n + i);
    }
    for (; i < n; i++) {
        const int32_t idx = ql_tanh_interval(ql_bits(x[i]));
        for (int k = 0; k < 8; k++)
            coef[k * n + i] = ql_float(ql_tanh_lut[k][idx]);
    }
    for (i = 0; i < n; i++)
        y[i] = ql_tanh_poly(x[i], coef[i], coef[n + i], coef[2 * n + i], coef[3 * n + i], coef[4 * n + i],
                            coef[5 * n + i], coef[6 * n + i], coef[7 * n + i]);
}

/* ``y = tanh(x)`` by numpy's algorithm (``numpy_math``) or the C library's. */
QL_INLINE void ql_tanh_of(int numpy_math, const float *x, float *y, Py_ssize_t n, float *restrict coef)
{
    if (numpy_math)
        ql_tanh_n(x, y, n, coef);
    else
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = tanhf(x[i]);
}

/* The range of h[0 .. n) with 0 in it, ``[bottom, top]``, NaN both where a value is
 * NaN, as numpy's minimum and maximum reduce it: sixteen lanes apart (vectorized),
 * then across. */
QL_INLINE void ql_range(const float *h, Py_ssize_t n, float *bottom, float *top)
{
    float lo[16], hi[16];
    int32_t nan[16];
    for (int l = 0; l < 16; l++) {
        lo[l] = hi[l] = 0.0f;
        nan[l] = 0;
    }
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            const float v = h[i + l];
            hi[l] = v > hi[l] ? v : hi[l];
            lo[l] = v < lo[l] ? v : lo[l];
            nan[l] |= v != v;
        }
    for (int l = 0; i < n; i++, l++) {
        const float v = h[i];
        hi[l] = v > hi[l] ? v : hi[l];
        lo[l] = v < lo[l] ? v : lo[l];
        nan[l] |= v != v;
    }
    float b = 0.0f, t = 0.0f;
    int any = 0;
    for (int l = 0; l < 16; l++) {
        t = hi[l] > t ? hi[l] : t;
        b = lo[l] < b ? lo[l] : b;
        any |= nan[l];
    }
    *bottom = any ? NAN : b;
    *top = any ? NAN : t;
}

/* ---- the time loop ------------------------------------------------------------- */

typedef struct {
    const float *r;       /* [D, H, 4H]: centred R, the sigmoid gates' columns negated */
    const float *rs;      /* [D, 4H]: R's scales per column (per direction: column 0's) */
    const float *gxa;     /* [seq, batch, D, 4H]: the product of X's codes and W */
    const float *gs;      /* [D, 4H]: its scales (X's scale times W's, signed) */
    const float *gb;      /* [D, 4H]: the bias, or NULL */
    const int64_t *lens;  /* [batch]: ragged lengths, or NULL */
    const float *masks;   /* [seq, rows] or NULL */
    float *ys;            /* [seq + 1, D, rows, H]: ys[0] the initial state */
    float *cell;          /* [D, rows, H] */
    float *scales;        /* [seq, D, groups] */
    float *ranges;        /* [2, seq, D, groups]: bottoms, tops */
    float *last_cell;     /* [D, rows, H] with masks */
    Py_ssize_t seq, batch, dirs, rows, hid, fr, groups;
    int reversed, per_direction, zero_start, failed;
    ql_product_fn product;
    int numpy_math; /* exp and tanh by numpy's own algorithms, else the C library's */
} qlstm_job;

/* Every step of direction d's group g (rows g * fr .. g * fr + fr). ``q`` holds the
 * group's codes, ``acc`` its gates, ``mult`` a step's multipliers of the product,
 * ``coef`` a row's tanh coefficients. */
NATIVE_CLONES static void qlstm_group(const qlstm_job *j, Py_ssize_t d, Py_ssize_t g, float *restrict q,
                                      float *restrict acc, float *restrict mult, float *restrict coef)
{
    const Py_ssize_t hid = j->hid, h4 = 4 * hid, fr = j->fr, n = fr * hid, row0 = g * fr;
    const Py_ssize_t dg = d * j->groups + g, per_step = j->dirs * j->groups;
    const float *w = j->r + d * hid * h4, *rs = j->rs + d * h4, *gs = j->gs + d * h4;
    const float *gb = j->gb ? j->gb + d * h4 : NULL;
    const int reversed = (j->reversed >> d) & 1;
    float *cell = j->cell + (d * j->rows + row0) * hid;
    float *last = j->last_cell ? j->last_cell + (d * j->rows + row0) * hid : NULL;
    for (Py_ssize_t t = 0; t < j->seq; t++) {
        const float *h = j->ys + ((t * j->dirs + d) * j->rows + row0) * hid;
        float *y = j->ys + (((t + 1) * j->dirs + d) * j->rows + row0) * hid;
        float scale, top = 0.0f, bottom = 0.0f;
        if (t == 0 && j->zero_start) {
            /* a zero state: scale 1, and a zero product */
            scale = 1.0f;
            memset(acc, 0, (size_t)(fr * h4) * sizeof(float));
        } else {
            ql_range(h, n, &bottom, &top);
            scale = top - bottom;
            scale = scale / 255.0f;
            for (Py_ssize_t i = 0; i < n; i++)
                q[i] = rintf(h[i] / scale);
            j->product(q, hid, w, h4, fr, acc);
        }
        j->scales[t * per_step + dg] = scale;
        j->ranges[t * per_step + dg] = bottom;
        j->ranges[(j->seq + t) * per_step + dg] = top;
        for (Py_ssize_t c = 0; c < h4; c++)
            mult[c] = scale * rs[j->per_direction ? 0 : c];
        for (Py_ssize_t r = 0; r < fr; r++) {
            float *a = acc + r * h4;
            const Py_ssize_t row = row0 + r;
            /* the input gates: X's product at this direction's step (the reverse
             * direction runs each row's valid steps backwards) scaled, and the bias */
            if (row < j->batch) {
                Py_ssize_t ts = t;
                if (reversed) {
                    const Py_ssize_t len = j->lens ? (Py_ssize_t)j->lens[row] : j->seq;
                    ts = t < len ? len - 1 - t : t;
                }
                const float *x = j->gxa + ((ts * j->batch + row) * j->dirs + d) * h4;
                if (gb) {
                    for (Py_ssize_t c = 0; c < h4; c++) {
                        const float v = a[c] * mult[c];
                        float gate = x[c] * gs[c];
                        gate = gate + gb[c];
                        a[c] = v + gate;
                    }
                } else {
                    for (Py_ssize_t c = 0; c < h4; c++) {
                        const float v = a[c] * mult[c];
                        const float gate = x[c] * gs[c];
                        a[c] = v + gate;
                    }
                }
            } else {
                /* a padding row of the last group: no inputs, a state that stays zero */
                for (Py_ssize_t c = 0; c < h4; c++) {
                    const float v = a[c] * mult[c];
                    a[c] = v + 0.0f;
                }
            }
            /* the gates o, f, i: 1 / (1 + exp(-x)), their inputs negated already */
            if (j->numpy_math)
                for (Py_ssize_t c = 0; c < 3 * hid; c++)
                    a[c] = ql_exp(a[c]);
            else
                for (Py_ssize_t c = 0; c < 3 * hid; c++)
                    a[c] = expf(a[c]);
            for (Py_ssize_t c = 0; c < 3 * hid; c++) {
                const float e = a[c] + 1.0f;
                a[c] = 1.0f / e;
            }
            float *cg = a + 3 * hid, *cr = cell + r * hid, *yr = y + r * hid;
            const float *o = a, *f = a + hid, *in = a + 2 * hid;
            ql_tanh_of(j->numpy_math, cg, cg, hid, coef);
            for (Py_ssize_t i = 0; i < hid; i++) {
                const float fc = f[i] * cr[i];
                const float ic = in[i] * cg[i];
                cr[i] = fc + ic;
            }
            ql_tanh_of(j->numpy_math, cr, yr, hid, coef);
            for (Py_ssize_t i = 0; i < hid; i++)
                yr[i] = o[i] * yr[i];
            if (j->masks) {
                const float m = j->masks[t * j->rows + row];
                for (Py_ssize_t i = 0; i < hid; i++)
                    yr[i] = yr[i] * m;
                if (m > 0)
                    memcpy(last + r * hid, cr, (size_t)hid * sizeof(float));
            }
        }
    }
}

static void qlstm_task(void *arg, Py_ssize_t i)
{
    qlstm_job *j = arg;
    const Py_ssize_t h4 = 4 * j->hid;
    float *q = scratch(0, (size_t)(j->fr * j->hid) * sizeof(float));
    float *acc = scratch(1, (size_t)(j->fr * h4 + h4 + 8 * j->hid) * sizeof(float));
    if (!q || !acc) {
        j->failed = 1;
        return;
    }
    qlstm_group(j, i / j->groups, i % j->groups, q, acc, acc + j->fr * h4, acc + j->fr * h4 + h4);
}

PyDoc_STRVAR(qlstm_steps_doc,
"qlstm_steps(r, r_scale, per_direction, gxa, gx_scale, bias, lens, reversed, ys, cell,\n"
"            scales, ranges, masks, last_cell, (seq, batch, dirs, rows, hid, fr),\n"
"            zero_start, threads)\n\n"
"The unchecked time loop of DynamicQuantizeLSTM's emulation with one exact float32\n"
"product a step (DynamicQuantizeLSTM._steps, careful=False, exact=True), every\n"
"direction at once. float32, C-contiguous: r [D, H, 4H] (centred, the sigmoid gates'\n"
"columns negated), r_scale [D, 4H] (column 0 alone read where per_direction); the\n"
"input gates gxa [seq, batch, D, 4H] * gx_scale [D, 4H] + bias [D, 4H] (or None), the\n"
"directions whose bit is set in reversed running backwards over each row's valid steps\n"
"(lens [batch], int64, ragged; or None: all seq steps); ys [seq + 1, D, rows, H]\n"
"(ys[0] the initial state; the steps write the rest), cell [D, rows, H] (in and out),\n"
"scales [seq, D, rows / fr] and ranges [2, seq, D, rows / fr] (written), masks [seq,\n"
"rows] and last_cell [D, rows, H] (ragged lengths) or both None. zero_start: ys[0] is\n"
"zero. Rows from batch to rows are padding (no inputs). Each direction's groups of fr\n"
"rows share out over up to threads threads, without the GIL.");

static PyObject *qlstm_steps(PyObject *self, PyObject *args)
{
    PyObject *ro, *rso, *gxao, *gso, *gbo, *lenso, *yso, *cello, *scaleso, *rangeso, *maskso, *lasto;
    qlstm_job j;
    int threads;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "OOpOOOOiOOOOOO(nnnnnn)pi:qlstm_steps", &ro, &rso, &j.per_direction, &gxao, &gso,
                          &gbo, &lenso, &j.reversed, &yso, &cello, &scaleso, &rangeso, &maskso, &lasto, &j.seq,
                          &j.batch, &j.dirs, &j.rows, &j.hid, &j.fr, &j.zero_start, &threads))
        return NULL;
    if (j.seq < 0 || j.batch < 1 || j.dirs < 1 || j.dirs > 2 || j.rows < j.batch || j.hid < 1 || j.fr < 1 ||
        j.rows % j.fr != 0 || j.hid > PY_SSIZE_T_MAX / 64 / j.hid ||
        j.seq + 1 > PY_SSIZE_T_MAX / 64 / j.dirs / j.rows / j.hid) {
        PyErr_SetString(PyExc_ValueError, "qlstm_steps: invalid sizes (batch <= rows, fr must divide rows)");
        return NULL;
    }
    if ((maskso == Py_None) != (lasto == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "qlstm_steps: masks and last_cell come together");
        return NULL;
    }
    j.groups = j.rows / j.fr;
    const int level = ql_level();
    j.product = level == 4 ? qlstm_product64 : level == 3 ? qlstm_product32 : qlstm_product16;
    j.numpy_math = level >= 3;
    const Py_ssize_t h4 = 4 * j.hid, state = j.dirs * j.rows * j.hid, steps = j.seq * j.dirs * j.groups;
    nbuf r, rs, gxa, gs, gb, lens, ys, cell, scales, ranges, masks, last;
    r.held = rs.held = gxa.held = gs.held = gb.held = lens.held = ys.held = cell.held = 0;
    scales.held = ranges.held = masks.held = last.held = 0;
    if (nb_get(ro, &r, 'f', 4, j.dirs * j.hid * h4, 0, 0, "qlstm_steps: r") < 0 ||
        nb_get(rso, &rs, 'f', 4, j.dirs * h4, 0, 0, "qlstm_steps: r_scale") < 0 ||
        nb_get(gxao, &gxa, 'f', 4, j.seq * j.batch * j.dirs * h4, 0, 0, "qlstm_steps: gxa") < 0 ||
        nb_get(gso, &gs, 'f', 4, j.dirs * h4, 0, 0, "qlstm_steps: gx_scale") < 0 ||
        nb_get(gbo, &gb, 'f', 4, j.dirs * h4, 0, 1, "qlstm_steps: bias") < 0 ||
        nb_get(lenso, &lens, 'i', 8, j.batch, 0, 1, "qlstm_steps: lens") < 0 ||
        nb_get(yso, &ys, 'f', 4, (j.seq + 1) * state, 1, 0, "qlstm_steps: ys") < 0 ||
        nb_get(cello, &cell, 'f', 4, state, 1, 0, "qlstm_steps: cell") < 0 ||
        nb_get(scaleso, &scales, 'f', 4, steps, 1, 0, "qlstm_steps: scales") < 0 ||
        nb_get(rangeso, &ranges, 'f', 4, 2 * steps, 1, 0, "qlstm_steps: ranges") < 0 ||
        nb_get(maskso, &masks, 'f', 4, j.seq * j.rows, 0, 1, "qlstm_steps: masks") < 0 ||
        nb_get(lasto, &last, 'f', 4, state, 1, 1, "qlstm_steps: last_cell") < 0)
        goto done;
    j.lens = lens.held ? lens.view.buf : NULL;
    for (Py_ssize_t i = 0; j.lens && i < j.batch; i++)
        if (j.lens[i] < 0 || j.lens[i] > j.seq) {
            PyErr_Format(PyExc_ValueError, "qlstm_steps: lens[%zd] = %lld lies outside [0, %zd]", i,
                         (long long)j.lens[i], j.seq);
            goto done;
        }
    j.r = r.view.buf;
    j.rs = rs.view.buf;
    j.gxa = gxa.view.buf;
    j.gs = gs.view.buf;
    j.gb = gb.held ? gb.view.buf : NULL;
    j.ys = ys.view.buf;
    j.cell = cell.view.buf;
    j.scales = scales.view.buf;
    j.ranges = ranges.view.buf;
    j.masks = masks.held ? masks.view.buf : NULL;
    j.last_cell = last.held ? last.view.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    pool_run(qlstm_task, &j, j.dirs * j.groups, threads);
    Py_END_ALLOW_THREADS
    if (j.failed)
        PyErr_NoMemory();
done:
    nb_release(&r);
    nb_release(&rs);
    nb_release(&gxa);
    nb_release(&gs);
    nb_release(&gb);
    nb_release(&lens);
    nb_release(&ys);
    nb_release(&cell);
    nb_release(&scales);
    nb_release(&ranges);
    nb_release(&masks);
    nb_release(&last);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- exp and tanh alone, for the tests ----------------------------------------- */

NATIVE_CLONES static void qlstm_map(const float *restrict x, float *restrict y, Py_ssize_t n, int which,
                                    int numpy_math, float *restrict coef)
{
    if (which == 1) {
        ql_tanh_of(numpy_math, x, y, n, coef);
    } else if (numpy_math) {
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = ql_exp(x[i]);
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            y[i] = expf(x[i]);
    }
}

static PyObject *qlstm_activation(PyObject *self, PyObject *args)
{
    PyObject *xo, *yo;
    const char *name;
    if (!PyArg_ParseTuple(args, "OOs:qlstm_activation", &xo, &yo, &name))
        return NULL;
    int which = strcmp(name, "exp") == 0 ? 0 : strcmp(name, "tanh") == 0 ? 1 : -1;
    if (which < 0) {
        PyErr_SetString(PyExc_ValueError, "qlstm_activation: the function is 'exp' or 'tanh'");
        return NULL;
    }
    nbuf x, y;
    x.held = y.held = 0;
    if (nb_get(xo, &x, 'f', 4, 0, 0, 0, "qlstm_activation: x") < 0)
        return NULL;
    Py_ssize_t n = x.view.len / 4;
    if (nb_get(yo, &y, 'f', 4, n, 1, 0, "qlstm_activation: y") < 0) {
        nb_release(&x);
        return NULL;
    }
    float *coef = which == 1 ? malloc((size_t)(8 * n + 1) * sizeof(float)) : NULL;
    if (which == 1 && !coef) {
        nb_release(&x);
        nb_release(&y);
        return PyErr_NoMemory();
    }
    const int numpy_math = ql_level() >= 3;
    Py_BEGIN_ALLOW_THREADS
    qlstm_map(x.view.buf, y.view.buf, n, which, numpy_math, coef);
    Py_END_ALLOW_THREADS
    free(coef);
    nb_release(&x);
    nb_release(&y);
    return PyBool_FromLong(numpy_math);
}

PyMethodDef qlstm_methods[] = {
    {"qlstm_steps", qlstm_steps, METH_VARARGS, qlstm_steps_doc},
    {"qlstm_activation", qlstm_activation, METH_VARARGS,
     "qlstm_activation(x, y, name) -> bool\n\ny = exp(x) or tanh(x) (name 'exp' or 'tanh'), float32, as qlstm_steps computes\n"
     "them; True where that is by numpy's own algorithms for AVX2 and AVX-512 (this CPU runs\n"
     "the x86-64-v3 or v4 clones), False where by the C library's expf and tanhf."},
    {NULL, NULL, 0, NULL},
};
