"""Models and data shared by the scale-out tests: the shipped digits MLP and an sklearn pipeline."""

import importlib.resources

import numpy as np
import onnxrt
import pandas as pd
import pytest

CPU = ["CPUExecutionProvider"]

#: Rows per batch for the digits model. Bitwise comparisons need the same arithmetic on
#: both sides, and OpenBLAS splits a product over its threads once it exceeds
#: 65536 * 4 multiply-adds (here: more than 64 rows through the 64x64 layer), with
#: thread counts that differ between the engines' workers and this process. Below
#: that size every product is single-threaded everywhere.
DIGITS_BATCH = 45


@pytest.fixture(scope="session")
def digits_path() -> str:
    """The demo model: pixels float32[batch, 64] -> label int64[batch], probabilities float32[batch, 10]."""
    return str(importlib.resources.files("onnxrt") / "demo" / "digits_mlp.onnx")


@pytest.fixture(scope="session")
def digits_rows() -> np.ndarray:
    """11,250 rows of 8x8 digit images (the shipped hold-out set, tiled, each copy shifted)."""
    data = np.load(str(importlib.resources.files("onnxrt") / "demo" / "digits_holdout.npz"))
    base = data["pixels"]
    copies = [np.clip(base + (k % 5) * 0.25, 0, 16) for k in range(25)]
    return np.concatenate(copies).astype(np.float32)


@pytest.fixture(scope="session")
def cancer_model():
    """(model bytes, feature DataFrame of 11,380 float64 rows): StandardScaler + LogisticRegression."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    frame = load_breast_cancer(as_frame=True)
    X, y = frame.data, frame.target
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)
    onx = to_onnx(pipe, X.to_numpy(np.float32)[:1], options={"zipmap": False}, target_opset=17)
    rng = np.random.default_rng(0)
    big = pd.concat([X * rng.uniform(0.9, 1.1, size=X.shape) for _ in range(20)], ignore_index=True)
    return onx.SerializeToString(), big


def batched(predictor: onnxrt.Predictor, frame_or_array, size: int) -> dict[str, np.ndarray]:
    """The single-process reference: the same predictor over the same row batches, concatenated."""
    parts = []
    for start in range(0, len(frame_or_array), size):
        chunk = frame_or_array[start:start + size]
        parts.append(predictor(chunk if not isinstance(chunk, np.ndarray) else {"pixels": chunk}))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
