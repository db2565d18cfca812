"""Quantization and float16 conversion, with onnxruntime's signatures, without onnxruntime.

``from onnxrt.quantization import quantize_dynamic, quantize_static, QuantType, ...``
runs scripts written for ``onnxruntime.quantization``; calibration runs on onnxrt
sessions (any provider, optionally in parallel on Dask or Ray). The models written are
standard ONNX (QDQ, QOperator with onnxruntime's com.microsoft ops, float16) that
onnxruntime loads too.

- :func:`quantize_static` (:mod:`.static`), :func:`quantize_dynamic` (:mod:`.dynamic`);
- :class:`CalibrationDataReader`, :class:`NumpyDataReader`, :func:`collect_ranges`
  (:mod:`.calibrate`);
- :func:`convert_float_to_float16` (:mod:`.float16`) and
  :func:`auto_convert_mixed_precision` (:mod:`.mixed_precision`).
"""

from .calibrate import CalibrationDataReader, NumpyDataReader, collect_ranges
from .dynamic import quantize_dynamic
from .float16 import convert_float_to_float16
from .mixed_precision import MixedPrecisionReport, auto_convert_mixed_precision, auto_mixed_precision
from .report import QuantizationReport
from .static import quantize_static
from .types import CalibrationMethod, QuantFormat, QuantType

__all__ = [
    "quantize_static",
    "quantize_dynamic",
    "CalibrationDataReader",
    "NumpyDataReader",
    "collect_ranges",
    "QuantFormat",
    "QuantType",
    "CalibrationMethod",
    "QuantizationReport",
    "convert_float_to_float16",
    "auto_convert_mixed_precision",
    "auto_mixed_precision",
    "MixedPrecisionReport",
]
