"""The training op ``Gradient`` (expanded into backward nodes by the CPU provider).

The onnx package's own Gradient models must reproduce their recorded outputs; every
op with a gradient rule is checked against central finite differences in float64
(and, where short, against a closed form), including broadcasting, values read by
several nodes, dynamic or unknown shapes, older opsets and second derivatives.
"""

import glob
import os

import numpy as np
import onnx
import onnxrt
import pytest
from onnx import TensorProto, helper, numpy_helper

DOMAIN = "ai.onnx.preview.training"
LEVELS = [onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL, onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL]
SIMPLE = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "simple")


def session(model, level=onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = onnxrt.SessionOptions()
    so.graph_optimization_level = level
    return onnxrt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def grad_model(nodes, inputs, y, xs, zs=(), inits=(), opset=18, dtype=TensorProto.DOUBLE,
               grad_inputs=None, grad_outputs=None, extra_outputs=()):
    """Forward ``nodes`` plus ``Gradient(xs, zs, y)``; outputs are y then one gradient per x.

    ``inputs`` maps names to shapes (None: no shape information at all).
    """
    outs = grad_outputs if grad_outputs is not None else [f"d_{x}" for x in xs]
    attrs = {"xs": list(xs), "y": y}
    if zs:
        attrs["zs"] = list(zs)
    g = helper.make_node("Gradient", grad_inputs or list(xs) + list(zs), outs, domain=DOMAIN, **attrs)
    graph = helper.make_graph(
        list(nodes) + [g], "grad",
        [helper.make_tensor_value_info(k, dtype, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(n, dtype, None) for n in [y, *extra_outputs, *(o for o in outs if o)]],
        initializer=[numpy_helper.from_array(v, k) for k, v in dict(inits).items()],
    )
    return helper.make_model(
        graph, ir_version=10,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, 1)],
    )


def numeric_grad(sess, feeds, y, x, eps=1e-6):
    """Central finite differences of sum(y) with respect to feeds[x]."""
    base = feeds[x]
    out = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        vals = []
        for step in (eps, -eps):
            xp = base.copy()
            xp[idx] += step
            vals.append(np.sum(sess.run([y], {**feeds, x: xp})[0]))
        out[idx] = (vals[0] - vals[1]) / (2 * eps)
    return out


def check(model, feeds, xs, level=onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL, rtol=1e-5, atol=1e-7):
    """Run the model and compare each gradient output with finite differences; returns them."""
    sess = session(model, level)
    y = model.graph.output[0].name
    res = sess.run(None, feeds)
    grads = res[1:]
    for x, g in zip(xs, grads):
        assert g.shape == feeds[x].shape, (x, g.shape, feeds[x].shape)
        assert g.dtype == feeds[x].dtype
        np.testing.assert_allclose(g, numeric_grad(sess, feeds, y, x), rtol=rtol, atol=atol, err_msg=x)
    return grads


def rnd(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed + 7 * len(shape)).uniform(low, high, size=shape).astype(np.float64)


def away_from_zero(*shape, seed=0):
    """Values in ±[0.5, 1.5] (for Relu/Abs kinks and divisions)."""
    a = rnd(*shape, seed=seed, low=0.5, high=1.5)
    signs = np.where(np.random.default_rng(seed + 1).random(shape) < 0.5, -1.0, 1.0)
    return np.asarray(a * signs)


# -- the onnx package's Gradient models ------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["test_gradient_of_add", "test_gradient_of_add_and_mul"])
def test_onnx_backend_models(name, level):
    d = os.path.join(SIMPLE, name)
    if not os.path.isdir(d):
        pytest.skip(f"{name} is not shipped with this onnx")
    model = onnx.load(os.path.join(d, "model.onnx"))
    data = os.path.join(d, "test_data_set_0")
    ins = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(data, "input_*.pb")))]
    outs = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(os.path.join(data, "output_*.pb")))]
    sess = session(model, level)
    got = sess.run(None, {vi.name: v for vi, v in zip(sess.get_inputs(), ins)})
    assert len(got) == len(outs)
    for g, e in zip(got, outs):
        np.testing.assert_allclose(g, e, rtol=1e-6)


# -- elementwise binary ops with broadcasting ------------------------------------------------------

BCAST = [((2, 3), (2, 3)), ((2, 3), (3,)), ((3,), (2, 3)), ((2, 3), (1, 3)), ((2, 1), (1, 3)),
         ((2, 3), ()), ((2, 1, 3), (4, 1))]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("sa,sb", BCAST)
def test_binary_broadcast(op, sa, sb, level):
    m = grad_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": sa, "b": sb}, "y", ["a", "b"])
    feeds = {"a": rnd(*sa, seed=1), "b": away_from_zero(*sb, seed=2) if op == "Div" else rnd(*sb, seed=2)}
    check(m, feeds, ["a", "b"], level)


def test_mul_closed_form():
    m = grad_model([helper.make_node("Mul", ["a", "b"], ["y"])], {"a": (2, 3), "b": (3,)}, "y", ["a", "b"])
    a, b = rnd(2, 3), rnd(3, seed=3)
    da, db = session(m).run(None, {"a": a, "b": b})[1:]
    np.testing.assert_allclose(da, np.broadcast_to(b, (2, 3)))
    np.testing.assert_allclose(db, a.sum(axis=0))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("exponent", [3.0, 0.5, -1.5])
def test_pow_constant_exponent(exponent, level):
    m = grad_model([helper.make_node("Pow", ["x", "p"], ["y"])], {"x": (2, 3)}, "y", ["x"],
                   inits={"p": np.array(exponent)})
    x = rnd(2, 3, low=0.5, high=2.0)
    (dx,) = check(m, {"x": x}, ["x"], level)
    np.testing.assert_allclose(dx, exponent * x ** (exponent - 1), rtol=1e-12)


def test_pow_integer_exponent_and_variable_exponent():
    # an int64 exponent is cast to x's type in the rule; a variable exponent is differentiated too
    m = grad_model([helper.make_node("Pow", ["x", "k"], ["t"]), helper.make_node("Pow", ["t", "p"], ["y"])],
                   {"x": (3,), "p": (3,)}, "y", ["x", "p"], inits={"k": np.array(2, dtype=np.int64)})
    check(m, {"x": rnd(3, low=0.5, high=1.5), "p": rnd(3, seed=5)}, ["x", "p"])


# -- elementwise unary ops ------------------------------------------------------------------------------

UNARY = {
    "Neg": lambda s: rnd(*s),
    "Identity": lambda s: rnd(*s),
    "Relu": lambda s: away_from_zero(*s),
    "Sigmoid": lambda s: rnd(*s, low=-3, high=3),
    "Tanh": lambda s: rnd(*s, low=-2, high=2),
    "Exp": lambda s: rnd(*s),
    "Log": lambda s: rnd(*s, low=0.5, high=3),
    "Sqrt": lambda s: rnd(*s, low=0.5, high=3),
    "Reciprocal": lambda s: away_from_zero(*s),
    "Abs": lambda s: away_from_zero(*s),
}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, level):
    # y = op(x) * w, so that the seed is not uniform and the chain rule is exercised
    nodes = [helper.make_node(op, ["x"], ["h"]), helper.make_node("Mul", ["h", "w"], ["y"])]
    m = grad_model(nodes, {"x": (2, 3)}, "y", ["x"], inits={"w": rnd(2, 3, seed=9)})
    check(m, {"x": UNARY[op]((2, 3))}, ["x"], level)


def test_unary_closed_forms():
    x = rnd(4, low=-2, high=2)
    for op, d in [("Tanh", 1 - np.tanh(x) ** 2), ("Sigmoid", np.exp(-x) / (1 + np.exp(-x)) ** 2),
                  ("Exp", np.exp(x)), ("Relu", (x > 0).astype(np.float64))]:
        m = grad_model([helper.make_node(op, ["x"], ["y"])], {"x": (4,)}, "y", ["x"])
        np.testing.assert_allclose(session(m).run(None, {"x": x})[1], d, rtol=1e-12, err_msg=op)


# -- matrix products ------------------------------------------------------------------------------------

MATMUL = [((2, 3), (3, 4)), ((2, 2, 3), (3, 4)), ((2, 3), (2, 3, 4)), ((2, 1, 2, 3), (3, 3, 2)),
          ((3,), (3, 4)), ((2, 3), (3,)), ((3,), (3,)), ((3,), (2, 3, 4)), ((2, 2, 3), (3,))]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("sa,sb", MATMUL)
def test_matmul(sa, sb, level):
    m = grad_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": sa, "b": sb}, "y", ["a", "b"])
    check(m, {"a": rnd(*sa, seed=1), "b": rnd(*sb, seed=2)}, ["a", "b"], level)


def test_matmul_closed_form():
    m = grad_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": (2, 3), "b": (3, 4)}, "y", ["a", "b"])
    a, b = rnd(2, 3), rnd(3, 4, seed=4)
    da, db = session(m).run(None, {"a": a, "b": b})[1:]
    np.testing.assert_allclose(da, np.ones((2, 4)) @ b.T)
    np.testing.assert_allclose(db, a.T @ np.ones((2, 4)))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("cshape", [(4,), (1, 4), (2, 4), (2, 1), ()])
def test_gemm(ta, tb, cshape, level):
    sa = (3, 2) if ta else (2, 3)
    sb = (4, 3) if tb else (3, 4)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=ta, transB=tb, alpha=0.7, beta=1.3)
    m = grad_model([node], {"a": sa, "b": sb, "c": cshape}, "y", ["a", "b", "c"])
    check(m, {"a": rnd(*sa, seed=1), "b": rnd(*sb, seed=2), "c": rnd(*cshape, seed=3)}, ["a", "b", "c"], level)


def test_gemm_without_bias():
    m = grad_model([helper.make_node("Gemm", ["a", "b"], ["y"])], {"a": (2, 3), "b": (3, 4)}, "y", ["a", "b"])
    check(m, {"a": rnd(2, 3), "b": rnd(3, 4, seed=2)}, ["a", "b"])


# -- shape ops ---------------------------------------------------------------------------------------------


def _weighted(nodes, out, shape, seed=11):
    """Append y = out * w, so each output element has its own weight in the derivative."""
    return list(nodes) + [helper.make_node("Mul", [out, "w"], ["y"])], {"w": rnd(*shape, seed=seed)}


@pytest.mark.parametrize("level", LEVELS)
def test_reshape_transpose(level):
    nodes, inits = _weighted([
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Transpose", ["t"], ["u"]),
    ], "u", (4, 3, 2))
    inits["shape"] = np.array([3, 4, 2], dtype=np.int64)
    m = grad_model(nodes, {"x": (6, 4)}, "y", ["x"], inits=inits)
    check(m, {"x": rnd(6, 4)}, ["x"], level)


def test_flatten_squeeze_unsqueeze_expand():
    nodes, inits = _weighted([
        helper.make_node("Unsqueeze", ["x", "ax0"], ["u"]),          # (1, 2, 3)
        helper.make_node("Squeeze", ["u", "ax0"], ["s"]),            # (2, 3)
        helper.make_node("Flatten", ["s"], ["f"], axis=0),           # (1, 6)
        helper.make_node("Expand", ["f", "eshape"], ["e"]),          # (4, 6)
    ], "e", (4, 6))
    inits.update(ax0=np.array([0], dtype=np.int64), eshape=np.array([4, 1], dtype=np.int64))
    m = grad_model(nodes, {"x": (2, 3)}, "y", ["x"], inits=inits)
    check(m, {"x": rnd(2, 3)}, ["x"])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([1], 0), ([0, 2], 0), ([-1], 0), (None, 1), (None, 0)])
def test_reduce(op, axes, keepdims, level):
    ins = ["x"] if axes is None else ["x", "axes"]
    inits = {} if axes is None else {"axes": np.array(axes, dtype=np.int64)}
    red = helper.make_node(op, ins, ["r"], keepdims=keepdims)
    out_shape = np.sum(np.zeros((2, 3, 4)), axis=None if axes is None else tuple(axes), keepdims=bool(keepdims)).shape
    nodes, w = _weighted([red], "r", out_shape)
    m = grad_model(nodes, {"x": (2, 3, 4)}, "y", ["x"], inits={**inits, **w})
    check(m, {"x": rnd(2, 3, 4)}, ["x"], level)


def test_reduce_mean_closed_form():
    m = grad_model([helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], {"x": (2, 5)}, "y", ["x"])
    np.testing.assert_allclose(session(m).run(None, {"x": rnd(2, 5)})[1], np.full((2, 5), 0.1))


def test_reduce_axes_from_graph_input():
    # axes known only at run time: the gradient unsqueezes by the same run-time axes
    nodes, w = _weighted([helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=0)], "r", (2, 4))
    graph_in = {"x": (2, 3, 4)}
    m = grad_model(nodes, graph_in, "y", ["x"], inits=w)
    m.graph.input.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [1]))
    sess = session(m)
    x = rnd(2, 3, 4)
    feeds = {"x": x, "axes": np.array([1], dtype=np.int64)}
    dx = sess.run(None, feeds)[1]
    np.testing.assert_allclose(dx, np.broadcast_to(w["w"][:, None, :], (2, 3, 4)))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(op, axis, level):
    nodes, w = _weighted([helper.make_node(op, ["x"], ["s"], axis=axis)], "s", (2, 3, 4))
    m = grad_model(nodes, {"x": (2, 3, 4)}, "y", ["x"], inits=w)
    check(m, {"x": rnd(2, 3, 4, low=-2, high=2)}, ["x"], level)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis, level):
    shapes = {"a": (2, 3), "b": (2, 3), "c": (2, 3)}
    if axis == 0:
        shapes = {"a": (1, 3), "b": (2, 3), "c": (3, 3)}
    else:
        shapes = {"a": (2, 1), "b": (2, 2), "c": (2, 3)}
    out_shape = np.concatenate([np.zeros(s) for s in shapes.values()], axis=axis).shape
    nodes, w = _weighted([helper.make_node("Concat", ["a", "k", "b", "c"], ["cat"], axis=axis)], "cat",
                         _concat_shape(out_shape, axis))
    m = grad_model(nodes, shapes, "y", ["a", "c"], zs=["b"],
                   inits={**w, "k": rnd(*_k_shape(axis), seed=6)})
    feeds = {"a": rnd(*shapes["a"], seed=1), "b": rnd(*shapes["b"], seed=2), "c": rnd(*shapes["c"], seed=3)}
    check(m, feeds, ["a", "c"], level)


def test_concat_symbolic_sizes():
    # the sizes along the axis are symbolic, so the slice bounds come from Shape at run time
    nodes = [helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=0),
             helper.make_node("Mul", ["cat", "cat"], ["y"])]
    m = grad_model(nodes, {"a": ["A", 3], "b": ["B", 3], "c": ["C", 3]}, "y", ["b", "c"], zs=["a"])
    feeds = {"a": rnd(2, 3, seed=1), "b": rnd(1, 3, seed=2), "c": rnd(3, 3, seed=3)}
    db, _ = check(m, feeds, ["b", "c"])
    np.testing.assert_allclose(db, 2 * feeds["b"])


def _k_shape(axis):
    return (1, 3) if axis == 0 else (2, 2)


def _concat_shape(shape, axis):
    s = list(shape)
    s[axis] += _k_shape(axis)[axis]
    return tuple(s)


def test_cast_through_float32():
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xf", "xf"], ["sq"]),
        helper.make_node("Cast", ["sq"], ["y"], to=TensorProto.DOUBLE),
    ]
    m = grad_model(nodes, {"x": (5,)}, "y", ["x"])
    x = rnd(5)
    dx = session(m).run(None, {"x": x})[1]
    assert dx.dtype == np.float64
    np.testing.assert_allclose(dx, 2 * x.astype(np.float32), rtol=1e-6)


def test_cast_to_integer_blocks_the_gradient():
    nodes = [
        helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
        helper.make_node("Cast", ["xi"], ["xd"], to=TensorProto.DOUBLE),
        helper.make_node("Add", ["xd", "x"], ["y"]),
    ]
    m = grad_model(nodes, {"x": (3,)}, "y", ["x"])
    np.testing.assert_allclose(session(m).run(None, {"x": rnd(3)})[1], np.ones(3))


def test_where():
    nodes = [helper.make_node("Greater", ["a", "b"], ["c"]), helper.make_node("Where", ["c", "a", "b"], ["y"])]
    m = grad_model(nodes, {"a": (2, 3), "b": (3,)}, "y", ["a", "b"])
    check(m, {"a": rnd(2, 3, seed=1), "b": rnd(3, seed=2)}, ["a", "b"])


# -- graph structure -----------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_value_used_twice(level):
    # x feeds Mul twice and Add once; h feeds two branches whose results are added
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["xx"]),
        helper.make_node("Add", ["xx", "x"], ["p"]),
        helper.make_node("Tanh", ["p"], ["h"]),
        helper.make_node("Mul", ["h", "w"], ["u"]),
        helper.make_node("Exp", ["h"], ["v"]),
        helper.make_node("Add", ["u", "v"], ["y"]),
    ]
    m = grad_model(nodes, {"x": (2, 3), "w": (3,)}, "y", ["x", "w"])
    x, w = rnd(2, 3), rnd(3, seed=2)
    dx, dw = check(m, {"x": x, "w": w}, ["x", "w"], level)
    h = np.tanh(x * x + x)
    np.testing.assert_allclose(dx, (w + np.exp(h)) * (1 - h**2) * (2 * x + 1), rtol=1e-12)
    np.testing.assert_allclose(dw, h.sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("level", LEVELS)
def test_mlp(level):
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("Gemm", ["h2", "w2", "b2"], ["logits"], transB=1),
        helper.make_node("LogSoftmax", ["logits"], ["lp"], axis=1),
        helper.make_node("Mul", ["lp", "labels"], ["picked"]),
        helper.make_node("ReduceSum", ["picked"], ["s"], keepdims=0),
        helper.make_node("Neg", ["s"], ["y"]),
    ]
    labels = np.eye(3)[[0, 2, 1, 2]]
    m = grad_model(nodes, {"x": (4, 5), "w1": (5, 6), "b1": (6,), "w2": (3, 6), "b2": (3,)}, "y",
                   ["w1", "b1", "w2", "b2"], zs=["x"], inits={"labels": labels})
    feeds = {"x": rnd(4, 5, seed=1), "w1": rnd(5, 6, seed=2), "b1": rnd(6, seed=3) + 0.1,
             "w2": rnd(3, 6, seed=4), "b2": rnd(3, seed=5)}
    check(m, feeds, ["w1", "b1", "w2", "b2"], level)


def test_symbolic_dims_broadcast_at_run_time():
    # N is symbolic, so whether b was broadcast along it is decided at run time
    nodes = [helper.make_node("Mul", ["a", "b"], ["p"]), helper.make_node("Sub", ["p", "c"], ["y"])]
    m = grad_model(nodes, {"a": ["N", 3], "b": ["M", 3], "c": [3]}, "y", ["a", "b", "c"])
    sess = session(m)
    for na, nb in [(4, 1), (4, 4), (1, 4)]:
        feeds = {"a": rnd(na, 3, seed=1), "b": rnd(nb, 3, seed=2), "c": rnd(3, seed=3)}
        res = sess.run(None, feeds)
        for x, g in zip("abc", res[1:]):
            np.testing.assert_allclose(g, numeric_grad(sess, feeds, "y", x), rtol=1e-5, atol=1e-7)


def test_unknown_shapes():
    # inputs declare no shape at all: even the ranks come from the run-time shapes
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "s"], ["y"])]
    m = grad_model(nodes, {"a": None, "b": None}, "y", ["a", "b"])
    feeds = {"a": rnd(2, 3, seed=1), "b": rnd(3, seed=2)}
    check(m, feeds, ["a", "b"])
    feeds = {"a": rnd(3, seed=1), "b": rnd(2, 2, 3, seed=2)}
    check(m, feeds, ["a", "b"])


@pytest.mark.parametrize("level", LEVELS)
def test_opset_12(level):
    # ReduceSum/Unsqueeze take axes as attributes, Softmax flattens at axis
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], axis=1),
        helper.make_node("Mul", ["s", "b"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["r"], axes=[1], keepdims=0),
        helper.make_node("ReduceMean", ["r"], ["y"], axes=[0], keepdims=0),
    ]
    m = grad_model(nodes, {"x": (2, 3, 4), "b": (4,)}, "y", ["x", "b"], opset=12)
    check(m, {"x": rnd(2, 3, 4), "b": rnd(4, seed=2)}, ["x", "b"], level)


def test_float32():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Sigmoid", ["m"], ["y"])]
    m = grad_model(nodes, {"a": (2, 3), "b": (3,)}, "y", ["a", "b"], dtype=TensorProto.FLOAT)
    a, b = rnd(2, 3).astype(np.float32), rnd(3, seed=2).astype(np.float32)
    da, db = session(m).run(None, {"a": a, "b": b})[1:]
    s = 1 / (1 + np.exp(-(a @ b)))
    assert da.dtype == db.dtype == np.float32
    np.testing.assert_allclose(da, np.outer(s * (1 - s), b), rtol=1e-5)
    np.testing.assert_allclose(db, a.T @ (s * (1 - s)), rtol=1e-5)


def test_intermediate_value_in_xs():
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["h"]),
        helper.make_node("Mul", ["h", "h"], ["y"]),
    ]
    m = grad_model(nodes, {"x": (3,)}, "y", ["h", "x"], inits={"two": np.array(2.0)})
    x = rnd(3)
    dh, dx = session(m).run(None, {"x": x})[1:]
    np.testing.assert_allclose(dh, 2 * (2 * x))  # h is a leaf: dy/dh = 2h
    np.testing.assert_allclose(dx, np.zeros(3))  # every path from x to y passes through the leaf h


def test_evaluated_at_other_inputs():
    # Gradient(xs=[h], y) fed h1: the derivative of y(h) = h*h*w is taken at h = h1
    nodes = [
        helper.make_node("Exp", ["x"], ["h"]),
        helper.make_node("Mul", ["h", "h"], ["hh"]),
        helper.make_node("Mul", ["hh", "w"], ["y"]),
    ]
    m = grad_model(nodes, {"x": (3,), "h1": (3,), "w": (3,)}, "y", ["h"], zs=["w"],
                   grad_inputs=["h1", "w"])
    x, h1, w = rnd(3), rnd(3, seed=2), rnd(3, seed=3)
    y, dh = session(m).run(None, {"x": x, "h1": h1, "w": w})
    np.testing.assert_allclose(y, np.exp(x) ** 2 * w)  # the forward output is untouched
    np.testing.assert_allclose(dh, 2 * h1 * w)


def test_zs_and_skipped_outputs():
    nodes = [helper.make_node("Mul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])]
    m = grad_model(nodes, {"x": (2, 3), "w": (3,), "b": (3,)}, "y", ["x", "w"], zs=["b"],
                   grad_outputs=["", "d_w"])
    sess = session(m)
    assert [o.name for o in sess.get_outputs()] == ["y", "d_w"]
    x, w, b = rnd(2, 3), rnd(3, seed=2), rnd(3, seed=3)
    np.testing.assert_allclose(sess.run(None, {"x": x, "w": w, "b": b})[1], x.sum(axis=0))


def test_y_independent_of_x_gives_zeros():
    nodes = [helper.make_node("Exp", ["z"], ["y"])]
    m = grad_model(nodes, {"x": (2, 2), "z": (3,)}, "y", ["x"], zs=["z"])
    np.testing.assert_array_equal(session(m).run(None, {"x": rnd(2, 2), "z": rnd(3)})[1], np.zeros((2, 2)))


def test_gradient_of_x_itself_is_ones():
    m = grad_model([helper.make_node("Identity", ["x"], ["y"])], {"x": (2, 3)}, "y", ["y", "x"])
    m.graph.output.pop()  # the two gradients: d_y then d_x
    m.graph.output.append(helper.make_tensor_value_info("d_x", TensorProto.DOUBLE, None))
    d_y, d_x = session(m).run(["d_y", "d_x"], {"x": rnd(2, 3)})
    np.testing.assert_array_equal(d_y, np.ones((2, 3)))
    np.testing.assert_array_equal(d_x, np.zeros((2, 3)))  # y is a leaf, so nothing reaches x


@pytest.mark.parametrize("level", LEVELS)
def test_second_derivative(level):
    # y = x^3: the first Gradient gives 3x^2, the second (of the first's output) 6x
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["xx"]),
        helper.make_node("Mul", ["xx", "x"], ["y"]),
        helper.make_node("Gradient", ["x"], ["dy"], domain=DOMAIN, xs=["x"], y="y"),
    ]
    m = grad_model(nodes, {"x": (4,)}, "dy", ["x"], extra_outputs=["y"])
    x = rnd(4)
    dy, y, d2y = session(m, level).run(None, {"x": x})
    np.testing.assert_allclose(y, x**3)
    np.testing.assert_allclose(dy, 3 * x**2)
    np.testing.assert_allclose(d2y, 6 * x)


def test_second_derivative_with_broadcast():
    # y = sum(tanh(x * w)) with w broadcast: d2y/dx2 = w^2 * tanh'' (diagonal)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["p"]),
        helper.make_node("Tanh", ["p"], ["y"]),
        helper.make_node("Gradient", ["x", "w"], ["dx"], domain=DOMAIN, xs=["x"], zs=["w"], y="y"),
    ]
    m = grad_model(nodes, {"x": (2, 3), "w": (3,)}, "dx", ["x"], zs=["w"])
    x, w = rnd(2, 3), rnd(3, seed=2)
    dx, d2x = session(m).run(None, {"x": x, "w": w})
    t = np.tanh(x * w)
    np.testing.assert_allclose(dx, w * (1 - t**2))
    np.testing.assert_allclose(d2x, w * w * (-2 * t * (1 - t**2)))


# -- errors ---------------------------------------------------------------------------------------------


def test_unsupported_op_is_not_implemented():
    nodes = [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Add", ["s", "x"], ["y"])]
    m = grad_model(nodes, {"x": (3,)}, "y", ["x"])
    with pytest.raises(onnxrt.NotImplemented, match=r"Gradient does not support op Sin"):
        session(m)


def test_unsupported_op_off_the_path_is_fine():
    # Sin only reads z, which is not differentiated
    nodes = [helper.make_node("Sin", ["z"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    m = grad_model(nodes, {"x": (3,), "z": (3,)}, "y", ["x"], zs=["z"])
    z = rnd(3, seed=4)
    np.testing.assert_allclose(session(m).run(None, {"x": rnd(3), "z": z})[1], np.sin(z))


def test_undefined_y_is_invalid_graph():
    m = grad_model([helper.make_node("Neg", ["x"], ["n"])], {"x": (3,)}, "n", ["x"])
    m.graph.node[-1].attribute[-1].s = b"nowhere"
    with pytest.raises(onnxrt.InvalidGraph):
        session(m)
