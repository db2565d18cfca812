"""``onnxrt run MODEL``: random or file inputs, fixed symbolic dims, saved outputs."""

import numpy as np
import pytest

import onnxrt
from onnxrt.cli import main

from .conftest import DIMS


def test_run_prints_each_output(yolo, capsys):
    assert main(["run", yolo, "--providers", "cpu", *DIMS]) == 0
    out = capsys.readouterr().out
    # 64x96 image: 8x12 anchors at stride 8, 4x6 at stride 16
    assert "boxes" in out and "[1, 120, 4]" in out and "float32" in out
    assert "scores" in out and "min " in out and "mean " in out
    assert "CPUExecutionProvider" in out


def test_run_saves_outputs_equal_to_a_direct_run(yolo, tmp_path, capsys):
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 48)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", yolo, "--providers", "cpu", "--input", f"images={tmp_path / 'x.npy'}",
                 "--output", str(tmp_path / "out")]) == 0
    boxes, scores = onnxrt.InferenceSession(yolo, providers=["cpu"]).run(None, {"images": x})
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "boxes.npy"), boxes)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "scores.npy"), scores)
    assert "[2, 30, 4]" in capsys.readouterr().out


def test_unresolved_dim_is_named(yolo, capsys):
    assert main(["run", yolo, "--dim", "batch=1", "--dim", "height=64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "onnxrt: error: input 'images' has an unresolved dimension 'width'; fix it with --dim width=VALUE"


@pytest.mark.parametrize("arg,message", [
    ("--dim=height=big", "--dim height='big': not an integer"),
    ("--dim=height", "bad --dim 'height': expected NAME=VALUE"),
    ("--input=pixels=x.npy", "--input pixels: the model has no input 'pixels' (inputs: images)"),
    ("--input=images=missing.npy", "--input images=missing.npy: cannot read a .npy array"),
])
def test_bad_options_exit_2_with_one_line(yolo, capsys, arg, message):
    assert main(["run", yolo, arg]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_demo_still_runs(capsys):
    assert main(["run", "--providers", "cpu"]) == 0
    assert "accuracy" in capsys.readouterr().out
