"""com.microsoft QAttention and QEmbedLayerNormalization: what
``onnxruntime.quantization.quantize_dynamic`` writes for a BERT model that
``onnxruntime.transformers`` has already rewritten into Attention and
EmbedLayerNormalization."""

from __future__ import annotations

import numpy as np

from .. import native
from ..registry import op
from .contrib_quant import _center_b, _check_q, _col_param, _dynamic_centred, _int8_product, _scalar, _zp
from .contrib_transformer import Attention, EmbedLayerNormalization, _no_rotary
from .quantize import _center, absmax, centred_bound, column_l1, dynamic_range, int_matmul_f32

__all__ = ["DynamicQuantizeAttention", "QAttention", "QEmbedLayerNormalization"]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)


@op("QAttention", since=1, domain=MS, accepts=_no_rotary)
class QAttention(Attention):
    """Attention whose input and merged QKV weight are 8-bit: the projection is an exact
    integer GEMM scaled by ``input_scale * weight_scale`` (per tensor or per column)."""

    def setup(self):
        super().setup()
        self.w_packed = None
        c = self.node.constants
        ins = self.node.inputs
        has_zp = len(ins) > 7 and ins[7]
        if 1 in c and (not has_zp or 7 in c):
            self.w_packed = _center_b(c[1], c.get(7) if has_zp else None)
            self.w_max = absmax(self.w_packed)
            self.w_l1 = column_l1(self.w_packed)
        # the weight packed for the compiled 8-bit products, where this CPU has them
        self.w8 = None
        if 1 in c and (not has_zp or 7 in c) and c[1].ndim == 2:
            self.w8 = native.pack_int8_weights(c[1], c.get(7) if has_zp else None)
        # a constant weight scale converted once (the same array comes back every run)
        self.w_scale = None
        if 1 in c and 4 in c and c[1].ndim == 2:
            try:
                self.w_scale = (c[4], _col_param(c[4], c[1].shape[1], "weight_scale").astype(_F32))
            except ValueError:
                pass  # a scale that does not fit the weight: run reports it

    def run(
        self,
        x,
        weight,
        bias,
        input_scale,
        weight_scale,
        mask_index=None,
        input_zero_point=None,
        weight_zero_point=None,
        past=None,
    ):
        desc = self.node.describe()
        _check_q(x, f"{desc}: input")
        hq, hk = self.split_sizes(x, weight)
        if self.w8 is not None and (input_zero_point is None or input_zero_point.size == 1):
            a_scale = _scalar(input_scale, "input_scale")
            qkv = _int8_product(self.w8, x, int(_zp(input_zero_point, x.dtype)), None,
                                a_scale * self._weight_scale(weight_scale), None)
            if qkv is not None:
                return self.attend(qkv, hq, hk, bias, mask_index, past, None, _F32)
        W = (
            self.w_packed
            if self.w_packed is not None
            else _center_b(weight, weight_zero_point)
        )
        A = _center(x, np.asarray(_zp(input_zero_point, x.dtype)), False, _F32)
        return self._project(A, centred_bound(x.dtype, input_zero_point), _scalar(input_scale, "input_scale"),
                             W, hq, hk, bias, weight_scale, mask_index, past)

    def _project(self, A, a_bound, a_scale, W, hq, hk, bias, weight_scale, mask_index, past):
        """Attention from the centred 8-bit input ``A`` (exact float32, ``|A| <=
        a_bound``) and its scale: the exact integer product, scaled, then attended."""
        wmax, wl1 = (self.w_max, self.w_l1) if self.w_packed is not None else (None, None)
        qkv = int_matmul_f32(A, W, a_bound, wmax, wl1)
        qkv *= a_scale * self._weight_scale(weight_scale, W.shape[1])
        return self.attend(qkv, hq, hk, bias, mask_index, past, None, _F32)

    def _weight_scale(self, weight_scale, columns=None):
        """The weight scale as float32, one value or one a column."""
        cached = self.w_scale
        if cached is not None and cached[0] is weight_scale:
            return cached[1]
        return _col_param(weight_scale, self.w8.n if columns is None else columns, "weight_scale").astype(_F32)


@op("DynamicQuantizeAttention", since=1, domain="ai.onnxrt", accepts=_no_rotary)
class DynamicQuantizeAttention(QAttention):
    """onnxrt's own op for ``QAttention(DynamicQuantizeLinear(x))``, which
    ``onnxruntime.quantization.quantize_dynamic`` writes for every attention layer of a
    BERT model: the float32 input is quantized to uint8 from its own range inside the
    op, as DynamicQuantizeMatMul does for a MatMul. The inputs are QAttention's, with
    the input scale and zero point (inputs 3 and 6) empty; the results are bitwise
    those of the two ops, without the uint8 tensor between them and its second pass
    (made only by the ``dynamic_quant_attention_fusion`` transform)."""

    def run(self, x, weight, bias, input_scale=None, weight_scale=None, mask_index=None, input_zero_point=None,
            weight_zero_point=None, past=None):
        desc = self.node.describe()
        if x.dtype != _F32:
            raise ValueError(f"{desc}: input must be float32, got {x.dtype}")
        if weight_scale is None:
            raise ValueError(f"{desc}: weight_scale is required")
        hq, hk = self.split_sizes(x, weight)
        if self.w8 is not None:
            # quantized inside the compiled product, bit for bit as below
            _, sa, za, _ = dynamic_range(x)
            qkv = _int8_product(self.w8, x, int(za), sa, sa * self._weight_scale(weight_scale), None)
            if qkv is not None:
                return self.attend(qkv, hq, hk, bias, mask_index, past, None, _F32)
        W = self.w_packed if self.w_packed is not None else _center_b(weight, weight_zero_point)
        # q - zero point of DynamicQuantizeLinear's uint8 result, exactly
        A, scale, zp = _dynamic_centred(x)
        return self._project(A, float(max(zp, 255 - zp)), scale, W, hq, hk, bias, weight_scale, mask_index, past)


@op("QEmbedLayerNormalization", since=1, domain=MS)
class QEmbedLayerNormalization(EmbedLayerNormalization):
    """EmbedLayerNormalization whose tables, gamma and beta are 8-bit quantized: they
    are dequantized (once, when constant) and the float op runs."""

    # (quantized input, scale input, zero point input) for each table
    _TABLES = ((2, 8, 13), (3, 9, 14), (4, 10, 15), (5, 11, 16), (6, 12, 17))

    def setup(self):
        super().setup()
        c = self.node.constants
        self.tables = {}
        for q, s, z in self._TABLES:
            if q in c and s in c and z in c:
                self.tables[q] = _dequant_any(c[q], c[s], c[z])

    def run(
        self,
        input_ids,
        segment_ids,
        word_q,
        pos_q,
        seg_q,
        gamma_q,
        beta_q,
        mask,
        *params,
    ):
        ins = (None, None, word_q, pos_q, seg_q, gamma_q, beta_q)
        floats = {}
        for q, s, z in self._TABLES:
            if q in self.tables:
                floats[q] = self.tables[q]
            elif ins[q] is not None:
                floats[q] = _dequant_any(ins[q], params[s - 8], params[z - 8])
            else:
                floats[q] = None
        return super().run(
            input_ids,
            segment_ids,
            floats[2],
            floats[3],
            floats[4],
            floats[5],
            floats[6],
            mask,
        )


def _dequant_any(q, scale, zero_point) -> np.ndarray:
    v = q.astype(_F32)
    v -= np.float32(_zp(zero_point, q.dtype))
    v *= _scalar(scale, "scale")
    return v
