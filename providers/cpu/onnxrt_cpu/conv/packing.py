"""Weights packed for the convolution algorithms, once a node (when the weight is a
constant) or once a call: the GEMM layout and the depthwise, channels-last,
paired, stride-phase and Winograd forms each algorithm multiplies by, made on
first use and kept."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ConvWeights", "DeconvWeights", "grouped_channels", "is_constant_input", "pair_count", "paired_rows",
           "weight_for"]


def grouped_channels(w: np.ndarray, group: int, what: str) -> int:
    """The channels on a convolution weight's first axis (``what``: "output" for
    Conv's, "input" for ConvTranspose's), which ``group`` must divide; a ValueError
    for a weight of rank below 3 or a group that does not divide them."""
    if w.ndim < 3:
        raise ValueError(f"weight must have rank >= 3, got shape {w.shape}")
    count = w.shape[0]
    if group < 1 or count % group:
        raise ValueError(f"{what} channels {count} are not divisible by group {group}")
    return count


class ConvWeights:
    """A Conv weight ``[M, C/g, *k]`` laid out for the kernel's GEMM.

    ``gemm`` is ``[g, M/g, C/g * prod(k)]`` contiguous; ``depthwise`` is
    ``[C, prod(k)]`` when the node is a depthwise convolution (else ``None``).
    """

    __slots__ = ("shape", "group", "kernel", "gemm", "depthwise", "absmax", "_rows", "_biased", "_paired", "_taps",
                 "_last", "_phased", "_winograd")

    def __init__(self, w: np.ndarray, group: int, dtype: np.dtype):
        m = grouped_channels(w, group, "output")
        self.shape, self.group, self.kernel = w.shape, group, tuple(w.shape[2:])
        self.depthwise = None
        self.absmax = None
        self._rows = None
        self._biased = None
        self._paired = None
        self._taps = None
        self._last = None
        self._phased = None
        self._winograd = None
        wc = np.asarray(w, dtype=dtype)
        if group > 1 and w.shape[1] == 1 and m == group:
            self.depthwise = np.ascontiguousarray(wc.reshape(m, math.prod(w.shape[1:])))
        # explicit sizes: -1 cannot be inferred when there are no output channels
        self.gemm = np.ascontiguousarray(wc.reshape(group, m // group, math.prod(w.shape[1:])))

    def rows(self) -> np.ndarray:
        """The 2-D, group-1 weight as ``[kh * kw * C, M]``: the row order of a
        channels-last im2col (made on first use; a race only builds it twice)."""
        if self._rows is None:
            m, c, kh, kw = self.shape
            w4 = self.gemm.reshape(m, c, kh, kw)
            self._rows = np.ascontiguousarray(w4.transpose(2, 3, 1, 0).reshape(kh * kw * c, m))
        return self._rows

    def paired(self, sw: int, pairs: int) -> np.ndarray:
        """:meth:`rows`, widened by :func:`paired_rows` for ``pairs`` outputs per row
        at column stride ``sw`` (kept for the last setting asked for)."""
        if pairs == 1:
            return self.rows()
        cached = self._paired
        if cached is None or cached[0] != (sw, pairs):
            m, c, kh, kw = self.shape
            cached = self._paired = ((sw, pairs), paired_rows(self.rows(), kh, kw, c, sw, pairs))
        return cached[1]

    def winograd(self) -> np.ndarray:
        """A group-1 3x3 weight's Winograd transform ``G g G^T`` as ``[16, M, C]``
        float32 (element ``4 i + j`` of each 4x4 transform at ``[4 i + j]``), for the
        compiled F(2x2, 3x3) kernel; computed in float64 and rounded once, on first
        use (a race only builds it twice)."""
        if self._winograd is None:
            m, c = self.shape[:2]
            g = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
            # G w G^T for every (m, c) at once: one product of G (x) G with the [MC, 9]
            # weights (an einsum over the five indices took 0.3 s for ResNet-18's)
            kron = np.einsum("ik,jl->ijkl", g, g).reshape(16, 9)
            # [16, 9] x [9, MC]: the transposed weight is read as it lies, and the
            # product comes out in the kernel's [16, M, C] order (no transposing copy)
            u = kron @ self.gemm.reshape(m * c, 9).astype(np.float64).T
            self._winograd = u.astype(np.float32).reshape(16, m, c)
        return self._winograd

    def depthwise_last(self) -> np.ndarray:
        """The depthwise weight as ``[*kernel, C]``: the channels-last layout of
        :func:`depthwise_channels_last` (made on first use; a race only builds it twice)."""
        if self._last is None:
            c = self.depthwise.shape[0]
            self._last = np.ascontiguousarray(self.depthwise.T.reshape(*self.kernel, c))
        return self._last

    def _kept(self, slot: str, key, bias, constant, build):
        """``build()``, kept in ``slot`` for ``key`` and ``constant``, the node's
        constant bias array (``bias`` is a new view of it on every call); a bias fed at
        run time (``constant`` None) may hold new values in the same memory, so a
        weight with a ``bias`` folded in is built afresh every call."""
        keep = bias is None or constant is not None
        cached = getattr(self, slot)
        if keep and cached is not None and cached[0] == key and cached[1] is constant:
            return cached[2]
        result = build()
        if keep:
            setattr(self, slot, (key, constant, result))
        return result

    def depthwise_taps(self, order, bias, constant=None):
        """The depthwise weight as ``[C, 1, taps]`` with its taps in ``order`` (a tuple,
        or None for kernel order), and the rows of gathered taps it multiplies: with a
        ``bias`` ``[C, 1]``, the bias as one more tap, which reads a row of ones, so the
        product carries it (one more row in a product that is in cache, where adding
        it afterwards is a pass over the whole output: 144 x 56 x 56, 112 us).
        Kept for the last order and ``constant`` (:meth:`_kept`)."""

        def build():
            c, taps = self.depthwise.shape
            w3 = self.depthwise.reshape(c, 1, taps)
            if order is not None:
                w3 = w3[:, :, list(order)]
            if bias is not None:
                w3 = np.concatenate([w3, bias.reshape(-1, 1, 1).astype(w3.dtype, copy=False)], axis=2)
            return w3, w3.shape[2]

        return self._kept("_taps", order, bias, constant, build)

    def phased(self, order, bias=None, constant=None) -> tuple[np.ndarray, int]:
        """The group-1 GEMM weight ``[M, C * taps]`` with each channel's taps in
        ``order`` (a tuple), the row order of
        :func:`~onnxrt_cpu.conv.phases.conv_phases`'s gathered taps,
        and with a ``bias`` ``[M, 1]`` as one more column (which multiplies a row of
        ones); and its column count. Kept for the last order and ``constant``
        (:meth:`_kept`)."""

        def build():
            m, k = self.gemm.shape[1:]
            taps = math.prod(self.kernel)
            w = self.gemm[0].reshape(m, k // taps, taps)[:, :, list(order)].reshape(m, k)
            if bias is not None:
                w = np.concatenate([w, bias.reshape(m, 1).astype(w.dtype, copy=False)], axis=1)
            return np.ascontiguousarray(w), w.shape[1]

        return self._kept("_phased", order, bias, constant, build)

    def biased(self, bias: np.ndarray, constant=None) -> np.ndarray:
        """The group-1 GEMM weight ``[M, K + 1]`` with ``bias`` (``[M]``) as its last
        column: times an input with a row of ones appended, the product carries the
        bias. Kept for ``constant``, the node's constant bias (:meth:`_kept`)."""

        def build():
            col = bias.astype(self.gemm.dtype, copy=False).reshape(-1, 1)
            return np.concatenate([self.gemm[0], col], axis=1)

        return self._kept("_biased", None, bias, constant, build)


#: Up to this many output channels, two adjacent output positions share one row of
#: the channels-last im2col (see :func:`paired_rows`).
_PAIR_MAX_CHANNELS = 16


def pair_count(m: int, ow: int) -> int:
    """Adjacent output columns per im2col row for ``m`` output channels and output
    width ``ow``: 2 for few channels (and an even width), else 1."""
    return 2 if m <= _PAIR_MAX_CHANNELS and ow % 2 == 0 else 1


def paired_rows(w_rows: np.ndarray, kh: int, kw: int, c: int, sw: int, pairs: int) -> np.ndarray:
    """The channels-last GEMM weight ``[kh * kw * C, M]`` widened to compute ``pairs``
    adjacent output columns per im2col row: ``[kh * fw * C, pairs * M]`` with
    ``fw = (pairs - 1) * sw + kw`` input columns, each output's taps at its own
    offset and zeros elsewhere.

    With 16 output channels a GEMM runs far below BLAS's peak (``[1024, 147] @
    [147, 16]`` for a 7x7 stem), and the im2col copy of short runs costs as much as
    the product. Two outputs per row double N and share the overlap of their
    windows: a third more multiply-adds, at a better rate, and half as many copied
    runs, each longer, of two thirds of the data (one 64x64 image of a 7x7 stride-2
    stem: copy 60 -> 33 us, product 67 -> 71 us; 16 channels 3x3 on 4 images of
    16x16: 42 -> 16 and 57 -> 58 us; with 32 channels the product lost what the copy
    saved, and four outputs per row lost on the product).
    """
    m = w_rows.shape[1]
    w = w_rows.reshape(kh, kw, c, m)
    fw = (pairs - 1) * sw + kw
    wide = np.zeros((kh, fw, c, pairs, m), dtype=w_rows.dtype)
    for j in range(pairs):
        wide[:, j * sw : j * sw + kw, :, j, :] = w
    return wide.reshape(kh * fw * c, pairs * m)


class DeconvWeights:
    """ConvTranspose weight ``[C, M/g, *k]`` as ``[g, M/g * prod(k), C/g]`` for the GEMM."""

    __slots__ = ("shape", "group", "kernel", "gemm")

    def __init__(self, w, group, dtype):
        c = grouped_channels(w, group, "input")
        self.shape, self.group, self.kernel = w.shape, group, tuple(w.shape[2:])
        wg = np.asarray(w, dtype=dtype).reshape(group, c // group, math.prod(w.shape[1:]))
        self.gemm = np.ascontiguousarray(wg.transpose(0, 2, 1))


def weight_for(k, w, group, dtype):
    """The packed weight: the one prepacked in setup if ``w`` is that constant."""
    pre = k._packed
    if pre is not None and pre[0] is w and pre[1].gemm.dtype == dtype:
        return pre[1]
    return ConvWeights(w, group, dtype)


def is_constant_input(k, value, index: int) -> bool:
    """Whether ``value`` is kernel ``k``'s node's constant input ``index`` (the same
    array every run, so what is derived from it may be kept), not a value fed or
    computed at run time."""
    return value is not None and value is k.node.constants.get(index)
