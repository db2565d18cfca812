"""The {{Name}} execution provider for onnxrt.

Installing this package is all a user needs: onnxrt finds the provider through the
``onnxrt.providers`` entry point declared in ``pyproject.toml``::

    import onnxrt as ort
    sess = ort.InferenceSession("model.onnx", providers=["{{Name}}ExecutionProvider", "CPUExecutionProvider"])
"""

from .provider import {{Name}}ExecutionProvider

__all__ = ["{{Name}}ExecutionProvider"]
