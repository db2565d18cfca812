"""Running with untrusted feeds: precise typed errors, correct results for unusual
array layouts, spec-conformant NaN/Inf, checked indices, and no aliasing."""

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort

from ..conftest import make_model

F, I64 = TensorProto.FLOAT, TensorProto.INT64

# NaN and Inf inputs make numpy warn; the results are compared exactly below
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _two_input_model():
    """a[N, 3] float, b[N, 'K'] int64, c['K'] int64 -> y = a * 2, z = b + c."""
    return make_model(
        [helper.make_node("Add", ["a", "a"], ["y"]), helper.make_node("Add", ["b", "c"], ["z"])],
        [_vi("a", F, ["N", 3]), _vi("b", I64, ["N", "K"]), _vi("c", I64, ["K"])],
        [_vi("y", F, ["N", 3]), _vi("z", I64, ["N", "K"])],
    )


GOOD = {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 5), np.int64), "c": np.ones(5, np.int64)}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"a": None}, r"missing input 'a'"),
        ({"c": None}, r"missing input 'c'"),
        ({"extra": np.ones(1)}, r"unknown input 'extra'.*a, b, c"),
        ({"a": np.ones((2, 3), np.float64)}, r"input 'a' has dtype float64; the model expects float32"),
        ({"b": np.ones((2, 5), np.int32)}, r"input 'b' has dtype int32; the model expects int64"),
        ({"a": np.ones((2, 3), np.float16)}, r"input 'a' has dtype float16"),
        ({"a": np.ones(6, np.float32)}, r"input 'a' has rank 1 .*expects rank 2"),
        ({"a": np.ones((2, 3, 1), np.float32)}, r"input 'a' has rank 3"),
        ({"a": np.ones((2, 4), np.float32)}, r"input 'a' has size 4 in dimension 1; the model expects 3"),
        ({"a": np.ones((3, 3), np.float32)}, r"symbolic dimension 'N' is 3 in input 'a' but 2 in input 'b'"),
        ({"c": np.ones(4, np.int64)}, r"symbolic dimension 'K' is 5 in input 'b' but 4 in input 'c'"),
        # a list converts to the input's type as onnxruntime converts it; a ragged one cannot
        ({"a": [[1.0, 2.0, 3.0], [1.0]]}, r"input 'a': the list does not convert to tensor\(float\)"),
        ({"a": ((1.0, 2.0, 3.0),) * 2}, r"input 'a' must be a numpy array, got tuple"),
        ({"a": "abc"}, r"input 'a' must be a numpy array, got str"),
        ({"a": None, "b": None}, r"missing inputs 'a', 'b'"),
    ],
)
def test_feed_errors_are_typed_and_name_the_input(change, match):
    sess = ort.InferenceSession(_two_input_model().SerializeToString())
    feed = dict(GOOD)
    for k, v in change.items():
        if v is None:
            del feed[k]
        else:
            feed[k] = v
    with pytest.raises(ort.InvalidArgument, match=match):
        sess.run(None, feed)
    # the session is unharmed
    y, z = sess.run(None, GOOD)
    np.testing.assert_array_equal(y, np.full((2, 3), 2, np.float32))
    np.testing.assert_array_equal(z, np.full((2, 5), 2, np.int64))


def test_feed_must_be_a_dict_and_outputs_must_exist():
    sess = ort.InferenceSession(_two_input_model().SerializeToString())
    with pytest.raises(ort.InvalidArgument, match="dict"):
        sess.run(None, [GOOD["a"]])
    with pytest.raises(ort.InvalidArgument, match="unknown output 'w'"):
        sess.run(["w"], GOOD)


# -- array layouts, empty batches, scalars ---------------------------------------------------


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w1", (4, 8)), ("b1", (8,)), ("w2", (8, 3))]]
    return make_model(
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
         helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["l"]),
         helper.make_node("Softmax", ["l"], ["y"], axis=-1), helper.make_node("Transpose", ["x"], ["xt"])],
        [_vi("x", F, ["N", 4])], [_vi("y", F, ["N", 3]), _vi("xt", F, [4, "N"])], inits,
    )


def _layouts():
    base = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    return {
        "strided": base[::2, ::2],                     # non-contiguous
        "reversed": base[::-1, 2:6],                   # negative stride
        "fortran": np.asfortranarray(base[:, :4]),
        "transposed": base[:4, :6].T,
        "broadcast": np.broadcast_to(base[0, :4], (5, 4)),  # zero stride, read-only
        "readonly": _readonly(base[:3, :4].copy()),
        "zero-batch": np.zeros((0, 4), np.float32),
        "one-row": base[:1, :4],
    }


def _readonly(a):
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("layout", list(_layouts()))
def test_unusual_layouts_match_onnxruntime(layout):
    model = _mlp().SerializeToString()
    x = _layouts()[layout]
    before = x.copy()
    ours = ort.InferenceSession(model).run(None, {"x": x})
    ref = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ascontiguousarray(x)})
    for o, r in zip(ours, ref):
        assert o.shape == r.shape
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(x, before)


def test_zero_d_scalars():
    model = make_model(
        [helper.make_node("Mul", ["a", "b"], ["p"]), helper.make_node("ReduceSum", ["v"], ["s"], keepdims=0)],
        [_vi("a", F, []), _vi("b", F, []), _vi("v", F, [None])], [_vi("p", F, []), _vi("s", F, [])],
    ).SerializeToString()
    sess = ort.InferenceSession(model)
    p, s = sess.run(None, {"a": np.float32(3), "b": np.array(2.5, np.float32), "v": np.arange(4, dtype=np.float32)})
    assert p.shape == () and s.shape == ()
    assert p == 7.5 and s == 6
    p, s = sess.run(None, {"a": np.float32(3), "b": np.array(2.5, np.float32), "v": np.zeros(0, np.float32)})
    assert s == 0
    with pytest.raises(ort.InvalidArgument, match="input 'a' has rank 1"):
        sess.run(None, {"a": np.ones(1, np.float32), "b": np.float32(1), "v": np.ones(1, np.float32)})


# -- NaN and Inf ------------------------------------------------------------------------------

X = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 3e38]], np.float32)
Y = np.array([[1.0, np.inf, 2.0, 0.0, np.nan, -np.inf, 0.0, 10.0]], np.float32)
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Equal", "Less", "Greater"]
UNARY = ["Relu", "Sqrt", "Log", "Exp", "Sigmoid", "Tanh", "Erf", "Abs", "Neg", "Floor", "Ceil", "Round",
         "Sign", "Reciprocal", "Softmax", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ArgMax",
         "LeakyRelu", "IsNaN", "IsInf"]


def _nan_model(op):
    ins = ["x", "y"] if op in BINARY else ["x"]
    attrs = {}
    nodes = []
    if op == "Mod":
        ins, attrs = ["x", "y"], {"fmod": 1}
    if op == "MatMul":
        nodes.append(helper.make_node("Transpose", ["y"], ["yt"]))
        ins = ["x", "yt"]
    if op == "Where":
        nodes.append(helper.make_node("Less", ["x", "y"], ["c"]))
        ins = ["c", "x", "y"]
    nodes.append(helper.make_node(op, ins, ["z"], **attrs))
    out = TensorProto.BOOL if op in ("IsNaN", "IsInf", "Equal", "Less", "Greater") else (
        I64 if op == "ArgMax" else F)
    return make_model(nodes, [_vi("x", F, [1, 8]), _vi("y", F, [1, 8])], [_vi("z", out)]).SerializeToString()


@pytest.mark.parametrize("op", BINARY + UNARY + ["Mod", "MatMul", "Where"])
def test_nan_and_inf_propagate_like_onnxruntime(op):
    model = _nan_model(op)
    feed = {"x": X, "y": Y}
    (ours,) = ort.InferenceSession(model).run(None, feed)
    (ref,) = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    if ref.dtype.kind == "f":
        # the same non-finite pattern, bit for bit; finite values within rounding
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
        np.testing.assert_array_equal(np.isposinf(ours), np.isposinf(ref))
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(ours[fin], ref[fin], rtol=1e-6, atol=0)
    else:
        np.testing.assert_array_equal(ours, ref)


# -- indices from the feed ---------------------------------------------------------------------

DATA = np.arange(12, dtype=np.float32).reshape(3, 4)
INDEX_CASES = [
    ("Gather", {}, np.array([0, 3], np.int64), None),
    ("Gather", {}, np.array([-4], np.int64), None),
    ("Gather", {"axis": 1}, np.array([[4]], np.int64), None),
    ("GatherElements", {}, np.array([[0, 1, 2, 3]], np.int64), None),
    ("GatherElements", {"axis": 1}, np.array([[-5, 0, 0, 0]], np.int64), None),
    ("GatherND", {}, np.array([[2, 4]], np.int64), None),
    ("GatherND", {}, np.array([[-4, 0]], np.int64), None),
    ("ScatterElements", {}, np.array([[3, 0]], np.int64), np.ones((1, 2), np.float32)),
    ("ScatterElements", {"axis": 1}, np.array([[0, -5]], np.int64), np.ones((1, 2), np.float32)),
    ("ScatterND", {}, np.array([[3]], np.int64), np.ones((1, 4), np.float32)),
    ("ScatterND", {}, np.array([[1, 9]], np.int64), np.ones(1, np.float32)),
]


@pytest.mark.parametrize("op, attrs, idx, upd", INDEX_CASES)
def test_out_of_range_indices_are_invalid_argument(op, attrs, idx, upd):
    ins = ["d", "i"] + (["u"] if upd is not None else [])
    vis = [_vi("d", F, None), _vi("i", I64, None)] + ([_vi("u", F, None)] if upd is not None else [])
    sess = ort.InferenceSession(make_model([helper.make_node(op, ins, ["y"], **attrs)], vis, [_vi("y")]))
    feed = {"d": DATA.copy(), "i": idx}
    if upd is not None:
        feed["u"] = upd
    with pytest.raises(ort.InvalidArgument, match=rf"{op} node .*out of range"):
        sess.run(None, feed)
    np.testing.assert_array_equal(feed["d"], DATA)  # the failed run wrote nothing into the feed
    # in-range negative indices still work and match onnxruntime
    good = dict(feed, i=np.zeros_like(idx) - 1)
    ref = onnxruntime.InferenceSession(
        make_model([helper.make_node(op, ins, ["y"], **attrs)], vis, [_vi("y")]).SerializeToString(),
        providers=["CPUExecutionProvider"]).run(None, good)[0]
    np.testing.assert_array_equal(sess.run(None, good)[0], ref)


def test_array_feature_extractor_out_of_range_is_typed():
    model = helper.make_model(
        helper.make_graph([helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")],
                          "g", [_vi("x", F, [2, 3]), _vi("i", I64, [None])], [_vi("y")]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "i": np.array([2, 0], np.int64)})[0], x[:, [2, 0]])
    with pytest.raises(ort.InvalidArgument, match="ArrayFeatureExtractor"):
        sess.run(None, {"x": x, "i": np.array([3], np.int64)})


# -- no mutation, no aliasing ------------------------------------------------------------------


def _view_model(op):
    """Models whose output may be a view of the input or of a constant."""
    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    starts = numpy_helper.from_array(np.array([0], np.int64), "st")
    ends = numpy_helper.from_array(np.array([1], np.int64), "en")
    axes0 = numpy_helper.from_array(np.array([0], np.int64), "ax0")
    nodes = {
        "Identity": [helper.make_node("Identity", ["x"], ["y"])],
        "Reshape": [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "Transpose": [helper.make_node("Transpose", ["x"], ["y"])],
        "Slice": [helper.make_node("Slice", ["x", "st", "en"], ["y"])],
        "Squeeze": [helper.make_node("Slice", ["x", "st", "en"], ["s"]), helper.make_node("Squeeze", ["s", "ax0"], ["y"])],
        "Flatten": [helper.make_node("Flatten", ["x"], ["y"], axis=0)],
        "Unsqueeze": [helper.make_node("Unsqueeze", ["x", "ax0"], ["y"])],
        "Expand-noop": [helper.make_node("Expand", ["x", "shape2"], ["y"])],
        "Identity-initializer": [helper.make_node("Identity", ["w"], ["y"])],
        "Transpose-initializer": [helper.make_node("Transpose", ["w"], ["y"])],
        "ScatterND": [helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"])],
        "two-outputs-one-value": [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["x"], ["y2"])],
    }[op]
    inits = [shape, w, starts, ends, axes0, numpy_helper.from_array(np.array([2, 3], np.int64), "shape2"),
             numpy_helper.from_array(np.array([[1]], np.int64), "idx"),
             numpy_helper.from_array(np.full((1, 3), 9, np.float32), "upd")]
    used = {i for n in nodes for i in n.input}
    outs = [_vi("y")] + ([_vi("y2")] if op == "two-outputs-one-value" else [])
    return make_model(nodes, [_vi("x", F, [2, 3])], outs, [t for t in inits if t.name in used])


VIEW_OPS = ["Identity", "Reshape", "Transpose", "Slice", "Squeeze", "Flatten", "Unsqueeze", "Expand-noop",
            "Identity-initializer", "Transpose-initializer", "ScatterND", "two-outputs-one-value"]


@pytest.mark.parametrize("level", [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL])
@pytest.mark.parametrize("op", VIEW_OPS)
def test_outputs_never_alias_inputs_or_state(op, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    sess = ort.InferenceSession(_view_model(op).SerializeToString(), so)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    x_before = x.copy()
    first = sess.run(None, {"x": x})
    expected = [o.copy() for o in first]
    np.testing.assert_array_equal(x, x_before)  # inputs are never mutated
    for o in first:
        assert o.flags.writeable
        assert not np.shares_memory(o, x)
        o[...] = -1  # the caller owns its result
    if len(first) == 2:
        assert not np.shares_memory(first[0], first[1])
    np.testing.assert_array_equal(x, x_before)
    second = sess.run(None, {"x": x})
    for s, e in zip(second, expected):
        np.testing.assert_array_equal(s, e)
