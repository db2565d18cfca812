"""Concurrent ``run`` calls on one OpenCL session give the sequential answers.

Kernel arguments are set and enqueued under a per-kernel lock on one in-order queue,
and kernels keep no per-run state, so threads may share a session.
"""

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort

from ..conftest import make_model
from ..models.test_real_models import DATA

pytest.importorskip("onnxrt_opencl")
from onnxrt_opencl import OpenCLExecutionProvider  # noqa: E402

OCL = "OpenCLExecutionProvider"
REASON = OpenCLExecutionProvider.is_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"OpenCL unavailable: {REASON}")
F = TensorProto.FLOAT


def _hammer(sess, feeds_list, n_threads=6, rounds=4):
    """Run every feed from ``n_threads`` threads at once; return each thread's results."""
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work(t):
        try:
            barrier.wait()
            out = []
            for r in range(rounds):
                feeds = feeds_list[(t + r) % len(feeds_list)]
                out.append(((t + r) % len(feeds_list), sess.run(None, feeds)))
            results[t] = out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    assert len(results) == n_threads
    return results


def test_threads_sharing_an_elementwise_and_datamove_session():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        helper.make_node("Sigmoid", ["t"], ["s"]),
        helper.make_node("Mul", ["s", "t"], ["m"]),
        helper.make_node("Slice", ["m", "starts", "ends", "axes"], ["sl"]),
        helper.make_node("Concat", ["sl", "sl"], ["c"], axis=2),
        helper.make_node("Tanh", ["c"], ["y"]),
    ]
    model = make_model(
        nodes, [helper.make_tensor_value_info("x", F, ["a", "b", 8])], [helper.make_tensor_value_info("y", F, None)],
        [helper.make_tensor("starts", TensorProto.INT64, [1], [1]), helper.make_tensor("ends", TensorProto.INT64, [1], [7]),
         helper.make_tensor("axes", TensorProto.INT64, [1], [2])],
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=[OCL, "CPUExecutionProvider"])
    assert all(a["provider"] == OCL for a in sess.get_provider_assignment())
    rng = np.random.default_rng(0)
    feeds_list = [{"x": rng.standard_normal((k + 1, 3 + k, 8)).astype(np.float32)} for k in range(5)]
    sequential = [sess.run(None, f) for f in feeds_list]
    for out in _hammer(sess, feeds_list, n_threads=8, rounds=6).values():
        for k, got in out:
            for g, w in zip(got, sequential[k]):
                np.testing.assert_array_equal(g, w)


def test_threads_sharing_a_resnet_session():
    sess = ort.InferenceSession(str(DATA / "resnet_small.onnx"), providers=[OCL, "CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    name = sess.get_inputs()[0].name
    feeds_list = [{name: rng.standard_normal((b, 3, 64, 64)).astype(np.float32)} for b in (1, 2, 1)]
    sequential = [sess.run(None, f) for f in feeds_list]
    for out in _hammer(sess, feeds_list, n_threads=4, rounds=3).values():
        for k, got in out:
            np.testing.assert_array_equal(got[0], sequential[k][0])
