"""Feeds beyond plain arrays: ndarray subclasses, string tensors, optional and map
inputs are checked and normalized before any kernel sees them."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort

from ..conftest import make_model

# np.matrix warns that it is not recommended; feeding one is the point here
pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")

F, I64, S = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _square():
    return _session(make_model([helper.make_node("Mul", ["a", "a"], ["y"]),
                                helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)],
                               [_vi("a", F, [2, 2])], [_vi("y", F, [2, 2]), _vi("s", F, [])]))


def test_a_matrix_feed_runs_as_a_plain_array():
    # np.matrix makes * a matrix product and keeps rank 2 through every reduction
    a = np.matrix([[1.0, 2.0], [3.0, 4.0]], np.float32)
    y, s = _square().run(None, {"a": a})
    assert type(y) is np.ndarray and type(s) is np.ndarray
    np.testing.assert_array_equal(y, [[1, 4], [9, 16]])
    assert s.shape == () and s == 30
    assert type(a) is np.matrix  # the feed is left as it was


def test_a_masked_array_feed_is_refused():
    a = np.ma.masked_array(np.ones((2, 2), np.float32), mask=[[0, 1], [0, 0]])
    with pytest.raises(ort.InvalidArgument, match="input 'a' is a masked array; its mask would be ignored"):
        _square().run(None, {"a": a})


def test_other_subclasses_run_as_plain_arrays():
    class Tagged(np.ndarray):
        pass

    a = np.arange(4, dtype=np.float32).reshape(2, 2).view(Tagged)
    y, _ = _square().run(None, {"a": a})
    assert type(y) is np.ndarray
    np.testing.assert_array_equal(y, np.arange(4).reshape(2, 2) ** 2)


def _strings():
    return _session(make_model([helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER")],
                               [_vi("x", S, [None])], [_vi("y", S, [None])]))


@pytest.mark.parametrize("feed", [
    np.array(["ab", "cé"]),
    np.array(["ab", "cé"], dtype=object),
    np.array([b"ab", "cé".encode()]),
    np.array([b"ab", "cé".encode()], dtype=object),
    np.array(["ab", np.str_("cé")], dtype=object),
])
def test_string_feeds_as_text_or_utf8_bytes(feed):
    (y,) = _strings().run(None, {"x": feed})
    assert y.tolist() == ["AB", "CÉ"]
    assert all(type(v) is str for v in y)


@pytest.mark.parametrize("feed,match", [
    (np.array(["a", 3], dtype=object), "element 1 is int 3; a string tensor holds str only"),
    (np.array(["a", None], dtype=object), "element 1 is NoneType"),
    (np.array([b"\xff\xfe"]), "its bytes are not UTF-8 text"),
    (np.array(["a", b"\xff"], dtype=object), "element 1 is bytes that are not UTF-8 text"),
    (np.array([1.5, 2.5]), "has dtype float64; the model expects strings"),
])
def test_string_feeds_with_other_elements_are_refused(feed, match):
    with pytest.raises(ort.InvalidArgument, match=f"input 'x'.*{match}"):
        _strings().run(None, {"x": feed})


def test_an_object_string_feed_is_not_modified():
    feed = np.array(["ab", b"cd"], dtype=object)
    (y,) = _strings().run(None, {"x": feed})
    assert y.tolist() == ["AB", "CD"] and feed[1] == b"cd"


def _optional(elem):
    tp = helper.make_optional_type_proto(elem)
    x = helper.make_value_info("x", tp)
    return _session(make_model([helper.make_node("OptionalHasElement", ["x"], ["has"])], [x],
                               [_vi("has", TensorProto.BOOL, [])]))


def test_optional_tensor_input():
    sess = _optional(helper.make_tensor_type_proto(F, [2]))
    assert sess.run(None, {"x": np.ones(2, np.float32)})[0]
    assert not sess.run(None, {"x": None})[0]
    with pytest.raises(ort.InvalidArgument, match="input 'x' has dtype float64; expected float32"):
        sess.run(None, {"x": np.ones(2)})
    with pytest.raises(ort.InvalidArgument, match="input 'x' must be a numpy array, got list"):
        sess.run(None, {"x": [np.ones(2, np.float32)]})
    with pytest.raises(ort.InvalidArgument, match="masked array"):
        sess.run(None, {"x": np.ma.masked_array(np.ones(2, np.float32))})


def test_optional_sequence_input():
    sess = _optional(helper.make_sequence_type_proto(helper.make_tensor_type_proto(I64, None)))
    assert sess.run(None, {"x": [np.ones(2, np.int64)]})[0]
    assert not sess.run(None, {"x": None})[0]
    with pytest.raises(ort.InvalidArgument, match="input 'x' expects a sequence"):
        sess.run(None, {"x": np.ones(2, np.int64)})
    with pytest.raises(ort.InvalidArgument, match=r"input 'x'\[1\] has dtype int32; expected int64"):
        sess.run(None, {"x": [np.ones(2, np.int64), np.ones(2, np.int32)]})
    with pytest.raises(ort.InvalidArgument, match=r"input 'x'\[0\] must be a numpy array, got list"):
        sess.run(None, {"x": [[np.ones(2, np.int64)]]})  # a sequence of sequences


def _dict_vectorizer(key_type):
    vocab = {"string_vocabulary": ["a", "b"]} if key_type == S else {"int64_vocabulary": [1, 2]}
    tp = helper.make_map_type_proto(key_type, helper.make_tensor_type_proto(F, None))
    node = helper.make_node("DictVectorizer", ["m"], ["y"], domain="ai.onnx.ml", **vocab)
    model = make_model([node], [helper.make_value_info("m", tp)], [_vi("y", F, None)])
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    return _session(model)


def test_map_inputs_with_the_right_keys_and_values_run():
    (y,) = _dict_vectorizer(S).run(None, {"m": {"b": 2.5}})
    np.testing.assert_array_equal(y.reshape(-1), [0, 2.5])
    (y,) = _dict_vectorizer(I64).run(None, {"m": {np.int64(1): 4.0}})
    np.testing.assert_array_equal(y.reshape(-1), [4.0, 0])


@pytest.mark.parametrize("key_type,feed,match", [
    (S, [("a", 1.0)], "expects a map \\(a dict\\), got list"),
    (S, {1: 1.0}, "key 1 is int; the map's keys are strings"),
    (I64, {"a": 1.0}, "key 'a' is str; the map's keys are int64"),
    (I64, {1.5: 1.0}, "key 1.5 is float"),
    (I64, {True: 1.0}, "key True is bool"),
    (S, {"a": "x"}, r"input 'm'\['a'\] is str 'x'; the map's values are float32"),
    (S, {"a": None}, "is NoneType"),
    (S, {"a": np.ones(2)}, "has dtype float64; expected float32"),
])
def test_map_inputs_with_the_wrong_keys_or_values_are_refused(key_type, feed, match):
    with pytest.raises(ort.InvalidArgument, match=match):
        _dict_vectorizer(key_type).run(None, {"m": feed})


def test_sequence_elements_that_are_subclasses_become_plain_arrays():
    seq = helper.make_value_info("s", helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None)))
    sess = _session(make_model([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], [seq],
                               [_vi("y", F, None)]))
    (y,) = sess.run(None, {"s": [np.matrix([[1.0, 2.0]], np.float32), np.ones((1, 2), np.float32)]})
    assert type(y) is np.ndarray
    np.testing.assert_array_equal(y, [[1, 2], [1, 1]])


@pytest.mark.parametrize("values", [[float("inf"), 1.0], [2**70, 1], [float("nan"), 0.0]])
def test_a_list_feed_that_does_not_fit_an_integer_input_is_refused(values):
    # found by the long fuzz run: an infinity in a list for an int64 input was a raw OverflowError
    sess = _session(make_model([helper.make_node("Identity", ["a"], ["y"])], [_vi("a", I64, [2])],
                               [_vi("y", I64, [2])]))
    with pytest.raises(ort.InvalidArgument, match="input 'a': the list does not convert to tensor\\(int64\\)"):
        sess.run(None, {"a": values})
    assert sess.run(None, {"a": [3, 4]})[0].tolist() == [3, 4]
