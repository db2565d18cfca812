"""onnxruntime's API names and behaviours that onnxrt provides, checked on their own
(and against onnxruntime where it is installed), without the suite in ../shared."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt import environment
from tests.conftest import make_model

try:
    import onnxruntime
except ImportError:  # pragma: no cover - onnxruntime is a test dependency here
    onnxruntime = None


def _square_model():
    return make_model([helper.make_node("Mul", ["X", "X"], ["Y"])],
                      [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])],
                      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])])


@pytest.fixture
def square(tmp_path):
    p = tmp_path / "square.onnx"
    onnx.save(_square_model(), p)
    return str(p)


X = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)


# -- devices, memory infos, arena settings --------------------------------------------------------

def test_ort_device_numbers_are_onnxruntimes():
    cpu, cuda = ort.OrtDevice.make("cpu", 0), ort.OrtDevice.make("cuda", 1)
    assert (cpu.device_type(), cpu.device_vendor_id(), cpu.device_mem_type(), cpu.device_id()) == (0, 0, 0, 0)
    assert (cuda.device_type(), cuda.device_vendor_id(), cuda.device_id()) == (1, 0x10DE, 1)
    assert ort.OrtDevice.cpu() == 0 and ort.OrtDevice.cuda() == 1 and ort.OrtDevice.dml() == 4
    with pytest.raises(ort.InvalidArgument, match="unsupported device name 'tpu'"):
        ort.OrtDevice.make("tpu", 0)
    if onnxruntime is not None:
        ref = onnxruntime.OrtDevice.make("cuda", 1)
        assert (ref.device_type(), ref.device_vendor_id()) == (cuda.device_type(), cuda.device_vendor_id())
        for name in ("OrtDeviceVendorId", "OrtAllocatorType", "OrtMemType", "OrtDeviceMemoryType"):
            assert {k: int(v) for k, v in getattr(onnxruntime, name).__members__.items()} == \
                {k: int(v) for k, v in getattr(ort, name).__members__.items()}, name


def test_memory_info_and_arena_cfg():
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    assert (info.name, info.device_id, info.mem_type, info.device_mem_type) == ("Cpu", 0, 0, 0)
    v2 = ort.OrtMemoryInfo.create_v2("T", ort.OrtMemoryInfoDeviceType.GPU, 0x10DE, 1,
                                     ort.OrtDeviceMemoryType.HOST_ACCESSIBLE, 64,
                                     ort.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
    assert (v2.device_vendor_id, v2.device_id, v2.device_mem_type, v2.alignment) == (0x10DE, 1, 5, 64)
    cfg = ort.OrtArenaCfg(8, 0, 4, 2)
    assert (cfg.max_mem, cfg.arena_extend_strategy, cfg.initial_chunk_size_bytes, cfg.max_dead_bytes_per_chunk,
            cfg.initial_growth_chunk_size_bytes) == (8, 0, 4, 2, -1)
    assert ort.OrtArenaCfg({"max_power_of_two_extend_bytes": 17}).max_power_of_two_extend_bytes == 17
    with pytest.raises(ort.InvalidArgument, match="unknown OrtArenaCfg key 'max'"):
        ort.OrtArenaCfg({"max": 1})
    ort.create_and_register_allocator(info, cfg)
    from onnxrt.devices import registered_allocators

    assert ("CPUExecutionProvider", info, cfg) in registered_allocators()
    with pytest.raises(ort.InvalidArgument, match="expected an OrtMemoryInfo"):
        ort.create_and_register_allocator("Cpu", None)


# -- process-wide functions -------------------------------------------------------------------------

def test_build_info_version_and_telemetry():
    assert ort.get_version_string() == ort.__version__
    assert "Build Info" in ort.get_build_info() and "CPUExecutionProvider" in ort.get_build_info()
    ort.disable_telemetry_events()
    ort.enable_telemetry_events()


def test_get_all_providers_lists_cpu_last():
    names = ort.get_all_providers()
    assert names[-1] == "CPUExecutionProvider"
    assert sorted(names) == sorted(ort.plugin.discovery.provider_registry().names())


def test_unknown_provider_is_also_a_runtime_error(square):
    sess = ort.InferenceSession(square, providers=["CPUExecutionProvider"])
    with pytest.raises(RuntimeError, match="Unknown Provider Type: InvalidProvider") as e:
        sess.set_providers(["InvalidProvider"])
    assert isinstance(e.value, ort.InvalidArgument)


def test_global_thread_pools_follow_onnxruntimes_rule(square, monkeypatch):
    monkeypatch.setattr(environment, "_global_pools", None)
    shared = ort.SessionOptions()
    shared.use_per_session_threads = False
    with pytest.raises(ort.Fail, match="call set_global_thread_pool_sizes"):
        ort.InferenceSession(square, shared)
    ort.set_global_thread_pool_sizes(1, 1)
    y, = ort.InferenceSession(square, shared).run(None, {"X": X})
    np.testing.assert_array_equal(y, X * X)
    with pytest.raises(RuntimeError, match="use_per_session_threads = False"):
        ort.InferenceSession(square)
    with pytest.raises(ort.InvalidArgument, match="non-negative int"):
        ort.set_global_thread_pool_sizes(-1, 0)


def test_logger_callback_receives_onnxrt_records():
    import logging

    got = []
    log = logging.getLogger("onnxrt")
    level = log.level  # another test may have raised the default severity: warnings need 2
    ort.set_default_logger_severity(2)
    ort.set_default_logger_callback(lambda *a: got.append(a))
    try:
        log.warning("hello %s", "there")
    finally:
        ort.set_default_logger_callback(None)
        log.setLevel(level)
    assert got and got[-1][0] == 2 and got[-1][4] == "hello there"
    with pytest.raises(ort.InvalidArgument, match="must be callable"):
        ort.set_default_logger_callback(3)


# -- OrtValue ------------------------------------------------------------------------------------------

def test_ortvalue_types_sizes_and_array_protocol():
    v = ort.OrtValue.ortvalue_from_numpy(X)
    assert v.element_type() == TensorProto.FLOAT and v.tensor_size_in_bytes() == 24
    a = np.asarray(v)
    assert a.ctypes.data == v.data_ptr()  # no copy
    assert np.asarray(v, dtype=np.float64).dtype == np.float64
    h = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(4, np.uint16), TensorProto.BFLOAT16)
    assert h.element_type() == TensorProto.BFLOAT16 and h.data_type() == "tensor(bfloat16)"
    with pytest.raises(ort.InvalidArgument, match="element sizes differ"):
        ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(4, np.float32), TensorProto.BFLOAT16)
    z = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], TensorProto.INT64)
    assert z.shape() == [2, 3] and z.element_type() == TensorProto.INT64
    z.update_inplace(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert z.numpy()[1, 2] == 5


def test_dlpack_round_trips_without_a_copy():
    v = ort.OrtValue.ortvalue_from_numpy(X)
    assert v.__dlpack_device__() == (1, 0)
    for source in (v.__dlpack__(), v, X):  # a capsule (device read from it), an OrtValue, a numpy array
        w = ort.OrtValue.from_dlpack(source)
        np.testing.assert_array_equal(w.numpy(), X)
        assert w.data_ptr() == v.data_ptr()
    b = ort.OrtValue.from_dlpack(ort.OrtValue.ortvalue_from_numpy(np.array([True, False])))
    assert b.numpy().dtype == np.bool_
    from onnxrt.ortvalue import _capsule_device

    assert _capsule_device(np.arange(3).__dlpack__()) == ("cpu", 0)
    versioned = X.__dlpack__(max_version=(1, 0))
    assert ort.OrtValue.from_dlpack(versioned).data_ptr() == X.ctypes.data
    with pytest.raises(ort.InvalidArgument, match="not an unconsumed DLPack capsule"):
        ort.OrtValue.from_dlpack(versioned)  # numpy consumed it
    with pytest.raises(ort.InvalidArgument, match="DLPack capsule or an object with __dlpack__"):
        ort.OrtValue.from_dlpack([1, 2])


def test_binding_by_onnx_type_number_and_refusing_string_buffers(square):
    sess = ort.InferenceSession(square)
    out = np.zeros((3, 2), np.float32)
    b = sess.io_binding()
    b.bind_input("X", "cpu", 0, TensorProto.FLOAT, [3, 2], X.ctypes.data)
    b.bind_output("Y", ort.OrtDevice.make("cpu", 0), 0, TensorProto.FLOAT, [3, 2], out.ctypes.data)
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(out, X * X)
    for t in (TensorProto.STRING, np.dtype("U1"), np.dtype(object)):
        with pytest.raises(RuntimeError, match="Only binding non-string Tensors"):
            b.bind_input("X", "cpu", 0, t, [1], X.ctypes.data)


# -- sessions --------------------------------------------------------------------------------------

def test_list_and_void_feeds_convert_as_onnxruntime_converts_them(square):
    y, = ort.InferenceSession(square).run(None, {"X": X.tolist()})
    np.testing.assert_array_equal(y, X * X)
    m = make_model([helper.make_node("Identity", ["s"], ["t"])],
                   [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
                   [helper.make_tensor_value_info("t", TensorProto.STRING, [2])])
    sess = ort.InferenceSession(m.SerializeToString())
    for feed in (["ab", "cd"], np.array([b"ab", b"cd"], dtype=np.void)):
        t, = sess.run(None, {"s": feed})
        assert t.tolist() == ["ab", "cd"]


def test_missing_input_message_has_onnxruntimes_text(tmp_path):
    m = make_model([helper.make_node("Add", ["a", "b"], ["c"])],
                   [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "ab"],
                   [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])])
    with pytest.raises(ValueError, match=r"Required inputs \(\['b'\]\) are missing from input feed \(\['a'\]\)"):
        ort.InferenceSession(m.SerializeToString()).run(None, {"a": np.ones(1, np.float32)})


def test_config_entry_missing_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="SessionOptions does not have configuration with key: K"):
        ort.SessionOptions().get_session_config_entry("K")
    with pytest.raises(RuntimeError, match="RunOptions does not have configuration with key: K"):
        ort.RunOptions().get_run_config_entry("K")


def test_session_options_from_the_model(tmp_path, monkeypatch):
    m = _square_model()
    cfg = {"session_options": {"intra_op_num_threads": 2, "graph_optimization_level": 1}}
    helper.set_model_props(m, {"ort_config": json.dumps(cfg)})
    data = m.SerializeToString()
    monkeypatch.delenv("ORT_LOAD_CONFIG_FROM_MODEL", raising=False)
    so = ort.SessionOptions()
    assert ort.InferenceSession(data, so).get_session_options().intra_op_num_threads == 0
    got = ort.InferenceSession(data, so, read_config_from_model=1).get_session_options()
    assert (got.intra_op_num_threads, got.graph_optimization_level) == (2, 1)
    assert so.intra_op_num_threads == 0  # the caller's options are not changed
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    assert ort.InferenceSession(data).get_session_options().intra_op_num_threads == 2
    helper.set_model_props(m, {"ort_config": json.dumps({"session_options": {"optimized_model_filepath": "/x"}})})
    with pytest.raises(ort.InvalidGraph, match="which a model may not set"):
        ort.InferenceSession(m.SerializeToString())
    helper.set_model_props(m, {"ort_config": "{not json"})
    with pytest.raises(ort.InvalidGraph, match="not valid JSON"):
        ort.InferenceSession(m.SerializeToString())


def test_free_dimension_overrides_show_in_get_inputs():
    m = make_model([helper.make_node("Abs", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C", 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C", 5])])
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_name("N", 4)
    so.add_free_dimension_override_by_name("C", 6)
    sess = ort.InferenceSession(m.SerializeToString(), so)
    assert sess.get_inputs()[0].shape == [4, 6, 5]
    assert ort.InferenceSession(m.SerializeToString()).get_inputs()[0].shape == ["N", "C", 5]


def test_run_async_calls_back_with_outputs_and_errors(square):
    sess = ort.InferenceSession(square)
    done, got = threading.Event(), []

    def callback(res, data, err):
        got.append((res, data, err))
        done.set()

    sess.run_async(["Y"], {"X": X}, callback, "tag")
    assert done.wait(10)
    (res, data, err), = got
    assert err == "" and data == "tag"
    np.testing.assert_array_equal(res[0], X * X)
    done.clear()
    got.clear()
    sess.run_async(["Y"], {"X": X[:1]}, callback, None)
    assert done.wait(10)
    assert got[0][0] == [] and "InvalidArgument" in got[0][2]


def test_memory_infos_and_graph_assignment(square):
    sess = ort.InferenceSession(square)
    assert [i.name for i in sess.get_input_memory_infos()] == ["Cpu"]
    assert len(sess.get_output_memory_infos()) == 1 and sess.get_input_epdevices() == [None]
    with pytest.raises(ort.Fail, match="session.record_ep_graph_assignment_info"):
        sess.get_provider_graph_assignment_info()
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    subs = ort.InferenceSession(square, so).get_provider_graph_assignment_info()
    assert [(s.ep_name, [(n.domain, n.op_type) for n in s.get_nodes()]) for s in subs] == \
        [("CPUExecutionProvider", [("", "Mul")])]


def test_outputs_view_the_runs_buffer(square):
    y, = ort.InferenceSession(square).run(None, {"X": X})
    assert y.base is not None and not np.shares_memory(y, X)


# -- sparse tensors ------------------------------------------------------------------------------

def test_sparse_tensor_views_and_dense_form():
    st = ort.SparseTensor.sparse_coo_from_numpy([3, 3], np.array([1.0, 2.0], np.float32),
                                                np.array([1, 5], np.int64), ort.OrtDevice.make("cpu", 0))
    assert st.format() == ort.OrtSparseFormat.ORT_SPARSE_COO and st.data_type() == "sparse_tensor(float)"
    assert not st.values().flags.writeable and not st.as_coo_view().indices().flags.writeable
    np.testing.assert_array_equal(st.to_dense(), [[0, 1, 0], [0, 0, 2], [0, 0, 0]])
    csr = ort.SparseTensor.sparse_csr_from_numpy([2, 3], np.array([4.0], np.float32), np.array([2], np.int64),
                                                 np.array([0, 0, 1], np.int64))
    np.testing.assert_array_equal(csr.to_dense(), [[0, 0, 0], [0, 0, 4]])
    with pytest.raises(ort.InvalidArgument, match="not COO"):
        csr.as_coo_view()
    with pytest.raises(RuntimeError, match="on the host"):
        st.to_cuda(ort.OrtDevice.make("cuda", 0))
    with pytest.raises(ort.InvalidArgument, match="do not fit 2 values"):
        ort.SparseTensor.sparse_coo_from_numpy([3, 3], np.ones(2, np.float32), np.array([1], np.int64))


def test_sparse_inputs_outputs_and_constants_run():
    vals = numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "v")
    idx = numpy_helper.from_array(np.array([0, 3], np.int64), "i")
    const = helper.make_node("Constant", [], ["s"], sparse_value=helper.make_sparse_tensor(vals, idx, [2, 2]))
    out = helper.make_value_info("s", helper.make_sparse_tensor_type_proto(TensorProto.FLOAT, [2, 2]))
    g = helper.make_graph([const], "g", [], [out])
    sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                                  ir_version=9).SerializeToString())
    assert sess.get_outputs()[0].type == "sparse_tensor(float)"
    ov, = sess.run_with_ort_values(None, {})
    st = ov.as_sparse_tensor()
    assert st.dense_shape() == [2, 2] and st.values().tolist() == [5.0, 7.0]
    assert st.as_coo_view().indices().tolist() == [0, 3]
    # a sparse input through com.microsoft.SparseToDenseMatMul
    a = helper.make_value_info("A", helper.make_sparse_tensor_type_proto(TensorProto.FLOAT, [2, 2]))
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2])
    g = helper.make_graph([helper.make_node("SparseToDenseMatMul", ["A", "B"], ["Y"], domain="com.microsoft")],
                          "g", [a, b], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("com.microsoft", 1)], ir_version=9)
    sess = ort.InferenceSession(m.SerializeToString())
    assert sess.get_inputs()[0].type == "sparse_tensor(float)"
    B = np.arange(4, dtype=np.float32).reshape(2, 2)
    ys, = sess.run_with_ort_values(["Y"], {"A": ort.OrtValue.ort_value_from_sparse_tensor(st),
                                           "B": ort.OrtValue.ortvalue_from_numpy(B)})
    np.testing.assert_allclose(ys.numpy(), st.to_dense() @ B)
    with pytest.raises(ort.InvalidArgument, match="is a sparse tensor"):
        sess.run(None, {"A": np.eye(2, dtype=np.float32), "B": B})


# -- LoRA adapters -----------------------------------------------------------------------------------

def test_adapter_files_round_trip_and_feed_runs(tmp_path):
    path = str(tmp_path / "a.onnx_adapter")
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(3)
    fmt.set_model_version(2)
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    fmt.set_parameters({"w": ort.OrtValue.ortvalue_from_numpy(w), "k": np.arange(4, dtype=np.int64)})
    fmt.export_adapter(path)
    back = ort.AdapterFormat.read_adapter(path)
    assert (back.get_adapter_version(), back.get_model_version()) == (3, 2)
    np.testing.assert_array_equal(back.get_parameters()["w"].numpy(), w)
    if onnxruntime is not None:  # onnxruntime reads the file onnxrt wrote
        ref = onnxruntime.AdapterFormat.read_adapter(path)
        np.testing.assert_array_equal(ref.get_parameters()["w"].numpy(), w)
    bad = ort.AdapterFormat()
    bad.set_parameters({"s": np.array(["x"], dtype=object)})
    with pytest.raises(ort.InvalidArgument, match="STRING"):
        bad.export_adapter(str(tmp_path / "s.onnx_adapter"))
    assert not (tmp_path / "s.onnx_adapter").exists()
    # x @ w with w an overridable initializer: the adapter's w replaces it
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3]),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                   [numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")])
    sess = ort.InferenceSession(m.SerializeToString())
    x = np.ones((1, 3), np.float32)
    lora = ort.LoraAdapter()
    lora.Load(path)
    ro = ort.RunOptions()
    ro.add_active_adapter(lora)
    with pytest.raises(ort.InvalidArgument, match="unknown input 'k'"):  # a parameter the model lacks
        sess.run(None, {"x": x}, ro)
    fmt.set_parameters({"w": w})
    fmt.export_adapter(path)
    lora.Load(path)
    ro = ort.RunOptions()
    ro.add_active_adapter(lora)
    np.testing.assert_array_equal(sess.run(None, {"x": x}, ro)[0], x @ w)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.zeros((1, 2)))
    with pytest.raises(ort.InvalidGraph, match="not an onnxruntime adapter file"):
        lora.Load(_write(tmp_path / "junk", b"12345678"))


def _write(p, data: bytes) -> str:
    p.write_bytes(data)
    return str(p)


# -- backend allowlist ------------------------------------------------------------------------------

def test_backend_refuses_options_that_write_files(square, tmp_path):
    from onnxrt import backend

    for kw in ({"optimized_model_filepath": str(tmp_path / "o.onnx")}, {"enable_profiling": True},
               {"profile_file_prefix": str(tmp_path / "p")}):
        with pytest.raises(RuntimeError, match="not permitted"):
            backend.prepare(square, **kw)
    with pytest.raises(RuntimeError, match="not permitted"):
        backend.run(square, [X], terminate=True)
    assert not os.listdir(tmp_path) or os.listdir(tmp_path) == ["square.onnx"]
    y, = backend.run(square, [X], graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                     only_execute_path_to_fetches=True, not_an_option=1)
    np.testing.assert_array_equal(y, X * X)


# -- external data: symlinks, in-memory files, saving -------------------------------------------------

def _external_model(location: str):
    t = helper.make_tensor("w", TensorProto.FLOAT, [4], np.arange(4, dtype=np.float32))
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    return make_model([helper.make_node("Add", ["x", "w"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [t])


@pytest.mark.parametrize("data_dir, ok", [("blobs", True), ("blobs/sub", True), ("elsewhere", False)])
def test_symlinked_model_and_data_the_hugging_face_way(tmp_path, data_dir, ok):
    (tmp_path / "blobs").mkdir()
    (tmp_path / data_dir).mkdir(parents=True, exist_ok=True)
    snap = tmp_path / "snapshots" / "rev"
    snap.mkdir(parents=True)
    onnx.save(_external_model("data.bin"), tmp_path / "blobs" / "m")
    (tmp_path / data_dir / "d").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink(tmp_path / "blobs" / "m", snap / "model.onnx")
    os.symlink(tmp_path / data_dir / "d", snap / "data.bin")
    if ok:
        y, = ort.InferenceSession(str(snap / "model.onnx")).run(None, {"x": np.ones(4, np.float32)})
        np.testing.assert_array_equal(y, np.arange(4) + 1)
    else:
        with pytest.raises(ort.InvalidGraph, match="External data path validation failed"):
            ort.InferenceSession(str(snap / "model.onnx"))


def test_symlinked_folder_on_the_way_is_still_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "d.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink(tmp_path / "real", tmp_path / "link")
    onnx.save(_external_model("link/d.bin"), tmp_path / "m.onnx")
    with pytest.raises(ort.InvalidGraph, match="goes through a symlink"):
        ort.InferenceSession(str(tmp_path / "m.onnx"))


def test_external_data_supplied_in_memory(tmp_path):
    data = _external_model("not_on_disk.bin").SerializeToString()
    so = ort.SessionOptions()
    so.add_external_initializers_from_files_in_memory(["not_on_disk.bin"], [np.full(4, 2, np.float32).tobytes()],
                                                      [16])
    y, = ort.InferenceSession(data, so).run(None, {"x": np.zeros(4, np.float32)})
    np.testing.assert_array_equal(y, [2, 2, 2, 2])
    so = ort.SessionOptions()
    so.add_external_initializers(["w"], [ort.OrtValue.ortvalue_from_numpy(np.full(4, 3, np.float32))])
    y, = ort.InferenceSession(data, so).run(None, {"x": np.zeros(4, np.float32)})
    np.testing.assert_array_equal(y, [3, 3, 3, 3])
    so = ort.SessionOptions()
    so.add_external_initializers(["nope"], [np.zeros(1)])
    with pytest.raises(ort.InvalidArgument, match="no initializer 'nope'"):
        ort.InferenceSession(data, so)


def test_optimized_model_saved_with_external_initializers(tmp_path):
    big = numpy_helper.from_array(np.arange(64, dtype=np.float32), "big")
    m = make_model([helper.make_node("Add", ["x", "big"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])], [big])
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.bin")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "100")
    ort.InferenceSession(m.SerializeToString(), so)
    assert (tmp_path / "opt.bin").stat().st_size == 256
    y, = ort.InferenceSession(str(tmp_path / "opt.onnx")).run(None, {"x": np.zeros(64, np.float32)})
    np.testing.assert_array_equal(y, np.arange(64))


# -- ModelCompiler -------------------------------------------------------------------------------------

def test_model_compiler_writes_the_model_at_the_chosen_level(tmp_path, square):
    out = tmp_path / "c.onnx"
    ort.ModelCompiler(ort.SessionOptions(), square, flags=ort.OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS
                      ).compile_to_file(str(out))
    y, = ort.InferenceSession(str(out)).run(None, {"X": X})
    np.testing.assert_array_equal(y, X * X)
    with pytest.raises(ort.Fail, match="exists already"):
        ort.ModelCompiler(ort.SessionOptions(), square,
                          flags=ort.OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS).compile_to_file(str(out))
    with pytest.raises(ort.Fail, match="Unable to compile any nodes"):
        ort.ModelCompiler(ort.SessionOptions(), square,
                          flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED).compile_to_bytes()

    def boom(_):
        raise ValueError("my writer")

    with pytest.raises(ort.Fail, match="my writer"):
        ort.ModelCompiler(ort.SessionOptions(), square).compile_to_stream(boom)
    seen = []

    def place(name, value, info):
        seen.append((name, value.tensor_size_in_bytes(), info))
        return ort.OrtExternalInitializerInfo(tmp_path / "w.bin", 0, 16)

    m = _external_model("data.bin")
    (tmp_path / "data.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    onnx.save(m, tmp_path / "ext.onnx")
    ort.ModelCompiler(ort.SessionOptions(), str(tmp_path / "ext.onnx"),
                      get_initializer_location_func=place).compile_to_file(str(tmp_path / "c2.onnx"))
    (name, size, info), = seen
    assert (name, size, info.file_offset, info.byte_size) == ("w", 16, 0, 16)
    loc = {e.key: e.value for e in onnx.load(tmp_path / "c2.onnx", load_external_data=False).graph.initializer[0]
           .external_data}
    assert loc["location"] == "w.bin"


def test_castlike_with_known_type_becomes_cast(tmp_path):
    m = make_model([helper.make_node("CastLike", ["x", "like"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])],
                   [numpy_helper.from_array(np.zeros(1, np.float64), "like")])
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "o.onnx")
    y, = ort.InferenceSession(m.SerializeToString(), so).run(None, {"x": np.array([1.5, 2.5], np.float32)})
    assert y.dtype == np.float64 and y.tolist() == [1.5, 2.5]
    node, = onnx.load(str(tmp_path / "o.onnx")).graph.node
    assert node.op_type == "Cast" and helper.get_attribute_value(node.attribute[0]) == TensorProto.DOUBLE


def test_sparse_constant_in_a_subgraph_and_scaled_sparse_matmul():
    vals = numpy_helper.from_array(np.array([2.0], np.float32), "v")
    idx = numpy_helper.from_array(np.array([1], np.int64), "i")
    const = helper.make_node("Constant", [], ["c"], sparse_value=helper.make_sparse_tensor(vals, idx, [2]))
    then = helper.make_graph([const], "then", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Constant", [], ["d"], value=numpy_helper.from_array(
        np.zeros(2, np.float32)))], "else", [], [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2])])
    m = make_model([helper.make_node("If", ["b"], ["y"], then_branch=then, else_branch=other)],
                   [helper.make_tensor_value_info("b", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    y, = ort.InferenceSession(m.SerializeToString()).run(None, {"b": np.array(True)})
    assert y.tolist() == [0.0, 2.0]
    a = helper.make_value_info("A", helper.make_sparse_tensor_type_proto(TensorProto.FLOAT, [2, 2]))
    g = helper.make_graph([helper.make_node("SparseToDenseMatMul", ["A", "B"], ["Y"], domain="com.microsoft",
                                            alpha=2.0, transA=1)], "g",
                          [a, helper.make_tensor_value_info("B", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("", 13)],
                          ir_version=9)
    st = ort.SparseTensor.sparse_coo_from_numpy([2, 2], np.array([1.0, 3.0], np.float32),
                                                np.array([[0, 1], [1, 0]], np.int64))
    B = np.arange(4, dtype=np.float32).reshape(2, 2)
    y, = ort.InferenceSession(m.SerializeToString()).run(None, {"A": st, "B": B})
    np.testing.assert_allclose(y, 2.0 * st.to_dense().T @ B)


# -- EP devices and compiled-model compatibility ------------------------------------------------------

def _model_with_compat(info: dict) -> bytes:
    m = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 13)])
    for ep, value in info.items():
        m.metadata_props.append(onnx.StringStringEntryProto(key=f"ep_compatibility_info.{ep}", value=value))
    return m.SerializeToString()


def test_ep_devices_and_hardware(square):
    devices = ort.get_ep_devices()
    names = [d.ep_name for d in devices]
    assert names == [n for n in ort.get_available_providers()]
    cpu = devices[names.index("CPUExecutionProvider")]
    assert cpu.device.type == ort.OrtHardwareDeviceType.CPU and cpu.memory_info().name == "Cpu"
    hw = ort.get_hardware_devices()
    assert hw[0] == cpu.device
    assert ort.get_hardware_device_ep_incompatibility_details("CPUExecutionProvider", hw[0]) == \
        {"reasons_bitmask": 0, "notes": None, "error_code": 0}
    with pytest.raises(RuntimeError, match="ep_name"):
        ort.get_hardware_device_ep_incompatibility_details("", hw[0])
    with pytest.raises(RuntimeError, match="No valid factory found for execution provider 'Nope'"):
        ort.get_hardware_device_ep_incompatibility_details("Nope", hw[0])
    assert ort.OrtDeviceEpIncompatibilityReason.UNKNOWN == 0x80000000
    assert ort.get_model_compatibility_for_ep_devices([cpu], "any") == \
        ort.OrtCompiledModelCompatibility.EP_NOT_APPLICABLE
    with pytest.raises(RuntimeError, match="empty"):
        ort.get_model_compatibility_for_ep_devices([], "info")
    with pytest.raises(TypeError):
        ort.get_model_compatibility_for_ep_devices(devices, None)
    # providers chosen through the options: by device, and by policy
    so = ort.SessionOptions()
    assert not so.has_providers()
    so.add_provider_for_devices([cpu])
    assert so.has_providers()
    assert ort.InferenceSession(square, so).get_providers() == ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.set_provider_selection_policy(ort.OrtExecutionProviderDevicePolicy.PREFER_CPU)
    assert ort.InferenceSession(square, so).get_providers() == ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.add_provider("NoSuchExecutionProvider", {})
    with pytest.raises(ort.InvalidArgument, match="is not installed"):
        ort.InferenceSession(square, so)


def test_compatibility_info_from_models(tmp_path):
    data = _model_with_compat({"TestCompatEP": "v1.0"})
    assert ort.get_compatibility_info_from_model_bytes(data, "TestCompatEP") == "v1.0"
    assert ort.get_compatibility_info_from_model_bytes(data, "OtherEP") is None
    assert ort.get_compatibility_info_from_model_bytes(_model_with_compat({}), "AnyEP") is None
    for bad, ep in ((b"this is not a valid ONNX model", "EP"), (b"", "EP"), (b"data", "")):
        with pytest.raises(RuntimeError):
            ort.get_compatibility_info_from_model_bytes(bad, ep)
    (tmp_path / "m.onnx").write_bytes(data)
    assert ort.get_compatibility_info_from_model(str(tmp_path / "m.onnx"), "TestCompatEP") == "v1.0"
    for path, ep in ((str(tmp_path / "none.onnx"), "EP"), ("", "EP"), (str(tmp_path / "m.onnx"), "")):
        with pytest.raises(RuntimeError):
            ort.get_compatibility_info_from_model(path, ep)


def test_map_key_of_the_wrong_type_is_onnxruntimes_runtime_error():
    from onnx import TypeProto

    tp = TypeProto()
    tp.map_type.key_type = TensorProto.INT64
    tp.map_type.value_type.tensor_type.elem_type = TensorProto.FLOAT
    from onnxrt.run.feeds import FeedChecker

    checker = FeedChecker([("m", tp)], {"m"})
    assert checker.check({"m": {1: np.float32(2.0)}})["m"] == {1: np.float32(2.0)}
    with pytest.raises(RuntimeError, match="Unexpected key type  <class 'str'>, it cannot be linked to C type int64_t"):
        checker.check({"m": {"a": 1.0}})
