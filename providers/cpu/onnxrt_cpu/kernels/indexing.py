"""Index-driven kernels: gathers, scatters, one-hot, selection, Unique and TopK.

Negative indices wrap once (``-n <= i < 0`` means ``i + n``) wherever the spec allows
them; anything else out of range raises ``IndexError`` naming the op and the index.
"""

from __future__ import annotations

import math

import numpy as np

from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import check_allocation

from ..registry import op
from ..select import byte_lookup

_INT64 = np.dtype(np.int64)


def _norm_axis(axis: int, rank: int, what: str) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ValueError(f"{what}: axis {axis} is out of range for rank {rank}")
    return a


def _wrap(idx, dim: int, what: str, axis=None):
    """Wrap negative indices into ``[0, dim)``; raise IndexError on any out of range."""
    idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{what}: indices must be integers, got {idx.dtype}")
    if idx.size == 0:
        return idx.astype(np.intp, copy=False)
    lo = idx.min()
    hi = idx.max()
    if lo < -dim or hi >= dim:
        bad = lo if lo < -dim else hi
        where = "" if axis is None else f" on axis {axis}"
        raise IndexError(f"{what}: index {int(bad)} is out of range{where} for dimension of size {dim}")
    if lo < 0:
        idx = np.where(idx < 0, idx + dim, idx)
    return idx


def _scalar_int(v) -> int:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"expected a scalar, got a tensor of shape {a.shape}")
    return int(a.reshape(-1)[0])


# -- gathers ------------------------------------------------------------------------------


@op("Gather", since=1)
class Gather(Kernel):
    """``take`` along ``axis``."""

    def setup(self):
        self.axis = self.attrs.get("axis", 0)

    def run(self, x, indices):
        axis = _norm_axis(self.axis, x.ndim, "Gather")
        if (
            x.shape == (256,)
            and x.itemsize == 1
            and isinstance(x, np.ndarray)
            and isinstance(indices, np.ndarray)
            and indices.itemsize == 1
            and indices.dtype.kind in "iu"
        ):
            # an 8-bit lookup table (quantized activations): every one-byte index is
            # in range, a negative int8 one wrapping to 256 + i, which is its byte
            return (byte_lookup(x.tobytes(), indices, x.dtype),)
        try:
            return (self.xp.take(x, indices, axis=axis),)
        except IndexError:
            _wrap(indices, x.shape[axis], "Gather", axis)
            raise
        except TypeError:
            raise TypeError(f"Gather: indices must be integers, got {np.asarray(indices).dtype}") from None


@op("LookupTable", since=1, domain="ai.onnxrt")
class LookupTable(Kernel):
    """onnxrt's own op, made by ``qdq_lookup_fusion``: ``Y = table[X]`` for a one-byte
    integer ``X``, indexed by its bit pattern (an int8 -1 reads entry 255), from a
    256-entry one-byte ``table``."""

    def run(self, x, table):
        if not isinstance(x, np.ndarray) or x.itemsize != 1 or x.dtype.kind not in "iu":
            raise TypeError(f"LookupTable: X must be int8 or uint8, got {np.asarray(x).dtype}")
        if table.shape != (256,) or table.itemsize != 1:
            raise ValueError(f"LookupTable: the table must hold 256 one-byte values, got {table.dtype} "
                             f"of shape {table.shape}")
        return (byte_lookup(table.tobytes(), x, table.dtype),)


@op("GatherElements", since=11)
class GatherElements(Kernel):
    """``out[i][j][k] = data[index[i][j][k]][j][k]`` (for axis 0)."""

    def setup(self):
        self.axis = self.attrs.get("axis", 0)

    def run(self, x, indices):
        r = x.ndim
        axis = _norm_axis(self.axis, r, "GatherElements")
        if indices.ndim != r:
            raise ValueError(f"GatherElements: indices rank {indices.ndim} != data rank {r}")
        idx = _wrap(indices, x.shape[axis], "GatherElements", axis)
        if any(i > d for a, (i, d) in enumerate(zip(idx.shape, x.shape)) if a != axis):
            raise ValueError(f"GatherElements: indices shape {idx.shape} exceeds data shape {x.shape}")
        # indices may be smaller than data on the other axes
        src = x[tuple(slice(None) if a == axis else slice(0, s) for a, s in enumerate(idx.shape))]
        return (self.xp.take_along_axis(src, idx, axis=axis),)


@op("GatherND", since=11)
class GatherND(Kernel):
    """Gather slices addressed by the last axis of ``indices``, after ``batch_dims``."""

    def setup(self):
        self.b = self.attrs.get("batch_dims", 0)

    def run(self, x, indices):
        b = self.b
        ind = np.asarray(indices)
        if ind.ndim < 1:
            raise ValueError("GatherND: indices must have rank >= 1")
        m = ind.shape[-1]
        if b + m > x.ndim:
            raise ValueError(f"GatherND: index depth {m} + batch_dims {b} exceeds data rank {x.ndim}")
        if x.shape[:b] != ind.shape[:b]:
            raise ValueError(f"GatherND: batch dims of data {x.shape} and indices {ind.shape} differ")
        batch = math.prod(x.shape[:b])
        idx_dims = x.shape[b : b + m]
        rest = x.shape[b + m :]
        out_shape = ind.shape[:-1] + rest
        flat = ind.reshape(batch, math.prod(ind.shape[b:-1]), m)
        lin = np.zeros(flat.shape[:2], dtype=np.intp)
        for j, d in enumerate(idx_dims):
            lin = lin * d + _wrap(flat[..., j], d, "GatherND", b + j)
        data = x.reshape((batch, math.prod(idx_dims)) + rest)
        out = data[np.arange(batch)[:, None], lin]
        return (out.reshape(out_shape),)


# -- scatters -----------------------------------------------------------------------------

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(node) -> str:
    r = node.attrs.get("reduction", "none")
    if r != "none" and r not in _REDUCE:
        raise ValueError(f"{node.describe()}: unknown reduction {r!r}")
    return r


def _scatter(out, where, updates, reduction):
    if reduction == "none":
        out[where] = updates
    else:
        _REDUCE[reduction].at(out, where, updates)
    return out


@op("ScatterElements", since=11)
@op("Scatter", since=9)
class ScatterElements(Kernel):
    """Element-wise scatter along ``axis`` with optional reduction (opset 16+)."""

    def setup(self):
        self.axis = self.attrs.get("axis", 0)
        self.reduction = _reduction(self.node)
        self.name = self.node.op_type

    def run(self, x, indices, updates):
        r = x.ndim
        axis = _norm_axis(self.axis, r, self.name)
        if indices.shape != updates.shape or indices.ndim != r:
            raise ValueError(
                f"{self.name}: indices {indices.shape} and updates {updates.shape} must have the "
                f"same shape and the rank of data {x.shape}"
            )
        if any(i > d for a, (i, d) in enumerate(zip(indices.shape, x.shape)) if a != axis):
            raise ValueError(f"{self.name}: indices shape {indices.shape} exceeds data shape {x.shape}")
        idx = _wrap(indices, x.shape[axis], self.name, axis)
        where = tuple(
            idx if a == axis else np.arange(s).reshape([-1 if b == a else 1 for b in range(r)])
            for a, s in enumerate(idx.shape)
        )
        return (_scatter(x.copy(), where, updates, self.reduction),)


@op("ScatterND", since=11)
class ScatterND(Kernel):
    """Scatter slices addressed by the last axis of ``indices``, with optional reduction."""

    def setup(self):
        self.reduction = _reduction(self.node)

    def run(self, x, indices, updates):
        k = indices.shape[-1] if indices.ndim else 0
        if indices.ndim < 1 or k > x.ndim:
            raise ValueError(f"ScatterND: bad indices shape {indices.shape} for data {x.shape}")
        want = indices.shape[:-1] + x.shape[k:]
        if updates.shape != want:
            raise ValueError(f"ScatterND: updates shape {updates.shape}, expected {want}")
        where = tuple(_wrap(indices[..., j], x.shape[j], "ScatterND", j) for j in range(k))
        return (_scatter(x.copy(), where, updates, self.reduction),)


@op("TensorScatter", since=24)
class TensorScatter(Kernel):
    """Write ``update`` into a copy of the cache at per-batch positions (KV-cache update)."""

    def setup(self):
        self.axis = self.attrs.get("axis", -2)
        self.mode = self.attrs.get("mode", "linear")
        if self.mode not in ("linear", "circular"):
            raise ValueError(f"{self.node.describe()}: unknown mode {self.mode!r}")

    def run(self, cache, update, write_indices=None):
        r = cache.ndim
        axis = _norm_axis(self.axis, r, "TensorScatter")
        if axis == 0:
            raise ValueError("TensorScatter: axis cannot be the batch axis 0")
        if update.ndim != r or any(
            u != c for a, (u, c) in enumerate(zip(update.shape, cache.shape)) if a != axis
        ):
            raise ValueError(f"TensorScatter: update shape {update.shape} does not match cache {cache.shape}")
        max_len = cache.shape[axis]
        seq = update.shape[axis]
        if seq > max_len:
            raise ValueError(f"TensorScatter: update length {seq} exceeds cache length {max_len}")
        out = cache.copy()
        batch = cache.shape[0]
        if write_indices is None:
            out[(slice(None),) * axis + (slice(0, seq),)] = update
            return (out,)
        w = np.asarray(write_indices).reshape(-1)
        if w.shape[0] != batch:
            raise ValueError(f"TensorScatter: {w.shape[0]} write indices for batch {batch}")
        pos = w[:, None] + np.arange(seq)
        if self.mode == "circular":
            pos %= max_len
        elif seq and (w.min() < 0 or w.max() + seq > max_len):
            raise IndexError(
                f"TensorScatter: write indices {w.tolist()} + length {seq} exceed cache length {max_len}"
            )
        # index the batch and sequence axes together; the axes between them stay sliced
        bidx = np.arange(batch).reshape((batch, 1))
        out_m = np.moveaxis(out, axis, 1)
        out_m[bidx, pos] = np.moveaxis(update, axis, 1)
        return (out,)


# -- one-hot, selection -------------------------------------------------------------------


@op("OneHot", since=9)
class OneHot(Kernel):
    """One-hot encode ``indices`` along a new axis of size ``depth``."""

    def setup(self):
        self.axis = self.attrs.get("axis", -1)

    def run(self, indices, depth, values):
        d = np.asarray(depth).reshape(-1)
        if d.size != 1:
            raise ValueError(f"OneHot: depth must be a scalar, got shape {d.shape}")
        depth = int(d[0])
        if depth < 1:
            raise ValueError(f"OneHot: depth {depth} must be positive")
        vals = values.reshape(-1)
        if vals.size != 2:
            raise ValueError(f"OneHot: values must hold [off, on], got shape {values.shape}")
        r = indices.ndim
        axis = self.axis + r + 1 if self.axis < 0 else self.axis
        if not 0 <= axis <= r:
            raise ValueError(f"OneHot: axis {self.axis} out of range for output rank {r + 1}")
        out_shape = list(indices.shape)
        out_shape.insert(axis, depth)
        check_allocation(out_shape, values.dtype, "OneHot output")
        idx = indices.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + depth, idx)
        shape = [1] * (r + 1)
        shape[axis] = depth
        hot = np.expand_dims(idx, axis) == np.arange(depth).reshape(shape)
        return (np.where(hot, vals[1], vals[0]).astype(values.dtype, copy=False),)


@op("NonZero", since=9)
def non_zero(k, x):
    """Indices of the non-zero elements, shape ``(rank, nnz)``; a scalar counts as 1-D."""
    if x.ndim == 0:
        x = x.reshape(1)
    return np.array(np.nonzero(x), dtype=_INT64).reshape(x.ndim, -1)


@op("Compress", since=9)
class Compress(Kernel):
    """Select slices along ``axis`` (or of the flattened input) where ``condition`` holds."""

    def setup(self):
        self.axis = self.attrs.get("axis")

    def run(self, x, condition):
        cond = np.asarray(condition).reshape(-1).astype(bool, copy=False)
        if self.axis is None:
            n = x.size
            axis = None
        else:
            axis = _norm_axis(self.axis, x.ndim, "Compress")
            n = x.shape[axis]
        if cond.size > n:
            # entries past the end select nothing, as in onnxruntime
            cond = cond[:n]
        return (self.xp.compress(cond, x, axis=axis),)


@op("ReverseSequence", since=10)
class ReverseSequence(Kernel):
    """Reverse the first ``sequence_lens[b]`` steps along the time axis of each batch entry."""

    def setup(self):
        self.batch_axis = self.attrs.get("batch_axis", 1)
        self.time_axis = self.attrs.get("time_axis", 0)
        if {self.batch_axis, self.time_axis} != {0, 1}:
            raise ValueError(f"{self.node.describe()}: batch_axis/time_axis must be 0 and 1")

    def run(self, x, sequence_lens):
        if x.ndim < 2:
            raise ValueError(f"ReverseSequence: input must have rank >= 2, got {x.shape}")
        B = x.shape[self.batch_axis]
        T = x.shape[self.time_axis]
        lens = np.asarray(sequence_lens).reshape(-1).astype(np.int64, copy=False)
        if lens.size != B:
            raise ValueError(f"ReverseSequence: {lens.size} sequence_lens for batch size {B}")
        if lens.size and (lens.min() < 0 or lens.max() > T):
            raise ValueError(f"ReverseSequence: sequence_lens {lens.tolist()} out of range [0, {T}]")
        t = np.arange(T)
        src = np.where(t < lens[:, None], lens[:, None] - 1 - t, t)  # (B, T)
        if self.time_axis == 0:
            src = src.T
        src = src.reshape(src.shape + (1,) * (x.ndim - 2))
        return (self.xp.take_along_axis(x, src, axis=self.time_axis),)


# -- Unique, TopK -------------------------------------------------------------------------


@op("Unique", since=11)
class Unique(Kernel):
    """Unique values (or slices along ``axis``), sorted or in first-occurrence order."""

    def setup(self):
        self.axis = self.attrs.get("axis")
        self.sorted = self.attrs.get("sorted", 1)

    def run(self, x):
        axis = None if self.axis is None else _norm_axis(self.axis, x.ndim, "Unique")
        y, first, inverse, counts = np.unique(
            x, return_index=True, return_inverse=True, return_counts=True, axis=axis
        )
        inverse = inverse.reshape(-1)
        if not self.sorted:
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            y = np.take(y, order, axis=0 if axis is None else axis)
            first = first[order]
            counts = counts[order]
            inverse = rank[inverse]
        return (
            y,
            first.astype(_INT64, copy=False),
            inverse.astype(_INT64, copy=False),
            counts.astype(_INT64, copy=False),
        )


def _descending_key(x):
    """A key whose ascending order is ``x``'s descending order, without overflow."""
    if x.dtype.kind in "iu":
        return ~x
    if x.dtype.kind == "b":
        return ~x
    return -x


@op("TopK", since=1)
class TopK(Kernel):
    """The ``k`` largest (or smallest) elements along ``axis``; ties go to the lower index."""

    def setup(self):
        self.axis = self.attrs.get("axis", -1)
        self.largest = self.attrs.get("largest", 1)
        self.k = self.attrs.get("k") if self.node.opset < 10 else None

    def run(self, x, K=None):
        k = self.k if self.k is not None else _scalar_int(K)
        axis = _norm_axis(self.axis, x.ndim, "TopK")
        n = x.shape[axis]
        if not 0 <= k <= n:
            raise ValueError(f"TopK: k={k} out of range for axis {axis} of size {n}")
        xm = np.moveaxis(x, axis, -1)
        lead = xm.shape[:-1]
        rows = xm.reshape(math.prod(lead), n)
        key = _descending_key(rows) if self.largest else rows
        if self.largest and rows.dtype.kind == "f" and k and np.isnan(rows).any():
            # NaN counts as the largest value, as in onnxruntime and onnx.reference: NaNs
            # first (by index), then the rest descending, ties by lower index
            idx = np.lexsort((key, ~np.isnan(rows)), axis=-1)[:, :k]
        else:
            idx = _topk_indices(key, k)
        vals = np.take_along_axis(rows, idx, axis=1)
        vals = np.moveaxis(vals.reshape(lead + (k,)), -1, axis)
        idx = np.moveaxis(idx.reshape(lead + (k,)), -1, axis)
        return (vals, idx.astype(_INT64, copy=False))


def _topk_indices(key, k):
    """Row-wise indices of the ``k`` smallest keys, ascending, ties by lower index."""
    R, n = key.shape
    if k == 0 or R == 0:
        return np.zeros((R, k), dtype=np.intp)
    if key.dtype.kind == "f" and np.isnan(key).any():
        # NaN compares false with everything; a full stable sort puts NaNs last
        return np.argsort(key, axis=1, kind="stable")[:, :k]
    if 4 * k >= n or n < 256:
        return np.argsort(key, axis=1, kind="stable")[:, :k]
    # Partition to find each row's k-th key, keep everything strictly smaller plus the
    # lowest-indexed equal ones, then sort just those k stably.
    kth = np.partition(key, k - 1, axis=1)[:, k - 1 : k]
    keep = key < kth
    eq = key == kth
    need = k - keep.sum(axis=1)
    surplus = eq.sum(axis=1) > need
    if surplus.any():
        # ties straddle the cut: only the first `need` equal keys of those rows survive
        rows = np.flatnonzero(surplus)
        sub = eq[rows]
        sub &= np.cumsum(sub, axis=1, dtype=np.int32) <= need[rows, None]
        eq[rows] = sub
    keep |= eq
    cols = np.nonzero(keep)[1].reshape(R, k)  # ascending index within each row
    order = np.argsort(np.take_along_axis(key, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)
