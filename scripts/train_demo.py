"""Train the demo model shipped in ``onnxrt/demo/``: a digits classifier.

Trains a small MLP on scikit-learn's bundled 8x8 digits (no download), writes it as
an ONNX model built with ``onnx.helper`` (Gemm -> Relu -> Gemm -> Softmax, ArgMax for
the label) and keeps the held-out samples beside it for ``onnxrt run``.

    python scripts/train_demo.py
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

OUT = Path(__file__).resolve().parent.parent / "core" / "onnxrt" / "demo"


def main() -> None:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=0)
    clf.fit(x_train, y_train)
    print(f"scikit-learn held-out accuracy: {clf.score(x_test, y_test):.4f}")

    w1, w2 = (w.astype(np.float32) for w in clf.coefs_)
    b1, b2 = (b.astype(np.float32) for b in clf.intercepts_)
    nodes = [
        helper.make_node("Gemm", ["pixels", "w1", "b1"], ["h"], name="hidden"),
        helper.make_node("Relu", ["h"], ["h_relu"], name="relu"),
        helper.make_node("Gemm", ["h_relu", "w2", "b2"], ["logits"], name="output"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1, name="softmax"),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="argmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10]),
        ],
        initializer=[numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="onnxrt-demo")
    model.doc_string = "8x8 handwritten digits classifier (scikit-learn MLP on sklearn.datasets.load_digits)"
    onnx.checker.check_model(model)
    OUT.mkdir(parents=True, exist_ok=True)
    onnx.save(model, OUT / "digits_mlp.onnx")
    np.savez_compressed(OUT / "digits_holdout.npz", pixels=x_test, labels=y_test)
    print(f"wrote {OUT / 'digits_mlp.onnx'} and {len(y_test)} held-out samples")


if __name__ == "__main__":
    main()
