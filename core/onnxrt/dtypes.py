"""Mapping between ONNX element types and numpy dtypes.

numpy lacks bfloat16, the float8 family, int4/uint4, float4 and int2; ``ml_dtypes``
provides them, and onnx's own ``helper.tensor_dtype_to_np_dtype`` already maps to them.
Strings are numpy ``object`` arrays holding ``str``.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

__all__ = [
    "np_dtype",
    "onnx_elem_type",
    "elem_type_name",
    "type_string",
    "FLOAT_TYPES",
    "INTEGER_TYPES",
]

_NP_BY_ELEM: dict[int, np.dtype] = {}
_ELEM_BY_NP: dict[np.dtype, int] = {}
for _name, _code in TensorProto.DataType.items():
    if _code == TensorProto.UNDEFINED:
        continue
    try:
        _dt = np.dtype(helper.tensor_dtype_to_np_dtype(_code))
    except Exception:  # pragma: no cover - a type this onnx build cannot map
        continue
    _NP_BY_ELEM[_code] = _dt
    # object is STRING; keep the first mapping for each numpy dtype (the canonical one)
    _ELEM_BY_NP.setdefault(_dt, _code)
_ELEM_BY_NP[np.dtype(object)] = TensorProto.STRING
# numpy's unicode/bytes arrays are strings too
_STR_KINDS = ("U", "S", "O")

FLOAT_TYPES = frozenset(
    np.dtype(t) for t in (np.float16, np.float32, np.float64)
)
INTEGER_TYPES = frozenset(
    np.dtype(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)


def np_dtype(elem_type: int) -> np.dtype:
    """Return the numpy dtype for an ONNX ``TensorProto.DataType`` code."""
    try:
        return _NP_BY_ELEM[elem_type]
    except KeyError:
        raise TypeError(f"unsupported ONNX element type {elem_type}") from None


def onnx_elem_type(dtype) -> int:
    """Return the ONNX ``TensorProto.DataType`` code for a numpy dtype."""
    dt = np.dtype(dtype)
    if dt.kind in _STR_KINDS:
        return TensorProto.STRING
    try:
        return _ELEM_BY_NP[dt]
    except KeyError:
        raise TypeError(f"numpy dtype {dt} has no ONNX element type") from None


def elem_type_name(elem_type: int) -> str:
    """Return onnxruntime's name for an element type, e.g. ``float`` or ``int64``."""
    name = TensorProto.DataType.Name(elem_type).lower()
    return {"float": "float", "double": "double", "string": "string", "bool": "bool"}.get(name, name)


def type_string(elem_type: int) -> str:
    """onnxruntime's ``NodeArg.type`` string for a tensor, e.g. ``tensor(float)``."""
    return f"tensor({elem_type_name(elem_type)})"
