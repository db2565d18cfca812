"""The banded im2col: a convolution's taps gathered, band of output rows by band,
into a per-thread column buffer about the L2 cache's size and multiplied straight
into that band of the output; and the grouped convolution of small maps, every
group's taps gathered at once for one batched product.

A band's taps are gathered from the input on its own row pitch ("same" rows of
unit stride), from its column phases (stride 2 along the rows), as whole output
rows copied as one element each (unit stride along the last axis), or through a
strided view of the padded input (the rest). Bands, groups and images are the
chunks the kernel threads share; a single-band image splits its product instead.
"""

from __future__ import annotations

import math

import numpy as np

from .. import parallel
from . import buffers
from .buffers import as_runs, runs_view, strided
from .geometry import pad_margins, pad_spatial, row_pitch

__all__ = ["BAND_ELEMS", "column_phases", "conv_bands", "conv_grouped"]

#: Elements of one im2col band: about the L2 cache, so that the GEMM reads what the
#: gather just wrote; a band also keeps at least ``_BAND_MIN_COLS`` output columns,
#: since narrower products run far below BLAS's peak (measured: 512 channels at 7x7,
#: 3.9 ms in 4-row bands against 2.8 ms in one).
BAND_ELEMS = 1 << 19
_BAND_MIN_COLS = 128


def column_phases(x: np.ndarray, pb, pe, s: int, value=0) -> np.ndarray:
    """The 2-D ``x`` ``[N, C, H, W]`` padded and split along its rows into ``s``
    column phases: ``[N, C, Hp, s, ceil(Wp / s)]`` holding padded column ``s * j +
    b`` at ``[..., b, j]`` (where ``s`` does not divide the padded width ``Wp``, a
    phase's last place holds the padding value too)."""
    n, c, h, w = x.shape
    hp, wp = h + pb[0] + pe[0], w + pb[1] + pe[1]
    out = np.empty((n, c, hp, s, -(-wp // s)), dtype=x.dtype)
    out[:, :, : pb[0]] = value
    out[:, :, hp - pe[0] :] = value
    inner = out[:, :, pb[0] : pb[0] + h]
    for b in range(s):
        # padded column s * j + b holds input column s * j + b - pb[1]
        first = (b - pb[1]) % s  # the first input column in phase b
        j0 = (first + pb[1]) // s
        count = len(range(first, w, s))
        inner[:, :, :, b, j0 : j0 + count] = x[..., first::s]
        pad_margins(inner[:, :, :, b], j0, j0 + count, value)
    return out


def conv_bands(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value, cphase: bool, finish, epilogue_for):
    """The convolution of ``x`` ``[N, C, *sp]`` into ``yv`` ``[N, M, L]`` by the banded
    im2col. ``cphase`` says the taps are gathered from the input's column phases
    (:func:`column_phases`: 2-D, stride 2 along the rows); ``finish(out, image,
    group, cols=...)`` adds the bias, residual and activation to a band while it is
    in cache, and ``epilogue_for(image, group)`` gives a split product's epilogue (or
    None)."""
    n, c = x.shape[:2]
    g, m = wp.group, wp.shape[0]
    kernel = wp.kernel
    nd = len(kernel)
    L = math.prod(out_sp)
    cg, mg = c // g, m // g
    K = cg * math.prod(kernel)
    threads = parallel.thread_count()
    flops = n * m * K * L
    # "Same" rows (unit stride along the row, output as wide as the input): the
    # input padded above and below only, each channel one flat run on the input's
    # own row pitch, where every tap of a band of output rows is one contiguous run
    # and a tap past a row's end reads the next row's first values (its column of
    # the gathered taps is overwritten with the padding, as in
    # onnxrt_cpu.conv.depthwise.depthwise_rows).
    # Against the padded grid: one contiguous copy of the input, not one per row,
    # and one long run per tap and band, not one per output row
    pitch = nd == 2 and strides[1] == 1 and out_sp[1] == x.shape[3] and min(pb) >= 0 and min(pe) >= 0
    if pitch:
        h, wd = x.shape[2:]
        head, per, edges = row_pitch(h, wd, tuple(pb), tuple(pe), kernel[1], dilations[1])
        xq = np.empty((n, c, per), dtype=x.dtype)
        pad_margins(xq, head, head + h * wd, pad_value)
        xq[..., head : head + h * wd] = x.reshape(n, c, h * wd)
        xq_flat = xq.reshape(-1)
    elif cphase:
        xph = column_phases(x, pb, pe, strides[1], pad_value)
    else:
        xp = pad_spatial(x, pb, pe, pad_value)
    rows = out_sp[0]
    inner = L // rows
    band = max(1, BAND_ELEMS // max(1, K * inner), -(-_BAND_MIN_COLS // inner))
    if band < rows and threads > 1 and flops >= parallel.PARALLEL_MIN_FLOPS:
        band = min(band, -(-rows // threads))
        # as many bands as a multiple of the threads, of equal height: 56 rows in
        # bands of 16 left one thread a half band idle at the end
        count = -(-rows // band)
        count = -(-count // threads) * threads
        band = -(-rows // count)
    band = min(rows, band)
    s0 = strides[0]

    # every tap's strided slice at once: a view [cg, *kernel, *out] of the padded input
    # (one copy per band, in C, instead of one per tap: the pool threads need the GIL
    # for each numpy call, and hand it over at a cost)
    if cphase:
        qs = xph.strides  # images, channels, rows, phases, columns
        sw = strides[1]
        # per phase b, the taps dx = b, b + s, ...: one view of the phase whose
        # elements are output rows (runs of OW values), and the matching columns
        phase_taps = [(b, len(range(b, kernel[1], sw))) for b in range(min(sw, kernel[1]))]
    elif not pitch:
        sx = xp.strides
        view_strides = (sx[1], *(sx[2 + a] * dilations[a] for a in range(nd)),
                        *(sx[2 + a] * strides[a] for a in range(nd)))

    # With a unit stride along the last axis, each tap's output row is one contiguous
    # run of the padded input, copied as one element (:func:`runs_view`): 512
    # channels of 7x7 with a 3x3 kernel 172 -> 110 us, 256 of 14x14 191 -> 144 us, 64
    # of 56x56 within the spread
    runs = not pitch and not cphase and nd >= 2 and strides[-1] == 1 and xp.flags.c_contiguous and out_sp[-1] > 0

    def gather(i, gi, r0, r1, cols):
        if pitch:
            kh_, kw_ = kernel
            start = (i * c + gi * cg) * per + strides[0] * r0 * wd
            if strides[0] == 1:
                run = (r1 - r0) * wd
                src = strided(xq_flat, start, (cg, kh_, kw_, run), (per, dilations[0] * wd, dilations[1], 1))
                np.copyto(cols.reshape(cg, kh_, kw_, run), src)
            else:
                src = strided(xq_flat, start, (cg, kh_, kw_, r1 - r0, wd),
                               (per, dilations[0] * wd, dilations[1], strides[0] * wd, 1))
                np.copyto(cols, src)
            for tx, col in edges:
                cols[:, :, tx, :, col] = pad_value
            return
        if cphase:
            runs_of = as_runs(cols, out_sp[1], (cg, kernel[0], kernel[1], r1 - r0))
            start = i * qs[0] + gi * cg * qs[1] + s0 * r0 * qs[2]
            for b, count in phase_taps:
                src = runs_view(xph, out_sp[1], (cg, kernel[0], count, r1 - r0),
                                 (qs[1], qs[2] * dilations[0], qs[4], qs[2] * s0), start + b * qs[3])
                np.copyto(runs_of[:, :, b::sw], src)
            return
        if runs:
            shape = (cg, *kernel, r1 - r0, *out_sp[1:-1])
            offset = i * sx[0] + gi * cg * sx[1] + s0 * r0 * sx[2]
            np.copyto(as_runs(cols, out_sp[-1], shape), runs_view(xp, out_sp[-1], shape, view_strides[:-1], offset))
            return
        src = xp[i, gi * cg : (gi + 1) * cg, s0 * r0 :]
        view = np.lib.stride_tricks.as_strided(
            src, (cg, *kernel, r1 - r0, *out_sp[1:]), view_strides, writeable=False
        )
        np.copyto(cols, view)

    if band >= rows and (n * g == 1 or flops >= parallel.PARALLEL_MIN_FLOPS * n * g):
        # One band per image: gather once, then split the product itself.
        cols = buffers.scratch(K * L, x.dtype).reshape(cg, *kernel, *out_sp)
        for i in range(n):
            for gi in range(g):
                gather(i, gi, 0, rows, cols)
                out = yv[i, gi * mg : (gi + 1) * mg]
                parallel.matmul(wp.gemm[gi], cols.reshape(K, L), out=out, epilogue=epilogue_for(i, gi))
        return

    jobs = [(i, gi, r0) for i in range(n) for gi in range(g) for r0 in range(0, rows, band)]

    def band_job(j):
        i, gi, r0 = jobs[j]
        r1 = min(rows, r0 + band)
        lb = (r1 - r0) * inner
        cols = buffers.scratch(K * lb, x.dtype).reshape(cg, *kernel, r1 - r0, *out_sp[1:])
        gather(i, gi, r0, r1, cols)
        out = yv[i, gi * mg : (gi + 1) * mg, r0 * inner : r1 * inner]
        np.matmul(wp.gemm[gi], cols.reshape(K, lb), out=out)
        finish(out, i, gi, cols=slice(r0 * inner, r1 * inner))

    parallel.parallel_for(len(jobs), band_job, 1 if flops < parallel.PARALLEL_MIN_FLOPS else threads)


def conv_grouped(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value):
    """A grouped convolution of small maps into ``yv`` ``[N, M, L]``: the taps of all
    channels of all images gathered at once (``[N, C, *kernel, *out]``, the rows of
    each group's weight in order) and multiplied by the ``[G, M/G, K]`` weights in
    one product batched over images and groups."""
    n, c = x.shape[:2]
    g, nd = wp.group, len(wp.kernel)
    xp = pad_spatial(x, pb, pe, pad_value)
    sx = xp.strides
    view = np.lib.stride_tricks.as_strided(
        xp, (n, c, *wp.kernel, *out_sp),
        (sx[0], sx[1], *(sx[2 + a] * dilations[a] for a in range(nd)), *(sx[2 + a] * strides[a] for a in range(nd))),
        writeable=False)
    cols = np.ascontiguousarray(view)
    L = yv.shape[-1]
    np.matmul(wp.gemm, cols.reshape(n, g, -1, L), out=yv.reshape(n, g, -1, L))
