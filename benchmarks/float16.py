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
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "models" / "data"

__all__ = ["conv_net", "ln_block", "main"]


def _init(name: str, arr: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(arr, name)


def conv_net(rng: np.random.Generator, c: int = 32, hw: int = 128):
    """A float16 conv net: Conv, Relu, BatchNormalization, Conv, Sigmoid, Resize, Softmax."""
    from onnx import TensorProto, helper as h

    f = np.float16
    inits = [
        _init("w1", (rng.standard_normal((c, 3, 3, 3)) * 0.3).astype(f)),
        _init("b1", (rng.standard_normal(c) * 0.1).astype(f)),
        _init("scale", (rng.random(c) + 0.5).astype(f)), _init("bias", (rng.standard_normal(c) * 0.1).astype(f)),
        _init("mean", (rng.standard_normal(c) * 0.1).astype(f)), _init("var", (rng.random(c) + 0.5).astype(f)),
        _init("w2", (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(f)),
        _init("scales", np.array([1, 1, 2, 2], np.float32)),
        _init("shape", np.array([1, c, -1], np.int64)),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("BatchNormalization", ["r1", "scale", "bias", "mean", "var"], ["bn"]),
        h.make_node("Conv", ["bn", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        h.make_node("Sigmoid", ["c2"], ["s"]),
        h.make_node("Resize", ["s", "", "scales"], ["up"], mode="linear"),
        h.make_node("Reshape", ["up", "shape"], ["flat"]),
        h.make_node("Softmax", ["flat"], ["y"], axis=-1),
    ]
    g = h.make_graph(nodes, "conv_net", [h.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, hw, hw])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT16, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def ln_block(rng: np.random.Generator, s: int = 256, d: int = 256):
    """A float16 transformer block: LayerNormalization, MatMul, Gelu, MatMul, residual."""
    from onnx import TensorProto, helper as h

    f = np.float16
    inits = [
        _init("gamma", (rng.random(d) + 0.5).astype(f)), _init("beta", (rng.standard_normal(d) * 0.1).astype(f)),
        _init("w1", (rng.standard_normal((d, 4 * d)) / np.sqrt(d)).astype(f)),
        _init("b1", (rng.standard_normal(4 * d) * 0.1).astype(f)),
        _init("w2", (rng.standard_normal((4 * d, d)) / np.sqrt(4 * d)).astype(f)),
    ]
    nodes = [
        h.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["ln", "w1"], ["m1"]),
        h.make_node("Add", ["m1", "b1"], ["a1"]),
        h.make_node("Gelu", ["a1"], ["g"]),
        h.make_node("MatMul", ["g", "w2"], ["m2"]),
        h.make_node("Add", ["m2", "x"], ["res"]),
        h.make_node("LayerNormalization", ["res", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
    ]
    g = h.make_graph(nodes, "ln_block", [h.make_tensor_value_info("x", TensorProto.FLOAT16, [1, s, d])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT16, [1, s, d])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 20)], ir_version=9)


def _repo_feeds(name: str, rng: np.random.Generator, half: bool) -> dict:
    if name in ("resnet_small", "mobilenet_small"):
        x = rng.standard_normal((4, 3, 64, 64)).astype(np.float32)
        return {"image": x.astype(np.float16) if half else x}
    ids = rng.integers(0, 100, (2, 16)).astype(np.int64)
    if name == "transformer_encoder":
        return {"input_ids": ids}
    mask = np.ones((2, 16), np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((2, 16), np.int64)}


#: as tests/cpu/test_float16_models.py converts them
_REPO = {"resnet_small": {}, "mobilenet_small": {}, "transformer_encoder": {"op_block_list": ["Cast"]},
         "bert_tiny": {}}


class Case:
    """A float16 model, its feeds, and optionally its float32 original."""

    def __init__(self, name: str, model: bytes | str, feeds: dict, f32: tuple | None = None):
        self.name, self.model, self.feeds, self.f32 = name, model, feeds, f32


def _cases(published: bool) -> list[Case]:
    import onnx

    rng = np.random.default_rng(0)
    cases = [
        Case("conv_net (32 ch, 128x128)", conv_net(rng).SerializeToString(),
             {"x": rng.standard_normal((1, 3, 128, 128)).astype(np.float16)}),
        Case("ln_block (256 x 256)", ln_block(rng).SerializeToString(),
             {"x": rng.standard_normal((1, 256, 256)).astype(np.float16)}),
    ]
    try:
        from onnxconverter_common.float16 import convert_float_to_float16
    except ImportError:
        print("onnxconverter_common is missing: the repository's models are left out", file=sys.stderr)
    else:
        for name, kw in _REPO.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m16 = convert_float_to_float16(onnx.load(str(DATA / f"{name}.onnx")), **kw)
            cases.append(Case(name, m16.SerializeToString(), _repo_feeds(name, np.random.default_rng(0), True),
                              (str(DATA / f"{name}.onnx"), _repo_feeds(name, np.random.default_rng(0), False))))
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
