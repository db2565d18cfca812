"""Device-resident IOBinding: bound device inputs reach device kernels with no host copy,
and outputs bound to a device stay there (checked with the fake device provider)."""

import numpy as np
import onnxrt as ort
import pytest
from onnx import TensorProto, helper

from ..fakes import FakeArray, FakeDevice

PROVIDERS = ["FakeDeviceExecutionProvider", "CPUExecutionProvider"]


def _model(extra_cpu_output=False):
    """y = Relu(x) + z on the fake device; optionally s = Sigmoid(x) on the CPU."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "z"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]
    if extra_cpu_output:
        nodes.append(helper.make_node("Sigmoid", ["x"], ["s"]))
        outs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                       helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)


def _counts():
    return FakeDevice.from_host_count, FakeDevice.to_host_count


def test_device_inputs_and_outputs_make_no_host_copies(fake_provider, data):
    x, z = data
    sess = ort.InferenceSession(_model(), providers=PROVIDERS)
    assert {a["provider"] for a in sess.get_provider_assignment()} == {"FakeDeviceExecutionProvider"}
    xv = ort.OrtValue.ortvalue_from_numpy(x, "fake", 0)
    zv = ort.OrtValue.ortvalue_from_numpy(z, "fake", 0)
    assert xv.device_name() == "fake" and isinstance(xv.device_array(), FakeArray)
    assert xv.shape() == [2, 3] and xv.data_type() == "tensor(float)"
    b = sess.io_binding()
    b.bind_ortvalue_input("x", xv)
    b.bind_ortvalue_input("z", zv)
    b.bind_output("y", "fake")
    before = _counts()
    sess.run_with_iobinding(b)
    assert _counts() == before, "a bound device value went through the host"
    (out,) = b.get_outputs()
    assert out.device_name() == "fake" and isinstance(out.device_array(), FakeArray)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], np.maximum(x, 0) + z)
    # the same binding runs again on the cached specialised plan, still with no copies
    before = _counts()
    sess.run_with_iobinding(b)
    assert _counts() == before


def test_host_bound_output_is_copied_once(fake_provider, data):
    x, z = data
    sess = ort.InferenceSession(_model(), providers=PROVIDERS)
    b = sess.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "fake"))
    b.bind_ortvalue_input("z", ort.OrtValue.ortvalue_from_numpy(z, "fake"))
    b.bind_output("y")  # on the host
    f0, t0 = _counts()
    sess.run_with_iobinding(b)
    assert _counts() == (f0, t0 + 1)
    (out,) = b.get_outputs()
    assert out.device_name() == "cpu" and isinstance(out.numpy(), np.ndarray)
    np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0) + z)


def test_device_input_also_read_on_the_host(fake_provider, data):
    """A CPU node reading a device feed gets one host copy; the device kernels still get none."""
    x, z = data
    sess = ort.InferenceSession(_model(extra_cpu_output=True), providers=PROVIDERS)
    prov = {a["node"]: a["provider"] for a in sess.get_provider_assignment()}
    assert "CPUExecutionProvider" in prov.values()
    b = sess.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "fake"))
    b.bind_cpu_input("z", z)
    b.bind_output("y", "fake")
    b.bind_output("s")
    f0, t0 = _counts()
    sess.run_with_iobinding(b)
    # z goes up once (it was bound on the host); x comes down once for Sigmoid
    assert _counts() == (f0 + 1, t0 + 1)
    y, s = b.copy_outputs_to_cpu()
    np.testing.assert_array_equal(y, np.maximum(x, 0) + z)
    np.testing.assert_allclose(s, 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_device_binding_matches_plain_run(fake_provider, data):
    x, z = data
    sess = ort.InferenceSession(_model(), providers=PROVIDERS)
    b = sess.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "fake"))
    b.bind_cpu_input("z", z)
    b.bind_output("y", "fake")
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], sess.run(None, {"x": x, "z": z})[0])


def test_device_feed_is_validated(fake_provider, data):
    x, z = data
    sess = ort.InferenceSession(_model(), providers=PROVIDERS)
    b = sess.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x.astype(np.float64), "fake"))
    b.bind_ortvalue_input("z", ort.OrtValue.ortvalue_from_numpy(z, "fake"))
    with pytest.raises(ort.InvalidArgument, match="'x' has dtype float64"):
        sess.run_with_iobinding(b)
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.zeros((3, 3), np.float32), "fake"))
    with pytest.raises(ort.InvalidArgument, match="dimension 0"):
        sess.run_with_iobinding(b)


def test_host_buffers_by_pointer(data):
    x, z = data
    sess = ort.InferenceSession(_model(), providers=["CPUExecutionProvider"])
    y = np.zeros((2, 3), np.float32)
    b = sess.io_binding()
    b.bind_input("x", "cpu", 0, np.float32, [2, 3], x.ctypes.data)
    b.bind_cpu_input("z", z)
    b.bind_output("y", "cpu", 0, np.float32, [2, 3], y.ctypes.data)
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(y, np.maximum(x, 0) + z)
    with pytest.raises(ort.InvalidArgument, match="buffer_ptr"):
        b.bind_input("x", "cpu")


def test_unknown_device_is_a_clear_error(data):
    with pytest.raises(ort.InvalidArgument, match="no installed provider has a 'tpu' device"):
        ort.OrtValue.ortvalue_from_numpy(data[0], "tpu", 0)


def _shape_model():
    """y = Relu(x) + z on the fake device; s = Shape(y), n = Size(x) and a Reshape target
    computed from Shape(x) on the CPU."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "z"], ["y"]),
             helper.make_node("Shape", ["y"], ["s"], name="shape_y"), helper.make_node("Size", ["x"], ["n"], name="size_x"),
             helper.make_node("Shape", ["x"], ["sx"], name="shape_x", start=-1)]
    # a symbolic batch, so the optimizer cannot fold the shapes into constants
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
                                       helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
                           helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
                           helper.make_tensor_value_info("n", TensorProto.INT64, []),
                           helper.make_tensor_value_info("sx", TensorProto.INT64, [1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def test_host_shape_of_a_device_value_copies_no_data(fake_provider, data):
    """Shape and Size on the CPU read a device value's shape: its data stays on the device."""
    x, z = data
    sess = ort.InferenceSession(_shape_model(), providers=PROVIDERS)
    prov = {a["node"]: a["provider"] for a in sess.get_provider_assignment()}
    assert {prov[n] for n in ("shape_y", "size_x", "shape_x")} == {"CPUExecutionProvider"}, prov
    b = sess.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "fake"))
    b.bind_ortvalue_input("z", ort.OrtValue.ortvalue_from_numpy(z, "fake"))
    for name in ("y", "s", "n", "sx"):
        b.bind_output(name, "fake" if name == "y" else "cpu")
    before = _counts()
    sess.run_with_iobinding(b)
    assert _counts() == before, "a Shape or Size on the host copied a device value's data"
    y, s, n, sx = b.copy_outputs_to_cpu()
    np.testing.assert_array_equal(y, np.maximum(x, 0) + z)
    assert s.tolist() == [2, 3] and int(n) == 6 and sx.tolist() == [3]
    # a plain run: y is copied down once (it is an output), nothing else
    f0, t0 = _counts()
    y2, s2, n2, sx2 = sess.run(None, {"x": x, "z": z})
    assert _counts() == (f0 + 2, t0 + 1)
    np.testing.assert_array_equal(y2, y)
    assert s2.tolist() == [2, 3] and int(n2) == 6 and sx2.tolist() == [3]


class _SumNamedShape:
    """A custom-domain op named Shape that reads its input's data (a sum), not its shape."""

    @ort.hookimpl
    def onnxrt_register_kernels(self, provider_name, registry):
        if provider_name == "CPUExecutionProvider":

            @registry.op("Shape", since=1, domain="test.data")
            def shape_named_sum(k, x):
                return np.asarray(x).sum().reshape(1)


def test_a_custom_op_named_shape_still_reads_the_data(fake_provider, data):
    """Only the default domain's Shape and Size read shapes alone: another domain's op of
    that name gets the device value's data, in a plain run and with a device-bound feed."""
    x, z = data
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "z"], ["y"]),
             helper.make_node("Shape", ["y"], ["sy"], domain="test.data"),
             helper.make_node("Shape", ["x"], ["sx"], domain="test.data")]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, ["N", 3]),
                                       helper.make_tensor_value_info("z", f, ["N", 3])],
                          [helper.make_tensor_value_info("sy", f, [1]), helper.make_tensor_value_info("sx", f, [1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.data", 1)],
                              ir_version=10).SerializeToString()
    plugin = _SumNamedShape()
    ort.plugin.register_plugin(plugin, name="sum_named_shape")
    try:
        sess = ort.InferenceSession(model, providers=PROVIDERS)
        want_y, want_x = (np.maximum(x, 0) + z).sum(), x.sum()
        sy, sx = sess.run(None, {"x": x, "z": z})
        np.testing.assert_allclose([sy[0], sx[0]], [want_y, want_x], rtol=1e-6)
        b = sess.io_binding()
        b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "fake"))
        b.bind_ortvalue_input("z", ort.OrtValue.ortvalue_from_numpy(z, "fake"))
        b.bind_output("sy")
        b.bind_output("sx")
        sess.run_with_iobinding(b)
        sy, sx = b.copy_outputs_to_cpu()
        np.testing.assert_allclose([sy[0], sx[0]], [want_y, want_x], rtol=1e-6)
    finally:
        ort.plugin.unregister_plugin(plugin)
