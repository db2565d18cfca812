"""onnxrt against onnxruntime (and onnx.reference), model by model.

    python benchmarks/run.py [--quick] [--models a,b] [--runs 30] [--threads 2] [--no-write]

For each model (see ``benchmarks/models.py``) both runtimes run in this process at
the same thread count (onnxruntime ``intra_op_num_threads=N, inter_op_num_threads=1``,
onnxrt ``intra_op_num_threads=N``), alternating one run each after a warm-up, so
that load from other processes falls on both alike. Reported per model:

* median and p90 latency of each, and onnxrt's ratio to onnxruntime for both;
* peak memory: the ratio of the resident-memory high-water marks of two fresh
  processes, one per runtime, each loading the model and running it (``memory.py``);
* session creation time of both;
* the speedup over ``onnx.reference.ReferenceEvaluator`` (run in its own process,
  a few runs, skipped with a note when it fails or would take over 60 s).

The table is printed with rich and written, with the machine and the date, to
``docs/benchmarks.md`` (``--no-write`` skips that).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as rt

import onnxrt as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS, QUICK, get_model, load_feeds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_TIMEOUT_S = 60
MARK_START = "<!-- results: written by benchmarks/run.py -->"
MARK_END = "<!-- end of results -->"


def _percentile(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def _subprocess(runtime, model, feeds, runs, threads, timeout):
    cmd = [sys.executable, str(Path(__file__).with_name("memory.py")), "--runtime", runtime, "--model", str(model),
           "--feeds", str(feeds), "--runs", str(runs), "--threads", str(threads)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"over {timeout} s"
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["failed"])[-1]
        return None, last[:120]
    return json.loads(p.stdout.strip().splitlines()[-1]), ""


def _compare_outputs(a, b) -> str:
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return f"output shapes differ: {x.shape} vs {y.shape}"
        if x.dtype.kind == "f" and not np.allclose(x, y, rtol=1e-2, atol=1e-3):
            return f"outputs differ (max abs diff {float(np.max(np.abs(x - y))):.3g})"
    return ""


def bench_model(name: str, runs: int, threads: int, mem_runs: int, ref_runs: int, ort_spinning: bool = False) -> dict:
    """Measure one model; return its row of results."""
    bm = get_model(name)
    path, feeds_path = bm.prepare()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    t0 = time.perf_counter()
    s_ours = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    create_ours = time.perf_counter() - t0
    ro = rt.SessionOptions()
    ro.intra_op_num_threads = threads
    ro.inter_op_num_threads = 1
    ro.log_severity_level = 3  # not the exporter-style warnings about initializers listed as inputs
    if not ort_spinning:
        # onnxruntime's idle pool threads busy-wait after each run; alternating in one
        # process, that spinning lands on the onnxrt run that follows (resnet18: 57 ms
        # against 33 ms), while onnxruntime's own latency barely changes without it.
        ro.add_session_config_entry("session.intra_op.allow_spinning", "0")
    t0 = time.perf_counter()
    s_ref = rt.InferenceSession(str(path), ro, providers=["CPUExecutionProvider"])
    create_rt = time.perf_counter() - t0
    feeds = load_feeds(feeds_path, [i.name for i in s_ours.get_inputs()])
    note = _compare_outputs(s_ours.run(None, feeds), s_ref.run(None, feeds))
    for _ in range(2):
        s_ours.run(None, feeds)
        s_ref.run(None, feeds)
    ours, theirs = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        s_ours.run(None, feeds)
        t1 = time.perf_counter()
        s_ref.run(None, feeds)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        theirs.append(t2 - t1)
    del s_ours, s_ref
    row = {
        "model": name, "note": bm.note, "check": note,
        "median_ms": 1e3 * statistics.median(ours), "p90_ms": 1e3 * _percentile(ours, 90),
        "rt_median_ms": 1e3 * statistics.median(theirs), "rt_p90_ms": 1e3 * _percentile(theirs, 90),
        "create_s": create_ours, "rt_create_s": create_rt,
    }
    row["ratio"] = row["median_ms"] / row["rt_median_ms"]
    row["p90_ratio"] = row["p90_ms"] / row["rt_p90_ms"]
    row["best_ratio"] = min(ours) / min(theirs)
    m_ours, why1 = _subprocess("onnxrt", path, feeds_path, mem_runs, threads, 600)
    m_rt, why2 = _subprocess("onnxruntime", path, feeds_path, mem_runs, threads, 600)
    row["mem_mb"] = m_ours["maxrss_kb"] / 1024 if m_ours else None
    row["rt_mem_mb"] = m_rt["maxrss_kb"] / 1024 if m_rt else None
    row["mem_ratio"] = row["mem_mb"] / row["rt_mem_mb"] if m_ours and m_rt else None
    if not (m_ours and m_rt):
        row["check"] = (row["check"] + "; " if row["check"] else "") + f"memory: {why1 or why2}"
    ref, why = (None, "skipped") if ref_runs <= 0 else _subprocess(
        "reference", path, feeds_path, ref_runs, threads, REFERENCE_TIMEOUT_S)
    row["ref_ms"] = 1e3 * ref["median_s"] if ref else None
    row["ref_speedup"] = ref["median_s"] * 1e3 / row["median_ms"] if ref else None
    row["ref_note"] = why
    return row


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(rows) -> dict:
    return {
        "latency_geomean": geomean(r["ratio"] for r in rows),
        "p90_geomean": geomean(r["p90_ratio"] for r in rows),
        "best_geomean": geomean(r["best_ratio"] for r in rows),
        "latency_max": max(r["ratio"] for r in rows),
        "memory": geomean(r["mem_ratio"] for r in rows),
        "memory_max": max((r["mem_ratio"] or 0) for r in rows),
        "reference_geomean": geomean(r["ref_speedup"] for r in rows),
    }


COLUMNS = [
    ("model", "model"), ("median ms", "median_ms"), ("p90 ms", "p90_ms"), ("ORT median", "rt_median_ms"),
    ("ORT p90", "rt_p90_ms"), ("median ×ORT", "ratio"), ("p90 ×ORT", "p90_ratio"), ("best ×ORT", "best_ratio"), ("peak mem ×ORT", "mem_ratio"),
    ("create s", "create_s"), ("ORT create s", "rt_create_s"), ("× reference", "ref_speedup"),
]


def _cell(row, key):
    v = row.get(key)
    if key == "model":
        return v + (f" ({row['note']})" if row.get("note") else "")
    if v is None:
        return f"— ({row['ref_note'][:40]})" if key == "ref_speedup" else "—"
    if key in ("ratio", "p90_ratio", "best_ratio", "mem_ratio"):
        return f"{v:.2f}"
    if key == "ref_speedup":
        return f"{v:.0f}"
    if key.endswith("_s"):
        return f"{v:.2f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cores = os.cpu_count()
    from threadpoolctl import threadpool_info

    blas = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})"
                     for i in threadpool_info() if i.get("user_api") == "blas")
    return {"cpu": cpu, "cores": cores, "python": platform.python_version(), "numpy": np.__version__,
            "onnxruntime": rt.__version__, "onnxrt": ort.__version__, "blas": blas,
            "load": "%.1f %.1f %.1f" % os.getloadavg()}


def write_markdown(rows, summ, info, args, out: Path):
    lines = [
        f"Measured {datetime.date.today().isoformat()} with `python benchmarks/run.py"
        f"{' --quick' if args.quick else ''} --runs {args.runs} --threads {args.threads}`.",
        "",
        f"- CPU: {info['cpu']}, {info['cores']} usable cores; load average at the start "
        f"{info['load']}, at the end {info['load_end']}",
        f"- Python {info['python']}, numpy {info['numpy']} ({info['blas']}), onnxruntime {info['onnxruntime']}, "
        f"onnxrt {info['onnxrt']}",
        f"- both at {args.threads} threads (onnxruntime `intra_op_num_threads={args.threads}, "
        f"inter_op_num_threads=1`, spinning {'on' if args.ort_spinning else 'off'}), batch 1, "
        f"{args.runs} alternating runs after 2 warm-up runs each",
        "- \"× reference\": how many times faster than `onnx.reference.ReferenceEvaluator` onnxrt is",
        "- peak memory: ratio of the resident-memory high-water marks (`VmHWM`) of two fresh processes, "
        "one per runtime, each loading the "
        "model and running it; `onnx.reference` runs in its own process too, limited to "
        f"{REFERENCE_TIMEOUT_S} s",
        "",
        "| " + " | ".join(c for c, _ in COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r, k) for _, k in COLUMNS) + " |")
    lines += [
        "",
        "| summary | measured | target |",
        "|---|---|---|",
        f"| latency, geometric mean of median ratios | {summ['latency_geomean']:.2f}× | ≤ 1.5× |",
        f"| latency, worst model | {summ['latency_max']:.2f}× | ≤ 3× |",
        f"| p90 latency, geometric mean of ratios | {summ['p90_geomean']:.2f}× | |",
        f"| best run, geometric mean of ratios | {summ['best_geomean']:.2f}× | |",
        f"| peak memory, geometric mean (worst) | {summ['memory']:.2f}× ({summ['memory_max']:.2f}×) | ≤ 1.5× |",
        f"| speedup over onnx.reference, geometric mean | {summ['reference_geomean']:.0f}× | ≥ 20× |",
        "",
    ]
    checks = [f"- {r['model']}: {r['check']}" for r in rows if r.get("check")]
    if checks:
        lines += ["Notes:", "", *checks, ""]
    block = "\n".join([MARK_START, *lines, MARK_END])
    text = out.read_text() if out.exists() else ""
    if MARK_START in text and MARK_END in text:
        # keep the hand-written analysis around the generated results
        head, rest = text.split(MARK_START, 1)
        text = head + block + rest.split(MARK_END, 1)[1]
    else:
        text = block + "\n"
    out.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="onnxrt against onnxruntime, model by model")
    ap.add_argument("--models", help=f"comma-separated names (default: all): {', '.join(MODELS)}")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per runtime (default 30, quick 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer models and runs")
    ap.add_argument("--no-reference", action="store_true", help="skip onnx.reference")
    ap.add_argument("--ort-spinning", action="store_true",
                    help="leave onnxruntime's busy-waiting pool threads on (its default)")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else (QUICK if args.quick else list(MODELS))
    for n in names:
        get_model(n)
    if args.runs is None:
        args.runs = 10 if args.quick else 30
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(150, Console().width))
    info = machine()
    rows = []
    for n in names:
        with console.status(f"{n} …"):
            try:
                rows.append(bench_model(n, args.runs, args.threads, 3, 0 if args.no_reference else
                                        (1 if args.quick else 3), args.ort_spinning))
            except Exception as e:  # one broken model does not end the suite
                console.print(f"[red]{n}: {type(e).__name__}: {e}")
                continue
        r = rows[-1]
        console.print(f"{n}: {r['median_ms']:.2f} ms vs {r['rt_median_ms']:.2f} ms ({r['ratio']:.2f}×)")
    if not rows:
        return 1
    info["load_end"] = "%.1f %.1f %.1f" % os.getloadavg()
    table = Table(title=f"onnxrt vs onnxruntime, {args.threads} threads ({info['cpu']}, load {info['load']})")
    for c, _ in COLUMNS:
        table.add_column(c, justify="left" if c == "model" else "right")
    for r in rows:
        table.add_row(*[_cell(r, k) for _, k in COLUMNS])
    console.print(table)
    summ = summary(rows)
    console.print(
        f"latency geomean {summ['latency_geomean']:.2f}× (max {summ['latency_max']:.2f}×), "
        f"memory {summ['memory']:.2f}× (max {summ['memory_max']:.2f}×), "
        f"vs reference {summ['reference_geomean']:.0f}×"
    )
    for r in rows:
        if r.get("check"):
            console.print(f"[yellow]{r['model']}: {r['check']}")
    if not args.no_write:
        write_markdown(rows, summ, info, args, Path(args.output))
        console.print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
