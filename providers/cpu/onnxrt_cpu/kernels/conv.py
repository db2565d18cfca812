"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, Col2Im.

Every convolution here is lowered to matrix products that BLAS runs; weights are
packed into the GEMM layout once, when the node's kernel is built:

* a 1x1, stride-1, unpadded Conv is one GEMM on the input viewed as ``[C, H*W]``
  (no copy), split over the output columns or images when there are threads to share;
* a general Conv copies the strided taps of the (padded) input into a column buffer
  ``[C/g * prod(kernel), band]`` (im2col) for a band of output rows at a time, and
  multiplies it straight into that band of the output. The buffer is per thread and
  reused across calls; bands, groups and images are the chunks the kernel threads
  share, and a single-band image splits its GEMM instead;
* a batch of small 2-D images (one band each, group 1) is padded once into a
  channels-last copy instead, where a block of images' im2col rows is one strided
  copy and one ``[positions, K] @ [K, M]`` product, transposed back at the end: no
  per-tap Python loop, which for small images cost more than the product;
* a strided group-1 Conv with no more output channels than taps (a network's first
  layers) gathers its taps from the padded input's stride phases, every tap a
  contiguous run, band by band, and crops the product's columns into the output;
* a depthwise Conv gathers a block of channels' taps and runs one batched
  ``[1, taps] @ [taps, span]`` product per channel block; the taps are contiguous
  runs of the input on its own row pitch (stride 1, output rows as wide as the
  input's) or of the padded input's stride phases (otherwise); a small 2-D map with
  many channels, or a small strided one, runs channels last instead, one ``einsum``
  over a strided view of the padded, transposed image;
* a grouped 1x1 Conv is one batched product over the groups per image;
* ConvTranspose and Col2Im run the GEMM first and scatter-add the columns back
  (col2im), one strided slice per kernel tap.

Integer convolutions run the same GEMM on floating-point copies of the operands:
float32 when every partial sum provably fits its 24-bit mantissa (checked per call
from the input's range), else a sum of float32 convolutions over channel blocks small
enough to be exact each, else float64, so the int32 accumulator is always exact.

The spatial helpers (:func:`conv_pads`, :func:`pad_spatial`, :func:`tap_slices`)
are shared with the pooling kernels.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading

import numpy as np

from onnxrt.plugin.kernel import Kernel
from onnxrt.plugin.pool_geometry import conv_transpose_geometry

from .. import native, parallel
from ..registry import op
from .quantize import centred_bound, column_l1, requantize
from .rows import broadcast_buffer, columns_op

__all__ = ["conv_pads", "pad_spatial", "tap_slices", "compute_dtype"]


# -- shared spatial helpers ------------------------------------------------------------


def compute_dtype(dt: np.dtype) -> np.dtype:
    """The float type a convolution or pooling computes in for inputs of type ``dt``."""
    dt = np.dtype(dt)
    if dt == np.float32 or dt == np.float64:
        return dt
    return np.dtype(np.float32)


def spatial_attrs(attrs: dict, nd: int, kernel=None):
    """``(kernel, strides, dilations)`` as tuples of ``nd`` ints, with spec defaults."""
    if kernel is None:
        kernel = attrs.get("kernel_shape")
    strides = attrs.get("strides") or [1] * nd
    dilations = attrs.get("dilations") or [1] * nd
    if len(strides) != nd or len(dilations) != nd:
        raise ValueError(f"strides {strides} / dilations {dilations} must have {nd} entries (spatial rank)")
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise ValueError(f"strides {strides} and dilations {dilations} must be positive")
    return tuple(int(k) for k in kernel), tuple(int(s) for s in strides), tuple(int(d) for d in dilations)


def conv_pads(in_sp, kernel, strides, dilations, pads, auto_pad):
    """Padding and output size of a convolution-like sliding window, per spatial axis.

    Returns ``(pads_begin, pads_end, out_spatial)`` following the ONNX Conv rules:
    ``SAME_*`` gives ``ceil(in / stride)`` outputs, splitting the padding with the
    extra element at the end (``SAME_UPPER``) or the beginning (``SAME_LOWER``).
    """
    nd = len(in_sp)
    auto_pad = auto_pad or "NOTSET"
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe, out = [], [], []
        for i in range(nd):
            o = -(-in_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i])
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pb.append(b)
            pe.append(total - b)
            out.append(o)
        return pb, pe, out
    if auto_pad == "VALID":
        pb = pe = [0] * nd
    elif auto_pad == "NOTSET":
        if pads is None or len(pads) == 0:
            pads = [0] * (2 * nd)
        if len(pads) != 2 * nd:
            raise ValueError(f"pads {list(pads)} must have {2 * nd} entries")
        if any(p < 0 for p in pads):
            raise ValueError(f"pads {list(pads)} must be non-negative")
        pb, pe = list(pads[:nd]), list(pads[nd:])
    else:
        raise ValueError(f"unknown auto_pad {auto_pad!r}")
    out = []
    for i in range(nd):
        ek = (kernel[i] - 1) * dilations[i] + 1
        o = (in_sp[i] + pb[i] + pe[i] - ek) // strides[i] + 1
        if o < 1:
            raise ValueError(
                f"window {kernel[i]} (dilation {dilations[i]}) does not fit spatial axis {i} "
                f"of size {in_sp[i]} with pads ({pb[i]}, {pe[i]})"
            )
        out.append(o)
    return pb, pe, out


def pad_spatial(x: np.ndarray, pb, pe, value=0) -> np.ndarray:
    """``x`` with its trailing ``len(pb)`` axes padded by ``value`` (``x`` itself if no padding)."""
    nd = len(pb)
    if not any(pb) and not any(pe):
        return x
    lead = x.shape[: x.ndim - nd]
    sp = x.shape[x.ndim - nd :]
    out = np.full(lead + tuple(s + b + e for s, b, e in zip(sp, pb, pe)), value, dtype=x.dtype)
    out[(Ellipsis,) + tuple(slice(b, b + s) for b, s in zip(pb, sp))] = x
    return out


def _column_phases(x: np.ndarray, pb, pe, s: int, value=0) -> np.ndarray:
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
        _pad_margins(inner[:, :, :, b], j0, j0 + count, value)
    return out


def tap_slices(kernel, strides, dilations, out_sp, offset=None):
    """Yield ``(tap, slices)``: for each kernel tap, the strided slices of the padded
    input (trailing axes) that the tap reads for every output position."""
    for tap in itertools.product(*[range(k) for k in kernel]):
        sl = []
        for i, t in enumerate(tap):
            start = t * dilations[i] + (offset[i] if offset else 0)
            sl.append(slice(start, start + strides[i] * (out_sp[i] - 1) + 1, strides[i]))
        yield tap, tuple(sl)


def _im2col(xp: np.ndarray, kernel, strides, dilations, out_sp) -> np.ndarray:
    """Columns ``[C, *kernel, *out_sp]`` (contiguous) of one padded image ``[C, *padded]``."""
    cols = np.empty((xp.shape[0], *kernel, *out_sp), dtype=xp.dtype)
    for tap, sl in tap_slices(kernel, strides, dilations, out_sp):
        cols[(slice(None),) + tap] = xp[(slice(None),) + sl]
    return cols


def _col2im_add(canvas: np.ndarray, cols: np.ndarray, kernel, strides, dilations, in_sp, offset=None):
    """Scatter-add columns ``[C, *kernel, *in_sp]`` into ``canvas`` ``[C, *spatial]``."""
    for tap, sl in tap_slices(kernel, strides, dilations, in_sp, offset):
        canvas[(slice(None),) + sl] += cols[(slice(None),) + tap]


# -- weight packing ------------------------------------------------------------------


class _ConvWeights:
    """A Conv weight ``[M, C/g, *k]`` laid out for the kernel's GEMM.

    ``gemm`` is ``[g, M/g, C/g * prod(k)]`` contiguous; ``depthwise`` is
    ``[C, prod(k)]`` when the node is a depthwise convolution (else ``None``).
    """

    __slots__ = ("shape", "group", "kernel", "gemm", "depthwise", "absmax", "_rows", "_biased", "_paired", "_taps",
                 "_last", "_phased", "_winograd")

    def __init__(self, w: np.ndarray, group: int, dtype: np.dtype):
        if w.ndim < 3:
            raise ValueError(f"weight must have rank >= 3, got shape {w.shape}")
        m = w.shape[0]
        if group < 1 or m % group:
            raise ValueError(f"output channels {m} are not divisible by group {group}")
        self.shape = w.shape
        self.group = group
        self.kernel = tuple(w.shape[2:])
        self.depthwise = None
        self.absmax = None
        self._rows = None
        self._biased = None
        self._paired = None
        self._taps = None
        self._last = None
        self._phased = None
        self._winograd = None
        wc = np.asarray(w, dtype=dtype)
        if group > 1 and w.shape[1] == 1 and m == group:
            self.depthwise = np.ascontiguousarray(wc.reshape(m, math.prod(w.shape[1:])))
        # explicit sizes: -1 cannot be inferred when there are no output channels
        self.gemm = np.ascontiguousarray(wc.reshape(group, m // group, math.prod(w.shape[1:])))

    def rows(self) -> np.ndarray:
        """The 2-D, group-1 weight as ``[kh * kw * C, M]``: the row order of a
        channels-last im2col (made on first use; a race only builds it twice)."""
        if self._rows is None:
            m, c, kh, kw = self.shape
            w4 = self.gemm.reshape(m, c, kh, kw)
            self._rows = np.ascontiguousarray(w4.transpose(2, 3, 1, 0).reshape(kh * kw * c, m))
        return self._rows

    def paired(self, sw: int, pairs: int) -> np.ndarray:
        """:meth:`rows`, widened by :func:`paired_rows` for ``pairs`` outputs per row
        at column stride ``sw`` (kept for the last setting asked for)."""
        if pairs == 1:
            return self.rows()
        cached = self._paired
        if cached is None or cached[0] != (sw, pairs):
            m, c, kh, kw = self.shape
            cached = self._paired = ((sw, pairs), paired_rows(self.rows(), kh, kw, c, sw, pairs))
        return cached[1]

    def winograd(self) -> np.ndarray:
        """A group-1 3x3 weight's Winograd transform ``G g G^T`` as ``[16, M, C]``
        float32 (element ``4 i + j`` of each 4x4 transform at ``[4 i + j]``), for the
        compiled F(2x2, 3x3) kernel; computed in float64 and rounded once, on first
        use (a race only builds it twice)."""
        if self._winograd is None:
            m, c = self.shape[:2]
            g = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
            # G w G^T for every (m, c) at once: one product of G (x) G with the [MC, 9]
            # weights (an einsum over the five indices took 0.3 s for ResNet-18's)
            kron = np.einsum("ik,jl->ijkl", g, g).reshape(16, 9)
            # [16, 9] x [9, MC]: the transposed weight is read as it lies, and the
            # product comes out in the kernel's [16, M, C] order (no transposing copy)
            u = kron @ self.gemm.reshape(m * c, 9).astype(np.float64).T
            self._winograd = u.astype(np.float32).reshape(16, m, c)
        return self._winograd

    def depthwise_last(self) -> np.ndarray:
        """The depthwise weight as ``[*kernel, C]``: the channels-last layout of
        :func:`_depthwise_channels_last` (made on first use; a race only builds it twice)."""
        if self._last is None:
            c = self.depthwise.shape[0]
            self._last = np.ascontiguousarray(self.depthwise.T.reshape(*self.kernel, c))
        return self._last

    def _kept(self, slot: str, key, bias, constant, build):
        """``build()``, kept in ``slot`` for ``key`` and ``constant``, the node's
        constant bias array (``bias`` is a new view of it on every call); a bias fed at
        run time (``constant`` None) may hold new values in the same memory, so a
        weight with a ``bias`` folded in is built afresh every call."""
        keep = bias is None or constant is not None
        cached = getattr(self, slot)
        if keep and cached is not None and cached[0] == key and cached[1] is constant:
            return cached[2]
        result = build()
        if keep:
            setattr(self, slot, (key, constant, result))
        return result

    def depthwise_taps(self, order, bias, constant=None):
        """The depthwise weight as ``[C, 1, taps]`` with its taps in ``order`` (a tuple,
        or None for kernel order), and the rows of gathered taps it multiplies: with a
        ``bias`` ``[C, 1]``, the bias as one more tap, which reads a row of ones, so the
        product carries it (one more row in a product that is in cache, where adding
        it afterwards is a pass over the whole output: 144 x 56 x 56, 112 us).
        Kept for the last order and ``constant`` (:meth:`_kept`)."""

        def build():
            c, taps = self.depthwise.shape
            w3 = self.depthwise.reshape(c, 1, taps)
            if order is not None:
                w3 = w3[:, :, list(order)]
            if bias is not None:
                w3 = np.concatenate([w3, bias.reshape(-1, 1, 1).astype(w3.dtype, copy=False)], axis=2)
            return w3, w3.shape[2]

        return self._kept("_taps", order, bias, constant, build)

    def phased(self, order, bias=None, constant=None) -> tuple[np.ndarray, int]:
        """The group-1 GEMM weight ``[M, C * taps]`` with each channel's taps in
        ``order`` (a tuple), the row order of :func:`_conv_phases`'s gathered taps,
        and with a ``bias`` ``[M, 1]`` as one more column (which multiplies a row of
        ones); and its column count. Kept for the last order and ``constant``
        (:meth:`_kept`)."""

        def build():
            m, k = self.gemm.shape[1:]
            taps = math.prod(self.kernel)
            w = self.gemm[0].reshape(m, k // taps, taps)[:, :, list(order)].reshape(m, k)
            if bias is not None:
                w = np.concatenate([w, bias.reshape(m, 1).astype(w.dtype, copy=False)], axis=1)
            return np.ascontiguousarray(w), w.shape[1]

        return self._kept("_phased", order, bias, constant, build)

    def biased(self, bias: np.ndarray, constant=None) -> np.ndarray:
        """The group-1 GEMM weight ``[M, K + 1]`` with ``bias`` (``[M]``) as its last
        column: times an input with a row of ones appended, the product carries the
        bias. Kept for ``constant``, the node's constant bias (:meth:`_kept`)."""

        def build():
            col = bias.astype(self.gemm.dtype, copy=False).reshape(-1, 1)
            return np.concatenate([self.gemm[0], col], axis=1)

        return self._kept("_biased", None, bias, constant, build)


def _runs_view(base: np.ndarray, run: int, shape, strides, offset: int = 0) -> np.ndarray:
    """A view of the C-contiguous ``base``'s memory whose elements are runs of ``run``
    consecutive values (one void element each), at byte ``strides`` from ``offset``;
    the runs may overlap (as the taps of neighbouring outputs do in an im2col).

    Copied from such a view, each run is one element, so numpy's copy loops over whole
    runs instead of calling its inner loop once per run of a few values."""
    return np.ndarray(shape, dtype=np.dtype((np.void, run * base.itemsize)), buffer=base, offset=offset,
                      strides=strides)


def _as_runs(a: np.ndarray, run: int, shape) -> np.ndarray:
    """The C-contiguous ``a`` as ``shape`` elements of ``run`` values each (the
    destination matching a :func:`_runs_view`)."""
    return a.reshape(-1).view(np.dtype((np.void, run * a.itemsize))).reshape(shape)


def _strided(buf: np.ndarray, offset: int, shape, steps) -> np.ndarray:
    """A view of the contiguous ``buf`` from element ``offset`` with ``shape`` and
    ``steps`` (element strides), which may overlap: ``as_strided`` without its Python
    wrapping (0.4 against 4.3 us a view)."""
    isz = buf.itemsize
    return np.ndarray(shape, buf.dtype, buf, offset * isz, tuple(st * isz for st in steps))


def _scratch(size: int, dtype) -> np.ndarray:
    """A flat buffer of ``size`` elements owned by the calling thread, reused across calls.

    Kernels are shared by every thread that runs a session, so the im2col buffer
    cannot live on the kernel; one per thread (grown as needed) avoids allocating
    and page-faulting a fresh column buffer per call.
    """
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    dt = np.dtype(dtype)
    buf = bufs.get(dt)
    if buf is None or buf.size < size:
        buf = bufs[dt] = np.empty(max(size, 1), dtype=dt)
    return buf[:size]


_tls = threading.local()

#: Elements of one im2col band: about the L2 cache, so that the GEMM reads what the
#: gather just wrote; a band also keeps at least ``_BAND_MIN_COLS`` output columns,
#: since narrower products run far below BLAS's peak (measured: 512 channels at 7x7,
#: 3.9 ms in 4-row bands against 2.8 ms in one).
_BAND_ELEMS = 1 << 19
_BAND_MIN_COLS = 128

#: Whether the banded im2col of a layer with stride 2 along the rows gathers from the
#: input's column phases (:func:`_column_phases`); off, every tap reads every second
#: value of a row. The gathered columns are the same either way.
_COLUMN_PHASES = True


def _conv_forward(x, wp: _ConvWeights, strides, dilations, pb, pe, out_sp, bias=None, pad_value=0,
                  residual=None, activation=None, constant_bias=False):
    """The convolution of ``x`` ``[N, C, *sp]`` (already in the compute dtype).

    The output is computed in bands of rows of the first output axis: each band's
    columns are gathered into a per-thread scratch buffer and multiplied at once into
    its slice of the output (a strided view BLAS writes directly). Bands, groups and
    images are the chunks the kernel threads share.

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
        if _depthwise_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, fused):
            if fused is not None or activation is None:
                return y
        else:
            _depthwise(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bcol, bias_key)
        if residual is not None:
            y += residual
        if activation is not None:
            activation(y)
        return y
    if _conv_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, residual, fused):
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
            xb = _scratch((c + 1) * L, x.dtype).reshape(c + 1, L)
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
        _conv_grouped(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value)
        if bcol is not None:
            yv += bcol
        if zv is not None:
            yv += zv
        if activation is not None:
            activation(yv)
        return y

    if (
        n > 1
        and g == 1
        and nd == 2
        and K * L <= _BAND_ELEMS
        and dilations[1] == 1
        and min(pb) >= 0
        and min(pe) >= 0
    ):
        _conv_rows(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value)
        yb = y.reshape(n, m, L)
        if bcol is not None:
            yb += bcol
        if residual is not None:
            y += residual
        if activation is not None:
            activation(y)
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
    # from the stride phases in runs (_conv_phases), where the banded im2col would
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
        _conv_phases(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value, bcol, bias_key, finish)
        return y

    # "Same" rows (unit stride along the row, output as wide as the input): the
    # input padded above and below only, each channel one flat run on the input's
    # own row pitch, where every tap of a band of output rows is one contiguous run
    # and a tap past a row's end reads the next row's first values (its column of
    # the gathered taps is overwritten with the padding, as in _depthwise_rows).
    # Against the padded grid: one contiguous copy of the input, not one per row,
    # and one long run per tap and band, not one per output row
    pitch = nd == 2 and strides[1] == 1 and out_sp[1] == x.shape[3] and min(pb) >= 0 and min(pe) >= 0
    if pitch:
        h, wd = x.shape[2:]
        head, per, edges = _row_pitch(h, wd, tuple(pb), tuple(pe), kernel[1], dilations[1])
        xq = np.empty((n, c, per), dtype=x.dtype)
        _pad_margins(xq, head, head + h * wd, pad_value)
        xq[..., head : head + h * wd] = x.reshape(n, c, h * wd)
        xq_flat = xq.reshape(-1)
    elif cphase:
        xph = _column_phases(x, pb, pe, strides[1], pad_value)
    else:
        xp = pad_spatial(x, pb, pe, pad_value)
    rows = out_sp[0]
    inner = L // rows
    band = max(1, _BAND_ELEMS // max(1, K * inner), -(-_BAND_MIN_COLS // inner))
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
    # run of the padded input, copied as one element (:func:`_runs_view`): 512
    # channels of 7x7 with a 3x3 kernel 172 -> 110 us, 256 of 14x14 191 -> 144 us, 64
    # of 56x56 within the spread
    runs = not pitch and not cphase and nd >= 2 and strides[-1] == 1 and xp.flags.c_contiguous and out_sp[-1] > 0

    def gather(i, gi, r0, r1, cols):
        if pitch:
            kh_, kw_ = kernel
            start = (i * c + gi * cg) * per + strides[0] * r0 * wd
            if strides[0] == 1:
                run = (r1 - r0) * wd
                src = _strided(xq_flat, start, (cg, kh_, kw_, run), (per, dilations[0] * wd, dilations[1], 1))
                np.copyto(cols.reshape(cg, kh_, kw_, run), src)
            else:
                src = _strided(xq_flat, start, (cg, kh_, kw_, r1 - r0, wd),
                               (per, dilations[0] * wd, dilations[1], strides[0] * wd, 1))
                np.copyto(cols, src)
            for tx, col in edges:
                cols[:, :, tx, :, col] = pad_value
            return
        if cphase:
            runs_of = _as_runs(cols, out_sp[1], (cg, kernel[0], kernel[1], r1 - r0))
            start = i * qs[0] + gi * cg * qs[1] + s0 * r0 * qs[2]
            for b, count in phase_taps:
                src = _runs_view(xph, out_sp[1], (cg, kernel[0], count, r1 - r0),
                                 (qs[1], qs[2] * dilations[0], qs[4], qs[2] * s0), start + b * qs[3])
                np.copyto(runs_of[:, :, b::sw], src)
            return
        if runs:
            shape = (cg, *kernel, r1 - r0, *out_sp[1:-1])
            offset = i * sx[0] + gi * cg * sx[1] + s0 * r0 * sx[2]
            np.copyto(_as_runs(cols, out_sp[-1], shape), _runs_view(xp, out_sp[-1], shape, view_strides[:-1], offset))
            return
        src = xp[i, gi * cg : (gi + 1) * cg, s0 * r0 :]
        view = np.lib.stride_tricks.as_strided(
            src, (cg, *kernel, r1 - r0, *out_sp[1:]), view_strides, writeable=False
        )
        np.copyto(cols, view)

    if band >= rows and (n * g == 1 or flops >= parallel.PARALLEL_MIN_FLOPS * n * g):
        # One band per image: gather once, then split the product itself.
        cols = _scratch(K * L, x.dtype).reshape(cg, *kernel, *out_sp)
        for i in range(n):
            for gi in range(g):
                gather(i, gi, 0, rows, cols)
                out = yv[i, gi * mg : (gi + 1) * mg]
                parallel.matmul(wp.gemm[gi], cols.reshape(K, L), out=out, epilogue=epilogue_for(i, gi))
        return y

    jobs = [(i, gi, r0) for i in range(n) for gi in range(g) for r0 in range(0, rows, band)]

    def band_job(j):
        i, gi, r0 = jobs[j]
        r1 = min(rows, r0 + band)
        lb = (r1 - r0) * inner
        cols = _scratch(K * lb, x.dtype).reshape(cg, *kernel, r1 - r0, *out_sp[1:])
        gather(i, gi, r0, r1, cols)
        out = yv[i, gi * mg : (gi + 1) * mg, r0 * inner : r1 * inner]
        np.matmul(wp.gemm[gi], cols.reshape(K, lb), out=out)
        finish(out, i, gi, cols=slice(r0 * inner, r1 * inner))

    parallel.parallel_for(len(jobs), band_job, 1 if flops < parallel.PARALLEL_MIN_FLOPS else threads)
    return y


#: Elements of one block of channels-last im2col rows (1 MiB of float32): a block is
#: gathered and multiplied while it is still in the L2 cache. A 7x7 stem of 8 images
#: of 64x64 (an im2col of [8192, 147]) on one thread: 1463 us in one block, 1099 in
#: blocks of four images, 948 in blocks of one (150k elements); on two threads, 772 us
#: in two blocks of four images against 709 in eight of one.
_ROWS_BLOCK_ELEMS = 1 << 18


def _row_blocks(n: int, oh: int, ow: int, k: int, threads: int) -> list[tuple[int, int, int, int]]:
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


#: Up to this many output channels, two adjacent output positions share one row of
#: the channels-last im2col (see :func:`paired_rows`).
_PAIR_MAX_CHANNELS = 16


def pair_count(m: int, ow: int) -> int:
    """Adjacent output columns per im2col row for ``m`` output channels and output
    width ``ow``: 2 for few channels (and an even width), else 1."""
    return 2 if m <= _PAIR_MAX_CHANNELS and ow % 2 == 0 else 1


def paired_rows(w_rows: np.ndarray, kh: int, kw: int, c: int, sw: int, pairs: int) -> np.ndarray:
    """The channels-last GEMM weight ``[kh * kw * C, M]`` widened to compute ``pairs``
    adjacent output columns per im2col row: ``[kh * fw * C, pairs * M]`` with
    ``fw = (pairs - 1) * sw + kw`` input columns, each output's taps at its own
    offset and zeros elsewhere.

    With 16 output channels a GEMM runs far below BLAS's peak (``[1024, 147] @
    [147, 16]`` for a 7x7 stem), and the im2col copy of short runs costs as much as
    the product. Two outputs per row double N and share the overlap of their
    windows: a third more multiply-adds, at a better rate, and half as many copied
    runs, each longer, of two thirds of the data (one 64x64 image of a 7x7 stride-2
    stem: copy 60 -> 33 us, product 67 -> 71 us; 16 channels 3x3 on 4 images of
    16x16: 42 -> 16 and 57 -> 58 us; with 32 channels the product lost what the copy
    saved, and four outputs per row lost on the product).
    """
    m = w_rows.shape[1]
    w = w_rows.reshape(kh, kw, c, m)
    fw = (pairs - 1) * sw + kw
    wide = np.zeros((kh, fw, c, pairs, m), dtype=w_rows.dtype)
    for j in range(pairs):
        wide[:, j * sw : j * sw + kw, :, j, :] = w
    return wide.reshape(kh * fw * c, pairs * m)


def _rows_product(xp, kernel, strides, out_sp, w_rows, pairs, jobs, threads, out, product, dh=1) -> None:
    """``out`` ``[N * OH * OW, M]`` (channels last) from the padded channels-last
    input ``xp``: each block of ``jobs`` (:func:`_row_blocks` over ``OW / pairs``
    columns) gathers its im2col rows with one strided copy and calls
    ``product(cols, w_rows, dst)``, the blocks claimed by ``threads`` threads.
    ``w_rows`` is :func:`paired_rows`'s weight for ``pairs`` outputs per row, or that
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
    # each tap row's fw * C values copied as one element (:func:`_runs_view`; xp is a
    # fresh padded copy, C-contiguous): a 7x7 stem on 3 channels, runs of 27 values,
    # gathers about a third faster
    view = _runs_view(xp, fw * c, (n, oh, owp, kh), (s_n, sh * s_h, pairs * sw * s_w, dh * s_h))
    per = oh * owp
    out2 = out.reshape(n * per, w_rows.shape[1])

    def block(j):
        i0, i1, r0, r1 = jobs[j]
        count = (i1 - i0) * (r1 - r0) * owp
        cols = _scratch(count * k, xp.dtype)
        if ones:
            # rows of k values: the taps' runs, then a one
            dst = _runs_view(cols, fw * c, (i1 - i0, r1 - r0, owp, kh),
                             ((r1 - r0) * owp * k * isz, owp * k * isz, k * isz, fw * c * isz))
            np.copyto(dst, view[i0:i1, r0:r1])
            cols.reshape(count, k)[:, k - 1] = 1
        else:
            np.copyto(_as_runs(cols, fw * c, (i1 - i0, r1 - r0, owp, kh)), view[i0:i1, r0:r1])
        start = i0 * per + r0 * owp
        product(cols.reshape(count, k), w_rows, out2[start : start + count])

    parallel.parallel_for(len(jobs), block, threads)


def _conv_rows(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value):
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
    jobs = _row_blocks(n, oh, ow // pairs, w_rows.shape[0], threads)
    _rows_product(xp, wp.kernel, strides, out_sp, w_rows, pairs, jobs, threads, out,
                  lambda a, b, dst: np.matmul(a, b, out=dst), dilations[0])
    y.reshape(n, m, per)[...] = out.reshape(n, per, m).transpose(0, 2, 1)


#: Largest im2col (elements, all images and groups) of :func:`_conv_grouped`. One
#: session alternating it with the banded path (2 threads), medians: 440 channels in
#: 55 groups at 4x4 0.94 -> 0.30 ms, 8x8 0.85 -> 0.40, 16x16 1.22 -> 1.02; 224 in 28
#: at 8x8 0.45 -> 0.23, 16x16 0.64 -> 0.51, 32x32 (2M elements) 1.73 -> 1.69; 96 in
#: 4 at 28x28 and 192 in 8 at 14x14 tied.
_GROUPED_ELEMS = 1 << 20


def _conv_grouped(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value):
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


#: Most stride phases (the product of the strides) :func:`_conv_phases` splits an
#: input into; larger strides take the banded im2col, one strided gather a band.
_MAX_PHASES = 9

#: Elements of one band of :func:`_conv_phases`'s gathered taps.
_PHASE_BAND_ELEMS = 1 << 17


def _conv_phases(x, wp, strides, dilations, pb, pe, out_sp, yv, pad_value, bias, bias_key, finish):
    """A strided group-1 convolution on the stride phases of its padded input, as
    :func:`_depthwise` lays them out (:func:`_phase_geometry`, :func:`_tap_groups`):
    every tap then reads contiguous runs, so a band of output rows gathers the taps
    of all channels in one copy per phase, with runs as long as the band, and
    multiplies them by the weight with its taps in the same order and the bias as one
    more tap reading ones (:meth:`_ConvWeights.phased`) in one product on the phase's
    row pitch, of which the band of the output keeps its own columns.

    The plain banded im2col reads a strided tap value by value (its inner loop steps
    over every other input value) and pads a copy of the input first; for the few
    input channels of a network's first strided layers that is most of the time.
    Layers with stride 2 along the row run the banded im2col on their column phases
    instead (:func:`_column_phases`), which is faster still; this path keeps the
    other strides, dilations along the row and 1-D and 3-D maps.
    ``finish(out, image, group, cols=..., with_bias=False)`` adds the residual and
    the activation to each band while it is in cache."""
    n, c = x.shape[:2]
    m = yv.shape[1]
    q, pitch, copies = _phase_geometry(tuple(x.shape[2:]), tuple(wp.kernel), tuple(strides), tuple(dilations),
                                       tuple(pb), tuple(pe), tuple(out_sp))
    groups, order = _tap_groups(wp.kernel, strides, dilations, pitch)
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
    buf = _scratch(phases + kk * width + m * width, x.dtype)
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
                view = _strided(buf, ph * plane + off + r0 * p0, (c, *shape, length), (nph * plane, *steps, 1))
                np.copyto(taps3[:, t0 : t0 + count, :length].reshape(c, *shape, length), view)
                t0 += count
            part = res[:, :length]
            np.matmul(w, cols[:, :length], out=part)
            out = yv[i, :, r0 * inner : r1 * inner]
            out.reshape(m, r1 - r0, *out_sp[1:])[...] = part.reshape(m, r1 - r0, *q[1:])[kept]
            finish(out, i, 0, cols=slice(r0 * inner, r1 * inner), with_bias=False)


#: Elements of a depthwise convolution's gathered taps per block of channels (1 MiB of
#: float32). MobileNetV2, alternating on one session, tenth percentiles of three runs:
#: 23.4-24.4 ms at 2**18 against 25.0-25.9 ms at 2**19; 2**16 and smaller were slower.
_DEPTHWISE_BLOCK_ELEMS = 1 << 18


@functools.lru_cache(maxsize=256)
def _phase_geometry(in_sp, kernel, strides, dilations, pb, pe, out_sp):
    """Where the stride phases of a padded input lie, flattened so every tap is one run.
    Kept per geometry (all arguments tuples, results read only): deriving it took 30 us
    a call, on every run of every strided depthwise layer.

    Phase ``p`` holds ``padded[p::s]`` along each axis (zero-extended to a common
    shape ``q``, plus one spare row), so the tap at ``t`` for output ``o`` reads phase
    ``(t*d) % s`` at ``o + (t*d) // s``: on the flattened phase, every tap's inputs for
    a run of output rows form one contiguous slice of ``rows * pitch[0]`` elements
    (outputs computed on the phase's row pitch, cropped afterwards).

    Returns ``(q, pitch, copies)``, ``copies`` being the ``(phase, destination slices,
    source slices)`` that write the input into the phases (:func:`_tap_groups` places
    the taps).
    """
    nd = len(kernel)
    reach = [(kernel[a] - 1) * dilations[a] // strides[a] for a in range(nd)]
    q = [max(-(-(in_sp[a] + pb[a] + pe[a]) // strides[a]), out_sp[a] + reach[a]) for a in range(nd)]
    q[0] += 1
    phases = list(itertools.product(*[range(s_) for s_ in strides]))
    copies = []
    for k, ph in enumerate(phases):
        dst, src = [], []
        for a in range(nd):
            s_, p_ = strides[a], ph[a]
            i0 = max(0, -(-(pb[a] - p_) // s_))  # first phase index landing inside the input
            o0 = s_ * i0 + p_ - pb[a]
            cnt = max(0, -(-(in_sp[a] - o0) // s_)) if o0 < in_sp[a] else 0
            cnt = min(cnt, q[a] - i0)
            dst.append(slice(i0, i0 + cnt))
            src.append(slice(o0, o0 + s_ * (cnt - 1) + 1 if cnt else o0, s_))
        if all(d_.stop > d_.start for d_ in dst):
            copies.append((k, tuple(dst), tuple(src)))
    pitch = [math.prod(q[a + 1 :]) for a in range(nd)]
    return tuple(q), tuple(pitch), tuple(copies)


def _native_geometry(x, wp, strides, dilations, pb, pe, out_sp, pad_value):
    """``(x as [N, C, H, W], kernel (kh, kw), strides, dilations, pads begin, out
    (oh, ow))`` for the compiled kernels, a 1-D convolution as a 2-D one of one row;
    None where they do not take the layer (3-D and more, a padding value other than
    0, negative pads, a dtype other than float32/64, an empty output)."""
    if native.K is None or pad_value != 0 or x.dtype not in _NATIVE_FLOATS or min(pb) < 0 or min(pe) < 0 \
            or 0 in out_sp or 0 in x.shape or wp.shape[0] == 0:
        return None
    if x.ndim == 4:
        return (np.ascontiguousarray(x), tuple(wp.kernel), tuple(strides), tuple(dilations), tuple(pb),
                tuple(out_sp))
    if x.ndim == 3:
        return (np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], 1, x.shape[2]), (1, wp.kernel[0]),
                (1, strides[0]), (1, dilations[0]), (0, pb[0]), (1, out_sp[0]))
    return None


def _native_act(act):
    """``(kind, lo, hi)`` of a fused activation the compiled kernels apply, from its
    ``native`` form (FusedConv's Relu and Clip); (0, 0, 0) for none."""
    return act if act is not None else (0, 0.0, 0.0)


def _depthwise_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, act) -> bool:
    """The depthwise convolution by the compiled kernel, where it takes the layer
    (:func:`_native_geometry`), with the bias ``[C]`` and the activation ``act``
    (``(kind, lo, hi)``, or None); False where it did nothing.

    Per plane it does what :func:`_depthwise` does in numpy calls (the stride phases
    of the padded input, every tap a contiguous run, the output on the phases' row
    pitch), in one pass in cache; maps of up to 256 positions go channels last, a
    vector of channels at a time. MobileNetV2's depthwise layers on one thread: 8.7 ms
    in numpy calls, 1.4 ms compiled, onnxruntime 1.1 ms."""
    geo = _native_geometry(x, wp, strides, dilations, pb, pe, out_sp, pad_value)
    if geo is None:
        return False
    x4, (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = geo
    n, c, h, w_ = x4.shape
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=x.dtype).reshape(c)
    kind, lo, hi = _native_act(act)
    native.K.depthwise2d(x4, wp.depthwise, bias, y, (n, c, h, w_, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow),
                        kind, lo, hi, parallel.thread_count())
    return True


def _conv_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, residual, act) -> bool:
    """The convolution by the compiled kernel (im2col in cache-sized chunks, numpy's
    BLAS, bias, residual and activation on each tile while it is in cache, the
    chunks on the compiled pool), where it takes the layer (:func:`_native_geometry`,
    and numpy's BLAS handed over); False where it did nothing."""
    if not native.BLAS:
        return False
    geo = _native_geometry(x, wp, strides, dilations, pb, pe, out_sp, pad_value)
    if geo is None:
        return False
    x4, (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = geo
    n, c, h, w_ = x4.shape
    m = wp.shape[0]
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=x.dtype).reshape(m)
    if residual is not None:
        residual = np.ascontiguousarray(residual, dtype=x.dtype)
    kind, lo, hi = _native_act(act)
    if _winograd_pays(x4, wp, (kh, kw), (sh, sw), (dh, dw), (oh, ow)):
        native.K.winograd3x3(x4, wp.winograd(), bias, residual, y, (n, c, h, w_, m, pt, pl, oh, ow), kind, lo, hi,
                             parallel.thread_count())
        return True
    if _direct_pays(x4, wp, (kh, kw), (oh, ow)):
        try:
            native.K.direct2d(x4, wp.gemm, bias, residual, y, (n, c, h, w_, m, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow),
                              kind, lo, hi, parallel.thread_count())
            return True
        except MemoryError:
            pass  # input phases past the compiled kernel's limit: im2col below, in bounded tiles
    try:
        native.K.conv2d(x4, wp.gemm, bias, residual, y,
                        (n, c, h, w_, m, wp.group, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow), kind, lo, hi,
                        parallel.thread_count())
    except MemoryError:
        # a kernel so large that a tile of its gathered columns passes the compiled
        # kernel's limit: the numpy path gathers in bounded bands
        return False
    return True


_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: Fewest output positions a side, and input times output channels, for which a 3x3
#: convolution takes Winograd's F(2x2, 3x3) (:func:`_winograd_pays`).
_WINOGRAD_MIN_SIDE = 12
_WINOGRAD_MIN_CHANNELS = 64 * 64


#: Longest reduction (input channels times taps) a convolution takes the compiled
#: direct kernel for (:func:`_direct_pays`).
_DIRECT_MAX_K = 300


#: Fewest output positions of a map the direct kernel takes: it runs every image as
#: two pool jobs, which on small maps cost more than the work (QDQ ResNet-style
#: model, batch 8, a 3x3/2 layer of 32 -> 64 channels to 4 x 4: 103 -> 510 us).
_DIRECT_MIN_POSITIONS = 400


def _direct_pays(x4, wp, kernel, out_sp) -> bool:
    """Whether the compiled direct kernel takes this layer: float32, group 1, not 1x1,
    a reduction of at most 300 (input channels times taps), at most 16 output
    channels or at least 8 input channels, and maps of at least 400 outputs. There im2col's product is short and
    narrow and runs far below BLAS's peak; the direct kernel keeps four output channels
    by 64 positions in registers. One thread: the YOLO-style detector's stem (8 x 3,
    3x3/2 at 320 x 320) 345 -> 239 us, 8 x 8 3x3 at 80 x 80 235 -> 122, 32 x 32 3x3 at
    40 x 40 462 -> 334; but 32 x 3 3x3/2 at 224 x 224 490 -> 562 (left to im2col)."""
    m, c = wp.shape[:2]
    return (x4.dtype == np.float32 and wp.group == 1 and kernel != (1, 1)
            and c * kernel[0] * kernel[1] <= _DIRECT_MAX_K and (m <= 16 or c >= 8)
            and out_sp[0] * out_sp[1] >= _DIRECT_MIN_POSITIONS)


def _winograd_pays(x4, wp, kernel, strides, dilations, out_sp) -> bool:
    """Whether the compiled F(2x2, 3x3) kernel takes this layer: float32, group 1, 3x3,
    stride 1, no dilation, maps of at least 12 x 12 outputs and at least 64 x 64
    channels. It multiplies 2.25 times less than im2col does, in 16 products of [M, C]
    x [C, tiles], plus additions for its transforms: ResNet-18's 3x3 layers on two
    threads, 64 x 56 x 56 1526 -> 1045 us, 128 x 28 x 28 1534 -> 930, 256 x 14 x 14
    1569 -> 736; but 512 x 7 x 7 (16 tiles) 1905 -> 2101 and 32 x 32 channels at 40 x
    40 441 -> 506 on one thread, whose products are too narrow for BLAS. Results agree
    with the direct convolution to about 1e-6 relative (the transforms' coefficients
    are 0, +-1 and +-1/2)."""
    return (x4.dtype == np.float32 and wp.group == 1 and kernel == (3, 3) and strides == (1, 1)
            and dilations == (1, 1) and min(out_sp) >= _WINOGRAD_MIN_SIDE
            and wp.shape[0] * wp.shape[1] >= _WINOGRAD_MIN_CHANNELS)


def _depthwise(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias=None, bias_key=None):
    """Depthwise conv: per channel, one small product ``w[c] @ taps[c]``.

    The padded input is split into ``prod(strides)`` phases (``x[p::s]`` along each
    axis), each contiguous, so that every kernel tap reads one contiguous run of one
    flattened phase: the output is computed on the phase's row pitch and cropped at
    the end (the phases get one spare row so the last tap's run stays in bounds).
    Per block of channels the input is written into the phases (whose padding,
    never overwritten, is filled once a call), the taps' runs copied into a ``[c,
    taps, span]`` buffer, a strided view of a phase per group of taps
    (:func:`_tap_groups`), and multiplied by the ``[c, 1, taps]`` weights in one
    batched matmul, a bias as one more tap reading ones
    (:meth:`_ConvWeights.depthwise_taps`). Blocks are shared by the kernel threads;
    each thread's buffers and views are made once a call.

    The phases are written block by block rather than for the whole input first:
    with stride 2 each phase's strided copy touches every cache line of the input,
    so four phases of a large map read it from memory four times, where a block's
    input stays in the cache between its phases (MobileNetV2's 96 x 112 x 112 layer:
    the phases alone 1.33 ms for the whole input).
    """
    if x.ndim == 4 and min(pb) >= 0 and min(pe) >= 0 and _channels_last_pays(x.shape[1], out_sp, strides):
        _depthwise_channels_last(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias)
        return
    if (x.ndim == 4 and strides == (1, 1) and out_sp[1] == x.shape[3] and min(pb) >= 0 and min(pe) >= 0):
        _depthwise_rows(x, wp, dilations, pb, pe, out_sp, y, pad_value, bias, bias_key)
        return
    n, c = x.shape[:2]
    w = wp.depthwise
    taps = w.shape[1]
    q, pitch, copies = _phase_geometry(tuple(x.shape[2:]), tuple(wp.kernel), tuple(strides), tuple(dilations),
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
    groups, order = _tap_groups(wp.kernel, strides, dilations, pitch)
    w3, rows_k = wp.depthwise_taps(order, bias, bias_key)
    spaces = {}

    def space():
        """This thread's phases, gathered taps, product and their views, made once a
        call (the views cost more Python than a block's copies; see _depthwise_rows)."""
        me = threading.get_ident()
        sp = spaces.get(me)
        if sp is None:
            buf = _scratch(cb * (nph * plane + (rows_k + 1) * span), x.dtype)
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
                view = _strided(buf, ph * plane + off, (cb, *shape, span), (nph * plane, *steps, 1))
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


#: Up to this many output positions per channel a 2-D depthwise convolution may run
#: channels last (:func:`_channels_last_pays`).
_CHANNELS_LAST_MAX_POSITIONS = 196


def _channels_last_pays(c: int, out_sp, strides) -> bool:
    """Whether a 2-D depthwise convolution of ``c`` channels runs faster channels last
    (:func:`_depthwise_channels_last`) than on gathered taps: for small maps with
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


def _depthwise_channels_last(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias=None):
    """:func:`_depthwise` for a 2-D map with few output positions, channels last.

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
    buf = _scratch(hp * wpd * c + oh * ow * c, x.dtype)
    padded = buf[: hp * wpd * c].reshape(hp, wpd, c)
    out = buf[hp * wpd * c :].reshape(oh, ow, c)
    # the padding only: the inside is overwritten by every image
    _pad_margins(padded.reshape(hp, wpd * c), pb[1] * c, (pb[1] + wd) * c, pad_value)
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


@functools.lru_cache(maxsize=256)
def _tap_groups(kernel, strides, dilations, pitch):
    """The taps of :func:`_phase_geometry`'s phase layout as groups that each read one
    strided view of one flattened phase: ``([(phase, offset, shape, element steps)],
    tap order)``, the order listing the taps group by group.

    Along each axis the taps landing in one phase are every ``s / gcd(s, d)``-th tap,
    and their offsets in the phase grow by a constant step, so a phase's taps are the
    product of one arithmetic run per axis: one view of ``shape`` (the run lengths)
    with the runs' steps times the phase's pitches.
    """
    nd = len(kernel)
    per_axis = []  # per axis: {phase index along the axis: [(tap index, offset)]}
    for a in range(nd):
        runs = {}
        for t in range(kernel[a]):
            pos = t * dilations[a]
            runs.setdefault(pos % strides[a], []).append((t, pos // strides[a]))
        per_axis.append(runs)
    groups, order = [], []
    for ph in itertools.product(*[range(s_) for s_ in strides]):
        axes = [per_axis[a].get(ph[a]) for a in range(nd)]
        if any(r is None for r in axes):
            continue
        index = 0
        for a in range(nd):
            index = index * strides[a] + ph[a]
        offset = sum(axes[a][0][1] * pitch[a] for a in range(nd))
        shape = tuple(len(r) for r in axes)
        steps = tuple((r[1][1] - r[0][1] if len(r) > 1 else 0) * pitch[a] for a, r in enumerate(axes))
        groups.append((index, offset, shape, steps))
        for t in itertools.product(*[[tt for tt, _ in r] for r in axes]):
            flat = 0
            for a in range(nd):
                flat = flat * kernel[a] + t[a]
            order.append(flat)
    return tuple(groups), tuple(order)


def _depthwise_rows(x, wp, dilations, pb, pe, out_sp, y, pad_value, bias=None, bias_key=None):
    """:func:`_depthwise` for a stride-1 2-D layer whose output rows are as wide as
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
    head, per, edges = _row_pitch(h, wd, tuple(pb), tuple(pe), kw, dw)
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
            buf = _scratch(cb * (per + rows_k * length), x.dtype)
            xb = buf[: cb * per].reshape(cb, per)
            gathered = buf[cb * per :].reshape(cb, rows_k, length)
            gathered[:, taps:] = 1  # the bias's row: never overwritten by the blocks
            cols = gathered[:, :taps].reshape(cb, kh, kw, length)
            _pad_margins(xb, head, head + h * wd, pad_value)
            view = _strided(buf, 0, (cb, kh, kw, length), (per, dh * wd, dw, 1))
            if len(edges) == 2:
                # both edge columns of every gathered row in one strided view
                (t0, c0_), (t1, c1_) = edges
                d = (t1 - t0) * length + (c1_ - c0_)
                fix = [_strided(buf, cb * per + t0 * length + c0_, (cb, kh, 2, oh),
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


@functools.lru_cache(maxsize=256)
def _row_pitch(h: int, wd: int, pb, pe, kw: int, dw: int) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """A 2-D map of ``h`` rows of ``wd`` values laid out on its own row pitch, padded
    above and below only (``pb[0]`` and ``pe[0]`` rows, plus ``pb[1]`` and ``pe[1]``
    values at the two ends): ``(head, per, edges)``, the values before the first input
    value, the values per channel, and the ``(tap column, output column)`` pairs whose
    tap (of ``kw`` columns dilated by ``dw``) falls left or right of the row and reads
    the neighbouring row instead of the padding. Kept per geometry (the arguments are
    ints and tuples)."""
    head = pb[1] + pb[0] * wd
    per = head + h * wd + pe[0] * wd + pe[1]
    edges = []
    for tx in range(kw):
        off = tx * dw - pb[1]
        cols_out = range(min(wd, -off)) if off < 0 else range(max(0, wd - off), wd)
        edges.extend((tx, col) for col in cols_out)
    return head, per, tuple(edges)


def _pad_margins(a: np.ndarray, start: int, stop: int, value) -> None:
    """Fill the last axis of ``a`` with ``value`` outside ``start:stop``."""
    if start:
        a[..., :start] = value
    if stop < a.shape[-1]:
        a[..., stop:] = value


def _weight_for(k, w, group, dtype):
    """The packed weight: the one prepacked in setup if ``w`` is that constant."""
    pre = k._packed
    if pre is not None and pre[0] is w and pre[1].gemm.dtype == dtype:
        return pre[1]
    return _ConvWeights(w, group, dtype)


def _is_constant_input(k, value, index: int) -> bool:
    """Whether ``value`` is kernel ``k``'s node's constant input ``index`` (the same
    array every run, so what is derived from it may be kept), not a value fed or
    computed at run time."""
    return value is not None and value is k.node.constants.get(index)


def _check_rank(x, w, what="input"):
    if x.ndim < 3:
        raise ValueError(f"{what} must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
    if w.ndim != x.ndim:
        raise ValueError(f"weight rank {w.ndim} does not match {what} rank {x.ndim}")


# -- Conv --------------------------------------------------------------------------


@op("Conv", since=1)
class Conv(Kernel):
    """N-d convolution with groups, strides, dilations and padding."""

    def setup(self):
        a = self.attrs
        self.group = int(a.get("group", 1))
        self.auto_pad = a.get("auto_pad", "NOTSET")
        self.pads = a.get("pads")
        self._packed = None
        self._geometries = {}
        w = self.node.constants.get(1)
        if w is not None and w.ndim >= 3:
            try:
                self._packed = (w, _ConvWeights(w, self.group, compute_dtype(w.dtype)))
            except ValueError:
                self._packed = None
            wp = None if self._packed is None else self._packed[1]
            strides, dil = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
            if (wp is not None and native.BLAS and w.ndim == 4 and wp.kernel == (3, 3) and wp.group == 1
                    and wp.gemm.dtype == np.float32 and list(strides) == [1, 1] and list(dil) == [1, 1]
                    and w.shape[0] * w.shape[1] >= _WINOGRAD_MIN_CHANNELS):
                wp.winograd()  # the transform once, at session creation, not in the first run

    def run(self, x, w, b=None):
        return (self.forward(x, w, b),)

    def _geometry(self, x_shape, w_shape):
        """``(kernel, strides, dilations, pads begin, pads end, output size)`` for these
        shapes, kept per shape pair: deriving it costs several microseconds a call, on
        every run of every layer."""
        key = (x_shape, w_shape)
        geometry = self._geometries.get(key)
        if geometry is None:
            kernel, strides, dil = spatial_attrs(self.attrs, len(x_shape) - 2, w_shape[2:])
            ks = self.attrs.get("kernel_shape")
            if ks is not None and tuple(ks) != tuple(w_shape[2:]):
                raise ValueError(f"kernel_shape {ks} does not match weight shape {w_shape}")
            pb, pe, out_sp = conv_pads(x_shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
            geometry = (kernel, strides, dil, tuple(pb), tuple(pe), tuple(out_sp))
            if len(self._geometries) >= 8:
                self._geometries.clear()  # shapes that keep changing: no unbounded growth
            self._geometries[key] = geometry
        return geometry

    def forward(self, x, w, b=None, residual=None, activation=None):
        """The convolution, plus ``residual`` and an in-place ``activation`` (FusedConv)."""
        _check_rank(x, w)
        kernel, strides, dil, pb, pe, out_sp = self._geometry(x.shape, w.shape)
        cdt = compute_dtype(x.dtype)
        wp = _weight_for(self, w, self.group, cdt)
        if residual is not None:
            residual = residual.astype(cdt, copy=False)
        constant_bias = _is_constant_input(self, b, 2)
        y = _conv_forward(x.astype(cdt, copy=False), wp, strides, dil, pb, pe, out_sp, b,
                          residual=residual, activation=activation, constant_bias=constant_bias)
        return y.astype(x.dtype, copy=False)


# -- ConvInteger / QLinearConv -----------------------------------------------------------


def _zero_point(zp, dtype):
    if zp is None:
        return None
    zp = np.asarray(zp)
    if zp.size == 1:
        return zp.reshape(()).astype(dtype)
    return zp.astype(dtype)


#: Largest im2col matrix (elements) of the batched channels-last path of the integer
#: convolutions; bigger inputs take the banded path.
_ROWS_MAX_ELEMS = 1 << 24

#: The strided im2col copy of one value, in multiply-adds of the GEMM that follows
#: (a 7x7 stem's [8192, 147] columns: 266 us to gather, 250 us for the product with
#: 16 channels, on AVX-512 BLAS kernels; about 8 on AVX2 ones), so that the split
#: threshold counts the copy that a split shares too.
_IM2COL_COST = 16


def _input_bound(x: np.ndarray, xzp, zp: int, product_bound: float) -> float:
    """``max |x - zp|`` for an integer convolution's input: the bound its 8-bit type
    alone gives where that already keeps every partial sum (at most ``product_bound``
    times it) below 2**24, which spares two passes over the data; else the data's."""
    by_type = centred_bound(x.dtype, xzp)
    if by_type is not None and product_bound * by_type < 2.0**24:
        return by_type
    return max(abs(int(x.max()) - zp), abs(int(x.min()) - zp)) if x.size else 0


def _exact_product(cols: np.ndarray, w_rows: np.ndarray, kchunk: int, dst: np.ndarray) -> None:
    """``dst = cols @ w_rows`` for integer-valued float32 operands, exact: in chunks of
    ``kchunk`` rows of K whose float32 products are exact, summed in ``dst``'s type
    (float64 when there are several chunks, exact for any int32 accumulator)."""
    k = w_rows.shape[0]
    if kchunk >= k:
        np.matmul(cols, w_rows, out=dst)
        return
    acc = None
    for k0 in range(0, k, kchunk):
        piece = np.matmul(cols[:, k0 : k0 + kchunk], w_rows[k0 : k0 + kchunk])
        acc = piece.astype(np.float64) if acc is None else acc + piece
    dst[...] = acc


class _IntConvBase(Kernel):
    """Shared by ConvInteger and QLinearConv: exact int32 accumulation via BLAS."""

    #: whether the kernel runs the compiled 8-bit convolution (and packs its weight for it)
    bytes_products = False

    x_index = 0
    w_index = 1
    wzp_index = 3

    def setup(self):
        a = self.attrs
        self.group = int(a.get("group", 1))
        self.auto_pad = a.get("auto_pad", "NOTSET")
        self.pads = a.get("pads")
        self._packed = None
        self._rows_w = None
        self._plans = {}
        self._bias_bound = None
        self._bias_rows = None
        c = self.node.constants
        w = c.get(self.w_index)
        wzp_idx = self.wzp_index
        has_wzp = wzp_idx < len(self.node.inputs) and self.node.inputs[wzp_idx]
        if w is not None and (not has_wzp or wzp_idx in c):
            try:
                self._packed = (w, self._pack(w, c.get(wzp_idx) if has_wzp else None))
            except ValueError:
                self._packed = None
        # the weight as bytes for the compiled 8-bit convolution, where this CPU has it
        self._requant = None  # (x, w and y scales, bias, their ratio and float bias) of the last run
        self._w8 = None if self._packed is None or not self.bytes_products else \
            native.pack_conv_int8(w, c.get(wzp_idx) if has_wzp else None)
        if self._packed is not None and self.group == 1 and w.ndim == 4:
            # [kh, kw, C, M]: the row order of the channels-last im2col below
            self._rows_w = self._packed[1][0].rows()

    def _rows_plan(self, shape, w, threads):
        """The geometry of :meth:`_accumulate_rows` for an input shape and a thread
        count, or None where that path does not apply: ``(kernel, strides, pads begin,
        pads end, output size, blocks, threads, outputs per im2col row, their weight)``.
        Kept per shape, since a run of small images otherwise spends about as long
        deriving it as multiplying."""
        key = (shape, threads)
        plan = self._plans.get(key, False)
        if plan is not False:
            return plan
        plan = None
        kernel, strides, dil = spatial_attrs(self.attrs, 2, w.shape[2:])
        n, c, h, wd = shape
        if all(d == 1 for d in dil) and n * c * h * wd:
            pb, pe, out_sp = conv_pads(shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
            (kh, kw), (sh, sw), (oh, ow) = kernel, strides, out_sp
            hp, wp = h + pb[0] + pe[0], wd + pb[1] + pe[1]
            k, m = self._rows_w.shape
            if (min(pb) >= 0 and min(pe) >= 0 and n * oh * ow * k <= _ROWS_MAX_ELEMS
                    and (oh - 1) * sh + kh <= hp and (ow - 1) * sw + kw <= wp):
                # the product's multiply-adds and the im2col copy, in multiply-adds
                work = n * oh * ow * k * (m + _IM2COL_COST)
                used = 1 if work < parallel.PARALLEL_MIN_FLOPS else threads
                pairs = 1 if kh == kw == 1 else pair_count(m, ow)
                w_rows = self._packed[1][0].paired(sw, pairs)
                jobs = _row_blocks(n, oh, ow // pairs, w_rows.shape[0], used)
                plan = (kernel, strides, pb, pe, out_sp, jobs, used, pairs, w_rows)
        if len(self._plans) >= 8:
            self._plans.clear()  # shapes that keep changing: no unbounded growth
        self._plans[key] = plan
        return plan

    def _accumulate_rows(self, x, xzp, w, bias=None):
        """The accumulator as exact float32 rows ``[N * OH * OW, M]`` (channels last),
        from the im2col of a channels-last copy of the whole batch, gathered and
        multiplied block by block (:func:`_row_blocks`), or None where that path does
        not apply (then :meth:`_accumulate` runs). Returns ``(rows, (N, OH, OW),
        biased)``: an integer ``bias`` ``[M]`` is carried by the product as one more
        row of the weight times a column of ones (``biased`` true) when every partial
        sum, the bias's included, stays below 2**24 and so exact in float32; its
        pass over the rows is spared.

        Many small images make the banded NCHW path a long Python loop of small copies;
        here each im2col row is ``KH`` contiguous runs of ``KW * C`` values of the
        channels-last input, gathered by a single strided copy. An unpadded 1x1
        kernel needs no im2col: its rows are the (subsampled) input itself.
        """
        if self._rows_w is None or self._packed[0] is not w or x.ndim != 4 or x.shape[1] != w.shape[1]:
            return None
        zp = 0
        if xzp is not None:
            xzp = np.asarray(xzp)
            if xzp.size != 1:
                return None
            zp = int(xzp.reshape(()))
        plan = self._rows_plan(x.shape, w, parallel.thread_count())
        if plan is None:
            return None
        (kh, kw), (sh, sw), pb, pe, (oh, ow), jobs, threads, pairs, paired = plan
        w_rows = self._rows_w
        k = w_rows.shape[0]
        l1, wmax = self._packed[1][2], self._packed[1][4]
        xmax = _input_bound(x, xzp, zp, l1)
        # K is cut into chunks whose float32 products are exact. One chunk gives the
        # accumulator in float32 (every partial sum below 2**24); several are summed
        # into float64 rows, which hold any int32 accumulator exactly, so that
        # ConvInteger returns it and QLinearConv adds its bias before the one rounding
        # to float32, as onnxruntime does (float32 rows would round it first)
        kchunk = paired.shape[0] if l1 * xmax < 2.0**24 else int((2**24 - 1) // (wmax * xmax))
        if kchunk < min(k, 32):
            return None
        if bias is not None and not (kchunk >= k and l1 * xmax + self._bias_max(bias) < 2.0**24):
            bias = None
        n, c, h, wd = x.shape
        rows_per_image = oh * ow
        out = np.empty((n * rows_per_image, w_rows.shape[1]), dtype=np.float32 if kchunk >= k else np.float64)
        if kh == kw == 1 and not any(pb) and not any(pe):
            ce = c + (bias is not None)
            cols = np.empty((n, oh, ow, ce), dtype=np.float32)
            fill_channels_last(cols[..., :c], x[:, :, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw], zp)
            if bias is not None:
                cols[..., c] = 1
                parallel.matmul(cols.reshape(-1, ce), self._with_bias_row(w_rows, bias, 1), out=out)
            elif kchunk >= k:
                parallel.matmul(cols.reshape(-1, c), w_rows, out=out)
            else:
                _exact_product(cols.reshape(-1, c), w_rows, kchunk, out)
            return out, (n, oh, ow), bias is not None
        xp = np.zeros((n, h + pb[0] + pe[0], wd + pb[1] + pe[1], c), dtype=np.float32)
        fill_channels_last(xp[:, pb[0] : pb[0] + h, pb[1] : pb[1] + wd], x, zp)
        # blocks small enough to be multiplied while in cache, claimed one at a time
        # by the threads; with fewer images than threads, bands of rows. The widened
        # weight has zeros only where the plain one has none: the same column sums,
        # hence the same exact chunks
        if bias is not None:
            paired = self._with_bias_row(paired, bias, pairs)
            kchunk = paired.shape[0]
        _rows_product(xp, (kh, kw), (sh, sw), (oh, ow), paired, pairs, jobs, threads, out,
                      lambda a, b, dst: _exact_product(a, b, kchunk, dst))
        return out, (n, oh, ow), bias is not None

    def _constant_bias(self, b) -> bool:
        """Whether ``b`` is the node's constant bias (QLinearConv's input 8): what is
        derived from it may be kept across runs. A bias fed at run time may hold new
        values in the same array, so nothing derived from it is kept."""
        return _is_constant_input(self, b, 8)

    def _bias_max(self, b) -> int:
        """``max |b|`` (0 if empty), kept for the node's constant bias."""
        cached = self._bias_bound
        if cached is not None and cached[0] is b:
            return cached[1]
        bound = int(np.abs(b.astype(np.int64)).max()) if b.size else 0
        if self._constant_bias(b):
            self._bias_bound = (b, bound)
        return bound

    def _with_bias_row(self, w_rows, bias, pairs):
        """``w_rows`` ``[K, pairs * M]`` with the bias (repeated for each of the
        ``pairs`` outputs) as one more row, kept for the last weight and the node's
        constant bias."""
        cached = self._bias_rows
        if cached is not None and cached[0] is w_rows and cached[1] is bias:
            return cached[2]
        row = np.tile(bias.astype(np.float32), pairs).reshape(1, -1)
        weight = np.concatenate([w_rows, row])
        if self._constant_bias(bias):
            self._bias_rows = (w_rows, bias, weight)
        return weight

    def _pack(self, w, wzp):
        wf = w.astype(np.float64)
        if wzp is not None:
            wzp = np.asarray(wzp)
            if wzp.size == 1:
                wf -= float(wzp.reshape(()))
            elif wzp.shape == (w.shape[0],):
                wf -= wzp.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
            else:
                raise ValueError(f"weight zero point shape {wzp.shape} must be scalar or ({w.shape[0]},)")
        # float32 copies too: used when the input's range keeps every sum exact.
        wp64 = _ConvWeights(wf, self.group, np.float64)
        wp32 = _ConvWeights(wf, self.group, np.float32)
        wmax = float(np.abs(wf).max()) if wf.size else 0.0
        # the largest sum of one output channel's |weights|: times max |x - zp| it
        # bounds every partial sum (several times below K * max |w| for real weights)
        l1 = column_l1(wf.reshape(w.shape[0], math.prod(w.shape[1:])).T)
        return wp32, wp64, l1, wp32.gemm.reshape(w.shape), wmax

    def _accumulate(self, x, xzp, w, wzp):
        """The int32 accumulator of the convolution, as an exact float array."""
        _check_rank(x, w)
        nd = x.ndim - 2
        kernel, strides, dil = spatial_attrs(self.attrs, nd, w.shape[2:])
        if self._packed is not None and self._packed[0] is w:
            wp32, wp64, bound, w32, wmax = self._packed[1]
        else:
            wp32, wp64, bound, w32, wmax = self._pack(w, wzp)
        zp = 0
        if xzp is not None:
            xzp = np.asarray(xzp)
            if xzp.size != 1:
                raise ValueError(f"input zero point must be a scalar, got shape {xzp.shape}")
            zp = int(xzp.reshape(()))
        # Every partial sum is bounded by max|x - zp| times an output channel's sum of
        # |w - w_zp| (``bound``); float32 represents all integers below 2**24 exactly,
        # whatever the summation order.
        xmax = _input_bound(x, xzp, zp, bound)
        pb, pe, out_sp = conv_pads(x.shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
        taps = math.prod(kernel)
        chunk = int((2**24 - 1) // (taps * wmax * xmax)) if xmax and wmax else x.shape[1]
        if bound * xmax < 2.0**24 or (self.group == 1 and chunk * taps >= 32):
            xf = x.astype(np.float32)
            if zp:
                xf -= np.float32(zp)
            if bound * xmax < 2.0**24:
                return _conv_forward(xf, wp32, strides, dil, pb, pe, out_sp)
            # Too long a K for one exact float32 GEMM: sum exact float32 convolutions
            # over channel blocks, which is about twice as fast as one float64 GEMM.
            acc = None
            for c0 in range(0, x.shape[1], chunk):
                wpc = _ConvWeights(w32[:, c0 : c0 + chunk], 1, np.float32)
                part = _conv_forward(xf[:, c0 : c0 + chunk], wpc, strides, dil, pb, pe, out_sp)
                acc = part.astype(np.float64) if acc is None else acc + part
            return acc
        xf = x.astype(np.float64)
        if zp:
            xf -= float(zp)
        return _conv_forward(xf, wp64, strides, dil, pb, pe, out_sp)


def _to_int32(acc: np.ndarray) -> np.ndarray:
    """An exact integer-valued float accumulator as int32, wrapping past its range as
    a 32-bit accumulator does (a float64 one through int64; float32 ones are below
    2**24)."""
    return (acc.astype(np.int64) if acc.dtype == np.float64 else acc).astype(np.int32)


@op("ConvInteger", since=10)
class ConvInteger(_IntConvBase):
    """Integer convolution with zero points, accumulated exactly into int32."""

    x_index, w_index, wzp_index = 0, 1, 3

    def run(self, x, w, x_zero_point=None, w_zero_point=None):
        rows = self._accumulate_rows(x, x_zero_point, w)
        if rows is not None:
            acc, (n, oh, ow), _ = rows
            return (np.ascontiguousarray(_to_int32(acc).reshape(n, oh, ow, acc.shape[-1]).transpose(0, 3, 1, 2)),)
        return (_to_int32(self._accumulate(x, x_zero_point, w, w_zero_point)),)


@op("QLinearConv", since=10)
class QLinearConv(_IntConvBase):
    """Quantized convolution: int32 accumulation, then requantization with
    round-half-to-even and saturation; per-tensor or per-output-channel weight scales."""

    x_index, w_index, wzp_index = 0, 3, 5
    bytes_products = True

    def run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point=None, b=None):
        m = w.shape[0]
        # a bias below 2**24 joins the exact float32 accumulator with one rounding, as
        # it would joining the int32 one
        bmax = self._bias_max(b) if b is not None and b.shape == (m,) else None
        if b is None or bmax is not None:
            y = self._native(x, x_scale, x_zero_point, w, w_scale, y_scale, y_zero_point, b, bmax or 0)
            if y is not None:
                return (y,)
        small_bias = b is None or (bmax is not None and bmax < 2**24)
        rows = None
        if small_bias:
            rows = self._accumulate_rows(x, x_zero_point, w, None if bmax is None else b)
        if rows is not None:
            return (self._requantize_rows(rows, x, x_scale, w_scale, y_scale, y_zero_point, b),)
        acc = self._accumulate(x, x_zero_point, w, w_zero_point)
        nd = x.ndim - 2
        if b is not None:
            if b.shape != (m,):
                raise ValueError(f"bias has shape {b.shape}, expected ({m},)")
            # the bias joins the int32 accumulator (wrapping as it does) before the
            # one float rounding
            acc = (acc.astype(np.int64) + b.astype(np.int64).reshape((m,) + (1,) * nd)).astype(np.int32)
        ws = np.asarray(w_scale, dtype=np.float32)
        if ws.size != 1:
            if ws.shape != (m,):
                raise ValueError(f"w_scale shape {ws.shape} must be scalar or ({m},)")
            ws = ws.reshape((m,) + (1,) * nd)
        else:
            ws = ws.reshape(())
        xs = np.asarray(x_scale, dtype=np.float32).reshape(())
        ys = np.asarray(y_scale, dtype=np.float32).reshape(())
        # requantized in float32 with the scale ratio formed in float32, as onnxruntime does
        mult = xs * ws / ys
        v = acc.astype(np.float32, copy=False)
        v *= mult
        return (_requantize_output(v, x, y_zero_point),)

    def _native(self, x, x_scale, x_zero_point, w, w_scale, y_scale, y_zero_point, b, bmax):
        """The whole QLinearConv by the compiled kernel, or None where it does not take
        the node: the input centred in the gather, the product exact in float32 (every
        partial sum, the bias's included, below 2**24), each tile requantized into the
        8-bit output while in cache. A 2-D (or 1-D) map, a constant weight, scalar zero
        points, 8-bit types, pads of at least 0. The QDQ ResNet-style model at batch 8:
        its QLinearConv layers 2.7 -> 0.9 ms a run (two threads)."""
        if not native.BLAS or self._packed is None or self._packed[0] is not w or x.ndim not in (3, 4) \
                or x.dtype not in (np.int8, np.uint8) or x.shape[1] != w.shape[1] * self.group or 0 in x.shape:
            return None
        out_dt = np.dtype(y_zero_point.dtype) if y_zero_point is not None else x.dtype
        if out_dt not in (np.int8, np.uint8):
            return None
        xzp = None if x_zero_point is None else np.asarray(x_zero_point)
        yzp = None if y_zero_point is None else np.asarray(y_zero_point)
        if (xzp is not None and xzp.size != 1) or (yzp is not None and yzp.size != 1):
            return None
        zp = 0 if xzp is None else int(xzp.reshape(()))
        wp32, _, l1, _, _ = self._packed[1]
        if l1 * _input_bound(x, xzp, zp, l1) + bmax >= 2.0**24:
            return None
        kernel, strides, dil = spatial_attrs(self.attrs, x.ndim - 2, w.shape[2:])
        pb, pe, out_sp = conv_pads(x.shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
        if min(pb) < 0 or min(pe) < 0 or 0 in out_sp:
            return None
        m = w.shape[0]
        kept = self._requant
        if kept is not None and kept[0] is x_scale and kept[1] is w_scale and kept[2] is y_scale and kept[3] is b:
            mult, bias = kept[4], kept[5]  # the constants of every run, converted once
        else:
            ws = np.asarray(w_scale, dtype=np.float32)
            if ws.size != 1 and ws.shape != (m,):
                return None  # the numpy path names the shape
            xs = np.asarray(x_scale, dtype=np.float32).reshape(())
            ys = np.asarray(y_scale, dtype=np.float32).reshape(())
            # the scale ratio formed in float32, as onnxruntime does
            mult = np.ascontiguousarray((xs * ws.reshape(-1) / ys).astype(np.float32))
            bias = None if b is None else b.astype(np.float32)
            c = self.node.constants
            if x_scale is c.get(1) and w_scale is c.get(4) and y_scale is c.get(6) and (b is None or b is c.get(8)):
                # only the session's own constants: a fed array may change between runs
                self._requant = (x_scale, w_scale, y_scale, b, mult, bias)
        y = np.empty((x.shape[0], m, *out_sp), out_dt)
        if x.ndim == 3:
            x4 = np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], 1, x.shape[2])
            geometry = (1, kernel[0], 1, strides[0], 1, dil[0], 0, pb[0], 1, out_sp[0])
        else:
            x4 = np.ascontiguousarray(x)
            geometry = (*kernel, *strides, *dil, pb[0], pb[1], *out_sp)
        n, c, h, wd = x4.shape
        y_zp = 0 if yzp is None else int(yzp.reshape(()))
        try:
            if self._w8 is not None:
                # 8-bit products (AVX-512 VNNI): the same output bit for bit, the
                # products four times as dense as float32's
                native.K.qconv8(x4, self._w8[0], self._w8[1], bias, mult, y, (n, c, h, wd, m, self.group, *geometry),
                                zp, y_zp, parallel.thread_count())
            elif _direct_pays(np.empty(0, np.float32), wp32, tuple(geometry[:2]), tuple(geometry[-2:])):
                # few output channels or a short reduction: the direct kernel (the
                # QDQ ResNet-style model's 7x7 stem of 16 channels, batch 8: 935 ->
                # 400 us on two threads)
                native.K.qdirect2d(x4, wp32.gemm, bias, mult, y, (n, c, h, wd, m, *geometry), zp, y_zp,
                                   parallel.thread_count())
            else:
                native.K.qconv2d(x4, wp32.gemm, bias, mult, y, (n, c, h, wd, m, self.group, *geometry), zp, y_zp,
                                 parallel.thread_count())
        except MemoryError:
            return None  # a huge kernel: the numpy path gathers in bounded bands
        return y

    @staticmethod
    def _requantize_rows(rows, x, x_scale, w_scale, y_scale, y_zero_point, b):
        """:meth:`run`'s requantization on channels-last rows, then back to NCHW."""
        v, (n, oh, ow), biased = rows
        m = v.shape[1]
        if v.dtype == np.float64:
            # rows summed from several exact chunks: the bias joins exactly, the sum
            # wraps to int32 as onnxruntime's accumulator does, then one rounding
            if b is not None:
                columns_op(np.add, v, b.astype(np.float64))
            v = _to_int32(v).astype(np.float32)
        elif b is not None and not biased:  # else the product carried it
            columns_op(np.add, v, b.astype(np.float32))
        ws = np.asarray(w_scale, dtype=np.float32)
        if ws.size != 1 and ws.shape != (m,):
            raise ValueError(f"w_scale shape {ws.shape} must be scalar or ({m},)")
        ws = ws.reshape(-1) if ws.size != 1 else ws.reshape(())
        xs = np.asarray(x_scale, dtype=np.float32).reshape(())
        ys = np.asarray(y_scale, dtype=np.float32).reshape(())
        mult = xs * ws / ys
        if mult.ndim:
            columns_op(np.multiply, v, mult)
        else:
            v *= mult
        q = _requantize_output(v, x, y_zero_point)
        # an NCHW view of the channels-last result: the next convolution reads it
        # channels last without a transposing copy, elementwise ops take any layout,
        # and the session hands graph outputs back C-ordered
        return q.reshape(n, oh, ow, m).transpose(0, 3, 1, 2)


def _requantize_output(v, x, y_zero_point):
    """QLinearConv's float32 ``v`` (already scaled) rounded in place, shifted by the
    output zero point and saturated to its type (``x``'s without one)."""
    out_dt = y_zero_point.dtype if y_zero_point is not None else x.dtype
    zp = None if y_zero_point is None else np.asarray(y_zero_point).reshape(()).item()
    return requantize(v, zp, out_dt, inplace=True)


# -- ConvTranspose -----------------------------------------------------------------------


class _DeconvWeights:
    """ConvTranspose weight ``[C, M/g, *k]`` as ``[g, M/g * prod(k), C/g]`` for the GEMM."""

    __slots__ = ("shape", "group", "kernel", "gemm")

    def __init__(self, w, group, dtype):
        if w.ndim < 3:
            raise ValueError(f"weight must have rank >= 3, got shape {w.shape}")
        c = w.shape[0]
        if group < 1 or c % group:
            raise ValueError(f"input channels {c} are not divisible by group {group}")
        self.shape = w.shape
        self.group = group
        self.kernel = tuple(w.shape[2:])
        wg = np.asarray(w, dtype=dtype).reshape(group, c // group, math.prod(w.shape[1:]))
        self.gemm = np.ascontiguousarray(wg.transpose(0, 2, 1))


@op("ConvTranspose", since=1)
class ConvTranspose(Kernel):
    """Transposed convolution: GEMM followed by a col2im scatter-add."""

    def setup(self):
        a = self.attrs
        self.group = int(a.get("group", 1))
        self.auto_pad = a.get("auto_pad", "NOTSET") or "NOTSET"
        self._packed = None
        w = self.node.constants.get(1)
        if w is not None and w.ndim >= 3:
            try:
                self._packed = (w, _DeconvWeights(w, self.group, compute_dtype(w.dtype)))
            except ValueError:
                self._packed = None

    def run(self, x, w, b=None):
        _check_rank(x, w)
        nd = x.ndim - 2
        cdt = compute_dtype(x.dtype)
        pre = self._packed
        if pre is not None and pre[0] is w and pre[1].gemm.dtype == cdt:
            wp = pre[1]
        else:
            wp = _DeconvWeights(w, self.group, cdt)
        kernel, strides, dil = spatial_attrs(self.attrs, nd, wp.kernel)
        n, c = x.shape[:2]
        g = self.group
        if c != wp.shape[0]:
            raise ValueError(f"input has {c} channels but weight {wp.shape} expects {wp.shape[0]}")
        m = wp.shape[1] * g
        in_sp = x.shape[2:]
        L = math.prod(in_sp)
        pb, out_sp = conv_transpose_geometry(in_sp, kernel, strides, dil, self.attrs, self.auto_pad,
                                             self.node.describe())
        # Canvas covering both the scattered taps and the requested output window.
        reach = [strides[i] * (in_sp[i] - 1) + (kernel[i] - 1) * dil[i] + 1 for i in range(nd)]
        lo = [min(0, pb[i]) for i in range(nd)]
        hi = [max(reach[i], pb[i] + out_sp[i]) for i in range(nd)]
        xc = x.astype(cdt, copy=False)
        y = np.empty((n, m, *out_sp), dtype=cdt)
        crop = (slice(None),) + tuple(slice(pb[i] - lo[i], pb[i] - lo[i] + out_sp[i]) for i in range(nd))
        offset = [-l for l in lo]
        for i in range(n):
            cols = np.matmul(wp.gemm, xc[i].reshape(g, c // g, L))  # [g, M/g*K, L]
            cols = cols.reshape(m, *kernel, *in_sp)
            canvas = np.zeros((m, *[hi[j] - lo[j] for j in range(nd)]), dtype=cdt)
            _col2im_add(canvas, cols, kernel, strides, dil, in_sp, offset)
            y[i] = canvas[crop]
        if b is not None:
            if b.shape != (m,):
                raise ValueError(f"bias has shape {b.shape}, expected ({m},)")
            y += b.astype(cdt, copy=False).reshape((m,) + (1,) * nd)
        return (y.astype(x.dtype, copy=False),)


# -- Col2Im ------------------------------------------------------------------------------


@op("Col2Im", since=18)
def col2im(k, x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """Rearrange column blocks ``[N, C*prod(block), L]`` into images ``[N, C, *image]``."""
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nd = len(image)
    if len(block) != nd:
        raise ValueError(f"image_shape {image} and block_shape {block} differ in length")
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    pads = list(pads or [0] * (2 * nd))
    if x.ndim != 3:
        raise ValueError(f"input must be [N, C*prod(block_shape), L], got shape {x.shape}")
    kprod = math.prod(block)
    n, ck, L = x.shape
    if kprod == 0 or ck % kprod:
        raise ValueError(f"input dim 1 ({ck}) is not a multiple of prod(block_shape) = {kprod}")
    c = ck // kprod
    grid = []
    for i in range(nd):
        ek = (block[i] - 1) * dilations[i] + 1
        grid.append((image[i] + pads[i] + pads[nd + i] - ek) // strides[i] + 1)
    if math.prod(grid) != L:
        raise ValueError(f"input has {L} blocks but the geometry gives {grid} = {math.prod(grid)}")
    padded = [image[i] + pads[i] + pads[nd + i] for i in range(nd)]
    canvas = np.zeros((n * c, *padded), dtype=x.dtype)
    _col2im_add(canvas, x.reshape(n * c, *block, *grid), block, strides, dilations, grid)
    crop = (slice(None),) + tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))
    return canvas[crop].reshape(n, c, *image)


# -- DeformConv --------------------------------------------------------------------------


@op("DeformConv", since=19)
class DeformConv(Kernel):
    """Deformable convolution: bilinear sampling at offset taps (times an optional mask),
    then one GEMM per group."""

    def setup(self):
        a = self.attrs
        self.group = int(a.get("group", 1))
        self.offset_group = int(a.get("offset_group", 1))

    def run(self, x, w, offset, b=None, mask=None):
        _check_rank(x, w)
        nd = x.ndim - 2
        kernel, strides, dil = spatial_attrs(self.attrs, nd, w.shape[2:])
        pads = self.attrs.get("pads") or [0] * (2 * nd)
        cdt = compute_dtype(x.dtype)
        n, c = x.shape[:2]
        in_sp = x.shape[2:]
        og = self.offset_group
        K = math.prod(kernel)
        if c % og:
            raise ValueError(f"input channels {c} are not divisible by offset_group {og}")
        out_sp = tuple(offset.shape[2:])
        if offset.shape[:2] != (n, og * K * nd):
            raise ValueError(f"offset shape {offset.shape} must be ({n}, {og * K * nd}, ...)")
        for i in range(nd):
            ek = (kernel[i] - 1) * dil[i] + 1
            if out_sp[i] != (in_sp[i] + pads[i] + pads[nd + i] - ek) // strides[i] + 1:
                raise ValueError(f"offset spatial shape {out_sp} is inconsistent with the conv geometry")
        L = math.prod(out_sp)
        wp = _ConvWeights(w, self.group, cdt)
        if c != w.shape[1] * self.group:
            raise ValueError(f"input has {c} channels but weight {w.shape} with group {self.group} expects")
        off = offset.astype(cdt, copy=False).reshape(n, og, K, nd, L)
        msk = None
        if mask is not None:
            if mask.shape != (n, og * K, *out_sp):
                raise ValueError(f"mask shape {mask.shape} must be ({n}, {og * K}, {', '.join(map(str, out_sp))})")
            msk = mask.astype(cdt, copy=False).reshape(n, og, K, L)
        # Undeformed sampling positions, [nd, K, L].
        taps = np.stack(np.meshgrid(*[np.arange(k) for k in kernel], indexing="ij"), 0).reshape(nd, K, 1)
        outs = np.stack(np.meshgrid(*[np.arange(o) for o in out_sp], indexing="ij"), 0).reshape(nd, 1, L)
        base = (
            outs * np.array(strides).reshape(nd, 1, 1)
            - np.array(pads[:nd]).reshape(nd, 1, 1)
            + taps * np.array(dil).reshape(nd, 1, 1)
        ).astype(cdt)
        cpg = c // og
        sp_strides = [math.prod(in_sp[i + 1 :]) for i in range(nd)]
        y = np.empty((n, wp.shape[0], L), dtype=cdt)
        xc = x.astype(cdt, copy=False).reshape(n, c, math.prod(in_sp))
        for bi in range(n):
            cols = np.zeros((c, K, L), dtype=cdt)
            for gi in range(og):
                pos = base + off[bi, gi].transpose(1, 0, 2)  # [nd, K, L]
                fl = np.floor(pos)
                frac = pos - fl
                fl = fl.astype(np.int64)
                xg = xc[bi, gi * cpg : (gi + 1) * cpg]
                acc = cols[gi * cpg : (gi + 1) * cpg]
                for corner in itertools.product((0, 1), repeat=nd):
                    wgt = np.ones((K, L), dtype=cdt)
                    idx = np.zeros((K, L), dtype=np.int64)
                    ok = np.ones((K, L), dtype=bool)
                    for a_, cb in enumerate(corner):
                        ia = fl[a_] + cb
                        wgt *= frac[a_] if cb else (1 - frac[a_])
                        ok &= (ia >= 0) & (ia < in_sp[a_])
                        idx += ia * sp_strides[a_]
                    wgt = np.where(ok, wgt, 0)
                    idx = np.where(ok, idx, 0)
                    acc += xg[:, idx] * wgt
                if msk is not None:
                    acc *= msk[bi, gi]
            np.matmul(wp.gemm, cols.reshape(self.group, -1, L), out=y[bi].reshape(self.group, -1, L))
        y = y.reshape(n, wp.shape[0], *out_sp)
        if b is not None:
            y += b.astype(cdt, copy=False).reshape((-1,) + (1,) * nd)
        return (y.astype(x.dtype, copy=False),)
