"""Logical and comparison ops: And, Or, Xor, Not and the elementwise comparisons.

All broadcast numpy-style; opset 1 nodes may carry the old ``broadcast``/``axis``
attributes, which are honoured. Comparisons return bool arrays.
"""

from __future__ import annotations

import numpy as np

from ..registry import op
from .math import legacy_broadcast

_COMPARE = {
    "Equal": "equal",
    "Greater": "greater",
    "Less": "less",
    "GreaterOrEqual": "greater_equal",
    "LessOrEqual": "less_equal",
}
_LOGIC = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}
_SINCE = {"GreaterOrEqual": 12, "LessOrEqual": 12}


def _operands(k, a, b):
    b = legacy_broadcast(k, a, b)
    if a.dtype != b.dtype and not (a.dtype.kind in "OUS" and b.dtype.kind in "OUS"):
        raise TypeError(f"{k.node.describe()}: input types differ ({a.dtype} and {b.dtype})")
    if a.dtype.kind == "V":  # bfloat16 and friends compare exactly as float32
        a, b = a.astype(np.float32), b.astype(np.float32)
    return a, b


def _register(name, fn):
    def kernel(k, a, b):
        a, b = _operands(k, a, b)
        return np.asarray(getattr(k.xp, fn)(a, b), dtype=np.bool_)

    kernel.__name__ = name
    kernel.__qualname__ = name
    kernel.__doc__ = f"ONNX {name}, elementwise with broadcasting; returns bool."
    op(name, since=_SINCE.get(name, 1))(kernel)


for _name, _fn in {**_COMPARE, **_LOGIC}.items():
    _register(_name, _fn)


@op("Not", since=1)
def not_(k, x):
    """ONNX Not."""
    return k.xp.logical_not(x)
