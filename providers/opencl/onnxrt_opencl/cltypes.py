"""numpy dtypes and the OpenCL C types that store them."""

from __future__ import annotations

import numpy as np

__all__ = ["ctype"]

#: numpy dtype -> OpenCL C type for buffers (bool is stored as one byte)
_CTYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.float16): "half",
    np.dtype(np.int8): "char",
    np.dtype(np.uint8): "uchar",
    np.dtype(np.int16): "short",
    np.dtype(np.uint16): "ushort",
    np.dtype(np.int32): "int",
    np.dtype(np.uint32): "uint",
    np.dtype(np.int64): "long",
    np.dtype(np.uint64): "ulong",
    np.dtype(np.bool_): "uchar",
}


def ctype(dtype) -> str:
    """The OpenCL C type storing ``dtype`` (``KeyError`` for types OpenCL has not)."""
    return _CTYPES[np.dtype(dtype)]
