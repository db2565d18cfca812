"""Large weights read straight from the model file (onnxrt.load.large_weights): the same model as the
ordinary parse, every fallback taken where it should be, and half the peak memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt
from onnxrt.load import large_weights as wire
from onnxrt.errors import InvalidArgument, InvalidGraph, InvalidProtobuf


@pytest.fixture
def small_files(monkeypatch):
    """Let the direct reader take files of any size."""
    monkeypatch.setattr(wire, "MIN_FILE_BYTES", 0)


def _mixed_model(tmp_path):
    """Every kind of initializer the reader must take or leave, and an If whose branch
    holds a large constant of its own."""
    rng = np.random.default_rng(0)
    big32 = rng.standard_normal((40, 64)).astype(np.float32)
    big16 = rng.standard_normal((40, 64)).astype(np.float16)
    big8 = rng.integers(-100, 100, (40, 64)).astype(np.int8)
    big64 = rng.integers(0, 5, (2000,)).astype(np.int64)  # integers stay in the model
    small = rng.standard_normal((64,)).astype(np.float32)
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [40, 64], (big32 * 2).ravel().tolist())  # float_data
    external = numpy_helper.from_array((big32 * 3).astype(np.float32), "external")
    branch_w = numpy_helper.from_array((big32 * 5).astype(np.float32), "branch_w")
    then_g = helper.make_graph([helper.make_node("Add", ["x", "branch_w"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [40, 64])], [branch_w])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "branch_w2"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [40, 64])],
                               [numpy_helper.from_array((big32 * 7).astype(np.float32), "branch_w2")])
    nodes = [
        helper.make_node("Add", ["x", "big32"], ["a"]),
        helper.make_node("Cast", ["big16"], ["h"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["big8"], ["i"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["a", "h"], ["b"]),
        helper.make_node("Add", ["b", "i"], ["c"]),
        helper.make_node("Add", ["c", "small"], ["d"]),
        helper.make_node("Add", ["d", "typed"], ["e1"]),
        helper.make_node("Add", ["e1", "external"], ["f"]),
        helper.make_node("ReduceSum", ["big64"], ["s"], keepdims=0),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["f", "sf"], ["g"]),
        helper.make_node("If", ["flag"], ["k"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Add", ["g", "k"], ["y"]),
    ]
    inits = [numpy_helper.from_array(big32, "big32"), numpy_helper.from_array(big16, "big16"),
             numpy_helper.from_array(big8, "big8"), numpy_helper.from_array(big64, "big64"),
             numpy_helper.from_array(small, "small"), typed, external]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 64]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "mixed.onnx"
    # "external" goes to its own file; the rest stays inline
    onnx.save_model(model, str(path))
    m = onnx.load(str(path))
    for t in m.graph.initializer:
        if t.name == "external":
            onnx.external_data_helper.set_external_data(t, "external.bin")
            (tmp_path / "external.bin").write_bytes(t.raw_data)
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
    onnx.save_model(m, str(path))
    return path


def test_direct_reader_takes_exactly_the_plain_large_main_graph_weights(tmp_path, small_files):
    path = _mixed_model(tmp_path)
    split = wire.split_large_weights(path, 1024)
    assert split is not None
    data, weights = split
    assert sorted(weights) == ["big16", "big32", "big8"]
    rest = onnx.ModelProto.FromString(data)
    assert sorted(t.name for t in rest.graph.initializer) == ["big64", "external", "small", "typed"]
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path), load_external_data=False).graph.initializer
            if t.name in weights}
    for name, arr in weights.items():
        assert arr.dtype == want[name].dtype and arr.shape == want[name].shape
        np.testing.assert_array_equal(arr, want[name])
        assert arr.flags.writeable and arr.flags.c_contiguous


@pytest.mark.parametrize("flag", [True, False])
def test_a_session_from_the_file_equals_one_from_its_bytes(tmp_path, small_files, flag):
    path = _mixed_model(tmp_path)
    from_file = onnxrt.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert set(from_file._weights) >= {"big16", "big32", "big8"}
    # the same model as bytes (external data inlined) goes the ordinary way
    full = onnx.load(str(path))
    from_bytes = onnxrt.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32),
             "flag": np.array(flag)}
    np.testing.assert_array_equal(from_file.run(None, feeds)[0], from_bytes.run(None, feeds)[0])


def test_small_files_and_models_without_large_weights_take_the_ordinary_path(tmp_path):
    path = _mixed_model(tmp_path)
    assert wire.split_large_weights(path, 1024) is None  # under MIN_FILE_BYTES
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    p = tmp_path / "tiny.onnx"
    onnx.save_model(helper.make_model(g), str(p))
    wire.MIN_FILE_BYTES, saved = 0, wire.MIN_FILE_BYTES
    try:
        assert wire.split_large_weights(p, 1024) is None  # nothing to take
    finally:
        wire.MIN_FILE_BYTES = saved


def test_truncated_and_garbage_files_fail_as_the_ordinary_path_says(tmp_path, small_files):
    path = _mixed_model(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) * 2 // 3])
    assert wire.split_large_weights(cut, 1024) is None
    with pytest.raises(InvalidProtobuf):
        onnxrt.InferenceSession(str(cut), providers=["CPUExecutionProvider"])
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)))
    with pytest.raises(InvalidProtobuf):
        onnxrt.InferenceSession(str(junk), providers=["CPUExecutionProvider"])


def test_a_large_weight_defined_twice_is_an_error(tmp_path, small_files):
    w = numpy_helper.from_array(np.ones((40, 64), np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, w])
    p = tmp_path / "twice.onnx"
    onnx.save_model(helper.make_model(g, ir_version=9, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(InvalidGraph, match="defined twice"):
        onnxrt.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    # a large one and a small one of the same name
    small = numpy_helper.from_array(np.ones((3,), np.float32), "w")
    g2 = helper.make_graph(g.node, "g", g.input, g.output, [w, small])
    onnx.save_model(helper.make_model(g2, ir_version=9, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(InvalidGraph, match="defined twice"):
        onnxrt.InferenceSession(str(p), providers=["CPUExecutionProvider"])


def test_the_allocation_cap_is_checked_before_a_weight_is_read(tmp_path, small_files):
    path = _mixed_model(tmp_path)
    so = onnxrt.SessionOptions()
    so.max_allocation_bytes = 4096  # each large weight is 2560 elements
    with pytest.raises(InvalidArgument, match="initializer"):
        onnxrt.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


_PEAK = textwrap.dedent(
    """
    import json, sys
    import numpy as np, onnxrt
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    src = sys.argv[1]
    if sys.argv[2] == "bytes":
        src = open(src, "rb").read()
        base = hwm()  # the bytes are the caller's
    else:
        base = hwm()
    s = onnxrt.InferenceSession(src, providers=["CPUExecutionProvider"])
    print(json.dumps({"grew": hwm() - base}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM")
def test_peak_memory_is_about_the_weights_once(tmp_path):
    """A 64 MiB model: loading from its path grows the peak by about the weights once;
    the ordinary parse of the same bytes holds them at least twice."""
    rng = np.random.default_rng(0)
    ws = [numpy_helper.from_array(rng.standard_normal((2048, 2048)).astype(np.float32), f"w{i}") for i in range(4)]
    nodes, prev = [], "x"
    for i in range(4):
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], ws)
    p = tmp_path / "big.onnx"
    onnx.save_model(helper.make_model(g, ir_version=9, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    weights = 4 * 2048 * 2048 * 4
    grew = {}
    for how in ("path", "bytes"):
        out = subprocess.run([sys.executable, "-c", _PEAK, str(p), how], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        grew[how] = json.loads(out.stdout.strip().splitlines()[-1])["grew"]
    assert grew["path"] < 1.4 * weights, grew
    assert grew["bytes"] > 1.8 * weights, grew
