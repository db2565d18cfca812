"""Type conversion: Cast, CastLike and BitCast.

numpy and ``ml_dtypes`` do the numeric conversions. The ONNX-specific parts are:
saturation to the finite range of the float8 types (``saturate``, opset 19+),
conversion to ``float8e8m0`` with its ``round_mode``, and the textual forms used
when converting between strings and numbers.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
from onnx import TensorProto

from onnxrt.dtypes import np_dtype
from onnxrt.plugin.kernel import Kernel
from onnxrt.run.threads import current_thread_count

from .. import native
from ..registry import op

__all__ = ["cast_array", "Cast", "CastLike", "BitCast"]

_OBJ = np.dtype(object)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BOOL = np.dtype(bool)
_F16 = np.dtype(np.float16)
_U16 = np.dtype(np.uint16)

#: Elements from which float16 <-> float32 casts go to the compiled kernel (F16C
#: conversions, numpy's bits): numpy converts one value at a time, 3-8 ns each, and
#: the compiled call costs about a microsecond.
_CAST16_MIN = 512

#: float8 types whose out-of-range values saturate when ``saturate`` is set
SATURATING_F8 = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)

#: dtypes numpy itself knows nothing about; conversions between two of them, or
#: between one of them and bool, go through float32
_EXOTIC = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float8_e8m0fnu,
        ml_dtypes.float4_e2m1fn,
        ml_dtypes.float6_e2m3fn,
        ml_dtypes.float6_e3m2fn,
        ml_dtypes.int4,
        ml_dtypes.uint4,
        ml_dtypes.int2,
        ml_dtypes.uint2,
    )
)

_ROUND_MODES = ("up", "down", "nearest")


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or (dt in _EXOTIC and dt.name.startswith(("bfloat", "float")))


def _to_type_code(to) -> int:
    """Cast-1 names the target type as a string (``"FLOAT"``); later versions use the code."""
    if isinstance(to, str):
        try:
            return TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise ValueError(f"Cast: unknown target type {to!r}") from None
    return int(to)


# -- strings ------------------------------------------------------------------------


def _format_floats(x: np.ndarray) -> np.ndarray:
    """Numbers to text as ``%.8g``, with ``NaN``, ``INF`` and ``-INF`` for the specials."""
    v = x.astype(_F64)
    out = np.char.mod("%.8g", np.where(np.isfinite(v), v, 0.0)).astype(_OBJ)
    nan = np.isnan(v)
    if nan.any():
        out[nan] = "NaN"
    pinf = v == np.inf
    if pinf.any():
        out[pinf] = "INF"
    ninf = v == -np.inf
    if ninf.any():
        out[ninf] = "-INF"
    return out


def _to_string(x: np.ndarray) -> np.ndarray:
    dt = x.dtype
    if dt == _OBJ or dt.kind in "US":
        return x.astype(_OBJ)
    if dt == _BOOL:
        return np.where(x, "1", "0").astype(_OBJ)
    if _is_float(dt):
        return _format_floats(x)
    if dt in _EXOTIC:  # sub-byte integers
        x = x.astype(np.int8)
    if x.ndim == 0:
        return np.array(str(x.item()), dtype=_OBJ)
    return x.astype(str).astype(_OBJ)


# The longest number at the start of a string, as C's strtoll and strtod read it (and
# onnxruntime's Cast with them): "1e10" is the integer 1, "1e" the float 1, "0b1" 0,
# "0x1p4" 16.0; Python's int() and float() would take "1_000" whole, and
# float.fromhex bare hexadecimal ("ff").
_INT_PREFIX = re.compile(r"\s*([+-]?\d+)")
_FLOAT_PREFIX = re.compile(
    r"\s*([+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)


def _parse_int(s) -> int:
    m = _INT_PREFIX.match(s) if isinstance(s, str) else None
    if m is None:
        raise ValueError(f"Cast: cannot convert string {s!r} to an integer")
    return int(m.group(1))


def _parse_float(s) -> float:
    m = _FLOAT_PREFIX.match(s) if isinstance(s, str) else None
    if m is None:
        raise ValueError(f"Cast: cannot convert string {s!r} to a number")
    t = m.group(1)
    return float.fromhex(t) if "x" in t[:3].lower() else float(t)


def _parse_bool(s) -> bool:
    t = s.strip().lower() if isinstance(s, str) else s
    if t == "true":
        return True
    if t == "false":
        return False
    return _parse_float(s) != 0.0


def _from_string(x: np.ndarray, to: np.dtype, saturate: bool, round_mode: str) -> np.ndarray:
    flat = x.ravel().tolist()
    if to == _BOOL:
        vals = np.array([_parse_bool(s) for s in flat], dtype=_BOOL)
        return vals.reshape(x.shape)
    if to.kind in "iu":
        ints = [_parse_int(s) for s in flat]
        try:
            vals = np.array(ints, dtype=to)
        except OverflowError:
            # out-of-range integers wrap like any fixed-point conversion
            bits = 8 * to.itemsize
            vals = np.array([v & ((1 << bits) - 1) for v in ints], dtype=np.uint64).astype(to)
        return vals.reshape(x.shape)
    vals = np.array([_parse_float(s) for s in flat], dtype=_F64).reshape(x.shape)
    return cast_array(vals, to, saturate, round_mode)


# -- float8e8m0 -----------------------------------------------------------------------


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float8e8m0 holds only a biased power-of-two exponent, float32's own exponent
    field; the mantissa decides the rounding. The sign is ignored (negative inputs
    are undefined by the spec)."""
    if round_mode not in _ROUND_MODES:
        raise ValueError(f"Cast: round_mode must be one of {_ROUND_MODES}, got {round_mode!r}")
    bits = np.asarray(x, dtype=_F32).copy().view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.uint16)
    mant = bits & 0x7FFFFF
    special = exp == 0xFF
    if round_mode == "up":
        inc = mant != 0
    elif round_mode == "nearest":
        # ties (mantissa exactly 1.5) round up; subnormals need more than the half
        inc = (mant & 0x400000) != 0
        inc &= (exp > 0) | ((mant & 0x3FFFFF) != 0)
    else:
        inc = np.zeros(exp.shape, dtype=bool)
    inc &= ~special
    if saturate:
        inc &= exp != 0xFE
    exp = exp + inc
    if saturate:
        # infinities saturate to the largest exponent; NaN stays NaN
        is_inf = special & (mant == 0)
        exp = np.where(is_inf, np.uint16(0xFE), exp)
    return np.minimum(exp, 0xFF).astype(np.uint8).view(_E8M0)


# -- numeric --------------------------------------------------------------------------


def _astype(x: np.ndarray, to: np.dtype) -> np.ndarray:
    src = x.dtype
    if (src in _EXOTIC or to in _EXOTIC) and (
        (src in _EXOTIC and to in _EXOTIC) or src == _BOOL or to == _BOOL
    ):
        # ml_dtypes has no direct conversions between its own types or with bool
        mid = x.astype(_F32)
        if to == _BOOL:
            return mid != 0
        return mid.astype(to)
    if to in _EXOTIC and src.kind in "iu" and src.itemsize >= 4:
        x = x.astype(_F64)
    return x.astype(to)


def cast_array(x: np.ndarray, to: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """Convert ``x`` to ``to`` following the ONNX Cast rules.

    :param saturate: float8 targets clamp out-of-range values (and infinities) to the
        largest finite value instead of producing NaN/Inf.
    :param round_mode: rounding of float8e8m0 targets: ``up``, ``down`` or ``nearest``.
    """
    # numpy hands back scalars for 0-d operands; callers always get arrays
    return np.asarray(_cast(np.asarray(x), np.dtype(to), saturate, round_mode))


def _cast16_ready() -> bool:
    kern = native.K
    return kern is not None and hasattr(kern, "cast16_ready") and kern.cast16_ready()


_CAST16_READY = _cast16_ready()


def _cast16(x: np.ndarray, to: np.dtype) -> np.ndarray | None:
    """``x.astype(to)`` between float16 and float32 by the compiled kernel, bit for bit
    numpy's result (NaNs included), over the run's threads; None where it does not
    apply (not loaded, the CPU lacks F16C, a small or non-contiguous array)."""
    kern = native.K
    if kern is None or not _CAST16_READY or x.size < _CAST16_MIN or not x.flags.c_contiguous:
        return None
    y = np.empty(x.shape, to)
    if to == _F16:
        kern.cast_f32_f16(x, y.view(_U16), current_thread_count())
    else:
        kern.cast_f16_f32(x.view(_U16), y, current_thread_count())
    return y


def _cast(x: np.ndarray, to: np.dtype, saturate: bool, round_mode: str):
    src = x.dtype
    if (src == _F32 and to == _F16) or (src == _F16 and to == _F32):
        y = _cast16(x, to)
        if y is not None:
            return y
    if to == _OBJ:
        return _to_string(x)
    if src == _OBJ or src.kind in "US":
        return _from_string(x, to, saturate, round_mode)
    if src == to and not (saturate and to.name == "float8_e5m2"):
        # e5m2 is the one float8 type with infinities, which saturation clamps
        return x.copy()
    if src.kind in "biu" and (to.kind in "biu" or to.kind == "f" and to.itemsize >= 4) and to not in _EXOTIC:
        # integers and booleans convert to these without the warnings the error state
        # silences (float16 can overflow); the state costs more than a small Cast (a
        # mask's int64 -> float32 at 8 x 32)
        return x.astype(to)
    with np.errstate(invalid="ignore", over="ignore"):
        if to == _E8M0:
            return _to_e8m0(_astype(x, _F32) if src != _F32 else x, saturate, round_mode)
        if to in SATURATING_F8 and saturate:
            if not _is_float(src) or src in _EXOTIC:
                x = _astype(x, _F32)
            fi = ml_dtypes.finfo(to)
            x = np.clip(x, x.dtype.type(float(fi.min)), x.dtype.type(float(fi.max)))
        return _astype(x, to)


def _check_saturate(k) -> tuple[bool, str]:
    saturate = bool(k.attrs.get("saturate", 1))
    round_mode = k.attrs.get("round_mode", "up")
    if round_mode not in _ROUND_MODES:
        raise ValueError(f"{k.node.describe()}: round_mode must be one of {_ROUND_MODES}, got {round_mode!r}")
    return saturate, round_mode


@op("Cast", since=1)
class Cast(Kernel):
    """Cast: convert every element to the type named by ``to``."""

    def setup(self):
        if "to" not in self.attrs:
            raise ValueError(f"{self.node.describe()}: attribute 'to' is required")
        self.to = np_dtype(_to_type_code(self.attrs["to"]))
        self.saturate, self.round_mode = _check_saturate(self)

    def run(self, x):
        return (cast_array(np.asarray(x), self.to, self.saturate, self.round_mode),)


@op("CastLike", since=15)
class CastLike(Kernel):
    """CastLike: convert ``input`` to the element type of ``target_type``."""

    def setup(self):
        self.saturate, self.round_mode = _check_saturate(self)

    def run(self, x, target_type):
        return (cast_array(np.asarray(x), np.asarray(target_type).dtype, self.saturate, self.round_mode),)


def _bit_width(dt: np.dtype) -> int:
    if dt in _EXOTIC:
        return int(ml_dtypes.finfo(dt).bits) if _is_float(dt) else int(ml_dtypes.iinfo(dt).bits)
    return dt.itemsize * 8


@op("BitCast", since=26)
class BitCast(Kernel):
    """BitCast: reinterpret the bits of each element as another type of the same width."""

    def setup(self):
        if "to" not in self.attrs:
            raise ValueError(f"{self.node.describe()}: attribute 'to' is required")
        self.to = np_dtype(int(self.attrs["to"]))
        if self.to == _OBJ:
            raise ValueError(f"{self.node.describe()}: BitCast cannot produce strings")

    def run(self, x):
        x = np.asarray(x)
        src, to = x.dtype, self.to
        if src == _OBJ:
            raise ValueError("BitCast: string tensors cannot be bit-cast")
        wa, wb = _bit_width(src), _bit_width(to)
        if wa != wb:
            raise ValueError(f"BitCast: {src} is {wa} bits wide but {to} is {wb}; widths must match")
        if not x.flags.c_contiguous:
            x = x.copy()
        if src == to:
            return (x.copy(),)
        if wa < 8:
            # sub-byte values live in the low bits of one byte each
            return ((x.view(np.uint8) & np.uint8((1 << wa) - 1)).view(to),)
        if to == _BOOL:
            return (x.view(np.uint8) != 0,)
        return (x.view(to),)
