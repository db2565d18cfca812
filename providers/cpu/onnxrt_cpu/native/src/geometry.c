/* The named geometries of the kernels' calls: ConvGeometry and WindowGeometry, named
 * tuples of ``onnxrt_cpu.native``, read into conv_geometry and window_geometry. A
 * named type, not a bare tuple of 14 or 16 integers, so that every caller names each
 * field and one definition of the order serves both sides; the field names are
 * checked once, when the types are handed over. */
#include "native.h"

#include <stddef.h>

static PyTypeObject *conv_type, *window_type;

/* A field's name on the Python side and where it lies in the struct. */
typedef struct {
    const char *name;
    size_t offset;
} geometry_field;

#define CF(name, member) {name, offsetof(conv_geometry, member)}
#define WF(name, member) {name, offsetof(window_geometry, member)}
static const geometry_field conv_fields[] = {
    CF("n", n),   CF("c", c),   CF("h", h),   CF("w", w),   CF("m", m),   CF("groups", groups),   CF("kh", kh),
    CF("kw", kw), CF("sh", sh), CF("sw", sw), CF("dh", dh), CF("dw", dw), CF("pad_top", pt), CF("pad_left", pl),
    CF("oh", oh), CF("ow", ow)};
static const geometry_field window_fields[] = {
    WF("n", n),   WF("c", c),   WF("h", h),   WF("w", w),         WF("kh", kh),        WF("kw", kw), WF("sh", sh),
    WF("sw", sw), WF("dh", dh), WF("dw", dw), WF("pad_top", pt), WF("pad_left", pl), WF("oh", oh), WF("ow", ow)};
#undef CF
#undef WF
#define CONV_FIELDS ((Py_ssize_t)(sizeof(conv_fields) / sizeof(conv_fields[0])))
#define WINDOW_FIELDS ((Py_ssize_t)(sizeof(window_fields) / sizeof(window_fields[0])))

/* Whether ``type`` is a tuple type whose ``_fields`` are ``names``; else a TypeError. */
static int fields_match(PyObject *type, const char *what, const geometry_field *expected, Py_ssize_t count)
{
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "set_geometry_types: %s must be a named tuple type", what);
        return 0;
    }
    PyObject *fields = PyObject_GetAttrString(type, "_fields");
    if (fields == NULL)
        return 0;
    int ok = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == count;
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        ok = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, expected[i].name) == 0;
    }
    Py_DECREF(fields);
    if (!ok)
        PyErr_Format(PyExc_TypeError, "set_geometry_types: %s's fields are not the kernels' (%s, %s, ... %s)", what,
                     expected[0].name, expected[1].name, expected[count - 1].name);
    return ok;
}

PyDoc_STRVAR(set_geometry_types_doc,
"set_geometry_types(conv, window)\n\n"
"Hand over the named tuple types the kernels take their geometry as: conv for\n"
"conv2d, qconv2d, qconv8, direct2d, qdirect2d and winograd3x3 (n, c, h, w, m,\n"
"groups, kh, kw, sh, sw, dh, dw, pad_top, pad_left, oh, ow), window for depthwise2d\n"
"and pool2d (the same without m and groups). A TypeError where their fields differ.");

static PyObject *set_geometry_types(PyObject *self, PyObject *args)
{
    PyObject *conv, *window;
    if (!PyArg_ParseTuple(args, "OO:set_geometry_types", &conv, &window))
        return NULL;
    if (!fields_match(conv, "conv", conv_fields, CONV_FIELDS) ||
        !fields_match(window, "window", window_fields, WINDOW_FIELDS))
        return NULL;
    Py_INCREF(conv);
    Py_INCREF(window);
    Py_XSETREF(conv_type, (PyTypeObject *)conv);
    Py_XSETREF(window_type, (PyTypeObject *)window);
    Py_RETURN_NONE;
}

/* Fill the struct at ``g`` from ``obj``, which must be of exactly ``type`` (its
 * ``count`` fields integers). */
static int geometry_fill(PyObject *obj, PyTypeObject *type, const geometry_field *fields, Py_ssize_t count, void *g,
                         const char *who)
{
    if (type == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: no geometry types were handed over (set_geometry_types)", who);
        return -1;
    }
    if (Py_TYPE(obj) != type || PyTuple_GET_SIZE(obj) != count) {
        PyErr_Format(PyExc_TypeError, "%s: geometry must be a %s, not %.200s", who, type->tp_name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *index = PyNumber_Index(PyTuple_GET_ITEM(obj, i));
        Py_ssize_t v = index == NULL ? -1 : PyLong_AsSsize_t(index);
        Py_XDECREF(index);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: geometry field %s must be an integer", who, fields[i].name);
            return -1;
        }
        *(Py_ssize_t *)((char *)g + fields[i].offset) = v;
    }
    return 0;
}

int conv_geometry_get(PyObject *obj, conv_geometry *g, const char *who)
{
    return geometry_fill(obj, conv_type, conv_fields, CONV_FIELDS, g, who);
}

int window_geometry_get(PyObject *obj, window_geometry *g, const char *who)
{
    return geometry_fill(obj, window_type, window_fields, WINDOW_FIELDS, g, who);
}

PyMethodDef geometry_methods[] = {
    {"set_geometry_types", set_geometry_types, METH_VARARGS, set_geometry_types_doc},
    {NULL, NULL, 0, NULL},
};
