"""Convolutions channels last: a batch of small 2-D images padded once into an
``[N, H, W, C]`` copy, in which a block of images' im2col rows is one strided copy
and one ``[positions, K] @ [K, M]`` product (the float and the integer
convolutions); and the depthwise convolution of a small map, one ``einsum`` over a
strided view of the padded, transposed image."""

from __future__ import annotations

import math

import numpy as np

from .. import parallel
from . import buffers
from .buffers import as_runs, runs_view
from .geometry import pad_margins
from .packing import pair_count

__all__ = ["channels_last_pays", "conv_rows", "depthwise_channels_last", "fill_channels_last", "row_blocks",
           "rows_product"]

#: Elements of one block of channels-last im2col rows (1 MiB of float32): a block is
#: gathered and multiplied while it is still in the L2 cache. A 7x7 stem of 8 images
#: of 64x64 (an im2col of [8192, 147]) on one thread: 1463 us in one block, 1099 in
#: blocks of four images, 948 in blocks of one (150k elements); on two threads, 772 us
#: in two blocks of four images against 709 in eight of one.
_ROWS_BLOCK_ELEMS = 1 << 18


def row_blocks(n: int, oh: int, ow: int, k: int, threads: int) -> list[tuple[int, int, int, int]]:
    """Blocks ``(i0, i1, r0, r1)`` (images ``i0:i1``, output rows ``r0:r1``) of a batched
    channels-last im2col with ``k`` columns, each about :data:`_ROWS_BLOCK_ELEMS`
    elements: whole images where one fits, bands of one image's rows otherwise, and at
    least one block per thread."""
    per = oh * ow
    budget = max(1, _ROWS_BLOCK_ELEMS // k)  # output positions per block
    if per <= budget and n > 1:
        parts = max(-(-n // max(1, budget // per)), min(n, threads))
        cuts = [n * i // parts for i in range(parts + 1)]
        return [(cuts[i], cuts[i + 1], 0, oh) for i in range(parts) if cuts[i] < cuts[i + 1]]
    band = max(1, min(oh, budget // ow, -(-oh // threads) if n < threads else oh))
    return [(i, i + 1, r0, min(oh, r0 + band)) for i in range(n) for r0 in range(0, oh, band)]


#: Up to this many channels a channels-last copy goes channel by channel: numpy's
#: transposing copy runs its inner loop over the few channels (3 for an RGB image),
#: 5-8x slower than one strided pass per channel.
_FEW_CHANNELS = 4


def fill_channels_last(dst: np.ndarray, x: np.ndarray, shift=0) -> None:
    """``dst[n, h, w, c] = x[n, c, h, w] - shift`` in ``dst``'s type (any NCHW ``x``;
    free of a transposing copy when ``x`` is a view of channels-last memory)."""
    xt = x.transpose(0, 2, 3, 1)
    if not xt.flags.c_contiguous:
        if x.shape[1] <= _FEW_CHANNELS:
            for ci in range(x.shape[1]):
                np.subtract(x[:, ci], shift, out=dst[..., ci], dtype=dst.dtype, casting="unsafe")
            return
        # the transposing copy in the input's own (often 1-byte) type, then one
        # contiguous pass: 1.5-2x faster than transposing while converting
        xt = np.ascontiguousarray(xt)
    np.subtract(xt, shift, out=dst, dtype=dst.dtype, casting="unsafe")


def rows_product(xp, kernel, strides, out_sp, w_rows, pairs, jobs, threads, out, product, dh=1) -> None:
    """``out`` ``[N * OH * OW, M]`` (channels last) from the padded channels-last
    input ``xp``: each block of ``jobs`` (:func:`row_blocks` over ``OW / pairs``
    columns) gathers its im2col rows with one strided copy and calls
    ``product(cols, w_rows, dst)``, the blocks claimed by ``threads`` threads.
    ``w_rows`` is :func:`~onnxrt_cpu.conv.packing.paired_rows`'s weight for ``pairs`` outputs per row, or that
    weight with one more row (a bias), which then multiplies a column of ones; ``dh``
    dilates the kernel rows (its columns are not dilated)."""
    n, c = xp.shape[0], xp.shape[3]
    (kh, kw), (sh, sw), (oh, ow) = kernel, strides, out_sp
    fw = (pairs - 1) * sw + kw
    owp = ow // pairs
    k = w_rows.shape[0]
    ones = k > kh * fw * c
    isz = xp.itemsize
    s_n, s_h, s_w, s_c = xp.strides
    # each tap row's fw * C values copied as one element (:func:`runs_view`; xp is a
    # fresh padded copy, C-contiguous): a 7x7 stem on 3 channels, runs of 27 values,
    # gathers about a third faster
    view = runs_view(xp, fw * c, (n, oh, owp, kh), (s_n, sh * s_h, pairs * sw * s_w, dh * s_h))
    per = oh * owp
    out2 = out.reshape(n * per, w_rows.shape[1])

    def block(j):
        i0, i1, r0, r1 = jobs[j]
        count = (i1 - i0) * (r1 - r0) * owp
        cols = buffers.scratch(count * k, xp.dtype)
        if ones:
            # rows of k values: the taps' runs, then a one
            dst = runs_view(cols, fw * c, (i1 - i0, r1 - r0, owp, kh),
                             ((r1 - r0) * owp * k * isz, owp * k * isz, k * isz, fw * c * isz))
            np.copyto(dst, view[i0:i1, r0:r1])
            cols.reshape(count, k)[:, k - 1] = 1
        else:
            np.copyto(as_runs(cols, fw * c, (i1 - i0, r1 - r0, owp, kh)), view[i0:i1, r0:r1])
        start = i0 * per + r0 * owp
        product(cols.reshape(count, k), w_rows, out2[start : start + count])

    parallel.parallel_for(len(jobs), block, threads)


def conv_rows(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value):
    """A 2-D, group-1 convolution of a batch of small images into ``y``, channels last.

    The NCHW path gathers each image's taps in a Python loop (one copy per tap) and
    runs one product per image; for small images (a 7x7 stem on 3 channels, 3x3
    layers on 16 to 64 channels at 8x8 to 32x32) that loop costs more than the
    product, and the pool threads, each needing the GIL for every copy, slow each
    other down. Here the batch is padded into one channels-last copy, in which the
    taps of an output position are ``kh`` runs of ``kw * C`` contiguous values, so a
    block of images' im2col rows is one strided copy and its product one GEMM
    (``[positions, K] @ [K, M]``); blocks of images are the chunks threads share, and
    the result is transposed back to NCHW at the end.
    """
    n, c, h, w = x.shape
    (kh, kw), (oh, ow) = wp.kernel, out_sp
    hp, wpad = h + pb[0] + pe[0], w + pb[1] + pe[1]
    xp = np.full((n, hp, wpad, c), pad_value, dtype=x.dtype) if pad_value else np.zeros((n, hp, wpad, c), x.dtype)
    fill_channels_last(xp[:, pb[0] : pb[0] + h, pb[1] : pb[1] + w], x)
    k, m = kh * kw * c, wp.shape[0]
    pairs = pair_count(m, ow)
    w_rows = wp.paired(strides[1], pairs)
    per = oh * ow
    out = np.empty((n * per, m), dtype=x.dtype)
    threads = parallel.thread_count()
    if n * per * k * m < parallel.PARALLEL_MIN_FLOPS:
        threads = 1
    jobs = row_blocks(n, oh, ow // pairs, w_rows.shape[0], threads)
    rows_product(xp, wp.kernel, strides, out_sp, w_rows, pairs, jobs, threads, out,
                  lambda a, b, dst: np.matmul(a, b, out=dst), dilations[0])
    y.reshape(n, m, per)[...] = out.reshape(n, per, m).transpose(0, 2, 1)


#: Up to this many output positions per channel a 2-D depthwise convolution may run
#: channels last (:func:`channels_last_pays`).
_CHANNELS_LAST_MAX_POSITIONS = 196


def channels_last_pays(c: int, out_sp, strides) -> bool:
    """Whether a 2-D depthwise convolution of ``c`` channels runs faster channels last
    (:func:`depthwise_channels_last`) than on gathered taps: for small maps with
    many channels, where the gathered taps' per-channel product calls and row-long
    copies dominate, or small strided maps, whose stride phases cost as much again.

    Single Conv nodes of MobileNetV2's shapes, one process alternating the two, at one
    thread and two: 960 channels of 7x7, 331 -> 172 us (480 -> 170 at two threads);
    576 of 14x14 with stride 2 (7x7 out), 419 -> 160 us; 192 of 28x28 with stride 2,
    370 -> 238 us; 576 of 14x14, 425 -> 376 us; but 384 of 14x14 tied (312, 316), 192 of
    28x28 lost (511 -> 722 us) and 144 of 56x56 more so (1210 -> 2145 us): there the two
    transposing copies and einsum's rate cost more than the calls they save.
    """
    positions = math.prod(out_sp)
    if positions > _CHANNELS_LAST_MAX_POSITIONS:
        return False
    return any(s > 1 for s in strides) or 2 * c >= 5 * positions


def depthwise_channels_last(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias=None):
    """:func:`~onnxrt_cpu.conv.depthwise.depthwise` for a 2-D map with few output positions,
    channels last.

    The gathered-taps product runs one ``[1, taps] @ [taps, positions]`` BLAS call
    per channel, and gathers the taps in runs as short as a row: on a 7x7 map of 960
    channels the calls and the short runs are most of the time. Channels last, every
    image is one transposing copy into a padded ``[H, W, C]`` buffer, one ``einsum``
    over a strided ``[OH, OW, kh, kw, C]`` view of it (no gathered copy; its inner
    loop runs over the contiguous channels), and one transposing copy back.
    """
    n, c, h, wd = x.shape
    kh, kw = wp.kernel
    oh, ow = out_sp
    hp, wpd = h + pb[0] + pe[0], wd + pb[1] + pe[1]
    wt = wp.depthwise_last()
    buf = buffers.scratch(hp * wpd * c + oh * ow * c, x.dtype)
    padded = buf[: hp * wpd * c].reshape(hp, wpd, c)
    out = buf[hp * wpd * c :].reshape(oh, ow, c)
    # the padding only: the inside is overwritten by every image
    pad_margins(padded.reshape(hp, wpd * c), pb[1] * c, (pb[1] + wd) * c, pad_value)
    if pb[0]:
        padded[: pb[0]] = pad_value
    if pe[0]:
        padded[hp - pe[0] :] = pad_value
    inner = padded[pb[0] : pb[0] + h, pb[1] : pb[1] + wd]
    row, col, ch = padded.strides
    taps = np.ndarray((oh, ow, kh, kw, c), x.dtype, padded,
                      strides=(row * strides[0], col * strides[1], row * dilations[0], col * dilations[1], ch))
    bias_row = None if bias is None else bias.reshape(c)
    for i in range(n):
        inner[...] = x[i].transpose(1, 2, 0)
        np.einsum("hwyxc,yxc->hwc", taps, wt, out=out)
        if bias_row is not None:
            np.add(out, bias_row, out=out)
        y[i] = out.transpose(2, 0, 1)
