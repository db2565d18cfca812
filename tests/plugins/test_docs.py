"""docs/plugins.md is the plugin author's manual: every hook is in it with its exact
signature, and its worked examples run as written."""

from __future__ import annotations

import inspect
import re
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.plugin import discovery as plugins, hookspecs

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def _hooks():
    return {name: fn for name, fn in vars(hookspecs).items()
            if name.startswith("onnxrt_") and callable(fn) and hasattr(fn, "onnxrt_spec")}


def _example(label: str) -> str:
    m = re.search(rf"<!-- example: {label} -->\s*```python\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"docs/plugins.md has no example {label!r}"
    return m.group(1)


def _module(label: str) -> types.ModuleType:
    mod = types.ModuleType(f"doc_example_{label.replace('-', '_')}")
    exec(compile(_example(label), f"docs/plugins.md:{label}", "exec"), mod.__dict__)
    return mod


def test_hookspecs_are_found():
    assert set(_hooks()) == {"onnxrt_register_providers", "onnxrt_register_kernels",
                             "onnxrt_register_transformers"}


@pytest.mark.parametrize("name", sorted(_hooks()))
def test_every_hook_is_documented_with_its_signature(name):
    headings = re.findall(r"^### (onnxrt_\w+.*)$", DOC.read_text(), re.M)
    # the hookspecs' annotations are strings (postponed evaluation); the docs write them bare
    signature = f"{name}{inspect.signature(_hooks()[name])}".replace("'", "")
    assert signature in headings, f"docs/plugins.md needs a heading '### {signature}'; it has {headings}"


def test_no_documented_hook_is_stale():
    headings = re.findall(r"^### (onnxrt_\w+)", DOC.read_text(), re.M)
    assert set(headings) == set(_hooks())


@pytest.fixture
def registered():
    """Register doc example modules for one test, then remove them."""
    done = []

    def register(mod):
        plugins.register_plugin(mod, name=mod.__name__)
        done.append(mod)
        return mod

    yield register
    for mod in done:
        plugins.unregister_plugin(mod)


def _custom_op_model(alpha, beta):
    node = helper.make_node("ScaledTanh", ["x"], ["y"], domain="com.example", alpha=alpha, beta=beta)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid("com.example", 1)])


def test_custom_op_example_runs_on_the_cpu_provider(registered):
    model = _custom_op_model(alpha=2.0, beta=0.5)
    x = np.array([-3, -1, 0, 2], np.float32)
    with pytest.raises(ort.NotImplemented, match="ScaledTanh"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    registered(_module("custom-op"))
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    y, = sess.run(None, {"x": x})
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, 2.0 * np.tanh(0.5 * x), rtol=1e-6)
    assert sess.get_provider_assignment()[0]["provider"] == "CPUExecutionProvider"


def test_custom_op_kernel_goes_away_when_its_plugin_is_unregistered():
    mod = _module("custom-op")
    plugins.register_plugin(mod, name="doc_custom_op")
    plugins.unregister_plugin(mod)
    with pytest.raises(ort.NotImplemented, match="no kernel for ScaledTanh in domain 'com.example'"):
        ort.InferenceSession(_custom_op_model(1.0, 1.0), providers=["CPUExecutionProvider"])


def _div_model(divisor_is_input=False):
    c = np.array([2.0, 4.0, -8.0], np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])]
    if divisor_is_input:  # an overridable initializer: a user may feed another value
        inputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [3]))
    graph = helper.make_graph([helper.make_node("Div", ["x", "c"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                              initializer=[onnx.numpy_helper.from_array(c, "c")])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]), c


def _optimized_ops(model, tmp_path, level, disabled=()):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.disabled_optimizers = list(disabled)
    path = tmp_path / f"opt_{int(level)}_{len(disabled)}.onnx"
    so.optimized_model_filepath = str(path)
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(path)).graph.node], sess


def test_rewrite_example_runs_at_its_level_only(registered, tmp_path):
    registered(_module("rewrite"))
    model, c = _div_model()
    x = np.array([1.0, -3.0, 5.0], np.float32)
    Level = ort.GraphOptimizationLevel
    for level, want in [(Level.ORT_ENABLE_BASIC, ["Div"]), (Level.ORT_ENABLE_EXTENDED, ["Mul"]),
                        (Level.ORT_ENABLE_ALL, ["Mul"])]:
        ops, sess = _optimized_ops(model, tmp_path, level)
        assert ops == want, f"at {level!r}"
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], x / c, rtol=1e-6)
    ops, _ = _optimized_ops(model, tmp_path, Level.ORT_ENABLE_ALL, disabled=["div_by_constant_to_mul"])
    assert ops == ["Div"]


def test_rewrite_example_leaves_a_divisor_the_user_may_feed(registered, tmp_path):
    registered(_module("rewrite"))
    model, _ = _div_model(divisor_is_input=True)
    ops, sess = _optimized_ops(model, tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert ops == ["Div"]
    x = np.array([1.0, -3.0, 5.0], np.float32)
    c = np.array([10.0, 10.0, 10.0], np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "c": c})[0], x / c, rtol=1e-6)


def test_rewrite_name_is_unknown_without_its_plugin():
    so = ort.SessionOptions()
    so.disabled_optimizers = ["div_by_constant_to_mul"]
    model, _ = _div_model()
    with pytest.raises(ort.InvalidArgument, match="unknown transforms: div_by_constant_to_mul"):
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def test_hookspecs_are_typed_with_the_registries_they_receive():
    import typing

    from onnxrt.optimizer import TransformerRegistry
    from onnxrt.plugin.discovery import ProviderRegistry
    from onnxrt.plugin.kernel import KernelRegistry

    names = {"ProviderRegistry": ProviderRegistry, "KernelRegistry": KernelRegistry,
             "TransformerRegistry": TransformerRegistry}
    hints = {n: typing.get_type_hints(fn, localns=names) for n, fn in _hooks().items()}
    assert hints["onnxrt_register_providers"] == {"registry": ProviderRegistry, "return": type(None)}
    assert hints["onnxrt_register_kernels"] == {"provider_name": str, "registry": KernelRegistry,
                                               "return": type(None)}
    assert hints["onnxrt_register_transformers"] == {"registry": TransformerRegistry, "return": type(None)}
