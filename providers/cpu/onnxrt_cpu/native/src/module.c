/* The module ``onnxrt_cpu.native._kernels``: every file's methods in one table. */
#include "native.h"

static PyMethodDef *const tables[] = {pool_methods, geometry_methods, blas_methods, depthwise_methods,
                                      conv_methods, pool2d_methods, elementwise_methods, cast16_methods, qlstm_methods,
                                      winograd_methods, direct_methods, gqa_methods, rnn_methods, igemm_methods,
                                      qconv8_methods, nbits8_methods, narrow_conv_methods, resize2d_methods};

static PyMethodDef methods[160];

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "Compiled kernels of the onnxrt CPU provider.", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    size_t n = 0;
    for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
        for (PyMethodDef *m = tables[t]; m->ml_name; m++) {
            if (n + 1 >= sizeof(methods) / sizeof(methods[0])) {
                PyErr_SetString(PyExc_ImportError, "_kernels: too many methods for the table");
                return NULL;
            }
            methods[n++] = *m;
        }
    methods[n] = (PyMethodDef){NULL, NULL, 0, NULL};
    return PyModule_Create(&module);
}
