"""The CPU provider's compiled kernels (``onnxrt_cpu.native``).

- They are built and loaded wherever the test environment was installed (a missing
  build is a failure here unless ``ONNXRT_CPU_NATIVE=0`` turns them off), with
  numpy's BLAS handed over.
- Pooling, activations, normalizations, attention and the 8-bit helpers give what
  the numpy paths give and what onnxruntime gives (the convolutions' own
  specification is ``test_conv.py``).
- The thread pool runs every chunk exactly once, from one caller or from many at
  once, and in a forked child.
- Bad arguments raise typed errors naming the argument, never crash.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt_cpu import native
from tests.cpu.conv_cases import GEOMETRIES, Counting, conv_model, needs_native, run

rt = pytest.importorskip("onnxruntime")


def test_the_compiled_kernels_are_built_and_multiply_through_numpys_blas():
    if os.environ.get("ONNXRT_CPU_NATIVE", "1") == "0":
        pytest.skip("turned off by ONNXRT_CPU_NATIVE=0")
    st = native.status()
    assert st["loaded"], st["reason"]
    assert st["blas"], st["blas_reason"]
    assert native.K is not None and native.BLAS


@needs_native
@pytest.mark.parametrize("count, threads", [(0, 2), (1, 2), (2, 2), (7, 3), (1000, 2), (5000, 4), (64, 1)])
def test_the_pool_runs_every_chunk_exactly_once(count, threads):
    assert native.K.pool_selftest(count, threads, 200) == [1] * count


@needs_native
def test_the_pool_serves_many_callers_at_once():
    """Callers that find the pool busy run their chunks themselves; none is lost."""
    results, errors = [], []

    def call():
        try:
            for _ in range(20):
                results.append(native.K.pool_selftest(300, 2, 500) == [1] * 300)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 120 and all(results)


@needs_native
def test_sessions_on_many_threads_at_once_give_the_same_results():
    x_shape, w_shape, attrs = GEOMETRIES[4]
    model = conv_model(x_shape, w_shape, act="Relu", **attrs)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(x_shape).astype(np.float32) for _ in range(8)]
    want = [sess.run(None, {"x": x})[0] for x in inputs]
    got = [None] * 8

    def run(i):
        for _ in range(10):
            got[i] = sess.run(None, {"x": inputs[i]})[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _child_conv(queue):
    x = np.ones((1, 8, 12, 12), np.float32)
    w = np.ones((16, 8 * 9), np.float32)
    y = np.empty((1, 16, 12, 12), np.float32)
    geometry = native.ConvGeometry(n=1, c=8, h=12, w=12, m=16, groups=1, kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pad_top=1,
                                   pad_left=1, oh=12, ow=12)
    native.K.conv2d(x, w, None, None, y, geometry, 0, 0.0, 0.0, 2)
    queue.put((float(y[0, 0, 5, 5]), float(y[0, 0, 0, 0]), native.K.pool_selftest(100, 2, 100) == [1] * 100))


@needs_native
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_starts_its_own_pool():
    native.K.pool_selftest(100, 2, 100)  # the parent's workers exist before the fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child_conv, args=(queue,))
    p.start()
    result = queue.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert result == (72.0, 32.0, True)


@needs_native
def test_bad_arguments_raise_typed_errors():
    k = native.K
    x = np.ones((1, 2, 4, 4), np.float32)
    w = np.ones((2, 9), np.float32)
    y = np.empty((1, 2, 4, 4), np.float32)
    geometry = native.WindowGeometry(n=1, c=2, h=4, w=4, kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pad_top=1, pad_left=1,
                                     oh=4, ow=4)
    conv = native.ConvGeometry(n=1, c=2, h=4, w=4, m=4, groups=1, kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pad_top=1,
                               pad_left=1, oh=4, ow=4)
    with pytest.raises(TypeError, match="x must be float32 or float64"):
        k.depthwise2d(x.astype(np.int32), w, None, y, geometry, 0, 0.0, 0.0, 1)
    with pytest.raises(TypeError, match="y must be a writable C-contiguous array"):
        k.depthwise2d(x, w, None, y[..., ::2], geometry, 0, 0.0, 0.0, 1)
    with pytest.raises(TypeError, match="w has element format 'd'"):
        k.depthwise2d(x, w.astype(np.float64), None, y, geometry, 0, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="y holds 16 elements, at least 32 are needed"):
        k.depthwise2d(x, w, None, y[:, :1], geometry, 0, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="invalid geometry or activation"):
        k.depthwise2d(x, w, None, y, geometry, 99, 0.0, 0.0, 1)  # kinds 0-8 exist
    with pytest.raises(ValueError, match="invalid geometry"):
        k.conv2d(x, w, None, None, y, conv._replace(m=3, groups=2), 0, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="w holds 18 elements"):
        k.conv2d(x, w, None, None, y, conv, 0, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="microseconds"):
        k.set_spin(-1.0)


def _pool_model(op, x_shape, **attrs):
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9).SerializeToString()


# (op, input shape, attributes): every kind of window the compiled pool takes
POOLS = [
    ("MaxPool", (1, 64, 56, 56), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 16, 35, 35), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ("MaxPool", (1, 8, 20, 21), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("MaxPool", (1, 8, 17, 17), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", (1, 6, 15, 16), {"kernel_shape": [3, 2], "strides": [1, 3], "dilations": [2, 1], "pads": [2, 0, 1, 1]}),
    ("MaxPool", (1, 5, 13, 13), {"kernel_shape": [5, 5], "strides": [1, 1], "auto_pad": "SAME_UPPER"}),
    ("MaxPool", (2, 4, 30), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ("AveragePool", (1, 32, 28, 28), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 32, 28, 28), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                                      "count_include_pad": 1}),
    ("AveragePool", (1, 8, 19, 19), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", (1, 8, 14, 14), {"kernel_shape": [7, 7], "strides": [7, 7]}),
    ("AveragePool", (1, 3, 9, 11), {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 2],
                                    "count_include_pad": 1}),
]


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op, x_shape, attrs", POOLS, ids=[f"{p[0]}-{'x'.join(map(str, p[1]))}-{i}"
                                                          for i, p in enumerate(POOLS)])
def test_pools_match_the_numpy_paths_and_onnxruntime(op, x_shape, attrs, threads, request, monkeypatch):
    model = _pool_model(op, x_shape, **attrs)
    x = np.random.default_rng(5).standard_normal(x_shape).astype(np.float32)
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = run(model, {"x": x}, threads)
    assert counting.calls == {"pool2d": 1}
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    request.getfixturevalue("numpy_kernels")
    np.testing.assert_allclose(got, run(model, {"x": x}, threads), rtol=1e-6, atol=1e-6)


@needs_native
def test_max_pooling_propagates_nan_and_keeps_infinities():
    """A window holding NaN gives NaN (numpy's maximum, and the numpy path); -inf and
    inf are values like any other."""
    model = _pool_model("MaxPool", (1, 3, 8, 8), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    x[0, 0, 3, 3] = np.nan
    x[0, 1] = -np.inf
    x[0, 2, 5, 6] = np.inf
    got = run(model, {"x": x}, 1)
    assert np.isnan(got[0, 0, 1:3, 1:3]).all() and np.isnan(got[0, 0]).sum() == 4
    assert (got[0, 1] == -np.inf).all()
    assert got[0, 2, 3, 3] == np.inf and got[0, 2, 2, 3] == np.inf and np.isinf(got[0, 2]).sum() == 2
    assert not np.isnan(got[0, 1:]).any()
    np.testing.assert_array_equal(got, run(model, {"x": x}, 2))


@needs_native
def test_pool_workers_sleep_as_soon_as_no_run_is_in_progress():
    """Between the kernels of a run the workers spin (set_spin: far longer than this
    test waits); when the run ends they go to sleep at once."""
    x_shape, w_shape, attrs = GEOMETRIES[4]
    model = conv_model(x_shape, w_shape, **attrs)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones(x_shape, np.float32)}
    native.K.set_spin(5e6)  # five seconds
    try:
        for _ in range(3):
            sess.run(None, feeds)
        info = native.K.pool_info()
        assert info["workers"] >= 1
        deadline = time.monotonic() + 10.0  # a loaded machine may keep a worker off its core a while
        while native.K.pool_info()["sleeping"] < info["workers"] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert native.K.pool_info()["sleeping"] == info["workers"]
        # a job wakes them again: every chunk still runs exactly once
        assert native.K.pool_selftest(500, 2, 100) == [1] * 500
    finally:
        native.K.set_spin(200.0)


def _unary_model(op, shape, dtype=TensorProto.FLOAT, domain="", **attrs):
    opsets = [helper.make_opsetid("", 24)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain, **attrs)], "g",
                              [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def _extremes(shape, seed=0):
    """Normal values, then the float32 extremes the activations must get right: NaN,
    both infinities, zeros of both signs, the arguments where exp over- and underflows."""
    x = (np.random.default_rng(seed).standard_normal(shape) * 8).astype(np.float32)
    flat = x.reshape(-1)
    flat[:12] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7, -88.7, 89.0, -104.5, 1e-30, -1e-30, 200.0]
    return x


def _swish(alpha):
    """x / (1 + exp(t)) in float64 for t = -alpha * x rounded to float32, as both
    paths compute it: exp magnifies that rounding (by up to |t| ulp), the same for both."""
    return lambda x: x / (1 + np.exp((x.astype(np.float32) * np.float32(-alpha)).astype(np.float64)))


# (op, domain, attributes, the formula in float64)
UNARY = [
    ("Relu", "", {}, lambda x: np.maximum(x, 0)),
    ("Sigmoid", "", {}, lambda x: 1 / (1 + np.exp(-x))),
    ("QuickGelu", "com.microsoft", {"alpha": 1.702}, _swish(1.702)),
    ("Swish", "", {"alpha": 0.5}, _swish(0.5)),
    ("Gelu", "", {}, None),  # the float64 erf form, against the scipy-free formula below
]


def _gelu64(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2.0)))


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op, domain, attrs, formula", UNARY, ids=[u[0] for u in UNARY])
def test_activations_match_the_numpy_paths_to_a_few_ulp(op, domain, attrs, formula, threads, request, monkeypatch):
    shape = (3, 50, 700)  # several chunks of the pool
    x = _extremes(shape)
    model = _unary_model(op, shape, domain=domain, **attrs)
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = run(model, {"x": x}, threads)
    assert counting.calls == {"unary": 1}
    with np.errstate(all="ignore"):
        exact = (formula or _gelu64)(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(exact))
    both = np.isfinite(exact)
    assert np.array_equal(got[~both & ~np.isnan(exact)], exact[~both & ~np.isnan(exact)])  # the infinities
    spacing = np.spacing(np.abs(exact[both])).astype(np.float64)
    err = np.abs(got[both].astype(np.float64) - exact[both])
    if formula is None:
        # Gelu's fitted erf is the numpy path's too: 5.7e-7 of the exact function,
        # scaled by |x| / 2, or 4 ulp
        assert (err <= np.maximum(5.7e-7 * np.abs(x[both]) / 2 + 1e-7, 4 * spacing)).all()
    else:
        # within 4 units in the last place, or 1e-37 absolutely where the result is
        # subnormal (the compiled exp flushes none, the divisions round there)
        assert (err <= np.maximum(4 * spacing, 1e-37)).all(), float((err / spacing).max())
    request.getfixturevalue("numpy_kernels")
    numpy_path = run(model, {"x": x}, threads)
    # Gelu: numpy's tanh and the compiled one (through exp) each within a few ulp of 1
    np.testing.assert_allclose(got, numpy_path, rtol=1e-6, atol=1e-37 if formula else 1e-6)


@needs_native
def test_small_and_non_float32_activations_stay_on_the_numpy_paths(monkeypatch):
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    small = np.linspace(-5, 5, native.UNARY_MIN - 1, dtype=np.float32)
    assert native.unary(small, native.RELU) is None
    assert native.unary(small, native.CLIP, -1.0, 2.0) is None
    assert native.unary(small.astype(np.float64).repeat(2), native.SIGMOID) is None
    assert native.unary(np.ones((100, 100), np.float32)[:, ::2], native.RELU) is None
    assert native.unary(np.ones((0,), np.float32), native.SIGMOID) is None
    assert not counting.calls
    big = np.linspace(-5, 5, native.UNARY_MIN, dtype=np.float32)
    np.testing.assert_array_equal(native.unary(big, native.CLIP, -1.0, 2.0), np.clip(big, -1.0, 2.0))
    assert counting.calls == {"unary": 1}


def test_small_multi_pass_activations_run_compiled(monkeypatch):
    # numpy spends several ufunc calls on a Sigmoid, SiLU or Gelu: a tensor of one
    # value (Silero VAD's decoder output) goes to the one compiled call
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    x = np.array([[-3.0, -0.5, 0.0, 0.25, 7.5]], np.float32)
    got = native.unary(x, native.SIGMOID)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    one = native.unary(np.array([[[0.3]]], np.float32), native.SWISH, 1.0)
    np.testing.assert_allclose(one, 0.3 / (1 + np.exp(-0.3)), rtol=1e-6)
    assert counting.calls == {"unary": 2}


def _bn_model(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    params = [rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c), rng.random(c) + 0.1]
    inits = [numpy_helper.from_array(p.astype(dtype), n) for p, n in zip(params, "sbmv")]
    graph = helper.make_graph([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                                epsilon=1e-3)], "g",
                              [helper.make_tensor_value_info("x", et, list(shape))],
                              [helper.make_tensor_value_info("y", et, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8).SerializeToString()


@needs_native
@pytest.mark.parametrize("shape, dtype", [((2, 64, 28, 28), np.float32), ((1, 8, 300, 300), np.float32),
                                          ((5, 40), np.float32), ((3, 6, 10, 11), np.float64),
                                          ((1, 3, 2, 5, 7), np.float32)])
def test_batch_normalization_matches_the_numpy_path_and_onnxruntime(shape, dtype, request, monkeypatch):
    model = _bn_model(shape, dtype)
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = [run(model, {"x": x}, t, ort.GraphOptimizationLevel.ORT_DISABLE_ALL) for t in (1, 2)]
    assert counting.calls == {"channel_affine": 2}
    tol = 1e-5 if dtype == np.float32 else 1e-12
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for g in got:
        assert g.dtype == dtype
        np.testing.assert_allclose(g, want, rtol=tol, atol=tol)
    # the compiled x * a + s is one fused multiply-add, numpy's two roundings: one ulp apart
    request.getfixturevalue("numpy_kernels")
    ulp = np.finfo(dtype).eps
    np.testing.assert_allclose(got[0], run(model, {"x": x}, 1, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                               rtol=2 * ulp, atol=2 * ulp)


@needs_native
def test_provider_info_says_the_compiled_kernels_are_loaded():
    cpu = {p["name"]: p for p in ort.get_provider_info()}["CPUExecutionProvider"]
    assert cpu["details"].startswith("compiled kernels loaded, products through ")


def test_onnxrt_cpu_native_0_runs_the_numpy_paths_and_says_so():
    """With the compiled kernels turned off the provider still runs everything, and
    ``get_provider_info`` says why they are not in use."""
    import subprocess
    import sys

    code = (
        "import numpy as np, onnxrt\n"
        "from onnxrt_cpu import native\n"
        "from tests.cpu.conv_cases import GEOMETRIES, conv_model\n"
        "x_shape, w_shape, attrs = GEOMETRIES[13]\n"
        "m = conv_model(x_shape, w_shape, act='Relu', **attrs)\n"
        "x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)\n"
        "y = onnxrt.InferenceSession(m, providers=['cpu']).run(None, {'x': x})[0]\n"
        "np.save(__import__('sys').argv[1], y)\n"
        "cpu = {p['name']: p for p in onnxrt.get_provider_info()}['CPUExecutionProvider']\n"
        "print(native.K is None, cpu['details'])\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "y.npy")
        env = dict(os.environ, ONNXRT_CPU_NATIVE="0")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        r = subprocess.run([sys.executable, "-c", code, out], env=env, cwd=root, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "True numpy kernels only: compiled kernels turned off by ONNXRT_CPU_NATIVE=0"
        x_shape, w_shape, attrs = GEOMETRIES[13]
        model = conv_model(x_shape, w_shape, act="Relu", **attrs)
        x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
        want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(np.load(out), want, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_bias_gelu_adds_its_bias_in_the_same_pass(threads, request, monkeypatch):
    shape = (2, 64, 384)  # rows of 384: several rows a chunk, several chunks
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    b = rng.standard_normal(384).astype(np.float32)
    graph = helper.make_graph([helper.make_node("BiasGelu", ["x", "b"], ["y"], domain="com.microsoft")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [384])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8).SerializeToString()
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = run(model, {"x": x, "b": b}, threads)
    assert counting.calls == {"unary": 1}
    exact = _gelu64(x.astype(np.float64) + b)
    np.testing.assert_allclose(got, exact, rtol=0, atol=5.7e-7 * 12 / 2 + 1e-6)
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x, "b": b})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    request.getfixturevalue("numpy_kernels")
    np.testing.assert_allclose(got, run(model, {"x": x, "b": b}, threads), rtol=1e-6, atol=1e-6)


# (attributes, extra inputs, batch, query length, heads, kv heads, head size, past, lengths, first prompt)
GQA_CASES = [
    ({}, (), 3, 1, 6, 2, 32, 7, [8, 3, 6], False),
    ({"do_rotary": 1}, ("rotary",), 8, 1, 4, 2, 16, 31, [32] * 8, False),
    ({"do_rotary": 1, "rotary_interleaved": 1}, ("rotary_partial",), 2, 1, 4, 4, 32, 5, [6, 4], False),
    ({"local_window_size": 3}, (), 1, 3, 4, 2, 16, 6, [9], False),
    ({"local_window_size": 3}, (), 2, 3, 4, 2, 16, 6, [9, 7], False),  # onnxruntime: batch 1 only
    ({"causal": 0, "do_rotary": 1}, ("rotary",), 1, 2, 2, 1, 16, 4, [6], False),
    ({"do_rotary": 1, "local_window_size": 2}, ("rotary",), 3, 5, 4, 2, 32, 0, [5, 3, 5], True),
]


@needs_native
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("case", GQA_CASES, ids=[f"gqa{i}" for i in range(len(GQA_CASES))])
def test_group_query_attention_matches_the_numpy_path_and_onnxruntime(case, packed, request, monkeypatch):
    from tests.cpu import test_group_query_attention as G

    attrs, extras, b, s, n, nkv, h, past, lengths, first = case
    rng = np.random.default_rng(4)
    total = s if first else max(lengths)
    feeds = G._feeds(rng, b, s, n, nkv, h, lengths, total, past=past, packed=packed)
    G._extras(rng, feeds, extras, n, h, s, total)
    model = G._model(feeds, dict(attrs, num_heads=n, kv_num_heads=nkv))
    given = {k: v for k, v in feeds.items() if v is not None}
    for threads in (1, 2):
        counting = Counting(native.K)
        monkeypatch.setattr(native, "K", counting)
        got = _run_all(model, given, threads)
        assert counting.calls == {"gqa": 1}
        if b == 1 or s == 1 or first:  # onnxruntime refuses a batch's chunk after a past
            G._assert_valid_rows_match(got, G._run(model, feeds, "ort"), lengths, s, first)
    request.getfixturevalue("numpy_kernels")
    G._assert_valid_rows_match(got, _run_all(model, given), lengths, s, first, tol=2e-6)


def _run_all(model, feeds, threads=1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _norm_model(node, feeds, shape, out_names, inits) -> bytes:
    """One normalization node over float32 feeds of ``shape`` (opsets 17 and com.microsoft 1)."""
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(shape))
                                            for k in feeds],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in out_names], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8).SerializeToString()


def _count_row_norms(model, feeds, monkeypatch):
    """The model's outputs at 1 and 2 threads, each run one call of the compiled row_norm."""
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = [_run_all(model, feeds, t) for t in (1, 2)]
    assert counting.calls == {"row_norm": 2}
    return got


@needs_native
@pytest.mark.parametrize("form, outs", [("plain", 1), ("plain", 3), ("plain 2 axes", 3), ("skip", 1),
                                        ("skip bias", 4), ("skip bias", 2), ("skip no beta", 3)])
@pytest.mark.parametrize("h", [7, 40, 100, 768])
def test_layer_normalizations_match_onnxruntime_and_the_numpy_path(form, outs, h, request, monkeypatch):
    rng = np.random.default_rng(h)
    shape = (3, 5, h)
    # an offset far from zero: the variance is taken about the mean, not as E[x^2] - mean^2
    feeds = {"x": (rng.standard_normal(shape) * 3 + 40).astype(np.float32)}
    g, b = rng.standard_normal(h).astype(np.float32), rng.standard_normal(h).astype(np.float32)
    if form.startswith("plain"):
        axis = 1 if form == "plain 2 axes" else -1
        if axis == 1:
            g, b = rng.standard_normal(shape[1:]).astype(np.float32), rng.standard_normal(shape[1:]).astype(np.float32)
        inits = [numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")]
        out_names = ["y", "mean", "inv"][:outs]
        node = helper.make_node("LayerNormalization", ["x", "g", "b"], out_names, axis=axis, epsilon=1e-5)
    else:
        feeds["s"] = rng.standard_normal(shape).astype(np.float32)
        inits = [numpy_helper.from_array(g, "g")]
        names = ["x", "s", "g"]
        if form != "skip no beta":
            inits.append(numpy_helper.from_array(b, "b"))
            names.append("b")
        if form == "skip bias":
            inits.append(numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "bias"))
            names.append("bias")
        out_names = ["y", "mean", "inv", "sum"][:outs]
        node = helper.make_node("SkipLayerNormalization", names, out_names, domain="com.microsoft", epsilon=1e-6)
    model = _norm_model(node, feeds, shape, out_names, inits)
    got = _count_row_norms(model, feeds, monkeypatch)
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for gt in got:
        assert [a.shape for a in gt] == [w.shape for w in want]
        for a, w in zip(gt, want):
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)
    # the float64 reference: the compiled kernel's sums are as close as float32 allows
    s = feeds["x"].astype(np.float64) + (feeds["s"] if "s" in feeds else 0)
    if form == "skip bias":
        s += numpy_helper.to_array(inits[-1])
    rows = s.reshape(shape[0], -1) if form == "plain 2 axes" else s
    centred = rows - rows.mean(-1, keepdims=True)
    exact = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + helper.get_node_attr_value(node, "epsilon"))
    exact = exact.reshape(shape) * (g if form == "plain 2 axes" else g.astype(np.float64))
    if form != "skip no beta":
        exact += b
    np.testing.assert_allclose(got[0][0], exact, rtol=1e-5, atol=1e-5)
    # the numpy path takes its row sums by a BLAS product, a few float32 roundings
    # further from the float64 reference (2.7e-5 at 3840 values about 40)
    request.getfixturevalue("numpy_kernels")
    for a, w in zip(got[0], _run_all(model, feeds)):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


@needs_native
def test_pair_lookup_reads_the_table_at_every_pair_of_codes():
    rng = np.random.default_rng(4)
    table = rng.integers(-128, 128, 65536).astype(np.int8)
    for a_type, b_type in [(np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)]:
        codes = np.arange(256, dtype=np.uint8)
        a, b = (g.copy().view(t) for g, t in zip(np.meshgrid(codes, codes, indexing="ij"), (a_type, b_type)))
        got = native.pair_lookup(a, b, table)
        assert got.dtype == np.int8 and got.shape == (256, 256)
        np.testing.assert_array_equal(got.reshape(-1), table)  # a << 8 | b walks the table in order
    big = rng.integers(0, 256, (3, 70001)).astype(np.uint8)  # several chunks of the pool
    other = rng.integers(0, 256, (3, 70001)).astype(np.uint8)
    np.testing.assert_array_equal(native.pair_lookup(big, other, table),
                                  table[(big.astype(np.intp) << 8) | other])
    assert native.pair_lookup(big, other[:, :-1].copy(), table) is None  # shapes differ
    assert native.pair_lookup(big, other, table[:100]) is None
    assert native.pair_lookup(big[:, ::2], other[:, ::2], table) is None  # not contiguous
    with pytest.raises(ValueError, match="pair_lookup: b holds 5 elements, at least 6"):
        native.K.pair_lookup(np.zeros(6, np.uint8), np.zeros(5, np.uint8), table, np.zeros(6, np.int8), 1)
    with pytest.raises(ValueError, match="pair_lookup: a holds 6 values, b 7 and out 6"):
        native.K.pair_lookup(np.zeros(6, np.uint8), np.zeros(7, np.uint8), table, np.zeros(6, np.int8), 1)
    with pytest.raises(TypeError, match="pair_lookup: b"):
        native.K.pair_lookup(np.zeros(6, np.uint8), np.zeros(6, np.float32), table, np.zeros(6, np.int8), 1)


@needs_native
def test_float_range_is_numpys_min_and_max():
    rng = np.random.default_rng(2)
    for n in (1, 5, 31, 32, 33, 64, 65, 1000, 8195):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
        assert native.float_range(x) == (float(x.min()), float(x.max())), n
        x[rng.integers(n)] = np.nan
        lo, hi = native.float_range(x)
        assert np.isnan(lo) and np.isnan(hi), n
    x = np.array([1.0, -np.inf, 3.0] * 20, np.float32)
    assert native.float_range(x) == (-np.inf, 3.0)
    assert native.float_range(np.array([np.inf] * 40, np.float32)) == (np.inf, np.inf)
    assert native.float_range(np.zeros((3, 4), np.float32)[:, ::2]) is None  # not contiguous
    assert native.float_range(np.zeros(0, np.float32)) is None
    with pytest.raises(TypeError, match="float_range: x"):
        native.K.float_range(np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="float_range: x"):
        native.K.float_range(np.zeros(0, np.float32))


@needs_native
def test_row_norm_refuses_what_it_cannot_take():
    x = np.ones((4, 8), np.float32)
    g = np.ones(8, np.float32)
    assert native.layer_norm(x.astype(np.float64), g, None, 1e-5) is None
    assert native.layer_norm(x, np.ones(7, np.float32), None, 1e-5) is None
    assert native.layer_norm(x, g, np.ones(7, np.float32), 1e-5) is None
    assert native.layer_norm(x, g, None, 1e-5, skip=np.ones((1, 8), np.float32)) is None  # broadcast skip
    assert native.layer_norm(x[:, ::2], g[:4], None, 1e-5) is None  # not contiguous
    y = np.empty_like(x)
    with pytest.raises(ValueError, match="not rows of 3"):
        native.K.row_norm(x, None, None, np.ones(3, np.float32), None, y, None, None, None, 1e-5, True, 1)
    with pytest.raises(ValueError, match="a bias needs a skip"):
        native.K.row_norm(x, None, g, g, None, y, None, None, None, 1e-5, True, 1)
    with pytest.raises(TypeError, match="row_norm: beta"):
        native.K.row_norm(x, None, None, g, g.astype(np.float64), y, None, None, None, 1e-5, True, 1)


@needs_native
def test_group_query_attention_kernel_refuses_positions_outside_its_buffers():
    b, s, n, nkv, h, cache = 1, 1, 2, 1, 4, 4
    q = np.zeros((b, s, n * h), np.float32)
    kv = np.zeros((b, s, nkv * h), np.float32)
    present = np.empty((b, nkv, cache, h), np.float32)
    out = np.empty((b, s, n, h), np.float32)
    offsets = (0, 0, 0, n * h, nkv * h, nkv * h)
    dims = (b, s, n, nkv, h, 0, cache, 0, 0, 0, -1, 1, 0.5)
    for starts, lengths in (([5], [4]), ([0], [9]), ([-1], [1])):
        with pytest.raises(ValueError, match="outside the cache"):
            native.K.gqa(q, kv, kv, offsets, None, None, present, present.copy(), out, None, None,
                         np.array(starts, np.int64), np.array(lengths, np.int64), dims, 1)
    with pytest.raises(ValueError, match="holds 4 elements"):
        native.K.gqa(q[..., :4], kv, kv, offsets, None, None, present, present.copy(), out, None, None,
                     np.array([0], np.int64), np.array([1], np.int64), dims, 1)


@needs_native
@pytest.mark.parametrize("skip, bias, outs", [(False, False, 1), (False, False, 2), (True, False, 1),
                                              (True, True, 4), (True, False, 3)])
def test_rms_normalizations_match_onnxruntime_and_the_numpy_path(skip, bias, outs, request, monkeypatch):
    rng = np.random.default_rng(8)
    shape, h = (3, 7, 96), 96
    feeds = {"x": (rng.standard_normal(shape) * 3).astype(np.float32)}
    inits = [numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "g")]
    if skip:
        feeds["s"] = rng.standard_normal(shape).astype(np.float32)
        names = ["x", "s", "g"] + (["b"] if bias else [])
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "b"))
        out_names = ["y", "mean", "inv", "sum"][:outs]
        node = helper.make_node("SkipSimplifiedLayerNormalization", names, out_names, domain="com.microsoft",
                                epsilon=1e-6)
    else:
        out_names = ["y", "inv"][:outs]
        node = helper.make_node("SimplifiedLayerNormalization", ["x", "g"], out_names, axis=-1, epsilon=1e-6)
    model = _norm_model(node, feeds, shape, out_names, inits)
    got = _count_row_norms(model, feeds, monkeypatch)
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g in got:
        for a, b, name in zip(g, want, out_names):
            if name != "mean":  # onnxruntime leaves the simplified form's mean unspecified
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    request.getfixturevalue("numpy_kernels")
    for a, b in zip(got[0], _run_all(model, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@needs_native
def test_int8_rounding_of_a_is_the_numpy_paths_bit_for_bit():
    from onnxrt_cpu.kernels.contrib_matmul_nbits import _int8_blocks

    rng = np.random.default_rng(9)
    for k, block in ((64, 32), (100, 32), (4096, 128), (70, 16), (31, 64)):
        a = (rng.standard_normal((5, k)) * 3).astype(np.float32)
        a[0, :block] = 0  # an all-zero block: codes 0
        a[1, :3] = [np.float32(1e-40), -np.float32(1e-40), 2.5]  # subnormals beside a normal value
        a[2, 1] = np.float32(3e38)  # near float32's range
        np.testing.assert_array_equal(native.int8_blocks(a, block), _int8_blocks(a, block))
