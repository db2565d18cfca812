"""``onnxrt run [MODEL]``: run a model and print a summary of each output.

With no model it runs the shipped demo (a digits classifier) on its held-out samples.
With a model, inputs come from ``.npy`` files (``--input NAME=FILE.npy``) or are
generated at random; ``--output DIR`` saves the outputs as ``.npy`` files.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

import numpy as np

from .common import add_model_args, console, make_feeds, make_session, providers_arg, styled

__all__ = ["add_command", "cmd_run", "demo_paths"]


def add_command(sub) -> None:
    """Add the ``run`` verb."""
    r = sub.add_parser("run", help="run a model (no model: the shipped digits demo)")
    add_model_args(r, model_optional=True)
    r.add_argument("--output", metavar="DIR", help="save outputs as .npy files in DIR")
    r.set_defaults(func=cmd_run)


def demo_paths() -> tuple[Path, Path]:
    """The shipped demo model and its held-out samples."""
    base = resources.files("onnxrt") / "demo"
    return Path(str(base / "digits_mlp.onnx")), Path(str(base / "digits_holdout.npz"))


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
    # the first run pays one-time costs (an OpenCL device compiles its kernels, buffers
    # are allocated): it is a warm-up, and the latency is that of the second run
    t0 = time.perf_counter()
    sess.run(None, feeds)
    first = time.perf_counter() - t0
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
    con.print(f"latency {dt * 1000:.2f} ms, timed after one untimed warm-up run (which took "
              f"{first * 1000:.2f} ms: a first run pays one-time setup, such as kernel compilation)")
    con.print("nodes per provider: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
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

    con.print(styled(("onnxrt demo", "bold"), f": {sess.get_modelmeta().description}"))
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
