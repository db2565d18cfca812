"""com.microsoft transformer ops, as ``onnxruntime.transformers`` writes them.

Gelu, FastGelu, BiasGelu, QuickGelu; SkipLayerNormalization, EmbedLayerNormalization,
SimplifiedLayerNormalization (ai.onnx domain, as onnxruntime registers it) and
SkipSimplifiedLayerNormalization; Attention, MultiHeadAttention and RotaryEmbedding.
Signatures, defaults and mask conventions follow onnxruntime's contrib operator
schemas: masked attention scores get ``mask_filter_value`` (default -10000) *added*,
not ``-inf``, so a fully masked row softmaxes to a uniform row exactly as there.

Narrow floats (float16, bfloat16) are computed in float32 and rounded once.
"""

from __future__ import annotations

import math

import numpy as np
from onnxrt.plugin.kernel import Kernel

from .. import native
from ..parallel import matmul_nd
from ..registry import op
from .activation import gelu_erf, swish
from .normalization import _normalize
from ..rows import SoftmaxRoute, broadcast_buffer, columns_op, row_mean, row_op, row_vector, softmax_rows

__all__ = [
    "Attention",
    "EmbedLayerNormalization",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SkipLayerNormalization",
    "gelu_erf",
]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)


def _work(x: np.ndarray) -> np.ndarray:
    return x if x.dtype in (np.float32, np.float64) else x.astype(_F32)


def _back(y: np.ndarray, dt) -> np.ndarray:
    return y if y.dtype == dt else y.astype(dt)


# -- Gelu family ----------------------------------------------------------------------------


def _bias_add(x, bias, what):
    if bias is None:
        return x
    if bias.ndim != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{what}: bias must have shape ({x.shape[-1]},), got {bias.shape}"
        )
    b = _work(bias)
    row = row_vector(b, x)
    if row is None:
        return x + b
    return columns_op(np.add, x, row, out=np.empty(x.shape, x.dtype))


@op("Gelu", since=1, domain=MS)
def gelu(k, x):
    """Exact Gelu (erf form)."""
    return _back(gelu_erf(_work(x)), x.dtype)


@op("BiasGelu", since=1, domain=MS)
def bias_gelu(k, a, b):
    """``Gelu(A + B)`` with a 1-D bias ``B``."""
    # the compiled kernel adds the bias row by row in the same pass (float32)
    y = native.unary(a, native.GELU, bias=b)
    if y is not None:
        return y
    return _back(gelu_erf(_bias_add(_work(a), b, "BiasGelu")), a.dtype)


@op("FastGelu", since=1, domain=MS)
def fast_gelu(k, x, bias=None):
    """``0.5 x (1 + tanh(0.7978845608 x + 0.0356774081 x^3))`` after an optional bias."""
    v = _bias_add(_work(x), bias, "FastGelu")
    t = v * v
    t *= v.dtype.type(0.044715)
    t += 1
    t *= v
    t *= v.dtype.type(math.sqrt(2.0 / math.pi))
    np.tanh(t, out=t)
    t += 1
    t *= v
    t *= v.dtype.type(0.5)
    return _back(t, x.dtype)


@op("QuickGelu", since=1, domain=MS)
def quick_gelu(k, x, *, alpha=1.702):
    """``x * sigmoid(alpha * x)``."""
    return _back(swish(np, _work(x), alpha), x.dtype)


# -- layer normalizations ----------------------------------------------------------------------


def _check_vec(p, h, what, name):
    if p is None:
        return None
    if p.shape != (h,):
        raise ValueError(f"{name}: {what} must have shape ({h},), got {p.shape}")
    return _work(p)


def _layer_norm(v, gamma, beta, eps, simplified):
    """Normalize the last axis; returns ``(y, mean, inv_std)`` (keepdims)."""
    if not simplified and gamma is not None:
        done = native.layer_norm(v, gamma, beta, eps, want_stats=True)
        if done is not None:
            stat = v.shape[:-1] + (1,)
            return done[0], done[2].reshape(stat), done[3].reshape(stat)
    if simplified:
        mean = None
        ms = row_mean(v * v)
        inv = 1.0 / np.sqrt(ms + v.dtype.type(eps))
        # a per-row scale over rows of the hidden size (rows.broadcast_buffer)
        with broadcast_buffer(v.shape, v.shape, inv.shape):
            y = v * inv
    else:
        y, mean, inv = _normalize(v, -1, eps)
    if row_op(np.multiply, y, gamma) is None:
        y *= gamma
    if beta is not None and row_op(np.add, y, beta) is None:
        y += beta
    return y, mean, inv


class _SkipNorm(Kernel):
    simplified = False

    def setup(self):
        self.eps = float(self.attrs.get("epsilon", 1e-12))
        self.n_out = len(self.node.outputs)

    def _run(self, x, skip, gamma, beta, bias):
        name = self.node.describe()
        if x.ndim not in (2, 3):
            raise ValueError(f"{name}: input must be 2-D or 3-D, got shape {x.shape}")
        h = x.shape[-1]
        if (
            skip.shape[-1] != h
            or skip.ndim > x.ndim
            or skip.shape != x.shape[x.ndim - skip.ndim :]
            and not (
                skip.ndim == 3 and skip.shape[0] == 1 and skip.shape[1:] == x.shape[1:]
            )
        ):
            raise ValueError(
                f"{name}: skip of shape {skip.shape} does not fit input of shape {x.shape}"
            )
        g = _check_vec(gamma, h, "gamma", name)
        b = _check_vec(beta, h, "beta", name)
        bb = _check_vec(bias, h, "bias", name)
        # the compiled kernel: the sum, its statistics and the scaled row a row at a time
        if self.simplified:
            done = native.rms_norm(x, g, self.eps, skip=skip, bias=bb, want_sum=self.n_out > 3,
                                   want_inv=self.n_out > 2)
            if done is not None:
                done = (done[0], done[1], None, done[2])
        else:
            done = native.layer_norm(x, g, b, self.eps, skip=skip, bias=bb, want_sum=self.n_out > 3,
                                     want_stats=self.n_out > 1)
        if done is not None:
            y, s, mean, inv = done
            stat = x.shape[:-1] + (1,)
            # the simplified form has no mean: zeros in its place, as onnxruntime gives
            outs = [y, np.zeros(stat, _F32) if mean is None else mean.reshape(stat)]
            if self.n_out > 2:
                outs.append(inv.reshape(stat))
            if self.n_out > 3:
                outs.append(s)
            return tuple(outs[: self.n_out])
        s = _work(x) + _work(skip)
        if bb is not None:
            s += bb
        y, mean, inv = _layer_norm(s, g, b, self.eps, self.simplified)
        outs = [_back(y, x.dtype)]
        if self.n_out > 1:
            stat = x.shape[:-1] + (1,)
            # the simplified form has no mean: zeros in its place, as onnxruntime gives
            outs.append(np.zeros(stat, _F32) if mean is None else mean.reshape(stat).astype(_F32))
            outs.append(inv.reshape(stat).astype(_F32))
            outs.append(_back(s, x.dtype))
        return tuple(outs[: self.n_out])


@op("SkipLayerNormalization", since=1, domain=MS)
class SkipLayerNormalization(_SkipNorm):
    """``LayerNorm(input + skip + bias) * gamma + beta`` over the last axis."""

    def run(self, x, skip, gamma, beta=None, bias=None):
        return self._run(x, skip, gamma, beta, bias)


@op("SkipSimplifiedLayerNormalization", since=1, domain=MS)
class SkipSimplifiedLayerNormalization(_SkipNorm):
    """``RMSNorm(input + skip + bias) * gamma``."""

    simplified = True

    def run(self, x, skip, gamma, bias=None):
        return self._run(x, skip, gamma, None, bias)


class SimplifiedLayerNormalization(Kernel):
    """RMS normalization over axes ``[axis, rank)``: ``x / sqrt(mean(x^2) + eps) * scale``."""

    def run(self, x, scale):
        axis = int(self.attrs.get("axis", -1))
        eps = float(self.attrs.get("epsilon", 1e-5))
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(
                f"{self.node.describe()}: axis {axis} is out of range for rank {x.ndim}"
            )
        axis %= x.ndim
        lead = x.shape[:axis]
        if axis == x.ndim - 1:
            done = native.rms_norm(x, scale, eps, want_inv=len(self.node.outputs) > 1)
            if done is not None:
                y, _, inv = done
                return (y,) if inv is None else (y, inv.reshape(lead + (1,)))
        v = _work(x).reshape(math.prod(lead), -1)
        ms = row_mean(v * v)
        inv = 1.0 / np.sqrt(ms + v.dtype.type(eps))
        y = (v * inv).reshape(x.shape) * _work(scale)
        outs = (
            _back(y, x.dtype),
            inv.reshape(lead + (1,) * (x.ndim - axis)).astype(_F32),
        )
        return outs[: len(self.node.outputs)]


op("SimplifiedLayerNormalization", since=1)(SimplifiedLayerNormalization)
op("SimplifiedLayerNormalization", since=1, domain=MS)(SimplifiedLayerNormalization)


@op("EmbedLayerNormalization", since=1, domain=MS)
class EmbedLayerNormalization(Kernel):
    """BERT's embedding layer: word + position (+ segment) embeddings, then LayerNorm.
    ``mask_index`` is the number of non-zero mask entries per row."""

    def setup(self):
        self.eps = float(self.attrs.get("epsilon", 1e-12))
        self.n_out = len(self.node.outputs)

    def run(
        self,
        input_ids,
        segment_ids,
        word_embedding,
        position_embedding,
        segment_embedding=None,
        gamma=None,
        beta=None,
        mask=None,
        position_ids=None,
    ):
        name = self.node.describe()
        if input_ids.ndim != 2:
            raise ValueError(
                f"{name}: input_ids must be 2-D (batch, sequence), got shape {input_ids.shape}"
            )
        b, s = input_ids.shape
        h = word_embedding.shape[1]
        v = _take(word_embedding, input_ids, "input_ids", name)
        if position_ids is None:
            # positions 0 .. S-1 of every row: the table's first S rows, broadcast
            if s > position_embedding.shape[0]:
                raise IndexError(
                    f"{name}: position_ids must be in [0, {position_embedding.shape[0]}), got values in [0, {s - 1}]"
                )
            v += position_embedding[:s]
        else:
            v += _take(position_embedding, np.broadcast_to(position_ids, (b, s)), "position_ids", name)
        if segment_ids is not None and segment_embedding is not None:
            v += _take(segment_embedding, segment_ids, "segment_ids", name)
        v = _work(v)
        y, _, _ = _layer_norm(
            v,
            _check_vec(gamma, h, "gamma", name),
            _check_vec(beta, h, "beta", name),
            self.eps,
            False,
        )
        outs = [_back(y, word_embedding.dtype)]
        if self.n_out > 1:
            if mask is None:
                mi = np.zeros(b, np.int32)
            else:
                if mask.shape != (b, s):
                    raise ValueError(
                        f"{name}: mask must have shape ({b}, {s}), got {mask.shape}"
                    )
                # 2.0 us against 3.5 for np.count_nonzero(mask, axis=1) on 8 x 32
                mi = np.add.reduce(mask != 0, axis=1, dtype=np.int32)
            outs.append(mi)
        if self.n_out > 2:
            outs.append(_back(v, word_embedding.dtype))
        return tuple(outs)


#: Unsigned views of signed index types: one maximum over the view finds both
#: negative indices (huge there) and indices past the table.
_UNSIGNED = {np.dtype(np.int64): np.uint64, np.dtype(np.int32): np.uint32}


def _take(table, ids, what, name):
    n = table.shape[0]
    if ids.size:
        wide = _UNSIGNED.get(ids.dtype)
        bad = ids.view(wide).max() >= n if wide is not None else (ids.min() < 0 or ids.max() >= n)
        if bad:
            raise IndexError(
                f"{name}: {what} must be in [0, {n}), got values in [{ids.min()}, {ids.max()}]"
            )
    return table.take(ids, axis=0)  # half the time of table[ids] on small tables


# -- attention ----------------------------------------------------------------------------------


def _key_mask(mask, b, s, total, past, filt, name, allow_4d=True):
    """The additive mask for onnxruntime's mask formats, or ``None``: ``[B, 1, 1, T]``
    for masks over keys only (1-D and 2-D), ``[B, 1, S, T]`` otherwise; it broadcasts
    over the heads (and the queries) of the scores."""
    if mask is None:
        return None
    m = np.asarray(mask)
    zero, fill = np.float32(0), np.float32(filt)
    if m.ndim == 1:
        cols = np.arange(total)
        if m.shape[0] == b:  # right padding: valid length per batch
            if m.size and m.min() >= total:
                return None  # no padding: an all-zero mask changes no score
            bad = cols[None, :] >= m[:, None]
        elif m.shape[0] == 2 * b:  # exclusive ends, then inclusive starts
            end, start = m[:b], m[b:]
            bad = (cols[None, :] >= end[:, None]) | (cols[None, :] < start[:, None])
        else:
            raise ValueError(
                f"{name}: a 1-D mask must have {b} or {2 * b} entries, got {m.shape[0]}"
            )
        return np.where(bad, fill, zero).reshape(b, 1, 1, total)
    if m.ndim == 2:
        if m.shape != (b, total):
            raise ValueError(
                f"{name}: a 2-D mask must have shape ({b}, {total}), got {m.shape}"
            )
        if m.all():
            return None  # nothing masked: an all-zero mask changes no score
        return np.where(m == 0, fill, zero).reshape(b, 1, 1, total)
    if m.ndim == 3:
        if m.shape != (b, s, total):
            raise ValueError(
                f"{name}: a 3-D mask must have shape ({b}, {s}, {total}), got {m.shape}"
            )
        return np.where(m == 0, fill, zero).reshape(b, 1, s, total)
    if m.ndim == 4 and allow_4d:
        if m.shape[0] != b or m.shape[2] < past + s or m.shape[3] < total:
            raise ValueError(
                f"{name}: a 4-D mask of shape {m.shape} does not cover {s} queries and {total} keys"
            )
        sub = m[:, :, past : past + s, :total]
        return np.where(sub == 0, fill, zero)
    raise ValueError(f"{name}: mask of rank {m.ndim} is not supported")


def _sdpa(q, k, v, scale, add_mask, attention_bias, causal, past, name, route=None):
    """``softmax(q k^T * scale + masks) v`` on ``[B, N, S, H]`` operands (``route``:
    the calling kernel's :class:`SoftmaxRoute`)."""
    scores = matmul_nd(q, k.swapaxes(-1, -2))
    scores *= scores.dtype.type(scale)
    s, t = scores.shape[-2:]
    if add_mask is not None:
        scores += add_mask
    if causal:
        # keys after each query's position are left out of its softmax altogether, as
        # onnxruntime does: adding the mask filter value instead (-10000) lets a future
        # score that far above the rest through
        future = np.arange(t)[None, :] > (np.arange(s)[:, None] + past)
        np.copyto(scores, scores.dtype.type(-np.inf), where=future)
    if attention_bias is not None:
        ab = _work(attention_bias)
        try:
            scores += ab
        except ValueError:
            raise ValueError(
                f"{name}: attention_bias of shape {attention_bias.shape} does not broadcast to {scores.shape}"
            ) from None
    probs = softmax_rows(scores, route)
    return matmul_nd(probs, v), probs


def _heads(x, n, what, name):
    """``[B, S, N*H]`` -> ``[B, N, S, H]``."""
    b, s, d = x.shape
    if d % n:
        raise ValueError(
            f"{name}: {what} hidden size {d} is not divisible by num_heads {n}"
        )
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _merge(x):
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _no_rotary(node) -> str | None:
    if node.attrs.get("do_rotary", 0):
        return "do_rotary=1 is not supported"
    if node.attrs.get("past_present_share_buffer", 0):
        return "past_present_share_buffer=1 is not supported"
    return None


@op("Attention", since=1, domain=MS, accepts=_no_rotary)
class Attention(Kernel):
    """Multi-head self attention with the Q/K/V projections merged into one weight."""

    def setup(self):
        a = self.attrs
        self.n = int(a["num_heads"]) if "num_heads" in a else 0
        if self.n <= 0:
            raise ValueError(f"{self.node.describe()}: num_heads must be positive")
        self.sizes = a.get("qkv_hidden_sizes")
        self.causal = bool(a.get("unidirectional", 0))
        self.filt = float(a.get("mask_filter_value", -10000.0))
        self.scale = a.get("scale")
        self.n_out = len(self.node.outputs)
        self._route = SoftmaxRoute()
        w = self.node.constants.get(1)
        self.w_packed = None if w is None else np.ascontiguousarray(_work(w))

    def run(
        self,
        x,
        weights,
        bias=None,
        mask_index=None,
        past=None,
        attention_bias=None,
        past_sequence_length=None,
    ):
        hq, hk = self.split_sizes(x, weights)
        w = (
            self.w_packed
            if self.w_packed is not None and self.w_packed.shape == weights.shape
            else _work(weights)
        )
        qkv = matmul_nd(_work(x), w)
        return self.attend(qkv, hq, hk, bias, mask_index, past, attention_bias, x.dtype)

    def split_sizes(self, x, weights) -> tuple[int, int]:
        """Check the input against the merged weight; return Q's and K's widths."""
        name = self.node.describe()
        if x.ndim != 3 or weights.ndim != 2 or weights.shape[0] != x.shape[2]:
            raise ValueError(
                f"{name}: input {x.shape} and weights {weights.shape} do not fit (B, S, D) @ (D, 3H)"
            )
        total_w = weights.shape[1]
        if self.sizes:
            if (
                len(self.sizes) != 3
                or sum(self.sizes) != total_w
                or self.sizes[0] != self.sizes[1]
            ):
                raise ValueError(
                    f"{name}: qkv_hidden_sizes {self.sizes} do not fit weights {weights.shape}"
                )
            return self.sizes[0], self.sizes[1]
        if total_w % 3:
            raise ValueError(f"{name}: weights width {total_w} is not divisible by 3")
        return total_w // 3, total_w // 3

    def attend(self, qkv, hq, hk, bias, mask_index, past, attention_bias, dtype):
        """Attention from the projected ``qkv`` ``[B, S, hq + hk + hv]`` (float)."""
        name = self.node.describe()
        total_w = qkv.shape[-1]
        if bias is not None:
            if bias.shape != (total_w,):
                raise ValueError(
                    f"{name}: bias must have shape ({total_w},), got {bias.shape}"
                )
            b = _work(bias)
            if row_op(np.add, qkv, b) is None:
                qkv += b
        q = _heads(qkv[..., :hq], self.n, "Q", name)
        k = _heads(qkv[..., hq : hq + hk], self.n, "K", name)
        v = _heads(qkv[..., hq + hk :], self.n, "V", name)
        past_len = 0
        if past is not None:
            if (
                past.ndim != 5
                or past.shape[0] != 2
                or past.shape[1:3] != k.shape[:2]
                or past.shape[4] != k.shape[3]
            ):
                raise ValueError(
                    f"{name}: past of shape {past.shape} must be (2, B, N, P, {k.shape[3]})"
                )
            past_len = past.shape[3]
            k = np.concatenate([_work(past[0]), k], axis=2)
            v = np.concatenate([_work(past[1]), v], axis=2)
        b, s = qkv.shape[:2]
        total = k.shape[2]
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(hq // self.n)
        mask = _key_mask(mask_index, b, s, total, past_len, self.filt, name)
        out, _ = _sdpa(
            q, k, v, scale, mask, attention_bias, self.causal, past_len, name, self._route
        )
        outs = [_back(_merge(out), dtype)]
        if self.n_out > 1:
            outs.append(_back(np.stack([k, v]), dtype))
        return tuple(outs)


@op("MultiHeadAttention", since=1, domain=MS)
class MultiHeadAttention(Kernel):
    """Multi-head self or cross attention on projected Q, K, V (separate, packed KV,
    packed QKV, or K/V already in ``[B, N, L, H]``), with optional past and bias."""

    def setup(self):
        a = self.attrs
        self.n = int(a.get("num_heads", 0))
        if self.n <= 0:
            raise ValueError(f"{self.node.describe()}: num_heads must be positive")
        self.causal = bool(a.get("unidirectional", 0))
        self.filt = float(a.get("mask_filter_value", -10000.0))
        self.scale = a.get("scale")
        self.n_out = len(self.node.outputs)
        self._route = SoftmaxRoute()

    def run(
        self,
        query,
        key=None,
        value=None,
        bias=None,
        key_padding_mask=None,
        attention_bias=None,
        past_key=None,
        past_value=None,
        past_sequence_length=None,
        cache_indirection=None,
    ):
        name = self.node.describe()
        if cache_indirection is not None:
            raise ValueError(
                f"{name}: cache_indirection (beam search) is not supported"
            )
        n = self.n
        qv = _work(query)
        if qv.ndim == 5:  # packed QKV [B, S, N, 3, H]
            if key is not None or value is not None or qv.shape[3] != 3:
                raise ValueError(
                    f"{name}: packed QKV must have shape (B, S, N, 3, H) and no key/value"
                )
            q, k, v = (qv[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
            if bias is not None:
                raise ValueError(f"{name}: bias with packed QKV is not supported")
        else:
            if qv.ndim != 3:
                raise ValueError(
                    f"{name}: query must be (B, S, D), got shape {query.shape}"
                )
            d = qv.shape[2]
            if key is None:
                raise ValueError(f"{name}: key is required unless query is packed QKV")
            kv = _work(key)
            if kv.ndim == 5:  # packed KV [B, L, N, 2, H]
                if value is not None:
                    raise ValueError(f"{name}: packed KV takes no separate value")
                k = kv[:, :, :, 0].transpose(0, 2, 1, 3)
                v = kv[:, :, :, 1].transpose(0, 2, 1, 3)
                if bias is not None:
                    raise ValueError(f"{name}: bias with packed KV is not supported")
                q = _heads(qv, n, "query", name)
            else:
                if value is None:
                    raise ValueError(f"{name}: value is required with an unpacked key")
                vv = _work(value)
                if bias is not None:
                    if bias.ndim != 1 or (
                        kv.ndim == 3 and bias.shape[0] != 2 * d + vv.shape[-1]
                    ):
                        raise ValueError(
                            f"{name}: bias of shape {bias.shape} does not fit Q, K and V"
                        )
                    bb = _work(bias)
                    qv = qv + bb[:d]
                    if kv.ndim == 3:
                        kv = kv + bb[d : d + kv.shape[-1]]
                        vv = vv + bb[d + kv.shape[-1] :]
                q = _heads(qv, n, "query", name)
                if kv.ndim == 3:
                    k = _heads(kv, n, "key", name)
                    v = _heads(vv, n, "value", name)
                elif kv.ndim == 4:  # already [B, N, L, H]
                    k, v = kv, vv
                else:
                    raise ValueError(f"{name}: key of rank {kv.ndim} is not supported")
        past_len = 0
        if past_key is not None or past_value is not None:
            if past_key is None or past_value is None:
                raise ValueError(f"{name}: past_key and past_value go together")
            if (
                past_key.ndim != 4
                or past_key.shape[:2] != k.shape[:2]
                or past_key.shape[3] != k.shape[3]
            ):
                raise ValueError(
                    f"{name}: past_key of shape {past_key.shape} does not fit key {k.shape}"
                )
            past_len = past_key.shape[2]
            k = np.concatenate([_work(past_key), k], axis=2)
            v = np.concatenate([_work(past_value), v], axis=2)
        b, _, s, h = q.shape
        total = k.shape[2]
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(h)
        mask = _key_mask(
            key_padding_mask, b, s, total, past_len, self.filt, name, allow_4d=False
        )
        out, probs = _sdpa(
            q, k, v, scale, mask, attention_bias, self.causal, past_len, name, self._route
        )
        dt = query.dtype
        outs = [_back(_merge(out), dt)]
        if self.n_out > 1:
            outs += [_back(k, dt), _back(v, dt)]
        if self.n_out > 3:
            outs.append(_back(probs, dt))
        return tuple(outs[: self.n_out])


@op("RotaryEmbedding", since=1, domain=MS)
class RotaryEmbedding(Kernel):
    """Rotary position embedding on ``[B, S, N*H]`` or ``[B, N, S, H]`` input, with the
    halves (default) or interleaved pairs rotated; dims past ``rotary_embedding_dim``
    pass through."""

    def setup(self):
        a = self.attrs
        self.interleaved = bool(a.get("interleaved", 0))
        self.n = int(a.get("num_heads", 0))
        self.rot = int(a.get("rotary_embedding_dim", 0))
        if a.get("is_packed_batching", 0):
            raise ValueError(
                f"{self.node.describe()}: is_packed_batching=1 is not supported"
            )

    def run(self, x, position_ids, cos_cache, sin_cache):
        name = self.node.describe()
        half = cos_cache.shape[-1]
        rot = self.rot or 2 * half
        if x.ndim == 4:
            xb = _work(x)  # [B, N, S, H]
        elif x.ndim == 3:
            n = self.n or x.shape[2] // rot
            if n <= 0 or x.shape[2] % n:
                raise ValueError(
                    f"{name}: hidden size {x.shape[2]} does not split into {n} heads"
                )
            xb = _heads(_work(x), n, "input", name)
        else:
            raise ValueError(f"{name}: input must be 3-D or 4-D, got shape {x.shape}")
        b, _, s, h = xb.shape
        if rot > h or rot != 2 * half:
            raise ValueError(
                f"{name}: rotary dim {rot} does not fit head size {h} and cos_cache {cos_cache.shape}"
            )
        pid = np.asarray(position_ids)
        if pid.size == 1 and pid.ndim <= 1:
            pos = np.broadcast_to(int(pid.reshape(())) + np.arange(s), (b, s))
        elif pid.shape == (b, s):
            pos = pid
        else:
            raise ValueError(
                f"{name}: position_ids must have shape (1,) or ({b}, {s}), got {pid.shape}"
            )
        if pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0]):
            raise IndexError(
                f"{name}: position ids reach {pos.max()}, the cache has {cos_cache.shape[0]} rows"
            )
        cos = _work(cos_cache)[pos][:, None]  # [B, 1, S, half]
        sin = _work(sin_cache)[pos][:, None]
        y = xb.copy()
        r = xb[..., :rot]
        if self.interleaved:
            x1, x2 = r[..., 0::2], r[..., 1::2]
            y[..., 0:rot:2] = x1 * cos - x2 * sin
            y[..., 1:rot:2] = x2 * cos + x1 * sin
        else:
            x1, x2 = r[..., :half], r[..., half:]
            y[..., :half] = x1 * cos - x2 * sin
            y[..., half:rot] = x2 * cos + x1 * sin
        if x.ndim == 3:
            y = _merge(y)
        return (_back(y, x.dtype),)
