"""The lean runs of kernels on small inputs: Gemm with prepacked operands, the Reduce
ops through their ufunc's reduce, Pad's reflect/edge/wrap joins and Unsqueeze's
per-rank axes. Each against onnxruntime (or numpy, bit for bit, where the lean run
claims the same arithmetic)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort_rt
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt_cpu.kernels.tensor import _pad

F = TensorProto.FLOAT
D = TensorProto.DOUBLE


def _sessions(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return (ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]),
            ort_rt.InferenceSession(data, providers=["CPUExecutionProvider"]))


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
@pytest.mark.parametrize("bias", ["row", "row2d", "none", "matrix", "dynamic"])
def test_gemm_with_constant_operands_matches_onnxruntime(trans_a, trans_b, alpha, beta, bias):
    rng = np.random.default_rng(7)
    m, k, n = 3, 20, 5
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(b, "b")]
    inputs = [helper.make_tensor_value_info("a", F, [k, m] if trans_a else [m, k])]
    feeds = {"a": rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)}
    ins = ["a", "b"]
    if bias in ("row", "row2d", "matrix"):
        shape = {"row": (n,), "row2d": (1, n), "matrix": (m, n)}[bias]
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), "c"))
        ins.append("c")
    elif bias == "dynamic":
        inputs.append(helper.make_tensor_value_info("c", F, [n]))
        feeds["c"] = rng.standard_normal(n).astype(np.float32)
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
    ours, theirs = _sessions([node], inputs, [helper.make_tensor_value_info("y", F, None)], inits, opset=13)
    kernel = next(st.fn.__self__ for st in ours._built.plan.steps if st.op_type == "Gemm")
    assert (kernel.lean is not None) == (bias in ("row", "row2d", "none") or beta == 0.0)
    got = ours.run(None, feeds)[0]
    np.testing.assert_allclose(got, theirs.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    assert got.dtype == np.float32 and got.shape == (m, n)


def test_gemm_lean_run_refuses_wrong_inputs_as_the_general_run_does():
    rng = np.random.default_rng(1)
    b = rng.standard_normal((4, 3)).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"])
    ours, _ = _sessions([node], [helper.make_tensor_value_info("a", F, [None, None])],
                        [helper.make_tensor_value_info("y", F, None)],
                        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.ones(3, np.float32), "c")],
                        opset=13)
    with pytest.raises(ort.errors.OnnxRtError, match="inner dimensions differ"):
        ours.run(None, {"a": np.ones((2, 5), np.float32)})
    np.testing.assert_allclose(ours.run(None, {"a": np.ones((2, 4), np.float32)})[0], np.ones((2, 4)) @ b + 1,
                               rtol=1e-6)


def test_gemm_lean_run_holds_the_allocation_cap():
    b = np.ones((2, 64), np.float32)
    node = helper.make_node("Gemm", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", F, [None, 2])],
                              [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.max_allocation_bytes", str(1 << 16))
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert sess.run(None, {"a": np.ones((8, 2), np.float32)})[0].shape == (8, 64)
    with pytest.raises(ort.errors.OnnxRtError, match="Gemm output"):
        sess.run(None, {"a": np.ones((4096, 2), np.float32)})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("shape,axes", [((1, 128), [-1]), ((3, 129), [1]), ((7, 5, 3), [0, 2]), ((1, 1), [1]),
                                        ((4, 6), [0, 1]), ((6,), [0])])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reduce_small_inputs_are_numpys_reductions_bit_for_bit(op, shape, axes, keepdims, dtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 1000).astype(dtype)
    tt = F if dtype == np.float32 else D
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    ours, theirs = _sessions([node], [helper.make_tensor_value_info("x", tt, list(shape))],
                             [helper.make_tensor_value_info("y", tt, None)],
                             [numpy_helper.from_array(np.array(axes, np.int64), "axes")], opset=18)
    ax = tuple(a % len(shape) for a in axes)
    ref = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[op]
    want = np.asarray(ref(x, axis=ax, keepdims=bool(keepdims)))
    for _ in range(2):  # the second run reads the axes normalized by the first
        got = ours.run(None, {"x": x})[0]
        assert got.dtype == dtype and got.shape == want.shape
        if op in ("ReduceMax", "ReduceMin") or x.size < 512 or len(ax) != 1 or ax[0] != x.ndim - 1:
            np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, theirs.run(None, {"x": x})[0], rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("shape", [(1, 1, 5, 32), (7,), ()])
def test_reduce_over_every_axis(op, keepdims, shape):
    x = np.asarray(np.random.default_rng(8).standard_normal(shape) * 100, dtype=np.float32)
    node = helper.make_node(op, ["x"], ["y"], keepdims=keepdims)
    ours, theirs = _sessions([node], [helper.make_tensor_value_info("x", F, list(shape))],
                             [helper.make_tensor_value_info("y", F, None)], opset=18)
    ref = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[op]
    got = ours.run(None, {"x": x})[0]
    want = np.asarray(ref(x, keepdims=bool(keepdims)))
    assert type(got) is np.ndarray and got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, theirs.run(None, {"x": x})[0], rtol=1e-5, atol=1e-4)


def test_reduce_nan_and_empty_and_attribute_axes():
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], np.float32)
    # NaN propagates, as numpy's reductions (and onnxrt before the lean run) give it;
    # onnxruntime's ReduceMax may skip it, so numpy is the reference here
    for op, ref in (("ReduceMax", np.max), ("ReduceMean", np.mean), ("ReduceSum", np.sum)):
        node = helper.make_node(op, ["x"], ["y"], axes=[1])
        ours, _ = _sessions([node], [helper.make_tensor_value_info("x", F, [2, 3])],
                            [helper.make_tensor_value_info("y", F, None)], opset=11)
        np.testing.assert_array_equal(ours.run(None, {"x": x})[0], ref(x, axis=1, keepdims=True))
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1])
    ours, theirs = _sessions([node], [helper.make_tensor_value_info("x", F, None)],
                             [helper.make_tensor_value_info("y", F, None)], opset=13)
    empty = np.zeros((2, 0), np.float32)
    # an empty mean stays the general run's (NaN, as numpy gives it)
    got = ours.run(None, {"x": empty})[0]
    assert got.shape == (2, 1) and np.isnan(got).all()
    x3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # another rank, the same node
    np.testing.assert_array_equal(ours.run(None, {"x": x3})[0], theirs.run(None, {"x": x3})[0])
    with pytest.raises(ort.errors.OnnxRtError, match="out of range"):
        ours.run(None, {"x": np.zeros(3, np.float32)})


def test_pad_by_parts_is_np_pad():
    rng = np.random.default_rng(5)
    for shape in [(5,), (1, 512), (3, 4), (2, 3, 4), (4, 1, 3)]:
        r = len(shape)
        for mode in ("reflect", "edge", "wrap"):
            for _ in range(40):
                def most(d):
                    return d - 1 if mode == "reflect" else (d if mode == "wrap" else 5)
                pads = [int(rng.integers(0, most(d) + 1)) for d in shape * 2]
                x = rng.standard_normal(shape).astype(np.float32)
                if r > 1 and rng.random() < 0.3:
                    x = x.swapaxes(0, 1).copy().swapaxes(0, 1)  # not C-ordered
                got = _pad(np, x, pads, None, mode, 0)
                np.testing.assert_array_equal(got, np.pad(x, list(zip(pads[:r], pads[r:])), mode=mode))


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 64, 0, 64], [1, 3, 0, 2], [0, 0, 0, 0], [0, -2, 0, 3], [2, 5, 1, 5]])
def test_pad_modes_match_onnxruntime(mode, pads):
    x = np.random.default_rng(2).standard_normal((3, 512 if pads[1] == 64 else 6)).astype(np.float32)
    if mode == "reflect" and max(pads) >= 3:
        pads = [min(p, 2) for p in pads]
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    ours, theirs = _sessions([node], [helper.make_tensor_value_info("x", F, list(x.shape))],
                             [helper.make_tensor_value_info("y", F, None)],
                             [numpy_helper.from_array(np.array(pads, np.int64), "pads")], opset=18)
    got = ours.run(None, {"x": x})[0]
    want = theirs.run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_unsqueeze_axes_per_rank():
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    ours, theirs = _sessions([node], [helper.make_tensor_value_info("x", F, None)],
                             [helper.make_tensor_value_info("y", F, None)],
                             [numpy_helper.from_array(np.array([0, -1], np.int64), "axes")], opset=13)
    for shape in [(3,), (2, 3), (2, 3), (4, 1, 2), ()]:
        x = np.ones(shape, np.float32)
        assert ours.run(None, {"x": x})[0].shape == theirs.run(None, {"x": x})[0].shape
    bad = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    ours, _ = _sessions([bad], [helper.make_tensor_value_info("x", F, None)],
                        [helper.make_tensor_value_info("y", F, None)],
                        [numpy_helper.from_array(np.array([0, 0], np.int64), "axes")], opset=13)
    with pytest.raises(ort.errors.OnnxRtError, match="repeated axes"):
        ours.run(None, {"x": np.ones(3, np.float32)})


def test_squeeze_and_slice_per_input_shape():
    nodes = [helper.make_node("Squeeze", ["x", "sq"], ["s"]),
             helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["t"]),
             helper.make_node("Squeeze", ["x"], ["all"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             [("sq", [1]), ("starts", [-1, 0]), ("ends", [-1 - 2**62, 2]), ("axes", [0, 2]), ("steps", [-1, 1])]]
    outs = [helper.make_tensor_value_info(n, F, None) for n in ("s", "t", "all")]
    ours, theirs = _sessions(nodes, [helper.make_tensor_value_info("x", F, None)], outs, inits, opset=13)
    rng = np.random.default_rng(4)
    # shapes again and again (the memo), others, and more than the memo holds
    shapes = [(3, 1, 4), (3, 1, 4), (2, 1, 5), (1, 1, 1)] + [(k, 1, 3) for k in range(1, 20)] + [(3, 1, 4)]
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        for g, w in zip(ours.run(None, {"x": x}), theirs.run(None, {"x": x})):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    with pytest.raises(ort.errors.OnnxRtError, match="is not 1"):
        ours.run(None, {"x": np.ones((2, 2, 2), np.float32)})


def test_identity_of_a_tensor_is_a_direct_view_and_sequences_pass_through():
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"]),
             helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
             helper.make_node("Identity", ["seq"], ["seq2"]),
             helper.make_node("SequenceLength", ["seq2"], ["n"])]
    outs = [helper.make_tensor_value_info("z", F, None), helper.make_tensor_value_info("y", F, None),
            helper.make_tensor_value_info("n", TensorProto.INT64, None)]
    ours, theirs = _sessions(nodes, [helper.make_tensor_value_info("x", F, [2, 3])], outs)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = ours.run(None, {"x": x})
    for g, w in zip(got, theirs.run(None, {"x": x})):
        np.testing.assert_array_equal(g, w)
    assert not np.shares_memory(got[1], x)  # the output is the caller's, not the feed
    steps = ours._built.plan.fast_steps
    ident = [i for i, st in enumerate(steps) if st.op_type == "Identity"]
    assert len(ident) == 2
    # the tensor's Identity is the view method itself; the sequence's is the kernel
    names = ours._built.plan.run.__globals__
    assert names.get(f"d{ident[0]}") is np.ndarray.view
    assert f"d{ident[1]}" not in names and f"f{ident[1]}" in names
