"""com.microsoft GroupQueryAttention, as decoder-only language models exported for
onnxruntime (its model builder) use it: grouped-query attention over a key/value
cache, with rotary embeddings, a local window, soft capping and attention sinks.

Semantics follow onnxruntime's CPU kernel, checked against it case by case
(tests/cpu/test_group_query_attention.py):

- ``seqlens_k[b]`` is the number of keys of batch entry ``b`` after this step, less
  one (``T_b - 1``); ``total_sequence_length`` is their maximum. A step whose query
  is as long as ``total_sequence_length`` is a first prompt: every entry's past is
  empty and its query rows sit at positions ``0 .. S-1`` (rows at or past ``T_b``
  are right padding and their outputs unspecified). Any other step appends its
  ``S`` rows after the ``T_b - S`` cached ones.
- ``present_key``/``present_value`` are ``[B, kv_num_heads, max(past length,
  total_sequence_length), head_size]``: the cached rows, then the new ones, then
  zeros.
- Query row ``s`` of entry ``b`` sees keys ``0 .. p`` with ``p = T_b - S + s`` (all
  ``T_b`` keys when ``causal=0``), and with ``local_window_size = W > 0`` only the
  last ``W`` of them, its own included.
- Scores are scaled (default ``1/sqrt(head_size)``), soft-capped (``softcap *
  tanh(x / softcap)``), then ``attention_bias`` is added; ``smooth_softmax`` adds a
  zero logit to every row's softmax, ``head_sink`` one logit per head instead.
- Rotary embeddings (``do_rotary``) rotate Q and K at their positions (or, when
  given, ``position_ids``; a first prompt reads only its first element, as
  onnxruntime does) over ``2 * cos_cache.shape[1]`` dimensions, halves or
  interleaved pairs.
- ``q_norm_weight``/``k_norm_weight``: a per-head RMS normalization of Q and K
  before the rotary embedding, as the operator's schema defines it (onnxruntime's
  CPU kernel refuses them; the tests check them against the same model written
  with ``SimplifiedLayerNormalization``).

Not supported, refused when the session is built: quantized caches (``k_quant_type``
/``v_quant_type`` other than ``NONE``, ``k_scale``/``v_scale``), window-sized
caches (``sliding_window_cache``), right-padded query chunks (``query_seqlens``)
and the ``output_qk`` output (``qk_output``).

float16 and bfloat16 are computed in float32 and rounded once.
"""

from __future__ import annotations

import math

import numpy as np
from onnxrt.kernel import Kernel

from ..registry import op

__all__ = ["GroupQueryAttention"]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)

#: input positions of the schema's optional inputs this kernel refuses
_K_SCALE, _V_SCALE, _QUERY_SEQLENS = 12, 13, 16


def _refuse(node) -> str | None:
    a = node.attrs
    for name in ("k_quant_type", "v_quant_type"):
        value = a.get(name, "NONE")
        value = value.decode() if isinstance(value, bytes) else value
        if value != "NONE":
            return f"{name}={value!r} (a quantized key/value cache) is not supported"
    if a.get("sliding_window_cache", 0):
        return "sliding_window_cache=1 (a window-sized cache) is not supported"
    if a.get("qk_output", 0):
        return "qk_output (the output_qk output) is not supported"
    given = lambda i: len(node.inputs) > i and bool(node.inputs[i])
    if given(_K_SCALE) or given(_V_SCALE):
        return "k_scale/v_scale (a quantized key/value cache) are not supported"
    if given(_QUERY_SEQLENS):
        return "query_seqlens (right-padded query chunks) is not supported"
    if len(node.outputs) > 3 and node.outputs[3]:
        return "the output_qk output is not supported"
    return None


def _work(x):
    return x if x.dtype in (np.float32, np.float64) else x.astype(_F32)


def _rotate(x, cos, sin, interleaved):
    """Rotary embedding in place on ``x`` ``[B, S, n, H]``; ``cos``/``sin`` are
    ``[B, S, 1, rot/2]``."""
    half = cos.shape[-1]
    rot = 2 * half
    if interleaved:
        x1, x2 = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
        x[..., 0:rot:2] = x1 * cos - x2 * sin
        x[..., 1:rot:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., :half].copy(), x[..., half:rot].copy()
        x[..., :half] = x1 * cos - x2 * sin
        x[..., half:rot] = x2 * cos + x1 * sin


def _rms(x, weight, eps):
    """Per-head RMS normalization over the last axis, times ``weight``."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    ms += x.dtype.type(eps)
    return x / np.sqrt(ms) * weight


@op("GroupQueryAttention", since=1, domain=MS, accepts=_refuse)
class GroupQueryAttention(Kernel):
    """Grouped-query attention over a key/value cache (``num_heads`` query heads
    sharing ``kv_num_heads`` key/value heads); see the module docstring."""

    def setup(self):
        a = self.attrs
        name = self.node.describe()
        self.n = int(a.get("num_heads", 0))
        self.nkv = int(a.get("kv_num_heads", 0))
        if self.n <= 0 or self.nkv <= 0 or self.n % self.nkv:
            raise ValueError(
                f"{name}: num_heads ({self.n}) must be a positive multiple of kv_num_heads ({self.nkv})"
            )
        self.scale = float(a.get("scale", 0.0))
        self.softcap = float(a.get("softcap", 0.0))
        self.window = int(a.get("local_window_size", -1))
        self.causal = int(a.get("causal", 1))
        if self.causal not in (0, 1):
            raise ValueError(f"{name}: causal must be 0 or 1, got {self.causal}")
        if not self.causal and self.window > 0:
            raise ValueError(f"{name}: local_window_size must be -1 when causal is 0")
        self.rotary = bool(a.get("do_rotary", 0))
        self.interleaved = bool(a.get("rotary_interleaved", 0))
        self.smooth = bool(a.get("smooth_softmax", 0))
        eps = float(a.get("qk_norm_epsilon", 1e-6))
        self.q_eps = float(a.get("q_norm_epsilon", eps))
        self.k_eps = float(a.get("k_norm_epsilon", eps))
        self.n_out = len(self.node.outputs)

    def run(
        self,
        query,
        key=None,
        value=None,
        past_key=None,
        past_value=None,
        seqlens_k=None,
        total_sequence_length=None,
        cos_cache=None,
        sin_cache=None,
        position_ids=None,
        attention_bias=None,
        head_sink=None,
        k_scale=None,
        v_scale=None,
        q_norm_weight=None,
        k_norm_weight=None,
        query_seqlens=None,
    ):
        name = self.node.describe()
        n, nkv = self.n, self.nkv
        if query.ndim != 3:
            raise ValueError(f"{name}: query must be (batch, sequence, hidden), got shape {query.shape}")
        b, s, d = query.shape
        qf = _work(query)
        if key is None and value is None:
            if d % (n + 2 * nkv):
                raise ValueError(
                    f"{name}: packed QKV width {d} is not (num_heads + 2 * kv_num_heads) * head_size"
                )
            h = d // (n + 2 * nkv)
            q, k, v = qf[..., : n * h], qf[..., n * h : (n + nkv) * h], qf[..., (n + nkv) * h :]
        elif key is None or value is None:
            raise ValueError(f"{name}: key and value go together (neither for packed QKV)")
        else:
            if d % n:
                raise ValueError(f"{name}: query hidden size {d} is not divisible by num_heads {n}")
            h = d // n
            for what, t in (("key", key), ("value", value)):
                if t.shape != (b, s, nkv * h):
                    raise ValueError(
                        f"{name}: {what} must have shape ({b}, {s}, {nkv * h}), got {t.shape}"
                    )
            q, k, v = qf, _work(key), _work(value)
        q = q.reshape(b, s, n, h)
        k = k.reshape(b, s, nkv, h)
        v = v.reshape(b, s, nkv, h)

        if seqlens_k is None or total_sequence_length is None:
            raise ValueError(f"{name}: seqlens_k and total_sequence_length are required")
        seqlens = np.asarray(seqlens_k)
        if seqlens.shape != (b,):
            raise ValueError(f"{name}: seqlens_k must have shape ({b},), got {seqlens.shape}")
        tot = np.asarray(total_sequence_length)
        if tot.size != 1:
            raise ValueError(f"{name}: total_sequence_length must be a scalar, got shape {tot.shape}")
        total = int(tot.reshape(()))
        lengths = seqlens.astype(np.int64) + 1  # T_b, keys after this step
        past_len = 0
        if (past_key is None) != (past_value is None):
            raise ValueError(f"{name}: past_key and past_value go together")
        if past_key is not None:
            want = (b, nkv, past_key.shape[2] if past_key.ndim == 4 else -1, h)
            if past_key.ndim != 4 or past_key.shape != want or past_value.shape != want:
                raise ValueError(
                    f"{name}: past_key {past_key.shape} and past_value {past_value.shape} must be "
                    f"(batch {b}, kv_num_heads {nkv}, length, head_size {h})"
                )
            past_len = past_key.shape[2]
        cache = max(past_len, total)
        first = s == total
        if b and (lengths.min() < 1 or lengths.max() > total):
            raise ValueError(
                f"{name}: seqlens_k + 1 must lie in [1, total_sequence_length {total}], got {seqlens.tolist()}"
            )
        if first:
            starts = np.zeros(b, np.int64)
        else:
            starts = lengths - s  # cached rows before this step's
            if b and starts.min() < 0:
                raise ValueError(
                    f"{name}: seqlens_k + 1 ({lengths.tolist()}) must be at least the sequence length {s}"
                )
            if b and starts.max() > past_len:
                raise ValueError(
                    f"{name}: seqlens_k ({seqlens.tolist()}) needs {int(starts.max())} cached rows, "
                    f"past_key holds {past_len}"
                )

        if (q_norm_weight is None) != (k_norm_weight is None):
            raise ValueError(f"{name}: q_norm_weight and k_norm_weight go together")
        if q_norm_weight is not None:
            for what, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
                if w.shape != (h,):
                    raise ValueError(f"{name}: {what} must have shape ({h},), got {w.shape}")
            q = _rms(q, _work(q_norm_weight), self.q_eps)
            k = _rms(k, _work(k_norm_weight), self.k_eps)
        else:
            q, k = q.copy(), k.copy()  # rotated in place below; never the caller's arrays

        if self.rotary:
            self._rotate(q, k, cos_cache, sin_cache, position_ids, starts, first, b, s, h, name)

        dt = q.dtype
        present_k = np.zeros((b, nkv, cache, h), dt)
        present_v = np.zeros((b, nkv, cache, h), dt)
        for i in range(b):
            p0 = int(starts[i])
            if p0:
                present_k[i, :, :p0] = past_key[i, :, :p0]
                present_v[i, :, :p0] = past_value[i, :, :p0]
            rows = min(s, cache - p0)
            present_k[i, :, p0 : p0 + rows] = k[i, :rows].transpose(1, 0, 2)
            present_v[i, :, p0 : p0 + rows] = v[i, :rows].transpose(1, 0, 2)

        bias = None
        if attention_bias is not None:
            ab = attention_bias
            if ab.ndim != 4 or ab.shape[0] not in (1, b) or ab.shape[1] not in (1, n) or ab.shape[2] != s \
                    or ab.shape[3] < int(lengths.max(initial=0)):
                raise ValueError(
                    f"{name}: attention_bias must be (batch or 1, num_heads or 1, {s}, {total}), got {ab.shape}"
                )
            bias = _work(ab)
        sink = None
        if head_sink is not None:
            if head_sink.shape != (n,):
                raise ValueError(f"{name}: head_sink must have shape ({n},), got {head_sink.shape}")
            sink = _work(head_sink).reshape(n, 1, 1)
        elif self.smooth:
            sink = np.zeros((n, 1, 1), dt)

        scale = dt.type(self.scale if self.scale else 1.0 / math.sqrt(h))
        groups = n // nkv
        out = np.empty((b, s, n, h), dt)
        for i in range(b):
            t = int(lengths[i])
            keys = present_k[i, :, :t]  # [nkv, t, h]
            qi = q[i].transpose(1, 0, 2).reshape(nkv, groups * s, h)
            scores = np.matmul(qi, keys.swapaxes(-1, -2)).reshape(n, s, t)
            scores *= scale
            if self.softcap > 0:
                cap = dt.type(self.softcap)
                scores /= cap
                np.tanh(scores, out=scores)
                scores *= cap
            if bias is not None:
                scores += bias[min(i, bias.shape[0] - 1), :, :, :t]
            probs = self._softmax(scores, self._allowed(int(starts[i]), s, t), sink)
            ctx = np.matmul(probs.reshape(nkv, groups * s, t), present_v[i, :, :t])
            out[i] = ctx.reshape(n, s, h).transpose(1, 0, 2)

        odt = query.dtype
        outs = [out.reshape(b, s, n * h).astype(odt, copy=False)]
        if self.n_out > 1:
            outs.append(present_k.astype(odt, copy=False))
        if self.n_out > 2:
            outs.append(present_v.astype(odt, copy=False))
        return tuple(outs)

    def _rotate(self, q, k, cos_cache, sin_cache, position_ids, starts, first, b, s, h, name):
        """Rotate ``q`` and ``k`` in place at their positions."""
        if cos_cache is None or sin_cache is None:
            raise ValueError(f"{name}: do_rotary=1 needs cos_cache and sin_cache")
        if cos_cache.ndim != 2 or cos_cache.shape != sin_cache.shape or 2 * cos_cache.shape[1] > h:
            raise ValueError(
                f"{name}: cos_cache {cos_cache.shape} and sin_cache {sin_cache.shape} must be equal "
                f"(positions, at most head_size / 2 = {h // 2})"
            )
        if position_ids is None:
            pos = starts[:, None] + np.arange(s)[None]
        else:
            pid = np.asarray(position_ids)
            if first:
                # a first prompt reads only the first position id, as onnxruntime does
                if pid.size == 0:
                    raise ValueError(f"{name}: position_ids is empty")
                pos = np.broadcast_to(int(pid.reshape(-1)[0]) + np.arange(s), (b, s))
            else:
                if pid.shape != (b, s):
                    raise ValueError(f"{name}: position_ids must have shape ({b}, {s}), got {pid.shape}")
                pos = pid
        if pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0]):
            raise IndexError(
                f"{name}: rotary positions reach {int(pos.max())}, cos_cache has {cos_cache.shape[0]} rows"
            )
        cos = _work(cos_cache)[pos][:, :, None].astype(q.dtype, copy=False)
        sin = _work(sin_cache)[pos][:, :, None].astype(q.dtype, copy=False)
        _rotate(q, cos, sin, self.interleaved)
        _rotate(k, cos, sin, self.interleaved)

    def _allowed(self, start, s, t):
        """``[s, t]`` keys each query row of an entry sees, or None for all."""
        if not self.causal:
            return None
        cols = np.arange(t)[None, :]
        row = start + np.arange(s)[:, None]
        ok = cols <= row
        if self.window > 0:
            ok &= cols > row - self.window
        return ok

    @staticmethod
    def _softmax(scores, allowed, sink):
        """Softmax over the keys each row sees (the others get 0), with an extra
        logit per head (``sink`` ``[n, 1, 1]``) in the denominator when given. A row
        that sees no key (a padding row of a first prompt) comes out as zeros."""
        if allowed is not None:
            np.copyto(scores, scores.dtype.type(-np.inf), where=~allowed)
        top = scores.max(axis=-1, keepdims=True)
        if sink is not None:
            top = np.maximum(top, sink)
        top[~np.isfinite(top)] = 0  # rows with no key: exp(-inf - 0) = 0, no NaN
        scores -= top
        np.exp(scores, out=scores)
        den = scores.sum(axis=-1, keepdims=True)
        if sink is not None:
            den += np.exp(sink - top)
        den[den == 0] = 1
        scores /= den
        return scores
