"""Per-node time of onnxrt beside onnxruntime's on one published model.

    python -m benchmarks.published.nodes MODEL [--top 25] [--runs 20] [--threads 2]

Both runtimes profile the same feeds in one process, alternating run by run, and the
median of each node's time over the runs is printed, largest onnxrt first. Nodes are
matched by name; onnxruntime renames the nodes its own fusions make (``*_nchwc`` and
the like), so those are listed apart, with the input shapes its profiler records, to be
matched by shape. It finds where a model's gap is before the whole-model benchmark
(``run.py``) says how large it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections import defaultdict

import numpy as np

from .fetch import fetch_model
from .models import get
from .run import sessions

_SUFFIX = "_kernel_time"


def node_medians(events: list[dict]) -> tuple[dict[str, float], dict[str, dict]]:
    """Each node's median duration (µs) over a trace's runs, and its last event's args."""
    times: dict[str, list[float]] = defaultdict(list)
    args: dict[str, dict] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith(_SUFFIX):
            continue
        name = e["name"][: -len(_SUFFIX)]
        times[name].append(float(e["dur"]))
        args[name] = e.get("args", {})
    return {k: statistics.median(v) for k, v in times.items()}, args


def _run_median(events: list[dict]) -> float:
    runs = [float(e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    return statistics.median(runs) if runs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a key of the manifest (benchmarks/published/models.py)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    m = get(a.model)
    path = str(fetch_model(m))
    feeds = m.feeds(np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = sessions(path, a.threads, profile_prefix=os.path.join(tmp, "p"))
        for _ in range(3):  # warm-up, in the traces but a median over many runs shrugs it off
            ours.run(None, feeds)
            theirs.run(None, feeds)
        for _ in range(a.runs):
            ours.run(None, feeds)
            theirs.run(None, feeds)
        with open(ours.end_profiling()) as f:
            a_ev = json.load(f)
        with open(theirs.end_profiling()) as f:
            b_ev = json.load(f)
    ta, ia = node_medians(a_ev)
    tb, ib = node_medians(b_ev)
    print(f"{a.model}: run median, onnxrt {_run_median(a_ev):.1f} us, onnxruntime {_run_median(b_ev):.1f} us")
    print(f"sum of node medians: onnxrt {sum(ta.values()):.1f} us ({len(ta)} nodes), "
          f"onnxruntime {sum(tb.values()):.1f} us ({len(tb)} nodes)")
    print(f"{'onnxrt us':>10} {'ort us':>9}  {'op':22s} node")
    for n in sorted(ta, key=lambda k: -ta[k])[: a.top]:
        other = f"{tb[n]:9.1f}" if n in tb else f"{'-':>9}"
        print(f"{ta[n]:10.1f} {other}  {ia[n].get('op_name', '?'):22s} {n}")
    rest = sorted((k for k in tb if k not in ta), key=lambda k: -tb[k])[: a.top]
    if rest:
        print("onnxruntime's nodes with no onnxrt node of the same name:")
        for n in rest:
            print(f"{'':10} {tb[n]:9.1f}  {ib[n].get('op_name', '?'):22s} {n} {ib[n].get('input_type_shape', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
