"""Declared input shapes as onnxruntime reads them: a negative ``dim_value`` is a free
dimension, a zero one is fixed at zero, and ``'?'`` is no name shared between axes.

Exporters write these: paddle2onnx declares PaddleOCR's inputs as ``[-1, 3, '?', '?']``.
Each case is checked against onnxruntime itself, not only against expected strings.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxrt
from onnxrt.cli import main


def _model(dims: list, out_dims: list | None = None, matmul: bool = False) -> bytes:
    """``x`` with the declared ``dims`` (ints as dim_value, strings as dim_param) ->
    Relu (and a MatMul by a 3x2 weight when ``matmul``) -> ``y``."""
    x = onnx.ValueInfoProto()
    x.name = "x"
    x.type.tensor_type.elem_type = TensorProto.FLOAT
    for d in dims:
        dim = x.type.tensor_type.shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d
    nodes = [helper.make_node("Relu", ["x"], ["r" if matmul else "y"])]
    inits = []
    if matmul:
        inits.append(helper.make_tensor("w", TensorProto.FLOAT, [3, 2], [1, 2, 3, 4, 5, 6]))
        nodes.append(helper.make_node("MatMul", ["r", "w"], ["y"]))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)
    g = helper.make_graph(nodes, "declared", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def _both(model: bytes):
    ours = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    theirs = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return ours, theirs


@pytest.mark.parametrize("declared", [-1, -5])
@pytest.mark.parametrize("batch", [1, 4, 0])
def test_negative_dim_value_is_free_as_in_onnxruntime(declared, batch):
    ours, theirs = _both(_model([declared, 3], [declared, 2], matmul=True))
    x = np.linspace(-1, 1, batch * 3, dtype=np.float32).reshape(batch, 3)
    (got,), (want,) = ours.run(None, {"x": x}), theirs.run(None, {"x": x})
    assert got.shape == want.shape == (batch, 2)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, np.maximum(x, 0) @ np.arange(1, 7, dtype=np.float32).reshape(3, 2),
                               rtol=1e-6)


def test_negative_dim_value_reads_as_unknown_in_node_args():
    ours, theirs = _both(_model([-1, 3], [-1, 2], matmul=True))
    assert ours.get_inputs()[0].shape == theirs.get_inputs()[0].shape == [None, 3]
    assert ours.get_outputs()[0].shape == theirs.get_outputs()[0].shape == [None, 2]


def test_negative_dim_leaves_the_fixed_ones_checked():
    ours, theirs = _both(_model([-1, 3]))
    x = np.ones((2, 4), np.float32)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
        theirs.run(None, {"x": x})
    with pytest.raises(onnxrt.InvalidArgument, match=r"input 'x' has size 4 in dimension 1; the model expects 3"):
        ours.run(None, {"x": x})


def test_zero_dim_value_takes_an_empty_dimension_only():
    ours, theirs = _both(_model([0, 3]))
    empty = np.zeros((0, 3), np.float32)
    assert ours.run(None, {"x": empty})[0].shape == theirs.run(None, {"x": empty})[0].shape == (0, 3)
    assert ours.get_inputs()[0].shape == theirs.get_inputs()[0].shape == [0, 3]
    one = np.ones((1, 3), np.float32)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
        theirs.run(None, {"x": one})
    with pytest.raises(onnxrt.InvalidArgument, match=r"size 1 in dimension 0; the model expects 0"):
        ours.run(None, {"x": one})


def test_question_mark_is_no_shared_name():
    # paddle2onnx's [-1, 3, '?', '?']: height and width differ in every real image
    ours, theirs = _both(_model([-1, 3, "?", "?"]))
    x = np.random.default_rng(0).standard_normal((2, 3, 48, 192)).astype(np.float32)
    np.testing.assert_array_equal(ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])


def test_a_real_name_is_still_shared_between_axes():
    ours = onnxrt.InferenceSession(_model(["n", "n"]), providers=["CPUExecutionProvider"])
    with pytest.raises(onnxrt.InvalidArgument, match=r"symbolic dimension 'n' is 2 in input 'x' but 3"):
        ours.run(None, {"x": np.ones((2, 3), np.float32)})


@pytest.fixture
def free_batch(tmp_path):
    path = tmp_path / "free_batch.onnx"
    path.write_bytes(_model([-1, 3], [-1, 2], matmul=True))
    return str(path)


def test_cli_fixes_a_negative_dim_by_input_and_axis(free_batch, tmp_path, capsys):
    assert main(["run", free_batch, "--providers", "cpu", "--dim", "x:0=5", "--output", str(tmp_path / "o")]) == 0
    assert np.load(tmp_path / "o" / "y.npy").shape == (5, 2)
    assert "[5, 2]" in capsys.readouterr().out


def test_cli_names_the_option_for_a_negative_dim(free_batch, capsys):
    assert main(["run", free_batch, "--providers", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("onnxrt: error: input 'x' has an unnamed free dimension 0 (shape [None, 3]); "
                   "fix it with --dim x:0=VALUE or give the input as a file: --input x=FILE.npy")


def test_cli_zero_dim_runs_empty(tmp_path, capsys):
    path = tmp_path / "zero.onnx"
    path.write_bytes(_model([0, 3], [0, 2], matmul=True))
    assert main(["run", str(path), "--providers", "cpu", "--output", str(tmp_path / "o")]) == 0
    assert np.load(tmp_path / "o" / "y.npy").shape == (0, 2)
