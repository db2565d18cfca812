"""``onnxrt profile MODEL -o trace.json``: a Chrome trace and the time per op type.

The trace is in onnxruntime's event schema and opens in Perfetto
(https://ui.perfetto.dev) or chrome://tracing. ``--plot ops.png`` draws the time per
op type with matplotlib (the ``onnxrt[plot]`` extra).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..run.profiling import load_trace, op_time_table
from .common import UsageError, add_model_args, console, make_feeds, make_session, model_path, progress

__all__ = ["add_command", "cmd_profile", "plot_op_times"]


def add_command(sub) -> None:
    """Add the ``profile`` verb."""
    p = sub.add_parser("profile", help="profile a model: Chrome-trace JSON and time per op type")
    add_model_args(p)
    p.add_argument("-o", "--output", metavar="TRACE.json", default="onnxrt_profile.json",
                   help="where to write the trace (default onnxrt_profile.json)")
    p.add_argument("-n", "--runs", type=int, default=10, help="profiled runs (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="unprofiled runs first (default 1)")
    p.add_argument("--top", type=int, default=15, help="op types in the table (default 15)")
    p.add_argument("--plot", metavar="OPS.png", help="draw the time per op type (needs matplotlib)")
    p.set_defaults(func=cmd_profile)


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'onnxrt[plot]'") from None
    return plt


def plot_op_times(rows: list[dict], path, title: str, top: int = 15) -> None:
    """A horizontal bar chart of the time per run of each op type (the rest as "other")."""
    plt = _matplotlib()
    shown = rows[:top]
    rest = sum(r["total_us"] for r in rows[top:])
    labels = [r["op_type"] for r in shown] + (["other"] if rest else [])
    values = [r["total_us"] / 1000 for r in shown] + ([rest / 1000] if rest else [])
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(labels) + 1.2))
    bars = ax.barh(labels[::-1], values[::-1], color="#4C72B0")
    grand = sum(values) or 1.0
    for bar, v in zip(bars, values[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.2f} ms ({100 * v / grand:.0f}%)",
                va="center", fontsize=8)
    ax.set_xlabel("time per run (ms)")
    ax.set_title(title)
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd_profile(args) -> int:
    """Run the ``profile`` verb."""
    if args.runs < 1 or args.warmup < 0:
        raise UsageError("-n must be at least 1 and --warmup at least 0")
    if args.plot:
        _matplotlib()  # fail before the work, not after it
    out = Path(args.output)
    if out.parent and not out.parent.exists():
        raise UsageError(f"-o {out}: folder {str(out.parent)!r} does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        sess = make_session(args, enable_profiling=True, profile_file_prefix=os.path.join(tmp, "profile"))
        feeds = make_feeds(args, sess)
        # warm-up runs are profiled too (the profiler is per session); they are dropped below
        with progress() as bar:
            task = bar.add_task("profiling", total=args.warmup + args.runs)
            for _ in range(args.warmup + args.runs):
                sess.run(None, feeds)
                bar.advance(task)
        written = sess.end_profiling()
        events = load_trace(written)
    events = _drop_warmup(events, args.warmup)
    import json

    with open(out, "w") as f:
        json.dump(events, f)
    rows = op_time_table(events, runs=args.runs)
    _print_table(rows, args, out)
    if args.plot:
        plot_op_times(rows, args.plot, f"{model_path(args).name}: time per op type", args.top)
        console().print(f"plot written to {args.plot}")
    return 0


def _drop_warmup(events: list[dict], warmup: int) -> list[dict]:
    """The events without those of the first ``warmup`` runs."""
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if warmup == 0 or len(starts) <= warmup:
        return events
    cutoff = starts[warmup]  # the first kept run starts here

    def keep(e: dict) -> bool:
        if e.get("cat") == "Node" or e.get("name") == "model_run":
            return e["ts"] >= cutoff
        return True

    return [e for e in events if keep(e)]


def _print_table(rows: list[dict], args, out: Path) -> None:
    from rich.table import Table

    total_ms = sum(r["total_us"] for r in rows) / 1000
    table = Table(title=f"{model_path(args).name}: time per op type, mean of {args.runs} run(s)")
    for col, just in (("op type", "left"), ("provider", "left"), ("calls", "right"), ("ms/run", "right"),
                      ("µs/call", "right"), ("share", "right")):
        table.add_column(col, justify=just)
    for r in rows[: args.top]:
        table.add_row(r["op_type"], ", ".join(p.replace("ExecutionProvider", "") for p in r["providers"]),
                      f"{r['calls']:g}", f"{r['total_us'] / 1000:.3f}", f"{r['mean_us']:.1f}",
                      f"{100 * r['share']:.1f}%")
    if len(rows) > args.top:
        rest = rows[args.top:]
        table.add_row(f"({len(rest)} more)", "", f"{sum(r['calls'] for r in rest):g}",
                      f"{sum(r['total_us'] for r in rest) / 1000:.3f}", "",
                      f"{100 * sum(r['share'] for r in rest):.1f}%")
    table.add_row("total", "", f"{sum(r['calls'] for r in rows):g}", f"{total_ms:.3f}", "", "100%", style="bold")
    con = console()
    con.print(table)
    con.print(f"trace written to {out} (open it in https://ui.perfetto.dev or chrome://tracing)")
