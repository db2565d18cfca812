"""The provider's kernels: one function per op, registered with explicit keys.

Each kernel is ``fn(k, *inputs, **attributes)``: inputs positional (device values),
attributes keyword-only with their ONNX defaults, and it returns the output (or a tuple
of outputs). ``since`` is the first opset the kernel implements; ``types`` restricts
the input types it accepts, by the schema's type-parameter name. A node the registry
has no kernel for is left to the next provider (in the end, the CPU provider), and
``session.get_provider_assignment()`` says why.

These kernels compute with numpy. On a real accelerator each one launches a device
kernel (or calls the vendor library) on the values ``{{Name}}Device.from_host`` made.
"""

from __future__ import annotations

import numpy as np
from onnxrt.plugin import KernelRegistry

__all__ = ["build_registry", "NUMERIC"]

#: the element types these kernels accept (no bool, string or bfloat16)
NUMERIC = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
           np.uint8, np.uint16, np.uint32, np.uint64]


def build_registry() -> KernelRegistry:
    """A new registry holding every kernel of the provider."""
    reg = KernelRegistry()

    # Add-7 onward broadcasts numpy-style (Add-1 and Add-6 used a ``broadcast`` attribute;
    # not claiming them leaves those old models to the CPU provider)
    @reg.op("Add", since=7, types={"T": NUMERIC})
    def add(k, a, b):
        return np.add(a, b)

    @reg.op("Mul", since=7, types={"T": NUMERIC})
    def mul(k, a, b):
        return np.multiply(a, b)

    @reg.op("Relu", since=6, types={"T": NUMERIC})
    def relu(k, x):
        return np.maximum(x, x.dtype.type(0))

    return reg
