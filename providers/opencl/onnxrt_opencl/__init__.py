"""onnxrt-opencl: the OpenCL execution provider for onnxrt.

``onnxrt.InferenceSession(model, providers=["OpenCLExecutionProvider", "CPUExecutionProvider"])``
runs the nodes this provider has kernels for on an OpenCL device (fusing chains of
elementwise nodes into one generated kernel each) and leaves the rest to the CPU.
Importing this package does not import pyopencl; the provider reports itself unavailable,
with the reason, where pyopencl or an OpenCL device is missing.
"""

from .provider import OpenCLDevice, OpenCLExecutionProvider

__all__ = ["OpenCLExecutionProvider", "OpenCLDevice"]
