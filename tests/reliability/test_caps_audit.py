"""The allocation cap, second round: every CPU kernel that sizes its output from its
inputs' values, attributes or sizes (rather than copying an input's size) checks the
cap before allocating.

Each case runs a tiny model whose feed asks for a tensor over a 1 MiB cap and
asserts the typed error naming the op, that the run's peak traced allocation stayed
under the cap (nothing over it was made first), and that a small feed of the same
model gives the right result.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort

from ..conftest import make_model
from .caps import CAP, refused_run

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _capped(cap=CAP):
    so = ort.SessionOptions()
    so.add_session_config_entry("session.max_allocation_bytes", str(cap))
    return so


def _one(op, inputs, feeds_types, out_t=F, opset=18, **attrs):
    return make_model([helper.make_node(op, inputs, ["y"], **attrs)],
                      [_vi(n, t, s) for n, (t, s) in feeds_types.items()], [_vi("y", out_t)], opset=opset)


def _f32(*shape):
    return np.ones(shape, np.float32)


def _i64(*v):
    return np.array(v, np.int64)


def _hann(n):
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float32)


# name: (model, feed over the cap, feed under it, a check of the small result)
CASES = {
    "CenterCropPad": (
        _one("CenterCropPad", ["x", "s"], {"x": (F, [2, 2]), "s": (I64, [2])}),
        {"x": _f32(2, 2), "s": _i64(1024, 1024)},
        {"x": np.arange(4, dtype=np.float32).reshape(2, 2), "s": _i64(4, 1)},
        lambda y: np.testing.assert_array_equal(y, [[0], [0], [2], [0]]),
    ),
    "MaxUnpool-output_shape": (
        _one("MaxUnpool", ["x", "i", "s"], {"x": (F, [1, 1, 1, 1]), "i": (I64, [1, 1, 1, 1]), "s": (I64, [4])},
             kernel_shape=[2, 2]),
        {"x": _f32(1, 1, 1, 1), "i": np.zeros((1, 1, 1, 1), np.int64), "s": _i64(1, 1, 1024, 1024)},
        {"x": np.full((1, 1, 1, 1), 7, np.float32), "i": np.full((1, 1, 1, 1), 3, np.int64), "s": _i64(1, 1, 3, 3)},
        # index 3 of the inferred 2 x 2 block, the block placed at the origin of the 3 x 3 output
        lambda y: np.testing.assert_array_equal(y.reshape(3, 3), [[0, 0, 0], [0, 7, 0], [0, 0, 0]]),
    ),
    "MaxUnpool-strides": (
        _one("MaxUnpool", ["x", "i"], {"x": (F, [1, 1, 1, 1]), "i": (I64, [1, 1, 1, 1])},
             kernel_shape=[1024, 1024]),
        {"x": _f32(1, 1, 1, 1), "i": np.zeros((1, 1, 1, 1), np.int64)},
        None, None,
    ),
    "HannWindow": (
        _one("HannWindow", ["n"], {"n": (I64, [])}),
        {"n": np.int64(1 << 20)},
        {"n": np.int64(8)},
        lambda y: np.testing.assert_allclose(y, _hann(8), atol=1e-6),
    ),
    "HammingWindow": (
        _one("HammingWindow", ["n"], {"n": (I64, [])}), {"n": np.int64(1 << 20)}, {"n": np.int64(5)},
        lambda y: np.testing.assert_allclose(y, 25 / 46 - 21 / 46 * np.cos(2 * np.pi * np.arange(5) / 5), atol=1e-6),
    ),
    "BlackmanWindow": (
        _one("BlackmanWindow", ["n"], {"n": (I64, [])}), {"n": np.int64(1 << 20)}, {"n": np.int64(4)},
        lambda y: np.testing.assert_allclose(
            y, 0.42 - 0.5 * np.cos(2 * np.pi * np.arange(4) / 4) + 0.08 * np.cos(4 * np.pi * np.arange(4) / 4),
            atol=1e-6),
    ),
    "MelWeightMatrix": (
        _one("MelWeightMatrix", ["m", "n", "r", "lo", "hi"],
             {"m": (I64, []), "n": (I64, []), "r": (I64, []), "lo": (F, []), "hi": (F, [])}),
        {"m": np.int64(1000), "n": np.int64(4000), "r": np.int64(16000), "lo": np.float32(0), "hi": np.float32(8000)},
        {"m": np.int64(8), "n": np.int64(16), "r": np.int64(8000), "lo": np.float32(0), "hi": np.float32(4000)},
        lambda y: (y.shape == (9, 8) and y.max() == 1.0) or pytest.fail(f"MelWeightMatrix gave {y.shape}"),
    ),
    "DFT": (
        _one("DFT", ["x", "n"], {"x": (F, [1, None, 1]), "n": (I64, [])}, opset=20),
        {"x": _f32(1, 4, 1), "n": np.int64(1 << 20)},
        {"x": _f32(1, 4, 1), "n": np.int64(4)},
        lambda y: np.testing.assert_allclose(y[0, :, 0], [4, 0, 0, 0], atol=1e-6),
    ),
    "STFT": (
        _one("STFT", ["s", "step", "", "len"], {"s": (F, [1, None, 1]), "step": (I64, []), "len": (I64, [])}),
        {"s": _f32(1, 4096, 1), "step": np.int64(1), "len": np.int64(2048)},
        {"s": _f32(1, 8, 1), "step": np.int64(2), "len": np.int64(4)},
        lambda y: np.testing.assert_allclose(y[0, :, 0, 0], [4, 4, 4], atol=1e-6),
    ),
    "MaxPool-pads": (
        _one("MaxPool", ["x"], {"x": (F, [1, 1, 1, 1])}, kernel_shape=[1, 1], pads=[512, 512, 512, 512]),
        {"x": _f32(1, 1, 1, 1)}, None, None,
    ),
    "AveragePool-pads": (
        _one("AveragePool", ["x"], {"x": (F, [1, 1, 1, 1])}, kernel_shape=[1, 1], pads=[512, 512, 512, 512]),
        {"x": _f32(1, 1, 1, 1)}, None, None,
    ),
    "LpPool-pads": (
        _one("LpPool", ["x"], {"x": (F, [1, 1, 1, 1])}, kernel_shape=[1, 1], pads=[512, 512, 512, 512]),
        {"x": _f32(1, 1, 1, 1)}, None, None,
    ),
    "Concat": (
        _one("Concat", ["a", "b"], {"a": (F, [None]), "b": (F, [None])}, axis=0),
        {"a": _f32(150_000), "b": _f32(150_000)},
        {"a": _f32(3), "b": np.zeros(2, np.float32)},
        lambda y: np.testing.assert_array_equal(y, [1, 1, 1, 0, 0]),
    ),
    "Add": (
        _one("Add", ["a", "b"], {"a": (F, [None, 1]), "b": (F, [1, None])}),
        {"a": _f32(1024, 1), "b": _f32(1, 1024)},
        {"a": np.arange(2, dtype=np.float32).reshape(2, 1), "b": np.arange(3, dtype=np.float32).reshape(1, 3)},
        lambda y: np.testing.assert_array_equal(y, [[0, 1, 2], [1, 2, 3]]),
    ),
    "Mul": (
        _one("Mul", ["a", "b"], {"a": (F, [None, 1]), "b": (F, [None])}),
        {"a": _f32(1024, 1), "b": _f32(1024)}, {"a": _f32(2, 1), "b": _f32(3)},
        lambda y: y.shape == (2, 3) or pytest.fail(str(y.shape)),
    ),
    "Where": (
        _one("Where", ["c", "a", "b"], {"c": (B, [None, 1, 1]), "a": (F, [1, None, 1]), "b": (F, [1, 1, None])}),
        {"c": np.ones((128, 1, 1), bool), "a": _f32(1, 64, 1), "b": _f32(1, 1, 64)},
        {"c": np.array([True, False]).reshape(2, 1, 1), "a": _f32(1, 2, 1), "b": np.zeros((1, 1, 2), np.float32)},
        lambda y: np.testing.assert_array_equal(y, [[[1, 1], [1, 1]], [[0, 0], [0, 0]]]),
    ),
    "MatMul": (
        _one("MatMul", ["a", "b"], {"a": (F, [None, None]), "b": (F, [None, None])}),
        {"a": _f32(1024, 1), "b": _f32(1, 1024)}, {"a": _f32(2, 3), "b": _f32(3, 2)},
        lambda y: np.testing.assert_array_equal(y, [[3, 3], [3, 3]]),
    ),
    "MatMul-empty": (
        _one("MatMul", ["a", "b"], {"a": (F, [None, None]), "b": (F, [None, None])}),
        {"a": _f32(1024, 0), "b": _f32(0, 1024)}, {"a": _f32(2, 0), "b": _f32(0, 3)},
        lambda y: np.testing.assert_array_equal(y, np.zeros((2, 3))),
    ),
    "Einsum": (
        _one("Einsum", ["a", "b"], {"a": (F, [None]), "b": (F, [None])}, equation="i,j->ij"),
        {"a": _f32(1024), "b": _f32(1024)},
        {"a": np.arange(2, dtype=np.float32), "b": np.arange(3, dtype=np.float32)},
        lambda y: np.testing.assert_array_equal(y, [[0, 0, 0], [0, 1, 2]]),
    ),
    "Einsum-empty": (
        _one("Einsum", ["a", "b"], {"a": (F, [None, None]), "b": (F, [None, None])}, equation="ij,jk->ik"),
        {"a": _f32(1024, 0), "b": _f32(0, 1024)}, {"a": _f32(2, 0), "b": _f32(0, 3)},
        lambda y: np.testing.assert_array_equal(y, np.zeros((2, 3))),
    ),
    "Einsum-ellipsis": (
        _one("Einsum", ["a", "b"], {"a": (F, None), "b": (F, None)}, equation="...i,...j->...ij"),
        {"a": _f32(4, 1, 256), "b": _f32(1, 4, 256)}, {"a": _f32(2, 1, 2), "b": _f32(1, 3, 2)},
        lambda y: y.shape == (2, 3, 2, 2) or pytest.fail(str(y.shape)),
    ),
    "Gemm": (
        _one("Gemm", ["a", "b"], {"a": (F, [None, None]), "b": (F, [None, None])}),
        {"a": _f32(1024, 0), "b": _f32(0, 1024)}, {"a": _f32(2, 1), "b": _f32(1, 3)},
        lambda y: np.testing.assert_array_equal(y, np.ones((2, 3))),
    ),
    "ConvTranspose-output_shape": (
        # a 1 x 1 input, a 1 x 1 kernel: output_shape alone asks for 1024 x 1024
        _one("ConvTranspose", ["x", "w"], {"x": (F, [1, 1, 1, 1]), "w": (F, [1, 1, 1, 1])},
             output_shape=[1024, 1024]),
        {"x": _f32(1, 1, 1, 1), "w": _f32(1, 1, 1, 1)}, None, None,
    ),
    "ConvTranspose-strides": (
        # strides spread a 5 x 5 input over 1201 x 1201; a 2 x 2 one over 301 x 301
        _one("ConvTranspose", ["x", "w"], {"x": (F, [1, 1, None, None]), "w": (F, [1, 1, 1, 1])},
             strides=[300, 300]),
        {"x": _f32(1, 1, 5, 5), "w": _f32(1, 1, 1, 1)},
        {"x": np.arange(1, 5, dtype=np.float32).reshape(1, 1, 2, 2), "w": np.full((1, 1, 1, 1), 2, np.float32)},
        lambda y: (y.shape == (1, 1, 301, 301) and y[0, 0, 300, 300] == 8 and y.sum() == 20)
        or pytest.fail(f"ConvTranspose gave {y.shape}, sum {y.sum()}"),
    ),
    "Col2Im": (
        # one block, strides as long as the image: image_shape alone asks for 1024 x 1024
        _one("Col2Im", ["x", "img", "blk"], {"x": (F, [1, None, None]), "img": (I64, [2]), "blk": (I64, [2])},
             strides=[1024, 1024]),
        {"x": _f32(1, 1, 1), "img": _i64(1024, 1024), "blk": _i64(1, 1)},
        {"x": np.full((1, 1, 1), 5, np.float32), "img": _i64(2, 2), "blk": _i64(1, 1)},
        lambda y: np.testing.assert_array_equal(y.reshape(2, 2), [[5, 0], [0, 0]]),
    ),
    "GridSample": (
        # 4,096 channels times 64 x 64 sampling points: each input small, their product not
        _one("GridSample", ["x", "g"], {"x": (F, [1, None, 1, 1]), "g": (F, [1, None, None, 2])}, opset=16),
        {"x": _f32(1, 4096, 1, 1), "g": np.zeros((1, 64, 64, 2), np.float32)},
        {"x": np.full((1, 2, 1, 1), 3, np.float32), "g": np.zeros((1, 1, 2, 2), np.float32)},
        lambda y: np.testing.assert_allclose(y, np.full((1, 2, 1, 2), 3.0)),  # (0, 0) is the pixel's centre
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_asked_for_too_much_is_refused_before_allocating(case):
    model, big, small, check = CASES[case]
    sess = ort.InferenceSession(model.SerializeToString(), _capped(), providers=["CPUExecutionProvider"])
    message, peak = refused_run(sess, big)
    assert peak < CAP, f"{case} allocated {peak} bytes before refusing"
    assert case.split("-")[0] in message  # names the node's op
    if small is not None:
        (y,) = sess.run(None, small)
        check(y)


def test_concat_from_sequence_past_the_cap_is_refused():
    model = make_model(
        [helper.make_node("SequenceConstruct", ["a", "a", "a"], ["s"]),
         helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)],
        [_vi("a", F, [None])], [_vi("y")])
    sess = ort.InferenceSession(model.SerializeToString(), _capped())
    with pytest.raises(ort.InvalidArgument, match="ConcatFromSequence.*max_allocation_bytes"):
        sess.run(None, {"a": _f32(100_000)})
    (y,) = sess.run(None, {"a": np.arange(2, dtype=np.float32)})
    np.testing.assert_array_equal(y, [0, 1, 0, 1, 0, 1])


def _doubling_loop():
    """A Loop whose carried value doubles every iteration through Concat."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Concat", ["x_in", "x_in"], ["x_out"], axis=0)],
        "body",
        [_vi("i", I64, []), _vi("c_in", B, []), _vi("x_in", F, [None])],
        [_vi("c_out", B, []), _vi("x_out", F, [None])],
    )
    return make_model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
                      [_vi("M", I64, []), _vi("x", F, [1])], [_vi("y", F, [None])])


def test_a_value_doubling_through_a_loop_stops_at_the_cap():
    sess = ort.InferenceSession(_doubling_loop().SerializeToString(), _capped())
    (y,) = sess.run(None, {"M": np.int64(5), "x": _f32(1)})
    assert y.shape == (32,)
    message, peak = refused_run(sess, {"M": np.int64(60), "x": _f32(1)}, "Concat output.*max_allocation_bytes")
    # the last join allowed is 1 MiB from a 512 KiB value; the refused one would have
    # been 2 MiB on top of the 1 MiB it joins: the peak shows it was never made
    assert peak < 2.5 * CAP, peak
    assert "Loop" in message
    (again,) = sess.run(None, {"M": np.int64(3), "x": _f32(1)})
    assert again.shape == (8,)


def test_the_default_cap_lets_the_small_runs_through():
    for case, (model, _, small, check) in CASES.items():
        if small is not None:
            (y,) = ort.InferenceSession(model.SerializeToString()).run(None, small)
            check(y)


def test_huge_broadcast_is_refused_under_the_default_cap():
    # [2^20, 1] + [1, 2^20] float32 is 4 TiB: a typed error, not an OOM kill
    model = CASES["Add"][0]
    sess = ort.InferenceSession(model.SerializeToString())
    a = np.ones((1 << 20, 1), np.float32)
    with pytest.raises(ort.InvalidArgument, match="Add output.*max_allocation_bytes"):
        sess.run(None, {"a": a, "b": a.reshape(1, -1)})


def test_broadcast_of_equal_shapes_and_row_vectors_still_runs():
    model = CASES["Add"][0]
    sess = ort.InferenceSession(model.SerializeToString(), _capped())
    a = np.arange(6, dtype=np.float32).reshape(6, 1)
    (y,) = sess.run(None, {"a": a, "b": np.ones((1, 1), np.float32)})
    np.testing.assert_array_equal(y, a + 1)


def test_pool_without_padding_growth_is_not_checked_against_the_input():
    # an ordinary pool over an input already near the cap runs: its output is smaller
    model = _one("MaxPool", ["x"], {"x": (F, [1, 1, None, None])}, kernel_shape=[2, 2], strides=[2, 2])
    sess = ort.InferenceSession(model.SerializeToString(), _capped(CAP))
    x = np.random.default_rng(0).standard_normal((1, 1, 500, 500)).astype(np.float32)  # 1,000,000 bytes
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, x.reshape(1, 1, 250, 2, 250, 2).max(axis=(3, 5)))


def test_initializer_fed_concat_is_capped_too():
    w = numpy_helper.from_array(np.ones(200_000, np.float32), "w")
    model = make_model([helper.make_node("Concat", ["w", "x"], ["y"], axis=0)], [_vi("x", F, [None])],
                       [_vi("y")], [w])
    sess = ort.InferenceSession(model.SerializeToString(), _capped())
    with pytest.raises(ort.InvalidArgument, match="Concat"):
        sess.run(None, {"x": _f32(100_000)})
    assert sess.run(None, {"x": _f32(2)})[0].shape == (200_002,)


def _png(width, height):
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, format="PNG")  # one bit a pixel, all zero: tiny
    return np.frombuffer(buf.getvalue(), np.uint8).copy()


def test_image_decoder_refuses_a_picture_over_the_cap_from_its_header():
    pytest.importorskip("PIL")
    model = make_model([helper.make_node("ImageDecoder", ["b"], ["y"])], [_vi("b", TensorProto.UINT8, [None])],
                       [_vi("y", TensorProto.UINT8)], opset=20)
    sess = ort.InferenceSession(model.SerializeToString(), _capped())
    big = _png(2048, 2048)  # a few hundred bytes that decode to 12 MiB of RGB
    assert big.size < 64 << 10
    _, peak = refused_run(sess, {"b": big}, "ImageDecoder image.*max_allocation_bytes")
    assert peak < CAP, peak
    (y,) = sess.run(None, {"b": _png(5, 3)})
    assert y.shape == (3, 5, 3) and not y.any()


@pytest.mark.parametrize("op,attrs", [
    ("MaxRoiPool", {"pooled_shape": [1024, 1024]}),
    ("RoiAlign", {"output_height": 1024, "output_width": 1024}),
])
def test_roi_pools_of_a_huge_pooled_shape_are_refused(op, attrs):
    inputs = ["x", "r"] + (["i"] if op == "RoiAlign" else [])
    vis = [_vi("x", F, [1, 1, 4, 4]), _vi("r", F, [1, 5 if op == "MaxRoiPool" else 4])]
    if op == "RoiAlign":
        vis.append(_vi("i", I64, [1]))
    model = make_model([helper.make_node(op, inputs, ["y"], **attrs)], vis, [_vi("y")])
    sess = ort.InferenceSession(model.SerializeToString(), _capped())
    feed = {"x": np.ones((1, 1, 4, 4), np.float32),
            "r": np.array([[0, 0, 0, 3, 3]] if op == "MaxRoiPool" else [[0, 0, 3, 3]], np.float32)}
    if op == "RoiAlign":
        feed["i"] = np.zeros(1, np.int64)
    _, peak = refused_run(sess, feed, f"{op} output.*max_allocation_bytes")
    assert peak < CAP
