"""Models quantized by ``onnxruntime.quantization`` run on onnxrt as on onnxruntime.

A CNN (ResNet and MobileNet style) and a transformer encoder are quantized three ways:
dynamic (``quantize_dynamic``: DynamicQuantizeLinear, MatMulInteger, ConvInteger),
static QDQ (QuantizeLinear/DequantizeLinear pairs around float ops) and static
QOperator (QLinearConv, QLinearMatMul and the com.microsoft QLinearAdd, QLinearMul,
QLinearSoftmax, QLinearGlobalAveragePool, QGemm...). Calibration uses random data of
a fixed seed. Variants add int8 per-channel QDQ, per-channel reduced-range QOperator,
and the quantized graphs after onnxruntime's own fusions (DynamicQuantizeMatMul, QGemm,
QLinearAdd, Gelu, SkipLayerNormalization). Labels (argmax) agree on at least 99% of
samples and values within one output quantization step. Integer accumulation is
proved exact on extreme values.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

import onnxrt
from onnx import TensorProto, helper, numpy_helper

from tests.ort_oracle import u8s8_pairs_saturate

DATA = Path(__file__).resolve().parent.parent / "models" / "data"
MODELS = {
    "resnet_small": ("image", (3, 64, 64)),
    "mobilenet_small": ("image", (3, 64, 64)),
    "transformer_encoder": ("input_ids", (16,)),
}
FORMATS = ["dynamic", "qdq", "qoperator"]


def _batch(model: str, rng, n: int):
    name, shape = MODELS[model]
    if name == "input_ids":
        return name, rng.integers(0, 100, (n, *shape)).astype(np.int64)
    return name, rng.standard_normal((n, *shape)).astype(np.float32)


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, model: str):
        rng = np.random.default_rng(1234)
        self._it = iter([dict([_batch(model, rng, 2)]) for _ in range(4)])

    def get_next(self):
        return next(self._it, None)


def _quantize(model: str, fmt: str, folder: Path) -> Path:
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = folder / f"{model}_pre.onnx"
    if not pre.exists():
        # folds the Constant biases into initializers, which the quantizer needs
        quant_pre_process(
            str(DATA / f"{model}.onnx"),
            str(pre),
            skip_symbolic_shape=model == "transformer_encoder",
        )
    out = folder / f"{model}_{fmt}.onnx"
    if out.exists():
        return out
    logging.getLogger().setLevel(logging.ERROR)
    # 7-bit weights where onnxruntime's own uint8 x int8 products saturate on this
    # machine (tests/ort_oracle.py), as its quantizer's reduce_range is meant for
    reduce = u8s8_pairs_saturate()
    if fmt.endswith("_ort_fused"):
        # onnxruntime's own graph optimizer fuses the quantized graph further
        # (DynamicQuantizeMatMul, QGemm, QLinearAdd, Gelu, SkipLayerNormalization...)
        src = _quantize(model, fmt[: -len("_ort_fused")], folder)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(out)
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        return out
    if fmt == "dynamic":
        quantize_dynamic(str(pre), str(out), reduce_range=reduce)
    elif fmt == "qdq_s8_per_channel":
        quantize_static(
            str(pre),
            str(out),
            _Reader(model),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            reduce_range=reduce,
        )
    elif fmt == "qoperator_per_channel":
        quantize_static(
            str(pre),
            str(out),
            _Reader(model),
            quant_format=QuantFormat.QOperator,
            per_channel=True,
            reduce_range=True,
        )
    else:
        qf = QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator
        quantize_static(str(pre), str(out), _Reader(model), quant_format=qf, reduce_range=reduce)
    return out


@pytest.fixture(scope="module")
def qfolder(tmp_path_factory):
    return tmp_path_factory.mktemp("quantized")


def _output_step(path: Path) -> float:
    """The scale of the DequantizeLinear that produces the graph output (0 if none)."""
    m = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    out = m.graph.output[0].name
    for n in m.graph.node:
        if out in n.output and n.op_type == "DequantizeLinear":
            return float(inits[n.input[1]])
    return 0.0


EXPECTED_OPS = {
    "dynamic": {"DynamicQuantizeLinear", "MatMulInteger"},
    "qdq": {"QuantizeLinear", "DequantizeLinear"},
    "qdq_s8_per_channel": {"QuantizeLinear", "DequantizeLinear"},
    "qoperator": {"QLinearAdd"},
    "qoperator_per_channel": {"QLinearAdd"},
    "dynamic_ort_fused": {"DynamicQuantizeMatMul"},
    "qdq_ort_fused": {"QGemm"},
}
VARIANTS = [(m, f) for m in MODELS for f in FORMATS] + [
    (m, f)
    for m in ("resnet_small", "transformer_encoder")
    for f in (
        "qdq_s8_per_channel",
        "qoperator_per_channel",
        "dynamic_ort_fused",
        "qdq_ort_fused",
    )
]


@pytest.mark.parametrize("model,fmt", VARIANTS)
def test_quantized_model_matches_onnxruntime(model, fmt, qfolder):
    path = _quantize(model, fmt, qfolder)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert EXPECTED_OPS[fmt] <= ops, ops
    if fmt.startswith("qoperator"):
        assert ops & {"QLinearConv", "QLinearMatMul"}
    name, x = _batch(
        model, np.random.default_rng(7), 64 if model != "transformer_encoder" else 32
    )
    ours = onnxrt.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = ours.run(None, {name: x})[0]
    exp = ref.run(None, {name: x})[0]
    assert got.shape == exp.shape and got.dtype == exp.dtype
    labels_got = got.reshape(-1, got.shape[-1]).argmax(-1)
    labels_exp = exp.reshape(-1, exp.shape[-1]).argmax(-1)
    assert (labels_got == labels_exp).mean() >= 0.99
    step = _output_step(path)
    # a dequantized output may differ by one quantization step; float outputs are
    # computed from identical integers and differ only by float32 rounding
    np.testing.assert_allclose(got, exp, rtol=0, atol=step * 1.0001 if step else 1e-5)


def _mm_integer_model(a_dt, b_dt, k):
    a = helper.make_tensor_value_info("a", a_dt, [None, k])
    b = helper.make_tensor_value_info("b", b_dt, [k, None])
    za = helper.make_tensor_value_info("za", a_dt, [])
    zb = helper.make_tensor_value_info("zb", b_dt, [])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    graph = helper.make_graph([node], "mmi", [a, b, za, zb], [y])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10
    )


@pytest.mark.parametrize("k", [1, 300, 4096, 30000])
def test_matmul_integer_is_exact_at_the_extremes(k):
    # |sum| reaches 255*255*k: far past float32's 2**24 exact range for k >= 300
    a = np.full((3, k), 255, np.uint8)
    a[1] = 0
    a[2, ::2] = 0
    b = np.zeros((k, 4), np.uint8)
    b[:, 1] = 255
    b[::3, 2] = 255
    b[:, 3] = np.arange(k) % 256
    za, zb = np.uint8(0), np.uint8(0)
    model = _mm_integer_model(TensorProto.UINT8, TensorProto.UINT8, k)
    sess = onnxrt.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = sess.run(None, {"a": a, "b": b, "za": np.array(za), "zb": np.array(zb)})[0]
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, exact.astype(np.int32))
    if k == 30000:
        assert exact.max() > 2**24  # the case that float32 accumulation gets wrong


def test_matmul_integer_signed_extremes_with_zero_points():
    k = 2048
    rng = np.random.default_rng(0)
    a = rng.choice(np.array([-128, 127], np.int8), (5, k))
    b = rng.choice(np.array([0, 255], np.uint8), (k, 6))
    za, zb = np.int8(-128), np.uint8(255)
    model = _mm_integer_model(TensorProto.INT8, TensorProto.UINT8, k)
    feeds = {"a": a, "b": b, "za": np.array(za), "zb": np.array(zb)}
    got = onnxrt.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)[0]
    exact = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)
    np.testing.assert_array_equal(got, exact.astype(np.int32))
    exp = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)[0]
    np.testing.assert_array_equal(got, exp)


def _dql_model():
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
        "dql",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [
            helper.make_tensor_value_info(n, t, None)
            for n, t in (
                ("y", TensorProto.UINT8),
                ("s", TensorProto.FLOAT),
                ("z", TensorProto.UINT8),
            )
        ],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10
    )


def test_dynamic_quantize_rounds_half_to_even_and_saturates():
    # scale 1: x/scale lands exactly on .5 values, which must round to even
    x = np.array([0, 0.5, 1.5, 2.5, 3.5, 254.5, 255, -0.0], np.float32)
    model = _dql_model().SerializeToString()
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    for g, e in zip(got, exp):
        np.testing.assert_array_equal(g, e)
    np.testing.assert_array_equal(got[0][:6], [0, 0, 2, 2, 4, 254])


def test_dynamic_quantize_saturates_where_the_rounded_top_overshoots():
    """Most ranges quantize within [0, 255] without a clip, which is then skipped;
    in this one the float32 scale rounds so that the largest value's quotient rounds
    to 256 - zero point, and it must saturate to 255, as in onnxruntime (a
    DynamicQuantizeLinear and a DynamicQuantizeMatMul reading the same values)."""
    x = np.array([-6.7877421379089355, 0.25, 9.464598655700684], np.float32)
    model = _dql_model().SerializeToString()
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, e in zip(got, exp):
        np.testing.assert_array_equal(g, e)
    assert got[0][-1] == 255 and got[2] == 107
    b = np.identity(3, dtype=np.uint8)
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeMatMul", ["x", "b", "bs"], ["y"], domain="com.microsoft")], "dqmm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(1.0, np.float32), "bs")],
    )
    mm = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)],
                           ir_version=10).SerializeToString()
    got, = onnxrt.InferenceSession(mm, providers=["CPUExecutionProvider"]).run(None, {"x": x[None]})
    exp, = ort.InferenceSession(mm, providers=["CPUExecutionProvider"]).run(None, {"x": x[None]})
    np.testing.assert_array_equal(got, exp)


def test_dynamic_quantize_matches_onnxruntime_across_ranges():
    """The scale, zero point and codes of DynamicQuantizeLinear against onnxruntime
    for ranges from subnormal (a scale that underflows to 0) to infinite, all zero,
    one-signed and mixed, and quotients landing on .5 (the scalar parameters are
    computed in Python floats rounded to float32 at each step, with numpy's float32
    path for the extremes)."""
    rng = np.random.default_rng(23)
    model = _dql_model().SerializeToString()
    ours = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    cases = [np.array(v, np.float32) for v in ([0.0], [-0.0, 0.0], [1e-45], [-1e-45, 2e-45], [3.4e38, -3.4e38],
                                                [3.4e38, 1.0], [-3.4e38], [127.5, -127.5], [1.0, 1.0],
                                                [-np.inf], [np.inf, 1.0], [-np.inf, 1.0], [2e-45, 0.0])]
    for i in range(300):
        n = int(rng.integers(1, 40))
        mag = 10.0 ** rng.integers(-44, 38)
        kind = i % 4
        v = rng.standard_normal(n) * mag
        if kind == 1:
            v = np.abs(v)
        elif kind == 2:
            v = -np.abs(v)
        elif kind == 3:
            v = rng.integers(-255, 256, n) / rng.choice([1.0, 2.0, 255.0, 127.5])
        cases.append(v.astype(np.float32))
    for x in cases:
        got = ours.run(None, {"x": x})
        exp = ref.run(None, {"x": x})
        for g, e in zip(got, exp):
            np.testing.assert_array_equal(g, e, err_msg=f"x = {x!r}")
    # rank-0 inputs too (numpy's scalar results once broke the clip's out=)
    any_rank = _dql_model()
    any_rank.graph.input[0].type.tensor_type.ClearField("shape")
    ours = onnxrt.InferenceSession(any_rank.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(any_rank.SerializeToString(), providers=["CPUExecutionProvider"])
    for v in (np.inf, -np.inf, 1e-45, 3.0, -2.5):
        x = np.array(v, np.float32)
        got, exp = ours.run(None, {"x": x}), ref.run(None, {"x": x})
        for g, e in zip(got, exp):
            assert g.shape == e.shape
            np.testing.assert_array_equal(g, e, err_msg=f"x = {x!r}")


def _op_zoo_model():
    """A small float CNN using the ops the QOperator quantizer has com.microsoft
    kernels for: LeakyRelu, Sigmoid, AveragePool, Concat, Mul, Softmax."""
    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(
        rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w"
    )
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c"], ["l"], alpha=0.1),
        helper.make_node("Sigmoid", ["l"], ["s"]),
        helper.make_node(
            "AveragePool", ["s"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "MaxPool", ["l"], ["mp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Concat", ["ap", "mp"], ["cc"], axis=1),
        helper.make_node("Mul", ["cc", "cc"], ["m"]),
        helper.make_node("GlobalAveragePool", ["m"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Softmax", ["f"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "zoo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, b],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10
    )
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("fmt", ["qoperator", "qdq"])
def test_quantized_op_zoo_matches_onnxruntime(fmt, tmp_path):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_static,
    )

    rng = np.random.default_rng(12)
    calib = [rng.standard_normal((2, 3, 16, 16)).astype(np.float32) for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": c} for c in calib])

        def get_next(self):
            return next(self.it, None)

    src, path = tmp_path / "zoo.onnx", tmp_path / "zoo_q.onnx"
    onnx.save(_op_zoo_model(), str(src))
    qf = QuantFormat.QOperator if fmt == "qoperator" else QuantFormat.QDQ
    ops = [
        "Conv",
        "LeakyRelu",
        "Sigmoid",
        "AveragePool",
        "MaxPool",
        "Concat",
        "Mul",
        "GlobalAveragePool",
        "Softmax",
    ]
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(
        str(src), str(path), Reader(), quant_format=qf, op_types_to_quantize=ops
    )
    kinds = {n.op_type for n in onnx.load(str(path)).graph.node}
    if fmt == "qoperator":
        assert {
            "QLinearLeakyRelu",
            "QLinearSigmoid",
            "QLinearAveragePool",
            "QLinearConcat",
            "QLinearMul",
            "QLinearSoftmax",
        } <= kinds, kinds
    x = rng.standard_normal((16, 3, 16, 16)).astype(np.float32)
    got = onnxrt.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    exp = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert (got.argmax(1) == exp.argmax(1)).mean() >= 0.99
    np.testing.assert_allclose(got, exp, rtol=0, atol=_output_step(path) * 1.0001)


def test_transformer_with_4_bit_weights_from_onnxruntimes_quantizer_matches_onnxruntime(tmp_path):
    # onnxruntime's weight-only quantizer turns every MatMul into MatMulNBits
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(DATA / "transformer_encoder.onnx")),
        algo_config=DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False),
    )
    quantizer.process()
    path = tmp_path / "nbits.onnx"
    quantizer.model.save_model_to_file(str(path), False)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("MatMulNBits") >= 4, ops
    name, x = _batch("transformer_encoder", np.random.default_rng(5), 16)
    got = onnxrt.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {name: x})[0]
    exp = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {name: x})[0]
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_dynamically_quantized_bidirectional_lstm_tagger_matches_onnxruntime(threads, tmp_path):
    # quantize_dynamic writes each LSTM as DynamicQuantizeLSTM; onnxruntime quantizes
    # the hidden state in groups of rows per thread, so the engines agree at equal
    # thread counts
    from onnxruntime.quantization import quantize_dynamic

    path = tmp_path / "lstm_dynamic.onnx"
    quantize_dynamic(str(DATA / "lstm_tagger.onnx"), str(path), reduce_range=u8s8_pairs_saturate())
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("DynamicQuantizeLSTM") == 2, ops
    # inputs on which no hidden value of either engine lands on the other side of a
    # quantization rounding boundary (a one-ulp difference in a sigmoid or tanh can
    # do that now and then, and the sequence's later outputs then differ by up to
    # 7e-4): the full-range model and the 7-bit one (tests/ort_oracle.py) need
    # inputs of their own
    seed = 11 if u8s8_pairs_saturate() else 9
    feeds = {"input_ids": np.random.default_rng(seed).integers(0, 500, (6, 20)).astype(np.int64)}
    so, ro = onnxrt.SessionOptions(), ort.SessionOptions()
    so.intra_op_num_threads = ro.intra_op_num_threads = threads
    got = onnxrt.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exp = ort.InferenceSession(str(path), ro, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert (got.argmax(-1) == exp.argmax(-1)).mean() >= 0.99
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)
