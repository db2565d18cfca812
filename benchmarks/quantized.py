"""Latency of quantized and contrib-op models: onnxrt against onnxruntime, side by side.

    python benchmarks/quantized.py [--threads 2] [--repeat 30] [--markdown] [--only TEXT ...]

Both engines run in this one process with the same number of threads (onnxruntime's
``SessionOptions.intra_op_num_threads`` and onnxrt's, which also bounds numpy's BLAS).
The models are made here from the test models in ``tests/models/data``:

* a ResNet-style CNN and a transformer encoder, each quantized by
  ``onnxruntime.quantization`` three ways: dynamic, static QDQ and static QOperator
  (calibrated on seeded random data);
* the BERT-like ``bert_tiny.onnx`` rewritten by ``onnxruntime.transformers`` into
  com.microsoft ops (EmbedLayerNormalization, Attention, SkipLayerNormalization, ...),
  and that model quantized dynamically (QAttention, QEmbedLayerNormalization, ...);
* the transformer encoder with 4-bit weights (``MatMulNBitsQuantizer``: MatMulNBits);
* the bidirectional LSTM tagger quantized dynamically (DynamicQuantizeLSTM);
* a tiny Llama as onnxruntime's generative-AI model builder writes it, float32 and
  4-bit (``llama_tiny*.onnx``: GroupQueryAttention, SimplifiedLayerNormalization,
  MatMulNBits, GatherBlockQuantized), timed over one generation step after 31 tokens.

For each model it prints the median latency of both engines over ``--repeat`` runs
(after warm-up; the two engines' runs alternate, so that background load on a shared
machine hits both alike) and the ratio onnxrt / onnxruntime; of ``--rounds`` such
measurements, the one with the median ratio is kept. ``--only`` keeps the models whose
label contains one of the given texts (``--only lstm``), and makes no other.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "models" / "data"


def _feeds(model: str, batch: int):
    rng = np.random.default_rng(0)
    if model in ("resnet_small", "mobilenet_small"):
        return {"image": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}
    if model == "transformer_encoder":
        return {"input_ids": rng.integers(0, 100, (batch, 32)).astype(np.int64)}
    if model == "lstm_tagger":
        return {"input_ids": rng.integers(0, 500, (batch, 32)).astype(np.int64)}
    if model == "llama_tiny":
        # one generation step after 31 tokens: the sizes of scripts/export_llm_models.py
        # (2 layers, 2 key/value heads of 16 values)
        past = {f"past_key_values.{i}.{kv}": rng.standard_normal((batch, 2, 31, 16)).astype(np.float32)
                for i in range(2) for kv in ("key", "value")}
        return {"input_ids": rng.integers(0, 128, (batch, 1)).astype(np.int64),
                "attention_mask": np.ones((batch, 32), np.int64), **past}
    return {
        "input_ids": rng.integers(0, 120, (batch, 32)).astype(np.int64),
        "attention_mask": np.ones((batch, 32), np.int64),
        "token_type_ids": np.zeros((batch, 32), np.int64),
    }


def make_models(folder: Path, wanted=lambda label: True) -> list[tuple[str, Path, str]]:
    """Quantize the CNN and the transformer three ways, and optimize the BERT model;
    of the models whose label ``wanted`` accepts (the others are not made)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from onnxruntime.transformers.optimizer import optimize_model

    logging.disable(logging.WARNING)
    out = []
    for model in ("resnet_small", "transformer_encoder"):
        if not any(wanted(f"{model} {k}") for k in ("dynamic", "qdq", "qoperator")):
            continue

        class Reader(CalibrationDataReader):
            def __init__(self, model=model):
                self.it = iter([_feeds(model, 2) for _ in range(4)])

            def get_next(self):
                return next(self.it, None)

        pre = folder / f"{model}_pre.onnx"
        quant_pre_process(
            str(DATA / f"{model}.onnx"),
            str(pre),
            skip_symbolic_shape=model == "transformer_encoder",
        )
        paths = {
            k: folder / f"{model}_{k}.onnx" for k in ("dynamic", "qdq", "qoperator")
        }
        quantize_dynamic(str(pre), str(paths["dynamic"]))
        quantize_static(
            str(pre), str(paths["qdq"]), Reader(), quant_format=QuantFormat.QDQ
        )
        quantize_static(
            str(pre),
            str(paths["qoperator"]),
            Reader(),
            quant_format=QuantFormat.QOperator,
        )
        out += [(f"{model} {k}", p, model) for k, p in paths.items()]
    out = [o for o in out if wanted(o[0])]
    if wanted("bert_tiny contrib ops") or wanted("bert_tiny contrib ops, dynamic int8"):
        out += _bert_models(folder, optimize_model, quantize_dynamic, wanted)
    if wanted("transformer_encoder 4-bit MatMulNBits"):
        out += _nbits_model(folder)
    # a bidirectional two-layer LSTM tagger: quantize_dynamic writes DynamicQuantizeLSTM
    if wanted("lstm_tagger dynamic (DynamicQuantizeLSTM)"):
        lstm_q = folder / "lstm_tagger_dynamic.onnx"
        quantize_dynamic(str(DATA / "lstm_tagger.onnx"), str(lstm_q))
        out.append(("lstm_tagger dynamic (DynamicQuantizeLSTM)", lstm_q, "lstm_tagger"))
    # a tiny Llama as onnxruntime's model builder writes it, one generation step
    out.append(("llama_tiny step (GroupQueryAttention)", DATA / "llama_tiny.onnx", "llama_tiny"))
    out.append(("llama_tiny int4 step (+ MatMulNBits, GatherBlockQuantized)", DATA / "llama_tiny_int4.onnx",
                "llama_tiny"))
    logging.disable(logging.NOTSET)
    return [o for o in out if wanted(o[0])]


def _bert_models(folder: Path, optimize_model, quantize_dynamic, wanted) -> list[tuple[str, Path, str]]:
    """The BERT-like model rewritten into com.microsoft ops, and that model quantized."""
    out = []
    opt = optimize_model(
        str(DATA / "bert_tiny.onnx"),
        model_type="bert",
        num_heads=2,
        hidden_size=32,
        opt_level=0,
    )
    bert = folder / "bert_tiny_contrib.onnx"
    opt.save_model_to_file(str(bert))
    out.append(("bert_tiny contrib ops", bert, "bert_tiny"))
    if wanted("bert_tiny contrib ops, dynamic int8"):
        # onnxruntime's BERT recipe continues with dynamic quantization (QAttention, ...)
        bert_q = folder / "bert_tiny_contrib_int8.onnx"
        import onnx

        quantize_dynamic(
            str(bert),
            str(bert_q),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        out.append(("bert_tiny contrib ops, dynamic int8", bert_q, "bert_tiny"))
    return out


def _nbits_model(folder: Path) -> list[tuple[str, Path, str]]:
    """The transformer encoder with 4-bit weights, where the quantizer imports."""
    import onnx

    # onnxruntime's 4-bit weight-only quantization: every MatMul a MatMulNBits (its
    # quantizer is written on the onnx-ir package, which the test extra installs)
    out = []
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )
    except ImportError as e:
        print(f"skipping the 4-bit MatMulNBits model: {e}", file=sys.stderr)
    else:
        nbits = folder / "transformer_encoder_nbits.onnx"
        quantizer = MatMulNBitsQuantizer(
            onnx.load(str(DATA / "transformer_encoder.onnx")),
            algo_config=DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False),
        )
        quantizer.process()
        quantizer.model.save_model_to_file(str(nbits), False)
        out.append(("transformer_encoder 4-bit MatMulNBits", nbits, "transformer_encoder"))
    return out


def _median_ms_interleaved(fn_a, fn_b, repeat: int) -> tuple[float, float]:
    """Median latency in ms of two callables timed alternately, so that both see the
    same background load on a shared machine."""
    for _ in range(3):
        fn_a()
        fn_b()
    ta, tb = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn_a()
        t1 = time.perf_counter()
        fn_b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def bench(path: Path, feeds: dict, threads: int, repeat: int) -> tuple[float, float]:
    """Median latency in ms of onnxrt and of onnxruntime on ``path``."""
    import onnxrt
    import onnxruntime as ort

    so = onnxrt.SessionOptions()
    so.intra_op_num_threads = threads
    ours = onnxrt.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ro = ort.SessionOptions()
    ro.intra_op_num_threads = threads
    ro.inter_op_num_threads = 1
    # onnxruntime's pool threads otherwise spin after each run, taking the cores from
    # the onnxrt runs that alternate with its own in this process
    ro.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(str(path), ro, providers=["CPUExecutionProvider"])
    names = {i.name for i in ref.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in names}
    return _median_ms_interleaved(
        lambda: ours.run(None, feeds), lambda: ref.run(None, feeds), repeat
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measure each model this many times and keep the median round",
    )
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--only", action="append", metavar="TEXT",
                    help="only the models whose label contains TEXT (repeatable)")
    args = ap.parse_args(argv)
    rows = []

    def wanted(label: str) -> bool:
        return not args.only or any(t in label for t in args.only)

    with tempfile.TemporaryDirectory() as tmp:
        for label, path, base in make_models(Path(tmp), wanted):
            feeds = _feeds(base, args.batch)
            rounds = sorted(
                (bench(path, feeds, args.threads, args.repeat) for _ in range(args.rounds)),
                key=lambda r: r[0] / r[1],
            )
            ours, ref = rounds[len(rounds) // 2]
            rows.append((label, ours, ref, ours / ref))
            if not args.markdown:
                print(
                    f"{label:42s} onnxrt {ours:8.2f} ms   onnxruntime {ref:8.2f} ms   ratio {ours / ref:5.2f}"
                )
    if args.markdown:
        print(
            f"| model (batch {args.batch}, {args.threads} threads) | onnxrt ms | onnxruntime ms | ratio |"
        )
        print("|---|---:|---:|---:|")
        for label, ours, ref, ratio in rows:
            print(f"| {label} | {ours:.2f} | {ref:.2f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
