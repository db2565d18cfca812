"""The choice of a convolution algorithm for one call, by the layer's shape: the
compiled kernels where they take it, else a depthwise, pointwise (one GEMM),
grouped, channels-last, stride-phase or banded im2col path in numpy calls.

The thresholds that choose are kept here, each beside what was measured for it;
those of one algorithm's own tiling stay in its module."""

from __future__ import annotations

import math

import numpy as np

from .. import parallel
from . import bands, buffers
from .bands import conv_bands, conv_grouped
from .channels_last import conv_rows
from .compiled import conv_native, depthwise_native
from .depthwise import depthwise
from .narrow import conv_narrow
from .packing import ConvWeights
from .phases import conv_phases
from ..rows import broadcast_buffer

__all__ = ["convolve"]

#: Whether the banded im2col of a layer with stride 2 along the rows gathers from the
#: input's column phases (:func:`column_phases`); off, every tap reads every second
#: value of a row. The gathered columns are the same either way.
_COLUMN_PHASES = True


#: Largest im2col (elements, all images and groups) of :func:`conv_grouped`. One
#: session alternating it with the banded path (2 threads), medians: 440 channels in
#: 55 groups at 4x4 0.94 -> 0.30 ms, 8x8 0.85 -> 0.40, 16x16 1.22 -> 1.02; 224 in 28
#: at 8x8 0.45 -> 0.23, 16x16 0.64 -> 0.51, 32x32 (2M elements) 1.73 -> 1.69; 96 in
#: 4 at 28x28 and 192 in 8 at 14x14 tied.
_GROUPED_ELEMS = 1 << 20

#: Most stride phases (the product of the strides) :func:`conv_phases` splits an
#: input into; larger strides take the banded im2col, one strided gather a band.
_MAX_PHASES = 9


def convolve(x, wp: ConvWeights, strides, dilations, pb, pe, out_sp, bias=None, pad_value=0,
             residual=None, activation=None, constant_bias=False):
    """The convolution of ``x`` ``[N, C, *sp]`` (already in the compute dtype) by the
    algorithm that suits its shape, in this order: the compiled depthwise kernel or
    :func:`~onnxrt_cpu.conv.depthwise.depthwise`; the compiled convolutions
    (:func:`~onnxrt_cpu.conv.compiled.conv_native`); one GEMM for an unpadded 1x1
    layer of stride 1; :func:`~onnxrt_cpu.conv.bands.conv_grouped` for many groups
    on small maps; :func:`~onnxrt_cpu.conv.channels_last.conv_rows` for a batch of
    small 2-D images; :func:`~onnxrt_cpu.conv.phases.conv_phases` for strided layers
    with few channels; else the banded im2col
    (:func:`~onnxrt_cpu.conv.bands.conv_bands`).

    ``residual`` (shaped like the output) is added and ``activation(out)`` (in place)
    applied band by band, while each band is still in cache (FusedConv).
    ``constant_bias`` says ``bias`` is the node's constant, whose folding into the
    weight (as one more column or tap) may be kept across calls.
    """
    n, c = x.shape[:2]
    g = wp.group
    m = wp.shape[0]
    if c != wp.shape[1] * g:
        raise ValueError(
            f"input has {c} channels but weight {wp.shape} with group {g} expects {wp.shape[1] * g}"
        )
    if bias is not None and bias.shape != (m,):
        raise ValueError(f"bias has shape {bias.shape}, expected ({m},)")
    kernel = wp.kernel
    nd = len(kernel)
    L = math.prod(out_sp)
    y = np.empty((n, m, *out_sp), dtype=x.dtype)
    if residual is not None and residual.shape != y.shape:
        raise ValueError(f"Z has shape {residual.shape}, the convolution gives {y.shape}")
    unit = all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pb) and not any(pe)
    bcol = None if bias is None else bias.astype(y.dtype, copy=False).reshape(m, 1)
    bias_key = bias if constant_bias else None

    # the compiled kernels apply Relu and Clip themselves; another activation runs on
    # the finished output (after the residual, which the convolution kernel adds)
    fused = getattr(activation, "native", None)
    if wp.depthwise is not None and not unit:
        fused = None if residual is not None else fused
        if depthwise_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, fused):
            if fused is not None or activation is None:
                return y
        else:
            depthwise(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bcol, bias_key)
        if residual is not None:
            y += residual
        if activation is not None:
            activation(y)
        return y
    if conv_narrow(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, residual, activation):
        return y  # a short reduction (first layers): the direct kernel of conv/narrow.py, its epilogue included
    if conv_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, residual, fused):
        if activation is not None and fused is None:
            activation(y)
        return y

    cg, mg = c // g, m // g
    taps = math.prod(kernel)
    K = cg * taps
    yv = y.reshape(n, m, L)
    zv = None if residual is None else residual.reshape(n, m, L)
    threads = parallel.thread_count()
    flops = n * m * K * L

    def finish(out, i, gi, rows=slice(None), cols=slice(None), with_bias=True):
        """Bias, residual and activation on ``out``: rows ``rows`` of group ``gi``'s
        output of image ``i``, columns ``cols`` (a part of it, or all); the bias is
        skipped when the product already carried it (``with_bias`` false)."""
        r0, r1, _ = rows.indices(mg)
        rows = slice(gi * mg + r0, gi * mg + r1)
        if bcol is not None and with_bias:
            b = bcol[rows]
            with broadcast_buffer(out.shape, out.shape, b.shape):
                out += b
        if zv is not None:
            out += zv[i, rows, cols]
        if activation is not None:
            activation(out)

    def epilogue_for(i, gi, with_bias=True):
        """:func:`finish` for each part of a split product, or None if there is nothing
        to do (``with_bias`` false: the product carried the bias)."""
        if (bcol is None or not with_bias) and zv is None and activation is None:
            return None
        return lambda part, rows, cols: finish(part, i, gi, rows, cols, with_bias)

    if unit:
        xv = x.reshape(n, c, L)
        if n * g == 1 and bcol is not None and c < m:
            # The bias as one more input row of ones: copying the (narrower) input
            # once costs less than a pass over the (wider) output after the product,
            # which no longer fits in cache (24 -> 144 channels on 56 x 56, product,
            # bias and Relu6: 311 -> 264 us). A product split over the threads gains
            # as well, though each thread would add the bias to its own part (the AMD
            # machine, alternating, medians: 16 -> 96 channels at 112 x 112 with Clip
            # 1028 -> 996 us, without 859 -> 774; 64 -> 256 at 56 x 56 with Relu 1318
            # -> 1256; 256 -> 1024 at 14 x 14 1202 -> 1136; 512 -> 2048 at 7 x 7 1373
            # -> 1331)
            xb = buffers.scratch((c + 1) * L, x.dtype).reshape(c + 1, L)
            xb[:c] = xv[0]
            xb[c] = 1
            parallel.matmul(wp.biased(bias, bias_key), xb, out=yv[0], epilogue=epilogue_for(0, 0, with_bias=False))
            return y
        if n * g == 1:
            parallel.matmul(wp.gemm[0], xv[0], out=yv[0], epilogue=epilogue_for(0, 0))
            return y
        if g > 1 and flops < parallel.PARALLEL_MIN_FLOPS:
            # one batched product over the groups and one epilogue per image, not a
            # product and an epilogue per group (ShuffleNet's 4 groups of 68
            # channels at 14x14 with Relu: 157 -> 137 us a node)
            for i in range(n):
                out = yv[i]
                np.matmul(wp.gemm, xv[i].reshape(g, cg, L), out=out.reshape(g, mg, L))
                if bcol is not None:
                    out += bcol
                if zv is not None:
                    out += zv[i]
                if activation is not None:
                    activation(out)
            return y
        jobs = [(i, gi) for i in range(n) for gi in range(g)]

        def unit_job(j):
            i, gi = jobs[j]
            out = yv[i, gi * mg : (gi + 1) * mg]
            np.matmul(wp.gemm[gi], xv[i, gi * cg : (gi + 1) * cg], out=out)
            finish(out, i, gi)

        parallel.parallel_for(len(jobs), unit_job, 1 if flops < parallel.PARALLEL_MIN_FLOPS else threads)
        return y

    if g > 1 and min(pb) >= 0 and min(pe) >= 0 and n * c * taps * L <= _GROUPED_ELEMS:
        # Many groups on a small map (RegNet's and ResNeXt's grouped 3x3 layers): one
        # gather of every channel's taps and one product batched over the groups, where
        # the bands below run a gather and a product per group, each a few microseconds
        # of Python (55 groups of 8 channels at 4x4: about 0.78 ms, ~20x onnxruntime)
        conv_grouped(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value)
        _finish_whole(yv, bcol, zv, activation)
        return y

    if (
        n > 1
        and g == 1
        and nd == 2
        and K * L <= bands.BAND_ELEMS
        and dilations[1] == 1
        and min(pb) >= 0
        and min(pe) >= 0
    ):
        conv_rows(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value)
        _finish_whole(yv, bcol, zv, activation)
        return y

    # A stride of 2 along the row: each tap would read every second value of a row,
    # one value per step of numpy's copy loop. The padded input split into its two
    # column phases first (x[..., b::2], one pass), every tap's row is one
    # contiguous run of a phase, and the taps of one phase are one strided view (a
    # 7x7 stride-2 stem of 3 channels at 224x224, one thread: 1000 -> 310 us with
    # the split; single nodes on two threads, alternating: that stem 3221 -> 3027 us,
    # 3x3 stride-2 layers 0.91-0.96 of the time). Only where the taps outnumber the
    # phases (a 1x1 stride-2 shortcut reads a quarter of the input, which the split
    # would copy whole first) and for stride 2: each phase is one more copy call a
    # band, and AlexNet's 11x11 stride-4 stem took 1.05x the time in four
    cphase = (_COLUMN_PHASES and nd == 2 and strides[1] == 2 and dilations[1] == 1 and min(pb) >= 0
              and min(pe) >= 0 and math.prod(kernel) > math.prod(strides) and out_sp[1] > 0)

    # Other strided layers with few input channels (a network's first layers;
    # batches of small maps took the channels-last path above): the taps gathered
    # from the stride phases in runs (conv_phases), where the banded im2col would
    # read them value by value. With more output channels than taps the cropping
    # copy of the output costs more than that saves (3 -> 64 channels of 224 x 224:
    # 1191 -> 1354 us), and larger products are split over the threads below. Where
    # the column phases apply, the banded im2col on them is faster still (the
    # detector's 3 -> 8 stem at 320 x 320 1173 -> 995 us, 8 -> 16 at 160 x 160 632 ->
    # 541; the whole detector 0.97 of the time)
    # Only for a few phases: each is one copy call per image, and a patch embedding's
    # 16 x 16 stride (256 phases) took 1.1 ms for a 2 x 4 output that one strided
    # gather makes in microseconds
    if not cphase and g == 1 and m <= K and flops < parallel.PARALLEL_MIN_FLOPS and any(st > 1 for st in strides) \
            and min(pb) >= 0 and min(pe) >= 0 and math.prod(strides) <= _MAX_PHASES:
        conv_phases(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value, bcol, bias_key, finish)
        return y

    conv_bands(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value, cphase, finish, epilogue_for)
    return y


def _finish_whole(yv, bcol, zv, activation) -> None:
    """The bias ``bcol`` (``[M, 1]`` or None), the residual ``zv`` (``[N, M, L]`` or
    None) and the in-place ``activation`` (or None) on the whole output ``yv``
    ``[N, M, L]``, after an algorithm that applies none of them."""
    if bcol is not None:
        yv += bcol
    if zv is not None:
        yv += zv
    if activation is not None:
        activation(yv)
