"""The ``onnxrt`` command and the tools behind it.

One module a verb: :mod:`.run` (``run``, the shipped demo), :mod:`.providers`,
:mod:`.explain`, :mod:`.profile`, :mod:`.bench`, :mod:`.compare` (also
:func:`~onnxrt.cli.compare.compare_models` for Python), :mod:`.optimize` and
:mod:`.scaffold` (``new-provider``, which renders ``plugins-template/``); what they
share is in :mod:`.common` and :mod:`.feeds`. Each verb module has
``add_command(subparsers)``, which adds its verb with a ``func`` default that takes the
parsed arguments and returns the exit status.

The runtime never imports this package, so ``import onnxrt`` and a session's runs load
neither ``rich`` nor matplotlib; the verbs import them when they print or plot.

Bad input (not a model, a missing file, a bad ``--input``) prints a one-line error
and exits with status 2; ``--debug`` (before or after the verb) shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import Sequence

from . import bench, compare, explain, optimize, profile, providers, run, scaffold
from .common import UsageError

__all__ = ["main", "build_parser", "UsageError", "EXIT_USAGE"]

#: the exit status of a usage error (a bad argument, a missing or unreadable model)
EXIT_USAGE = 2

_VERBS = (run, providers, explain, profile, bench, compare, optimize, scaffold)
#: modules, maybe not installed, whose ``register(subparsers)`` adds more verbs
_OPTIONAL_VERBS = ("onnxrt.quantization.cli",)


def _find(module: str) -> bool:
    """Whether ``module`` can be imported; a missing parent package is absence too, but
    an error inside a module that is present is not hidden."""
    parent = module.rpartition(".")[0]
    if parent and not _find(parent):
        return False
    return importlib.util.find_spec(module) is not None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnxrt`` command."""
    p = argparse.ArgumentParser(prog="onnxrt", description="Run, inspect and benchmark ONNX models with onnxrt.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command")
    for verb in _VERBS:
        verb.add_command(sub)
    for name in _OPTIONAL_VERBS:
        if _find(name):
            importlib.import_module(name).register(sub)
    for verb_parser in sub.choices.values():
        # --debug after the verb too; SUPPRESS, so that a verb given without it keeps
        # the value parsed before the verb instead of resetting it to False
        verb_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                 help="show tracebacks on errors")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnxrt`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from ..errors import InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile, NotImplemented, OnnxRtError

    try:
        return int(args.func(args) or 0)
    except (UsageError, InvalidProtobuf, NoSuchFile, InvalidArgument, InvalidGraph, NotImplemented) as e:
        if args.debug:
            raise
        print(f"onnxrt: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except OnnxRtError as e:
        if args.debug:
            raise
        print(f"onnxrt: error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
