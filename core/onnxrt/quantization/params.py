"""Scales and zero points from ranges, and the quantization of constant arrays.

The rules are onnxruntime's, so that the same range gives the same scale and zero
point: the range is widened to include 0 (so that 0 is exact, as padding and ReLU
need), a symmetric range is centred on 0 with a zero point in the middle of the
type, and a signed symmetric type leaves out its lowest value (int8 codes -127..127),
so that negating a code never overflows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument
from .types import QuantType, qtype_info

__all__ = ["QParams", "qrange", "scale_zero_point", "quantize_array", "quantize_weight", "quantize_bias"]


@dataclass
class QParams:
    """A tensor's quantization parameters: ``scale`` and ``zero_point`` (scalars, or
    1-D along ``axis`` for per-channel weights) and the integer type."""

    scale: np.ndarray
    zero_point: np.ndarray
    qtype: QuantType
    axis: int | None = None

    @property
    def per_channel(self) -> bool:
        """True when the parameters hold one value per channel."""
        return self.scale.ndim == 1


def qrange(qtype: QuantType, symmetric: bool = False, reduce_range: bool = False) -> tuple[int, int]:
    """The codes a quantized value may take: (qmin, qmax)."""
    _, _, qmin, qmax = qtype_info(qtype)
    if reduce_range:
        # 7 bits, as onnxruntime's reduce_range: room for the AVX2 u8s8 pair sums
        if qmin < 0:
            return (-64, 64)
        return (0, 127)
    if symmetric and qmin < 0:
        return (qmin + 1, qmax)
    return (qmin, qmax)


def scale_zero_point(rmin, rmax, qtype: QuantType, symmetric: bool = False,
                     reduce_range: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The scale (float32) and zero point (of ``qtype``) that map [rmin, rmax] onto the
    type's codes; elementwise for arrays of ranges (per-channel)."""
    qmin, qmax = qrange(qtype, symmetric, reduce_range)
    rmin = np.minimum(np.asarray(rmin, dtype=np.float64), 0.0)
    rmax = np.maximum(np.asarray(rmax, dtype=np.float64), 0.0)
    if not (np.all(np.isfinite(rmin)) and np.all(np.isfinite(rmax))):
        raise InvalidArgument(f"cannot quantize a range that is not finite: [{rmin}, {rmax}]")
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (rmax - rmin) / float(qmax - qmin)
    tiny = scale < np.finfo(np.float32).tiny
    scale = np.where(tiny, 1.0, scale)
    if symmetric:
        zp = np.full(scale.shape, np.round((qmin + qmax) / 2.0))
    else:
        zp = np.round(qmin - rmin / scale)
    zp = np.where(tiny, 0.0, zp)
    _, dt, tmin, tmax = qtype_info(qtype)
    return scale.astype(np.float32), np.clip(zp, tmin, tmax).astype(dt)


def quantize_array(x: np.ndarray, scale, zero_point, qtype: QuantType, axis: int | None = None,
                   qmin: int | None = None, qmax: int | None = None) -> np.ndarray:
    """``clip(rint(x / scale) + zero_point)`` in the codes of ``qtype`` (per-channel along
    ``axis`` when ``scale`` is 1-D), as ``QuantizeLinear`` computes it."""
    _, dt, tmin, tmax = qtype_info(qtype)
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.asarray(zero_point).astype(np.float32)
    if scale.ndim == 1 and axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    q = np.rint(x.astype(np.float32) / scale) + zp
    return np.clip(q, tmin if qmin is None else qmin, tmax if qmax is None else qmax).astype(dt)


def quantize_weight(w: np.ndarray, qtype: QuantType, symmetric: bool, per_channel: bool = False,
                    axis: int = 0, reduce_range: bool = False) -> tuple[np.ndarray, QParams]:
    """A constant quantized from its own range: (codes, parameters). Per channel, each
    slice along ``axis`` has its own range."""
    w = np.asarray(w, dtype=np.float32)
    if per_channel:
        if w.ndim == 0:
            raise InvalidArgument("per-channel quantization needs a weight of rank 1 or more")
        axis = axis % w.ndim
        others = tuple(i for i in range(w.ndim) if i != axis)
        rmin, rmax = w.min(axis=others), w.max(axis=others)
    else:
        axis = None
        rmin, rmax = (w.min(), w.max()) if w.size else (0.0, 0.0)
    scale, zp = scale_zero_point(rmin, rmax, qtype, symmetric, reduce_range)
    qmin, qmax = qrange(qtype, symmetric, reduce_range)
    q = quantize_array(w, scale, zp, qtype, axis, qmin, qmax)
    return q, QParams(scale, zp, qtype, axis)


def quantize_bias(b: np.ndarray, input_scale: np.ndarray, weight_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A bias as int32 codes of scale ``input_scale * weight_scale`` (zero point 0), the
    form integer convolutions and GEMMs add to their accumulator: (codes, scale)."""
    scale = (np.float32(input_scale) * np.asarray(weight_scale, dtype=np.float32)).astype(np.float32)
    # a zero weight scale (an all-zero channel) would divide by zero: its bias is exact as 0 codes
    safe = np.where(scale == 0, np.float32(1), scale)
    q = np.rint(np.asarray(b, dtype=np.float64) / safe.astype(np.float64))
    info = np.iinfo(np.int32)
    q = np.clip(q, info.min, info.max).astype(np.int32)
    return q, scale
