"""``onnxrt new-provider NAME``: render the provider template into a new package.

The template (``plugins-template/`` in the source tree) is a complete package in which
``{{name}}`` stands for the provider's short name (``acme``), ``{{Name}}`` for its
CamelCase form (``Acme``) and ``{{NAME}}`` for its upper-case form (``ACME``), in file
contents and in file and folder names. Rendering ``acme`` gives the distribution
``onnxrt-acme``, the import package ``onnxrt_acme`` and the provider
``AcmeExecutionProvider`` with the alias ``acme``, ready to ``pip install``.

The renderer sits with what it renders: a source checkout reads ``plugins-template/``
itself, and a wheel carries a copy of it beside this module, as
``onnxrt/cli/provider_template/`` (the root ``setup.py`` puts it there at build time).
"""

from __future__ import annotations

import keyword
import os
import re
import shutil
from pathlib import Path

from ..errors import InvalidArgument

__all__ = ["render_provider", "add_command", "template_dir", "TemplateError", "check_name"]

#: where a checkout keeps the template, relative to this file (core/onnxrt/cli/scaffold.py)
_SOURCE_TEMPLATE = Path(__file__).resolve().parents[3] / "plugins-template"
#: set to a folder to render another template (a fork of the shipped one, say)
TEMPLATE_ENV_VAR = "ONNXRT_PROVIDER_TEMPLATE"

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_PLACEHOLDER_RE = re.compile(r"\{\{(name|Name|NAME)\}\}")
_MAX_NAME = 40
#: names of providers onnxrt itself ships: a package rendered with one would clash
_RESERVED = {"cpu", "cuda", "opencl", "template", "test", "testing"}
#: files and folders never copied from the template
_SKIP = {"__pycache__", ".pytest_cache", ".venv", "build", "dist"}


class TemplateError(InvalidArgument):
    """A bad provider name or output folder, or a missing template (exit status 2)."""


def check_name(name: str) -> str:
    """Return ``name`` if it is a usable provider name, else raise :class:`TemplateError`.

    A name is lower case, starts with a letter, holds only letters, digits and
    underscores (it becomes the Python package ``onnxrt_<name>``), and is not a
    Python keyword or the name of a provider onnxrt ships.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        hint = ""
        if isinstance(name, str) and name:
            fixed = re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_")
            if fixed and fixed[0].isalpha():
                hint = f" (try {fixed!r})"
        raise TemplateError(
            f"bad provider name {name!r}: use lower-case letters, digits and underscores, "
            f"starting with a letter{hint}"
        )
    if len(name) > _MAX_NAME:
        raise TemplateError(f"provider name {name!r} is longer than {_MAX_NAME} characters")
    if keyword.iskeyword(name) or name in _RESERVED:
        raise TemplateError(f"provider name {name!r} is reserved; choose another")
    return name


def camel(name: str) -> str:
    """``my_npu`` -> ``MyNpu``: the provider class's prefix."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


#: where a wheel install carries its copy of the template, beside this module (see setup.py)
_PACKAGED_TEMPLATE = Path(__file__).resolve().parent / "provider_template"


def template_dir() -> Path:
    """The template folder: ``$ONNXRT_PROVIDER_TEMPLATE``, else the source tree's, else
    the copy an installed wheel carries."""
    env = os.environ.get(TEMPLATE_ENV_VAR)
    if env:
        path = Path(env)
    elif (_SOURCE_TEMPLATE / "pyproject.toml").is_file():
        path = _SOURCE_TEMPLATE
    else:
        path = _PACKAGED_TEMPLATE
    if not (path / "pyproject.toml").is_file():
        where = f"${TEMPLATE_ENV_VAR}={env}" if env else str(path)
        raise TemplateError(
            f"the provider template is not at {where}; point {TEMPLATE_ENV_VAR} at a copy of "
            "onnxrt's plugins-template folder"
        )
    return path


def _substitute(text: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text)


def render_provider(name: str, output: str | Path | None = None) -> Path:
    """Render the provider template for ``name`` and return the new package's folder.

    :param name: the provider's short name, e.g. ``"acme"``.
    :param output: the folder to create; by default ``./onnxrt-<name>``. It must not
        exist, or be empty.
    :raises TemplateError: for a bad name, a non-empty output folder or a missing
        template (an :class:`onnxrt.InvalidArgument`, so the CLI exits with status 2).
    """
    check_name(name)
    src = template_dir()
    dest = Path(output) if output is not None else Path.cwd() / f"onnxrt-{name}"
    if dest.exists():
        if not dest.is_dir():
            raise TemplateError(f"output {str(dest)!r} exists and is not a folder")
        if any(dest.iterdir()):
            raise TemplateError(f"output folder {str(dest)!r} is not empty; choose a new folder")
    values = {"name": name, "Name": camel(name), "NAME": name.upper()}
    files: list[tuple[Path, Path]] = []
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP)
        rel_root = Path(root).relative_to(src)
        for fname in sorted(names):
            if fname.endswith((".pyc", ".pyo")):
                continue
            rel = rel_root / fname
            files.append((src / rel, Path(_substitute(str(rel), values))))
    dest.mkdir(parents=True, exist_ok=True)
    for from_path, rel in files:
        to_path = dest / rel
        to_path.parent.mkdir(parents=True, exist_ok=True)
        raw = from_path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            to_path.write_bytes(raw)  # binary files are copied as they are
        else:
            to_path.write_text(_substitute(text, values), encoding="utf-8")
        shutil.copymode(from_path, to_path)  # keeps .ci/run executable
    return dest


def _handler(args) -> int:
    out = render_provider(args.name, args.output)
    pkg = f"onnxrt_{args.name}"
    print(f"created {out} (distribution onnxrt-{args.name}, package {pkg}, "
          f"provider {camel(args.name)}ExecutionProvider)")
    print("next:")
    print(f"  cd {out}")
    print('  pip install -e ".[test]"')
    print("  python -m pytest -q")
    return 0


def add_command(subparsers) -> None:
    """Register ``new-provider NAME [--output DIR]`` on an argparse sub-parser set."""
    p = subparsers.add_parser(
        "new-provider",
        help="create a new execution-provider package from the template",
        description="Create onnxrt-NAME: a pip-installable execution provider package with "
                    "example kernels, a fusing example, tests and CI, ready to edit.",
    )
    p.add_argument("name", help="the provider's short name, e.g. acme (lower case, digits, underscores)")
    p.add_argument("--output", "-o", default=None,
                   help="folder to create (default: ./onnxrt-NAME); must not exist or be empty")
    p.set_defaults(func=_handler)
