"""Resize's per-axis sampling tables, per the ONNX rules.

Resize is separable: along each resized axis, output position ``i`` reads a few input
positions ``idx[i, :]`` with weights ``w[i, :]`` (one position and no weights for
nearest). Every provider needs exactly the same tables from the same attributes, or
the providers disagree, so they are computed here once, on the host, in float64.
Providers apply them with their own kernels.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["cubic_kernel", "source_coords", "axis_table", "axis_order"]


def cubic_kernel(x: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances ``x``."""
    x = np.abs(x)
    x2 = x * x
    x3 = x2 * x
    near = (a + 2) * x3 - (a + 3) * x2 + 1
    far = a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def source_coords(coord: str, in_len: int, out_len: int, scale: float,
                  start: float = 0.0, end: float = 1.0) -> np.ndarray:
    """The input coordinate of every output position along one axis.

    :param coord: the ``coordinate_transformation_mode``.
    :param start, end: the axis's region of interest (``tf_crop_and_resize`` only).
    """
    y = np.arange(out_len, dtype=np.float64)
    # the length the scale implies, before flooring to an integer size
    out_f = in_len * scale
    if coord == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if coord == "half_pixel_symmetric":
        adjustment = out_len / out_f if out_f else 1.0
        offset = in_len / 2 * (1 - adjustment)
        return offset + (y + 0.5) / scale - 0.5
    if coord == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
    if coord == "align_corners":
        return y * (in_len - 1) / (out_f - 1) if out_f != 1 else np.zeros(out_len)
    if coord == "asymmetric":
        return y / scale
    if coord == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    # tf_crop_and_resize
    if out_f != 1:
        return start * (in_len - 1) + y * (end - start) * (in_len - 1) / (out_f - 1)
    return np.full(out_len, 0.5 * (start + end) * (in_len - 1))


def axis_table(x: np.ndarray, in_len: int, scale: float, *, mode: str, nearest_mode: str,
               cubic_a: float = -0.75, antialias: bool = False,
               exclude_outside: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """``(idx, w)`` for source coordinates ``x`` along one axis of length ``in_len``.

    ``idx`` is int64 ``[out, taps]`` and may point outside ``[0, in_len)`` (clamp it,
    as the border rule of every mode reads the edge); ``w`` is float64 ``[out, taps]``,
    or ``None`` for nearest.
    """
    if mode == "nearest":
        # Scales arrive as float32 (0.6 is 0.60000002), so a position meant to fall on
        # an integer or a half can land a hair beside it; snap those so the rounding
        # rule decides, not the representation error.
        half = np.round(x * 2) / 2
        x = np.where(np.abs(x - half) <= 1e-5 * np.maximum(1.0, np.abs(x)), half, x)
        if nearest_mode == "round_prefer_floor":
            idx = np.ceil(x - 0.5)
        elif nearest_mode == "round_prefer_ceil":
            idx = np.floor(x + 0.5)
        elif nearest_mode == "floor":
            idx = np.floor(x)
        elif nearest_mode == "ceil":
            idx = np.ceil(x)
        else:  # "simple": Resize-10 rounds down when upsampling, up when downsampling
            idx = np.ceil(x) if scale < 1 else np.floor(x)
        return idx.astype(np.int64)[:, None], None
    # taps sit at base + k, base = ceil(x) - 1, so the fraction lies in (0, 1]
    base = np.ceil(x) - 1
    frac = x - base
    s = min(scale, 1.0) if antialias else 1.0
    support = 1.0 if mode == "linear" else 2.0
    k0 = int(np.floor(-support / s)) + 1
    ks = np.arange(k0, 2 - k0, dtype=np.float64)
    dist = (ks[None, :] - frac[:, None]) * s
    w = np.clip(1 - np.abs(dist), 0, 1) if mode == "linear" else cubic_kernel(dist, cubic_a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    idx = base[:, None].astype(np.int64) + ks.astype(np.int64)[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return idx, w


def axis_order(work: list[int], shape: list[int], out: list[int]) -> list[int]:
    """Order the resized axes to move the least data.

    Each pass writes its whole output; a pass over the innermost axis gathers element
    by element, which costs several times a pass over an outer axis (whole rows).
    """
    if len(work) <= 1:
        return work
    last = len(shape) - 1
    best, best_cost = work, None
    for perm in itertools.permutations(work):
        cur = list(shape)
        cost = 0.0
        for ax in perm:
            cur[ax] = out[ax]
            cost += float(np.prod(cur)) * (4.0 if ax == last else 1.0)
        if best_cost is None or cost < best_cost:
            best, best_cost = list(perm), cost
    return best
