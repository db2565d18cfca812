"""OpenCL reductions, ArgMax/ArgMin, Softmax and LogSoftmax: the ONNX node tests, and
comparisons with the CPU provider for scattered axes (the permute path), long rows
(a work-group per row), strided columns and both Softmax axis semantics."""

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

REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
OPS = set(REDUCE) | {"ArgMax", "ArgMin", "Softmax", "LogSoftmax"}


def _fallbacks():
    out = {}
    for p in node_cases(OPS):
        case = p.values[0]
        x = case.model.graph.input[0].type.tensor_type.elem_type
        if x == TensorProto.BOOL:
            out[case.name] = "bool"
        elif x not in (TensorProto.FLOAT, TensorProto.DOUBLE):
            out[case.name] = "this kernel takes"
    return out


FALLBACKS = _fallbacks()


@pytest.mark.parametrize("case", node_cases(OPS))
def test_node_case(case):
    check_node_case(case, OPS, FALLBACKS)


def test_only_non_float_node_cases_are_fallbacks():
    # the fallback list holds only bool/integer inputs: every float case runs on OpenCL
    assert FALLBACKS and len(FALLBACKS) < len(node_cases(OPS)) // 10


def _reduce_model(op, x_shape, axes, keepdims, opset=18, axes_as_input=True):
    inits, names, attrs = [], ["x"], {"keepdims": keepdims}
    if axes is not None:
        if axes_as_input:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            names.append("axes")
        else:
            attrs["axes"] = axes
    return make_model(
        [helper.make_node(op, names, ["y"], **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
        opset=opset,
    )


SHAPES_AXES = [
    ((4, 5, 6, 7), [0, 2]),  # scattered axes: permuted to the end first
    ((3, 1, 4, 5, 2), [1, 2, 4]),  # size-1 axis merged away
    ((2, 300), [1]),  # long rows: a work-group per row
    ((3, 17, 33), [1]),  # strided columns (inner = 33)
    ((6, 9, 11), None),  # every axis
    ((5, 4), [-1]),
    ((70, 5), [1]),  # short rows, more than one work-group of them
]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_matches_cpu(op, keepdims):
    rng = np.random.default_rng(len(op))
    for shape, axes in SHAPES_AXES:
        x = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        if op not in ("ReduceLogSum", "ReduceProd"):
            x = x * rng.choice([-1.0, 1.0], shape).astype(np.float32)
        if op == "ReduceProd":
            x = x ** (1.0 / 64)  # keep products of hundreds of factors finite
        compare_with_cpu(_reduce_model(op, shape, axes, keepdims), {"x": x}, rtol=2e-5, atol=1e-5)


def test_axes_as_attribute_and_as_runtime_input():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    compare_with_cpu(_reduce_model("ReduceMax", x.shape, [0, 2], 0, opset=13, axes_as_input=False), {"x": x})
    model = make_model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    for axes in ([1], [0, 2], [-1, 0]):
        compare_with_cpu(model, {"x": x, "axes": np.array(axes, np.int64)}, expect_ops={"ReduceSum"})


def test_log_sum_exp_does_not_overflow():
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -np.inf]], np.float32)
    got = compare_with_cpu(_reduce_model("ReduceLogSumExp", x.shape, [1], 0), {"x": x})[0]
    assert np.isfinite(got).all()


def _softmax_model(op, shape, axis, opset):
    return make_model(
        [helper.make_node(op, ["x"], ["y"], axis=axis)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        opset=opset,
    )


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(
    "shape,axis,opset",
    [
        ((2, 3, 4, 5), 1, 11),  # opset < 13: flattened to 2-D at the axis
        ((2, 3, 4, 5), -2, 11),
        ((2, 3, 4, 5), 1, 13),  # opset 13: one axis, strided
        ((6, 1000), -1, 13),  # long rows: a work-group per row
        ((3, 7, 300), 2, 13),
        ((4, 30), 0, 13),
        ((70, 5), -1, 13),
    ],
)
def test_softmax_matches_cpu(op, shape, axis, opset):
    x = (np.random.default_rng(2).standard_normal(shape) * 20).astype(np.float32)
    compare_with_cpu(_softmax_model(op, shape, axis, opset), {"x": x}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduce_with_ties(op, last):
    x = np.random.default_rng(3).integers(0, 3, (70, 6, 5)).astype(np.float32)
    for axis in (0, 1, -1):
        model = make_model(
            [helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=axis % 2, select_last_index=last)],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        )
        compare_with_cpu(model, {"x": x})
