/* Relu as a numpy ufunc of one operand, ``onnxrt_cpu.native._ufuncs.relu``.
 *
 * numpy has no one-operand Relu: ``np.maximum(x, 0)`` goes through a binary ufunc's
 * type resolution and broadcasting, which on the one-element values of a streaming
 * model costs more than Relu itself (a 1,000-node chain: 0.31 us a node against 0.25
 * for ``np.negative``). A unary ufunc takes the unary path. The loops give what
 * ``np.maximum(x, 0)`` gives: NaN stays NaN, -0.0 becomes +0.0.
 *
 * Unlike ``_kernels`` (buffer protocol only), this module is built against numpy's
 * headers, so it is a separate extension: where they are missing at build time, or
 * the numpy it meets at run time cannot load it, Relu keeps ``np.maximum``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>

#include <math.h>

#define RELU_FLOAT(NAME, T)                                                                         \
    static void NAME(char **args, const npy_intp *dimensions, const npy_intp *steps, void *data)   \
    {                                                                                               \
        (void)data;                                                                                 \
        char *in = args[0], *out = args[1];                                                         \
        npy_intp n = dimensions[0], is = steps[0], os = steps[1];                                   \
        for (npy_intp i = 0; i < n; i++, in += is, out += os) {                                     \
            T v = *(T *)in;                                                                         \
            /* isgreater is false for NaN and -0.0 and, unlike >, raises no invalid-operation     \
             * flag on NaN: NaN is kept, -0.0 becomes +0.0 */                                       \
            *(T *)out = (isgreater(v, (T)0) || v != v) ? v : (T)0;                                  \
        }                                                                                           \
    }

#define RELU_INT(NAME, T)                                                                           \
    static void NAME(char **args, const npy_intp *dimensions, const npy_intp *steps, void *data)   \
    {                                                                                               \
        (void)data;                                                                                 \
        char *in = args[0], *out = args[1];                                                         \
        npy_intp n = dimensions[0], is = steps[0], os = steps[1];                                   \
        for (npy_intp i = 0; i < n; i++, in += is, out += os) {                                     \
            T v = *(T *)in;                                                                         \
            *(T *)out = v > 0 ? v : (T)0;                                                           \
        }                                                                                           \
    }

RELU_FLOAT(relu_f32, npy_float)
RELU_FLOAT(relu_f64, npy_double)
RELU_INT(relu_i8, npy_int8)
RELU_INT(relu_i16, npy_int16)
RELU_INT(relu_i32, npy_int32)
RELU_INT(relu_i64, npy_int64)

static PyUFuncGenericFunction funcs[] = {relu_f32, relu_f64, relu_i8, relu_i16, relu_i32, relu_i64};
static void *data[] = {NULL, NULL, NULL, NULL, NULL, NULL};
static char types[] = {NPY_FLOAT32, NPY_FLOAT32, NPY_FLOAT64, NPY_FLOAT64, NPY_INT8, NPY_INT8,
                       NPY_INT16, NPY_INT16, NPY_INT32, NPY_INT32, NPY_INT64, NPY_INT64};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ufuncs", "numpy ufuncs of the onnxrt CPU provider.", -1, NULL,
};

PyMODINIT_FUNC PyInit__ufuncs(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    import_array();
    import_umath();
    PyObject *relu = PyUFunc_FromFuncAndData(funcs, data, types, 6, 1, 1, PyUFunc_None, "relu",
                                             "relu(x): max(x, 0), NaN kept, as np.maximum(x, 0) gives.", 0);
    if (relu == NULL || PyModule_AddObject(m, "relu", relu) < 0) {
        Py_XDECREF(relu);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
