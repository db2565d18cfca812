/* Shared declarations of the CPU provider's compiled kernels (one extension module,
 * ``onnxrt_cpu.native._kernels``, built from every .c file here).
 *
 * Every kernel takes numpy arrays through the buffer protocol (no numpy headers are
 * needed to build), checks their element type, contiguity and size, and releases
 * the GIL while it computes. Work is shared out on the module's own thread pool
 * (pool.c), whose workers never touch Python objects.
 */
#ifndef ONNXRT_CPU_NATIVE_H
#define ONNXRT_CPU_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Hot loops are compiled three times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 and
 * FMA) and the baseline, and the loader picks the best the CPU runs: one build
 * serves every x86-64 machine, where -march=native would not. Vector values never
 * cross between a clone and its caller by value (the clones pass them differently);
 * only pointers do. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 12
#define NATIVE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NATIVE_CLONES
#endif

/* Fused activations of the kernels' epilogues. */
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2 };

/* ---- windows over 2-D planes (phases.h) ----------------------------------------- */

/* A window of kh x kw taps over planes [h, w] of n images of c channels: strides,
 * dilations, the pads before each axis (at least 0) and the output size. */
typedef struct {
    Py_ssize_t n, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
} window_geometry;

/* A 2-D convolution of n images of c channels h x w into m channels oh x ow, in
 * ``groups`` groups, with a kh x kw kernel, strides, dilations and the pads before
 * each axis (conv.c, direct.c, winograd.c, qconv8.c). */
typedef struct {
    Py_ssize_t n, c, h, w, m, groups, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
} conv_geometry;

/* ---- named geometries (geometry.c) -------------------------------------------- */

/* Python passes a geometry as a named tuple, ``onnxrt_cpu.native.ConvGeometry`` or
 * ``WindowGeometry``, whose fields are the structs' above in order (the pads named
 * pad_top and pad_left); ``set_geometry_types`` hands the two types over when the
 * module is loaded, after checking their field names against these. Each getter
 * fills the struct, or returns -1 with a TypeError naming ``who`` where ``obj`` is
 * not of the type (a plain tuple included) or a field is not an integer. */
int conv_geometry_get(PyObject *obj, conv_geometry *g, const char *who);
int window_geometry_get(PyObject *obj, window_geometry *g, const char *who);

/* Elements of slack after every phase buffer: a flat pass's last block of four
 * vectors reads and writes past the end, for any element type. */
#define PHASE_SLACK 128

/* The stride phases of a padded plane (``x[py::sh, px::sw]``, see phases.h): rows per
 * phase ``hq``, the row pitch ``pq``, each phase's elements ``plane`` (one spare row
 * and the slack), the padded extent the taps read (``hn`` rows by ``wn`` columns) and
 * the output computed on the phases' pitch, ``span = oh * pq``. */
typedef struct {
    Py_ssize_t hn, wn, hq, pq, plane, span;
} phase_layout;

static inline void phase_layout_of(const window_geometry *g, phase_layout *l)
{
    l->hn = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1;
    l->wn = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1;
    l->hq = (l->hn + g->sh - 1) / g->sh;
    l->pq = (l->wn + g->sw - 1) / g->sw;
    l->plane = (l->hq + 1) * l->pq + PHASE_SLACK;
    l->span = g->oh * l->pq;
}

/* Where tap (ky, kx) reads in the phases: its phase's offset plus its shift. */
static inline Py_ssize_t phase_offset(const window_geometry *g, const phase_layout *l, Py_ssize_t ky, Py_ssize_t kx)
{
    Py_ssize_t ry = ky * g->dh, rx = kx * g->dw;
    return ((ry % g->sh) * g->sw + rx % g->sw) * l->plane + (ry / g->sh) * l->pq + rx / g->sw;
}

/* ---- buffers (buffers.c) ------------------------------------------------------- */

/* A C-contiguous buffer of one element type, held until nb_release. */
typedef struct {
    Py_buffer view;
    int held;
} nbuf;

/* Acquire ``obj`` as a C-contiguous buffer of ``itemsize``-byte elements of kind
 * ``kind`` ('f' float, 'i' signed int, 'u' unsigned int) holding at least ``count``
 * elements; on failure a TypeError or ValueError naming ``what`` is set and -1
 * returned. ``obj`` None with ``optional`` leaves ``nb`` unheld and returns 0. */
int nb_get(PyObject *obj, nbuf *nb, char kind, Py_ssize_t itemsize, Py_ssize_t count, int writable, int optional,
           const char *what);
void nb_release(nbuf *nb);
/* The element size of a float array (4 or 8), or -1 with a TypeError naming ``what``. */
Py_ssize_t nb_float_size(PyObject *obj, const char *what);
/* Whether an 8-bit array is int8 (``*is_signed`` 1) or uint8 (0): 0, or -1 with a
 * TypeError naming ``what`` for any other type. */
int nb_int8_kind(PyObject *obj, int *is_signed, const char *what);
/* An 8-bit convolution's scale ratio x_scale * w_scale / y_scale (QLinearConv's
 * requantization): float32, one value or one per output channel of m; acquired into
 * ``nb``, its count returned, or -1 with the error set naming ``who``. */
Py_ssize_t nb_get_ratio(PyObject *obj, nbuf *nb, Py_ssize_t m, const char *who);

/* ---- thread pool (pool.c) ------------------------------------------------------ */

/* One chunk of a parallel loop: ``task(ctx, index)``. */
typedef void (*pool_task)(void *ctx, Py_ssize_t index);

/* Run ``task(ctx, i)`` for every ``i < count`` over up to ``threads`` threads: the
 * caller and ``threads - 1`` pool workers, who claim chunks from a shared counter.
 * Called without the GIL. Where another caller holds the pool, or ``threads`` is 1,
 * the caller runs every chunk itself. */
void pool_run(pool_task task, void *ctx, Py_ssize_t count, int threads);

/* A per-thread scratch buffer of at least ``bytes`` bytes, 64-byte aligned, kept and
 * reused by the thread (``slot`` 0, 1 or 2: three independent buffers); NULL if
 * memory runs out. */
void *scratch(int slot, size_t bytes);

/* ---- BLAS (blas.c) ------------------------------------------------------------- */

/* C = A B (row-major, no transposes, alpha 1, beta 0) through the BLAS numpy uses;
 * 0 on success, -1 where no BLAS function was handed over (blas_ready() is 0). */
int gemm_f32(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const float *a, Py_ssize_t lda, const float *b,
             Py_ssize_t ldb, float *c, Py_ssize_t ldc);
int gemm_f64(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const double *a, Py_ssize_t lda, const double *b,
             Py_ssize_t ldb, double *c, Py_ssize_t ldc);
int blas_ready(void);

/* ---- the methods each file adds to the module ---------------------------------- */

extern PyMethodDef pool_methods[];
extern PyMethodDef geometry_methods[];
extern PyMethodDef blas_methods[];
extern PyMethodDef depthwise_methods[];
extern PyMethodDef conv_methods[];
extern PyMethodDef pool2d_methods[];
extern PyMethodDef elementwise_methods[];
extern PyMethodDef cast16_methods[];
extern PyMethodDef qlstm_methods[];
extern PyMethodDef winograd_methods[];
extern PyMethodDef direct_methods[];
extern PyMethodDef gqa_methods[];
extern PyMethodDef rnn_methods[];
extern PyMethodDef narrow_conv_methods[];
extern PyMethodDef resize2d_methods[];
/* The 8-bit kernels (igemm.c, qconv8.c, nbits8.c): built where the compiler can target
 * AVX-512 VNNI, run where vnni_ready() says this CPU has AVX-512 F, BW, DQ, VL and
 * VNNI, and BMI2. */
#if defined(__GNUC__) && defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 9)
#define VNNI_BUILT 1
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,bmi2")))
#else
#define VNNI_BUILT 0
#endif
int vnni_ready(void);

/* MatMulNBits' int8 rounding of A (accuracy_level 4), one block of n values a: the
 * factor its codes are taken with, rint(a * factor), and in *scale the step
 * max|a| / 127 that multiplies them back; every operation in float32 as the numpy
 * path (_int8_blocks) does it. The floor keeps 127 / max|a| finite: an all-zero
 * block's codes are 0 against any finite factor. Shared by int8_blocks
 * (elementwise.c) and nbits_matmul (nbits8.c), whose codes must be the same. */
static inline float int8_block_factor(const float *a, Py_ssize_t n, float *scale)
{
    float amax = 0.0f;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float v = fabsf(a[i]);
        amax = v > amax ? v : amax;
    }
    *scale = amax / 127.0f;
    const float floor_ = 127.0f / 3.4028234663852886e+38f;
    return 127.0f / (amax > floor_ ? amax : floor_);
}
extern PyMethodDef igemm_methods[];
extern PyMethodDef qconv8_methods[];
extern PyMethodDef nbits8_methods[];

#endif
