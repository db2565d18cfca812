"""The OpenCL provider as a plugin: availability and its reasons, options, devices, memory.

Runs for real on whatever OpenCL device is installed (PoCL on CI); skipped with the
provider's own reason where there is none.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.errors import EPFail, Fail, InvalidArgument

from ..conftest import make_model

pytest.importorskip("onnxrt_opencl")
from onnxrt_opencl import OpenCLExecutionProvider  # noqa: E402

REASON = OpenCLExecutionProvider.is_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"OpenCL unavailable: {REASON}")
OCL = "OpenCLExecutionProvider"


def _relu_model(n=4):
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
    )


def _run_isolated(code: str, env_extra: dict) -> str:
    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_registered_and_available():
    assert OCL in ort.get_all_providers()
    assert OCL in ort.get_available_providers()
    info = next(p for p in ort.get_provider_info() if p["name"] == OCL)
    assert info["available"] and info["reason"] == "" and info["aliases"] == ("opencl",)
    assert info["distribution"] == "onnxrt-opencl"


def test_availability_is_checked_once_and_cached():
    from onnxrt_opencl import provider

    assert "default" in provider._availability
    before = dict(provider._availability)
    assert OpenCLExecutionProvider.is_available() is None
    assert provider._availability == before


def test_no_platform_makes_it_unavailable_with_the_reason(tmp_path):
    # an empty vendor directory hides every ICD from the loader
    code = """
        import onnxrt
        info = {p["name"]: p for p in onnxrt.get_provider_info()}["OpenCLExecutionProvider"]
        print(info["available"], "|", info["reason"])
        print("OpenCLExecutionProvider" in onnxrt.get_available_providers())
        try:
            onnxrt.InferenceSession
            from onnx import helper, TensorProto
            g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
            onnxrt.InferenceSession(m.SerializeToString(), providers=["opencl"])
        except onnxrt.EPFail as e:
            print("EPFail:", e)
        so = onnxrt.SessionOptions()
        so.allow_provider_fallback = True
        s = onnxrt.InferenceSession(m.SerializeToString(), so, providers=["opencl"])
        print(s.get_providers())
    """
    out = _run_isolated(code, {"OCL_ICD_VENDORS": str(tmp_path), "OCL_ICD_FILENAMES": ""}).splitlines()
    assert out[0].startswith("False |") and "no OpenCL platform" in out[0]
    assert out[1] == "False"
    assert out[2].startswith("EPFail:") and "unavailable" in out[2] and "no OpenCL platform" in out[2]
    assert out[3] == "['CPUExecutionProvider']"


def test_missing_pyopencl_makes_it_unavailable_not_a_crash():
    code = """
        import sys
        sys.modules["pyopencl"] = None  # what an absent package looks like to import
        import onnxrt
        info = {p["name"]: p for p in onnxrt.get_provider_info()}["OpenCLExecutionProvider"]
        print(info["available"], "|", info["reason"])
    """
    out = _run_isolated(code, {})
    assert out.startswith("False |") and "pyopencl cannot be imported" in out


def test_unknown_option_is_an_error():
    with pytest.raises(InvalidArgument, match="unknown provider option 'nonsense'.*device"):
        ort.InferenceSession(_relu_model().SerializeToString(), providers=[(OCL, {"nonsense": 1})])


@pytest.mark.parametrize("opt,match", [
    ({"platform": "no-such-platform"}, "no OpenCL platform whose name contains 'no-such-platform'"),
    ({"device": "no-such-device"}, "no OpenCL device whose name contains 'no-such-device'"),
    ({"platform": 99}, "platform index 99 is out of range"),
    ({"device": "7"}, "device index 7 is out of range"),
])
def test_nonexistent_platform_or_device_is_named(opt, match):
    with pytest.raises(InvalidArgument, match=match):
        ort.InferenceSession(_relu_model().SerializeToString(), providers=[(OCL, opt)])


def test_bad_option_values():
    for opt in ({"memory_limit": -1}, {"memory_limit": "lots"}, {"enable_fusion": "maybe"}):
        with pytest.raises(InvalidArgument, match="bad value"):
            ort.InferenceSession(_relu_model().SerializeToString(), providers=[(OCL, opt)])


def test_device_selected_by_index_and_by_name_substring():
    import pyopencl as cl

    dev = cl.get_platforms()[0].get_devices()[0]
    x = np.array([[-1, 2, -3, 4]], np.float32)
    for opts in ({"platform": 0, "device": 0}, {"platform": "0"}, {"device": dev.name.split()[0].lower()}):
        sess = ort.InferenceSession(_relu_model().SerializeToString(), providers=[(OCL, opts), "CPUExecutionProvider"])
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
        assert sess.get_provider_assignment()[0]["provider"] == OCL
        assert sess.get_provider_options()[OCL]["memory_limit"] == "0"


def test_alias_and_options_reported():
    sess = ort.InferenceSession(_relu_model().SerializeToString(), providers=["opencl", "cpu"])
    assert sess.get_providers() == [OCL, "CPUExecutionProvider"]
    assert set(sess.get_provider_options()[OCL]) == {"platform", "device", "memory_limit", "enable_fusion"}


def test_program_build_failure_is_an_ep_fail_with_the_log():
    from onnxrt_opencl.runtime import get_runtime

    rt = get_runtime()
    with pytest.raises(EPFail, match="build failed") as ei:
        rt.program("__kernel void broken(__global float *x) { x[0] = undefined_name; }")
    assert "undefined_name" in str(ei.value)


def test_probe_runs_a_trivial_kernel():
    from onnxrt_opencl.runtime import get_runtime, probe

    assert probe(get_runtime()) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, np.int8])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 3), (2, 3, 4)])
def test_device_round_trip(dtype, shape):
    sess = ort.InferenceSession(_relu_model().SerializeToString(), providers=[OCL])
    dev = sess._built.providers[0].device
    assert dev.kind == "opencl" and not dev.is_host
    a = np.asarray(np.arange(int(np.prod(shape))).reshape(shape) % 5).astype(dtype)
    d = dev.from_host(a)
    back = dev.to_host(d)
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)


def test_memory_limit_is_enforced_with_a_clear_error_and_the_session_survives():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, None])],
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=[(OCL, {"memory_limit": 64 * 1024}), "cpu"])
    big = np.ones((20000, 4), np.float32)  # 320 kB per value
    with pytest.raises(Fail, match=r"memory limit exceeded.*limit of 65536 bytes"):
        sess.run(None, {"x": big})
    small = np.array([[-1, 2, -3, 4]] * 3, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": small})[0], np.maximum(small, 0).T)


def test_pool_reuses_freed_buffers():
    from onnxrt_opencl.runtime import get_runtime

    rt = get_runtime()
    before = rt.bytes_in_use
    a = rt.empty((1000,), np.float32)
    assert rt.bytes_in_use >= before + 4000
    del a
    assert rt.bytes_in_use == before


def test_unsupported_dtype_falls_back_to_the_cpu_with_a_reason():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3])],
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=[OCL, "cpu"])
    # the CPU provider computes float16 Relu in float32 between Casts (float16_compute)
    (a,) = [r for r in sess.get_provider_assignment() if r["op_type"] == "Relu"]
    assert a["provider"] == "CPUExecutionProvider"
    assert "float16" in a["reason"] and OCL in a["reason"]
    x = np.array([-1, 0.5, 2], np.float16)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def test_shape_subgraphs_stay_on_the_cpu():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the shape arithmetic stays on the host
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("zero1", TensorProto.INT64, [1], [0]),
             helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=[OCL, "cpu"])
    where = {a["op_type"]: a for a in sess.get_provider_assignment()}
    for op in ("Shape", "Gather", "Unsqueeze", "Concat"):
        assert where[op]["provider"] == "CPUExecutionProvider", op
    assert "shape computation kept on the CPU" in where["Gather"]["reason"]
    assert where["Relu"]["provider"] == OCL and where["Reshape"]["provider"] == OCL
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0).reshape(5, -1))


def test_constants_are_uploaded_once():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 4], w.reshape(-1).tolist())],
    )
    from onnxrt_opencl.provider import OpenCLDevice

    uploads = []
    real = OpenCLDevice._upload

    def counted(self, value):
        uploads.append(value.shape)
        return real(self, value)

    OpenCLDevice._upload = counted
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=[OCL, "cpu"])
        at_creation = list(uploads)
        x = np.ones((3, 4), np.float32)
        for _ in range(3):
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + w)
    finally:
        OpenCLDevice._upload = real
    # w goes up once, while the session is built; each run uploads only its feed x
    assert at_creation == [(3, 4)]
    assert uploads == [(3, 4)] * 4
