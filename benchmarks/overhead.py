"""Per-node overhead of the executor, side by side with onnxruntime.

    python benchmarks/overhead.py [--nodes 1000] [--runs 30]

A chain of ``--nodes`` cheap nodes on a one-element tensor spends almost all its time
outside the arithmetic: in the run loop, the kernel call and the array wrapper. The
time per node of such a chain is the overhead a node adds to any model. Both runtimes
run the same chains in this process, at ``ORT_DISABLE_ALL`` (so nothing folds the
chain away) and one thread, alternating runs so that outside load falls on both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as rt
from onnx import TensorProto, helper

import onnxrt as ort

#: op -> how each node of the chain reads the previous value (and the input x)
CHAINS = {
    "Relu": lambda prev: [prev],
    "Neg": lambda prev: [prev],
    "Add": lambda prev: [prev, "x"],
    "Mul": lambda prev: [prev, "x"],
    "Reshape": lambda prev: [prev, "shape"],
}


def chain_model(op: str, n: int):
    """``n`` ``op`` nodes in a chain over a float tensor of one element."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node(op, CHAINS[op](prev), [f"v{i}"]))
        prev = f"v{i}"
    init = [helper.make_tensor("shape", TensorProto.INT64, [1], [1])] if op == "Reshape" else []
    g = helper.make_graph(nodes, f"{op}_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1])], initializer=init)
    m = helper.make_model(g, opset_imports=[helper.make_operatorsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def measure(n: int, runs: int) -> list[tuple[str, float, float]]:
    """(op, onnxrt µs/node, onnxruntime µs/node) for every chain."""
    rows = []
    feeds = {"x": np.ones(1, np.float32)}
    for op in CHAINS:
        model = chain_model(op, n)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        ours = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        rso = rt.SessionOptions()
        rso.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
        rso.intra_op_num_threads = 1
        theirs = rt.InferenceSession(model, rso, providers=["CPUExecutionProvider"])
        times: dict[str, list[float]] = {"onnxrt": [], "onnxruntime": []}
        for _ in range(3):
            ours.run(None, feeds)
            theirs.run(None, feeds)
        for _ in range(runs):
            for name, sess in (("onnxrt", ours), ("onnxruntime", theirs)):
                t = time.perf_counter()
                sess.run(None, feeds)
                times[name].append(time.perf_counter() - t)
        rows.append((op, statistics.median(times["onnxrt"]) / n * 1e6,
                     statistics.median(times["onnxruntime"]) / n * 1e6))
    return rows


def main(argv=None) -> int:
    """Print the per-node overhead table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args(argv)
    print(f"| op chain ({args.nodes} nodes, 1 element) | onnxrt µs/node | onnxruntime µs/node | ratio |")
    print("|---|---:|---:|---:|")
    for op, ours, theirs in measure(args.nodes, args.runs):
        print(f"| {op} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
