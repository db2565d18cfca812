"""Plugin discovery: entry points, broken plugins, duplicate names, the environment switch."""

import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.plugin import discovery as plugins

from ..conftest import make_model


def _fake_distribution(tmp_path, dist, entry_points: dict[str, str], modules: dict[str, str]):
    """An installed distribution on sys.path: importlib.metadata finds its entry points."""
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[onnxrt.providers]\n{lines}\n")
    for name, src in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(src))


@pytest.fixture
def isolated_plugins(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.reset()
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("tp_")]:
        del sys.modules[mod]
    plugins.reset()


GOOD = """
    import numpy as np
    from onnxrt import hookimpl
    from onnxrt.plugin.kernel import KernelRegistry
    from onnxrt.plugin.provider import ExecutionProvider

    class NegProvider(ExecutionProvider):
        name = "NegExecutionProvider"
        aliases = ("neg",)
        priority = 10

        @classmethod
        def build_registry(cls):
            reg = KernelRegistry()

            @reg.op("Neg", since=1)
            def neg(k, x):
                return -x

            return reg

    @hookimpl
    def onnxrt_register_providers(registry):
        registry.add_provider(NegProvider)
"""


def test_broken_plugin_is_unavailable_and_host_keeps_working(isolated_plugins):
    _fake_distribution(isolated_plugins, "tp-broken", {"broken": "tp_broken"},
                       {"tp_broken": "raise ImportError('libacme.so: cannot open shared object file')"})
    info = {p["name"]: p for p in ort.get_provider_info()}
    assert info["broken"]["available"] is False
    assert "libacme.so" in info["broken"]["reason"]
    assert info["broken"]["distribution"] == "tp-broken"
    assert "CPUExecutionProvider" in ort.get_available_providers()
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    assert ort.InferenceSession(model).run(None, {"x": np.array([-1, 1], np.float32)})[0].tolist() == [0, 1]


def test_plugin_from_entry_point_runs_its_kernels(isolated_plugins):
    _fake_distribution(isolated_plugins, "tp-neg", {"neg": "tp_neg"}, {"tp_neg": GOOD})
    assert ort.get_available_providers()[0] == "NegExecutionProvider"
    model = make_model([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Relu", ["n"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    sess = ort.InferenceSession(model, providers=["neg", "cpu"])
    assert [d["provider"] for d in sess.get_provider_assignment()] == ["NegExecutionProvider", "CPUExecutionProvider"]
    assert sess.run(None, {"x": np.array([-1, 1], np.float32)})[0].tolist() == [1, 0]


def test_two_plugins_claiming_one_name_is_an_error(isolated_plugins):
    _fake_distribution(isolated_plugins, "tp-neg", {"neg_a": "tp_neg_a", "neg_b": "tp_neg_b"},
                       {"tp_neg_a": GOOD, "tp_neg_b": GOOD})
    with pytest.raises(ort.EPFail, match="two plugins register provider 'NegExecutionProvider'"):
        ort.get_available_providers()


def test_environment_variable_limits_loading(isolated_plugins, monkeypatch):
    _fake_distribution(isolated_plugins, "tp-neg", {"neg": "tp_neg"}, {"tp_neg": GOOD})
    monkeypatch.setenv("ONNXRT_PLUGINS", "cpu")
    plugins.reset()
    assert ort.get_all_providers() == ["CPUExecutionProvider"]
    monkeypatch.setenv("ONNXRT_PLUGINS", "none")
    plugins.reset()
    assert ort.get_all_providers() == []
    with pytest.raises(ort.EPFail, match="CPU provider is not installed"):
        ort.InferenceSession(make_model([helper.make_node("Relu", ["x"], ["y"])],
                                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))


def test_unavailable_provider_requested_by_name(isolated_plugins):
    src = GOOD.replace("        priority = 10", "        priority = 10\n\n        @classmethod\n"
                       "        def is_available(cls):\n            return 'no Neg device found'")
    _fake_distribution(isolated_plugins, "tp-neg", {"neg": "tp_neg"}, {"tp_neg": src})
    assert "NegExecutionProvider" not in ort.get_available_providers()
    info = {p["name"]: p for p in ort.get_provider_info()}
    assert info["NegExecutionProvider"]["reason"] == "no Neg device found"
    model = make_model([helper.make_node("Neg", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(ort.EPFail, match="unavailable: no Neg device found"):
        ort.InferenceSession(model, providers=["NegExecutionProvider"])
    so = ort.SessionOptions()
    so.allow_provider_fallback = True
    sess = ort.InferenceSession(model, so, providers=["NegExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_kernel_hook_adds_a_custom_op_to_the_cpu_provider():
    class CustomOps:
        @ort.hookimpl
        def onnxrt_register_kernels(self, provider_name, registry):
            if provider_name == "CPUExecutionProvider":
                @registry.op("Cube", since=1, domain="my.ops")
                def cube(k, x, *, offset=0.0):
                    return x * x * x + x.dtype.type(offset)

    plugin = CustomOps()
    plugins.register_plugin(plugin, name="custom_ops")
    try:
        model = make_model([helper.make_node("Cube", ["x"], ["y"], domain="my.ops", offset=1.0)],
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        model.opset_import.append(helper.make_opsetid("my.ops", 1))
        y = ort.InferenceSession(model).run(None, {"x": np.array([2, 3], np.float32)})[0]
        assert y.tolist() == [9.0, 28.0]
    finally:
        plugins.unregister_plugin(plugin)
