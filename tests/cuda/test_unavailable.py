"""Without a usable GPU the CUDA provider is installed, unavailable with a reason, and harmless."""

import types

import numpy as np
import onnxrt as ort
import pytest
from onnxrt_cuda import CUDAExecutionProvider, runtime
from onnxrt_cuda.provider import parse_options

from .gpu import CUDA, REASON

no_gpu = pytest.mark.skipif(REASON is None, reason="a GPU is usable here")


@pytest.fixture
def fresh_availability():
    runtime.reset_availability()
    yield
    runtime.reset_availability()


def test_listed_with_its_reason():
    info = {p["name"]: p for p in ort.get_provider_info()}
    cuda = info[CUDA]
    assert cuda["aliases"] == ("cuda",) and cuda["distribution"] == "onnxrt-cuda"
    assert cuda["available"] is (REASON is None)
    assert cuda["reason"] == (REASON or "")
    assert (CUDA in ort.get_available_providers()) is (REASON is None)
    assert CUDA in ort.get_all_providers()


@no_gpu
def test_reason_names_the_missing_piece():
    # CuPy missing, no device, or a driver older than CuPy's CUDA runtime
    assert any(w in REASON for w in ("CuPy", "CUDA device", "driver")), REASON


@no_gpu
@pytest.mark.parametrize("name", [CUDA, "cuda"])
def test_asking_by_name_is_epfail_with_the_reason(name, mlp_model):
    with pytest.raises(ort.EPFail, match="unavailable") as e:
        ort.InferenceSession(mlp_model, providers=[name, "CPUExecutionProvider"])
    assert REASON in str(e.value)


@no_gpu
def test_fallback_runs_on_the_cpu(mlp_model):
    so = ort.SessionOptions()
    so.allow_provider_fallback = True
    sess = ort.InferenceSession(mlp_model, so, providers=[CUDA, "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    x = np.ones((2, 4), np.float32)
    want = ort.InferenceSession(mlp_model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


@no_gpu
def test_default_sessions_do_not_use_it(mlp_model):
    assert CUDA not in ort.InferenceSession(mlp_model).get_providers()
    assert ort.get_device() == "CPU"


@no_gpu
def test_device_ortvalue_is_epfail():
    with pytest.raises(ort.EPFail, match="CUDAExecutionProvider"):
        ort.OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32), "cuda", 0)


def test_unknown_and_bad_options_are_errors():
    with pytest.raises(ort.InvalidArgument, match="unknown provider option 'cudnn_conv_algo_search'"):
        parse_options({"cudnn_conv_algo_search": "EXHAUSTIVE"})
    with pytest.raises(ort.InvalidArgument, match="arena_extend_strategy"):
        parse_options({"arena_extend_strategy": "kDoubling"})
    with pytest.raises(ort.InvalidArgument, match="gpu_mem_limit"):
        parse_options({"gpu_mem_limit": -1})
    with pytest.raises(ort.InvalidArgument, match="device_id"):
        parse_options({"device_id": "first"})
    with pytest.raises(ort.InvalidArgument, match="needs use_memory_pool"):
        parse_options({"gpu_mem_limit": 1 << 20, "use_memory_pool": False})


def test_options_convert_like_onnxruntime():
    o = parse_options({"device_id": "0", "gpu_mem_limit": "1073741824", "arena_extend_strategy": 1,
                       "use_memory_pool": "true", "enable_fusion": "0"})
    assert o == {"device_id": 0, "gpu_mem_limit": 1 << 30, "arena_extend_strategy": "kSameAsRequested",
                 "use_memory_pool": True, "enable_fusion": False}
    assert parse_options({})["arena_extend_strategy"] == "kNextPowerOfTwo"


@no_gpu
def test_unknown_option_in_a_session_is_an_error_before_availability(mlp_model):
    with pytest.raises(ort.InvalidArgument, match="unknown provider option"):
        CUDAExecutionProvider({"bogus": 1})


def test_cupy_missing_is_a_reason(monkeypatch, fresh_availability):
    def missing():
        raise ImportError("No module named 'cupy'")

    monkeypatch.setattr(runtime, "import_cupy", missing)
    why = CUDAExecutionProvider.is_available()
    assert "CuPy is not installed" in why and "onnxrt-cuda[cuda12]" in why


def _fake_cupy(count=None, error=None, driver=12040, rt_version=12080):
    class CUDARuntimeError(RuntimeError):
        pass

    def get_count():
        if error:
            raise CUDARuntimeError(error)
        return count

    rt = types.SimpleNamespace(getDeviceCount=get_count, driverGetVersion=lambda: driver,
                               runtimeGetVersion=lambda: rt_version)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt))


def test_no_device_is_a_reason(monkeypatch, fresh_availability):
    monkeypatch.setattr(runtime, "import_cupy", lambda: _fake_cupy(count=0))
    assert CUDAExecutionProvider.is_available() == "no CUDA device found (driver 12.4, runtime 12.8)"


def test_old_driver_is_a_reason_with_both_versions(monkeypatch, fresh_availability):
    monkeypatch.setattr(runtime, "import_cupy", lambda: _fake_cupy(
        error="cudaErrorInsufficientDriver: CUDA driver version is insufficient", driver=11080, rt_version=13000))
    why = CUDAExecutionProvider.is_available()
    assert "cudaErrorInsufficientDriver" in why and "driver 11.8, runtime 13.0" in why


def test_device_id_out_of_range_is_a_reason(monkeypatch, fresh_availability):
    monkeypatch.setattr(runtime, "import_cupy", lambda: _fake_cupy(count=1))
    assert runtime.availability(3) == "device_id 3 is out of range: 1 CUDA device(s) found"


def test_a_broken_check_never_crashes_the_host(monkeypatch, fresh_availability):
    def boom():
        raise OSError("libcudart.so.13: cannot open shared object file")

    monkeypatch.setattr(runtime, "import_cupy", boom)
    info = {p["name"]: p for p in ort.get_provider_info()}
    assert info[CUDA]["available"] is False and "libcudart" in info[CUDA]["reason"]
