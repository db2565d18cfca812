"""quantize_static: calibrated on onnxrt, QDQ and QOperator, against float and against
onnxruntime's own tool on the same calibration data."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxrt import GraphOptimizationLevel
from onnxrt.errors import InvalidArgument
from onnxrt.quantization import (CalibrationMethod, NumpyDataReader, QuantFormat, QuantType, collect_ranges,
                                 quantize_static)

from .conftest import OrtReader, batches, run_onnxrt, run_onnxruntime, top1
from .models import cosine

FORMATS = [QuantFormat.QDQ, QuantFormat.QOperator]
METHODS = [CalibrationMethod.MinMax, CalibrationMethod.Entropy, CalibrationMethod.Percentile]


def _ort_quantize(path_or_model, out, cal_batches, fmt, method, tmp_path, per_channel=True):
    oq = pytest.importorskip("onnxruntime.quantization")
    src = path_or_model
    if isinstance(src, onnx.ModelProto):
        src = str(tmp_path / "float.onnx")
        onnx.save(path_or_model, src)
    oq.quantize_static(src, str(out), OrtReader(cal_batches),
                       quant_format=getattr(oq.QuantFormat, fmt.name),
                       calibrate_method=getattr(oq.CalibrationMethod, method.name),
                       per_channel=per_channel, activation_type=oq.QuantType.QInt8, weight_type=oq.QuantType.QInt8)
    return str(out)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_digits_int8_top1_matches_float_and_onnxruntimes_tool(digits, fmt, method, tmp_path):
    path, x_train, x_test, y_test = digits
    cal = batches("pixels", x_train[:1344], 64)  # equal batches: onnxruntime's histograms need them
    out = tmp_path / "int8.onnx"
    report = quantize_static(path, out, NumpyDataReader(cal), quant_format=fmt, calibrate_method=method,
                             per_channel=True)
    assert {"hidden", "output"} <= set(report.quantized)
    assert not report.skipped
    float_top1 = top1(run_onnxrt(path, {"pixels": x_test})[0], y_test)
    ours = run_onnxrt(str(out), {"pixels": x_test})
    ours_top1 = top1(ours[0], y_test)
    assert ours_top1 >= float_top1 - 0.01
    # the same model on onnxruntime: the same labels and probabilities
    theirs_run = run_onnxruntime(str(out), {"pixels": x_test})
    np.testing.assert_array_equal(theirs_run[0], ours[0])
    np.testing.assert_allclose(theirs_run[1], ours[1], atol=1e-6)
    # onnxruntime's tool on the same calibration data does no better
    ort_model = _ort_quantize(path, tmp_path / "ort.onnx", cal, fmt, method, tmp_path)
    ort_top1 = top1(run_onnxruntime(ort_model, {"pixels": x_test})[0], y_test)
    assert ours_top1 >= ort_top1 - 0.01


def _scales(model: onnx.ModelProto) -> dict[str, tuple[float, int]]:
    """tensor -> (scale, zero point) of every per-tensor QuantizeLinear on an activation."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[1] in inits and inits[n.input[1]].ndim == 0:
            name = n.input[0].removesuffix("_QuantizeLinear_Input")
            out[name] = (float(inits[n.input[1]]), int(inits[n.input[2]]))
    return out


def test_minmax_parameters_equal_onnxruntimes_for_the_same_data(cnn, tmp_path):
    model, cal, _ = cnn
    cal_b = batches("x", cal)
    ours = quantize_static(model, None, NumpyDataReader(cal_b), per_channel=True).model
    theirs = onnx.load(_ort_quantize(model, tmp_path / "ort.onnx", cal_b, QuantFormat.QDQ,
                                     CalibrationMethod.MinMax, tmp_path))
    a, b = _scales(ours), _scales(theirs)
    common = sorted(set(a) & set(b))
    assert len(common) >= 5, (sorted(a), sorted(b))
    for t in common:
        assert a[t][1] == b[t][1], t
        np.testing.assert_allclose(a[t][0], b[t][0], rtol=1e-6, err_msg=t)


@pytest.mark.parametrize("which", ["cnn", "encoder"])
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_cnn_and_encoder_int8_track_float_as_closely_as_onnxruntimes_tool(request, which, fmt, tmp_path):
    model, cal, test = request.getfixturevalue(which)
    cal_b = batches("x", cal)
    ref = run_onnxrt(model, {"x": test})[0]
    q = quantize_static(model, None, NumpyDataReader(cal_b), quant_format=fmt, per_channel=True).model
    ours = run_onnxrt(q, {"x": test})[0]
    theirs_model = _ort_quantize(model, tmp_path / "ort.onnx", cal_b, fmt, CalibrationMethod.MinMax, tmp_path)
    theirs = run_onnxruntime(theirs_model, {"x": test})[0]
    assert cosine(ours, ref) >= 0.999
    assert cosine(ours, ref) >= cosine(theirs, ref) - 1e-3
    assert np.abs(ours - ref).max() <= 1.5 * np.abs(theirs - ref).max()
    # onnxruntime runs our model as onnxrt does. Both runtimes' level-2 QDQ rewrites
    # (QLinearMatMul of per-column weights in both, QLinearSoftmax in onnxruntime's)
    # accumulate in integers and round once, so a value next to a rounding boundary
    # can take the other code: the exact check is between the unfused graphs (level 1)
    basic = run_onnxrt(q, {"x": test}, GraphOptimizationLevel.ORT_ENABLE_BASIC)[0]
    np.testing.assert_allclose(run_onnxruntime(q, {"x": test}, basic=True)[0], basic, atol=1e-5)
    assert cosine(run_onnxruntime(q, {"x": test})[0], ours) >= 0.999


def test_per_channel_weights_have_a_scale_per_output_channel(cnn):
    model, cal, _ = cnn
    q = quantize_static(model, None, NumpyDataReader({"x": cal}, 16), per_channel=True).model
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    axes = {}
    for n in q.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in ("w1_quantized", "w2_quantized"):
            axes[n.input[0]] = ([a.i for a in n.attribute if a.name == "axis"], inits[n.input[1]].shape)
            assert inits[n.input[0]].dtype == np.int8
    assert axes == {"w1_quantized": ([0], (8,)), "w2_quantized": ([0], (16,))}


def test_uint8_activations_and_qoperator_ops(cnn):
    model, cal, test = cnn
    r = quantize_static(model, None, NumpyDataReader({"x": cal}, 16), quant_format=QuantFormat.QOperator,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    ops = [n.op_type for n in r.model.graph.node]
    assert ops.count("QLinearConv") == 2 and "QGemm" in ops and "QLinearGlobalAveragePool" in ops
    assert "Relu" not in ops and r.folded == ["relu1", "relu2"]
    assert cosine(run_onnxrt(r.model, {"x": test})[0], run_onnxrt(model, {"x": test})[0]) >= 0.999


def test_nodes_to_exclude_and_op_types_leave_nodes_in_float(cnn):
    model, cal, _ = cnn
    r = quantize_static(model, None, NumpyDataReader({"x": cal}, 16), quant_format=QuantFormat.QOperator,
                        op_types_to_quantize=["Conv", "Relu"], nodes_to_exclude=["conv2"])
    ops = [n.op_type for n in r.model.graph.node]
    assert ops.count("QLinearConv") == 1 and ops.count("Conv") == 1 and "Gemm" in ops
    assert "conv2" not in r.quantized and "fc" not in r.quantized


def test_calibrated_ranges_are_the_observed_ones(cnn):
    model, cal, _ = cnn
    import onnxrt

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.append(onnx.ValueInfoProto(name="c1"))
    values = np.concatenate([onnxrt.InferenceSession(exposed.SerializeToString()).run(["c1"], {"x": cal[i:i + 16]})[0]
                             for i in range(0, len(cal), 16)])
    mm = collect_ranges(model, NumpyDataReader({"x": cal}, 16), ["c1"], CalibrationMethod.MinMax)["c1"]
    assert mm == (float(values.min()), float(values.max()))
    on_cpu = collect_ranges(model, NumpyDataReader({"x": cal}, 16), ["c1"], CalibrationMethod.MinMax,
                            providers=["CPUExecutionProvider"])["c1"]
    assert on_cpu == mm
    lo, hi = collect_ranges(model, NumpyDataReader({"x": cal}, 16), ["c1"], CalibrationMethod.Percentile,
                            extra_options={"CalibPercentile": 99.0})["c1"]
    width = 2.0 ** np.ceil(np.log2(np.abs(values).max())) / 2048
    assert abs(hi - np.percentile(values, 99.5)) <= 2 * width
    assert abs(lo - np.percentile(values, 0.5)) <= 2 * width
    t_lo, t_hi = collect_ranges(model, NumpyDataReader({"x": cal}, 16), ["c1"], CalibrationMethod.Entropy)["c1"]
    assert values.min() <= t_lo < 0 < t_hi <= values.max()


def test_histograms_merge_exactly_whatever_the_batch_order():
    from onnxrt.quantization.calibrate import TensorStats

    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(1000) * s for s in (0.3, 5.0, 1.0, 40.0)]
    one = TensorStats(256, True)
    for p in parts:
        one.update(p)
    merged = TensorStats(256, True)
    for p in reversed(parts):
        s = TensorStats(256, True)
        s.update(p)
        merged.merge(s)
    everything = np.concatenate(parts)
    limit = 2.0 ** np.ceil(np.log2(np.abs(everything).max()))
    assert one.limit == merged.limit == limit
    np.testing.assert_array_equal(one.counts, merged.counts)
    direct, _ = np.histogram(everything.astype(np.float32), bins=512, range=(-limit, limit))
    np.testing.assert_array_equal(one.counts, direct)


def test_bad_arguments_are_named(cnn):
    model, cal, _ = cnn
    reader = NumpyDataReader({"x": cal}, 16)
    with pytest.raises(InvalidArgument, match="Softsign"):
        quantize_static(model, None, reader, op_types_to_quantize=["Softsign"])
    with pytest.raises(InvalidArgument, match="NotAnOption"):
        quantize_static(model, None, reader, extra_options={"NotAnOption": 1})
    with pytest.raises(InvalidArgument, match="8-bit"):
        quantize_static(model, None, reader, quant_format=QuantFormat.QOperator, activation_type=QuantType.QInt16)
    with pytest.raises(InvalidArgument, match="no batches"):
        quantize_static(model, None, NumpyDataReader([]))
    with pytest.raises(InvalidArgument, match="nodes_to_exclude"):
        quantize_static(model, None, reader, nodes_to_exclude=["no_such_node"])
    with pytest.raises(InvalidArgument, match="QInt4"):
        quantize_static(model, None, reader, weight_type=QuantType.QInt4)


def test_int16_activations_in_qdq(cnn):
    model, cal, test = cnn
    r = quantize_static(model, None, NumpyDataReader({"x": cal}, 16), activation_type=QuantType.QInt16)
    q_types = {numpy_helper.to_array(t).dtype for t in r.model.graph.initializer if t.name.endswith("_zero_point")}
    assert np.dtype(np.int16) in q_types
    ours = run_onnxrt(r.model, {"x": test})[0]
    assert cosine(ours, run_onnxrt(model, {"x": test})[0]) >= 0.9999
    np.testing.assert_allclose(run_onnxruntime(r.model, {"x": test}, basic=True)[0], ours, atol=1e-5)


def test_an_older_opset_is_converted_and_subgraphs_read_float_values(cnn):
    from onnx import TensorProto, helper

    model, cal, test = cnn
    old = onnx.ModelProto()
    old.CopyFrom(model)
    old.opset_import[0].version = 11
    r = quantize_static(old, None, NumpyDataReader({"x": cal}, 16), per_channel=True)
    assert r.model.opset_import[0].version == 13  # DequantizeLinear's axis needs 13
    assert cosine(run_onnxrt(r.model, {"x": test})[0], run_onnxrt(model, {"x": test})[0]) >= 0.999
    # an If whose branches read a tensor the QOperator writer holds as codes
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    branch = [helper.make_graph([helper.make_node(op, ["c"], [f"{op}_out"])], op, [],
                                [helper.make_tensor_value_info(f"{op}_out", TensorProto.FLOAT, [2, 4])])
              for op in ("Relu", "Neg")]
    g = helper.make_graph(
        [helper.make_node("MatMul", ["a", "W"], ["c"], name="mm"),
         helper.make_node("If", ["cond"], ["y"], then_branch=branch[0], else_branch=branch[1], name="if")], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    a = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    q = quantize_static(m, None, [{"a": a, "cond": np.array(True)}], quant_format=QuantFormat.QOperator).model
    assert [n.op_type for n in q.graph.node] == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear", "If"]
    feeds = {"a": a, "cond": np.array(False)}
    ours = run_onnxrt(q, feeds)[0]
    np.testing.assert_allclose(ours, -(a @ w), atol=0.05)
    np.testing.assert_array_equal(run_onnxruntime(q, feeds)[0], ours)


def test_a_calibration_cache_is_written_then_read(cnn, tmp_path):
    model, cal, _ = cnn
    cache = tmp_path / "ranges.json"
    first = quantize_static(model, None, NumpyDataReader({"x": cal}, 16), calibration_cache_path=cache)
    assert cache.exists()
    again = quantize_static(model, None, None, calibration_cache_path=cache)
    assert again.ranges == first.ranges
    assert again.model.SerializeToString() == first.model.SerializeToString()
    with pytest.raises(InvalidArgument, match="calibration_data_reader"):
        quantize_static(model, None, None)
    cache.write_text("not json")
    with pytest.raises(InvalidArgument, match="not a calibration cache"):
        quantize_static(model, None, None, calibration_cache_path=cache)
