"""Real models give onnxruntime's answers (rtol 1e-3, atol 1e-4).

- the ``light_*`` models that ship inside the onnx package (ResNet-50, DenseNet-121,
  Inception v1 and v2, SqueezeNet, ShuffleNet, VGG-19, ZFNet, AlexNet). Their stored
  weights are degenerate (a handful of distinct values, so the output is a constant),
  so the tests give them seeded random weights of the same shapes and compare every
  intermediate value, not only the output;
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


def _random_weight(rng, shape, op, index):
    """A value for an initializer by its role, as a real initialization would choose it."""
    if op in ("Conv", "Gemm", "MatMul", "ConvTranspose") and index == 1:
        fan_in = int(np.prod(shape[1:])) if op != "MatMul" else int(shape[0])
        return rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
    if op == "BatchNormalization" and index in (1, 4):  # scale and variance: positive
        return rng.uniform(0.8, 1.2, shape)
    if op == "Mul":  # a per-channel affine scale
        return rng.uniform(0.8, 1.2, shape)
    return rng.uniform(-0.1, 0.1, shape)  # biases, shifts, means


def _randomized(path, seed=0, expose=True):
    """The model with random weights and every intermediate value as an output.

    The light models build each weight at run time as ``ConstantOfShape(shape)`` filled
    with one value; those nodes become initializers of random values, chosen by the
    role of the input they feed. Dropout masks are not exposed: for opsets before 10
    onnxruntime returns zeros where the spec's inference-mode mask keeps every element.
    """
    model = onnx.load(path)
    g = model.graph
    rng = np.random.default_rng(seed)
    role = {}
    for n in g.node:
        for i, name in enumerate(n.input):
            role.setdefault(name, (n.op_type, i))
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
    keep, new_inits = [], []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts and n.output[0] in role:
            w = _random_weight(rng, tuple(int(d) for d in consts[n.input[0]]), *role[n.output[0]])
            new_inits.append(onnx.numpy_helper.from_array(w.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    model.ir_version = max(model.ir_version, 4)  # initializers need not be listed as inputs
    if not expose:
        return model
    outputs = {o.name for o in g.output}
    for n in g.node:
        for k, o in enumerate(n.output):
            if o and o not in outputs and not (n.op_type == "Dropout" and k == 1):
                g.output.append(onnx.ValueInfoProto(name=o))
                outputs.add(o)
    return model


@pytest.mark.parametrize("name", LIGHT)
def test_light_model_matches_onnxruntime(name, tmp_path):
    assert LIGHT, "the onnx package ships light_* models"
    n_outputs = len(onnx.load(LIGHT_DIR / name).graph.output)
    model = _randomized(LIGHT_DIR / name)
    path = tmp_path / name
    onnx.save(model, path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(sess)
    got, want = sess.run(None, feeds), ref.run(None, feeds)
    names = [o.name for o in model.graph.output]
    for i, (name_, g, w) in enumerate(zip(names, got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, name_
        if i < n_outputs:  # the model's own outputs
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=name_)
        else:
            # intermediates reach magnitudes in the thousands with random weights, where
            # float32 summation order alone moves near-zero elements by more than 1e-4:
            # the absolute tolerance follows the tensor's scale
            scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL * scale, err_msg=name_)
    # the random weights make the network's values informative, unlike the stored ones
    assert len(got) > 10 and float(np.std(got[0])) > 1e-5
    assert max(float(np.std(v)) for v in got if v.size) > 1e-2


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


@pytest.mark.parametrize("name", ["light_inception_v1.onnx", "light_resnet50.onnx"])
def test_light_models_at_both_optimization_levels(name, tmp_path):
    # the optimizer must not change answers
    path = tmp_path / name
    onnx.save(_randomized(LIGHT_DIR / name, expose=False), path)
    feeds = None
    outs = []
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        sess = ort.InferenceSession(str(path), so)
        feeds = feeds or _feeds(sess)
        outs.append(sess.run(None, feeds)[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
