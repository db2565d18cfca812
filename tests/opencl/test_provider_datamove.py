"""Data movement on OpenCL: views without launches, strided copies, Gather's bounds.

The ops' full node tests run on the device in ``test_node_tests.py``; these check what
they cannot see: that views launch nothing, that values stay on the device between
OpenCL nodes, and that bad indices are a typed error.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.errors import InvalidArgument

from ..conftest import make_model

pytest.importorskip("onnxrt_opencl")
from onnxrt_opencl import OpenCLExecutionProvider  # noqa: E402

OCL = "OpenCLExecutionProvider"
REASON = OpenCLExecutionProvider.is_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"OpenCL unavailable: {REASON}")
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _ints(name, values):
    return helper.make_tensor(name, I64, [len(values)], values)


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=[OCL, "CPUExecutionProvider"])


def _launches(sess, feeds):
    rt = sess._built.providers[0].runtime
    before = rt.launches.count
    out = sess.run(None, feeds)
    return out, rt.launches.count - before


def test_shape_ops_are_views_and_launch_nothing():
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["u"]),
        helper.make_node("Flatten", ["u"], ["f"], axis=1),
        helper.make_node("Squeeze", ["f", "ax0"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4])],
                       [helper.make_tensor_value_info("y", F, None)],
                       [_ints("shape", [0, -1]), _ints("ax0", [0])])
    sess = _session(model)
    assert all(a["provider"] == OCL for a in sess.get_provider_assignment())
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (y,), launches = _launches(sess, {"x": x})
    assert launches == 0
    np.testing.assert_array_equal(y, x.reshape(24))


def test_values_stay_on_the_device_between_opencl_nodes():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Slice", ["t", "starts", "ends", "axes", "steps"], ["s"]),
        helper.make_node("Concat", ["s", "t"], ["c"], axis=1),
        helper.make_node("Split", ["c"], ["a", "b"], axis=0, num_outputs=2),
        helper.make_node("Pad", ["a", "pads", "pv"], ["p"]),
        helper.make_node("Expand", ["b", "eshape"], ["e"]),
        helper.make_node("Tile", ["p", "reps"], ["y1"]),
        helper.make_node("Gather", ["e", "idx"], ["y2"], axis=2),
    ]
    inits = [_ints("starts", [3]), _ints("ends", [-100]), _ints("axes", [1]), _ints("steps", [-2]),
             _ints("pads", [0, 1, 2, 0, 0, 1]), helper.make_tensor("pv", F, [], [7.5]),
             _ints("eshape", [2, 1, 1, 1]), _ints("reps", [1, 2, 1]), _ints("idx", [2, -1, 0])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [3, 5, 4])],
                       [helper.make_tensor_value_info("y1", F, None), helper.make_tensor_value_info("y2", F, None)],
                       inits, opset=18)
    sess = _session(model)
    assert all(a["provider"] == OCL for a in sess.get_provider_assignment())
    x = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    copies = [s for s in sess._built.plan.steps if s.is_copy]
    # the feed and the constants go in, the two outputs come out: nothing else crosses
    assert sorted(s.output_names[0] for s in copies if s.op_type == "MemcpyToHost") == ["y1", "y2"]
    assert {s.output_names[0] for s in copies if s.op_type == "MemcpyFromHost"} <= {"x"} | {t.name for t in inits}
    got = sess.run(None, {"x": x})
    for g, w in zip(got, ref):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("bad", [[0, 5], [-6, 1]])
def test_gather_out_of_range_indices_are_an_invalid_argument(bad):
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)],
                       [helper.make_tensor_value_info("x", F, [2, 5]), helper.make_tensor_value_info("i", I64, [2])],
                       [helper.make_tensor_value_info("y", F, None)])
    sess = _session(model)
    assert sess.get_provider_assignment()[0]["provider"] == OCL
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    with pytest.raises(InvalidArgument, match=r"indices must be in \[-5, 4\]"):
        sess.run(None, {"x": x, "i": np.array(bad, np.int64)})
    # the session is intact
    np.testing.assert_array_equal(sess.run(None, {"x": x, "i": np.array([4, -5])})[0], x[:, [4, 0]])


def test_large_runtime_indices_are_checked_too():
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
                       [helper.make_tensor_value_info("x", F, [10, 3]), helper.make_tensor_value_info("i", I64, [1000])],
                       [helper.make_tensor_value_info("y", F, None)])
    sess = _session(model)
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    idx = np.random.default_rng(1).integers(-10, 10, 1000)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "i": idx})[0], x[idx])
    idx[500] = 10
    with pytest.raises(InvalidArgument, match="indices must be in"):
        sess.run(None, {"x": x, "i": idx})


def test_bad_reshape_is_an_invalid_argument():
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                       [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("s", I64, [2])],
                       [helper.make_tensor_value_info("y", F, None)])
    sess = _session(model)
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(InvalidArgument, match="cannot reshape"):
        sess.run(None, {"x": x, "s": np.array([4, -1])})
    assert sess.run(None, {"x": x, "s": np.array([3, -1])})[0].shape == (3, 2)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32, np.uint8, np.bool_, np.int16])
def test_data_movement_is_dtype_agnostic(dtype):
    tp = {np.float64: TensorProto.DOUBLE, np.int64: I64, np.int32: TensorProto.INT32, np.uint8: TensorProto.UINT8,
          np.bool_: TensorProto.BOOL, np.int16: TensorProto.INT16}[dtype]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Concat", ["t", "t"], ["y"], axis=0)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", tp, [3, 4])], [helper.make_tensor_value_info("y", tp, None)])
    sess = _session(model)
    assert all(a["provider"] == OCL for a in sess.get_provider_assignment())
    x = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.concatenate([x.T, x.T]))
