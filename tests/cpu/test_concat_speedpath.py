"""Concat of large tensors into an output the node keeps and writes again next run
(onnxrt_cpu.large_outputs): the values of onnxruntime and numpy, every run, and never a
block someone still holds."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt
from onnxrt_cpu import large_outputs

_BIG = (1, 64, 256, 256)  # 16 MiB each: a 32 MiB join, reused


def _model(n, axis=1, then_relu=False, dtype=TensorProto.FLOAT):
    names = [f"x{i}" for i in range(n)]
    nodes = [helper.make_node("Concat", names, ["c" if then_relu else "y"], axis=axis)]
    if then_relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(v, dtype, None) for v in names],
                              [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9).SerializeToString()


def _session(model):
    return onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])


def test_matches_onnxruntime_and_numpy_every_run():
    rt = pytest.importorskip("onnxruntime")
    model = _model(3, axis=1, then_relu=True)
    sess = _session(model)
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for run in range(3):
        feeds = {f"x{i}": rng.standard_normal((1, c, 128, 256)).astype(np.float32) for i, c in enumerate((96, 64, 32))}
        got = sess.run(None, feeds)[0]
        np.testing.assert_array_equal(got, ref.run(None, feeds)[0])
        np.testing.assert_array_equal(got, np.maximum(np.concatenate(list(feeds.values()), axis=1), 0))


@pytest.mark.parametrize("axis", [0, 2, 3, -1])
def test_other_axes(axis):
    rng = np.random.default_rng(1)
    shape = list(_BIG)
    shape[0] = 2
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    got = _session(_model(2, axis=axis)).run(None, {"x0": xs[0], "x1": xs[1]})[0]
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


def test_an_output_the_caller_holds_is_never_written_again():
    sess = _session(_model(2))
    a = np.full(_BIG, 1.0, np.float32)
    first = sess.run(None, {"x0": a, "x1": a})[0]
    kept = first.copy()
    view = first[:, :3]
    second = sess.run(None, {"x0": a * 2, "x1": a * 2})[0]
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, kept)
    del first, view
    third = sess.run(None, {"x0": a * 3, "x1": a * 3})[0]
    np.testing.assert_array_equal(third, np.full((1, 128, 256, 256), 3.0, np.float32))
    # once the caller lets go, the next run writes the same block again
    address = third.ctypes.data
    del second, third
    fourth = sess.run(None, {"x0": a * 4, "x1": a})[0]
    assert fourth.ctypes.data == address
    np.testing.assert_array_equal(fourth, np.concatenate([a * 4, a], axis=1))


def test_the_slot_reuses_only_a_free_block_of_the_same_geometry():
    slot = large_outputs.OutputSlot()
    a = slot.empty((1 << 23,), np.float32)
    addr = a.ctypes.data
    del a
    b = slot.empty((1 << 23,), np.float32)
    assert b.ctypes.data == addr
    del b
    held = slot.empty((1 << 23,), np.float32)
    assert held.ctypes.data == addr
    assert not np.shares_memory(held, slot.empty((1 << 23,), np.float32))  # held: a fresh block
    c = slot.empty((1 << 22,), np.float64)  # same bytes, other dtype: fresh
    assert c.dtype == np.float64 and c.shape == (1 << 22,)
    assert slot.empty((4, 4), np.float32).shape == (4, 4)  # small: plain np.empty


def test_concurrent_runs_get_their_own_blocks():
    sess = _session(_model(2))
    results, errors = {}, []

    def work(k):
        try:
            x = np.full(_BIG, float(k), np.float32)
            for _ in range(3):
                y = sess.run(None, {"x0": x, "x1": x})[0]
                if not (y == k).all():
                    errors.append(k)
            results[k] = y
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, y in results.items():
        assert (y == k).all()


def test_mismatched_shapes_still_raise():
    sess = _session(_model(2))
    with pytest.raises(Exception, match="Concat"):
        sess.run(None, {"x0": np.zeros(_BIG, np.float32), "x1": np.zeros((1, 64, 256, 255), np.float32)})
