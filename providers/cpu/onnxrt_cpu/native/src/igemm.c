/* 8-bit matrix products (DynamicQuantizeMatMul, MatMulInteger, MatMulIntegerToFloat)
 * on AVX-512 VNNI: one vpdpbusd multiplies 64 unsigned by signed byte pairs and adds
 * them in fours into 16 int32 sums, four times the multiply-adds of a float32 FMA. The
 * numpy path takes the products through a float32 GEMM (exact while they fit 24 bits);
 * here they are exact in int32, and the result is converted once, so both agree bit
 * for bit.
 *
 * B is packed once, at session creation (onnxrt_cpu.native.pack_int8_weights): the
 * values as int8 (uint8 B shifted by -128), in panels of 16 columns, each column's
 * four consecutive k next to each other ([N/16][K/4][16][4]), zero-padded to whole
 * panels of four k. A's rows are brought to uint8 (int8 A shifted by +128; float A
 * quantized as DynamicQuantizeLinear does) by each task for its own rows. The shifts
 * and the zero points come back in as corrections of the int32 sums:
 *
 *   sum (a - za)(b - zb) = sum a b - zb sum a - za sum b + K za zb
 *
 * with int32 arithmetic that wraps, which is exact wherever the true sum fits int32
 * (the caller keeps K below 33025: 255 * 255 * K < 2^31).
 */
#include "native.h"

#include <math.h>

#if VNNI_BUILT
#include <immintrin.h>
#endif

/* Rows of a micro-tile; its columns are two panels (32). */
#define MR 8
#define NR 32

typedef struct {
    const void *a;
    int a_kind; /* 0 float32 (quantized here), 1 uint8, 2 int8 */
    float a_scale;
    int32_t za; /* A's zero point after the shift to uint8 */
    Py_ssize_t m, k, k4, n, npad, lda;
    const int8_t *b;
    const int32_t *zb;    /* [npad]: B's zero points after its shift */
    const int32_t *colterm; /* [npad]: K za zb - za sum b */
    const float *scale, *bias; /* [n] each, or NULL */
    int scale_one;             /* scale is one value for every column */
    void *out;
    int out_f32;
    int out_8bit;   /* 0: int32 or float32 out; 1 uint8, 2 int8: requantized */
    float yzp;      /* the 8-bit output's zero point */
    Py_ssize_t row_block, col_block, col_tasks;
    int failed, nan;
} ig_job;

#if VNNI_BUILT

/* Rows r0 .. r1 of A as uint8 rows of k4 bytes (zeros past k) into ``dst``, their sums
 * into ``rowsum``; rows up to a whole micro-tile are zeros. Float A is quantized as
 * DynamicQuantizeLinear: saturate(rint(x / scale) + za), the quotient in float32 as
 * the numpy path divides; a NaN sets job->nan (the caller falls back). */
VNNI_TARGET static void ig_rows(ig_job *j, Py_ssize_t r0, Py_ssize_t r1, uint8_t *dst, int32_t *rowsum)
{
    const Py_ssize_t k = j->k, k4 = j->k4;
    Py_ssize_t rows = r1 - r0, padded = (rows + MR - 1) / MR * MR;
    const __m512 scale = _mm512_set1_ps(j->a_scale), zp = _mm512_set1_ps((float)j->za);
    const __m512 lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.0f);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (Py_ssize_t r = 0; r < rows; r++) {
        uint8_t *d = dst + r * k4;
        __m512i sum = _mm512_setzero_si512();
        if (j->a_kind == 0) {
            const float *x = (const float *)j->a + (r0 + r) * j->lda;
            __mmask16 bad = 0;
            for (Py_ssize_t i = 0; i < k; i += 16) {
                __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i)) - 1);
                __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
                v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zp);
                bad |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
                v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                __m512i q = _mm512_maskz_cvtps_epi32(m, v);
                sum = _mm512_add_epi32(sum, q);
                _mm_mask_storeu_epi8(d + i, m, _mm512_cvtepi32_epi8(q));
            }
            if (bad)
                j->nan = 1;
        } else {
            const uint8_t *x = (const uint8_t *)j->a + (r0 + r) * j->lda;
            for (Py_ssize_t i = 0; i < k; i += 64) {
                __mmask64 m = k - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (k - i)) - 1);
                __m512i q = _mm512_maskz_loadu_epi8(m, x + i);
                if (j->a_kind == 2) /* int8 to uint8 + 128: the sign bit flipped */
                    q = _mm512_maskz_mov_epi8(m, _mm512_xor_si512(q, flip));
                /* byte sums in fours: a multiply-add by ones */
                sum = _mm512_dpbusd_epi32(sum, q, _mm512_set1_epi8(1));
                _mm512_mask_storeu_epi8(d + i, m, q);
            }
        }
        for (Py_ssize_t i = k; i < k4; i++)
            d[i] = 0;
        rowsum[r] = _mm512_reduce_add_epi32(sum);
    }
    if (padded > rows)
        memset(dst + rows * k4, 0, (size_t)((padded - rows) * k4));
}

/* Four bytes of a row as one int32 (any alignment). */
static inline int32_t ig_four(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define IG_ROW(i)                                                                                                \
    x = _mm512_set1_epi32(ig_four(a + (i) * k4 + q * 4));                                                         \
    c##i##0 = _mm512_dpbusd_epi32(c##i##0, x, w0);                                                                \
    c##i##1 = _mm512_dpbusd_epi32(c##i##1, x, w1);

/* One micro-tile: 8 rows (of which the first ``mr`` are written) by 32 columns from
 * ``col``, the sums corrected and written (converted, scaled and biased for float
 * output; masked past column n). The accumulators are sixteen named variables: GCC
 * copies an array of vectors between registers on every multiply-add. The scale and
 * bias are applied with explicitly rounded operations, which the compiler cannot
 * contract into an FMA: a multiply, then an add, each rounded, as numpy does them. */
VNNI_TARGET static void ig_tile(const ig_job *j, const uint8_t *a, const int32_t *rowsum, Py_ssize_t row,
                              Py_ssize_t col, int mr)
{
    const Py_ssize_t kq = j->k4 / 4, k4 = j->k4;
    const int8_t *p0 = j->b + (col / 16) * kq * 64, *p1 = p0 + kq * 64;
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00, x;
    for (Py_ssize_t q = 0; q < kq; q++) {
        __m512i w0 = _mm512_loadu_si512((const void *)(p0 + q * 64));
        __m512i w1 = _mm512_loadu_si512((const void *)(p1 + q * 64));
        IG_ROW(0) IG_ROW(1) IG_ROW(2) IG_ROW(3) IG_ROW(4) IG_ROW(5) IG_ROW(6) IG_ROW(7)
    }
    __m512i acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                          {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
    for (int h = 0; h < 2; h++) {
        Py_ssize_t c = col + 16 * h;
        if (c >= j->n)
            break;
        __mmask16 mask = j->n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j->n - c)) - 1);
        __m512i zb = _mm512_loadu_si512((const void *)(j->zb + c));
        __m512i ct = _mm512_loadu_si512((const void *)(j->colterm + c));
        __m512 sc = _mm512_setzero_ps(), bi = _mm512_setzero_ps();
        if (j->scale)
            sc = j->scale_one ? _mm512_set1_ps(j->scale[0]) : _mm512_maskz_loadu_ps(mask, j->scale + c);
        if (j->bias)
            bi = _mm512_maskz_loadu_ps(mask, j->bias + c);
        for (int i = 0; i < mr; i++) {
            __m512i v = _mm512_sub_epi32(acc[i][h], _mm512_mullo_epi32(zb, _mm512_set1_epi32(rowsum[i])));
            v = _mm512_add_epi32(v, ct);
            Py_ssize_t at = (row + i) * j->n + c;
            if (j->out_8bit) {
                /* QLinearMatMul's requantization, as the numpy path: the sum times
                 * the float32 ratio, rounded half to even, plus the zero point,
                 * saturated */
                __m512 f = _mm512_mul_round_ps(_mm512_cvtepi32_ps(v), sc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                f = _mm512_add_ps(_mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                  _mm512_set1_ps(j->yzp));
                if (j->out_8bit == 2) {
                    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
                    _mm_mask_storeu_epi8((int8_t *)j->out + at, mask, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(f)));
                } else {
                    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
                    _mm_mask_storeu_epi8((uint8_t *)j->out + at, mask, _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(f)));
                }
            } else if (j->out_f32) {
                __m512 f = _mm512_cvtepi32_ps(v);
                if (j->scale)
                    f = _mm512_mul_round_ps(f, sc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                if (j->bias)
                    f = _mm512_add_round_ps(f, bi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm512_mask_storeu_ps((float *)j->out + at, mask, f);
            } else {
                _mm512_mask_storeu_epi32((int32_t *)j->out + at, mask, v);
            }
        }
    }
}

/* A task: a block of rows by a block of columns. Its rows are brought to uint8 in the
 * thread's scratch, then every pair of panels runs down them in micro-tiles (the
 * panels, K x 32 bytes, stay in cache while the rows pass). */
VNNI_TARGET static void ig_task(void *arg, Py_ssize_t t)
{
    ig_job *j = arg;
    const Py_ssize_t r0 = (t / j->col_tasks) * j->row_block, c0 = (t % j->col_tasks) * j->col_block;
    const Py_ssize_t r1 = r0 + j->row_block < j->m ? r0 + j->row_block : j->m;
    const Py_ssize_t c1 = c0 + j->col_block < j->npad ? c0 + j->col_block : j->npad;
    const Py_ssize_t rows = r1 - r0, padded = (rows + MR - 1) / MR * MR;
    uint8_t *a = scratch(0, (size_t)(padded * j->k4) + (size_t)padded * sizeof(int32_t));
    if (!a) {
        j->failed = 1;
        return;
    }
    int32_t *rowsum = (int32_t *)(a + padded * j->k4);
    ig_rows(j, r0, r1, a, rowsum);
    for (Py_ssize_t c = c0; c < c1; c += NR)
        for (Py_ssize_t r = 0; r < rows; r += MR)
            ig_tile(j, a + r * j->k4, rowsum + r, r0 + r, c, rows - r < MR ? (int)(rows - r) : MR);
}

int vnni_ready(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("bmi2");
    }
    return known;
}

#else

int vnni_ready(void)
{
    return 0;
}

#endif

PyDoc_STRVAR(igemm_ready_doc,
"igemm_ready()\n\n"
"Whether this CPU runs the 8-bit kernels: igemm, qconv8 and nbits_matmul (AVX-512 with\n"
"VNNI).");

static PyObject *igemm_ready(PyObject *self, PyObject *noargs)
{
    return PyBool_FromLong(vnni_ready());
}

PyDoc_STRVAR(igemm_doc,
"igemm(a, a_scale, a_zero_point, packed, zb, colsum, scale, bias, out, dims, threads,\n"
"      y_zero_point=None)\n\n"
"out[m, n] = sum_k (a[m, k] - a_zero_point) (B[k, n] - zb[n]), B as packed by\n"
"onnxrt_cpu.native.pack_int8_weights. a is [m, k] (rows lda apart) of float32\n"
"(quantized first to uint8 with a_scale and a_zero_point, as DynamicQuantizeLinear),\n"
"uint8 or int8. zb and colsum are int32 [npad]: B's zero points and column sums after\n"
"the packing's shift. out is float32 (then the sums times scale [n] or [1], plus bias [n],\n"
"each optional) or int32 [m, n]; with y_zero_point, uint8 or int8 [m, n]: 8-bit a's sums\n"
"times scale, rounded half to even, plus y_zero_point, saturated (QLinearMatMul).\n"
"dims is (m, k, n, lda). Returns False where float A\n"
"held a NaN (nothing useful was written), else True. Runs on up to threads threads,\n"
"without the GIL.");

static PyObject *igemm(PyObject *self, PyObject *args)
{
    PyObject *ao, *po, *zbo, *cso, *sco, *bio, *outo, *yzo = Py_None;
    double a_scale;
    int za, threads;
    ig_job j;
    memset(&j, 0, sizeof(j));
    if (!PyArg_ParseTuple(args, "OdiOOOOOO(nnnn)i|O:igemm", &ao, &a_scale, &za, &po, &zbo, &cso, &sco, &bio, &outo,
                          &j.m, &j.k, &j.n, &j.lda, &threads, &yzo))
        return NULL;
    if (!vnni_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "igemm: this CPU has no AVX-512 VNNI (see igemm_ready)");
        return NULL;
    }
    if (j.m < 0 || j.k < 1 || j.k > 33024 || j.n < 1 || j.lda < j.k) {
        PyErr_SetString(PyExc_ValueError, "igemm: invalid dimensions (k from 1 to 33024, n at least 1, lda >= k)");
        return NULL;
    }
    j.k4 = (j.k + 3) / 4 * 4;
    j.npad = (j.n + NR - 1) / NR * NR;
    nbuf a, p, zb, cs, sc, bi, out;
    a.held = p.held = zb.held = cs.held = sc.held = bi.held = out.held = 0;
    int32_t *colterm = NULL;
    int ok = 0;
    Py_ssize_t fsize = 0;
    int is_signed = 0;
    if (PyObject_CheckBuffer(ao) && (fsize = nb_float_size(ao, "igemm: a")) == 4) {
        j.a_kind = 0;
        if (!(a_scale > 0.0) || za < 0 || za > 255) {
            PyErr_SetString(PyExc_ValueError, "igemm: float a needs a positive scale and a zero point in 0..255");
            goto done;
        }
    } else {
        PyErr_Clear();
        if (nb_int8_kind(ao, &is_signed, "igemm: a") < 0)
            goto done;
        j.a_kind = is_signed ? 2 : 1;
        if (is_signed ? (za < -128 || za > 127) : (za < 0 || za > 255)) {
            PyErr_SetString(PyExc_ValueError, "igemm: a_zero_point outside a's type");
            goto done;
        }
    }
    j.a_scale = (float)a_scale;
    j.za = j.a_kind == 2 ? za + 128 : za;
    Py_ssize_t a_count = j.m ? (j.m - 1) * j.lda + j.k : 0;
    int out_f32 = 0;
    if (nb_get(ao, &a, j.a_kind == 0 ? 'f' : (j.a_kind == 2 ? 'i' : 'u'), j.a_kind == 0 ? 4 : 1, a_count, 0, 0,
               "igemm: a") < 0 ||
        nb_get(po, &p, 'i', 1, j.npad * j.k4, 0, 0, "igemm: packed") < 0 ||
        nb_get(zbo, &zb, 'i', 4, j.npad, 0, 0, "igemm: zb") < 0 ||
        nb_get(cso, &cs, 'i', 4, j.npad, 0, 0, "igemm: colsum") < 0)
        goto done;
    if (yzo != Py_None) {
        /* 8-bit output, requantized with this zero point */
        long yz = PyLong_AsLong(yzo);
        if (yz == -1 && PyErr_Occurred())
            goto done;
        if (nb_int8_kind(outo, &is_signed, "igemm: out") < 0)
            goto done;
        if (is_signed ? (yz < -128 || yz > 127) : (yz < 0 || yz > 255)) {
            PyErr_SetString(PyExc_ValueError, "igemm: y_zero_point outside out's type");
            goto done;
        }
        j.out_8bit = is_signed ? 2 : 1;
        j.yzp = (float)yz;
    } else if (PyObject_CheckBuffer(outo) && nb_float_size(outo, "igemm: out") == 4) {
        out_f32 = 1;
    }
    PyErr_Clear();
    if (nb_get(outo, &out, j.out_8bit ? (j.out_8bit == 2 ? 'i' : 'u') : out_f32 ? 'f' : 'i', j.out_8bit ? 1 : 4,
               j.m * j.n, 1, 0, "igemm: out") < 0 ||
        nb_get(sco, &sc, 'f', 4, 1, 0, 1, "igemm: scale") < 0 ||
        nb_get(bio, &bi, 'f', 4, j.n, 0, 1, "igemm: bias") < 0)
        goto done;
    if (sc.held && sc.view.len / 4 != 1 && sc.view.len / 4 != j.n) {
        PyErr_Format(PyExc_ValueError, "igemm: scale holds %zd values, expected 1 or %zd", sc.view.len / 4, j.n);
        goto done;
    }
    j.scale_one = sc.held && sc.view.len / 4 == 1;
    if (!out_f32 && !j.out_8bit && (sc.held || bi.held)) {
        PyErr_SetString(PyExc_ValueError, "igemm: a scale or bias needs float32 output");
        goto done;
    }
    if (j.out_8bit && (!sc.held || bi.held || j.a_kind == 0)) {
        PyErr_SetString(PyExc_ValueError, "igemm: 8-bit output takes 8-bit a, a scale and no bias");
        goto done;
    }
    colterm = PyMem_RawMalloc((size_t)j.npad * sizeof(int32_t));
    if (!colterm) {
        PyErr_NoMemory();
        goto done;
    }
    const int32_t *zbv = zb.view.buf, *csv = cs.view.buf;
    for (Py_ssize_t c = 0; c < j.npad; c++)
        colterm[c] = (int32_t)((uint32_t)j.k * (uint32_t)j.za * (uint32_t)zbv[c] - (uint32_t)j.za * (uint32_t)csv[c]);
    j.a = a.view.buf;
    j.b = p.view.buf;
    j.zb = zbv;
    j.colterm = colterm;
    j.scale = sc.held ? sc.view.buf : NULL;
    j.bias = bi.held ? bi.view.buf : NULL;
    j.out = out.view.buf;
    j.out_f32 = out_f32;
    if (j.m == 0) {
        ok = 1;
        goto done;
    }
    /* tasks: blocks of 64 rows; where that leaves fewer than two tasks a thread, the
     * columns are split as well (in whole pairs of panels) */
    if (threads < 1)
        threads = 1;
    j.row_block = 64;
    Py_ssize_t row_tasks = (j.m + j.row_block - 1) / j.row_block;
    if (row_tasks < threads && j.m > MR) {
        j.row_block = ((j.m + threads - 1) / threads + MR - 1) / MR * MR;
        row_tasks = (j.m + j.row_block - 1) / j.row_block;
    }
    Py_ssize_t pairs = j.npad / NR, want = row_tasks >= 2 * threads ? 1 : (2 * threads + row_tasks - 1) / row_tasks;
    /* a column block of at least 4 pairs, so that the rows' quantization is repeated
     * for at most a small part of the work */
    Py_ssize_t col_tasks = want < pairs / 4 ? want : (pairs / 4 > 1 ? pairs / 4 : 1);
    j.col_block = (pairs + col_tasks - 1) / col_tasks * NR;
    j.col_tasks = (j.npad + j.col_block - 1) / j.col_block;
#if VNNI_BUILT
    Py_BEGIN_ALLOW_THREADS
    pool_run(ig_task, &j, row_tasks * j.col_tasks, threads);
    Py_END_ALLOW_THREADS
#endif
    if (j.failed)
        PyErr_NoMemory();
    else
        ok = 1;
done:
    PyMem_RawFree(colterm);
    nb_release(&a);
    nb_release(&p);
    nb_release(&zb);
    nb_release(&cs);
    nb_release(&sc);
    nb_release(&bi);
    nb_release(&out);
    if (!ok)
        return NULL;
    return PyBool_FromLong(!j.nan);
}

/* ---- The range of float32 data: DynamicQuantizeLinear's scale and zero point come
 * from it (one pass where numpy's min and max take two) ---------------------------- */

/* (lo, hi) of v[0..n); returns whether a NaN was seen (the comparisons skip it). */
static int range_scalar(const float *v, Py_ssize_t i, Py_ssize_t n, float *lo, float *hi)
{
    int nan = 0;
    for (; i < n; i++) {
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
        nan |= v[i] != v[i];
    }
    return nan;
}

#if VNNI_BUILT
/* vminps / vmaxps return their second operand where either is NaN: the extremes stay
 * those of the numbers, and the NaN is noted by an unordered compare. Two sets of
 * extremes, so that one's latency hides behind the other's. */
__attribute__((target("avx512f"))) static int range_avx512(const float *v, Py_ssize_t n, float *lo, float *hi)
{
    Py_ssize_t i = 0;
    int nan = 0;
    if (n >= 32) {
        __m512 lo0 = _mm512_loadu_ps(v), lo1 = _mm512_loadu_ps(v + 16), hi0 = lo0, hi1 = lo1;
        __mmask16 bad = _mm512_cmp_ps_mask(lo0, lo0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(lo1, lo1, _CMP_UNORD_Q);
        for (i = 32; i + 32 <= n; i += 32) {
            const __m512 x0 = _mm512_loadu_ps(v + i), x1 = _mm512_loadu_ps(v + i + 16);
            lo0 = _mm512_min_ps(x0, lo0);
            hi0 = _mm512_max_ps(x0, hi0);
            lo1 = _mm512_min_ps(x1, lo1);
            hi1 = _mm512_max_ps(x1, hi1);
            bad |= _mm512_cmp_ps_mask(x0, x1, _CMP_UNORD_Q); /* a NaN in either */
        }
        /* a lane that started as NaN holds it until a number replaces it: noted above */
        *lo = _mm512_reduce_min_ps(_mm512_min_ps(lo1, lo0));
        *hi = _mm512_reduce_max_ps(_mm512_max_ps(hi1, hi0));
        nan = bad != 0;
    }
    return range_scalar(v, i, n, lo, hi) | nan;
}

static int avx512f_here(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f");
    }
    return known;
}
#endif

PyDoc_STRVAR(float_range_doc,
"float_range(x)\n\n"
"(min, max) of the float32 values of x (a C-contiguous buffer of at least one value)\n"
"as Python floats; both NaN where x holds a NaN, as numpy's min and max give.");

static PyObject *float_range(PyObject *self, PyObject *arg)
{
    nbuf x;
    x.held = 0;
    if (nb_get(arg, &x, 'f', 4, 1, 0, 0, "float_range: x") < 0)
        return NULL;
    const float *v = x.view.buf;
    const Py_ssize_t n = x.view.len / 4;
    float lo = INFINITY, hi = -INFINITY;
    int nan;
#if VNNI_BUILT
    if (avx512f_here())
        nan = range_avx512(v, n, &lo, &hi);
    else
#endif
        nan = range_scalar(v, 0, n, &lo, &hi);
    nb_release(&x);
    if (nan)
        lo = hi = NAN;
    return Py_BuildValue("(dd)", (double)lo, (double)hi);
}

/* ---- B packed at run time (a QLinearMatMul of two activations) -------------------- */

PyDoc_STRVAR(igemm_pack_doc,
"igemm_pack(b, packed, colsum)\n\n"
"A uint8 or int8 b [k, n] (C-contiguous) into igemm's layout, as\n"
"onnxrt_cpu.native.pack_int8_weights packs it: packed int8 [npad / 16, k4 / 4, 16, 4]\n"
"(uint8 shifted by -128, zeros past k and n; k4 k rounded up to 4, npad n to 32) and\n"
"colsum int32 [npad], the shifted columns' sums.");

static PyObject *igemm_pack(PyObject *self, PyObject *args)
{
    PyObject *bo, *po, *co;
    if (!PyArg_ParseTuple(args, "OOO:igemm_pack", &bo, &po, &co))
        return NULL;
    Py_buffer probe;
    if (PyObject_GetBuffer(bo, &probe, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0)
        return NULL;
    int nd = probe.ndim;
    Py_ssize_t k = nd == 2 ? probe.shape[0] : 0, n = nd == 2 ? probe.shape[1] : 0;
    PyBuffer_Release(&probe);
    if (nd != 2 || k < 1 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "igemm_pack: b must be a non-empty 2-D array");
        return NULL;
    }
    int is_signed;
    if (nb_int8_kind(bo, &is_signed, "igemm_pack: b") < 0)
        return NULL;
    const Py_ssize_t k4 = (k + 3) / 4 * 4, npad = (n + NR - 1) / NR * NR, kq = k4 / 4;
    nbuf b, p, c;
    b.held = p.held = c.held = 0;
    PyObject *result = NULL;
    if (nb_get(bo, &b, is_signed ? 'i' : 'u', 1, k * n, 0, 0, "igemm_pack: b") < 0 ||
        nb_get(po, &p, 'i', 1, npad * k4, 1, 0, "igemm_pack: packed") < 0 ||
        nb_get(co, &c, 'i', 4, npad, 1, 0, "igemm_pack: colsum") < 0)
        goto done;
    {
        const uint8_t *src = b.view.buf;
        int8_t *dst = p.view.buf;
        int32_t *cs = c.view.buf;
        const uint8_t flip = is_signed ? 0 : 0x80;
        Py_BEGIN_ALLOW_THREADS
        memset(cs, 0, (size_t)npad * sizeof(int32_t));
        for (Py_ssize_t panel = 0; panel < npad / 16; panel++) {
            const Py_ssize_t c0 = panel * 16, width = n - c0 >= 16 ? 16 : (n > c0 ? n - c0 : 0);
            int8_t *pp = dst + panel * kq * 64;
            int32_t sums[16] = {0};
            for (Py_ssize_t q = 0; q < kq; q++) {
                int8_t *d = pp + q * 64;
                for (int r = 0; r < 4; r++) {
                    const Py_ssize_t row = q * 4 + r;
                    if (row >= k) {
                        for (int cc = 0; cc < 16; cc++)
                            d[cc * 4 + r] = 0;
                        continue;
                    }
                    const uint8_t *line = src + row * n + c0;
                    int cc = 0;
                    for (; cc < width; cc++) {
                        int8_t v = (int8_t)(line[cc] ^ flip);
                        d[cc * 4 + r] = v;
                        sums[cc] += v;
                    }
                    for (; cc < 16; cc++)
                        d[cc * 4 + r] = 0;
                }
            }
            for (int cc = 0; cc < 16; cc++)
                cs[c0 + cc] = sums[cc];
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_None;
    Py_INCREF(result);
done:
    nb_release(&b);
    nb_release(&p);
    nb_release(&c);
    return result;
}

/* ---- QuantizeLinear and DequantizeLinear of 8-bit integers --------------------------
 * Per tensor or per axis (block_size 0). The element i's scale and zero point are those
 * of index (i / inner) % count: count 1 per tensor, else the axis' length, with inner
 * the elements after the axis. The work is cut into runs of Q8_CHUNK elements. */

#define Q8_CHUNK 16384

typedef struct {
    const void *x;
    void *out;
    const float *scale;
    const void *zp; /* NULL: zero */
    Py_ssize_t n, inner, count;
    int is_signed;
} q8_job;

/* saturate(rint(x / scale) + zp): the quotient in float32 and rounded half to even, as
 * the numpy path computes it; a NaN gives the code 0, as numpy's conversion of NaN to
 * an 8-bit type does on x86-64. */
#if VNNI_BUILT
/* The same, sixteen at a time: the quotient, its rounding (half to even), the zero
 * point and the clamps are each one float32 operation, as in the loop below; a NaN
 * lane (unordered) is masked to 0. */
__attribute__((target("avx512f,avx512bw"))) static Py_ssize_t q8_avx512(const float *x, Py_ssize_t n, float s,
                                                                         float zp, int is_signed, uint8_t *d)
{
    const __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(zp);
    const __m512 lo = _mm512_set1_ps(is_signed ? -128.0f : 0.0f), hi = _mm512_set1_ps(is_signed ? 127.0f : 255.0f);
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_div_ps(_mm512_loadu_ps(x + i), vs);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        __mmask16 ok = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        __m512i q = _mm512_maskz_cvtps_epi32(ok, v);
        _mm_storeu_si128((__m128i *)(d + i), _mm512_cvtepi32_epi8(q));
    }
    return i;
}

static int avx512_here(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    }
    return known;
}
#endif

NATIVE_CLONES static void q8_run(const float *restrict x, Py_ssize_t n, float s, float zp, int is_signed,
                                 void *restrict dst)
{
    const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
#if VNNI_BUILT
    if (avx512_here()) {
        Py_ssize_t done = q8_avx512(x, n, s, zp, is_signed, dst);
        x += done;
        n -= done;
        dst = (uint8_t *)dst + done;
    }
#endif
    if (is_signed) {
        int8_t *restrict d = dst;
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = rintf(x[i] / s) + zp;
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            d[i] = (int8_t)(int32_t)(v == v ? v : 0.0f);
        }
    } else {
        uint8_t *restrict d = dst;
        for (Py_ssize_t i = 0; i < n; i++) {
            float v = rintf(x[i] / s) + zp;
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            d[i] = (uint8_t)(int32_t)(v == v ? v : 0.0f);
        }
    }
}

/* (x - zp) * scale in float32: the difference is exact, the product rounded once. */
NATIVE_CLONES static void dq8_run(const void *restrict src, Py_ssize_t n, float s, float zp, int is_signed,
                                  float *restrict d)
{
    if (is_signed) {
        const int8_t *restrict x = src;
        for (Py_ssize_t i = 0; i < n; i++)
            d[i] = ((float)x[i] - zp) * s;
    } else {
        const uint8_t *restrict x = src;
        for (Py_ssize_t i = 0; i < n; i++)
            d[i] = ((float)x[i] - zp) * s;
    }
}

static float q8_zero(const q8_job *j, Py_ssize_t a)
{
    if (!j->zp)
        return 0.0f;
    return j->is_signed ? (float)((const int8_t *)j->zp)[a] : (float)((const uint8_t *)j->zp)[a];
}

static void q8_task(void *arg, Py_ssize_t t, int dequant)
{
    const q8_job *j = arg;
    Py_ssize_t i = t * Q8_CHUNK, e = i + Q8_CHUNK < j->n ? i + Q8_CHUNK : j->n;
    while (i < e) {
        Py_ssize_t row = j->count == 1 ? 0 : i / j->inner, a = j->count == 1 ? 0 : row % j->count;
        Py_ssize_t end = j->count == 1 ? e : ((row + 1) * j->inner < e ? (row + 1) * j->inner : e);
        if (dequant)
            dq8_run((const uint8_t *)j->x + i, end - i, j->scale[a], q8_zero(j, a), j->is_signed,
                    (float *)j->out + i);
        else
            q8_run((const float *)j->x + i, end - i, j->scale[a], q8_zero(j, a), j->is_signed,
                   (uint8_t *)j->out + i);
        i = end;
    }
}

static void q8_quant_task(void *arg, Py_ssize_t t)
{
    q8_task(arg, t, 0);
}

static void q8_dequant_task(void *arg, Py_ssize_t t)
{
    q8_task(arg, t, 1);
}

/* Both directions: ``dequant`` 0 quantizes float32 x into 8-bit out, 1 the reverse. */
static PyObject *q8_common(PyObject *args, int dequant, const char *who)
{
    PyObject *xo, *so, *zo, *oo;
    Py_ssize_t inner;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOni", &xo, &so, &zo, &oo, &inner, &threads))
        return NULL;
    char what[64];
    nbuf x, s, z, o;
    x.held = s.held = z.held = o.held = 0;
    PyObject *result = NULL;
    int is_signed = 0;
    q8_job j;
    memset(&j, 0, sizeof(j));
    snprintf(what, sizeof what, "%s: %s", who, dequant ? "x" : "out");
    if (nb_int8_kind(dequant ? xo : oo, &is_signed, what) < 0)
        goto done;
    const char ik = is_signed ? 'i' : 'u';
    snprintf(what, sizeof what, "%s: x", who);
    if (nb_get(xo, &x, dequant ? ik : 'f', dequant ? 1 : 4, 0, 0, 0, what) < 0)
        goto done;
    j.n = x.view.len / x.view.itemsize;
    snprintf(what, sizeof what, "%s: out", who);
    if (nb_get(oo, &o, dequant ? 'f' : ik, dequant ? 4 : 1, j.n, 1, 0, what) < 0)
        goto done;
    snprintf(what, sizeof what, "%s: scale", who);
    if (nb_get(so, &s, 'f', 4, 1, 0, 0, what) < 0)
        goto done;
    j.count = s.view.len / 4;
    snprintf(what, sizeof what, "%s: zero_point", who);
    if (nb_get(zo, &z, ik, 1, j.count, 0, 1, what) < 0)
        goto done;
    if (z.held && z.view.len != j.count) {
        PyErr_Format(PyExc_ValueError, "%s: zero_point holds %zd values, scale %zd", who, z.view.len, j.count);
        goto done;
    }
    if (j.count > 1 && (inner < 1 || j.n % (inner * j.count))) {
        PyErr_Format(PyExc_ValueError, "%s: %zd elements are not whole runs of %zd scales of %zd elements", who, j.n,
                     j.count, inner);
        goto done;
    }
    j.x = x.view.buf;
    j.out = o.view.buf;
    j.scale = s.view.buf;
    j.zp = z.held ? z.view.buf : NULL;
    j.inner = inner;
    j.is_signed = is_signed;
    if (j.n) {
        Py_BEGIN_ALLOW_THREADS
        pool_run(dequant ? q8_dequant_task : q8_quant_task, &j, (j.n + Q8_CHUNK - 1) / Q8_CHUNK,
                 threads < 1 ? 1 : threads);
        Py_END_ALLOW_THREADS
    }
    result = Py_None;
    Py_INCREF(result);
done:
    nb_release(&x);
    nb_release(&s);
    nb_release(&z);
    nb_release(&o);
    return result;
}

PyDoc_STRVAR(quantize8_doc,
"quantize8(x, scale, zero_point, out, inner, threads)\n\n"
"QuantizeLinear of float32 x into uint8 or int8 out (of x's size):\n"
"saturate(rint(x / scale) + zero_point), the quotient in float32, rounded half to\n"
"even; NaN gives 0. scale is float32 [count] and zero_point None or out's type\n"
"[count]: element i takes index (i // inner) % count (count 1: per tensor). Runs on\n"
"up to threads threads, without the GIL.");

static PyObject *quantize8(PyObject *self, PyObject *args)
{
    return q8_common(args, 0, "quantize8");
}

PyDoc_STRVAR(dequantize8_doc,
"dequantize8(x, scale, zero_point, out, inner, threads)\n\n"
"DequantizeLinear of uint8 or int8 x into float32 out: (x - zero_point) * scale in\n"
"float32. scale, zero_point (None or x's type), inner and threads as quantize8.");

static PyObject *dequantize8(PyObject *self, PyObject *args)
{
    return q8_common(args, 1, "dequantize8");
}

PyMethodDef igemm_methods[] = {
    {"igemm_ready", igemm_ready, METH_NOARGS, igemm_ready_doc},
    {"igemm", igemm, METH_VARARGS, igemm_doc},
    {"float_range", float_range, METH_O, float_range_doc},
    {"quantize8", quantize8, METH_VARARGS, quantize8_doc},
    {"igemm_pack", igemm_pack, METH_VARARGS, igemm_pack_doc},
    {"dequantize8", dequantize8, METH_VARARGS, dequantize8_doc},
    {NULL, NULL, 0, NULL},
};
