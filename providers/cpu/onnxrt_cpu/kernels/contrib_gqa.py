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

- ``sliding_window_cache=1``: a window-sized cache whose capacity is past_key's
  length, laid out as the schema says (:meth:`GroupQueryAttention._sliding`).

Not supported, refused when the session is built: quantized caches (``k_quant_type``
/``v_quant_type`` other than ``NONE``, ``k_scale``/``v_scale``), right-padded query
chunks (``query_seqlens``) and the ``output_qk`` output (``qk_output``).

float16 and bfloat16 are computed in float32 and rounded once.
"""

from __future__ import annotations

import math

import numpy as np
from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import check_allocation

from .. import native
from ..parallel import thread_count
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


def _rotation_tables(cos_cache, sin_cache, interleaved):
    """``(C, S)``, each ``[positions, rot]``, so that rotating ``x`` (its first ``rot``
    values) at position ``p`` is ``x * C[p] + swapped(x) * S[p]``, ``swapped`` exchanging
    the two halves (or the two values of each interleaved pair)."""
    cos, sin = _work(cos_cache), _work(sin_cache)
    if interleaved:
        c = np.repeat(cos, 2, axis=-1)
        s = np.stack([-sin, sin], axis=-1).reshape(sin.shape[0], -1)
    else:
        c = np.concatenate([cos, cos], axis=-1)
        s = np.concatenate([-sin, sin], axis=-1)
    return c, s


def _rotate(x, c, s, interleaved):
    """Rotary embedding in place on the first ``rot`` values of ``x``'s last axis;
    ``c``/``s`` broadcast to ``x[..., :rot]`` (:func:`_rotation_tables`)."""
    rot = c.shape[-1]
    r = x[..., :rot]
    pairs = r.reshape(r.shape[:-1] + ((rot // 2, 2) if interleaved else (2, rot // 2)))
    swapped = np.ascontiguousarray(pairs[..., ::-1] if interleaved else pairs[..., ::-1, :]).reshape(r.shape)
    swapped *= s
    r *= c
    r += swapped


def _rms(x, weight, eps):
    """Per-head RMS normalization over the last axis, times ``weight``, in place."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    ms += x.dtype.type(eps)
    np.sqrt(ms, out=ms)
    x /= ms
    x *= weight


@op("GroupQueryAttention", since=1, domain=MS, accepts=_refuse)
class GroupQueryAttention(Kernel):
    """Grouped-query attention over a key/value cache (``num_heads`` query heads
    sharing ``kv_num_heads`` key/value heads); see the module docstring."""

    def setup(self):
        a = self.attrs
        name = self._name = self.node.describe()
        self.n = int(a.get("num_heads", 0))
        self.nkv = int(a.get("kv_num_heads", 0))
        if self.n <= 0 or self.nkv <= 0 or self.n % self.nkv:
            raise ValueError(
                f"{name}: num_heads ({self.n}) must be a positive multiple of kv_num_heads ({self.nkv})"
            )
        self.scale = float(a.get("scale", 0.0))
        self.softcap = float(a.get("softcap", 0.0))
        self.window = int(a.get("local_window_size", -1))
        self.sliding = a.get("sliding_window_cache", 0) == 1
        if self.sliding and self.window <= 0:
            raise ValueError(f"{name}: sliding_window_cache=1 needs local_window_size > 0")
        self.causal = int(a.get("causal", 1))
        if self.causal not in (0, 1):
            raise ValueError(f"{name}: causal must be 0 or 1, got {self.causal}")
        if not self.causal and self.window > 0:
            raise ValueError(f"{name}: local_window_size must be -1 when causal is 0")
        # flags are on only at 1, as onnxruntime reads them (its saved models write -1
        # for smooth_softmax left unset)
        self.rotary = a.get("do_rotary", 0) == 1
        self.interleaved = a.get("rotary_interleaved", 0) == 1
        self.smooth = a.get("smooth_softmax", 0) == 1
        eps = float(a.get("qk_norm_epsilon", 1e-6))
        self.q_eps = float(a.get("q_norm_epsilon", eps))
        self.k_eps = float(a.get("k_norm_epsilon", eps))
        self.n_out = len(self.node.outputs)
        c = self.node.constants
        # constant caches (as model builders write them): the rotation tables once
        self._tables = None
        if self.rotary and 7 in c and 8 in c and c[7].ndim == 2 and c[7].shape == c[8].shape:
            self._tables = (c[7], c[8], _rotation_tables(c[7], c[8], self.interleaved))

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
        name = self._name
        n, nkv = self.n, self.nkv
        if query.ndim != 3:
            raise ValueError(f"{name}: query must be (batch, sequence, hidden), got shape {query.shape}")
        b, s, d = query.shape
        qf = _work(query)
        packed = key is None and value is None
        if packed:
            if d % (n + 2 * nkv):
                raise ValueError(
                    f"{name}: packed QKV width {d} is not (num_heads + 2 * kv_num_heads) * head_size"
                )
            h = d // (n + 2 * nkv)
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
        dt = qf.dtype

        if seqlens_k is None or total_sequence_length is None:
            raise ValueError(f"{name}: seqlens_k and total_sequence_length are required")
        if seqlens_k.shape != (b,):
            raise ValueError(f"{name}: seqlens_k must have shape ({b},), got {seqlens_k.shape}")
        if total_sequence_length.size != 1:
            raise ValueError(
                f"{name}: total_sequence_length must be a scalar, got shape {total_sequence_length.shape}"
            )
        total = int(total_sequence_length.reshape(()))
        lengths = [int(x) + 1 for x in seqlens_k.tolist()]  # T_b, keys after this step
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
        if b and (min(lengths) < 1 or max(lengths) > total):
            raise ValueError(
                f"{name}: seqlens_k + 1 must lie in [1, total_sequence_length {total}], got {lengths}"
            )
        # cached rows before this step's, per entry
        starts = [0] * b if first else [t - s for t in lengths]
        if b and not first:
            if min(starts) < 0:
                raise ValueError(f"{name}: seqlens_k + 1 ({lengths}) must be at least the sequence length {s}")
            if max(starts) > past_len and not self.sliding:
                raise ValueError(
                    f"{name}: seqlens_k ({seqlens_k.tolist()}) needs {max(starts)} cached rows, "
                    f"past_key holds {past_len}"
                )

        if (q_norm_weight is None) != (k_norm_weight is None):
            raise ValueError(f"{name}: q_norm_weight and k_norm_weight go together")
        if (native.K is not None and dt == np.float32 and q_norm_weight is None and not self.sliding
                and attention_bias is None and head_sink is None and not self.smooth and self.softcap <= 0
                and position_ids is None and b):
            outs = self._native(qf, key, value, packed, past_key, past_value, cos_cache, sin_cache, starts, lengths,
                                b, s, h, cache, past_len, query.dtype)
            if outs is not None:
                return outs
        if packed:
            # Q and K together, a copy: normalized and rotated in place below
            qk = qf[..., : (n + nkv) * h].reshape(b, s, n + nkv, h).copy()
            v = qf[..., (n + nkv) * h :].reshape(b, s, nkv, h)
        else:
            qk = np.empty((b, s, n + nkv, h), qf.dtype)
            qk[:, :, :n] = qf.reshape(b, s, n, h)
            qk[:, :, n:] = _work(key).reshape(b, s, nkv, h)
            v = _work(value).reshape(b, s, nkv, h)
        dt = qk.dtype
        q, k = qk[:, :, :n], qk[:, :, n:]
        if q_norm_weight is not None:
            for what, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
                if w.shape != (h,):
                    raise ValueError(f"{name}: {what} must have shape ({h},), got {w.shape}")
            _rms(q, _work(q_norm_weight), self.q_eps)
            _rms(k, _work(k_norm_weight), self.k_eps)
        if self.rotary:
            self._rotate(qk, cos_cache, sin_cache, position_ids, starts, first, b, s, h, name)
        if self.sliding:
            return self._sliding(q, k, v, past_key, past_value, lengths, starts, attention_bias, head_sink,
                                 total, query.dtype)

        # the cache's length comes from total_sequence_length, a value: checked first
        check_allocation((2 * b, nkv, cache, h), dt, f"{name} present_key and present_value")
        present_k = np.zeros((b, nkv, cache, h), dt)
        present_v = np.zeros((b, nkv, cache, h), dt)
        if b and min(starts) == max(starts):  # every entry's new rows at the same place
            p0 = starts[0]
            rows = min(s, cache - p0)
            if p0:
                present_k[:, :, :p0] = past_key[:, :, :p0]
                present_v[:, :, :p0] = past_value[:, :, :p0]
            present_k[:, :, p0 : p0 + rows] = k[:, :rows].transpose(0, 2, 1, 3)
            present_v[:, :, p0 : p0 + rows] = v[:, :rows].transpose(0, 2, 1, 3)
        else:
            for i in range(b):
                p0 = starts[i]
                if p0:
                    present_k[i, :, :p0] = past_key[i, :, :p0]
                    present_v[i, :, :p0] = past_value[i, :, :p0]
                rows = min(s, cache - p0)
                present_k[i, :, p0 : p0 + rows] = k[i, :rows].transpose(1, 0, 2)
                present_v[i, :, p0 : p0 + rows] = v[i, :rows].transpose(1, 0, 2)

        bias, sink = self._bias_and_sink(attention_bias, head_sink, b, n, s, lengths, total, dt)
        groups = n // nkv
        # every entry at once over the longest entry's keys; an entry's keys past its
        # own length are left out of its softmax (zeros in the cache, masked here)
        t = max(lengths, default=0)
        qb = q.reshape(b, s, nkv, groups, h).transpose(0, 2, 3, 1, 4).reshape(b, nkv, groups * s, h)
        scores = self._scaled(np.matmul(qb, present_k[:, :, :t].swapaxes(-1, -2)).reshape(b, n, s, t), h)
        if bias is not None:
            scores += bias[..., :t]
        probs = self._softmax(scores, self._allowed(starts, lengths, s, t), sink)
        ctx = np.matmul(probs.reshape(b, nkv, groups * s, t), present_v[:, :, :t])
        return self._outputs(ctx.reshape(b, n, s, h).transpose(0, 2, 1, 3), present_k, present_v, query.dtype)

    def _native(self, qf, key, value, packed, past_key, past_value, cos_cache, sin_cache, starts, lengths, b, s, h,
                cache, past_len, odt):
        """The cache update and the attention by the compiled kernel, for float32 without
        a bias, sink, soft cap or Q/K norm and with positions from the cache's length;
        None where it does not take the node (the numpy path below then also names
        any error). A generation step of a tiny Llama (8 entries, 4 heads of 16): 65 ->
        about 20 us a node, where the numpy path's forty array calls cost more than
        the work."""
        n, nkv = self.n, self.nkv
        tables = None
        if self.rotary:
            if cos_cache is None or sin_cache is None or cos_cache.ndim != 2 or cos_cache.shape != sin_cache.shape \
                    or 2 * cos_cache.shape[1] > h or s + max(starts) > cos_cache.shape[0]:
                return None
            kept = self._tables
            if kept is not None and kept[0] is cos_cache and kept[1] is sin_cache:
                tables = kept[2]
            else:
                tables = _rotation_tables(cos_cache, sin_cache, self.interleaved)
            tables = tuple(np.ascontiguousarray(t, dtype=np.float32) for t in tables)
        if past_key is not None and (past_key.dtype != np.float32 or past_value.dtype != np.float32):
            return None
        check_allocation((2 * b, nkv, cache, h), np.float32, f"{self._name} present_key and present_value")
        if packed:
            q = k = v = np.ascontiguousarray(qf)
            width = (n + 2 * nkv) * h
            offsets = (0, n * h, (n + nkv) * h, width, width, width)
        else:
            q = np.ascontiguousarray(qf)
            k, v = (np.ascontiguousarray(t, dtype=np.float32) for t in (key, value))
            offsets = (0, 0, 0, n * h, nkv * h, nkv * h)
        present_k = np.empty((b, nkv, cache, h), np.float32)
        present_v = np.empty((b, nkv, cache, h), np.float32)
        out = np.empty((b, s, n, h), np.float32)
        pk = None if past_key is None else np.ascontiguousarray(past_key)
        pv = None if past_value is None else np.ascontiguousarray(past_value)
        rot = 0 if tables is None else tables[0].shape[1]
        positions = 0 if tables is None else tables[0].shape[0]
        scale = self.scale if self.scale else 1.0 / math.sqrt(h)
        # a generation step of a small model is a few microseconds of work: on one
        # thread (the tiny Llama's node 55 -> 45 us), more only from 1M multiply-adds
        work = b * n * s * cache * h
        native.K.gqa(q, k, v, offsets, pk, pv, present_k, present_v, out,
                     None if tables is None else tables[0], None if tables is None else tables[1],
                     np.asarray(starts, np.int64), np.asarray(lengths, np.int64),
                     (b, s, n, nkv, h, rot, cache, past_len, positions, int(self.interleaved), self.window,
                      self.causal, scale), thread_count() if work >= 1 << 20 else 1)
        return self._outputs(out, present_k, present_v, odt)

    def _bias_and_sink(self, attention_bias, head_sink, b, n, s, lengths, total, dt):
        """``attention_bias`` checked and as float, and the extra softmax logit per head
        (``head_sink``, or zeros for ``smooth_softmax``), or None for either."""
        name = self._name
        bias = None
        if attention_bias is not None:
            ab = attention_bias
            if ab.ndim != 4 or ab.shape[0] not in (1, b) or ab.shape[1] not in (1, n) or ab.shape[2] != s \
                    or ab.shape[3] < max(lengths, default=0):
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
        return bias, sink

    def _scaled(self, scores, h):
        """The scores scaled (default ``1/sqrt(head_size)``) and soft-capped, in place."""
        dt = scores.dtype
        scores *= dt.type(self.scale if self.scale else 1.0 / math.sqrt(h))
        if self.softcap > 0:
            cap = dt.type(self.softcap)
            scores /= cap
            np.tanh(scores, out=scores)
            scores *= cap
        return scores

    def _outputs(self, out, present_k, present_v, odt):
        """``(output [B, S, N*H], present_key, present_value)`` in the input's type, as
        many as the node asks for; ``out`` is ``[B, S, N, H]``."""
        b, s = out.shape[:2]
        outs = [out.reshape(b, s, -1).astype(odt, copy=False)]
        if self.n_out > 1:
            outs.append(present_k.astype(odt, copy=False))
        if self.n_out > 2:
            outs.append(present_v.astype(odt, copy=False))
        return tuple(outs)

    def _sliding(self, q, k, v, past_key, past_value, lengths, starts, attention_bias, head_sink, total, odt):
        """Attention over a window-sized cache (``sliding_window_cache=1``), entry by
        entry: the cache's capacity ``C`` is past_key's length, and after a step its
        first ``L(T)`` rows hold the entry's last ``L(T)`` positions, where ``L(T) = T``
        up to ``C`` and ``T - G * ceil((T - C) / G)`` past it, ``G = C - W + 1`` (the
        schema's layout: the window stays resident, ``G`` positions are evicted at
        once). The past's resident rows and the step's new ones are joined first, so a
        step longer than the free rows still reads every key its window needs."""
        name = self._name
        b, s, n, h = q.shape
        nkv = k.shape[2]
        w = self.window
        if past_key is None:
            raise ValueError(f"{name}: sliding_window_cache=1 needs past_key and past_value (their length is the "
                             f"cache's capacity)")
        cap = past_key.shape[2]
        if cap < w:
            raise ValueError(f"{name}: the cache's capacity {cap} is below local_window_size {w}")
        evict = cap - w + 1

        def resident(t):
            return t if t <= cap else t - evict * -(-(t - cap) // evict)

        dt = q.dtype
        check_allocation((2 * b, nkv, cap, h), dt, f"{name} present_key and present_value")
        present_k = np.zeros((b, nkv, cap, h), dt)
        present_v = np.zeros((b, nkv, cap, h), dt)
        bias, sink = self._bias_and_sink(attention_bias, head_sink, b, n, s, lengths, total, dt)
        groups = n // nkv
        out = np.empty((b, s, n, h), dt)
        for i in range(b):
            t, p = lengths[i], starts[i]
            kept = resident(p) if p else 0  # past rows 0 .. kept-1: positions p-kept .. p-1
            base = p - kept
            keys = np.concatenate([_work(past_key[i, :, :kept]), k[i].transpose(1, 0, 2)], axis=1)
            vals = np.concatenate([_work(past_value[i, :, :kept]), v[i].transpose(1, 0, 2)], axis=1)
            span = t - base  # positions base .. t-1; a first prompt's padding rows past t are no keys
            keys, vals = keys[:, :span], vals[:, :span]
            qi = q[i].transpose(1, 0, 2).reshape(nkv, groups * s, h)
            scores = self._scaled(np.matmul(qi, keys.swapaxes(-1, -2)).reshape(n, s, span), h)
            if bias is not None:  # its last axis is the absolute key position
                scores += bias[min(i, bias.shape[0] - 1), :, :, base:t]
            pos = base + np.arange(span)[None, :]
            row = p + np.arange(s)[:, None]
            allowed = (pos <= row) & (pos > row - w)
            probs = self._softmax(scores, allowed[None], sink)
            ctx = np.matmul(probs.reshape(nkv, groups * s, span), vals)
            out[i] = ctx.reshape(n, s, h).transpose(1, 0, 2)
            size = resident(t)
            present_k[i, :, :size] = keys[:, span - size :]
            present_v[i, :, :size] = vals[:, span - size :]
        return self._outputs(out, present_k, present_v, odt)

    def _rotate(self, qk, cos_cache, sin_cache, position_ids, starts, first, b, s, h, name):
        """Rotate Q and K (``qk`` ``[B, S, heads, H]``) in place at their positions."""
        if cos_cache is None or sin_cache is None:
            raise ValueError(f"{name}: do_rotary=1 needs cos_cache and sin_cache")
        if cos_cache.ndim != 2 or cos_cache.shape != sin_cache.shape or 2 * cos_cache.shape[1] > h:
            raise ValueError(
                f"{name}: cos_cache {cos_cache.shape} and sin_cache {sin_cache.shape} must be equal "
                f"(positions, at most head_size / 2 = {h // 2})"
            )
        run = None  # positions p0 .. p0 + S - 1 for every entry: a slice of the tables
        if position_ids is None:
            if b == 1 or first or min(starts) == max(starts):
                run = starts[0] if b else 0
            else:
                pos = np.asarray(starts)[:, None] + np.arange(s)[None]
        else:
            if first:
                # a first prompt reads only the first position id, as onnxruntime does
                if position_ids.size == 0:
                    raise ValueError(f"{name}: position_ids is empty")
                run = int(position_ids.reshape(-1)[0])
                if run < 0 or run + s > cos_cache.shape[0]:
                    raise IndexError(
                        f"{name}: rotary positions reach {run + s - 1}, cos_cache has {cos_cache.shape[0]} rows"
                    )
            else:
                if position_ids.shape != (b, s):
                    raise ValueError(
                        f"{name}: position_ids must have shape ({b}, {s}), got {position_ids.shape}"
                    )
                pos = position_ids
            if run is None and pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0]):
                raise IndexError(
                    f"{name}: rotary positions reach {int(pos.max())}, cos_cache has {cos_cache.shape[0]} rows"
                )
        if position_ids is None and (s + max(starts, default=0) > cos_cache.shape[0]):
            raise IndexError(
                f"{name}: rotary positions reach {s + max(starts) - 1}, cos_cache has {cos_cache.shape[0]} rows"
            )
        kept = self._tables
        if kept is not None and kept[0] is cos_cache and kept[1] is sin_cache:
            c, sn = kept[2]
        else:
            c, sn = _rotation_tables(cos_cache, sin_cache, self.interleaved)
        if run is not None:
            c, sn = c[run : run + s][None, :, None], sn[run : run + s][None, :, None]
        else:
            c, sn = c[pos][:, :, None], sn[pos][:, :, None]
        _rotate(qk, c.astype(qk.dtype, copy=False), sn.astype(qk.dtype, copy=False), self.interleaved)

    def _allowed(self, starts, lengths, s, t):
        """``[B, 1, S, t]``: the keys each query row of each entry sees, or None for all."""
        same = min(lengths, default=t) == t
        if same and (not self.causal or (s == 1 and (self.window <= 0 or self.window >= t))):
            return None  # every row sees every key (a generation step)
        cols = np.arange(t)
        ok = cols < np.asarray(lengths).reshape(-1, 1, 1, 1)
        if self.causal:
            row = np.asarray(starts).reshape(-1, 1, 1, 1) + np.arange(s).reshape(1, 1, s, 1)
            ok = ok & (cols <= row)
            if self.window > 0:
                ok &= cols > row - self.window
        return ok

    @staticmethod
    def _softmax(scores, allowed, sink):
        """Softmax over the keys each row sees (the others get 0), with an extra
        logit per head (``sink`` ``[n, 1, 1]``) in the denominator when given. A row
        that sees no key (a padding row of a first prompt) comes out as zeros."""
        if allowed is None and sink is None:
            # the reductions as ufunc calls: a generation step's rows are short, and
            # the array methods' extra Python costs as much as the work
            scores -= np.maximum.reduce(scores, axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= np.add.reduce(scores, axis=-1, keepdims=True)
            return scores
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
