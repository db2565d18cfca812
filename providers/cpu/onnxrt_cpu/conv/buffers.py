"""Views and scratch memory of the convolution algorithms: runs of values copied as
one element, strided views without numpy's Python wrapping, and a per-thread
buffer reused across calls.

The algorithms call :func:`scratch` through this module (``buffers.scratch``), so
that one replacement of it sees every use."""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["as_runs", "runs_view", "scratch", "strided"]


def runs_view(base: np.ndarray, run: int, shape, strides, offset: int = 0) -> np.ndarray:
    """A view of the C-contiguous ``base``'s memory whose elements are runs of ``run``
    consecutive values (one void element each), at byte ``strides`` from ``offset``;
    the runs may overlap (as the taps of neighbouring outputs do in an im2col).

    Copied from such a view, each run is one element, so numpy's copy loops over whole
    runs instead of calling its inner loop once per run of a few values."""
    return np.ndarray(shape, dtype=np.dtype((np.void, run * base.itemsize)), buffer=base, offset=offset,
                      strides=strides)


def as_runs(a: np.ndarray, run: int, shape) -> np.ndarray:
    """The C-contiguous ``a`` as ``shape`` elements of ``run`` values each (the
    destination matching a :func:`runs_view`)."""
    return a.reshape(-1).view(np.dtype((np.void, run * a.itemsize))).reshape(shape)


def strided(buf: np.ndarray, offset: int, shape, steps) -> np.ndarray:
    """A view of the contiguous ``buf`` from element ``offset`` with ``shape`` and
    ``steps`` (element strides), which may overlap: ``as_strided`` without its Python
    wrapping (0.4 against 4.3 us a view)."""
    isz = buf.itemsize
    return np.ndarray(shape, buf.dtype, buf, offset * isz, tuple(st * isz for st in steps))


def scratch(size: int, dtype) -> np.ndarray:
    """A flat buffer of ``size`` elements owned by the calling thread, reused across calls.

    Kernels are shared by every thread that runs a session, so the im2col buffer
    cannot live on the kernel; one per thread (grown as needed) avoids allocating
    and page-faulting a fresh column buffer per call.
    """
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    dt = np.dtype(dtype)
    buf = bufs.get(dt)
    if buf is None or buf.size < size:
        buf = bufs[dt] = np.empty(max(size, 1), dtype=dt)
    return buf[:size]


_tls = threading.local()
