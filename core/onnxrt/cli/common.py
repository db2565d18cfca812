"""What the ``onnxrt`` verbs share: the model arguments, sessions, feeds and output."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from .feeds import random_feeds

__all__ = [
    "UsageError",
    "LEVELS",
    "console",
    "error_console",
    "providers_arg",
    "parse_kv",
    "parse_dims",
    "add_model_args",
    "model_path",
    "session_options",
    "make_session",
    "make_feeds",
    "progress",
]

#: ``--level`` names and the :class:`~onnxrt.GraphOptimizationLevel` each selects.
LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": 99}


class UsageError(Exception):
    """A problem with what the user asked for: reported in one line, exit status 2."""


def console(stderr: bool = False):
    """A rich console; when not writing to a terminal (and ``COLUMNS`` is unset), wide
    enough that tables keep their columns instead of truncating them to 80 characters."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(highlight=False, stderr=stderr, width=width)


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


def make_session(args, **attrs):
    """An :class:`~onnxrt.InferenceSession` for ``args.model`` with the common arguments."""
    import onnxrt as ort

    args.dims = parse_dims(getattr(args, "dim", None))
    path = model_path(args)
    return ort.InferenceSession(str(path), session_options(args, **attrs),
                                providers=providers_arg(getattr(args, "providers", None)))


def make_feeds(args, sess) -> dict[str, np.ndarray]:
    """Inputs from ``--input NAME=FILE.npy``, and random ones (``--seed``) for the rest."""
    files = parse_kv(getattr(args, "input", None), "--input")
    known = {a.name for a in sess.get_inputs()} | {a.name for a in sess.get_overridable_initializers()}
    given = {}
    for name, f in files.items():
        if name not in known:
            raise UsageError(f"--input {name}: the model has no input {name!r} (inputs: {', '.join(sorted(known))})")
        try:
            given[name] = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UsageError(f"--input {name}={f}: cannot read a .npy array ({e})") from None
    dims = getattr(args, "dims", None) or parse_dims(getattr(args, "dim", None))
    return random_feeds(sess.get_inputs(), dims, getattr(args, "seed", 0), given)


def progress():
    """A progress bar on stderr (on a terminal only) that disappears when done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    con = error_console()
    # a bar is for a person watching: none in logs and pipes
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=con, transient=True, disable=not con.is_terminal)
