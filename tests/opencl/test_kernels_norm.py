"""OpenCL BatchNormalization (inference), InstanceNormalization and LayerNormalization:
the ONNX node tests, and comparisons with the CPU provider for long rows, rows far
from zero, broadcast scales and LayerNormalization's statistics outputs."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ..conftest import make_model
from .kernel_checks import (
    check_node_case,
    compare_with_cpu,
    node_cases,
    skip_without_opencl,
)

pytestmark = skip_without_opencl()

OPS = {"BatchNormalization", "InstanceNormalization", "LayerNormalization"}
FALLBACKS = {
    "test_batchnorm_example_training_mode": "training",
    "test_batchnorm_epsilon_training_mode": "training",
}


@pytest.mark.parametrize("case", node_cases(OPS))
def test_node_case(case):
    check_node_case(case, OPS, FALLBACKS)


def _model(op, x_shape, params, n_out=1, **attrs):
    outs = ["y", "mean", "inv"][:n_out]
    return make_model(
        [helper.make_node(op, ["x"] + [n for n, _ in params], outs, **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(v, n) for n, v in params],
    )


@pytest.mark.parametrize("shape", [(2, 5), (3, 4, 7), (2, 3, 5, 6), (1, 2, 3, 4, 5)])
def test_batchnorm_matches_cpu(shape):
    rng = np.random.default_rng(len(shape))
    c = shape[1]
    params = [("s", rng.standard_normal(c)), ("b", rng.standard_normal(c)), ("m", rng.standard_normal(c)),
              ("v", rng.uniform(0.5, 2, c))]
    params = [(n, v.astype(np.float32)) for n, v in params]
    x = rng.standard_normal(shape).astype(np.float32)
    compare_with_cpu(_model("BatchNormalization", shape, params, epsilon=1e-3), {"x": x}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (1, 4, 300), (3, 2, 3, 4, 5)])
def test_instancenorm_matches_cpu(shape):
    rng = np.random.default_rng(len(shape))
    c = shape[1]
    params = [("s", rng.standard_normal(c).astype(np.float32)), ("b", rng.standard_normal(c).astype(np.float32))]
    # a large offset: the two-pass variance keeps the result accurate
    x = (rng.standard_normal(shape) + 100).astype(np.float32)
    compare_with_cpu(_model("InstanceNormalization", shape, params, epsilon=1e-4), {"x": x}, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "shape,axis,scale_shape,with_bias,n_out",
    [
        ((4, 16, 768), -1, (768,), True, 1),  # transformer-sized rows
        ((2, 3, 5, 6), 2, (5, 6), True, 3),  # statistics outputs
        ((2, 3, 5, 6), 1, (1,), False, 2),  # scalar scale, no bias
        ((2, 3, 5, 6), -2, (1, 6), True, 1),  # a scale broadcast over the normalized axes
        ((7, 9), 0, (7, 9), True, 3),
    ],
)
def test_layernorm_matches_cpu(shape, axis, scale_shape, with_bias, n_out):
    rng = np.random.default_rng(sum(shape))
    norm_shape = shape[axis % len(shape):]
    params = [("s", rng.standard_normal(scale_shape).astype(np.float32))]
    if with_bias:
        params.append(("b", rng.standard_normal(norm_shape).astype(np.float32)))
    x = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)
    got = compare_with_cpu(_model("LayerNormalization", shape, params, n_out, axis=axis, epsilon=1e-5),
                           {"x": x}, rtol=1e-4, atol=1e-4)
    assert len(got) == n_out
