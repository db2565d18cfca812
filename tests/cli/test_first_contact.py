"""The ``onnxrt`` command as a new user first meets it: names with brackets print whole,
every unresolved dimension is named at once (unnamed ones fixed by ``--dim INPUT:AXIS``),
bad ``--dim`` and ``--input`` values are one-line errors, ``--debug`` goes anywhere,
``onnxrt providers`` fits 80 columns, and ``onnxrt run`` does not time its first run."""

from __future__ import annotations

import re
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxrt
from onnxrt import hookimpl
from onnxrt.cli import main
from onnxrt.cli.feeds import UnresolvedDimensions, random_feeds
from onnxrt.plugin.kernel import Kernel, KernelRegistry
from onnxrt.plugin.provider import ExecutionProvider

#: strings rich would read as markup or emoji codes if it were given them to parse
REASON = "install onnxrt-fake[cuda12] or onnxrt-fake[bold]x[/bold]"
DETAILS = "device [gpu0] :thumbs_up:"


def _relu_model(path, dims: list, name: str = "images", out: str = "out") -> str:
    """``name`` with the declared ``dims`` (ints as dim_value, strings as dim_param,
    ``None`` as neither) -> Relu -> ``out``."""
    x = onnx.ValueInfoProto()
    x.name = name
    x.type.tensor_type.elem_type = TensorProto.FLOAT
    for d in dims:
        dim = x.type.tensor_type.shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        elif d is not None:
            dim.dim_value = d
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", [name], [out], name=f"relu[{out}]")], "relu", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return str(path)


@pytest.fixture
def detector(tmp_path):
    """A detector's input: ``images [batch, 3, height, width]``."""
    return _relu_model(tmp_path / "detector.onnx", ["batch", 3, "height", "width"])


@pytest.fixture
def unnamed(tmp_path):
    """``images [?, 3, ?, ?]`` with no dim_param and no dim_value on the free axes."""
    return _relu_model(tmp_path / "unnamed.onnx", [None, 3, None, None])


@pytest.fixture
def paddle(tmp_path):
    """paddle2onnx's declaration: ``[-1, 3, '?', '?']``."""
    return _relu_model(tmp_path / "paddle.onnx", [-1, 3, "?", "?"])


class _Plugin:
    """A plugin that registers one provider class."""

    def __init__(self, provider: type[ExecutionProvider]):
        self.provider = provider

    @hookimpl
    def onnxrt_register_providers(self, registry):
        registry.add_provider(self.provider)


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


# -- brackets and colons print as they are --------------------------------------------------

class BracketsProvider(ExecutionProvider):
    """Unavailable, with a reason and details full of brackets."""

    name = "BracketsExecutionProvider"
    aliases = ("brackets",)
    priority = -50

    @classmethod
    def is_available(cls):
        return REASON

    @classmethod
    def details(cls):
        return DETAILS


@pytest.fixture
def brackets():
    plugin = _Plugin(BracketsProvider)
    onnxrt.plugin.discovery.register_plugin(plugin, name="brackets")
    try:
        yield BracketsProvider
    finally:
        onnxrt.plugin.discovery.unregister_plugin(plugin)


def test_providers_reason_and_details_keep_their_brackets(brackets, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that no cell wraps
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    assert REASON in out and DETAILS in out


def test_the_real_reasons_print_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    for p in onnxrt.get_provider_info():
        assert p["name"] in out and p["reason"] in out and p["details"] in out


def test_a_model_name_with_brackets_prints_whole(tmp_path, capsys):
    path = _relu_model(tmp_path / "o[b].onnx", [1, 2])
    assert main(["run", path, "--providers", "cpu"]) == 0
    assert "o[b].onnx: outputs" in capsys.readouterr().out
    assert main(["explain", path, "--providers", "cpu"]) == 0
    assert "o[b].onnx: 1 nodes in the model" in capsys.readouterr().out
    assert main(["compare", path, "--providers", "cpu", "--against", "cpu"]) == 0
    assert "o[b].onnx: " in capsys.readouterr().out


def test_the_writing_verbs_print_bracketed_names_whole(tmp_path, capsys):
    path = _relu_model(tmp_path / "o[b].onnx", [1, 2])
    out = tmp_path / "o[16].onnx"
    assert main(["float16", path, "-o", str(out)]) == 0
    assert f"o[b].onnx -> {out}: " in capsys.readouterr().out
    assert main(["optimize", path, "--providers", "cpu", "-o", str(tmp_path / "o[opt].onnx")]) == 0
    assert f"{tmp_path / 'o[opt].onnx'}: 1 nodes -> " in capsys.readouterr().out


def test_output_and_node_names_with_markup_print_whole(tmp_path, capsys):
    path = _relu_model(tmp_path / "m.onnx", [2], out="[red]y[/red]")
    assert main(["run", path, "--providers", "cpu"]) == 0
    assert "[red]y[/red]" in capsys.readouterr().out
    assert main(["explain", path, "--providers", "cpu", "--verbose"]) == 0
    assert "relu[[red]y[/red]]" in capsys.readouterr().out


# -- onnxrt providers at 80 columns ---------------------------------------------------------

def test_providers_at_80_columns_cut_nothing(brackets, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 80
    words = set(out.split())
    for p in onnxrt.get_provider_info():
        assert p["name"] in words  # a block per provider, its name on a line of its own
        for text in (p["reason"], p["details"], p["distribution"], p["version"]):
            assert all(w in words for w in text.split()), text


def test_providers_is_a_table_where_it_fits(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["providers"]) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if "provider" in line and "aliases" in line]
    assert len(header) == 1
    assert [c.strip() for c in header[0].strip("┃ ").split("┃")] == [
        "provider", "aliases", "priority", "available", "reason", "distribution", "version", "details"]


def test_opencl_row_names_its_device(capsys, monkeypatch):
    pytest.importorskip("onnxrt_opencl")
    from onnxrt_opencl import OpenCLExecutionProvider

    if OpenCLExecutionProvider.is_available() is not None:
        pytest.skip(f"OpenCL unavailable: {OpenCLExecutionProvider.is_available()}")
    from onnxrt_opencl.runtime import select_device

    monkeypatch.setenv("COLUMNS", "400")
    assert main(["providers"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "OpenCLExecutionProvider" in line)
    assert f"device {select_device().name.strip()} (" in row


# -- every unresolved dimension at once ---------------------------------------------------------

def test_a_detector_names_its_three_dims_at_once(detector, capsys):
    assert main(["run", detector, "--providers", "cpu"]) == 2
    assert _err(capsys) == ("onnxrt: error: input 'images' has unresolved dimensions 'batch', 'height' and "
                            "'width'; fix them with --dim batch=VALUE --dim height=VALUE --dim width=VALUE")


def test_the_dims_given_are_not_asked_again(detector, capsys):
    assert main(["run", detector, "--providers", "cpu", "--dim", "height=8"]) == 2
    assert _err(capsys) == ("onnxrt: error: input 'images' has unresolved dimensions 'batch' and 'width'; "
                            "fix them with --dim batch=VALUE --dim width=VALUE")


def test_unnamed_dims_name_both_fixes(unnamed, capsys):
    assert main(["run", unnamed, "--providers", "cpu"]) == 2
    assert _err(capsys) == (
        "onnxrt: error: input 'images' has unnamed free dimensions 0, 2 and 3 (shape [None, 3, None, None]); "
        "fix them with --dim images:0=VALUE --dim images:2=VALUE --dim images:3=VALUE "
        "or give the input as a file: --input images=FILE.npy")


def test_every_input_at_once_and_a_shared_name_once(tmp_path):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", None])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Sum", ["a", "b", "c"], ["y"])], "three", [a, b, c], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    sess = onnxrt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(UnresolvedDimensions) as e:
        random_feeds(sess.get_inputs(), {})
    assert e.value.problems == [("a", 0, "batch"), ("b", 0, "batch"), ("b", 1, None)]
    assert str(e.value) == (
        "input 'a' has an unresolved dimension 'batch'; input 'b' has an unresolved dimension 'batch' and an "
        "unnamed free dimension 1 (shape ['batch', None]); fix them with --dim batch=VALUE --dim b:1=VALUE "
        "or give the input as a file: --input b=FILE.npy")
    assert isinstance(e.value, onnxrt.InvalidArgument)
    feeds = random_feeds(sess.get_inputs(), {"batch": 2, "b:1": 4})
    assert {k: v.shape for k, v in feeds.items()} == {"a": (2, 4), "b": (2, 4), "c": (2, 4)}


def test_an_input_with_no_shape_is_named_with_the_file_option(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "noshape", [x, b], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(tmp_path / "noshape.onnx"))
    assert main(["run", str(tmp_path / "noshape.onnx"), "--providers", "cpu"]) == 2
    assert _err(capsys) == ("onnxrt: error: input 'x' has no declared shape; input 'b' has an unresolved "
                            "dimension 'n'; fix it with --dim n=VALUE or give the input as a file: --input x=FILE.npy")
    np.save(tmp_path / "x.npy", np.arange(3, dtype=np.float32))
    assert main(["run", str(tmp_path / "noshape.onnx"), "--providers", "cpu", "--dim", "n=3",
                 "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o")]) == 0
    assert np.load(tmp_path / "o" / "y.npy").shape == (3,)


def test_unnamed_dims_are_set_separately(unnamed, tmp_path, capsys):
    dims = ["--dim", "images:0=1", "--dim", "images:2=5", "--dim", "images:3=7"]
    assert main(["run", unnamed, "--providers", "cpu", "--seed", "4", "--output", str(tmp_path / "o"), *dims]) == 0
    sess = onnxrt.InferenceSession(unnamed, providers=["CPUExecutionProvider"])
    x = random_feeds(sess.get_inputs(), {"images:0": 1, "images:2": 5, "images:3": 7}, seed=4)["images"]
    assert x.shape == (1, 3, 5, 7)
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "out.npy"), np.maximum(x, 0))
    assert "[1, 3, 5, 7]" in capsys.readouterr().out


def test_question_mark_dims_by_axis_or_all_by_name(paddle, tmp_path, capsys):
    assert main(["run", paddle, "--providers", "cpu", "--output", str(tmp_path / "a"),
                 "--dim", "images:0=2", "--dim", "images:2=4", "--dim", "images:3=8"]) == 0
    assert np.load(tmp_path / "a" / "out.npy").shape == (2, 3, 4, 8)
    # as onnxruntime's add_free_dimension_override_by_name reads it, '?' names every such axis
    assert main(["run", paddle, "--providers", "cpu", "--output", str(tmp_path / "b"),
                 "--dim", "?=48", "--dim", "images:0=1"]) == 0
    assert np.load(tmp_path / "b" / "out.npy").shape == (1, 3, 48, 48)


@pytest.mark.parametrize("dim,message", [
    ("?=48", "--dim ?=48: no input of the model has a dimension named '?' (named dimensions: 'batch', 'height', "
             "'width'; an unnamed one is fixed with --dim INPUT:AXIS=VALUE)"),
    ("=48", "bad --dim '=48': no dimension name before '=' (NAME=VALUE, or INPUT:AXIS=VALUE)"),
    ("Batch=1", "--dim Batch=1: no input of the model has a dimension named 'Batch'"),
    ("images:0=1", "--dim images:0=1: dimension 0 of input 'images' is named 'batch'; fix it by name: "
                   "--dim batch=1"),
    ("images:1=3", "--dim images:1=3: dimension 1 of input 'images' is fixed at 3 "
                   "(shape ['batch', 3, 'height', 'width'])"),
    ("images:4=1", "--dim images:4=1: input 'images' has rank 4 (shape ['batch', 3, 'height', 'width']), no axis 4"),
    ("images:-1=1", "--dim images:-1=1: the axis '-1' is not a non-negative integer"),
    ("pixels:0=1", "--dim pixels:0=1: the model has no input 'pixels' (inputs: images)"),
    ("batch=-1", "--dim batch=-1: must not be negative"),
])
def test_bad_dims_are_one_line_errors(detector, capsys, dim, message):
    assert main(["run", detector, "--providers", "cpu", "--dim", dim]) == 2
    assert message in _err(capsys)


def test_a_question_mark_axis_cannot_be_fixed_twice(paddle, capsys):
    assert main(["run", paddle, "--providers", "cpu", "--dim", "?=48", "--dim", "images:2=4"]) == 2
    assert _err(capsys) == ("onnxrt: error: --dim images:2=4: dimension 2 of input 'images' is declared '?', "
                            "which --dim ?=48 already fixes; give one of the two")


@pytest.mark.parametrize("verb", [["explain"], ["bench", "-n", "1"], ["profile", "-n", "1"], ["compare"]],
                         ids=lambda v: v[0])
def test_every_model_verb_checks_its_dims(detector, capsys, verb, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # profile writes its trace here
    assert main([verb[0], detector, "--providers", "cpu", "--dim", "nosuch=1", *verb[1:]]) == 2
    assert "--dim nosuch=1: no input of the model has a dimension named 'nosuch'" in _err(capsys)


# -- --debug before or after the verb -------------------------------------------------------------

def test_debug_after_the_verb_shows_the_traceback(detector, capsys):
    assert main(["run", detector]) == 2
    capsys.readouterr()
    with pytest.raises(UnresolvedDimensions, match="'batch', 'height' and 'width'"):
        main(["run", detector, "--debug"])
    with pytest.raises(UnresolvedDimensions):
        main(["run", "--debug", detector])
    with pytest.raises(UnresolvedDimensions):
        main(["--debug", "run", detector])  # a verb without --debug keeps the one before it


def test_every_verb_takes_debug(capsys):
    from onnxrt.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    for verb in sub.choices:
        args = parser.parse_args([verb, "--debug"] + (["m.onnx"] if verb not in ("providers", "run") else [])
                                 + (["-o", "x.onnx"] if verb in ("optimize", "quantize", "float16") else [])
                                 + (["--dynamic"] if verb == "quantize" else []))
        assert args.debug is True, verb
    assert main(["providers", "--debug"]) == 0


# -- --input that is not a .npy file ----------------------------------------------------------------

@pytest.mark.parametrize("kind,message", [
    ("text", "cannot read a .npy array (not a .npy file: it does not start with numpy's header; "
             "save arrays with numpy.save)"),
    ("empty", "cannot read a .npy array (not a .npy file"),
    ("objects", "cannot read a .npy array (it holds Python objects, which are not loaded"),
    ("npz", "cannot read a .npy array (it is an .npz archive; save the one array with numpy.save)"),
    ("missing", "cannot read a .npy array (No such file or directory"),
])
def test_input_that_is_not_a_npy_file(detector, tmp_path, capsys, kind, message):
    path = tmp_path / f"{kind}.npy"
    if kind == "text":
        path.write_text("1 2 3\n4 5 6\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "objects":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "npz":
        with open(path, "wb") as f:
            np.savez(f, images=np.ones((1, 3, 2, 2), np.float32))
    assert main(["run", detector, "--providers", "cpu", "--input", f"images={path}"]) == 2
    err = _err(capsys)
    assert err.startswith(f"onnxrt: error: --input images={path}: ") and message in err
    assert "pickle" not in err


def test_a_npy_input_still_runs(detector, tmp_path, capsys):
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(1, 3, 2, 4)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", detector, "--providers", "cpu", "--input", f"images={tmp_path / 'x.npy'}",
                 "--output", str(tmp_path / "o")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "out.npy"), np.maximum(x, 0))


# -- the first run is a warm-up, not the latency -------------------------------------------------

FIRST_RUN_S = 0.4


class SlowStartProvider(ExecutionProvider):
    """Runs Relu; its kernel's first run sleeps, as an OpenCL kernel compiles on first use."""

    name = "SlowStartExecutionProvider"
    aliases = ("slowstart",)
    priority = -60
    runs = 0

    @classmethod
    def build_registry(cls):
        reg = KernelRegistry()

        @reg.op("Relu", since=1)
        class Relu(Kernel):
            def run(self, x):
                SlowStartProvider.runs += 1
                if SlowStartProvider.runs == 1:
                    time.sleep(FIRST_RUN_S)
                return (np.maximum(x, 0),)

        return reg


@pytest.fixture
def slow_start():
    plugin = _Plugin(SlowStartProvider)
    onnxrt.plugin.discovery.register_plugin(plugin, name="slow_start")
    SlowStartProvider.runs = 0
    try:
        yield SlowStartProvider
    finally:
        onnxrt.plugin.discovery.unregister_plugin(plugin)


def test_run_times_after_an_untimed_warm_up(slow_start, tmp_path, capsys):
    path = _relu_model(tmp_path / "m.onnx", [2, 3])
    assert main(["run", path, "--providers", "slowstart,cpu"]) == 0
    out = capsys.readouterr().out
    assert slow_start.runs == 2 and "SlowStartExecutionProvider 1" in out
    m = re.search(r"latency ([\d.]+) ms, timed after one untimed warm-up run \(which took ([\d.]+) ms", out)
    assert m, out
    latency, first = float(m.group(1)), float(m.group(2))
    assert first >= FIRST_RUN_S * 1000 > latency


def test_opencl_first_run_is_a_warm_up(tmp_path, capsys):
    pytest.importorskip("onnxrt_opencl")
    from onnxrt_opencl import OpenCLExecutionProvider

    if OpenCLExecutionProvider.is_available() is not None:
        pytest.skip(f"OpenCL unavailable: {OpenCLExecutionProvider.is_available()}")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                           np.random.default_rng(0).standard_normal(108).astype(np.float32))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(tmp_path / "conv.onnx"))
    assert main(["run", str(tmp_path / "conv.onnx"), "--providers", "opencl,cpu"]) == 0
    out = capsys.readouterr().out
    assert "OpenCLExecutionProvider 1" in out and "timed after one untimed warm-up run" in out
