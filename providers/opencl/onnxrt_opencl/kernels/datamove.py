"""Data-movement kernels: views where possible, otherwise one strided-copy kernel.

Reshape, Flatten, Squeeze, Unsqueeze and Identity return views of their input (no
copy, no launch). Transpose, Slice, Concat, Split, Expand, Tile and Pad are all strided
copies: ``dst[dbase + sum(c*ds)] = src[sbase + sum(c*ss)]`` over an index space, with
one program per element size and rank bucket, so they compile a handful of programs in
all. Gather has its own kernel. Shape-like inputs (a Reshape's shape, a Slice's starts)
are read on the host: from the node's constants, the host copy kept with small
uploads, or a read-back.
"""

from __future__ import annotations

import numpy as np

from onnxrt.errors import InvalidArgument

from ..registry import op
from .base import CLKernel

__all__ = ["strided_copy", "fill", "host_ints"]

_UINT = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}
_RANK_BUCKETS = (1, 2, 4, 6, 8, 12)


def _copy_source(itemsize: int, rank: int) -> str:
    T = _UINT[itemsize]
    dims = ", ".join(f"long d{j}" for j in range(rank))
    ss = ", ".join(f"long ss{j}" for j in range(rank))
    ds = ", ".join(f"long ds{j}" for j in range(rank))
    lines = ["    long r = get_global_id(0);"]
    for j in range(rank - 1, 0, -1):
        lines.append(f"    const long c{j} = r % d{j}; r /= d{j};")
    lines.append("    const long c0 = r;")
    so = " + ".join(f"c{j} * ss{j}" for j in range(rank))
    do = " + ".join(f"c{j} * ds{j}" for j in range(rank))
    lines.append(f"    dst[dbase + {do}] = src[sbase + {so}];")
    return (f"__kernel void copy_nd(__global const {T} *src, __global {T} *dst, long sbase, long dbase, "
            f"{dims}, {ss}, {ds})\n{{\n" + "\n".join(lines) + "\n}\n")


def _fill_source(itemsize: int) -> str:
    T = _UINT[itemsize]
    return f"__kernel void fill(__global {T} *dst, {T} v)\n{{\n    dst[get_global_id(0)] = v;\n}}\n"


def _check_dtype(a) -> None:
    if a.dtype.itemsize not in _UINT:
        raise InvalidArgument(f"OpenCL data movement does not handle {a.dtype} values")


def strided_copy(rt, src, dst, shape, sstrides, sbase, dstrides, dbase) -> None:
    """Copy ``src`` into ``dst`` over index space ``shape`` (strides and bases in elements)."""
    _check_dtype(src)
    total = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if total == 0:
        return
    # drop unit dimensions: they add index math and nothing else
    keep = [j for j, d in enumerate(shape) if d != 1]
    shape = [shape[j] for j in keep]
    sstrides = [sstrides[j] for j in keep]
    dstrides = [dstrides[j] for j in keep]
    rank = next((b for b in _RANK_BUCKETS if b >= len(shape)), None)
    if rank is None:
        raise InvalidArgument(f"OpenCL strided copy supports up to {_RANK_BUCKETS[-1]} dimensions, not {len(shape)}")
    pad = rank - len(shape)
    shape = [1] * pad + list(shape)
    sstrides = [0] * pad + list(sstrides)
    dstrides = [0] * pad + list(dstrides)
    prg = rt.program(_copy_source(src.dtype.itemsize, rank))
    args = [np.int64(sbase), np.int64(dbase)] + [np.int64(v) for v in (*shape, *sstrides, *dstrides)]
    rt.launch(prg, "copy_nd", (total,), None, src, dst, *args)


def fill(rt, dst, value) -> None:
    """Set every element of ``dst`` to ``value`` (any dtype: the bits are copied)."""
    _check_dtype(dst)
    n = dst.dtype.itemsize
    bits = np.array(value, dtype=dst.dtype).view(np.dtype(f"u{n}")).reshape(())
    prg = rt.program(_fill_source(n))
    rt.launch(prg, "fill", (dst.size,), None, dst, bits[()])


def _contiguous_strides(shape) -> list[int]:
    out = [1] * len(shape)
    for j in range(len(shape) - 2, -1, -1):
        out[j] = out[j + 1] * int(shape[j + 1])
    return out


def host_ints(kernel: CLKernel, i: int, value) -> list[int] | None:
    """Input ``i`` as a list of Python ints, read on the host (``None`` when absent)."""
    const = kernel.node.constants.get(i)
    if const is not None:
        return [int(v) for v in np.asarray(const).reshape(-1)]
    if value is None:
        return None
    host = getattr(value, "host_copy", None)
    if host is None:
        host = kernel.rt.to_host(value)
    return [int(v) for v in np.asarray(host).reshape(-1)]


def _data_refusal(ni) -> str | None:
    dt = ni.input_dtype(0)
    if dt is None:
        return "input 0 has no static type"
    if dt.kind not in "biuf" or dt.itemsize not in _UINT:
        return f"input 0 has type {dt}, which OpenCL data movement does not handle"
    return None


def _norm_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise InvalidArgument(f"{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


# -- views ------------------------------------------------------------------------------
@op("Identity", since=1, accepts=_data_refusal)
class Identity(CLKernel):
    """The input itself (values are never written in place)."""

    def run(self, x):
        return (x,)


@op("Reshape", since=1, accepts=_data_refusal)
class Reshape(CLKernel):
    """A view with the new shape (``0`` copies a dimension unless ``allowzero``)."""

    def setup(self):
        self.allowzero = int(self.attrs.get("allowzero", 0))

    def run(self, x, shape=None):
        target = host_ints(self, 1, shape) if self.node.opset >= 5 else list(self.attrs.get("shape", []))
        out = []
        for j, s in enumerate(target):
            if s == 0 and not self.allowzero:
                if j >= x.ndim:
                    raise InvalidArgument(f"Reshape {self.node.name!r}: 0 at position {j} but the input has rank {x.ndim}")
                s = x.shape[j]
            out.append(s)
        if out.count(-1) > 1:
            raise InvalidArgument(f"Reshape {self.node.name!r}: more than one -1 in {target}")
        if -1 in out:
            known = int(np.prod([s for s in out if s != -1], dtype=np.int64))
            if known == 0 or x.size % known:
                raise InvalidArgument(f"Reshape {self.node.name!r}: cannot reshape {tuple(x.shape)} to {target}")
            out[out.index(-1)] = x.size // known
        if int(np.prod(out, dtype=np.int64)) != x.size:
            raise InvalidArgument(f"Reshape {self.node.name!r}: cannot reshape {tuple(x.shape)} to {target}")
        return (_view(self.rt, x, tuple(out)),)


def _view(rt, x, shape):
    if x.size == 0:
        return rt.empty(shape, x.dtype)
    return x.reshape(shape)


@op("Flatten", since=1, accepts=_data_refusal)
class Flatten(CLKernel):
    """A 2-D view split at ``axis``."""

    def run(self, x):
        axis = int(self.attrs.get("axis", 1))
        if not -x.ndim <= axis <= x.ndim:
            raise InvalidArgument(f"Flatten {self.node.name!r}: axis {axis} is out of range for rank {x.ndim}")
        if axis < 0:
            axis += x.ndim
        lead = int(np.prod(x.shape[:axis], dtype=np.int64))
        return (_view(self.rt, x, (lead, int(np.prod(x.shape[axis:], dtype=np.int64)))),)


@op("Squeeze", since=1, accepts=_data_refusal)
class Squeeze(CLKernel):
    """A view without the given (or all) unit dimensions."""

    def run(self, x, axes=None):
        ax = host_ints(self, 1, axes) if self.node.opset >= 13 else self.attrs.get("axes")
        if ax is None:
            shape = tuple(s for s in x.shape if s != 1)
        else:
            ax = {_norm_axis(a, x.ndim, f"Squeeze {self.node.name!r}") for a in ax}
            for a in ax:
                if x.shape[a] != 1:
                    raise InvalidArgument(f"Squeeze {self.node.name!r}: dimension {a} of {tuple(x.shape)} is not 1")
            shape = tuple(s for j, s in enumerate(x.shape) if j not in ax)
        return (_view(self.rt, x, shape),)


@op("Unsqueeze", since=1, accepts=_data_refusal)
class Unsqueeze(CLKernel):
    """A view with unit dimensions inserted."""

    def run(self, x, axes=None):
        ax = host_ints(self, 1, axes) if self.node.opset >= 13 else self.attrs.get("axes", [])
        rank = x.ndim + len(ax)
        ax = sorted(_norm_axis(a, rank, f"Unsqueeze {self.node.name!r}") for a in ax)
        if len(set(ax)) != len(ax):
            raise InvalidArgument(f"Unsqueeze {self.node.name!r}: repeated axes {ax}")
        shape = list(x.shape)
        for a in ax:
            shape.insert(a, 1)
        return (_view(self.rt, x, tuple(shape)),)


def _dropout_refusal(ni) -> str | None:
    why = _data_refusal(ni)
    if why:
        return why
    if len(ni.inputs) > 2 and ni.inputs[2]:
        return "Dropout with a training_mode input runs on the CPU"
    if ni.opset < 7 and not int(ni.attrs.get("is_test", 0)):
        return "Dropout in training mode runs on the CPU"
    return None


@op("Dropout", since=1, accepts=_dropout_refusal)
class Dropout(CLKernel):
    """Inference-mode dropout: the input itself, and an all-true mask when asked for."""

    def run(self, x, ratio=None, training_mode=None):
        if len(self.node.outputs) < 2 or not self.node.outputs[1]:
            return (x,)
        mask = self.rt.empty(x.shape, np.bool_)
        if mask.size:
            fill(self.rt, mask, True)
        return (x, mask)


def _constant_refusal(ni) -> str | None:
    for key in ("sparse_value", "value_string", "value_strings"):
        if key in ni.attrs:
            return f"Constant with {key} runs on the CPU"
    value = ni.attrs.get("value")
    if value is not None and (value.dtype.kind not in "biuf" or value.dtype.itemsize not in _UINT):
        return f"Constant of type {value.dtype} runs on the CPU"
    return None


@op("Constant", since=1, accepts=_constant_refusal)
class Constant(CLKernel):
    """A value uploaded once; every run returns the same device array (never written)."""

    def setup(self):
        a = self.attrs
        if "value" in a:
            self.value = np.asarray(a["value"])
        elif "value_float" in a:
            self.value = np.asarray(a["value_float"], np.float32)
        elif "value_floats" in a:
            self.value = np.asarray(a["value_floats"], np.float32)
        elif "value_int" in a:
            self.value = np.asarray(a["value_int"], np.int64)
        elif "value_ints" in a:
            self.value = np.asarray(a["value_ints"], np.int64)
        else:
            raise InvalidArgument(f"Constant {self.node.name!r} has no value attribute")

    def prepare(self):
        self.device_value = self.rt.to_device(self.value)
        if self.value.size <= 64:
            self.device_value.host_copy = self.value

    def run(self):
        return (self.device_value,)


# -- strided copies ----------------------------------------------------------------------------
@op("Transpose", since=1, accepts=_data_refusal)
class Transpose(CLKernel):
    """Permute dimensions (reversed by default)."""

    def run(self, x):
        perm = self.attrs.get("perm") or list(range(x.ndim))[::-1]
        if sorted(perm) != list(range(x.ndim)):
            raise InvalidArgument(f"Transpose {self.node.name!r}: perm {perm} does not fit rank {x.ndim}")
        shape = [x.shape[p] for p in perm]
        st = _contiguous_strides(x.shape)
        out = self.rt.empty(shape, x.dtype)
        strided_copy(self.rt, x, out, shape, [st[p] for p in perm], 0, _contiguous_strides(shape), 0)
        return (out,)


def _slice_params(kernel, x, starts, ends, axes, steps):
    rank = x.ndim
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise InvalidArgument(f"Slice {kernel.node.name!r}: starts, ends, axes and steps differ in length")
    begin = [0] * rank
    step = [1] * rank
    size = list(x.shape)
    seen = set()
    for s, e, a, k in zip(starts, ends, axes, steps):
        a = _norm_axis(a, rank, f"Slice {kernel.node.name!r}")
        if a in seen:
            raise InvalidArgument(f"Slice {kernel.node.name!r}: axis {a} repeated")
        seen.add(a)
        if k == 0:
            raise InvalidArgument(f"Slice {kernel.node.name!r}: step 0 on axis {a}")
        b, _, _ = slice(s, e, k).indices(x.shape[a])
        n = len(range(*slice(s, e, k).indices(x.shape[a])))
        begin[a], step[a], size[a] = b, k, n
    return begin, step, size


@op("Slice", since=1, accepts=_data_refusal)
class Slice(CLKernel):
    """A strided sub-block (negative steps included)."""

    def run(self, x, starts=None, ends=None, axes=None, steps=None):
        if self.node.opset >= 10:
            p = (host_ints(self, 1, starts), host_ints(self, 2, ends), host_ints(self, 3, axes),
                 host_ints(self, 4, steps))
        else:
            p = (self.attrs["starts"], self.attrs["ends"], self.attrs.get("axes"), None)
        begin, step, size = _slice_params(self, x, *p)
        st = _contiguous_strides(x.shape)
        out = self.rt.empty(size, x.dtype)
        base = sum(b * s for b, s in zip(begin, st))
        strided_copy(self.rt, x, out, size, [k * s for k, s in zip(step, st)], base, _contiguous_strides(size), 0)
        return (out,)


@op("Concat", since=1, accepts=_data_refusal)
class Concat(CLKernel):
    """Join along ``axis``: one strided copy per input."""

    def run(self, *xs):
        ref = xs[0]
        axis = _norm_axis(int(self.attrs.get("axis", 1 if self.node.opset < 4 else 0)), ref.ndim,
                          f"Concat {self.node.name!r}")
        for x in xs:
            if x.ndim != ref.ndim or any(x.shape[j] != ref.shape[j] for j in range(ref.ndim) if j != axis):
                raise InvalidArgument(
                    f"Concat {self.node.name!r}: shapes {[tuple(v.shape) for v in xs]} differ off axis {axis}"
                )
            if x.dtype != ref.dtype:
                raise InvalidArgument(f"Concat {self.node.name!r}: inputs of types {ref.dtype} and {x.dtype}")
        shape = list(ref.shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        out = self.rt.empty(shape, ref.dtype)
        ost = _contiguous_strides(shape)
        at = 0
        for x in xs:
            strided_copy(self.rt, x, out, list(x.shape), _contiguous_strides(x.shape), 0, ost, at * ost[axis])
            at += x.shape[axis]
        return (out,)


@op("Split", since=1, accepts=_data_refusal)
class Split(CLKernel):
    """Cut along ``axis`` into the given sizes (or equal parts)."""

    def run(self, x, split=None):
        axis = _norm_axis(int(self.attrs.get("axis", 0)), x.ndim, f"Split {self.node.name!r}")
        n_out = len(self.node.outputs)
        sizes = host_ints(self, 1, split) if self.node.opset >= 13 else self.attrs.get("split")
        if self.node.opset < 13 and sizes is None and split is not None:
            sizes = host_ints(self, 1, split)
        dim = x.shape[axis]
        if not sizes:
            parts = int(self.attrs.get("num_outputs", n_out))
            chunk = -(-dim // parts)
            sizes = [min(chunk, max(dim - chunk * k, 0)) for k in range(parts)]
        if sum(sizes) != dim or len(sizes) != n_out:
            raise InvalidArgument(f"Split {self.node.name!r}: sizes {sizes} do not split dimension {dim} into {n_out}")
        st = _contiguous_strides(x.shape)
        outs = []
        at = 0
        for n in sizes:
            shape = list(x.shape)
            shape[axis] = n
            out = self.rt.empty(shape, x.dtype)
            strided_copy(self.rt, x, out, shape, st, at * st[axis], _contiguous_strides(shape), 0)
            outs.append(out)
            at += n
        return tuple(outs)


@op("Expand", since=8, accepts=_data_refusal)
class Expand(CLKernel):
    """Broadcast to a shape: a copy reading with stride 0 along broadcast dimensions."""

    def run(self, x, shape):
        target = host_ints(self, 1, shape)
        try:
            out_shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(target)))
        except ValueError:
            raise InvalidArgument(f"Expand {self.node.name!r}: {tuple(x.shape)} does not broadcast to {target}") from None
        return (_broadcast_to(self.rt, x, out_shape),)


def _broadcast_to(rt, x, out_shape):
    rank = len(out_shape)
    xs = (1,) * (rank - x.ndim) + tuple(x.shape)
    st = (0,) * (rank - x.ndim) + tuple(_contiguous_strides(x.shape))
    src_st = [0 if xs[j] == 1 and out_shape[j] != 1 else st[j] for j in range(rank)]
    out = rt.empty(out_shape, x.dtype)
    strided_copy(rt, x, out, list(out_shape), src_st, 0, _contiguous_strides(out_shape), 0)
    return out


@op("Tile", since=6, accepts=_data_refusal)
class Tile(CLKernel):
    """Repeat along each axis: a copy over (repeat, dim) pairs with stride 0 on repeats."""

    def run(self, x, repeats):
        reps = host_ints(self, 1, repeats)
        if len(reps) != x.ndim or any(r < 0 for r in reps):
            raise InvalidArgument(f"Tile {self.node.name!r}: repeats {reps} do not fit rank {x.ndim}")
        out_shape = [d * r for d, r in zip(x.shape, reps)]
        st = _contiguous_strides(x.shape)
        space, sst = [], []
        for d, r, s in zip(x.shape, reps, st):
            space += [r, d]
            sst += [0, s]
        out = self.rt.empty(out_shape, x.dtype)
        strided_copy(self.rt, x, out, space, sst, 0, _contiguous_strides(space), 0)
        return (out,)


def _pad_refusal(ni) -> str | None:
    why = _data_refusal(ni)
    if why:
        return why
    mode = ni.attrs.get("mode", "constant")
    if mode != "constant":
        return f"Pad mode {mode!r} runs on the CPU"
    return None


@op("Pad", since=2, accepts=_pad_refusal)
class Pad(CLKernel):
    """Constant padding (negative pads crop): a fill, then one strided copy."""

    def run(self, x, pads=None, value=None, axes=None):
        rank = x.ndim
        if self.node.opset >= 11:
            p = host_ints(self, 1, pads)
            cval = 0
            if value is not None:
                cv = self.node.constants.get(2)
                if cv is None:
                    cv = getattr(value, "host_copy", None)
                cval = (np.asarray(cv) if cv is not None else self.rt.to_host(value)).reshape(-1)[0]
            ax = host_ints(self, 3, axes)
        else:
            p = list(self.attrs.get("pads", []))
            cval = float(self.attrs.get("value", 0.0))
            ax = None
        ax = list(range(rank)) if ax is None else [_norm_axis(a, rank, f"Pad {self.node.name!r}") for a in ax]
        if len(p) != 2 * len(ax):
            raise InvalidArgument(f"Pad {self.node.name!r}: {len(p)} pads for {len(ax)} axes")
        before = [0] * rank
        after = [0] * rank
        for k, a in enumerate(ax):
            before[a], after[a] = p[k], p[k + len(ax)]
        out_shape = [d + b + e for d, b, e in zip(x.shape, before, after)]
        if any(s < 0 for s in out_shape):
            raise InvalidArgument(f"Pad {self.node.name!r}: pads {p} crop {tuple(x.shape)} below zero")
        out = self.rt.empty(out_shape, x.dtype)
        if out.size:
            fill(self.rt, out, cval)
        src0 = [max(0, -b) for b in before]
        dst0 = [max(0, b) for b in before]
        region = [max(0, d - s - max(0, -e)) for d, s, e in zip(x.shape, src0, after)]
        sst = _contiguous_strides(x.shape)
        dst = _contiguous_strides(out_shape)
        if all(r > 0 for r in region):
            strided_copy(self.rt, x, out, region, sst, sum(a * b for a, b in zip(src0, sst)),
                         dst, sum(a * b for a, b in zip(dst0, dst)))
        return (out,)


# -- gather --------------------------------------------------------------------------------------
_GATHER = """__kernel void gather(__global const {T} *data, __global const {I} *idx, __global {T} *out,
                     long n_idx, long inner, long dim)
{{
    const long gid = get_global_id(0);
    const long i = gid % inner;
    const long j = (gid / inner) % n_idx;
    const long o = gid / (inner * n_idx);
    long k = (long)idx[j];
    if (k < 0) k += dim;
    k = clamp(k, (long)0, dim - 1);  /* indices are checked on the host when it has them */
    out[gid] = data[(o * dim + k) * inner + i];
}}
"""


def _gather_refusal(ni) -> str | None:
    why = _data_refusal(ni)
    if why:
        return why
    it = ni.input_dtype(1)
    if it is None or it not in (np.dtype(np.int32), np.dtype(np.int64)):
        return f"Gather indices of type {it} run on the CPU"
    return None


@op("Gather", since=1, accepts=_gather_refusal)
class Gather(CLKernel):
    """Take slices along ``axis`` at the given (possibly negative) indices."""

    def run(self, data, indices):
        axis = _norm_axis(int(self.attrs.get("axis", 0)), data.ndim, f"Gather {self.node.name!r}")
        dim = data.shape[axis]
        host = self.node.constants.get(1)
        if host is None:
            host = getattr(indices, "host_copy", None)
        if host is not None:
            h = np.asarray(host)
            if h.size and (h.min() < -dim or h.max() >= dim):
                raise InvalidArgument(
                    f"Gather {self.node.name!r}: indices must be in [{-dim}, {dim - 1}] for axis {axis} of size {dim}"
                )
        shape = tuple(data.shape[:axis]) + tuple(indices.shape) + tuple(data.shape[axis + 1:])
        out = self.rt.empty(shape, data.dtype)
        if out.size == 0:
            return (out,)
        if dim == 0:
            raise InvalidArgument(f"Gather {self.node.name!r}: indices into an empty axis {axis}")
        inner = int(np.prod(data.shape[axis + 1:], dtype=np.int64))
        src = _GATHER.format(T=_UINT[data.dtype.itemsize], I="int" if indices.dtype == np.int32 else "long")
        prg = self.rt.program(src)
        self.rt.launch(prg, "gather", (out.size,), None, data, indices, out,
                       np.int64(max(indices.size, 1)), np.int64(inner), np.int64(dim))
        return (out,)
