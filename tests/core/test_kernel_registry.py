"""The kernel registry: opset ranges, type constraints, and errors that say what exists."""

import numpy as np
import pytest

from onnxrt.plugin.kernel import Kernel, KernelRegistry, NodeInfo, NoKernelError


def _reg():
    reg = KernelRegistry()

    @reg.op("Clip", since=6)
    def clip6(k, x, *, min=-3.4e38, max=3.4e38):
        return np.clip(x, min, max)

    @reg.op("Clip", since=11)
    def clip11(k, x, lo=None, hi=None):
        return np.clip(x, lo, hi)

    @reg.op("Relu", since=14, types={"T": [np.float32]})
    class FastRelu(Kernel):
        def run(self, x):
            return (np.maximum(x, 0),)

    return reg


def _node(op, opset, dtype=None):
    import onnx

    types = [] if dtype is None else [onnx.helper.make_tensor_type_proto(
        onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)]
    return NodeInfo(name="n", op_type=op, opset=opset, inputs=["x"], outputs=["y"], input_types=types,
                    attrs={"min": 0.0} if op == "Clip" else {})


def test_version_ranges_follow_the_next_registration():
    reg = _reg()
    assert reg.find(_node("Clip", 10))[0].cls.__name__ == "clip6"
    assert reg.find(_node("Clip", 13))[0].cls.__name__ == "clip11"
    kdef, why = reg.find(_node("Clip", 5))
    assert kdef is None and "kernels exist for opsets [6, 10], [11, ...]" in why


def test_function_kernels_get_attributes_as_keywords():
    k = _reg().create(_node("Clip", 10))
    (y,) = k.run(np.array([-1.0, 2.0], np.float32))
    assert y.tolist() == [0.0, 2.0]


def test_type_constraints_refuse_other_types_with_a_reason():
    reg = _reg()
    assert reg.find(_node("Relu", 14, np.float32))[0] is not None
    kdef, why = reg.find(_node("Relu", 14, np.float64))
    assert kdef is None and "float64" in why and "float32" in why
    with pytest.raises(NoKernelError, match="Relu 'n'"):
        reg.create(_node("Relu", 14, np.float64))


def test_unknown_op_says_so():
    kdef, why = _reg().find(_node("Frob", 14))
    assert kdef is None and "no kernel for Frob" in why


def test_a_registry_iterates_its_definitions():
    defs = list(_reg())
    assert [(d.domain, d.op_type, d.since) for d in defs] == [("", "Clip", 6), ("", "Clip", 11), ("", "Relu", 14)]
    merged = KernelRegistry()
    merged.update(_reg())
    assert [(d.op_type, d.since) for d in merged] == [(d.op_type, d.since) for d in defs]


def test_a_kernel_knows_its_device_when_it_is_set_up():
    seen = {}
    reg = KernelRegistry()

    @reg.op("Relu", since=1)
    class Relu(Kernel):
        def setup(self):
            seen["device"] = self.device

        def run(self, x):
            return (np.maximum(x, 0),)

    device = object()
    k = reg.create(_node("Relu", 14), device)
    assert seen["device"] is device and k.device is device
    assert reg.create(_node("Relu", 14)).device is None  # built without one: the host


def test_the_session_builds_each_kernel_with_its_providers_device(fake_provider):
    from onnx import TensorProto, helper

    import onnxrt as ort

    from ..conftest import make_model
    from ..fakes import FakeDevice, FakeDeviceProvider

    built = []
    real = FakeDeviceProvider.create_kernel

    def create(self, ni):
        k = real(self, ni)
        built.append((ni.op_type, k.device))
        return k

    FakeDeviceProvider.create_kernel = create
    try:
        model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        sess = ort.InferenceSession(model, providers=["fake", "cpu"])
    finally:
        FakeDeviceProvider.create_kernel = real
    ((op, device),) = built
    assert op == "Relu" and isinstance(device, FakeDevice)
    assert device is sess._built.providers[0].device


def test_node_infos_see_the_types_of_values_added_after_partitioning():
    # a post-partition transform (a Cast it inserts) records the new value's type on its
    # graph; the kernel built for the new node must see it
    from onnx import TensorProto, helper

    from onnxrt.compile import NodeInfoFactory
    from onnxrt.ir import Graph, Node

    gp = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
    g = Graph.from_proto(gp, {"": 17})
    info = NodeInfoFactory(g)
    cast = Node("Cast", inputs=["x"], outputs=["x32"], name="cast")
    g.value_types["x32"] = helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    ni = info(cast)
    assert ni.input_dtype(0) == np.float16
    assert ni.output_dtype(0) == np.float32
