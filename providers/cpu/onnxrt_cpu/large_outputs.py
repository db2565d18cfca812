"""Large outputs kept by their kernel and written again in the next run, and Concat into one.

glibc maps every block of 32 MiB or more fresh (``onnxrt.run.malloc`` keeps smaller
ones on the heap): each run page-faults such an output in again, with the kernel
zeroing (and, for transparent huge pages, compacting) memory in the fault path. On
isnet-quint8 (U2-Net decoders joining pairs of feature maps along the channels) the
128 MiB output of ``/Concat_9`` took 15-1650 ms to fault in, run to run, against
15 ms to copy; onnxruntime's arena hands the same block back every run.

:class:`OutputSlot` does the same for one node: it keeps its last large output and
hands it back for the next run once nothing else refers to it (the executor and the
consumers have let go; a view or a graph output the caller holds keeps it taken and
a fresh array is made). The held block counts against the peak only where the run's
peak comes after the output died; it is limited to outputs of at least
:data:`REUSE_MIN_BYTES`.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["REUSE_MIN_BYTES", "OutputSlot", "concat"]

#: outputs smaller than this come from the heap, which reuses them already
REUSE_MIN_BYTES = 32 << 20


class OutputSlot:
    """One node's reusable output: :meth:`empty` is ``np.empty`` that hands back the
    previous run's array of the same shape and dtype when only the slot refers to it."""

    __slots__ = ("_array", "_lock")

    def __init__(self) -> None:
        self._array: np.ndarray | None = None
        self._lock = threading.Lock()

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized array of ``shape`` and ``dtype``, the kept one where it is free."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < REUSE_MIN_BYTES:
            return np.empty(shape, dtype=dtype)
        with self._lock:  # check and take at once: concurrent runs of one session
            a = self._array
            # three references: the slot's, ``a`` and getrefcount's argument
            if a is not None and a.shape == tuple(shape) and a.dtype == dtype and sys.getrefcount(a) == 3:
                return a
            a = np.empty(shape, dtype=dtype)
            self._array = a
            return a


def concat(slot: OutputSlot, xs: list[np.ndarray], axis: int) -> np.ndarray | None:
    """``np.concatenate(xs, axis)`` written into ``slot``'s array, or None where the
    inputs do not join plainly (mixed dtypes, ranks or shapes: ``np.concatenate``
    then raises its own error) or the output is too small to be worth keeping."""
    first = xs[0]
    if sum(x.nbytes for x in xs) < REUSE_MIN_BYTES or first.dtype.hasobject:
        return None
    shape = list(first.shape)
    for x in xs:
        if x.dtype != first.dtype or x.ndim != first.ndim:
            return None
        if any(x.shape[d] != shape[d] for d in range(first.ndim) if d != axis):
            return None
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = slot.empty(shape, first.dtype)
    np.concatenate(xs, axis=axis, out=out)
    return out
