"""The session's public API, as onnxruntime users know it."""

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxrt as ort

from ..conftest import make_model


def _reference(model, x):
    w1, b1, w2 = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer)
    h = np.maximum(x @ w1 + b1, 0) @ w2
    e = np.exp(h - h.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_run_matches_numpy(mlp_model):
    sess = ort.InferenceSession(mlp_model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(mlp_model, x), rtol=1e-5, atol=1e-6)
    assert y.dtype == np.float32 and y.shape == (5, 3)


def test_accepts_path_bytes_and_proto(mlp_model, tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(mlp_model, p)
    x = np.ones((2, 4), np.float32)
    outs = [ort.InferenceSession(src).run(None, {"x": x})[0] for src in (str(p), p.read_bytes(), mlp_model)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_inputs_outputs_and_meta(mlp_model):
    mlp_model.producer_name = "tests"
    mlp_model.metadata_props.add(key="k", value="v")
    sess = ort.InferenceSession(mlp_model)
    (i,) = sess.get_inputs()
    assert (i.name, i.type, i.shape) == ("x", "tensor(float)", ["N", 4])
    (o,) = sess.get_outputs()
    assert (o.name, o.type, o.shape) == ("y", "tensor(float)", ["N", 3])
    meta = sess.get_modelmeta()
    assert meta.producer_name == "tests" and meta.custom_metadata_map == {"k": "v"}
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}


@pytest.mark.parametrize(
    "feed,match",
    [
        ({}, "missing input 'x'"),
        ({"x": np.ones((1, 4), np.float32), "z": np.ones(1)}, "unknown input 'z'"),
        ({"x": np.ones((1, 4), np.float64)}, "dtype float64; the model expects float32"),
        ({"x": np.ones((4,), np.float32)}, "rank 1"),
        ({"x": np.ones((1, 5), np.float32)}, "size 5 in dimension 1"),
        # a list converts to the input's type, as in onnxruntime; a ragged one cannot
        ({"x": [[1.0, 2.0], [3.0]]}, "the list does not convert"),
        ({"x": "1.0"}, "must be a numpy array"),
    ],
)
def test_feed_errors_are_typed_and_name_the_input(mlp_model, feed, match):
    sess = ort.InferenceSession(mlp_model)
    with pytest.raises(ort.InvalidArgument, match=match):
        sess.run(None, feed)
    # a failed run leaves the session usable
    (y,) = sess.run(None, {"x": np.ones((1, 4), np.float32)})
    assert y.shape == (1, 3)


def test_symbolic_dimension_must_agree_across_inputs():
    model = make_model(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", 2])],
    )
    sess = ort.InferenceSession(model)
    with pytest.raises(ort.InvalidArgument, match="symbolic dimension 'N' is 2 in input 'a' but 3"):
        sess.run(None, {"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.float32)})


def test_output_selection(mlp_model):
    sess = ort.InferenceSession(mlp_model)
    x = np.ones((1, 4), np.float32)
    assert len(sess.run(["y"], {"x": x})) == 1
    with pytest.raises(ort.InvalidArgument, match="unknown output 'nope'"):
        sess.run(["nope"], {"x": x})


def test_overridable_initializer():
    # an initializer that is also a graph input may be fed at run time
    w = np.array([1.0, 2.0], np.float32)
    model = make_model(
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    sess = ort.InferenceSession(model)
    assert [a.name for a in sess.get_inputs()] == ["x"]
    assert [a.name for a in sess.get_overridable_initializers()] == ["w"]
    x = np.array([3.0, 4.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [3.0, 8.0])
    np.testing.assert_array_equal(sess.run(None, {"x": x, "w": np.array([10.0, 10.0], np.float32)})[0], [30.0, 40.0])
    # the override did not stick
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [3.0, 8.0])


def test_outputs_never_alias_inputs_or_constants():
    c = np.array([1.0, 2.0], np.float32)
    model = make_model(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["c"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(c, "c")],
    )
    sess = ort.InferenceSession(model)
    x = np.array([5.0, 6.0], np.float32)
    y, z = sess.run(None, {"x": x})
    assert not np.shares_memory(x, y)
    z[:] = 0  # must not corrupt the session's constant
    np.testing.assert_array_equal(sess.run(None, {"x": x})[1], [1.0, 2.0])


def test_sequence_outputs_never_alias_inputs_or_constants():
    """The tensors of a sequence output are the caller's own too, as onnxruntime's are:
    a SequenceConstruct of a feed, a constant and the feed again handed out the feed
    itself (twice) and the session's read-only constant."""
    c = np.array([1.0, 2.0], np.float32)
    model = make_model(
        [helper.make_node("SequenceConstruct", ["x", "c", "x"], ["s"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(c, "c")],
    )
    sess = ort.InferenceSession(model)
    x = np.array([5.0, 6.0], np.float32)
    (seq,) = sess.run(None, {"x": x})
    assert all(t.flags.writeable for t in seq)
    assert not any(np.shares_memory(x, t) for t in seq) and not np.shares_memory(seq[0], seq[2])
    for t in seq:
        t[:] = -1  # must reach neither the feed nor the session's constant
    np.testing.assert_array_equal(x, [5.0, 6.0])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0][1], [1.0, 2.0])


def test_outputs_of_constant_nodes_are_fresh_and_writable():
    # without constant folding the value comes from the Constant kernel's own array
    model = make_model(
        [helper.make_node("Constant", [], ["y"], value_floats=[1.0, 2.0])],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, so)
    (a,) = sess.run(None, {})
    (b,) = sess.run(None, {})
    assert a.flags.writeable and not np.shares_memory(a, b)
    a[:] = 0
    np.testing.assert_array_equal(sess.run(None, {})[0], [1.0, 2.0])


def test_concurrent_runs_on_one_session(mlp_model):
    sess = ort.InferenceSession(mlp_model)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((int(rng.integers(1, 9)), 4)).astype(np.float32) for _ in range(32)]
    expected = [sess.run(None, {"x": x})[0] for x in xs]
    errors = []

    def worker(k):
        for j in range(50):
            i = (k * 7 + j) % len(xs)
            (y,) = sess.run(None, {"x": xs[i]})
            if not np.array_equal(y, expected[i]):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_kernel_error_names_node_and_session_survives():
    model = make_model(
        [helper.make_node("Gather", ["data", "idx"], ["y"], name="the_gather")],
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    sess = ort.InferenceSession(model)
    data = np.array([1.0, 2.0, 3.0], np.float32)
    with pytest.raises(ort.InvalidArgument, match="Gather node 'the_gather' on CPUExecutionProvider"):
        sess.run(None, {"data": data, "idx": np.array([7], np.int64)})
    np.testing.assert_array_equal(sess.run(None, {"data": data, "idx": np.array([2], np.int64)})[0], [3.0])


def test_run_options_terminate(mlp_model):
    sess = ort.InferenceSession(mlp_model)
    ro = ort.RunOptions()
    ro.terminate = True
    with pytest.raises(ort.RuntimeException, match="terminated"):
        sess.run(None, {"x": np.ones((1, 4), np.float32)}, ro)


def test_unknown_session_argument(mlp_model):
    with pytest.raises(ort.InvalidArgument, match="unknown InferenceSession argument"):
        ort.InferenceSession(mlp_model, provider="cpu")


def test_ort_value_and_io_binding(mlp_model):
    sess = ort.InferenceSession(mlp_model)
    x = np.ones((2, 4), np.float32)
    ov = ort.OrtValue.ortvalue_from_numpy(x)
    assert ov.device_name() == "cpu" and ov.shape() == [2, 4] and ov.data_type() == "tensor(float)"
    (out,) = sess.run_with_ort_values(["y"], {"x": ov})
    np.testing.assert_array_equal(out.numpy(), sess.run(None, {"x": x})[0])
    b = sess.io_binding()
    b.bind_cpu_input("x", x)
    b.bind_output("y")
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], out.numpy())


def test_optimized_model_is_saved_and_valid(mlp_model, tmp_path):
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(mlp_model, so)
    saved = onnx.load(so.optimized_model_filepath)
    onnx.checker.check_model(saved)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(ort.InferenceSession(saved).run(None, {"x": x})[0],
                               ort.InferenceSession(mlp_model).run(None, {"x": x})[0], rtol=1e-6)


def test_disabled_optimizers_must_exist(mlp_model):
    so = ort.SessionOptions()
    so.disabled_optimizers = ["no_such_transform"]
    with pytest.raises(ort.InvalidArgument, match="no_such_transform"):
        ort.InferenceSession(mlp_model, so)
    with pytest.raises(ort.InvalidArgument, match="no_such_transform"):
        ort.InferenceSession(mlp_model, disabled_optimizers=["no_such_transform"])


def test_disabled_optimizers_as_onnxruntimes_keyword_leave_the_options_alone():
    """``InferenceSession(..., disabled_optimizers=[...])`` as onnxruntime spells it: the
    named transforms do not run, and the caller's SessionOptions are not changed."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                       [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
                       [onnx.numpy_helper.from_array(np.ones((3, 2), np.float32), "w"),
                        onnx.numpy_helper.from_array(np.ones(2, np.float32), "b")])
    so = ort.SessionOptions()
    fused = ort.InferenceSession(model, so)
    kept = ort.InferenceSession(model, so, disabled_optimizers=["matmul_add_fusion"])
    assert so.disabled_optimizers == []
    assert "Gemm" in {n.op_type for n in fused._built.graph.nodes}
    assert {n.op_type for n in kept._built.graph.nodes} == {"MatMul", "Add"}
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_allclose(kept.run(None, feeds)[0], fused.run(None, feeds)[0])


def test_constant_folding_runs_constant_subgraphs():
    model = make_model(
        [helper.make_node("Shape", ["c"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [onnx.numpy_helper.from_array(np.zeros((2, 3), np.float32), "c")],
    )
    sess = ort.InferenceSession(model)
    assert [d["op_type"] for d in sess.get_provider_assignment()] == ["Reshape"]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert [d["op_type"] for d in ort.InferenceSession(model, so).get_provider_assignment()] == ["Shape", "Reshape"]
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.reshape(2, 3))


def test_profiling_writes_chrome_trace(mlp_model, tmp_path):
    import json

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the model's own ops
    sess = ort.InferenceSession(mlp_model, so)
    sess.run(None, {"x": np.ones((1, 4), np.float32)})
    path = sess.end_profiling()
    events = json.load(open(path))
    nodes = [e for e in events if e["cat"] == "Node"]
    assert {e["args"]["op_name"] for e in nodes} >= {"MatMul", "Relu", "Softmax"}
    assert all(e["ph"] == "X" and e["args"]["provider"] == "CPUExecutionProvider" for e in nodes)
    assert any(e["cat"] == "Session" for e in events)


def test_free_dimension_override_fixes_a_symbolic_dimension(mlp_model):
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_name("N", 2)
    sess = ort.InferenceSession(mlp_model, so)
    assert sess.run(None, {"x": np.ones((2, 4), np.float32)})[0].shape == (2, 3)
    with pytest.raises(ort.InvalidArgument, match="size 3 in dimension 0"):
        sess.run(None, {"x": np.ones((3, 4), np.float32)})


def test_set_providers_rebuilds(mlp_model):
    sess = ort.InferenceSession(mlp_model)
    x = np.ones((1, 4), np.float32)
    before = sess.run(None, {"x": x})[0]
    sess.set_providers(["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], before)


def test_large_weights_are_held_once_as_arrays_and_the_model_still_round_trips(tmp_path):
    """The session keeps large initializers as arrays, not in a second copy of the proto,
    and everything that reads the model (inputs, overridable initializers, metadata, the
    saved optimized model, set_providers) still sees them."""
    from onnx import numpy_helper

    w = np.random.default_rng(0).standard_normal((32, 48)).astype(np.float32)
    shape = numpy_helper.from_array(np.array([-1, 32], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])]
    m = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(w, "w"), shape])
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert [a.name for a in sess.get_inputs()] == ["x"]
    assert "w" not in {t.name for t in sess._proto.graph.initializer} and "w" in sess._weights
    x = np.ones((3, 64), np.float32)
    (y,) = sess.run(None, {"x": x})
    want = x.reshape(-1, 32) @ w
    np.testing.assert_allclose(y, want, rtol=1e-5)
    saved = onnx.load(so.optimized_model_filepath)
    assert "w" in {t.name for t in saved.graph.initializer}
    sess.set_providers(["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5)
