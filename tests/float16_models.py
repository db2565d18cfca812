"""float16 models for the tests and the float16 benchmark: two built with
``onnx.helper`` (a conv net and a transformer block) and the repository's float32
test models converted to float16, with their feeds."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

__all__ = ["conv_net", "ln_block", "REPO_CONVERSIONS", "repo_float16", "repo_feeds", "DATA"]

DATA = Path(__file__).resolve().parent / "models" / "data"
F16 = np.float16


def _init(name, arr):
    return nh.from_array(arr, name)


def conv_net(rng, c=16, hw=32):
    """Conv, Relu, BatchNormalization, Conv, Sigmoid, Resize, Reshape, Softmax."""
    inits = [
        _init("w1", (rng.standard_normal((c, 3, 3, 3)) * 0.3).astype(F16)),
        _init("b1", (rng.standard_normal(c) * 0.1).astype(F16)),
        _init("scale", (rng.random(c) + 0.5).astype(F16)), _init("bias", (rng.standard_normal(c) * 0.1).astype(F16)),
        _init("mean", (rng.standard_normal(c) * 0.1).astype(F16)), _init("var", (rng.random(c) + 0.5).astype(F16)),
        _init("w2", (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(F16)),
        _init("scales", np.array([1, 1, 2, 2], np.float32)),
        _init("shape", np.array([1, c, -1], np.int64)),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("BatchNormalization", ["r1", "scale", "bias", "mean", "var"], ["bn"]),
        h.make_node("Conv", ["bn", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        h.make_node("Sigmoid", ["c2"], ["s"]),
        h.make_node("Resize", ["s", "", "scales"], ["up"], mode="linear"),
        h.make_node("Reshape", ["up", "shape"], ["flat"]),
        h.make_node("Softmax", ["flat"], ["y"], axis=-1),
    ]
    g = h.make_graph(nodes, "conv_net", [h.make_tensor_value_info("x", TP.FLOAT16, [1, 3, hw, hw])],
                     [h.make_tensor_value_info("y", TP.FLOAT16, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def ln_block(rng, s=16, d=64):
    """LayerNormalization, MatMul, Add, Gelu, MatMul, residual Add, LayerNormalization."""
    inits = [
        _init("gamma", (rng.random(d) + 0.5).astype(F16)), _init("beta", (rng.standard_normal(d) * 0.1).astype(F16)),
        _init("w1", (rng.standard_normal((d, 4 * d)) / np.sqrt(d)).astype(F16)),
        _init("b1", (rng.standard_normal(4 * d) * 0.1).astype(F16)),
        _init("w2", (rng.standard_normal((4 * d, d)) / np.sqrt(4 * d)).astype(F16)),
    ]
    nodes = [
        h.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["ln", "w1"], ["m1"]),
        h.make_node("Add", ["m1", "b1"], ["a1"]),
        h.make_node("Gelu", ["a1"], ["g"]),
        h.make_node("MatMul", ["g", "w2"], ["m2"]),
        h.make_node("Add", ["m2", "x"], ["res"]),
        h.make_node("LayerNormalization", ["res", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
    ]
    g = h.make_graph(nodes, "ln_block", [h.make_tensor_value_info("x", TP.FLOAT16, [1, s, d])],
                     [h.make_tensor_value_info("y", TP.FLOAT16, [1, s, d])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 20)], ir_version=9)


#: the repository's float32 test models, and how each is converted to float16
REPO_CONVERSIONS = {
    "resnet_small": {},
    "mobilenet_small": {},
    # the converter would retype this export's float Casts without changing their 'to'
    "transformer_encoder": {"op_block_list": ["Cast"]},
    "bert_tiny": {},
}


def repo_float16(name: str) -> bytes:
    """The repository's model ``name`` converted to float16 by onnxconverter_common."""
    import onnx
    from onnxconverter_common.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m16 = convert_float_to_float16(onnx.load(str(DATA / f"{name}.onnx")), **REPO_CONVERSIONS[name])
    return m16.SerializeToString()


def repo_feeds(name: str, rng, half: bool) -> dict:
    """Feeds for the repository's model ``name`` (float16 images where ``half``)."""
    if name in ("resnet_small", "mobilenet_small"):
        x = rng.standard_normal((4, 3, 64, 64)).astype(np.float32)
        return {"image": x.astype(np.float16) if half else x}
    ids = rng.integers(0, 100, (2, 16)).astype(np.int64)
    if name == "transformer_encoder":
        return {"input_ids": ids}
    mask = np.ones((2, 16), np.int64)
    mask[1, 12:] = 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": np.zeros((2, 16), np.int64),
    }
