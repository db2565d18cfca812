"""Optimizer steps of the ``ai.onnx.preview.training`` domain: Adagrad, Adam, Momentum.

Each takes the learning rate ``R``, the update count ``T`` and, for ``n`` optimized
tensors, the ``n`` values, then the ``n`` gradients, then the optimizer states; it
returns the ``n`` new values followed by the new states. Every tensor is updated
independently (elementwise), in the dtype of the tensor.
"""

from __future__ import annotations

import numpy as np

from ..registry import op

__all__ = ["adagrad", "adam", "momentum"]

_DOMAIN = "ai.onnx.preview.training"


def _split(k, inputs, groups: int):
    """Split the variadic inputs into ``groups`` equal lists."""
    if len(inputs) % groups or not inputs:
        raise ValueError(
            f"{k.node.describe()}: expected {groups} equal groups of tensors after R and T, got {len(inputs)} inputs"
        )
    n = len(inputs) // groups
    return [list(inputs[i * n : (i + 1) * n]) for i in range(groups)]


def _scalar(k, v, name: str) -> float:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{k.node.describe()}: {name} must be a scalar, got shape {a.shape}")
    return a.reshape(()).item()


@op("Adagrad", since=1, domain=_DOMAIN)
def adagrad(k, R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    """One ADAGRAD step: outputs the new values, then the new accumulated squared gradients."""
    xs, gs, hs = _split(k, inputs, 3)
    r = _scalar(k, R, "R") / (1 + _scalar(k, T, "T") * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        dt = x.dtype.type
        g_reg = dt(norm_coefficient) * x + g
        h_new = h + g_reg * g_reg
        x_new = x - dt(r) * g_reg / (np.sqrt(h_new) + dt(epsilon))
        new_x.append(x_new.astype(x.dtype, copy=False))
        new_h.append(h_new.astype(h.dtype, copy=False))
    return tuple(new_x + new_h)


@op("Adam", since=1, domain=_DOMAIN)
def adam(k, R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    """One Adam step: outputs the new values, then the new first and second moments."""
    xs, gs, vs, hs = _split(k, inputs, 4)
    r = _scalar(k, R, "R")
    t = _scalar(k, T, "T")
    if t > 0:
        r = r * np.sqrt(1 - beta**t) / (1 - alpha**t)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        dt = x.dtype.type
        g_reg = dt(norm_coefficient) * x + g
        v_new = dt(alpha) * v + dt(1 - alpha) * g_reg
        h_new = dt(beta) * h + dt(1 - beta) * g_reg * g_reg
        x_new = x - dt(r) * v_new / (np.sqrt(h_new) + dt(epsilon))
        if norm_coefficient_post:
            x_new = dt(1 - norm_coefficient_post) * x_new
        new_x.append(x_new.astype(x.dtype, copy=False))
        new_v.append(v_new.astype(v.dtype, copy=False))
        new_h.append(h_new.astype(h.dtype, copy=False))
    return tuple(new_x + new_v + new_h)


@op("Momentum", since=1, domain=_DOMAIN)
def momentum(k, R, T, *inputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
    """One SGD-with-momentum step (standard or Nesterov): new values, then new momenta."""
    missing = [n for n, v in (("alpha", alpha), ("beta", beta), ("mode", mode), ("norm_coefficient", norm_coefficient)) if v is None]
    if missing:
        raise ValueError(f"{k.node.describe()}: missing required attribute(s) {', '.join(missing)}")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"{k.node.describe()}: mode must be 'standard' or 'nesterov', got {mode!r}")
    xs, gs, vs = _split(k, inputs, 3)
    r = _scalar(k, R, "R")
    beta_adj = beta if _scalar(k, T, "T") > 0 else 1.0
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        dt = x.dtype.type
        g_reg = dt(norm_coefficient) * x + g
        v_new = dt(alpha) * v + dt(beta_adj) * g_reg
        if mode == "nesterov":
            x_new = x - dt(r) * (g_reg + dt(alpha) * v_new)
        else:
            x_new = x - dt(r) * v_new
        new_x.append(x_new.astype(x.dtype, copy=False))
        new_v.append(v_new.astype(v.dtype, copy=False))
    return tuple(new_x + new_v)
