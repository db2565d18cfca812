"""Sequence and optional kernels.

A sequence is a Python list of arrays and an empty optional is ``None``. Input lists
are never mutated: every kernel that changes a sequence builds a new list (the
arrays themselves are shared, which is safe because no kernel writes to its inputs).
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import allocation_limit, check_allocation

from ..registry import op

_INT64 = np.dtype(np.int64)


def _position(pos, n: int, hi: int, what: str) -> int:
    """Wrap a position tensor into ``[0, hi]`` given ``n`` elements, or raise."""
    a = np.asarray(pos)
    if a.size != 1:
        raise ValueError(f"{what}: position must be a scalar, got shape {a.shape}")
    p = int(a.reshape(-1)[0])
    q = p + n if p < 0 else p
    if not 0 <= q <= hi:
        raise IndexError(f"{what}: position {p} is out of range for a sequence of length {n}")
    return q


def _seq(s, what: str) -> list:
    if not isinstance(s, list):
        raise TypeError(f"{what}: expected a sequence, got {type(s).__name__}")
    return s


def _view(v):
    return v.view() if isinstance(v, np.ndarray) else v


def _tensor(x, what: str):
    """A sequence's element must be a tensor: a list (a sequence) or an empty optional
    would build a sequence of sequences, which ONNX's sequence types do not allow."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} is {type(x).__name__ if x is not None else 'an empty optional'}; "
                        "a sequence holds tensors only")
    return x


@op("SequenceConstruct", since=11)
def sequence_construct(k, *xs):
    return [_view(_tensor(x, f"SequenceConstruct input {i}")) for i, x in enumerate(xs)]


@op("SequenceEmpty", since=11)
def sequence_empty(k, *, dtype=1):
    return []


@op("SequenceAt", since=11)
def sequence_at(k, seq, position):
    seq = _seq(seq, "SequenceAt")
    n = len(seq)
    return _view(seq[_position(position, n, n - 1, "SequenceAt")])


@op("SequenceInsert", since=11)
def sequence_insert(k, seq, tensor, position=None):
    out = list(_seq(seq, "SequenceInsert"))
    _tensor(tensor, "SequenceInsert's tensor")
    if position is None:
        out.append(tensor)
    else:
        out.insert(_position(position, len(out), len(out), "SequenceInsert"), tensor)
    return out


@op("SequenceErase", since=11)
def sequence_erase(k, seq, position=None):
    out = list(_seq(seq, "SequenceErase"))
    n = len(out)
    if position is None:
        if not n:
            raise IndexError("SequenceErase: cannot erase from an empty sequence")
        out.pop()
    else:
        del out[_position(position, n, n - 1, "SequenceErase")]
    return out


@op("SequenceLength", since=11)
def sequence_length(k, seq):
    return np.array(len(_seq(seq, "SequenceLength")), dtype=_INT64)


@op("SplitToSequence", since=11)
class SplitToSequence(Kernel):
    """Split a tensor along ``axis`` into a sequence of views."""

    def setup(self):
        self.axis = self.attrs.get("axis", 0)
        self.keepdims = self.attrs.get("keepdims", 1)

    def run(self, x, split=None):
        r = x.ndim
        axis = self.axis + r if self.axis < 0 else self.axis
        if not 0 <= axis < r:
            raise ValueError(f"SplitToSequence: axis {self.axis} is out of range for rank {r}")
        dim = x.shape[axis]
        xp = self.xp
        if split is None:
            parts = xp.split(x, dim, axis=axis) if dim else []
            if not self.keepdims:
                parts = [xp.squeeze(p, axis=axis) for p in parts]
            return (parts,)
        s = np.asarray(split)
        if s.ndim == 0:
            size = int(s)
            if size <= 0:
                raise ValueError(f"SplitToSequence: split {size} must be positive")
            bounds = list(range(size, dim, size))
        else:
            sizes = s.reshape(-1).tolist()
            if sum(sizes) != dim or any(v < 0 for v in sizes):
                raise ValueError(f"SplitToSequence: split {sizes} does not add up to dimension {dim}")
            bounds = np.cumsum(sizes[:-1]).tolist()
        return (list(xp.split(x, bounds, axis=axis)),)


@op("ConcatFromSequence", since=11)
class ConcatFromSequence(Kernel):
    """Concatenate (or, with ``new_axis``, stack) the tensors of a sequence."""

    def setup(self):
        self.axis = self.attrs["axis"]
        self.new_axis = self.attrs.get("new_axis", 0)

    def run(self, seq):
        seq = _seq(seq, "ConcatFromSequence")
        if not seq:
            raise ValueError("ConcatFromSequence: the sequence is empty")
        r = seq[0].ndim + (1 if self.new_axis else 0)
        axis = self.axis + r if self.axis < 0 else self.axis
        if not 0 <= axis < r:
            raise ValueError(f"ConcatFromSequence: axis {self.axis} is out of range for rank {r}")
        xp = self.xp
        if sum(t.nbytes for t in seq) > allocation_limit():
            # a sequence grown in a Loop holds any number of tensors under the cap
            shape = list(seq[0].shape)
            if self.new_axis:
                shape.insert(axis, len(seq))
            else:
                shape[axis] = sum(t.shape[axis] if t.ndim > axis else 0 for t in seq)
            check_allocation(shape, seq[0].dtype, "ConcatFromSequence output")
        try:
            if self.new_axis:
                return (xp.stack(seq, axis=axis),)
            return (xp.concatenate(seq, axis=axis),)
        except ValueError as e:
            shapes = [t.shape for t in seq]
            raise ValueError(f"ConcatFromSequence: cannot join shapes {shapes}: {e}") from None


@op("Optional", since=15)
def optional(k, x=None, *, type=None):  # noqa: A002 - the ONNX attribute name
    """Wrap ``x``; with no input, the empty optional (``None``) of ``type``."""
    return _view(x)


@op("OptionalHasElement", since=15)
def optional_has_element(k, x=None):
    return np.array(x is not None)


@op("OptionalGetElement", since=15)
def optional_get_element(k, x):
    """The optional's element; plain tensors and sequences pass through (opset 18)."""
    if x is None:
        raise ValueError("OptionalGetElement: the optional is empty")
    return _view(x)
