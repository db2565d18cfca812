"""Real models give onnxruntime's answers (rtol 1e-3, atol 1e-4).

- the ``light_*`` models that ship inside the onnx package (ResNet-50, DenseNet-121,
  Inception v1 and v2, SqueezeNet, ShuffleNet, VGG-19, ZFNet, AlexNet);
- models exported from PyTorch with random weights by ``scripts/export_test_models.py``:
  a small ResNet, a MobileNetV2-style net, a transformer encoder and an LSTM tagger.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxrt as ort

rt = pytest.importorskip("onnxruntime")

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT = sorted(p.name for p in LIGHT_DIR.glob("light_*.onnx"))
DATA = Path(__file__).parent / "data"

RTOL, ATOL = 1e-3, 1e-4


def _feeds(sess, shapes=None, int_high=None, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for a in sess.get_inputs():
        shape = [d if isinstance(d, int) else shapes[d] for d in a.shape]
        if a.type == "tensor(int64)":
            feeds[a.name] = rng.integers(0, int_high, size=shape).astype(np.int64)
        else:
            feeds[a.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _compare(path, shapes=None, int_high=None, min_nodes=1):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(sess, shapes, int_high)
    got = sess.run(None, feeds)
    want = ref.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    assert len(sess.get_provider_assignment()) >= min_nodes
    return got


@pytest.mark.parametrize("name", LIGHT)
def test_light_model_matches_onnxruntime(name):
    assert LIGHT, "the onnx package ships light_* models"
    _compare(LIGHT_DIR / name)


@pytest.mark.parametrize("batch", [1, 3])
def test_resnet_small(batch):
    (y,) = _compare(DATA / "resnet_small.onnx", {"batch": batch})
    assert y.shape == (batch, 10)


@pytest.mark.parametrize("batch", [1, 2])
def test_mobilenet_small_depthwise(batch):
    model = onnx.load(DATA / "mobilenet_small.onnx")
    assert any(n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute) for n in model.graph.node)
    (y,) = _compare(DATA / "mobilenet_small.onnx", {"batch": batch})
    assert y.shape == (batch, 10)


@pytest.mark.parametrize("batch,seq", [(1, 16), (2, 40)])
def test_transformer_encoder(batch, seq):
    (y,) = _compare(DATA / "transformer_encoder.onnx", {"batch": batch, "sequence": seq}, int_high=1000)
    assert y.shape == (batch, 2)


@pytest.mark.parametrize("batch,seq", [(1, 20), (3, 7)])
def test_lstm_tagger(batch, seq):
    (y,) = _compare(DATA / "lstm_tagger.onnx", {"batch": batch, "sequence": seq}, int_high=500)
    assert y.shape == (batch, seq, 5)


def test_light_models_at_both_optimization_levels():
    # the optimizer must not change answers
    path = LIGHT_DIR / "light_inception_v1.onnx"
    feeds = None
    outs = []
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        sess = ort.InferenceSession(str(path), so)
        feeds = feeds or _feeds(sess)
        outs.append(sess.run(None, feeds)[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
