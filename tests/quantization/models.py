"""Test models for onnxrt.quantization, built with onnx.helper (random weights, fixed seed).

- :func:`cnn`: Conv/ReLU/MaxPool/Conv/ReLU/GlobalAveragePool/Flatten/Gemm on 3x16x16 images;
- :func:`encoder`: two post-norm transformer encoder layers (multi-head attention,
  erf GELU feed-forward, LayerNormalization) on [batch, 16, 32];
- :func:`digits`: the shipped digits MLP and scikit-learn's digits, split as
  ``scripts/train_demo.py`` split them (the training rows calibrate, the held-out
  rows measure).

All are opset 17, IR version 9, which onnxruntime loads too.
"""

from __future__ import annotations

import importlib.resources

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 9
OPSET = 17


def _model(nodes, inputs, outputs, inits, name: str) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = IR_VERSION
    onnx.checker.check_model(m)
    return m


def cnn(seed: int = 0) -> onnx.ModelProto:
    """A small image classifier: float32[batch, 3, 16, 16] -> logits float32[batch, 10]."""
    rng = np.random.default_rng(seed)

    def he(*shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    inits = [
        numpy_helper.from_array(he(8, 3, 3, 3), "w1"),
        numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b1"),
        numpy_helper.from_array(he(16, 8, 3, 3), "w2"),
        numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "b2"),
        numpy_helper.from_array(he(10, 16), "wf"),
        numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype(np.float32), "bf"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits, "cnn")


def encoder(seed: int = 0, layers: int = 2, seq: int = 16, dim: int = 32, heads: int = 4,
            ffn: int = 64) -> onnx.ModelProto:
    """Post-norm transformer encoder layers: float32[batch, seq, dim] -> float32[batch, seq, dim]."""
    rng = np.random.default_rng(seed)
    dh = dim // heads
    inits, nodes = [], []

    def w(name, *shape, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name))
        return name

    def c(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    c("split_shape", [0, 0, heads, dh], np.int64)
    c("merge_shape", [0, 0, dim], np.int64)
    c("inv_sqrt_dh", 1.0 / np.sqrt(dh))
    c("half", 0.5)
    c("one", 1.0)
    c("inv_sqrt2", 1.0 / np.sqrt(2.0))
    x = "x"
    for i in range(layers):
        p = f"l{i}_"

        def n(op, ins, outs, **kw):
            nodes.append(helper.make_node(op, ins, [p + o for o in outs], name=p + outs[0], **kw))
            return p + outs[0]

        heads_of = {}
        for proj in ("q", "k", "v"):
            mm = n("MatMul", [x, w(p + f"w{proj}", dim, dim)], [f"{proj}_mm"])
            b = n("Add", [mm, w(p + f"b{proj}", dim, scale=0.02)], [f"{proj}_b"])
            r = n("Reshape", [b, "split_shape"], [f"{proj}_r"])
            heads_of[proj] = n("Transpose", [r], [f"{proj}_t"], perm=[0, 2, 3, 1] if proj == "k" else [0, 2, 1, 3])
        s = n("MatMul", [heads_of["q"], heads_of["k"]], ["scores"])
        s = n("Mul", [s, "inv_sqrt_dh"], ["scaled"])
        a = n("Softmax", [s], ["probs"], axis=-1)
        o = n("MatMul", [a, heads_of["v"]], ["ctx"])
        o = n("Transpose", [o], ["ctx_t"], perm=[0, 2, 1, 3])
        o = n("Reshape", [o, "merge_shape"], ["ctx_r"])
        o = n("MatMul", [o, w(p + "wo", dim, dim)], ["o_mm"])
        o = n("Add", [o, w(p + "bo", dim, scale=0.02)], ["o_b"])
        h = n("Add", [x, o], ["res1"])
        h = n("LayerNormalization", [h, c(p + "g1", np.ones(dim)), c(p + "be1", np.zeros(dim))], ["ln1"], axis=-1)
        f = n("MatMul", [h, w(p + "w1", dim, ffn)], ["f1_mm"])
        f = n("Add", [f, w(p + "b1", ffn, scale=0.02)], ["f1_b"])
        e = n("Mul", [f, "inv_sqrt2"], ["gelu_div"])
        e = n("Erf", [e], ["gelu_erf"])
        e = n("Add", [e, "one"], ["gelu_add"])
        e = n("Mul", [f, e], ["gelu_mul"])
        f = n("Mul", [e, "half"], ["gelu"])
        f = n("MatMul", [f, w(p + "w2", ffn, dim)], ["f2_mm"])
        f = n("Add", [f, w(p + "b2", dim, scale=0.02)], ["f2_b"])
        h2 = n("Add", [h, f], ["res2"])
        x = n("LayerNormalization", [h2, c(p + "g2", np.ones(dim)), c(p + "be2", np.zeros(dim))], ["ln2"], axis=-1)
    nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, dim])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", seq, dim])], inits, "encoder")


def cnn_data(n: int, seed: int = 1) -> np.ndarray:
    """Images for :func:`cnn`: smooth random fields (neighbouring pixels correlate, as in photos)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, 3, 4, 4)).astype(np.float32)
    img = np.repeat(np.repeat(base, 4, axis=2), 4, axis=3)
    return (img + 0.3 * rng.standard_normal(img.shape)).astype(np.float32)


def encoder_data(n: int, seed: int = 1, seq: int = 16, dim: int = 32) -> np.ndarray:
    """Token embeddings for :func:`encoder`."""
    return np.random.default_rng(seed).standard_normal((n, seq, dim)).astype(np.float32)


def digits():
    """(model path, calibration pixels, held-out pixels, held-out labels)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.data.astype(np.float32)
    x_train, x_test, _, y_test = train_test_split(x, d.target, test_size=0.25, random_state=0, stratify=d.target)
    path = str(importlib.resources.files("onnxrt") / "demo" / "digits_mlp.onnx")
    return path, x_train, x_test, y_test


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two outputs, flattened."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
