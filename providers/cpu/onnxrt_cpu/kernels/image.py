"""Image operators: Resize, GridSample, AffineGrid, NonMaxSuppression, ImageDecoder.

Resize is separable: each resized axis gets a precomputed table of source indices
and weights (``[out, taps]``), applied with one ``take`` and one multiply-add per tap.
GridSample gathers the ``taps ** rank`` neighbours of every sampling point from the
flattened spatial block, one gather per tap combination.
"""

from __future__ import annotations

import io
import itertools
import math

import numpy as np

from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import check_allocation
from onnxrt.plugin.resize_geometry import axis_order, axis_table, cubic_kernel, source_coords

from .. import native, parallel
from ..large_outputs import OutputSlot
from ..registry import op

__all__ = ["Resize", "GridSample", "affine_grid", "non_max_suppression", "image_decoder"]


def _float_dtype(dt: np.dtype) -> np.dtype:
    """The dtype interpolation arithmetic runs in for inputs of dtype ``dt``."""
    if dt == np.float64:
        return dt
    if dt.kind in "iu" and dt.itemsize > 2:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _cast_result(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Cast interpolated values back to ``dt``, rounding and saturating integers."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        y = np.clip(np.rint(y), info.min, info.max)
    return y.astype(dt, copy=False)


# -- Resize -------------------------------------------------------------------------

_COORD_MODES = {
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",
}


@op("Resize", since=10)
class Resize(Kernel):
    """Resize (opsets 10-19): nearest / linear / cubic, every coordinate mode, antialias, axes."""

    def setup(self):
        a = self.attrs
        opset = self.node.opset
        self.mode = a.get("mode", "nearest")
        if self.mode not in ("nearest", "linear", "cubic"):
            raise ValueError(f"{self.node.describe()}: unknown mode {self.mode!r}")
        if opset < 11:
            if self.mode == "cubic":
                raise ValueError(f"{self.node.describe()}: mode 'cubic' needs opset 11")
            # Resize-10 samples like Upsample: asymmetric coordinates
            self.coord = "asymmetric"
            self.nearest_mode = "simple"
        else:
            self.coord = a.get("coordinate_transformation_mode", "half_pixel")
            self.nearest_mode = a.get("nearest_mode", "round_prefer_floor")
        if self.coord not in _COORD_MODES:
            raise ValueError(f"{self.node.describe()}: unknown coordinate_transformation_mode {self.coord!r}")
        if self.nearest_mode not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"):
            raise ValueError(f"{self.node.describe()}: unknown nearest_mode {self.nearest_mode!r}")
        self.cubic_a = float(a.get("cubic_coeff_a", -0.75))
        self.exclude_outside = bool(a.get("exclude_outside", 0))
        self.extrapolation_value = float(a.get("extrapolation_value", 0.0))
        self.antialias = bool(a.get("antialias", 0)) and self.mode != "nearest"
        self.axes = a.get("axes")
        self.policy = a.get("keep_aspect_ratio_policy", "stretch")
        if self.policy not in ("stretch", "not_larger", "not_smaller"):
            raise ValueError(f"{self.node.describe()}: unknown keep_aspect_ratio_policy {self.policy!r}")
        self._tables: dict = {}
        self._plans: dict = {}
        # the compiled kernel's output, kept where 32 MiB or more (see large_outputs)
        self._slot = OutputSlot()

    # -- output geometry ---------------------------------------------------------
    def _geometry(self, x, roi, scales, sizes):
        """Per axis: (scale, output size, roi start, roi end) for every axis of x."""
        r = x.ndim
        shape = x.shape
        if self.axes is not None:
            axes = [int(v) + r if int(v) < 0 else int(v) for v in self.axes]
            if any(v < 0 or v >= r for v in axes) or len(set(axes)) != len(axes):
                raise ValueError(f"{self.node.describe()}: axes {self.axes} invalid for rank {r}")
        else:
            axes = list(range(r))
        n = len(axes)
        if scales is not None and np.size(scales) == 0:
            scales = None
        if sizes is not None and np.size(sizes) == 0:
            sizes = None
        if (scales is None) == (sizes is None):
            raise ValueError(f"{self.node.describe()}: exactly one of 'scales' and 'sizes' must be given")
        scale = [1.0] * r
        out = list(shape)
        if scales is not None:
            s = np.asarray(scales, dtype=np.float64).reshape(-1)
            if s.size != n:
                raise ValueError(f"{self.node.describe()}: scales has {s.size} entries, expected {n}")
            if (s <= 0).any():
                raise ValueError(f"{self.node.describe()}: scales must be positive, got {s}")
            for i, ax in enumerate(axes):
                scale[ax] = float(s[i])
                out[ax] = int(np.floor(shape[ax] * s[i]))
        else:
            sz = np.asarray(sizes, dtype=np.int64).reshape(-1)
            if sz.size != n:
                raise ValueError(f"{self.node.describe()}: sizes has {sz.size} entries, expected {n}")
            if (sz < 0).any():
                raise ValueError(f"{self.node.describe()}: sizes must be non-negative, got {sz}")
            if self.policy == "stretch":
                for i, ax in enumerate(axes):
                    out[ax] = int(sz[i])
                    scale[ax] = sz[i] / shape[ax] if shape[ax] else 1.0
            else:
                ratios = [sz[i] / shape[ax] for i, ax in enumerate(axes) if shape[ax]]
                s = (min if self.policy == "not_larger" else max)(ratios) if ratios else 1.0
                for ax in axes:
                    scale[ax] = s
                    out[ax] = int(np.floor(s * shape[ax] + 0.5))
        starts = [0.0] * r
        ends = [1.0] * r
        if self.coord == "tf_crop_and_resize":
            if roi is None or np.size(roi) == 0:
                raise ValueError(f"{self.node.describe()}: tf_crop_and_resize needs the 'roi' input")
            rv = np.asarray(roi, dtype=np.float64).reshape(-1)
            if rv.size != 2 * n:
                raise ValueError(f"{self.node.describe()}: roi has {rv.size} entries, expected {2 * n}")
            for i, ax in enumerate(axes):
                starts[ax] = float(rv[i])
                ends[ax] = float(rv[n + i])
        return axes, scale, out, starts, ends

    def _table(self, in_len, out_len, scale, start, end):
        """The :class:`_AxisPlan` of one axis, memoized by its geometry."""
        key = (in_len, out_len, scale, start, end)
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        x = source_coords(self.coord, in_len, out_len, scale, start, end)
        outside = None
        if self.coord == "tf_crop_and_resize":
            outside = (x < 0) | (x > in_len - 1)
            if not outside.any():
                outside = None
        idx, w = axis_table(x, in_len, scale, mode=self.mode, nearest_mode=self.nearest_mode,
                            cubic_a=self.cubic_a, antialias=self.antialias, exclude_outside=self.exclude_outside)
        res = _AxisPlan(in_len, idx, w, outside)
        if len(self._tables) > 64:
            self._tables.clear()
        self._tables[key] = res
        return res

    def run(self, X, roi=None, scales=None, sizes=None):
        if self.node.opset < 11:
            # Resize-10 takes (X, scales)
            roi, scales, sizes = None, roi, None
        # the resampling plan depends only on X's shape and type and on roi, scales and
        # sizes (small constants, as a rule): deriving it (output geometry, allocation
        # checks, axis order, tables) cost about 200 us a call, twice what a detector's
        # 2x upsampling of 64x20x20 takes to copy
        key = (X.shape, X.dtype.str, _value_key(roi), _value_key(scales), _value_key(sizes))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(X, roi, scales, sizes)
            if len(self._plans) >= 16:
                self._plans.clear()
            self._plans[key] = plan
        out, work, steps, fast = plan
        in_dt = np.dtype(X.dtype)
        if work is None:
            return (np.zeros(out, dtype=in_dt),)
        if fast is not None and native.K is not None:
            return (self._run_native(X, out, work, steps, fast),)
        masks = []
        if self.mode == "nearest":
            y = X
        else:
            y = X.astype(_float_dtype(in_dt), copy=False)
        for ax, step in zip(work, steps):
            y = step.apply(y, ax)
            if step.outside is not None:
                masks.append((ax, step.outside))
        if y is X:
            return (X.view(),)
        for ax, m in masks:
            y[(slice(None),) * ax + (m,)] = np.asarray(self.extrapolation_value).astype(y.dtype)
        return (_cast_result(y, in_dt) if self.mode != "nearest" else y,)

    def _plan(self, X, roi, scales, sizes):
        """``(output shape, axes to resample in order or None for an empty output,
        their :class:`_AxisPlan` s)`` for this input, with every check a run makes."""
        axes, scale, out, starts, ends = self._geometry(X, roi, scales, sizes)
        in_dt = np.dtype(X.dtype)
        # intermediates are computed in float64 at worst
        check_allocation(out, np.float64 if self.mode != "nearest" else in_dt, f"{self.node.describe()} output")
        for ax in axes:
            check_allocation((out[ax], 4), np.float64, f"{self.node.describe()} interpolation table")
        if self.mode != "nearest" and in_dt.kind not in "fiu" and in_dt != np.float16:
            if in_dt.kind != "V":  # ml_dtypes floats (bfloat16) have kind 'V'
                raise ValueError(f"{self.node.describe()}: mode {self.mode!r} needs numeric input, got {in_dt}")
        work = []
        for ax in axes:
            identity = (
                out[ax] == X.shape[ax]
                and scale[ax] == 1.0
                and (self.coord != "tf_crop_and_resize" or (starts[ax] == 0.0 and ends[ax] == 1.0))
            )
            if not identity:
                work.append(ax)
        if any(out[ax] == 0 for ax in work) or X.size == 0:
            return tuple(out), None, (), None
        if any(X.shape[ax] == 0 for ax in work):
            raise ValueError(f"{self.node.describe()}: cannot resize an empty axis to a non-empty one")
        work = axis_order(work, list(X.shape), out)
        steps = tuple(self._table(X.shape[ax], out[ax], scale[ax], starts[ax], ends[ax]) for ax in work)
        return tuple(out), tuple(work), steps, self._native_tables(X, out, work, steps)

    def _native_tables(self, X, out, work, steps):
        """The tables of the compiled kernel (native/src/resize2d.c) where it takes this
        resize: float32 (or float16 interpolated in float32, as the numpy path does)
        input of rank 2 or more whose resized axes are among its last two; None
        otherwise. ``(iy, wy, ix, wx, order)``: per axis int64 indices and float32
        weights ``[out, taps]`` (None: nearest, a copy), and the order the numpy path
        resamples the two axes in (0 rows first, 1 columns first), so that the sums
        are the same."""
        dt = np.dtype(X.dtype)
        r = X.ndim
        if r < 2 or not work or not set(work) <= {r - 2, r - 1} or X.size == 0:
            return None
        if not (dt == np.float32 or (dt == np.float16 and self.mode != "nearest")):
            return None
        plans = dict(zip(work, steps))
        tables = []
        for ax in (r - 2, r - 1):
            step = plans.get(ax)
            if step is None:  # not resized: each position reads itself
                tables += [np.arange(X.shape[ax], dtype=np.int64).reshape(-1, 1), None]
                continue
            if step.idx.shape[1] > 64:
                return None
            idx = np.ascontiguousarray(step.idx, dtype=np.int64)
            w = None if step.w is None else np.ascontiguousarray(step.w.astype(np.float32))
            tables += [idx, w]
        order = 1 if list(work) == [r - 1, r - 2] else 0
        return (*tables, order)

    def _run_native(self, X, out, work, steps, fast):
        """Resize through the compiled kernel: one pass, every output row made once
        (the numpy path writes a whole tensor per tap and axis)."""
        iy, wy, ix, wx, order = fast
        in_dt = np.dtype(X.dtype)
        x = np.ascontiguousarray(X, dtype=np.float32)
        h, w = x.shape[-2:]
        oh, ow = out[-2:]
        planes = int(np.prod(out[:-2], dtype=np.int64))
        y = self._slot.empty(out, np.float32)
        native.K.resize2d(x, y, planes, h, w, oh, ow, iy, wy, iy.shape[1], ix, wx, ix.shape[1], order,
                          parallel.thread_count())
        for ax, step in zip(work, steps):
            if step.outside is not None:  # tf_crop_and_resize outside the input
                y[(slice(None),) * ax + (step.outside,)] = np.float32(self.extrapolation_value)
        return y if in_dt == np.float32 else _cast_result(y, in_dt)


def _value_key(v):
    """A hashable stand-in for an optional small input array (its type, shape and bytes)."""
    if v is None:
        return None
    a = np.asarray(v)
    return (a.dtype.str, a.shape, a.tobytes())


def _repeat_last(y: np.ndarray, k: int) -> np.ndarray:
    """``np.repeat(y, k, axis=-1)`` as ``k`` strided copies of ``y``. A take (or numpy's
    repeat) along the last axis moves one value at a time: the last axis of a
    detector's 2x nearest upsampling of 64x20x20 took 75 us by ``take`` and 31 us so
    (both axes, whole: 128 -> 43 us standalone; 256x40x40: 1522 -> 874 us). Along
    any other axis a take copies whole rows, as fast as anything."""
    out = np.empty(y.shape + (k,), dtype=y.dtype)
    for j in range(k):
        out[..., j] = y
    return out.reshape(y.shape[:-1] + (y.shape[-1] * k,))


class _AxisPlan:
    """How one axis is resampled: edge-clamped source indices and weights per output
    position (``[out, taps]``), plus the positions that take the extrapolation value."""

    def __init__(self, in_len, idx, w, outside):
        self.out_len = idx.shape[0]
        self.idx = np.clip(idx, 0, in_len - 1).astype(np.intp)
        self.w = w
        self.outside = outside
        #: nearest sampling that repeats every source position ``factor`` times in
        #: order (an integer upsampling, as detectors' 2x Upsample/Resize): 0 otherwise
        self.factor = 0
        k = self.out_len // in_len if in_len else 0
        if (w is None and outside is None and k > 1 and k * in_len == self.out_len
                and np.array_equal(self.idx[:, 0], np.arange(self.out_len) // k)):
            self.factor = k

    def apply(self, y, ax):
        """Resample axis ``ax`` of ``y``: one ``take`` and one multiply-add per tap
        (nearest: one ``take``, or :func:`_repeat_last` for an integer upsampling of
        the last axis)."""
        if self.w is None:
            if self.factor and ax == y.ndim - 1:
                return _repeat_last(y, self.factor)
            return np.take(y, self.idx[:, 0], axis=ax)
        wshape = [1] * y.ndim
        wshape[ax] = self.out_len
        w = self.w.astype(y.dtype)
        acc = None
        for k in range(self.idx.shape[1]):
            term = np.take(y, self.idx[:, k], axis=ax)
            term *= w[:, k].reshape(wshape)
            acc = term if acc is None else np.add(acc, term, out=acc)
        return acc


# -- GridSample ---------------------------------------------------------------------


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates into ``[lo, hi]`` by folding at the borders."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    t = np.abs(x - lo)
    n = np.floor(t / span)
    r = t - n * span
    return np.where(n % 2 == 0, lo + r, hi - r)


@op("GridSample", since=16)
class GridSample(Kernel):
    """GridSample (16, 20, 22): nearest / (bi)linear / (bi)cubic, zeros / border / reflection, N-D."""

    def setup(self):
        a = self.attrs
        opset = self.node.opset
        mode = a.get("mode", "bilinear" if opset < 20 else "linear")
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
        if mode not in ("nearest", "linear", "cubic"):
            raise ValueError(f"{self.node.describe()}: unknown mode {a.get('mode')!r}")
        self.mode = mode
        self.padding = a.get("padding_mode", "zeros")
        if self.padding not in ("zeros", "border", "reflection"):
            raise ValueError(f"{self.node.describe()}: unknown padding_mode {self.padding!r}")
        self.align = bool(a.get("align_corners", 0))

    def run(self, X, grid):
        r = X.ndim - 2
        if r < 1 or grid.ndim != r + 2 or grid.shape[-1] != r or grid.shape[0] != X.shape[0]:
            raise ValueError(
                f"{self.node.describe()}: X {X.shape} and grid {grid.shape} do not match "
                f"(grid must be [N, *out_spatial, {max(r, 1)}])"
            )
        N, C = X.shape[:2]
        dims = X.shape[2:]
        out_sp = grid.shape[1:-1]
        in_dt = np.dtype(X.dtype)
        P = math.prod(out_sp)
        if N == 0 or C == 0 or P == 0:
            return (np.zeros((N, C, *out_sp), dtype=in_dt),)
        fdt = _float_dtype(in_dt) if in_dt.kind in "fiu" or in_dt.kind == "V" else np.dtype(np.float32)
        # the output is X's channels times the grid's points: two inputs' sizes multiplied
        check_allocation((N, C, P), fdt, f"{self.node.describe()} output")
        g = grid.reshape(N, P, r).astype(np.float64)
        # grid's last axis lists coordinates innermost-first (x, y, z)
        coords = []
        for i, d in enumerate(dims):
            n = g[:, :, r - 1 - i]
            x = (n + 1) / 2 * (d - 1) if self.align else ((n + 1) * d - 1) / 2
            if self.mode == "nearest":
                x = np.rint(x)
            lo, hi = (0.0, d - 1.0) if self.align else (-0.5, d - 0.5)
            if self.padding == "border":
                if self.mode != "cubic":  # cubic clamps each tap instead
                    x = np.clip(x, 0, d - 1)
            elif self.padding == "reflection":
                x = np.where((x < lo) | (x > hi), _reflect(x, lo, hi), x)
            coords.append(x)

        # per spatial axis: tap indices [N, P, taps], weights [N, P, taps], valid mask
        taps = []
        for i, d in enumerate(dims):
            x = coords[i]
            if self.mode == "nearest":
                idx = x[:, :, None].astype(np.int64)
                w = None
            else:
                x0 = np.floor(x)
                t = (x - x0)[:, :, None]
                if self.mode == "linear":
                    offs = np.array([0, 1])
                    w = np.concatenate([1 - t, t], axis=2)
                else:
                    offs = np.array([-1, 0, 1, 2])
                    w = cubic_kernel(offs[None, None, :] - t, -0.75)
                idx = x0.astype(np.int64)[:, :, None] + offs
            valid = None
            if self.padding == "zeros":
                valid = (idx >= 0) & (idx < d)
                idx = np.clip(idx, 0, d - 1)
            elif self.padding == "border":
                idx = np.clip(idx, 0, d - 1)
            else:
                lo, hi = (0.0, d - 1.0) if self.align else (-0.5, d - 0.5)
                out = (idx < lo) | (idx > hi)
                if out.any():
                    idx = np.where(out, _reflect(idx.astype(np.float64), lo, hi).astype(np.int64), idx)
                idx = np.clip(idx, 0, d - 1)
            taps.append((idx, w, valid))

        strides = [math.prod(dims[i + 1 :]) for i in range(r)]
        S = math.prod(dims)
        # channels last, so every tap gathers one contiguous row of C values
        rows_x = X.reshape(N, C, S).transpose(0, 2, 1).reshape(N * S, C)
        if self.mode != "nearest":
            rows_x = rows_x.astype(fdt, copy=False)
        batch_off = (np.arange(N, dtype=np.int64) * S)[:, None]
        acc = None
        for combo in itertools.product(*(range(t[0].shape[2]) for t in taps)):
            flat = batch_off
            wt = None
            ok = None
            for i, j in enumerate(combo):
                idx, w, valid = taps[i]
                flat = flat + idx[:, :, j] * strides[i]
                if w is not None:
                    wt = w[:, :, j] if wt is None else wt * w[:, :, j]
                if valid is not None:
                    ok = valid[:, :, j] if ok is None else ok & valid[:, :, j]
            vals = np.take(rows_x, flat.reshape(-1), axis=0).reshape(N, P, C)
            if self.mode == "nearest":
                if ok is not None:
                    vals = np.where(ok[:, :, None], vals, np.zeros((), in_dt))
                acc = vals
                break
            if ok is not None:
                wt = np.where(ok, wt, 0.0)
            vals *= wt.astype(fdt)[:, :, None]
            if acc is None:
                acc = vals
            else:
                acc += vals
        y = acc.transpose(0, 2, 1).reshape(N, C, *out_sp)
        if self.mode == "nearest":
            return (np.ascontiguousarray(y, dtype=in_dt),)
        return (np.ascontiguousarray(_cast_result(y, in_dt)),)


# -- AffineGrid ---------------------------------------------------------------------


@op("AffineGrid", since=20)
def affine_grid(k, theta, size, *, align_corners=0):
    """Sampling grid ``[N, *spatial, r]`` from affine matrices theta ``[N, r, r+1]``."""
    size = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(size) not in (4, 5):
        raise ValueError(f"{k.node.describe()}: size must have 4 (2-D) or 5 (3-D) entries, got {size}")
    N = size[0]
    spatial = size[2:]
    r = len(spatial)
    check_allocation([N, *spatial, r], np.float64, f"{k.node.describe()} output")
    if theta.shape != (N, r, r + 1):
        raise ValueError(f"{k.node.describe()}: theta must be {(N, r, r + 1)} for size {size}, got {theta.shape}")
    dt = np.dtype(theta.dtype)
    cdt = np.float64 if dt == np.float64 else np.float32
    axes = []
    for d in spatial:
        if align_corners:
            a = np.linspace(-1.0, 1.0, d) if d > 1 else np.zeros(d)
        else:
            a = (2 * np.arange(d, dtype=np.float64) + 1) / d - 1
        axes.append(a.astype(cdt))
    mesh = np.meshgrid(*axes, indexing="ij")  # spatial order (z, y, x)
    P = math.prod(spatial)
    # homogeneous base points, coordinates innermost-first: (x, y[, z], 1)
    base = np.empty((P, r + 1), cdt)
    for i in range(r):
        base[:, i] = mesh[r - 1 - i].reshape(-1)
    base[:, r] = 1
    grid = np.matmul(base, theta.astype(cdt, copy=False).transpose(0, 2, 1))  # [N, P, r]
    return grid.reshape(N, *spatial, r).astype(dt, copy=False)


# -- NonMaxSuppression --------------------------------------------------------------


@op("NonMaxSuppression", since=10)
def non_max_suppression(
    k, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None, *, center_point_box=0
):
    """Greedy per-(batch, class) suppression; returns ``[num_selected, 3]`` int64 indices."""
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"{k.node.describe()}: boxes must be [batches, boxes, 4], got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"{k.node.describe()}: scores {scores.shape} do not match boxes {boxes.shape}")
    max_out = 0 if max_output_boxes_per_class is None or np.size(max_output_boxes_per_class) == 0 else int(
        np.asarray(max_output_boxes_per_class).reshape(-1)[0]
    )
    iou_thr = 0.0 if iou_threshold is None or np.size(iou_threshold) == 0 else float(
        np.asarray(iou_threshold).reshape(-1)[0]
    )
    score_thr = None
    if score_threshold is not None and np.size(score_threshold):
        score_thr = float(np.asarray(score_threshold).reshape(-1)[0])
    if not 0.0 <= iou_thr <= 1.0:
        raise ValueError(f"{k.node.describe()}: iou_threshold must lie in [0, 1], got {iou_thr}")
    if max_out <= 0 or boxes.shape[1] == 0:
        return np.zeros((0, 3), np.int64)

    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        y1, x1, y2, x2 = yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    else:
        # corners may come in either order along each axis
        y1 = np.minimum(b[..., 0], b[..., 2])
        y2 = np.maximum(b[..., 0], b[..., 2])
        x1 = np.minimum(b[..., 1], b[..., 3])
        x2 = np.maximum(b[..., 1], b[..., 3])
    area = (y2 - y1) * (x2 - x1)

    out = []
    for bi in range(boxes.shape[0]):
        by1, bx1, by2, bx2, barea = y1[bi], x1[bi], y2[bi], x2[bi], area[bi]
        for ci in range(scores.shape[1]):
            s = scores[bi, ci]
            cand = np.arange(s.shape[0]) if score_thr is None else np.nonzero(s > score_thr)[0]
            if cand.size == 0:
                continue
            order = cand[np.argsort(-s[cand], kind="stable")]
            keep = []
            while order.size and len(keep) < max_out:
                i = order[0]
                keep.append(i)
                rest = order[1:]
                if rest.size == 0:
                    break
                ih = np.minimum(by2[i], by2[rest]) - np.maximum(by1[i], by1[rest])
                iw = np.minimum(bx2[i], bx2[rest]) - np.maximum(bx1[i], bx1[rest])
                inter = np.maximum(ih, 0) * np.maximum(iw, 0)
                union = barea[i] + barea[rest] - inter
                valid = (barea[i] > 0) & (barea[rest] > 0) & (union > 0)
                iou = np.where(valid, inter / np.where(union > 0, union, 1.0), 0.0)
                order = rest[iou <= iou_thr]
            if keep:
                sel = np.empty((len(keep), 3), np.int64)
                sel[:, 0] = bi
                sel[:, 1] = ci
                sel[:, 2] = keep
                out.append(sel)
    if not out:
        return np.zeros((0, 3), np.int64)
    return np.concatenate(out, axis=0)


# -- ImageDecoder -------------------------------------------------------------------


@op("ImageDecoder", since=20)
def image_decoder(k, encoded_stream, *, pixel_format="RGB"):
    """Decode an encoded image (JPEG, PNG, BMP, TIFF, WebP, ...) to ``[H, W, C]`` uint8."""
    try:
        from PIL import Image
    except ImportError as e:  # Pillow is an optional dependency
        raise ImportError(
            "ImageDecoder needs Pillow; install it with: pip install 'onnxrt-cpu[image]'"
        ) from e
    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise ValueError(f"{k.node.describe()}: unknown pixel_format {pixel_format!r}")
    data = np.ascontiguousarray(encoded_stream, dtype=np.uint8).tobytes()
    try:
        img = Image.open(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - Pillow raises many kinds of errors
        raise ValueError(f"{k.node.describe()}: cannot decode the image: {e}") from e
    # the header gives the size before anything is decoded: a few bytes of a PNG can
    # claim a picture of any size (decoded as up to 4 bytes a pixel, then converted)
    check_allocation((img.size[1], img.size[0], 4), np.uint8, "ImageDecoder image")
    try:
        img.load()
    except Exception as e:  # noqa: BLE001 - Pillow raises many kinds of errors
        raise ValueError(f"{k.node.describe()}: cannot decode the image: {e}") from e
    if pixel_format == "Grayscale":
        arr = np.asarray(img.convert("L"), dtype=np.uint8)[:, :, None]
    else:
        arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
        if pixel_format == "BGR":
            arr = arr[:, :, ::-1]
    return np.ascontiguousarray(arr)
