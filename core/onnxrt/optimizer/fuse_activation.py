"""Conv or Gemm followed by an activation -> com.microsoft FusedConv / FusedGemm.

Level 2, after partitioning: a match is replaced only where the provider that owns
both nodes has a kernel for the fused op. The activation's parameters travel as
onnxruntime's fused ops take them: FusedConv's ``activation_params`` (LeakyRelu:
alpha; Clip: min, max; HardSigmoid: alpha, beta), FusedGemm's
``activation_alpha``/``activation_beta``. FusedConv also takes ``HardSwish`` (no
parameters), which onnxruntime's does not: PP-LCNet and the PaddleOCR models follow
their convolutions with it, and the CPU provider applies it to each tile of the output
while it is in cache (where a HardSwish node is two passes over the whole output).
The fusion asks the provider whether its FusedConv takes the activation, so a provider
without it keeps the two nodes. PaddlePaddle's exports spell HardSwish out as
``Div(Mul(c, Clip(Add(c, 3), 0, 6)), 6)`` (94 times in the PP-PicoDet layout model,
four passes over each output); that becomes FusedConv's HardSwish with
``activation_params`` ``[3, 6]`` (offset and threshold, computed in the pattern's
order: the same values as the four nodes). FusedConv takes com.microsoft QuickGelu
too (``x * sigmoid(alpha x)``, alpha its one parameter; SiLU at alpha 1, which
``quick_gelu_fusion`` makes of YOLO's 57 ``Mul(c, Sigmoid(c))`` after convolutions),
again onnxrt's own. The fusions into those onnxrt-only activations run at level 3
(``conv_onnxrt_activation_fusion``), so that a model saved at level 2 loads in
onnxruntime.

- ``conv_activation_fusion``: ``act(Conv(x, W, b))``, ``act(Conv(x, W, b) + z)`` and
  ``Conv(x, W, b) + z`` where ``z`` has exactly the convolution's shape (a residual)
  -> ``FusedConv`` (without an ``activation`` attribute for the last, which
  onnxruntime's FusedConv reads as none); the ``+`` is an ``Add``, or a ``Sum`` of
  exactly two inputs (as Caffe2-converted ResNets write their residuals), which is
  the same addition. The residual is added to each tile of the output while it is
  in cache (MobileNetV2's ten projections with a skip: one pass over their outputs
  fewer).
- ``gemm_activation_fusion``: ``act(Gemm(a, b, c))`` -> ``FusedGemm`` (not Clip,
  HardSwish or QuickGelu, which FusedGemm does not take).
"""

from __future__ import annotations

import numpy as np

from .patterns import MS_DOMAIN, GraphView

__all__ = ["ONNXRUNTIME_ACTIVATIONS", "activation_params", "conv_activation_fusion", "conv_onnxrt_activation_fusion",
           "gemm_activation_fusion"]

_F32 = np.finfo(np.float32)


def activation_params(view: GraphView, act) -> list[float] | None:
    """``act``'s parameters as FusedConv wants them, or None if it cannot be fused."""
    if act.domain == MS_DOMAIN and act.op_type == "QuickGelu":
        return [float(act.attr("alpha", 1.702))]
    if act.domain != "":
        return None
    op = act.op_type
    if op in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        return []
    if op == "LeakyRelu":
        return [float(act.attr("alpha", 0.01))]
    if op == "HardSigmoid":
        return [float(act.attr("alpha", 0.2)), float(act.attr("beta", 0.5))]
    if op == "Clip":
        if act.opset < 11:
            return [float(act.attr("min", float(_F32.min))), float(act.attr("max", float(_F32.max)))]
        bounds = []
        for i, default in ((1, float(_F32.min)), (2, float(_F32.max))):
            name = act.inputs[i] if len(act.inputs) > i else ""
            if not name:
                bounds.append(default)
                continue
            v = view.scalar(name)
            if v is None:
                return None
            bounds.append(v)
        return bounds
    return None


def _activation_after(view: GraphView, value: str):
    act = view.only_reader(value)
    if act is None or act.inputs[0] != value or len(act.outputs) != 1:
        return None, None
    params = activation_params(view, act)
    return (act, params) if params is not None else (None, None)


def _decomposed_hard_swish(view: GraphView, value: str):
    """HardSwish spelled out as ``Div(Mul(value, Clip(Add(value, a), 0, t)), t)``
    (either operand order of the Add and the Mul, scalar constants, ``t`` > 0) read
    from ``value``: ``(nodes, output, [a, t])``, or None."""
    if value in view.outputs:
        return None
    readers = view.readers(value)
    if len(readers) != 2 or not all(view.free(r) and r.domain == "" for r in readers):
        return None
    add = next((r for r in readers if r.op_type == "Add"), None)
    mul = next((r for r in readers if r.op_type == "Mul"), None)
    if add is None or mul is None or len(add.inputs) != 2 or len(mul.inputs) != 2:
        return None
    offset = view.scalar(add.inputs[1] if add.inputs[0] == value else add.inputs[0], value)
    clip = view.only_reader(add.outputs[0], "Clip")
    if offset is None or clip is None or clip.inputs[0] != add.outputs[0]:
        return None
    bounds = activation_params(view, clip)
    if bounds is None or bounds[0] != 0.0 or not bounds[1] > 0.0:
        return None
    if sorted(mul.inputs) != sorted([value, clip.outputs[0]]) or view.only_reader(clip.outputs[0]) is not mul:
        return None
    div = view.only_reader(mul.outputs[0], "Div")
    if div is None or div.inputs[0] != mul.outputs[0] or view.scalar(div.inputs[1], mul.outputs[0]) != bounds[1]:
        return None
    return [add, clip, mul, div], div.outputs[0], [offset, bounds[1]]


def _same_shape(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(
        x is not None and x == y for x, y in zip(a, b))


#: The activations onnxruntime's FusedConv takes: a model saved with only these in its
#: FusedConv nodes loads in onnxruntime
ONNXRUNTIME_ACTIVATIONS = frozenset(("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip"))


def conv_activation_fusion(graph, ctx) -> bool:
    """``act(Conv(...))``, ``act(Conv(...) + z)`` and ``Conv(...) + z`` -> com.microsoft
    FusedConv, for the activations onnxruntime's FusedConv takes (level 2: a model saved
    at that level still loads in onnxruntime)."""
    return _conv_activation(graph, ctx, onnxrt_only=False)


def conv_onnxrt_activation_fusion(graph, ctx) -> bool:
    """The same for the activations only onnxrt's FusedConv takes: HardSwish (and
    PaddlePaddle's spelling of it) and com.microsoft QuickGelu. Level 3
    (``ORT_ENABLE_LAYOUT``, within the default ``ORT_ENABLE_ALL``), where onnxruntime
    puts its own hardware-specific layouts: a model saved at this level runs in onnxrt."""
    return _conv_activation(graph, ctx, onnxrt_only=True)


def _conv_activation(graph, ctx, onnxrt_only: bool) -> bool:
    view = GraphView(graph, ctx)
    for conv in view.candidates("Conv"):
        if len(conv.outputs) != 1:
            continue
        y = conv.outputs[0]
        inputs = list(conv.inputs)
        old = [conv]
        hard_swish = _decomposed_hard_swish(view, y) if onnxrt_only else None
        if hard_swish is not None:
            nodes, out, params = hard_swish
            fused = view.make_node("FusedConv", inputs, [out], conv.name, domain=MS_DOMAIN, activation="HardSwish",
                                   activation_params=params)
            fused.attrs.update(conv.attrs)
            view.replace(old + nodes, [fused])
            continue
        act, params = _activation_after(view, y)
        if act is None:
            add = view.only_reader(y, "Add") or view.only_reader(y, "Sum")
            if add is None or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
                continue
            z = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
            if not _same_shape(view.shape(z), view.shape(y)) or view.elem_type(z) != view.elem_type(y):
                continue
            act, params = _activation_after(view, add.outputs[0])
            inputs = inputs + [""] * (3 - len(inputs)) + [z]
            old.append(add)
        # each pass takes the Convs whose activation is its own; the other pass the rest
        private = act is not None and act.op_type not in ONNXRUNTIME_ACTIVATIONS
        if private != onnxrt_only:
            continue
        if act is not None:
            old.append(act)
        out = act.outputs[0] if act is not None else old[-1].outputs[0]
        fused = view.make_node("FusedConv", inputs, [out], conv.name, domain=MS_DOMAIN,
                               activation=act.op_type if act is not None else None,
                               activation_params=params or None)
        fused.attrs.update(conv.attrs)
        view.replace(old, [fused])
    return view.finish()


def gemm_activation_fusion(graph, ctx) -> bool:
    """``act(Gemm(...))`` -> com.microsoft FusedGemm."""
    view = GraphView(graph, ctx)
    for gemm in view.candidates("Gemm"):
        if len(gemm.outputs) != 1:
            continue
        act, params = _activation_after(view, gemm.outputs[0])
        if act is None or act.op_type in ("Clip", "HardSwish", "QuickGelu"):
            continue
        extra = {}
        if params:
            extra["activation_alpha"] = params[0]
        if len(params) > 1:
            extra["activation_beta"] = params[1]
        fused = view.make_node("FusedGemm", gemm.inputs, [act.outputs[0]], gemm.name, domain=MS_DOMAIN,
                               activation=act.op_type, **extra)
        fused.attrs.update(gemm.attrs)
        view.replace([gemm, act], [fused])
    return view.finish()
