"""com.microsoft quantized ops: what ``onnxruntime.quantization`` writes in QOperator
format, and the integer matrix products its graph optimizer fuses.

* elementwise: QLinearAdd, QLinearMul;
* lookup tables: QLinearSigmoid, QLinearLeakyRelu (an 8-bit input has only 256
  values, so the float function is evaluated once per value and then gathered);
* QLinearSoftmax, QLinearConcat, QLinearGlobalAveragePool, QLinearAveragePool;
* QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat;
* QuantizeLinear / DequantizeLinear in the com.microsoft domain (same semantics).

Quantized values are taken to float32 as ``(q - zero_point) * scale``, computed in
float32 and requantized with round-half-to-even and saturation, as onnxruntime's
reference paths do. Integer products accumulate exactly (see :mod:`.quantize`). The block-quantized
MatMulNBits, DynamicQuantizeLSTM and the quantized BERT ops live in
:mod:`.contrib_matmul_nbits`, :mod:`.contrib_quant_lstm` and :mod:`.contrib_quant_bert`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from onnxrt.plugin.kernel import Kernel
from onnxrt.plugin.pool_geometry import pool_geometry

from .. import native
from ..registry import op
from .activation import _sigmoid
from ..conv.geometry import pad_spatial, spatial_attrs, tap_slices
from .quantize import (
    INT_RANGES,
    DequantizeLinear,
    QuantizeLinear,
    _center,
    _check_matmul,
    _int_matmul,
    absmax,
    centred_bound,
    column_l1,
    dynamic_range,
    int_matmul_f32,
    requantize,
)
from ..conv.integer import IntConvBase
from ..rows import columns_op, plane_sum, row_op
from ..select import byte_lookup, clip

__all__ = [
    "ConvIntegerToFloat",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QGemm",
    "QLinearAdd",
    "QLinearAveragePool",
    "QLinearConcat",
    "QLinearLookup",
    "QLinearMul",
    "QLinearSoftmax",
    "qlinear_global_average_pool",
    "requantize",
]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)

op("QuantizeLinear", since=1, domain=MS)(QuantizeLinear)
op("DequantizeLinear", since=1, domain=MS)(DequantizeLinear)


def _scalar(p, what: str) -> np.float32:
    """A per-tensor scale as a float32 scalar; per-axis values are refused by name."""
    a = np.asarray(p)
    if a.size != 1:
        raise ValueError(f"{what} must be a scalar (per-tensor), got shape {a.shape}")
    return np.float32(a.reshape(()))


def _zp(p, dtype) -> int:
    """A per-tensor zero point as a Python int (0 when absent)."""
    if p is None:
        return 0
    a = np.asarray(p)
    if a.size != 1:
        raise ValueError(
            f"zero point must be a scalar (per-tensor), got shape {a.shape}"
        )
    if dtype is not None and a.dtype != dtype:
        raise ValueError(
            f"zero point has type {a.dtype}, the quantized tensor has type {dtype}"
        )
    return int(a.reshape(()))


def _check_q(x, what: str):
    if x.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise ValueError(f"{what} must be uint8 or int8, got {x.dtype}")


def dequant(x, scale, zp, what="x") -> np.ndarray:
    """``(x - zp) * scale`` in float32 (per-tensor)."""
    v = x.astype(_F32)
    z = _zp(zp, x.dtype)
    if z:
        v -= np.float32(z)
    v *= _scalar(scale, f"{what}_scale")
    return v


def _centre_f32(q: np.ndarray, zero_point) -> np.ndarray:
    """``q - zero_point`` as a new float32 array (exact for 8-bit codes).

    A conversion then a float32 subtraction: numpy has no vector loop for a mixed
    ``uint8 - float32`` subtraction, which took 12 us per 65k values against 5 + 3.5.
    """
    v = q.astype(_F32)
    if zero_point:
        v -= np.float32(zero_point)
    return v


def _dequant_f32(q: np.ndarray, zero_point, scale) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32."""
    v = _centre_f32(q, zero_point)
    v *= scale
    return v


def _out_type(y_zero_point, x) -> np.dtype:
    return np.dtype(y_zero_point.dtype) if y_zero_point is not None else x.dtype


# -- elementwise -----------------------------------------------------------------------


def _binary_inputs(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp, name):
    _check_q(a, f"{name}: A")
    if b.dtype != a.dtype:
        raise ValueError(
            f"{name}: A and B must have the same type, got {a.dtype} and {b.dtype}"
        )
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"{name}: shapes {a.shape} and {b.shape} do not broadcast"
        ) from None
    out = _out_type(c_zp, a)
    return (
        _scalar(a_scale, "A_scale"),
        _zp(a_zp, a.dtype),
        _scalar(b_scale, "B_scale"),
        _zp(b_zp, b.dtype),
        _scalar(c_scale, "C_scale"),
        _zp(c_zp, out),
        out,
    )


def _add_values(va, vb, sc):
    """QLinearAdd's float steps on dequantized operands: ``(va + vb) / sc``."""
    # summed in place into the larger operand (the result's shape) when it has it
    if va.shape == np.broadcast_shapes(va.shape, vb.shape):
        va += vb
        v = va
    else:
        v = np.add(va, vb)
    v /= sc
    return v


def _mul_values(ca, cb, ratio):
    """QLinearMul's float steps on centred operands: ``ca * cb * ratio``."""
    if ca.shape == np.broadcast_shapes(ca.shape, cb.shape):
        ca *= cb
        v = ca
    else:
        v = np.multiply(ca, cb)
    v *= ratio
    return v


def _codes(dtype) -> np.ndarray:
    """Every value of an 8-bit type, in the order of its bit patterns 0..255."""
    return np.arange(256, dtype=np.uint8).view(dtype)


#: Largest per-column table (entries, one byte each) that QLinearAdd and QLinearMul
#: read for a constant column vector: the gather pays only while the table stays in
#: the L1 cache (64 columns: 32 -> 28 us; 192 and 256 columns were 9-16 % slower than
#: the direct steps).
_COLUMN_TABLE_MAX = 1 << 15


class _QLinearBinary(Kernel):
    """QLinearAdd and QLinearMul. With constant scales and zero points the result of
    each pair of 8-bit codes is one of 65,536 values: the op is a lookup in a table
    computed once with the very float32 steps of the direct path (so the two are
    bitwise equal), indexed by ``a << 8 | b`` (three passes instead of eight).

    When one operand is a constant too (a bias, a fixed scale factor), its float32
    side of those steps is computed once, and the other operand's steps run directly:
    fewer passes than the table's, and no random-access gather (a [256, 256] + [256]
    QLinearAdd 57 us against 72 us; [8, 32, 32, 32] + [32] 192 us against 308 us).
    A constant that is one value reads its 256 entries of the table instead, by the
    other operand's raw bytes (``bytearray.translate``: 65,536 values, 76 -> 30 us);
    one value per column of the last axis, its columns' entries, while they fit the
    L1 cache (:data:`_COLUMN_TABLE_MAX`).
    """

    name = ""

    def setup(self):
        c = self.node.constants
        ins = self.node.inputs
        self.table = None
        self.fixed = None  # (index of the constant operand: 0 or 3, its float32 side)
        self.fixed_lookup = None
        dt = self.table_dtype = self.node.input_dtype(0)
        if dt not in (np.dtype(np.uint8), np.dtype(np.int8)) or self.node.input_dtype(3) != dt:
            return
        given = lambda i: i < len(ins) and bool(ins[i])  # noqa: E731
        # scales constant; zero points constant or absent
        if not all(i in c if given(i) else i in (2, 5, 7) for i in (1, 2, 4, 5, 6, 7)):
            return
        get = lambda i: c.get(i) if given(i) else None  # noqa: E731
        codes = _codes(dt)
        try:
            (v,) = self._compute(codes.reshape(256, 1), get(1), get(2), codes.reshape(1, 256), get(4), get(5),
                                 get(6), get(7))
        except ValueError:
            return  # the run reports it, with the node named
        self.table = v.reshape(-1)
        self.params = _binary_inputs(codes, get(1), get(2), codes, get(4), get(5), get(6), get(7), self.name)
        sa, za, sb, zb = self.params[:4]
        for i, zp, scale in ((3, zb, sb), (0, za, sa)):
            if i in c and c[i].dtype == dt:
                self.fixed = (i, c[i], self._side(c[i], zp, scale))
                self.fixed_lookup = self._constant_lookup(i, c[i])
                break

    def _constant_lookup(self, i, const):
        """For a constant operand ``const`` (input ``i``) that is one value, or one value
        per column of the last axis: the table's entries for it, indexed by the other
        operand's code alone (``bytes`` of 256 entries; for a column vector, a flat
        array of 256 entries per column), or None. Bitwise equal to the direct steps,
        as the whole table is."""
        grid = self.table.reshape(256, 256)  # [a code, b code]
        k = const.reshape(-1).view(np.uint8)
        if const.size == 1:
            row = grid[:, k[0]] if i == 3 else grid[k[0], :]
            return np.ascontiguousarray(row).tobytes()
        if const.ndim >= 1 and const.size == const.shape[-1] and const.size * 256 <= _COLUMN_TABLE_MAX:
            cols = grid[:, k].T if i == 3 else grid[k, :]  # [N, 256]
            return np.ascontiguousarray(cols).reshape(-1)
        return None

    def _side(self, q, zp, scale):
        """An operand's float32 part of the direct steps: QLinearAdd adds dequantized
        operands, QLinearMul multiplies centred ones (and scales the product)."""
        return _dequant_f32(q, zp, scale) if self.name == "QLinearAdd" else _centre_f32(q, zp)

    def _combine(self, vx, vy, sa, sb, sc):
        """The op on two operands' sides, divided by the output scale (in ``vx`` when
        it has the result's shape; the operands commute bit for bit)."""
        if self.name == "QLinearAdd":
            return _add_values(vx, vy, sc)
        return _mul_values(vx, vy, np.float32(sa * sb / sc))

    def _with_fixed(self, a, b):
        """The direct steps with the constant operand's side precomputed, or None."""
        i, const, side = self.fixed
        x, y = (a, b) if i == 3 else (b, a)
        if y is not const or x.dtype != self.table_dtype:
            return None
        try:
            shape = np.broadcast_shapes(x.shape, side.shape)
        except ValueError:
            return None  # the direct path reports it
        if shape != x.shape:
            return None  # the result is larger than the varying operand: the table
        lookup = self.fixed_lookup
        if isinstance(lookup, bytes):
            # one constant value: a 256-entry lookup by the other operand's raw byte
            return byte_lookup(lookup, x, self.table.dtype)
        if lookup is not None and x.shape[-1] == side.shape[-1]:
            # one value per column: the column's 256 entries, at column * 256 + code
            offsets = self._column_offsets(x.shape[-1])
            idx = np.add(x.view(np.uint8), offsets, dtype=np.intp)
            return lookup.take(idx, mode="clip")  # every index is in the table
        sa, za, sb, zb, sc, zc, out = self.params
        scale, zp = (sa, za) if i == 3 else (sb, zb)
        # the varying side first: it has the result's shape, so the constant side is
        # only read, never summed or multiplied into
        v = self._combine(self._side(x, zp, scale), side, sa, sb, sc)
        return requantize(v, zc, out, inplace=True)

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def _column_offsets(n: int) -> np.ndarray:
        offsets = np.arange(n, dtype=np.intp) * 256
        offsets.flags.writeable = False
        return offsets

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
        if a.ndim == 0 and b.ndim == 0:
            # numpy's scalar results cannot take out=: as one value, reshaped back
            (y,) = self.run(a.reshape(1), a_scale, a_zero_point, b.reshape(1), b_scale, b_zero_point, c_scale,
                            c_zero_point)
            return (y.reshape(()),)
        if self.fixed is not None:
            y = self._with_fixed(a, b)
            if y is not None:
                return (y,)
        if self.table is not None and a.dtype == self.table_dtype and b.dtype == self.table_dtype:
            try:
                shape = np.broadcast_shapes(a.shape, b.shape)
            except ValueError:
                shape = None  # the direct path reports it
            if shape is not None:
                y = native.pair_lookup(a, b, self.table) if a.shape == b.shape else None
                if y is not None:
                    return (y,)
                idx = np.left_shift(a.view(np.uint8), 8, dtype=np.uint16)
                if idx.shape == shape:
                    np.bitwise_or(idx, b.view(np.uint8), out=idx)
                else:
                    idx = np.bitwise_or(idx, b.view(np.uint8))
                return (np.asarray(self.table.take(idx)).reshape(shape),)
        return self._compute(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point)

    def _compute(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point):
        sa, za, sb, zb, sc, zc, out = _binary_inputs(
            a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, self.name
        )
        v = self._combine(self._side(a, za, sa), self._side(b, zb, sb), sa, sb, sc)
        return (requantize(v, zc, out, inplace=True),)


@op("QLinearAdd", since=1, domain=MS)
class QLinearAdd(_QLinearBinary):
    """``C = quantize(dequantize(A) + dequantize(B))`` with broadcasting."""

    name = "QLinearAdd"


@op("QLinearMul", since=1, domain=MS)
class QLinearMul(_QLinearBinary):
    """``C = quantize(dequantize(A) * dequantize(B))`` with broadcasting."""

    name = "QLinearMul"


# -- lookup-table activations ------------------------------------------------------------


class QLinearLookup(Kernel):
    """Base of 8-bit unary ops computed through a 256-entry table.

    Inputs ``X, X_scale, X_zero_point?, Y_scale, Y_zero_point?``. The table is built
    once when every scale and zero point is a constant, else per call.
    """

    def fn(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        """The float function the op applies."""
        raise NotImplementedError

    def setup(self):
        c = self.node.constants
        n = len(self.node.inputs)
        self.table = None
        self.table_bytes = None
        needed = [i for i in range(1, 5) if i < n and self.node.inputs[i]]
        dt = self.node.input_dtype(0)
        if dt in (np.dtype(np.uint8), np.dtype(np.int8)) and all(
            i in c for i in needed
        ):
            get = lambda i: c.get(i) if i < n and self.node.inputs[i] else None
            self.table = self._table(dt, get(1), get(2), get(3), get(4))
            # the same table indexed by the input's raw byte, for byte_lookup: an int8
            # value v (byte v mod 256) sits at v + 128 in the table, its byte ^ 0x80
            flip = 0x80 if INT_RANGES[np.dtype(dt)][0] else 0
            self.table_bytes = (np.dtype(dt), self.table[np.arange(256) ^ flip].tobytes())

    def _table(self, dt, x_scale, x_zp, y_scale, y_zp):
        lo, hi = INT_RANGES[np.dtype(dt)]
        q = np.arange(lo, hi + 1, dtype=np.int32).astype(dt)
        with np.errstate(over="ignore", under="ignore"):
            v = self.fn(dequant(q, x_scale, x_zp))
        out = _out_type(y_zp, q)
        return requantize(v / _scalar(y_scale, "Y_scale"), _zp(y_zp, out), out)

    def run(self, x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        _check_q(x, f"{self.node.describe()}: X")
        if y_scale is None:
            raise ValueError(f"{self.node.describe()}: Y_scale is required")
        table = self.table
        if table is None:
            table = self._table(x.dtype, x_scale, x_zero_point, y_scale, y_zero_point)
        elif isinstance(x, np.ndarray) and x.dtype == self.table_bytes[0]:
            return (byte_lookup(self.table_bytes[1], x, table.dtype),)
        lo = INT_RANGES[x.dtype][0]
        idx = x.astype(np.intp)
        if lo:
            idx -= lo
        return (table[idx],)


@op("QLinearSigmoid", since=1, domain=MS)
class QLinearSigmoid(QLinearLookup):
    """Quantized Sigmoid."""

    def fn(self, x):
        return _sigmoid(np, x)


@op("QLinearLeakyRelu", since=1, domain=MS)
class QLinearLeakyRelu(QLinearLookup):
    """Quantized LeakyRelu (``alpha`` defaults to 0.01)."""

    def fn(self, x):
        alpha = np.float32(self.attrs.get("alpha", 0.01))
        return np.where(x >= 0, x, x * alpha)


@op("QLinearSoftmax", since=1, domain=MS)
class QLinearSoftmax(Kernel):
    """Quantized Softmax. ``opset`` (the Softmax version the node replaced) picks the
    axis semantics: before 13 the input is coerced to 2-D at ``axis``. ``axis`` is -1
    unless given, whatever ``opset`` says (onnxruntime's schema default; Softmax-11's
    own default of 1 does not apply to this op)."""

    def setup(self):
        self.opset = int(self.attrs.get("opset", 13))
        self.axis = int(self.attrs.get("axis", -1))

    def run(self, x, x_scale, x_zero_point, y_scale, y_zero_point):
        _check_q(x, "QLinearSoftmax: X")
        r = x.ndim
        if not -r <= self.axis < r:
            raise ValueError(
                f"QLinearSoftmax: axis {self.axis} is out of range for rank {r}"
            )
        axis = self.axis % r
        v = dequant(x, x_scale, x_zero_point)
        if self.opset < 13:
            shape = v.shape
            v = v.reshape(math.prod(shape[:axis]), -1)
            axis = 1
        v = v - v.max(axis=axis, keepdims=True)
        np.exp(v, out=v)
        v /= v.sum(axis=axis, keepdims=True)
        v = v.reshape(x.shape)
        out = _out_type(y_zero_point, x)
        return (
            requantize(v / _scalar(y_scale, "y_scale"), _zp(y_zero_point, out), out),
        )


@op("QLinearConcat", since=1, domain=MS)
class QLinearConcat(Kernel):
    """Concatenation of quantized tensors, each requantized to ``Y``'s scale.

    Inputs ``Y_scale, Y_zero_point, (X, X_scale, X_zero_point)...``."""

    def run(self, y_scale, y_zero_point, *xs):
        if not xs or len(xs) % 3:
            raise ValueError(
                f"QLinearConcat: inputs after Y_scale, Y_zero_point come in triples, got {len(xs)}"
            )
        out = np.dtype(y_zero_point.dtype)
        sy = _scalar(y_scale, "Y_scale")
        zy = _zp(y_zero_point, out)
        parts = []
        for i in range(0, len(xs), 3):
            x, s, z = xs[i : i + 3]
            _check_q(x, f"QLinearConcat: input {i // 3}")
            sx = _scalar(s, "X_scale")
            zx = _zp(z, x.dtype)
            if x.dtype == out and sx == sy and zx == zy:
                parts.append(x)  # same quantization: taken as is, as onnxruntime does
            else:
                parts.append(requantize(dequant(x, s, z) / sy, zy, out))
        axis = int(self.attrs.get("axis", 0))
        r = parts[0].ndim
        if not -r <= axis < r:
            raise ValueError(f"QLinearConcat: axis {axis} is out of range for rank {r}")
        try:
            return (np.concatenate(parts, axis=axis),)
        except ValueError as e:
            raise ValueError(f"QLinearConcat: {e}") from None


# -- pooling --------------------------------------------------------------------------


@op("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(
    k, x, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0
):
    """Quantized GlobalAveragePool (NCHW, or NHWC with ``channels_last=1``)."""
    _check_q(x, "QLinearGlobalAveragePool: X")
    if x.ndim < 3:
        raise ValueError(
            f"QLinearGlobalAveragePool: input must have rank >= 3, got shape {x.shape}"
        )
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    zx = _zp(x_zero_point, x.dtype)
    n = math.prod([x.shape[a] for a in axes])
    # the sum of 8-bit values is exact in float64 for any realistic size, and in
    # float32 (one product with ones, several times faster) below 2**24
    s = None
    if n * 256 < 2**24 and x.size:
        planes = x if not channels_last else np.moveaxis(x, -1, 1)
        s = plane_sum(planes.astype(_F32, order="K"))
    if s is None:
        s = x.sum(axis=axes, keepdims=True, dtype=np.float64)
    else:
        s = s.astype(np.float64).reshape([1 if a in axes else d for a, d in enumerate(x.shape)])
    mean = (s / n - zx).astype(_F32)
    out = _out_type(y_zero_point, x)
    v = mean * np.float32(_scalar(x_scale, "x_scale") / _scalar(y_scale, "y_scale"))
    return requantize(v, _zp(y_zero_point, out), out)


@op("QLinearAveragePool", since=1, domain=MS)
class QLinearAveragePool(Kernel):
    """Quantized AveragePool with AveragePool's attributes and ``channels_last``."""

    def setup(self):
        a = self.attrs
        self.ceil_mode = int(a.get("ceil_mode", 0))
        self.include_pad = bool(a.get("count_include_pad", 0))
        self.channels_last = bool(a.get("channels_last", 0))

    def run(self, x, x_scale, x_zero_point, y_scale, y_zero_point=None):
        _check_q(x, "QLinearAveragePool: X")
        if x.ndim < 3:
            raise ValueError(
                f"QLinearAveragePool: input must have rank >= 3, got shape {x.shape}"
            )
        xc = np.moveaxis(x, -1, 1) if self.channels_last else x
        nd = xc.ndim - 2
        kernel, strides, dil = spatial_attrs(self.attrs, nd)
        if len(kernel) != nd:
            raise ValueError(
                f"QLinearAveragePool: kernel_shape {kernel} must have {nd} entries"
            )
        pb, pe, extra, out_sp = pool_geometry(
            xc.shape[2:],
            kernel,
            strides,
            dil,
            self.attrs.get("pads"),
            self.attrs.get("auto_pad", "NOTSET"),
            self.ceil_mode,
            self.node.describe(),
        )
        v = dequant(xc, x_scale, x_zero_point)
        ones = np.ones((1, 1) + xc.shape[2:], dtype=_F32)
        pe = [e + x_ for e, x_ in zip(pe, extra)]
        vp = pad_spatial(v, pb, pe)
        # padded cells count towards the divisor only with count_include_pad, and then
        # so does the overhang of ceil mode's last windows: onnxruntime divides every
        # window by the kernel size there (AveragePool itself never counts the overhang)
        cp = pad_spatial(ones, pb, pe, 1 if self.include_pad else 0)
        acc = np.zeros(xc.shape[:2] + tuple(out_sp), dtype=_F32)
        cnt = np.zeros((1, 1) + tuple(out_sp), dtype=_F32)
        for _, sl in tap_slices(kernel, strides, dil, out_sp):
            acc += vp[(slice(None), slice(None)) + sl]
            cnt += cp[(slice(None), slice(None)) + sl]
        acc /= np.maximum(cnt, 1)
        out = _out_type(y_zero_point, x)
        y = requantize(acc / _scalar(y_scale, "y_scale"), _zp(y_zero_point, out), out)
        return (np.moveaxis(y, 1, -1) if self.channels_last else y,)


# -- integer matrix products ---------------------------------------------------------------


def _col_param(p, n: int, what: str) -> np.ndarray:
    """A scale or zero point of B: scalar, or one per column ``[N]``."""
    a = np.asarray(p)
    if a.size == 1:
        return a.reshape(())
    if a.shape != (n,):
        raise ValueError(f"{what} must be a scalar or have shape ({n},), got {a.shape}")
    return a


def _center_b(b: np.ndarray, zp) -> np.ndarray:
    """``B - zp`` (per tensor or per column) as exact float32."""
    v = b.astype(_F32)
    if zp is not None:
        z = _col_param(zp, b.shape[-1], "B zero point")
        if z.dtype != b.dtype:
            raise ValueError(f"B zero point has type {z.dtype}, B has type {b.dtype}")
        v -= z.astype(_F32)
    return v


@op("QGemm", since=1, domain=MS)
class QGemm(Kernel):
    """``Y = alpha * (A - a_zp)' (B - b_zp)' * a_scale * b_scale + C * a_scale * b_scale``,
    requantized with ``y_scale``/``y_zero_point``, or float32 when ``y_scale`` is absent.
    ``C`` is an int32 bias already quantized with scale ``a_scale * b_scale``."""

    def setup(self):
        a = self.attrs
        self.alpha = np.float32(a.get("alpha", 1.0))
        self.trans_a = bool(a.get("transA", 0))
        self.trans_b = bool(a.get("transB", 0))
        c = self.node.constants
        self.b_packed = None
        if 3 in c and 5 in c:
            self.b_packed = self._pack_b(c[3], c[5])
            self.b_l1 = column_l1(self.b_packed)

    def _pack_b(self, b, zp):
        if b.ndim != 2:
            raise ValueError(
                f"{self.node.describe()}: B must be 2-D, got shape {b.shape}"
            )
        bt = b.T if self.trans_b else b
        return np.ascontiguousarray(_center_b(bt, zp))

    def run(
        self,
        a,
        a_scale,
        a_zero_point,
        b,
        b_scale,
        b_zero_point,
        c=None,
        y_scale=None,
        y_zero_point=None,
    ):
        desc = self.node.describe()
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(
                f"{desc}: A and B must be 2-D, got shapes {a.shape} and {b.shape}"
            )
        _check_q(a, f"{desc}: A")
        B = (
            self.b_packed
            if self.b_packed is not None
            else self._pack_b(b, b_zero_point)
        )
        aa = a.T if self.trans_a else a
        if aa.shape[1] != B.shape[0]:
            raise ValueError(
                f"{desc}: inner dimensions differ: A' is {aa.shape}, B' is {B.shape}"
            )
        A = _center(aa, np.asarray(_zp(a_zero_point, a.dtype)), False, _F32)
        bl1 = self.b_l1 if self.b_packed is not None else None
        acc = _int_matmul(A, B, centred_bound(a.dtype, a_zero_point), None, bl1)
        n = B.shape[1]
        if c is not None:
            if c.dtype != np.int32:
                raise ValueError(f"{desc}: C must be int32, got {c.dtype}")
            acc = acc + c  # wrapping as the int32 accumulator does
        # C joins the int32 accumulator; alpha scales both, and the accumulator is
        # converted to float32 and multiplied by the float32 scale ratio, as
        # onnxruntime does (a float64 product differs at ties: 3 * float32(1 / 6)
        # is exactly 0.5 in float32, which rounds to 0)
        mult = (
            self.alpha
            * _scalar(a_scale, "a_scale")
            * _col_param(b_scale, n, "b_scale").astype(_F32)
        )
        v = acc.astype(_F32)
        if y_scale is None:
            v *= mult
            return (v,)
        out = _out_type(y_zero_point, a)
        v *= mult / _scalar(y_scale, "y_scale")
        return (requantize(v, _zp(y_zero_point, out), out, inplace=True),)


def _bias(y: np.ndarray, bias, what: str) -> np.ndarray:
    if bias is None:
        return y
    if bias.shape != (y.shape[-1],):
        raise ValueError(
            f"{what}: bias has shape {bias.shape}, expected ({y.shape[-1]},)"
        )
    columns_op(np.add, y, bias.astype(y.dtype, copy=False))
    return y


def _column_vector(v, n: int) -> np.ndarray | None:
    """A float32 scale of one value or one per column as a [1] or [n] vector, for the
    compiled 8-bit products' epilogue; None for any other shape."""
    if v.size == 1:
        return v.reshape(1)
    return v if v.shape == (n,) else None


def _int8_product(w, a, za: int, a_scale, scale, bias):
    """``a``'s product with the packed ``w`` by the compiled 8-bit kernel, converted,
    times ``scale`` (one value or one per column) and plus ``bias``: None where it
    does not apply (no packed B, B not 2-D, other shapes, a NaN in float ``a``)."""
    if w is None or a.ndim == 0 or a_scale is not None and not 0.0 < a_scale < np.inf:
        return None
    vec = _column_vector(scale, w.n)
    if vec is None or (bias is not None and (bias.dtype != _F32 or bias.shape != (w.n,))):
        return None
    return native.int8_matmul(a, w, za, a_scale=a_scale, scale=vec, bias=bias)


def _b_scale(b, b_scale) -> np.ndarray:
    """B's scale as float32: per tensor, per column (the last axis of B; shared by a
    batch of B matrices, as in onnxruntime) or per column of each matrix."""
    s = np.asarray(b_scale, dtype=_F32)
    if s.size == 1:
        return s.reshape(())
    if s.ndim == 1 and s.shape[0] == b.shape[-1]:
        return s  # broadcasts over rows (a 1-D A's product too) and batches
    if s.shape[-1] != b.shape[-1] or s.size != b.shape[-1] * int(
        math.prod(b.shape[:-2])
    ):
        raise ValueError(
            f"b_scale of shape {s.shape} does not fit B of shape {b.shape}"
        )
    return s.reshape(b.shape[:-2] + (1, b.shape[-1]))


def _center_b_any(b, zp, prepacked):
    if prepacked is not None:
        return prepacked
    v = b.astype(_F32)
    if zp is not None:
        z = np.asarray(zp)
        if z.dtype != b.dtype:
            raise ValueError(f"b_zero_point has type {z.dtype}, B has type {b.dtype}")
        if z.size == 1:
            v -= np.float32(z.reshape(()))
        else:
            v -= z.astype(_F32).reshape(b.shape[:-2] + (1, b.shape[-1]))
    return v


class _ConstB:
    """A constant 8-bit B of MatMulIntegerToFloat or DynamicQuantizeMatMul: packed for
    the compiled 8-bit products where this CPU has them, and centred as float32 for
    the numpy path only where they do not take it or when a run first needs it (four
    times the packed weight's memory, held for nothing while the compiled kernel runs)."""

    @staticmethod
    def setup_b(kernel, c: dict, b_index: int, zp_index: int | None) -> None:
        kernel.w8 = kernel.b_packed = None
        kernel.b_source = None
        if b_index in c and (zp_index is None or zp_index in c):
            kernel.b_source = (c[b_index], None if zp_index is None else c[zp_index])
            # B packed for the compiled 8-bit products, where this CPU has them
            kernel.w8 = native.pack_int8_weights(*kernel.b_source)
            if kernel.w8 is None:
                _ConstB.centred(kernel)

    @staticmethod
    def centred(kernel):
        """``(B - zero point as float32, its absmax, its column_l1)`` of the constant B,
        made once; None where B is not constant."""
        if kernel.b_packed is None and kernel.b_source is not None:
            bp = _center_b_any(*kernel.b_source, None)
            kernel.b_packed = (bp, absmax(bp), column_l1(bp))
        return kernel.b_packed


@op("MatMulIntegerToFloat", since=1, domain=MS)
class MatMulIntegerToFloat(Kernel):
    """``(A - a_zp) @ (B - b_zp) * a_scale * b_scale + bias`` in float32; ``b_scale``
    and ``b_zero_point`` may be per column."""

    def setup(self):
        c = self.node.constants
        ins = self.node.inputs
        has_zp = len(ins) > 5 and ins[5]
        _ConstB.setup_b(self, c, 1, 5 if has_zp else None)

    def run(
        self, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None
    ):
        desc = self.node.describe()
        _check_matmul(a, b, desc)
        if self.w8 is not None and a.dtype in (np.uint8, np.int8):
            y = _int8_product(self.w8, a, _zp(a_zero_point, a.dtype), None,
                              _scalar(a_scale, "a_scale") * _b_scale(b, b_scale), bias)
            if y is not None:
                return (y,)
        A = _center(a, np.asarray(_zp(a_zero_point, a.dtype)), False, _F32)
        packed = _ConstB.centred(self)
        B = _center_b_any(b, b_zero_point, None if packed is None else packed[0])
        y = int_matmul_f32(
            A,
            B,
            centred_bound(a.dtype, a_zero_point),
            packed[1] if packed is not None else centred_bound(b.dtype, b_zero_point),
            packed[2] if packed is not None else None,
        )
        # scaled in float32, as onnxruntime does
        y *= _scalar(a_scale, "a_scale") * _b_scale(b, b_scale)
        return (_bias(y, bias, desc),)


def _dynamic_centred(x: np.ndarray):
    """DynamicQuantizeLinear's ``q - zero_point`` as exact float32, with its scale and
    zero point: ``clip(rint(x / s) + z, 0, 255) - z`` is ``clip(rint(x / s), -z, 255 - z)``
    for these integers, which spares the uint8 round trip."""
    xf, scale, zp, saturates = dynamic_range(x)
    v = np.divide(xf, scale, dtype=_F32)
    np.rint(v, out=v)
    if saturates:
        clip(v, -zp, np.float32(255) - zp, out=v)
    return v, scale, int(zp)


@op("DynamicQuantizeMatMul", since=1, domain=MS)
class DynamicQuantizeMatMul(Kernel):
    """Float A quantized to uint8 on the fly (DynamicQuantizeLinear), multiplied by the
    8-bit B, scaled back to float32 and biased."""

    def setup(self):
        c = self.node.constants
        ins = self.node.inputs
        has_zp = len(ins) > 3 and ins[3]
        _ConstB.setup_b(self, c, 1, 3 if has_zp else None)
        # a constant B scale converted once (the same array comes back every run)
        self.b_scale = None
        if 1 in c and 2 in c:
            try:
                self.b_scale = (c[2], _b_scale(c[1], c[2]))
            except ValueError:
                pass  # a scale that does not fit B: run reports it

    def run(self, a, b, b_scale, b_zero_point=None, bias=None):
        desc = self.node.describe()
        _check_matmul(a, b, desc)
        cached = self.b_scale
        if self.w8 is not None and a.dtype == _F32:
            _, sa, za, _ = dynamic_range(a)
            y = _int8_product(self.w8, a, int(za), sa, sa * (
                cached[1] if cached is not None and cached[0] is b_scale else _b_scale(b, b_scale)), bias)
            if y is not None:
                return (y,)
        A, sa, za = _dynamic_centred(a)
        packed = _ConstB.centred(self)
        B = _center_b_any(b, b_zero_point, None if packed is None else packed[0])
        bmax = packed[1] if packed is not None else centred_bound(b.dtype, b_zero_point)
        bl1 = packed[2] if packed is not None else None
        y = int_matmul_f32(A, B, float(max(za, 255 - za)), bmax, bl1)
        scale = sa * (cached[1] if cached is not None and cached[0] is b_scale else _b_scale(b, b_scale))
        if row_op(np.multiply, y, scale) is None:  # a scalar scale, or one per batch item
            y *= scale
        return (_bias(y, bias, desc),)


@op("ConvIntegerToFloat", since=1, domain="ai.onnxrt")
class ConvIntegerToFloat(IntConvBase):
    """onnxrt's dynamically quantized convolution's float end (made only by
    ``dynamic_quant_conv_fusion``): ``[Relu](float32(ConvInteger(x, w, x_zero_point,
    w_zero_point)) * scale [+ bias])`` with ConvInteger's attributes, ``scale`` one
    float32 value, ``bias`` float32 one a channel (``[1, M, 1, ...]`` or ``[M, 1,
    ...]``) and ``relu`` 0 or 1: each op's float32 rounding, in the compiled 8-bit
    convolution's tiles where it takes the node."""

    x_index, w_index, wzp_index = 0, 1, 3
    bytes_products = True

    def setup(self):
        super().setup()
        self.relu = bool(self.attrs.get("relu", 0))
        self._vectors = None  # (scale, bias, their float32 vectors) of the last run

    def run(self, x, w, x_zero_point=None, w_zero_point=None, scale=None, bias=None):
        if scale is None:
            raise ValueError(f"{self.node.describe()}: the scale input is missing")
        m = w.shape[0]
        y = self._native_float(x, x_zero_point, w, scale, bias, m)
        if y is not None:
            return (y,)
        from .conv import ConvInteger

        acc = ConvInteger.run(self, x, w, x_zero_point, w_zero_point)[0]
        # the Cast, Mul, Add and Relu the fusion replaced, as their kernels compute them
        v = acc.astype(np.float32)
        v = np.multiply(v, scale)
        if bias is not None:
            v = np.add(v, bias)
        if self.relu:
            np.maximum(v, np.float32(0), out=v)
        return (v,)

    def _native_float(self, x, x_zero_point, w, scale, bias, m):
        """The whole node by qconv8's float32 output, or None where it does not take it
        (a scale that is not one finite float32 value, a bias not one a channel, or
        what :meth:`_native_int32` refuses)."""
        if type(scale) is not np.ndarray or scale.dtype != np.float32 or scale.size != 1 \
                or not math.isfinite(float(scale.reshape(()))):
            return None
        if bias is not None and (type(bias) is not np.ndarray or bias.dtype != np.float32 or bias.size != m
                                 or bias.ndim > x.ndim or bias.shape[-x.ndim + 1:] != (m,) + (1,) * (x.ndim - 2)):
            return None
        kept = self._vectors
        if kept is not None and kept[0] is scale and kept[1] is bias:
            mult, b = kept[2], kept[3]
        else:
            mult = scale.reshape(1).copy()
            b = None if bias is None else np.ascontiguousarray(bias.reshape(m))
            if bias is None or bias is self.node.constants.get(5):
                self._vectors = (scale, bias, mult, b)  # a fed array may change: never kept
        return self._native_int32(x, x_zero_point, w, out_dtype=np.float32, mult=mult, bias=b, relu=self.relu)
