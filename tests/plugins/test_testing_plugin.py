"""onnxrt.testing for provider authors: the node tests a provider claims, comparison with
the CPU provider, model builders, and the pytest plugin that wraps them as fixtures."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import onnx
import pytest

import onnxrt as ort
from onnxrt.plugin import discovery as plugins
from onnxrt.testing import (
    NodeRefused,
    claimed_ops,
    compare_with_cpu,
    models,
    provider_node_tests,
    run_provider_node_test,
)

from ..fakes import FakeDevice


class OddProvider(ort.ExecutionProvider):
    """Relu for float64 only; an Add that is wrong whenever it broadcasts."""

    name = "OddExecutionProvider"
    aliases = ("odd",)

    @classmethod
    def build_registry(cls):
        reg = ort.KernelRegistry()
        reg.op("Relu", since=6, types={"T": [np.float64]})(lambda k, x: np.maximum(x, 0))

        @reg.op("Add", since=7)
        def add(k, a, b):
            if a.shape != b.shape:  # a deliberate bug
                return np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)).copy()
            return a + b

        return reg


class OddPlugin:
    @ort.hookimpl
    def onnxrt_register_providers(self, registry):
        registry.add_provider(OddProvider)


@pytest.fixture
def odd_provider():
    plugin = OddPlugin()
    plugins.register_plugin(plugin, name="odd")
    try:
        yield OddProvider
    finally:
        plugins.unregister_plugin(plugin)


def _case(name, cases):
    return next(c for c in cases if c.name == name)


def test_claimed_ops_come_from_the_kernel_registry(fake_provider):
    assert claimed_ops("fake") == {("", "Relu"), ("", "Add")}
    with pytest.raises(ort.InvalidArgument, match="provider 'nope' is not installed"):
        claimed_ops("nope")


def test_node_tests_are_those_using_only_claimed_ops(fake_provider):
    cases = provider_node_tests("FakeDeviceExecutionProvider")
    names = {c.name for c in cases}
    assert {"test_relu", "test_add", "test_add_bcast", "test_add_uint8"} <= names
    assert all(c.ops <= {("", "Relu"), ("", "Add")} for c in cases)
    assert not any(n.startswith(("test_mul", "test_leakyrelu")) for n in names)  # use other ops
    assert {c.name for c in provider_node_tests("fake", ops=["Relu"])} == {"test_relu"}


def test_a_node_test_runs_on_the_provider_itself(fake_provider):
    before = FakeDevice.from_host_count
    run_provider_node_test(_case("test_add_bcast", provider_node_tests("fake")), "fake")
    assert FakeDevice.from_host_count - before == 2  # both inputs went to the fake device


def test_a_refused_node_is_reported_with_the_provider_reason(odd_provider):
    case = _case("test_relu", provider_node_tests("odd"))
    with pytest.raises(NodeRefused, match=r"OddExecutionProvider does not take Relu node .*float32"):
        run_provider_node_test(case, "odd")


def test_a_wrong_kernel_fails_its_node_test(odd_provider):
    cases = provider_node_tests("odd")
    run_provider_node_test(_case("test_add", cases), "odd")
    with pytest.raises(AssertionError, match="test_add_bcast"):
        run_provider_node_test(_case("test_add_bcast", cases), "odd")


def test_the_cpu_provider_can_be_the_provider_under_test():
    cases = provider_node_tests("cpu", ops=["Relu"])
    assert [c.name for c in cases] == ["test_relu"]
    run_provider_node_test(cases[0], "CPUExecutionProvider")


def test_compare_with_cpu_reports_assignment_and_agreement(fake_provider):
    result = compare_with_cpu(models.residual_mlp(), ["fake"], seed=4)
    assert [(r["op_type"], r["provider"]) for r in result.assignment] == [
        ("Mul", "CPUExecutionProvider"), ("Add", "FakeDeviceExecutionProvider"),
        ("Relu", "FakeDeviceExecutionProvider"), ("MatMul", "CPUExecutionProvider"),
        ("Softmax", "CPUExecutionProvider")]
    assert result.feeds["x"].shape == (2, 4)
    np.testing.assert_allclose(result.outputs[0].sum(axis=1), [1, 1], rtol=1e-6)


def test_compare_with_cpu_catches_a_wrong_provider(odd_provider):
    m = models
    model = m.make_model([m.node("Add", ["x", "b"], ["y"])], [m.tensor("x", [2, 3])], [m.tensor("y", [2, 3])],
                         {"b": np.arange(3, dtype=np.float32)})
    with pytest.raises(AssertionError, match="output 'y' on OddExecutionProvider vs the CPU"):
        compare_with_cpu(model, ["odd"])


def test_model_builders_make_valid_models():
    model = models.chain(["Add", "Mul", "Relu"], shape=[3, "N"])
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Add", "Mul", "Relu"]
    assert [i.name for i in model.graph.input] == ["x", "in1", "in2"]
    feeds = models.random_feeds(model, dims={"N": 5})
    assert {k: v.shape for k, v in feeds.items()} == {"x": (3, 5), "in1": (3, 5), "in2": (3, 5)}
    y, = ort.InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(y, np.maximum((feeds["x"] + feeds["in1"]) * feeds["in2"], 0), rtol=1e-6)
    ints = models.random_feeds(models.single_op("Add", shape=[4], dtype=np.uint8), seed=1)
    assert sorted(ints) == ["x0", "x1"] and ints["x0"].dtype == np.uint8
    custom = models.single_op("ScaledTanh", domain="com.example", alpha=2.0)
    assert [(o.domain, o.version) for o in custom.opset_import] == [("", 18), ("com.example", 1)]


# -- the pytest plugin, in a nested pytest session ------------------------------------------

CONFTEST = '''
import numpy as np
import onnxrt as ort
from onnxrt.plugin import discovery as plugins


class TinyProvider(ort.ExecutionProvider):
    name = "TinyExecutionProvider"
    aliases = ("tiny",)

    @classmethod
    def build_registry(cls):
        reg = ort.KernelRegistry()
        reg.op("Relu", since=6, types={"T": [np.float64]})(lambda k, x: np.maximum(x, 0))

        @reg.op("Add", since=7)
        def add(k, a, b):
            if a.shape != b.shape:
                return np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)).copy()
            return a + b

        return reg


class TinyPlugin:
    @ort.hookimpl
    def onnxrt_register_providers(self, registry):
        registry.add_provider(TinyProvider)


PLUGIN = TinyPlugin()


def pytest_configure(config):
    plugins.register_plugin(PLUGIN, name="tiny")


def pytest_unconfigure(config):
    plugins.unregister_plugin(PLUGIN)
'''

TESTS = '''
import pytest

pytestmark = pytest.mark.onnxrt_provider(xfail={"test_add_bcast": "Add ignores broadcasting"})


def test_node(onnxrt_node_test):
    onnxrt_node_test.run()


@pytest.mark.onnxrt_provider("tiny", ops=["Relu"])
def test_relu_only(onnxrt_node_test):
    onnxrt_node_test.run()


def test_compare(onnxrt_compare, onnxrt_models, onnxrt_provider):
    assert onnxrt_provider == "TinyExecutionProvider"
    result = onnxrt_compare(onnxrt_models.single_op("Add", shape=[2, 2]))
    assert result.assignment[0]["provider"] == "TinyExecutionProvider"


def test_compare_catches_broadcasting(onnxrt_compare, onnxrt_models):
    m = onnxrt_models
    model = m.make_model([m.node("Add", ["x", "y"], ["z"])], [m.tensor("x", [2, 2]), m.tensor("y", [2])],
                         [m.tensor("z", [2, 2])])
    with pytest.raises(AssertionError):
        onnxrt_compare(model)
'''


class _Outcomes:
    def __init__(self):
        self.by_id: dict[str, tuple[str, str]] = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            kind = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            detail = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
            self.by_id[report.nodeid.split("::", 1)[1]] = (kind, detail)


def _nested_pytest(tmp_path, *args, ini="onnxrt_provider = TinyExecutionProvider\n",
                   tests=TESTS) -> tuple[int, dict]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_tiny_provider.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + ini)
    return _run_nested(tmp_path, args)


def _run_nested(tmp_path, args=(), enable=("-p", "onnxrt.testing")) -> tuple[int, dict]:
    """pytest.main on ``tmp_path`` with the plugin enabled by ``enable``; its test modules
    and conftest are forgotten afterwards."""
    outcomes = _Outcomes()
    before = set(sys.modules)
    try:
        rc = pytest.main(["-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path),
                          "-c", str(tmp_path / "pytest.ini"), *enable, *args, str(tmp_path)], plugins=[outcomes])
    finally:
        for name in set(sys.modules) - before:
            if name == "conftest" or name.startswith("test_"):
                del sys.modules[name]
    return int(rc), outcomes.by_id


def test_plugin_fixtures_in_a_pytest_session(tmp_path):
    rc, got = _nested_pytest(tmp_path)
    assert rc == 0, got
    assert got["test_node[TinyExecutionProvider-test_add]"] == ("passed", "")
    assert got["test_node[TinyExecutionProvider-test_add_bcast]"][0] == "xfailed"
    kind, why = got["test_node[TinyExecutionProvider-test_relu]"]
    assert kind == "skipped" and "does not take Relu" in why and "float32" in why
    assert [k for k in got if k.startswith("test_relu_only")] == ["test_relu_only[TinyExecutionProvider-test_relu]"]
    assert got["test_compare"] == ("passed", "")
    assert got["test_compare_catches_broadcasting"] == ("passed", "")
    assert "TinyExecutionProvider" not in ort.get_all_providers()  # the nested session cleaned up


def test_plugin_without_a_provider_skips_node_tests(tmp_path):
    (tmp_path / "test_none.py").write_text(textwrap.dedent('''
        def test_node(onnxrt_node_test):
            onnxrt_node_test.run()

        def test_provider(onnxrt_provider):
            pass
    '''))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    rc, got = _run_nested(tmp_path)
    assert rc == 0
    assert got["test_node[no-provider]"][0] == "skipped"
    assert "no provider under test" in got["test_provider"][1]


def test_plugin_takes_the_provider_from_the_command_line(tmp_path):
    tests = textwrap.dedent('''
        def test_name(onnxrt_provider):
            assert onnxrt_provider == "TinyExecutionProvider"  # the alias resolved

        def test_node(onnxrt_node_test):
            onnxrt_node_test.run()
    ''')
    rc, got = _nested_pytest(tmp_path, "--onnxrt-provider", "tiny", ini="", tests=tests)
    assert got["test_name"] == ("passed", "")
    assert got["test_node[TinyExecutionProvider-test_add]"] == ("passed", "")
    assert got["test_node[TinyExecutionProvider-test_add_bcast]"][0] == "failed"  # the deliberate bug, not excused here
    assert rc == 1


def test_plugin_refuses_an_xfail_for_a_node_test_the_provider_does_not_run(tmp_path, capsys):
    tests = textwrap.dedent('''
        import pytest

        @pytest.mark.onnxrt_provider("tiny", xfail={"test_conv": "no Conv here"})
        def test_node(onnxrt_node_test):
            onnxrt_node_test.run()
    ''')
    rc, got = _nested_pytest(tmp_path, ini="", tests=tests)
    assert rc != 0 and not any(k.startswith("test_node[") for k in got)
    out = capsys.readouterr().out
    assert "xfail names node tests TinyExecutionProvider does not run: test_conv" in out
    assert "Traceback" not in out and "_hooks.py" not in out  # one clear line, no pytest internals


def test_plugin_reports_a_provider_that_is_not_installed(tmp_path, capsys):
    rc, _ = _nested_pytest(tmp_path, "--onnxrt-provider", "nosuch", ini="", tests=TESTS)
    assert rc != 0
    assert "provider 'nosuch' is not installed; installed providers: " in capsys.readouterr().out


# -- the plugin is opt-in ------------------------------------------------------------------

OPT_IN_TESTS = textwrap.dedent('''
    def test_name(onnxrt_provider):
        assert onnxrt_provider == "CPUExecutionProvider"
''')


def test_installing_onnxrt_adds_no_pytest_plugin():
    from importlib.metadata import entry_points

    assert not [e for e in entry_points(group="pytest11") if e.value.startswith("onnxrt")]


def test_without_opting_in_a_pytest_session_has_no_onnxrt_fixtures(tmp_path, capsys):
    (tmp_path / "test_opt_in.py").write_text(OPT_IN_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    rc, got = _run_nested(tmp_path, enable=())
    assert rc != 0 and got["test_name"][0] == "failed"
    assert "fixture 'onnxrt_provider' not found" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["addopts", "conftest"])
def test_a_project_opts_in_through_its_config_or_its_conftest(tmp_path, how):
    (tmp_path / "test_opt_in.py").write_text(OPT_IN_TESTS)
    ini = "[pytest]\nonnxrt_provider = cpu\n"
    if how == "addopts":
        ini += "addopts = -p onnxrt.testing\n"
    else:
        (tmp_path / "conftest.py").write_text('pytest_plugins = ["onnxrt.testing"]\n')
    (tmp_path / "pytest.ini").write_text(ini)
    rc, got = _run_nested(tmp_path, enable=())
    assert rc == 0 and got["test_name"] == ("passed", "")
