"""Throughput of batch inference with onnxrt.Predictor: one process, then Ray and Dask with 1 and 2 workers.

Runs the shipped digits MLP over a table of rows and prints rows per second. With
``--write`` the table and a description of the machine replace the results section of
``docs/scaleout.md``.

    python benchmarks/scaleout.py --write

Each engine run includes starting its workers and loading the model in each of them,
as a real job would; one untimed run first warms the engine up.
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import platform
import re
import time
from pathlib import Path

import numpy as np
import onnxrt

CPU = ["CPUExecutionProvider"]
DOC = Path(__file__).resolve().parent.parent / "docs" / "scaleout.md"
START, END = "<!-- scaleout-results:start -->", "<!-- scaleout-results:end -->"


def _rows(n: int) -> np.ndarray:
    data = np.load(str(importlib.resources.files("onnxrt") / "demo" / "digits_holdout.npz"))["pixels"]
    reps = -(-n // len(data))
    return np.tile(data, (reps, 1))[:n].astype(np.float32)


def _model() -> str:
    return str(importlib.resources.files("onnxrt") / "demo" / "digits_mlp.onnx")


def bench_single(x: np.ndarray, batch: int) -> float:
    p = onnxrt.Predictor(_model(), providers=CPU, num_threads=1)
    p({"pixels": x[:batch]})
    t = time.perf_counter()
    for i in range(0, len(x), batch):
        p({"pixels": x[i:i + batch]})
    return len(x) / (time.perf_counter() - t)


def bench_ray(x: np.ndarray, batch: int, workers: int) -> float:
    import ray
    from onnxrt.integrations.ray import predict_dataset

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        blocks = max(2 * workers, len(x) // (4 * batch))
        ds = ray.data.from_numpy(x).repartition(blocks).materialize()

        def run():
            out = predict_dataset(ds, _model(), providers=CPU, batch_size=batch, batch_format="numpy",
                                  concurrency=workers).materialize()
            assert out.count() == len(x)

        run()
        t = time.perf_counter()
        run()
        return len(x) / (time.perf_counter() - t)
    finally:
        ray.shutdown()


def bench_dask(x: np.ndarray, batch: int, workers: int) -> float:
    import dask.array as da
    from distributed import Client, LocalCluster
    from onnxrt.integrations.dask import predict_array

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster):
        # built on the workers from the small hold-out set, not shipped from here
        base = da.from_array(x[: 4 * batch], chunks=(4 * batch, 64))
        reps = -(-len(x) // len(base))
        arr = da.concatenate([base] * reps)[: len(x)].rechunk((4 * batch, 64)).persist()

        def run():
            # the predictor is released after each compute, so each run loads the model again
            y = predict_array(arr, _model(), output="label", providers=CPU, num_threads=1).compute()
            assert len(y) == len(x)

        run()
        t = time.perf_counter()
        run()
        return len(x) / (time.perf_counter() - t)


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cores} usable cores, {model}, Python {platform.python_version()}, load average {load:.1f} at start"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--write", action="store_true", help="write the results into docs/scaleout.md")
    args = ap.parse_args()
    desc = machine()
    x = _rows(args.rows)
    results = [("single process (no engine)", 1, bench_single(x, args.batch))]
    for workers in (1, 2):
        results.append(("Ray Data, predict_dataset", workers, bench_ray(x, args.batch, workers)))
    for workers in (1, 2):
        results.append(("Dask, predict_array", workers, bench_dask(x, args.batch, workers)))
    lines = [
        (
            f"{args.rows:,} rows of the digits MLP (64 -> 64 -> 10), batches of {args.batch}, "
            f"`num_threads=1` per worker. Machine: {desc}."
        ),
        "",
        "| engine | workers | rows/s |",
        "|---|---:|---:|",
    ] + [f"| {name} | {w} | {rate:,.0f} |" for name, w, rate in results]
    table = "\n".join(lines)
    print(table)
    if args.write:
        text = DOC.read_text()
        block = f"{START}\n{table}\n{END}"
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.DOTALL)
        DOC.write_text(text)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
