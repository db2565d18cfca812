"""Where onnxruntime departs from the ONNX spec, onnxrt follows the spec (see "Where
onnxrt differs from onnxruntime, and why" in docs/architecture.md). Each case checks
onnxrt against the spec's rule, or against ``onnx.reference`` where it runs."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt

F32 = np.float32


def _model(op, x, attrs, inits=(), n_out=1, opset=19):
    names = ["x"] + [i.name for i in inits]
    graph = helper.make_graph([helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _run(model, x):
    sess = onnxrt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


@pytest.mark.parametrize("act, defaults", [("Affine", ([1.0], [0.0])), ("ThresholdedRelu", ([1.0], None)),
                                           ("ScaledTanh", ([1.0], [1.0])), ("LeakyRelu", ([0.01], None)),
                                           ("HardSigmoid", ([0.2], [0.5])), ("Elu", ([1.0], None))])
def test_recurrent_activation_parameters_default_to_their_ops_defaults(act, defaults):
    """The spec: activation_alpha and activation_beta default to the values of the op of
    the same name. onnxruntime takes 0 for Affine, ThresholdedRelu and ScaledTanh."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 2, 3)).astype(F32) * 2
    inits = [numpy_helper.from_array(rng.standard_normal((1, 3, 3)).astype(F32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, 3, 3)).astype(F32) * 0.5, "r")]

    def run(**params):
        return _run(_model("RNN", x, dict(hidden_size=3, activations=[act], **params), inits, n_out=2, opset=14), x)[0]

    alpha, beta = defaults
    explicit = {"activation_alpha": alpha} | ({"activation_beta": beta} if beta else {})
    zeros = {"activation_alpha": [0.0]} | ({"activation_beta": [0.0]} if beta else {})
    np.testing.assert_array_equal(run(), run(**explicit))
    assert not np.array_equal(run(), run(**zeros))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_same_pooling_with_dilations_gives_ceil_of_input_over_stride(op, auto_pad):
    """SAME padding gives ``ceil(in / stride)`` outputs whatever the dilation;
    onnxruntime pads for the undilated kernel and gives fewer (9 -> 4 here)."""
    x = np.random.default_rng(1).standard_normal((1, 2, 9, 8)).astype(F32)
    k, s, d = (3, 2), (2, 3), (2, 2)
    attrs = dict(kernel_shape=list(k), strides=list(s), dilations=list(d), auto_pad=auto_pad)
    (got,) = _run(_model(op, x, attrs), x)
    out = [-(-n // st) for n, st in zip(x.shape[2:], s)]
    assert list(got.shape[2:]) == out == [5, 3]
    # the windows by the spec's rule: the total padding (out - 1) * stride + dilated
    # kernel - in, its odd unit at the end (SAME_UPPER) or at the start (SAME_LOWER)
    pads = []
    for n, o, kk, st, dd in zip(x.shape[2:], out, k, s, d):
        total = max(0, (o - 1) * st + (kk - 1) * dd + 1 - n)
        begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        pads.append((begin, total - begin))
    xp = np.pad(x, [(0, 0), (0, 0), *pads], constant_values=np.nan)
    exp = np.empty_like(got)
    for i in range(out[0]):
        for j in range(out[1]):
            win = xp[:, :, i * s[0] : i * s[0] + (k[0] - 1) * d[0] + 1 : d[0], j * s[1] : j * s[1] + (k[1] - 1) * d[1] + 1 : d[1]]
            exp[:, :, i, j] = (np.nanmax if op == "MaxPool" else np.nanmean)(win, axis=(2, 3))
    np.testing.assert_allclose(got, exp, rtol=1e-6)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_reduce_mean_over_an_empty_axis_is_nan():
    """The mean of no values is 0 / 0, as numpy and onnx.reference give; onnxruntime gives 0."""
    x = np.ones((0, 3), F32)
    model = _model("ReduceMean", x, {"keepdims": 0}, [numpy_helper.from_array(np.array([0], np.int64), "a")], opset=18)
    (got,) = _run(model, x)  # without numpy's empty-mean warning
    assert got.shape == (3,) and np.isnan(got).all()
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # onnx.reference's numpy warns
        (exp,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("attrs, scales, roi", [
    (dict(mode="cubic", coordinate_transformation_mode="align_corners", cubic_coeff_a=-0.5), [1, 1, 1.3, 0.7], None),
    (dict(mode="cubic", coordinate_transformation_mode="align_corners", exclude_outside=1), [1, 1, 1.3, 0.5], None),
    (dict(mode="cubic", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=0.5),
     [1, 1, 0.75, 1.5], [0, 0, 0.04, 0.3, 1, 1, 0.89, 0.74]),
    (dict(mode="nearest", coordinate_transformation_mode="align_corners", nearest_mode="round_prefer_ceil"),
     [1, 1, 0.6, 2.0], None),
])
def test_resize_follows_the_reference_evaluator(attrs, scales, roi):
    """Resize cases where onnxruntime's results differ from onnx.reference's."""
    x = np.random.default_rng(5).standard_normal((1, 2, 6, 9)).astype(F32)
    inits = [numpy_helper.from_array(np.array(roi or [], F32), "roi"), numpy_helper.from_array(np.array(scales, F32), "s")]
    model = _model("Resize", x, attrs, inits)
    (got,) = _run(model, x)
    (exp,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)
