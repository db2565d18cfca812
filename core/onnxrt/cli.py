"""The ``onnxrt`` command.

``onnxrt run`` with no model runs the shipped demo (a digits classifier) on its
held-out samples. ``onnxrt run MODEL`` runs any model, with inputs from ``.npy``
files or generated at random. ``onnxrt providers`` lists the installed providers.
The other verbs (``explain``, ``profile``, ``bench``, ``compare``, ``optimize``)
live in :mod:`onnxrt.cli_tools`, one module each.

Bad input (not a model, a missing file, a bad ``--input``) prints a one-line error
and exits with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from .cli_tools.common import UsageError, add_model_args, console, make_feeds, make_session, providers_arg

__all__ = ["main", "build_parser", "UsageError"]

EXIT_USAGE = 2


def demo_paths() -> tuple[Path, Path]:
    """The shipped demo model and its held-out samples."""
    base = resources.files("onnxrt") / "demo"
    return Path(str(base / "digits_mlp.onnx")), Path(str(base / "digits_holdout.npz"))


# -- run ----------------------------------------------------------------------------


def _summary(v) -> str:
    if isinstance(v, np.ndarray):
        if v.size == 0:
            return "empty"
        if v.dtype.kind in "fiub" and v.dtype != object:
            a = v.astype(np.float64)
            return f"min {a.min():.4g}  max {a.max():.4g}  mean {a.mean():.4g}"
        flat = v.reshape(-1)[:4].tolist()
        return f"first values {flat}"
    if isinstance(v, list):
        return f"sequence of {len(v)}"
    return type(v).__name__


def cmd_run(args) -> int:
    """``onnxrt run [MODEL]``."""
    con = console()
    if args.model is None:
        return _run_demo(con, providers_arg(args.providers), args)
    path = Path(args.model)
    sess = make_session(args)
    feeds = make_feeds(args, sess)
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    dt = time.perf_counter() - t0
    from rich.table import Table

    table = Table(title=f"{path.name}: outputs")
    for col in ("output", "shape", "dtype", "summary"):
        table.add_column(col)
    for meta, v in zip(sess.get_outputs(), outs):
        shape = list(v.shape) if isinstance(v, np.ndarray) else "-"
        dtype = str(v.dtype) if isinstance(v, np.ndarray) else type(v).__name__
        table.add_row(meta.name, str(shape), dtype, _summary(v))
    con.print(table)
    counts: dict[str, int] = {}
    for d in sess.get_provider_assignment():
        counts[d["provider"]] = counts.get(d["provider"], 0) + 1
    con.print(f"latency {dt * 1000:.2f} ms; nodes per provider: "
              + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        for meta, v in zip(sess.get_outputs(), outs):
            if isinstance(v, np.ndarray):
                np.save(out / f"{_safe_name(meta.name)}.npy", v)
        con.print(f"saved outputs to {out}/")
    return 0


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _run_demo(con, providers, args) -> int:
    import onnxrt as ort

    model, data = demo_paths()
    held = np.load(data)
    x, y = held["pixels"], held["labels"]
    sess = ort.InferenceSession(str(model), providers=providers)
    sess.run(None, {"pixels": x[:1]})  # warm-up
    t0 = time.perf_counter()
    label, prob = sess.run(None, {"pixels": x})
    batch_ms = (time.perf_counter() - t0) * 1000
    singles = []
    for i in range(min(len(x), 50)):
        t = time.perf_counter()
        sess.run(None, {"pixels": x[i : i + 1]})
        singles.append((time.perf_counter() - t) * 1000)
    acc = float((label == y).mean())
    from rich.table import Table

    con.print(f"[bold]onnxrt demo[/bold]: {sess.get_modelmeta().description}")
    table = Table(title="first predictions on held-out digits")
    for col in ("sample", "predicted", "true", "confidence"):
        table.add_column(col, justify="right")
    for i in range(min(10, len(y))):
        mark = "" if label[i] == y[i] else " ✗"
        table.add_row(str(i), f"{label[i]}{mark}", str(y[i]), f"{prob[i, label[i]]:.3f}")
    con.print(table)
    providers_used = sorted({d["provider"] for d in sess.get_provider_assignment()})
    con.print(f"accuracy: {acc:.4f} ({int((label == y).sum())}/{len(y)} held-out samples)")
    con.print(f"latency: batch of {len(y)} in {batch_ms:.2f} ms; single sample median "
              f"{float(np.median(singles)):.3f} ms")
    con.print(f"provider: {', '.join(providers_used)} (session providers: {', '.join(sess.get_providers())})")
    return 0


# -- providers ------------------------------------------------------------------------


def cmd_providers(args) -> int:
    """``onnxrt providers``."""
    import onnxrt as ort
    from rich.table import Table

    table = Table(title="onnxrt execution providers")
    for col in ("provider", "aliases", "priority", "available", "reason", "distribution", "version", "details"):
        table.add_column(col)
    for p in ort.get_provider_info():
        table.add_row(p["name"], ", ".join(p["aliases"]), str(p["priority"]),
                      "yes" if p["available"] else "no", p["reason"], p["distribution"], p["version"],
                      p.get("details", ""))
    console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnxrt`` command."""
    p = argparse.ArgumentParser(prog="onnxrt", description="Run, inspect and benchmark ONNX models with onnxrt.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command")
    r = sub.add_parser("run", help="run a model (no model: the shipped digits demo)")
    add_model_args(r, model_optional=True)
    r.add_argument("--output", metavar="DIR", help="save outputs as .npy files in DIR")
    r.set_defaults(func=cmd_run)
    pr = sub.add_parser("providers", help="list installed providers, and why any is unavailable")
    pr.set_defaults(func=cmd_providers)
    from . import cli_tools

    cli_tools.add_commands(sub)
    # the provider scaffolding verb, where that module is present; an import error
    # inside it is a real error, so only its absence is checked
    if importlib.util.find_spec(f"{__package__}.scaffold") is not None:
        from . import scaffold

        scaffold.add_command(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnxrt`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from .errors import InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile, NotImplemented, OnnxRtError

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
