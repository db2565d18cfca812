"""Self-attention fusion: the scaled dot-product attention subgraph exporters write ->
com.microsoft ``MultiHeadAttention`` or ``Attention``.

Anchored at a last-axis ``Softmax``, the matched subgraph is::

    q4 = heads(q), k4t = heads(k) with its last two axes swapped, v4 = heads(v)
    scores = MatMul(q4, k4t) * c  (or / c), + mask (optional, additive)
    ctx = Reshape(Transpose(MatMul(Softmax(scores), v4), [0, 2, 1, 3]), [B, S, N*H])

where ``heads(t)`` splits ``[B, S, N*H]`` into ``[B, N, S, H]`` in one of two ways:

- separate projections, as BERT and hand-written self-attention export:
  ``Transpose(Reshape(t, [B, S, N, H]), [0, 2, 1, 3])`` (K as ``[0, 2, 3, 1]``, or the
  ``[0, 2, 1, 3]`` Transpose followed by a swap). It becomes
  ``MultiHeadAttention(q, k, v, bias, attention_bias=mask)``, where ``bias`` gathers
  the constant biases added to Q, K and V when all three have one.
- one packed projection split in three, as ``torch.nn.MultiheadAttention``-style
  code exports: ``qkv = MatMul(x, W) + b``, ``Reshape(qkv, [B, S, 3, N, H])``,
  ``Transpose([2, 0, 3, 1, 4])``, ``Split`` on axis 0 and ``Squeeze``. With a constant
  ``W`` and ``b`` it becomes ``Attention(x, W, b, attention_bias=mask)``.

The reshape targets must be constants (fixed shapes, or dimensions fixed with
``add_free_dimension_override_by_name``) so that the head count and size are known
and the reshapes provably split and merge the last axis only. The scale ``c`` must be
a scalar constant; the mask is passed as ``attention_bias`` and added to the scaled
scores, exactly as the unfused graph adds it. onnxruntime wants that bias as
``[B or 1, N or 1, S, T]``, so a mask that broadcasts over queries or keys is
expanded to it first (its shape must then be static).
"""

from __future__ import annotations

import numpy as np

from .fuse_transformer import other_input
from .patterns import MS_DOMAIN, GraphView

__all__ = ["attention_fusion"]


def _perm(t) -> list[int] | None:
    p = t.attr("perm")
    return None if p is None else [int(v) for v in p]


def _reshape_const(view: GraphView, node) -> list[int] | None:
    if node is None or node.op_type != "Reshape" or node.domain != "" or len(node.inputs) != 2:
        return None
    if node.attr("allowzero", 0):
        return None
    c = view.const(node.inputs[1])
    return None if c is None or c.ndim != 1 else [int(v) for v in c]


def _lead_dims_kept(target: list[int], src_shape: list) -> bool:
    """Whether ``target``'s first two entries keep ``src_shape``'s first two dims."""
    for t, s in zip(target[:2], src_shape[:2]):
        if t == 0 or (isinstance(s, int) and t == s):
            continue
        return False
    return True


def _split_heads(view: GraphView, name: str, perm: list[int]):
    """``name`` = Transpose(Reshape(t, [B, S, N, H]), perm): (t, N, H, nodes)."""
    tr = view.producer(name, "Transpose")
    if tr is None or _perm(tr) != perm:
        return None
    rs = view.producer(tr.inputs[0])
    target = _reshape_const(view, rs)
    if target is None or len(target) != 4:
        return None
    t = rs.inputs[0]
    shape = view.shape(t)
    if not shape or len(shape) != 3 or not isinstance(shape[2], int) or not _lead_dims_kept(target, shape):
        return None
    d = shape[2]
    n, h = target[2], target[3]
    if h > 0 and n == -1 and d % h == 0:
        n = d // h
    elif n > 0 and h == -1 and d % n == 0:
        h = d // n
    if n <= 0 or h <= 0 or n * h != d:
        return None
    return t, n, h, [rs, tr]


def _key_heads(view: GraphView, name: str):
    """K split into heads with the last two axes swapped: (k, N, H, nodes)."""
    found = _split_heads(view, name, [0, 2, 3, 1])
    if found is not None:
        return found
    sw = view.producer(name, "Transpose")
    if sw is None or _perm(sw) != [0, 1, 3, 2]:
        return None
    inner = _split_heads(view, sw.inputs[0], [0, 2, 1, 3])
    if inner is None or not view.internal(sw.inputs[0], [sw]):
        return None
    return inner[0], inner[1], inner[2], inner[3] + [sw]


def _scores(view: GraphView, name: str):
    """``name`` = (MatMul(q4, k4t) scaled by a constant) + optional mask:
    (matmul, scale, mask, nodes)."""
    nodes, mask = [], None
    n = view.producer(name)
    if n is not None and n.op_type == "Add" and n.domain == "" and len(n.inputs) == 2:
        for s, m in (n.inputs, n.inputs[::-1]):
            sn = view.producer(s)
            if sn is not None and sn.op_type in ("Mul", "Div", "MatMul"):
                nodes.append(n)
                mask, n = m, sn
                break
        else:
            return None
    if n is None or n.domain != "":
        return None
    scale = None
    if n.op_type in ("Mul", "Div"):
        y = n.inputs[0] if n.op_type == "Div" else None
        if n.op_type == "Mul":
            for a, b in (n.inputs, n.inputs[::-1]):
                if view.scalar(b) is not None:
                    y = a
                    break
        c = view.scalar(other_input(n, y) or "") if y else None
        if c is None or c == 0.0 or n.inputs.count(y) != 1:
            return None
        scale = c if n.op_type == "Mul" else 1.0 / c
        nodes.append(n)
        n = view.producer(y, "MatMul")
    if n is None or n.op_type != "MatMul":
        return None
    nodes.append(n)
    return n, scale, mask, nodes


def _merge_heads(view: GraphView, name: str, d: int, q_shape: list):
    """The Transpose and Reshape turning ``[B, N, S, H]`` at ``name`` into ``[B, S, D]``."""
    tr = view.only_reader(name, "Transpose")
    if tr is None or _perm(tr) != [0, 2, 1, 3]:
        return None
    rs = view.only_reader(tr.outputs[0], "Reshape")
    target = _reshape_const(view, rs)
    if target is None or len(target) != 3 or target[2] not in (d, -1) or not _lead_dims_kept(target, q_shape):
        return None
    return [tr, rs], rs.outputs[0]


def _from_split(view: GraphView, q4: str, k_swapped: str, v4: str):
    sw = view.producer(k_swapped, "Transpose")
    if sw is None or _perm(sw) != [0, 1, 3, 2] or not view.internal(sw.inputs[0], [sw]):
        return None
    squeezes = [view.producer(v, "Squeeze") for v in (q4, sw.inputs[0], v4)]
    if any(s is None for s in squeezes):
        return None
    split = view.producer(squeezes[0].inputs[0], "Split")
    if split is None or split.attr("axis", 0) != 0 or len(split.outputs) != 3:
        return None
    for i, s in enumerate(squeezes):
        axes = s.attr("axes") if len(s.inputs) < 2 else view.const(s.inputs[1])
        if s.inputs[0] != split.outputs[i] or axes is None or [int(a) for a in list(axes)] != [0]:
            return None
    if len(split.inputs) > 1 and split.inputs[1]:
        sizes = view.const(split.inputs[1])
        if sizes is None or [int(v) for v in sizes] != [1, 1, 1]:
            return None
    tr = view.producer(split.inputs[0], "Transpose")
    if tr is None or _perm(tr) != [2, 0, 3, 1, 4]:
        return None
    rs = view.producer(tr.inputs[0])
    target = _reshape_const(view, rs)
    if target is None or len(target) != 5 or target[2] != 3:
        return None
    qkv = rs.inputs[0]
    shape = view.shape(qkv)
    if not shape or len(shape) != 3 or not isinstance(shape[2], int) or shape[2] % 3:
        return None
    d = shape[2] // 3
    n, h = target[3], target[4]
    if n == -1 and h > 0 and d % h == 0:
        n = d // h
    if h == -1 and n > 0 and d % n == 0:
        h = d // n
    if n <= 0 or h <= 0 or n * h != d or not _lead_dims_kept(target, shape):
        return None
    add = view.producer(qkv, "Add")
    if add is None or len(add.inputs) != 2:
        return None
    for b, p in (add.inputs, add.inputs[::-1]):
        mm = view.producer(p, "MatMul")
        bias = view.const(b)
        if mm is None or bias is None or bias.shape != (3 * d,):
            continue
        w = view.const(mm.inputs[1])
        x_shape = view.shape(mm.inputs[0])
        if w is None or w.ndim != 2 or w.shape[1] != 3 * d or not x_shape or len(x_shape) != 3:
            continue
        nodes = [mm, add, rs, tr, split, *squeezes, sw]
        return mm.inputs[0], mm.inputs[1], b, n, h, nodes, x_shape
    return None


def attention_fusion(graph, ctx) -> bool:
    """Fuse scaled dot-product self-attention into MultiHeadAttention or Attention."""
    view = GraphView(graph, ctx)
    for sm in view.candidates("Softmax"):
        if sm.attr("axis", -1) not in (-1, 3):
            continue
        if sm.opset < 13 and sm.attr("axis") is None:
            continue  # the old default axis is 1
        sc = _scores(view, sm.inputs[0])
        if sc is None:
            continue
        qk, scale, mask, score_nodes = sc
        if mask is not None and (view.rank(mask) is None or view.rank(mask) > 4):
            continue
        pv = view.only_reader(sm.outputs[0], "MatMul")
        if pv is None or pv.inputs[0] != sm.outputs[0]:
            continue
        q4, k4t = qk.inputs
        v4 = pv.inputs[1]
        q = _split_heads(view, q4, [0, 2, 1, 3])
        k = _key_heads(view, k4t) if q is not None else None
        v = _split_heads(view, v4, [0, 2, 1, 3]) if k is not None else None
        if q is not None and k is not None and v is not None:
            (qv, n, h, qn), (kv, kn_, kh, kn), (vv, vn_, vh, vn) = q, k, v
            if (kn_, kh) != (n, h) or vn_ != n:
                continue
            q_shape = view.shape(qv)
            merged = _merge_heads(view, pv.outputs[0], n * vh, q_shape)
            if merged is None:
                continue
            tail, out = merged
            fitted = _fit_mask(view, mask, q_shape, view.shape(kv), n, sm.name)
            if fitted is None:
                continue
            mask, expand = fitted
            (qv, kv, vv), bias, bias_nodes = _take_biases(view, [qv, kv, vv], [qn[0], kn[0], vn[0]])
            inputs = [qv, kv, vv, bias, "", mask or ""]
            while inputs and not inputs[-1]:
                inputs.pop()
            node = view.make_node("MultiHeadAttention", inputs, [out], sm.name + "_mha", domain=MS_DOMAIN,
                                  num_heads=n, scale=float(scale if scale is not None else 1.0))
            old = bias_nodes + qn + kn + vn + score_nodes + [sm, pv] + tail
            view.replace(_unique(old), expand + [node])
            continue
        packed = _from_split(view, q4, k4t, v4)
        if packed is None:
            continue
        x, w, b, n, h, packed_nodes, x_shape = packed
        merged = _merge_heads(view, pv.outputs[0], n * h, x_shape)
        if merged is None:
            continue
        tail, out = merged
        fitted = _fit_mask(view, mask, x_shape, x_shape, n, sm.name)
        if fitted is None:
            continue
        mask, expand = fitted
        inputs = [x, w, b, "", "", mask or ""]
        while inputs and not inputs[-1]:
            inputs.pop()
        node = view.make_node("Attention", inputs, [out], sm.name + "_attention", domain=MS_DOMAIN,
                              num_heads=n, scale=float(scale if scale is not None else 1.0))
        view.replace(_unique(packed_nodes + score_nodes + [sm, pv] + tail), expand + [node])
    return view.finish()


def _fit_mask(view: GraphView, mask: str | None, q_shape, k_shape, heads: int, name: str):
    """The mask as onnxruntime's ``attention_bias`` takes it, ``[B or 1, N or 1, S, T]``:
    ``(mask, nodes)``, with an Expand added where the mask broadcasts over queries or
    keys; None where that cannot be known statically."""
    if mask is None:
        return None, []
    shape = view.shape(mask)
    if shape is None or len(shape) > 4 or not q_shape or not k_shape:
        return None
    shape = [1] * (4 - len(shape)) + list(shape)
    s, t, b = q_shape[1], k_shape[1], q_shape[0]
    if not all(isinstance(d, int) for d in shape) or not isinstance(s, int) or not isinstance(t, int):
        return None
    if shape[0] not in (1, b) or shape[1] not in (1, heads) or shape[2] not in (1, s) or shape[3] not in (1, t):
        return None
    if shape[2:] == [s, t] and view.rank(mask) == 4:
        return mask, []
    target = view.add_constant(name + "_bias_shape", np.array(shape[:2] + [s, t], np.int64))
    out = view.graph.unique_name(name + "_bias")
    expand = view.make_node("Expand", [mask, target], [out], name + "_expand_bias")
    expand.opset = view.graph.opsets.get("", 1)
    return out, [expand]


def _take_biases(view: GraphView, values: list[str], readers: list):
    """Q, K and V each ``t + bias`` with a constant 1-D bias read only by its reshape:
    the values before the bias, the bias name for MultiHeadAttention, the Add nodes.
    Where not all three have one, everything stays as it is."""
    found = []
    for v, r in zip(values, readers):
        add = view.producer(v, "Add")
        if add is None or len(add.inputs) != 2 or not view.internal(v, [r]):
            return values, "", []
        shape = view.shape(v)
        for t, b in (add.inputs, add.inputs[::-1]):
            c = view.const(b)
            if c is not None and c.ndim == 1 and view.const(t) is None and view.shape(t) == shape and shape \
                    and c.shape[0] == shape[-1] and view.elem_type(b) == view.elem_type(t):
                found.append((t, c, add))
                break
        else:
            return values, "", []
    if len({id(a) for _, _, a in found}) != 3:
        return values, "", []  # one projection shared by Q, K and V: keep its single Add
    bias = view.add_constant(found[0][2].name + "_qkv_bias", np.concatenate([c for _, c, _ in found]))
    return [t for t, _, _ in found], bias, [a for _, _, a in found]


def _unique(nodes: list) -> list:
    seen: set[int] = set()
    out = []
    for n in nodes:
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    return out
