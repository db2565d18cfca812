"""com.microsoft DynamicQuantizeLSTM: an LSTM with 8-bit weights whose activations
are quantized on the fly, as ``onnxruntime.quantization.quantize_dynamic`` writes it."""

from __future__ import annotations

import numpy as np
from onnxrt.kernel import Kernel, NodeInfo

from ..parallel import thread_count
from ..registry import op
from .activation import _sigmoid
from .quantize import _int_matmul, dynamic_quantize_linear
from .rnn import LSTM

__all__ = ["DynamicQuantizeLSTM"]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)


def _dequantize_lstm_weight(w, scale, zero_point, what, desc) -> np.ndarray:
    """``[D, in, 4H]`` 8-bit weights (per direction or per column) to the float
    ``[D, 4H, in]`` layout of ONNX LSTM."""
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
    v = w.astype(_F32) - z.astype(_F32).reshape(shapes[z.shape])
    v *= s.reshape(shapes[s.shape])
    return np.ascontiguousarray(v.transpose(0, 2, 1))


@op("DynamicQuantizeLSTM", since=1, domain=MS)
class DynamicQuantizeLSTM(Kernel):
    """LSTM whose W and R are 8-bit (``[D, input, 4H]`` and ``[D, hidden, 4H]``, note
    the layout) with per-direction or per-column scales and zero points.

    As onnxruntime does, X (all steps at once) and then the hidden state (before each
    step, in groups of ``ceil(batch / threads)`` rows) are quantized dynamically to
    uint8, and every product is an exact integer GEMM scaled back by
    ``activation_scale * weight_scale``; so at the same thread count the results are
    onnxruntime's to float32 rounding. That path covers the
    default activations without clip, peepholes, ``input_forget`` or ragged
    ``sequence_lens``; for the rest the weights are dequantized (once, when constant)
    and the float ONNX LSTM runs, which differs from onnxruntime by its activation
    rounding only.
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
        if all(i in c for i in (1, 2, 8, 9, 10, 11)):
            self.q_weights = self._weights(c[1], c[2], c[8], c[9], c[10], c[11])

    @staticmethod
    def _weights(w, r, w_scale, w_zp, r_scale, r_zp):
        """Per direction: centred float32 W [in, 4H] and R [H, 4H], their |max| and
        per-column (or scalar) scales."""
        out = []
        for d in range(w.shape[0]):
            per = []
            for q, sc, zp in ((w, w_scale, w_zp), (r, r_scale, r_zp)):
                z = np.asarray(zp).astype(_F32).reshape(q.shape[0], -1)[d]
                cq = q[d].astype(_F32) - (z if z.size > 1 else z.reshape(()))
                scl = np.asarray(sc, dtype=_F32).reshape(q.shape[0], -1)[d]
                per += [
                    cq,
                    float(np.abs(cq).max(initial=0)),
                    scl if scl.size > 1 else scl.reshape(()),
                ]
            out.append(per)
        return out

    def _quant_rows(self, v):
        """Dynamic uint8 quantization: centred float32 values and their scale."""
        q, s, z = dynamic_quantize_linear(self, v)
        c = q.astype(_F32)
        c -= np.float32(z)
        return c, s

    def _emulate(self, x, weights, b, initial_h, initial_c):
        seq, batch, _ = x.shape
        dirs = len(weights)
        h4 = weights[0][3].shape[1]
        hid = h4 // 4
        y = np.zeros((seq, dirs, batch, hid), _F32)
        yh = np.empty((dirs, batch, hid), _F32)
        yc = np.empty((dirs, batch, hid), _F32)
        xq, xs = self._quant_rows(x.reshape(seq * batch, -1))
        # onnxruntime shares the batch rows out among its threads, and each group's
        # hidden state is quantized with its own range: the same grouping gives the
        # same results at the same thread count
        threads = max(1, thread_count())
        fr = -(-batch // threads)
        for d, (wc, wmax, ws, rc, rmax, rs) in enumerate(weights):
            gx = _int_matmul(xq, wc, 255.0, wmax).astype(_F32) * (xs * ws)
            if b is not None:
                gx += b[d, :h4] + b[d, h4:]
            gx = gx.reshape(seq, batch, h4)
            h = (
                np.zeros((batch, hid), _F32)
                if initial_h is None
                else initial_h[d].astype(_F32)
            )
            cell = (
                np.zeros((batch, hid), _F32)
                if initial_c is None
                else initial_c[d].astype(_F32)
            )
            reverse = self.direction == "reverse" or (
                self.direction == "bidirectional" and d == 1
            )
            for t in range(seq - 1, -1, -1) if reverse else range(seq):
                g = gx[t].copy()
                for r0 in range(0, batch, fr):
                    hq, hs = self._quant_rows(h[r0 : r0 + fr])
                    g[r0 : r0 + fr] += _int_matmul(hq, rc, 255.0, rmax).astype(_F32) * (
                        hs * rs
                    )
                i, o, f = (
                    _sigmoid(np, g[:, k * hid : (k + 1) * hid]) for k in range(3)
                )
                cell = f * cell + i * np.tanh(g[:, 3 * hid :])
                h = o * np.tanh(cell)
                y[t, d] = h
            yh[d], yc[d] = h, cell
        return y, yh, yc

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
        ragged = sequence_lens is not None and np.any(
            np.asarray(sequence_lens) != x.shape[0]
        )
        if (
            self.emulated
            and p is None
            and not ragged
            and x.ndim == 3
            and x.dtype == np.float32
        ):
            weights = self.q_weights
            if weights is None:
                weights = self._weights(
                    w, r, w_scale, w_zero_point, r_scale, r_zero_point
                )
            if b is not None:
                b = b.astype(_F32)
            outs = self._emulate(x, weights, b, initial_h, initial_c)
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
