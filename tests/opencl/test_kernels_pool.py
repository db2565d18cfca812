"""OpenCL pooling: the ONNX node tests, and comparisons with the CPU provider for
Indices with both storage orders, ceil mode, dilations, padding counts and 1-D/3-D."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from ..conftest import make_model
from .kernel_checks import (
    check_node_case,
    compare_with_cpu,
    node_cases,
    skip_without_opencl,
)

pytestmark = skip_without_opencl()

OPS = {"MaxPool", "AveragePool", "LpPool", "GlobalMaxPool", "GlobalAveragePool"}
FALLBACKS = {"test_maxpool_2d_uint8": "uint8"}


@pytest.mark.parametrize("case", node_cases(OPS))
def test_node_case(case):
    check_node_case(case, OPS, FALLBACKS)


def _pool_model(op, x_shape, n_out=1, opset=18, **attrs):
    outs = ["y", "i"][:n_out]
    return make_model(
        [helper.make_node(op, ["x"], outs, **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        + ([helper.make_tensor_value_info("i", TensorProto.INT64, None)] if n_out > 1 else []),
        opset=opset,
    )


POOL_CASES = [
    ("MaxPool", (2, 3, 11, 13), 2, dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1], storage_order=0)),
    ("MaxPool", (2, 3, 11, 13), 2, dict(kernel_shape=[3, 3], strides=[2, 2], storage_order=1, ceil_mode=1)),
    ("MaxPool", (1, 2, 12, 10), 2, dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", (2, 4, 17), 1, dict(kernel_shape=[4], strides=[3], ceil_mode=1, pads=[1, 2])),
    ("MaxPool", (1, 2, 5, 6, 7), 2, dict(kernel_shape=[2, 3, 2], strides=[2, 2, 1], auto_pad="SAME_UPPER")),
    ("AveragePool", (2, 3, 11, 13), 1, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", (2, 3, 11, 13), 1,
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1, ceil_mode=1)),
    ("AveragePool", (1, 3, 9, 10), 1, dict(kernel_shape=[3, 2], dilations=[2, 3], count_include_pad=1, pads=[2, 1, 0, 2])),
    ("AveragePool", (2, 5, 19), 1, dict(kernel_shape=[5], strides=[2], auto_pad="SAME_LOWER")),
    ("AveragePool", (1, 2, 6, 5, 7), 1, dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], auto_pad="VALID", ceil_mode=1)),
    ("LpPool", (2, 3, 9, 8), 1, dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], p=3)),
    ("LpPool", (2, 3, 9, 8), 1, dict(kernel_shape=[2, 2], p=2)),
    # a window that fits nowhere along the rows: an empty axis
    ("MaxPool", (2, 3, 2, 4), 2, dict(kernel_shape=[3, 2])),
    ("AveragePool", (1, 1, 3), 1, dict(kernel_shape=[4], ceil_mode=1)),
    ("GlobalMaxPool", (2, 3, 40, 37), 1, {}),  # long rows: a work-group per row
    ("GlobalAveragePool", (3, 5, 7), 1, {}),
    ("GlobalAveragePool", (2, 7, 3, 30, 31), 1, {}),
]


@pytest.mark.parametrize("op,xs,n_out,attrs", POOL_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(POOL_CASES)])
def test_pool_matches_cpu(op, xs, n_out, attrs):
    rng = np.random.default_rng(sum(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    # opset 19: AveragePool takes dilations from there on
    compare_with_cpu(_pool_model(op, xs, n_out, opset=19, **attrs), {"x": x}, rtol=1e-5, atol=1e-5)


def test_maxpool_indices_pick_the_first_maximum():
    # every window holds ties: the first maximal tap in window order wins, as on the CPU
    x = np.repeat(np.arange(6, dtype=np.float32), 2).reshape(1, 1, 3, 4)
    x = np.concatenate([x, -x], axis=1)
    for order in (0, 1):
        got = compare_with_cpu(_pool_model("MaxPool", x.shape, 2, kernel_shape=[2, 2], storage_order=order), {"x": x})
        assert got[1].dtype == np.int64
