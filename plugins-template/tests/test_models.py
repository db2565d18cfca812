"""Whole models: the provider takes what it claims, the CPU runs the rest, results agree."""

import numpy as np
import onnxrt as ort

PROVIDER = "{{Name}}ExecutionProvider"


def test_model_split_between_the_provider_and_the_cpu(onnxrt_models, onnxrt_compare):
    model = onnxrt_models.residual_mlp()  # Mul, Add, Relu, MatMul, Softmax
    result = onnxrt_compare(model)  # asserts every output matches the CPU provider's
    assert [(row["op_type"], row["provider"]) for row in result.assignment] == [
        ("Mul", PROVIDER), ("Add", PROVIDER), ("Relu", PROVIDER),
        ("MatMul", "CPUExecutionProvider"), ("Softmax", "CPUExecutionProvider")]


def test_cpu_listed_first_takes_everything(onnxrt_models):
    model = onnxrt_models.residual_mlp()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider", PROVIDER])
    assert {row["provider"] for row in sess.get_provider_assignment()} == {"CPUExecutionProvider"}


def test_fused_chain_matches_the_cpu(onnxrt_models, onnxrt_compare):
    # x + y -> * z -> Relu: one fused group with three external inputs
    model = onnxrt_models.chain(["Add", "Mul", "Relu"], shape=[3, 4])
    result = onnxrt_compare(model, providers=[(PROVIDER, {"fuse_elementwise": True})])
    groups = result.session.get_fused_groups()
    assert len(groups) == 1 and groups[0]["provider"] == PROVIDER
    assert len(groups[0]["nodes"]) == 3


def test_fused_group_outputs_read_later_stay_correct(onnxrt_models, onnxrt_compare):
    # Add -> Relu is fused; Softmax (CPU) reads the Relu result; Mul (fused again) reads Softmax
    m = onnxrt_models
    model = m.make_model(
        [m.node("Add", ["x", "y"], ["s"]), m.node("Relu", ["s"], ["r"]),
         m.node("Softmax", ["r"], ["p"], axis=-1), m.node("Mul", ["p", "r"], ["q"]),
         m.node("Add", ["q", "s"], ["out"])],
        [m.tensor("x", [2, 5]), m.tensor("y", [2, 5])],
        [m.tensor("out", [2, 5]), m.tensor("r", [2, 5])],
    )
    result = onnxrt_compare(model, providers=[(PROVIDER, {"fuse_elementwise": True})])
    assert [len(g["nodes"]) for g in result.session.get_fused_groups()] == [2, 2]
    x = result.feeds["x"] + result.feeds["y"]
    r = np.maximum(x, 0)
    e = np.exp(r - r.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(result.outputs[0], e / e.sum(axis=-1, keepdims=True) * r + x, rtol=1e-5)
