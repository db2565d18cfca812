"""Reductions on the device: the Reduce* ops, ArgMax/ArgMin, Softmax and LogSoftmax.

Every reduction is brought to the form ``[outer, R, inner]``: adjacent axes that are
all reduced (or all kept) are merged and size-1 axes dropped, and when the reduced
axes are still not one block a permute kernel moves them to the end first. Then:

* ``inner == 1`` with long rows: one work-group per row, a local-memory tree;
* otherwise: one work-item per output, walking its ``R`` inputs ``inner`` apart
  (neighbouring work-items read neighbouring addresses).

All Reduce* ops share one program; the op is a kernel argument (uniform across the
launch), so one build serves all of them. An op is ``pre`` (applied to each
element), ``combine``, ``init`` and ``post`` (applied to the result);
ReduceLogSumExp first finds the row maximum so ``exp`` cannot overflow. Reducing
no axes (``noop_with_empty_axes``) still applies the elementwise part, as
``numpy`` does for ``axis=()``.
"""

from __future__ import annotations

import numpy as np
from onnxrt.errors import InvalidArgument

from ..registry import op
from .base import CLKernel
from .gemm import FLOATS, PARAMS_DECL, dev, fp_options, launch_size, params

__all__ = ["REDUCE_OPS", "ArgMax", "ArgMin", "LogSoftmax", "Reduce", "Softmax", "host_values", "reduce_rows"]

#: op name -> code in REDUCE_SOURCE
REDUCE_OPS = {
    "ReduceSum": 0,
    "ReduceMean": 1,
    "ReduceMax": 2,
    "ReduceMin": 3,
    "ReduceProd": 4,
    "ReduceL1": 5,
    "ReduceL2": 6,
    "ReduceSumSquare": 7,
    "ReduceLogSum": 8,
    "ReduceLogSumExp": 9,
}

# first opset where the axes come as an input rather than an attribute
_AXES_INPUT_SINCE = {name: (13 if name == "ReduceSum" else 18) for name in REDUCE_OPS}

_WG = 64
# rows at least this long get a work-group each
_ROW_WG_MIN = 256

REDUCE_SOURCE = PARAMS_DECL + r"""
#define WG 64
inline real r_init(const int op) {
    return op == 2 ? -INFINITY : (op == 3 ? INFINITY : (op == 4 ? 1.0f : 0.0f));
}
inline real r_pre(const int op, const real v) {
    return op == 5 ? fabs(v) : ((op == 6 || op == 7) ? v * v : v);
}
/* max/min keep a NaN once seen, as numpy does */
inline real r_comb(const int op, const real a, const real b) {
    if (op == 2) return (isnan(a) || a >= b) ? a : b;
    if (op == 3) return (isnan(a) || a <= b) ? a : b;
    if (op == 4) return a * b;
    return a + b;
}
inline real r_post(const int op, const real acc, const int n, const real m) {
    if (op == 1) return acc / (real)n;
    if (op == 6) return sqrt(acc);
    if (op == 8) return log(acc);
    if (op == 9) return log(acc) + m;
    return acc;
}

/* y[o * inner + i] = reduce over r of x[(o * R + r) * inner + i] */
__kernel void reduce_cols(__global const real* x, __global real* y, const Params p)
{
    const int offx = PI(0), offy = PI(1), R = PI(2), inner = PI(3), op = PI(4), outer = PI(5);
    const int i = get_global_id(0);
    const int o = get_global_id(1);
    if (i >= inner || o >= outer) return;
    __global const real* src = x + offx + (size_t)o * R * inner + i;
    real m = 0.0f;
    if (op == 9) {
        m = -INFINITY;
        for (int r = 0; r < R; r++) m = fmax(m, src[(size_t)r * inner]);
        if (!isfinite(m)) m = 0.0f;
    }
    real acc = r_init(op);
    if (op == 9) {
        for (int r = 0; r < R; r++) acc += exp(src[(size_t)r * inner] - m);
    } else {
        for (int r = 0; r < R; r++) acc = r_comb(op, acc, r_pre(op, src[(size_t)r * inner]));
    }
    y[offy + (size_t)o * inner + i] = r_post(op, acc, R, m);
}

inline real wg_reduce(__local real* s, real v, const int op) {
    const int t = get_local_id(0);
    s[t] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (t < h) s[t] = r_comb(op, s[t], s[t + h]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const real r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* one work-group per row of R contiguous elements */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void reduce_rows(__global const real* x, __global real* y, const Params p)
{
    const int offx = PI(0), offy = PI(1), R = PI(2), op = PI(4);
    __local real s[WG];
    const int t = get_local_id(0);
    const int o = get_group_id(1);
    __global const real* src = x + offx + (size_t)o * R;
    real m = 0.0f;
    if (op == 9) {
        real a = -INFINITY;
        for (int r = t; r < R; r += WG) a = fmax(a, src[r]);
        m = wg_reduce(s, a, 2);
        if (!isfinite(m)) m = 0.0f;
    }
    real acc = r_init(op);
    if (op == 9) {
        for (int r = t; r < R; r += WG) acc += exp(src[r] - m);
        acc = wg_reduce(s, acc, 0);
    } else {
        for (int r = t; r < R; r += WG) acc = r_comb(op, acc, r_pre(op, src[r]));
        acc = wg_reduce(s, acc, op == 1 || op >= 5 ? 0 : op);
    }
    if (t == 0) y[offy + o] = r_post(op, acc, R, m);
}

/* y = x permuted: y's 6-D index (padded with leading 1s) read through x strides t0..t5 */
__kernel void permute6(__global const real* x, __global real* y, const Params p)
{
    const int offx = PI(0), offy = PI(1), total = PI(2);
    const int s1 = PI(3), s2 = PI(4), s3 = PI(5), s4 = PI(6), s5 = PI(7);
    const int t0 = PI(8), t1 = PI(9), t2 = PI(10), t3 = PI(11), t4 = PI(12), t5 = PI(13);
    int i = get_global_id(0);
    if (i >= total) return;
    const int out = i;
    const int i5 = i % s5; i /= s5;
    const int i4 = i % s4; i /= s4;
    const int i3 = i % s3; i /= s3;
    const int i2 = i % s2; i /= s2;
    const int i1 = i % s1; i /= s1;
    y[offy + out] = x[offx + i * t0 + i1 * t1 + i2 * t2 + i3 * t3 + i4 * t4 + i5 * t5];
}

/* arg-reduce along R: first (or last) index of the max (largest) or min */
__kernel void arg_reduce(__global const real* x, __global long* y, const Params p)
{
    const int offx = PI(0), R = PI(2), inner = PI(3), largest = PI(4), last = PI(5), outer = PI(6);
    const int i = get_global_id(0);
    const int o = get_global_id(1);
    if (i >= inner || o >= outer) return;
    __global const real* src = x + offx + (size_t)o * R * inner + i;
    real best = src[0];
    int bi = 0;
    for (int r = 1; r < R; r++) {
        const real v = src[(size_t)r * inner];
        const int better = largest ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
        if (better) { best = v; bi = r; }
    }
    y[(size_t)o * inner + i] = bi;
}

/* softmax along R with stride inner; one work-item per (outer, inner) */
__kernel void softmax_cols(__global const real* x, __global real* y, const Params p)
{
    const int offx = PI(0), offy = PI(1), R = PI(2), inner = PI(3), logsm = PI(4), outer = PI(5);
    const int i = get_global_id(0);
    const int o = get_global_id(1);
    if (i >= inner || o >= outer) return;
    const size_t base = (size_t)o * R * inner + i;
    __global const real* src = x + offx + base;
    __global real* q = y + offy + base;
    real m = -INFINITY;
    for (int r = 0; r < R; r++) m = fmax(m, src[(size_t)r * inner]);
    real s = 0.0f;
    for (int r = 0; r < R; r++) s += exp(src[(size_t)r * inner] - m);
    if (logsm) {
        const real ls = log(s);
        for (int r = 0; r < R; r++) q[(size_t)r * inner] = src[(size_t)r * inner] - m - ls;
    } else {
        const real inv = 1.0f / s;
        for (int r = 0; r < R; r++) q[(size_t)r * inner] = exp(src[(size_t)r * inner] - m) * inv;
    }
}

/* softmax over contiguous rows, one work-group per row */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void softmax_rows(__global const real* x, __global real* y, const Params p)
{
    const int offx = PI(0), offy = PI(1), R = PI(2), logsm = PI(4);
    __local real s[WG];
    const int t = get_local_id(0);
    const size_t base = (size_t)get_group_id(1) * R;
    __global const real* src = x + offx + base;
    __global real* q = y + offy + base;
    real a = -INFINITY;
    for (int r = t; r < R; r += WG) a = fmax(a, src[r]);
    const real m = wg_reduce(s, a, 2);
    real e = 0.0f;
    for (int r = t; r < R; r += WG) e += exp(src[r] - m);
    const real sum = wg_reduce(s, e, 0);
    if (logsm) {
        const real ls = log(sum);
        for (int r = t; r < R; r += WG) q[r] = src[r] - m - ls;
    } else {
        const real inv = 1.0f / sum;
        for (int r = t; r < R; r += WG) q[r] = exp(src[r] - m) * inv;
    }
}
"""


def _program(rt, dtype):
    return rt.program(REDUCE_SOURCE, fp_options(dtype))


def _local_2d(inner: int, outer: int) -> tuple[int, int]:
    """A work-group of about 64 items over (inner, outer): PoCL pays per work-group."""
    l0 = 16 if inner >= 16 else 1
    return l0, max(1, min(64 // l0, outer))


def host_values(rt, a) -> np.ndarray:
    """A small device array's values on the host (its host copy when it has one)."""
    hc = getattr(a, "host_copy", None)
    if hc is not None:
        return np.asarray(hc)
    return rt.to_host(a)


def reduce_rows(rt, x, outer: int, R: int, inner: int, op_name: str, out=None):
    """Reduce ``x`` viewed as ``[outer, R, inner]`` over ``R``; returns ``[outer, inner]``."""
    y = out if out is not None else rt.empty((outer, inner), x.dtype)
    if y.size == 0:
        return y
    prg = _program(rt, x.dtype)
    xb, xoff = dev(x) if x.size else (dev(y)[0], 0)
    yb, yoff = dev(y)
    p = params(xoff, yoff, R, inner, REDUCE_OPS[op_name], outer)
    if inner == 1 and R >= _ROW_WG_MIN:
        rt.launch(prg, "reduce_rows", (_WG, outer), (_WG, 1), xb, yb, p)
    else:
        l0, l1 = _local_2d(inner, outer)
        rt.launch(prg, "reduce_cols", (launch_size(inner, l0), launch_size(outer, l1)), (l0, l1), xb, yb, p)
    return y


def _canonical(shape, axes):
    """Merge adjacent axes of equal kind: a list of ``(size, reduced)``, size-1 axes dropped."""
    groups: list = []
    for i, s in enumerate(shape):
        if s == 1:
            continue
        red = i in axes
        if groups and groups[-1][1] == red:
            groups[-1] = (groups[-1][0] * s, red)
        else:
            groups.append((s, red))
    return groups


def permute(rt, x, groups_shape, perm):
    """``x`` (viewed with shape ``groups_shape``, at most 6 axes) transposed by ``perm``."""
    nd = len(groups_shape)
    if nd > 6:
        raise InvalidArgument(f"cannot permute {nd} merged axes on the device (at most 6)")
    strides = [int(np.prod(groups_shape[i + 1:])) for i in range(nd)]
    out_shape = [groups_shape[p] for p in perm]
    out_strides = [strides[p] for p in perm]
    s = [1] * (6 - nd) + out_shape
    t = [0] * (6 - nd) + out_strides
    y = rt.empty((int(np.prod(out_shape)),), x.dtype)
    total = y.size
    xb, xoff = dev(x)
    yb, yoff = dev(y)
    rt.launch(_program(rt, x.dtype), "permute6", (launch_size(total, 64),), (64,), xb, yb,
              params(xoff, yoff, total, *s[1:], *t))
    return y


def reduce_axes(rt, x, axes: tuple, keepdims: bool, op_name: str):
    """Reduce device array ``x`` over ``axes`` (normalized, non-negative) with ``op_name``."""
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keepdims else tuple(
        d for i, d in enumerate(x.shape) if i not in axes
    )
    y = rt.empty(out_shape, x.dtype)
    if y.size == 0:
        return y
    groups = _canonical(x.shape, set(axes))
    red = [g for g in groups if g[1]]
    R = int(np.prod([g[0] for g in red])) if red else 1
    if any(x.shape[a] == 0 for a in axes):
        R = 0
    if R == 0 or len(red) <= 1:
        outer = inner = 1
        seen = False
        for size, is_red in groups:
            if is_red:
                seen = True
            elif seen:
                inner *= size
            else:
                outer *= size
        if R == 0:
            outer, inner = y.size, 1
        reduce_rows(rt, x, outer, R, inner, op_name, out=y.reshape((outer, inner)))
        return y
    sizes = [g[0] for g in groups]
    kept = [i for i, g in enumerate(groups) if not g[1]]
    reds = [i for i, g in enumerate(groups) if g[1]]
    xt = permute(rt, x, sizes, kept + reds)
    reduce_rows(rt, xt, y.size, R, 1, op_name, out=y.reshape((y.size, 1)))
    return y


def _normalize_axes(axes, ndim: int, desc: str) -> tuple[int, ...]:
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise InvalidArgument(f"{desc}: axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise InvalidArgument(f"{desc}: axes {list(axes)} repeat an axis")
    return tuple(out)


class Reduce(CLKernel):
    """Any Reduce* op, in either the attribute-axes or the input-axes form."""

    def setup(self):
        name = self.node.op_type
        self.keepdims = bool(self.attrs.get("keepdims", 1))
        self.axes_as_input = self.node.opset >= _AXES_INPUT_SINCE[name]
        self.noop = bool(self.attrs.get("noop_with_empty_axes", 0)) if self.axes_as_input else False
        attr_axes = self.attrs.get("axes")
        self.attr_axes = None if self.axes_as_input or attr_axes is None else list(attr_axes)
        const = self.node.constants.get(1)
        self.const_axes = None if const is None else np.asarray(const).reshape(-1).tolist()

    def run(self, x, axes=None):
        desc = self.node.describe()
        if self.axes_as_input:
            ax = self.const_axes
            if ax is None and axes is not None and axes.size:
                ax = host_values(self.rt, axes).reshape(-1).tolist()
        else:
            ax = self.attr_axes
        if not ax:
            ax = () if self.noop else tuple(range(x.ndim))
        else:
            ax = _normalize_axes(ax, x.ndim, desc)
        return (reduce_axes(self.rt, x, ax, self.keepdims, self.node.op_type),)


for _name in REDUCE_OPS:
    op(_name, since=1, types={"T": FLOATS})(Reduce)


class _ArgReduce(CLKernel):
    largest = True

    def run(self, x):
        desc = self.node.describe()
        a = self.attrs
        axis = int(a.get("axis", 0))
        if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
            raise InvalidArgument(f"{desc}: axis {axis} is out of range for shape {x.shape}")
        axis %= x.ndim
        R = x.shape[axis]
        if R == 0:
            raise InvalidArgument(f"{desc}: cannot take the arg of an empty axis {axis}")
        outer = int(np.prod(x.shape[:axis]))
        inner = int(np.prod(x.shape[axis + 1:]))
        shape = list(x.shape)
        if a.get("keepdims", 1):
            shape[axis] = 1
        else:
            del shape[axis]
        y = self.rt.empty(tuple(shape), np.int64)
        if y.size == 0:
            return (y,)
        xb, xoff = dev(x)
        l0, l1 = _local_2d(inner, outer)
        self.rt.launch(_program(self.rt, x.dtype), "arg_reduce", (launch_size(inner, l0), launch_size(outer, l1)), (l0, l1),
                       xb, dev(y)[0],
                       params(xoff, 0, R, inner, int(self.largest), int(bool(a.get("select_last_index", 0))), outer))
        return (y,)


@op("ArgMax", since=1, types={"T": FLOATS})
class ArgMax(_ArgReduce):
    """Index of the largest element along ``axis`` (first or last on ties)."""

    largest = True


@op("ArgMin", since=1, types={"T": FLOATS})
class ArgMin(_ArgReduce):
    """Index of the smallest element along ``axis`` (first or last on ties)."""

    largest = False


class _SoftmaxBase(CLKernel):
    """Before opset 13 the input is coerced to 2-D at ``axis``; from 13 on, one axis."""

    log = False

    def setup(self):
        self.legacy = self.node.opset < 13
        self.axis = int(self.attrs.get("axis", 1 if self.legacy else -1))

    def run(self, x):
        nd = x.ndim
        axis = self.axis
        hi = nd if self.legacy else nd - 1
        if nd == 0 or not -nd <= axis <= hi:
            raise InvalidArgument(f"{self.node.describe()}: axis {self.axis} out of range for rank {nd}")
        if axis < 0:
            axis += nd
        outer = int(np.prod(x.shape[:axis]))
        if self.legacy:
            R, inner = int(np.prod(x.shape[axis:])), 1
        else:
            R, inner = x.shape[axis], int(np.prod(x.shape[axis + 1:]))
        rt = self.rt
        y = rt.empty(x.shape, x.dtype)
        if y.size == 0:
            return (y,)
        xb, xoff = dev(x)
        yb, yoff = dev(y)
        prg = _program(rt, x.dtype)
        p = params(xoff, yoff, R, inner, int(self.log), outer)
        if inner == 1 and R >= _ROW_WG_MIN:
            rt.launch(prg, "softmax_rows", (_WG, outer), (_WG, 1), xb, yb, p)
        else:
            l0, l1 = _local_2d(inner, outer)
            rt.launch(prg, "softmax_cols", (launch_size(inner, l0), launch_size(outer, l1)), (l0, l1), xb, yb, p)
        return (y,)


@op("Softmax", since=1, types={"T": FLOATS})
class Softmax(_SoftmaxBase):
    """``exp(x - max) / sum(exp(x - max))`` along the axis."""

    log = False


@op("LogSoftmax", since=1, types={"T": FLOATS})
class LogSoftmax(_SoftmaxBase):
    """``x - max - log(sum(exp(x - max)))`` along the axis."""

    log = True
