"""Convolutions with a short reduction (a network's first layers: 1 or 3 input
channels, a 3x3 kernel) by the compiled direct kernel ``narrow_conv2d``: each output
row computed straight into the output, eight channels by two vectors of positions
at a time, the bias, the residual and the activation applied in the same pass.

There im2col gathers columns as large as the output and BLAS multiplies a
``[M, 9] x [9, positions]`` product that is all overhead (plcmos's first layer, 1
-> 32 channels at 500 x 257 with LeakyRelu, took 16 times onnxruntime's time), and
the activations only numpy applies were one more pass over the output."""

from __future__ import annotations

import math

import numpy as np

from .. import native, parallel
from .compiled import direct_pays, native_geometry

__all__ = ["NARROW_MAX_K", "conv_narrow", "narrow_activation", "narrow_pays"]

#: Longest reduction (input channels times taps) the narrow kernel takes: beyond it
#: the im2col product is long enough for BLAS to run near its peak, and the
#: kernel's sixteen accumulators reload every input vector for each block of eight
#: output channels.
NARROW_MAX_K = 32

#: Fewest output positions (a map's, all images) the narrow kernel takes: below it
#: the work is a few microseconds on any path.
_NARROW_MIN_POSITIONS = 64

#: The compiled kernel's activation numbers (epilogue.h's), and the last it knows.
_RELU, _CLIP, _LEAKY, _HARD_SIGMOID = 1, 2, 3, 4
_LAST = 8


def narrow_pays(x, wp, kernel, strides, pb, pe, out_sp) -> bool:
    """Whether the narrow kernel may take this layer: float32, 2-D (or 1-D), group 1,
    a reduction of at most :data:`NARROW_MAX_K`, not an unpadded 1x1 of stride 1 (one
    GEMM on the input as it lies), at least 64 output positions. Of these,
    :func:`conv_narrow` leaves the direct kernel's (:func:`direct_pays`) to it."""
    # the cheapest tests first: most layers of a network fail the reduction's length
    if wp.group != 1 or len(kernel) not in (1, 2):
        return False
    taps = math.prod(kernel)
    if wp.shape[1] * taps > NARROW_MAX_K or x.dtype != np.float32:
        return False
    if taps == 1 and all(s == 1 for s in strides) and not any(pb) and not any(pe):
        return False
    return x.shape[0] * math.prod(out_sp) >= _NARROW_MIN_POSITIONS


def narrow_activation(activation):
    """``(kind, p0, p1)`` of a FusedConv activation the narrow kernel applies, or
    None where only numpy does: its ``native`` form where it has one (the compiled
    epilogue's kinds 1 to 8: Relu, Clip, LeakyRelu, HardSigmoid, both HardSwish
    spellings, Sigmoid, SiLU/QuickGelu), else by its name and parameters (Relu,
    Clip, LeakyRelu, HardSigmoid); ``(0, 0, 0)`` for none."""
    if activation is None:
        return (0, 0.0, 0.0)
    form = getattr(activation, "native", None)
    if form is not None:
        kind = int(form[0])
        return (kind, float(form[1]), float(form[2])) if 0 <= kind <= _LAST else None
    name = getattr(activation, "name", None)
    params = list(getattr(activation, "params", None) or [])
    if name == "Relu":
        return (_RELU, 0.0, 0.0)
    if name == "Clip":
        lo, hi = (params[:2] + [-np.inf, np.inf][len(params[:2]):])
        return (_CLIP, float(lo), float(hi))
    if name == "LeakyRelu":
        return (_LEAKY, float(params[0]) if params else 0.01, 0.0)
    if name == "HardSigmoid":
        alpha = float(params[0]) if params else 0.2
        beta = float(params[1]) if len(params) > 1 else 0.5
        return (_HARD_SIGMOID, alpha, beta)
    return None


def conv_narrow(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, residual, activation) -> bool:
    """The convolution of ``x`` by the narrow kernel into ``y``, with the bias, the
    residual and ``activation`` (applied by the kernel where
    :func:`narrow_activation` gives its form, else in numpy on the finished output),
    where :func:`narrow_pays` and the compiled kernels take the layer; False where
    it did nothing."""
    if not narrow_pays(x, wp, wp.kernel, strides, pb, pe, out_sp):
        return False
    if native.K is None or not hasattr(native.K, "narrow_conv2d"):
        return False
    geo = native_geometry(x, wp, strides, dilations, pb, pe, out_sp, pad_value)
    if geo is None:
        return False
    x4, g = geo
    if direct_pays(x4, wp, (g.kh, g.kw), (g.oh, g.ow)):
        # the direct kernel's layers (at most 16 output channels, or 8 input channels
        # and more): the two ran alike on them (3 -> 16 channels 3x3/2 at 224 x 224,
        # one thread: 140 against 146 us; 1 -> 16 3x3 at 500 x 257: 612 against 619)
        return False
    form = narrow_activation(activation)
    kind, p0, p1 = form if form is not None else (0, 0.0, 0.0)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(g.m)
    z = None if residual is None else np.ascontiguousarray(residual, dtype=np.float32)
    try:
        native.K.narrow_conv2d(x4, wp.gemm, b, z, y, g, kind, p0, p1, parallel.thread_count())
    except MemoryError:
        # a band's input rows past the kernel's limit (rows of a million values), or
        # no memory for them: the other paths write the whole output anew
        return False
    if form is None:
        activation(y)
    return True
