"""Resize on the device: nearest (every rounding mode), linear and cubic, separably.

Resize is separable: each resized axis gets a table of source indices and weights
(``[out, taps]``), computed on the host from the geometry alone (every coordinate
transformation mode, the nearest rounding modes, antialias, ``exclude_outside``)
and uploaded once per geometry. One kernel then resamples one axis of the tensor
viewed as ``[outer, in, inner]``: ``y[o, j, i] = sum_k w[j, k] * x[o, idx[j, k], i]``.
Nearest mode is the one-tap, weightless case. ``tf_crop_and_resize`` (whose
extrapolated positions need a mask across axes) and non-float inputs stay on the CPU.
"""

from __future__ import annotations

import threading

import numpy as np
from onnxrt.errors import InvalidArgument
from onnxrt.plugin.resize_geometry import axis_order, axis_table, source_coords

from ..registry import op
from .base import CLKernel
from .gemm import FLOATS, PARAMS_DECL, dev, fp_options, launch_size, params
from .reduce import host_values

__all__ = ["Resize"]

RESIZE_SOURCE = PARAMS_DECL + r"""
__kernel void resize_axis(__global const real* x, __global real* y, __global const int* idx,
                          __global const real* w, const Params p)
{
    const int offx = PI(0), offy = PI(1), has_w = PI(2), in_len = PI(3), out_len = PI(4);
    const int inner = PI(5), taps = PI(6);
    const int i = get_global_id(0);
    const int j = get_global_id(1);
    if (i >= inner || j >= out_len) return;
    const int o = get_global_id(2);
    __global const real* src = x + offx + (size_t)o * in_len * inner + i;
    real acc;
    if (has_w) {
        acc = 0.0f;
        for (int k = 0; k < taps; k++) acc = mad(w[j * taps + k], src[(size_t)idx[j * taps + k] * inner], acc);
    } else {
        acc = src[(size_t)idx[j] * inner];
    }
    y[offy + ((size_t)o * out_len + j) * inner + i] = acc;
}
"""

_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
)


def _resize_ok(node) -> str | None:
    a = node.attrs
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        return f"unknown mode {mode!r}"
    if node.opset >= 11:
        coord = a.get("coordinate_transformation_mode", "half_pixel")
        if coord not in _COORD_MODES:
            return f"coordinate_transformation_mode {coord!r} runs on the CPU"
        if a.get("nearest_mode", "round_prefer_floor") not in _NEAREST_MODES:
            return f"unknown nearest_mode {a.get('nearest_mode')!r}"
    if a.get("keep_aspect_ratio_policy", "stretch") not in ("stretch", "not_larger", "not_smaller"):
        return f"unknown keep_aspect_ratio_policy {a.get('keep_aspect_ratio_policy')!r}"
    return None


@op("Resize", since=10, types={"T": FLOATS, "T1": FLOATS}, accepts=_resize_ok)
class Resize(CLKernel):
    """Resize (opsets 10+): nearest / linear / cubic, antialias, axes, aspect-ratio policies."""

    def setup(self):
        a = self.attrs
        self.mode = a.get("mode", "nearest")
        if self.node.opset < 11:
            # Resize-10 samples like Upsample: asymmetric coordinates
            self.coord, self.nearest_mode = "asymmetric", "simple"
        else:
            self.coord = a.get("coordinate_transformation_mode", "half_pixel")
            self.nearest_mode = a.get("nearest_mode", "round_prefer_floor")
        self.cubic_a = float(a.get("cubic_coeff_a", -0.75))
        self.exclude_outside = bool(a.get("exclude_outside", 0))
        self.antialias = bool(a.get("antialias", 0)) and self.mode != "nearest"
        self.axes = a.get("axes")
        self.policy = a.get("keep_aspect_ratio_policy", "stretch")
        self._tables: dict = {}
        self._lock = threading.Lock()


    # -- geometry --------------------------------------------------------------------
    def _host_input(self, i, value):
        c = self.node.constants.get(i)
        if c is not None:
            return np.asarray(c)
        if value is None or value.size == 0:
            return None
        return host_values(self.rt, value)

    def _geometry(self, shape, scales, sizes, desc):
        r = len(shape)
        if self.axes is not None:
            axes = [int(v) + r if int(v) < 0 else int(v) for v in self.axes]
            if any(v < 0 or v >= r for v in axes) or len(set(axes)) != len(axes):
                raise InvalidArgument(f"{desc}: axes {self.axes} invalid for rank {r}")
        else:
            axes = list(range(r))
        n = len(axes)
        if scales is not None and scales.size == 0:
            scales = None
        if sizes is not None and sizes.size == 0:
            sizes = None
        if (scales is None) == (sizes is None):
            raise InvalidArgument(f"{desc}: exactly one of 'scales' and 'sizes' must be given")
        scale = [1.0] * r
        out = list(shape)
        if scales is not None:
            s = np.asarray(scales, dtype=np.float64).reshape(-1)
            if s.size != n or (s <= 0).any():
                raise InvalidArgument(f"{desc}: scales {s.tolist()} must be {n} positive values")
            for i, ax in enumerate(axes):
                scale[ax] = float(s[i])
                out[ax] = int(np.floor(shape[ax] * s[i]))
        else:
            sz = np.asarray(sizes, dtype=np.int64).reshape(-1)
            if sz.size != n or (sz < 0).any():
                raise InvalidArgument(f"{desc}: sizes {sz.tolist()} must be {n} non-negative values")
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
        return axes, scale, out

    def _table(self, in_len, out_len, scale, dtype):
        """Device ``(indices, weights or None, taps)`` of one axis, memoized by geometry."""
        key = (in_len, out_len, scale, dtype)
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        x = source_coords(self.coord, in_len, out_len, scale)
        idx, w = axis_table(x, in_len, scale, mode=self.mode, nearest_mode=self.nearest_mode,
                            cubic_a=self.cubic_a, antialias=self.antialias, exclude_outside=self.exclude_outside)
        idx = np.clip(idx, 0, in_len - 1).astype(np.int32)
        res = (
            self.rt.to_device(np.ascontiguousarray(idx)),
            None if w is None else self.rt.to_device(np.ascontiguousarray(w, dtype=dtype)),
            idx.shape[1],
        )
        with self._lock:
            if len(self._tables) > 64:
                self._tables.clear()
            self._tables[key] = res
        return res

    def run(self, X, roi=None, scales=None, sizes=None):
        desc = self.node.describe()
        if self.node.opset < 11:
            scales_h, sizes_h = self._host_input(1, roi), None  # Resize-10 takes (X, scales)
        else:
            scales_h, sizes_h = self._host_input(2, scales), self._host_input(3, sizes)
        shape = tuple(X.shape)
        axes, scale, out = self._geometry(shape, scales_h, sizes_h, desc)
        work = [ax for ax in axes if not (out[ax] == shape[ax] and scale[ax] == 1.0)]
        rt = self.rt
        if any(out[ax] == 0 for ax in work) or X.size == 0:
            return (rt.zeros(out, X.dtype),)
        if any(shape[ax] == 0 for ax in work):
            raise InvalidArgument(f"{desc}: cannot resize an empty axis to a non-empty one")
        y = X
        cur = list(shape)
        for ax in axis_order(work, list(shape), out):
            idx, w, taps = self._table(shape[ax], out[ax], scale[ax], np.dtype(X.dtype))
            outer = int(np.prod(cur[:ax]))
            inner = int(np.prod(cur[ax + 1:]))
            nxt = cur.copy()
            nxt[ax] = out[ax]
            z = rt.empty(tuple(nxt), X.dtype)
            xb, xoff = dev(y)
            zb, zoff = dev(z)
            # work-groups of about 64 items: PoCL pays per work-group
            l0 = 16 if inner >= 16 else 1
            l1 = max(1, min(64 // l0, out[ax]))
            rt.launch(rt.program(RESIZE_SOURCE, fp_options(X.dtype)), "resize_axis", (launch_size(inner, l0), launch_size(out[ax], l1), outer),
                      (l0, l1, 1),
                      xb, zb, dev(idx)[0], dev(w)[0] if w is not None else dev(idx)[0],
                      params(xoff, zoff, int(w is not None), shape[ax], out[ax], inner, taps))
            y, cur = z, nxt
        if y is X:
            y = rt.empty(shape, X.dtype)
            if y.size:
                import pyopencl as cl

                cl.enqueue_copy(rt.queue, y.base_data, X.base_data, byte_count=X.nbytes,
                                src_offset=X.offset, dst_offset=y.offset)
        return (y,)
