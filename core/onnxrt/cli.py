"""The ``onnxrt`` command.

``onnxrt run`` with no model runs the shipped demo (a digits classifier) on its
held-out samples. ``onnxrt run MODEL`` runs any model, with inputs from ``.npy``
files or generated at random. ``onnxrt providers`` lists the installed providers.

Bad input (not a model, a missing file, a bad ``--input``) prints a one-line error
and exits with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["main"]

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with what the user asked for: reported in one line, exit status 2."""


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _providers_arg(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [p.strip() for p in value.split(",") if p.strip()]


def demo_paths() -> tuple[Path, Path]:
    """The shipped demo model and its held-out samples."""
    base = resources.files("onnxrt") / "demo"
    return Path(str(base / "digits_mlp.onnx")), Path(str(base / "digits_holdout.npz"))


# -- run ----------------------------------------------------------------------------


def _parse_kv(items: Sequence[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"bad {what} {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _resolve_shape(arg, dims: dict[str, str]) -> list[int]:
    shape = []
    for i, d in enumerate(arg.shape or []):
        if isinstance(d, int):
            shape.append(d)
        elif isinstance(d, str) and d in dims:
            try:
                shape.append(int(dims[d]))
            except ValueError:
                raise UsageError(f"--dim {d}={dims[d]!r}: not an integer") from None
        else:
            name = d if isinstance(d, str) else f"dimension {i}"
            raise UsageError(
                f"input {arg.name!r} has an unresolved dimension {name!r}; fix it with --dim {name}=VALUE"
            )
    return shape


def _random_input(arg, dims: dict[str, str], rng) -> np.ndarray:
    from onnx import helper

    from .dtypes import np_dtype

    shape = _resolve_shape(arg, dims)
    t = arg.type
    if not t.startswith("tensor("):
        raise UsageError(f"input {arg.name!r} has type {t}; give it with --input {arg.name}=FILE.npy")
    elem = t[len("tensor("):-1]
    code = {"float": 1, "double": 11, "string": 8, "bool": 9, "float16": 10}.get(elem)
    if code is None:
        code = getattr(helper.TensorProto, elem.upper(), None)
    dt = np_dtype(code)
    if dt == object:
        return np.array(["text"] * int(np.prod(shape)), dtype=object).reshape(shape)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


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
    import onnxrt as ort

    console = _console()
    providers = _providers_arg(args.providers)
    if args.model is None:
        return _run_demo(console, providers, args)
    path = Path(args.model)
    if not path.exists():
        raise UsageError(f"model file {str(path)!r} does not exist")
    so = ort.SessionOptions()
    dims = _parse_kv(args.dim, "--dim")
    for k, v in dims.items():
        try:
            so.add_free_dimension_override_by_name(k, int(v))
        except ValueError:
            raise UsageError(f"--dim {k}={v!r}: not an integer") from None
    sess = ort.InferenceSession(str(path), so, providers=providers)
    files = _parse_kv(args.input, "--input")
    known = {a.name for a in sess.get_inputs()} | {a.name for a in sess.get_overridable_initializers()}
    rng = np.random.default_rng(args.seed)
    feeds = {}
    for name, f in files.items():
        if name not in known:
            raise UsageError(f"--input {name}: the model has no input {name!r} (inputs: {', '.join(sorted(known))})")
        try:
            feeds[name] = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UsageError(f"--input {name}={f}: cannot read a .npy array ({e})") from None
    for a in sess.get_inputs():
        if a.name not in feeds:
            feeds[a.name] = _random_input(a, dims, rng)
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
    console.print(table)
    counts: dict[str, int] = {}
    for d in sess.get_provider_assignment():
        counts[d["provider"]] = counts.get(d["provider"], 0) + 1
    console.print(f"latency {dt * 1000:.2f} ms; nodes per provider: "
                  + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        for meta, v in zip(sess.get_outputs(), outs):
            if isinstance(v, np.ndarray):
                np.save(out / f"{_safe_name(meta.name)}.npy", v)
        console.print(f"saved outputs to {out}/")
    return 0


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _run_demo(console, providers, args) -> int:
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

    console.print(f"[bold]onnxrt demo[/bold]: {sess.get_modelmeta().description}")
    table = Table(title="first predictions on held-out digits")
    for col in ("sample", "predicted", "true", "confidence"):
        table.add_column(col, justify="right")
    for i in range(min(10, len(y))):
        mark = "" if label[i] == y[i] else " ✗"
        table.add_row(str(i), f"{label[i]}{mark}", str(y[i]), f"{prob[i, label[i]]:.3f}")
    console.print(table)
    providers_used = sorted({d["provider"] for d in sess.get_provider_assignment()})
    console.print(f"accuracy: {acc:.4f} ({int((label == y).sum())}/{len(y)} held-out samples)")
    console.print(f"latency: batch of {len(y)} in {batch_ms:.2f} ms; single sample median "
                  f"{float(np.median(singles)):.3f} ms")
    console.print(f"provider: {', '.join(providers_used)} (session providers: {', '.join(sess.get_providers())})")
    return 0


# -- providers ------------------------------------------------------------------------


def cmd_providers(args) -> int:
    """``onnxrt providers``."""
    import onnxrt as ort
    from rich.table import Table

    table = Table(title="onnxrt execution providers")
    for col in ("provider", "aliases", "priority", "available", "reason", "distribution", "version"):
        table.add_column(col)
    for p in ort.get_provider_info():
        table.add_row(p["name"], ", ".join(p["aliases"]), str(p["priority"]),
                      "yes" if p["available"] else "no", p["reason"], p["distribution"], p["version"])
    _console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnxrt`` command."""
    p = argparse.ArgumentParser(prog="onnxrt", description="Run, inspect and benchmark ONNX models with onnxrt.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command")
    r = sub.add_parser("run", help="run a model (no model: the shipped digits demo)")
    r.add_argument("model", nargs="?", help="path to an .onnx model; omit to run the demo")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file")
    r.add_argument("--dim", action="append", metavar="NAME=VALUE", help="fix a symbolic dimension")
    r.add_argument("--providers", help="comma-separated providers in priority order")
    r.add_argument("--output", metavar="DIR", help="save outputs as .npy files in DIR")
    r.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    r.set_defaults(func=cmd_run)
    pr = sub.add_parser("providers", help="list installed providers, and why any is unavailable")
    pr.set_defaults(func=cmd_providers)
    try:
        from . import cli_tools

        cli_tools.add_commands(sub)
    except ImportError:
        pass
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
        print(f"onnxrt: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OnnxRtError as e:
        if args.debug:
            raise
        print(f"onnxrt: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
