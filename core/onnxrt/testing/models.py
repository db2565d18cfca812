"""Small test models built with ``onnx.helper``, and random feeds for any model.

Every builder returns an ``onnx.ModelProto`` with IR version 10 (which onnxruntime also
accepts), so the same model can be checked against onnxruntime::

    from onnxrt.testing import models as m

    model = m.make_model([m.node("Relu", ["x"], ["y"])], [m.tensor("x", [2, 3])], [m.tensor("y", [2, 3])])
    model = m.single_op("Add", shape=[4], dtype=np.int64)
    model = m.chain(["Add", "Mul", "Relu"])          # x + y -> * z -> Relu
    model = m.mlp()                                  # MatMul, Add, Relu, MatMul, Softmax
    model = m.residual_mlp()                         # Mul, Add, Relu, MatMul, Softmax
    feeds = m.random_feeds(model, seed=0)
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["make_model", "node", "tensor", "single_op", "chain", "mlp", "residual_mlp", "random_feeds"]

DEFAULT_OPSET = 18
DEFAULT_IR_VERSION = 10


def tensor(name: str, shape: Sequence[int | str | None] | None = None, dtype=np.float32) -> onnx.ValueInfoProto:
    """A tensor value info; ``shape`` entries are sizes, symbolic names or ``None``."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], domain: str = "", name: str | None = None,
         **attrs: Any) -> onnx.NodeProto:
    """A node; attributes are keyword arguments (``axis=-1``)."""
    return helper.make_node(op_type, list(inputs), list(outputs), name=name, domain=domain or None, **attrs)


def make_model(nodes: Iterable[onnx.NodeProto], inputs: Iterable[onnx.ValueInfoProto],
               outputs: Iterable[onnx.ValueInfoProto], initializers: dict[str, np.ndarray] | Iterable = (),
               opset: int = DEFAULT_OPSET, domains: dict[str, int] | None = None,
               ir_version: int = DEFAULT_IR_VERSION) -> onnx.ModelProto:
    """A model from nodes and value infos, checked with ``onnx.checker``.

    :param initializers: a dict name -> array, or ``TensorProto`` objects.
    :param domains: opsets of other domains the nodes use, e.g. ``{"my.ops": 1}``.
    """
    nodes = list(nodes)
    for i, n in enumerate(nodes):
        if not n.name:
            n.name = f"{n.op_type.lower()}_{i}"
    if isinstance(initializers, dict):
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    else:
        inits = list(initializers)
    graph = helper.make_graph(nodes, "test", list(inputs), list(outputs), initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version, producer_name="onnxrt.testing")
    if not domains:  # the checker knows no custom domain's schemas
        onnx.checker.check_model(model)
    return model


def _arity(op_type: str, opset: int, domain: str) -> int:
    try:
        return onnx.defs.get_schema(op_type, opset, domain).min_input
    except Exception:  # noqa: BLE001 - an unknown op: assume unary
        return 1


def single_op(op_type: str, shape: Sequence[int | str] = (2, 3), dtype=np.float32, n_inputs: int | None = None,
              opset: int = DEFAULT_OPSET, domain: str = "", **attrs: Any) -> onnx.ModelProto:
    """One node of ``op_type`` reading ``n_inputs`` tensors ``x0, x1, ...`` of one shape and type.

    ``n_inputs`` defaults to the schema's minimum input count; the output ``y`` has the
    same shape and type (declare other ops with :func:`make_model`).
    """
    n = _arity(op_type, opset, domain) if n_inputs is None else n_inputs
    names = [f"x{i}" for i in range(n)]
    return make_model([node(op_type, names, ["y"], domain=domain, **attrs)],
                      [tensor(x, shape, dtype) for x in names], [tensor("y", shape, dtype)],
                      opset=opset, domains={domain: 1} if domain else None)


def chain(ops: Sequence[str], shape: Sequence[int | str] = (2, 3), dtype=np.float32,
          opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """Elementwise ops applied one after another: ``x``, then each binary op reads a new input.

    ``chain(["Add", "Mul", "Relu"])`` is ``Relu((x + in1) * in2)`` with inputs
    ``x, in1, in2`` and output ``y``.
    """
    nodes, inputs = [], [tensor("x", shape, dtype)]
    cur = "x"
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"t{i}"
        args = [cur]
        for _ in range(_arity(op, opset, "") - 1):
            extra = f"in{len(inputs)}"
            inputs.append(tensor(extra, shape, dtype))
            args.append(extra)
        nodes.append(node(op, args, [out]))
        cur = out
    return make_model(nodes, inputs, [tensor("y", shape, dtype)], opset=opset)


def mlp(in_features: int = 4, hidden: int = 8, out_features: int = 3, seed: int = 0,
        opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """``x[N, in] -> MatMul -> Add -> Relu -> MatMul -> Softmax -> y[N, out]``, random weights."""
    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.standard_normal((in_features, hidden)).astype(np.float32),
        "b1": rng.standard_normal(hidden).astype(np.float32),
        "w2": rng.standard_normal((hidden, out_features)).astype(np.float32),
    }
    nodes = [
        node("MatMul", ["x", "w1"], ["h0"]),
        node("Add", ["h0", "b1"], ["h1"]),
        node("Relu", ["h1"], ["h2"]),
        node("MatMul", ["h2", "w2"], ["logits"]),
        node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    return make_model(nodes, [tensor("x", ["N", in_features])], [tensor("y", ["N", out_features])],
                      weights, opset=opset)


def residual_mlp(features: int = 4, out_features: int = 3, seed: int = 0,
                 opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """``x[N, f] -> Mul(x, s) -> Add(., x) -> Relu -> MatMul(., w) -> Softmax -> y[N, out]``, random weights.

    No built-in fusion merges its elementwise ops into a neighbour, so a provider
    that claims Mul, Add or Relu keeps them at every optimization level (the Add of
    :func:`mlp` becomes part of a Gemm when MatMul+Add fusion runs).
    """
    rng = np.random.default_rng(seed)
    weights = {
        "s": rng.uniform(0.5, 1.5, features).astype(np.float32),
        "w": rng.standard_normal((features, out_features)).astype(np.float32),
    }
    nodes = [
        node("Mul", ["x", "s"], ["scaled"]),
        node("Add", ["scaled", "x"], ["res"]),
        node("Relu", ["res"], ["h"]),
        node("MatMul", ["h", "w"], ["logits"]),
        node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    return make_model(nodes, [tensor("x", ["N", features])], [tensor("y", ["N", out_features])],
                      weights, opset=opset)


def random_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict[str, int] | None = None,
                 default_dim: int = 2) -> dict[str, np.ndarray]:
    """Random inputs for every graph input that is not an initializer.

    Symbolic dimensions take their size from ``dims`` (by name), else ``default_dim``.
    Floats are standard normal, integers lie in [-5, 5) (unsigned in [0, 10)), booleans
    are fair coin flips.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ValueError(f"input {vi.name!r} is not a tensor; give its value explicitly")
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append((dims or {}).get(d.dim_param, default_dim))
        if dt == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif dt.kind == "u":
            feeds[vi.name] = rng.integers(0, 10, size=shape).astype(dt)
        elif dt.kind == "i":
            feeds[vi.name] = rng.integers(-5, 5, size=shape).astype(dt)
        elif dt.kind == "f":
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
        else:
            raise ValueError(f"input {vi.name!r} has type {dt}; give its value explicitly")
    return feeds
