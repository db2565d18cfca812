"""Attention family: Attention, RotaryEmbedding, LinearAttention, CausalConvWithState
and the preview FlexAttention.

Scores are computed with batched matmuls in float32 for float32 and float16 inputs
(float64 for double) and rounded to the output type once; bfloat16 Attention rounds
after each step as the operator's definition does, so it agrees bit for bit. Grouped-query
attention never materialises repeated K/V heads: the query heads that share a K/V
head are stacked along the query-sequence axis so each K/V head does one larger
matmul. The softmax subtracts the row maximum, and a query row with no attendable
key (its additive bias is all ``-inf``) yields zeros rather than NaN.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto
from onnxrt.plugin.kernel import Kernel

from ..parallel import matmul_nd
from ..registry import op
from ..rows import row_max, row_sum, unshifted_softmax

__all__ = ["Attention", "RotaryEmbedding", "LinearAttention", "CausalConvWithState", "FlexAttention"]


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


_PRECISION = {
    int(TensorProto.FLOAT): np.dtype(np.float32),
    int(TensorProto.FLOAT16): np.dtype(np.float32),  # computed wider, rounded at the end
    int(TensorProto.BFLOAT16): np.dtype(np.float32),
    int(TensorProto.DOUBLE): np.dtype(np.float64),
}


def _softmax_last_axis(s: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis, in a new array or in ``s``.

    A row that is entirely ``-inf`` becomes all zeros.
    """
    p = unshifted_softmax(s)
    if p is not None:
        return p
    m = row_max(s)
    m[~np.isfinite(m)] = 0
    s -= m
    np.exp(s, out=s)
    tot = row_sum(s)
    tot[tot == 0] = 1
    s /= tot
    return s


def _grouped_matmul(a: np.ndarray, b: np.ndarray, groups: int) -> np.ndarray:
    """``a @ b`` where ``a`` has ``groups`` times the heads of ``b``.

    ``a``: (B, Hkv*G, M, K), ``b``: (B, Hkv, K, N) -> (B, Hkv*G, M, N); query head
    ``h`` pairs with K/V head ``h // G``.
    """
    if groups == 1:
        return matmul_nd(a, b)
    bsz, h, m, k = a.shape
    a2 = a.reshape(bsz, h // groups, groups * m, k)
    return matmul_nd(a2, b).reshape(bsz, h, m, b.shape[-1])


def _grouped_matmul_f32(a: np.ndarray, b: np.ndarray, groups: int, dt: np.dtype) -> np.ndarray:
    """:func:`_grouped_matmul` accumulated in float32 and rounded to ``dt``."""
    return _grouped_matmul(a.astype(np.float32), b.astype(np.float32), groups).astype(dt)


def _rounds_each_step(dt: np.dtype) -> bool:
    # the ml_dtypes floats (bfloat16...) are not numpy float kinds
    return dt.kind != "f"


def _split_heads(x: np.ndarray, heads: int, what: str, desc: str) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D) as a view."""
    b, s, hd = x.shape
    if heads <= 0 or hd % heads:
        raise ValueError(f"{desc}: {what} hidden size {hd} is not a multiple of num_heads {heads}")
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def _check_gqa(hq: int, hkv: int, desc: str) -> int:
    if hkv <= 0 or hq % hkv:
        raise ValueError(f"{desc}: q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    return hq // hkv


# --------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------


@op("Attention", since=23)
class Attention(Kernel):
    """Scaled dot-product attention with masks, KV cache, GQA and soft capping."""

    def setup(self):
        a = self.attrs
        self.is_causal = bool(a.get("is_causal", 0))
        self.q_num_heads = a.get("q_num_heads")
        self.kv_num_heads = a.get("kv_num_heads")
        self.scale = a.get("scale")
        self.softcap = float(a.get("softcap", 0.0))
        self.mode = int(a.get("qk_matmul_output_mode", 0))
        if self.mode not in (0, 1, 2, 3):
            raise ValueError(f"{self.node.describe()}: qk_matmul_output_mode must be 0..3, got {self.mode}")
        sp = a.get("softmax_precision")
        if sp is not None and int(sp) not in _PRECISION:
            raise ValueError(f"{self.node.describe()}: unsupported softmax_precision {sp}")
        self.softmax_precision = None if sp is None else _PRECISION[int(sp)]
        self.left = int(a.get("left_window_size", -1))
        self.right = int(a.get("right_window_size", -1))
        if self.left < -1 or self.right < -1:
            raise ValueError(f"{self.node.describe()}: window sizes must be -1 or nonnegative")
        n_out = len(self.node.outputs)
        self.want_present = n_out > 1
        self.want_qk = n_out > 3 and bool(self.node.outputs[3])

    def _to_4d(self, q, k, v):
        desc = self.node.describe()
        if not (q.ndim == k.ndim == v.ndim) or q.ndim not in (3, 4):
            raise ValueError(f"{desc}: Q, K, V must all be 3-D or all 4-D, got {q.shape}, {k.shape}, {v.shape}")
        if q.ndim == 3:
            if self.q_num_heads is None or self.kv_num_heads is None:
                raise ValueError(f"{desc}: 3-D inputs need the q_num_heads and kv_num_heads attributes")
            q = _split_heads(q, int(self.q_num_heads), "Q", desc)
            k = _split_heads(k, int(self.kv_num_heads), "K", desc)
            v = _split_heads(v, int(self.kv_num_heads), "V", desc)
        else:
            heads = (("q_num_heads", self.q_num_heads, q.shape[1]), ("kv_num_heads", self.kv_num_heads, k.shape[1]))
            for name, want, got in heads:
                if want is not None and int(want) != got:
                    raise ValueError(f"{desc}: {name}={want} does not match the 4-D input's {got} heads")
        return q, k, v

    def _bias(self, mask, cdt, sq, skv, past_len, nonpad):
        """Additive bias broadcastable to (B, Hq, Sq, Skv), or None when nothing masks."""
        desc = self.node.describe()
        bias = None
        if mask is not None:
            if mask.ndim == 0 or mask.ndim > 4:
                raise ValueError(f"{desc}: attn_mask must have rank 1 to 4, got shape {mask.shape}")
            short = skv - mask.shape[-1]
            if short < 0:
                raise ValueError(f"{desc}: attn_mask has {mask.shape[-1]} keys, more than the {skv} keys attended")
            if mask.dtype == np.bool_:
                bias = np.where(mask, cdt.type(0), cdt.type(-np.inf))
            else:
                bias = mask.astype(cdt)
            if short:
                # a short mask is padded with -inf up to the total key length
                pad = np.full(bias.shape[:-1] + (short,), -np.inf, dtype=cdt)
                bias = np.concatenate([bias, pad], axis=-1)
        allowed = None
        window = self.left >= 0 or self.right >= 0
        if self.is_causal or window:
            if nonpad is not None and past_len == 0:
                offset = (nonpad.astype(np.int64) - sq).reshape(-1, 1, 1, 1)
            else:
                offset = past_len
            i = np.arange(sq).reshape(sq, 1)
            j = np.arange(skv).reshape(1, skv)
            diff = (i + offset) - j  # query position minus key position
            allowed = diff >= 0 if self.is_causal else None
            if self.left >= 0:
                allowed = diff <= self.left if allowed is None else allowed & (diff <= self.left)
            if self.right >= 0:
                allowed = -diff <= self.right if allowed is None else allowed & (-diff <= self.right)
        if nonpad is not None:
            pad_ok = np.arange(skv).reshape(1, 1, 1, skv) < nonpad.astype(np.int64).reshape(-1, 1, 1, 1)
            allowed = pad_ok if allowed is None else allowed & pad_ok
        if allowed is not None:
            if bias is None:
                bias = np.where(allowed, cdt.type(0), cdt.type(-np.inf))
            else:
                bias = np.where(allowed, bias, cdt.type(-np.inf))
        return bias

    def run(self, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        desc = self.node.describe()
        in3d = q.ndim == 3
        q4, k4, v4 = self._to_4d(q, k, v)
        bsz, hq, sq, dh = q4.shape
        if k4.shape[0] != bsz or v4.shape[0] != bsz:
            raise ValueError(f"{desc}: Q, K and V have different batch sizes")
        if k4.shape[3] != dh:
            raise ValueError(f"{desc}: Q head size {dh} differs from K head size {k4.shape[3]}")
        if k4.shape[1] != v4.shape[1] or k4.shape[2] != v4.shape[2]:
            raise ValueError(f"{desc}: K {k4.shape} and V {v4.shape} disagree on heads or sequence length")
        groups = _check_gqa(hq, k4.shape[1], desc)
        if (past_key is None) != (past_value is None):
            raise ValueError(f"{desc}: past_key and past_value must be given together")
        past_len = 0
        if past_key is not None:
            if nonpad_kv_seqlen is not None:
                raise ValueError(f"{desc}: nonpad_kv_seqlen cannot be combined with past_key/past_value")
            if past_key.ndim != 4 or past_key.shape[:2] != k4.shape[:2] or past_key.shape[3] != dh:
                raise ValueError(f"{desc}: past_key shape {past_key.shape} does not fit K {k4.shape}")
            if past_value.ndim != 4 or past_value.shape[:2] != v4.shape[:2] or past_value.shape[3] != v4.shape[3]:
                raise ValueError(f"{desc}: past_value shape {past_value.shape} does not fit V {v4.shape}")
            past_len = past_key.shape[2]
            k4 = np.concatenate([past_key, k4], axis=2)
            v4 = np.concatenate([past_value, v4], axis=2)
        if nonpad_kv_seqlen is not None and nonpad_kv_seqlen.shape != (bsz,):
            raise ValueError(f"{desc}: nonpad_kv_seqlen must have shape ({bsz},), got {nonpad_kv_seqlen.shape}")
        skv = k4.shape[2]
        out_dt = q.dtype
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(dh)
        if _rounds_each_step(out_dt):
            # bfloat16 and friends: round to the input type after each step, as the
            # operator's definition does, so results agree to the last bit
            cdt = out_dt
            r = cdt.type(math.sqrt(scale))
            s = _grouped_matmul_f32(q4 * r, (k4 * r).transpose(0, 1, 3, 2), groups, cdt)
        else:
            cdt = _compute_dtype(out_dt)
            qs = q4.astype(cdt) * cdt.type(scale) if q4.dtype != cdt else q4 * cdt.type(scale)
            kt = k4.astype(cdt, copy=False).transpose(0, 1, 3, 2)
            s = _grouped_matmul(qs, kt, groups)  # (B, Hq, Sq, Skv), a fresh array
        qk = s.copy() if self.want_qk and self.mode == 0 else None
        if self.softcap > 0:
            if s.dtype.kind != "f":
                s = s.astype(np.float32)
            c = cdt.type(self.softcap)
            s /= c
            np.tanh(s, out=s)
            s *= c
        if self.want_qk and self.mode == 1:
            qk = s.copy()
        bias = self._bias(attn_mask, cdt, sq, skv, past_len, nonpad_kv_seqlen)
        if bias is not None:
            try:
                full = np.broadcast_shapes(s.shape, bias.shape)
            except ValueError:
                raise ValueError(
                    f"{desc}: attn_mask of shape {attn_mask.shape} does not broadcast to the scores {s.shape}"
                ) from None
            with np.errstate(invalid="ignore"):
                if full == s.shape:
                    s += bias
                else:
                    s = s + bias
        if self.want_qk and self.mode == 2:
            qk = s.copy()
        sdt = self.softmax_precision if self.softmax_precision is not None else s.dtype
        if sdt != s.dtype:
            s = s.astype(sdt)
        with np.errstate(invalid="ignore", over="ignore"):
            p = _softmax_last_axis(s)
        if bias is not None:
            # rows whose bias masks every key attend nothing, whatever the logits were
            dead = np.isneginf(bias.max(axis=-1, keepdims=True))
            if dead.any():
                p = np.where(dead, p.dtype.type(0), p)
        if self.want_qk and self.mode == 3:
            qk = p
        p = p.astype(cdt, copy=False)
        if cdt.kind != "f":
            y = _grouped_matmul_f32(p, v4, groups, cdt)
        else:
            y = _grouped_matmul(p, v4.astype(cdt, copy=False), groups)  # (B, Hq, Sq, Dv)
        if in3d:
            y = y.transpose(0, 2, 1, 3).reshape(bsz, sq, hq * y.shape[-1])
        y = y.astype(out_dt, copy=False)
        outs = [y]
        if self.want_present:
            outs.append(k4 if past_key is not None else k4.view())
            outs.append(v4 if past_value is not None else v4.view())
            if self.want_qk:
                outs.append(qk.astype(out_dt, copy=False))
            elif len(self.node.outputs) > 3:
                outs.append(None)
        return tuple(outs)


# --------------------------------------------------------------------------------------
# RotaryEmbedding
# --------------------------------------------------------------------------------------


@op("RotaryEmbedding", since=23)
class RotaryEmbedding(Kernel):
    """Rotary position embedding applied to the first ``rotary_embedding_dim`` features."""

    def setup(self):
        a = self.attrs
        self.interleaved = bool(a.get("interleaved", 0))
        self.rot_dim = int(a.get("rotary_embedding_dim", 0))
        self.num_heads = int(a.get("num_heads", 0))

    def run(self, x, cos_cache, sin_cache, position_ids=None):
        desc = self.node.describe()
        if x.ndim == 4:
            xv = x  # (B, H, S, D)
            head_axis_first = True
        elif x.ndim == 3:
            if self.num_heads <= 0:
                raise ValueError(f"{desc}: a 3-D input needs the num_heads attribute")
            b, s, hd = x.shape
            if hd % self.num_heads:
                raise ValueError(f"{desc}: hidden size {hd} is not a multiple of num_heads {self.num_heads}")
            xv = x.reshape(b, s, self.num_heads, hd // self.num_heads)  # (B, S, H, D)
            head_axis_first = False
        else:
            raise ValueError(f"{desc}: input must be 3-D or 4-D, got shape {x.shape}")
        bsz = xv.shape[0]
        seq = xv.shape[2] if head_axis_first else xv.shape[1]
        d = xv.shape[3]
        rd = self.rot_dim or d
        if rd > d or rd % 2:
            raise ValueError(f"{desc}: rotary_embedding_dim {rd} must be even and at most the head size {d}")
        half = rd // 2
        if position_ids is not None:
            if cos_cache.ndim != 2 or sin_cache.ndim != 2:
                raise ValueError(f"{desc}: with position_ids the caches must be 2-D, got {cos_cache.shape}")
            pos = position_ids.astype(np.int64, copy=False)
            if pos.shape != (bsz, seq):
                raise ValueError(f"{desc}: position_ids shape {pos.shape} must be {(bsz, seq)}")
            n = cos_cache.shape[0]
            if pos.size and (pos.min() < 0 or pos.max() >= n):
                raise IndexError(f"{desc}: position_ids must lie in [0, {n}), got {pos.min()}..{pos.max()}")
            cos, sin = cos_cache[pos], sin_cache[pos]
        else:
            if cos_cache.shape != (bsz, seq, cos_cache.shape[-1]) or sin_cache.shape != cos_cache.shape:
                raise ValueError(
                    f"{desc}: without position_ids the caches must have shape (batch, seq, dim/2), "
                    f"got {cos_cache.shape} and {sin_cache.shape}"
                )
            cos, sin = cos_cache, sin_cache
        if cos.shape[-1] != half or sin.shape[-1] != half:
            raise ValueError(f"{desc}: cache last dimension {cos.shape[-1]} must be rotary_embedding_dim/2 = {half}")
        cdt = _compute_dtype(x.dtype)
        cos = cos.astype(cdt, copy=False)
        sin = sin.astype(cdt, copy=False)
        # (B, S, half) -> broadcast against the head axis
        cos = cos[:, None] if head_axis_first else cos[:, :, None]
        sin = sin[:, None] if head_axis_first else sin[:, :, None]
        xr = xv[..., :rd].astype(cdt, copy=False)
        if self.interleaved:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
        else:
            x1, x2 = xr[..., :half], xr[..., half:]
        out = np.array(xv, copy=True)
        real = x1 * cos - x2 * sin
        imag = x1 * sin + x2 * cos
        if self.interleaved:
            out[..., 0:rd:2] = real
            out[..., 1:rd:2] = imag
        else:
            out[..., :half] = real
            out[..., half:rd] = imag
        return (out.reshape(x.shape),)


# --------------------------------------------------------------------------------------
# LinearAttention
# --------------------------------------------------------------------------------------

_RULES = ("linear", "gated", "delta", "gated_delta")


@op("LinearAttention", since=27)
class LinearAttention(Kernel):
    """Recurrent (linear, gated, delta, gated-delta) linear attention with a state."""

    def setup(self):
        a = self.attrs
        desc = self.node.describe()
        self.rule = a.get("update_rule", "gated_delta")
        if self.rule not in _RULES:
            raise ValueError(f"{desc}: unknown update_rule {self.rule!r}; expected one of {_RULES}")
        if a.get("q_num_heads") is None or a.get("kv_num_heads") is None:
            raise ValueError(f"{desc}: q_num_heads and kv_num_heads are required")
        self.hq = int(a["q_num_heads"])
        self.hkv = int(a["kv_num_heads"])
        self.groups = _check_gqa(self.hq, self.hkv, desc)
        self.scale = float(a.get("scale", 0.0))
        self.gated = self.rule in ("gated", "gated_delta")
        self.delta = self.rule in ("delta", "gated_delta")

    def run(self, query, key, value, past_state=None, decay=None, beta=None):
        desc = self.node.describe()
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim != 3:
                raise ValueError(f"{desc}: {name} must be 3-D (B, T, H*D), got {t.shape}")
        if self.gated and decay is None:
            raise ValueError(f"{desc}: update_rule {self.rule!r} needs the decay input")
        if not self.gated and decay is not None:
            raise ValueError(f"{desc}: update_rule {self.rule!r} takes no decay input")
        if self.delta and beta is None:
            raise ValueError(f"{desc}: update_rule {self.rule!r} needs the beta input")
        if not self.delta and beta is not None:
            raise ValueError(f"{desc}: update_rule {self.rule!r} takes no beta input")
        b, t, qd = query.shape
        hq, hkv, g = self.hq, self.hkv, self.groups
        if qd % hq or key.shape[2] % hkv or value.shape[2] % hkv:
            raise ValueError(f"{desc}: packed head dimensions do not divide by the head counts")
        dk, dv = qd // hq, value.shape[2] // hkv
        if key.shape != (b, t, hkv * dk) or value.shape[:2] != (b, t):
            raise ValueError(f"{desc}: key {key.shape} / value {value.shape} do not fit query {query.shape}")
        f32 = np.float32
        # time-major layouts so each step reads one contiguous slab
        q = query.astype(f32, copy=False).reshape(b, t, hkv, g, dk).transpose(1, 0, 2, 3, 4)
        k = key.astype(f32, copy=False).reshape(b, t, hkv, dk).transpose(1, 0, 2, 3)
        v = value.astype(f32, copy=False).reshape(b, t, hkv, dv).transpose(1, 0, 2, 3)
        if self.gated:
            if decay.ndim != 3 or decay.shape[:2] != (b, t):
                raise ValueError(f"{desc}: decay must have shape (B, T, H_kv) or (B, T, H_kv*d_k), got {decay.shape}")
            if decay.shape[2] == hkv:
                dec = decay.reshape(b, t, hkv, 1)
            elif decay.shape[2] == hkv * dk:
                dec = decay.reshape(b, t, hkv, dk)
            else:
                raise ValueError(f"{desc}: decay last dimension {decay.shape[2]} must be {hkv} or {hkv * dk}")
            gate = np.exp(dec.astype(f32)).transpose(1, 0, 2, 3)[..., None]  # (T, B, Hkv, 1|dk, 1)
        if self.delta:
            if beta.ndim != 3 or beta.shape[:2] != (b, t) or beta.shape[2] not in (hkv, 1):
                raise ValueError(f"{desc}: beta must have shape (B, T, H_kv) or (B, T, 1), got {beta.shape}")
            bet = beta.astype(f32, copy=False).transpose(1, 0, 2)[..., None]  # (T, B, Hkv|1, 1)
        if past_state is not None:
            if past_state.shape != (b, hkv, dk, dv):
                raise ValueError(f"{desc}: past_state shape {past_state.shape} must be {(b, hkv, dk, dv)}")
            state = past_state.astype(f32)  # a private copy, updated in place
        else:
            state = np.zeros((b, hkv, dk, dv), dtype=f32)
        scale = self.scale if self.scale != 0.0 else 1.0 / math.sqrt(dk)
        out = np.empty((t, b, hkv, g, dv), dtype=f32)
        for i in range(t):
            if self.gated:
                state *= gate[i]
            kt, vt = k[i], v[i]
            if self.delta:
                retrieved = np.matmul(kt[..., None, :], state)[..., 0, :]  # S^T k
                vt = bet[i] * (vt - retrieved)
            state += kt[..., :, None] * vt[..., None, :]
            np.matmul(q[i], state, out=out[i])
        out *= f32(scale)
        y = out.transpose(1, 0, 2, 3, 4).reshape(b, t, hq * dv).astype(query.dtype, copy=False)
        sdt = self.node.output_dtype(1)
        if sdt is None:
            sdt = past_state.dtype if past_state is not None else query.dtype
        return (y, state.astype(sdt, copy=False))


# --------------------------------------------------------------------------------------
# CausalConvWithState
# --------------------------------------------------------------------------------------

_ACTIVATIONS = ("none", "silu", "swish")


@op("CausalConvWithState", since=27)
class CausalConvWithState(Kernel):
    """Depthwise causal 1-D convolution that carries its last ``k-1`` inputs as state."""

    def setup(self):
        self.activation = self.attrs.get("activation", "none")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"{self.node.describe()}: unknown activation {self.activation!r}")

    def run(self, x, weight, bias=None, past_state=None):
        desc = self.node.describe()
        if x.ndim != 3:
            raise ValueError(f"{desc}: input must be (batch, channels, length), got {x.shape}")
        b, c, length = x.shape
        if weight.ndim != 3 or weight.shape[:2] != (c, 1):
            raise ValueError(f"{desc}: weight must have shape ({c}, 1, k), got {weight.shape}")
        k = weight.shape[2]
        if k < 1:
            raise ValueError(f"{desc}: kernel size must be at least 1")
        if past_state is None:
            pad = np.zeros((b, c, k - 1), dtype=x.dtype)
        else:
            if past_state.shape != (b, c, k - 1):
                raise ValueError(f"{desc}: past_state shape {past_state.shape} must be {(b, c, k - 1)}")
            pad = past_state
        padded = np.concatenate([pad, x], axis=2)
        cdt = _compute_dtype(x.dtype)
        pc = padded.astype(cdt, copy=False)
        w = weight[:, 0, :].astype(cdt, copy=False)
        # accumulate over the (small) kernel taps, vectorized over batch/channel/time
        y = pc[:, :, 0:length] * w[:, 0:1]
        if k > 1:
            tmp = np.empty_like(y)
            for j in range(1, k):
                np.multiply(pc[:, :, j : j + length], w[:, j : j + 1], out=tmp)
                y += tmp
        if bias is not None:
            if bias.shape != (c,):
                raise ValueError(f"{desc}: bias must have shape ({c},), got {bias.shape}")
            y += bias.astype(cdt, copy=False)[:, None]
        if self.activation != "none":
            if y.dtype != x.dtype:
                y = y.astype(x.dtype).astype(cdt)  # the activation sees the rounded conv
            # silu(y) = y / (1 + exp(-y)), computed without further temporaries
            t = np.negative(y)
            with np.errstate(over="ignore"):
                np.exp(t, out=t)
            t += 1
            np.divide(y, t, out=y)
        present = padded[:, :, padded.shape[2] - (k - 1) :]
        return (y.astype(x.dtype, copy=False), present.copy())


# --------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)
# --------------------------------------------------------------------------------------


def _call_modifier(fn, x: np.ndarray, what: str, desc: str, outer, ctx) -> np.ndarray:
    if not callable(fn):
        raise NotImplementedError(f"{desc}: the {what} subgraph is not executable in this context")
    r = fn(x, outer=outer, ctx=ctx)
    if isinstance(r, (list, tuple)):
        if len(r) != 1:
            raise ValueError(f"{desc}: {what} must produce exactly one output, got {len(r)}")
        r = r[0]
    r = np.asarray(r)
    if r.shape != x.shape:
        raise ValueError(f"{desc}: {what} changed the shape {x.shape} to {r.shape}")
    return r.astype(x.dtype, copy=False)


@op("FlexAttention", since=1, domain="ai.onnx.preview")
class FlexAttention(Kernel):
    """Attention with optional score/probability modifier subgraphs."""

    def setup(self):
        a = self.attrs
        self.scale = a.get("scale")
        sp = a.get("softmax_precision")
        if sp is not None and int(sp) not in _PRECISION:
            raise ValueError(f"{self.node.describe()}: unsupported softmax_precision {sp}")
        self.softmax_precision = None if sp is None else _PRECISION[int(sp)]
        self.score_mod = a.get("score_mod")
        self.prob_mod = a.get("prob_mod")

    def run(self, q, k, v, outer=None, ctx=None):
        desc = self.node.describe()
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"{desc}: Q, K, V must be 4-D, got {q.shape}, {k.shape}, {v.shape}")
        bsz, hq, sq, e = q.shape
        if k.shape[0] != bsz or v.shape[0] != bsz:
            raise ValueError(f"{desc}: Q, K and V have different batch sizes")
        if k.shape[3] != e:
            raise ValueError(f"{desc}: Q head size {e} differs from K head size {k.shape[3]}")
        if k.shape[1:3] != v.shape[1:3]:
            raise ValueError(f"{desc}: K {k.shape} and V {v.shape} disagree on heads or sequence length")
        groups = _check_gqa(hq, k.shape[1], desc)
        cdt = self.softmax_precision or _compute_dtype(q.dtype)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(e)
        qs = q.astype(cdt) * cdt.type(scale)
        s = _grouped_matmul(qs, k.astype(cdt, copy=False).transpose(0, 1, 3, 2), groups)
        if self.score_mod is not None:
            s = np.array(_call_modifier(self.score_mod, s, "score_mod", desc, outer, ctx), dtype=cdt, copy=True)
        with np.errstate(invalid="ignore", over="ignore"):
            p = _softmax_last_axis(s)
        if self.prob_mod is not None:
            p = _call_modifier(self.prob_mod, p, "prob_mod", desc, outer, ctx)
        y = _grouped_matmul(p, v.astype(cdt, copy=False), groups)
        return (y.astype(v.dtype, copy=False),)
