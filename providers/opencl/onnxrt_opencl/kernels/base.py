"""The base class of OpenCL kernels, and small helpers they share.

A kernel is built like any other (``__init__(node_info)`` parses attributes in
:meth:`~onnxrt.plugin.kernel.Kernel.setup`), then the provider calls :meth:`CLKernel.bind` with
the :class:`~onnxrt_opencl.runtime.CLRuntime`, which runs :meth:`CLKernel.prepare`: build
programs and upload constant inputs (``self.node.constants``) there, once. ``run``
receives ``pyopencl.array.Array`` inputs (``None`` for absent optional ones) and returns a
tuple of ``Array`` outputs. Kernels keep no per-run state on ``self``.
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.kernel import Kernel

from ..cltypes import ctype

__all__ = ["CLKernel", "FLOAT_TYPES", "INDEX_TYPES", "ctype"]

#: the float types kernels take (the provider refuses float64 nodes on devices without it)
FLOAT_TYPES = (np.float32, np.float64)
#: index and shape types
INDEX_TYPES = (np.int64, np.int32)


class CLKernel(Kernel):
    """A kernel running on an OpenCL device.

    :ivar rt: the :class:`~onnxrt_opencl.runtime.CLRuntime`, set by :meth:`bind`.
    """

    rt = None

    def bind(self, rt) -> "CLKernel":
        """Attach the runtime and call :meth:`prepare`; returns ``self``."""
        self.rt = rt
        self.prepare()
        return self

    def prepare(self) -> None:
        """Build programs and upload constant inputs. Called once, after :meth:`bind`."""

    def constant(self, i: int):
        """Input ``i`` as a host array when it is a constant initializer, else ``None``."""
        return self.node.constants.get(i)

    def run(self, *inputs):  # pragma: no cover - abstract
        """Compute the outputs on the device: a tuple of ``pyopencl.array.Array``."""
        raise NotImplementedError
