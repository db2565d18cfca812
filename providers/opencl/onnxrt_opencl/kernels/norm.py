"""Normalization on the device: BatchNormalization (inference), InstanceNormalization,
LayerNormalization.

BatchNormalization in inference form is one elementwise pass: each element reads
its channel's four parameters. Instance and layer normalization share one kernel:
a work-group per row (an (image, channel) plane, or the trailing axes from
``axis``) computes the mean, then the variance of the deviations (two passes,
which keeps the variance accurate for rows far from zero), then writes
``(x - mean) * rsqrt(var + eps) * scale + bias``. The scale and bias are read
per row (instance) or per column (layer). LayerNormalization's optional Mean and
InvStdDev outputs are written by the same work-group.
"""

from __future__ import annotations

import numpy as np
from onnxrt.errors import InvalidArgument

from ..registry import op
from .base import CLKernel
from .gemm import FLOATS, PARAMS_DECL, dev, fp_options, launch_size, params

__all__ = ["BatchNormalization", "InstanceNormalization", "LayerNormalization"]

_WG = 64

NORM_SOURCE = PARAMS_DECL + r"""
#define WG 64
__kernel void batchnorm(__global const real* x, __global real* y, __global const real* sc,
                        __global const real* b, __global const real* mean, __global const real* var,
                        const Params p)
{
    const int offx = PI(0), offy = PI(1), offs = PI(2), offb = PI(3), offm = PI(4), offv = PI(5);
    const int C = PI(6), inner = PI(7), total = PI(8);
    const real eps = PF(9);
    const int i = get_global_id(0);
    if (i >= total) return;
    const int c = (i / inner) % C;
    const real a = sc[offs + c] / sqrt(var[offv + c] + eps);
    y[offy + i] = (x[offx + i] - mean[offm + c]) * a + b[offb + c];
}

inline real wg_sum(__local real* s, real v) {
    const int t = get_local_id(0);
    s[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (t < h) s[t] += s[t + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const real r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* row o of R elements; parameter index = (o % pmod) * prow + j * pcol */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void norm_rows(__global const real* x, __global real* y, __global const real* sc, __global const real* b,
               __global real* mean_out, __global real* inv_out, const Params p)
{
    const int offx = PI(0), offy = PI(1), offs = PI(2), offb = PI(3), has_bias = PI(4), R = PI(5);
    const int pmod = PI(6), prow = PI(7), pcol = PI(8), want_stats = PI(10);
    const real eps = PF(9);
    __local real s[WG];
    const int t = get_local_id(0);
    const int o = get_group_id(1);
    __global const real* src = x + offx + (size_t)o * R;
    __global real* q = y + offy + (size_t)o * R;
    real a = 0.0f;
    for (int r = t; r < R; r += WG) a += src[r];
    const real mean = wg_sum(s, a) / (real)R;
    real v = 0.0f;
    for (int r = t; r < R; r += WG) { const real d = src[r] - mean; v = mad(d, d, v); }
    const real inv = 1.0f / sqrt(wg_sum(s, v) / (real)R + eps);
    const int pr = (o % pmod) * prow;
    for (int r = t; r < R; r += WG) {
        const int k = pr + r * pcol;
        real out = (src[r] - mean) * inv * sc[offs + k];
        if (has_bias) out += b[offb + k];
        q[r] = out;
    }
    if (want_stats && t == 0) { mean_out[o] = mean; inv_out[o] = inv; }
}
"""


def _program(rt, dtype):
    return rt.program(NORM_SOURCE, fp_options(dtype))


def _vector(p, n, name, desc):
    if p.size != n:
        raise InvalidArgument(f"{desc}: {name} has shape {p.shape}, expected ({n},)")
    return dev(p)


def _batchnorm_ok(node) -> str | None:
    a = node.attrs
    n_out = sum(1 for o in node.outputs if o)
    if node.opset >= 14 and a.get("training_mode", 0):
        return "training mode runs on the CPU"
    if n_out > 1:
        return "the running-statistics outputs run on the CPU"
    if node.opset < 9 and a.get("spatial", 1) == 0:
        return "per-activation (spatial=0) parameters run on the CPU"
    dts = {node.input_dtype(i) for i in range(len(node.inputs))} - {None}
    if len(dts) > 1:
        return "parameters of another type than the input run on the CPU"
    return None


@op("BatchNormalization", since=1, types={"T": FLOATS, "T1": FLOATS, "T2": FLOATS},
    accepts=_batchnorm_ok)
class BatchNormalization(CLKernel):
    """Inference batch normalization: ``(x - mean) * scale / sqrt(var + eps) + B`` per channel."""

    def setup(self):
        self.eps = float(self.attrs.get("epsilon", 1e-5))

    def run(self, x, scale, b, mean, var):
        desc = self.node.describe()
        c = x.shape[1] if x.ndim >= 2 else x.size
        inner = int(np.prod(x.shape[2:])) if x.ndim >= 2 else 1
        args = [_vector(p, c, name, desc) for p, name in ((scale, "scale"), (b, "B"), (mean, "mean"), (var, "var"))]
        rt = self.rt
        y = rt.empty(x.shape, x.dtype)
        if y.size == 0:
            return (y,)
        xb, xoff = dev(x)
        yb, yoff = dev(y)
        rt.launch(_program(rt, x.dtype), "batchnorm", (launch_size(x.size, 64),), (64,), xb, yb, *[a[0] for a in args],
                  params(xoff, yoff, *[a[1] for a in args], c, inner, x.size, self.eps))
        return (y,)


def _norm_rows(rt, x, rows, R, scale, bias, pmod, prow, pcol, eps, stats=False):
    y = rt.empty(x.shape, x.dtype)
    mean = inv = None
    if stats:
        mean = rt.empty((rows,), x.dtype)
        inv = rt.empty((rows,), x.dtype)
    if y.size == 0:
        return y, mean, inv
    xb, xoff = dev(x)
    yb, yoff = dev(y)
    sb, soff = dev(scale)
    bb, boff = dev(bias) if bias is not None else (sb, 0)
    mb = dev(mean)[0] if stats else yb
    ib = dev(inv)[0] if stats else yb
    rt.launch(_program(rt, x.dtype), "norm_rows", (_WG, rows), (_WG, 1), xb, yb, sb, bb, mb, ib,
              params(xoff, yoff, soff, boff, int(bias is not None), R, pmod, prow, pcol, float(eps), int(stats)))
    return y, mean, inv


@op("InstanceNormalization", since=1, types={"T": FLOATS})
class InstanceNormalization(CLKernel):
    """Normalization over the spatial axes of each (image, channel), with per-channel scale and bias."""

    def run(self, x, scale, b):
        desc = self.node.describe()
        if x.ndim < 3:
            raise InvalidArgument(f"{desc}: input must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
        c = x.shape[1]
        _vector(scale, c, "scale", desc)
        _vector(b, c, "B", desc)
        rows = x.shape[0] * c
        y, _, _ = _norm_rows(self.rt, x, rows, int(np.prod(x.shape[2:])), scale, b, c, 1, 0,
                             float(self.attrs.get("epsilon", 1e-5)))
        return (y,)


def _layernorm_ok(node) -> str | None:
    if int(node.attrs.get("stash_type", 1)) != 1:
        return "stash_type other than float32 runs on the CPU"
    return None


@op("LayerNormalization", since=17, types={"T": [np.float32], "U": [np.float32]}, accepts=_layernorm_ok)
class LayerNormalization(CLKernel):
    """Normalization over axes ``[axis, rank)``, with the optional Mean and InvStdDev outputs."""

    def setup(self):
        self.axis = int(self.attrs.get("axis", -1))
        self.eps = float(self.attrs.get("epsilon", 1e-5))
        self.n_out = len(self.node.outputs)

    def _param(self, p, norm_shape, desc):
        """``(array, column stride)`` of a scale or bias broadcast over the normalized axes."""
        R = int(np.prod(norm_shape))
        if p.size == R and tuple(p.shape) == tuple(norm_shape)[len(norm_shape) - p.ndim:]:
            return p, 1
        if p.size == 1:
            return p, 0
        try:
            full = np.broadcast_to(self.rt.to_host(p), norm_shape)
        except ValueError:
            raise InvalidArgument(f"{desc}: shape {p.shape} does not broadcast to {tuple(norm_shape)}") from None
        return self.rt.to_device(np.ascontiguousarray(full)), 1

    def run(self, x, scale, b=None):
        desc = self.node.describe()
        if not -x.ndim <= self.axis < x.ndim:
            raise InvalidArgument(f"{desc}: axis {self.axis} is out of range for rank {x.ndim}")
        axis = self.axis % x.ndim
        lead = x.shape[:axis]
        rows = int(np.prod(lead))
        norm_shape = x.shape[axis:]
        R = int(np.prod(norm_shape))
        sc, s_col = self._param(scale, norm_shape, desc)
        if b is not None:
            bb, b_col = self._param(b, norm_shape, desc)
            if b_col != s_col:  # one column stride serves both: expand the broadcast one
                full = np.broadcast_to(self.rt.to_host(bb if b_col == 0 else sc), norm_shape)
                if b_col == 0:
                    bb = self.rt.to_device(np.ascontiguousarray(full))
                else:
                    sc = self.rt.to_device(np.ascontiguousarray(full))
                s_col = 1
        else:
            bb = None
        stats = self.n_out > 1
        y, mean, inv = _norm_rows(self.rt, x, rows, R, sc, bb, 1, 0, s_col, self.eps, stats)
        if not stats:
            return (y,)
        st_shape = lead + (1,) * (x.ndim - axis)
        return (y, mean.reshape(st_shape), inv.reshape(st_shape))[: self.n_out]
