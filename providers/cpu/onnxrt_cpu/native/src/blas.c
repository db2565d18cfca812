/* Matrix products through the BLAS library numpy itself uses.
 *
 * The module is built without BLAS headers or libraries: at import, Python finds
 * numpy's CBLAS ``sgemm``/``dgemm`` in the process (scipy-openblas's 64-bit-integer
 * ``scipy_cblas_sgemm64_`` or a plain ``cblas_sgemm``) and hands their addresses to
 * ``set_blas``. Kernels call them from pool threads with BLAS single-threaded (the
 * session keeps it so during a run), one product per chunk.
 */
#include "native.h"

enum { ROW_MAJOR = 101, NO_TRANS = 111 };

typedef void (*sgemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                          int64_t, float, float *, int64_t);
typedef void (*dgemm64_t)(int, int, int, int64_t, int64_t, int64_t, double, const double *, int64_t,
                          const double *, int64_t, double, double *, int64_t);
typedef void (*sgemm32_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                          float *, int);
typedef void (*dgemm32_t)(int, int, int, int, int, int, double, const double *, int, const double *, int, double,
                          double *, int);

static void *sgemm_fn, *dgemm_fn;
static int ilp64;

int blas_ready(void)
{
    return sgemm_fn != NULL && dgemm_fn != NULL;
}

int gemm_f32(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const float *a, Py_ssize_t lda, const float *b,
             Py_ssize_t ldb, float *c, Py_ssize_t ldc)
{
    if (!sgemm_fn)
        return -1;
    if (ilp64)
        ((sgemm64_t)sgemm_fn)(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    else
        ((sgemm32_t)sgemm_fn)(ROW_MAJOR, NO_TRANS, NO_TRANS, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb,
                              0.0f, c, (int)ldc);
    return 0;
}

int gemm_f64(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const double *a, Py_ssize_t lda, const double *b,
             Py_ssize_t ldb, double *c, Py_ssize_t ldc)
{
    if (!dgemm_fn)
        return -1;
    if (ilp64)
        ((dgemm64_t)dgemm_fn)(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
    else
        ((dgemm32_t)dgemm_fn)(ROW_MAJOR, NO_TRANS, NO_TRANS, (int)m, (int)n, (int)k, 1.0, a, (int)lda, b, (int)ldb,
                              0.0, c, (int)ldc);
    return 0;
}

static PyObject *set_blas(PyObject *self, PyObject *args)
{
    unsigned long long s, d;
    int wide;
    if (!PyArg_ParseTuple(args, "KKp:set_blas", &s, &d, &wide))
        return NULL;
    if (!s != !d) {
        PyErr_SetString(PyExc_ValueError, "set_blas: both addresses or neither (0, 0 clears them)");
        return NULL;
    }
    sgemm_fn = (void *)(uintptr_t)s;
    dgemm_fn = (void *)(uintptr_t)d;
    ilp64 = wide;
    Py_RETURN_NONE;
}

static PyObject *py_blas_ready(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(blas_ready());
}

PyMethodDef blas_methods[] = {
    {"set_blas", set_blas, METH_VARARGS,
     "set_blas(sgemm, dgemm, ilp64)\n\nThe addresses of CBLAS sgemm and dgemm (64-bit integers if ilp64); 0, 0 clears them."},
    {"blas_ready", py_blas_ready, METH_NOARGS, "blas_ready() -> whether set_blas was given the products"},
    {NULL, NULL, 0, NULL},
};
