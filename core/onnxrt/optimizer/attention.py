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

The head count and size in the reshape targets must be constants, so that the
reshapes provably split and merge the last axis only; their batch and sequence
entries may be constants or, with dynamic axes, dims computed at run time from a
tensor whose shape names the same symbols (``Unsqueeze(Gather(Shape(x), 0))``). A
packed projection that is not a MatMul with a constant weight (a quantized one, say)
becomes ``Split`` into Q, K and V and ``MultiHeadAttention``. The scale ``c`` must be
a scalar constant; the mask is passed as ``attention_bias`` and added to the scaled
scores, exactly as the unfused graph adds it. onnxruntime wants that bias as
``[B or 1, N or 1, S, T]``, so a mask that broadcasts over queries or keys is
expanded to it first (to a target read from the inputs' shapes at run time where
the sequence lengths are dynamic).
"""

from __future__ import annotations

import numpy as np

from .fuse_transformer import other_input
from .patterns import MS_DOMAIN, GraphView, trim_inputs

__all__ = ["attention_fusion"]


def _perm(t) -> list[int] | None:
    p = t.attr("perm")
    return None if p is None else [int(v) for v in p]


def _reshape_const(view: GraphView, node) -> list | None:
    """A Reshape's target: its entries ints, or the symbolic name of a dimension the
    target copies from some tensor's shape at run time (:func:`_shape_entries`)."""
    if node is None or node.op_type != "Reshape" or node.domain != "" or len(node.inputs) != 2:
        return None
    if node.attr("allowzero", 0):
        return None
    c = view.const(node.inputs[1])
    if c is not None:
        return None if c.ndim != 1 else [int(v) for v in c]
    cat = view.producer(node.inputs[1], "Concat")
    if cat is None or int(cat.attr("axis", 0)) not in (0, -1):
        return None
    target = []
    for part in cat.inputs:
        entries = _shape_entries(view, part)
        if entries is None:
            return None
        target += entries
    return target


def _shape_entries(view: GraphView, name: str) -> list | None:
    """The 1-D int64 ``name`` as target entries: a constant's values, or the dims that
    ``Unsqueeze(Gather(Shape(u), i))`` or ``Gather(Shape(u), [i, ...])`` pick from ``u``
    where its shape names them (a symbol such as ``batch``, or an int). Two tensors
    whose dims carry one symbol have the same size there, so a target entry copying
    a symbolic dim of the tensor it reshapes keeps that dim, as a 0 entry would."""
    c = view.const(name)
    if c is not None:
        return [int(v) for v in c.reshape(-1)] if c.ndim == 1 and c.dtype.kind in "iu" else None
    node = view.producer(name)
    squeeze = node is not None and node.op_type == "Unsqueeze" and node.domain == ""
    if squeeze:
        axes = node.attr("axes") if len(node.inputs) < 2 else view.const(node.inputs[1])
        if axes is None or [int(a) for a in list(np.asarray(axes).reshape(-1))] != [0]:
            return None
        node = view.producer(node.inputs[0])
    if node is None or node.op_type != "Gather" or node.domain != "" or int(node.attr("axis", 0)) != 0:
        return None
    idx = view.const(node.inputs[1])
    shape_node = view.producer(node.inputs[0], "Shape")
    if idx is None or shape_node is None or idx.ndim != (0 if squeeze else 1) or idx.dtype.kind not in "iu":
        return None
    if shape_node.attr("start", 0) or shape_node.attr("end") is not None:
        return None
    dims = view.shape(shape_node.inputs[0])
    if not dims:
        return None
    out = []
    for i in idx.reshape(-1):
        i = int(i)
        if not -len(dims) <= i < len(dims) or dims[i] is None:
            return None
        out.append(dims[i])
    return out


def _lead_dims_kept(target: list, src_shape: list) -> bool:
    """Whether ``target``'s first two entries keep ``src_shape``'s first two dims."""
    for t, s in zip(target[:2], src_shape[:2]):
        if t == 0 or (s is not None and t == s):
            continue
        return False
    return True


def _ints(*entries) -> bool:
    return all(isinstance(e, int) for e in entries)


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
    if not _ints(n, h):
        return None
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
                if view.scalar(b, operand=a) is not None:
                    y = a
                    break
        c = view.scalar(other_input(n, y) or "", operand=y) if y else None
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
    if (target is None or len(target) != 3 or not _ints(target[2]) or target[2] not in (d, -1)
            or not _lead_dims_kept(target, q_shape)):
        return None
    return [tr, rs], rs.outputs[0]


def _split_in_three(view: GraphView, values: list[str], axis: int):
    """``values`` = Squeeze(Split(t, axis)[i], [axis]) for i = 0, 1, 2: (t, nodes)."""
    squeezes = [view.producer(v, "Squeeze") for v in values]
    if any(s is None for s in squeezes):
        return None
    split = view.producer(squeezes[0].inputs[0], "Split")
    if split is None or split.attr("axis", 0) != axis or len(split.outputs) != 3:
        return None
    for i, s in enumerate(squeezes):
        axes = s.attr("axes") if len(s.inputs) < 2 else view.const(s.inputs[1])
        if s.inputs[0] != split.outputs[i] or axes is None or [int(a) for a in list(axes)] != [axis]:
            return None
    if len(split.inputs) > 1 and split.inputs[1]:
        sizes = view.const(split.inputs[1])
        if sizes is None or [int(v) for v in sizes] != [1, 1, 1]:
            return None
    return split.inputs[0], [split, *squeezes]


def _packed_heads(view: GraphView, q4: str, k_swapped: str, v4: str):
    """Q, K (last two axes swapped) and V in heads from one ``[B, S, 3, N, H]`` tensor:
    (its Reshape node, the nodes between). Either the whole is transposed to
    ``[3, B, N, S, H]`` and split on axis 0 (K then swapped), or it is split on axis 2
    and each part transposed (K straight to ``[B, N, H, S]``)."""
    sw = view.producer(k_swapped, "Transpose")
    if sw is None:
        return None
    if _perm(sw) == [0, 1, 3, 2] and view.internal(sw.inputs[0], [sw]):
        found = _split_in_three(view, [q4, sw.inputs[0], v4], 0)
        if found is None:
            return None
        tr = view.producer(found[0], "Transpose")
        if tr is None or _perm(tr) != [2, 0, 3, 1, 4]:
            return None
        return view.producer(tr.inputs[0]), [tr, *found[1], sw]
    trs = [view.producer(q4, "Transpose"), sw, view.producer(v4, "Transpose")]
    if any(t is None for t in trs) or [_perm(t) for t in trs] != [[0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]]:
        return None
    found = _split_in_three(view, [t.inputs[0] for t in trs], 2)
    if found is None:
        return None
    return view.producer(found[0]), [*found[1], *trs]


def _from_split(view: GraphView, q4: str, k_swapped: str, v4: str):
    heads = _packed_heads(view, q4, k_swapped, v4)
    if heads is None:
        return None
    rs, between = heads
    target = _reshape_const(view, rs)
    if target is None or len(target) != 5 or not _ints(*target[2:]) or target[2] != 3:
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
    nodes = [rs, *between]
    add = view.producer(qkv, "Add")
    for b, p in (add.inputs, add.inputs[::-1]) if add is not None and len(add.inputs) == 2 else ():
        mm = view.producer(p, "MatMul")
        bias = view.const(b)
        if mm is None or bias is None or bias.shape != (3 * d,) or not view.internal(p, [add]):
            continue
        w = view.const(mm.inputs[1])
        x_shape = view.shape(mm.inputs[0])
        if w is None or w.ndim != 2 or w.shape[1] != 3 * d or not x_shape or len(x_shape) != 3:
            continue
        return qkv, n, h, nodes, shape, (mm.inputs[0], mm.inputs[1], b, [mm, add], x_shape)
    # made otherwise (a quantized projection, say): split into Q, K and V
    return qkv, n, h, nodes, shape, None


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
            k_shape = view.shape(kv)
            # (Q, K and V before their biases: the shapes the mask's Expand may read)
            (qv, kv, vv), bias, bias_nodes = _take_biases(view, [qv, kv, vv], [qn[0], kn[0], vn[0]])
            fitted = _fit_mask(view, mask, q_shape, k_shape, n, sm.name, qv, kv)
            if fitted is None:
                continue
            mask, expand = fitted
            inputs = trim_inputs([qv, kv, vv, bias, "", mask or ""])
            node = view.make_node("MultiHeadAttention", inputs, [out], sm.name + "_mha", domain=MS_DOMAIN,
                                  num_heads=n, scale=float(scale if scale is not None else 1.0))
            old = bias_nodes + qn + kn + vn + score_nodes + [sm, pv] + tail
            view.replace(_unique(old), expand + [node])
            continue
        packed = _from_split(view, q4, k4t, v4)
        if packed is None:
            continue
        qkv, n, h, packed_nodes, qkv_shape, projection = packed
        merged = _merge_heads(view, pv.outputs[0], n * h, qkv_shape)
        if merged is None:
            continue
        tail, out = merged
        scale = float(scale if scale is not None else 1.0)
        if projection is not None:
            x, w, b, proj_nodes, x_shape = projection
            fitted = _fit_mask(view, mask, x_shape, x_shape, n, sm.name, x, x)
            if fitted is None:
                continue
            mask, expand = fitted
            inputs = trim_inputs([x, w, b, "", "", mask or ""])
            node = view.make_node("Attention", inputs, [out], sm.name + "_attention", domain=MS_DOMAIN,
                                  num_heads=n, scale=scale)
            view.replace(_unique(proj_nodes + packed_nodes + score_nodes + [sm, pv] + tail), expand + [node])
            continue
        if view.graph.opsets.get("", 1) < 13:
            continue  # Split's sizes are an input from opset 13
        fitted = _fit_mask(view, mask, qkv_shape, qkv_shape, n, sm.name, qkv, qkv)
        if fitted is None:
            continue
        mask, expand = fitted
        d = n * h
        parts = [view.graph.unique_name(f"{sm.name}_{p}") for p in "qkv"]
        sizes = view.add_constant(sm.name + "_qkv_sizes", np.array([d, d, d], np.int64))
        split = view.make_node("Split", [qkv, sizes], parts, sm.name + "_qkv_split", axis=-1)
        node = view.make_node("MultiHeadAttention", trim_inputs(parts + ["", "", mask or ""]), [out], sm.name + "_mha",
                              domain=MS_DOMAIN, num_heads=n, scale=scale)
        view.replace(_unique(packed_nodes + score_nodes + [sm, pv] + tail), expand + [split, node])
    return view.finish()


def _fit_mask(view: GraphView, mask: str | None, q_shape, k_shape, heads: int, name: str, q: str, k: str):
    """The mask as onnxruntime's ``attention_bias`` takes it, ``[B or 1, N or 1, S, T]``:
    ``(mask, nodes)``, with an Expand added where the mask broadcasts over queries or
    keys, or None.

    Where the sizes are symbolic (a dynamic batch and sequence), the Expand's target
    ``[1, 1, S, T]`` is read from the shapes of the query and key inputs ``q`` and ``k``
    at run time. A run of the unfused graph gives the mask 1, S or T there (a larger
    size would broadcast the scores past what the product with V and the reshapes
    back to ``[B, S, D]`` accept), so the expanded mask is what the attention takes;
    a mask that fits neither fails in the Expand, as the unfused graph fails."""
    if mask is None:
        return None, []
    shape = view.shape(mask)
    if shape is None or len(shape) > 4 or not q_shape or not k_shape:
        return None
    shape = [1] * (4 - len(shape)) + list(shape)
    s, t, b = q_shape[1], k_shape[1], q_shape[0]
    for dim, size in zip(shape, [b, heads, s, t]):
        if dim != 1 and dim != size and (dim is None or (isinstance(dim, int) and isinstance(size, int))):
            return None  # unknown, or known not to fit
    if shape[2:] == [s, t] and None not in (s, t) and view.rank(mask) == 4:
        return mask, []
    out = view.graph.unique_name(name + "_bias")
    if all(isinstance(d, int) for d in shape) and isinstance(s, int) and isinstance(t, int):
        target = view.add_constant(name + "_bias_shape", np.array(shape[:2] + [s, t], np.int64))
        return out, [view.make_node("Expand", [mask, target], [out], name + "_expand_bias")]
    # [1, 1] then dim 1 of q's shape and of k's
    nodes, parts = [], [view.add_constant(name + "_bias_lead", np.ones(2, np.int64))]
    second = view.add_constant(name + "_bias_axis", np.array([1], np.int64))

    def length(src: str, tag: str) -> str:
        sh, dim = view.graph.unique_name(f"{name}_{tag}_shape"), view.graph.unique_name(f"{name}_{tag}")
        nodes.extend([view.make_node("Shape", [src], [sh], f"{name}_{tag}_shape"),
                      view.make_node("Gather", [sh, second], [dim], f"{name}_{tag}", axis=0)])
        return dim

    queries = length(q, "queries")
    # as many keys as queries where K is Q or one symbol names both lengths
    parts += [queries, queries if k == q or k_shape[1] == s else length(k, "keys")]
    target = view.graph.unique_name(name + "_bias_shape")
    nodes.append(view.make_node("Concat", parts, [target], name + "_bias_shape", axis=0))
    nodes.append(view.make_node("Expand", [mask, target], [out], name + "_expand_bias"))
    return out, nodes


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
