"""``onnxrt new-provider``: names, output folders, and what the rendered package holds."""

from __future__ import annotations

import ast
import os

import pytest

from onnxrt import InvalidArgument
from onnxrt.cli import main, scaffold


def test_renders_a_package_for_a_multi_word_name(tmp_path, capsys):
    out = tmp_path / "pkg"
    assert main(["new-provider", "my_npu", "--output", str(out)]) == 0
    assert "MyNpuExecutionProvider" in capsys.readouterr().out
    pkg = out / "onnxrt_my_npu"
    assert sorted(p.name for p in pkg.iterdir()) == [
        "__init__.py", "device.py", "fusion.py", "kernels.py", "plugin.py", "provider.py"]
    for path in list(pkg.glob("*.py")) + list((out / "tests").glob("*.py")):
        ast.parse(path.read_text(), str(path))  # every rendered module is valid Python
    provider = (pkg / "provider.py").read_text()
    assert 'name = "MyNpuExecutionProvider"' in provider and 'aliases = ("my_npu",)' in provider
    assert 'my_npu = "onnxrt_my_npu.plugin"' in (out / "pyproject.toml").read_text()
    assert (out / ".github" / "workflows" / "ci.yml").read_text().count("${{ matrix.python-version }}") == 1
    assert "onnxrt-my_npu" in (out / "README.md").read_text().splitlines()[0]


def test_default_output_is_onnxrt_dash_name_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert scaffold.render_provider("acme") == tmp_path / "onnxrt-acme"
    assert (tmp_path / "onnxrt-acme" / "onnxrt_acme" / "plugin.py").is_file()


def test_an_existing_empty_folder_is_used(tmp_path):
    (tmp_path / "empty").mkdir()
    assert scaffold.render_provider("acme", tmp_path / "empty") == tmp_path / "empty"
    assert (tmp_path / "empty" / "pyproject.toml").is_file()


@pytest.mark.parametrize("name,message", [
    ("Acme", "bad provider name 'Acme'.*try 'acme'"),
    ("my-npu", "bad provider name 'my-npu'.*try 'my_npu'"),
    ("1acme", "bad provider name '1acme'"),
    ("", "bad provider name ''"),
    ("ac me", "try 'ac_me'"),
    ("class", "'class' is reserved"),
    ("cpu", "'cpu' is reserved"),
    ("a" * 41, "longer than 40 characters"),
])
def test_bad_names_are_refused(tmp_path, name, message):
    with pytest.raises(scaffold.TemplateError, match=message):
        scaffold.render_provider(name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_reports_a_bad_name_in_one_line_with_status_2(tmp_path, capsys):
    assert main(["new-provider", "Bad-Name", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnxrt: error: bad provider name 'Bad-Name'") and "\n" not in err


def test_a_non_empty_output_folder_is_refused_and_left_alone(tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["new-provider", "acme", "--output", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["notes.txt"]
    with pytest.raises(InvalidArgument, match="is not empty"):
        scaffold.render_provider("acme", out)


def test_an_output_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(scaffold.TemplateError, match="exists and is not a folder"):
        scaffold.render_provider("acme", tmp_path / "file")


def test_a_missing_template_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(scaffold.TEMPLATE_ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(scaffold.TemplateError, match="template is not at"):
        scaffold.render_provider("acme", tmp_path / "out")


def test_another_template_can_be_rendered(tmp_path, monkeypatch):
    tpl = tmp_path / "tpl"
    (tpl / "onnxrt_{{name}}").mkdir(parents=True)
    (tpl / "pyproject.toml").write_text('name = "onnxrt-{{name}}"\n')
    (tpl / "onnxrt_{{name}}" / "x.py").write_text("CLS = '{{Name}}ExecutionProvider'  # {{NAME}}\n")
    monkeypatch.setenv(scaffold.TEMPLATE_ENV_VAR, str(tpl))
    out = scaffold.render_provider("deep_chip", tmp_path / "out")
    assert (out / "pyproject.toml").read_text() == 'name = "onnxrt-deep_chip"\n'
    assert (out / "onnxrt_deep_chip" / "x.py").read_text() == "CLS = 'DeepChipExecutionProvider'  # DEEP_CHIP\n"


def test_help_lists_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["new-provider", "--help"])
    assert "--output" in capsys.readouterr().out


def test_an_installed_wheel_carries_the_template_and_renders_from_it(tmp_path, monkeypatch):
    """Outside a source checkout, ``new-provider`` uses the copy the wheel ships."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(scaffold.__file__).resolve().parents[3]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(root)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("onnxrt-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    packaged = tmp_path / "site" / "onnxrt" / "cli" / "provider_template"
    assert (packaged / "pyproject.toml").is_file() and (packaged / "onnxrt_{{name}}" / "provider.py").is_file()
    monkeypatch.delenv(scaffold.TEMPLATE_ENV_VAR, raising=False)
    monkeypatch.setattr(scaffold, "_SOURCE_TEMPLATE", tmp_path / "no-source-tree")
    monkeypatch.setattr(scaffold, "_PACKAGED_TEMPLATE", packaged)
    out = scaffold.render_provider("acme", tmp_path / "acme")
    assert 'name = "AcmeExecutionProvider"' in (out / "onnxrt_acme" / "provider.py").read_text()
