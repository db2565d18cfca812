"""Random generators: RandomNormal, RandomUniform, their *Like forms, Bernoulli and
Multinomial.

Each call draws from its own ``numpy.random.Generator``: seeded from the ``seed``
attribute when one is given (so a seeded node gives the same values on every call),
and from fresh OS entropy otherwise. Nothing mutable is shared between calls, so
the kernels are safe to run from many threads at once.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from onnxrt.dtypes import np_dtype
from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import check_allocation

from ..registry import op

__all__ = ["RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_FLOAT_OUT = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16))


def _seed_value(seed) -> int | None:
    """The ``seed`` attribute is a float; integral values seed as themselves, others by
    their bit pattern."""
    if seed is None:
        return None
    seed = float(seed)
    if math.isnan(seed):
        return None
    if seed.is_integer():
        return abs(int(seed))
    return int(np.float64(seed).view(np.uint64))


class _RandomKernel(Kernel):
    """Shared parsing of ``seed`` and ``dtype``."""

    default_dtype: int | None = 1  # float

    def setup(self):
        self.seed = _seed_value(self.attrs.get("seed"))
        code = self.attrs.get("dtype", 0) or self.default_dtype
        self.dtype = np_dtype(code) if code else None

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def out_dtype(self, like=None) -> np.dtype:
        dt = self.dtype if self.dtype is not None else (like.dtype if like is not None else _F32)
        if dt not in _FLOAT_OUT:
            raise ValueError(f"{self.node.describe()}: output type {dt} is not a floating-point type")
        return dt


def _shape_attr(k) -> tuple:
    shape = k.attrs.get("shape")
    if shape is None:
        raise ValueError(f"{k.node.describe()}: attribute 'shape' is required")
    if any(d < 0 for d in shape):
        raise ValueError(f"{k.node.describe()}: shape {shape} has a negative dimension")
    # refused when the session is built, before any run tries to allocate it
    return check_allocation(shape, _F64, f"{k.node.describe()} output")


def _gen_dtype(dt: np.dtype) -> np.dtype:
    return _F64 if dt == _F64 else _F32


def _normal(k, shape, dt):
    g = k.rng().standard_normal(shape, dtype=_gen_dtype(dt))
    g *= g.dtype.type(k.attrs.get("scale", 1.0))
    g += g.dtype.type(k.attrs.get("mean", 0.0))
    return g.astype(dt, copy=False)


def _uniform(k, shape, dt):
    lo = float(k.attrs.get("low", 0.0))
    hi = float(k.attrs.get("high", 1.0))
    g = k.rng().random(shape, dtype=_gen_dtype(dt))
    g *= g.dtype.type(hi - lo)
    g += g.dtype.type(lo)
    return g.astype(dt, copy=False)


@op("RandomNormal", since=1)
class RandomNormal(_RandomKernel):
    """RandomNormal: samples of N(mean, scale**2) with the ``shape`` attribute."""

    def setup(self):
        super().setup()
        self.shape = _shape_attr(self)

    def run(self):
        return (_normal(self, self.shape, self.out_dtype()),)


@op("RandomUniform", since=1)
class RandomUniform(_RandomKernel):
    """RandomUniform: samples of U[low, high) with the ``shape`` attribute."""

    def setup(self):
        super().setup()
        self.shape = _shape_attr(self)

    def run(self):
        return (_uniform(self, self.shape, self.out_dtype()),)


@op("RandomNormalLike", since=1)
class RandomNormalLike(_RandomKernel):
    """RandomNormalLike: normal samples with the input's shape (and type, by default)."""

    default_dtype = None

    def run(self, x):
        return (_normal(self, np.shape(x), self.out_dtype(x)),)


@op("RandomUniformLike", since=1)
class RandomUniformLike(_RandomKernel):
    """RandomUniformLike: uniform samples with the input's shape (and type, by default)."""

    default_dtype = None

    def run(self, x):
        return (_uniform(self, np.shape(x), self.out_dtype(x)),)


@op("Bernoulli", since=15)
class Bernoulli(_RandomKernel):
    """Bernoulli: 1 with the probability given by each input element, else 0."""

    default_dtype = None

    def run(self, x):
        dt = self.dtype if self.dtype is not None else x.dtype
        p = x.astype(_F64, copy=False)
        if p.size and (np.nanmin(p) < 0 or np.nanmax(p) > 1):
            raise ValueError("Bernoulli: probabilities must lie in [0, 1]")
        u = self.rng().random(x.shape)
        return ((u < p).astype(dt),)


@op("Multinomial", since=7)
class Multinomial(_RandomKernel):
    """Multinomial: ``sample_size`` class indices per row, drawn from the row's
    unnormalized log-probabilities."""

    default_dtype = 6  # int32

    def setup(self):
        super().setup()
        self.sample_size = int(self.attrs.get("sample_size", 1))
        if self.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(f"{self.node.describe()}: dtype must be int32 or int64, got {self.dtype}")

    def run(self, x):
        if x.ndim != 2:
            raise ValueError(f"Multinomial: input must be [batch_size, class_size], got shape {x.shape}")
        batch, classes = x.shape
        if classes == 0:
            raise ValueError("Multinomial: class_size is 0")
        if self.sample_size < 1:
            raise ValueError(f"Multinomial: sample_size {self.sample_size} must be positive")
        check_allocation((batch, self.sample_size), _F64, "Multinomial samples")
        logits = x.astype(_F64)
        w = np.exp(logits - np.max(logits, axis=1, keepdims=True))
        cdf = np.cumsum(w, axis=1)
        cdf /= cdf[:, -1:]
        u = self.rng().random((batch, self.sample_size))
        # one sorted search over all rows: row r's CDF is shifted to [r, r + 1]
        rows = np.arange(batch, dtype=_F64)[:, None]
        idx = np.searchsorted((cdf + rows).ravel(), (u + rows).ravel(), side="right")
        idx = idx.reshape(batch, self.sample_size) - np.arange(batch)[:, None] * classes
        np.clip(idx, 0, classes - 1, out=idx)
        return (idx.astype(self.dtype),)
