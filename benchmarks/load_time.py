"""Session creation time for large graphs, side by side with onnxruntime.

    python benchmarks/load_time.py [--nodes 100000] [--calls 10000] [--repeats 3] [--profile]

Two models whose load cost is all structure, no weights:

* ``chain``: ``--nodes`` cheap nodes (Neg and Abs alternating) in one chain;
* ``calls``: ``--calls`` calls in a chain of one model-local function (a Constant and
  an Add), which the session inlines.

Both runtimes load the same serialized bytes in this process, alternating
(onnxrt, onnxruntime, onnxrt, ...) so that outside load falls on both alike, one
thread each, onnxruntime at its default optimization level and onnxrt at its own.
Each load is followed by one run whose result is checked, so that a runtime which
deferred its work to the first run is not credited for it. ``--profile`` prints
onnxrt's cProfile of one load of each model, by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # this machine's 2 cores: no oversubscription
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import onnxrt as ort  # noqa: E402

F = TensorProto.FLOAT


def chain_model(n: int) -> bytes:
    """``n`` Neg/Abs nodes in a chain over a one-element float tensor."""
    nodes = [helper.make_node("Abs" if i % 2 else "Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", F, [1])],
                              [helper.make_tensor_value_info(f"v{n}", F, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def calls_model(n: int) -> bytes:
    """``n`` chained calls of one local function ``AddOne`` (Constant 1, Add)."""
    fn = helper.make_function("local", "AddOne", ["x"], ["y"], [
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Add", ["x", "one"], ["y"])], [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("AddOne", [f"v{i}"], [f"v{i + 1}"], domain="local") for i in range(n)]
    graph = helper.make_graph(nodes, "calls", [helper.make_tensor_value_info("v0", F, [1])],
                              [helper.make_tensor_value_info(f"v{n}", F, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                             ir_version=9, functions=[fn]).SerializeToString()


def _onnxrt(data: bytes):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _onnxruntime(data: bytes):
    import onnxruntime as rt

    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return rt.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _load_and_run(make, data: bytes, expected: float) -> float:
    t0 = time.perf_counter()
    sess = make(data)
    (y,) = sess.run(None, {"v0": np.full(1, 1.0, np.float32)})
    seconds = time.perf_counter() - t0
    if float(y[0]) != expected:
        raise SystemExit(f"wrong result {y} (expected {expected})")
    return seconds


def _profile(data: bytes, label: str, top: int = 25) -> None:
    prof = cProfile.Profile()
    prof.enable()
    _onnxrt(data)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    print(f"\n== onnxrt load of {label}, by cumulative time\n{out.getvalue()}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000, help="nodes of the chain")
    ap.add_argument("--calls", type=int, default=10_000, help="calls of the local function")
    ap.add_argument("--repeats", type=int, default=3, help="loads of each model by each runtime")
    ap.add_argument("--profile", action="store_true", help="print onnxrt's cProfile of one load of each")
    args = ap.parse_args(argv)
    # Neg then Abs: the chain ends at |x| = 1; AddOne n times adds n
    models = {f"chain of {args.nodes} nodes": (chain_model(args.nodes), 1.0),
              f"{args.calls} calls of a local function": (calls_model(args.calls), 1.0 + args.calls)}
    # the first session of a process imports and registers every kernel: not load time
    for make in (_onnxrt, _onnxruntime):
        _load_and_run(make, chain_model(2), 1.0)
    print("| model | onnxrt (s) | onnxruntime (s) | ratio |\n|---|---|---|---|")
    for label, (data, expected) in models.items():
        mine, theirs = [], []
        for _ in range(args.repeats):
            mine.append(_load_and_run(_onnxrt, data, expected))
            theirs.append(_load_and_run(_onnxruntime, data, expected))
        a, b = statistics.median(mine), statistics.median(theirs)
        print(f"| {label} | {a:.2f} ({min(mine):.2f}-{max(mine):.2f}) | {b:.2f} ({min(theirs):.2f}-{max(theirs):.2f})"
              f" | {a / b:.1f}x |", flush=True)
    if args.profile:
        for label, (data, _) in models.items():
            _profile(data, label)


if __name__ == "__main__":
    main()
