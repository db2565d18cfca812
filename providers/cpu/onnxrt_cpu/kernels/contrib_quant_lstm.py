"""com.microsoft DynamicQuantizeLSTM: an LSTM with 8-bit weights whose activations
are quantized on the fly, as ``onnxruntime.quantization.quantize_dynamic`` writes it."""

from __future__ import annotations

import numpy as np
from onnxrt.plugin.kernel import Kernel, NodeInfo

from .. import native
from ..parallel import thread_count
from ..registry import op
from .quantize import (
    _F32_MAX,
    _F32_TINY,
    _int_matmul,
    _single_f32,
    column_l1,
    dynamic_quantize_linear,
    dynamic_range,
    int_matmul_f32,
)
from .rnn import LSTM, directions_together, ragged_lengths, ragged_steps

__all__ = ["DynamicQuantizeLSTM"]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)


def _check_lstm_weight(w, scale, zero_point, what, desc) -> tuple[np.ndarray, np.ndarray, dict]:
    """``w`` ``[D, size, 4H]`` with its scale and zero point (per direction or per
    column, of ``w``'s type) checked: ``(scale as float32, zero point, shape map)``,
    the map giving each allowed parameter shape its ``[D, 1, 4H or 1]`` form."""
    if w.ndim != 3:
        raise ValueError(
            f"{desc}: {what} must be [num_directions, size, 4*hidden], got shape {w.shape}"
        )
    d, _, g = w.shape
    s = np.asarray(scale, dtype=_F32)
    z = np.asarray(zero_point)
    if z.dtype != w.dtype:
        raise ValueError(
            f"{desc}: {what}_zero_point has type {z.dtype}, {what} has type {w.dtype}"
        )
    shapes = {(d,): (d, 1, 1), (d, g): (d, 1, g), (): (1, 1, 1), (1,): (1, 1, 1)}
    if s.shape not in shapes or z.shape not in shapes:
        raise ValueError(
            f"{desc}: {what}_scale {s.shape} / zero point {z.shape} must be [{d}] or [{d}, {g}]"
        )
    return s, z, shapes


def _centred_lstm_weight(w, scale, zero_point, what, desc) -> tuple[np.ndarray, np.ndarray]:
    """``w - zero_point`` as exact float32 ``[D, size, 4H]``, and the scale shaped to
    multiply it (``[D or 1, 1, 4H or 1]``), both checked by :func:`_check_lstm_weight`."""
    s, z, shapes = _check_lstm_weight(w, scale, zero_point, what, desc)
    return w.astype(_F32) - z.astype(_F32).reshape(shapes[z.shape]), s.reshape(shapes[s.shape])


def _dequantize_lstm_weight(w, scale, zero_point, what, desc) -> np.ndarray:
    """``[D, in, 4H]`` 8-bit weights (per direction or per column) to the float
    ``[D, 4H, in]`` layout of ONNX LSTM."""
    v, s = _centred_lstm_weight(w, scale, zero_point, what, desc)
    v *= s
    return np.ascontiguousarray(v.transpose(0, 2, 1))


def _gate_order(h4: int) -> np.ndarray:
    """The column order of the emulation's gates, o, f, i, c, from ONNX's i, o, f, c:
    the sigmoid gates stay the first three blocks, and f and i side by side multiply
    the cell and c side by side (one product for ``f * C + i * c``)."""
    h = h4 // 4
    return np.concatenate([np.arange(h, 3 * h), np.arange(h), np.arange(3 * h, h4)])


class _Prepared:
    """Centred float32 weights of a DynamicQuantizeLSTM for its emulation: ``w``
    ``[D, input, 4H]`` as one ``[input, D * 4H]`` GEMM operand, ``r_neg`` ``[D, H,
    4H]`` (the sigmoid gates' columns negated), their largest magnitudes and column
    sums, the per-column scales ``[D, 4H]`` (scalar ones repeated) and W's with the
    sigmoid gates' columns negated; every gate column in the order of
    :func:`_gate_order` (``order``, which the bias takes too)."""

    def __init__(self, w, w_scale, r, r_scale):
        dirs, size, h4 = w.shape
        self.order = order = _gate_order(h4)
        # take, not w[..., order]: the latter lays the columns out as the outer axis
        w, w_scale, r, r_scale = (np.take(v, order, axis=-1) for v in (w, w_scale, r, r_scale))
        self.w_cat = np.ascontiguousarray(w.transpose(1, 0, 2).reshape(size, dirs * h4))
        self.w_max = float(np.abs(w).max(initial=0))
        # the columns' absolute sums bound the products more tightly than the largest
        # magnitude times the length: one exact float32 GEMM for longer rows
        self.w_l1 = column_l1(self.w_cat)
        # the sigmoid gates' columns negated (exact), as 1 / (1 + exp(-x)) reads them:
        # in W's scales and R itself, so that the products and the bias come out
        # negated there
        self.sign = np.ones(h4, _F32)
        self.sign[: 3 * (h4 // 4)] = -1
        self.w_scale_signed = (w_scale * self.sign).reshape(-1)
        self.r_max = [float(np.abs(r[d]).max(initial=0)) for d in range(dirs)]
        self.r_l1 = [column_l1(r[d]) for d in range(dirs)]
        self.r_neg = r * self.sign
        self.r_scale = np.ascontiguousarray(r_scale)
        #: one scale per direction: the step scales rows, not columns
        self.r_scale_per_direction = bool((r_scale == r_scale[:, :1]).all())
        #: whether one float32 product per step is exact for every direction (a
        #: centred uint8 state is at most 255 in magnitude)
        self.exact = all(_single_f32(255.0, m, l1, r.shape[1]) for m, l1 in zip(self.r_max, self.r_l1))

    def bias(self, b: np.ndarray) -> np.ndarray:
        """ONNX's ``B`` ``[D, 8H]`` (W's and R's biases) as the emulation adds it:
        the two summed in float32, in the gate order, the sigmoid gates' negated,
        shaped ``[D, 1, 4H]``."""
        dirs, h4 = self.r_neg.shape[0], self.r_neg.shape[2]
        b = b.astype(_F32).reshape(dirs, 2, h4)
        return ((b[:, 0] + b[:, 1])[:, self.order] * self.sign).reshape(dirs, 1, h4)

    def recurrent(self, part: slice):
        """``(r_neg, r_scale, per-direction scales, r_max)`` of the directions ``part``."""
        return self.r_neg[part], self.r_scale[part], self.r_scale_per_direction, self.r_max[part]


@op("DynamicQuantizeLSTM", since=1, domain=MS)
class DynamicQuantizeLSTM(Kernel):
    """LSTM whose W and R are 8-bit (``[D, input, 4H]`` and ``[D, hidden, 4H]``, note
    the layout) with per-direction or per-column scales and zero points.

    As onnxruntime does, X (all steps at once) and then the hidden state (before each
    step, in groups of ``ceil(batch / threads)`` rows where the batch has more than 4
    rows or 2 or more of at most 256 hidden values, else as a whole) are quantized
    dynamically to uint8, and every product is an exact integer GEMM scaled back by
    ``activation_scale * weight_scale``; so at the same thread count the results are
    onnxruntime's to float32 rounding (but where a one-ulp difference in a sigmoid or
    tanh moves a hidden value across a rounding boundary of its quantization, by that
    step's effect). That path covers the
    default activations without clip, peepholes or ``input_forget``, ragged
    ``sequence_lens`` included (as in onnxruntime, a row's state past its length is
    zero, so that it stays out of its group's range); for the rest the weights are
    dequantized (once, when constant) and the float ONNX LSTM runs, which differs from
    onnxruntime by the dynamic quantization of X and of the hidden state.
    """

    def setup(self):
        node = self.node
        c = node.constants
        desc = node.describe()
        consts = {i: c[i] for i in (3, 4, 5, 6, 7) if i in c}
        if all(i in c for i in (1, 8, 9)):
            consts[1] = _dequantize_lstm_weight(c[1], c[8], c[9], "W", desc)
        if all(i in c for i in (2, 10, 11)):
            consts[2] = _dequantize_lstm_weight(c[2], c[10], c[11], "R", desc)
        inner = NodeInfo(
            name=node.name,
            op_type="LSTM",
            domain="",
            opset=14,
            attrs={k: v for k, v in node.attrs.items() if k != "layout"},
            inputs=list(node.inputs[:8]),
            outputs=list(node.outputs),
            constants=consts,
        )
        self.lstm = LSTM(inner)
        a = node.attrs
        acts = [x.lower() for x in a.get("activations", [])]
        self.emulated = (
            (not acts or acts == ["sigmoid", "tanh", "tanh"] * (len(acts) // 3))
            and a.get("clip") is None
            and not a.get("input_forget", 0)
        )
        self.direction = a.get("direction", "forward")
        self.q_weights = None
        self.w8 = None
        if all(i in c for i in (1, 2, 8, 9, 10, 11)):
            self.q_weights = self._weights(c[1], c[2], c[8], c[9], c[10], c[11], desc)
            # W packed for the compiled 8-bit products, in the emulation's column order
            self.w8 = self._pack_w(c[1], c[9], self.q_weights.order)
        # a constant B in the emulation's form, once (the same array comes back every run)
        self.q_bias = None
        if self.q_weights is not None and 3 in c and c[3].shape == (c[1].shape[0], 2 * c[1].shape[2]):
            self.q_bias = (c[3], self.q_weights.bias(c[3]))

    @staticmethod
    def _weights(w, r, w_scale, w_zp, r_scale, r_zp, desc):
        """The centred float32 weights and scales of :meth:`_emulate`, every
        direction's together (:class:`_Prepared`)."""

        def centred(q, sc, zp, what):
            c, s = _centred_lstm_weight(q, sc, zp, what, desc)
            return c, np.broadcast_to(s[:, 0], (q.shape[0], q.shape[2]))

        if w.shape[0] != r.shape[0] or w.shape[2] != r.shape[2] or r.shape[2] != 4 * r.shape[1]:
            raise ValueError(f"{desc}: W {w.shape} and R {r.shape} must be [D, input, 4H] and [D, H, 4H]")
        return _Prepared(*centred(w, w_scale, w_zp, "W"), *centred(r, r_scale, r_zp, "R"))

    @staticmethod
    def _pack_w(w, zero_point, order):
        """W ``[D, input, 4H]`` as the compiled 8-bit products' operand ``[input, D *
        4H]`` (the columns of ``w_cat``), with its zero points (one a direction or one a
        column) a column; None where the CPU or the arrays do not allow it."""
        z = np.asarray(zero_point)
        if w.ndim != 3 or z.dtype != w.dtype or z.size not in (w.shape[0], w.shape[0] * w.shape[2]):
            return None
        dirs, size, h4 = w.shape
        zc = np.broadcast_to(z.reshape(dirs, -1), (dirs, h4))
        raw = np.take(w, order, axis=-1).transpose(1, 0, 2).reshape(size, dirs * h4)
        return native.pack_int8_weights(np.ascontiguousarray(raw), np.take(zc, order, axis=-1).reshape(-1))

    def _x_products(self, v, prep):
        """X's dynamic quantization and its exact product with every direction's W:
        ``(products [rows, D * 4H] float32, X's scale)``. By the compiled 8-bit kernel
        where W is the session's (quantized inside it, bit for bit as below), else
        :meth:`_quant_rows` and one exact float32 GEMM."""
        if self.w8 is not None and prep is self.q_weights:
            _, scale, zp, _ = dynamic_range(v)
            if 0.0 < scale < np.inf:
                products = native.int8_matmul(v, self.w8, int(zp), a_scale=scale)
                if products is not None:  # (None: a NaN in X)
                    return products, np.array(scale, dtype=_F32)
        xq, xs = self._quant_rows(v)
        return int_matmul_f32(xq, prep.w_cat, 255.0, prep.w_max, prep.w_l1), xs

    def _quant_rows(self, v):
        """Dynamic uint8 quantization: centred float32 values and their scale."""
        xf, scale, _, saturates = dynamic_range(v)
        if not saturates:
            # within the range no value clips: the centred values are rint(x / scale)
            # themselves, without the round trip through uint8 and the zero point
            c = np.divide(xf, scale)
            return np.rint(c, out=c), np.array(scale, dtype=_F32)
        q, s, z = dynamic_quantize_linear(self, v)
        c = q.astype(_F32)
        c -= np.float32(z)
        return c, s

    def _emulate(self, x, prep, b, initial_h, initial_c, sequence_lens=None):
        seq, batch, size = x.shape
        dirs, hid, h4 = prep.r_neg.shape
        desc = self.node.describe()
        if size != prep.w_cat.shape[0]:
            raise ValueError(f"{desc}: X has input size {size}, W expects {prep.w_cat.shape[0]}")
        if b is not None and b.shape != (dirs, 2 * h4):
            raise ValueError(f"{desc}: B must be [{dirs}, {2 * h4}], got {b.shape}")
        for name, v in (("initial_h", initial_h), ("initial_c", initial_c)):
            if v is not None and np.shape(v) != (dirs, batch, hid):
                raise ValueError(f"{desc}: {name} must be {(dirs, batch, hid)}, got {np.shape(v)}")
        lens = ragged_lengths(sequence_lens, batch, seq, desc)
        # onnxruntime shares the batch rows out among its threads (where the batch has
        # more than 4 rows, or 2 or more of at most 256 hidden values; else the whole
        # batch is one group), and each group's hidden state is quantized with its own
        # range: the same grouping gives the same results at the same thread count.
        # The state carries zero rows up to whole groups: zeros are inside every range
        # already (it always holds 0), and a zero row stays zero through a step (zero
        # gates, cell and output)
        threads_all = threads = max(1, thread_count())
        if not (batch > 4 or (batch >= 2 and hid <= 256)):
            threads = 1
        fr = -(-batch // threads)
        groups = -(-batch // fr)
        rows = groups * fr
        # X quantized once for all steps, its product with every direction's W one GEMM
        gxa, xs = self._x_products(x.reshape(seq * batch, -1), prep)
        # its scales, the sigmoid gates' negated (exact), as 1 / (1 + exp(-x)) reads
        # them (R's columns are negated alike), and the bias
        gx_scale = xs * prep.w_scale_signed
        bias = None
        if b is not None:
            cached = self.q_bias
            bias = (cached[1] if cached is not None and cached[0] is b else prep.bias(b)).reshape(-1)
        masks = rev = None
        if lens is not None:
            # ragged: the steps past a row's length are masked, and the reverse
            # direction runs over each row's valid prefix reversed (the map is its own
            # inverse)
            valid, rev = ragged_steps(lens, seq)
            masks = np.zeros((seq, 1, rows, 1), _F32)
            masks[:, 0, :batch, 0] = valid
        # ys[0]: the initial state, set by the loop below; the steps write the rest
        ys = np.empty((seq + 1, dirs, rows, hid), _F32)
        cell = np.zeros((dirs, rows, hid), _F32)
        # each row's cell at its last valid step (ragged), else the last cell
        last_cell = cell if masks is None else np.zeros_like(cell)
        scales = np.ones((seq, dirs, groups), _F32)
        # each step's range [bottom, top] per group, for the check after the loop
        ranges = np.zeros((2, seq, dirs, groups), _F32)
        # a zero initial state (as exporters write it) has scale 1 and zero point 0
        zero_start = initial_h is None or not np.any(initial_h)
        # the unchecked pass with one exact product a step runs compiled where the
        # kernels are loaded: every direction and group at once, each reading its
        # input gates from X's product as it goes; the same values as the numpy loop
        # (_steps), which takes the checked pass and inexact products
        kernels = native.K if prep.exact and seq > 0 else None
        gx = None
        for careful in (False, True):
            ys[0] = 0
            cell[...] = 0
            last_cell[...] = 0
            if initial_h is not None:
                ys[0, :, :batch] = initial_h
            if initial_c is not None:
                cell[:, :batch] = initial_c
            if kernels is not None and not careful:
                backwards = sum(1 << d for d in range(dirs) if self._reversed(d))
                kernels.qlstm_steps(prep.r_neg, prep.r_scale, prep.r_scale_per_direction,
                                    np.ascontiguousarray(gxa), gx_scale, bias, lens, backwards, ys, cell, scales,
                                    ranges, masks, None if masks is None else last_cell,
                                    (seq, batch, dirs, rows, hid, fr), zero_start, threads_all)
            else:
                if gx is None:
                    gx = self._step_inputs(gxa, gx_scale, bias, (seq, batch, dirs, rows), rev)
                # both directions step together while their recurrent weights (as
                # float32) are small enough, as the float LSTM's do
                together = directions_together(prep.r_neg.nbytes)
                parts = [slice(None)] if together else [slice(d, d + 1) for d in range(dirs)]
                with np.errstate(all="ignore"):
                    for part in parts:
                        self._steps(prep.recurrent(part), gx[:, part], ys[:, part], cell[part], scales[:, part],
                                    ranges[:, :, part], fr, prep.exact, careful, zero_start, masks,
                                    last_cell[part])
            if careful or self._unchecked_steps_hold(scales, ranges):
                break
        if lens is None:
            y_h = ys[seq, :, :batch].copy()
        else:
            # each row's output at its last valid step; zero for an empty row
            y_h = ys[lens, :, np.arange(batch)].transpose(1, 0, 2).copy()
            y_h[:, lens == 0] = 0
        y = ys[1:, :, :batch]
        for d in range(dirs):
            if self._reversed(d):
                y[:, d] = y[::-1, d].copy() if rev is None else y[:, d][rev]
        return np.ascontiguousarray(y), y_h, np.ascontiguousarray(last_cell[:, :batch])

    def _step_inputs(self, gxa, gx_scale, bias, sizes, rev):
        """The numpy loop's input gates ``[seq, D, rows, 4H]`` from X's product
        ``gxa`` ``[seq * batch, D * 4H]`` (scaled by ``gx_scale`` and the ``bias`` added
        in place; ``sizes`` ``(seq, batch, D, rows)``): direction d's step t at ``[t,
        d]``, the reverse direction's inputs in reverse time order (where ``rev``,
        ragged, each row's valid prefix reversed), zero in the padding rows past the
        batch."""
        seq, batch, dirs, rows = sizes
        gxa *= gx_scale
        if bias is not None:
            gxa += bias
        h4 = gxa.shape[1] // dirs
        gx = np.empty((seq, dirs, rows, h4), _F32)
        if rows > batch:
            gx[:, :, batch:] = 0  # the padding rows: a zero state stays zero
        gxa = gxa.reshape(seq, batch, dirs, h4)
        for d in range(dirs):
            if not self._reversed(d):
                gx[:, d, :batch] = gxa[:, :, d]
            else:
                gx[:, d, :batch] = gxa[::-1, :, d] if rev is None else gxa[:, :, d][rev]
        return gx

    @staticmethod
    def _unchecked_steps_hold(scales, ranges) -> bool:
        """Whether the unchecked steps quantized as :func:`dynamic_quantize_linear`
        does: every scale normal and finite (not NaN), and no group saturated. Centred,
        a group's values run from ``rint(bottom / scale)``, which is minus its zero
        point exactly (rint is odd), to ``rint(top / scale)``, which can pass ``255 -
        zero point`` only by the two roundings: rarely, and then the steps run again,
        group by group."""
        if not (float(scales.min()) >= _F32_TINY and float(scales.max()) <= _F32_MAX / 255):
            return False
        # normal finite scales, each at least its group's range / 255: the quotients
        # are finite (no error state to set)
        q = np.rint(ranges / scales)
        return not bool(((q[1] - q[0]) > 255).any())

    def _reversed(self, d: int) -> bool:
        return self.direction == "reverse" or (self.direction == "bidirectional" and d == 1)

    def _steps(self, recurrent, gx, ys, cell, scales, ranges, fr, exact, careful, zero_start, masks=None,
               last_cell=None):
        """The numpy time loop of :meth:`_emulate` (where the compiled kernels are
        loaded, the unchecked pass with one exact product a step runs compiled
        instead, ``native.K.qlstm_steps``: the same values) for the directions it is
        given (both at once, or one), writing the
        hidden states to ``ys[1:]``, the cell to ``cell``, and each step's scales and
        ranges to ``scales`` and ``ranges`` (views of the directions ``recurrent``,
        :meth:`_Prepared.recurrent`, belongs to). Each step's state ``h`` is quantized
        per direction and group of ``fr`` rows as :func:`dynamic_quantize_linear`
        does it, in float32 operations (each correctly rounded, as
        :func:`dynamic_range`'s Python arithmetic is), centred: ``rint(h / scale)``.

        Unless ``careful``, nothing is checked in the loop (the caller checks every
        step after it, :meth:`_unchecked_steps_hold`); else every group is quantized
        by :func:`dynamic_quantize_linear` itself. ``masks`` ``[seq, 1, rows, 1]``
        (ragged ``sequence_lens``) zero each row's state past its length, as
        onnxruntime does, and ``last_cell`` keeps each row's cell at its last valid
        step. Every array is allocated here once,
        with its views, so that a step is eighteen numpy calls on small arrays: on
        arrays of a few thousand values a call's own cost is most of its time, so the
        loop takes each step's views from one ``zip`` and passes ``out`` by position."""
        seq, dirs, rows, h4 = gx.shape
        hid = h4 // 4
        groups = rows // fr
        rc, r_scale, per_row, r_max = recurrent
        bottoms, tops = ranges
        q = np.zeros((dirs, groups, fr * hid), _F32)
        q3 = q.reshape(dirs, rows, hid)
        acc = np.empty((dirs, rows, h4), _F32)
        acc4 = acc.reshape(dirs, groups, fr, h4)
        if per_row:
            # one scale per direction: a group's rows all take one multiplier
            rs = r_scale[:, :1].copy()
            mult = np.empty((dirs, groups), _F32)
            mult4 = mult[:, :, None, None]
            step_scales = scales
        else:
            rs = r_scale.reshape(dirs, 1, 1, h4)
            mult4 = mult = np.empty((dirs, groups, 1, h4), _F32)
            step_scales = scales[:, :, :, None, None]
        # the sigmoid gates (o, f, i) in a buffer of their own: on a contiguous array
        # exp and the rest take half the time they take on the gate columns of the
        # product
        sig = np.empty((dirs, rows, 3 * hid), _F32)
        o_g, f_i = sig[..., :hid], sig[..., hid:]
        # the cell beside tanh(c): with f and i beside each other, one product gives
        # f * C and i * c, and one sum of its halves the new cell
        cc = np.empty((dirs, rows, 2 * hid), _F32)
        c_now, c_in = cc[..., :hid], cc[..., hid:]
        c_now[...] = cell
        prod = np.empty_like(cc)
        fc, ic = prod[..., :hid], prod[..., hid:]
        c_g = acc[..., 3 * hid :]
        neg = acc[..., : 3 * hid]
        tmp = np.empty_like(cell)
        # constants of the operands' shapes: with a numpy scalar operand a call costs
        # 0.15-0.2 us more (its conversion to an array)
        f255 = np.full(scales.shape[1:], 255, _F32)
        ones = np.ones_like(sig)
        top_of, bottom_of = np.maximum.reduce, np.minimum.reduce
        sub, div, rint, mul, add, exp, tanh = np.subtract, np.divide, np.rint, np.multiply, np.add, np.exp, np.tanh
        matmul, reciprocal = np.matmul, np.reciprocal
        per_step = zip(range(seq), scales, step_scales, scales[:, :, :, None],
                       ys.reshape(seq + 1, dirs, groups, fr * hid), tops, bottoms, gx, ys[1:])
        for t, scale, step_scale, divisor, hv, top, bottom, g, y in per_step:
            if t == 0 and zero_start:
                pass  # a zero state: scale 1 and zero q, as set
            elif careful:
                hq, scale[...] = self._quant_groups(ys[t], groups)
                q3[...] = hq
            else:
                top_of(hv, 2, None, top, False, 0)
                bottom_of(hv, 2, None, bottom, False, 0)
                sub(top, bottom, scale)
                div(scale, f255, scale)
                div(hv, divisor, q)
                rint(q, q)
            if exact:
                matmul(q3, rc, acc)
            else:
                for d in range(dirs):
                    acc[d] = _int_matmul(q3[d], rc[d], 255.0, r_max[d])  # in exact chunks
            mul(step_scale, rs, mult)
            mul(acc4, mult4, acc4)
            add(acc, g, acc)
            # gates o, f, i: 1 / (1 + exp(-x)), whose rounding is closer to
            # onnxruntime's logistic than 0.5 * tanh(x / 2) + 0.5 is: one rounding
            # apart moves a hidden value across a quantization step now and then,
            # which the next steps carry on (5e-4 on a tagger's outputs)
            exp(neg, sig)
            add(sig, ones, sig)
            reciprocal(sig, sig)  # 1 / x, the same division
            tanh(c_g, c_in)
            mul(f_i, cc, prod)
            add(fc, ic, c_now)
            tanh(c_now, tmp)
            mul(o_g, tmp, y)
            if masks is not None:
                m = masks[t]
                mul(y, m, y)
                np.copyto(last_cell, c_now, where=m > 0)
        cell[...] = c_now

    def _quant_groups(self, h, groups):
        """``h`` ``[D, rows, H]`` quantized by :func:`dynamic_quantize_linear` per
        direction and group of rows: centred float32 values and scales ``[D, groups]``."""
        dirs, rows, _ = h.shape
        fr = rows // groups
        q = np.empty_like(h)
        scale = np.empty((dirs, groups), _F32)
        for d in range(dirs):
            for g in range(groups):
                q[d, g * fr : (g + 1) * fr], scale[d, g] = self._quant_rows(h[d, g * fr : (g + 1) * fr])
        return q, scale

    def run(
        self,
        x,
        w,
        r,
        b=None,
        sequence_lens=None,
        initial_h=None,
        initial_c=None,
        p=None,
        w_scale=None,
        w_zero_point=None,
        r_scale=None,
        r_zero_point=None,
    ):
        desc = self.node.describe()
        if (
            w_scale is None
            or w_zero_point is None
            or r_scale is None
            or r_zero_point is None
        ):
            raise ValueError(
                f"{desc}: W_scale, W_zero_point, R_scale and R_zero_point are required"
            )
        if (
            self.emulated
            and p is None
            and x.ndim == 3
            and x.dtype == np.float32
        ):
            prep = self.q_weights
            if prep is None:
                prep = self._weights(
                    w, r, w_scale, w_zero_point, r_scale, r_zero_point, desc
                )
            outs = self._emulate(x, prep, b, initial_h, initial_c, sequence_lens)
            return outs[: len(self.node.outputs)]
        packed = getattr(self.lstm, "_packed", None)
        if (
            isinstance(packed, dict)
            and packed.get("dt") == np.float32
            and x.dtype == np.float32
        ):
            wf, rf = w, r  # the inner kernel uses its prepacked float weights
        else:
            wf = _dequantize_lstm_weight(w, w_scale, w_zero_point, "W", desc)
            rf = _dequantize_lstm_weight(r, r_scale, r_zero_point, "R", desc)
        return self.lstm.run(x, wf, rf, b, sequence_lens, initial_h, initial_c, p)
