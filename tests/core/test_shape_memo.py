"""Memoized shape computations (onnxrt.plan.shape_memo): the Shape -> Gather -> Unsqueeze ->
Concat chains of exported models run once per input shape, and give the same results
as running every node, as onnxruntime does."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt
from onnxrt.errors import OnnxRtError

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _attention_like(extra_outputs=()) -> onnx.ModelProto:
    """x [N, S, 64] -> reshaped to [N, S, 4, 16] by a shape computed from x, scaled by
    1 / sqrt(head size) computed from x's shape too (as torch exports attention)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Gather", ["shape", "i2"], ["h"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
        helper.make_node("Concat", ["n1", "s1", "heads"], ["target"], axis=0),
        helper.make_node("Div", ["h", "four"], ["head_size"]),
        helper.make_node("Cast", ["head_size"], ["head_size_f"], to=F),
        helper.make_node("Sqrt", ["head_size_f"], ["scale"]),
        helper.make_node("Relu", ["x"], ["xr"]),
        helper.make_node("Reshape", ["xr", "target"], ["r"]),
        helper.make_node("Div", ["r", "scale"], ["y"]),
        # a second leaf, after data ops, reading an earlier segment's output by value
        helper.make_node("Shape", ["y"], ["yshape"]),
        helper.make_node("Slice", ["yshape", "i0_1", "i2_1"], ["ns"]),
        helper.make_node("Concat", ["ns", "target"], ["both"], axis=0),
    ]
    inits = [
        _i64("i0", 0), _i64("i1", 1), _i64("i2", 2), _i64("ax0", [0]), _i64("heads", [4, 16]),
        _i64("four", 4), _i64("i0_1", [0]), _i64("i2_1", [2]),
    ]
    outputs = [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("both", I64, None)]
    outputs += [helper.make_tensor_value_info(n, t, None) for n, t in extra_outputs]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["N", "S", 64])], outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _session(model, memo=True, level=None, **opts):
    so = onnxrt.SessionOptions()
    so.intra_op_num_threads = 1
    if level is not None:
        so.graph_optimization_level = level
    for k, v in opts.items():
        setattr(so, k, v)
    so.add_session_config_entry("session.memoize_shapes", "1" if memo else "0")
    return onnxrt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _segments(sess):
    return [st.fn for st in sess._built.plan.fast_steps if st.op_type == "ShapeSegment"]


@pytest.mark.parametrize("level", [onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_shapes_alternating_match_onnxruntime_and_every_node_run(level):
    model = _attention_like()
    memo, plain = _session(model, level=level), _session(model, memo=False, level=level)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    segs = _segments(memo)
    # the first leaf with its ten pure followers, and the second leaf with its two;
    # optimized, the head size (Gather of the static dimension, Div, Cast, Sqrt) is
    # folded to a constant before the plan is made
    optimized = level != onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert [len(s.steps) for s in segs] == ([6, 3] if optimized else [10, 3])
    assert not _segments(plain)
    rng = np.random.default_rng(0)
    shapes = [(2, 5), (3, 7), (2, 5), (1, 1), (3, 7), (2, 5)]
    for n, s in shapes:
        x = rng.standard_normal((n, s, 64)).astype(np.float32)
        want = ref.run(None, {"x": x})
        for got in (memo.run(None, {"x": x}), plain.run(None, {"x": x})):
            assert got[0].shape == (n, s, 4, 16)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
            np.testing.assert_array_equal(got[1], want[1])
    # one entry per distinct shape: later runs of a seen shape were served from it
    assert [len(s.cache) for s in segs] == [3, 3]


def test_a_cache_hit_runs_none_of_the_segments_kernels():
    memo = _session(_attention_like())
    x = np.ones((2, 3, 64), np.float32)
    calls = []
    # a segment compiles its steps on its first miss, calling the step functions it
    # finds then: counted from the start
    for seg in _segments(memo):
        for st in seg.steps:
            st.fn = (lambda f: lambda *a: calls.append(1) or f(*a))(st.fn)
    first = memo.run(None, {"x": x})
    assert len(calls) == 9
    calls.clear()
    again = memo.run(None, {"x": x})
    assert calls == []
    np.testing.assert_array_equal(again[1], first[1])
    memo.run(None, {"x": np.ones((4, 3, 64), np.float32)})  # a new shape: computed
    assert len(calls) == sum(len(seg.steps) for seg in _segments(memo)) == 9


def test_a_memoized_output_handed_to_the_caller_is_its_own():
    memo = _session(_attention_like(extra_outputs=[("target", I64)]))
    x = np.ones((2, 3, 64), np.float32)
    _, both, target = memo.run(None, {"x": x})
    assert target.flags.writeable
    target[:] = -1
    both[:] = -1
    _, both2, target2 = memo.run(None, {"x": x})
    np.testing.assert_array_equal(target2, [2, 3, 4, 16])
    np.testing.assert_array_equal(both2, [2, 3, 2, 3, 4, 16])


def test_profiled_runs_run_every_node():
    memo = _session(_attention_like(), enable_profiling=True)
    x = np.ones((2, 3, 64), np.float32)
    for _ in range(3):
        memo.run(None, {"x": x})
    import json
    from pathlib import Path

    events = json.loads(Path(memo.end_profiling()).read_text())
    gathers = [e for e in events if e.get("cat") == "Node" and e["args"]["op_name"] == "Gather"]
    # two Gathers a run (of the batch and sequence sizes; the head size's is folded)
    assert len(gathers) == 3 * 2


def test_large_outputs_are_not_kept():
    """ConstantOfShape of a large input's shape: 4 MiB, over the limit, so the segment
    stops memoizing and recomputes, still right for every shape."""
    g = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["z"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
            helper.make_node("Add", ["x", "z"], ["y"]),
        ],
        "g", [helper.make_tensor_value_info("x", F, ["A", "B"])], [helper.make_tensor_value_info("y", F, None)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    memo = _session(model)
    (seg,) = _segments(memo)
    for shape in ((1024, 1024), (2, 3), (1024, 1024)):
        x = np.full(shape, 1.0, np.float32)
        np.testing.assert_array_equal(memo.run(None, {"x": x})[0], x + 2)
    assert not seg.enabled and not seg.cache


def test_constant_only_chains_run_once():
    """Unfolded at ORT_DISABLE_ALL, a chain of constants runs on the first run only."""
    g = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["c"]),
            helper.make_node("Cast", ["c"], ["cf"], to=F),
            helper.make_node("Mul", ["x", "cf"], ["y"]),
        ],
        "g", [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, [3])],
        [_i64("a", [1, 2, 3]), _i64("b", [10, 20, 30])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    memo = _session(model, level=onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    (seg,) = _segments(memo)
    assert seg.leaf is None and [st.op_type for st in seg.steps] == ["Add", "Cast"]
    x = np.ones(3, np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(memo.run(None, {"x": x})[0], [11, 22, 33])
    assert list(seg.cache) == [()]


def test_an_error_inside_a_segment_names_its_node_and_the_session_recovers():
    g = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "two"], ["d"], axis=0, name="third_dim"),
            helper.make_node("Unsqueeze", ["d", "ax0"], ["d1"]),
            helper.make_node("Reshape", ["x", "d1"], ["y"]),
        ],
        "g", [helper.make_tensor_value_info("x", F, None)], [helper.make_tensor_value_info("y", F, None)],
        [_i64("two", 2), _i64("ax0", [0])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    memo = _session(model)
    assert _segments(memo)
    with pytest.raises(OnnxRtError, match="third_dim"):
        memo.run(None, {"x": np.ones((4, 5), np.float32)})  # rank 2: no index 2
    y = memo.run(None, {"x": np.ones((1, 1, 6), np.float32)})[0]
    np.testing.assert_array_equal(y, np.ones(6, np.float32))


def test_threads_running_different_shapes_at_once_get_their_own_results():
    memo = _session(_attention_like())
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1 + i % 3, 2 + i % 4, 64)).astype(np.float32) for i in range(24)]
    plain = _session(_attention_like(), memo=False)
    want = [plain.run(None, {"x": x}) for x in inputs]
    errors = []

    def work(k):
        try:
            for j in range(20):
                i = (k * 7 + j) % len(inputs)
                got = memo.run(None, {"x": inputs[i]})
                np.testing.assert_array_equal(got[1], want[i][1])
                np.testing.assert_allclose(got[0], want[i][0], rtol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_value_read_between_a_segment_and_a_step_moved_into_it_survives():
    """``target`` is read by the Reshape, and last by a Mul after it that depends on the
    Shape alone, so it moves into the Shape's segment: running the segment must not
    drop ``target`` on the Mul's account before the Reshape has read it."""
    g = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Concat", ["s", "one"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
            helper.make_node("Mul", ["target", "two"], ["doubled"]),
        ],
        "g", [helper.make_tensor_value_info("x", F, ["A", "B"])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("doubled", I64, None)],
        [_i64("one", [1]), _i64("two", 2)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    memo = _session(model)
    (seg,) = _segments(memo)
    assert [st.op_type for st in seg.steps] == ["Shape", "Concat", "Mul"]
    for shape in ((2, 3), (4, 1), (2, 3)):
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        y, doubled = memo.run(None, {"x": x})
        np.testing.assert_array_equal(y, x.reshape(*shape, 1))
        np.testing.assert_array_equal(doubled, [2 * shape[0], 2 * shape[1], 2])
