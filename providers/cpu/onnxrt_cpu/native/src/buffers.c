/* Arrays in through the buffer protocol: checked element type, contiguity and size. */
#include "native.h"

int nb_get(PyObject *obj, nbuf *nb, char kind, Py_ssize_t itemsize, Py_ssize_t count, int writable, int optional,
           const char *what)
{
    nb->held = 0;
    if (obj == Py_None && optional)
        return 0;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &nb->view, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous array", what, writable ? "writable " : "");
        return -1;
    }
    nb->held = 1;
    const char *fmt = nb->view.format ? nb->view.format : "B";
    char code = fmt[strlen(fmt) - 1];
    int ok;
    switch (kind) {
    case 'f':
        ok = (code == 'f' && itemsize == 4) || (code == 'd' && itemsize == 8);
        break;
    case 'i':
        ok = strchr("bhilq", code) != NULL;
        break;
    default:
        ok = strchr("BHILQ", code) != NULL;
        break;
    }
    if (!ok || nb->view.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s has element format '%s' of %zd bytes, expected kind '%c' of %zd", what,
                     fmt, nb->view.itemsize, kind, itemsize);
        nb_release(nb);
        return -1;
    }
    if (nb->view.len / itemsize < count) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd elements, at least %zd are needed", what,
                     nb->view.len / itemsize, count);
        nb_release(nb);
        return -1;
    }
    return 0;
}

void nb_release(nbuf *nb)
{
    if (nb->held) {
        PyBuffer_Release(&nb->view);
        nb->held = 0;
    }
}

Py_ssize_t nb_float_size(PyObject *obj, const char *what)
{
    Py_buffer probe;
    if (PyObject_GetBuffer(obj, &probe, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous array", what);
        return -1;
    }
    const char *fmt = probe.format ? probe.format : "B";
    char code = fmt[strlen(fmt) - 1];
    Py_ssize_t size = probe.itemsize;
    PyBuffer_Release(&probe);
    if (!((code == 'f' && size == 4) || (code == 'd' && size == 8))) {
        PyErr_Format(PyExc_TypeError, "%s must be float32 or float64, not format '%s'", what, fmt);
        return -1;
    }
    return size;
}

Py_ssize_t nb_get_ratio(PyObject *obj, nbuf *nb, Py_ssize_t m, const char *who)
{
    char what[64];
    snprintf(what, sizeof what, "%s: mult", who);
    if (nb_get(obj, nb, 'f', 4, 1, 0, 0, what) < 0)
        return -1;
    const Py_ssize_t count = nb->view.len / 4;
    if (count != 1 && count != m) {
        PyErr_Format(PyExc_ValueError, "%s: mult holds %zd values, expected 1 or %zd", who, count, m);
        return -1;
    }
    return count;
}

int nb_int8_kind(PyObject *obj, int *is_signed, const char *what)
{
    Py_buffer probe;
    if (PyObject_GetBuffer(obj, &probe, PyBUF_FORMAT) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be an array", what);
        return -1;
    }
    const char *fmt = probe.format ? probe.format : "B";
    char code = fmt[strlen(fmt) - 1];
    PyBuffer_Release(&probe);
    if (code != 'b' && code != 'B') {
        PyErr_Format(PyExc_TypeError, "%s must be int8 or uint8, not format '%s'", what, fmt);
        return -1;
    }
    *is_signed = code == 'b';
    return 0;
}
