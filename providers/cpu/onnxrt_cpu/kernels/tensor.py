"""Data-movement kernels: constants, shape manipulation, slicing, padding and friends.

Most of these only change how an array is viewed (Reshape, Transpose, Squeeze,
Unsqueeze, Flatten, Identity, Split, Slice return numpy views) so that they cost
next to nothing on the hot path. Attributes are parsed once in ``setup``; shape-like
inputs that are constant initializers are decoded there too.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from onnxrt.dtypes import np_dtype
from onnxrt.plugin.kernel import DirectCall, Kernel
from onnxrt.run.limits import allocation_limit, check_allocation

from .. import large_outputs
from ..registry import op

_INT64 = np.dtype(np.int64)
_INT64_MAX = np.iinfo(np.int64).max


# -- helpers ----------------------------------------------------------------------------


def _norm_axis(axis: int, rank: int, what: str) -> int:
    """Map a possibly negative axis into ``[0, rank)`` or raise."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ValueError(f"{what}: axis {axis} is out of range for rank {rank}")
    return a


def _ints(v) -> list[int]:
    """A small integer tensor (shape, axes, pads...) as a Python list."""
    return np.asarray(v).reshape(-1).tolist()


def _scalar(v):
    """The single element of a scalar or 1-element tensor, as a Python number."""
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"expected a scalar, got a tensor of shape {a.shape}")
    return a.reshape(-1)[0].item() if a.dtype != object else a.reshape(-1)[0]


def _const(node, i):
    """The constant initializer at input ``i``, or None."""
    if i < len(node.inputs) and node.inputs[i]:
        return node.constants.get(i)
    return None


def _sparse_to_dense(sp) -> np.ndarray:
    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices).astype(np.int64, copy=False)
    dims = tuple(int(d) for d in sp.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    elif indices.size:
        dense[tuple(indices.T)] = values
    return dense


# -- constants ----------------------------------------------------------------------------


@op("Constant", since=1)
class Constant(Kernel):
    """Produces the tensor held by whichever ``value*`` attribute the node has."""

    def setup(self):
        a = self.attrs
        if "value" in a:
            v = np.asarray(a["value"])
        elif "sparse_value" in a:
            sp = a["sparse_value"]
            v = sp if isinstance(sp, np.ndarray) else _sparse_to_dense(sp)
        elif "value_float" in a:
            v = np.array(a["value_float"], dtype=np.float32)
        elif "value_floats" in a:
            v = np.array(a["value_floats"], dtype=np.float32).reshape(-1)
        elif "value_int" in a:
            v = np.array(a["value_int"], dtype=np.int64)
        elif "value_ints" in a:
            v = np.array(a["value_ints"], dtype=np.int64).reshape(-1)
        elif "value_string" in a:
            v = np.array(a["value_string"], dtype=object)
        elif "value_strings" in a:
            v = np.empty(len(a["value_strings"]), dtype=object)
            v[:] = a["value_strings"]
        else:
            raise ValueError(f"{self.node.describe()}: Constant has no value attribute")
        # The same array is handed out on every call; make it immutable so no
        # consumer can change the constant for later runs.
        v = np.array(v, copy=True)
        v.flags.writeable = False
        self.value = v

    def run(self):
        return (self.value,)


@op("ConstantOfShape", since=9)
class ConstantOfShape(Kernel):
    """A tensor of the given shape filled with the single element of ``value``."""

    def setup(self):
        v = self.attrs.get("value")
        if v is None:
            v = np.zeros(1, dtype=np.float32)
        v = np.asarray(v)
        if v.size != 1:
            raise ValueError(f"{self.node.describe()}: value must hold exactly one element")
        self.fill = v.reshape(())
        self.dtype = v.dtype

    def run(self, shape):
        dims = check_allocation(_ints(shape), self.dtype, "ConstantOfShape output")
        if not self.fill.any() and self.dtype != object:
            return (self.xp.zeros(dims, dtype=self.dtype),)
        return (self.xp.full(dims, self.fill, dtype=self.dtype),)


# -- identity, shape, size ----------------------------------------------------------------


def _identity_direct(k):
    """``x.view()`` called as the method itself, for an input statically a tensor (a
    sequence or optional passes through ``identity``)."""
    if k.xp is not np or k.node.input_dtype(0) is None:
        return None
    return DirectCall(np.ndarray.view)


@op("Identity", since=1, direct=_identity_direct)
def identity(k, x):
    """Tensors come back as views; sequences and optionals as the same object."""
    if isinstance(x, np.ndarray):
        return x.view()
    return x


@op("Shape", since=1)
class Shape(Kernel):
    """The input's shape as int64, optionally sliced by ``start``/``end`` (opset 15+)."""

    def setup(self):
        self.start = self.attrs.get("start", 0)
        self.end = self.attrs.get("end")

    def run(self, x):
        shp = x.shape
        if self.start or self.end is not None:
            shp = shp[self.start : self.end]
        return (np.array(shp, dtype=_INT64),)


@op("Size", since=1)
def size(k, x):
    return np.array(x.size, dtype=_INT64)


# -- reshaping ----------------------------------------------------------------------------


def _check_dims(dims) -> None:
    """numpy takes any negative dimension for "infer"; ONNX only -1, and once."""
    if min(dims, default=0) < -1 or list(dims).count(-1) > 1:
        raise ValueError(f"Reshape: shape {list(dims)} may hold one -1 and no other negative dimension")


def _reshape_dims(x, dims: list[int], allowzero: int) -> list[int]:
    if not allowzero and 0 in dims:
        dims = list(dims)
        for i, d in enumerate(dims):
            if d == 0:
                if i >= x.ndim:
                    raise ValueError(
                        f"Reshape: shape {dims} copies dimension {i} but the input has rank {x.ndim}"
                    )
                dims[i] = x.shape[i]
    return dims


@op("Reshape", since=1)
class Reshape(Kernel):
    """Reshape; ``0`` copies the input dimension unless ``allowzero``, ``-1`` is inferred."""

    def setup(self):
        self.allowzero = self.attrs.get("allowzero", 0)
        if self.node.opset < 5:
            shape = self.attrs.get("shape")
            if shape is None:
                raise ValueError(f"{self.node.describe()}: missing 'shape' attribute")
            self.dims = list(shape)
        else:
            c = _const(self.node, 1)
            self.dims = None if c is None else _ints(c)
        if self.dims is not None:
            _check_dims(self.dims)
        # constant shapes with no 0 to resolve go straight to numpy
        self.direct = (
            None
            if self.dims is None or (not self.allowzero and 0 in self.dims)
            else tuple(self.dims)
        )

    def direct_call(self):
        """``x.reshape(dims)`` for a constant target that the input's static shape fits
        (the reshape cannot fail, so the error message of :meth:`run` is never needed)."""
        d = self.direct
        shape = self.node.input_shape(0)
        if self.xp is not np or d is None or shape is None or not all(type(n) is int for n in shape):
            return None
        size, known = math.prod(shape), math.prod(n for n in d if n != -1)
        if (known == 0 or size % known) if -1 in d else size != known:
            return None
        return DirectCall(np.ndarray.reshape, args=(d,), inputs=(0,))

    def run(self, x, shape=None):
        d = self.direct
        if d is None:
            if self.dims is not None:
                dims = self.dims  # checked once, in setup
            else:
                dims = _ints(shape)
                _check_dims(dims)
            d = _reshape_dims(x, dims, self.allowzero)
        try:
            return (x.reshape(d),)
        except ValueError:
            raise ValueError(f"Reshape: cannot reshape input of shape {x.shape} into {list(d)}") from None


@op("Flatten", since=1)
class Flatten(Kernel):
    """Flatten to 2-D around ``axis``."""

    def setup(self):
        self.axis = self.attrs.get("axis", 1)

    def run(self, x):
        r = x.ndim
        a = self.axis + r if self.axis < 0 else self.axis
        if not 0 <= a <= r:
            raise ValueError(f"Flatten: axis {self.axis} is out of range for rank {r}")
        outer = math.prod(x.shape[:a])
        return (x.reshape(outer, math.prod(x.shape[a:])),)


@op("Squeeze", since=1)
class Squeeze(Kernel):
    """Remove size-1 axes (``axes`` attribute before opset 13, an input from 13)."""

    def setup(self):
        if self.node.opset < 13:
            ax = self.attrs.get("axes")
        else:
            c = _const(self.node, 1)
            ax = None if c is None else _ints(c)
        self.axes = None if ax is None else list(ax)
        self.dynamic = self.node.opset >= 13 and self.axes is None
        self._memo: dict[tuple, tuple] = {}

    def run(self, x, axes=None):
        if not (self.dynamic and axes is not None):
            # the node's own axes: the output shape, once per input shape
            memo = self._memo
            shape = memo.get(x.shape)
            if shape is None:
                if len(memo) >= _MEMO_SHAPES:
                    memo.clear()
                shape = memo[x.shape] = self._squeezed(x, self.axes).shape
            return (x.reshape(shape),)
        return (self._squeezed(x, _ints(axes)),)

    def _squeezed(self, x, ax):
        if not ax:
            # no axes (or an empty list, as onnxruntime reads it): drop every 1
            return self.xp.squeeze(x)
        r = x.ndim
        norm = tuple(_norm_axis(a, r, "Squeeze") for a in ax)
        for a in norm:
            if x.shape[a] != 1:
                raise ValueError(f"Squeeze: axis {a} of input shape {x.shape} is not 1")
        return x.reshape([d for i, d in enumerate(x.shape) if i not in norm])


@op("Unsqueeze", since=1)
class Unsqueeze(Kernel):
    """Insert size-1 axes at the given output positions."""

    def setup(self):
        if self.node.opset < 13:
            ax = self.attrs.get("axes")
            if ax is None:
                raise ValueError(f"{self.node.describe()}: missing 'axes' attribute")
        else:
            c = _const(self.node, 1)
            ax = None if c is None else _ints(c)
        self.axes = None if ax is None else list(ax)
        self._by_rank: dict[int, list[int]] = {}

    @staticmethod
    def _normalized(rank: int, ax: list[int]) -> list[int]:
        out_rank = rank + len(ax)
        norm = sorted(_norm_axis(a, out_rank, "Unsqueeze") for a in ax)
        if len(set(norm)) != len(norm):
            raise ValueError(f"Unsqueeze: repeated axes {ax}")
        return norm

    def run(self, x, axes=None):
        if self.axes is not None:
            # the node's own axes, normalized once per input rank
            norm = self._by_rank.get(x.ndim)
            if norm is None:
                norm = self._by_rank[x.ndim] = self._normalized(x.ndim, self.axes)
        else:
            norm = self._normalized(x.ndim, _ints(axes))
        shape = list(x.shape)
        for a in norm:
            shape.insert(a, 1)
        return (x.reshape(shape),)


@op("Transpose", since=1)
class Transpose(Kernel):
    """Permute axes (reversed when ``perm`` is absent); returns a view."""

    def setup(self):
        p = self.attrs.get("perm")
        self.perm = None if p is None else tuple(p)

    def run(self, x):
        p = self.perm
        if p is not None and len(p) != x.ndim:
            raise ValueError(f"Transpose: perm {list(p)} does not match input rank {x.ndim}")
        return (self.xp.transpose(x, p),)


# -- joining and splitting ----------------------------------------------------------------


@op("Concat", since=1)
class Concat(Kernel):
    """Join tensors along ``axis``."""

    def setup(self):
        self.axis = self.attrs.get("axis", 1)
        # outputs of 32 MiB or more are kept and written again next run (large_outputs)
        self._slot = large_outputs.OutputSlot()

    def run(self, *xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            raise ValueError("Concat: no inputs")
        axis = _norm_axis(self.axis, xs[0].ndim, "Concat")
        if len(xs) == 1:
            return (xs[0].view(),)
        if sum(x.nbytes for x in xs) > allocation_limit():
            # each input is under the cap, their join need not be (a value that
            # doubles through a Loop): refused before numpy allocates it
            shape = list(xs[0].shape)
            shape[axis] = sum(x.shape[axis] if x.ndim > axis else 0 for x in xs)
            check_allocation(shape, xs[0].dtype, "Concat output")
        if self.xp is np:
            y = large_outputs.concat(self._slot, xs, axis)
            if y is not None:
                return (y,)
        try:
            return (self.xp.concatenate(xs, axis=axis),)
        except ValueError as e:
            shapes = [x.shape for x in xs]
            raise ValueError(f"Concat: cannot join shapes {shapes} on axis {axis}: {e}") from None


def _split_sizes(dim: int, sizes, n_out: int, num_outputs, what: str) -> list[int]:
    if sizes is not None:
        sizes = list(sizes)
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ValueError(f"{what}: split sizes {sizes} do not add up to dimension {dim}")
        return sizes
    if num_outputs is not None:
        chunk = -(-dim // num_outputs)
        sizes = [chunk] * (num_outputs - 1)
        last = dim - chunk * (num_outputs - 1)
        if last < 0:
            raise ValueError(f"{what}: cannot split dimension {dim} into {num_outputs} outputs")
        return sizes + [last]
    if dim % n_out:
        raise ValueError(f"{what}: dimension {dim} cannot be split evenly into {n_out} outputs")
    return [dim // n_out] * n_out


@op("Split", since=1)
class Split(Kernel):
    """Split along ``axis`` by sizes (attribute or input), ``num_outputs``, or evenly."""

    def setup(self):
        self.axis = self.attrs.get("axis", 0)
        self.n_out = len(self.node.outputs)
        self.num_outputs = self.attrs.get("num_outputs") if self.node.opset >= 18 else None
        self.split = self.attrs.get("split") if self.node.opset < 13 else None
        c = _const(self.node, 1)
        if c is not None and self.split is None:
            self.split = _ints(c)

    def run(self, x, split=None):
        axis = _norm_axis(self.axis, x.ndim, "Split")
        sizes = self.split
        if sizes is None and split is not None and split.size:
            sizes = _ints(split)
        if sizes is not None and len(sizes) != self.n_out:
            raise ValueError(f"Split: {len(sizes)} split sizes for {self.n_out} outputs")
        sizes = _split_sizes(x.shape[axis], sizes, self.n_out, self.num_outputs, "Split")
        # views by plain slicing: np.split's general machinery cost 25-30 us for the
        # three parts of an attention layer's packed projections
        lead = (slice(None),) * axis
        parts, start = [], 0
        for size in sizes:
            parts.append(x[lead + (slice(start, start + int(size)),)])
            start += int(size)
        return tuple(parts)


@op("Slice", since=1)
class Slice(Kernel):
    """Strided slicing with ONNX clamping; returns a view."""

    def setup(self):
        node = self.node
        if node.opset < 10:
            self.fixed = (
                list(self.attrs["starts"]),
                list(self.attrs["ends"]),
                self.attrs.get("axes"),
                None,
            )
        else:
            parts = [_const(node, i) for i in range(1, 5)]
            present = [i < len(node.inputs) and bool(node.inputs[i]) for i in range(1, 5)]
            if all(p is not None or not pr for p, pr in zip(parts, present)):
                self.fixed = tuple(None if p is None else _ints(p) for p in parts)
            else:
                self.fixed = None
        self._memo: dict[tuple, tuple] = {}

    def run(self, x, starts=None, ends=None, axes=None, steps=None):
        if self.fixed is not None:
            # the node's own starts/ends/axes/steps: the index, once per input shape
            memo = self._memo
            index = memo.get(x.shape)
            if index is None:
                if len(memo) >= _MEMO_SHAPES:
                    memo.clear()
                index = memo[x.shape] = _slices(x.shape, *self.fixed)
            return (x[index],)
        else:
            starts = _ints(starts)
            ends = _ints(ends)
            axes = None if axes is None else _ints(axes)
            steps = None if steps is None else _ints(steps)
        return (x[_slices(x.shape, starts, ends, axes, steps)],)


#: input shapes a node keeps its computed index (or output shape) for; a node fed ever
#: new shapes starts its memo again
_MEMO_SHAPES = 16


def _slices(shape, starts, ends, axes, steps) -> tuple:
    r = len(shape)
    n = len(starts)
    if len(ends) != n:
        raise ValueError(f"Slice: {n} starts but {len(ends)} ends")
    if axes is None:
        axes = range(n)
    elif len(axes) != n:
        raise ValueError(f"Slice: {n} starts but {len(axes)} axes")
    if steps is not None and len(steps) != n:
        raise ValueError(f"Slice: {n} starts but {len(steps)} steps")
    sl = [slice(None)] * r
    seen = set()
    for i, a in enumerate(axes):
        a = _norm_axis(a, r, "Slice")
        if a in seen:
            raise ValueError(f"Slice: axis {a} appears more than once")
        seen.add(a)
        dim = shape[a]
        s, e = starts[i], ends[i]
        st = 1 if steps is None else steps[i]
        if st == 0:
            raise ValueError("Slice: step cannot be 0")
        if st < 0 and e == _INT64_MAX:
            # exporters write INT64_MAX for "to the end" in either direction
            e = -1 - dim
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
            sl[a] = slice(s, e, st)
        else:
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
            # -1 means "before the first element", which Python spells None
            sl[a] = slice(s, None if e < 0 else e, st)
    return tuple(sl)


# -- broadcasting and repeating -----------------------------------------------------------


def _broadcast_exact(a: tuple, b: tuple) -> tuple | None:
    """The broadcast of shapes ``a`` and ``b`` in Python ints, or None where they do
    not broadcast: ``np.broadcast_shapes`` refuses a result whose size passes intp
    ("broadcast dimensions too large"), which hid an over-the-cap request behind a
    wrong reason."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for da, db in zip(a, b):
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            return None
    return tuple(out)


@op("Expand", since=8)
class Expand(Kernel):
    """Broadcast the input to ``shape`` (bidirectionally)."""

    def run(self, x, shape):
        dims = tuple(_ints(shape))
        out = _broadcast_exact(x.shape, dims)
        if out is None:
            raise ValueError(f"Expand: input shape {x.shape} cannot broadcast to {list(dims)}")
        if out == x.shape:
            return (x.view(),)
        check_allocation(out, x.dtype, "Expand output")
        return (self.xp.broadcast_to(x, out).copy(),)


@op("Tile", since=1)
class Tile(Kernel):
    """Repeat the input ``repeats`` times along each axis."""

    def run(self, x, repeats, axis=None):
        if self.node.opset < 6:
            reps = [1] * x.ndim
            reps[_norm_axis(int(_scalar(axis)), x.ndim, "Tile")] = int(_scalar(repeats))
        else:
            reps = _ints(repeats)
            if len(reps) != x.ndim:
                raise ValueError(f"Tile: {len(reps)} repeats for input of rank {x.ndim}")
        if any(r < 0 for r in reps):
            raise ValueError(f"Tile: negative repeats {reps}")
        check_allocation([d * r for d, r in zip(x.shape, reps)], x.dtype, "Tile output")
        return (self.xp.tile(x, reps),)


# -- padding ------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@op("Pad", since=1)
class Pad(Kernel):
    """Pad (or crop, for negative pads) in constant, reflect, edge or wrap mode."""

    def setup(self):
        node = self.node
        self.mode = self.attrs.get("mode", "constant")
        if self.mode not in _PAD_MODES:
            raise ValueError(f"{node.describe()}: unsupported mode {self.mode!r}")
        if node.opset < 11:
            pads = self.attrs.get("pads" if node.opset >= 2 else "paddings")
            if pads is None:
                raise ValueError(f"{node.describe()}: missing pads")
            self.pads = list(pads)
            self.value = self.attrs.get("value", 0.0)
            self.axes = None
        else:
            c = _const(node, 1)
            self.pads = None if c is None else _ints(c)
            self.value = None
            c = _const(node, 3)
            self.axes = None if c is None else _ints(c)

    def run(self, x, pads=None, constant_value=None, axes=None):
        p = self.pads if self.pads is not None else _ints(pads)
        ax = self.axes
        if ax is None and axes is not None:
            ax = _ints(axes)
        if self.value is not None:
            value = self.value
        elif constant_value is not None and constant_value.size:
            value = constant_value.reshape(-1)[0]
        else:
            value = 0
        return (_pad(self.xp, x, p, ax, self.mode, value),)


def _pad(xp, x, pads, axes, mode, value):
    r = x.ndim
    if axes is None:
        axes = range(r)
    n = len(axes)
    if len(pads) != 2 * n:
        raise ValueError(f"Pad: expected {2 * n} pads for {n} axes, got {len(pads)}")
    before = [0] * r
    after = [0] * r
    for i, a in enumerate(axes):
        a = _norm_axis(a, r, "Pad")
        before[a] = pads[i]
        after[a] = pads[i + n]
    if mode == "constant":
        # a negative pad drops elements from that side; output index = input index + before
        shape = tuple(d + b + e for d, b, e in zip(x.shape, before, after))
        if min(shape, default=0) < 0:
            raise ValueError(f"Pad: pads {list(pads)} give a negative output shape {shape}")
        if shape == x.shape and not any(before):
            return x.view()
        check_allocation(shape, x.dtype, "Pad output")
        if x.dtype != object and value == 0:
            out = xp.zeros(shape, dtype=x.dtype)
        else:
            out = xp.full(shape, value, dtype=x.dtype)
        dst = []
        src = []
        for d, b, size in zip(x.shape, before, shape):
            lo = max(b, 0)
            hi = min(d + b, size)
            if hi <= lo:
                return out
            dst.append(slice(lo, hi))
            src.append(slice(lo - b, hi - b))
        out[tuple(dst)] = x[tuple(src)]
        return out
    if min(before) < 0 or min(after) < 0:
        # other modes crop first, then pad what is left
        crop = tuple(
            slice(max(-b, 0), d - max(-e, 0)) for b, e, d in zip(before, after, x.shape)
        )
        if any(s.start >= s.stop for s in crop):
            raise ValueError(f"Pad: negative pads {list(pads)} leave nothing of input shape {x.shape}")
        x = x[crop]
        before = [max(b, 0) for b in before]
        after = [max(e, 0) for e in after]
    if not any(before) and not any(after):
        return x.view()
    check_allocation([d + b + e for d, b, e in zip(x.shape, before, after)], x.dtype, "Pad output")
    for a in range(r):
        if (before[a] or after[a]) and x.shape[a] == 0:
            raise ValueError(f"Pad: cannot pad an empty axis {a} in {mode} mode")
        if mode == "reflect" and (before[a] or after[a]) and max(before[a], after[a]) >= x.shape[a]:
            raise ValueError(
                f"Pad: reflect pads {before[a]}, {after[a]} on axis {a} need a dimension larger "
                f"than {x.shape[a]}"
            )
    if xp is np and (mode in ("reflect", "edge") or (mode == "wrap" and all(
            b <= d and e <= d for b, e, d in zip(before, after, x.shape)))):
        return _pad_by_parts(xp, x, before, after, mode)
    return xp.pad(x, list(zip(before, after)), mode=mode)


def _pad_by_parts(xp, x, before, after, mode):
    """``np.pad`` in reflect, edge or wrap mode for pads the checks above allow (reflect:
    under the dimension; wrap: at most the dimension), as one join per padded axis of
    the input's mirrored, repeated or wrapped ends: the same values, without np.pad's
    general machinery (15-19 us for a 512-sample frame against 2-3 us). Axes are padded
    in order, each join taking the corners from the axes padded before it, as np.pad
    does."""
    r = x.ndim
    for a in range(r):
        b, e = before[a], after[a]
        if not b and not e:
            continue
        n = x.shape[a]
        lead = (slice(None),) * a
        parts = []
        if mode == "reflect":
            if b:
                parts.append(x[lead + (slice(b, 0, -1),)])
            parts.append(x)
            if e:
                stop = n - 2 - e
                parts.append(x[lead + (slice(n - 2, stop if stop >= 0 else None, -1),)])
        elif mode == "edge":
            if b:
                parts.append(xp.repeat(x[lead + (slice(0, 1),)], b, axis=a))
            parts.append(x)
            if e:
                parts.append(xp.repeat(x[lead + (slice(n - 1, n),)], e, axis=a))
        else:  # wrap
            if b:
                parts.append(x[lead + (slice(n - b, n),)])
            parts.append(x)
            if e:
                parts.append(x[lead + (slice(0, e),)])
        x = xp.concatenate(parts, axis=a)
    return x


@op("CenterCropPad", since=18)
class CenterCropPad(Kernel):
    """Center-crop or zero-pad the input to ``shape`` on ``axes``."""

    def setup(self):
        self.axes = self.attrs.get("axes")

    def run(self, x, shape):
        r = x.ndim
        axes = range(r) if self.axes is None else [_norm_axis(a, r, "CenterCropPad") for a in self.axes]
        target = _ints(shape)
        if len(target) != len(axes):
            raise ValueError(f"CenterCropPad: {len(target)} sizes for {len(axes)} axes")
        out_shape = list(x.shape)
        src = [slice(None)] * r
        dst = [slice(None)] * r
        for a, t in zip(axes, target):
            d = x.shape[a]
            out_shape[a] = t
            if t < d:
                o = (d - t) // 2
                src[a] = slice(o, o + t)
            elif t > d:
                o = (t - d) // 2
                dst[a] = slice(o, o + d)
        if out_shape == list(x.shape):
            return (x.view(),)
        check_allocation(out_shape, x.dtype, "CenterCropPad output")  # the sizes are fed
        out = self.xp.zeros(out_shape, dtype=x.dtype)
        out[tuple(dst)] = x[tuple(src)]
        return (out,)


# -- generators ---------------------------------------------------------------------------


@op("Range", since=11)
class Range(Kernel):
    """``start + i * delta`` for ``i`` in ``[0, ceil((limit - start) / delta))``."""

    def run(self, start, limit, delta):
        dt = start.dtype
        s, l, d = _scalar(start), _scalar(limit), _scalar(delta)
        if d == 0:
            raise ValueError("Range: delta cannot be 0")
        if dt.kind in "iu":
            s, l, d = int(s), int(l), int(d)
            # the length in Python ints: np.arange(s, l, d) computes it in float64,
            # which miscounts bounds near 2**62 or the int64 limits
            n = max(-((s - l) // d), 0)
            check_allocation([n], dt, "Range output")
            # start + i * delta wraps in int64 (silently, for arrays) only where an
            # intermediate product passes the limits; every result lies in [start, limit)
            steps = np.arange(n, dtype=np.int64)
            steps *= np.int64(d)
            steps += np.int64(s)
            return (self.xp.asarray(steps.astype(dt, copy=False)),)
        if not all(math.isfinite(v) for v in (s, l, d)):
            raise ValueError(f"Range: start {s}, limit {l} and delta {d} must be finite")
        n = max(math.ceil((l - s) / d), 0)
        check_allocation([n], dt, "Range output")
        work = np.float64 if dt == np.float64 else np.float32
        out = self.xp.arange(n, dtype=work) * work(d) + work(s)
        return (out.astype(dt, copy=False),)


@op("EyeLike", since=9)
class EyeLike(Kernel):
    """A 2-D tensor with ones on the ``k``-th diagonal."""

    def setup(self):
        dt = self.attrs.get("dtype")
        self.dtype = None if dt is None else np_dtype(dt)
        self.k = self.attrs.get("k", 0)

    def run(self, x):
        if x.ndim != 2:
            raise ValueError(f"EyeLike: input must be 2-D, got shape {x.shape}")
        dt = self.dtype or x.dtype
        return (self.xp.eye(x.shape[0], x.shape[1], k=self.k, dtype=dt),)


@op("Trilu", since=14)
class Trilu(Kernel):
    """Upper or lower triangle of the last two axes."""

    def setup(self):
        self.upper = self.attrs.get("upper", 1)

    def run(self, x, k=None):
        if x.ndim < 2:
            raise ValueError(f"Trilu: input must have rank >= 2, got shape {x.shape}")
        kk = 0 if k is None else int(_scalar(k))
        # numpy takes k as a C long: an int64 k near the limits overflowed; past the
        # matrix's extent every k keeps the same triangle
        kk = min(max(kk, -x.shape[-2] - 1), x.shape[-1] + 1)
        f = self.xp.triu if self.upper else self.xp.tril
        return (f(x, kk),)


# -- depth/space --------------------------------------------------------------------------


@op("DepthToSpace", since=1)
class DepthToSpace(Kernel):
    """Move channel blocks into spatial blocks (DCR or CRD order)."""

    def setup(self):
        self.bs = self.attrs["blocksize"]
        self.mode = self.attrs.get("mode", "DCR")
        if self.mode not in ("DCR", "CRD"):
            raise ValueError(f"{self.node.describe()}: unknown mode {self.mode!r}")

    def run(self, x):
        if x.ndim != 4:
            raise ValueError(f"DepthToSpace: input must be 4-D, got shape {x.shape}")
        b, c, h, w = x.shape
        bs = self.bs
        if c % (bs * bs):
            raise ValueError(f"DepthToSpace: channels {c} not divisible by blocksize^2 = {bs * bs}")
        c2 = c // (bs * bs)
        xp = self.xp
        if self.mode == "DCR":
            t = xp.transpose(x.reshape(b, bs, bs, c2, h, w), (0, 3, 4, 1, 5, 2))
        else:
            t = xp.transpose(x.reshape(b, c2, bs, bs, h, w), (0, 1, 4, 2, 5, 3))
        return (t.reshape(b, c2, h * bs, w * bs),)


@op("SpaceToDepth", since=1)
class SpaceToDepth(Kernel):
    """Move spatial blocks into channels (DCR, or CRD from opset 28)."""

    def setup(self):
        self.bs = self.attrs["blocksize"]
        self.mode = self.attrs.get("mode", "DCR")
        if self.mode not in ("DCR", "CRD"):
            raise ValueError(f"{self.node.describe()}: unknown mode {self.mode!r}")

    def run(self, x):
        if x.ndim != 4:
            raise ValueError(f"SpaceToDepth: input must be 4-D, got shape {x.shape}")
        b, c, h, w = x.shape
        bs = self.bs
        if h % bs or w % bs:
            raise ValueError(f"SpaceToDepth: spatial shape {(h, w)} not divisible by blocksize {bs}")
        t = x.reshape(b, c, h // bs, bs, w // bs, bs)
        perm = (0, 3, 5, 1, 2, 4) if self.mode == "DCR" else (0, 1, 3, 5, 2, 4)
        return (self.xp.transpose(t, perm).reshape(b, c * bs * bs, h // bs, w // bs),)


# -- dropout ------------------------------------------------------------------------------


@op("Dropout", since=1)
class Dropout(Kernel):
    """Identity at inference; random masking in training mode (opset 12+ input, or
    ``is_test=0`` before opset 7). The optional mask is all True at inference."""

    def setup(self):
        node = self.node
        self.want_mask = len(node.outputs) > 1 and bool(node.outputs[1])
        self.mask_bool = node.opset >= 10
        self.seed = self.attrs.get("seed")
        self.ratio = self.attrs.get("ratio", 0.5)
        self.attr_training = node.opset < 7 and not self.attrs.get("is_test", 0)

    def run(self, x, ratio=None, training_mode=None):
        training = self.attr_training
        r = self.ratio
        if self.node.opset >= 12:
            training = training_mode is not None and bool(_scalar(training_mode))
            r = 0.5 if ratio is None else float(_scalar(ratio))
        if not training or r == 0:
            if not self.want_mask:
                return (x.view(),)
            mask_dt = np.bool_ if self.mask_bool else x.dtype
            return (x.view(), self.xp.ones(x.shape, dtype=mask_dt))
        if not 0 <= r < 1:
            raise ValueError(f"Dropout: ratio {r} must be in [0, 1)")
        if self.seed is not None:
            u = np.random.RandomState(self.seed).uniform(0.0, 1.0, x.shape)
        else:
            u = np.random.default_rng().random(x.shape)
        mask = u >= r
        y = (x * mask * x.dtype.type(1.0 / (1.0 - r))).astype(x.dtype, copy=False)
        if not self.want_mask:
            return (y,)
        return (y, mask if self.mask_bool else mask.astype(x.dtype))


# -- upsample (deprecated) ----------------------------------------------------------------


@op("Upsample", since=1)
class Upsample(Kernel):
    """Nearest or (bi)linear upsampling by per-axis scales (asymmetric coordinates)."""

    def setup(self):
        node = self.node
        self.mode = self.attrs.get("mode", "nearest")
        if self.mode == "bilinear":
            self.mode = "linear"
        if self.mode not in ("nearest", "linear"):
            raise ValueError(f"{node.describe()}: unsupported mode {self.mode!r}")
        if node.opset < 7:
            self.scales = [1.0, 1.0, float(self.attrs["height_scale"]), float(self.attrs["width_scale"])]
        elif node.opset < 9:
            self.scales = [float(s) for s in self.attrs["scales"]]
        else:
            c = _const(node, 1)
            self.scales = None if c is None else np.asarray(c, dtype=np.float64).reshape(-1).tolist()

    def run(self, x, scales=None):
        sc = self.scales
        if sc is None:
            sc = np.asarray(scales, dtype=np.float64).reshape(-1).tolist()
        if len(sc) != x.ndim:
            raise ValueError(f"Upsample: {len(sc)} scales for input of rank {x.ndim}")
        if not all(math.isfinite(s) and s > 0 for s in sc):
            raise ValueError(f"Upsample: scales {sc} must be positive and finite")
        check_allocation([int(math.floor(d * s)) for d, s in zip(x.shape, sc)], np.float64, "Upsample output")
        y = x
        for a, s in enumerate(sc):
            if s == 1:
                continue
            if s <= 0:
                raise ValueError(f"Upsample: scale {s} must be positive")
            n_in = x.shape[a]
            n_out = int(math.floor(n_in * s))
            coord = np.arange(n_out, dtype=np.float64) / s
            if self.mode == "nearest":
                idx = np.minimum(np.floor(coord).astype(np.int64), n_in - 1)
                y = self.xp.take(y, idx, axis=a)
            else:
                coord = np.minimum(coord, n_in - 1)
                lo = np.floor(coord).astype(np.int64)
                hi = np.minimum(lo + 1, n_in - 1)
                frac = (coord - lo).astype(np.float32 if x.dtype != np.float64 else np.float64)
                shp = [1] * x.ndim
                shp[a] = n_out
                frac = frac.reshape(shp)
                y0 = self.xp.take(y, lo, axis=a)
                y1 = self.xp.take(y, hi, axis=a)
                y = (y0 + (y1 - y0) * frac).astype(x.dtype, copy=False)
        return (y if y is not x else x.copy(),)
