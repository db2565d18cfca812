"""Where the file system refuses a path, or memory runs short, the error is an
onnxrt error naming what was wrong, never a raw ``OSError``, ``ValueError`` or
``MemoryError`` from the layers below."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import onnxrt as ort

from .test_hostile_models import WEIGHTS, _run, _save_external


def test_external_data_location_with_a_nul_byte(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path, "w.bin\0.txt")
    with pytest.raises(ort.InvalidGraph, match="external data location .* contains a NUL byte"):
        _run(path)


def test_external_data_location_too_long_for_the_file_system(tmp_path):
    # a name over NAME_MAX: ENAMETOOLONG from the system
    path = _save_external(tmp_path, "x" * 300 + ".bin")
    with pytest.raises(ort.InvalidGraph, match="too long for the file system"):
        _run(path)


def test_external_data_location_of_missing_long_folders(tmp_path):
    # past PATH_MAX in all, but the first folder on the way is already missing
    path = _save_external(tmp_path, "/".join(["d" * 200] * 30) + "/w.bin")
    with pytest.raises(ort.NoSuchFile, match="does not exist"):
        _run(path)


def test_external_data_location_through_a_file(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path, "w.bin/x")
    with pytest.raises(ort.InvalidGraph, match="'w.bin/x' goes through something that is not a folder"):
        _run(path)


def test_external_data_that_loads_still_loads(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    np.testing.assert_array_equal(_run(_save_external(tmp_path, "w.bin")), WEIGHTS)


@pytest.mark.parametrize("name", ["m" * 300 + ".onnx", "/".join(["d" * 200] * 30) + "/m.onnx"])
def test_model_path_too_long(tmp_path, name):
    with pytest.raises(ort.InvalidArgument, match="model path .* is too long for the file system"):
        ort.InferenceSession(str(tmp_path / name))


def test_model_path_with_a_nul_byte(tmp_path):
    with pytest.raises(ort.InvalidArgument, match="contains a NUL byte"):
        ort.InferenceSession(str(tmp_path / "m\0.onnx"))


def test_model_path_through_a_file(tmp_path):
    (tmp_path / "f.onnx").write_bytes(b"x")
    with pytest.raises(ort.NoSuchFile, match="goes through something that is not a folder"):
        ort.InferenceSession(str(tmp_path / "f.onnx" / "m.onnx"))


def test_model_path_that_is_a_folder(tmp_path):
    with pytest.raises(ort.InvalidArgument, match="is not a file"):
        ort.InferenceSession(str(tmp_path))


def test_model_larger_than_the_memory_limit_is_refused_before_reading(monkeypatch, tmp_path):
    import onnxrt.load.model as loader

    path = tmp_path / "m.onnx"
    path.write_bytes(b"\x08\x07" * 600)
    monkeypatch.setattr(loader, "process_memory_limit", lambda: 1000)
    with pytest.raises(ort.InvalidArgument, match="1200 bytes, more than the 1000 bytes of memory"):
        ort.InferenceSession(str(path))


_UNDER_A_LIMIT = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    import onnxrt as ort
    try:
        ort.InferenceSession(sys.argv[1])
    except ort.OnnxRtError as e:
        print(type(e).__name__, e)
""")


@pytest.mark.parametrize("size,match", [
    (8 << 30, "InvalidArgument model file .* is 8589934592 bytes, more than the 3221225472 bytes"),
    # under the limit, but more than the process has left once Python and numpy are in
    (3050 << 20, "InvalidArgument model file .* does not fit in the memory this process may use"),
])
def test_model_file_over_the_address_space_limit(tmp_path, size, match):
    path = tmp_path / "big.onnx"
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: no disk space used
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _UNDER_A_LIMIT.format(limit=3 << 30), str(path)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    import re

    assert re.search(match, out.stdout), out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize("op,domain,attrs", [
    ("DictVectorizer", "ai.onnx.ml", {"string_vocabulary": ["a"]}),
    ("Relu", "", {}),
    ("Gather", "", {}),
])
def test_a_required_input_with_an_empty_name_is_invalid_graph(op, domain, attrs):
    # onnx's shape inference dereferenced the missing input's type: DictVectorizer with
    # an empty input crashed the interpreter (found by the fuzz test's feed-kinds seed)
    from onnx import TensorProto, helper

    n_in = 2 if op == "Gather" else 1
    node = helper.make_node(op, [""] * n_in, ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(ort.InvalidGraph, match=f"node '{op}' \\({op}\\): its input 0 is required"):
        ort.InferenceSession(model.SerializeToString())


def test_a_node_reading_a_name_defined_nowhere_is_invalid_graph_before_shape_inference():
    # the same crash of onnx's inference as an empty input: the name has no type at all
    from onnx import TensorProto, helper

    node = helper.make_node("DictVectorizer", ["nowhere"], ["y"], domain="ai.onnx.ml", string_vocabulary=["a"])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(ort.InvalidGraph, match="reads 'nowhere', which is not defined"):
        ort.InferenceSession(model.SerializeToString())


def test_a_node_reading_its_own_output_is_a_cycle_before_shape_inference():
    # onnx's inference walks nodes in the listed order and met an input with no type yet:
    # DictVectorizer reading its own output crashed it (found by the long fuzz run)
    from onnx import TensorProto, helper

    node = helper.make_node("DictVectorizer", ["dv"], ["dv"], domain="ai.onnx.ml", string_vocabulary=["a"])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("dv", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(ort.InvalidGraph, match=r"graph 'g' has a cycle through nodes \['DictVectorizer'\]"):
        ort.InferenceSession(model.SerializeToString())


def test_nodes_listed_out_of_order_are_sorted_before_shape_inference():
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Neg", ["b"], ["y"]), helper.make_node("Abs", ["a"], ["b"]),
             helper.make_node("Relu", ["x"], ["a"])]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [3])], [vi("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    sess = ort.InferenceSession(model.SerializeToString())
    (y,) = sess.run(None, {"x": np.array([-2.0, 0.0, 3.0], np.float32)})
    np.testing.assert_array_equal(y, [0.0, 0.0, -3.0])
    assert sess.get_outputs()[0].shape == [3]  # inference saw the nodes in order
