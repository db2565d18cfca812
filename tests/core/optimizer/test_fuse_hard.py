"""``hard_activation_fusion``: the elementwise spellings of HardSwish and HardSigmoid,
``HardSigmoid(x) * x`` and scalar affine maps become one onnxrt ``HardActivation``, whose
outputs are the unfused graph's bit for bit and agree with onnxruntime; what it must
leave alone stays as it was."""

import numpy as np
import onnxruntime as rt
import pytest
from onnx import TensorProto, helper

from tests.core.optimizer.util import ALL, OFF, model, ops, session, vi

SHAPE = [1, 8, 40, 40]
HARD = "ai.onnxrt:HardActivation"


def _feeds(seed=0):
    x = (np.random.default_rng(seed).standard_normal(SHAPE) * 4).astype(np.float32)
    x.reshape(-1)[:8] = [-3.0, 3.0, 0.0, -0.0, np.inf, -np.inf, -2.9999998, 6.0]
    return {"x": x}


def _scalars(**values):
    return {k: np.array(v, np.float32) for k, v in values.items()}


def _check(m, expect_hard: int, leftover=()):
    """Fused as expected; the same bits as without the fusion and as the unoptimized
    graph; close to onnxruntime."""
    feeds = _feeds()
    fused = session(m)
    counts = ops(fused)
    assert counts[HARD] == expect_hard, counts
    for op in leftover:
        assert counts[op], counts
    got = fused.run(None, feeds)
    for other in (session(m, ALL, disabled=["hard_activation_fusion"]), session(m, OFF)):
        for g, w in zip(got, other.run(None, feeds)):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    theirs = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, theirs):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    return counts


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("order", ["mul_then_div", "div_then_mul", "mul_sixth", "swapped_operands"])
def test_hard_swish_spellings(opset, order):
    n = [helper.make_node("Add", ["three", "x"] if order == "swapped_operands" else ["x", "three"], ["a"]),
         helper.make_node("Clip", ["a", "zero", "six"], ["c"])]
    if order == "div_then_mul":
        n += [helper.make_node("Div", ["c", "six"], ["d"]), helper.make_node("Mul", ["x", "d"], ["y"])]
    elif order == "mul_sixth":
        n += [helper.make_node("Mul", ["c", "x"], ["m"]), helper.make_node("Mul", ["sixth", "m"], ["y"])]
    else:
        n += [helper.make_node("Mul", ["c", "x"] if order == "swapped_operands" else ["x", "c"], ["m"]),
              helper.make_node("Div", ["m", "six"], ["y"])]
    m = model(n, [vi("x", SHAPE)], [vi("y", SHAPE)], _scalars(three=3, zero=0, six=6, sixth=1 / 6), opset=opset)
    counts = _check(m, 1)
    assert not counts["Clip"] and not counts["Div"] and not counts["Mul"] and not counts["Add"]


def test_hard_sigmoid_spelling_and_clip6_attributes():
    n = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a"], ["c"], min=0.0, max=6.0),
         helper.make_node("Div", ["c", "six"], ["y"])]
    _check(model(n, [vi("x", SHAPE)], [vi("y", SHAPE)], _scalars(three=3, six=6), opset=10), 1)


def test_omitted_clip_bound_is_float32_max():
    n = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "", "six"], ["c"]),
         helper.make_node("Mul", ["x", "c"], ["y"])]
    _check(model(n, [vi("x", SHAPE)], [vi("y", SHAPE)], _scalars(three=3, six=6), opset=13), 1)


def test_hard_sigmoid_times_its_input():
    n = [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=0.1666667014, beta=0.5),
         helper.make_node("Mul", ["h", "x"], ["y"])]
    _check(model(n, [vi("x", SHAPE)], [vi("y", SHAPE)], opset=13), 1)


def test_learnable_affine_after_an_activation():
    """PP-OCRv4's ``Add(Mul(y, s), b)`` after its HardSwish: two HardActivations."""
    n = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["s", "r"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["t"]), helper.make_node("Add", ["t", "three"], ["a"]),
         helper.make_node("Clip", ["a", "zero", "six"], ["c"]), helper.make_node("Mul", ["t", "c"], ["p"]),
         helper.make_node("Div", ["p", "six"], ["y"])]
    inits = _scalars(s=0.63296586, b=-0.54658866, three=3, zero=0, six=6)
    _check(model(n, [vi("x", SHAPE)], [vi("y", SHAPE)], inits, opset=12), 2, leftover=["Relu"])


def test_scaled_clip_without_a_gate():
    n = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Clip", ["a", "zero", "one"], ["y"])]
    _check(model(n, [vi("x", SHAPE)], [vi("y", SHAPE)], _scalars(s=0.2, b=0.5, zero=0, one=1), opset=13), 1)


def test_gate_keeps_a_scaling_out():
    """``x' = x * s`` feeds both the Add and the gate: the product is with x', so the
    Mul stays (and the rest is fused)."""
    n = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Add", ["t", "three"], ["a"]),
         helper.make_node("Clip", ["a", "zero", "six"], ["c"]), helper.make_node("Mul", ["t", "c"], ["p"]),
         helper.make_node("Div", ["p", "six"], ["y"])]
    m = model(n, [vi("x", SHAPE)], [vi("y", SHAPE)], _scalars(s=1.7, three=3, zero=0, six=6), opset=13)
    counts = _check(m, 1)
    assert counts["Mul"] == 1


def test_left_alone():
    inits = _scalars(three=3, zero=0, six=6)
    inits["vec"] = np.full([1, 8, 1, 1], 3, np.float32)
    io = [vi("x", SHAPE)], [vi("y", SHAPE)]
    # a per-channel offset is not a scalar: nothing is fused
    n = [helper.make_node("Add", ["x", "vec"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
         helper.make_node("Mul", ["x", "c"], ["y"])]
    counts = _check(model(n, *io, inits, opset=13), 0, leftover=["Add", "Clip", "Mul"])
    # six divided by the product is no factor: the chain ends before the Div
    n = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
         helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["six", "m"], ["y"])]
    counts = _check(model(n, *io, inits, opset=13), 1, leftover=["Div"])
    assert not counts["Mul"]
    # a Clip alone is one pass already
    _check(model([helper.make_node("Clip", ["x", "zero", "six"], ["y"])], *io, inits, opset=13), 0, leftover=["Clip"])


def test_an_intermediate_read_elsewhere_stops_the_chain():
    n = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
         helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])]
    m = model(n, [vi("x", SHAPE)], [vi("y", SHAPE), vi("c", SHAPE)], _scalars(three=3, zero=0, six=6), opset=13)
    counts = _check(m, 1)  # Add and Clip fused; the product and the division stay
    assert counts["Mul"] == 1 and counts["Div"] == 1


def test_float16_chains_are_not_fused():
    """A float16 graph rounds to float16 after every node."""
    n = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
         helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "divisor"], ["y"])]
    inits = {k: np.array(v, np.float16) for k, v in dict(three=3, zero=0, six=6, divisor=6).items()}
    m = model(n, [vi("x", SHAPE, TensorProto.FLOAT16)], [vi("y", SHAPE, TensorProto.FLOAT16)], inits, opset=13)
    fused = session(m)
    assert ops(fused)[HARD] == 0
    x = _feeds()["x"].astype(np.float16)
    unfused = session(m, ALL, disabled=["hard_activation_fusion"])
    np.testing.assert_array_equal(fused.run(None, {"x": x})[0], unfused.run(None, {"x": x})[0])
