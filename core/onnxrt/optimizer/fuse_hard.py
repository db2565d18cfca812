"""Elementwise spellings of HardSwish, HardSigmoid and a scalar affine map -> onnxrt's
``HardActivation``.

PaddlePaddle's exports write HardSwish out as ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)``
and follow activations with a learnable scalar affine map, ``Add(Mul(y, s), b)``
(PP-OCRv4's detector and recognizer: 24 and 28 of them); squeeze-and-excitation
blocks gate a tensor with ``Mul(x, HardSigmoid(x))``. Each node is one pass over the
tensor and one allocation; ``HardActivation`` is one of each:

    t = Clip(x * scale + shift, low, high);  t = t * x (gate);  t = t / factor (or * factor)

with the factor applied after the product with ``x``, or before it (``factor_first``).

``hard_activation_fusion`` matches, on float32 tensors with scalar constants:

- ``[Mul(x, s)] -> [Add(., b)] -> Clip(., lo, hi)`` followed by up to two of a gate
  ``Mul(., x)`` and a factor ``Div(., f)`` / ``Mul(., f)``, in either order (the gate
  only where no ``Mul(x, s)`` comes first: the product is with the chain's input);
- ``HardSigmoid(x)`` followed by a gate and/or a factor (alone it is one pass
  already);
- ``Add(Mul(x, s), b)`` with nothing of the above after it (the bounds infinite).

The rewrite is exact: the kernel rounds every step to float32 as the node it replaces
did (no fused multiply-add), a missing multiplication is by 1 and a missing addition
of -0.0 (both identities in float arithmetic, -0.0 included), and the bounds are the
ones the Clip kernel applies (an omitted bound of Clip-11 is float32's largest finite
value, of Clip-6 an infinity). Only float32 chains are taken: a float16 one rounds to
float16 after every node, which one node computing in float32 would not.

It runs after ``conv_activation_fusion`` in each round, which takes a HardSwish
spelling that reads a convolution's output into the convolution's epilogue first.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .patterns import ONNXRT_DOMAIN, GraphView

__all__ = ["hard_activation_fusion"]

_F32_MAX = float(np.finfo(np.float32).max)
_FLOAT = TensorProto.FLOAT


def _f32(v: float) -> float:
    return float(np.float32(v))


def _operand_scalar(view: GraphView, node, value: str) -> tuple[str, float] | None:
    """For a binary ``node`` with ``value`` as one operand and a float32 scalar constant
    as the other: (the constant's name, its value); else None."""
    if len(node.inputs) != 2 or node.domain != "" or node.opset < 7:
        return None
    if node.inputs[0] == value:
        other = node.inputs[1]
    elif node.inputs[1] == value:
        other = node.inputs[0]
    else:
        return None
    if other == value or view.elem_type(other) != _FLOAT:
        return None
    c = view.const(other)
    rank = view.rank(value)
    if c is None or rank is None or c.ndim > rank:
        return None
    v = view.scalar(other, operand=value)
    return None if v is None else (other, _f32(v))


def _clip_bounds(view: GraphView, clip) -> tuple[float, float] | None:
    """The bounds the Clip kernel applies to a float32 ``clip``, or None when they are
    not constants."""
    if clip.opset < 11:
        return (_f32(clip.attr("min", -np.inf)), _f32(clip.attr("max", np.inf)))
    bounds = []
    for i, default in ((1, -_F32_MAX), (2, _F32_MAX)):
        name = clip.inputs[i] if len(clip.inputs) > i else ""
        if not name:
            bounds.append(default)
            continue
        c = view.const(name)
        if c is None or c.size != 1:
            return None
        bounds.append(_f32(c.reshape(-1)[0]))
    return bounds[0], bounds[1]


def _tail(view: GraphView, value: str, x: str, gate_ok: bool):
    """The gate and factor steps that read ``value`` (the clipped tensor), at most one of
    each: (nodes, output, attributes)."""
    nodes, attrs = [], {}
    out = value
    for _ in range(2):
        nxt = view.only_reader(out)
        if nxt is None or nxt.domain != "" or len(nxt.outputs) != 1 or nxt.opset < 7:
            break
        if nxt.op_type == "Mul" and "gate" not in attrs and gate_ok and len(nxt.inputs) == 2 \
                and sorted(nxt.inputs) == sorted([out, x]) and out != x:
            attrs["gate"] = 1
            if "factor" in attrs:
                attrs["factor_first"] = 1
        elif nxt.op_type in ("Mul", "Div") and "factor" not in attrs and \
                (nxt.op_type == "Mul" or nxt.inputs[0] == out):
            found = _operand_scalar(view, nxt, out)
            if found is None:
                break
            attrs["factor"] = found[1]
            if nxt.op_type == "Div":
                attrs["divide"] = 1
        else:
            break
        nodes.append(nxt)
        out = nxt.outputs[0]
    return nodes, out, attrs


def _scalar_step(view: GraphView, op_type: str, value: str, reader):
    """The ``op_type`` node (Add or Mul) producing ``value`` from a tensor and a scalar
    constant, read by ``reader`` alone (None: any number of readers): (node, the tensor,
    the constant), or None."""
    node = view.producer(value, op_type)
    if node is None or len(node.outputs) != 1:
        return None
    if reader is not None and view.only_reader(value) is not reader:
        return None
    for cand in node.inputs:
        found = _operand_scalar(view, node, cand)
        if found is not None and view.const(cand) is None:
            return node, cand, found[1]
    return None


def _fuse(view: GraphView, nodes, x: str, out: str, name: str, attrs: dict) -> bool:
    if view.elem_type(x) != _FLOAT or view.elem_type(out) != _FLOAT or view.const(x) is not None:
        return False
    fused = view.make_node("HardActivation", [x], [out], name + "_hard", domain=ONNXRT_DOMAIN, **attrs)
    return view.replace(nodes, [fused])


def hard_activation_fusion(graph, ctx) -> bool:
    """HardSwish / HardSigmoid spellings and scalar affine maps -> onnxrt HardActivation."""
    view = GraphView(graph, ctx)
    for clip in view.candidates("Clip"):
        if len(clip.outputs) != 1 or not clip.inputs:
            continue
        bounds = _clip_bounds(view, clip)
        if bounds is None:
            continue
        front, x, scale, shift = [], clip.inputs[0], 1.0, -0.0
        add = _scalar_step(view, "Add", x, clip)
        if add is not None:
            front, x, shift = [add[0]], add[1], add[2]
        tail, out, attrs = _tail(view, clip.outputs[0], x, gate_ok=True)
        if "gate" not in attrs:
            # the product with the chain's input rules out a scaling before it
            mul = _scalar_step(view, "Mul", x, front[0] if front else clip)
            if mul is not None:
                front, x, scale = [mul[0]] + front, mul[1], mul[2]
        if not front and not tail:
            continue  # a Clip alone is one pass already
        attrs.update(scale=scale, shift=shift, low=bounds[0], high=bounds[1])
        _fuse(view, front + [clip] + tail, x, out, clip.name, attrs)
    for hs in view.candidates("HardSigmoid"):
        if len(hs.outputs) != 1 or not view.free(hs):
            continue
        x = hs.inputs[0]
        tail, out, attrs = _tail(view, hs.outputs[0], x, gate_ok=True)
        if not tail:
            continue  # alone it is one pass already
        attrs.update(scale=_f32(hs.attr("alpha", 0.2)), shift=_f32(hs.attr("beta", 0.5)), low=0.0, high=1.0)
        _fuse(view, [hs] + tail, x, out, hs.name, attrs)
    for node in view.candidates("Add"):
        if not view.free(node):
            continue
        add = _scalar_step(view, "Add", node.outputs[0] if node.outputs else "", None)
        if add is None or add[0] is not node:
            continue
        mul = _scalar_step(view, "Mul", add[1], node)
        if mul is None:
            continue  # one Add is one pass already
        _fuse(view, [mul[0], node], mul[1], node.outputs[0], node.name,
              {"scale": mul[2], "shift": add[2], "low": -np.inf, "high": np.inf})
    return view.finish()
