"""The optimizer on the exported test models: node counts shrink, outputs stay equal,
shapes fixed by free-dimension overrides fold, and the saved optimized model is valid
ONNX that onnxrt and onnxruntime both run."""

from pathlib import Path

import numpy as np
import onnx
import pytest

from .util import ALL, BASIC, OFF, ops, session

DATA = Path(__file__).resolve().parents[2] / "models" / "data"
FIXED = {"batch": 1, "height": 64, "width": 64, "sequence": 8}


def feeds_for(sess, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else FIXED[d] for d in i.shape]
        if "int64" in i.type:
            high = 2 if ("mask" in i.name or "type" in i.name) else 50
            out[i.name] = rng.integers(0, high, shape).astype(np.int64)
            if "mask" in i.name:
                out[i.name][:, 0] = 1
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


#: model -> (nodes in the file, at ORT_ENABLE_ALL, at ORT_ENABLE_ALL with fixed dims, fused ops then)
EXPECTED = {
    "resnet_small": (29, 13, 13, {"com.microsoft:FusedConv": 7}),
    # three projections + skip Add without an activation are FusedConv with a residual
    "mobilenet_small": (64, 18, 18, {"com.microsoft:FusedConv": 14}),
    "transformer_encoder": (169, 41, 29, {"com.microsoft:BiasGelu": 2, "com.microsoft:SkipLayerNormalization": 4,
                                          "com.microsoft:Attention": 2}),
    "bert_tiny": (256, 88, 39, {"com.microsoft:BiasGelu": 2, "com.microsoft:SkipLayerNormalization": 5,
                                 "com.microsoft:FusedGemm": 1, "com.microsoft:MultiHeadAttention": 2}),
    # 19 Conv -> Sigmoid -> Mul (SiLU) activations become QuickGelu, then FusedConv with it
    "yolo_small": (270, 123, 67, {"com.microsoft:FusedConv": 19}),  # two Mul -> Add pairs: HardActivation
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_node_counts_and_outputs(name):
    path = DATA / f"{name}.onnx"
    total, at_all, at_all_fixed, must = EXPECTED[name]
    assert len(onnx.load(path).graph.node) == total
    off = session(path, OFF, fixed=FIXED)
    feeds = feeds_for(off)
    want = off.run(None, feeds)
    for fixed, count in ((None, at_all), (FIXED, at_all_fixed)):
        sess = session(path, ALL, fixed=fixed)
        found = ops(sess)
        assert sum(found.values()) == count, found
        for op, n in must.items():
            assert fixed is None or found[op] == n, found
        for got, w in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)


def test_fixed_dims_let_the_yolo_decoding_grid_fold():
    """Shape -> Gather -> Range -> Expand chains fold once the image size is fixed."""
    path = DATA / "yolo_small.onnx"
    free = ops(session(path, BASIC))
    fixed = ops(session(path, BASIC, fixed=FIXED))
    assert free["Shape"] > 0 and free["Range"] == 4 and free["Expand"] == 4
    assert fixed["Shape"] == 0 and fixed["Range"] == 0 and fixed["Expand"] == 0
    # (with free dims, Gathers of the static channel dimensions of a Shape fold too)
    assert sum(fixed.values()) < sum(free.values()) - 50


def test_a_fixed_dims_session_still_refuses_other_sizes():
    sess = session(DATA / "yolo_small.onnx", ALL, fixed=FIXED)
    with pytest.raises(Exception, match="images"):
        sess.run(None, {"images": np.zeros((1, 3, 96, 64), np.float32)})


@pytest.mark.parametrize("name", ["resnet_small", "bert_tiny", "transformer_encoder"])
def test_saved_optimized_model_is_valid_and_runs_everywhere(name, tmp_path):
    rt = pytest.importorskip("onnxruntime")
    path = DATA / f"{name}.onnx"
    out = tmp_path / "opt.onnx"
    sess = session(path, ALL, fixed=FIXED, save=out)
    feeds = feeds_for(sess)
    want = sess.run(None, feeds)
    saved = onnx.load(out)
    assert "com.microsoft" in {n.domain for n in saved.graph.node}
    assert "com.microsoft" in {o.domain for o in saved.opset_import}
    onnx.checker.check_model(saved)
    np.testing.assert_allclose(session(saved, OFF).run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-5)
    got = rt.InferenceSession(saved.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def _head_size_model(index, starts=None):
    """x [batch, 6, 8] -> Reshape(x, [-1, 2, d]) with ``d`` picked from Shape(x) at run
    time, as exported attention computes its head size: by a Gather of dimension
    ``index``, or a Slice from ``starts`` to ``starts + 1``."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    if starts is None:
        nodes.append(helper.make_node("Gather", ["s", "i"], ["d"], axis=0))
        inits = [onnx.numpy_helper.from_array(np.array(index, np.int64), "i")]
        nodes.append(helper.make_node("Unsqueeze", ["d", "ax"], ["du"]))
    else:
        nodes.append(helper.make_node("Slice", ["s", "st", "en"], ["du"]))
        inits = [onnx.numpy_helper.from_array(np.array([starts], np.int64), "st"),
                 onnx.numpy_helper.from_array(np.array([starts + 1], np.int64), "en")]
    inits += [onnx.numpy_helper.from_array(np.array([0], np.int64), "ax"),
              onnx.numpy_helper.from_array(np.array([-1, 2], np.int64), "head")]
    nodes += [helper.make_node("Concat", ["head", "du"], ["t"], axis=0),
              helper.make_node("Reshape", ["x", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("index,starts,folds", [(2, None, True), (-1, None, True), (0, None, False),
                                                (None, 2, True), (None, 0, False)])
def test_static_dims_picked_from_a_dynamic_shape_fold(index, starts, folds):
    m = _head_size_model(index, starts)
    sess = session(m, BASIC)
    found = ops(sess)
    # the picked dimension is static (8) or the batch (dynamic)
    assert ("Gather" in found or "Slice" in found) is not folds, found
    assert ("Shape" in found) is not folds, found
    x = np.arange(3 * 6 * 8, dtype=np.float32).reshape(3, 6, 8)
    want = session(m, OFF).run(None, {"x": x})[0]
    got = sess.run(None, {"x": x})[0]
    assert got.shape == want.shape and np.array_equal(got, want)
