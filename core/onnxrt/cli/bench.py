"""``onnxrt bench MODEL``: latency (median, p90) and throughput, optionally beside onnxruntime.

Both engines get the same inputs, warm-up and thread count, and run one after the
other, so the ratio compares like with like.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import Fail
from ..options import default_thread_count
from .common import UsageError, add_model_args, console, make_feeds, make_session, model_path, progress

__all__ = ["add_command", "cmd_bench", "latency_stats"]


def add_command(sub) -> None:
    """Add the ``bench`` verb."""
    p = sub.add_parser("bench", help="measure latency and throughput (optionally against onnxruntime)")
    add_model_args(p)
    p.add_argument("-n", "--runs", type=int, default=100, help="timed runs (default 100)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads for both engines (default: the cores this process may use)")
    p.add_argument("--compare", choices=["onnxruntime"], help="also time onnxruntime and print the ratio")
    p.set_defaults(func=cmd_bench)


def latency_stats(times_s: list[float], batch: int = 1) -> dict:
    """Median, p90, mean, min (ms) and throughput (runs/s and items/s) of run times in seconds."""
    ms = np.asarray(times_s, dtype=np.float64) * 1000
    median = float(np.median(ms))
    return {"median_ms": median, "p90_ms": float(np.percentile(ms, 90)), "mean_ms": float(ms.mean()),
            "min_ms": float(ms.min()), "runs_per_s": 1000 / median if median > 0 else float("inf"),
            "items_per_s": batch * 1000 / median if median > 0 else float("inf"), "runs": len(ms)}


def _time(run, warmup: int, runs: int, label: str) -> list[float]:
    times = []
    with progress() as bar:
        task = bar.add_task(f"{label}: warm-up", total=warmup + runs)
        for i in range(warmup + runs):
            if i == warmup:
                bar.update(task, description=f"{label}: timing")
            t0 = time.perf_counter()
            run()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
            bar.advance(task)
    return times


def _batch(feeds: dict) -> int:
    """The leading dimension of the first input (the batch, by convention), else 1."""
    for v in feeds.values():
        if isinstance(v, np.ndarray) and v.ndim >= 1:
            return int(v.shape[0])
    return 1


def cmd_bench(args) -> int:
    """Run the ``bench`` verb."""
    from rich.table import Table

    if args.runs < 1 or args.warmup < 0 or args.threads < 0:
        raise UsageError("-n must be at least 1, --warmup and --threads at least 0")
    threads = args.threads or default_thread_count()
    sess = make_session(args)
    feeds = make_feeds(args, sess)
    batch = _batch(feeds)
    results = {"onnxrt": latency_stats(_time(lambda: sess.run(None, feeds), args.warmup, args.runs, "onnxrt"),
                                       batch)}
    if args.compare == "onnxruntime":
        results["onnxruntime"] = latency_stats(
            _time(_onnxruntime_runner(args, feeds, threads), args.warmup, args.runs, "onnxruntime"), batch)
    table = Table(title=f"{model_path(args).name}: {args.runs} runs after {args.warmup} warm-up, "
                        f"{threads} thread(s), batch {batch}")
    for col, just in (("engine", "left"), ("median ms", "right"), ("p90 ms", "right"), ("mean ms", "right"),
                      ("min ms", "right"), ("runs/s", "right"), ("items/s", "right")):
        table.add_column(col, justify=just)
    for name, r in results.items():
        table.add_row(name, f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}", f"{r['mean_ms']:.3f}",
                      f"{r['min_ms']:.3f}", f"{r['runs_per_s']:.1f}", f"{r['items_per_s']:.1f}")
    con = console()
    con.print(table)
    con.print(f"providers: {', '.join(sess.get_providers())}")
    if "onnxruntime" in results:
        ratio = results["onnxrt"]["median_ms"] / results["onnxruntime"]["median_ms"]
        verdict = "slower" if ratio > 1 else "faster"
        factor = ratio if ratio > 1 else 1 / ratio
        con.print(f"ratio onnxrt/onnxruntime (median): {ratio:.2f} "
                  f"(onnxrt is {factor:.2f}x {verdict})")
    return 0


def _onnxruntime_runner(args, feeds, threads: int):
    try:
        import onnxruntime as rt
    except ImportError:
        raise UsageError("--compare onnxruntime needs the onnxruntime package: pip install onnxruntime") from None
    from .common import LEVELS

    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = {0: rt.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   1: rt.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   2: rt.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   99: rt.GraphOptimizationLevel.ORT_ENABLE_ALL}[LEVELS[args.level]]
    for name, value in args.dims.items():
        so.add_free_dimension_override_by_name(name, value)
    try:
        ref = rt.InferenceSession(str(model_path(args)), so, providers=["CPUExecutionProvider"])
        ref.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own error types
        raise Fail(f"onnxruntime could not run the model: {type(e).__name__}: {e}") from e
    return lambda: ref.run(None, feeds)
