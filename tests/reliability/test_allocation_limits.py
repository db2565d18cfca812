"""The allocation cap: tiny models asking for huge tensors get a typed error *before*
anything is allocated (Linux overcommits, so allocating first and failing later is
not an option: the process would be killed when the pages are touched)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt.run.limits import (
    CONFIG_KEY,
    allocation_limit,
    check_allocation,
    default_max_allocation_bytes,
    limit_allocations,
)

from ..conftest import make_model
from .caps import CAP, peak_during, refused_run

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _capped(cap=CAP):
    so = ort.SessionOptions()
    so.max_allocation_bytes = cap
    return so


# each case: a model, a feed over the cap, a feed under it and the expected result shape
CASES = {
    "ConstantOfShape": (
        make_model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [_vi("s", I64, [3])], [_vi("y")]),
        {"s": np.array([1024, 1024, 2], np.int64)},
        {"s": np.array([4, 5, 6], np.int64)}, (4, 5, 6),
    ),
    "Expand": (
        make_model([helper.make_node("Expand", ["x", "s"], ["y"])], [_vi("x", F, [1]), _vi("s", I64, [2])], [_vi("y")]),
        {"x": np.ones(1, np.float32), "s": np.array([1024, 2048], np.int64)},
        {"x": np.ones(1, np.float32), "s": np.array([3, 7], np.int64)}, (3, 7),
    ),
    "Tile": (
        make_model([helper.make_node("Tile", ["x", "r"], ["y"])], [_vi("x", F, [2, 2]), _vi("r", I64, [2])], [_vi("y")]),
        {"x": np.ones((2, 2), np.float32), "r": np.array([1024, 512], np.int64)},
        {"x": np.ones((2, 2), np.float32), "r": np.array([3, 2], np.int64)}, (6, 4),
    ),
    "Range": (
        make_model([helper.make_node("Range", ["a", "b", "d"], ["y"])],
                   [_vi("a", F, []), _vi("b", F, []), _vi("d", F, [])], [_vi("y")]),
        {"a": np.float32(0), "b": np.float32(4e6), "d": np.float32(1)},
        {"a": np.float32(0), "b": np.float32(10), "d": np.float32(2)}, (5,),
    ),
    "Range-int": (
        make_model([helper.make_node("Range", ["a", "b", "d"], ["y"])],
                   [_vi("a", I64, []), _vi("b", I64, []), _vi("d", I64, [])], [_vi("y", I64)]),
        {"a": np.int64(-(1 << 62)), "b": np.int64(1 << 62), "d": np.int64(1)},
        {"a": np.int64(10), "b": np.int64(0), "d": np.int64(-3)}, (4,),
    ),
    "Pad": (
        make_model([helper.make_node("Pad", ["x", "p"], ["y"])], [_vi("x", F, [1, 1]), _vi("p", I64, [4])], [_vi("y")]),
        {"x": np.ones((1, 1), np.float32), "p": np.array([0, 0, 1023, 2047], np.int64)},
        {"x": np.ones((1, 1), np.float32), "p": np.array([1, 0, 1, 2], np.int64)}, (3, 3),
    ),
    "Pad-edge": (
        make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="edge")],
                   [_vi("x", F, [1, 1]), _vi("p", I64, [4])], [_vi("y")]),
        {"x": np.ones((1, 1), np.float32), "p": np.array([0, 0, 1023, 2047], np.int64)},
        {"x": np.ones((1, 1), np.float32), "p": np.array([1, 0, 1, 2], np.int64)}, (3, 3),
    ),
    "OneHot": (
        make_model([helper.make_node("OneHot", ["i", "d", "v"], ["y"])],
                   [_vi("i", I64, [None]), _vi("d", I64, []), _vi("v", F, [2])], [_vi("y")]),
        {"i": np.zeros(1024, np.int64), "d": np.int64(4096), "v": np.array([0, 1], np.float32)},
        {"i": np.array([0, 2], np.int64), "d": np.int64(3), "v": np.array([0, 1], np.float32)}, (2, 3),
    ),
    "Resize": (
        make_model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")],
                   [_vi("x", F, [1, 1, 2, 2]), _vi("s", F, [4])], [_vi("y")]),
        {"x": np.ones((1, 1, 2, 2), np.float32), "s": np.array([1, 1, 512, 512], np.float32)},
        {"x": np.ones((1, 1, 2, 2), np.float32), "s": np.array([1, 1, 2, 3], np.float32)}, (1, 1, 4, 6),
    ),
    "Upsample": (
        make_model([helper.make_node("Upsample", ["x", "s"], ["y"])],
                   [_vi("x", F, [1, 1, 2, 2]), _vi("s", F, [4])], [_vi("y")], opset=9),
        {"x": np.ones((1, 1, 2, 2), np.float32), "s": np.array([1, 1, 512, 512], np.float32)},
        {"x": np.ones((1, 1, 2, 2), np.float32), "s": np.array([1, 1, 2, 3], np.float32)}, (1, 1, 4, 6),
    ),
    "Multinomial": (
        make_model([helper.make_node("Multinomial", ["x"], ["y"], sample_size=1 << 20, seed=1.0)],
                   [_vi("x", F, [1, 3])], [_vi("y", TensorProto.INT32)]),
        {"x": np.zeros((1, 3), np.float32)}, None, None,
    ),
}


@pytest.mark.parametrize("op", list(CASES))
def test_run_time_shape_over_the_cap_is_refused_before_allocating(op):
    model, big, small, shape = CASES[op]
    sess = ort.InferenceSession(model.SerializeToString(), _capped())
    message, peak = refused_run(sess, big)
    assert peak < CAP, f"{op} allocated {peak} bytes before refusing"
    assert op.split("-")[0] in message  # names the node's op
    if small is not None:
        (y,) = sess.run(None, small)
        assert y.shape == shape


def test_the_default_cap_lets_the_same_small_runs_through():
    for op, (model, _, small, shape) in CASES.items():
        if small is not None:
            (y,) = ort.InferenceSession(model.SerializeToString()).run(None, small)
            assert y.shape == shape, op


def test_huge_shapes_under_the_default_cap_never_raise_memory_error():
    # petabyte requests: no MemoryError, no OOM kill, a typed error naming the cap
    model, _, _, _ = CASES["ConstantOfShape"]
    sess = ort.InferenceSession(model.SerializeToString())
    with pytest.raises(ort.InvalidArgument, match="max_allocation_bytes"):
        sess.run(None, {"s": np.array([1 << 20, 1 << 20, 1 << 10], np.int64)})
    with pytest.raises(ort.InvalidArgument, match="negative dimension"):
        sess.run(None, {"s": np.array([2, -1, 2], np.int64)})


def test_random_normal_with_a_huge_shape_attribute_fails_at_session_creation():
    model = make_model([helper.make_node("RandomNormal", [], ["y"], shape=[1 << 20, 1 << 20])], [], [_vi("y")])
    peak = peak_during(lambda: pytest.raises(ort.InvalidArgument, ort.InferenceSession, model.SerializeToString()))
    assert peak < 64 << 20
    with pytest.raises(ort.InvalidArgument, match="RandomNormal.*max_allocation_bytes"):
        ort.InferenceSession(model.SerializeToString())


def test_huge_declared_initializer_is_refused_before_decoding():
    t = TensorProto(name="w", data_type=F, dims=[1 << 20, 1 << 20])  # 4 TiB, no data at all
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y")], [t])
    with pytest.raises(ort.InvalidGraph, match="tensor 'w'.*max_allocation_bytes"):
        ort.InferenceSession(model.SerializeToString())


def test_initializer_over_a_small_cap_is_refused():
    w = numpy_helper.from_array(np.ones(1 << 19, np.float32), "w")  # 2 MiB
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y")], [w])
    with pytest.raises(ort.InvalidGraph, match="max_allocation_bytes \\(1048576\\)"):
        ort.InferenceSession(model.SerializeToString(), _capped())
    (y,) = ort.InferenceSession(model.SerializeToString()).run(None, {})
    assert y.shape == (1 << 19,)


def test_constant_folding_respects_the_cap():
    shape = numpy_helper.from_array(np.array([1024, 1024], np.int64), "s")
    model = make_model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [], [_vi("y")], [shape])
    holder = []
    peak = peak_during(lambda: holder.append(
        pytest.raises((ort.InvalidGraph, ort.InvalidArgument),
                      lambda: ort.InferenceSession(model.SerializeToString(), _capped()).run(None, {}))))
    assert "max_allocation_bytes" in str(holder[0].value)
    assert peak < CAP


def test_cap_applies_inside_subgraphs():
    body = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["o"])], "then", [], [_vi("o")])
    other = helper.make_graph([helper.make_node("Constant", [], ["o2"], value_floats=[0.0])], "else", [], [_vi("o2")])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)],
                       [_vi("c", TensorProto.BOOL, []), _vi("s", I64, [2])], [_vi("y")])
    sess = ort.InferenceSession(model.SerializeToString(), _capped())
    with pytest.raises(ort.InvalidArgument, match="max_allocation_bytes"):
        sess.run(None, {"c": np.array(True), "s": np.array([1024, 1024], np.int64)})
    assert sess.run(None, {"c": np.array(True), "s": np.array([2, 3], np.int64)})[0].shape == (2, 3)


def test_session_config_entry_overrides_the_option():
    model, big, _, _ = CASES["Expand"]
    so = ort.SessionOptions()
    so.add_session_config_entry(CONFIG_KEY, str(CAP))
    sess = ort.InferenceSession(model.SerializeToString(), so)
    with pytest.raises(ort.InvalidArgument, match=f"max_allocation_bytes \\({CAP}\\)"):
        sess.run(None, big)
    so.add_session_config_entry(CONFIG_KEY, "lots")
    with pytest.raises(ort.InvalidArgument, match=CONFIG_KEY):
        ort.InferenceSession(model.SerializeToString(), so)
    so.add_session_config_entry(CONFIG_KEY, "0")
    with pytest.raises(ort.InvalidArgument, match=CONFIG_KEY):
        ort.InferenceSession(model.SerializeToString(), so)


@pytest.mark.parametrize("bad", [0, -1, "1GB", 1.5, True])
def test_option_must_be_a_positive_int(bad):
    so = ort.SessionOptions()
    with pytest.raises(ort.InvalidArgument, match="max_allocation_bytes"):
        so.max_allocation_bytes = bad


def test_default_is_half_the_memory_this_process_can_have():
    import os

    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    d = default_max_allocation_bytes()
    assert 0 < d <= phys // 2
    assert ort.SessionOptions().max_allocation_bytes == d
    assert allocation_limit() == d  # outside any session


def test_check_allocation_helper_contract():
    with limit_allocations(100):
        assert check_allocation((5, np.int64(5)), np.float32, "x") == (5, 5)
        with pytest.raises(ort.InvalidArgument, match=r"thing: a tensor of shape \[5, 6\] \(float32\) needs 120"):
            check_allocation([5, 6], np.float32, "thing")
        with pytest.raises(ort.InvalidArgument, match="negative dimension -2"):
            check_allocation([3, -2], np.float32, "thing")
        # Python ints: no int64 overflow hides a huge product
        with pytest.raises(ort.InvalidArgument, match="needs"):
            check_allocation([1 << 40, 1 << 40, 1 << 40], np.uint8, "thing")
        with limit_allocations(1000):
            assert allocation_limit() == 1000
        assert allocation_limit() == 100
    assert allocation_limit() == default_max_allocation_bytes()


def _loop_model():
    """A Loop whose trip count is fed, emitting a 64 KiB scan slice per iteration."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("ConstantOfShape", ["shape"], ["slice"],
                             value=helper.make_tensor("v", F, [1], [1.0])),
        ],
        "body",
        [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, [])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("slice", F, [16384])],
        initializer=[numpy_helper.from_array(np.array([16384], np.int64), "shape")],
    )
    node = helper.make_node("Loop", ["M", "c"], ["scan"], body=body)
    return make_model([node], [_vi("M", I64, []), _vi("c", TensorProto.BOOL, [])], [_vi("scan", F, None)])


def test_loop_scan_output_growing_past_the_cap_is_refused():
    sess = ort.InferenceSession(_loop_model(), sess_options=_capped(), providers=["CPUExecutionProvider"])
    (ok,) = sess.run(None, {"M": np.array(8, np.int64), "c": np.array(True)})
    assert ok.shape == (8, 16384) and np.all(ok == 1.0)
    # 1 MiB / 64 KiB = 16 slices fit; a fed trip count of a million must stop at the cap
    feed = {"M": np.array(1_000_000, np.int64), "c": np.array(True)}
    with pytest.raises(ort.InvalidArgument, match="Loop scan output 0"):
        sess.run(None, feed)
    (again,) = sess.run(None, {"M": np.array(3, np.int64), "c": np.array(True)})
    assert again.shape == (3, 16384)
