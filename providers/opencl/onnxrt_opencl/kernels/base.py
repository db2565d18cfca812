"""The base class of OpenCL kernels, and small helpers they share.

A kernel is built like any other, with its device: ``__init__(node_info, device)``
parses attributes in :meth:`~onnxrt.plugin.Kernel.setup`, then runs
:meth:`CLKernel.prepare`, which builds programs and uploads constant inputs
(``self.node.constants``) on the device's runtime, once. ``run`` receives
``pyopencl.array.Array`` inputs (``None`` for absent optional ones) and returns a tuple
of ``Array`` outputs. Kernels keep no per-run state on ``self``.
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
    """A kernel running on an OpenCL device (an :class:`~onnxrt_opencl.provider.OpenCLDevice`)."""

    def __init__(self, node, device=None):
        super().__init__(node, device)
        self.prepare()

    @property
    def rt(self):
        """The device's :class:`~onnxrt_opencl.runtime.CLRuntime`."""
        return self.device.rt

    def prepare(self) -> None:
        """Build programs and upload constant inputs. Called once, after :meth:`setup`."""

    def constant(self, i: int):
        """Input ``i`` as a host array when it is a constant initializer, else ``None``."""
        return self.node.constants.get(i)

    def run(self, *inputs):  # pragma: no cover - abstract
        """Compute the outputs on the device: a tuple of ``pyopencl.array.Array``."""
        raise NotImplementedError
