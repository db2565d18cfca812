"""What the ``onnxrt`` verbs share: the model arguments, sessions, feeds and output."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from .feeds import ANONYMOUS_DIMS, random_feeds

__all__ = [
    "UsageError",
    "LEVELS",
    "console",
    "styled",
    "error_console",
    "providers_arg",
    "parse_kv",
    "parse_dims",
    "check_dims",
    "load_npy",
    "add_model_args",
    "model_path",
    "session_options",
    "make_session",
    "make_feeds",
    "progress",
]

#: ``--level`` names and the :class:`~onnxrt.GraphOptimizationLevel` each selects.
LEVELS = {"disable": 0, "basic": 1, "extended": 2, "layout": 3, "all": 99}


class UsageError(Exception):
    """A problem with what the user asked for: reported in one line, exit status 2."""


def console(stderr: bool = False):
    """A rich console; when not writing to a terminal (and ``COLUMNS`` is unset), wide
    enough that tables keep their columns instead of truncating them to 80 characters.

    It reads no markup and no emoji codes: what the verbs print holds model and file
    names, node names, providers' reasons (``install onnxrt-cuda[cuda12]``), and rich
    would take their brackets for tags and drop them. Styles go in as
    :class:`rich.text.Text` (see :func:`styled`), never as markup in a string."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(highlight=False, stderr=stderr, width=width, markup=False, emoji=False)


def styled(*parts):
    """A :class:`rich.text.Text` of ``parts``: plain strings, or ``(text, style)`` pairs;
    every text is taken literally (brackets and colons print as they are)."""
    from rich.text import Text

    return Text.assemble(*[(str(p[0]), p[1]) if isinstance(p, tuple) else str(p) for p in parts])


def error_console():
    """A rich console on stderr, for progress bars (stdout keeps only the results)."""
    return console(stderr=True)


def providers_arg(value: str | None) -> list[str] | None:
    """``"a,b"`` -> ``["a", "b"]``; empty -> ``None`` (the default priority order)."""
    if not value:
        return None
    return [p.strip() for p in value.split(",") if p.strip()]


def parse_kv(items: Sequence[str] | None, what: str) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}``; anything without ``=`` is a usage error."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"bad {what} {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def parse_dims(items: Sequence[str] | None) -> dict[str, int]:
    """``--dim NAME=VALUE`` options -> ``{name: int}``."""
    dims = {}
    for k, v in parse_kv(items, "--dim").items():
        if not k:
            raise UsageError(f"bad --dim {'=' + v!r}: no dimension name before '=' (NAME=VALUE, or INPUT:AXIS=VALUE)")
        try:
            dims[k] = int(v)
        except ValueError:
            raise UsageError(f"--dim {k}={v!r}: not an integer") from None
        if dims[k] < 0:
            raise UsageError(f"--dim {k}={v}: must not be negative")
    return dims


def add_model_args(p: argparse.ArgumentParser, providers: bool = True, inputs: bool = True,
                   level: bool = True, model_optional: bool = False) -> None:
    """The arguments every model verb takes."""
    if model_optional:
        p.add_argument("model", nargs="?", help="path to an .onnx model; omit to run the demo")
    else:
        p.add_argument("model", help="path to an .onnx model")
    if providers:
        p.add_argument("--providers", help="comma-separated providers in priority order (names or aliases)")
    if inputs:
        p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file")
        p.add_argument("--dim", action="append", metavar="NAME=VALUE",
                      help="fix a symbolic dimension (INPUT:AXIS=VALUE for an unnamed one)")
        p.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    if level:
        p.add_argument("--level", choices=list(LEVELS), default="all", help="graph optimization level")


def model_path(args) -> Path:
    """The model argument as a path that exists."""
    path = Path(args.model)
    if not path.exists():
        raise UsageError(f"model file {str(path)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"{str(path)!r} is a directory, not a model file")
    return path


def session_options(args, **attrs):
    """:class:`~onnxrt.SessionOptions` from the common arguments, plus ``attrs``."""
    import onnxrt as ort

    so = ort.SessionOptions()
    for k, v in getattr(args, "dims", {}).items():
        so.add_free_dimension_override_by_name(k, v)
    if getattr(args, "level", None):
        so.graph_optimization_level = LEVELS[args.level]
    threads = getattr(args, "threads", None)
    if threads:
        so.intra_op_num_threads = threads
    for k, v in attrs.items():
        setattr(so, k, v)
    return so


def check_dims(dims: dict[str, int], inputs: Sequence) -> None:
    """Each ``--dim`` must fix something in the model's ``inputs`` (``get_inputs()``):
    ``NAME`` a symbolic dimension of some input, ``INPUT:AXIS`` an unnamed one (a typo
    would otherwise be ignored, and the run fail on the dimension it meant to fix).

    :raises UsageError: naming the option and what the model has instead."""
    by_input = {a.name: a for a in inputs}
    names = list(dict.fromkeys(d for a in inputs for d in (a.shape or []) if isinstance(d, str) and d))
    for key, value in dims.items():
        if key in names:
            continue
        opt = f"--dim {key}={value}"
        inp, sep, axis = key.rpartition(":")
        if not sep:
            known = ", ".join(repr(n) for n in names) or "none"
            raise UsageError(f"{opt}: no input of the model has a dimension named {key!r} (named dimensions: "
                             f"{known}; an unnamed one is fixed with --dim INPUT:AXIS=VALUE)")
        if inp not in by_input:
            raise UsageError(f"{opt}: the model has no input {inp!r} (inputs: {', '.join(by_input) or 'none'})")
        if not axis.isdigit():
            raise UsageError(f"{opt}: the axis {axis!r} is not a non-negative integer (INPUT:AXIS=VALUE)")
        shape = by_input[inp].shape
        if shape is None:
            raise UsageError(f"{opt}: input {inp!r} has no declared shape; give it as a file: --input {inp}=FILE.npy")
        ax = int(axis)
        if ax >= len(shape):
            raise UsageError(f"{opt}: input {inp!r} has rank {len(shape)} (shape {shape}), no axis {ax}")
        d = shape[ax]
        if isinstance(d, int):
            raise UsageError(f"{opt}: dimension {ax} of input {inp!r} is fixed at {d} (shape {shape})")
        if d and d not in ANONYMOUS_DIMS:
            raise UsageError(f"{opt}: dimension {ax} of input {inp!r} is named {d!r}; "
                             f"fix it by name: --dim {d}={value}")
        if d and d in dims:
            # the session fixes every axis declared '?' to --dim ?=N: this axis cannot differ
            raise UsageError(f"{opt}: dimension {ax} of input {inp!r} is declared {d!r}, which "
                             f"--dim {d}={dims[d]} already fixes; give one of the two")


def make_session(args, **attrs):
    """An :class:`~onnxrt.InferenceSession` for ``args.model`` with the common arguments;
    every ``--dim`` is checked against its inputs (:func:`check_dims`)."""
    import onnxrt as ort

    args.dims = parse_dims(getattr(args, "dim", None))
    path = model_path(args)
    sess = ort.InferenceSession(str(path), session_options(args, **attrs),
                                providers=providers_arg(getattr(args, "providers", None)))
    check_dims(args.dims, _declared_inputs(sess))
    return sess


def _declared_inputs(sess) -> list:
    """The session's inputs as the model declares them: ``get_inputs()`` shows the
    ``--dim`` overrides applied (``batch`` already 1), which would hide the names the
    options fixed."""
    from ..run.feeds import NodeArg

    proto = getattr(sess, "_proto", None)
    if proto is None:
        return sess.get_inputs()
    fed = {a.name for a in sess.get_inputs()}
    return [NodeArg(vi.name, vi.type) for vi in proto.graph.input if vi.name in fed]


#: the first bytes of every .npy file (numpy.lib.format.MAGIC_PREFIX)
_NPY_MAGIC = b"\x93NUMPY"


def load_npy(name: str, path: str) -> np.ndarray:
    """The array in ``path`` for ``--input name=path``: a .npy file, never unpickled.

    :raises UsageError: the file is missing or unreadable, not a .npy file (a text
        file, an .npz archive), or holds objects numpy would have to unpickle."""
    opt = f"--input {name}={path}"
    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
    except OSError as e:
        raise UsageError(f"{opt}: cannot read a .npy array ({e.strerror or e}: {path!r})") from None
    if head.startswith(b"PK\x03\x04"):
        raise UsageError(f"{opt}: cannot read a .npy array (it is an .npz archive; save the one array with "
                         "numpy.save)")
    if head != _NPY_MAGIC:
        raise UsageError(f"{opt}: cannot read a .npy array (not a .npy file: it does not start with numpy's "
                         "header; save arrays with numpy.save)")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):  # an object array: loading it would run pickle
            raise UsageError(f"{opt}: cannot read a .npy array (it holds Python objects, which are not loaded; "
                             "save a numeric, boolean or string array)") from None
        raise UsageError(f"{opt}: cannot read a .npy array ({e})") from None
    except OSError as e:
        raise UsageError(f"{opt}: cannot read a .npy array ({e})") from None


def make_feeds(args, sess) -> dict[str, np.ndarray]:
    """Inputs from ``--input NAME=FILE.npy``, and random ones (``--seed``) for the rest."""
    files = parse_kv(getattr(args, "input", None), "--input")
    known = {a.name for a in sess.get_inputs()} | {a.name for a in sess.get_overridable_initializers()}
    given = {}
    for name, f in files.items():
        if name not in known:
            raise UsageError(f"--input {name}: the model has no input {name!r} (inputs: {', '.join(sorted(known))})")
        given[name] = load_npy(name, f)
    dims = getattr(args, "dims", None) or parse_dims(getattr(args, "dim", None))
    return random_feeds(sess.get_inputs(), dims, getattr(args, "seed", 0), given)


def progress():
    """A progress bar on stderr (on a terminal only) that disappears when done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    con = error_console()
    # a bar is for a person watching: none in logs and pipes
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=con, transient=True, disable=not con.is_terminal)
