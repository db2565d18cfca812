"""The OpenCL provider's one-line report (``details()``, shown by ``onnxrt providers``):
the device sessions get by default, and never an exception, whatever is missing."""

import os
import subprocess
import sys
import textwrap

import pytest

import onnxrt as ort

pytest.importorskip("onnxrt_opencl")
from onnxrt_opencl import OpenCLExecutionProvider, provider  # noqa: E402

OCL = "OpenCLExecutionProvider"


def _isolated(code: str, env_extra: dict) -> str:
    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(OpenCLExecutionProvider.is_available() is not None, reason="no OpenCL device")
def test_names_the_default_device_and_its_platform():
    import pyopencl as cl

    from onnxrt_opencl.runtime import select_device

    dev = select_device()  # the device a session without options gets
    info = next(p for p in ort.get_provider_info() if p["name"] == OCL)
    assert info["details"] == OpenCLExecutionProvider.details()
    assert info["details"].startswith(f"device {dev.name.strip()} ({dev.platform.name.strip()}, ")
    kind = "GPU" if dev.type & cl.device_type.GPU else "CPU" if dev.type & cl.device_type.CPU else None
    if kind:
        assert kind in info["details"]


def test_empty_when_unavailable(monkeypatch):
    monkeypatch.setitem(provider._availability, "default", "no OpenCL platform found")
    assert OpenCLExecutionProvider.details() == ""


def test_a_driver_error_is_reported_not_raised(monkeypatch):
    from onnxrt_opencl import runtime

    def broken(*args, **kwargs):
        raise RuntimeError("clGetDeviceInfo failed")

    monkeypatch.setitem(provider._availability, "default", None)
    monkeypatch.setattr(runtime, "get_runtime", broken)
    assert OpenCLExecutionProvider.details() == "device unknown (RuntimeError: clGetDeviceInfo failed)"


def test_missing_pyopencl_lists_the_provider_with_empty_details():
    out = _isolated("""
        import sys
        sys.modules["pyopencl"] = None  # what an absent package looks like to import
        import onnxrt
        info = {p["name"]: p for p in onnxrt.get_provider_info()}["OpenCLExecutionProvider"]
        print(info["available"], repr(info["details"]))
    """, {})
    assert out == "False ''"


def test_no_platform_lists_the_provider_with_empty_details(tmp_path):
    # an empty vendor directory hides every ICD from the loader
    out = _isolated("""
        import onnxrt
        info = {p["name"]: p for p in onnxrt.get_provider_info()}["OpenCLExecutionProvider"]
        print(info["available"], repr(info["details"]))
    """, {"OCL_ICD_VENDORS": str(tmp_path), "OCL_ICD_FILENAMES": ""})
    assert out == "False ''"
