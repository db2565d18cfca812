"""OpenCL Gemm and MatMul: the ONNX node tests, and comparisons with the CPU provider
on shapes the node tests do not reach (ragged tiles, long K, broadcast batches)."""

import numpy as np
import onnxrt as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxrt.errors import InvalidArgument

from ..conftest import make_model
from .kernel_checks import (
    check_node_case,
    compare_with_cpu,
    node_cases,
    skip_without_opencl,
)

pytestmark = skip_without_opencl()

OPS = {"Gemm", "MatMul"}


@pytest.mark.parametrize("case", node_cases(OPS))
def test_node_case(case):
    check_node_case(case, OPS, {})


def _matmul_model(sa, sb, b_const=None):
    inits = []
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(sa))]
    if b_const is not None:
        inits.append(numpy_helper.from_array(b_const, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(sb)))
    return make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs,
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((37, 53), (53, 29)),  # no side a multiple of the 4x4 register block
        ((3, 2000), (2000, 5)),  # long K
        ((2, 3, 5, 7), (7, 9)),  # shared B: one tall product
        ((2, 1, 5, 7), (4, 7, 3)),  # broadcast on both sides
        ((2, 3, 4, 5, 6), (3, 1, 6, 2)),  # three batch dims, one broadcast: loops on the host
        ((7,), (2, 7, 3)),  # 1-D left operand
        ((2, 4, 7), (7,)),  # 1-D right operand
        ((6,), (6,)),  # dot product: a 0-D result
    ],
)
def test_matmul_matches_cpu(sa, sb):
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    atol = 1e-4 * np.sqrt(sa[-1])
    compare_with_cpu(_matmul_model(sa, sb), {"a": a, "b": b}, atol=atol)
    got = compare_with_cpu(_matmul_model(sa, sb, b_const=b), {"a": a}, atol=atol)
    np.testing.assert_allclose(got[0], np.matmul(a, b), rtol=1e-4, atol=atol)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (29,), (1, 29), (37, 1), (37, 29)])
def test_gemm_matches_cpu(trans_a, trans_b, c_shape):
    rng = np.random.default_rng(7)
    M, K, N = 37, 61, 29
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape)),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b.shape))]
    feeds = {"a": a, "b": b}
    names = ["a", "b"]
    if c_shape is not None:
        c = rng.standard_normal(c_shape).astype(np.float32)
        inputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, list(c_shape)))
        feeds["c"] = c
        names.append("c")
    node = helper.make_node("Gemm", names, ["y"], alpha=0.7, beta=-1.3, transA=trans_a, transB=trans_b)
    model = make_model([node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])])
    got = compare_with_cpu(model, feeds, atol=1e-3)
    ref = 0.7 * ((a.T if trans_a else a) @ (b.T if trans_b else b))
    if c_shape is not None:
        ref = ref - 1.3 * feeds["c"]
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-3)


def test_gemm_rejects_bad_c_shape():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"])
    model = make_model(
        [node],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    sess = ort.InferenceSession(model, providers=["OpenCLExecutionProvider", "CPUExecutionProvider"])
    f = np.ones((3, 4), np.float32)
    with pytest.raises(InvalidArgument, match=r"C of shape \(2, 3\) does not broadcast"):
        sess.run(None, {"a": f, "b": f.T.copy(), "c": np.ones((2, 3), np.float32)})


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_with_constant_weight(trans_b):
    # the Linear-layer form: a constant (pre-transposed once when transB=1) weight and bias
    rng = np.random.default_rng(11)
    w = rng.standard_normal((19, 45) if trans_b else (45, 19)).astype(np.float32)
    bias = rng.standard_normal(19).astype(np.float32)
    model = make_model(
        [helper.make_node("Gemm", ["x", "w", "bias"], ["y"], transB=trans_b, alpha=0.5)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 45])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 19])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")],
    )
    for n in (1, 3, 50):
        x = rng.standard_normal((n, 45)).astype(np.float32)
        got = compare_with_cpu(model, {"x": x}, atol=1e-4 * np.sqrt(45))
        np.testing.assert_allclose(got[0], 0.5 * x @ (w.T if trans_b else w) + bias, rtol=1e-4, atol=1e-3)


def test_clblast_fast_path_when_installed():
    pytest.importorskip("pyclblast")
    from onnxrt_opencl.kernels import gemm as gemm_module

    assert gemm_module._clblast is not None
    rng = np.random.default_rng(12)
    a = rng.standard_normal((33, 70)).astype(np.float32)
    b = rng.standard_normal((70, 21)).astype(np.float32)
    got = compare_with_cpu(_matmul_model(a.shape, b.shape), {"a": a, "b": b}, atol=1e-3)
    np.testing.assert_allclose(got[0], a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("activation,attrs", [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.3}),
                                              ("HardSigmoid", {}), ("Tanh", {}), ("Sigmoid", {})])
def test_fused_gemm_matches_cpu(activation, attrs):
    rng = np.random.default_rng(13)
    a = rng.standard_normal((9, 21)).astype(np.float32)
    w = rng.standard_normal((13, 21)).astype(np.float32)
    c = rng.standard_normal(13).astype(np.float32)
    model = make_model(
        [helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain="com.microsoft", transB=1,
                          activation=activation, **attrs)],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [9, 21])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")],
    )
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    compare_with_cpu(model, {"a": a}, rtol=1e-5, atol=1e-5)
