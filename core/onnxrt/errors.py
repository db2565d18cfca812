"""The error classes, named as onnxruntime names them.

Every error onnxrt raises on purpose derives from :class:`OnnxRtError`, so callers
can catch one base class. Each also derives from the closest built-in exception
(``InvalidArgument`` is a ``ValueError``) so generic handlers keep working.
"""

from __future__ import annotations

__all__ = [
    "OnnxRtError",
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "InvalidProtobuf",
    "InvalidGraph",
    "NotImplemented",
    "EPFail",
    "RuntimeException",
    "ModelLoaded",
    "EngineError",
]


class OnnxRtError(Exception):
    """Base class of every error onnxrt raises on purpose."""


class Fail(OnnxRtError, RuntimeError):
    """A generic failure (onnxruntime's ``FAIL``), e.g. a kernel that raised while running."""


class InvalidArgument(OnnxRtError, ValueError):
    """An argument or a feed was wrong: a missing input, a wrong dtype, rank or dimension."""


class NoSuchFile(OnnxRtError, FileNotFoundError):
    """A model or external-data file does not exist."""


class NoModel(OnnxRtError, ValueError):
    """No model was given."""


class InvalidProtobuf(OnnxRtError, ValueError):
    """The bytes are not a parseable ONNX ``ModelProto``."""


class InvalidGraph(OnnxRtError, ValueError):
    """The model parsed but its graph is malformed (cycles, undefined names, bad tensors)."""


class NotImplemented(OnnxRtError, NotImplementedError):  # noqa: A001 - onnxruntime's name
    """No provider has a kernel for an op, domain, opset or type the model needs."""


class EPFail(OnnxRtError, RuntimeError):
    """An execution provider could not be created or used."""


class RuntimeException(OnnxRtError, RuntimeError):
    """A run was stopped, e.g. by ``RunOptions.terminate``."""


class ModelLoaded(OnnxRtError, RuntimeError):
    """A model was loaded twice into one session."""


EngineError = OnnxRtError
