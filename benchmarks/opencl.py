"""The OpenCL provider against the CPU provider on a few real models: median latency.

    python benchmarks/opencl.py [--runs 20] [--warmup 3] [--models resnet_small,mobilenet_small,light_squeezenet]

For each model it builds one session with ``["OpenCLExecutionProvider", "CPUExecutionProvider"]``
and one with the CPU provider alone, runs both ``--warmup`` times (the first OpenCL run
compiles the programs), then ``--runs`` times each, and prints a table: the median
latency of each, their ratio (OpenCL / CPU; above 1 means OpenCL is slower), the share
of nodes on OpenCL and the kernel launches per run. The light models get random weights
as in the test suite. The device, its driver and its OpenCL version head the output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import onnxrt as ort  # noqa: E402

OCL = "OpenCLExecutionProvider"


def _model_path(name: str, tmp: Path) -> tuple[Path, dict]:
    if name.startswith("light_"):
        from tests.models.test_real_models import LIGHT_DIR, _randomized

        path = tmp / f"{name}.onnx"
        onnx.save(_randomized(LIGHT_DIR / f"{name}.onnx", expose=False), path)
        return path, {}
    return ROOT / "tests" / "models" / "data" / f"{name}.onnx", {"batch": 1, "height": 64, "width": 64}


def _feeds(sess, dims: dict) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for a in sess.get_inputs():
        shape = [d if isinstance(d, int) else dims[d] for d in a.shape]
        out[a.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _median(sess, feeds, warmup: int, runs: int) -> float:
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default="resnet_small,mobilenet_small,light_squeezenet,light_resnet50")
    args = ap.parse_args(argv)
    why = ort.get_provider_info()
    info = next((p for p in why if p["name"] == OCL), None)
    if info is None or not info["available"]:
        print(f"OpenCL provider unavailable: {info['reason'] if info else 'not installed'}")
        return 1
    from onnxrt_opencl.runtime import get_runtime

    rt = get_runtime()
    d = rt.device
    print(f"device: {d.name.strip()} ({d.platform.name.strip()} {d.platform.version.strip()}, "
          f"driver {d.driver_version.strip()}, {d.max_compute_units} compute units)")
    print(f"{'model':<20} {'cpu ms':>9} {'opencl ms':>10} {'ratio':>7} {'on OpenCL':>10} {'launches':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path, dims = _model_path(name.strip(), Path(tmp))
            so = ort.SessionOptions()
            cpu = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            ocl = ort.InferenceSession(str(path), so, providers=[OCL, "CPUExecutionProvider"])
            feeds = _feeds(cpu, dims)
            t_cpu = _median(cpu, feeds, args.warmup, args.runs)
            t_ocl = _median(ocl, feeds, args.warmup, args.runs)
            before = rt.launches.count
            ocl.run(None, feeds)
            launches = rt.launches.count - before
            a = ocl.get_provider_assignment()
            share = sum(x["provider"] == OCL for x in a) / len(a)
            print(f"{name:<20} {t_cpu * 1e3:9.2f} {t_ocl * 1e3:10.2f} {t_ocl / t_cpu:7.2f} {share:10.0%} {launches:9d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
