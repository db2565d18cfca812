"""Classification losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Inputs are ``(N, C, d1, ..., dk)`` scores with ``(N, d1, ..., dk)`` integer labels.
The per-element loss is gathered along the class axis in one vectorized step;
labels equal to ``ignore_index`` contribute zero loss and zero weight. Half
precision inputs are computed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np
from onnxrt.plugin.kernel import Kernel

from ..registry import op

__all__ = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]

_REDUCTIONS = ("none", "sum", "mean")


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return dt if dt.kind == "f" and dt.itemsize >= 4 else np.dtype(np.float32)


def _nll(desc, logp, target, weight, ignore_index, reduction, mean_ignored_count_all=False):
    """Weighted negative log likelihood of ``target`` under log-probabilities ``logp``."""
    if logp.ndim < 2:
        raise ValueError(f"{desc}: the input must have shape (N, C, ...), got {logp.shape}")
    n, c = logp.shape[:2]
    if target.shape != (n,) + logp.shape[2:]:
        raise ValueError(
            f"{desc}: target shape {target.shape} does not match input shape {logp.shape} "
            f"(expected {(n,) + logp.shape[2:]})"
        )
    tgt = target.astype(np.int64, copy=False)
    ignored = None if ignore_index is None else tgt == ignore_index
    bad = (tgt < 0) | (tgt >= c)
    if ignored is not None:
        bad &= ~ignored
    if bad.any():
        raise IndexError(
            f"{desc}: target value {int(tgt[bad].flat[0])} is out of range for {c} classes"
        )
    safe = tgt if ignored is None else np.where(ignored, 0, tgt)
    loss = -np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = None
    if weight is not None:
        if weight.shape != (c,):
            raise ValueError(f"{desc}: weight must have shape ({c},), got {weight.shape}")
        w = weight.astype(logp.dtype, copy=False)[safe]
        if ignored is not None:
            w[ignored] = 0
        loss *= w
    elif ignored is not None:
        loss[ignored] = 0
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum(dtype=logp.dtype)
    total = loss.sum(dtype=logp.dtype)
    if w is not None:
        denom = w.sum(dtype=logp.dtype)
    elif ignored is not None and not mean_ignored_count_all:
        denom = logp.dtype.type(loss.size - np.count_nonzero(ignored))
    else:
        denom = logp.dtype.type(loss.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / denom)


class _LossBase(Kernel):
    def setup(self):
        self.reduction = self.attrs.get("reduction", "mean")
        if self.reduction not in _REDUCTIONS:
            raise ValueError(f"{self.node.describe()}: unknown reduction {self.reduction!r}")
        ii = self.attrs.get("ignore_index")
        self.ignore_index = None if ii is None else int(ii)


@op("NegativeLogLikelihoodLoss", since=12)
class NegativeLogLikelihoodLoss(_LossBase):
    """Mean/sum/per-element negative log likelihood of class labels."""

    def run(self, x, target, weight=None):
        cdt = _compute_dtype(x.dtype)
        w = None if weight is None else weight.astype(cdt, copy=False)
        loss = _nll(self.node.describe(), x.astype(cdt, copy=False), target, w, self.ignore_index, self.reduction)
        return (np.asarray(loss).astype(x.dtype, copy=False),)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    z = x - m
    with np.errstate(divide="ignore"):
        z -= np.log(np.sum(np.exp(z), axis=axis, keepdims=True))
    return z


@op("SoftmaxCrossEntropyLoss", since=12)
class SoftmaxCrossEntropyLoss(_LossBase):
    """Cross entropy of ``softmax(scores)`` over axis 1 against class labels."""

    def run(self, scores, labels, weights=None):
        if scores.ndim < 2:
            raise ValueError(f"{self.node.describe()}: scores must have shape (N, C, ...), got {scores.shape}")
        cdt = _compute_dtype(scores.dtype)
        logp = _log_softmax(scores.astype(cdt, copy=False), 1)
        w = None if weights is None else weights.astype(cdt, copy=False)
        loss = _nll(self.node.describe(), logp, labels, w, self.ignore_index, self.reduction)
        loss = np.asarray(loss).astype(scores.dtype, copy=False)
        if len(self.node.outputs) > 1:
            return (loss, logp.astype(scores.dtype, copy=False))
        return (loss,)
