"""onnxrt.quantization against onnxruntime's own tool, side by side.

    python benchmarks/quantize_tool.py [--threads 1] [--repeat 50] [--rounds 3] [--json OUT]

For the shipped digits MLP (top-1 on its 450 held-out digits, calibrated on the 1,344
first training rows of the same split), and the CNN and transformer encoder of
``tests/quantization/models.py`` (random weights, fixed seed; cosine and largest
error of the output against float32 on 32 test inputs, calibrated on 64 others):

1. accuracy of the int8 models written by ``onnxrt.quantization`` and by
   ``onnxruntime.quantization`` from the same calibration batches, each scored on
   the engine of its own package (QDQ and QOperator with MinMax, Entropy and
   Percentile, per-channel weights; dynamic);
2. the largest difference between onnxrt's and onnxruntime's outputs for the same
   int8 and float16 models (onnxruntime at its default level and at
   ``ORT_ENABLE_BASIC``, which leaves out its QDQ node-unit rewrites);
3. the time each tool takes to quantize (the two alternate, median of ``--rounds``);
4. onnxrt's latency of the int8 models (per-channel weights, and QDQ with per-tensor
   weights too) against the float32 one (batch 32; the
   sessions alternate run by run; the lowest of ``--rounds`` medians of ``--repeat``
   runs), plus a larger encoder
   (dim 128, sequence 64, feed-forward 512), and of the QDQ model onnxruntime's tool
   writes, run on onnxrt too.

Threads are set explicitly (``--threads``, both engines and numpy's BLAS), since an
unset count oversubscribes a small machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _threads_from_argv(default: int = 1) -> int:
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return default


# BLAS reads these once, at import: set them before numpy is imported
_T = str(_threads_from_argv())
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = _T

import numpy as np  # noqa: E402
import onnx  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.quantization.models import cnn, cnn_data, cosine, digits, encoder, encoder_data  # noqa: E402


class _Reader:
    def __init__(self, batches):
        self.batches, self.pos = list(batches), 0

    def get_next(self):
        if self.pos >= len(self.batches):
            return None
        self.pos += 1
        return self.batches[self.pos - 1]


def _batches(name, x, size):
    return [{name: x[i:i + size]} for i in range(0, len(x), size)]


def _onnxrt(model, threads):
    import onnxrt

    so = onnxrt.SessionOptions()
    so.intra_op_num_threads = threads
    return onnxrt.InferenceSession(model if isinstance(model, (str, bytes)) else model.SerializeToString(), so)


def _ort(model, threads, basic=False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if basic:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(model if isinstance(model, (str, bytes)) else model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


CONFIGS = [("QDQ", "MinMax"), ("QDQ", "Entropy"), ("QDQ", "Percentile"), ("QOperator", "MinMax"),
           ("QOperator", "Entropy"), ("QOperator", "Percentile"), ("dynamic", "")]


def _quantize_ours(src, cal, fmt, method):
    from onnxrt import quantization as q

    if fmt == "dynamic":
        return q.quantize_dynamic(src, None).model
    return q.quantize_static(src, None, q.NumpyDataReader(cal), quant_format=getattr(q.QuantFormat, fmt),
                             calibrate_method=getattr(q.CalibrationMethod, method), per_channel=True,
                             show_progress=False).model


def _quantize_ort(src, cal, fmt, method, tmp):
    import onnxruntime.quantization as oq

    out = str(Path(tmp) / f"ort_{fmt}_{method}.onnx")
    if fmt == "dynamic":
        oq.quantize_dynamic(src, out, weight_type=oq.QuantType.QInt8)
    else:
        oq.quantize_static(src, out, _Reader(cal), quant_format=getattr(oq.QuantFormat, fmt),
                           calibrate_method=getattr(oq.CalibrationMethod, method), per_channel=True,
                           activation_type=oq.QuantType.QInt8, weight_type=oq.QuantType.QInt8)
    return onnx.load(out)


def _score(kind, outs, ref, labels=None):
    if kind == "digits":
        return {"top1": float((outs[0] == labels).mean())}
    return {"cosine": cosine(outs[0], ref), "max_err": float(np.abs(outs[0].astype(np.float32) - ref).max())}


def _fmt_score(s: dict) -> str:
    return f"{s['top1']:.4f}" if "top1" in s else f"cos {s['cosine']:.5f}, max err {s['max_err']:.3g}"


def _workloads():
    path, x_train, x_test, y_test = digits()
    c, e = cnn(), encoder()
    tmp = tempfile.mkdtemp(prefix="quantize_tool_")
    for name, m in (("cnn", c), ("encoder", e)):
        onnx.save(m, str(Path(tmp) / f"{name}.onnx"))
    return tmp, [
        ("digits", path, _batches("pixels", x_train[:1344], 64), {"pixels": x_test}, y_test),
        ("cnn", str(Path(tmp) / "cnn.onnx"), _batches("x", cnn_data(64, 1), 16), {"x": cnn_data(32, 2)}, None),
        ("encoder", str(Path(tmp) / "encoder.onnx"), _batches("x", encoder_data(64, 1), 16),
         {"x": encoder_data(32, 2)}, None),
    ]


def _latency(sessions: dict, feeds, repeat: int) -> dict[str, float]:
    """Median latency (ms) of each session; the sessions alternate run by run."""
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feeds)
    times = {k: [] for k in sessions}
    for _ in range(repeat):
        for k, s in sessions.items():
            t = time.perf_counter()
            s.run(None, feeds)
            times[k].append((time.perf_counter() - t) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write every figure to this file")
    args = p.parse_args(argv)
    from onnxrt.quantization import convert_float_to_float16

    tmp, work = _workloads()
    results = {"threads": args.threads, "accuracy": [], "engines": [], "tool_time": [], "latency": []}
    print(f"threads {args.threads}\n")
    print("## accuracy of the int8 models (each on its own package's engine)\n")
    print("| model | format | method | float | onnxrt.quantization | onnxruntime.quantization |")
    print("|---|---|---|---|---|---|")
    ours_models = {}
    for name, src, cal, feeds, labels in work:
        ref_outs = _onnxrt(src, args.threads).run(None, feeds)
        ref = ref_outs[0] if name != "digits" else ref_outs[1]
        float_score = _score(name, ref_outs, ref, labels)
        for fmt, method in CONFIGS:
            t_ours, t_ort = [], []
            for _ in range(args.rounds):  # the two tools alternate
                t = time.perf_counter()
                ours = _quantize_ours(src, cal, fmt, method)
                t_ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                theirs = _quantize_ort(src, cal, fmt, method, tmp)
                t_ort.append(time.perf_counter() - t)
            ours_models[(name, fmt, method)] = ours
            so = _score(name, _onnxrt(ours, args.threads).run(None, feeds), ref, labels)
            st = _score(name, _ort(theirs, args.threads).run(None, feeds), ref, labels)
            print(f"| {name} | {fmt} | {method or '-'} | {_fmt_score(float_score)} | {_fmt_score(so)} "
                  f"| {_fmt_score(st)} |")
            results["accuracy"].append({"model": name, "format": fmt, "method": method, "float": float_score,
                                        "onnxrt": so, "onnxruntime": st})
            results["tool_time"].append({"model": name, "format": fmt, "method": method,
                                         "onnxrt_s": statistics.median(t_ours),
                                         "onnxruntime_s": statistics.median(t_ort)})
    print("\n## the same models on onnxrt and onnxruntime: largest output difference\n")
    print("| model | model kind | onnxruntime default level | onnxruntime basic level |")
    print("|---|---|---|---|")
    for name, src, cal, feeds, labels in work:
        kinds = [(f"int8 {fmt} {method}".strip(), ours_models[(name, fmt, method)]) for fmt, method in
                 (("QDQ", "MinMax"), ("QOperator", "MinMax"), ("dynamic", ""))]
        m16 = convert_float_to_float16(src, keep_io_types=True)
        kinds.append(("float16", m16))
        for kind, m in kinds:
            a = _onnxrt(m, args.threads).run(None, feeds)
            b = _ort(m, args.threads).run(None, feeds)
            c = _ort(m, args.threads, basic=True).run(None, feeds)
            k = 1 if name == "digits" else 0
            d_def = float(np.abs(a[k].astype(np.float64) - b[k]).max())
            d_basic = float(np.abs(a[k].astype(np.float64) - c[k]).max())
            extra = ""
            if name == "digits":
                extra = f" (labels differ on {int((a[0] != b[0]).sum())} of {len(a[0])})"
            print(f"| {name} | {kind} | {d_def:.3g}{extra} | {d_basic:.3g} |")
            results["engines"].append({"model": name, "kind": kind, "default": d_def, "basic": d_basic})
    print("\n## time to quantize (s, median of the alternating rounds)\n")
    print("| model | format | method | onnxrt.quantization | onnxruntime.quantization |")
    print("|---|---|---|---|---|")
    for r in results["tool_time"]:
        print(f"| {r['model']} | {r['format']} | {r['method'] or '-'} | {r['onnxrt_s']:.3f} "
              f"| {r['onnxruntime_s']:.3f} |")
    print("\n## onnxrt latency, int8 against float32 (ms, batch 32, lowest of the rounds' medians)\n")
    big = encoder(seed=0, layers=2, seq=64, dim=128, heads=4, ffn=512)
    big_src = str(Path(tmp) / "encoder128.onnx")
    onnx.save(big, big_src)
    speed = [(n, s, c, f) for n, s, c, f, _ in work]
    speed.append(("encoder-128", big_src, _batches("x", encoder_data(32, 1, seq=64, dim=128), 8),
                  {"x": encoder_data(32, 2, seq=64, dim=128)}))
    print("| model | float32 | int8 QDQ | int8 QDQ, per-tensor weights | int8 QOperator | int8 dynamic | float16 "
          "| int8 QDQ by onnxruntime's tool |")
    print("|---|---|---|---|---|---|---|---|")
    for name, src, cal, feeds in speed:
        sess = {"float32": _onnxrt(src, args.threads)}
        for fmt in ("QDQ", "QOperator", "dynamic"):
            m = ours_models.get((name, fmt, "MinMax" if fmt != "dynamic" else ""))
            if m is None:
                m = _quantize_ours(src, cal, fmt, "MinMax")
            sess[fmt] = _onnxrt(m, args.threads)
        from onnxrt import quantization as q

        # per-tensor weights: onnxrt's QDQ fusion turns every MatMul into QLinearMatMul
        # (per-column weights it leaves in float)
        per_tensor = q.quantize_static(src, None, q.NumpyDataReader(cal), show_progress=False).model
        sess["QDQ per tensor"] = _onnxrt(per_tensor, args.threads)
        sess["float16"] = _onnxrt(convert_float_to_float16(src, keep_io_types=True), args.threads)
        # the QDQ model onnxruntime's tool writes, on onnxrt: the same layout, so about the same speed
        sess["QDQ (onnxruntime's tool)"] = _onnxrt(_quantize_ort(src, cal, "QDQ", "MinMax", tmp), args.threads)
        # a shared machine's load comes in bursts: of several rounds, each session's
        # least disturbed median is kept
        rounds = [_latency(sess, feeds, args.repeat) for _ in range(args.rounds)]
        lat = {k: min(r[k] for r in rounds) for k in sess}
        base = lat["float32"]
        cells = [f"{lat['float32']:.3f}"] + [f"{lat[k]:.3f} ({lat[k] / base:.2f}x)"
                                            for k in ("QDQ", "QDQ per tensor", "QOperator", "dynamic", "float16",
                                                      "QDQ (onnxruntime's tool)")]
        print(f"| {name} | " + " | ".join(cells) + " |")
        results["latency"].append({"model": name, **lat})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
