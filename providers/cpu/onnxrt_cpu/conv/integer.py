"""The integer convolutions' exact accumulation (ConvInteger, QLinearConv): the same
products as the float convolutions on floating-point copies of the operands,
float32 where every partial sum provably fits its 24-bit mantissa (checked per
call from the input's range), else a sum of float32 products over chunks of the
reduction small enough to be exact each, else float64, so that the int32
accumulator is always exact. Batches of small images go channels last."""

from __future__ import annotations

import math

import numpy as np

from onnxrt.plugin.kernel import Kernel

from .. import native, parallel
from ..kernels.quantize import centred_bound, column_l1, requantize
from . import channels_last
from .channels_last import fill_channels_last, rows_product
from .compiled import planes
from .forward import convolve
from .geometry import check_rank, conv_attributes, conv_pads, spatial_attrs
from .packing import ConvWeights, is_constant_input, pair_count

__all__ = ["IntConvBase", "exact_product", "input_bound", "requantize_output", "to_int32"]

#: Largest im2col matrix (elements) of the batched channels-last path of the integer
#: convolutions; bigger inputs take the banded path.
_ROWS_MAX_ELEMS = 1 << 24

#: The strided im2col copy of one value, in multiply-adds of the GEMM that follows
#: (a 7x7 stem's [8192, 147] columns: 266 us to gather, 250 us for the product with
#: 16 channels, on AVX-512 BLAS kernels; about 8 on AVX2 ones), so that the split
#: threshold counts the copy that a split shares too.
_IM2COL_COST = 16


def input_bound(x: np.ndarray, xzp, zp: int, product_bound: float) -> float:
    """``max |x - zp|`` for an integer convolution's input: the bound its 8-bit type
    alone gives where that already keeps every partial sum (at most ``product_bound``
    times it) below 2**24, which spares two passes over the data; else the data's."""
    by_type = centred_bound(x.dtype, xzp)
    if by_type is not None and product_bound * by_type < 2.0**24:
        return by_type
    return max(abs(int(x.max()) - zp), abs(int(x.min()) - zp)) if x.size else 0


def exact_product(cols: np.ndarray, w_rows: np.ndarray, kchunk: int, dst: np.ndarray) -> None:
    """``dst = cols @ w_rows`` for integer-valued float32 operands, exact: in chunks of
    ``kchunk`` rows of K whose float32 products are exact, summed in ``dst``'s type
    (float64 when there are several chunks, exact for any int32 accumulator)."""
    k = w_rows.shape[0]
    if kchunk >= k:
        np.matmul(cols, w_rows, out=dst)
        return
    acc = None
    for k0 in range(0, k, kchunk):
        piece = np.matmul(cols[:, k0 : k0 + kchunk], w_rows[k0 : k0 + kchunk])
        acc = piece.astype(np.float64) if acc is None else acc + piece
    dst[...] = acc


class IntConvBase(Kernel):
    """Shared by ConvInteger and QLinearConv: exact int32 accumulation via BLAS."""

    #: whether the kernel runs the compiled 8-bit convolution (and packs its weight for it)
    bytes_products = False

    x_index = 0
    w_index = 1
    wzp_index = 3

    def setup(self):
        self.group, self.auto_pad, self.pads = conv_attributes(self.attrs)
        self._packed = None
        self._rows_w = None
        self._plans = {}
        self._bias_bound = None
        self._bias_rows = None
        c = self.node.constants
        w = c.get(self.w_index)
        wzp_idx = self.wzp_index
        has_wzp = wzp_idx < len(self.node.inputs) and self.node.inputs[wzp_idx]
        if w is not None and (not has_wzp or wzp_idx in c):
            try:
                self._packed = (w, self._pack(w, c.get(wzp_idx) if has_wzp else None))
            except ValueError:
                self._packed = None
        # the weight as bytes for the compiled 8-bit convolution, where this CPU has it
        self._requant = None  # (x, w and y scales, bias, their ratio and float bias) of the last run
        self._w8 = None if self._packed is None or not self.bytes_products else \
            native.pack_conv_int8(w, c.get(wzp_idx) if has_wzp else None)
        if self._packed is not None and self.group == 1 and w.ndim == 4:
            # [kh, kw, C, M]: the row order of the channels-last im2col below
            self._rows_w = self._packed[1][0].rows()

    def _rows_plan(self, shape, w, threads):
        """The geometry of :meth:`_accumulate_rows` for an input shape and a thread
        count, or None where that path does not apply: ``(kernel, strides, pads begin,
        pads end, output size, blocks, threads, outputs per im2col row, their weight)``.
        Kept per shape, since a run of small images otherwise spends about as long
        deriving it as multiplying."""
        key = (shape, threads)
        plan = self._plans.get(key, False)
        if plan is not False:
            return plan
        plan = None
        kernel, strides, dil = spatial_attrs(self.attrs, 2, w.shape[2:])
        n, c, h, wd = shape
        if all(d == 1 for d in dil) and n * c * h * wd:
            pb, pe, out_sp = conv_pads(shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
            (kh, kw), (sh, sw), (oh, ow) = kernel, strides, out_sp
            hp, wp = h + pb[0] + pe[0], wd + pb[1] + pe[1]
            k, m = self._rows_w.shape
            if (min(pb) >= 0 and min(pe) >= 0 and n * oh * ow * k <= _ROWS_MAX_ELEMS
                    and (oh - 1) * sh + kh <= hp and (ow - 1) * sw + kw <= wp):
                # the product's multiply-adds and the im2col copy, in multiply-adds
                work = n * oh * ow * k * (m + _IM2COL_COST)
                used = 1 if work < parallel.PARALLEL_MIN_FLOPS else threads
                pairs = 1 if kh == kw == 1 else pair_count(m, ow)
                w_rows = self._packed[1][0].paired(sw, pairs)
                jobs = channels_last.row_blocks(n, oh, ow // pairs, w_rows.shape[0], used)
                plan = (kernel, strides, pb, pe, out_sp, jobs, used, pairs, w_rows)
        if len(self._plans) >= 8:
            self._plans.clear()  # shapes that keep changing: no unbounded growth
        self._plans[key] = plan
        return plan

    def _accumulate_rows(self, x, xzp, w, bias=None):
        """The accumulator as exact float32 rows ``[N * OH * OW, M]`` (channels last),
        from the im2col of a channels-last copy of the whole batch, gathered and
        multiplied block by block (:func:`~onnxrt_cpu.conv.channels_last.row_blocks`), or None where that path does
        not apply (then :meth:`_accumulate` runs). Returns ``(rows, (N, OH, OW),
        biased)``: an integer ``bias`` ``[M]`` is carried by the product as one more
        row of the weight times a column of ones (``biased`` true) when every partial
        sum, the bias's included, stays below 2**24 and so exact in float32; its
        pass over the rows is spared.

        Many small images make the banded NCHW path a long Python loop of small copies;
        here each im2col row is ``KH`` contiguous runs of ``KW * C`` values of the
        channels-last input, gathered by a single strided copy. An unpadded 1x1
        kernel needs no im2col: its rows are the (subsampled) input itself.
        """
        if self._rows_w is None or self._packed[0] is not w or x.ndim != 4 or x.shape[1] != w.shape[1]:
            return None
        zp = 0
        if xzp is not None:
            xzp = np.asarray(xzp)
            if xzp.size != 1:
                return None
            zp = int(xzp.reshape(()))
        plan = self._rows_plan(x.shape, w, parallel.thread_count())
        if plan is None:
            return None
        (kh, kw), (sh, sw), pb, pe, (oh, ow), jobs, threads, pairs, paired = plan
        w_rows = self._rows_w
        k = w_rows.shape[0]
        l1, wmax = self._packed[1][2], self._packed[1][4]
        xmax = input_bound(x, xzp, zp, l1)
        # K is cut into chunks whose float32 products are exact. One chunk gives the
        # accumulator in float32 (every partial sum below 2**24); several are summed
        # into float64 rows, which hold any int32 accumulator exactly, so that
        # ConvInteger returns it and QLinearConv adds its bias before the one rounding
        # to float32, as onnxruntime does (float32 rows would round it first)
        kchunk = paired.shape[0] if l1 * xmax < 2.0**24 else int((2**24 - 1) // (wmax * xmax))
        if kchunk < min(k, 32):
            return None
        if bias is not None and not (kchunk >= k and l1 * xmax + self._bias_max(bias) < 2.0**24):
            bias = None
        n, c, h, wd = x.shape
        rows_per_image = oh * ow
        out = np.empty((n * rows_per_image, w_rows.shape[1]), dtype=np.float32 if kchunk >= k else np.float64)
        if kh == kw == 1 and not any(pb) and not any(pe):
            ce = c + (bias is not None)
            cols = np.empty((n, oh, ow, ce), dtype=np.float32)
            fill_channels_last(cols[..., :c], x[:, :, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw], zp)
            if bias is not None:
                cols[..., c] = 1
                parallel.matmul(cols.reshape(-1, ce), self._with_bias_row(w_rows, bias, 1), out=out)
            elif kchunk >= k:
                parallel.matmul(cols.reshape(-1, c), w_rows, out=out)
            else:
                exact_product(cols.reshape(-1, c), w_rows, kchunk, out)
            return out, (n, oh, ow), bias is not None
        xp = np.zeros((n, h + pb[0] + pe[0], wd + pb[1] + pe[1], c), dtype=np.float32)
        fill_channels_last(xp[:, pb[0] : pb[0] + h, pb[1] : pb[1] + wd], x, zp)
        # blocks small enough to be multiplied while in cache, claimed one at a time
        # by the threads; with fewer images than threads, bands of rows. The widened
        # weight has zeros only where the plain one has none: the same column sums,
        # hence the same exact chunks
        if bias is not None:
            paired = self._with_bias_row(paired, bias, pairs)
            kchunk = paired.shape[0]
        rows_product(xp, (kh, kw), (sh, sw), (oh, ow), paired, pairs, jobs, threads, out,
                     lambda a, b, dst: exact_product(a, b, kchunk, dst))
        return out, (n, oh, ow), bias is not None

    def _native_int32(self, x, x_zero_point, w, out_dtype=np.int32, mult=None, bias=None, relu=False):
        """ConvInteger's int32 accumulator by the compiled 8-bit convolution (qconv8's
        int32 output: exact, wrapping as a 32-bit accumulator does), or None where it
        does not take the node: a 2-D (or 1-D) map, the constant weight it packed,
        a scalar input zero point of the input's 8-bit type, pads of at least 0.
        With ``out_dtype`` float32: those sums converted, times ``mult`` (float32
        [1]), plus ``bias`` (float32 [M] or None), Relu'd where ``relu``."""
        if self._w8 is None or self._packed[0] is not w or x.ndim not in (3, 4) \
                or x.dtype not in (np.int8, np.uint8) or x.shape[1] != w.shape[1] * self.group or 0 in x.shape:
            return None
        zp = 0
        if x_zero_point is not None:
            xzp = np.asarray(x_zero_point)
            if xzp.size != 1 or xzp.dtype != x.dtype:
                return None  # the numpy path names what is wrong
            zp = int(xzp.reshape(()))
        kernel, strides, dil = spatial_attrs(self.attrs, x.ndim - 2, w.shape[2:])
        pb, pe, out_sp = conv_pads(x.shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
        if min(pb) < 0 or min(pe) < 0 or 0 in out_sp:
            return None
        m = w.shape[0]
        x4, g = planes(x, m, self.group, tuple(kernel), tuple(strides), tuple(dil), tuple(pb), tuple(out_sp))
        y = np.empty((x.shape[0], m, *out_sp), out_dtype)
        try:
            native.K.qconv8(x4, self._w8[0], self._w8[1], bias, mult, y, g, zp, 0, parallel.thread_count(), relu)
        except MemoryError:
            return None  # a kernel so large that a task's columns pass the compiled limit
        return y

    def _constant_bias(self, b) -> bool:
        """Whether ``b`` is the node's constant bias (QLinearConv's input 8): what is
        derived from it may be kept across runs. A bias fed at run time may hold new
        values in the same array, so nothing derived from it is kept."""
        return is_constant_input(self, b, 8)

    def _bias_max(self, b) -> int:
        """``max |b|`` (0 if empty), kept for the node's constant bias."""
        cached = self._bias_bound
        if cached is not None and cached[0] is b:
            return cached[1]
        bound = int(np.abs(b.astype(np.int64)).max()) if b.size else 0
        if self._constant_bias(b):
            self._bias_bound = (b, bound)
        return bound

    def _with_bias_row(self, w_rows, bias, pairs):
        """``w_rows`` ``[K, pairs * M]`` with the bias (repeated for each of the
        ``pairs`` outputs) as one more row, kept for the last weight and the node's
        constant bias."""
        cached = self._bias_rows
        if cached is not None and cached[0] is w_rows and cached[1] is bias:
            return cached[2]
        row = np.tile(bias.astype(np.float32), pairs).reshape(1, -1)
        weight = np.concatenate([w_rows, row])
        if self._constant_bias(bias):
            self._bias_rows = (w_rows, bias, weight)
        return weight

    def _pack(self, w, wzp):
        wf = w.astype(np.float64)
        if wzp is not None:
            wzp = np.asarray(wzp)
            if wzp.size == 1:
                wf -= float(wzp.reshape(()))
            elif wzp.shape == (w.shape[0],):
                wf -= wzp.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
            else:
                raise ValueError(f"weight zero point shape {wzp.shape} must be scalar or ({w.shape[0]},)")
        # float32 copies too: used when the input's range keeps every sum exact.
        wp64 = ConvWeights(wf, self.group, np.float64)
        wp32 = ConvWeights(wf, self.group, np.float32)
        wmax = float(np.abs(wf).max()) if wf.size else 0.0
        # the largest sum of one output channel's |weights|: times max |x - zp| it
        # bounds every partial sum (several times below K * max |w| for real weights)
        l1 = column_l1(wf.reshape(w.shape[0], math.prod(w.shape[1:])).T)
        return wp32, wp64, l1, wp32.gemm.reshape(w.shape), wmax

    def _accumulate(self, x, xzp, w, wzp):
        """The int32 accumulator of the convolution, as an exact float array."""
        check_rank(x, w)
        nd = x.ndim - 2
        kernel, strides, dil = spatial_attrs(self.attrs, nd, w.shape[2:])
        if self._packed is not None and self._packed[0] is w:
            wp32, wp64, bound, w32, wmax = self._packed[1]
        else:
            wp32, wp64, bound, w32, wmax = self._pack(w, wzp)
        zp = 0
        if xzp is not None:
            xzp = np.asarray(xzp)
            if xzp.size != 1:
                raise ValueError(f"input zero point must be a scalar, got shape {xzp.shape}")
            zp = int(xzp.reshape(()))
        # Every partial sum is bounded by max|x - zp| times an output channel's sum of
        # |w - w_zp| (``bound``); float32 represents all integers below 2**24 exactly,
        # whatever the summation order.
        xmax = input_bound(x, xzp, zp, bound)
        pb, pe, out_sp = conv_pads(x.shape[2:], kernel, strides, dil, self.pads, self.auto_pad)
        taps = math.prod(kernel)
        chunk = int((2**24 - 1) // (taps * wmax * xmax)) if xmax and wmax else x.shape[1]
        if bound * xmax < 2.0**24 or (self.group == 1 and chunk * taps >= 32):
            xf = x.astype(np.float32)
            if zp:
                xf -= np.float32(zp)
            if bound * xmax < 2.0**24:
                return convolve(xf, wp32, strides, dil, pb, pe, out_sp)
            # Too long a K for one exact float32 GEMM: sum exact float32 convolutions
            # over channel blocks, which is about twice as fast as one float64 GEMM.
            acc = None
            for c0 in range(0, x.shape[1], chunk):
                wpc = ConvWeights(w32[:, c0 : c0 + chunk], 1, np.float32)
                part = convolve(xf[:, c0 : c0 + chunk], wpc, strides, dil, pb, pe, out_sp)
                acc = part.astype(np.float64) if acc is None else acc + part
            return acc
        xf = x.astype(np.float64)
        if zp:
            xf -= float(zp)
        return convolve(xf, wp64, strides, dil, pb, pe, out_sp)


def to_int32(acc: np.ndarray) -> np.ndarray:
    """An exact integer-valued float accumulator as int32, wrapping past its range as
    a 32-bit accumulator does (a float64 one through int64; float32 ones are below
    2**24)."""
    return (acc.astype(np.int64) if acc.dtype == np.float64 else acc).astype(np.int32)


def requantize_output(v, x, y_zero_point):
    """QLinearConv's float32 ``v`` (already scaled) rounded in place, shifted by the
    output zero point and saturated to its type (``x``'s without one)."""
    out_dt = y_zero_point.dtype if y_zero_point is not None else x.dtype
    zp = None if y_zero_point is None else np.asarray(y_zero_point).reshape(()).item()
    return requantize(v, zp, out_dt, inplace=True)
