"""Pooling on the device: MaxPool (with Indices), AveragePool, LpPool and the global pools.

Windowed pooling runs one work-item per output element, walking the taps of its
window (1-3 spatial axes, run as 3-D). Taps outside the input are skipped, which is
what padding with ``-inf`` (max) or zero (average, Lp) means; AveragePool divides by
the taps inside the input, or with ``count_include_pad`` by those inside the
explicitly padded input (never the ceil-mode overhang). MaxPool's Indices output is
the flattened input position of the first maximal tap, row-major or, with
``storage_order=1``, column-major. The global pools are row reductions over the
spatial axes (:mod:`.reduce`).
"""

from __future__ import annotations

import numpy as np
from onnxrt.errors import InvalidArgument
from onnxrt.plugin.pool_geometry import pool_geometry

from ..registry import op
from .base import CLKernel
from .conv import GEOM_DECL, geometry_args, spatial_attrs, to_3d
from .gemm import FLOATS, dev, fp_options, launch_size, params
from .reduce import reduce_rows

__all__ = ["AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "MaxPool"]

POOL_SOURCE = GEOM_DECL + r"""
/* mode 0: max, 1: average, 2: Lp (p given).  (ED, EH, EW): pads at the end, which
   count_include_pad counts; the ceil-mode overhang beyond them never counts. */
__kernel void pool(__global const real* x, __global real* y, __global long* ind, const Params p)
{
    GEOM_PARAMS
    const int offx = PI(18), offy = PI(19), want_ind = PI(20), col_major = PI(21), mode = PI(22);
    const int include_pad = PI(23), ED = PI(25), EH = PI(26), EW = PI(27);
    const real pw = PF(24);
    const int l = get_global_id(0);
    const int L = OD * OH * OW;
    if (l >= L) return;
    const int nc = get_global_id(1);
    const int ow = l % OW, oh = (l / OW) % OH, od = l / (OW * OH);
    const int d0 = od * SD - PD, h0 = oh * SH - PH, w0 = ow * SW - PW;
    const size_t plane = (size_t)ID * IH * IW;
    __global const real* xc = x + offx + nc * plane;
    real acc = mode == 0 ? -INFINITY : 0.0f;
    int best = -1, cnt = 0, cd = 0, ch = 0, cw = 0;
    for (int kd = 0; kd < KD; kd++) {
        const int id = d0 + kd * DD;
        if (id >= -PD && id < ID + ED) cd++;
        if (id < 0 || id >= ID) continue;
        for (int kh = 0; kh < KH; kh++) {
            const int ih = h0 + kh * DH;
            if (ih < 0 || ih >= IH) continue;
            for (int kw = 0; kw < KW; kw++) {
                const int iw = w0 + kw * DW;
                if (iw < 0 || iw >= IW) continue;
                const int pos = (id * IH + ih) * IW + iw;
                const real v = xc[pos];
                cnt++;
                if (mode == 0) {
                    if (v > acc || best < 0) { acc = v; best = pos; }
                } else if (mode == 1) {
                    acc += v;
                } else {
                    acc += (pw == 2.0f) ? v * v : pow(fabs(v), pw);
                }
            }
        }
    }
    if (mode == 1) {
        if (include_pad) {
            for (int kh = 0; kh < KH; kh++) { const int ih = h0 + kh * DH; if (ih >= -PH && ih < IH + EH) ch++; }
            for (int kw = 0; kw < KW; kw++) { const int iw = w0 + kw * DW; if (iw >= -PW && iw < IW + EW) cw++; }
            cnt = cd * ch * cw;
        }
        acc = acc / (real)max(cnt, 1);
    } else if (mode == 2) {
        acc = (pw == 2.0f) ? sqrt(acc) : pow(acc, 1.0f / pw);
    }
    y[offy + (size_t)nc * L + l] = acc;
    if (want_ind) {
        long idx = 0;
        if (best >= 0) {
            const int iw = best % IW, ih = (best / IW) % IH, id = best / (IW * IH);
            idx = col_major ? (long)id + (long)ID * (ih + (long)IH * iw) : (long)best;
        }
        ind[(size_t)nc * L + l] = (long)nc * plane + idx;
    }
}
"""


def _pool_ok(node) -> str | None:
    ks = node.attrs.get("kernel_shape")
    if ks is None:
        return "kernel_shape is required"
    if not 1 <= len(ks) <= 3:
        return f"the OpenCL {node.op_type} runs 1 to 3 spatial axes, this node has {len(ks)}"
    return None


class _Pool(CLKernel):
    mode = 0

    def setup(self):
        a = self.attrs
        self.auto_pad = a.get("auto_pad", "NOTSET") or "NOTSET"
        self.ceil_mode = int(a.get("ceil_mode", 0))
        self.pads = a.get("pads")
        self.kernel_shape = list(a["kernel_shape"])


    def _pool(self, x, want_ind=False, col_major=False, include_pad=False, p=2.0):
        desc = self.node.describe()
        nd = len(self.kernel_shape)
        if x.ndim != nd + 2:
            raise InvalidArgument(f"{desc}: input shape {x.shape} does not match kernel_shape {self.kernel_shape}")
        kernel, strides, dil = spatial_attrs(self.attrs, nd, self.kernel_shape, desc)
        in_sp = x.shape[2:]
        pb, pe, _, out_sp = pool_geometry(in_sp, kernel, strides, dil, self.pads, self.auto_pad, self.ceil_mode, desc)
        rt = self.rt
        nc = x.shape[0] * x.shape[1]
        y = rt.empty(x.shape[:2] + tuple(out_sp), x.dtype)
        ind = rt.empty(y.shape, np.int64) if want_ind else None
        if y.size == 0:
            return y, ind
        L = int(np.prod(out_sp))
        xb, xoff = dev(x)
        yb, yoff = dev(y)
        ib = dev(ind)[0] if want_ind else yb
        geom = geometry_args(in_sp, out_sp, kernel, strides, dil, pb)
        rt.launch(rt.program(POOL_SOURCE, fp_options(x.dtype)), "pool", (launch_size(L, 64), nc), (64, 1), xb, yb, ib,
                  params(*geom, xoff, yoff, int(want_ind), int(col_major), self.mode, int(include_pad),
                         float(p), *to_3d(pe, 0)))
        return y, ind


@op("MaxPool", since=1, types={"T": FLOATS}, accepts=_pool_ok)
class MaxPool(_Pool):
    """Max pooling with dilations, ceil mode, padding and the optional Indices output."""

    mode = 0

    def run(self, x):
        want = len(self.node.outputs) > 1 and bool(self.node.outputs[1])
        col_major = int(self.attrs.get("storage_order", 0)) == 1
        y, ind = self._pool(x, want_ind=want, col_major=col_major)
        return (y, ind) if want else (y,)


@op("AveragePool", since=1, types={"T": FLOATS}, accepts=_pool_ok)
class AveragePool(_Pool):
    """Average pooling; ``count_include_pad`` counts explicit padding only."""

    mode = 1

    def run(self, x):
        return (self._pool(x, include_pad=bool(self.attrs.get("count_include_pad", 0)))[0],)


@op("LpPool", since=1, types={"T": FLOATS}, accepts=_pool_ok)
class LpPool(_Pool):
    """``(sum |x|^p)^(1/p)`` over each window (padding contributes zero)."""

    mode = 2

    def run(self, x):
        return (self._pool(x, p=float(self.attrs.get("p", 2)))[0],)


class _GlobalPool(CLKernel):
    reduce_op = "ReduceMax"

    def run(self, x):
        if x.ndim < 3:
            raise InvalidArgument(f"{self.node.describe()}: input must be [N, C, spatial...], got shape {x.shape}")
        rows = x.shape[0] * x.shape[1]
        y = reduce_rows(self.rt, x, rows, int(np.prod(x.shape[2:])), 1, self.reduce_op)
        return (y.reshape(x.shape[:2] + (1,) * (x.ndim - 2)),)


@op("GlobalMaxPool", since=1, types={"T": FLOATS})
class GlobalMaxPool(_GlobalPool):
    """The maximum over all spatial positions of each (image, channel)."""

    reduce_op = "ReduceMax"


@op("GlobalAveragePool", since=1, types={"T": FLOATS})
class GlobalAveragePool(_GlobalPool):
    """The mean over all spatial positions of each (image, channel)."""

    reduce_op = "ReduceMean"
