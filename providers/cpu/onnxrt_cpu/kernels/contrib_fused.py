"""com.microsoft fused ops: FusedConv and FusedGemm, a Conv or Gemm followed by an
activation (and, for FusedConv, an optional residual ``Z`` added first).

These are the targets of onnxruntime's Conv+activation and Gemm+activation fusions,
so the activation names and their parameters follow onnxruntime: FusedConv takes
``activation_params`` (LeakyRelu: alpha; Clip: min, max; HardSigmoid: alpha, beta),
FusedGemm takes ``activation_alpha``/``activation_beta``/``activation_gamma``.
"""

from __future__ import annotations

import numpy as np

from ..registry import op
from .activation import _sigmoid, swish
from .conv import Conv
from .linalg import Gemm
from ..select import clamp, relu, where

__all__ = ["ACTIVATIONS", "FusedConv", "FusedGemm", "apply_activation"]


def _leaky(x, alpha=0.01):
    return where(x >= 0, x, x * x.dtype.type(alpha))


def _clip(x, lo=-np.inf, hi=np.inf):
    return clamp(x, lo, hi)


def _hard_sigmoid(x, alpha=0.2, beta=0.5):
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(
        x.dtype, copy=False
    )


def _hard_swish(x, offset=None, threshold=None):
    # ONNX's x * HardSigmoid(x, 1/6, 1/2); with activation_params (offset, threshold),
    # x * clip(x + offset, 0, threshold) / threshold in that order, as PaddlePaddle's
    # exports spell it (the optimizer fuses that pattern with its constants)
    if offset is None:
        return x * _hard_sigmoid(x, 1.0 / 6.0, 0.5)
    t = x + x.dtype.type(offset)
    np.clip(t, 0, x.dtype.type(threshold), out=t)
    t *= x
    t /= x.dtype.type(threshold)
    return t


def _quick_gelu(x, alpha=1.702):
    # x * sigmoid(alpha x), as the QuickGelu kernel computes it
    with np.errstate(over="ignore", invalid="ignore"):
        return swish(np, x, alpha)


def _elu(x, alpha=1.0):
    with np.errstate(over="ignore"):
        return np.where(x >= 0, x, x.dtype.type(alpha) * np.expm1(np.minimum(x, 0)))


def _thresholded(x, alpha=1.0):
    return np.where(x > x.dtype.type(alpha), x, 0).astype(x.dtype, copy=False)


def _scaled_tanh(x, alpha=1.0, beta=1.0):
    return x.dtype.type(alpha) * np.tanh(x * x.dtype.type(beta))


#: activation name -> (function, number of float parameters it reads)
ACTIVATIONS = {
    "Relu": (relu, 0),
    "Sigmoid": (lambda x: _sigmoid(np, x), 0),
    "Tanh": (np.tanh, 0),
    "LeakyRelu": (_leaky, 1),
    "Clip": (_clip, 2),
    "HardSigmoid": (_hard_sigmoid, 2),
    "HardSwish": (_hard_swish, 2),
    "QuickGelu": (_quick_gelu, 1),
    "Elu": (_elu, 1),
    "ThresholdedRelu": (_thresholded, 1),
    "ScaledTanh": (_scaled_tanh, 2),
}


#: activations applied in place on a convolution's output band (no temporary)
_INPLACE = {
    "Relu": lambda x: relu(x, out=x),
    "Clip": lambda x, lo=-np.inf, hi=np.inf: clamp(x, lo, hi, out=x),
}


class _InPlace:
    """FusedConv's activation applied in place to a part of the output, and its form
    for the compiled kernels, ``native``: ``(kind, lo, hi)`` (kind 1 Relu, 2 Clip to
    ``[lo, hi]``, 3 LeakyRelu of alpha ``lo``, 4 HardSigmoid and 5 HardSwish of alpha
    ``lo`` and beta ``hi``, 6 HardSwish as ``x * clip(x + lo, 0, hi) / hi``, 7 Sigmoid,
    8 QuickGelu of alpha ``lo``), or None for the activations only numpy applies."""

    __slots__ = ("name", "params", "inplace", "native")

    def __init__(self, name: str, params):
        self.name = name
        self.params = params
        self.inplace = _INPLACE.get(name)
        self.native = None
        if name == "Relu":
            self.native = (1, 0.0, 0.0)
        elif name == "Clip":
            bounds = (list(params[:2]) + [-np.inf, np.inf][len(params[:2]):])
            self.native = (2, float(bounds[0]), float(bounds[1]))
        elif name == "LeakyRelu":
            self.native = (3, float(params[0]), 0.0)
        elif name == "HardSigmoid":
            self.native = (4, float(params[0]), float(params[1]))
        elif name == "HardSwish":
            self.native = (6, float(params[0]), float(params[1])) if len(params) >= 2 else (5, 1.0 / 6.0, 0.5)
        elif name == "Sigmoid":
            self.native = (7, 0.0, 0.0)
        elif name == "QuickGelu":
            self.native = (8, float(params[0]) if params else 1.702, 0.0)

    def __call__(self, out: np.ndarray) -> None:
        if self.inplace is not None:
            self.inplace(out, *self.params[: ACTIVATIONS[self.name][1]])
        else:
            out[...] = apply_activation(self.name, out, self.params)


def apply_activation(name: str, x: np.ndarray, params) -> np.ndarray:
    """Apply onnxruntime's fused activation ``name`` with its parameters."""
    fn, count = ACTIVATIONS[name]
    return fn(x, *params[:count])


def _known_activation(node) -> str | None:
    name = node.attrs.get("activation", "")
    if name and name not in ACTIVATIONS:
        return f"activation {name!r} is not supported (known: {', '.join(sorted(ACTIVATIONS))})"
    return None


@op("FusedConv", since=1, domain="com.microsoft", accepts=_known_activation)
class FusedConv(Conv):
    """``activation(Conv(X, W, B) + Z)``."""

    def setup(self):
        super().setup()
        self.activation = self.attrs.get("activation", "")
        self.params = [float(p) for p in self.attrs.get("activation_params", [])]
        need = ACTIVATIONS[self.activation][1] if self.activation else 0
        # Clip's bounds, HardSwish's offset and threshold and QuickGelu's alpha may be
        # left out
        if self.activation not in ("", "Clip", "HardSwish", "QuickGelu") and len(self.params) < need:
            raise ValueError(
                f"{self.node.describe()}: {self.activation} needs {need} activation_params"
            )
        # one activation object for every call: the convolution keeps its compiled
        # call for it (Conv.forward)
        self._act = _InPlace(self.activation, self.params) if self.activation else None

    def run(self, x, w, b=None, z=None):
        if x.dtype in (np.float32, np.float64) and (z is None or z.dtype == x.dtype):
            # Z and the activation are applied band by band inside the convolution.
            return (self.forward(x, w, b, residual=z, activation=self._act),)
        (y,) = super().run(x, w, b)
        if z is not None:
            if z.shape != y.shape:
                raise ValueError(
                    f"{self.node.describe()}: Z has shape {z.shape}, the convolution gives {y.shape}"
                )
            y = y + z
        if self.activation:
            y = apply_activation(self.activation, y, self.params)
        return (y.astype(x.dtype, copy=False),)


@op("FusedGemm", since=1, domain="com.microsoft", accepts=_known_activation)
class FusedGemm(Gemm):
    """``activation(alpha * A' B' + beta * C)``."""

    def setup(self):
        super().setup()
        a = self.attrs
        self.activation = a.get("activation", "")
        self.params = [
            float(
                a.get(
                    "activation_alpha", 0.01 if self.activation == "LeakyRelu" else 1.0
                )
            ),
            float(a.get("activation_beta", 1.0)),
            float(a.get("activation_gamma", 0.0)),
        ]
        if self.activation == "HardSigmoid":
            self.params[:2] = [
                float(a.get("activation_alpha", 0.2)),
                float(a.get("activation_beta", 0.5)),
            ]
        if self.activation in ("Clip", "HardSwish", "QuickGelu"):
            raise ValueError(f"{self.node.describe()}: FusedGemm does not take {self.activation}")

    def run(self, a, b, c=None):
        (y,) = super().run(a, b, c)
        if self.activation:
            y = apply_activation(self.activation, y, self.params)
        return (y.astype(a.dtype, copy=False),)
