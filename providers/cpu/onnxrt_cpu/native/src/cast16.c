/* Casts between float16 and float32 with the CPU's conversion instructions (F16C's
 * vcvtps2ph / vcvtph2ps, sixteen lanes at a time with AVX-512F, eight with AVX2), where
 * numpy converts one value at a time (a million float32 -> float16: 8 ms).
 *
 * The results are numpy's ``astype`` bits, every one: the instructions round to the
 * nearest, ties to even (the immediate sets it, whatever MXCSR says), overflow to
 * infinity and make float16 subnormals exactly as numpy's npy_floatbits_to_halfbits
 * does, and widen every float16 exactly. NaNs differ: the instructions quiet a
 * signalling NaN, numpy keeps its payload's top bits as they are (and a float32 NaN
 * whose top ten payload bits are zero becomes 0x7c01). A vector holding a NaN is
 * therefore redone lane by lane in numpy's way; NaNs are rare, so the cost is too.
 *
 * float16 travels as its bits (uint16): the buffer protocol's 'e' is not a format
 * nb_get knows.
 */
#include "native.h"

#if defined(__GNUC__) && defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 9)
#define CAST16_BUILT 1
#include <immintrin.h>
#else
#define CAST16_BUILT 0
#endif

/* Elements per chunk of the pool. */
#define CAST_CHUNK (1 << 15)

/* numpy's float32 -> float16 for a NaN (npy_floatbits_to_halfbits). */
static inline uint16_t nan_to_half(uint32_t f)
{
    uint16_t r = (uint16_t)(0x7c00u + ((f & 0x007fffffu) >> 13));
    if (r == 0x7c00u)
        r++;
    return (uint16_t)(((f >> 16) & 0x8000u) | r);
}

/* numpy's float16 -> float32 for a NaN (npy_halfbits_to_floatbits). */
static inline uint32_t nan_to_float(uint16_t h)
{
    return ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(h & 0x03ffu) << 13);
}

#if CAST16_BUILT

#define AVX512_TARGET __attribute__((target("avx512f")))
#define AVX2_TARGET __attribute__((target("avx2,f16c")))

/* Sixteen float32 at p to float16 at q; the NaN lanes redone. */
AVX512_TARGET static inline void f32_to_f16_x16(const float *p, uint16_t *q)
{
    const __m512 v = _mm512_loadu_ps(p);
    _mm256_storeu_si256((__m256i *)q, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    /* a NaN is the one value that compares unordered with itself */
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    while (nan) {
        const int i = __builtin_ctz(nan);
        uint32_t f;
        memcpy(&f, p + i, 4);
        q[i] = nan_to_half(f);
        nan &= (__mmask16)(nan - 1);
    }
}

AVX512_TARGET static inline void f16_to_f32_x16(const uint16_t *p, float *q)
{
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    _mm512_storeu_ps(q, v);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    while (nan) {
        const int i = __builtin_ctz(nan);
        const uint32_t f = nan_to_float(p[i]);
        memcpy(q + i, &f, 4);
        nan &= (__mmask16)(nan - 1);
    }
}

AVX512_TARGET static void f32_to_f16_avx512(const float *x, uint16_t *y, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        f32_to_f16_x16(x + i, y + i);
    if (i < n) { /* the tail through a padded block */
        float in[16] = {0};
        uint16_t out[16];
        memcpy(in, x + i, (size_t)(n - i) * 4);
        f32_to_f16_x16(in, out);
        memcpy(y + i, out, (size_t)(n - i) * 2);
    }
}

AVX512_TARGET static void f16_to_f32_avx512(const uint16_t *x, float *y, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        f16_to_f32_x16(x + i, y + i);
    if (i < n) {
        uint16_t in[16] = {0};
        float out[16];
        memcpy(in, x + i, (size_t)(n - i) * 2);
        f16_to_f32_x16(in, out);
        memcpy(y + i, out, (size_t)(n - i) * 4);
    }
}

AVX2_TARGET static inline void f32_to_f16_x8(const float *p, uint16_t *q)
{
    const __m256 v = _mm256_loadu_ps(p);
    _mm_storeu_si128((__m128i *)q, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    unsigned nan = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    while (nan) {
        const int i = __builtin_ctz(nan);
        uint32_t f;
        memcpy(&f, p + i, 4);
        q[i] = nan_to_half(f);
        nan &= nan - 1;
    }
}

AVX2_TARGET static inline void f16_to_f32_x8(const uint16_t *p, float *q)
{
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    _mm256_storeu_ps(q, v);
    unsigned nan = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    while (nan) {
        const int i = __builtin_ctz(nan);
        const uint32_t f = nan_to_float(p[i]);
        memcpy(q + i, &f, 4);
        nan &= nan - 1;
    }
}

AVX2_TARGET static void f32_to_f16_avx2(const float *x, uint16_t *y, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        f32_to_f16_x8(x + i, y + i);
    if (i < n) {
        float in[8] = {0};
        uint16_t out[8];
        memcpy(in, x + i, (size_t)(n - i) * 4);
        f32_to_f16_x8(in, out);
        memcpy(y + i, out, (size_t)(n - i) * 2);
    }
}

AVX2_TARGET static void f16_to_f32_avx2(const uint16_t *x, float *y, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        f16_to_f32_x8(x + i, y + i);
    if (i < n) {
        uint16_t in[8] = {0};
        float out[8];
        memcpy(in, x + i, (size_t)(n - i) * 2);
        f16_to_f32_x8(in, out);
        memcpy(y + i, out, (size_t)(n - i) * 4);
    }
}

/* 2: AVX-512F, 1: AVX2 and F16C, 0: neither (the caller keeps numpy). */
static int cast16_level(void)
{
    static int level = -1;
    if (level < 0) {
        __builtin_cpu_init();
        level = __builtin_cpu_supports("avx512f") ? 2 : (__builtin_cpu_supports("avx2") &&
                                                         __builtin_cpu_supports("f16c")) ? 1 : 0;
    }
    return level;
}

#else

static int cast16_level(void)
{
    return 0;
}

#endif

typedef struct {
    const void *x;
    void *y;
    Py_ssize_t n;
    int to_half, level;
} cast_job;

static void cast_task(void *arg, Py_ssize_t t)
{
    const cast_job *j = arg;
    const Py_ssize_t i0 = t * CAST_CHUNK, m = (i0 + CAST_CHUNK < j->n ? i0 + CAST_CHUNK : j->n) - i0;
#if CAST16_BUILT
    if (j->to_half) {
        const float *x = (const float *)j->x + i0;
        uint16_t *y = (uint16_t *)j->y + i0;
        if (j->level == 2)
            f32_to_f16_avx512(x, y, m);
        else
            f32_to_f16_avx2(x, y, m);
    } else {
        const uint16_t *x = (const uint16_t *)j->x + i0;
        float *y = (float *)j->y + i0;
        if (j->level == 2)
            f16_to_f32_avx512(x, y, m);
        else
            f16_to_f32_avx2(x, y, m);
    }
#else
    (void)j;
    (void)m;
#endif
}

/* The two casts share their checks: x of one type, y of the other and x's size. */
static PyObject *cast16(PyObject *args, int to_half, const char *name)
{
    PyObject *xo, *yo;
    int threads;
    if (!PyArg_ParseTuple(args, "OOi", &xo, &yo, &threads))
        return NULL;
    const int level = cast16_level();
    if (level == 0) {
        PyErr_Format(PyExc_RuntimeError, "%s: this CPU has no F16C conversion instructions (see cast16_ready)",
                     name);
        return NULL;
    }
    char what_x[48], what_y[48];
    snprintf(what_x, sizeof what_x, "%s: x", name);
    snprintf(what_y, sizeof what_y, "%s: y", name);
    nbuf x, y;
    x.held = y.held = 0;
    if ((to_half ? nb_get(xo, &x, 'f', 4, 0, 0, 0, what_x) : nb_get(xo, &x, 'u', 2, 0, 0, 0, what_x)) < 0)
        return NULL;
    cast_job j = {x.view.buf, NULL, x.view.len / (to_half ? 4 : 2), to_half, level};
    if ((to_half ? nb_get(yo, &y, 'u', 2, j.n, 1, 0, what_y) : nb_get(yo, &y, 'f', 4, j.n, 1, 0, what_y)) < 0) {
        nb_release(&x);
        return NULL;
    }
    j.y = y.view.buf;
    if (j.n) {
        Py_BEGIN_ALLOW_THREADS
        pool_run(cast_task, &j, (j.n + CAST_CHUNK - 1) / CAST_CHUNK, threads);
        Py_END_ALLOW_THREADS
    }
    nb_release(&x);
    nb_release(&y);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cast_f32_f16_doc,
"cast_f32_f16(x, y, threads)\n\n"
"y = x.astype(float16), bit for bit as numpy gives it (NaNs included), from float32 x\n"
"into y, a uint16 array of x's size holding the float16 bits. Runs on up to threads\n"
"threads, without the GIL. RuntimeError where cast16_ready() is false.");

static PyObject *cast_f32_f16(PyObject *self, PyObject *args)
{
    return cast16(args, 1, "cast_f32_f16");
}

PyDoc_STRVAR(cast_f16_f32_doc,
"cast_f16_f32(x, y, threads)\n\n"
"y = x.astype(float32), bit for bit as numpy gives it (NaNs included), from x, a\n"
"uint16 array of float16 bits, into float32 y of x's size. Runs on up to threads\n"
"threads, without the GIL. RuntimeError where cast16_ready() is false.");

static PyObject *cast_f16_f32(PyObject *self, PyObject *args)
{
    return cast16(args, 0, "cast_f16_f32");
}

PyDoc_STRVAR(cast16_ready_doc,
"cast16_ready()\n\n"
"Whether this CPU runs cast_f32_f16 and cast_f16_f32 (AVX-512F, or AVX2 and F16C).");

static PyObject *cast16_ready(PyObject *self, PyObject *args)
{
    return PyBool_FromLong(cast16_level() > 0);
}

PyMethodDef cast16_methods[] = {
    {"cast_f32_f16", cast_f32_f16, METH_VARARGS, cast_f32_f16_doc},
    {"cast_f16_f32", cast_f16_f32, METH_VARARGS, cast_f16_f32_doc},
    {"cast16_ready", cast16_ready, METH_NOARGS, cast16_ready_doc},
    {NULL, NULL, 0, NULL},
};
