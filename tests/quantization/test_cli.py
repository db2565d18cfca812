"""The quantize and float16 verbs, through their own parser and through ``onnxrt``."""

import argparse
import importlib.util

import numpy as np
import onnx
import pytest

from onnxrt.errors import InvalidArgument
from onnxrt.quantization.cli import register

from .conftest import run_onnxrt, top1
from .models import encoder, encoder_data


def _parse(argv):
    p = argparse.ArgumentParser(prog="onnxrt")
    register(p.add_subparsers(dest="command"))
    return p.parse_args(argv)


def _run(argv) -> int:
    args = _parse(argv)
    return args.func(args)


def test_quantize_calibrate_from_npy_files(digits, tmp_path, capsys):
    path, x_train, x_test, y_test = digits
    cal = tmp_path / "cal"
    cal.mkdir()
    np.save(cal / "pixels.npy", x_train[:512])
    out = tmp_path / "q.onnx"
    assert _run(["quantize", path, "-o", str(out), "--calibrate", str(cal), "--per-channel",
                 "--batch-size", "64", "--format", "qoperator"]) == 0
    text = capsys.readouterr().out
    assert "what changed" in text and "com.microsoft.QGemm" in text and "nodes quantized: 2" in text
    labels = run_onnxrt(str(out), {"pixels": x_test})[0]
    assert top1(labels, y_test) >= top1(run_onnxrt(path, {"pixels": x_test})[0], y_test) - 0.01


def test_quantize_npz_batches_and_dynamic(digits, tmp_path, capsys):
    path, x_train, _, _ = digits
    cal = tmp_path / "cal"
    cal.mkdir()
    for i in range(3):
        np.savez(cal / f"b{i}.npz", pixels=x_train[i * 32:(i + 1) * 32])
    assert _run(["quantize", path, "-o", str(tmp_path / "s.onnx"), "--calibrate", str(cal),
                 "--method", "percentile"]) == 0
    assert "QuantizeLinear" in capsys.readouterr().out
    assert _run(["quantize", path, "-o", str(tmp_path / "d.onnx"), "--dynamic"]) == 0
    text = capsys.readouterr().out
    assert "MatMulInteger" in text and "DynamicQuantizeLinear" in text


def test_quantize_errors_name_the_problem(digits, tmp_path):
    path, _, _, _ = digits
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgument, match="pixels.npy"):
        _run(["quantize", path, "-o", str(tmp_path / "q.onnx"), "--calibrate", str(empty)])
    with pytest.raises(SystemExit):
        _parse(["quantize", path, "-o", "x.onnx"])  # --dynamic or --calibrate is required


def test_float16_plain_and_auto(tmp_path, capsys):
    model = encoder(layers=1)
    src = tmp_path / "enc.onnx"
    onnx.save(model, src)
    out = tmp_path / "enc16.onnx"
    assert _run(["float16", str(src), "-o", str(out), "--keep-io-types"]) == 0
    assert "Cast" in capsys.readouterr().out
    x = encoder_data(4)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=x)
    assert _run(["float16", str(src), "-o", str(out), "--auto", str(feeds), "--keep-io-types",
                 "--rtol", "1e-4", "--atol", "1e-4"]) == 0
    text = capsys.readouterr().out
    assert "kept in float32" in text and "within rtol" in text
    ref = run_onnxrt(model, {"x": x})[0]
    got = run_onnxrt(str(out), {"x": x})[0]
    assert np.all(np.abs(got - ref) <= 1e-4 * max(1.0, np.abs(ref).max()) + 1e-4 * np.abs(ref))


@pytest.mark.skipif(importlib.util.find_spec("onnxrt.cli") is None, reason="no onnxrt.cli package")
def test_the_onnxrt_command_has_the_verbs(digits, tmp_path, capsys):
    from onnxrt import cli

    if "quantize" not in cli.build_parser().format_help():
        pytest.skip("this onnxrt command does not register onnxrt.quantization's verbs")
    path, _, _, _ = digits
    assert cli.main(["quantize", path, "-o", str(tmp_path / "d.onnx"), "--dynamic"]) == 0
    assert "MatMulInteger" in capsys.readouterr().out
    assert cli.main(["quantize", path, "-o", str(tmp_path / "x.onnx"), "--calibrate", str(tmp_path / "none")]) == 2
    assert "is not a directory" in capsys.readouterr().err
