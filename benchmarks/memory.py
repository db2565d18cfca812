"""Run one model with one runtime in this process and print its peak memory as JSON.

    python benchmarks/memory.py --runtime onnxrt --model m.onnx --feeds m.npz [--runs 5] [--threads 2]

``--runtime`` is ``onnxrt``, ``onnxruntime`` or ``reference`` (``onnx.reference``).
The process loads the model, runs it ``--runs`` times and prints
``{"maxrss_kb": ..., "create_s": ..., "median_s": ...}``: the high-water mark of its
resident memory (``VmHWM``, which is ``getrusage(RUSAGE_SELF).ru_maxrss`` without the
parent's peak that ``ru_maxrss`` keeps across ``exec``; the imports included, nothing
subtracted), the session creation time and the median run time. ``benchmarks/run.py``
starts one such process per runtime and model, so each peak is measured alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path


def _peak_rss_kb() -> int:
    """This process's resident-memory high-water mark, in KiB.

    ``ru_maxrss`` survives ``exec``: a process started by a large parent reports at least
    the parent's peak. Linux's ``VmHWM`` belongs to the new address space, so it is
    preferred where it exists.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _session(runtime: str, path: str, threads: int):
    if runtime == "onnxrt":
        import onnxrt as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    if runtime == "onnxruntime":
        import onnxruntime as rt

        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        return rt.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=("onnxrt", "onnxruntime", "reference"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--feeds", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import load_feeds

    t0 = time.perf_counter()
    sess = _session(a.runtime, a.model, a.threads)
    create = time.perf_counter() - t0
    if a.runtime == "reference":
        import onnx

        g = onnx.load(a.model, load_external_data=False).graph
        inits = {t.name for t in g.initializer}
        names = [i.name for i in g.input if i.name not in inits]
    else:
        names = [i.name for i in sess.get_inputs()]
    feeds = load_feeds(Path(a.feeds), names)
    times = []
    for _ in range(max(1, a.runs)):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    rss = _peak_rss_kb()
    print(json.dumps({"maxrss_kb": rss, "create_s": create, "median_s": statistics.median(times)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
