"""The per-run path of a session: the common feed's quick check (and every feed it
hands to the full check), outputs handed out as the caller's own, BLAS threads around
a run, and If bodies entered through their plans with only the outer values they read.
Results are compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort_rt
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt.errors import InvalidArgument, OnnxRtError
from onnxrt.run import threads as run_threads
from onnxrt.run.feeds import FeedChecker

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _pair(model):
    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return (ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]),
            ort_rt.InferenceSession(data, providers=["CPUExecutionProvider"]))


def _two_input_model():
    # x [2, 3] fixed; y [N, 3] symbolic; z [N] symbolic (N shared between y and z)
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"]),
        helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0),
        helper.make_node("Add", ["s", "z"], ["b"]),
        helper.make_node("Identity", ["x"], ["xi"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F, [2, 3]),
        helper.make_tensor_value_info("y", F, ["N", 3]),
        helper.make_tensor_value_info("z", F, ["N"]),
    ]
    outputs = [helper.make_tensor_value_info(n, F, None) for n in ("a", "b", "xi", "w_out")]
    nodes.append(helper.make_node("Identity", ["w"], ["w_out"]))
    inits = [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    return _model(nodes, inputs, outputs, inits)


def _feeds(n=4):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((2, 3)).astype(np.float32),
            "y": rng.standard_normal((n, 3)).astype(np.float32),
            "z": rng.standard_normal(n).astype(np.float32)}


def test_common_feed_takes_the_quick_check_and_matches_onnxruntime():
    ours, theirs = _pair(_two_input_model())
    feeds = _feeds()
    assert ours._checker.check_fast(feeds) is feeds
    got = ours.run(None, feeds)
    want = theirs.run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    # a subset, reordered, by name
    b, a = ours.run(["b", "a"], feeds)
    np.testing.assert_allclose(a, want[0], rtol=1e-6)
    np.testing.assert_allclose(b, want[1], rtol=1e-6)


def test_outputs_are_the_callers_own_memory():
    ours, _ = _pair(_two_input_model())
    feeds = _feeds()
    a, b, xi, w_out = ours.run(None, feeds)
    # Identity of a feed and of a constant: copies, never the feed's or the weight's memory
    assert not np.shares_memory(xi, feeds["x"])
    np.testing.assert_array_equal(xi, feeds["x"])
    xi[...] = 0
    w_out[...] = 0
    a2, _, xi2, w2 = ours.run(None, feeds)
    np.testing.assert_array_equal(xi2, feeds["x"])
    np.testing.assert_array_equal(w2, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(a2, a)
    # a view of a feed fed again: still a copy
    big = np.zeros((4, 3), np.float32)
    feeds2 = dict(feeds, x=big[:2])
    assert ours._checker.check_fast(feeds2) is feeds2
    out = ours.run(["xi"], feeds2)[0]
    assert not np.shares_memory(out, big)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.asmatrix
def test_feeds_the_quick_check_declines_get_the_full_checks_errors():
    ours, _ = _pair(_two_input_model())
    checker = ours._checker
    feeds = _feeds()
    # another dtype, a list, a subclass, a missing and an unknown input
    declined = [
        dict(feeds, x=feeds["x"].astype(np.float64)),
        dict(feeds, x=feeds["x"].tolist()),
        dict(feeds, x=np.asmatrix(feeds["x"])),
        {k: v for k, v in feeds.items() if k != "z"},
        dict(feeds, extra=feeds["x"]),
        dict(feeds, x=feeds["x"].reshape(3, 2)),
        dict(feeds, z=feeds["z"][:3]),  # N is 4 in y, 3 in z
        dict(feeds, y=feeds["y"][None]),  # rank 3 for [N, 3]
        dict(feeds, y=feeds["y"][:, :2]),  # [N, 2] for [N, 3]
    ]
    for f in declined:
        assert checker.check_fast(f) is None
    with pytest.raises(InvalidArgument, match="dtype float64"):
        ours.run(None, declined[0])
    np.testing.assert_allclose(ours.run(["a"], declined[1])[0], ours.run(["a"], feeds)[0])
    np.testing.assert_allclose(ours.run(["a"], declined[2])[0], ours.run(["a"], feeds)[0])
    with pytest.raises(InvalidArgument, match="missing input 'z'"):
        ours.run(None, declined[3])
    with pytest.raises(InvalidArgument, match="unknown input 'extra'"):
        ours.run(None, declined[4])
    with pytest.raises(InvalidArgument, match="size 3 in dimension 0"):
        ours.run(None, declined[5])
    with pytest.raises(InvalidArgument, match="symbolic dimension 'N'"):
        ours.run(None, declined[6])
    with pytest.raises(InvalidArgument, match="rank 3"):
        ours.run(None, declined[7])
    with pytest.raises(InvalidArgument, match="size 2 in dimension 1"):
        ours.run(None, declined[8])
    # other sizes of N, consistent across y and z, take the quick check
    assert checker.check_fast(_feeds(7)) is not None
    with pytest.raises(InvalidArgument, match="unknown output"):
        ours.run(["nope"], feeds)
    with pytest.raises(InvalidArgument, match="must be a dict"):
        ours.run(None, [feeds["x"]])


def test_quick_check_is_off_where_an_input_is_optional_or_strings():
    tp_f = helper.make_tensor_type_proto(F, [2])
    tp_s = helper.make_tensor_type_proto(TensorProto.STRING, [2])
    # an overridable initializer may be fed or not: the full check decides
    assert FeedChecker([("a", tp_f), ("w", tp_f)], {"a"})._fast is not None
    assert FeedChecker([("a", tp_f), ("w", tp_f)], {"a"}).check_fast({"a": np.zeros(2, np.float32),
                                                                     "w": np.zeros(2, np.float32)}) is None
    assert FeedChecker([("s", tp_s)], {"s"})._fast is None


def test_blas_threads_are_given_back_after_runs(monkeypatch):
    ours, _ = _pair(_two_input_model())
    before = run_threads.blas_threads()
    seen = []
    real_run = ours._built.plan.run

    def spy(*a):
        seen.append(run_threads.blas_threads())
        return real_run(*a)

    monkeypatch.setattr(ours._built.plan, "run", spy)
    ours.run(None, _feeds())
    assert run_threads.blas_threads() == before
    assert seen and all(n == 1 for n in seen[0])
    # a library already at one thread is left alone and stays at one
    controllers = run_threads._blas_controllers()
    if controllers:
        old = [c.get() for c in controllers]
        try:
            for c in controllers:
                c.set(1)
            ours.run(None, _feeds())
            assert run_threads.blas_threads() == [1] * len(controllers)
            assert run_threads._saved == []
        finally:
            for c, n in zip(controllers, old):
                c.set(n)


def _if_model():
    """If (x.sum() > 0) on outer values: the then branch reads x and the weight w,
    the else branch reads y; a nested If inside the then branch reads x again."""
    inner_then = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["it"])], "inner_then", [],
                                   [helper.make_tensor_value_info("it", F, None)])
    inner_else = helper.make_graph([helper.make_node("Neg", ["x"], ["ie"])], "inner_else", [],
                                   [helper.make_tensor_value_info("ie", F, None)])
    then_g = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
         helper.make_node("Greater", ["mx", "half"], ["c2"]),
         helper.make_node("If", ["c2"], ["t"], then_branch=inner_then, else_branch=inner_else)],
        "then", [], [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["y", "w"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, None)])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g),
    ]
    inits = [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(0.5), "half"),
             numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "w")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3]),
                          helper.make_tensor_value_info("y", F, [2, 3])],
                  [helper.make_tensor_value_info("out", F, None)], inits)


def test_if_passes_only_the_outer_values_its_bodies_read():
    ours, theirs = _pair(_if_model())
    (step,) = [st for st in ours._built.plan.steps if st.op_type == "If"]
    # the weight and the constants are the bodies' own constants; x and y are values
    assert sorted(n for n, _ in step.implicit) == ["x", "y"]
    code = ours.get_plan_code()
    assert "'w'" not in code and "'x':" in code
    rng = np.random.default_rng(3)
    for _ in range(20):
        feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32),
                 "y": rng.standard_normal((2, 3)).astype(np.float32)}
        np.testing.assert_allclose(ours.run(None, feeds)[0], theirs.run(None, feeds)[0], rtol=1e-6)


def test_if_branch_of_the_wrong_dtype_is_refused():
    then_g = helper.make_graph([helper.make_node("Cast", ["x"], ["t"], to=TensorProto.DOUBLE)], "then", [],
                               [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, None)])
    model = _model([helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                   [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", F, [2])],
                   [helper.make_tensor_value_info("out", F, None)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.arange(2, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(False), "x": x})[0], x)
    with pytest.raises(OnnxRtError, match="float64 for output 0"):
        sess.run(None, {"c": np.array(True), "x": x})


def test_body_plans_keep_the_error_state_and_allocation_cap():
    # a run inside a caller's errstate: the run is quiet (inf, no warning) and the
    # caller's state is back afterwards
    ours, _ = _pair(_if_model())
    feeds = {"x": np.full((2, 3), 3e38, np.float32), "y": np.zeros((2, 3), np.float32)}
    with np.errstate(all="raise"):
        out = ours.run(None, feeds)[0]
        with pytest.raises(FloatingPointError):
            np.float32(3e38) * np.float32(10)
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(out, feeds["x"] * w)


def test_if_of_two_outputs_checks_each():
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t0"]),
                                helper.make_node("Cast", ["x"], ["t1"], to=TensorProto.DOUBLE)], "then", [],
                               [helper.make_tensor_value_info("t0", F, None),
                                helper.make_tensor_value_info("t1", F, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e0"]), helper.make_node("Abs", ["x"], ["e1"])],
                               "else", [], [helper.make_tensor_value_info("e0", F, None),
                                            helper.make_tensor_value_info("e1", F, None)])
    model = _model([helper.make_node("If", ["c"], ["a", "b"], then_branch=then_g, else_branch=else_g)],
                   [helper.make_tensor_value_info("c", TensorProto.BOOL, [1]),
                    helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_value_info(n, F, None) for n in ("a", "b")])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    a, b = sess.run(None, {"c": np.array([False]), "x": x})  # a condition of shape [1]
    np.testing.assert_array_equal(a, -x)
    np.testing.assert_array_equal(b, np.abs(x))
    with pytest.raises(OnnxRtError, match="float64 for output 1"):
        sess.run(None, {"c": np.array([True]), "x": x})
