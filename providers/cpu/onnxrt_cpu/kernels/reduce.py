"""Reductions: ReduceSum and the other Reduce* ops, ArgMax and ArgMin.

Every Reduce* op shares one kernel class. The reduced axes come from the ``axes``
attribute in older opsets and from an optional second input later (ReduceSum from
opset 13, the others from opset 18); with the input form, ``noop_with_empty_axes``
says whether an empty or absent ``axes`` means "reduce nothing" or "reduce all".
Reducing nothing still applies the op's elementwise part (``ReduceL2`` of a tensor
over no axes is ``|x|``), which is what numpy does for ``axis=()``.
"""

from __future__ import annotations

import math

import numpy as np
from onnxrt.plugin.kernel import Kernel

from ..registry import op
from ..rows import row_max, row_mean, row_min, row_sum

__all__ = ["Reduce", "ArgMax", "ArgMin"]


def _is_half(dt: np.dtype) -> bool:
    # float16 and the ml_dtypes floats (bfloat16...) accumulate in float32.
    return dt.kind == "V" or (dt.kind == "f" and dt.itemsize < 4)


def _normalize_axes(axes, ndim: int, what: str) -> tuple[int, ...]:
    out = []
    for a in axes:
        a = int(a)
        # a rank-0 tensor reduces over its one (implicit) axis as 0 or -1, as in
        # onnxruntime
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise ValueError(f"{what}: axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: axes {list(axes)} repeat an axis")
    return tuple(out)


def _lowest(dt: np.dtype):
    if dt == np.bool_:
        return False
    if dt.kind in "iu":
        return np.iinfo(dt).min
    return -np.inf


def _highest(dt: np.dtype):
    if dt == np.bool_:
        return True
    if dt.kind in "iu":
        return np.iinfo(dt).max
    return np.inf


def _reduce_extreme(xp, x, axes, keepdims, lowest: bool):
    fn = xp.max if lowest else xp.min
    if x.size == 0 and (axes is None or any(x.shape[a] == 0 for a in axes)):
        # numpy refuses an empty max/min; the spec gives the identity of the op
        shape = _reduced_shape(x.shape, axes, keepdims)
        fill = _lowest(x.dtype) if lowest else _highest(x.dtype)
        return xp.full(shape, fill, dtype=x.dtype)
    return fn(x, axis=axes, keepdims=keepdims)


def _reduced_shape(shape, axes, keepdims):
    if axes is None:
        axes = tuple(range(len(shape)))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _sum(xp, x, axes, keepdims):
    return xp.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _mean(xp, x, axes, keepdims):
    if x.dtype.kind in "iu":
        n = x.size if axes is None else math.prod([x.shape[a] for a in axes])
        s = xp.sum(x, axis=axes, keepdims=keepdims, dtype=np.int64 if x.dtype.kind == "i" else np.uint64)
        if n == 0:
            return xp.zeros(s.shape, dtype=x.dtype)
        # integer mean truncates toward zero, as a float mean cast back would
        return (s / n).astype(x.dtype)
    if x.size == 0 and (axes is None or any(x.shape[a] == 0 for a in axes)):
        return xp.full(_reduced_shape(x.shape, axes, keepdims), np.nan, dtype=x.dtype)
    return xp.mean(x, axis=axes, keepdims=keepdims)


def _prod(xp, x, axes, keepdims):
    return xp.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _l1(xp, x, axes, keepdims):
    return xp.sum(xp.abs(x), axis=axes, keepdims=keepdims, dtype=x.dtype)


def _sum_square(xp, x, axes, keepdims):
    return xp.sum(x * x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _l2(xp, x, axes, keepdims):
    if x.dtype.kind in "iu":
        s = xp.sum(x.astype(np.float64) ** 2, axis=axes, keepdims=keepdims)
        return xp.sqrt(s).astype(x.dtype)
    return xp.sqrt(xp.sum(x * x, axis=axes, keepdims=keepdims))


def _log_sum(xp, x, axes, keepdims):
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.log(xp.sum(x, axis=axes, keepdims=keepdims))


def _log_sum_exp(xp, x, axes, keepdims):
    if x.dtype.kind in "iu":
        # in float64: x - max wraps around for unsigned integers (the result is cast
        # back to x's type by the kernel)
        x = x.astype(np.float64)
    if x.size == 0:
        with np.errstate(divide="ignore"):
            return xp.log(xp.sum(xp.exp(x), axis=axes, keepdims=keepdims))
    # subtract the max so exp cannot overflow; an all -inf / inf slice keeps max 0
    m = xp.max(x, axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros((), dtype=m.dtype))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = xp.log(xp.sum(xp.exp(x - m), axis=axes, keepdims=True)) + m
    if not keepdims:
        s = s.reshape(_reduced_shape(x.shape, axes, False))
    return s


def _max(xp, x, axes, keepdims):
    return _reduce_extreme(xp, x, axes, keepdims, True)


def _min(xp, x, axes, keepdims):
    return _reduce_extreme(xp, x, axes, keepdims, False)


def _row_l2(x):
    y = row_sum(x * x)
    return np.sqrt(y, out=y)


# The row route: reductions over the last axis alone, through the row helpers, since
# numpy reduces along a short last axis one row at a time (1000 rows of 30 values: a
# sum 29 -> 6 us, a maximum 95 -> 24 us; 100,000 rows of 3: a sum 1.7 ms -> 68 us, a
# maximum 4.5 ms -> 0.2 ms). The sums are BLAS products with a vector of ones, which
# accumulate a row in order (blocked) where numpy sums pairwise: within a few ulps for
# rows up to _ROWS_MAX_LEN values, beyond which numpy is about as fast and is left to it.
_ROWS_MAX_LEN = 1024
_ROWS_MIN_SIZE = 512
_ROW_TYPES = (np.dtype(np.float32), np.dtype(np.float64))

# op -> (function, first opset taking axes as an input, whether half floats are upcast,
# the row route or None)
_REDUCERS = {
    "ReduceSum": (_sum, 13, True, row_sum),
    "ReduceMean": (_mean, 18, True, row_mean),
    "ReduceMax": (_max, 18, False, row_max),
    "ReduceMin": (_min, 18, False, row_min),
    "ReduceProd": (_prod, 18, True, None),
    "ReduceL1": (_l1, 18, True, lambda x: row_sum(np.abs(x))),
    "ReduceL2": (_l2, 18, True, _row_l2),
    "ReduceLogSum": (_log_sum, 18, True, None),
    "ReduceLogSumExp": (_log_sum_exp, 18, True, None),
    "ReduceSumSquare": (_sum_square, 18, True, lambda x: row_sum(x * x)),
}


#: ops whose float32/float64 reduction is one ufunc's reduce (a mean: the sum, divided)
_UFUNCS = {"ReduceSum": np.add, "ReduceMean": np.add, "ReduceMax": np.maximum, "ReduceMin": np.minimum}
_UNSET = object()


class Reduce(Kernel):
    """Any Reduce* op, in either the attribute-axes or the input-axes form."""

    def setup(self):
        fn, axes_input_since, upcast, rows = _REDUCERS[self.node.op_type]
        self.fn = fn
        self.rows = rows
        self.upcast = upcast
        self.keepdims = bool(self.attrs.get("keepdims", 1))
        self.axes_as_input = self.node.opset >= axes_input_since
        self.noop = bool(self.attrs.get("noop_with_empty_axes", 0)) if self.axes_as_input else False
        attr_axes = self.attrs.get("axes")
        self.attr_axes = None if self.axes_as_input or attr_axes is None else list(attr_axes)
        const = self.node.constants.get(1)
        self.const_axes = None if const is None else np.asarray(const).reshape(-1).tolist()
        self._static_axes: dict[int, tuple | None] = {}
        self.ufunc = _UFUNCS.get(self.node.op_type)

    def _axes(self, x, axes_in):
        if self.axes_as_input:
            axes = self.const_axes
            if axes is None and axes_in is not None:
                axes = np.asarray(axes_in).reshape(-1).tolist()
        else:
            axes = self.attr_axes
        if not axes:
            # no axes: reduce everything, unless the node asked for a no-op
            return () if self.noop else None
        return _normalize_axes(axes, x.ndim, self.node.describe())

    def run(self, x, axes=None):
        if axes is None or self.const_axes is not None or not self.axes_as_input:
            # the axes are the node's own: normalized once per input rank
            ax = self._static_axes.get(x.ndim, _UNSET)
            if ax is _UNSET:
                ax = self._static_axes[x.ndim] = self._axes(x, None)
        else:
            ax = self._axes(x, axes)
        if x.ndim == 0 and ax:
            # the scalar's one value, reduced as a 1-element vector
            (y,) = self._reduce(x.reshape(1), (0,), False)
            return (y.reshape(()),)
        return self._reduce(x, ax, self.keepdims)

    def _reduce(self, x, ax, keepdims):
        xp = self.xp
        dt = x.dtype
        if (self.rows is not None and xp is np and ax is not None and len(ax) == 1 and ax[0] == x.ndim - 1
                and x.ndim >= 2 and dt in _ROW_TYPES and 2 <= x.shape[-1] <= _ROWS_MAX_LEN
                and x.size >= _ROWS_MIN_SIZE and x.flags.c_contiguous):
            y = self.rows(x)
            return (y if keepdims else y.reshape(x.shape[:-1]),)
        if self.ufunc is not None and ax != () and xp is np and dt in _ROW_TYPES and x.size:
            # the ufunc's reduce itself, without np.sum's / np.mean's / np.max's Python
            # layers (7 -> 1.5 us for a mean over 128 values): the same loop, the same
            # result (np.mean divides the float32 sum by the count computed in float64 and
            # rounded, which is the float32 quotient: float64 holds it exactly enough)
            y = self.ufunc.reduce(x, axis=ax, keepdims=keepdims)
            if type(y) is not np.ndarray:
                y = np.asarray(y)  # every axis reduced away: a numpy scalar, made a 0-d array
            if self.fn is _mean:
                n = x.size
                if ax is not None:
                    n = 1
                    for a in ax:
                        n *= x.shape[a]
                np.true_divide(y, n, out=y)
            return (y,)
        if self.upcast and _is_half(dt):
            y = self.fn(xp, x.astype(np.float32), ax, keepdims)
        else:
            y = self.fn(xp, x, ax, keepdims)
        y = xp.asarray(y)
        if y.dtype != dt:
            with np.errstate(over="ignore", invalid="ignore"):
                y = y.astype(dt)
        elif y is x:
            y = x.copy()
        return (y,)


for _name in _REDUCERS:
    op(_name, since=1)(Reduce)


def _arg_reduce(k, x, axis, keepdims, select_last_index, largest):
    xp = k.xp
    if x.ndim == 0:
        raise ValueError(f"{k.node.describe()}: the input must have rank >= 1")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{k.node.describe()}: axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    if x.shape[axis] == 0:
        raise ValueError(f"{k.node.describe()}: cannot take the arg of an empty axis {axis}")
    fn = xp.argmax if largest else xp.argmin
    if select_last_index:
        n = x.shape[axis]
        idx = (n - 1) - fn(xp.flip(x, axis=axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = idx.astype(np.int64, copy=False)
    if keepdims:
        idx = xp.expand_dims(idx, axis)
    return idx


@op("ArgMax", since=1)
def ArgMax(k, x, *, axis=0, keepdims=1, select_last_index=0):
    """Index of the largest element along ``axis`` (first or last on ties)."""
    return _arg_reduce(k, x, axis, keepdims, select_last_index, True)


@op("ArgMin", since=1)
def ArgMin(k, x, *, axis=0, keepdims=1, select_last_index=0):
    """Index of the smallest element along ``axis`` (first or last on ties)."""
    return _arg_reduce(k, x, axis, keepdims, select_last_index, False)
