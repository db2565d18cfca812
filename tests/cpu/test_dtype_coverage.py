"""Every numeric type the spec allows, for the common elementwise, comparison and
reduction ops, checked against the onnx reference evaluator."""

import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt.dtypes import np_dtype

OPSET = 22
UNARY = ["Abs", "Neg", "Relu", "Sign", "Ceil", "Floor", "Round", "Sqrt", "Exp", "Log", "Reciprocal", "Sigmoid",
         "Tanh", "Identity", "Not", "IsNaN", "Erf", "Softplus"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
          "And", "Or", "Xor", "Pow", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Mod"]
REDUCE = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ArgMax", "ArgMin"]


def _types(op):
    schema = onnx.defs.get_schema(op, OPSET)
    param = schema.inputs[0].type_str
    allowed = next(c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == param)
    out = []
    for t in allowed:
        if not t.startswith("tensor("):
            continue
        name = t[len("tensor("):-1]
        code = {"float": 1, "double": 11}.get(name, getattr(onnx.TensorProto, name.upper(), None))
        if code is not None and code not in (onnx.TensorProto.STRING,):
            out.append((name, code))
    return out


def _data(dt, rng, shape=(2, 3), positive=False):
    dt = np.dtype(dt)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        lo = 1 if positive or dt.kind == "u" else -5
        return rng.integers(lo, 6, size=shape).astype(dt)
    x = rng.uniform(0.5 if positive else -2, 2, size=shape)
    return x.astype(dt)


def _params():
    for op in UNARY + BINARY + REDUCE:
        for name, code in _types(op):
            yield pytest.param(op, code, id=f"{op}-{name}")


@pytest.mark.parametrize("op,code", list(_params()))
def test_op_dtype_matches_reference(op, code):
    dt = np_dtype(code)
    rng = np.random.default_rng(0)
    n_in = 2 if op in BINARY else 1
    positive = op in ("Sqrt", "Log", "Reciprocal", "Div", "Mod", "Pow")
    feeds = {f"x{i}": _data(dt, rng, positive=positive or (op in ("Div", "Mod") and i == 1)) for i in range(n_in)}
    if op == "Pow" and dt.kind in "iu":
        feeds["x1"] = rng.integers(0, 3, size=(2, 3)).astype(dt)
    attrs = {"axis": 1} if op in ("ArgMax", "ArgMin") else {}
    if op.startswith("Reduce"):
        attrs = {"keepdims": 1}
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    inputs = [helper.make_tensor_value_info(k, code, [2, 3]) for k in feeds]
    model = helper.make_model(helper.make_graph([node], "t", inputs, [helper.make_empty_tensor_value_info("y")]),
                              opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            (want,) = ReferenceEvaluator(model).run(None, feeds)
        except Exception as e:  # noqa: BLE001 - the reference lacks this type: nothing to compare with
            pytest.skip(f"onnx.reference cannot run {op} on {dt}: {type(e).__name__}")
        (got,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{op}: dtype {got.dtype}, reference {want.dtype}"
    assert got.shape == want.shape
    if want.dtype.kind == "c":
        np.testing.assert_allclose(got, want, rtol=1e-6)
    elif want.dtype.kind == "f" or want.dtype in (ml_dtypes.bfloat16,):
        tol = 1e-2 if want.dtype in (np.float16, ml_dtypes.bfloat16) else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


ACTIVATIONS = ["Sigmoid", "HardSigmoid", "HardSwish", "Mish", "Softplus", "Softsign", "Elu", "Selu", "Celu",
               "LeakyRelu", "ThresholdedRelu", "Gelu", "Shrink", "Relu", "Tanh", "Erf"]


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("op", ACTIVATIONS)
def test_activation_of_a_rank_0_input(op, dt):
    """A rank-0 input (numpy's ufuncs return scalars for it, which in-place steps
    cannot write) gives a rank-0 result equal to the reference's."""
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    node = helper.make_node(op, ["x"], ["y"])
    model = helper.make_model(
        helper.make_graph([node], "t", [helper.make_tensor_value_info("x", code, [])],
                          [helper.make_empty_tensor_value_info("y")]),
        opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    tol = 1e-2 if dt == np.float16 else 1e-5
    for v in (-1.5, 0.5, 3.0):
        feeds = {"x": np.array(v, dt)}
        # the reference on a one-value array where it fails on rank 0 itself (Softsign)
        (want,) = ReferenceEvaluator(model).run(None, {"x": feeds["x"].reshape(1)}) if op == "Softsign" else \
            ReferenceEvaluator(model).run(None, feeds)
        (got,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        assert got.shape == () and got.dtype == np.dtype(dt)
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want).astype(np.float64).reshape(()),
                                   rtol=tol, atol=tol)
