"""Exact weight rewrites: fold BatchNormalization, a per-channel Add and a per-channel
Mul into the Conv before them, and MatMul + Add into Gemm.

These change constants, not what is computed, so they are provider independent and
run at level 1, before partitioning, as onnxruntime's ConvBNFusion, ConvAddFusion,
ConvMulFusion and MatMulAddFusion do. Folding is done in float64 and rounded once
to the weights' type.

- ``conv_bn_fusion``: ``BN(Conv(x, W, b))`` -> ``Conv(x, W * f, (b - mean) * f + beta)``
  with ``f = scale / sqrt(var + eps)`` per output channel.
- ``conv_add_fusion``: ``Conv(x, W, b) + c`` with a constant ``c`` holding one value per
  output channel (shape ``[M, 1, 1]``, ``[1, M, 1, 1]``...) -> ``Conv(x, W, b + c)``.
- ``conv_mul_fusion``: ``Conv(x, W, b) * s`` likewise -> ``Conv(x, W * s, b * s)``.
- ``matmul_add_fusion``: ``MatMul(A, B) + C`` with 2-D ``A`` and ``B`` and ``C``
  broadcastable to the product -> ``Gemm(A, B, C)``.
- ``bn_mul_fusion`` / ``bn_add_fusion``: an inference BatchNormalization followed by a
  per-channel constant Mul or Add (the Scale layer that Caffe-converted models keep
  after each BatchNorm, as in the model zoo's DenseNet and Inception v2) ->
  one BatchNormalization with ``scale * s, beta * s`` or ``beta + c``: two passes
  over the activations fewer per pair. onnxruntime has no such fusion; it is exact
  in the same sense as the Conv folds (float64, rounded once).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .patterns import GraphView

__all__ = ["bn_add_fusion", "bn_mul_fusion", "conv_add_fusion", "conv_bn_fusion", "conv_mul_fusion",
           "matmul_add_fusion"]

_FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


def _foldable_conv(view: GraphView, name: str):
    """The Conv producing ``name`` if its weight (and bias) are float constants."""
    conv = view.producer(name, "Conv")
    if conv is None or len(conv.inputs) < 2 or conv.outputs[0] != name:
        return None
    w = view.const(conv.inputs[1])
    if w is None or w.dtype.kind != "f" or w.ndim < 3:
        return None
    if len(conv.inputs) > 2 and conv.inputs[2]:
        b = view.const(conv.inputs[2])
        # a bias of any other shape is an invalid Conv: leave it for the kernel to report
        if b is None or b.shape != (w.shape[0],):
            return None
    return conv


def _conv_params(view: GraphView, conv):
    w = view.const(conv.inputs[1])
    b = view.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
    if b is None:
        b = np.zeros(w.shape[0], w.dtype)
    return w, b


def _rewritten_conv(view: GraphView, conv, w: np.ndarray | None, b: np.ndarray, dtype, output: str):
    """A copy of ``conv`` with new weights (None: its own, unchanged) and bias, writing ``output``."""
    wn = conv.inputs[1] if w is None else view.add_constant(conv.inputs[1] + "_folded", w.astype(dtype))
    bn = view.add_constant((conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else conv.name + "_B")
                           + "_folded", b.astype(dtype))
    new = view.make_node("Conv", [conv.inputs[0], wn, bn], [output], conv.name)
    new.attrs = dict(conv.attrs)
    new.opset = conv.opset
    return new


def _replace_folded(view: GraphView, old: list, new, made: list[str]) -> bool:
    """``view.replace(old, [new])``; where it is refused, the constants ``made`` for
    ``new`` are dropped again, so that a refused fold leaves no weight copy behind
    (which would also keep the transforms' rounds going, as dead-node elimination
    then finds something to remove every round)."""
    if view.replace(old, [new]):
        return True
    for name in made:
        view.graph.initializers.pop(name, None)
        view.graph.value_types.pop(name, None)
    return False


def _swallowable(view: GraphView, conv, node) -> bool:
    """Whether ``node`` is the only reader of ``conv``'s output (no graph output
    either): what :meth:`GraphView.replace` asks of the pair, checked before any
    weights are computed for it."""
    return view.internal(conv.outputs[0], [conv, node])


def _per_channel(view: GraphView, name: str, m: int, rank: int) -> np.ndarray | None:
    """``name`` as a length-``m`` vector if it is a constant varying only along axis 1
    of a rank-``rank`` tensor (or a single value)."""
    c = view.const(name)
    # an infinite or NaN factor folded into the weights sums inf and -inf products to NaN
    # where the unfolded graph gives an infinity: left unfolded
    if c is None or c.dtype.kind != "f" or c.ndim > rank or not np.isfinite(c).all():
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, m):
        return None
    return np.broadcast_to(c.reshape(-1), (m,)).astype(np.float64)


def conv_bn_fusion(graph, ctx) -> bool:
    """Fold an inference BatchNormalization into the Conv before it."""
    view = GraphView(graph, ctx)
    for bn in view.candidates("BatchNormalization"):
        if len(bn.inputs) != 5 or any(o for o in bn.outputs[1:]) or bn.attr("training_mode", 0):
            continue
        conv = _foldable_conv(view, bn.inputs[0])
        if conv is None or not _swallowable(view, conv, bn):
            continue
        params = [view.const(i) for i in bn.inputs[1:]]
        w, b = _conv_params(view, conv)
        m = w.shape[0]
        if any(p is None or p.shape != (m,) or p.dtype.kind != "f" for p in params):
            continue
        scale, beta, mean, var = (p.astype(np.float64) for p in params)
        with np.errstate(all="ignore"):
            f = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
        if not (np.isfinite(f).all() and np.isfinite(beta).all() and np.isfinite(mean).all()):
            continue  # a factor that is not finite (a zero or negative variance): left unfolded
        w2 = w.astype(np.float64) * f.reshape((m,) + (1,) * (w.ndim - 1))
        b2 = (b.astype(np.float64) - mean) * f + beta
        new = _rewritten_conv(view, conv, w2, b2, w.dtype, bn.outputs[0])
        _replace_folded(view, [conv, bn], new, [i for i in new.inputs[1:3] if i not in conv.inputs])
    return view.finish()


def _binary_fold(op_type: str, fold_side):
    """A transform that offers every ``op_type`` node with two inputs to
    ``fold_side(view, node, side)`` for ``side`` 0 then 1, until one folds it."""

    def fuse(graph, ctx) -> bool:
        view = GraphView(graph, ctx)
        for node in view.candidates(op_type):
            if len(node.inputs) != 2:
                continue
            for side in (0, 1):
                if fold_side(view, node, side):
                    break
        return view.finish()

    return fuse


def _conv_binary(op_type: str, combine):
    def fold_side(view, node, side) -> bool:
        conv = _foldable_conv(view, node.inputs[side])
        if conv is None or not _swallowable(view, conv, node):
            return False
        w, b = _conv_params(view, conv)
        c = _per_channel(view, node.inputs[1 - side], w.shape[0], w.ndim)
        if c is None or view.const(node.inputs[1 - side]).dtype != w.dtype:
            return False
        w2, b2 = combine(w, b.astype(np.float64), c)
        new = _rewritten_conv(view, conv, w2, b2, w.dtype, node.outputs[0])
        return _replace_folded(view, [conv, node], new, [i for i in new.inputs[1:3] if i not in conv.inputs])

    return _binary_fold(op_type, fold_side)


# an Add leaves the weights as they are: the Conv keeps reading its own (no copy)
conv_add_fusion = _conv_binary("Add", lambda w, b, c: (None, b + c))
conv_add_fusion.__doc__ = "Fold a constant per-channel Add into the Conv before it."
conv_mul_fusion = _conv_binary(
    "Mul", lambda w, b, s: (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1)), b * s))
conv_mul_fusion.__doc__ = "Fold a constant per-channel Mul into the Conv before it."


def matmul_add_fusion(graph, ctx) -> bool:
    """``MatMul(A, B) + C`` on 2-D operands -> ``Gemm(A, B, C)``."""
    view = GraphView(graph, ctx)
    for mm in view.candidates("MatMul"):
        a_shape, b_shape = view.shape(mm.inputs[0]), view.shape(mm.inputs[1])
        if a_shape is None or b_shape is None or len(a_shape) != 2 or len(b_shape) != 2:
            continue
        if view.elem_type(mm.inputs[0]) not in _FLOATS:
            continue
        add = view.only_reader(mm.outputs[0], "Add")
        if add is None or len(add.inputs) != 2:
            continue
        c = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
        if c == mm.outputs[0]:
            continue
        c_shape = view.shape(c)
        if c_shape is None or view.elem_type(c) != view.elem_type(mm.inputs[0]):
            continue
        # Gemm broadcasts C one way only: to [M, N], never the product to C's shape
        want = [a_shape[0], b_shape[1]]
        if len(c_shape) > 2 or not all(d == 1 or (d is not None and d == t)
                                       for d, t in zip(c_shape[::-1], want[::-1])):
            continue
        if graph.opsets.get("", 1) < 11:
            continue
        gemm = view.make_node("Gemm", [mm.inputs[0], mm.inputs[1], c], [add.outputs[0]], mm.name)
        gemm.opset = graph.opsets.get("", 1)
        view.replace([mm, add], [gemm])
    return view.finish()


def _foldable_bn(view: GraphView, name: str):
    """The inference BatchNormalization producing ``name``, with its constant
    ``(scale, beta)`` as float64, and its input's rank; or None."""
    bn = view.producer(name, "BatchNormalization")
    if bn is None or len(bn.inputs) != 5 or bn.outputs[0] != name or any(o for o in bn.outputs[1:]):
        return None
    if bn.attr("training_mode", 0) or bn.opset < 9:  # older opsets carry spatial/is_test
        return None
    rank = view.rank(bn.inputs[0])
    params = [view.const(i) for i in bn.inputs[1:]]
    if rank is None or rank < 2 or any(p is None or p.ndim != 1 or p.dtype.kind != "f" for p in params):
        return None
    m = params[0].shape[0]
    if any(p.shape != (m,) for p in params):
        return None
    return bn, params, rank


def _bn_binary(op_type: str, combine):
    def fold_side(view, node, side) -> bool:
        found = _foldable_bn(view, node.inputs[side])
        if found is None:
            return False
        bn, (scale, beta, _, _), rank = found
        if not view.internal(bn.outputs[0], [bn, node]):
            return False
        c = _per_channel(view, node.inputs[1 - side], scale.shape[0], rank)
        if c is None or view.const(node.inputs[1 - side]).dtype != scale.dtype:
            return False
        s2, b2 = combine(scale.astype(np.float64), beta.astype(np.float64), c)
        sn = view.add_constant(bn.inputs[1] + "_folded", s2.astype(scale.dtype))
        bname = view.add_constant(bn.inputs[2] + "_folded", b2.astype(beta.dtype))
        new = view.make_node("BatchNormalization", [bn.inputs[0], sn, bname, bn.inputs[3], bn.inputs[4]],
                             [node.outputs[0]], bn.name)
        new.attrs = dict(bn.attrs)
        new.opset = bn.opset
        return _replace_folded(view, [bn, node], new, [sn, bname])

    return _binary_fold(op_type, fold_side)


bn_mul_fusion = _bn_binary("Mul", lambda scale, beta, s: (scale * s, beta * s))
bn_mul_fusion.__doc__ = "Fold a constant per-channel Mul into the BatchNormalization before it."
bn_add_fusion = _bn_binary("Add", lambda scale, beta, c: (scale, beta + c))
bn_add_fusion.__doc__ = "Fold a constant per-channel Add into the BatchNormalization before it."
