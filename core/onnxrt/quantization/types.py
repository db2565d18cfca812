"""The enumerations of ``onnxrt.quantization``, with onnxruntime's names and values.

Scripts written for ``onnxruntime.quantization`` pass these by name
(``QuantType.QInt8``); the values match onnxruntime's, so a value stored in a
configuration file means the same thing in both.
"""

from __future__ import annotations

from enum import Enum

import numpy as np
from onnx import TensorProto

from ..errors import InvalidArgument

__all__ = ["QuantFormat", "QuantType", "CalibrationMethod", "qtype_info"]


class QuantFormat(Enum):
    """How a statically quantized model is written.

    - ``QOperator``: integer operators (``QLinearConv``, ``QLinearMatMul``, ``QGemm``, ...);
    - ``QDQ``: the float operators kept, with ``QuantizeLinear``/``DequantizeLinear``
      pairs around them (the format most runtimes fuse).
    """

    QOperator = 0
    QDQ = 1

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def from_string(fmt: str) -> "QuantFormat":
        """``"QDQ"`` or ``"QOperator"`` (any case)."""
        for f in QuantFormat:
            if f.name.lower() == str(fmt).lower():
                return f
        raise InvalidArgument(f"unknown quant_format {fmt!r}; expected QDQ or QOperator")


class QuantType(Enum):
    """The integer type of quantized weights or activations."""

    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def from_string(t: str) -> "QuantType":
        """``"QInt8"``, ``"int8"``, ``"QUInt8"``, ``"uint8"``, ... (any case)."""
        key = str(t).lower()
        for q in QuantType:
            if key in (q.name.lower(), q.name.lower()[1:]):
                return q
        raise InvalidArgument(f"unknown quantization type {t!r}; expected one of "
                              f"{', '.join(q.name for q in _SUPPORTED)}")

    @property
    def tensor_type(self) -> int:
        """The ONNX ``TensorProto`` element type."""
        return qtype_info(self)[0]


class CalibrationMethod(Enum):
    """How calibration turns the observed activations into a range.

    - ``MinMax``: the smallest and largest value seen (optionally a moving average);
    - ``Entropy``: the clipping threshold whose quantized histogram has the least
      KL divergence from the observed one;
    - ``Percentile``: the range holding the given percentile of the values.
    """

    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3

    @staticmethod
    def from_string(m: str) -> "CalibrationMethod":
        """``"MinMax"``, ``"Entropy"`` or ``"Percentile"`` (any case)."""
        for c in CalibrationMethod:
            if c.name.lower() == str(m).lower():
                return c
        raise InvalidArgument(f"unknown calibrate_method {m!r}; expected MinMax, Entropy or Percentile")


#: (ONNX element type, numpy dtype, qmin, qmax) of the types this package writes.
_INFO = {
    QuantType.QInt8: (TensorProto.INT8, np.dtype(np.int8), -128, 127),
    QuantType.QUInt8: (TensorProto.UINT8, np.dtype(np.uint8), 0, 255),
    QuantType.QInt16: (TensorProto.INT16, np.dtype(np.int16), -32768, 32767),
    QuantType.QUInt16: (TensorProto.UINT16, np.dtype(np.uint16), 0, 65535),
}
_SUPPORTED = tuple(_INFO)


def as_quant_type(value, what: str) -> QuantType:
    """``value`` (a :class:`QuantType` or its name) as a supported :class:`QuantType`."""
    q = value if isinstance(value, QuantType) else QuantType.from_string(value)
    if q not in _INFO:
        raise InvalidArgument(f"{what}={q.name} is not supported; onnxrt.quantization writes "
                              f"{', '.join(t.name for t in _SUPPORTED)}")
    return q


def qtype_info(q: QuantType) -> tuple[int, np.dtype, int, int]:
    """(ONNX element type, numpy dtype, qmin, qmax) of a supported :class:`QuantType`."""
    try:
        return _INFO[q]
    except KeyError:
        raise InvalidArgument(f"quantization type {q} is not supported") from None
