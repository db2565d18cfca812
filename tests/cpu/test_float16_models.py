"""float16 models, as ``onnxconverter_common.float16.convert_float_to_float16`` makes them.

The float32 test models (two CNNs, a transformer encoder and a BERT-like model) are
converted to float16 weights and activations at run time, run on onnxrt and on
onnxruntime, and compared within float16 tolerance: a few units in the last place of
the output's magnitude. They are also checked against the float32 original, which
shows that the half-precision graph still computes the same function.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxconverter_common")

import onnxrt

from tests.float16_models import DATA, REPO_CONVERSIONS, repo_feeds, repo_float16

CASES = REPO_CONVERSIONS


@pytest.mark.parametrize("name", list(CASES))
def test_float16_model_matches_onnxruntime(name):
    model = repo_float16(name)
    assert any(
        t.data_type == onnx.TensorProto.FLOAT16
        for t in onnx.load_from_string(model).graph.initializer
    )
    feeds = repo_feeds(name, np.random.default_rng(0), half=True)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    ref32 = onnxrt.InferenceSession(
        str(DATA / f"{name}.onnx"), providers=["CPUExecutionProvider"]
    ).run(None, repo_feeds(name, np.random.default_rng(0), half=False))
    for g, e, r in zip(got, exp, ref32):
        assert g.dtype == e.dtype == np.float16 and g.shape == e.shape
        mag = float(np.abs(e.astype(np.float32)).max())
        ulp = float(np.spacing(np.float16(mag)))
        np.testing.assert_allclose(
            g.astype(np.float32), e.astype(np.float32), rtol=0, atol=8 * ulp
        )
        # half precision keeps about 3 decimal digits through these depths
        np.testing.assert_allclose(
            g.astype(np.float32), r, rtol=0, atol=0.02 * max(mag, 1e-3)
        )


def test_float16_labels_agree_on_a_batch():
    model = repo_float16("resnet_small")
    x = np.random.default_rng(5).standard_normal((32, 3, 64, 64)).astype(np.float16)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"image": x}
    )[0]
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"image": x}
    )[0]
    assert (got.argmax(1) == exp.argmax(1)).mean() >= 0.99
