"""float16 models on the CPU provider: onnxrt with and without ``float16_compute``
against onnxruntime, alternating in one process at equal threads.

    python -m benchmarks.float16 [--threads 2] [--rounds 7] [--published]

Models:

* ``conv_net``: Conv, Relu, BatchNormalization, Conv, Sigmoid, Resize, Softmax in
  float16 (32 channels, 128x128), built here with ``onnx.helper``;
* ``ln_block``: a transformer block's LayerNormalization, MatMul, Gelu, MatMul,
  residual and LayerNormalization in float16 (256 tokens of 256);
* the repository's test models (``tests/models/data``) converted to float16 by
  ``onnxconverter_common`` as ``tests/cpu/test_float16_models.py`` converts them, and
  their float32 originals on onnxrt (the ``f32`` column);
* with ``--published``, the published float16 models of ``benchmarks/published``
  (IS-Net, Silero VAD) through its fetcher, when they can be had.

Each round runs every session once, in turn, so that a change of machine load hits all
of them alike; the table gives medians in milliseconds and onnxrt's time over
onnxruntime's. OpenBLAS and both runtimes get ``--threads`` threads.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.float16_models import DATA, REPO_CONVERSIONS, conv_net, ln_block, repo_feeds, repo_float16  # noqa: E402

__all__ = ["main"]


class Case:
    """A float16 model, its feeds, and optionally its float32 original."""

    def __init__(self, name: str, model: bytes | str, feeds: dict, f32: tuple | None = None):
        self.name, self.model, self.feeds, self.f32 = name, model, feeds, f32


def _cases(published: bool) -> list[Case]:
    rng = np.random.default_rng(0)
    cases = [
        Case("conv_net (32 ch, 128x128)", conv_net(rng, c=32, hw=128).SerializeToString(),
             {"x": rng.standard_normal((1, 3, 128, 128)).astype(np.float16)}),
        Case("ln_block (256 x 256)", ln_block(rng, s=256, d=256).SerializeToString(),
             {"x": rng.standard_normal((1, 256, 256)).astype(np.float16)}),
    ]
    if importlib.util.find_spec("onnxconverter_common") is None:
        print("onnxconverter_common is missing: the repository's models are left out", file=sys.stderr)
    else:
        for name in REPO_CONVERSIONS:
            cases.append(Case(name, repo_float16(name), repo_feeds(name, np.random.default_rng(0), True),
                              (str(DATA / f"{name}.onnx"), repo_feeds(name, np.random.default_rng(0), False))))
    if published:
        try:
            from .published.fetch import FetchError, fetch_model
            from .published.models import MODELS
        except ImportError as e:
            print(f"benchmarks.published is not usable ({e}): published models left out", file=sys.stderr)
        else:
            for pm in MODELS:
                if pm.tolerance != "float16":
                    continue
                try:
                    path = fetch_model(pm)
                except FetchError as e:
                    print(f"{pm.key}: not fetched ({e})", file=sys.stderr)
                    continue
                cases.append(Case(pm.key, str(path), pm.feeds(np.random.default_rng(0))))
    return cases


def _sessions(case: Case, threads: int) -> dict[str, Callable[[], object]]:
    import onnxruntime as ort

    import onnxrt

    def ours(disabled=()):
        so = onnxrt.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        s = onnxrt.InferenceSession(case.model, so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(disabled))
        return lambda: s.run(None, case.feeds)

    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    theirs = ort.InferenceSession(case.model, o, providers=["CPUExecutionProvider"])
    runs = {"onnxrt": ours(), "onnxrt, float16_compute off": ours(["float16_compute"]),
            "onnxruntime": lambda: theirs.run(None, case.feeds)}
    if case.f32 is not None:
        so = onnxrt.SessionOptions()
        so.intra_op_num_threads = threads
        s32 = onnxrt.InferenceSession(case.f32[0], so, providers=["CPUExecutionProvider"])
        runs["onnxrt, float32 model"] = lambda: s32.run(None, case.f32[1])
    return runs


def _agreement(case: Case, runs: dict) -> float:
    """onnxrt's largest difference from onnxruntime, in float16 spacings at the
    output's largest magnitude (over all float outputs)."""
    worst = 0.0
    for g, e in zip(runs["onnxrt"](), runs["onnxruntime"]()):
        g, e = np.asarray(g), np.asarray(e)
        if e.dtype.kind != "f" or e.size == 0:
            continue
        e32 = e.astype(np.float32)
        ulp = float(np.spacing(np.float16(np.abs(e32).max())))
        worst = max(worst, float(np.abs(g.astype(np.float32) - e32).max()) / max(ulp, 1e-30))
    return worst


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--published", action="store_true", help="add the published float16 models")
    args = ap.parse_args(argv)
    try:
        import threadpoolctl

        threadpoolctl.threadpool_limits(args.threads)
    except ImportError:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    rows = []
    from onnxrt.errors import OnnxRtError

    for case in _cases(args.published):
        try:
            runs = _sessions(case, args.threads)
        except OnnxRtError as e:
            print(f"{case.name}: left out, a session could not be made ({e})", file=sys.stderr)
            continue
        for fn in runs.values():
            fn()  # warm up
        times: dict[str, list[float]] = {k: [] for k in runs}
        rounds = args.rounds if "isnet" not in case.name else max(3, args.rounds // 3)
        for _ in range(rounds):
            for k, fn in runs.items():
                t = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((case.name, med, _agreement(case, runs)))
        print(f"{case.name}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items()), file=sys.stderr)
    print(f"\n{args.threads} threads, median of {args.rounds} alternating rounds (ms)\n")
    print("| model | onnxrt | onnxrt, transform off | onnxruntime | onnxrt / onnxruntime | off / onnxruntime "
          "| onnxrt, float32 model | ulps from onnxruntime |")
    print("|---|---|---|---|---|---|---|---|")
    for name, med, ulps in rows:
        ort_ms = med["onnxruntime"]
        f32 = med.get("onnxrt, float32 model")
        print(f"| {name} | {med['onnxrt']:.2f} | {med['onnxrt, float16_compute off']:.2f} | {ort_ms:.2f} "
              f"| {med['onnxrt'] / ort_ms:.2f} | {med['onnxrt, float16_compute off'] / ort_ms:.2f} "
              f"| {'' if f32 is None else f'{f32:.2f}'} | {ulps:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
