"""Bad input to any verb: one line on stderr, exit status 2, a traceback only with --debug."""

import pytest

from onnxrt.cli import main
from onnxrt.errors import InvalidProtobuf

VERBS = [["run"], ["explain"], ["profile"], ["bench"], ["compare"], ["optimize", "-o", "out.onnx"]]


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_missing_file(verb, tmp_path, capsys):
    missing = tmp_path / "nope.onnx"
    assert main([verb[0], str(missing), *verb[1:]]) == 2
    err = capsys.readouterr().err
    assert err == f"onnxrt: error: model file {str(missing)!r} does not exist\n"


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_not_a_model(verb, tmp_path, capsys):
    bad = tmp_path / "notes.onnx"
    bad.write_text("these are not the weights you are looking for\n" * 3)
    assert main([verb[0], str(bad), *verb[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("onnxrt: error: ") and err.count("\n") == 1 and str(bad) in err


def test_a_directory_is_not_a_model(tmp_path, capsys):
    assert main(["explain", str(tmp_path)]) == 2
    assert "is a directory, not a model file" in capsys.readouterr().err


def test_unknown_provider(yolo, capsys):
    assert main(["explain", yolo, "--providers", "NoSuchExecutionProvider"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NoSuchExecutionProvider" in err


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xff" * 10)
    with pytest.raises(InvalidProtobuf):
        main(["--debug", "run", str(bad)])


def test_no_verb_prints_help(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    for verb in ("run", "providers", "explain", "profile", "bench", "compare", "optimize"):
        assert verb in out


def test_providers_verb(capsys):
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    assert "CPUExecutionProvider" in out and "onnxrt-cpu" in out and "yes" in out
