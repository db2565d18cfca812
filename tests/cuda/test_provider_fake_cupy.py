"""The real CUDA provider end to end on a numpy-backed stand-in for CuPy.

Checks the plumbing no other test without a GPU reaches: availability, the device
(values stay on it between CUDA nodes; constants upload once), the per-thread streams,
the memory-pool options, the kernel wrappers, the fused kernels' dispatch, and IOBinding
with device-resident values through the provider's own device.
"""

import threading

import numpy as np
import onnxrt as ort
import pytest
from onnxrt.plugin.provider import ExecutionProvider
from onnxrt_cuda import CUDAExecutionProvider, raw, runtime
from onnxrt_cuda.codegen import EwProgram
from onnxrt_cuda.device import CUDADevice

from ..models.test_real_models import DATA, _feeds
from . import fake_cupy
from .test_kernels_on_host import model_share

CUDA = "CUDAExecutionProvider"


@pytest.fixture
def fake(monkeypatch):
    ns = fake_cupy.module()
    monkeypatch.setattr(runtime, "import_cupy", lambda: ns)
    # the fake's compiled raw kernels stay out of the cache a real GPU's share
    monkeypatch.setattr(raw, "_modules", {})
    source = EwProgram.source

    def remembering(self, dtypes):
        out = source(self, dtypes)
        fake_cupy._programs[out[2]] = self
        return out

    monkeypatch.setattr(EwProgram, "source", remembering)
    runtime.reset_availability()
    ExecutionProvider._registries.pop(CUDAExecutionProvider, None)
    fake_cupy.SOURCES.clear()
    import onnxrt.ortvalue as ov

    ov._devices.clear()
    try:
        yield ns
    finally:
        runtime.reset_availability()
        ExecutionProvider._registries.pop(CUDAExecutionProvider, None)
        ov._devices.clear()


def _counting(monkeypatch):
    counts = {"to_host": 0, "from_host": 0}
    to_host, from_host = CUDADevice.to_host, CUDADevice.from_host

    def th(self, v):
        counts["to_host"] += 1
        return to_host(self, v)

    def fh(self, v):
        if not self.holds(v):  # constants went up while the session was built
            counts["from_host"] += 1
        return from_host(self, v)

    monkeypatch.setattr(CUDADevice, "to_host", th)
    monkeypatch.setattr(CUDADevice, "from_host", fh)
    return counts


@pytest.mark.parametrize("name,shapes,int_high", [("resnet_small", {"batch": 2}, None),
                                                  ("mobilenet_small", {"batch": 1}, None),
                                                  ("bert_tiny", {"batch": 2, "sequence": 5}, 2)])
def test_models_run_through_the_provider(fake, name, shapes, int_high):
    assert CUDA in ort.get_available_providers()
    path = str(DATA / f"{name}.onnx")
    sess = ort.InferenceSession(path, providers=[CUDA, "CPUExecutionProvider"])
    on, total, off = model_share(sess.get_provider_assignment(), CUDA)
    assert on == total, off
    assert sess._built.fused
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = _feeds(sess, shapes, int_high)
    got, want = sess.run(None, feeds), ref.run(None, feeds)
    for g, w in zip(got, want):
        assert type(g) is np.ndarray, "outputs come back as host arrays"
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert fake_cupy.SOURCES, "fused groups ran as generated kernels"


def test_values_stay_on_the_device_between_cuda_nodes(fake, monkeypatch):
    counts = _counting(monkeypatch)  # before the session: its copy steps bind these methods
    sess = ort.InferenceSession(str(DATA / "resnet_small.onnx"), providers=[CUDA, "CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    sess.run(None, {"image": x})
    counts.update(to_host=0, from_host=0)
    sess.run(None, {"image": x})
    assert counts == {"to_host": 1, "from_host": 1}


def test_iobinding_device_values(fake, monkeypatch):
    counts = _counting(monkeypatch)
    sess = ort.InferenceSession(str(DATA / "resnet_small.onnx"), providers=[CUDA, "CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = sess.run(None, {"image": x})[0]
    xv = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    assert isinstance(xv.device_array(), fake_cupy.DeviceArray) and xv.device_name() == "cuda"
    out_name = sess.get_outputs()[0].name
    b = sess.io_binding()
    b.bind_ortvalue_input("image", xv)
    b.bind_output(out_name, "cuda", 0)
    counts.update(to_host=0, from_host=0)
    sess.run_with_iobinding(b)
    assert counts == {"to_host": 0, "from_host": 0}
    (out,) = b.get_outputs()
    assert out.device_name() == "cuda" and isinstance(out.device_array(), fake_cupy.DeviceArray)
    np.testing.assert_allclose(np.asarray(out.device_array()), want, rtol=1e-5, atol=1e-6)


def test_memory_pool_options(fake):
    p = CUDAExecutionProvider({"gpu_mem_limit": 1 << 20})
    assert p.pool.limit == 1 << 20
    p.scope.allocator(1000)
    assert p.pool.requests == [1024]  # kNextPowerOfTwo
    q = CUDAExecutionProvider({"arena_extend_strategy": "kSameAsRequested"})
    q.scope.allocator(1000)
    assert q.pool.requests == [1000] and q.pool.limit is None
    assert CUDAExecutionProvider({"use_memory_pool": False}).scope.allocator is None


def test_each_thread_has_its_own_stream(fake):
    p = CUDAExecutionProvider()
    streams = []

    def grab():
        streams.append(p.scope.stream())
        assert p.scope.stream() is streams[-1]

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # blocking streams: ordered with the legacy default stream the caller's own CuPy work uses
    assert len({id(s) for s in streams}) == 4 and not any(s.non_blocking for s in streams)


def test_concurrent_runs(fake):
    sess = ort.InferenceSession(str(DATA / "bert_tiny.onnx"), providers=[CUDA, "CPUExecutionProvider"])
    feeds = [_feeds(sess, {"batch": 1, "sequence": 4 + i}, 2, seed=i) for i in range(4)]
    want = [sess.run(None, f) for f in feeds]
    errors, got = [], {}

    def work(i):
        try:
            for _ in range(3):
                got[i] = sess.run(None, feeds[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(4):
        for g, w in zip(got[i], want[i]):
            np.testing.assert_array_equal(g, w)


def test_shapes_computed_on_the_cpu_are_not_uploaded(fake, monkeypatch):
    """A Reshape on CUDA reads its shape on the host: the shape computed by CPU nodes is
    handed over as it is (no upload and read back), and Shape of a device value copies no data."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Gather", ["s", "first"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["r", "target"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 12])],
                          [helper.make_tensor("first", TensorProto.INT64, [], [0]),
                           helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
                           helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    counts = {"to_host": 0}
    to_host = CUDADevice.to_host

    def counting(self, v):
        counts["to_host"] += 1
        return to_host(self, v)

    # before the session: its copy steps bind the method
    monkeypatch.setattr(CUDADevice, "to_host", counting)
    sess = ort.InferenceSession(model.SerializeToString(), providers=[CUDA, "CPUExecutionProvider"])
    prov = {a["node"]: a["provider"] for a in sess.get_provider_assignment()}
    assert prov["Relu_0"] == CUDA and prov["Reshape_5"] == CUDA and prov["Concat_4"] == "CPUExecutionProvider", prov
    copies = [st.node_name for st in sess._built.plan.steps if st.is_copy]
    assert "copy:target" not in copies and "copy:r" not in copies, copies
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(2, 12))
    assert counts["to_host"] == 1  # the output, and nothing else


def test_the_device_scope_is_entered_once_per_run(fake):
    """The plan makes the device, stream and pool current once per run, not once per node."""
    sess = ort.InferenceSession(str(DATA / "resnet_small.onnx"), providers=[CUDA, "CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = sess.run(None, {"image": x})[0]
    cuda_steps = sum(a["provider"] == CUDA for a in sess.get_provider_assignment())
    assert cuda_steps > 10
    fake_cupy._Ctx.log.clear()
    got = sess.run(None, {"image": x})[0]
    streams = [k for k, _ in fake_cupy._Ctx.log if k == "stream"]
    assert len(streams) == 1, f"the stream was made current {len(streams)} times in one run"
    np.testing.assert_array_equal(got, want)


def test_fused_branches_of_different_shapes(fake):
    """One scale applied to two tensors whose shapes do not broadcast together (as the
    expanded FlexAttention tests do to query and key) is one fused group with no single
    iteration space: it runs node by node, with the right answers."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Sqrt", ["d"], ["s"], name="sqrt"),
             helper.make_node("Div", ["q", "s"], ["qs"], name="div_q"),
             helper.make_node("Div", ["k", "s"], ["ks"], name="div_k")]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("d", f, []),
                                       helper.make_tensor_value_info("q", f, [2, 4, 8, 16]),
                                       helper.make_tensor_value_info("k", f, [2, 4, 6, 16])],
                          [helper.make_tensor_value_info("qs", f, [2, 4, 8, 16]),
                           helper.make_tensor_value_info("ks", f, [2, 4, 6, 16])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, so, providers=[CUDA, "CPUExecutionProvider"])
    assert sess._built.fused == [{"provider": CUDA, "nodes": ["sqrt", "div_q", "div_k"]}]
    rng = np.random.default_rng(0)
    d = np.float32(16.0)
    q = rng.standard_normal((2, 4, 8, 16)).astype(np.float32)
    k = rng.standard_normal((2, 4, 6, 16)).astype(np.float32)
    qs, ks = sess.run(None, {"d": np.array(d), "q": q, "k": k})
    np.testing.assert_allclose(qs, q / np.sqrt(d), rtol=1e-6)
    np.testing.assert_allclose(ks, k / np.sqrt(d), rtol=1e-6)


def _conv_reference(x, w, b, group, strides, dil, begin, end):
    """A direct 2-D convolution in float64 (the loops the kernels must agree with)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (begin[0], end[0]), (begin[1], end[1])))
    oh = (h + begin[0] + end[0] - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (wd + begin[1] + end[1] - (kw - 1) * dil[1] - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for o in range(m):
        g = o // mg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dil[0]:i * dil[0] + (oh - 1) * strides[0] + 1:strides[0],
                           j * dil[1]:j * dil[1] + (ow - 1) * strides[1] + 1:strides[1]]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j].astype(np.float64))
        if b is not None:
            y[:, o] += b[o]
    return y


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n,c,m,k,group,strides,dil,begin,end,bias", [
    (2, 3, 8, 3, 1, [2, 2], [1, 1], [1, 1], [1, 1], True),
    (3, 4, 6, 3, 2, [1, 2], [2, 1], [2, 0], [1, 1], True),
    (1, 5, 7, 2, 1, [1, 1], [1, 1], [0, 1], [1, 0], False),
    (2, 6, 4, 1, 1, [1, 1], [1, 1], [0, 0], [0, 0], True),
    (1, 6, 4, 1, 1, [1, 1], [1, 1], [0, 0], [0, 0], False),
    (4, 3, 5, 3, 1, [1, 1], [1, 1], [1, 1], [1, 1], True),
])
def test_im2col_convolution_paths(fake, monkeypatch, dtype, n, c, m, k, group, strides, dil, begin, end, bias):
    """``raw.conv2d_im2col`` around its kernel (run by the fake as its contract says):
    the bias as a row of ones, groups, 1x1 products, float16's one 2-D product, and
    batches split into chunks of images (the chunk limit set to one image)."""
    rng = np.random.default_rng(n * 100 + c * 10 + m)
    x = rng.standard_normal((n, c, 9, 8)).astype(dtype)
    w = (rng.standard_normal((m, c // group, k, k)) * 0.5).astype(dtype)
    b = rng.standard_normal(m).astype(dtype) if bias else None
    want = _conv_reference(x, w, b, group, strides, dil, begin, end)
    tol = 1e-5 if dtype == np.float32 else 2e-2
    for limit in (raw.IM2COL_BYTES, 1):  # one chunk, then one image per chunk
        monkeypatch.setattr(raw, "IM2COL_BYTES", limit)
        got = raw.conv2d_im2col(fake, fake.asarray(x), fake.asarray(w), None if b is None else fake.asarray(b),
                                group, strides, dil, begin, end)
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_row_kernels(fake, dtype):
    """``raw.layer_norm_rows`` and ``raw.softmax_rows`` around their kernels."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 10)).astype(dtype)
    sc, bi = rng.standard_normal(10).astype(dtype), rng.standard_normal(10).astype(dtype)
    y, mean, inv = raw.layer_norm_rows(fake, fake.asarray(x), fake.asarray(sc), fake.asarray(bi), 1e-5, 10)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    istd = 1 / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    assert y.dtype == dtype and mean.dtype == np.float32 and inv.dtype == np.float32
    np.testing.assert_allclose(np.asarray(y, np.float64), (x64 - mu) * istd * sc + bi, rtol=tol, atol=tol)
    np.testing.assert_allclose(mean, mu.reshape(-1), rtol=tol, atol=tol)
    np.testing.assert_allclose(inv, istd.reshape(-1), rtol=tol, atol=tol)
    for log in (False, True):
        got = raw.softmax_rows(fake, fake.asarray(x), 10, log)
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        want = np.log(e / e.sum(-1, keepdims=True)) if log else e / e.sum(-1, keepdims=True)
        assert got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def test_the_weight_with_its_bias_column_is_built_once(fake, monkeypatch):
    """A convolution with a constant weight and bias builds the weight with the bias as
    one more column on its first run only (it was a concatenation on every run)."""
    calls = []
    concatenate = fake.concatenate

    def counting(arrays, *a, **k):
        calls.append(len(arrays))
        return concatenate(arrays, *a, **k)

    monkeypatch.setattr(fake, "concatenate", counting)
    sess = ort.InferenceSession(str(DATA / "resnet_small.onnx"), providers=[CUDA, "CPUExecutionProvider"])
    ref = ort.InferenceSession(str(DATA / "resnet_small.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = ref.run(None, {"image": x})[0]
    np.testing.assert_allclose(sess.run(None, {"image": x})[0], want, rtol=1e-4, atol=1e-5)
    first = len(calls)
    assert first > 0, "the model has convolutions whose bias rides in the product"
    np.testing.assert_allclose(sess.run(None, {"image": x})[0], want, rtol=1e-4, atol=1e-5)
    assert len(calls) == first
