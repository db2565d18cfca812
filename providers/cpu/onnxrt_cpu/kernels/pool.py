"""Pooling: MaxPool, AveragePool, LpPool, their global forms, MaxUnpool, MaxRoiPool, RoiAlign.

Windowed pooling reduces over kernel taps: for each tap, one strided view of the
padded input covers every output position. Box windows are separable, so max, sum
and Lp pooling reduce one spatial axis at a time (a k x k pool costs 2(k-1)
vectorized ``maximum``/``add`` calls over the data); very wide windows reduce a
sliding-window view instead. MaxPool with Indices walks all taps once, tracking
the first maximal tap per output.
"""

from __future__ import annotations

import itertools
import math
import sys

import numpy as np

from onnxrt.plugin.kernel import Kernel
from onnxrt.plugin.pool_geometry import pool_geometry
from onnxrt.run.limits import check_allocation

from .. import native, parallel
from ..registry import op
from ..conv.geometry import compute_dtype, pad_spatial, spatial_attrs, tap_slices
from ..rows import channels_last, plane_sum

# Above this window extent on any axis, reduce a sliding-window view rather than looping over taps.
_MAX_TAPS = 64


def _window_view(xp, kernel, strides, dilations, out_sp):
    """View ``[..., *out_sp, *kernel]`` of the windows of the padded array ``xp``."""
    nd = len(kernel)
    axes = tuple(range(xp.ndim - nd, xp.ndim))
    ek = [(kernel[i] - 1) * dilations[i] + 1 for i in range(nd)]
    v = np.lib.stride_tricks.sliding_window_view(xp, ek, axis=axes)
    sl = (Ellipsis,)
    sl += tuple(slice(0, strides[i] * (out_sp[i] - 1) + 1, strides[i]) for i in range(nd))
    sl += tuple(slice(None, None, dilations[i]) for i in range(nd))
    return v[sl]


def _axis_counts(in_sp, kernel, strides, dilations, pb, lo_pad, hi_pad, out_sp):
    """Per axis, how many taps of each output window fall in ``[-lo_pad, in + hi_pad)``."""
    counts = []
    for i in range(len(in_sp)):
        starts = np.arange(out_sp[i]) * strides[i] - pb[i]
        pos = starts[:, None] + np.arange(kernel[i])[None, :] * dilations[i]
        counts.append(((pos >= -lo_pad[i]) & (pos < in_sp[i] + hi_pad[i])).sum(1))
    return counts


def _outer(vectors):
    r = np.ones((), dtype=np.float64)
    for v in vectors:
        r = np.multiply.outer(r, v)
    return r


class _PoolBase(Kernel):
    def setup(self):
        a = self.attrs
        self.auto_pad = a.get("auto_pad", "NOTSET") or "NOTSET"
        self.ceil_mode = int(a.get("ceil_mode", 0))
        self.pads = a.get("pads")
        if a.get("kernel_shape") is None:
            raise ValueError(f"{self.node.describe()}: kernel_shape is required")

    def _geom(self, x):
        if x.ndim < 3:
            raise ValueError(f"input must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
        nd = x.ndim - 2
        kernel, strides, dil = spatial_attrs(self.attrs, nd)
        if len(kernel) != nd:
            raise ValueError(f"kernel_shape {list(kernel)} does not match spatial rank {nd}")
        pb, pe, extra, out_sp = pool_geometry(x.shape[2:], kernel, strides, dil, self.pads, self.auto_pad,
                                              self.ceil_mode, self.node.describe())
        if math.prod(out_sp) > math.prod(x.shape[2:]):
            # only padding makes a pooled map larger than its input, and a model's pads can be huge
            check_allocation((*x.shape[:2], *out_sp), np.float64, f"{self.node.op_type} output")
        return kernel, strides, dil, pb, pe, extra, out_sp


def _trim_taps(in_sp, kernel, strides, dil, pb, out_sp):
    """``(kernel, pads before)`` without the taps that fall in the padding for every
    output along their axis: they add only the reduction's identity, and a window far
    larger than its input (a pooler's 640 x 640 kernel over a 2 x 2 map) would
    otherwise be padded out whole, 1 GB for 640 channels. The window is cut to the
    first through last tap that reaches the input for some output."""
    ks, ps = list(kernel), list(pb)
    for a, (n, k, s, d, p, o) in enumerate(zip(in_sp, kernel, strides, dil, pb, out_sp)):
        if k == 1 or o == 0:
            continue
        off = np.arange(k) * d - p  # input index of each tap for output 0
        first = np.maximum(0, -(off // s))  # first output whose index is >= 0 ...
        last = np.minimum(o - 1, np.where(n - 1 - off >= 0, (n - 1 - off) // s, -1))  # ... and the last < n
        hits = np.flatnonzero(first <= last)
        if hits.size and (hits[0] > 0 or hits[-1] < k - 1):
            ks[a] = int(hits[-1] - hits[0] + 1)
            ps[a] = p - int(hits[0]) * d
    return tuple(ks), tuple(ps)


def _reduce_taps(x, kernel, strides, dil, pb, out_sp, ufunc, fill):
    """``ufunc``-reduce the taps of every window of ``x`` padded by ``pb`` before each
    spatial axis with ``fill`` (and as far as the windows reach after it).

    A box window is separable, so it is reduced one spatial axis at a time, first
    axis first: ``sum(k - 1)`` passes instead of ``prod(k) - 1``, and the strided
    last axis is reduced once the array has already shrunk along the others. No
    padded copy is made: a tap that falls in the padding for some outputs is applied
    only to the outputs where it is inside ``x`` (the padding is ``fill``, the
    reduction's identity: -inf or the lowest integer for max, 0 for a sum).
    """
    nd = len(kernel)
    kernel, pb = _trim_taps(x.shape[x.ndim - nd :], kernel, strides, dil, pb, out_sp)
    if max(kernel) > _MAX_TAPS:
        pe = [max(0, (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - pb[i] - x.shape[x.ndim - nd + i])
              for i in range(nd)]
        xp = pad_spatial(x, pb, pe, fill)
        v = _window_view(xp, kernel, strides, dil, out_sp)
        return ufunc.reduce(v, axis=tuple(range(v.ndim - nd, v.ndim)))
    y, owned = x, False
    for a in range(nd):
        ax = y.ndim - nd + a
        r = None
        if strides[a] == 2:
            r = _reduce_pairs(y, ax, kernel[a], dil[a], pb[a], out_sp[a], ufunc, fill)
        if r is None:
            r = _reduce_axis_flat(y, ax, kernel[a], strides[a], dil[a], pb[a], out_sp[a], ufunc, fill)
        if r is not None:
            y, owned = r, True
            continue
        lead = (slice(None),) * ax
        n, s_, o = y.shape[ax], strides[a], out_sp[a]
        taps = []
        for t in range(kernel[a]):
            off = t * dil[a] - pb[a]
            lo = max(0, -(off // s_))  # first output whose input index is >= 0
            hi = min(o, (n - 1 - off) // s_ + 1) if n - 1 - off >= 0 else 0
            if hi > lo:
                src = slice(lo * s_ + off, (hi - 1) * s_ + off + 1, s_)
                taps.append((lo, hi, y[lead + (src,)]))
        full = [v for lo, hi, v in taps if lo == 0 and hi == o]
        if full:
            r, r_owned = full[0], False  # a view: the first combination allocates
        else:
            shape = y.shape[:ax] + (o,) + y.shape[ax + 1 :]
            # in y's memory order (a channels-last view stays channels last)
            r, r_owned = np.empty_like(y, shape=shape), True
            r.fill(fill)
        for lo, hi, v in taps:
            if full and v is full[0]:
                continue
            if not r_owned:
                # the first combination writes a new array: the taps' part combined,
                # the rest copied from the full tap (one pass, not a copy and a pass)
                src, r, r_owned = r, np.empty_like(r), True
                for a0, a1 in ((0, lo), (hi, o)):
                    if a1 > a0:
                        part = lead + (slice(a0, a1),)
                        r[part] = src[part]
                part = lead + (slice(lo, hi),)
                ufunc(src[part], v, out=r[part])
                continue
            dst = r[lead + (slice(lo, hi),)]
            ufunc(dst, v, out=dst)
        y, owned = r, r_owned or owned
    # a 1x1 window over no padding leaves a view of the input
    return y if owned else y.copy(order="K")


def _reduce_axis_flat(y, ax, k, s, d, pb, o, ufunc, fill):
    """One axis (``ax``) of :func:`_reduce_taps` on a C-contiguous ``y``, or None
    where it does not apply (then the per-tap views run).

    The rows of a feature map are short (7 to 56 values), and a ufunc over a strided
    view pays its inner-loop set-up for every row or plane it crosses. Here the array
    is taken as ``[outer, n, inner]`` and flattened: every tap of every output whose
    window stays inside its ``n`` positions is one 1-D view of the flat array, offset
    by the tap's distance times ``inner`` (and strided by ``s`` along the last axis),
    so each tap is one long pass. Where such a view crosses into the next row or
    plane, the window reaches into the padding; those few output positions are
    recomputed from their in-range taps alone. Needs ``s == 1`` off the last axis,
    and ``s`` dividing the row length with at most ``n / s`` outputs along it.
    """
    n = y.shape[ax]
    inner = math.prod(y.shape[ax + 1 :])
    if not y.flags.c_contiguous or not y.size or n % s or o > n // s or (inner > 1 and s > 1):
        return None
    p = n // s  # output positions per row of the flat views; the first o are kept
    outer = y.size // (n * inner)
    flat = y.reshape(-1)
    out = np.empty((outer, p, inner), dtype=y.dtype)
    # outputs whose every tap lies inside the row
    j0 = -(-pb // s)
    last = n - 1 - (k - 1) * d + pb
    j1 = min(o, last // s + 1) if last >= 0 else 0
    if j1 > j0:
        qa, qb = j0 * inner, ((outer - 1) * p + j1) * inner
        length = (qb - qa - 1) * s + 1
        views = [flat[qa * s + (t * d - pb) * inner :][:length:s] for t in range(k)]
        dst = out.reshape(-1)[qa:qb]
        if k == 1:
            np.copyto(dst, views[0])
        else:
            ufunc(views[0], views[1], out=dst)
            for v in views[2:]:
                ufunc(dst, v, out=dst)
    _edge_outputs(out, y.reshape(outer, n, inner), j0, j1, o, k, s, d, pb, ufunc, fill)
    return (out if o == p else out[:, :o]).reshape(y.shape[:ax] + (o,) + y.shape[ax + 1 :])


def _edge_outputs(out, y, j0, j1, o, k, s, d, pb, ufunc, fill):
    """Outputs ``j`` of axis 1 of ``out`` outside ``j0:j1`` (of ``o``), whose windows
    reach into the padding, reduced from their in-range taps along axis 1 of ``y``
    (``n`` values: tap ``t`` of output ``j`` reads ``j * s + t * d - pb``)."""
    n = y.shape[1]
    for j in itertools.chain(range(min(j0, o)), range(max(j0, j1), o)):
        taps = [c for c in (j * s + t * d - pb for t in range(k)) if 0 <= c < n]
        dst = out[:, j]
        if not taps:
            dst.fill(fill)
        elif len(taps) == 1:
            dst[...] = y[:, taps[0]]
        else:
            ufunc(y[:, taps[0]], y[:, taps[1]], out=dst)
            for c in taps[2:]:
                ufunc(dst, y[:, c], out=dst)


#: Unsigned integer types twice as wide as an element of each size (in bytes).
_PAIR_TYPES = {1: np.uint16, 2: np.uint32, 4: np.uint64}
_HALF_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def deinterleave(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(flat[0::2], flat[1::2])`` as contiguous arrays, for a contiguous 1-D array of
    even length whose elements are 1, 2 or 4 bytes wide.

    numpy copies a stride-2 view at about 0.3 ns a value on this kind of machine, its
    unvectorized strided loop. Viewed as unsigned integers twice as wide, each pair
    is one element whose low half (on a little-endian machine) is the even value: a
    narrowing cast keeps it, in one contiguous pass at about a third of that cost.
    The odd values are the low halves of the same view shifted by one element.
    """
    size = flat.itemsize
    pair, half = _PAIR_TYPES[size], _HALF_TYPES[size]
    n = flat.size // 2
    even = flat.view(pair).astype(half).view(flat.dtype)
    odd = np.empty(n, dtype=flat.dtype)
    if n > 1:
        odd[:-1] = flat[1:-1].view(pair).astype(half).view(flat.dtype)
    if n:
        odd[-1] = flat[-1]
    return even, odd


def _pixel_halves(rows: np.ndarray, inner: int) -> tuple[np.ndarray, np.ndarray]:
    """The even and odd positions of each row of ``rows`` ``[outer, n * inner]`` (C
    contiguous, ``n`` even), a position being ``inner`` consecutive values, as two
    flat contiguous arrays of ``outer * n / 2 * inner`` values.

    One value per position splits through :func:`deinterleave`'s narrowing casts; a
    position of several values (a pixel of a channels-last map, or a whole row of a
    map) is taken as one ``inner``-value wide element, so that each half is one
    strided copy whose inner loop runs along all the rows, instead of one short loop
    per pixel or row."""
    if inner == 1:
        return deinterleave(rows.reshape(-1))
    px = rows.view(np.dtype((np.void, inner * rows.itemsize)))  # [outer, n]
    return (np.ascontiguousarray(px[:, 0::2]).view(rows.dtype).reshape(-1),
            np.ascontiguousarray(px[:, 1::2]).view(rows.dtype).reshape(-1))


def _reduce_pairs(y, ax, k, d, pb, o, ufunc, fill):
    """A stride-2 axis ``ax`` of :func:`_reduce_taps` of even length, on a C-contiguous
    ``y`` (or, for the last axis, an NCHW view of channels-last memory); None where
    that does not apply.

    The array is taken as ``[outer, n, inner]`` and split into its even and odd
    positions along the axis (:func:`_pixel_halves`), after which every tap reads one
    of the two halves at a fixed shift: each tap is then one contiguous pass over
    all rows at once, as in :func:`_reduce_axis_flat`, and the outputs whose taps
    run past a row's ends are recomputed from their in-range positions. With three
    taps or more, two copies of the data and contiguous passes cost less than the
    strided passes they replace, whose inner loops are a row or a pixel long:

    * the last axis, one value a position (64x112x112 MaxPool's last axis: 190 ->
      110 us); in channels-last memory a position is a pixel of ``C`` values (the
      QDQ CNN's 8 x 16 x 32 x 32 int8 3x3 stride-2 MaxPool: 127 -> 96 us for the whole
      pool);
    * an axis before the last, a position being a whole row (or plane): 3x3 stride-2
      MaxPools with the rows split this way before the columns, one thread, tenth
      percentiles: 192 x 56 x 56 502 -> 371 us, 64 x 112 x 112 494 -> 446, 320 x 28 x 28
      282 -> 200, 576 x 14 x 14 177 -> 126.

    Two taps (2x2 stride-2 windows) keep the strided passes: there one pass is all
    the copies would save (128 x 112 x 112: 778 -> 999 us with the rows split).
    """
    n = y.shape[ax]
    if k < 3 or n % 2 or not y.size or sys.byteorder != "little":
        return None
    last = ax == y.ndim - 1
    if y.flags.c_contiguous:
        base, inner = y, math.prod(y.shape[ax + 1 :])
        if inner == 1 and y.itemsize not in _PAIR_TYPES:
            return None
    elif last:
        base = channels_last(y)
        if base is None:
            return None
        inner = y.shape[1]
    else:
        return None
    m = n // 2
    if o > m:
        return None
    outer = y.size // (n * inner)
    halves = _pixel_halves(base.reshape(outer, n * inner), inner)
    taps = [((t * d - pb) % 2, (t * d - pb) // 2) for t in range(k)]
    shifts = [q for _, q in taps]
    out = np.empty((outer, m, inner), dtype=y.dtype)
    flat = out.reshape(-1)
    j0, j1 = max(0, -min(shifts)), min(o, m - max(shifts))
    if j1 > j0:
        qa, qb = j0 * inner, ((outer - 1) * m + j1) * inner
        views = [halves[r][qa + q * inner : qb + q * inner] for r, q in taps]
        ufunc(views[0], views[1], out=flat[qa:qb])
        for v in views[2:]:
            ufunc(flat[qa:qb], v, out=flat[qa:qb])
    _edge_outputs(out, base.reshape(outer, n, inner), j0, j1, o, k, 2, d, pb, ufunc, fill)
    if o < m:
        # before the last axis, contiguous again (one copy of runs of o * inner
        # values) so that the next axis can take its flat or paired path
        out = out[:, :o] if last else np.ascontiguousarray(out[:, :o])
    if y.flags.c_contiguous:
        return out.reshape(y.shape[:ax] + (o,) + y.shape[ax + 1 :])
    # back to an NCHW view of the channels-last result
    res = out.reshape(base.shape[:-2] + (o, inner))
    return res.transpose(0, res.ndim - 1, *range(1, res.ndim - 1))


_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _native_pool(x, kernel, strides, dil, pb, out_sp, mode: int, div=None):
    """MaxPool (``mode`` 0) or AveragePool (1, dividing by ``div``, shaped like the
    output map) of a 1-D or 2-D float32/64 map by the compiled kernel (which picks
    among flat one-row windows, 2 x 2 / 2, output rows for planes past 64 KB and the
    stride phases: native/src/pool2d.c); None where it does not take the layer.
    ResNet-18's 3x3/2 MaxPool on 64 x 112 x 112: 930 us in numpy passes (two threads),
    onnxruntime 90 us."""
    if native.K is None or x.dtype not in _NATIVE_FLOATS or x.ndim not in (3, 4) or min(pb) < 0:
        return None
    if 0 in x.shape:
        return None  # an empty batch or map: the reshape below cannot infer its -1 axis
    if x.ndim == 3:
        kernel, strides, dil, pb, out_sp = (1, *kernel), (1, *strides), (1, *dil), (0, *pb), (1, *out_sp)
    x4 = np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], -1, x.shape[-1])
    n, c, h, w = x4.shape
    if 0 in x4.shape:
        return None
    y = np.empty((n, c, *out_sp), x.dtype)
    if div is not None:
        div = np.ascontiguousarray(np.broadcast_to(div, out_sp), dtype=x.dtype)
    geometry = native.window_geometry(x4.shape, tuple(kernel), tuple(strides), tuple(dil), (pb[0], pb[1]),
                                      tuple(out_sp))
    native.K.pool2d(x4, y, geometry, mode, div, parallel.thread_count())
    return y.reshape(x.shape[:2] + tuple(out_sp[2 - (x.ndim - 2):]))


def _lowest(dt):
    if dt.kind == "f":
        return -np.inf
    if dt.kind in "iu":
        return np.iinfo(dt).min
    raise ValueError(f"unsupported dtype {dt}")


@op("MaxPool", since=1)
class MaxPool(_PoolBase):
    """Max pooling, with the optional Indices output (flattened input positions)."""

    def setup(self):
        super().setup()
        self.storage_order = int(self.attrs.get("storage_order", 0))
        self.want_indices = len(self.node.outputs) > 1 and bool(self.node.outputs[1])

    def run(self, x):
        kernel, strides, dil, pb, pe, extra, out_sp = self._geom(x)
        dt = x.dtype
        xc = x if dt.kind in "iu" or dt in (np.float32, np.float64) else x.astype(np.float32)
        low = _lowest(xc.dtype)
        if not self.want_indices:
            y = _native_pool(xc, kernel, strides, dil, pb, out_sp, 0)
            if y is None:
                y = _reduce_taps(xc, kernel, strides, dil, pb, out_sp, np.maximum, low)
            return (y.astype(dt, copy=False),)
        if 0 in out_sp:
            # a window that fits nowhere along an axis (an empty axis, as onnxruntime
            # gives): the tap slices below would not be empty
            y = np.empty((*x.shape[:2], *out_sp), dtype=dt)
            return y, np.empty(y.shape, np.int64)
        xp = pad_spatial(xc, pb, [e + x_ for e, x_ in zip(pe, extra)], low)
        y = None
        ntaps = math.prod(kernel)
        best = np.zeros((*x.shape[:2], *out_sp), dtype=np.int8 if ntaps <= 127 else np.int32)
        mask = np.empty(best.shape, dtype=bool)
        for t, (_, sl) in enumerate(tap_slices(kernel, strides, dil, out_sp)):
            v = xp[(Ellipsis,) + sl]
            if y is None:
                y = v.copy()
                continue
            # Strictly greater: the first maximal tap in window order wins. A NaN
            # propagates into the value (np.maximum), so the index follows the first
            # NaN too: never a value's index that the output does not hold
            np.greater(v, y, out=mask)
            if v.dtype.kind == "f":
                mask |= np.isnan(v) & ~np.isnan(y)
            np.maximum(y, v, out=y)
            np.putmask(best, mask, t)
        return (y.astype(dt, copy=False), self._indices(x.shape, best, kernel, strides, dil, pb, out_sp))

    def _indices(self, shape, best, kernel, strides, dil, pb, out_sp):
        """Flattened input positions: per-position window origin plus per-tap offset."""
        nd = len(kernel)
        in_sp = shape[2:]
        if self.storage_order == 0:
            mult = [math.prod(in_sp[i + 1 :]) for i in range(nd)]
        else:
            mult = [math.prod(in_sp[:i]) for i in range(nd)]
        tap_off = np.zeros(kernel, dtype=np.int64)
        origin = np.zeros(out_sp, dtype=np.int64)
        for i in range(nd):
            bshape = [-1 if j == i else 1 for j in range(nd)]
            tap_off += (np.arange(kernel[i]) * dil[i] * mult[i]).reshape(bshape)
            origin += ((np.arange(out_sp[i]) * strides[i] - pb[i]) * mult[i]).reshape(bshape)
        plane = math.prod(in_sp)
        base = (np.arange(shape[0] * shape[1], dtype=np.int64) * plane).reshape(shape[0], shape[1], *([1] * nd))
        idx = tap_off.reshape(-1).take(best)
        idx += origin
        idx += base
        return idx


@op("AveragePool", since=1)
class AveragePool(_PoolBase):
    """Average pooling; ``count_include_pad`` counts explicit padding (never ceil-mode overhang)."""

    def setup(self):
        super().setup()
        self.include_pad = int(self.attrs.get("count_include_pad", 0))
        self._divisors = {}  # (spatial shape, dtype) -> the window sizes (about 20 us to build)

    def run(self, x):
        kernel, strides, dil, pb, pe, extra, out_sp = self._geom(x)
        cdt = compute_dtype(x.dtype)
        key = (x.shape[2:], cdt)
        div = self._divisors.get(key)
        if div is None:
            nd = len(kernel)
            if self.include_pad:
                counts = _axis_counts(x.shape[2:], kernel, strides, dil, pb, pb, pe, out_sp)
            else:
                counts = _axis_counts(x.shape[2:], kernel, strides, dil, pb, [0] * nd, [0] * nd, out_sp)
            div = np.maximum(_outer(counts), 1).astype(cdt)
            if len(self._divisors) < 16:
                self._divisors[key] = div
        xc = x.astype(cdt, copy=False)
        y = _native_pool(xc, kernel, strides, dil, pb, out_sp, 1, div)
        if y is None:
            y = _reduce_taps(xc, kernel, strides, dil, pb, out_sp, np.add, 0)
            y /= div
        return (y.astype(x.dtype, copy=False),)


@op("LpPool", since=1)
class LpPool(_PoolBase):
    """Lp pooling: ``(sum |x|^p)^(1/p)`` over each window (padding contributes zero)."""

    def run(self, x):
        kernel, strides, dil, pb, pe, extra, out_sp = self._geom(x)
        p = self.attrs.get("p", 2)
        cdt = compute_dtype(x.dtype)
        xa = np.abs(x.astype(cdt, copy=False))
        xa = xa * xa if p == 2 else np.power(xa, cdt.type(p))
        y = _reduce_taps(xa, kernel, strides, dil, pb, out_sp, np.add, 0)
        y = np.sqrt(y) if p == 2 else np.power(y, cdt.type(1.0 / p))
        return (y.astype(x.dtype, copy=False),)


def _spatial_axes(x):
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
    return tuple(range(2, x.ndim))


@op("GlobalAveragePool", since=1)
def global_average_pool(k, x):
    ax = _spatial_axes(x)
    cdt = compute_dtype(x.dtype)
    s = plane_sum(x.astype(cdt, copy=False))
    if s is None:
        return np.mean(x, axis=ax, keepdims=True, dtype=cdt).astype(x.dtype, copy=False)
    # the sum divided by the count, as np.mean does
    s /= cdt.type(math.prod(x.shape[2:]))
    return s.reshape(x.shape[:2] + (1,) * len(ax)).astype(x.dtype, copy=False)


@op("GlobalMaxPool", since=1)
def global_max_pool(k, x):
    return np.max(x, axis=_spatial_axes(x), keepdims=True)


@op("GlobalLpPool", since=1)
def global_lp_pool(k, x, *, p=2):
    ax = _spatial_axes(x)
    cdt = compute_dtype(x.dtype)
    xa = np.abs(x.astype(cdt, copy=False))
    if p == 2:
        y = np.sqrt(np.sum(xa * xa, axis=ax, keepdims=True))
    else:
        y = np.power(np.sum(np.power(xa, cdt.type(p)), axis=ax, keepdims=True), cdt.type(1.0 / p))
    return y.astype(x.dtype, copy=False)


@op("MaxUnpool", since=9)
def max_unpool(k, x, indices, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    """Scatter ``x`` to the flattened positions ``indices`` of a zero output."""
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3, got shape {x.shape}")
    if indices.shape != x.shape:
        raise ValueError(f"indices shape {indices.shape} differs from input shape {x.shape}")
    nd = x.ndim - 2
    if kernel_shape is None or len(kernel_shape) != nd:
        raise ValueError(f"kernel_shape {kernel_shape} must have {nd} entries")
    strides = strides or [1] * nd
    pads = pads or [0] * (2 * nd)
    inferred = x.shape[:2] + tuple(
        (x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[nd + i] + kernel_shape[i] for i in range(nd)
    )
    # Indices address the inferred (unpadded MaxPool input) shape; an explicit
    # output_shape places that block at the origin of a larger zero output.
    # Both come from the strides and pads attributes (and a fed output_shape): capped
    check_allocation(inferred, x.dtype, "MaxUnpool output")
    y = np.zeros(inferred, dtype=x.dtype)
    flat = indices.reshape(-1).astype(np.int64, copy=False)
    if flat.size and (flat.min() < 0 or flat.max() >= y.size):
        raise IndexError(f"MaxUnpool index out of range for output of shape {inferred}")
    y.reshape(-1)[flat] = x.reshape(-1)
    if output_shape is not None:
        shape = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
        if len(shape) != x.ndim:
            raise ValueError(f"output_shape {list(shape)} must have rank {x.ndim}")
        if shape != inferred:
            check_allocation(shape, x.dtype, "MaxUnpool output")
            out = np.zeros(shape, dtype=x.dtype)
            common = tuple(slice(0, min(a, b)) for a, b in zip(shape, inferred))
            out[common] = y[common]
            y = out
    return y


@op("MaxRoiPool", since=1)
def max_roi_pool(k, x, rois, *, pooled_shape=None, spatial_scale=1.0):
    """Max pooling over each RoI ``[batch_id, x1, y1, x2, y2]`` into ``pooled_shape`` bins."""
    if pooled_shape is None or len(pooled_shape) != 2:
        raise ValueError(f"pooled_shape {pooled_shape} must be [height, width]")
    if x.ndim != 4:
        raise ValueError(f"input must be 4-D, got shape {x.shape}")
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"rois must have shape (num_rois, 5), got {rois.shape}")
    ph_n, pw_n = (int(v) for v in pooled_shape)
    n, c, h, w = x.shape
    # pooled_shape is an attribute: any size a model asks for
    y = np.zeros(check_allocation((rois.shape[0], c, ph_n, pw_n), x.dtype, "MaxRoiPool output"), dtype=x.dtype)
    r = rois.astype(np.float64)

    def rnd(v):  # half away from zero
        return int(np.sign(v) * np.floor(abs(v) + 0.5))

    for i in range(rois.shape[0]):
        b = int(r[i, 0])
        if not 0 <= b < n:
            raise IndexError(f"roi {i} has batch index {b}, outside [0, {n})")
        x1, y1, x2, y2 = (rnd(v * spatial_scale) for v in r[i, 1:])
        rh = max(y2 - y1 + 1, 1)
        rw = max(x2 - x1 + 1, 1)
        bh, bw = rh / ph_n, rw / pw_n
        hs = np.clip(np.floor(np.arange(ph_n) * bh).astype(int) + y1, 0, h)
        he = np.clip(np.ceil(np.arange(1, ph_n + 1) * bh).astype(int) + y1, 0, h)
        ws = np.clip(np.floor(np.arange(pw_n) * bw).astype(int) + x1, 0, w)
        we = np.clip(np.ceil(np.arange(1, pw_n + 1) * bw).astype(int) + x1, 0, w)
        r0, r1 = hs.min(), he.max()
        if r1 <= r0:
            continue
        plane = x[b, :, r0:r1]
        # Reduce columns per width bin first, then rows per height bin.
        cols = np.full((c, r1 - r0, pw_n), -np.inf if x.dtype.kind == "f" else 0, dtype=x.dtype)
        for j in range(pw_n):
            if we[j] > ws[j]:
                cols[:, :, j] = plane[:, :, ws[j] : we[j]].max(axis=2)
        for j in range(ph_n):
            if he[j] > hs[j]:
                y[i, :, j] = cols[:, hs[j] - r0 : he[j] - r0].max(axis=1)
        empty_w = we <= ws
        if empty_w.any():
            y[i][:, :, empty_w] = 0
    return y


def _bilinear_axis(coords, size):
    """Per sample: low and high neighbor indices and their weights along one axis;
    samples beyond ``[-1, size]`` get zero weights."""
    valid = (coords >= -1.0) & (coords <= size)
    c = np.maximum(coords, 0.0)
    low = np.floor(c).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    c = np.where(at_end, low, c)
    frac = c - low
    w_low = np.where(valid, 1.0 - frac, 0.0)
    w_high = np.where(valid, frac, 0.0)
    return low, high, w_low, w_high


@op("RoiAlign", since=10)
class RoiAlign(Kernel):
    """RoI Align with bilinear sampling; ``avg`` mode as separable interpolation
    matrices, ``max`` mode as the max of weighted corner values per sample."""

    def setup(self):
        a = self.attrs
        self.mode = a.get("mode", "avg")
        if self.mode not in ("avg", "max"):
            raise ValueError(f"{self.node.describe()}: unknown mode {self.mode!r}")
        self.oh = int(a.get("output_height", 1))
        self.ow = int(a.get("output_width", 1))
        self.sampling_ratio = int(a.get("sampling_ratio", 0))
        self.scale = float(a.get("spatial_scale", 1.0))
        default = "half_pixel" if self.node.opset >= 16 else "output_half_pixel"
        self.half_pixel = a.get("coordinate_transformation_mode", default) == "half_pixel"

    def run(self, x, rois, batch_indices):
        if x.ndim != 4:
            raise ValueError(f"input must be 4-D, got shape {x.shape}")
        if rois.ndim != 2 or rois.shape[1] != 4:
            raise ValueError(f"rois must have shape (num_rois, 4), got {rois.shape}")
        if batch_indices.shape != (rois.shape[0],):
            raise ValueError(f"batch_indices shape {batch_indices.shape} must be ({rois.shape[0]},)")
        n, c, h, w = x.shape
        cdt = compute_dtype(x.dtype)
        oh, ow = self.oh, self.ow
        # output_height and output_width are attributes: any size a model asks for
        y = np.zeros(check_allocation((rois.shape[0], c, oh, ow), cdt, "RoiAlign output"), dtype=cdt)
        off = 0.5 if self.half_pixel else 0.0
        r = rois.astype(np.float64) * self.scale - off
        for i in range(rois.shape[0]):
            b = int(batch_indices[i])
            if not 0 <= b < n:
                raise IndexError(f"batch index {b} of roi {i} is outside [0, {n})")
            x1, y1, x2, y2 = r[i]
            rw, rh = x2 - x1, y2 - y1
            if not self.half_pixel:
                rw, rh = max(rw, 1.0), max(rh, 1.0)
            bh, bw = rh / oh, rw / ow
            gh = self.sampling_ratio if self.sampling_ratio > 0 else int(np.ceil(rh / oh))
            gw = self.sampling_ratio if self.sampling_ratio > 0 else int(np.ceil(rw / ow))
            count = max(gh * gw, 1)
            if gh <= 0 or gw <= 0:
                continue
            ys = y1 + (np.arange(oh)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh).reshape(-1)
            xs = x1 + (np.arange(ow)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw).reshape(-1)
            yl, yh, wyl, wyh = _bilinear_axis(ys, h)
            xl, xh, wxl, wxh = _bilinear_axis(xs, w)
            img = x[b]
            if self.mode == "avg":
                r0, r1 = int(yl.min()), int(yh.max()) + 1
                c0, c1 = int(xl.min()), int(xh.max()) + 1
                ay = np.zeros((oh, r1 - r0))
                bins_y = np.repeat(np.arange(oh), gh)
                np.add.at(ay, (bins_y, yl - r0), wyl)
                np.add.at(ay, (bins_y, yh - r0), wyh)
                ax = np.zeros((ow, c1 - c0))
                bins_x = np.repeat(np.arange(ow), gw)
                np.add.at(ax, (bins_x, xl - c0), wxl)
                np.add.at(ax, (bins_x, xh - c0), wxh)
                region = img[:, r0:r1, c0:c1].astype(cdt, copy=False)
                t = np.matmul(ay.astype(cdt), region)  # [C, oh, cols]
                y[i] = np.matmul(t, (ax.T / count).astype(cdt))
            else:
                best = None
                for yi, wy in ((yl, wyl), (yh, wyh)):
                    rows = img[:, yi].astype(cdt, copy=False)  # [C, Sy, W]
                    for xi, wx in ((xl, wxl), (xh, wxh)):
                        v = rows[:, :, xi] * np.multiply.outer(wy, wx).astype(cdt)
                        best = v if best is None else np.maximum(best, v, out=best)
                y[i] = best.reshape(c, oh, gh, ow, gw).max(axis=(2, 4))
        return (y.astype(x.dtype, copy=False),)
