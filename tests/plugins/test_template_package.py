"""The provider template, end to end, as a new provider author meets it.

``onnxrt new-provider acme`` renders the template; the package is pip-installed; a
fresh interpreter finds ``AcmeExecutionProvider``, runs a model split between it and the
CPU provider, and the package's own tests pass; after ``pip uninstall`` it is gone.

The package is installed into a throwaway virtual environment layered over this one
(its ``.pth`` file adds this environment's site-packages), so onnxrt and its
dependencies come from here while the install and uninstall never touch this
environment, which other test sessions may be using at the same time.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sysconfig
import textwrap
import venv
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from onnxrt.cli import main as cli_main

PROVIDER = "AcmeExecutionProvider"


def _can_build_offline() -> bool:
    """setuptools builds wheels by itself from 70.1 on; older ones need ``wheel``."""
    try:
        major, minor = (int(x) for x in version("setuptools").split(".")[:2])
    except Exception:  # noqa: BLE001 - no setuptools at all
        return False
    if (major, minor) >= (70, 1):
        return True
    try:
        version("wheel")
        return True
    except Exception:  # noqa: BLE001
        return False


class LayeredEnv:
    """A virtual environment that sees this environment's packages but installs into its own."""

    def __init__(self, root: Path):
        venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(root)
        bindir = "Scripts" if os.name == "nt" else "bin"
        self.python = str(root / bindir / ("python.exe" if os.name == "nt" else "python"))
        purelib = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        outer = site.getsitepackages() + [sysconfig.get_path("purelib")]
        if site.ENABLE_USER_SITE:
            outer.append(site.getusersitepackages())
        outer = [p for p in outer if os.path.isdir(p)]
        # addsitedir (not a plain path line) so this environment's own .pth files,
        # editable installs among them, are processed too
        lines = "; ".join(f"site.addsitedir({p!r})" for p in dict.fromkeys(outer))
        Path(purelib, "_layered_over_parent.pth").write_text(f"import site; {lines}\n")

    def run(self, *args, cwd=None, timeout=300, check=True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "ONNXRT_PLUGINS"}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        proc = subprocess.run([self.python, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args[:3])} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def script(self, code: str, **kw) -> str:
        return self.run("-c", textwrap.dedent(code), **kw).stdout

    def providers(self) -> list[str]:
        return json.loads(self.script("import json, onnxrt; print(json.dumps(onnxrt.get_available_providers()))"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("render") / "onnxrt-acme"
    assert cli_main(["new-provider", "acme", "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def installed(rendered, tmp_path_factory):
    """The rendered package pip-installed into a layered environment; uninstalled afterwards."""
    env = LayeredEnv(tmp_path_factory.mktemp("venv") / "env")
    args = ["-m", "pip", "install", "--no-deps", "-q"]
    if _can_build_offline():
        args.append("--no-build-isolation")
    env.run(*args, str(rendered))
    try:
        yield env
    finally:
        env.run("-m", "pip", "uninstall", "-y", "-q", "onnxrt-acme", check=False)


def test_rendered_package_has_its_names(rendered):
    import tomllib

    meta = tomllib.loads((rendered / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "onnxrt-acme"
    assert meta["project"]["entry-points"]["onnxrt.providers"] == {"acme": "onnxrt_acme.plugin"}
    provider_src = (rendered / "onnxrt_acme" / "provider.py").read_text()
    assert "class AcmeExecutionProvider(ExecutionProvider):" in provider_src
    assert 'aliases = ("acme",)' in provider_src
    assert os.access(rendered / ".ci" / "run", os.X_OK)
    for path in rendered.rglob("*"):
        if path.is_file():
            assert "{{" not in path.name
            text = path.read_text()
            for token in ("{{name}}", "{{Name}}", "{{NAME}}"):
                assert token not in text, f"{path}: unrendered {token}"


def test_installed_provider_is_discovered(installed):
    found = json.loads(installed.script("""
        import json, onnxrt
        info = {p["name"]: p for p in onnxrt.get_provider_info()}["AcmeExecutionProvider"]
        print(json.dumps({"available": onnxrt.get_available_providers(), "info": info}))
    """))
    providers, info = found["available"], found["info"]
    assert providers[0] == PROVIDER  # priority 50, above the CPU provider's 0
    assert "CPUExecutionProvider" in providers
    assert info["available"] is True and info["distribution"] == "onnxrt-acme"
    assert info["aliases"] == ["acme"]


def test_installed_provider_runs_its_share_of_a_model(installed, tmp_path):
    from onnxrt.testing import models

    model = models.residual_mlp(seed=3)  # Mul, Add, Relu, MatMul, Softmax
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = installed.script(f"""
        import json
        import numpy as np
        import onnxrt
        x = np.load({str(tmp_path / 'x.npy')!r})
        result = {{}}
        for order in (["AcmeExecutionProvider", "CPUExecutionProvider"],
                      ["CPUExecutionProvider", "AcmeExecutionProvider"]):
            sess = onnxrt.InferenceSession({str(path)!r}, providers=order)
            y, = sess.run(None, {{"x": x}})
            result[order[0]] = {{"y": y.tolist(), "assignment": sess.get_provider_assignment()}}
        print(json.dumps(result))
    """)
    result = json.loads(out)
    # what the model computes, with numpy
    init = {t.name: np.frombuffer(t.raw_data, np.float32).reshape(t.dims) for t in model.graph.initializer}
    h = np.maximum(x * init["s"] + x, 0) @ init["w"]
    e = np.exp(h - h.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)

    acme_first = result[PROVIDER]
    np.testing.assert_allclose(np.array(acme_first["y"], np.float32), want, rtol=1e-5, atol=1e-6)
    by_op = {row["op_type"]: row for row in acme_first["assignment"]}
    assert by_op["Relu"]["provider"] == PROVIDER
    assert by_op["Add"]["provider"] == PROVIDER
    assert by_op["Mul"]["provider"] == PROVIDER
    assert by_op["Softmax"]["provider"] == "CPUExecutionProvider"
    assert "AcmeExecutionProvider: no kernel for Softmax" in by_op["Softmax"]["reason"]
    assert by_op["MatMul"]["provider"] == "CPUExecutionProvider"

    cpu_first = result["CPUExecutionProvider"]
    np.testing.assert_allclose(np.array(cpu_first["y"], np.float32), want, rtol=1e-5, atol=1e-6)
    assert {row["provider"] for row in cpu_first["assignment"]} == {"CPUExecutionProvider"}


def test_rendered_package_passes_its_own_tests(installed, rendered):
    proc = installed.run("-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=rendered, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 20  # 18 node tests of Add/Mul/Relu, discovery and model tests


def test_uninstall_removes_the_provider(installed):
    # runs last in this module (the fixture's teardown uninstalls in any case)
    assert installed.script("import importlib.metadata as md; print(md.version('onnxrt-acme'))").strip() == "0.1.0"
    installed.run("-m", "pip", "uninstall", "-y", "-q", "onnxrt-acme")
    providers = installed.providers()
    assert PROVIDER not in providers
    assert "CPUExecutionProvider" in providers
