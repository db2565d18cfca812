"""Loading plugins robustly: ``ONNXRT_PLUGINS``, broken plugins, name clashes, run-time registration.

Complements tests/core/test_plugins.py. Plugins here are fake installed distributions
(a ``.dist-info`` folder with ``entry_points.txt``) on the path; the ``ONNXRT_PLUGINS``
tests run in fresh interpreters, as a user would set the variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import onnxrt as ort
from onnxrt.plugin import discovery as plugins
from onnxrt.testing import models

PREFIX = "tpl_"  # module names of this file's fake plugins


def provider_source(cls_name: str, provider_name: str, op: str = "Neg", extra: str = "") -> str:
    """A plugin module defining one provider that runs ``op`` as negation; ``extra`` adds class members."""
    members = textwrap.indent(textwrap.dedent(extra).strip("\n"), "    ")
    return (
        "from onnxrt import hookimpl\n"
        "from onnxrt.plugin.kernel import KernelRegistry\n"
        "from onnxrt.plugin.provider import ExecutionProvider\n\n\n"
        f"class {cls_name}(ExecutionProvider):\n"
        f"    name = {provider_name!r}\n"
        "    priority = 10\n"
        f"{members}\n\n"
        "    @classmethod\n"
        "    def build_registry(cls):\n"
        "        reg = KernelRegistry()\n"
        f"        reg.op({op!r}, since=1)(lambda k, x: -x)\n"
        "        return reg\n\n\n"
        "@hookimpl\n"
        "def onnxrt_register_providers(registry):\n"
        f"    registry.add_provider({cls_name})\n"
    )


def add_distribution(root, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """An installed distribution on ``root``: importlib.metadata finds its entry points."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[onnxrt.providers]\n{lines}\n")
    for name, src in modules.items():
        (root / f"{name}.py").write_text(src)


@pytest.fixture
def site_dir(tmp_path, monkeypatch):
    """A folder on sys.path for fake distributions; plugin discovery is redone around the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.reset()
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith(PREFIX)]:
        del sys.modules[mod]
    plugins.reset()


def neg_model():
    return models.make_model([models.node("Neg", ["x"], ["n"]), models.node("Relu", ["n"], ["y"])],
                             [models.tensor("x", [3])], [models.tensor("y", [3])])


def assert_cpu_still_works():
    y, = ort.InferenceSession(neg_model(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.array([-2, 0, 3], np.float32)})
    assert y.tolist() == [2, 0, 0]


# -- ONNXRT_PLUGINS, in fresh interpreters -------------------------------------------------


def _providers_in_subprocess(site, value: str | None, code: str = "") -> dict:
    env = dict(os.environ)
    env.pop("ONNXRT_PLUGINS", None)
    if value is not None:
        env["ONNXRT_PLUGINS"] = value
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json, onnxrt
        print(json.dumps({"all": onnxrt.get_all_providers(), "available": onnxrt.get_available_providers()}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def two_plugins(tmp_path):
    add_distribution(tmp_path, "tpl-neg", {"tpl_neg": "tpl_neg"},
                     {"tpl_neg": provider_source("NegProvider", "NegExecutionProvider")})
    add_distribution(tmp_path, "tpl-abs", {"tpl_abs": "tpl_abs"},
                     {"tpl_abs": provider_source("AbsProvider", "AbsExecutionProvider")})
    return tmp_path


def test_unset_loads_every_installed_plugin(two_plugins):
    got = _providers_in_subprocess(two_plugins, None)
    assert {"NegExecutionProvider", "AbsExecutionProvider", "CPUExecutionProvider"} <= set(got["all"])


def test_a_list_loads_only_those_entry_points(two_plugins):
    got = _providers_in_subprocess(two_plugins, " cpu, tpl_neg ")
    assert got["all"] == ["NegExecutionProvider", "CPUExecutionProvider"]
    assert got["available"] == got["all"]


@pytest.mark.parametrize("value", ["none", "0"])
def test_none_disables_automatic_loading(two_plugins, value):
    got = _providers_in_subprocess(two_plugins, value)
    assert got == {"all": [], "available": []}


def test_run_time_registration_works_with_loading_disabled(two_plugins):
    got = _providers_in_subprocess(two_plugins, "none", """
        import onnxrt.plugin.discovery, tpl_neg
        onnxrt.plugin.discovery.register_plugin(tpl_neg)
    """)
    assert got["all"] == ["NegExecutionProvider"]


# -- broken plugins: unavailable with the reason, the rest keeps working --------------------


@pytest.mark.parametrize("source,reason", [
    ("import tpl_acme_driver_missing\n", "ModuleNotFoundError: No module named 'tpl_acme_driver_missing'"),
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('no Acme device node /dev/acme0')\n", "RuntimeError: no Acme device node /dev/acme0"),
])
def test_plugin_that_fails_to_import_is_listed_with_its_reason(site_dir, source, reason):
    add_distribution(site_dir, "tpl-acme", {"tpl_acme": "tpl_acme"}, {"tpl_acme": source})
    add_distribution(site_dir, "tpl-neg", {"tpl_neg": "tpl_neg"},
                     {"tpl_neg": provider_source("NegProvider", "NegExecutionProvider")})
    info = {p["name"]: p for p in ort.get_provider_info()}
    assert info["tpl_acme"]["available"] is False
    assert reason in info["tpl_acme"]["reason"]
    assert (info["tpl_acme"]["distribution"], info["tpl_acme"]["version"]) == ("tpl-acme", "0.1")
    assert ort.get_available_providers()[0] == "NegExecutionProvider"
    sess = ort.InferenceSession(neg_model(), providers=["NegExecutionProvider", "CPUExecutionProvider"])
    assert sess.run(None, {"x": np.array([-2, 0, 3], np.float32)})[0].tolist() == [2, 0, 0]
    with pytest.raises(ort.InvalidArgument, match=f"provider 'tpl_acme' is not installed .*{reason.split(':')[0]}"):
        ort.InferenceSession(neg_model(), providers=["tpl_acme"])


def test_plugin_whose_registration_raises_is_listed_with_its_reason(site_dir):
    src = textwrap.dedent("""
        from onnxrt import hookimpl

        @hookimpl
        def onnxrt_register_providers(registry):
            raise OSError("libacme.so.1: cannot open shared object file")
    """)
    add_distribution(site_dir, "tpl-acme", {"tpl_acme": "tpl_acme"}, {"tpl_acme": src})
    info = {p["name"]: p for p in ort.get_provider_info()}
    assert info["tpl_acme"]["available"] is False
    assert "failed to register: OSError: libacme.so.1" in info["tpl_acme"]["reason"]
    assert "CPUExecutionProvider" in ort.get_available_providers()
    assert_cpu_still_works()


def test_provider_whose_availability_check_raises_is_unavailable(site_dir):
    extra = """
        @classmethod
        def is_available(cls):
            raise RuntimeError("driver query failed")
    """
    add_distribution(site_dir, "tpl-neg", {"tpl_neg": "tpl_neg"},
                     {"tpl_neg": provider_source("NegProvider", "NegExecutionProvider", extra=extra)})
    assert "NegExecutionProvider" in ort.get_all_providers()
    assert "NegExecutionProvider" not in ort.get_available_providers()
    info = {p["name"]: p for p in ort.get_provider_info()}
    assert info["NegExecutionProvider"]["reason"] == "availability check raised RuntimeError: driver query failed"
    with pytest.raises(ort.EPFail, match="driver query failed"):
        ort.InferenceSession(neg_model(), providers=["NegExecutionProvider"])
    assert_cpu_still_works()


# -- one provider name, two plugins --------------------------------------------------------


def test_same_name_from_two_distributions_names_both(site_dir):
    add_distribution(site_dir, "tpl-first", {"tpl_first": "tpl_first"},
                     {"tpl_first": provider_source("NegA", "NegExecutionProvider")})
    add_distribution(site_dir, "tpl-second", {"tpl_second": "tpl_second"},
                     {"tpl_second": provider_source("NegB", "NegExecutionProvider")})
    with pytest.raises(ort.EPFail) as err:
        ort.get_available_providers()
    msg = str(err.value)
    assert "two plugins register provider 'NegExecutionProvider'" in msg
    assert "tpl_first (tpl-first 0.1)" in msg and "tpl_second (tpl-second 0.1)" in msg
    assert "ONNXRT_PLUGINS" in msg


def test_same_name_at_run_time_is_refused_and_leaves_nothing_behind():
    calls = []

    class Twin(ort.ExecutionProvider):
        name = "TwinExecutionProvider"

    class FakeCPU(ort.ExecutionProvider):
        name = "CPUExecutionProvider"

    class Clashing:
        @ort.hookimpl
        def onnxrt_register_providers(self, registry):
            registry.add_provider(Twin)      # added first, then the clash
            registry.add_provider(FakeCPU)

        @ort.hookimpl
        def onnxrt_register_kernels(self, provider_name, registry):
            calls.append(provider_name)

    plugin = Clashing()
    with pytest.raises(ort.EPFail, match=r"'CPUExecutionProvider': cpu \(onnxrt-cpu .*\) and clashing"):
        plugins.register_plugin(plugin, name="clashing")
    assert not plugins.plugin_manager().is_registered(plugin)
    assert "TwinExecutionProvider" not in ort.get_all_providers()
    assert_cpu_still_works()
    assert calls == []


def test_unregister_removes_the_providers_a_plugin_added():
    class Local:
        @ort.hookimpl
        def onnxrt_register_providers(self, registry):
            # a class the plugin object does not hold as an attribute
            registry.add_provider(type("Hidden", (ort.ExecutionProvider,), {"name": "HiddenExecutionProvider"}))

    plugin = Local()
    plugins.register_plugin(plugin, name="local")
    try:
        assert "HiddenExecutionProvider" in ort.get_available_providers()
    finally:
        plugins.unregister_plugin(plugin)
    assert "HiddenExecutionProvider" not in ort.get_all_providers()
