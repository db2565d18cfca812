"""``onnxrt compare`` and :func:`onnxrt.cli.compare.compare_models`: error per output, and the
first node whose outputs differ, found across any two providers or onnxruntime."""

import numpy as np
import onnx
import pytest

from onnxrt.cli import main
from onnxrt.cli.compare import compare_models, compare_values
from onnxrt.cli.feeds import random_feeds

from .conftest import DIMS, YOLO


def _sigmoids():
    return [n.name for n in onnx.load(YOLO).graph.node if n.op_type == "Sigmoid"]


def test_cpu_agrees_with_onnxruntime(yolo, capsys):
    assert main(["compare", yolo, "--providers", "cpu", "--against", "onnxruntime", *DIMS]) == 0
    out = capsys.readouterr().out
    assert "CPUExecutionProvider against onnxruntime" in out
    assert "boxes" in out and "scores" in out and "all outputs agree" in out
    assert "MISMATCH" not in out


def test_planted_wrong_kernel_is_named_against_onnxruntime(yolo, wrong_sigmoid, capsys):
    assert main(["compare", yolo, "--providers", "wrong,cpu", "--against", "onnxruntime", *DIMS]) == 1
    out = capsys.readouterr().out
    first = _sigmoids()[0]  # every Sigmoid is wrong: the first in topological order shows first
    assert "MISMATCH" in out
    assert f"first differing node: {first} (Sigmoid)" in out
    assert "WrongSigmoidExecutionProvider" in out


@pytest.mark.parametrize("pick", [10, -1])
def test_bisect_names_exactly_the_planted_node_between_providers(yolo, wrong_sigmoid, capsys, pick):
    target = _sigmoids()[pick]  # one wrong node deep in the graph; the others are right
    wrong_sigmoid.targets = {target}
    assert main(["compare", yolo, "--providers", "wrong,cpu", "--against", "cpu", *DIMS]) == 1
    out = capsys.readouterr().out
    assert "against CPUExecutionProvider" in out
    assert f"first differing node: {target} (Sigmoid)" in out
    assert "runs on WrongSigmoidExecutionProvider here and on CPUExecutionProvider in the reference" in out
    assert "max abs err 0.1" in out


def test_library_report(wrong_sigmoid):
    import onnxrt

    target = _sigmoids()[16]  # the neck's
    wrong_sigmoid.targets = {target}
    sess = onnxrt.InferenceSession(str(YOLO), providers=["cpu"])
    feeds = random_feeds(sess.get_inputs(), {"batch": 2, "height": 32, "width": 64}, seed=1)
    report = compare_models(YOLO, feeds, providers=["wrong", "cpu"], against=["cpu"])
    assert not report.ok and report.bisected
    fd = report.first_divergence
    assert fd.node == target and fd.op_type == "Sigmoid"
    assert fd.provider == "WrongSigmoidExecutionProvider" and fd.against_provider == "CPUExecutionProvider"
    assert fd.outputs[0].max_abs == pytest.approx(0.1, abs=1e-5)
    # without bisecting only the outputs are compared
    report = compare_models(YOLO, feeds, providers=["wrong", "cpu"], against=["cpu"], bisect=False)
    assert not report.ok and report.first_divergence is None and not report.bisected


def test_always_bisect_finds_an_error_the_outputs_hide(yolo, wrong_sigmoid, capsys):
    # the error at the first Sigmoid shrinks below tolerance by the outputs
    target = _sigmoids()[0]
    wrong_sigmoid.targets = {target}
    assert main(["compare", yolo, "--providers", "wrong,cpu", "--against", "cpu", *DIMS]) == 0
    assert "first differing node" not in capsys.readouterr().out
    assert main(["compare", yolo, "--providers", "wrong,cpu", "--against", "cpu", "--always-bisect", *DIMS]) == 0
    out = capsys.readouterr().out
    assert "all outputs agree" in out and f"first differing node: {target} (Sigmoid)" in out


def test_no_bisect_option(yolo, wrong_sigmoid, capsys):
    assert main(["compare", yolo, "--providers", "wrong,cpu", "--against", "cpu", "--no-bisect", *DIMS]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "first differing node" not in out


def test_loose_tolerance_accepts_the_planted_error(yolo, wrong_sigmoid, capsys):
    wrong_sigmoid.targets = {_sigmoids()[-1]}  # the scores' Sigmoid: boxes untouched, scores off by 0.1
    assert main(["compare", yolo, "--providers", "wrong,cpu", "--against", "cpu", "--atol", "0.2", *DIMS]) == 0
    assert "all outputs agree" in capsys.readouterr().out


def test_compare_values_tolerance_scale_nan_and_shape():
    ref = np.array([100.0, 0.0, np.nan, np.inf], np.float32)
    # atol is scaled by the tensor's magnitude (100): 5e-3 at a zero is within 1e-4 * 100
    assert compare_values("v", ref + np.float32([0, 5e-3, 0, 0]), ref).ok
    assert not compare_values("v", ref + np.float32([0, 5e-2, 0, 0]), ref).ok
    bad = compare_values("v", np.zeros(3, np.float32), np.zeros(4, np.float32))
    assert not bad.ok and "shape" in bad.note
    assert compare_values("i", np.arange(3), np.arange(3)).ok
    assert not compare_values("i", np.arange(3), np.arange(1, 4)).ok


def test_a_model_onnxruntime_cannot_load_is_a_one_line_error(tmp_path, capsys):
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT16, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT16, [2])])
    path = tmp_path / "int16_relu.onnx"
    # Relu takes int16 since opset 14; onnxruntime (1.31 and 1.32) has no kernel for it
    # (it expands Relu into a Max it has no int16 kernel for) and refuses the model
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    assert main(["compare", str(path), "--providers", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("onnxrt: error: Fail: onnxruntime could not run the model: ") and err.count("\n") == 1
