"""Level-1 weight folds: BatchNormalization, per-channel Add and Mul into Conv; MatMul+Add into Gemm."""

import numpy as np
import pytest
from onnx import helper

import onnxrt as ort

from .util import BASIC, OFF, assert_same_outputs, f32, model, ops, session, vi


def conv_then(*after, bias=True, inits=(), out="y", extra_outputs=()):
    """x[1,3,8,8] -> Conv(4 channels, 3x3) -> ``after`` nodes -> ``out``."""
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1])]
    nodes += list(after)
    init = {"w": f32(4, 3, 3, 3, seed=1), "b": f32(4, seed=2)}
    if not bias:
        init.pop("b")
    init.update(dict(inits))
    outs = [vi(out, None)] + [vi(o, None) for o in extra_outputs]
    return model(nodes, [vi("x", [1, 3, 8, 8])], outs, init)


def bn_params(seed=3):
    rng = np.random.default_rng(seed)
    return {"scale": f32(4, seed=seed), "beta": f32(4, seed=seed + 1), "mean": f32(4, seed=seed + 2),
            "var": (rng.random(4) + 0.5).astype(np.float32)}


BN = helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"], epsilon=1e-3)
FEEDS = {"x": f32(1, 3, 8, 8, seed=9)}


@pytest.mark.parametrize("bias", [True, False])
def test_conv_bn_folds_into_the_conv_weights(bias):
    m = conv_then(BN, bias=bias, inits=bn_params())
    sess = assert_same_outputs(m, FEEDS, rtol=1e-5, atol=1e-5)
    assert ops(sess) == {"Conv": 1}
    assert ops(session(m, BASIC)) == {"Conv": 1}  # a level-1 transform, as in onnxruntime


def test_conv_bn_disabled_by_name_and_at_level_0():
    m = conv_then(BN, inits=bn_params())
    assert ops(session(m, disabled=["conv_bn_fusion"]))["BatchNormalization"] == 1
    assert ops(session(m, OFF)) == {"Conv": 1, "BatchNormalization": 1}


def test_conv_bn_keeps_a_conv_output_that_is_read_elsewhere():
    m = conv_then(BN, inits=bn_params(), extra_outputs=["c"])
    sess = assert_same_outputs(m, FEEDS, atol=1e-5)
    assert ops(sess)["BatchNormalization"] == 1


def test_conv_bn_needs_constant_statistics():
    m = conv_then(BN, inits={k: v for k, v in bn_params().items() if k != "var"})
    m.graph.input.append(vi("var", [4]))
    feeds = dict(FEEDS, var=np.full(4, 0.7, np.float32))
    want = session(m, OFF).run(None, feeds)
    sess = session(m)
    assert ops(sess)["BatchNormalization"] == 1
    np.testing.assert_allclose(sess.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), (1,), ()])
@pytest.mark.parametrize("op,name", [("Add", "conv_add_fusion"), ("Mul", "conv_mul_fusion")])
def test_per_channel_add_and_mul_fold(op, name, shape):
    c = f32(*shape, seed=5) if shape else np.float32(1.5)
    m = conv_then(helper.make_node(op, ["c", "k"], ["y"]), inits={"k": c})
    sess = assert_same_outputs(m, FEEDS, atol=1e-5)
    assert ops(sess) == {"Conv": 1}
    assert ops(session(m, disabled=[name]))[op] == 1


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_add_and_mul_that_vary_over_space_stay(op):
    m = conv_then(helper.make_node(op, ["k", "c"], ["y"]), inits={"k": f32(4, 8, 8, seed=5)})
    sess = assert_same_outputs(m, FEEDS, atol=1e-5)
    assert ops(sess)[op] == 1


def test_matmul_add_becomes_gemm():
    m = model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["bias", "p"], ["y"])],
              [vi("a", ["n", 6])], [vi("y", ["n", 5])], {"w": f32(6, 5, seed=1), "bias": f32(5, seed=2)})
    sess = assert_same_outputs(m, {"a": f32(3, 6, seed=3)})
    assert ops(sess) == {"Gemm": 1}
    assert ops(session(m, disabled=["matmul_add_fusion"])) == {"MatMul": 1, "Add": 1}


def _matmul_add(a_shape, bias_shape):
    return model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["y"])],
                 [vi("a", a_shape), vi("bias", bias_shape)], [vi("y", None)], {"w": f32(6, 5, seed=1)})


def test_matmul_add_takes_a_run_time_bias_of_the_product_shape():
    m = _matmul_add(["n", 6], ["n", 5])
    sess = assert_same_outputs(m, {"a": f32(3, 6), "bias": f32(3, 5, seed=4)})
    assert ops(sess) == {"Gemm": 1}


@pytest.mark.parametrize("a_shape,bias_shape", [
    ([2, "n", 6], [5]),     # 3-D: Gemm is 2-D only
    (["n", 6], ["m", 5]),   # rows that may differ: the product could broadcast up to the bias
    (["n", 6], [3, 1, 5]),  # the bias would raise the result's rank
])
def test_matmul_add_stays_where_gemm_could_differ(a_shape, bias_shape):
    m = _matmul_add(a_shape, bias_shape)
    sess = session(m)
    assert ops(sess) == {"MatMul": 1, "Add": 1}
    size = {"n": 2, "m": 2}
    feeds = {"a": f32(*[size.get(d, d) for d in a_shape]), "bias": f32(*[size.get(d, d) for d in bias_shape], seed=4)}
    np.testing.assert_allclose(sess.run(None, feeds)[0], session(m, OFF).run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def test_matmul_output_read_twice_is_not_fused():
    m = model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["y"])],
              [vi("a", [3, 6])], [vi("y", [3, 5]), vi("p", [3, 5])], {"w": f32(6, 5), "bias": f32(5)})
    assert ops(session(m)) == {"MatMul": 1, "Add": 1}


def test_conv_with_a_misshapen_bias_is_not_folded_and_fails_as_the_kernel_reports():
    m = conv_then(BN, inits=dict(bn_params(), b=f32(2, 2, seed=2)))
    with pytest.raises(ort.OnnxRtError):
        session(m).run(None, FEEDS)
    assert ops(session(m, disabled=[]))["BatchNormalization"] == 1


def bn_then(*after, x_shape=(2, 4, 6, 6), inits=()):
    """x -> MaxPool(1x1) -> BatchNormalization -> ``after``: a BatchNorm with no Conv
    before it, as in pre-activation networks."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[1] * (len(x_shape) - 2)),
             helper.make_node("BatchNormalization", ["p", "scale", "beta", "mean", "var"], ["c"], epsilon=1e-3)]
    nodes += list(after)
    init = bn_params()
    init.update(dict(inits))
    return model(nodes, [vi("x", list(x_shape))], [vi("y", None)], init)


def test_bn_scale_layer_folds_into_the_batchnorm():
    """BatchNorm -> Mul -> Add -> Relu (the Caffe Scale layer): one BatchNorm and the Relu."""
    m = bn_then(helper.make_node("Mul", ["c", "s"], ["d"]), helper.make_node("Add", ["t", "d"], ["e"]),
                helper.make_node("Relu", ["e"], ["y"]), inits={"s": f32(4, 1, 1, seed=6), "t": f32(4, 1, 1, seed=7)})
    feeds = {"x": f32(2, 4, 6, 6, seed=8)}
    sess = assert_same_outputs(m, feeds, rtol=1e-5, atol=1e-5)
    assert ops(sess) == {"MaxPool": 1, "BatchNormalization": 1, "Relu": 1}
    assert ops(session(m, BASIC)) == {"MaxPool": 1, "BatchNormalization": 1, "Relu": 1}
    assert ops(session(m, disabled=["bn_mul_fusion"]))["Mul"] == 1
    assert ops(session(m, disabled=["bn_add_fusion"]))["Add"] == 1
    assert ops(session(m, OFF))["Mul"] == 1


@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), (1,), ()])
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_bn_per_channel_constants_fold(op, shape):
    c = f32(*shape, seed=5) if shape else np.float32(1.5)
    m = bn_then(helper.make_node(op, ["c", "k"], ["y"]), inits={"k": c})
    sess = assert_same_outputs(m, {"x": f32(2, 4, 6, 6, seed=8)}, atol=1e-5)
    assert op not in ops(sess)


@pytest.mark.parametrize("op,const,x_shape", [
    ("Mul", (1, 6, 1), (2, 4, 6, 6)),  # varies along H, not channels
    ("Add", (6, 1), (2, 4, 6, 6)),  # [6, 1] varies along H for a rank-4 input
    ("Mul", (4, 1, 1), (4, 4, 6)),  # rank 3: [4, 1, 1] is along the batch axis
])
def test_bn_constants_that_are_not_per_channel_stay(op, const, x_shape):
    m = bn_then(helper.make_node(op, ["c", "k"], ["y"]), x_shape=x_shape, inits={"k": f32(*const, seed=5)})
    sess = assert_same_outputs(m, {"x": f32(*x_shape, seed=8)}, atol=1e-5)
    assert ops(sess)[op] == 1


def test_bn_output_read_elsewhere_is_not_folded():
    m = bn_then(helper.make_node("Mul", ["c", "k"], ["y"]), inits={"k": f32(4, 1, 1, seed=5)})
    m.graph.output.append(vi("c", None))
    sess = assert_same_outputs(m, {"x": f32(2, 4, 6, 6, seed=8)}, atol=1e-5)
    assert ops(sess)["Mul"] == 1
