"""The CUDA provider's kernel registry, for any array namespace.

Two sources of kernels:

- the CPU provider's kernels listed in :data:`CPU_OPS`, each subclassed with
  ``xp = cupy``. Each was read for numpy-only calls on its data (``np.asarray``,
  host-side prepacking, ``np.empty_like`` fills) and is listed only when its data path
  goes through ``xp`` or through numpy ufuncs that CuPy arrays dispatch back to CuPy.
  Inputs that these kernels read on the host (shapes, axes, pads, split sizes) are
  named per op and arrive as host arrays;
- the provider's own kernels in :mod:`onnxrt_cuda.kernels`, where a GPU wants a
  different algorithm or the CPU kernel is not namespace-clean.

``build_registry(numpy)`` builds the same registry on the host: the tests use it to
check every kernel's arithmetic against the CPU provider without a GPU.
"""

from __future__ import annotations

import numpy as np
from onnxrt.plugin import KernelDef, KernelRegistry

from .kernels import KERNELS

__all__ = ["CPU_OPS", "build_registry"]

_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
_UNARY = ("Abs", "Neg", "Sign", "Reciprocal", "Floor", "Ceil", "Round", "Sqrt", "Exp", "Log", "Sin", "Cos",
          "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Tanh", "Asinh", "Acosh", "Atanh")
_ACTIVATIONS = ("Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus",
                "Softsign")

#: CPU-provider ops bound to the device namespace -> the input positions read on the host
CPU_OPS: dict[str, tuple[int, ...]] = {
    **{op: () for op in _UNARY + _ACTIVATIONS},
    **{op: (1,) for op in _REDUCE},
    "Add": (), "Sub": (), "Mul": (), "Div": (), "Where": (),
    "ArgMax": (), "ArgMin": (),
    "Identity": (), "Flatten": (), "Transpose": (), "Concat": (), "DepthToSpace": (), "SpaceToDepth": (),
    "Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "Expand": (1,), "Tile": (1,),
    "Slice": (1, 2, 3, 4), "Trilu": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
}


def _bind(cls, xp, host_inputs: tuple[int, ...]):
    """``cls`` computing with ``xp``: host arrays it returns (a shape it computed, a
    numpy scalar) move to the device, so every value a CUDA node makes is a device array."""
    inner = cls.run

    def run(self, *inputs):
        return tuple(xp.asarray(o) if isinstance(o, (np.ndarray, np.generic)) else o for o in inner(self, *inputs))

    return type(cls.__name__, (cls,), {"xp": xp, "host_inputs": frozenset(host_inputs), "run": run,
                                       "__module__": cls.__module__, "__doc__": cls.__doc__})


def build_registry(xp) -> KernelRegistry:
    """A registry of the CUDA provider's kernels computing with namespace ``xp``."""
    from onnxrt_cpu import kernels as cpu_kernels
    from onnxrt_cpu.registry import REGISTRY as CPU

    cpu_kernels.load_all()
    reg = KernelRegistry()
    own = {op for op, *_ in KERNELS}
    for d in CPU:
        if d.domain != "" or d.op_type not in CPU_OPS or d.op_type in own:
            continue
        reg.register(KernelDef(d.op_type, d.domain, d.since, d.end, _bind(d.cls, xp, CPU_OPS[d.op_type]), d.types,
                               d.accepts))
    for op, since, cls, accepts in KERNELS:
        reg.register(KernelDef(op, "", since, None, _bind(cls, xp, ()), None, accepts))
    return reg
