"""Level-2 Conv+activation -> FusedConv (with a residual Z) and Gemm+activation -> FusedGemm."""

import numpy as np
import pytest
from onnx import helper

from .util import OFF, assert_same_outputs, f32, model, ops, session, vi

FEEDS = {"x": f32(1, 3, 8, 8, seed=9, scale=2.0)}
W = {"w": f32(4, 3, 3, 3, seed=1), "b": f32(4, seed=2)}


def conv_model(*after, out="y", inits=(), extra_outputs=(), extra_inputs=()):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])] + list(after)
    init = dict(W)
    init.update(dict(inits))
    return model(nodes, [vi("x", [1, 3, 8, 8])] + list(extra_inputs),
                 [vi(out, None)] + [vi(o, None) for o in extra_outputs], init)


ACTIVATIONS = [
    (helper.make_node("Relu", ["c"], ["y"]), {}),
    (helper.make_node("Sigmoid", ["c"], ["y"]), {}),
    (helper.make_node("Tanh", ["c"], ["y"]), {}),
    (helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2), {}),
    (helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4), {}),
    (helper.make_node("Clip", ["c", "lo", "hi"], ["y"]), {"lo": np.float32(-0.5), "hi": np.float32(6.0)}),
    (helper.make_node("Clip", ["c", "", "hi"], ["y"]), {"hi": np.float32(1.0)}),
]


@pytest.mark.parametrize("act,inits", ACTIVATIONS, ids=lambda a: getattr(a, "op_type", ""))
def test_conv_activation_becomes_fused_conv(act, inits):
    m = conv_model(act, inits=inits)
    sess = assert_same_outputs(m, FEEDS, atol=1e-5)
    assert ops(sess) == {"com.microsoft:FusedConv": 1}
    node = sess._built.graph.nodes[0]
    assert node.attr("activation") == act.op_type and node.provider == "CPUExecutionProvider"
    assert ops(session(m, disabled=["conv_activation_fusion"]))[act.op_type] == 1


def test_conv_add_relu_becomes_fused_conv_with_a_residual():
    m = conv_model(helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"]),
                   extra_inputs=[vi("r", [1, 4, 8, 8])])
    sess = assert_same_outputs(m, dict(FEEDS, r=f32(1, 4, 8, 8, seed=4)), atol=1e-5)
    assert ops(sess) == {"com.microsoft:FusedConv": 1}
    assert sess._built.graph.nodes[0].inputs[3] == "r"


@pytest.mark.parametrize("order", [["c", "r"], ["r", "c"]])
def test_conv_sum_of_two_relu_becomes_fused_conv_with_a_residual(order):
    """A two-input Sum (Caffe2-converted ResNets write their residuals so) is the same
    addition as Add; a Sum of three is left alone."""
    m = conv_model(helper.make_node("Sum", order, ["s"]), helper.make_node("Relu", ["s"], ["y"]),
                   extra_inputs=[vi("r", [1, 4, 8, 8])])
    sess = assert_same_outputs(m, dict(FEEDS, r=f32(1, 4, 8, 8, seed=4)), atol=1e-5)
    assert ops(sess) == {"com.microsoft:FusedConv": 1}
    assert sess._built.graph.nodes[0].inputs[3] == "r"
    three = conv_model(helper.make_node("Sum", ["c", "r", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"]),
                       extra_inputs=[vi("r", [1, 4, 8, 8])])
    sess = assert_same_outputs(three, dict(FEEDS, r=f32(1, 4, 8, 8, seed=4)), atol=1e-5)
    assert ops(sess) == {"Conv": 1, "Sum": 1, "Relu": 1}


def test_residual_that_broadcasts_is_not_taken_as_z():
    m = conv_model(helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"]),
                   extra_inputs=[vi("r", [1, 1, 8, 8])])
    sess = assert_same_outputs(m, dict(FEEDS, r=f32(1, 1, 8, 8, seed=4)), atol=1e-5)
    assert ops(sess) == {"Conv": 1, "Add": 1, "Relu": 1}


def test_conv_output_read_twice_or_a_graph_output_is_not_fused():
    m = conv_model(helper.make_node("Relu", ["c"], ["y"]), helper.make_node("Neg", ["c"], ["z"]),
                   extra_outputs=["z"])
    assert ops(assert_same_outputs(m, FEEDS))["Relu"] == 1
    m = conv_model(helper.make_node("Relu", ["c"], ["y"]), extra_outputs=["c"])
    assert ops(assert_same_outputs(m, FEEDS))["Relu"] == 1


def test_clip_with_a_run_time_bound_is_not_fused():
    m = conv_model(helper.make_node("Clip", ["c", "lo"], ["y"]), extra_inputs=[vi("lo", [])])
    sess = session(m)
    assert ops(sess) == {"Conv": 1, "Clip": 1}
    feeds = dict(FEEDS, lo=np.array(0.25, np.float32))
    np.testing.assert_allclose(sess.run(None, feeds)[0], session(m, OFF).run(None, feeds)[0], atol=1e-6)


def test_unsupported_activation_is_left_alone():
    m = conv_model(helper.make_node("Softplus", ["c"], ["y"]))
    assert ops(assert_same_outputs(m, FEEDS, atol=1e-5)) == {"Conv": 1, "Softplus": 1}


@pytest.mark.parametrize("act", [helper.make_node("Relu", ["g"], ["y"]),
                                 helper.make_node("LeakyRelu", ["g"], ["y"], alpha=0.3),
                                 helper.make_node("Sigmoid", ["g"], ["y"])], ids=lambda a: a.op_type)
def test_gemm_activation_becomes_fused_gemm(act):
    m = model([helper.make_node("Gemm", ["a", "w", "c"], ["g"], transB=1, alpha=0.5), act],
              [vi("a", ["n", 6])], [vi("y", ["n", 5])], {"w": f32(5, 6, seed=1), "c": f32(5, seed=2)})
    sess = assert_same_outputs(m, {"a": f32(4, 6, seed=3)})
    assert ops(sess) == {"com.microsoft:FusedGemm": 1}
    assert ops(session(m, disabled=["gemm_activation_fusion"]))[act.op_type] == 1


def test_gemm_clip_is_not_fused():
    m = model([helper.make_node("Gemm", ["a", "w"], ["g"]), helper.make_node("Clip", ["g", "lo", "hi"], ["y"])],
              [vi("a", [3, 6])], [vi("y", [3, 5])], {"w": f32(6, 5), "lo": np.float32(0), "hi": np.float32(1)})
    assert ops(assert_same_outputs(m, {"a": f32(3, 6)})) == {"Gemm": 1, "Clip": 1}


def test_resnet_style_block_fuses_bn_relu_and_residual():
    """Conv-BN-Relu-Conv-BN + identity -> Relu: two FusedConvs, the second with Z."""
    rng = np.random.default_rng(0)

    def bn(name, x, y):
        return helper.make_node("BatchNormalization", [x, f"{name}_s", f"{name}_b", f"{name}_m", f"{name}_v"], [y])

    inits = {"w1": f32(4, 4, 3, 3, seed=1), "w2": f32(4, 4, 3, 3, seed=2)}
    for name in ("bn1", "bn2"):
        inits.update({f"{name}_s": f32(4, seed=3), f"{name}_b": f32(4, seed=4), f"{name}_m": f32(4, seed=5),
                      f"{name}_v": (rng.random(4) + 0.5).astype(np.float32)})
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), bn("bn1", "c1", "n1"),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), bn("bn2", "c2", "n2"),
             helper.make_node("Add", ["n2", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    m = model(nodes, [vi("x", [1, 4, 8, 8])], [vi("y", [1, 4, 8, 8])], inits)
    sess = assert_same_outputs(m, {"x": f32(1, 4, 8, 8, seed=7)}, atol=1e-4)
    assert ops(sess) == {"com.microsoft:FusedConv": 2}


def test_no_fusion_across_providers(fake_provider):
    """Relu and Add run on the fake device, Conv on the CPU: nothing may be fused across."""
    import onnxrt as ort

    for after, extra in (([helper.make_node("Relu", ["c"], ["y"])], []),
                         ([helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                          [vi("r", [1, 4, 8, 8])])):
        m = conv_model(*after, extra_inputs=extra)
        feeds = dict(FEEDS, r=f32(1, 4, 8, 8, seed=4)) if extra else FEEDS
        sess = ort.InferenceSession(m.SerializeToString(), providers=["FakeDeviceExecutionProvider",
                                                                      "CPUExecutionProvider"])
        by_op = {n.op_type: n.provider for n in sess._built.graph.nodes}
        assert by_op == {"Conv": "CPUExecutionProvider", "Relu": "FakeDeviceExecutionProvider",
                         **({"Add": "FakeDeviceExecutionProvider"} if extra else {})}
        np.testing.assert_allclose(sess.run(None, feeds)[0], session(m, OFF).run(None, feeds)[0], atol=1e-5)


def test_the_assignment_report_lists_the_fused_node_that_runs():
    m = conv_model(helper.make_node("Relu", ["c"], ["y"]))
    rows = session(m).get_provider_assignment()
    assert [(r["op_type"], r["provider"]) for r in rows] == [("FusedConv", "CPUExecutionProvider")]
    rows = session(m, OFF).get_provider_assignment()
    assert [r["op_type"] for r in rows] == ["Conv", "Relu"]
