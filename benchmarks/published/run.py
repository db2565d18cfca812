"""The published-model benchmark: onnxrt against onnxruntime on models others trained.

    python -m benchmarks.published.run [--models a,b] [--threads 2] [--seconds 3] [--no-write]

For each model of the manifest (``models.py``; fetched and hash-checked by ``fetch.py``):

* latency: both runtimes in one process at the same thread count (onnxrt
  ``intra_op_num_threads=N``; onnxruntime the same with ``inter_op_num_threads=1``
  and its threads' spinning off, as in ``benchmarks/run.py``),
  alternating one run each after a warm-up, so load from other processes falls on both
  alike; the median and p90 of each and onnxrt's ratio to onnxruntime for both. This
  runs in a child process twice: with the environment's ``OPENBLAS_CORETYPE`` and
  ``OPENBLAS_L2_SIZE`` as set, and with both unset (once only where the environment
  sets neither), each time with the OpenBLAS kernel that threadpoolctl reports;
* peak RSS: the resident-memory high-water mark (``VmHWM``) of a fresh process per
  runtime that loads the model and runs it, imports included, and the same above the
  process's resident size before the session was made;
* where onnxrt's time goes: the share of each op type in onnxrt's profiler
  (``SessionOptions.enable_profiling``), and the part of a run spent outside nodes.

The table, with the machine and the date, goes between markers in ``docs/benchmarks.md``
(``--no-write`` skips that); ``--json PATH`` also writes the raw results.
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
import tempfile
import time
from pathlib import Path

import numpy as np

from .fetch import fetch_model
from .models import MODELS, PublishedModel, get

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
MARK_START = "<!-- published results: written by benchmarks/published/run.py -->"
MARK_END = "<!-- end of published results -->"
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
CHILD_TIMEOUT_S = 1800


def sessions(path: str, threads: int, profile_prefix: str | None = None):
    """An onnxrt and an onnxruntime session of the model at ``path``, each on the CPU
    provider with ``threads`` intra-op threads; with ``profile_prefix`` both profile,
    their traces named from it."""
    import onnxruntime as rt

    import onnxrt as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix + "_onnxrt"
    ours = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ro = rt.SessionOptions()
    ro.intra_op_num_threads = threads
    ro.inter_op_num_threads = 1
    ro.log_severity_level = 3
    # onnxruntime's pool threads busy-wait after each run; in a shared process that
    # spinning slows the onnxrt run that follows (as benchmarks/run.py found), so it is
    # off, as there
    ro.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix:
        ro.enable_profiling = True
        ro.profile_file_prefix = profile_prefix + "_onnxruntime"
    theirs = rt.InferenceSession(path, ro, providers=["CPUExecutionProvider"])
    return ours, theirs


def _blas_kernel() -> str:
    """The OpenBLAS kernel (core type) numpy's OpenBLAS runs, as threadpoolctl says."""
    try:
        import threadpoolctl
    except ImportError:
        return "unknown (no threadpoolctl)"
    infos = [i for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
    return ", ".join(f"{i.get('architecture')} (OpenBLAS {i.get('version')})" for i in infos) or "no OpenBLAS"


def measure_latency(m: PublishedModel, threads: int, seconds: float) -> dict:
    """Median and p90 of both runtimes, alternating run by run."""
    ours, theirs = sessions(str(fetch_model(m)), threads)
    feeds = m.feeds(np.random.default_rng(0))
    for _ in range(2):  # warm-up: first-run allocations and caches
        ours.run(None, feeds)
        theirs.run(None, feeds)
    t0 = time.perf_counter()
    ours.run(None, feeds)
    theirs.run(None, feeds)
    pair = time.perf_counter() - t0
    runs = int(min(400, max(5, seconds / max(pair, 1e-6))))
    to, tt = [], []
    for i in range(runs):
        order = (ours, theirs) if i % 2 == 0 else (theirs, ours)
        for sess in order:
            t0 = time.perf_counter()
            sess.run(None, feeds)
            (to if sess is ours else tt).append(time.perf_counter() - t0)
    med_o, med_t = statistics.median(to), statistics.median(tt)
    p90_o, p90_t = float(np.percentile(to, 90)), float(np.percentile(tt, 90))
    return {"runs": runs, "onnxrt_median_ms": med_o * 1e3, "onnxruntime_median_ms": med_t * 1e3,
            "onnxrt_p90_ms": p90_o * 1e3, "onnxruntime_p90_ms": p90_t * 1e3,
            "ratio_median": med_o / med_t, "ratio_p90": p90_o / p90_t}


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def rss_child(runtime: str, key: str, threads: int, runs: int) -> dict:
    """Peak RSS of this process loading and running one model on one runtime (KiB)."""
    m = get(key)
    path = str(fetch_model(m))
    feeds = m.feeds(np.random.default_rng(0))
    if runtime == "onnxrt":
        import onnxrt as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        before = _vm("VmRSS")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    else:
        import onnxruntime as rt

        ro = rt.SessionOptions()
        ro.intra_op_num_threads = threads
        ro.inter_op_num_threads = 1
        ro.log_severity_level = 3
        before = _vm("VmRSS")
        sess = rt.InferenceSession(path, ro, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        sess.run(None, feeds)
    peak = _vm("VmHWM")
    return {"peak_kb": peak, "above_start_kb": peak - before}


def self_times(events: list[dict]) -> list[tuple[str, float]]:
    """(op type, self time in us) for each node event: a node's time less that of the
    nodes that ran inside it (an If's, Loop's or Scan's body), so nothing counts twice."""
    nodes = sorted((e for e in events if e.get("cat") == "Node" and e.get("ph") == "X"),
                   key=lambda e: (e.get("tid"), float(e["ts"]), -float(e.get("dur", 0))))
    out: list[list] = []
    stack: list[tuple[float, int, object]] = []  # (end, index in out, tid)
    for e in nodes:
        ts, dur, tid = float(e["ts"]), float(e.get("dur", 0)), e.get("tid")
        while stack and (stack[-1][2] != tid or stack[-1][0] <= ts):
            stack.pop()
        if stack:
            out[stack[-1][1]][1] -= dur  # the enclosing node's own time excludes this one
        out.append([e.get("args", {}).get("op_name", "?"), dur])
        stack.append((ts + dur, len(out) - 1, tid))
    return [(op, max(0.0, t)) for op, t in out]


def profile_onnxrt(m: PublishedModel, threads: int, runs: int) -> dict:
    """onnxrt's time per op type (share of node self time) and the share of a run outside nodes."""
    import onnxrt as ort
    from onnxrt.run.profiling import load_trace

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "p")
        sess = ort.InferenceSession(str(fetch_model(m)), so, providers=["CPUExecutionProvider"])
        feeds = m.feeds(np.random.default_rng(0))
        sess.run(None, feeds)  # warm-up, dropped below
        for _ in range(runs):
            sess.run(None, feeds)
        events = load_trace(sess.end_profiling())
    run_events = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                        key=lambda e: e["ts"])[1:]  # the warm-up run dropped
    if not run_events:
        return {"error": "the profile has no runs"}
    # the median run, whole: a mean over runs lets one slow call (a thread waking) dominate
    median_run = sorted(run_events, key=lambda e: float(e["dur"]))[len(run_events) // 2]
    lo, hi = float(median_run["ts"]), float(median_run["ts"]) + float(median_run["dur"])
    kept = [e for e in events if e.get("cat") == "Node" and lo <= float(e["ts"]) <= hi]
    total: dict[str, float] = {}
    calls: dict[str, int] = {}
    for op, t in self_times(kept):
        total[op] = total.get(op, 0.0) + t
        calls[op] = calls.get(op, 0) + 1
    node_us = sum(total.values())
    grand = node_us or 1.0
    ops = sorted(total, key=lambda o: -total[o])
    run_us = float(median_run["dur"])
    return {"ops": [{"op_type": o, "share": total[o] / grand, "calls": calls[o]} for o in ops[:6]],
            "nodes_per_run": sum(calls.values()), "run_us": run_us, "node_us": node_us,
            "constant_nodes_per_run": calls.get("Constant", 0),
            "outside_nodes_share": max(0.0, 1.0 - node_us / run_us) if run_us else None}


def _child(args: list[str], env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.published.run", *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def latency_pass(keys: list[str], threads: int, seconds: float) -> dict:
    """One process: every model's latency, and the OpenBLAS kernel in use there."""
    out = {"blas": _blas_kernel(), "env": {v: os.environ.get(v) for v in OPENBLAS_VARS}, "models": {}}
    for k in keys:
        m = get(k)
        try:
            out["models"][k] = measure_latency(m, threads, seconds / 3 if m.heavy else seconds)
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the rest go on
            out["models"][k] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(f"  {k}: {out['models'][k]}", file=sys.stderr, flush=True)
    return out


def _geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def _kib(kb: float) -> str:
    return f"{kb / 1024:.0f}"


def render(res: dict) -> str:
    """The markdown results: environment, the latency and memory table, the profile."""
    lines = [MARK_START, ""]
    lines.append(f"Measured {res['date']} on {res['machine']}, {res['threads']} threads for both runtimes, "
                 f"onnxruntime {res['onnxruntime']}, numpy {res['numpy']}; each model run alternately on "
                 f"the two runtimes in one process for about {res['seconds']:g} s (a third of that for "
                 "the two 1024x1024 nets). Ratios are onnxrt / onnxruntime: below 1 onnxrt is faster "
                 "or smaller.")
    lines.append("")
    passes = res["passes"]
    for label, p in passes.items():
        env = ", ".join(f"{k}={v}" for k, v in p["env"].items() if v) or "neither variable set"
        lines.append(f"- pass **{label}**: {env}; OpenBLAS kernel in use: {p['blas']}")
    if len(passes) == 1:
        lines.append("- the environment sets neither OPENBLAS_CORETYPE nor OPENBLAS_L2_SIZE, so the pass with "
                     "both unset is the same pass and was not repeated")
    lines.append("")
    first = next(iter(passes))
    head = "| model | kind | onnxruntime median ms | onnxrt median ms | ratio | p90 ratio |"
    sep = "|---|---|---:|---:|---:|---:|"
    for label in list(passes)[1:]:
        head += f" ratio ({label}) |"
        sep += "---:|"
    head += " peak RSS MiB ort / onnxrt | RSS ratio | above start ratio |"
    sep += "---:|---:|---:|"
    lines += [head, sep]
    ratios: dict[str, list[float]] = {label: [] for label in passes}
    rss_ratios = []
    for k in res["keys"]:
        m = get(k)
        lat = passes[first]["models"].get(k, {})
        if "error" in lat:
            row = f"| {k} | {m.kind} | error: {lat['error']} | | | |"
        else:
            row = (f"| {k} | {m.kind} | {lat['onnxruntime_median_ms']:.3g} | {lat['onnxrt_median_ms']:.3g} | "
                   f"{lat['ratio_median']:.2f} | {lat['ratio_p90']:.2f} |")
            ratios[first].append(lat["ratio_median"])
        for label in list(passes)[1:]:
            other = passes[label]["models"].get(k, {})
            if "ratio_median" in other:
                ratios[label].append(other["ratio_median"])
                row += f" {other['ratio_median']:.2f} |"
            else:
                row += " error |"
        mem = res["rss"].get(k, {})
        if "onnxrt" in mem and "onnxruntime" in mem:
            r = mem["onnxrt"]["peak_kb"] / mem["onnxruntime"]["peak_kb"]
            above = mem["onnxrt"]["above_start_kb"] / max(1, mem["onnxruntime"]["above_start_kb"])
            rss_ratios.append(r)
            row += (f" {_kib(mem['onnxruntime']['peak_kb'])} / {_kib(mem['onnxrt']['peak_kb'])} | {r:.2f} | "
                    f"{above:.2f} |")
        else:
            row += f" {mem.get('error', 'n/a')} | | |"
        lines.append(row)
    lines.append("")
    for label, rs in ratios.items():
        if rs:
            lines.append(f"- pass {label}: latency geometric mean **{_geomean(rs):.2f}x** onnxruntime over "
                         f"{len(rs)} models; worst {max(rs):.2f}x; {sum(r <= 2 for r in rs)} of {len(rs)} "
                         f"within 2x")
    if rss_ratios:
        lines.append(f"- peak RSS: worst {max(rss_ratios):.2f}x onnxruntime, geometric mean "
                     f"{_geomean(rss_ratios):.2f}x; {sum(r <= 1.3 for r in rss_ratios)} of {len(rss_ratios)} "
                     f"within 1.3x")
    agree = res.get("agree")
    if agree:
        lines.append(f"- agreement with onnxruntime (tests/published): {agree}")
    lines += ["", "Where onnxrt's time goes (its profiler, median run; each op type's share of the time in "
              "nodes, a node's own time without the nodes inside its If/Loop/Scan bodies; the part of a "
              "run spent outside nodes: feed checks, dispatch, fetches):", "",
              "| model | nodes executed/run | run ms | outside nodes | top op types (share of node time) |",
              "|---|---:|---:|---:|---|"]
    for k in res["keys"]:
        p = res["profile"].get(k)
        if not p or "error" in p:
            lines.append(f"| {k} | | | | {p.get('error', 'n/a') if p else 'n/a'} |")
            continue
        ops = ", ".join(f"{o['op_type']} {100 * o['share']:.0f}%" for o in p["ops"])
        outside = f"{100 * p['outside_nodes_share']:.0f}%" if p["outside_nodes_share"] is not None else "n/a"
        consts = f" ({p['constant_nodes_per_run']:g} Constant)" if p.get("constant_nodes_per_run") else ""
        lines.append(f"| {k} | {p['nodes_per_run']:g}{consts} | {p['run_us'] / 1000:.3g} | {outside} | {ops} |")
    lines += ["", MARK_END]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    """Replace the text between the markers in docs/benchmarks.md (append the markers once)."""
    doc = DOC.read_text()
    if MARK_START in doc and MARK_END in doc:
        pre, rest = doc.split(MARK_START, 1)
        _, post = rest.split(MARK_END, 1)
        doc = pre + text + post
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(doc)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with the internal ``--child-*`` options, one part of it)."""
    ap = argparse.ArgumentParser(description="onnxrt against onnxruntime on published models")
    ap.add_argument("--models", help="comma-separated keys (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="time per model and runtime (about)")
    ap.add_argument("--profile-runs", type=int, default=5)
    ap.add_argument("--rss-runs", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--agree", help="a line on agreement to print under the table (the tests' result)")
    ap.add_argument("--from-json", type=Path, help="render the results of an earlier --json run, measuring nothing")
    ap.add_argument("--child-latency", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-rss", nargs=2, metavar=("RUNTIME", "KEY"), help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", metavar="KEY", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    keys = a.models.split(",") if a.models else [m.key for m in MODELS]
    for k in keys:
        get(k)
    if a.child_latency:
        print(json.dumps(latency_pass(keys, a.threads, a.seconds)))
        return 0
    if a.child_rss:
        print(json.dumps(rss_child(a.child_rss[0], a.child_rss[1], a.threads, a.rss_runs)))
        return 0
    if a.child_profile:
        print(json.dumps(profile_onnxrt(get(a.child_profile), a.threads, a.profile_runs)))
        return 0

    if a.from_json:
        res = json.loads(a.from_json.read_text())
        if a.agree:
            res["agree"] = a.agree
        text = render(res)
        print(text)
        if not a.no_write:
            write_doc(text)
        return 0
    import onnxruntime

    for k in keys:  # fetch first, so that no download falls inside a measurement
        fetch_model(k)
    base = ["--models", ",".join(keys), "--threads", str(a.threads), "--seconds", str(a.seconds)]
    passes = {}
    print("latency, OpenBLAS variables as set", file=sys.stderr)
    passes["as set"] = _child([*base, "--child-latency"])
    if any(os.environ.get(v) for v in OPENBLAS_VARS):
        env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_VARS}
        print("latency, OpenBLAS variables unset", file=sys.stderr)
        passes["unset"] = _child([*base, "--child-latency"], env)
    rss: dict[str, dict] = {}
    prof: dict[str, dict] = {}
    for k in keys:
        rss[k] = {}
        for runtime in ("onnxruntime", "onnxrt"):
            try:
                rss[k][runtime] = _child(["--threads", str(a.threads), "--rss-runs", str(a.rss_runs),
                                          "--child-rss", runtime, k])
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                rss[k] = {"error": str(e)[:200]}
                break
        try:
            prof[k] = _child(["--threads", str(a.threads), "--profile-runs",
                              str(2 if get(k).heavy else a.profile_runs), "--child-profile", k])
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            prof[k] = {"error": str(e)[:200]}
        print(f"  {k}: rss {rss[k]}, profile {prof[k].get('ops', prof[k])}", file=sys.stderr, flush=True)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"{platform.python_implementation()} {platform.python_version()}",
           "threads": a.threads, "seconds": a.seconds, "onnxruntime": onnxruntime.__version__,
           "numpy": np.__version__, "keys": keys, "passes": passes, "rss": rss, "profile": prof,
           "agree": a.agree}
    text = render(res)
    print(text)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    if not a.no_write:
        write_doc(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
