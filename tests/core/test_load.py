"""Loading models: typed errors for bad input, and safe external data."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort

from ..conftest import make_model


def _add_model(w=None):
    w = np.arange(4, dtype=np.float32) if w is None else w
    return make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(w, "w")],
    )


def test_random_bytes_empty_truncated_and_missing(tmp_path):
    with pytest.raises(ort.InvalidProtobuf):
        ort.InferenceSession(os.urandom(256) + b"\xff\xff")
    with pytest.raises(ort.InvalidProtobuf, match="empty"):
        ort.InferenceSession(b"")
    data = _add_model().SerializeToString()
    with pytest.raises((ort.InvalidProtobuf, ort.InvalidGraph)):
        ort.InferenceSession(data[: len(data) // 2])
    with pytest.raises(ort.NoSuchFile):
        ort.InferenceSession(str(tmp_path / "absent.onnx"))
    with pytest.raises(ort.InvalidArgument, match="must be a path, bytes or onnx.ModelProto"):
        ort.InferenceSession(42)


def _external_model(tmp_path, location, data=None):
    model = _add_model()
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    del t.float_data[:]
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": location, "offset": "0", "length": "16"}.items():
        t.external_data.add(key=k, value=v)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def test_external_data_loads(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    sess = ort.InferenceSession(str(_external_model(tmp_path, "w.bin")))
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones(4, np.float32)})[0], [1, 2, 3, 4])


@pytest.mark.parametrize("location", ["../w.bin", "/etc/passwd", "sub/../../w.bin"])
def test_external_data_must_stay_in_the_model_folder(tmp_path, location):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ort.InvalidGraph, match="absolute|leaves the model folder"):
        ort.InferenceSession(str(_external_model(model_dir, location)))


def test_external_data_symlinks_and_hard_links_are_refused(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 16)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "link.bin").symlink_to(outside)
    with pytest.raises(ort.InvalidGraph, match="symlink"):
        ort.InferenceSession(str(_external_model(model_dir, "link.bin")))
    os.link(outside, model_dir / "hard.bin")
    with pytest.raises(ort.InvalidGraph, match="hard links"):
        ort.InferenceSession(str(_external_model(model_dir, "hard.bin")))


def test_external_data_bounds_and_keys(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)  # shorter than the 16 bytes declared
    with pytest.raises(ort.InvalidGraph, match="runs past the end"):
        ort.InferenceSession(str(_external_model(tmp_path, "w.bin")))
    model = onnx.load(_external_model(tmp_path, "w.bin"), load_external_data=False)
    model.graph.initializer[0].external_data.add(key="evil", value="1")
    with pytest.raises(ort.InvalidGraph, match="unknown external_data key 'evil'"):
        ort.InferenceSession(_save(tmp_path, model))


def _save(tmp_path, model):
    p = tmp_path / "k.onnx"
    onnx.save(model, p)
    return str(p)


def test_raw_data_shorter_than_shape():
    model = _add_model()
    model.graph.initializer[0].raw_data = b"\0" * 8
    with pytest.raises(ort.InvalidGraph, match="raw_data holds 8 bytes"):
        ort.InferenceSession(model)


def test_malformed_graphs_are_invalid_graph():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    cycle = make_model([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("Add", ["x", "a"], ["y"])], [x], [y])
    with pytest.raises(ort.InvalidGraph, match="cycle"):
        ort.InferenceSession(cycle)
    undefined = make_model([helper.make_node("Relu", ["nowhere"], ["y"])], [x], [y])
    with pytest.raises(ort.InvalidGraph, match="'nowhere', which is not defined"):
        ort.InferenceSession(undefined)
    duplicate = make_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    with pytest.raises(ort.InvalidGraph, match="defined more than once"):
        ort.InferenceSession(duplicate)


def test_deeply_nested_subgraphs_are_refused_cleanly():
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    leaf = helper.make_graph([helper.make_node("Constant", [], ["y"], value_floats=[1.0])], "leaf", [], [out])
    body = leaf
    # protobuf itself stops at about 32 levels; onnxrt's own limit is lower, and clean
    for _ in range(30):
        node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=leaf)
        body = helper.make_graph([node], "level", [], [out])
    model = make_model(list(body.node), [cond], [out])
    with pytest.raises(ort.InvalidGraph, match="nested more than"):
        ort.InferenceSession(model)


def test_unsupported_versions_and_ops():
    model = _add_model()
    model.ir_version = 99
    with pytest.raises(ort.NotImplemented, match="IR version 99"):
        ort.InferenceSession(model)
    model = _add_model()
    model.opset_import[0].version = 99
    with pytest.raises(ort.NotImplemented, match="opset 99"):
        ort.InferenceSession(model)
