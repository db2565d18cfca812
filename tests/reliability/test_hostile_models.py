"""Model files from strangers: every malformed or hostile model is a typed error.

Each case here is something onnx or onnxruntime has been bitten by (path traversal
through external data, out-of-bounds reads from short tensors, blow-ups from tiny
models) or a malformation that must not surface as a raw Python exception.
"""

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt.load.large_weights import encode_varint
from onnxrt.ir import MAX_NESTING

from ..conftest import make_model

F = TensorProto.FLOAT


def _add_model(w=None):
    w = np.arange(4, dtype=np.float32) if w is None else w
    return make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("y", F, [4])],
        [numpy_helper.from_array(w, "w")],
    )


def _identity_of(tensor, out_type=F):
    return make_model(
        [helper.make_node("Identity", [tensor.name], ["y"])], [],
        [helper.make_tensor_value_info("y", out_type, None)], [tensor],
    )


# -- bytes that are not a model ------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_are_invalid_protobuf(seed):
    data = np.random.default_rng(seed).integers(0, 256, 512, dtype=np.uint8).tobytes()
    with pytest.raises((ort.InvalidProtobuf, ort.InvalidGraph)):
        ort.InferenceSession(data)


def test_empty_input_is_invalid_protobuf(tmp_path):
    with pytest.raises(ort.InvalidProtobuf, match="empty"):
        ort.InferenceSession(b"")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(ort.InvalidProtobuf, match="empty"):
        ort.InferenceSession(str(tmp_path / "empty.onnx"))


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_truncated_model_is_a_typed_error(fraction):
    data = _add_model().SerializeToString()
    with pytest.raises((ort.InvalidProtobuf, ort.InvalidGraph)):
        ort.InferenceSession(data[: int(len(data) * fraction)])


def test_missing_file_and_folder_are_typed(tmp_path):
    with pytest.raises(ort.NoSuchFile, match="absent.onnx"):
        ort.InferenceSession(str(tmp_path / "absent.onnx"))
    with pytest.raises(ort.InvalidArgument, match="not a file"):
        ort.InferenceSession(str(tmp_path))


# -- external data ---------------------------------------------------------------------


def _save_external(model_dir, location, *, offset="0", length="16", extra=()):
    model = _add_model()
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entries = [("location", location)]
    if offset is not None:
        entries.append(("offset", offset))
    if length is not None:
        entries.append(("length", length))
    for k, v in [*entries, *extra]:
        t.external_data.add(key=k, value=v)
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "m.onnx"
    onnx.save(model, path)
    return str(path)


WEIGHTS = np.array([10, 20, 30, 40], np.float32)


def _run(path):
    return ort.InferenceSession(path).run(None, {"x": np.zeros(4, np.float32)})[0]


def test_external_data_inside_the_folder_loads(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(b"pad!" + WEIGHTS.tobytes())
    path = _save_external(tmp_path, "sub/w.bin", offset="4")
    np.testing.assert_array_equal(_run(path), WEIGHTS)


@pytest.mark.parametrize("location", ["../w.bin", "sub/../../w.bin", "..\\w.bin", "sub/..", "./../w.bin"])
def test_external_data_cannot_leave_the_folder(tmp_path, location):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path / "model", location)
    (tmp_path / "model" / "sub").mkdir()
    with pytest.raises(ort.InvalidGraph, match="leaves the model folder"):
        _run(path)


def test_external_data_cannot_be_an_absolute_path(tmp_path):
    target = tmp_path / "w.bin"
    target.write_bytes(WEIGHTS.tobytes())
    for location in [str(target), "/etc/passwd", "C:\\secrets\\w.bin", "\\\\server\\share\\w.bin"]:
        path = _save_external(tmp_path / "model", location)
        with pytest.raises(ort.InvalidGraph, match="absolute"):
            _run(path)


def test_external_data_symlinked_file_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path / "model", "w.bin")
    os.symlink(tmp_path / "secret.bin", tmp_path / "model" / "w.bin")
    with pytest.raises(ort.InvalidGraph, match="symlink"):
        _run(path)


def test_external_data_symlinked_parent_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path / "model", "data/w.bin")
    os.symlink(tmp_path / "elsewhere", tmp_path / "model" / "data")
    with pytest.raises(ort.InvalidGraph, match="symlink"):
        _run(path)


def test_external_data_with_several_hard_links_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path / "model", "w.bin")
    os.link(tmp_path / "secret.bin", tmp_path / "model" / "w.bin")
    with pytest.raises(ort.InvalidGraph, match="hard links"):
        _run(path)


def test_external_data_must_be_a_regular_file(tmp_path):
    path = _save_external(tmp_path, "dir.bin")
    (tmp_path / "dir.bin").mkdir()
    with pytest.raises(ort.InvalidGraph, match="not a regular file"):
        _run(path)


def test_external_data_missing_file_is_no_such_file(tmp_path):
    path = _save_external(tmp_path, "absent.bin")
    with pytest.raises(ort.NoSuchFile, match="absent.bin"):
        _run(path)


@pytest.mark.parametrize(
    "offset, length, match",
    [
        ("20", "16", "outside"),       # offset past the end of a 16-byte file
        ("-1", "16", "outside"),       # negative offset
        ("8", "16", "runs past the end"),
        ("0", "-4", "runs past the end"),
        ("0", "1000000000000", "runs past the end"),
        ("zero", "16", "not an integer"),
        ("0", "12", "raw_data holds 12 bytes"),  # shorter than the shape needs
    ],
)
def test_external_data_offset_and_length_are_checked(tmp_path, offset, length, match):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path, "w.bin", offset=offset, length=length)
    with pytest.raises(ort.InvalidGraph, match=match):
        _run(path)


def test_external_data_longer_than_the_shape_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes() * 2)
    path = _save_external(tmp_path, "w.bin", length=None)
    with pytest.raises(ort.InvalidGraph, match="raw_data holds 32 bytes, but its shape"):
        _run(path)


def test_external_data_keys_are_onnx_known_set(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    # checksum and basepath are known keys; basepath never redirects the lookup
    ok = _save_external(tmp_path, "w.bin", extra=[("checksum", "0" * 40), ("basepath", "/etc")])
    np.testing.assert_array_equal(_run(ok), WEIGHTS)
    bad = _save_external(tmp_path / "b", "w.bin", extra=[("location2", "../w.bin")])
    with pytest.raises(ort.InvalidGraph, match="unknown external_data key 'location2'"):
        _run(bad)
    no_location = _save_external(tmp_path / "c", "")
    with pytest.raises(ort.InvalidGraph, match="no location"):
        _run(no_location)


def test_external_data_needs_a_folder(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path, "w.bin")
    with pytest.raises(ort.InvalidArgument, match="external data"):
        ort.InferenceSession(Path(path).read_bytes())


def test_external_data_over_the_allocation_cap_is_not_read(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHTS.tobytes())
    path = _save_external(tmp_path, "w.bin")
    so = ort.SessionOptions()
    so.max_allocation_bytes = 8
    with pytest.raises(ort.InvalidGraph, match="max_allocation_bytes"):
        ort.InferenceSession(path, so)


# -- tensors whose data does not match their shape -------------------------------------------


def test_raw_data_shorter_or_longer_than_the_shape():
    for nbytes in (0, 8, 15, 17, 64):
        model = _add_model()
        model.graph.initializer[0].raw_data = b"\0" * nbytes
        with pytest.raises(ort.InvalidGraph, match=f"raw_data holds {nbytes} bytes, but its shape \\[4\\] needs 16"):
            ort.InferenceSession(model)


@pytest.mark.parametrize(
    "dtype, field, count, need",
    [
        (TensorProto.FLOAT, "float_data", 3, 4),
        (TensorProto.FLOAT, "float_data", 5, 4),
        (TensorProto.INT64, "int64_data", 0, 4),
        (TensorProto.INT32, "int32_data", 7, 4),
        (TensorProto.DOUBLE, "double_data", 1, 4),
        (TensorProto.COMPLEX64, "float_data", 4, 8),   # two floats per element
        (TensorProto.UINT64, "uint64_data", 9, 4),
        (TensorProto.FLOAT16, "int32_data", 2, 4),
        (TensorProto.INT4, "int32_data", 4, 2),        # two 4-bit values per entry
    ],
)
def test_typed_data_with_the_wrong_count(dtype, field, count, need):
    t = TensorProto(name="w", data_type=dtype, dims=[4])
    getattr(t, field).extend([1] * count)
    with pytest.raises(ort.InvalidGraph, match=f"{field} holds {count} values, but its shape \\[4\\] needs {need}"):
        ort.InferenceSession(_identity_of(t, dtype))


def test_string_tensor_with_the_wrong_count():
    t = TensorProto(name="w", data_type=TensorProto.STRING, dims=[3])
    t.string_data.extend([b"a", b"b"])
    with pytest.raises(ort.InvalidGraph, match="string_data holds 2 strings"):
        ort.InferenceSession(_identity_of(t, TensorProto.STRING))


def test_tensor_with_negative_or_unknown_type_or_dims():
    t = TensorProto(name="w", data_type=F, dims=[-1])
    with pytest.raises(ort.InvalidGraph, match="negative dimension"):
        ort.InferenceSession(_identity_of(t))
    t = TensorProto(name="w", data_type=77, dims=[1])
    with pytest.raises(ort.InvalidGraph, match="unknown data type 77"):
        ort.InferenceSession(_identity_of(t))
    t = TensorProto(name="w", data_type=TensorProto.UNDEFINED, dims=[1])
    with pytest.raises(ort.InvalidGraph, match="no data type"):
        ort.InferenceSession(_identity_of(t))


def test_constant_attribute_tensor_is_checked_like_an_initializer():
    t = TensorProto(name="v", data_type=F, dims=[2, 2])
    t.float_data.extend([1, 2, 3])
    model = make_model([helper.make_node("Constant", [], ["y"], value=t)], [],
                       [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ort.InvalidGraph, match="float_data holds 3 values"):
        ort.InferenceSession(model)


def test_sparse_initializer_with_out_of_range_indices():
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "s")
    for idx, match in [([0, 9], "outside its shape"), ([0, -1], "outside its shape"),
                       ([0, 1, 2], "do not fit")]:
        indices = numpy_helper.from_array(np.array(idx, np.int64), "s_idx")
        sp = helper.make_sparse_tensor(values, indices, [4])
        graph = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "g", [],
                                  [helper.make_tensor_value_info("y", F, None)], sparse_initializer=[sp])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
        with pytest.raises(ort.InvalidGraph, match=match):
            ort.InferenceSession(model)


# -- graphs that are not DAGs of defined values ----------------------------------------------


def _relu_chain(nodes, inputs=("x",), outputs=("y",)):
    return make_model(nodes, [helper.make_tensor_value_info(i, F, [2]) for i in inputs],
                      [helper.make_tensor_value_info(o, F, [2]) for o in outputs])


def test_node_cycle_is_invalid_graph():
    model = _relu_chain([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                         helper.make_node("Add", ["x", "b"], ["y"])])
    with pytest.raises(ort.InvalidGraph, match="cycle"):
        ort.InferenceSession(model)


def test_self_loop_is_invalid_graph():
    model = _relu_chain([helper.make_node("Add", ["x", "y"], ["y"])])
    with pytest.raises(ort.InvalidGraph, match="cycle"):
        ort.InferenceSession(model)


def test_undefined_tensor_name_is_invalid_graph():
    model = _relu_chain([helper.make_node("Relu", ["nowhere"], ["y"])])
    with pytest.raises(ort.InvalidGraph, match="'nowhere', which is not defined"):
        ort.InferenceSession(model)
    model = _relu_chain([helper.make_node("Relu", ["x"], ["z"])])
    with pytest.raises(ort.InvalidGraph, match="output 'y' is never produced"):
        ort.InferenceSession(model)


def test_duplicate_outputs_are_invalid_graph():
    model = _relu_chain([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])])
    with pytest.raises(ort.InvalidGraph, match="defined more than once"):
        ort.InferenceSession(model)
    model = _relu_chain([helper.make_node("Relu", ["x"], ["x"])], outputs=("x",))
    with pytest.raises(ort.InvalidGraph, match="defined more than once"):
        ort.InferenceSession(model)


def test_duplicate_inputs_and_initializers_are_invalid_graph():
    model = _relu_chain([helper.make_node("Add", ["x", "x"], ["y"])], inputs=("x", "x"))
    with pytest.raises(ort.InvalidGraph, match="listed twice"):
        ort.InferenceSession(model)
    model = _add_model()
    model.graph.initializer.append(model.graph.initializer[0])
    with pytest.raises(ort.InvalidGraph, match="defined twice"):
        ort.InferenceSession(model)


def test_attribute_without_a_type_is_invalid_graph():
    model = _relu_chain([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1)])
    model.graph.node[0].attribute[0].type = onnx.AttributeProto.UNDEFINED
    with pytest.raises(ort.InvalidGraph, match="attribute 'alpha' has no type"):
        ort.InferenceSession(model)
    # an unknown enum value arrives from bytes as UNDEFINED too
    data = model.SerializeToString().replace(b"\xa0\x01\x00", b"\xa0\x01\x63")
    with pytest.raises(ort.InvalidGraph, match="attribute 'alpha' has no type"):
        ort.InferenceSession(data)


def test_attribute_without_a_name_is_invalid_graph():
    model = _relu_chain([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1)])
    model.graph.node[0].attribute[0].name = ""
    with pytest.raises(ort.InvalidGraph, match="no name"):
        ort.InferenceSession(model)


def test_recursive_functions_are_invalid_graph():
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]
    f = helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("G", ["a"], ["b"], domain="local")], opsets)
    g = helper.make_function("local", "G", ["a"], ["b"], [helper.make_node("F", ["a"], ["b"], domain="local")], opsets)
    graph = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10, functions=[f, g])
    with pytest.raises(ort.InvalidGraph, match="recursion"):
        ort.InferenceSession(model)


def _nested_if(depth):
    """``depth`` If nodes, each then-branch holding the next; one else-branch leaf each."""
    out0 = helper.make_tensor_value_info("o0", F, [1])
    leaf = helper.make_graph([helper.make_node("Constant", [], ["o0"], value_floats=[1.0])], "leaf", [], [out0])
    g = leaf
    for d in range(depth):
        out = helper.make_tensor_value_info(f"o{d + 1}", F, [1])
        g = helper.make_graph([helper.make_node("If", ["c"], [f"o{d + 1}"], then_branch=g, else_branch=leaf)],
                              f"g{d}", [], [out])
    main = helper.make_graph(list(g.node), "main", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                             list(g.output))
    return helper.make_model(main, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_nested_if_chain_within_the_limit_runs():
    sess = ort.InferenceSession(_nested_if(MAX_NESTING - 1).SerializeToString())
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(True)})[0], [1.0])


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 30])
def test_nested_if_chain_beyond_the_limit_is_invalid_graph(depth):
    with pytest.raises(ort.InvalidGraph, match=f"nested more than {MAX_NESTING} levels"):
        ort.InferenceSession(_nested_if(depth).SerializeToString())


_varint = encode_varint


def _field(num, payload):
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _deep_model_bytes(depth):
    """A ModelProto nested ``depth`` graphs deep, encoded by hand (onnx.helper refuses)."""
    graph = b""
    for _ in range(depth):
        attr = _field(1, b"then_branch") + _field(6, graph) + _varint(20 << 3) + _varint(AttributeType := 5)
        assert AttributeType == onnx.AttributeProto.GRAPH
        node = _field(4, b"If") + _field(5, attr)
        graph = _field(1, node)
    opset = _field(1, b"") + _varint(2 << 3) + _varint(18)
    return _varint(1 << 3) + _varint(10) + _field(7, graph) + _field(8, opset)


def test_protobuf_nested_too_deep_to_parse_is_invalid_protobuf():
    with pytest.raises(ort.InvalidProtobuf):
        ort.InferenceSession(_deep_model_bytes(5000))


def test_hand_encoded_nesting_beyond_the_limit_is_invalid_graph():
    with pytest.raises(ort.InvalidGraph, match="nested more than"):
        ort.InferenceSession(_deep_model_bytes(MAX_NESTING + 5))


# -- what no provider can run ----------------------------------------------------------------


def test_unknown_op_names_the_op_and_version():
    model = _relu_chain([helper.make_node("NoSuchOp", ["x"], ["y"])])
    with pytest.raises(ort.NotImplemented, match=r"NoSuchOp node .*opset 18"):
        ort.InferenceSession(model)


def test_unknown_domain_names_the_domain():
    model = _relu_chain([helper.make_node("Relu", ["x"], ["y"], domain="com.example.evil")])
    model.opset_import.append(helper.make_opsetid("com.example.evil", 3))
    with pytest.raises(ort.NotImplemented, match=r"Relu node .*com\.example\.evil.*opset 3"):
        ort.InferenceSession(model)


def test_unsupported_opset_and_ir_version():
    model = _relu_chain([helper.make_node("Relu", ["x"], ["y"])])
    model.opset_import[0].version = 999
    with pytest.raises(ort.NotImplemented, match="opset 999"):
        ort.InferenceSession(model)
    model = _relu_chain([helper.make_node("Relu", ["x"], ["y"])])
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 99))
    with pytest.raises(ort.NotImplemented, match="ai.onnx.ml opset 99"):
        ort.InferenceSession(model)
    model = _relu_chain([helper.make_node("Relu", ["x"], ["y"])])
    model.ir_version = 1000
    with pytest.raises(ort.NotImplemented, match="IR version 1000"):
        ort.InferenceSession(model)


def test_op_newer_than_the_model_opset_is_not_implemented():
    # Gelu entered ai.onnx at opset 20; a model importing opset 13 cannot use it
    model = _relu_chain([helper.make_node("Gelu", ["x"], ["y"])])
    model.opset_import[0].version = 13
    with pytest.raises(ort.NotImplemented, match=r"Gelu node .*opset 13"):
        ort.InferenceSession(model)


# -- regressions found by fuzzing --------------------------------------------------------------


def test_invalid_utf8_in_a_name_is_invalid_protobuf():
    data = _relu_chain([helper.make_node("Relu", ["x"], ["y"], name="nodeAB")]).SerializeToString()
    with pytest.raises(ort.InvalidProtobuf, match="not valid UTF-8"):
        ort.InferenceSession(data.replace(b"nodeAB", b"node\xe0\x80"))


def test_unknown_element_type_in_a_declared_type_is_invalid_graph():
    model = _relu_chain([helper.make_node("Relu", ["x"], ["y"])])
    model.graph.output[0].type.tensor_type.elem_type = 104
    with pytest.raises(ort.InvalidGraph, match="unknown element type 104"):
        ort.InferenceSession(model)


@pytest.mark.parametrize(
    "node, match",
    [
        (helper.make_node("LeakyRelu", ["x"], ["y"], alpha=[0.1, 0.2]), "'alpha' is FLOATS, but LeakyRelu-16 expects FLOAT"),
        (helper.make_node("Relu", ["x"], ["y"], alpha=0.1), "attribute 'alpha', which Relu-14 does not define"),
        (helper.make_node("Relu", ["x", "x"], ["y"]), "has 2 inputs; Relu-14 takes 1 to 1"),
        (helper.make_node("Cast", ["x"], ["y"]), "lacks its required attribute 'to'"),
    ],
)
def test_nodes_are_checked_against_their_schema(node, match):
    with pytest.raises(ort.InvalidGraph, match=match):
        ort.InferenceSession(_relu_chain([node]))


def test_transform_failure_on_an_inconsistent_model_is_typed():
    # a Conv bias of the wrong shape, followed by a BatchNormalization the optimizer folds
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")] + [
        numpy_helper.from_array(np.ones(4, np.float32), n) for n in ("s", "bb", "m", "v")]
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "w"], ["c"], kernel_shape=[3, 3]),
         helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 2, 5, 5])], [helper.make_tensor_value_info("y", F, None)], inits)
    with pytest.raises(ort.OnnxRtError):
        ort.InferenceSession(model.SerializeToString()).run(None, {"x": np.ones((1, 2, 5, 5), np.float32)})
