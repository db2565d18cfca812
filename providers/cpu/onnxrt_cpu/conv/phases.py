"""A strided group-1 convolution gathered from the stride phases of its padded
input, every tap a contiguous run (a network's first strided layers)."""

from __future__ import annotations

import math

import numpy as np

from . import buffers
from .buffers import strided
from .geometry import phase_geometry, tap_groups

__all__ = ["conv_phases"]

#: Elements of one band of :func:`conv_phases`'s gathered taps.
_PHASE_BAND_ELEMS = 1 << 17


def conv_phases(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value, bias, bias_key, finish):
    """A strided group-1 convolution on the stride phases of its padded input, as
    :func:`~onnxrt_cpu.conv.depthwise.depthwise` lays them out (:func:`phase_geometry`, :func:`tap_groups`):
    every tap then reads contiguous runs, so a band of output rows gathers the taps
    of all channels in one copy per phase, with runs as long as the band, and
    multiplies them by the weight with its taps in the same order and the bias as one
    more tap reading ones (:meth:`ConvWeights.phased`) in one product on the phase's
    row pitch, of which the band of the output keeps its own columns.

    The plain banded im2col reads a strided tap value by value (its inner loop steps
    over every other input value) and pads a copy of the input first; for the few
    input channels of a network's first strided layers that is most of the time.
    Layers with stride 2 along the row run the banded im2col on their column phases
    instead (:func:`~onnxrt_cpu.conv.bands.column_phases`), which is faster still; this path keeps the
    other strides, dilations along the row and 1-D and 3-D maps.
    ``finish(out, image, group, cols=..., with_bias=False)`` adds the residual and
    the activation to each band while it is in cache."""
    n, c = x.shape[:2]
    m = yv.shape[1]
    q, pitch, copies = phase_geometry(tuple(x.shape[2:]), tuple(wp.kernel), tuple(strides), tuple(dilations),
                                      tuple(pb), tuple(pe), tuple(out_sp))
    groups, order = tap_groups(wp.kernel, strides, dilations, pitch)
    nph = math.prod(strides)
    plane = math.prod(q)
    rows, p0 = out_sp[0], pitch[0]
    inner = math.prod(out_sp[1:])
    taps = math.prod(wp.kernel)
    k = c * taps
    w, kk = wp.phased(order, bias, bias_key)
    band = max(1, min(rows, _PHASE_BAND_ELEMS // max(1, kk * p0)))
    width = band * p0
    phases = c * nph * plane
    buf = buffers.scratch(phases + kk * width + m * width, x.dtype)
    qb = buf[:phases].reshape(c, nph, plane)
    qb.fill(pad_value)  # the padding: the images overwrite the same parts of the phases
    grid = qb.reshape(c, nph, *q)
    cols = buf[phases : phases + kk * width].reshape(kk, width)
    cols[k:] = 1  # the bias's row
    taps3 = cols[:k].reshape(c, taps, width)
    res = buf[phases + kk * width :].reshape(m, width)
    fills = [(grid[(slice(None), ph) + dst], (slice(None),) + src) for ph, dst, src in copies]
    kept = (slice(None), slice(None)) + tuple(slice(0, o) for o in out_sp[1:])
    for i in range(n):
        xi = x[i]
        for dst, src in fills:
            dst[...] = xi[src]
        for r0 in range(0, rows, band):
            r1 = min(rows, r0 + band)
            length = (r1 - r0) * p0
            t0 = 0
            for ph, off, shape, steps in groups:
                count = math.prod(shape)
                view = strided(buf, ph * plane + off + r0 * p0, (c, *shape, length), (nph * plane, *steps, 1))
                np.copyto(taps3[:, t0 : t0 + count, :length].reshape(c, *shape, length), view)
                t0 += count
            part = res[:, :length]
            np.matmul(w, cols[:, :length], out=part)
            out = yv[i, :, r0 * inner : r1 * inner]
            out.reshape(m, r1 - r0, *out_sp[1:])[...] = part.reshape(m, r1 - r0, *q[1:])[kept]
            finish(out, i, 0, cols=slice(r0 * inner, r1 * inner), with_bias=False)
