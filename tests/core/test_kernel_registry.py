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
