"""The ``onnxrt`` parser: the verbs of ``onnxrt.cli``, and those a module found at run time
adds through ``register(subparsers)`` (how ``onnxrt.quantization.cli`` adds its own)."""

from __future__ import annotations

import sys
import textwrap

import pytest

import onnxrt.cli as cli
from onnxrt.cli import build_parser, main

EXTRA = textwrap.dedent('''
    def register(subparsers):
        p = subparsers.add_parser("shout", help="print a word in capitals")
        p.add_argument("word")
        p.set_defaults(func=lambda args: print(args.word.upper()) or 3)
''')


@pytest.fixture
def extra_verbs(tmp_path, monkeypatch):
    """A package ``extra_verbs_pkg`` with a ``cli`` module that registers ``shout``."""
    pkg = tmp_path / "extra_verbs_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(EXTRA)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in ("extra_verbs_pkg", "extra_verbs_pkg.cli"):
        sys.modules.pop(name, None)


def _verbs(parser) -> list[str]:
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return list(sub.choices)


def test_the_verbs_in_help_order():
    assert _verbs(build_parser())[:8] == ["run", "providers", "explain", "profile", "bench", "compare",
                                          "optimize", "new-provider"]


def test_a_module_that_is_found_adds_its_verbs(extra_verbs, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_OPTIONAL_VERBS", ("extra_verbs_pkg.cli",))
    assert "shout" in _verbs(build_parser())
    assert main(["shout", "hello"]) == 3
    assert capsys.readouterr().out == "HELLO\n"


@pytest.mark.parametrize("name", ["no_such_verbs_pkg.cli", "extra_verbs_pkg.nothing_here"])
def test_a_module_that_is_absent_adds_nothing(extra_verbs, monkeypatch, name):
    monkeypatch.setattr(cli, "_OPTIONAL_VERBS", ())
    without = _verbs(build_parser())
    monkeypatch.setattr(cli, "_OPTIONAL_VERBS", (name,))
    assert _verbs(build_parser()) == without and "shout" not in without


def test_an_error_inside_a_module_that_is_present_is_not_hidden(extra_verbs, monkeypatch):
    (extra_verbs / "cli.py").write_text("import no_such_dependency_of_the_verbs\n")
    monkeypatch.setattr(cli, "_OPTIONAL_VERBS", ("extra_verbs_pkg.cli",))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_of_the_verbs"):
        build_parser()
