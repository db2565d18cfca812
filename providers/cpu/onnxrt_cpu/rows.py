"""Sums, means and maxima along the last axis, for the short rows of normalizations;
numpy's ufunc buffer narrowed for broadcasts along long runs (:func:`broadcast_buffer`).

numpy reduces along a short contiguous last axis slowly: it walks each row with a
per-row loop setup. Softmax over attention scores (rows of 32 to 512), LayerNorm over
hidden sizes (64 to 1024) and the like spend most of their time there. Two faster
routes, both exact to float rounding:

* a sum is a matrix-vector product with a vector of ones, which BLAS runs at memory
  speed: 4.5 us against 28 us for ``x.sum(-1)`` on 1024 rows of 32 float32 values;
* a maximum (or minimum) over rows of 8 to 64 values is the elementwise maximum of
  the columns of the transposed rows (one copy, then contiguous passes): 24 us
  against 61 us for halving the rows with elementwise maxima, on the same rows. Rows
  of 2 to 7 values are combined column by column, rows of 65 to 511 values are
  halved; longer ones are left to numpy, which is fast there.

BLAS accumulates a row in order (blocked, with FMA) where numpy sums pairwise; for
the row lengths of normalizations both are within a few float32 ulps.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

__all__ = ["SoftmaxRoute", "broadcast_buffer", "channels_last", "columns_op", "plane_sum", "row_max", "row_mean", "row_min", "row_op",
           "row_sum", "row_vector", "softmax_rows", "unshifted_softmax"]

_BLAS_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
# rows of at most this many values are maximized through the transposed copy
_TRANSPOSED_MAX = 64


@functools.lru_cache(maxsize=64)
def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    v = np.ones((n, 1), dtype=dtype)
    v.flags.writeable = False
    return v


def _as_rows(x: np.ndarray) -> np.ndarray | None:
    """``x`` as a 2-D ``[rows, n]`` view, or None where that would need a copy or BLAS
    does not apply."""
    if x.dtype not in _BLAS_TYPES or x.ndim == 0 or x.size == 0 or not x.flags.c_contiguous:
        return None
    return x.reshape(-1, x.shape[-1])


def row_sum(x: np.ndarray) -> np.ndarray:
    """``x.sum(axis=-1, keepdims=True)``."""
    r = _as_rows(x)
    if r is None or r.shape[1] < 2:
        return x.sum(axis=-1, keepdims=True)
    return (r @ _ones(r.shape[1], x.dtype)).reshape(x.shape[:-1] + (1,))


def plane_sum(x: np.ndarray) -> np.ndarray | None:
    """The sums over the spatial axes of ``x`` ``[N, C, *spatial]`` as ``[N, C]``, as
    products with a vector of ones (a global pooling: 6 us against 29 us for
    ``np.mean`` over 1024 maps of 7x7), for NCHW-contiguous arrays and NCHW views of
    channels-last memory; None for any other layout or type."""
    if x.dtype not in _BLAS_TYPES or x.ndim < 3 or x.size == 0:
        return None
    n, c = x.shape[:2]
    hw = x.size // (n * c)
    if x.flags.c_contiguous:
        return (x.reshape(n * c, hw) @ _ones(hw, x.dtype)).reshape(n, c)
    last = channels_last(x)
    if last is not None:  # [N, HW, C] summed over HW
        return (_ones(hw, x.dtype).T @ last.reshape(n, hw, c)).reshape(n, c)
    return None


def channels_last(x: np.ndarray) -> np.ndarray | None:
    """``x`` ``[N, C, *spatial]`` as its C-contiguous ``[N, *spatial, C]`` memory, when
    it is an NCHW view of channels-last memory (as integer convolutions return); else
    None (a C-contiguous ``x`` included)."""
    if x.ndim < 3 or x.flags.c_contiguous:
        return None
    last = x.transpose(0, *range(2, x.ndim), 1)
    return last if last.flags.c_contiguous else None


def row_mean(x: np.ndarray) -> np.ndarray:
    """``x.mean(axis=-1, keepdims=True)``."""
    s = row_sum(x)
    s *= x.dtype.type(1.0 / x.shape[-1]) if x.dtype in _BLAS_TYPES else 1.0 / x.shape[-1]
    return s


def row_max(x: np.ndarray) -> np.ndarray:
    """``x.max(axis=-1, keepdims=True)`` (NaN propagates, as in ``np.max``)."""
    return _row_extreme(x, np.maximum)


def row_min(x: np.ndarray) -> np.ndarray:
    """``x.min(axis=-1, keepdims=True)`` (NaN propagates, as in ``np.min``)."""
    return _row_extreme(x, np.minimum)


def _row_extreme(x: np.ndarray, ufunc) -> np.ndarray:
    """``ufunc.reduce(x, axis=-1, keepdims=True)`` for ``np.maximum`` or ``np.minimum``.

    Rows of 2 to 7 values are combined column by column (``n - 1`` strided passes:
    100,000 rows of 3 values, 4.5 ms -> about 0.3 ms), rows of 8 to 64 through the
    transposed copy, rows of 65 to 511 by halving; longer rows are numpy's own."""
    n = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or x.size == 0 or not 2 <= n < 512:
        return ufunc.reduce(x, axis=-1, keepdims=True)
    if n < 8:
        out = ufunc(x[..., 0:1], x[..., 1:2])
        for j in range(2, n):
            ufunc(out, x[..., j : j + 1], out=out)
        return out
    if n <= _TRANSPOSED_MAX:
        t = np.ascontiguousarray(x.reshape(-1, n).T)
        return ufunc.reduce(t, axis=0).reshape(x.shape[:-1] + (1,))
    m = x
    while n > 1:
        h = n // 2
        r = ufunc(m[..., :h], m[..., h : 2 * h])
        if n % 2:
            ufunc(r[..., :1], m[..., 2 * h :], out=r[..., :1])
        m, n = r, h
    return m


# Row sums of exp(x) inside these bounds let softmax skip the shift by the row maximum
# (see unshifted_softmax): below 1e-20 a row's largest exp may be near float32's smallest
# normal value, and above 1e20 the reciprocal of the sum would be.
_UNSHIFTED_SUM_MIN = 1e-20
_UNSHIFTED_SUM_MAX = 1e20


def unshifted_softmax(x: np.ndarray) -> np.ndarray | None:
    """Softmax over the last axis of a float32 or float64 array without the shift by
    each row's maximum, into a new array; None where that shift is needed.

    Softmax is unchanged by a shift of each row, which other runtimes take to be the
    row's maximum so that ``exp`` cannot overflow. That maximum costs more than the
    ``exp`` itself on short rows (92 us against 47 us on 4096 rows of 32 float32
    values). When every row's sum of ``exp(x)`` lies between 1e-20 and 1e20, nothing
    overflowed, every row's largest term is a normal number, and a term that
    underflowed has a probability below 1e-18, so the result is the shifted one to
    float rounding. Large or very negative logits, infinities, NaN and narrower
    floats give None.
    """
    if x.dtype not in _BLAS_TYPES or x.size == 0:
        return None
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.exp(x)
        s = row_sum(y)
        if not (_UNSHIFTED_SUM_MIN < s.min() and s.max() < _UNSHIFTED_SUM_MAX):
            return None
        np.reciprocal(s, out=s)
        y *= s
    return y


class SoftmaxRoute:
    """Whether one kernel's softmax has needed the shift by the row maximum: its
    later calls then go straight to the shifted route, instead of first spending an
    ``exp`` pass on the unshifted one (models whose logits are large, such as
    attention with untrained weights, need the shift on every call). Either route
    gives the same probabilities, so a stale flag costs time, never accuracy."""

    __slots__ = ("shifted",)

    def __init__(self):
        self.shifted = False


def softmax_rows(x: np.ndarray, route: SoftmaxRoute | None = None) -> np.ndarray:
    """Softmax over the last axis, into a new array: :func:`unshifted_softmax` where
    it applies, else shifted by each row's maximum (directly, once ``route`` has
    seen the unshifted route fail)."""
    if route is None or not route.shifted:
        y = unshifted_softmax(x)
        if y is not None:
            return y
        if route is not None:
            route.shifted = True
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        top = row_max(x)
        with broadcast_buffer(x.shape, x.shape, top.shape):
            y = x - top
            np.exp(y, out=y)
            y /= row_sum(y)
    return y


#: Inner-loop length :func:`columns_op` widens rows to: from about 6,000 values numpy
#: runs a ufunc with a broadcast row as fast as with a scalar, below it each row (or
#: group of rows) pays a loop setup ([1024, 256] + [256]: 74 us as it is, 63 us with
#: rows taken four at a time, 38 us eight or more at a time; a scalar multiplication
#: 38 us).
_COLUMNS_WIDTH = 8192
#: Smallest array :func:`columns_op` widens (below it the repeated vector's lookup
#: costs what the wider loop saves: [256, 64] 6.5 against 6.2 us).
_COLUMNS_MIN = 8192


@functools.lru_cache(maxsize=64)
def _tiled(data: bytes, dtype: np.dtype, times: int) -> np.ndarray:
    v = np.tile(np.frombuffer(data, dtype=dtype), times)
    v.flags.writeable = False
    return v


def row_vector(v, x: np.ndarray) -> np.ndarray | None:
    """``v`` as ``[N]`` where it is a row for :func:`columns_op` on ``x`` ``[..., N]``:
    of ``x``'s type, ``[N]`` or ``[1, ..., N]`` with no more dimensions than ``x``, and
    ``x`` larger than one row; else None."""
    if (not isinstance(v, np.ndarray) or v.dtype != x.dtype or x.ndim < 2 or v.ndim > x.ndim or v.ndim == 0
            or v.size != v.shape[-1] or v.size != x.shape[-1] or x.size < 2 * v.size):
        return None
    return v.reshape(-1)


def columns_op(ufunc, x: np.ndarray, vec: np.ndarray, out: np.ndarray | None = None,
               vec_first: bool = False) -> np.ndarray:
    """``ufunc(x, vec, out=out)`` (``ufunc(vec, x, ...)`` with ``vec_first``) for ``x``
    of rows ``[..., M]`` and a vector ``vec`` ``[M]`` of ``x``'s type; ``out`` is ``x``
    itself unless given (shaped like ``x``). Returns ``out``.

    numpy broadcasts ``vec`` with an inner loop of ``M`` values and a loop setup per
    row, slow for the 16 to 64 channels of a channels-last convolution output and
    still for the 256 to 3072 columns of a transformer's products. For C-contiguous
    arrays, consecutive rows are taken together here, with ``vec`` repeated to match,
    so that the inner loop is :data:`_COLUMNS_WIDTH` values or more (8192 rows of 16
    channels: 73 -> 22 us; [1024, 3072] + [3072]: 996 -> 655 us; a multiplication by
    a scalar: 16 and 543 us).
    """
    if out is None:
        out = x
    m = vec.shape[0]
    rows = x.size // m if m else 0
    times = 1
    if x.size >= _COLUMNS_MIN and x.flags.c_contiguous and out.flags.c_contiguous:
        while times * m < _COLUMNS_WIDTH and rows % (times * 2) == 0:
            times *= 2
    if times == 1:
        ufunc(vec, x, out=out) if vec_first else ufunc(x, vec, out=out)
        return out
    wide = _tiled(np.ascontiguousarray(vec).tobytes(), vec.dtype, times)
    flat = x.reshape(-1, m * times)
    flat_out = out.reshape(-1, m * times)
    ufunc(wide, flat, out=flat_out) if vec_first else ufunc(flat, wide, out=flat_out)
    return out


def row_op(ufunc, x: np.ndarray, v, out: np.ndarray | None = None, vec_first: bool = False) -> np.ndarray | None:
    """:func:`columns_op` where ``v`` is a row of ``x`` (:func:`row_vector`): ``out``
    (``x`` itself unless given); None where it is not, and nothing was computed."""
    vec = row_vector(v, x)
    return None if vec is None else columns_op(ufunc, x, vec, out=out, vec_first=vec_first)


#: numpy's default ufunc buffer, in elements.
_NUMPY_BUFSIZE = 8192
#: Shortest inner run :func:`broadcast_buffer` narrows the buffer for: below it numpy's
#: buffered loop, which takes several short runs at once, is as fast or faster (rows
#: of 128 minus a per-row mean and times its inverse: 1536 rows 123 us buffered, 145
#: us not; rows of 256: 326 against 216 us; rows of 49 times a per-row scale: 471
#: against 677 us).
_BUFFER_MIN_RUN = 256
#: Smallest broadcast (output values) worth the two buffer-size switches (about 1 us each).
_BUFFER_MIN_SIZE = 1 << 15


class _BufferSize:
    """numpy's ufunc buffer set to ``size`` elements while entered (per thread: numpy
    keeps it in a context variable)."""

    __slots__ = ("size", "old")

    def __init__(self, size: int):
        self.size = size
        self.old = _NUMPY_BUFSIZE

    def __enter__(self):
        self.old = np.setbufsize(self.size)
        return self

    def __exit__(self, *exc):
        np.setbufsize(self.old)
        return False


_NO_CHANGE = contextlib.nullcontext()


def _inner_run(out_shape, shapes) -> tuple[int, bool]:
    """The values numpy's inner loop runs over when broadcasting operands of ``shapes``
    to ``out_shape`` (the trailing axes along which each operand is either whole or
    broadcast throughout), and whether any operand broadcasts at all."""
    n = len(out_shape)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    run, kind, broadcast = 1, None, False
    for ax in range(n - 1, -1, -1):
        d = out_shape[ax]
        if d == 1:
            continue
        k = tuple(p[ax] == d for p in padded)
        broadcast = broadcast or not all(k)
        if kind is None:
            kind = k
        elif k != kind:
            break
        run *= d
    return run, broadcast


def broadcast_buffer(out_shape, *shapes):
    """A context for a ufunc that broadcasts operands of ``shapes`` to ``out_shape``
    (C-contiguous), in which numpy does not buffer runs that are long already.

    Where an operand is broadcast (a per-channel ``[C, 1, 1]`` scale over ``[C, H,
    W]``, a per-row ``[R, 1]`` mean) and the inner run is shorter than numpy's
    8192-value buffer, numpy's iterator copies several runs through its buffers to
    make a longer loop: for runs of 256 values and more that costs more than the
    per-run loop set-up it saves (:data:`_BUFFER_MIN_RUN`). ``[256, 3136] * [256, 1]``: 454 us buffered, 245 us
    with the buffer at most one run long (a scalar multiplication: 234 us); ``[1536,
    768] - [1536, 1]``: 696 against 344 us. The results are the same bits either way.
    Elsewhere (short runs, small arrays, no broadcasting) nothing changes.
    """
    size = 1
    for d in out_shape:
        size *= d
    if size < _BUFFER_MIN_SIZE:
        return _NO_CHANGE
    run, broadcast = _inner_run(out_shape, shapes)
    if not broadcast or run < _BUFFER_MIN_RUN or run >= _NUMPY_BUFSIZE:
        return _NO_CHANGE
    return _BufferSize(run // 16 * 16)
