"""numpy's ufunc buffer narrowed for broadcasts along long runs (``rows.broadcast_buffer``).

A per-channel or per-row operand broadcast over runs of 256 to 8191 values is faster
when numpy does not buffer several runs together; the kernels that broadcast so
(BatchNormalization, Add/Sub/Mul/Div, LayerNormalization and the contrib layer norms,
the shifted softmax, a convolution's bias) narrow the buffer around those calls. The
answers must be the same bits as without it, and onnxruntime's to float tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt_cpu import rows

# these tests check the numpy paths' internals; the compiled kernels have their own
# (tests/cpu/test_native_kernels.py)
pytestmark = pytest.mark.usefixtures("numpy_kernels")

rt = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize(
    "out_shape, shapes, size",
    [
        ((1, 256, 56, 56), [(1, 256, 56, 56), (256, 1, 1)], 3136),  # per channel: runs of H * W
        ((1536, 768), [(1536, 768), (1536, 1)], 768),  # per row
        ((100, 1000), [(100, 1000), (100, 1)], 992),  # a multiple of 16, never above the run
        ((4, 64, 30, 30), [(4, 64, 30, 30), (1, 64, 1, 1)], 896),
        ((1024, 3072), [(1024, 3072), (1024, 1)], 3072),
        ((2, 256, 128), [(2, 256, 128), (2, 256, 1)], None),  # runs of 128: buffering wins
        ((8, 64, 7, 7), [(8, 64, 7, 7), (64, 1, 1)], None),  # runs of 49
        ((64, 100), [(64, 100), (64, 1)], None),  # too small to pay the switch
        ((256, 3136), [(256, 3136), (256, 3136)], None),  # nothing broadcast
        ((256, 3136), [(256, 3136), ()], None),  # a scalar: one run of everything
        ((64, 12544), [(64, 12544), (64, 1)], None),  # runs as long as numpy's buffer
    ],
)
def test_buffer_narrowed_only_for_long_broadcast_runs(out_shape, shapes, size):
    ctx = rows.broadcast_buffer(out_shape, *shapes)
    if size is None:
        assert not isinstance(ctx, rows._BufferSize)
    else:
        assert isinstance(ctx, rows._BufferSize) and ctx.size == size


def test_planes_broadcast_along_two_axes_run_over_both():
    # [16, 64, 64] times [16, 1, 1]: the run is the whole 4096-value plane
    ctx = rows.broadcast_buffer((16, 64, 64), (16, 64, 64), (16, 1, 1))
    assert isinstance(ctx, rows._BufferSize) and ctx.size == 4096


def test_buffer_size_restored_after_the_block_and_after_an_error():
    before = np.getbufsize()
    with rows.broadcast_buffer((256, 3136), (256, 3136), (256, 1)):
        assert np.getbufsize() == 3136
    assert np.getbufsize() == before
    with pytest.raises(RuntimeError, match="inside"):
        with rows.broadcast_buffer((256, 3136), (256, 3136), (256, 1)):
            raise RuntimeError("inside")
    assert np.getbufsize() == before


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=9)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _cases():
    rng = np.random.default_rng(3)
    c, h = 96, 40  # runs of 1600 values
    x = rng.standard_normal((1, c, h, h)).astype(np.float32)
    params = [(rng.random(c) + 0.5).astype(np.float32) for _ in range(4)]
    # BatchNormalization whose parameters are graph inputs (overridable initializers,
    # as older exporters write them): folded at run time, applied by broadcasting
    bn = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
                [_vi("x", list(x.shape))] + [_vi(n, [c]) for n in "sbmv"], [_vi("y", None)],
                [numpy_helper.from_array(p, n) for p, n in zip(params, "sbmv")])
    vec = rng.standard_normal((c, 1, 1)).astype(np.float32)
    arith = _model([helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Sub", ["t", "a"], ["u"]),
                    helper.make_node("Div", ["u", "a"], ["y"])],
                   [_vi("x", list(x.shape)), _vi("a", [c, 1, 1])], [_vi("y", None)])
    rows_x = rng.standard_normal((512, 768)).astype(np.float32)
    gamma, beta = rng.standard_normal(768).astype(np.float32), rng.standard_normal(768).astype(np.float32)
    ln = _model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                [_vi("x", [512, 768])], [_vi("y", None)],
                [numpy_helper.from_array(gamma, "g"), numpy_helper.from_array(beta, "b")])
    skip = rng.standard_normal((512, 768)).astype(np.float32)
    sln = _model([helper.make_node("SkipLayerNormalization", ["x", "k", "g", "b"], ["y"], domain="com.microsoft")],
                 [_vi("x", [1, 512, 768]), _vi("k", [1, 512, 768])], [_vi("y", None)],
                 [numpy_helper.from_array(gamma, "g"), numpy_helper.from_array(beta, "b")])
    # logits in the thousands take the shifted softmax
    logits = (rng.standard_normal((64, 1000)) * 1000).astype(np.float32)
    sm = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_vi("x", [64, 1000])], [_vi("y", None)])
    w = (rng.standard_normal((64, c, 3, 3)) / 30).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    conv = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                  [_vi("x", list(x.shape))], [_vi("y", None)],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    return {
        "batchnorm-runtime-params": (bn, {"x": x}),
        "mul-sub-div-per-channel": (arith, {"x": x, "a": vec}),
        "layernorm": (ln, {"x": rows_x}),
        "skip-layernorm": (sln, {"x": rows_x[None], "k": skip[None]}),
        "softmax-shifted": (sm, {"x": logits}),
        "conv-bias": (conv, {"x": x}),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_give_the_same_bits_with_the_narrowed_buffer_and_onnxruntime_answers(name, monkeypatch):
    model, feeds = CASES[name]
    blob = model.SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
    entered = []
    real_enter = rows._BufferSize.__enter__

    def spy(self):
        entered.append(self.size)
        return real_enter(self)

    monkeypatch.setattr(rows._BufferSize, "__enter__", spy)
    narrowed = sess.run(None, feeds)[0]
    assert entered, f"{name} never narrowed the buffer"
    monkeypatch.setattr(rows, "_BUFFER_MIN_SIZE", 1 << 62)  # never narrow
    entered.clear()
    plain = sess.run(None, feeds)[0]
    assert not entered
    np.testing.assert_array_equal(narrowed, plain)
    ref = rt.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(narrowed, ref, rtol=1e-5, atol=1e-5)
