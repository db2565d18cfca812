"""Per-node overhead of the executor, side by side with onnxruntime.

    python benchmarks/overhead.py [--nodes 1000] [--runs 30] [--numpy]

A chain of ``--nodes`` cheap nodes on a one-element tensor spends almost all its time
outside the arithmetic: in the executor, the kernel call and the array wrapper. The
time per node of such a chain is the overhead a node adds to any model. Both runtimes
run the same chains in this process, at ``ORT_DISABLE_ALL`` (so nothing folds the
chain away) and one thread, alternating runs so that outside load falls on both alike.
``--numpy`` adds a third column, alternating with the two: the same chain written out
as straight-line Python calling numpy (``v1 = np.negative(v0)``...), the floor of what
any executor calling numpy can reach.
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


#: op -> the numpy expression of one node of the chain (``{p}``: the previous value)
NUMPY = {
    "Relu": "np.maximum({p}, zero)",
    "Neg": "np.negative({p})",
    "Add": "np.add({p}, x)",
    "Mul": "np.multiply({p}, x)",
    "Reshape": "{p}.reshape(dims)",
}


def numpy_chain(op: str, n: int):
    """The chain of ``n`` ``op`` nodes as one straight-line Python function of ``x``."""
    lines = ["def chain(x):", "    v0 = x"]
    for i in range(1, n + 1):
        lines += [f"    v{i} = {NUMPY[op].format(p=f'v{i - 1}')}", f"    del v{i - 1}"]
    lines.append(f"    return [v{n}]")
    ns = {"np": np, "zero": np.zeros((), np.float32), "dims": (1,)}
    exec("\n".join(lines), ns)  # noqa: S102 - the benchmark's own source
    return ns["chain"]


def measure(n: int, runs: int, with_numpy: bool = False) -> list[tuple]:
    """(op, onnxrt µs/node, onnxruntime µs/node[, numpy µs/node]) for every chain."""
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
        runners = {"onnxrt": lambda: ours.run(None, feeds), "onnxruntime": lambda: theirs.run(None, feeds)}
        if with_numpy:
            chain, x = numpy_chain(op, n), feeds["x"]
            runners["numpy"] = lambda: chain(x)
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(3):
            for run in runners.values():
                run()
        for _ in range(runs):
            for name, run in runners.items():
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
        rows.append((op, *(statistics.median(times[name]) / n * 1e6 for name in runners)))
    return rows


def main(argv=None) -> int:
    """Print the per-node overhead table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--numpy", action="store_true", help="also time the chain as straight-line numpy calls")
    args = p.parse_args(argv)
    extra = " numpy µs/node |" if args.numpy else ""
    print(f"| op chain ({args.nodes} nodes, 1 element) | onnxrt µs/node | onnxruntime µs/node | ratio |{extra}")
    print("|---|---:|---:|---:|" + ("---:|" if args.numpy else ""))
    for op, ours, theirs, *floor in measure(args.nodes, args.runs, args.numpy):
        tail = f" {floor[0]:.2f} |" if floor else ""
        print(f"| {op} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x |{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
