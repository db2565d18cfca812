"""Normalization: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LpNormalization, LRN, MeanVarianceNormalization.

Statistics are computed in float32 at least (float16/bfloat16 inputs are upcast,
float64 stays float64) and results are cast back to the input's type. Inference
BatchNormalization folds its four parameter vectors into one scale and one shift.
"""

from __future__ import annotations

import math

import numpy as np

from onnxrt.dtypes import np_dtype
from onnxrt.plugin.kernel import Kernel

from .. import native
from ..registry import op
from ..rows import broadcast_buffer, row_mean, row_op


def _work_dtype(*dts) -> np.dtype:
    """float64 if any of ``dts`` is float64, else float32."""
    return np.dtype(np.float64) if any(np.dtype(d) == np.float64 for d in dts) else np.dtype(np.float32)


def _stash_dtype(stash_type: int, x_dtype) -> np.dtype:
    """Compute type for a ``stash_type`` attribute: never narrower than the input's float."""
    st = np.dtype(np_dtype(stash_type)) if stash_type else np.dtype(np.float32)
    if st.itemsize < 4:
        st = np.dtype(np.float32)
    return _work_dtype(st, x_dtype)


def _channel_param(p, x, cdt, name):
    """Reshape a per-channel parameter to broadcast over ``x`` ``[N, C, ...]``.

    A 1-D parameter of length C is per channel; a parameter shaped like ``x.shape[1:]``
    (the pre-opset-9 non-spatial form) is per activation.
    """
    p = np.asarray(p).astype(cdt, copy=False)
    c = x.shape[1] if x.ndim > 1 else 1
    if p.ndim == 1 and p.shape[0] == c:
        return p.reshape((c,) + (1,) * max(0, x.ndim - 2))
    if p.shape == x.shape[1:]:
        return p
    if p.size == 1:
        return p.reshape(())
    raise ValueError(f"{name} has shape {p.shape}, expected ({c},) for input of shape {x.shape}")


@op("BatchNormalization", since=1)
class BatchNormalization(Kernel):
    """Batch normalization in inference form, or training form (batch statistics and
    updated running statistics) when ``training_mode`` is set (opset 14+) or, before
    opset 14, when the node asks for its statistics outputs."""

    def setup(self):
        a = self.attrs
        self.eps = float(a.get("epsilon", 1e-5))
        self.momentum = float(a.get("momentum", 0.9))
        n_out = sum(1 for o in self.node.outputs if o)
        if self.node.opset >= 14:
            self.training = bool(a.get("training_mode", 0))
        else:
            self.training = n_out > 1 and not a.get("is_test", 0)
        self._folded = None
        self._last_fold = None
        c = self.node.constants
        if not self.training and all(i in c for i in (1, 2, 3, 4)):
            self._folded = self._fold(c[1], c[2], c[3], c[4], _work_dtype(c[1].dtype, c[3].dtype))

    def _fold(self, scale, b, mean, var, cdt):
        a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + self.eps)
        shift = b.astype(np.float64) - mean.astype(np.float64) * a
        return a.astype(cdt), shift.astype(cdt)

    def run(self, x, scale, b, mean, var):
        if x.ndim < 2:
            x2 = x.reshape(1, -1)
        else:
            x2 = x
        cdt = _work_dtype(x.dtype)
        if self.training:
            return self._train(x, x2, scale, b, mean, var, cdt)
        if self._folded is not None:
            a, s = self._folded
        else:
            # Parameters that are not constants (initializers listed as graph inputs,
            # which a feed may override) are the session's own read-only arrays on
            # every run that does not feed them: their fold is kept while the very
            # same arrays come back. Writeable (fed) arrays are folded every time,
            # since a caller may change one in place between runs.
            params = (scale, b, mean, var)
            last = self._last_fold
            if (last is not None and last[1] == cdt and all(p is q for p, q in zip(last[0], params))):
                a, s = last[2]
            else:
                a, s = self._fold(scale, b, mean, var, cdt)
                if not any(p.flags.writeable for p in params):
                    self._last_fold = (params, cdt, (a, s))
        a = _channel_param(a, x2, cdt, "scale")
        s = _channel_param(s, x2, cdt, "B")
        y = native.channel_affine(x2, a, s) if x2.dtype == cdt else None
        if y is not None:
            y = y.reshape(x.shape)
            if self.node.opset < 14 and len(self.node.outputs) > 1:
                return (y, mean.copy(), var.copy(), mean.copy(), var.copy())[: len(self.node.outputs)]
            return (y,)
        with broadcast_buffer(x2.shape, x2.shape, a.shape, s.shape):
            y = x2.astype(cdt, copy=False) * a
            y += s
        y = y.reshape(x.shape).astype(x.dtype, copy=False)
        if self.node.opset < 14 and len(self.node.outputs) > 1:
            # Inference with statistics outputs requested: they pass through.
            return (y, mean.copy(), var.copy(), mean.copy(), var.copy())[: len(self.node.outputs)]
        return (y,)

    def _train(self, x, x2, scale, b, mean, var, cdt):
        axes = (0,) + tuple(range(2, x2.ndim))
        xc = x2.astype(cdt, copy=False)
        bm = xc.mean(axis=axes)
        d = xc - bm.reshape((-1,) + (1,) * (x2.ndim - 2))
        bv = np.mean(d * d, axis=axes)
        inv = 1.0 / np.sqrt(bv + cdt.type(self.eps))
        y = d * _channel_param(inv * scale.astype(cdt), x2, cdt, "scale")
        y += _channel_param(b, x2, cdt, "B")
        y = y.reshape(x.shape).astype(x.dtype, copy=False)
        mdt = mean.dtype
        m = self.momentum
        run_mean = (mean.astype(cdt) * cdt.type(m) + bm * cdt.type(1 - m)).astype(mdt)
        run_var = (var.astype(cdt) * cdt.type(m) + bv * cdt.type(1 - m)).astype(var.dtype)
        if self.node.opset >= 14:
            return (y, run_mean, run_var)
        return (y, run_mean, run_var, bm.astype(mdt), bv.astype(var.dtype))[: len(self.node.outputs)]


def _normalize(xc, axes, eps):
    """``(x - mean) / sqrt(var + eps)`` over ``axes``, with the mean and 1/std (keepdims)."""
    last = axes in (-1, xc.ndim - 1)
    mean = row_mean(xc) if last else xc.mean(axis=axes, keepdims=True)
    per_row = broadcast_buffer(xc.shape, xc.shape, mean.shape)
    with per_row:
        d = xc - mean
    sq = d * d
    var = row_mean(sq) if last else np.mean(sq, axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + xc.dtype.type(eps))
    with per_row:
        d *= inv
    return d, mean, inv


@op("InstanceNormalization", since=1)
def instance_normalization(k, x, scale, b, *, epsilon=1e-5):
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
    cdt = _work_dtype(x.dtype)
    y, _, _ = _normalize(x.astype(cdt, copy=False), tuple(range(2, x.ndim)), epsilon)
    y *= _channel_param(scale, x, cdt, "scale")
    y += _channel_param(b, x, cdt, "B")
    return y.astype(x.dtype, copy=False)


def _norm_axis(axis, rank):
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# since opset 1, as in onnxruntime, which defines LayerNormalization in the default domain
# before ONNX did (opset 17) and fuses the decomposed form into it at any opset
@op("LayerNormalization", since=1)
class LayerNormalization(Kernel):
    """Normalization over axes ``[axis, rank)``, with optional Mean and InvStdDev outputs."""

    def setup(self):
        a = self.attrs
        self.axis = int(a.get("axis", -1))
        self.eps = float(a.get("epsilon", 1e-5))
        self.stash = int(a.get("stash_type", 1))
        self.n_out = len(self.node.outputs)

    def run(self, x, scale, b=None):
        axis = _norm_axis(self.axis, x.ndim)
        done = self._compiled(x, scale, b, axis)
        if done is not None:
            return done
        cdt = _stash_dtype(self.stash, x.dtype)
        lead = x.shape[:axis]
        rows = math.prod(lead)
        xc = x.astype(cdt, copy=False).reshape(rows, math.prod(x.shape[axis:]))
        y, mean, inv = _normalize(xc, 1, self.eps)
        y = y.reshape(x.shape)
        y = y.astype(x.dtype, copy=False) if x.dtype != cdt else y
        # (y is this run's own array: scaled in place where the result keeps its type)
        scaled = row_op(np.multiply, y, scale)
        y = scaled if scaled is not None else y * scale
        if b is not None and row_op(np.add, y, b) is None:
            y += b
        y = y.astype(x.dtype, copy=False)
        if self.n_out == 1:
            return (y,)
        udt = np.dtype(np_dtype(self.stash)) if self.stash else np.dtype(np.float32)
        st_shape = lead + (1,) * (x.ndim - axis)
        return (y, mean.reshape(st_shape).astype(udt), inv.reshape(st_shape).astype(udt))[: self.n_out]

    def _compiled(self, x, scale, b, axis):
        """The compiled kernel's result for float32 statistics of float32 rows, where
        ``scale`` and ``b`` hold one value a normalized position; else None."""
        if x.dtype != np.float32 or self.stash not in (0, 1) or x.ndim == 0:
            return None
        tail = x.shape[axis:]
        h = math.prod(tail)
        params = []
        for p in (scale, b):
            # broadcasting that repeats a parameter along a normalized axis is the numpy path's
            if p is not None and (p.dtype != np.float32 or p.ndim > len(tail) or p.shape != tail[len(tail) - p.ndim:]
                                  or p.size != h):
                return None
            params.append(None if p is None else np.ascontiguousarray(p).reshape(h))
        if h == 0 or not x.flags.c_contiguous:
            return None
        done = native.layer_norm(x.reshape(-1, h), params[0], params[1], self.eps, want_stats=self.n_out > 1)
        if done is None:
            return None
        y = done[0].reshape(x.shape)
        if self.n_out == 1:
            return (y,)
        st_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
        return (y, done[2].reshape(st_shape), done[3].reshape(st_shape))[: self.n_out]


@op("GroupNormalization", since=18)
class GroupNormalization(Kernel):
    """Group normalization; opset 18 takes scale/bias per group, opset 21 per channel."""

    def setup(self):
        a = self.attrs
        self.eps = float(a.get("epsilon", 1e-5))
        if "num_groups" not in a:
            raise ValueError(f"{self.node.describe()}: num_groups is required")
        self.groups = int(a["num_groups"])
        self.stash = int(a.get("stash_type", 1))
        self.per_group = self.node.opset < 21

    def run(self, x, scale, bias):
        if x.ndim < 2:
            raise ValueError(f"input must have rank >= 2, got shape {x.shape}")
        n, c = x.shape[:2]
        g = self.groups
        if g < 1 or c % g:
            raise ValueError(f"channels {c} are not divisible by num_groups {g}")
        want = g if self.per_group else c
        if scale.shape != (want,) or bias.shape != (want,):
            raise ValueError(f"scale {scale.shape} and bias {bias.shape} must have shape ({want},)")
        cdt = _stash_dtype(self.stash, x.dtype)
        y, _, _ = _normalize(x.astype(cdt, copy=False).reshape(n, g, -1), 2, self.eps)
        if self.per_group:
            scale = np.repeat(scale, c // g)
            bias = np.repeat(bias, c // g)
        y = y.reshape(x.shape)
        y = y.astype(x.dtype, copy=False) if x.dtype != cdt else y
        bshape = (c,) + (1,) * (x.ndim - 2)
        y = y * scale.reshape(bshape)
        y += bias.reshape(bshape)
        return (y.astype(x.dtype, copy=False),)


@op("RMSNormalization", since=23)
def rms_normalization(k, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """``x / sqrt(mean(x^2) + epsilon) * scale`` over axes ``[axis, rank)``."""
    ax = _norm_axis(axis, x.ndim)
    cdt = _stash_dtype(stash_type, x.dtype)
    lead = x.shape[:ax]
    xc = x.astype(cdt, copy=False).reshape(math.prod(lead), math.prod(x.shape[ax:]))
    ms = np.mean(xc * xc, axis=1, keepdims=True)
    y = xc * (1.0 / np.sqrt(ms + cdt.type(epsilon)))
    y = y.reshape(x.shape).astype(x.dtype, copy=False)
    return (y * scale).astype(scale.dtype, copy=False)


@op("LpNormalization", since=1)
def lp_normalization(k, x, *, axis=-1, p=2):
    """``x / ||x||_p`` along ``axis`` (zero where the norm is zero)."""
    ax = _norm_axis(axis, x.ndim)
    cdt = _work_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    if p == 2:
        norm = np.sqrt(np.sum(xc * xc, axis=ax, keepdims=True))
    elif p == 1:
        norm = np.sum(np.abs(xc), axis=ax, keepdims=True)
    else:
        raise ValueError(f"LpNormalization supports p = 1 or 2, got {p}")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, cdt.type(0), xc / norm)
    return y.astype(x.dtype, copy=False)


@op("LRN", since=1)
def lrn(k, x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    """Local response normalization across channels."""
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
    cdt = _work_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    sq = xc * xc
    c = x.shape[1]
    lo = (size - 1) // 2
    hi = size - 1 - lo
    ssum = sq.copy()
    # Shifted adds over the channel window: each shift touches the whole tensor once.
    for s in range(1, lo + 1):
        if s < c:
            ssum[:, s:] += sq[:, : c - s]
    for s in range(1, hi + 1):
        if s < c:
            ssum[:, : c - s] += sq[:, s:]
    ssum *= cdt.type(alpha / size)
    ssum += cdt.type(bias)
    y = xc / (ssum ** cdt.type(beta) if beta != 0.75 else np.sqrt(ssum * np.sqrt(ssum)))
    return y.astype(x.dtype, copy=False)


@op("MeanVarianceNormalization", since=9)
def mean_variance_normalization(k, x, *, axes=(0, 2, 3)):
    """``(x - mean) / (std + 1e-9)`` over ``axes``.

    Axes past the input's rank are dropped, as onnxruntime drops them: the default
    ``[0, 2, 3]`` normalizes a 3-D input over ``[0, 2]``. None left is an error."""
    kept = [a for a in axes if a < x.ndim]
    if not kept:
        raise ValueError(f"none of the axes {list(axes)} lies within the input's rank {x.ndim}")
    ax = tuple(_norm_axis(a, x.ndim) for a in kept)
    if x.size == 0:
        return x.copy()  # nothing to normalize (numpy would warn of empty means)
    cdt = _work_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    mean = xc.mean(axis=ax, keepdims=True)
    d = xc - mean
    std = np.sqrt(np.mean(d * d, axis=ax, keepdims=True))
    d /= std + cdt.type(1e-9)
    return d.astype(x.dtype, copy=False)
