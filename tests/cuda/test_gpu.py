"""The CUDA provider on a real GPU. Every test here skips with the provider's reason
when no usable GPU is present (``CUDAExecutionProvider.is_available()``).

- every op the provider claims passes its ONNX node tests on the GPU;
- the real CNN and transformer models put at least 90% of their compute nodes on CUDA
  and match onnxruntime on the CPU; a float16 copy runs in float16;
- CuPy arrays go in and out through IOBinding without a host round trip;
- eight threads share one session;
- provider options (memory limit, allocation strategy, no pool, no fusion) take effect.

The ONNX conformance suite (``tests/conformance``) runs every available provider, so on
a GPU machine it also runs ``["CUDAExecutionProvider", "CPUExecutionProvider"]``.
"""

import threading
import warnings

import numpy as np
import onnxrt as ort
import pytest

from ..models.test_real_models import DATA, _feeds
from .gpu import CUDA, REASON, needs_gpu
from .test_kernels_on_host import MIN_SHARE, MODELS, model_share

pytestmark = needs_gpu

if REASON is None:  # pragma: no cover - needs a GPU
    import cupy as cp
    from onnxrt.testing import NodeRefused, provider_node_tests, run_provider_node_test
    from onnxrt_cuda import CUDAExecutionProvider
    from onnxrt_cuda.codegen import OPS

    CLAIMED = {op for _, op, _ in CUDAExecutionProvider.kernel_registry().ops()} | set(OPS)
    CASES = provider_node_tests(CUDA, sorted(CLAIMED))
else:
    CASES = []

#: share of the claimed-op node tests that must run wholly on CUDA
MIN_ON_DEVICE = 0.75


def _so(level=None):
    so = ort.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    return so


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_claimed_op_runs_on_cuda(case):  # pragma: no cover - needs a GPU
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            run_provider_node_test(case, CUDA, _so(ort.GraphOptimizationLevel.ORT_DISABLE_ALL))
        except NodeRefused as e:
            pytest.skip(f"refused with a reason: {e}")


def test_most_claimed_op_tests_really_run_on_cuda():  # pragma: no cover - needs a GPU
    ran, refused = [], {}
    for case in CASES:
        sess = ort.InferenceSession(case.model, _so(ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                                    providers=[CUDA, "CPUExecutionProvider"])
        off = [a for a in sess.get_provider_assignment() if a["provider"] != CUDA]
        if off:
            assert all(a["reason"] for a in off)
            refused[case.name] = off[0]["reason"]
        else:
            ran.append(case.name)
    assert len(CASES) >= 300
    assert len(ran) >= MIN_ON_DEVICE * len(CASES), f"{len(ran)}/{len(CASES)} ran on CUDA; refused: {refused}"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("batch", [1, 2])
def test_real_model_on_cuda_matches_onnxruntime(name, batch):  # pragma: no cover - needs a GPU
    rt = pytest.importorskip("onnxruntime")
    shapes, int_high = MODELS[name]
    shapes = {**shapes, "batch": batch}
    path = str(DATA / f"{name}.onnx")
    sess = ort.InferenceSession(path, providers=[CUDA, "CPUExecutionProvider"])
    on, total, off = model_share(sess.get_provider_assignment(), CUDA)
    assert on >= MIN_SHARE * total, f"{on}/{total} on CUDA; off: {off}"
    ref = rt.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = _feeds(sess, shapes, int_high)
    for g, w in zip(sess.run(None, feeds), ref.run(None, feeds)):
        assert isinstance(g, np.ndarray) and g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


def test_float16_model_runs_in_float16(tmp_path):  # pragma: no cover - needs a GPU
    import onnx
    from onnxconverter_common import float16

    m16 = float16.convert_float_to_float16(onnx.load(str(DATA / "resnet_small.onnx")), keep_io_types=False)
    path = tmp_path / "resnet16.onnx"
    onnx.save(m16, str(path))
    sess = ort.InferenceSession(str(path), providers=[CUDA, "CPUExecutionProvider"])
    on, total, off = model_share(sess.get_provider_assignment(), CUDA)
    assert on == total, off
    ref = ort.InferenceSession(str(DATA / "resnet_small.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    (y16,) = sess.run(None, {"image": x.astype(np.float16)})
    (y32,) = ref.run(None, {"image": x})
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float32), y32, rtol=5e-2, atol=5e-2)


def _counting(monkeypatch):
    from onnxrt_cuda.device import CUDADevice

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


def test_cupy_arrays_in_and_out_without_host_copies(monkeypatch):  # pragma: no cover - needs a GPU
    path = str(DATA / "resnet_small.onnx")
    counts = _counting(monkeypatch)  # before the session: its copy steps bind these methods
    sess = ort.InferenceSession(path, providers=[CUDA, "CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = sess.run(None, {"image": x})[0]
    xd = cp.asarray(x)
    counts.update(to_host=0, from_host=0)
    b = sess.io_binding()
    b.bind_ortvalue_input("image", ort.OrtValue.from_device_array(xd))
    b.bind_output(sess.get_outputs()[0].name, "cuda", 0)
    sess.run_with_iobinding(b)
    assert counts == {"to_host": 0, "from_host": 0}
    (out,) = b.get_outputs()
    assert out.device_name() == "cuda" and isinstance(out.device_array(), cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(out.device_array()), want, rtol=1e-5, atol=1e-6)
    # raw device pointers, as onnxruntime's bind_input takes them
    y = cp.empty(want.shape, dtype=cp.float32)
    b2 = sess.io_binding()
    b2.bind_input("image", "cuda", 0, np.float32, list(x.shape), xd.data.ptr)
    b2.bind_output(sess.get_outputs()[0].name, "cuda", 0, np.float32, list(want.shape), y.data.ptr)
    sess.run_with_iobinding(b2)
    np.testing.assert_allclose(cp.asnumpy(y), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b2.copy_outputs_to_cpu()[0], want, rtol=1e-5, atol=1e-6)


def test_ortvalue_from_numpy_on_cuda():  # pragma: no cover - needs a GPU
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ov = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    assert ov.device_name() == "cuda" and isinstance(ov.device_array(), cp.ndarray)
    assert ov.data_ptr() == ov.device_array().data.ptr
    np.testing.assert_array_equal(ov.numpy(), x)


def test_eight_threads_share_one_session():  # pragma: no cover - needs a GPU
    path = str(DATA / "bert_tiny.onnx")
    sess = ort.InferenceSession(path, providers=[CUDA, "CPUExecutionProvider"])
    feeds = [_feeds(sess, {"batch": 2, "sequence": 5 + i % 3}, 2, seed=i) for i in range(8)]
    want = [sess.run(None, f) for f in feeds]
    errors, results = [], {}

    def work(i):
        try:
            for _ in range(10):
                results[i] = sess.run(None, feeds[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(8):
        for g, w in zip(results[i], want[i]):
            np.testing.assert_array_equal(g, w)


def test_memory_limit_is_honoured():  # pragma: no cover - needs a GPU
    path = str(DATA / "resnet_small.onnx")
    sess = ort.InferenceSession(path, providers=[(CUDA, {"gpu_mem_limit": 1 << 20}), "CPUExecutionProvider"])
    x = np.zeros((64, 3, 64, 64), np.float32)
    with pytest.raises(ort.Fail, match="(?i)out of memory"):
        sess.run(None, {"image": x})


@pytest.mark.parametrize("opts", [{"arena_extend_strategy": "kSameAsRequested"}, {"use_memory_pool": False},
                                  {"enable_fusion": False}])
def test_options_give_the_same_answers(opts):  # pragma: no cover - needs a GPU
    path = str(DATA / "mobilenet_small.onnx")
    sess = ort.InferenceSession(path, providers=[(CUDA, opts), "CPUExecutionProvider"])
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((2, 3, 64, 64)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"image": x})[0], ref.run(None, {"image": x})[0], rtol=1e-3, atol=1e-4)
    if opts.get("enable_fusion") is False:
        assert sess._built.fused == []
