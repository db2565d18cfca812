"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, Col2Im.

Every convolution here is lowered to matrix products that BLAS runs:

* a 1x1, stride-1, unpadded Conv is one GEMM on the input viewed as ``[C, H*W]``;
* a general Conv copies the strided taps of the (padded) input into one contiguous
  column buffer ``[C/g * prod(kernel), prod(out)]`` (im2col) and runs one GEMM per
  group (a stacked matmul over groups);
* a depthwise Conv accumulates ``prod(kernel)`` shifted, scaled views of the input
  instead, which moves far less memory than im2col would;
* ConvTranspose and Col2Im run the GEMM first and scatter-add the columns back
  (col2im), one strided slice per kernel tap.

Integer convolutions run the same GEMM on floating-point copies of the operands:
float32 when every partial sum provably fits its 24-bit mantissa (checked per call
from the input's range), float64 otherwise, so the int32 accumulator is always exact.

The spatial helpers (:func:`conv_pads`, :func:`pad_spatial`, :func:`tap_slices`)
are shared with the pooling kernels.
"""

from __future__ import annotations

import itertools

import numpy as np

from onnxrt.kernel import Kernel

from ..registry import op

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

    __slots__ = ("shape", "group", "kernel", "gemm", "depthwise", "absmax")

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
        wc = np.asarray(w, dtype=dtype)
        if group > 1 and w.shape[1] == 1 and m == group:
            self.depthwise = np.ascontiguousarray(wc.reshape(m, -1))
        self.gemm = np.ascontiguousarray(wc.reshape(group, m // group, -1))


def _conv_forward(x, wp: _ConvWeights, strides, dilations, pb, pe, out_sp, bias=None, pad_value=0):
    """The convolution of ``x`` ``[N, C, *sp]`` (already in the compute dtype)."""
    n, c = x.shape[:2]
    g = wp.group
    m = wp.shape[0]
    if c != wp.shape[1] * g:
        raise ValueError(
            f"input has {c} channels but weight {wp.shape} with group {g} expects {wp.shape[1] * g}"
        )
    kernel = wp.kernel
    nd = len(kernel)
    L = int(np.prod(out_sp, dtype=np.int64))
    y = np.empty((n, m, *out_sp), dtype=x.dtype)
    unit = all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pb) and not any(pe)

    if wp.depthwise is not None and not unit:
        _depthwise(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value)
    else:
        yv = y.reshape(n, g, m // g, L)
        for i in range(n):
            if unit:
                cols = x[i].reshape(g, c // g, L)
            else:
                xp = pad_spatial(x[i], pb, pe, pad_value)
                cols = _im2col(xp, kernel, strides, dilations, out_sp).reshape(g, -1, L)
            np.matmul(wp.gemm, cols, out=yv[i])
    if bias is not None:
        if bias.shape != (m,):
            raise ValueError(f"bias has shape {bias.shape}, expected ({m},)")
        y += bias.astype(y.dtype, copy=False).reshape((m,) + (1,) * nd)
    return y


def _depthwise(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value):
    """Depthwise conv as a sum over taps of per-channel scaled shifted input views.

    With unit strides every tap reads one contiguous run of the flattened padded
    image: the output is computed on the padded row pitch (one extra padded row
    keeps the last tap in bounds) and cropped once at the end.
    """
    n, c = x.shape[:2]
    kernel = wp.kernel
    nd = len(kernel)
    w = wp.depthwise
    flat = all(s == 1 for s in strides)
    if flat:
        pe = list(pe)
        pe[0] += 1
    xp = pad_spatial(x, pb, pe, pad_value)
    psp = xp.shape[2:]
    if flat:
        pitch = [int(np.prod(psp[a + 1 :], dtype=np.int64)) for a in range(nd)]
        span = out_sp[0] * pitch[0]
        offs = [
            sum(t[a] * dilations[a] * pitch[a] for a in range(nd))
            for t in itertools.product(*[range(k) for k in kernel])
        ]
        xf = xp.reshape(n, c, -1)
        work = np.empty((c, span), dtype=x.dtype)
        crop = (slice(None), slice(None)) + tuple(slice(0, o) for o in out_sp[1:])
        L = span
    else:
        taps = [sl for _, sl in tap_slices(kernel, strides, dilations, out_sp)]
        L = int(np.prod(out_sp, dtype=np.int64))
    # Channel blocks keep the accumulator and the temporary in cache across taps.
    cb = max(1, min(c, (48 * 1024) // max(1, L)))
    tmp_full = np.empty((cb, span) if flat else (cb, *out_sp), dtype=x.dtype)
    bshape = (1,) if flat else (1,) * nd
    for i in range(n):
        for c0 in range(0, c, cb):
            c1 = min(c, c0 + cb)
            acc = work[c0:c1] if flat else y[i, c0:c1]
            tmp = tmp_full[: c1 - c0]
            wb = w[c0:c1]
            for t in range(len(wb[0])):
                if flat:
                    src = xf[i, c0:c1, offs[t] : offs[t] + span]
                else:
                    src = xp[(i, slice(c0, c1)) + taps[t]]
                wt = wb[:, t].reshape((c1 - c0,) + bshape)
                if t == 0:
                    np.multiply(src, wt, out=acc)
                else:
                    np.multiply(src, wt, out=tmp)
                    acc += tmp
        if flat:
            y[i] = work.reshape(c, out_sp[0], *psp[1:])[crop]


def _weight_for(k, w, group, dtype):
    """The packed weight: the one prepacked in setup if ``w`` is that constant."""
    pre = k._packed
    if pre is not None and pre[0] is w and pre[1].gemm.dtype == dtype:
        return pre[1]
    return _ConvWeights(w, group, dtype)


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
        w = self.node.constants.get(1)
        if w is not None and w.ndim >= 3:
            try:
                self._packed = (w, _ConvWeights(w, self.group, compute_dtype(w.dtype)))
            except ValueError:
                self._packed = None

    def run(self, x, w, b=None):
        _check_rank(x, w)
        nd = x.ndim - 2
        kernel, strides, dil = spatial_attrs(self.attrs, nd, w.shape[2:])
        ks = self.attrs.get("kernel_shape")
        if ks is not None and tuple(ks) != tuple(w.shape[2:]):
            raise ValueError(f"kernel_shape {ks} does not match weight shape {w.shape}")
        cdt = compute_dtype(x.dtype)
        wp = _weight_for(self, w, self.group, cdt)
        pb, pe, out_sp = conv_pads(x.shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
        y = _conv_forward(x.astype(cdt, copy=False), wp, strides, dil, pb, pe, out_sp, b)
        return (y.astype(x.dtype, copy=False),)


# -- ConvInteger / QLinearConv -----------------------------------------------------------


def _zero_point(zp, dtype):
    if zp is None:
        return None
    zp = np.asarray(zp)
    if zp.size == 1:
        return zp.reshape(()).astype(dtype)
    return zp.astype(dtype)


class _IntConvBase(Kernel):
    """Shared by ConvInteger and QLinearConv: exact int32 accumulation via BLAS."""

    x_index = 0
    w_index = 1
    wzp_index = 3

    def setup(self):
        a = self.attrs
        self.group = int(a.get("group", 1))
        self.auto_pad = a.get("auto_pad", "NOTSET")
        self.pads = a.get("pads")
        self._packed = None
        c = self.node.constants
        w = c.get(self.w_index)
        wzp_idx = self.wzp_index
        has_wzp = wzp_idx < len(self.node.inputs) and self.node.inputs[wzp_idx]
        if w is not None and (not has_wzp or wzp_idx in c):
            try:
                self._packed = (w, self._pack(w, c.get(wzp_idx) if has_wzp else None))
            except ValueError:
                self._packed = None

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
        kdim = int(np.prod(w.shape[1:]))
        wmax = float(np.abs(wf).max()) if wf.size else 0.0
        return wp32, wp64, kdim * wmax

    def _accumulate(self, x, xzp, w, wzp):
        """The int32 accumulator of the convolution, as an exact float array."""
        _check_rank(x, w)
        nd = x.ndim - 2
        kernel, strides, dil = spatial_attrs(self.attrs, nd, w.shape[2:])
        if self._packed is not None and self._packed[0] is w:
            wp32, wp64, bound = self._packed[1]
        else:
            wp32, wp64, bound = self._pack(w, wzp)
        zp = 0
        if xzp is not None:
            xzp = np.asarray(xzp)
            if xzp.size != 1:
                raise ValueError(f"input zero point must be a scalar, got shape {xzp.shape}")
            zp = int(xzp.reshape(()))
        # Every partial sum is bounded by K * max|x - zp| * max|w - w_zp|; float32
        # represents all integers below 2**24 exactly, whatever the summation order.
        xmax = max(abs(int(x.max()) - zp), abs(int(x.min()) - zp)) if x.size else 0
        wp = wp32 if bound * xmax < 2.0**24 else wp64
        xf = x.astype(wp.gemm.dtype)
        if zp:
            xf -= xf.dtype.type(zp)
        pb, pe, out_sp = conv_pads(x.shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
        return _conv_forward(xf, wp, strides, dil, pb, pe, out_sp)


@op("ConvInteger", since=10)
class ConvInteger(_IntConvBase):
    """Integer convolution with zero points, accumulated exactly into int32."""

    x_index, w_index, wzp_index = 0, 1, 3

    def run(self, x, w, x_zero_point=None, w_zero_point=None):
        acc = self._accumulate(x, x_zero_point, w, w_zero_point)
        return (acc.astype(np.int32),)


@op("QLinearConv", since=10)
class QLinearConv(_IntConvBase):
    """Quantized convolution: int32 accumulation, then requantization with
    round-half-to-even and saturation; per-tensor or per-output-channel weight scales."""

    x_index, w_index, wzp_index = 0, 3, 5

    def run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point=None, b=None):
        acc = self._accumulate(x, x_zero_point, w, w_zero_point).astype(np.float64, copy=False)
        m = w.shape[0]
        nd = x.ndim - 2
        if b is not None:
            if b.shape != (m,):
                raise ValueError(f"bias has shape {b.shape}, expected ({m},)")
            acc += b.astype(np.float64).reshape((m,) + (1,) * nd)
        ws = np.asarray(w_scale, dtype=np.float32)
        if ws.size != 1:
            if ws.shape != (m,):
                raise ValueError(f"w_scale shape {ws.shape} must be scalar or ({m},)")
            ws = ws.reshape((m,) + (1,) * nd)
        else:
            ws = ws.reshape(())
        xs = np.asarray(x_scale, dtype=np.float32).reshape(())
        ys = np.asarray(y_scale, dtype=np.float32).reshape(())
        mult = (xs * ws / ys).astype(np.float64)
        acc *= mult
        out_dt = y_zero_point.dtype if y_zero_point is not None else x.dtype
        if y_zero_point is not None:
            acc += float(np.asarray(y_zero_point).reshape(()))
        info = np.iinfo(out_dt)
        np.rint(acc, out=acc)
        np.clip(acc, info.min, info.max, out=acc)
        return (acc.astype(out_dt),)


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
        wg = np.asarray(w, dtype=dtype).reshape(group, c // group, -1)
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

    def _geometry(self, in_sp, kernel, strides, dil):
        a = self.attrs
        nd = len(in_sp)
        op_ = list(a.get("output_padding") or [0] * nd)
        if len(op_) != nd:
            raise ValueError(f"output_padding {op_} must have {nd} entries")
        full = [strides[i] * (in_sp[i] - 1) + op_[i] + (kernel[i] - 1) * dil[i] + 1 for i in range(nd)]
        out_shape = a.get("output_shape")
        pads = a.get("pads")
        explicit = bool(out_shape)
        if explicit:
            out_shape = list(out_shape)[-nd:]
        elif self.auto_pad in ("SAME_UPPER", "SAME_LOWER") and not pads:
            out_shape = [in_sp[i] * strides[i] for i in range(nd)]
        if out_shape:
            # Padding is never negative (as in onnxruntime): a target larger than the
            # natural output is zero-extended (explicit output_shape) or not reached (SAME).
            pb, out = [], []
            for i in range(nd):
                total = max(0, full[i] - out_shape[i])
                pb.append(total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2)
                out.append(out_shape[i] if explicit else full[i] - total)
            return pb, out
        if self.auto_pad == "VALID" or not pads:
            pads = [0] * (2 * nd)
        if len(pads) != 2 * nd:
            raise ValueError(f"pads {list(pads)} must have {2 * nd} entries")
        pb = list(pads[:nd])
        out = [full[i] - pads[i] - pads[nd + i] for i in range(nd)]
        if any(o < 1 for o in out):
            raise ValueError(f"ConvTranspose output shape {out} is not positive")
        return pb, out

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
        L = int(np.prod(in_sp, dtype=np.int64))
        pb, out_sp = self._geometry(in_sp, kernel, strides, dil)
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
    kprod = int(np.prod(block))
    n, ck, L = x.shape
    if kprod == 0 or ck % kprod:
        raise ValueError(f"input dim 1 ({ck}) is not a multiple of prod(block_shape) = {kprod}")
    c = ck // kprod
    grid = []
    for i in range(nd):
        ek = (block[i] - 1) * dilations[i] + 1
        grid.append((image[i] + pads[i] + pads[nd + i] - ek) // strides[i] + 1)
    if int(np.prod(grid)) != L:
        raise ValueError(f"input has {L} blocks but the geometry gives {grid} = {int(np.prod(grid))}")
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
        K = int(np.prod(kernel))
        if c % og:
            raise ValueError(f"input channels {c} are not divisible by offset_group {og}")
        out_sp = tuple(offset.shape[2:])
        if offset.shape[:2] != (n, og * K * nd):
            raise ValueError(f"offset shape {offset.shape} must be ({n}, {og * K * nd}, ...)")
        for i in range(nd):
            ek = (kernel[i] - 1) * dil[i] + 1
            if out_sp[i] != (in_sp[i] + pads[i] + pads[nd + i] - ek) // strides[i] + 1:
                raise ValueError(f"offset spatial shape {out_sp} is inconsistent with the conv geometry")
        L = int(np.prod(out_sp))
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
        sp_strides = [int(np.prod(in_sp[i + 1 :])) for i in range(nd)]
        y = np.empty((n, wp.shape[0], L), dtype=cdt)
        xc = x.astype(cdt, copy=False).reshape(n, c, -1)
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
