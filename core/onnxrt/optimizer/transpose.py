"""Transposes: cancel them, or fold them (and scalar scales) into com.microsoft FusedMatMul.

Level 2, after partitioning.

- ``transpose_cancellation``: ``Transpose(Transpose(x, p), q)`` is one Transpose with
  the composed permutation, or nothing when that is the identity.
- ``transpose_matmul_fusion``: ``MatMul(Transpose(a), b)`` where the Transpose only
  swaps the last two axes -> ``FusedMatMul(a, b, transA=1)`` (likewise ``transB``),
  where the owning provider has FusedMatMul.
- ``matmul_scale_fusion``: ``MatMul(a, b) * c`` or ``/ c`` with a scalar constant ``c``
  -> ``FusedMatMul(a, b, alpha=c)`` (or ``1 / c``), as attention scores are scaled.
"""

from __future__ import annotations

from .fuse_transformer import other_input
from .patterns import MS_DOMAIN, GraphView

__all__ = ["matmul_scale_fusion", "transpose_cancellation", "transpose_matmul_fusion"]


def _perm(view: GraphView, t) -> list[int] | None:
    """A Transpose's permutation (the default reverses the axes; needs the rank)."""
    p = t.attr("perm")
    if p is not None:
        return [int(v) for v in p]
    r = view.rank(t.inputs[0])
    return None if r is None else list(range(r))[::-1]


def transpose_cancellation(graph, ctx) -> bool:
    """Merge back-to-back Transposes; drop them where they cancel."""
    view = GraphView(graph, ctx)
    for t2 in view.candidates("Transpose"):
        t1 = view.producer(t2.inputs[0], "Transpose")
        if t1 is None:
            continue
        p, q = _perm(view, t1), _perm(view, t2)
        if p is None or q is None or len(p) != len(q) or sorted(p) != list(range(len(p))):
            continue
        composed = [p[i] for i in q]
        alone = view.internal(t1.outputs[0], [t2])
        x = t1.inputs[0]
        if composed == list(range(len(p))) and view.bypass([t1, t2] if alone else [t2], t2.outputs[0], x):
            continue
        new = view.make_node("Transpose", [x], [t2.outputs[0]], t2.name, perm=composed)
        new.opset = t2.opset
        view.replace([t1, t2] if alone else [t2], [new])
    return view.finish()


def _last_two_swapped(p: list[int]) -> bool:
    n = len(p)
    return n >= 2 and p[:-2] == list(range(n - 2)) and p[-2:] == [n - 1, n - 2]


def _matmul_or_fused(node) -> bool:
    return (node.op_type == "MatMul" and node.domain == "") or (
        node.op_type == "FusedMatMul" and node.domain == MS_DOMAIN)


def _fused_from(view: GraphView, mm, inputs, outputs, **changes):
    attrs = {"alpha": float(mm.attr("alpha", 1.0)), "transA": int(mm.attr("transA", 0)),
             "transB": int(mm.attr("transB", 0))}
    attrs.update(changes)
    return view.make_node("FusedMatMul", inputs, outputs, mm.name, domain=MS_DOMAIN, **attrs)


def transpose_matmul_fusion(graph, ctx) -> bool:
    """A last-two-axes Transpose feeding a MatMul -> FusedMatMul transA/transB."""
    view = GraphView(graph, ctx)
    for mm in list(graph.nodes):
        if not _matmul_or_fused(mm) or not view.free(mm) or len(mm.inputs) != 2:
            continue
        if mm.attr("transBatchA", 0) or mm.attr("transBatchB", 0):
            continue
        # both operands at least 2-D: onnxruntime's FusedMatMul reads a 1-D operand of a
        # transposed product wrongly, and the saved optimized model must run there
        if any((view.rank(v) or 0) < 2 for v in mm.inputs):
            continue
        inputs, old, changes = list(mm.inputs), [mm], {}
        for i, key in ((0, "transA"), (1, "transB")):
            t = view.producer(inputs[i], "Transpose")
            if t is None or not view.internal(t.outputs[0], [mm]) or mm.inputs[0] == mm.inputs[1]:
                continue
            p = _perm(view, t)
            if p is None or not _last_two_swapped(p):
                continue
            inputs[i] = t.inputs[0]
            old.append(t)
            changes[key] = 1 - int(mm.attr(key, 0))
        if len(old) == 1:
            continue
        view.replace(old, [_fused_from(view, mm, inputs, mm.outputs, **changes)])
    return view.finish()


def matmul_scale_fusion(graph, ctx) -> bool:
    """MatMul then a multiply or divide by a scalar constant -> FusedMatMul alpha."""
    view = GraphView(graph, ctx)
    for mm in list(graph.nodes):
        if not _matmul_or_fused(mm) or not view.free(mm) or len(mm.inputs) != 2:
            continue
        y = mm.outputs[0]
        s = view.only_reader(y)
        if s is None or s.domain != "" or s.op_type not in ("Mul", "Div"):
            continue
        c = other_input(s, y)
        if c is None or c == y or (s.op_type == "Div" and s.inputs[0] != y):
            continue
        v = view.scalar(c)
        cval = view.const(c)
        if v is None or v == 0.0 or cval.dtype.kind != "f" or view.elem_type(c) != view.elem_type(mm.inputs[0]):
            continue
        # a scalar of higher rank than the product would change the result's rank
        r = view.rank(y)
        if r is None or cval.ndim > r:
            continue
        factor = v if s.op_type == "Mul" else 1.0 / v
        alpha = float(mm.attr("alpha", 1.0)) * factor
        # the fused product scales as it multiplies: a factor near float32's range ends
        # (or past it: x / 1e-39) would overflow where the product then scaled does not
        if not 2.0**-64 <= abs(alpha) <= 2.0**64:
            continue
        view.replace([mm, s], [_fused_from(view, mm, mm.inputs, s.outputs, alpha=alpha)])
    return view.finish()
