"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, Col2Im.

The ops here check their inputs, pack a constant weight once (when the node's
kernel is built) and hand each call to the algorithms of :mod:`onnxrt_cpu.conv`,
which choose by the layer's shape how to compute it (the compiled kernels,
depthwise, pointwise, grouped, channels-last, stride-phase or banded im2col
paths); the integer convolutions accumulate exactly there too
(:mod:`onnxrt_cpu.conv.integer`). ConvTranspose and Col2Im run the GEMM first and
scatter-add the columns back (col2im), one strided slice per kernel tap.

The spatial helpers the pooling kernels share with these are in
:mod:`onnxrt_cpu.conv.geometry`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from onnxrt.plugin import check_allocation
from onnxrt.plugin.kernel import Kernel
from onnxrt.plugin.pool_geometry import conv_transpose_geometry

from .. import native
from ..conv.compiled import WINOGRAD_MIN_CHANNELS, native_call, qlinear_conv_native
from ..conv.forward import convolve
from ..conv.geometry import check_rank, col2im_add, compute_dtype, conv_attributes, conv_pads, spatial_attrs
from ..conv.integer import IntConvBase, input_bound, requantize_output, to_int32
from ..conv.packing import ConvWeights, DeconvWeights, is_constant_input, weight_for
from ..registry import op
from ..rows import columns_op

__all__ = ["Conv", "ConvInteger", "ConvTranspose", "DeformConv", "QLinearConv"]


# -- Conv --------------------------------------------------------------------------


@op("Conv", since=1)
class Conv(Kernel):
    """N-d convolution with groups, strides, dilations and padding."""

    def setup(self):
        a = self.attrs
        self.group, self.auto_pad, self.pads = conv_attributes(a)
        self._packed = None
        self._geometries = {}
        self._calls = {}
        w = self.node.constants.get(1)
        if w is not None and w.ndim >= 3:
            try:
                self._packed = (w, ConvWeights(w, self.group, compute_dtype(w.dtype)))
            except ValueError:
                self._packed = None
            wp = None if self._packed is None else self._packed[1]
            strides, dil = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
            if (wp is not None and native.BLAS and w.ndim == 4 and wp.kernel == (3, 3) and wp.group == 1
                    and wp.gemm.dtype == np.float32 and list(strides) == [1, 1] and list(dil) == [1, 1]
                    and w.shape[0] * w.shape[1] >= WINOGRAD_MIN_CHANNELS):
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
        """The convolution, plus ``residual`` and an in-place ``activation`` (FusedConv).

        A layer that one compiled call computes keeps that call per input shape
        (:class:`~onnxrt_cpu.conv.compiled.NativeCall`): later calls with the node's
        own weight and bias skip the checks and the choice of algorithm."""
        key = (x.shape, x.dtype, residual is None)
        call = self._calls.get(key)
        if call is not None and call.w is w and call.b is b and call.activation is activation:
            y = call(x, residual)
            if y is not None:
                return y
            self._calls[key] = None  # refused for its size: the other paths from now on
        check_rank(x, w)
        kernel, strides, dil, pb, pe, out_sp = self._geometry(x.shape, w.shape)
        cdt = compute_dtype(x.dtype)
        wp = weight_for(self, w, self.group, cdt)
        if residual is not None:
            residual = residual.astype(cdt, copy=False)
        constant_bias = is_constant_input(self, b, 2)
        if key not in self._calls and cdt == x.dtype and wp is not None and self._packed is not None \
                and wp is self._packed[1] and (b is None or constant_bias):
            # the node's own weight and bias: what is derived from them holds for
            # every call of this shape
            if len(self._calls) >= 8:
                self._calls.clear()  # shapes that keep changing: no unbounded growth
            call = native_call(x, wp, strides, dil, pb, pe, out_sp, b, residual, activation, w, b)
            self._calls[key] = call
            if call is not None:
                y = call(x, residual)
                if y is not None:
                    return y
                self._calls[key] = None
        y = convolve(x.astype(cdt, copy=False), wp, strides, dil, pb, pe, out_sp, b,
                     residual=residual, activation=activation, constant_bias=constant_bias)
        return y.astype(x.dtype, copy=False)


@op("ConvInteger", since=10)
class ConvInteger(IntConvBase):
    """Integer convolution with zero points, accumulated exactly into int32."""

    x_index, w_index, wzp_index = 0, 1, 3
    bytes_products = True

    def run(self, x, w, x_zero_point=None, w_zero_point=None):
        y = self._native_int32(x, x_zero_point, w)
        if y is not None:
            return (y,)
        rows = self._accumulate_rows(x, x_zero_point, w)
        if rows is not None:
            acc, (n, oh, ow), _ = rows
            return (np.ascontiguousarray(to_int32(acc).reshape(n, oh, ow, acc.shape[-1]).transpose(0, 3, 1, 2)),)
        return (to_int32(self._accumulate(x, x_zero_point, w, w_zero_point)),)


@op("QLinearConv", since=10)
class QLinearConv(IntConvBase):
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
        return (requantize_output(v, x, y_zero_point),)

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
        if l1 * input_bound(x, xzp, zp, l1) + bmax >= 2.0**24:
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
        y_zp = 0 if yzp is None else int(yzp.reshape(()))
        if not qlinear_conv_native(x, wp32, self._w8, bias, mult, y, kernel, strides, dil, pb, out_sp, zp, y_zp):
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
            v = to_int32(v).astype(np.float32)
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
        q = requantize_output(v, x, y_zero_point)
        # an NCHW view of the channels-last result: the next convolution reads it
        # channels last without a transposing copy, elementwise ops take any layout,
        # and the session hands graph outputs back C-ordered
        return q.reshape(n, oh, ow, m).transpose(0, 3, 1, 2)

# -- ConvTranspose -----------------------------------------------------------------------




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
                self._packed = (w, DeconvWeights(w, self.group, compute_dtype(w.dtype)))
            except ValueError:
                self._packed = None

    def run(self, x, w, b=None):
        check_rank(x, w)
        nd = x.ndim - 2
        cdt = compute_dtype(x.dtype)
        pre = self._packed
        if pre is not None and pre[0] is w and pre[1].gemm.dtype == cdt:
            wp = pre[1]
        else:
            wp = DeconvWeights(w, self.group, cdt)
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
        # output_shape, pads and strides are attributes: a small model can ask for any size
        check_allocation((n, m, *out_sp), cdt, f"{self.node.describe()} output")
        check_allocation((m, *kernel, *in_sp), cdt, f"{self.node.describe()} columns")
        check_allocation((m, *[hi[j] - lo[j] for j in range(nd)]), cdt, f"{self.node.describe()} canvas")
        xc = x.astype(cdt, copy=False)
        y = np.empty((n, m, *out_sp), dtype=cdt)
        crop = (slice(None),) + tuple(slice(pb[i] - lo[i], pb[i] - lo[i] + out_sp[i]) for i in range(nd))
        offset = [-l for l in lo]
        for i in range(n):
            cols = np.matmul(wp.gemm, xc[i].reshape(g, c // g, L))  # [g, M/g*K, L]
            cols = cols.reshape(m, *kernel, *in_sp)
            canvas = np.zeros((m, *[hi[j] - lo[j] for j in range(nd)]), dtype=cdt)
            col2im_add(canvas, cols, kernel, strides, dil, in_sp, offset)
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
    # image_shape and pads come from the model or the feed, not from x's size
    check_allocation((n * c, *padded), x.dtype, f"{k.node.describe()} image")
    canvas = np.zeros((n * c, *padded), dtype=x.dtype)
    col2im_add(canvas, x.reshape(n * c, *block, *grid), block, strides, dilations, grid)
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
        check_rank(x, w)
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
        wp = ConvWeights(w, self.group, cdt)
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
