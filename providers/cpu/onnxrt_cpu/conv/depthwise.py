"""Depthwise convolutions in numpy calls: per block of channels, the taps gathered as
contiguous runs (of the padded input's stride phases, or of the input on its own
row pitch for "same" rows of unit stride) and one batched ``[1, taps] @ [taps,
span]`` product; small maps go channels last
(:func:`~onnxrt_cpu.conv.channels_last.depthwise_channels_last`)."""

from __future__ import annotations

import math

import numpy as np
import threading

from .. import parallel
from . import buffers, channels_last
from .buffers import strided
from .geometry import pad_margins, phase_geometry, row_pitch, tap_groups

__all__ = ["depthwise", "depthwise_rows"]

#: Elements of a depthwise convolution's gathered taps per block of channels (1 MiB of
#: float32). MobileNetV2, alternating on one session, tenth percentiles of three runs:
#: 23.4-24.4 ms at 2**18 against 25.0-25.9 ms at 2**19; 2**16 and smaller were slower.
_DEPTHWISE_BLOCK_ELEMS = 1 << 18


def depthwise(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias=None, bias_key=None):
    """Depthwise conv: per channel, one small product ``w[c] @ taps[c]``.

    The padded input is split into ``prod(strides)`` phases (``x[p::s]`` along each
    axis), each contiguous, so that every kernel tap reads one contiguous run of one
    flattened phase: the output is computed on the phase's row pitch and cropped at
    the end (the phases get one spare row so the last tap's run stays in bounds).
    Per block of channels the input is written into the phases (whose padding,
    never overwritten, is filled once a call), the taps' runs copied into a ``[c,
    taps, span]`` buffer, a strided view of a phase per group of taps
    (:func:`tap_groups`), and multiplied by the ``[c, 1, taps]`` weights in one
    batched matmul, a bias as one more tap reading ones
    (:meth:`ConvWeights.depthwise_taps`). Blocks are shared by the kernel threads;
    each thread's buffers and views are made once a call.

    The phases are written block by block rather than for the whole input first:
    with stride 2 each phase's strided copy touches every cache line of the input,
    so four phases of a large map read it from memory four times, where a block's
    input stays in the cache between its phases (MobileNetV2's 96 x 112 x 112 layer:
    the phases alone 1.33 ms for the whole input).
    """
    if x.ndim == 4 and min(pb) >= 0 and min(pe) >= 0 and channels_last.channels_last_pays(x.shape[1], out_sp,
                                                                                          strides):
        channels_last.depthwise_channels_last(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias)
        return
    if (x.ndim == 4 and strides == (1, 1) and out_sp[1] == x.shape[3] and min(pb) >= 0 and min(pe) >= 0):
        depthwise_rows(x, wp, dilations, pb, pe, out_sp, y, pad_value, bias, bias_key)
        return
    n, c = x.shape[:2]
    w = wp.depthwise
    taps = w.shape[1]
    q, pitch, copies = phase_geometry(tuple(x.shape[2:]), tuple(wp.kernel), tuple(strides), tuple(dilations),
                                      tuple(pb), tuple(pe), tuple(out_sp))
    nph = math.prod(strides)
    plane = math.prod(q)
    span = out_sp[0] * pitch[0]
    cb = max(1, min(c, _DEPTHWISE_BLOCK_ELEMS // max(1, taps * span)))
    jobs = [(i, c0) for i in range(n) for c0 in range(0, c, cb)]
    # the taps as groups that each read one strided view of one phase: with stride 1
    # there is one phase and all taps are one grid (kernel offsets times dilated
    # pitches); with larger strides each phase's taps are a grid too (one run per
    # axis), so a 3x3 stride-2 kernel is 4 copies, not 9. cols holds the taps in
    # group order, the weights are permuted to match
    groups, order = tap_groups(wp.kernel, strides, dilations, pitch)
    w3, rows_k = wp.depthwise_taps(order, bias, bias_key)
    spaces = {}

    def space():
        """This thread's phases, gathered taps, product and their views, made once a
        call (the views cost more Python than a block's copies; see depthwise_rows)."""
        me = threading.get_ident()
        sp = spaces.get(me)
        if sp is None:
            buf = buffers.scratch(cb * (nph * plane + (rows_k + 1) * span), x.dtype)
            qb = buf[: cb * nph * plane].reshape(cb, nph, plane)
            # the padding, once: the blocks write the same parts of the phases
            qb.fill(pad_value)
            cols = buf[cb * nph * plane : cb * (nph * plane + rows_k * span)].reshape(cb, rows_k, span)
            cols[:, taps:] = 1  # the bias's row: never overwritten by the blocks
            res = buf[cb * (nph * plane + rows_k * span) :].reshape(cb, 1, span)
            grid = qb.reshape(cb, nph, *q)
            fills = [(grid[(slice(None), k) + dst], (slice(None),) + src) for k, dst, src in copies]
            pairs = []
            t0 = 0
            for ph, off, shape, steps in groups:
                count = math.prod(shape)
                view = strided(buf, ph * plane + off, (cb, *shape, span), (nph * plane, *steps, 1))
                pairs.append((cols[:, t0 : t0 + count].reshape(cb, *shape, span), view))
                t0 += count
            kept = (slice(None), slice(None)) + tuple(slice(0, o) for o in out_sp[1:])
            crop = res.reshape(cb, out_sp[0], *q[1:])[kept]
            sp = spaces[me] = (qb, fills, pairs, cols, res, crop)
        return sp

    def block(j):
        i, c0 = jobs[j]
        c1 = min(c, c0 + cb)
        k = c1 - c0
        qb, fills, pairs, cols, res, crop = space()
        xi = x[i, c0:c1]
        if k == cb:
            for dst, src in fills:
                dst[...] = xi[src]
            for dst, view in pairs:
                np.copyto(dst, view)
        else:
            for dst, src in fills:
                dst[:k] = xi[src]
            for dst, view in pairs:
                np.copyto(dst[:k], view[:k])
        np.matmul(w3[c0:c1], cols[:k], out=res[:k])
        y[i, c0:c1] = crop[:k]

    work = n * c * span * taps
    parallel.parallel_for(len(jobs), block, 1 if work < parallel.PARALLEL_MIN_FLOPS else None)


def depthwise_rows(x, wp, dilations, pb, pe, out_sp, y, pad_value, bias=None, bias_key=None):
    """:func:`depthwise` for a stride-1 2-D layer whose output rows are as wide as
    its input rows (the usual "same" 3x3 layer), on the input's own row pitch.

    Each channel is padded only above and below (plus ``pb[1]`` and ``pe[1]`` values
    at its two ends), so that its copy is one contiguous run and every tap reads one
    run of ``OH * W`` values at a fixed offset; a tap that reaches past the left or
    right edge reads the neighbouring row's first or last values there instead of
    the padding, and those few columns of the gathered taps are overwritten with the
    padding value. Against the phase split, this saves the short-row copies into a
    wider padded grid and the cropping copy of the result, which the product writes
    straight into ``y`` (272 channels of 14x14: 146 -> 90 us).
    """
    n, c, h, wd = x.shape
    (kh, kw), (dh, dw) = wp.kernel, dilations
    oh = out_sp[0]
    length = oh * wd
    taps = kh * kw
    head, per, edges = row_pitch(h, wd, tuple(pb), tuple(pe), kw, dw)
    cb = max(1, min(c, _DEPTHWISE_BLOCK_ELEMS // max(1, taps * length)))
    jobs = [(i, c0) for i in range(n) for c0 in range(0, c, cb)]
    w3, rows_k = wp.depthwise_taps(None, bias, bias_key)
    spaces = {}

    def space():
        """This thread's padded input, gathered taps and their views, made once a call:
        the views cost more Python than a block's copies, and every line of Python a
        pool thread runs is one more wait for the GIL."""
        me = threading.get_ident()
        sp = spaces.get(me)
        if sp is None:
            buf = buffers.scratch(cb * (per + rows_k * length), x.dtype)
            xb = buf[: cb * per].reshape(cb, per)
            gathered = buf[cb * per :].reshape(cb, rows_k, length)
            gathered[:, taps:] = 1  # the bias's row: never overwritten by the blocks
            cols = gathered[:, :taps].reshape(cb, kh, kw, length)
            pad_margins(xb, head, head + h * wd, pad_value)
            view = strided(buf, 0, (cb, kh, kw, length), (per, dh * wd, dw, 1))
            if len(edges) == 2:
                # both edge columns of every gathered row in one strided view
                (t0, c0_), (t1, c1_) = edges
                d = (t1 - t0) * length + (c1_ - c0_)
                fix = [strided(buf, cb * per + t0 * length + c0_, (cb, kh, 2, oh),
                                (rows_k * length, kw * length, d, wd))]
            else:
                fix = [cols[:, :, tx, col::wd] for tx, col in edges]
            sp = spaces[me] = (xb[:, head : head + h * wd], cols, view, fix, gathered)
        return sp

    def block(j):
        i, c0 = jobs[j]
        c1 = min(c, c0 + cb)
        k = c1 - c0
        inner, cols, view, fix, gathered = space()
        if k == cb:
            inner[...] = x[i, c0:c1].reshape(k, h * wd)
            np.copyto(cols, view)
            for f in fix:
                f.fill(pad_value)
        else:
            inner[:k] = x[i, c0:c1].reshape(k, h * wd)
            np.copyto(cols[:k], view[:k])
            for f in fix:
                f[:k] = pad_value
        np.matmul(w3[c0:c1], gathered[:k], out=y[i, c0:c1].reshape(k, 1, length))

    work = n * c * length * taps
    parallel.parallel_for(len(jobs), block, 1 if work < parallel.PARALLEL_MIN_FLOPS else None)
