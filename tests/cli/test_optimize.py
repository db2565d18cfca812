"""``onnxrt optimize``: a valid optimized model that gives the same outputs."""

import numpy as np
import onnx
import pytest

import onnxrt
from onnxrt.cli import main

from .conftest import YOLO

RESNET = YOLO.parent / "resnet_small.onnx"


@pytest.mark.parametrize("model,level", [(YOLO, "all"), (YOLO, "extended"), (YOLO, "basic"), (RESNET, "extended")])
def test_optimized_model_is_valid_and_equivalent(model, level, tmp_path, capsys):
    out = tmp_path / "opt.onnx"
    assert main(["optimize", str(model), "-o", str(out), "--providers", "cpu", "--level", level]) == 0
    onnx.checker.check_model(onnx.load(out), full_check=True)
    before, after = onnx.load(model), onnx.load(out)
    assert 0 < len(after.graph.node) < len(before.graph.node)
    assert [i.name for i in after.graph.input] == [i.name for i in before.graph.input]
    printed = capsys.readouterr().out
    assert f"{len(before.graph.node)} nodes -> {len(after.graph.node)}" in printed and "passes onnx.checker" in printed
    so = onnxrt.SessionOptions()
    so.graph_optimization_level = onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    orig = onnxrt.InferenceSession(str(model), so, providers=["cpu"])
    opt = onnxrt.InferenceSession(str(out), so, providers=["cpu"])
    name = orig.get_inputs()[0].name
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    for a, b in zip(orig.run(None, {name: x}), opt.run(None, {name: x})):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    ops = {(n.domain, n.op_type) for n in after.graph.node}
    if level == "all":
        # level 3 fuses into ops only onnxrt runs (the detector's SiLU into FusedConv),
        # as onnxruntime's own level 3 uses its hardware-specific layouts
        assert any(n.op_type == "FusedConv" and any(a.name == "activation" and a.s == b"QuickGelu"
                                                     for a in n.attribute) for n in after.graph.node)
        return
    assert not any(d == "ai.onnxrt" for d, _ in ops)
    # below it onnxruntime loads the model too
    rt = pytest.importorskip("onnxruntime")
    got = rt.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {name: x})
    np.testing.assert_allclose(got[0], orig.run(None, {name: x})[0], rtol=1e-3, atol=1e-4)


def test_output_must_not_overwrite_the_input(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(RESNET.read_bytes())
    assert main(["optimize", str(src), "-o", str(src)]) == 2
    assert capsys.readouterr().err == "onnxrt: error: -o must differ from the input model\n"
