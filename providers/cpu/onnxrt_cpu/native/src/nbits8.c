/* MatMulNBits at accuracy_level 4 on AVX-512 VNNI: A's blocks rounded to int8 codes (as
 * onnxruntime's int8 path and the numpy path round them), multiplied with the 4-bit
 * weight's centred values (q - zero point, -15..15, unpacked to int8 once, at session
 * start) in integers, block by block:
 *
 *   y[m, n] = sum over blocks b of  sa[m, b] * sw[n, b] * sum_{k in b} qa[m, k] w'[k, n]
 *
 * where the numpy path takes a float32 GEMM of the rounded A and the dequantized
 * weight. The integer sums are exact; the blocks' float sums come in another order
 * than the GEMM's, so the two agree to float32 rounding (as onnxruntime's does with
 * both).
 *
 * A's codes are stored as uint8 (code + 128, for vpdpbusd's unsigned operand) and the
 * 128 comes back as -128 * (the block's column sum of w'). The weight is packed as
 * igemm's: panels of 16 columns, four consecutive k of a column together.
 */
#include "native.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if VNNI_BUILT
#include <immintrin.h>
#endif

/* Rows of a register tile; its columns are two panels (32). */
#define NB_MR 4
#define NB_NR 32
#define NB_ROWS 64 /* rows of a task */

typedef struct {
    const float *a;
    Py_ssize_t m, k, n, npad, block, nb, kp; /* kp = nb * block */
    const int8_t *w;        /* packed [npad / 16][kp / 4][16][4] */
    const int32_t *colsum;  /* [nb][npad] */
    const float *scale;     /* [nb][npad] */
    const float *bias;      /* [n] or NULL */
    float *out;             /* [m, n] */
    uint8_t *codes;         /* [m][kp]: A's codes + 128 */
    float *sa;              /* [m][nb]: A's block scales */
    Py_ssize_t row_tasks, col_tasks;
} nb_job;

#if VNNI_BUILT

/* Row r of A into codes + 128 and block scales, every operation in float32 as
 * int8_blocks_row (elementwise.c) and the numpy path do it. */
VNNI_TARGET static void nb_quantize_row(const nb_job *j, Py_ssize_t r)
{
    const float *a = j->a + r * j->k;
    uint8_t *q = j->codes + r * j->kp;
    for (Py_ssize_t b = 0; b < j->nb; b++) {
        const Py_ssize_t b0 = b * j->block, n = b0 + j->block <= j->k ? j->block : (j->k > b0 ? j->k - b0 : 0);
        const float inv = int8_block_factor(a + b0, n, j->sa + r * j->nb + b);
        for (Py_ssize_t i = 0; i < n; i++)
            q[b0 + i] = (uint8_t)((int)rintf(a[b0 + i] * inv) + 128);
        for (Py_ssize_t i = n; i < j->block; i++)
            q[b0 + i] = 128; /* past K: a zero code */
    }
}

VNNI_TARGET static void nb_quantize_task(void *arg, Py_ssize_t t)
{
    const nb_job *j = arg;
    const Py_ssize_t r1 = (t + 1) * NB_ROWS < j->m ? (t + 1) * NB_ROWS : j->m;
    for (Py_ssize_t r = t * NB_ROWS; r < r1; r++)
        nb_quantize_row(j, r);
}

#define NB_ROW(r)                                                                                   \
    do {                                                                                             \
        const __m512i x = _mm512_set1_epi32(*(const int32_t *)(q##r + kk));                        \
        i##r##0 = _mm512_dpbusd_epi32(i##r##0, x, w0);                                               \
        i##r##1 = _mm512_dpbusd_epi32(i##r##1, x, w1);                                               \
    } while (0)

#define NB_FOLD(r)                                                                                  \
    do {                                                                                             \
        const __m512 s = _mm512_set1_ps(sa[(r) * j->nb + b]);                                        \
        f##r##0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(i##r##0, c0)), _mm512_mul_ps(sw0, s), f##r##0); \
        f##r##1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(i##r##1, c1)), _mm512_mul_ps(sw1, s), f##r##1); \
    } while (0)

#define NB_STORE(r)                                                                                 \
    do {                                                                                             \
        if (r < mr) {                                                                                \
            float *o = j->out + (row + r) * j->n + col;                                              \
            _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(f##r##0, b0v));                               \
            if (m1)                                                                                  \
                _mm512_mask_storeu_ps(o + 16, m1, _mm512_add_ps(f##r##1, b1v));                      \
        }                                                                                            \
    } while (0)

/* Rows row .. row + mr (mr <= 4) by columns col .. col + 32 (two panels). */
VNNI_TARGET static void nb_tile(const nb_job *j, Py_ssize_t row, int mr, Py_ssize_t col)
{
    const Py_ssize_t kq = j->kp / 4;
    const int8_t *p0 = j->w + (col / 16) * kq * 64, *p1 = p0 + kq * 64;
    const uint8_t *q0 = j->codes + row * j->kp;
    const uint8_t *q1 = mr > 1 ? q0 + j->kp : q0, *q2 = mr > 2 ? q0 + 2 * j->kp : q0, *q3 = mr > 3 ? q0 + 3 * j->kp : q0;
    const float *sa = j->sa + row * j->nb;
    __m512 f00 = _mm512_setzero_ps(), f01 = f00, f10 = f00, f11 = f00, f20 = f00, f21 = f00, f30 = f00, f31 = f00;
    for (Py_ssize_t b = 0; b < j->nb; b++) {
        __m512i i00 = _mm512_setzero_si512(), i01 = i00, i10 = i00, i11 = i00, i20 = i00, i21 = i00, i30 = i00,
                i31 = i00;
        const Py_ssize_t g0 = b * j->block / 4, g1 = g0 + j->block / 4;
        for (Py_ssize_t g = g0; g < g1; g++) {
            const __m512i w0 = _mm512_loadu_si512(p0 + g * 64), w1 = _mm512_loadu_si512(p1 + g * 64);
            const Py_ssize_t kk = 4 * g;
            NB_ROW(0);
            NB_ROW(1);
            NB_ROW(2);
            NB_ROW(3);
        }
        /* the codes' +128, back out: 128 times the block's column sums */
        const __m512i c0 = _mm512_slli_epi32(_mm512_loadu_si512(j->colsum + b * j->npad + col), 7);
        const __m512i c1 = _mm512_slli_epi32(_mm512_loadu_si512(j->colsum + b * j->npad + col + 16), 7);
        const __m512 sw0 = _mm512_loadu_ps(j->scale + b * j->npad + col);
        const __m512 sw1 = _mm512_loadu_ps(j->scale + b * j->npad + col + 16);
        NB_FOLD(0);
        NB_FOLD(1);
        NB_FOLD(2);
        NB_FOLD(3);
    }
    const Py_ssize_t left = j->n - col;
    const __mmask16 m0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    const __mmask16 m1 = left >= 32 ? (__mmask16)0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
    const __m512 b0v = j->bias ? _mm512_maskz_loadu_ps(m0, j->bias + col) : _mm512_setzero_ps();
    const __m512 b1v = j->bias && m1 ? _mm512_maskz_loadu_ps(m1, j->bias + col + 16) : _mm512_setzero_ps();
    NB_STORE(0);
    NB_STORE(1);
    NB_STORE(2);
    NB_STORE(3);
}

/* A task: a block of NB_ROWS rows by one pair of panels (the panels stay in cache while
 * the rows pass). */
VNNI_TARGET static void nb_task(void *arg, Py_ssize_t t)
{
    const nb_job *j = arg;
    const Py_ssize_t r0 = (t / j->col_tasks) * NB_ROWS, col = (t % j->col_tasks) * NB_NR;
    const Py_ssize_t r1 = r0 + NB_ROWS < j->m ? r0 + NB_ROWS : j->m;
    for (Py_ssize_t r = r0; r < r1; r += NB_MR)
        nb_tile(j, r, r1 - r < NB_MR ? (int)(r1 - r) : NB_MR, col);
}

#endif

PyDoc_STRVAR(nbits_matmul_doc,
"nbits_matmul(a, packed, colsum, scale, bias, out, dims, threads)\n\n"
"MatMulNBits at accuracy_level 4: the float32 rows a [m, k] rounded to int8 codes per\n"
"block of ``block`` values (as int8_blocks), times the weight's centred int8 values\n"
"packed as igemm's B ([npad / 16][kp / 4][16][4], kp = nb * block, zeros past k and n),\n"
"in integers a block at a time; each block's sums times a's block scale and the\n"
"weight's (scale [nb][npad] float32), summed in float32, plus bias [n] (or None), into\n"
"out [m, n] float32. colsum is int32 [nb][npad]: each block's column sums of the\n"
"weight. dims is (m, k, n, block). AVX-512 VNNI only; runs on up to threads threads,\n"
"without the GIL.");

static PyObject *nbits_matmul(PyObject *self, PyObject *args)
{
    PyObject *ao, *po, *co, *so, *bo, *oo;
    nb_job j;
    int threads;
    memset(&j, 0, sizeof(j));
    if (!PyArg_ParseTuple(args, "OOOOOO(nnnn)i:nbits_matmul", &ao, &po, &co, &so, &bo, &oo, &j.m, &j.k, &j.n,
                          &j.block, &threads))
        return NULL;
    if (!vnni_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "nbits_matmul: this CPU has no AVX-512 VNNI");
        return NULL;
    }
    if (j.m < 0 || j.k < 1 || j.n < 1 || j.block < 4 || j.block % 4) {
        PyErr_SetString(PyExc_ValueError, "nbits_matmul: invalid dimensions (block a multiple of 4)");
        return NULL;
    }
    j.nb = (j.k + j.block - 1) / j.block;
    j.kp = j.nb * j.block;
    j.npad = (j.n + NB_NR - 1) / NB_NR * NB_NR;
    if (j.block > 33024) {
        PyErr_SetString(PyExc_ValueError, "nbits_matmul: block too long for exact int32 sums");
        return NULL;
    }
    nbuf a, p, c, s, b, o;
    a.held = p.held = c.held = s.held = b.held = o.held = 0;
    if (nb_get(ao, &a, 'f', 4, j.m * j.k, 0, 0, "nbits_matmul: a") < 0 ||
        nb_get(po, &p, 'i', 1, j.npad * j.kp, 0, 0, "nbits_matmul: packed") < 0 ||
        nb_get(co, &c, 'i', 4, j.nb * j.npad, 0, 0, "nbits_matmul: colsum") < 0 ||
        nb_get(so, &s, 'f', 4, j.nb * j.npad, 0, 0, "nbits_matmul: scale") < 0 ||
        nb_get(bo, &b, 'f', 4, j.n, 0, 1, "nbits_matmul: bias") < 0 ||
        nb_get(oo, &o, 'f', 4, j.m * j.n, 1, 0, "nbits_matmul: out") < 0)
        goto done;
    j.a = a.view.buf;
    j.w = p.view.buf;
    j.colsum = c.view.buf;
    j.scale = s.view.buf;
    j.bias = b.held ? b.view.buf : NULL;
    j.out = o.view.buf;
    if (j.m) {
        j.codes = PyMem_RawMalloc((size_t)(j.m * j.kp) + 64);
        j.sa = PyMem_RawMalloc((size_t)(j.m * j.nb) * sizeof(float));
        if (!j.codes || !j.sa) {
            PyErr_NoMemory();
            goto done;
        }
#if VNNI_BUILT
        j.row_tasks = (j.m + NB_ROWS - 1) / NB_ROWS;
        j.col_tasks = j.npad / NB_NR;
        Py_BEGIN_ALLOW_THREADS
        pool_run(nb_quantize_task, &j, j.row_tasks, threads);
        pool_run(nb_task, &j, j.row_tasks * j.col_tasks, threads);
        Py_END_ALLOW_THREADS
#endif
    }
done:
    PyMem_RawFree(j.codes);
    PyMem_RawFree(j.sa);
    nb_release(&a);
    nb_release(&p);
    nb_release(&c);
    nb_release(&s);
    nb_release(&b);
    nb_release(&o);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef nbits8_methods[] = {
    {"nbits_matmul", nbits_matmul, METH_VARARGS, nbits_matmul_doc},
    {NULL, NULL, 0, NULL},
};
