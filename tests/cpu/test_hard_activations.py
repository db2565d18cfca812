"""HardSigmoid, HardSwish and onnxrt's HardActivation on the CPU provider: the compiled
``hard`` kernel gives the numpy path's values bit for bit (every step rounded to
float32, no fused multiply-add, NaN passed through), the nodes agree with onnxruntime
and the onnx reference implementation, and a squeeze-and-excitation block's
per-channel Mul (``binary`` with a value per plane) gives numpy's products."""

import numpy as np
import onnxruntime as rt
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt import errors
from onnxrt_cpu import native
from onnxrt_cpu.kernels import activation, math as cpu_math

needs_native = pytest.mark.skipif(native.K is None or not hasattr(native.K, "hard"),
                                  reason="the compiled kernels are not built here (or ONNXRT_CPU_NATIVE=0)")

_SPECIALS = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 3.0, -3.0, 2.9999998, -2.9999998, 3.0000002,
                      -3.0000002, 6.0, -6.0, 1e-45, -1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 0.5, -0.5],
                     np.float32)


def _values(n: int, seed: int = 0) -> np.ndarray:
    """``n`` float32 values: the specials, values around the kinks at +-3, and a wide
    normal spread, shuffled so that every vector lane sees each kind."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([_SPECIALS, (rng.standard_normal(n) * 4).astype(np.float32),
                        (rng.uniform(-3.01, -2.99, n // 4)).astype(np.float32),
                        (rng.uniform(2.99, 3.01, n // 4)).astype(np.float32)])
    return rng.permutation(x)[:n]


def _numpy_steps(x, mode, scale, shift, lo, hi, factor):
    """The numpy path's steps, one rounding each."""
    t = np.float32
    y = x * t(scale)
    y += t(shift)
    y = np.clip(y, t(lo), t(hi))
    def apply(y):
        return y / t(factor) if mode & activation.HARD_DIV else y * t(factor)
    if mode & activation.HARD_FACTOR_FIRST:
        y = apply(y)
    if mode & activation.HARD_GATE:
        y = y * x
    if not mode & activation.HARD_FACTOR_FIRST:
        y = apply(y)
    return y


@needs_native
@pytest.mark.parametrize("mode", range(8))
@pytest.mark.parametrize("n", [1, 15, 17, 1000, 70001])
def test_hard_kernel_matches_numpy_steps_bit_for_bit(mode, n):
    x = _values(n, seed=mode)
    params = (1.0, 3.0, 0.0, 6.0, 6.0) if mode & activation.HARD_DIV else (np.float32(1 / 6), 0.5, 0.0, 1.0, 0.75)
    y = np.empty_like(x)
    with np.errstate(all="ignore"):
        native.K.hard(x, y, mode, *map(float, params), 2)
        want = _numpy_steps(x, mode, *params)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))


@needs_native
def test_hard_kernel_in_place_and_bad_arguments():
    x = _values(5000)
    with np.errstate(all="ignore"):
        want = _numpy_steps(x, activation.HARD_GATE, np.float32(1 / 6), 0.5, 0.0, 1.0, 1.0)
    native.K.hard(x, x, activation.HARD_GATE, float(np.float32(1 / 6)), 0.5, 0.0, 1.0, 1.0, 2)
    np.testing.assert_array_equal(x.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="unknown mode"):
        native.K.hard(x, x, 8, 1.0, 0.0, 0.0, 1.0, 1.0, 1)
    with pytest.raises(TypeError, match="hard: x"):
        native.K.hard(x.astype(np.float64), x, 0, 1.0, 0.0, 0.0, 1.0, 1.0, 1)
    with pytest.raises(ValueError, match="hard: y"):
        native.K.hard(x, x[:10], 0, 1.0, 0.0, 0.0, 1.0, 1.0, 1)


def _model(op, shape, elem=TensorProto.FLOAT, opset=17, **attrs):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", elem, shape)],
                          [helper.make_tensor_value_info("y", elem, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


_CASES = [("HardSwish", {}), ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.1666667014, "beta": 0.5}),
          ("HardSigmoid", {"alpha": -0.3, "beta": 0.25})]


@pytest.mark.parametrize("op,attrs", _CASES)
@pytest.mark.parametrize("shape", [[2, 3, 5], [1, 16, 112, 112]])  # the numpy path, the compiled one
def test_nodes_agree_with_onnxruntime_and_the_reference(op, attrs, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 5
    x.reshape(-1)[:len(_SPECIALS)] = _SPECIALS[:x.size]
    model = _model(op, shape, **attrs)
    got = _run(model, x)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    theirs = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    finite = np.isfinite(x)
    np.testing.assert_allclose(got[finite], theirs[finite], rtol=1e-6, atol=1e-6)
    assert np.isnan(got[np.isnan(x)]).all()


@needs_native
@pytest.mark.parametrize("op,attrs", _CASES)
def test_compiled_and_numpy_paths_agree_bit_for_bit(op, attrs, monkeypatch):
    shape = [1, 8, 64, 64]
    x = _values(8 * 64 * 64, seed=2).reshape(shape)
    model = _model(op, shape, **attrs)
    fast = _run(model, x)
    monkeypatch.setattr(native, "K", None)
    slow = _run(model, x)
    np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))


@pytest.mark.parametrize("op", ["HardSwish", "HardSigmoid"])
def test_float16_inputs_compute_in_float32(op):
    shape = [4, 1000]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float16) * 4
    got = _run(_model(op, shape, TensorProto.FLOAT16), x)
    want = _run(_model(op, shape), x.astype(np.float32)).astype(np.float16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


def _hard_activation_model(shape, **attrs):
    g = helper.make_graph([helper.make_node("HardActivation", ["x"], ["y"], domain="ai.onnxrt", **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnxrt", 1)],
                             ir_version=9)


@pytest.mark.parametrize("shape", [[], [7], [3, 50, 50]])
@pytest.mark.parametrize("attrs", [dict(shift=3.0, low=0.0, high=6.0, factor=6.0, divide=1, gate=1),
                                   dict(shift=3.0, low=0.0, high=6.0, factor=6.0, divide=1, gate=1, factor_first=1),
                                   dict(scale=0.63296586, shift=-0.54658866),
                                   dict(scale=0.2, shift=0.5, low=0.0, high=1.0, gate=1)])
def test_hard_activation_op_matches_its_numpy_steps(shape, attrs, monkeypatch):
    x = np.asarray(_values(max(1, int(np.prod(shape))), seed=4)).reshape(shape)
    mode = (activation.HARD_GATE if attrs.get("gate") else 0) | (activation.HARD_DIV if attrs.get("divide") else 0) \
        | (activation.HARD_FACTOR_FIRST if attrs.get("factor_first") else 0)
    with np.errstate(all="ignore"):
        want = _numpy_steps(x.reshape(-1), mode, attrs.get("scale", 1.0), attrs.get("shift", 0.0),
                            attrs.get("low", -np.inf), attrs.get("high", np.inf), attrs.get("factor", 1.0))
    model = _hard_activation_model(shape, **attrs)
    got = _run(model, x)
    assert got.shape == tuple(shape) and got.dtype == np.float32
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))
    monkeypatch.setattr(native, "K", None)
    np.testing.assert_array_equal(_run(model, x).reshape(-1).view(np.uint32), want.view(np.uint32))


def test_hard_activation_refuses_integers():
    g = helper.make_graph([helper.make_node("HardActivation", ["x"], ["y"], domain="ai.onnxrt")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.INT32, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnxrt", 1)],
                              ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(errors.Fail, match="float tensor"):
        sess.run(None, {"x": np.arange(3, dtype=np.int32)})


# -- the squeeze-and-excitation product (and other per-plane operands) -------------------


_NUMPY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


@needs_native
@pytest.mark.parametrize("name", sorted(_NUMPY))
@pytest.mark.parametrize("big,small", [((1, 96, 40, 40), (1, 96, 1, 1)), ((2, 24, 30, 30), (2, 24, 1, 1)),
                                       ((1, 480, 20, 20), (480, 1, 1)), ((1, 4, 100, 200), (1, 4, 100, 1)),
                                       ((3, 70000), (3, 1))])
def test_plane_op_gives_numpy_values_in_either_order(name, big, small):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(big).astype(np.float32)
    b = rng.standard_normal(small).astype(np.float32)
    a.reshape(-1)[:len(_SPECIALS)] = _SPECIALS
    b.reshape(-1)[:2] = [0.0, -np.inf]
    with np.errstate(all="ignore"):
        for x, s in ((a, b), (b, a)):
            want = _NUMPY[name](x, s)
            got = cpu_math._plane_op(name, x, s)
            assert got is not None and got.shape == want.shape
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@needs_native
@pytest.mark.parametrize("big,small", [((2, 8, 50, 50), (1, 8, 1, 1)),  # a broadcast over the leading axis
                                       ((1, 8, 50, 50), (1, 8, 50, 50)),  # none at all
                                       ((1, 8, 50, 50), (1, 1, 1, 1)),  # a scalar: numpy's own pass
                                       ((1, 8, 5, 5), (1, 8, 1, 1))])  # too small to pay for the call
def test_plane_op_leaves_other_operands_to_numpy(big, small):
    a = np.ones(big, np.float32)
    b = np.ones(small, np.float32)
    assert cpu_math._plane_op("Mul", a, b) is None
    assert cpu_math._plane_op("Mul", a.astype(np.float64), b.astype(np.float64)) is None


@needs_native
def test_binary_kernel_bad_arguments():
    a = np.ones(12, np.float32)
    with pytest.raises(ValueError, match="unknown op"):
        native.K.binary(a, a, a, 4, 0, False, 1)
    with pytest.raises(ValueError, match="not planes of 5"):
        native.K.binary(a, a, a, 0, 5, False, 1)
    with pytest.raises(ValueError, match="binary: b"):
        native.K.binary(a, a[:2], a, 0, 4, False, 1)


def test_squeeze_excitation_block_agrees_with_onnxruntime():
    """GlobalAveragePool -> 1x1 Conv -> HardSigmoid -> Mul by the block's input."""
    rng = np.random.default_rng(6)
    c = 32
    w = (rng.standard_normal((c, c, 1, 1)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w"], ["q"]),
             helper.make_node("HardSigmoid", ["q"], ["s"], alpha=0.1666667014, beta=0.5),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 48, 48])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 48, 48])],
                          initializer=[helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.reshape(-1))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    x = rng.standard_normal((1, c, 48, 48)).astype(np.float32)
    got = _run(model, x)
    want = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
