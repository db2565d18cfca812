"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger and QLinearMatMul.

Integer quantization rounds half to even and saturates to the target range. Integer
matrix products are computed exactly, on float BLAS:

* float32 represents every integer below 2**24, and a sum of integers whose magnitudes
  add up to less than 2**24 is exact in any order, with or without FMA. So the inner
  dimension K is cut into chunks of at most ``(2**24 - 1) // (max|a| * max|b|)``
  (zero points taken off; 258 or more for 8-bit operands) and each chunk is one float32
  GEMM, converted to int32 and summed in int32, wrapping as a 32-bit accumulator does;
* when a chunk would be too short to pay, a float64 product is used instead: every
  8-bit product is below 2**17, so it is exact for K below 2**36. Larger K falls back
  to int64 matmul.
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
from onnxrt.dtypes import np_dtype
from onnxrt.plugin.kernel import Kernel

from .. import native
from ..parallel import current_thread_count, matmul_nd
from ..registry import op
from .cast import SATURATING_F8, cast_array
from ..select import clip

__all__ = ["DequantizeLinear", "MatMulInteger", "QLinearMatMul", "QuantizeLinear", "dynamic_quantize_linear",
           "column_l1", "dynamic_range", "int_matmul_f32", "requantize"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
_F32_STRUCT = struct.Struct("f")


def _to_f32(v: float) -> float:
    """``v`` rounded to float32 (a finite ``v`` within float32's range)."""
    return _F32_STRUCT.unpack(_F32_STRUCT.pack(v))[0]

#: saturation range of each integer quantized type
INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int2): (-2, 1),
}
#: float quantized types without infinities: ml_dtypes' own conversion saturates
_SATURATING_SMALL_FLOATS = frozenset(
    np.dtype(t) for t in (ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn)
)
_QUANT_TYPES = frozenset(INT_RANGES) | SATURATING_F8 | _SATURATING_SMALL_FLOATS
_COMPUTE_16 = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})

# exact-float64 limit on the inner dimension of an 8-bit integer matmul
_EXACT_K = 1 << 36


def _expand_param(p: np.ndarray, shape: tuple, axis: int, block_size: int, what: str) -> np.ndarray:
    """Make a scale/zero point broadcastable against ``shape`` (per tensor, per axis
    or blocked along ``axis``)."""
    if p.ndim == 0 or (p.size == 1 and not block_size):
        return p.reshape(())
    rank = len(shape)
    if rank == 0:
        raise ValueError(f"{what} has shape {p.shape} but the input is a scalar")
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for an input of rank {rank}")
    axis %= rank
    if not block_size:
        if p.ndim != 1 or p.shape[0] != shape[axis]:
            raise ValueError(
                f"{what} of shape {p.shape} does not fit per-axis quantization of an input "
                f"of shape {tuple(shape)} on axis {axis} (expected ({shape[axis]},))"
            )
        dims = [1] * rank
        dims[axis] = shape[axis]
        return p.reshape(dims)
    if block_size < 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    expect = list(shape)
    expect[axis] = -(-shape[axis] // block_size)
    if p.ndim != rank or list(p.shape) != expect:
        raise ValueError(
            f"{what} of shape {p.shape} does not fit blocked quantization of an input of "
            f"shape {tuple(shape)} with block_size {block_size} on axis {axis} "
            f"(expected {tuple(expect)})"
        )
    rep = np.repeat(p, block_size, axis=axis)
    if rep.shape[axis] != shape[axis]:
        rep = np.take(rep, np.arange(shape[axis]), axis=axis)
    return rep


def _axis_for(x: np.ndarray, axis: int) -> int:
    # the default axis 1 means nothing for rank-1 inputs; the spec treats them per tensor
    return 0 if x.ndim == 1 and axis in (1, -1) else axis


#: elements a thread takes at least in the compiled QuantizeLinear/DequantizeLinear
_Q8_THREAD_ELEMS = 1 << 16
_BYTE_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8))


def _q8_params(shape: tuple, scale: np.ndarray, zero_point, int_dtype: np.dtype, axis: int):
    """``(scale, zero point, inner)`` as the compiled 8-bit QuantizeLinear and
    DequantizeLinear take them (float32 scales and zero points of ``int_dtype``, one
    value or one along ``axis``, with ``inner`` elements after it), or None where they
    are not such (the numpy path handles them and reports what is wrong)."""
    if type(scale) is not np.ndarray or scale.dtype != _F32:
        return None
    if zero_point is not None and (type(zero_point) is not np.ndarray or zero_point.dtype != int_dtype
                                   or zero_point.size != scale.size):
        return None
    if scale.size == 1:
        return scale.reshape(1), None if zero_point is None else zero_point.reshape(1), 1
    rank = len(shape)
    if scale.ndim != 1 or not rank or not -rank <= axis < rank or shape[axis] != scale.size \
            or (zero_point is not None and zero_point.ndim != 1):
        return None
    inner = 1
    for d in shape[axis % rank + 1:]:
        inner *= d
    return scale, zero_point, inner


def _q8_threads(n: int) -> int:
    return min(current_thread_count(), 1 + n // _Q8_THREAD_ELEMS)


def quantize8(x: np.ndarray, scale: np.ndarray, zero_point, out_dtype: np.dtype, axis: int = 1):
    """QuantizeLinear of float32 ``x`` to uint8 or int8 by the compiled kernel (per
    tensor or per axis, no blocks), what :func:`quantize` computes; None where it does
    not take the arguments."""
    k = native.K
    if k is None or type(x) is not np.ndarray or x.dtype != _F32 or out_dtype not in _BYTE_DTYPES:
        return None
    p = _q8_params(x.shape, scale, zero_point, out_dtype, _axis_for(x, axis))
    if p is None:
        return None
    xc = np.ascontiguousarray(x)
    y = np.empty(x.shape, out_dtype)
    k.quantize8(xc, p[0], p[1], y, p[2], _q8_threads(x.size))
    return y


def dequantize8(x: np.ndarray, scale: np.ndarray, zero_point, axis: int = 1):
    """DequantizeLinear of uint8 or int8 ``x`` to float32 by the compiled kernel (per
    tensor or per axis, no blocks), what :func:`dequantize` computes; None where it
    does not take the arguments."""
    k = native.K
    if k is None or type(x) is not np.ndarray or x.dtype not in _BYTE_DTYPES:
        return None
    p = _q8_params(x.shape, scale, zero_point, x.dtype, _axis_for(x, axis))
    if p is None:
        return None
    y = np.empty(x.shape, _F32)
    k.dequantize8(np.ascontiguousarray(x), p[0], p[1], y, p[2], _q8_threads(x.size))
    return y


def quantize(x, scale, zero_point, out_dtype, *, axis=1, block_size=0, saturate=True, precision=None):
    """``saturate(round_half_even(x / scale) + zero_point)`` in ``out_dtype``."""
    out_dtype = np.dtype(out_dtype)
    axis = _axis_for(x, axis)
    s = _expand_param(np.asarray(scale), x.shape, axis, block_size, "y_scale")
    if s.dtype.kind != "f" and s.dtype not in _COMPUTE_16:
        s = s.astype(_F32)  # int32 or float8e8m0 scales
    if precision is not None:
        pdt = np.dtype(precision)
        if pdt in _COMPUTE_16:
            # an explicit 16-bit precision rounds the operands and the quotient
            x = x.astype(pdt)
            s = s.astype(pdt)
    elif x.dtype.kind in "iu":
        pdt = _F64
    else:
        # 16-bit inputs divide in float32 without rounding the quotient, as onnxruntime does
        pdt = np.result_type(x.dtype, s.dtype)
    cdt = _F64 if pdt == _F64 else _F32
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = np.asarray(np.divide(x.astype(cdt, copy=False), s.astype(cdt, copy=False), dtype=cdt))
        if precision is not None and pdt in _COMPUTE_16:
            v = v.astype(pdt).astype(cdt)
        zp = None
        if zero_point is not None:
            zp = _expand_param(np.asarray(zero_point), x.shape, axis, block_size, "y_zero_point")
        if out_dtype in INT_RANGES:
            lo, hi = INT_RANGES[out_dtype]
            np.rint(v, out=v)
            if zp is not None:
                v += zp.astype(cdt)
            clip(v, lo, hi, out=v)
            if out_dtype.itemsize == 1 and out_dtype.kind in "iu":
                return v.astype(out_dtype)
            return v.astype(np.int32).astype(out_dtype)
        if zp is not None:
            zf = zp.astype(cdt)
            if np.any(zf):
                v = v + zf
        if out_dtype in SATURATING_F8:
            return cast_array(v, out_dtype, saturate)
        return v.astype(out_dtype)


def _out_dtype_attr(attrs) -> np.dtype | None:
    code = attrs.get("output_dtype", 0)
    return np_dtype(code) if code else None


@op("QuantizeLinear", since=10)
class QuantizeLinear(Kernel):
    """QuantizeLinear: per-tensor, per-axis or blocked quantization to integer,
    float8 or float4 types."""

    def setup(self):
        a = self.attrs
        self.axis = a.get("axis", 1)
        self.block_size = a.get("block_size", 0)
        self.saturate = bool(a.get("saturate", 1))
        self.out = _out_dtype_attr(a)
        self.precision = np_dtype(a["precision"]) if a.get("precision") else None
        if self.out is not None and self.out not in _QUANT_TYPES:
            raise ValueError(f"{self.node.describe()}: output_dtype {self.out} is not a quantized type")

    def run(self, x, y_scale, y_zero_point=None):
        out = self.out
        if y_zero_point is not None:
            zdt = y_zero_point.dtype
            if out is not None and out != zdt:
                raise ValueError(f"QuantizeLinear: output_dtype {out} differs from y_zero_point type {zdt}")
            out = zdt
        if out is None:
            out = np.dtype(np.uint8)
        if out not in _QUANT_TYPES:
            raise ValueError(f"QuantizeLinear: {out} is not a quantized type")
        if not self.block_size and self.precision is None:
            y = quantize8(x, y_scale, y_zero_point, out, self.axis)
            if y is not None:
                return (y,)
        y = quantize(
            x,
            y_scale,
            y_zero_point,
            out,
            axis=self.axis,
            block_size=self.block_size,
            saturate=self.saturate,
            precision=self.precision,
        )
        return (y,)


def dequantize(x, scale, zero_point, out_dtype, *, axis=1, block_size=0):
    """``(x - zero_point) * scale`` computed in float32 (float64 for double output)."""
    axis = _axis_for(x, axis)
    s = _expand_param(np.asarray(scale), x.shape, axis, block_size, "x_scale")
    cdt = _F64 if out_dtype == _F64 else _F32
    xdt = x.dtype
    if xdt.kind in "iu" or xdt in INT_RANGES:
        # up to 16-bit values the difference is exact in float32; int32 needs int64
        wide = np.int64 if xdt.itemsize >= 4 else cdt
        d = x.astype(wide)
        if zero_point is not None:
            if zero_point.dtype != xdt:
                raise ValueError(f"DequantizeLinear: x_zero_point type {zero_point.dtype} differs from x type {xdt}")
            zp = _expand_param(np.asarray(zero_point), x.shape, axis, block_size, "x_zero_point")
            d -= zp.astype(wide)
        d = d.astype(cdt, copy=False)
    else:
        d = x.astype(cdt)
        if zero_point is not None:
            zp = _expand_param(np.asarray(zero_point), x.shape, axis, block_size, "x_zero_point").astype(cdt)
            if np.any(zp):
                d = d - zp
    d *= s.astype(cdt, copy=False)
    return d.astype(out_dtype, copy=False)


@op("DequantizeLinear", since=10)
class DequantizeLinear(Kernel):
    """DequantizeLinear: per-tensor, per-axis or blocked dequantization."""

    def setup(self):
        a = self.attrs
        self.axis = a.get("axis", 1)
        self.block_size = a.get("block_size", 0)
        self.out = _out_dtype_attr(a)

    def run(self, x, x_scale, x_zero_point=None):
        out = self.out
        if out is None:
            out = x_scale.dtype if x_scale.dtype.kind == "f" or x_scale.dtype == ml_dtypes.bfloat16 else _F32
        if x.dtype == np.int32 and x_zero_point is not None and np.any(x_zero_point):
            raise ValueError("DequantizeLinear: int32 input takes no (or a zero) zero point")
        if out == _F32 and not self.block_size:
            y = dequantize8(x, x_scale, x_zero_point, self.axis)
            if y is not None:
                return (y,)
        return (dequantize(x, x_scale, x_zero_point, out, axis=self.axis, block_size=self.block_size),)


def dynamic_range(x: np.ndarray):
    """DynamicQuantizeLinear's parameters: ``(x as float32, scale, zero point,
    saturates)``, the scale and the (rounded, float32) zero point taken from the data's
    range and 0; ``saturates`` is False where ``rint(x / scale)`` provably stays within
    ``[-zero point, 255 - zero point]``, so that the clip can be skipped: division by a
    positive scale and rounding are monotone, so the quotients' extremes are those of
    the data's extremes (about 1 % of values near the edges; NaN data clips). Data
    that is all zero, or empty, has scale 1 and zero point 0, as in onnxruntime."""
    xf = x.astype(_F32, copy=False)
    if x.size == 0:
        # the range of no values taken as [0, 0], as onnxruntime does: scale 1, zero point 0
        return xf, np.float32(1), np.float32(0), False
    extremes = native.float_range(xf)
    bottom, top = extremes if extremes is not None else (float(xf.min()), float(xf.max()))
    # Python floats with each result rounded to float32: a single +, - or / of two
    # float32 values done in double and rounded to float32 is the float32 operation's
    # own result (53 >= 2 * 24 + 2 bits), and a Python scalar costs a fraction of a
    # numpy one and of the error state the numpy path needs (9.5 -> 6.0 us on 8192
    # values, 3.5 of them the two passes). Non-finite or subnormal ranges take the
    # numpy path below.
    hi = top if top > 0.0 else 0.0
    lo = bottom if bottom < 0.0 else 0.0
    if hi != lo and hi - lo <= _F32_MAX:
        scale = _to_f32(_to_f32(hi - lo) / 255.0)
        if scale >= _F32_TINY:
            zp = round(min(max(_to_f32(-lo / scale), 0.0), 255.0))
            saturates = not (round(_to_f32(top / scale)) <= 255 - zp and round(_to_f32(bottom / scale)) >= -zp)
            return xf, np.float32(scale), np.float32(zp), saturates
    return (xf, *_dynamic_range_numpy(np.float32(top), np.float32(bottom)))


def _dynamic_range_numpy(top: np.float32, bottom: np.float32):
    """:func:`dynamic_range`'s ``(scale, zero point, saturates)`` in numpy float32
    scalars, for any extremes (NaN, infinities, subnormal scales)."""
    hi = max(np.float32(0), top)
    lo = min(np.float32(0), bottom)
    # an all-zero range has scale 1, as in onnxruntime (onnx.reference divides that 1
    # by 255 too, though its comment quotes onnxruntime's rule)
    scale = (hi - lo) / np.float32(255) if hi != lo else np.float32(1)
    with np.errstate(all="ignore"):
        zp = np.float32(0) - lo / scale
        if zp != zp:
            # 0 / 0 (a scale that underflowed) or inf / inf: onnxruntime clamps with
            # min(255, zp) first, which gives 255 for NaN
            return scale, np.float32(255), True
        # saturated and rounded half to even (Python's round) on the scalar, as
        # np.rint(np.clip(...)) would, without two ufunc calls on a scalar
        zp = np.float32(round(min(max(float(zp), 0.0), 255.0)))
        q_top, q_bottom = np.rint(top / scale), np.rint(bottom / scale)
    return scale, zp, not (q_top <= np.float32(255) - zp and q_bottom >= -zp)


def requantize(v: np.ndarray, zero_point, dtype, *, inplace: bool = False) -> np.ndarray:
    """Round ``v`` (already divided by the output scale) half to even, add the scalar
    zero point (``None`` or 0: none) and saturate to the integer ``dtype``;
    ``inplace`` rounds in ``v`` itself, which the caller no longer needs."""
    dtype = np.dtype(dtype)
    lo, hi = INT_RANGES[dtype]
    if inplace:
        np.rint(v, out=v)
    else:
        v = np.rint(v)
    if zero_point:
        v += v.dtype.type(zero_point)
    clip(v, lo, hi, out=v)
    return v.astype(dtype)


@op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(k, x):
    """Quantize to uint8 with a scale and zero point computed from the data range."""
    if x.ndim == 0:  # numpy's scalar results cannot take out=: as one value, reshaped back
        y, scale, zp = dynamic_quantize_linear(k, x.reshape(1))
        return y.reshape(()), scale, zp
    xf, scale, zp, saturates = dynamic_range(x)
    scale_a, zp_a = np.array(scale, dtype=_F32), np.array(zp, dtype=np.uint8)
    # the compiled pass: the same quotient, rounding, zero point and clip, in one pass
    # without the float32 temporaries (a 1024x1024 IS-Net layer's input is 256 MiB)
    y = quantize8(xf, scale_a, zp_a, np.dtype(np.uint8))
    if y is not None:
        return y, scale_a, zp_a
    y = np.rint(xf / scale)
    y += zp
    if saturates:
        clip(y, 0, 255, out=y)
    return y.astype(np.uint8), scale_a, zp_a


def _center(m: np.ndarray, zp, per_row: bool, dtype=_F64) -> np.ndarray:
    """``m - zp`` as float64 or float32 (both exact for 8- and 16-bit values); per-row
    zero points of a 1-D shape apply to the rows of ``m``."""
    if zp is None:
        return np.array(m, dtype=dtype)
    z = np.asarray(zp).astype(dtype)
    if z.size == 1:
        z = z.reshape(())
        if not z:
            return np.array(m, dtype=dtype)
        # one pass: the conversion and the subtraction together
        return np.subtract(m, z, dtype=dtype)
    v = np.array(m, dtype=dtype)
    if per_row and z.ndim == 1 and m.ndim >= 2:
        z = z.reshape(-1, 1)
    if np.broadcast_shapes(v.shape, z.shape) == v.shape:
        v -= z
        return v
    return v - z


def absmax(v: np.ndarray) -> float:
    """``max |v|`` (0 for an empty array)."""
    if not v.size:
        return 0.0
    return float(max(abs(float(v.max())), abs(float(v.min()))))


def centred_bound(dtype, zero_point) -> float | None:
    """A bound on ``|q - zero_point|`` from ``q``'s type alone (``None`` if not 8-bit
    integer), which spares a pass over the data."""
    rng = _BYTE_RANGES.get(dtype)
    if rng is None:
        return None
    lo, hi = rng
    if zero_point is None:
        return float(max(hi, -lo))
    if zero_point.size == 1:
        z = int(zero_point.reshape(()))
        return float(max(hi - z, z - lo))
    z = zero_point.astype(np.float64)
    return float(np.max(np.maximum(hi - z, z - lo)))


_BYTE_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


#: float32 holds every integer below this exactly
_F32_EXACT = float(1 << 24)
# below this chunk length, float64 beats several float32 products
_MIN_CHUNK = 32


def _k_slice(b: np.ndarray, k0: int, k1: int) -> np.ndarray:
    return b[k0:k1] if b.ndim == 1 else b[..., k0:k1, :]


def column_l1(b: np.ndarray) -> float:
    """The largest ``sum_k |b[k, n]|`` over the columns of ``b`` (``[..., K, N]``, or
    ``[K]``): times ``max |a|`` it bounds every partial sum of ``a @ b``, whatever the
    order. For real weights it is several times below ``K * max |b|``, so that one
    exact float32 product often covers a K that the element bound cuts in chunks."""
    if not b.size:
        return 0.0
    if b.ndim == 1:
        return float(np.abs(b).sum())
    return float(np.abs(b).sum(axis=-2).max())


def _single_f32(amax, bmax, bl1, k) -> bool:
    """Whether one float32 product ``a @ b`` over ``k`` keeps every partial sum exact,
    given ``|a| <= amax`` (None: unknown), ``|b| <= bmax`` and the columns' absolute
    sums of ``b`` at most ``bl1``."""
    if amax is None:
        return False
    if bl1 is not None and amax * bl1 < _F32_EXACT:
        return True
    return bmax is not None and amax * bmax * k < _F32_EXACT


def _int_matmul(a: np.ndarray, b: np.ndarray, amax: float | None = None, bmax: float | None = None,
                bl1: float | None = None) -> np.ndarray:
    """Exact integer product of two centred float operands, wrapped to int32.

    float32 operands are multiplied in float32 chunks of K that keep every partial sum
    below 2**24 (``amax``/``bmax`` bound ``|a|``/``|b|``, computed when not given;
    ``bl1``, when given, bounds ``b``'s :func:`column_l1`); float64 operands (or
    chunks too short to pay) in float64.
    """
    k = a.shape[-1]
    if a.dtype == _F32 and b.dtype == _F32:
        if _single_f32(amax, bmax, bl1, k):
            return matmul_nd(a, b).astype(np.int32)
        if bl1 is not None and amax is not None:
            # a type bound was too loose: the data's own range may do
            amax = absmax(a)
            if _single_f32(amax, bmax, bl1, k):
                return matmul_nd(a, b).astype(np.int32)
        per = (absmax(a) if amax is None else amax) * (absmax(b) if bmax is None else bmax)
        chunk = k if per == 0 else int((_F32_EXACT - 1) // per)
        if chunk < k and amax is not None and bl1 is None:
            # a type bound was too loose: the data's own range may allow longer chunks
            per = absmax(a) * (absmax(b) if bmax is None else bmax)
            chunk = k if per == 0 else int((_F32_EXACT - 1) // per)
        if chunk >= k:
            return matmul_nd(a, b).astype(np.int32)
        if chunk >= _MIN_CHUNK:
            acc = None
            for k0 in range(0, k, chunk):
                part = matmul_nd(a[..., k0 : k0 + chunk], _k_slice(b, k0, k0 + chunk)).astype(np.int32)
                if acc is None:
                    acc = part
                else:
                    acc += part  # int32 wraps, as the accumulator it models
            return acc
        a, b = a.astype(_F64), b.astype(_F64)
    if k < _EXACT_K:
        acc = matmul_nd(a, b).astype(np.int64)
    else:
        acc = np.matmul(a.astype(np.int64), b.astype(np.int64))
    return acc.astype(np.int32)


def int_matmul_f32(a: np.ndarray, b: np.ndarray, amax: float | None = None, bmax: float | None = None,
                   bl1: float | None = None) -> np.ndarray:
    """:func:`_int_matmul` as float32: the product itself when one float32 GEMM is
    exact (no int32 round trip), else the int32 accumulator converted as
    onnxruntime's requantization converts it (``float(int32)``)."""
    if a.dtype == _F32 and b.dtype == _F32 and _single_f32(amax, bmax, bl1, a.shape[-1]):
        return matmul_nd(a, b)
    return _int_matmul(a, b, amax, bmax, bl1).astype(_F32)


@op("MatMulInteger", since=10)
class MatMulInteger(Kernel):
    """MatMulInteger: int32 product of zero-point-adjusted 8-bit matrices."""

    def setup(self):
        c = self.node.constants
        self.b_packed = self.w8 = None
        self.b_const = 1 in c and (len(self.node.inputs) < 4 or not self.node.inputs[3] or 3 in c)
        if self.b_const:
            # B packed for the compiled 8-bit products, where this CPU has them; the
            # float32 centred B of the numpy path only where they do not take it, or
            # when a run first needs it
            self.w8 = native.pack_int8_weights(c[1], c.get(3))
            if self.w8 is None:
                self._centre_const_b()

    def _centre_const_b(self):
        """``(B centred as float32, its absmax, its column_l1)`` of the constant B, made once."""
        if self.b_packed is None:
            c = self.node.constants
            bp = _center(c[1], c.get(3), False, _F32)
            self.b_packed = (bp, absmax(bp), column_l1(bp))
        return self.b_packed

    def run(self, a, b, a_zero_point=None, b_zero_point=None):
        _check_matmul(a, b, "MatMulInteger")
        if self.w8 is not None and a.dtype in (np.uint8, np.int8) and (
                a_zero_point is None or a_zero_point.size == 1 and a_zero_point.dtype == a.dtype):
            y = native.int8_matmul(a, self.w8, 0 if a_zero_point is None else int(a_zero_point.reshape(())))
            if y is not None:
                return (y,)
        A = _center(a, a_zero_point, True, _F32)
        if self.b_const:
            B, bmax, bl1 = self._centre_const_b()
        else:
            B = _center(b, b_zero_point, False, _F32)
            bmax = bl1 = None
        return (_int_matmul(A, B, centred_bound(a.dtype, a_zero_point), bmax, bl1),)


def _check_matmul(a, b, name):
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{name}: inputs must have rank >= 1, got shapes {a.shape} and {b.shape}")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ValueError(f"{name}: inner dimensions differ: A {a.shape} and B {b.shape}")


def _row_param(p: np.ndarray, a: np.ndarray) -> np.ndarray:
    """A per-row scale or zero point of ``a``: a 1-D [M] vector applies to rows."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.ndim == 1 and a.ndim >= 2:
        return p.reshape(-1, 1)
    return p


def _scalar_zp(zp, dtype) -> int | None:
    """A per-tensor zero point of ``dtype`` as an int (0 when absent), else None."""
    if zp is None:
        return 0
    zp = np.asarray(zp)
    return int(zp.reshape(())) if zp.size == 1 and zp.dtype == dtype else None


def _batched_int8(a, a_zero_point, b, b_zero_point, mult, out: np.dtype, y_zero_point):
    """QLinearMatMul of two 8-bit tensors (B not constant: attention's Q K' and P V) by
    the compiled 8-bit product, B packed for each matrix of the batch; per-tensor
    scales and zero points, 8-bit out. None where the kernel does not take them."""
    if a.dtype not in _BYTE_DTYPES or b.dtype not in _BYTE_DTYPES or a.ndim < 2 or b.ndim < 2 \
            or mult.size != 1 or mult.dtype != _F32:
        return None
    k = native.K
    if k is None or not k.igemm_ready():
        return None
    za, zb, yz = _scalar_zp(a_zero_point, a.dtype), _scalar_zp(b_zero_point, b.dtype), _scalar_zp(y_zero_point, out)
    if za is None or zb is None or yz is None or not 1 <= b.shape[-2] <= native.INT8_MAX_K:
        return None
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    m, n = a.shape[-2], b.shape[-1]
    aa = np.broadcast_to(a, batch + a.shape[-2:]).reshape(-1, m, a.shape[-1])
    bb = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, b.shape[-2], n)
    y = np.empty((aa.shape[0], m, n), out)
    scale = np.ascontiguousarray(mult, _F32).reshape(1)
    kb = b.shape[-2]
    k4, npad = -(-kb // 4) * 4, -(-n // 32) * 32
    # B's zero point in the kernel's signed domain (uint8 shifted by -128), for its columns
    zbv = np.zeros(npad, np.int32)
    zbv[:n] = zb - 128 if b.dtype == np.uint8 else zb
    for i in range(aa.shape[0]):
        packed, colsum = np.empty(npad * k4, np.int8), np.empty(npad, np.int32)
        k.igemm_pack(np.ascontiguousarray(bb[i]), packed, colsum)
        w = native.Int8Weights(packed, zbv, colsum, kb, n)
        r = native.int8_matmul(aa[i], w, za, scale=scale, y_zero_point=yz, y_type=out.type)
        if r is None:
            return None
        y[i] = r
    return y.reshape(batch + (m, n))


@op("QLinearMatMul", since=10)
class QLinearMatMul(Kernel):
    """QLinearMatMul: matrix product of quantized tensors, requantized to ``y``'s type."""

    def setup(self):
        c = self.node.constants
        self.b_packed = None
        self.b_l1 = None
        # B packed for the compiled 8-bit products, where this CPU has them
        self.b_const = c.get(3)
        self.w8 = None
        if 3 in c and 5 in c:
            zp = np.asarray(c[5])  # (pack_int8_weights refuses a B or zero point it cannot take)
            self.w8 = native.pack_int8_weights(c[3], zp.reshape(-1) if zp.size > 1 else zp)
            if self.w8 is None:
                self._centre_const_b()
        # else the float32 centred B (four times the packed weight's memory) is made
        # only if a run needs the numpy path

    def _centre_const_b(self) -> bool:
        """The constant B centred as float32 for the numpy path, made once; whether B
        is constant."""
        if self.b_packed is None:
            c = self.node.constants
            if 3 not in c or 5 not in c:
                return False
            self.b_packed = self._centre_b(c[3], c[5])
            self.b_l1 = column_l1(self.b_packed)
        return True

    def _compiled(self, a, a_zero_point, b, mult, out, y_zero_point):
        """The product and its requantization by the compiled 8-bit kernel: 8-bit A with
        one zero point, the packed constant B, one float32 ratio or one a column, 8-bit
        out with one zero point; else None."""
        if self.w8 is None or b is not self.b_const or a.dtype not in (np.uint8, np.int8) or a.ndim == 0 \
                or out not in (np.dtype(np.uint8), np.dtype(np.int8)) or mult.dtype != _F32:
            return None
        if (a_zero_point is not None and np.asarray(a_zero_point).size != 1) or \
                (y_zero_point is not None and np.asarray(y_zero_point).size != 1):
            return None
        n = self.w8.n
        if mult.size == 1:
            scale = mult.reshape(1)
        elif mult.size == n and mult.shape[-1] == n:
            scale = np.ascontiguousarray(mult).reshape(n)
        else:
            return None  # a scale a row
        za = 0 if a_zero_point is None else int(np.asarray(a_zero_point).reshape(()))
        yz = 0 if y_zero_point is None else int(np.asarray(y_zero_point).reshape(()))
        return native.int8_matmul(a, self.w8, za, scale=scale, y_zero_point=yz, y_type=out.type)

    @staticmethod
    def _centre_b(b, b_zero_point):
        if b.dtype.kind in "iu":
            return _center(b, b_zero_point, False, _F32)
        return _center(b.astype(_F32), np.asarray(b_zero_point).astype(_F32), False)

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
        _check_matmul(a, b, "QLinearMatMul")
        sa = _row_param(a_scale, a)
        # the scale ratio is formed in the scales' own precision
        mult = (sa * np.asarray(b_scale)) / np.asarray(y_scale)
        out = a.dtype if y_zero_point is None else y_zero_point.dtype
        if b.dtype.kind in "iu" and out in _BYTE_RANGES:
            y = self._compiled(a, a_zero_point, b, mult, np.dtype(out), y_zero_point)
            if y is None and self.w8 is None:
                y = _batched_int8(a, a_zero_point, b, b_zero_point, mult, np.dtype(out), y_zero_point)
            if y is not None:
                return (y,)
        if a.dtype.kind in "iu":
            A = _center(a, _row_param(a_zero_point, a) if a_zero_point is not None else None, False, _F32)
        else:
            zp = None if a_zero_point is None else _row_param(a_zero_point.astype(_F32), a)
            A = _center(a.astype(_F32), zp, False)
        const = self._centre_const_b()
        B = self.b_packed if const else self._centre_b(b, b_zero_point)
        bl1 = self.b_l1 if const else None
        exact = a.dtype.kind in "iu" and b.dtype.kind in "iu"
        bounds = centred_bound(a.dtype, a_zero_point), centred_bound(b.dtype, b_zero_point)
        if exact and out in _BYTE_RANGES and mult.dtype == _F32 and None not in bounds:
            # 8-bit in and out with float32 scales: the accumulator times the float32
            # ratio, rounded, offset and saturated in float32 (onnxruntime's requantization)
            v = int_matmul_f32(A, B, *bounds, bl1)
            v *= mult
            np.rint(v, out=v)
            if y_zero_point is not None:
                v += np.asarray(y_zero_point).astype(_F32)
            lo, hi = _BYTE_RANGES[out]
            clip(v, lo, hi, out=v)
            return (v.astype(out),)
        if exact:
            acc = _int_matmul(A, B, *bounds, bl1).astype(_F64)
        else:
            acc = np.matmul(A.astype(_F64, copy=False), B.astype(_F64, copy=False))
        v = np.asarray(acc * mult.astype(_F64))
        if out in INT_RANGES:
            lo, hi = INT_RANGES[out]
            v = np.rint(v)
            if y_zero_point is not None:
                v += np.asarray(y_zero_point).astype(_F64)
            clip(v, lo, hi, out=v)
            return (v.astype(out),)
        if y_zero_point is not None:
            v = v + np.asarray(y_zero_point).astype(_F64)
        return (cast_array(v.astype(_F32), out, True),)
