"""The compiled float16 <-> float32 casts (``cast_f32_f16``, ``cast_f16_f32``: F16C
conversions): numpy's ``astype`` bits for every float16 value and for the float32
classes that round differently (ties, subnormals, overflow, infinities, NaN payloads),
at lengths that end in every tail; and the Cast node through them against onnxruntime."""

import numpy as np
import onnxruntime as rt
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt_cpu import native
from onnxrt_cpu.kernels import cast as cpu_cast

needs_cast16 = pytest.mark.skipif(not cpu_cast._CAST16_READY,
                                  reason="no compiled kernels here, or this CPU has no F16C conversions")


def _to_half(x: np.ndarray) -> np.ndarray:
    y = np.empty(x.shape, np.uint16)
    native.K.cast_f32_f16(x, y, 2)
    return y


def _to_float(h: np.ndarray) -> np.ndarray:
    y = np.empty(h.shape, np.float32)
    native.K.cast_f16_f32(h, y, 2)
    return y


def _numpy_half_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(np.float16).view(np.uint16)


@needs_cast16
def test_every_float16_widens_as_numpy_does():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # NaNs, signalling ones included
    want = h.view(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(_to_float(h).view(np.uint32), want)


def _hard_float32_bits() -> np.ndarray:
    """float32 bit patterns where the narrowing is delicate."""
    half = np.arange(1 << 16, dtype=np.uint32)
    widened = half.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    finite = widened[(widened & 0x7F800000) != 0x7F800000]
    parts = [finite, finite + 1, finite - 1]
    # halfway between neighbours (the ties, even and odd) and one ulp on either side
    parts += [finite + (1 << 12), finite + (1 << 12) + 1, finite + (1 << 12) - 1]
    # float16's subnormal range and below it, where float32 still has many values
    low = np.arange(0x32000000, 0x38800000, 997, dtype=np.uint32)
    parts += [low, low | 0x80000000]
    # around the overflow threshold 65520 and infinity; every NaN payload shape
    parts += [np.arange(0x477FE000 - 64, 0x477FE000 + 64, dtype=np.uint32), np.array([0x7F800000, 0xFF800000,
                                                                                         0x7F7FFFFF], np.uint32)]
    nan_payloads = np.array([1, 0x1FFF, 0x2000, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF, 0x5A5A5A], np.uint32)
    parts += [0x7F800000 | nan_payloads, 0xFF800000 | nan_payloads]
    rng = np.random.default_rng(0)
    parts.append(rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32))
    return np.concatenate([p.astype(np.uint32) for p in parts])


@needs_cast16
def test_narrowing_matches_numpy_bit_for_bit():
    x = _hard_float32_bits().view(np.float32)
    np.testing.assert_array_equal(_to_half(x), _numpy_half_bits(x))


@needs_cast16
@pytest.mark.parametrize("n", list(range(0, 40)) + [511, 512, 513, (1 << 15) + 3, 100003])
def test_every_length_and_tail(n):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(_to_half(x), _numpy_half_bits(x))
    h = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    np.testing.assert_array_equal(_to_float(h).view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))


@needs_cast16
def test_bad_arguments():
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="cast_f32_f16: y"):
        native.K.cast_f32_f16(x, np.empty(5, np.uint16), 1)
    with pytest.raises(TypeError, match="cast_f16_f32: x"):
        native.K.cast_f16_f32(x, np.empty(10, np.float32), 1)
    with pytest.raises(TypeError, match="cast_f32_f16: x"):
        native.K.cast_f32_f16(np.ones((4, 4), np.float32)[:, ::2], np.empty(8, np.uint16), 1)


@needs_cast16
def test_cast_array_takes_the_kernel_and_keeps_numpy_results(monkeypatch):
    x = (np.random.default_rng(1).standard_normal((3, 700)) * 3e4).astype(np.float32)
    calls = []
    real = native.K

    class Spy:
        def __getattr__(self, name):
            if name.startswith("cast_f"):
                calls.append(name)
            return getattr(real, name)

    monkeypatch.setattr(native, "K", Spy())
    h = cpu_cast.cast_array(x, np.float16)
    f = cpu_cast.cast_array(h, np.float32)
    small = cpu_cast.cast_array(x[:, :10], np.float16)  # small, and not contiguous: numpy
    assert calls == ["cast_f32_f16", "cast_f16_f32"]
    assert h.dtype == np.float16 and h.shape == x.shape and f.dtype == np.float32
    np.testing.assert_array_equal(h.view(np.uint16), _numpy_half_bits(x))
    np.testing.assert_array_equal(f, h.astype(np.float32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(small, x[:, :10].astype(np.float16))


def _cast_model(src, dst, shape):
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=dst)], "g",
                          [helper.make_tensor_value_info("x", src, shape)],
                          [helper.make_tensor_value_info("y", dst, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


@pytest.mark.parametrize("src,dst", [(TensorProto.FLOAT, TensorProto.FLOAT16), (TensorProto.FLOAT16, TensorProto.FLOAT)])
def test_cast_nodes_agree_with_onnxruntime(src, dst):
    shape = [2, 3, 64, 65]
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 2e4).astype(np.float32)
    x.reshape(-1)[:6] = [np.inf, -np.inf, 65520.0, 65519.996, 1e-8, -2.9802322e-08]
    if src == TensorProto.FLOAT16:
        with np.errstate(over="ignore"):
            x = x.astype(np.float16)
    model = _cast_model(src, dst, shape)
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
