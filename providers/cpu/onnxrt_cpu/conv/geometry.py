"""The geometry of a sliding window: padding and output size, the taps' slices,
the stride phases of a padded input and the row-pitch layout, shared by the
convolution algorithms here and by the pooling kernels."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

__all__ = ["check_rank", "col2im_add", "compute_dtype", "conv_attributes", "conv_pads", "pad_margins", "pad_spatial",
           "phase_geometry", "row_pitch", "spatial_attrs", "tap_groups", "tap_slices"]


def compute_dtype(dt: np.dtype) -> np.dtype:
    """The float type a convolution or pooling computes in for inputs of type ``dt``."""
    dt = np.dtype(dt)
    if dt == np.float32 or dt == np.float64:
        return dt
    return np.dtype(np.float32)


def conv_attributes(attrs: dict) -> tuple[int, str, list | None]:
    """``(group, auto_pad, pads)`` of a convolution node's attributes, with the spec's
    defaults (group 1, NOTSET, pads None: zeros)."""
    return int(attrs.get("group", 1)), attrs.get("auto_pad", "NOTSET"), attrs.get("pads")


def spatial_attrs(attrs: dict, nd: int, kernel=None):
    """``(kernel, strides, dilations)`` as tuples of ``nd`` ints, with spec defaults."""
    if kernel is None:
        kernel = attrs.get("kernel_shape")
    strides = attrs.get("strides") or [1] * nd
    dilations = attrs.get("dilations") or [1] * nd
    if len(strides) != nd or len(dilations) != nd:
        raise ValueError(f"strides {strides} / dilations {dilations} must have {nd} entries (spatial rank)")
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise ValueError(f"strides {strides} and dilations {dilations} must be positive")
    return tuple(int(k) for k in kernel), tuple(int(s) for s in strides), tuple(int(d) for d in dilations)


def conv_pads(in_sp, kernel, strides, dilations, pads, auto_pad):
    """Padding and output size of a convolution-like sliding window, per spatial axis.

    Returns ``(pads_begin, pads_end, out_spatial)`` following the ONNX Conv rules:
    ``SAME_*`` gives ``ceil(in / stride)`` outputs, splitting the padding with the
    extra element at the end (``SAME_UPPER``) or the beginning (``SAME_LOWER``).
    """
    nd = len(in_sp)
    auto_pad = auto_pad or "NOTSET"
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe, out = [], [], []
        for i in range(nd):
            o = -(-in_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i])
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pb.append(b)
            pe.append(total - b)
            out.append(o)
        return pb, pe, out
    if auto_pad == "VALID":
        pb = pe = [0] * nd
    elif auto_pad == "NOTSET":
        if pads is None or len(pads) == 0:
            pads = [0] * (2 * nd)
        if len(pads) != 2 * nd:
            raise ValueError(f"pads {list(pads)} must have {2 * nd} entries")
        if any(p < 0 for p in pads):
            raise ValueError(f"pads {list(pads)} must be non-negative")
        pb, pe = list(pads[:nd]), list(pads[nd:])
    else:
        raise ValueError(f"unknown auto_pad {auto_pad!r}")
    out = []
    for i in range(nd):
        ek = (kernel[i] - 1) * dilations[i] + 1
        o = (in_sp[i] + pb[i] + pe[i] - ek) // strides[i] + 1
        if o < 1:
            raise ValueError(
                f"window {kernel[i]} (dilation {dilations[i]}) does not fit spatial axis {i} "
                f"of size {in_sp[i]} with pads ({pb[i]}, {pe[i]})"
            )
        out.append(o)
    return pb, pe, out


def pad_spatial(x: np.ndarray, pb, pe, value=0) -> np.ndarray:
    """``x`` with its trailing ``len(pb)`` axes padded by ``value`` (``x`` itself if no padding)."""
    nd = len(pb)
    if not any(pb) and not any(pe):
        return x
    lead = x.shape[: x.ndim - nd]
    sp = x.shape[x.ndim - nd :]
    out = np.full(lead + tuple(s + b + e for s, b, e in zip(sp, pb, pe)), value, dtype=x.dtype)
    out[(Ellipsis,) + tuple(slice(b, b + s) for b, s in zip(pb, sp))] = x
    return out


def tap_slices(kernel, strides, dilations, out_sp, offset=None):
    """Yield ``(tap, slices)``: for each kernel tap, the strided slices of the padded
    input (trailing axes) that the tap reads for every output position."""
    for tap in itertools.product(*[range(k) for k in kernel]):
        sl = []
        for i, t in enumerate(tap):
            start = t * dilations[i] + (offset[i] if offset else 0)
            sl.append(slice(start, start + strides[i] * (out_sp[i] - 1) + 1, strides[i]))
        yield tap, tuple(sl)


def col2im_add(canvas: np.ndarray, cols: np.ndarray, kernel, strides, dilations, in_sp, offset=None):
    """Scatter-add columns ``[C, *kernel, *in_sp]`` into ``canvas`` ``[C, *spatial]``."""
    for tap, sl in tap_slices(kernel, strides, dilations, in_sp, offset):
        canvas[(slice(None),) + sl] += cols[(slice(None),) + tap]



@functools.lru_cache(maxsize=256)
def phase_geometry(in_sp, kernel, strides, dilations, pb, pe, out_sp):
    """Where the stride phases of a padded input lie, flattened so every tap is one run.
    Kept per geometry (all arguments tuples, results read only): deriving it took 30 us
    a call, on every run of every strided depthwise layer.

    Phase ``p`` holds ``padded[p::s]`` along each axis (zero-extended to a common
    shape ``q``, plus one spare row), so the tap at ``t`` for output ``o`` reads phase
    ``(t*d) % s`` at ``o + (t*d) // s``: on the flattened phase, every tap's inputs for
    a run of output rows form one contiguous slice of ``rows * pitch[0]`` elements
    (outputs computed on the phase's row pitch, cropped afterwards).

    Returns ``(q, pitch, copies)``, ``copies`` being the ``(phase, destination slices,
    source slices)`` that write the input into the phases (:func:`tap_groups` places
    the taps).
    """
    nd = len(kernel)
    reach = [(kernel[a] - 1) * dilations[a] // strides[a] for a in range(nd)]
    q = [max(-(-(in_sp[a] + pb[a] + pe[a]) // strides[a]), out_sp[a] + reach[a]) for a in range(nd)]
    q[0] += 1
    phases = list(itertools.product(*[range(s_) for s_ in strides]))
    copies = []
    for k, ph in enumerate(phases):
        dst, src = [], []
        for a in range(nd):
            s_, p_ = strides[a], ph[a]
            i0 = max(0, -(-(pb[a] - p_) // s_))  # first phase index landing inside the input
            o0 = s_ * i0 + p_ - pb[a]
            cnt = max(0, -(-(in_sp[a] - o0) // s_)) if o0 < in_sp[a] else 0
            cnt = min(cnt, q[a] - i0)
            dst.append(slice(i0, i0 + cnt))
            src.append(slice(o0, o0 + s_ * (cnt - 1) + 1 if cnt else o0, s_))
        if all(d_.stop > d_.start for d_ in dst):
            copies.append((k, tuple(dst), tuple(src)))
    pitch = [math.prod(q[a + 1 :]) for a in range(nd)]
    return tuple(q), tuple(pitch), tuple(copies)


@functools.lru_cache(maxsize=256)
def tap_groups(kernel, strides, dilations, pitch):
    """The taps of :func:`phase_geometry`'s phase layout as groups that each read one
    strided view of one flattened phase: ``([(phase, offset, shape, element steps)],
    tap order)``, the order listing the taps group by group.

    Along each axis the taps landing in one phase are every ``s / gcd(s, d)``-th tap,
    and their offsets in the phase grow by a constant step, so a phase's taps are the
    product of one arithmetic run per axis: one view of ``shape`` (the run lengths)
    with the runs' steps times the phase's pitches.
    """
    nd = len(kernel)
    per_axis = []  # per axis: {phase index along the axis: [(tap index, offset)]}
    for a in range(nd):
        runs = {}
        for t in range(kernel[a]):
            pos = t * dilations[a]
            runs.setdefault(pos % strides[a], []).append((t, pos // strides[a]))
        per_axis.append(runs)
    groups, order = [], []
    for ph in itertools.product(*[range(s_) for s_ in strides]):
        axes = [per_axis[a].get(ph[a]) for a in range(nd)]
        if any(r is None for r in axes):
            continue
        index = 0
        for a in range(nd):
            index = index * strides[a] + ph[a]
        offset = sum(axes[a][0][1] * pitch[a] for a in range(nd))
        shape = tuple(len(r) for r in axes)
        steps = tuple((r[1][1] - r[0][1] if len(r) > 1 else 0) * pitch[a] for a, r in enumerate(axes))
        groups.append((index, offset, shape, steps))
        for t in itertools.product(*[[tt for tt, _ in r] for r in axes]):
            flat = 0
            for a in range(nd):
                flat = flat * kernel[a] + t[a]
            order.append(flat)
    return tuple(groups), tuple(order)


@functools.lru_cache(maxsize=256)
def row_pitch(h: int, wd: int, pb, pe, kw: int, dw: int) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """A 2-D map of ``h`` rows of ``wd`` values laid out on its own row pitch, padded
    above and below only (``pb[0]`` and ``pe[0]`` rows, plus ``pb[1]`` and ``pe[1]``
    values at the two ends): ``(head, per, edges)``, the values before the first input
    value, the values per channel, and the ``(tap column, output column)`` pairs whose
    tap (of ``kw`` columns dilated by ``dw``) falls left or right of the row and reads
    the neighbouring row instead of the padding. Kept per geometry (the arguments are
    ints and tuples)."""
    head = pb[1] + pb[0] * wd
    per = head + h * wd + pe[0] * wd + pe[1]
    edges = []
    for tx in range(kw):
        off = tx * dw - pb[1]
        cols_out = range(min(wd, -off)) if off < 0 else range(max(0, wd - off), wd)
        edges.extend((tx, col) for col in cols_out)
    return head, per, tuple(edges)


def pad_margins(a: np.ndarray, start: int, stop: int, value) -> None:
    """Fill the last axis of ``a`` with ``value`` outside ``start:stop``."""
    if start:
        a[..., :start] = value
    if stop < a.shape[-1]:
        a[..., stop:] = value


def check_rank(x, w, what="input"):
    """Raise a ValueError unless ``x`` has a batch, a channel and a spatial axis and
    ``w`` the same rank."""
    if x.ndim < 3:
        raise ValueError(f"{what} must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
    if w.ndim != x.ndim:
        raise ValueError(f"weight rank {w.ndim} does not match {what} rank {x.ndim}")
