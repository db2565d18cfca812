"""Zero-size batches, channels and maps through the pooling kernels: an empty output
of the right shape, with the compiled kernels and with the numpy paths alone."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort

from ..conftest import make_model

F = TensorProto.FLOAT


def _pool(op, nd, **attrs):
    outs = ["y", "i"] if attrs.pop("indices", False) else ["y"]
    node = helper.make_node(op, ["x"], outs, kernel_shape=[3] * nd, strides=[2] * nd, **attrs)
    vis = [helper.make_tensor_value_info("y", F, None)]
    if len(outs) == 2:
        vis.append(helper.make_tensor_value_info("i", TensorProto.INT64, None))
    model = make_model([node], [helper.make_tensor_value_info("x", F, None)], vis)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


SHAPES = [(0, 3, 8, 8), (2, 0, 8, 8), (0, 3, 9), (0, 2, 5, 5, 5), (0, 0, 8, 8)]


def _expected(shape):
    nd = len(shape) - 2
    return shape[:2] + tuple((d - 3) // 2 + 1 for d in shape[2:]) if nd else shape


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_empty_batches_and_channels_pool_to_empty_outputs(request, op, shape, native):
    if not native:
        request.getfixturevalue("numpy_kernels")
    (y,) = _pool(op, len(shape) - 2).run(None, {"x": np.zeros(shape, np.float32)})
    assert y.shape == _expected(shape) and y.dtype == np.float32


@pytest.mark.parametrize("shape", SHAPES[:3], ids=[str(s) for s in SHAPES[:3]])
def test_maxpool_with_indices_of_an_empty_batch(shape):
    y, i = _pool("MaxPool", len(shape) - 2, indices=True).run(None, {"x": np.zeros(shape, np.float32)})
    assert y.shape == i.shape == _expected(shape) and i.dtype == np.int64


def test_empty_map_axis_pools_to_an_empty_axis():
    (y,) = _pool("MaxPool", 2, pads=[1, 1, 1, 1]).run(None, {"x": np.zeros((1, 2, 0, 8), np.float32)})
    assert y.shape[:2] == (1, 2) and y.size == 0


def test_a_session_pools_a_real_batch_after_an_empty_one():
    sess = _pool("AveragePool", 2)
    sess.run(None, {"x": np.zeros((0, 1, 4, 4), np.float32)})
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y.reshape(-1), [x[0, 0, :3, :3].mean()])
