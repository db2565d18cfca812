"""The compiled time loop of RNN, GRU and LSTM (``onnxrt_cpu/native/src/rnn.c``).

Where the CPU provider's compiled kernels are built, the recurrent layers with their
default activations (tanh; sigmoid and tanh; sigmoid, tanh and tanh) and no clip or
``input_forget`` run their steps in C: every element gets the numpy loop's operations
in its order, each rounded once, with numpy's own float32 tanh where the CPU runs the
AVX2 or AVX-512 clones. The one operation summed differently is the recurrent
product (here a chain of fused multiply-adds per column; numpy calls OpenBLAS's
``sgemv`` for one row, ``sgemm`` for more), so:

- with a zero recurrent weight (the product exactly zero both ways) the compiled
  loop gives the numpy loop's values bit for bit, tanh included;
- with real weights the two differ by the rounding of the products carried through
  the steps: within :data:`_ATOL` (float32, weights of the usual ``1/sqrt(H)`` scale;
  the largest difference over these configurations is about 5e-7) and 1e-13 for
  float64, whose tanh is the C library's, an ulp or two from numpy's;
- a column's sum does not depend on the block the column falls in, so the outputs
  are the same bit for bit on any number of threads (a direction's hidden units are
  split among them).

Everything else (clip, other activations, ``input_forget``) stays on the numpy loop.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt
from onnxrt_cpu import native
from tests.conftest import make_model

rt = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(native.K is None, reason="the compiled kernels are not loaded")

#: compiled against numpy loop, float32 (see the module's docstring)
_ATOL = 5e-6
_ATOL_F64 = 1e-13
#: against onnxruntime, whose sigmoid and tanh are approximations of their own
_ATOL_ORT = 1e-5

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


class _CountingKernels:
    """The compiled kernels, counting the calls of the recurrent loop."""

    def __init__(self, kernels):
        self.kernels, self.calls = kernels, 0

    def __getattr__(self, name):
        return getattr(self.kernels, name)

    def rnn_steps(self, *args):
        self.calls += 1
        return self.kernels.rnn_steps(*args)


def _layer(op, direction, seq, batch, size, hidden, *, dtype=np.float32, states=(), ragged=None, peepholes=False,
           bias=True, fed_weights=False, layout=0, rng=None, r_scale=1.0, x_scale=1.0, **attrs):
    """One recurrent layer: (model bytes, feeds). ``states`` names the initial states
    fed (``"h0"``, ``"c0"``); ``ragged`` the sequence lengths or None; weights of the
    usual ``1/sqrt(hidden)`` scale (R times ``r_scale``), constants unless
    ``fed_weights``."""
    rng = rng or np.random.default_rng(0)
    d = 2 if direction == "bidirectional" else 1
    g = _GATES[op]
    s = 1 / np.sqrt(hidden)
    tp = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    values = {
        "w": rng.uniform(-s, s, (d, g * hidden, size)).astype(dtype),
        "r": (rng.uniform(-s, s, (d, g * hidden, hidden)) * r_scale).astype(dtype),
    }
    if bias:
        values["b"] = rng.uniform(-s, s, (d, 2 * g * hidden)).astype(dtype)
    if peepholes:
        values["p"] = rng.uniform(-s, s, (d, 3 * hidden)).astype(dtype)
    x_shape = [seq, batch, size] if layout == 0 else [batch, seq, size]
    state_shape = [d, batch, hidden] if layout == 0 else [batch, d, hidden]
    feeds = {"x": (rng.standard_normal(x_shape) * x_scale).astype(dtype)}
    if ragged is not None:
        feeds["sl"] = np.asarray(ragged, np.int32)
    for n in states:
        feeds[n] = (rng.standard_normal(state_shape) * 0.7).astype(dtype)
    names = ["x", "w", "r", "b" if bias else "", "sl" if ragged is not None else "", "h0" if "h0" in states else ""]
    if op == "LSTM":
        names += ["c0" if "c0" in states else "", "p" if peepholes else ""]
    while not names[-1]:
        names.pop()
    outs = ["y", "yh", "yc"] if op == "LSTM" else ["y", "yh"]
    if layout:
        attrs["layout"] = 1
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction, **attrs)
    fed = dict(feeds)
    if fed_weights:
        fed |= values
    types = {"sl": TensorProto.INT32}
    inputs = [helper.make_tensor_value_info(n, types.get(n, tp), list(v.shape)) for n, v in fed.items()]
    inits = [] if fed_weights else [numpy_helper.from_array(v, n) for n, v in values.items()]
    model = make_model([node], inputs, [helper.make_tensor_value_info(n, tp, None) for n in outs], inits,
                       opset=14)
    return model.SerializeToString(), fed


def _run(model, feeds, threads, kernels):
    """The outputs with ``native.K`` set to ``kernels`` (None: the numpy loop)."""
    saved = native.K
    native.K = kernels
    try:
        so = onnxrt.SessionOptions()
        so.intra_op_num_threads = threads
        return onnxrt.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    finally:
        native.K = saved


def _compiled_and_numpy(model, feeds, threads=1):
    """(compiled outputs, numpy loop's outputs, compiled loop calls)."""
    counting = _CountingKernels(native.K)
    compiled = _run(model, feeds, threads, counting)
    numpy_loop = _run(model, feeds, threads, None)
    return compiled, numpy_loop, counting.calls


def _assert_close(got, want, atol, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, i)
        np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=f"{what}, output {i}")


def _random_layer(seed):
    """A random configuration: (model, feeds, threads, dtype, ragged, layout)."""
    rng = np.random.default_rng(9000 + seed)
    op = ("RNN", "GRU", "LSTM")[seed % 3]
    direction = ("forward", "reverse", "bidirectional")[seed // 3 % 3]
    threads = 1 + seed // 9 % 3
    batch = int(rng.choice([1, 2, 3, 4, 5, 8, 11]))
    hidden = int(rng.choice([1, 5, 16, 33, 64, 130, 200, 256]))
    size = int(rng.integers(1, 21))
    seq = int(rng.integers(1, 11))
    dtype = np.float64 if rng.random() < 0.2 else np.float32
    states = [n for n in (("h0", "c0") if op == "LSTM" else ("h0",)) if rng.random() < 0.6]
    ragged = None
    if rng.random() < 0.4:  # ragged: one whole row, maybe an empty one
        ragged = rng.integers(0, seq + 1, batch)
        ragged[0] = seq
    attrs = {}
    layout = int(rng.random() < 0.25)
    if op == "GRU" and rng.random() < 0.5:
        attrs["linear_before_reset"] = 1
    model, feeds = _layer(op, direction, seq, batch, size, hidden, dtype=dtype, states=states, ragged=ragged,
                          peepholes=op == "LSTM" and rng.random() < 0.3, bias=rng.random() < 0.8,
                          fed_weights=rng.random() < 0.2, layout=layout, rng=rng,
                          x_scale=float(rng.choice([0.5, 1, 3])), **attrs)
    return model, feeds, threads, dtype, ragged, layout


@pytest.mark.parametrize("seed", range(90))
def test_compiled_loop_agrees_with_the_numpy_loop_and_onnxruntime(seed):
    # random configurations: RNN, GRU (linear_before_reset or not) and LSTM (with
    # peepholes or not), forward, reverse and bidirectional, 1 to 3 threads (hidden
    # sizes from 128 on split among them), batches of 1 to 11, ragged lengths (an
    # empty row likely), initial states or none, layout 0 or 1, weights constant or
    # fed, float32 or float64
    model, feeds, threads, dtype, ragged, layout = _random_layer(seed)
    compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds, threads)
    assert calls == 1
    _assert_close(compiled, numpy_loop, _ATOL if dtype == np.float32 else _ATOL_F64, "numpy loop")
    if ragged is not None:
        # the outputs past a row's length are zero in both
        np.testing.assert_array_equal(compiled[0] == 0, numpy_loop[0] == 0)
    if threads != 1:
        for a, b in zip(compiled, _run(model, feeds, 1, native.K)):
            np.testing.assert_array_equal(a, b)
    if dtype == np.float32 and layout == 0:  # onnxruntime's are float32 only, and layout 0
        expected = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        _assert_close(compiled, expected, _ATOL_ORT, "onnxruntime")


def _compiled_tanh_is_numpys() -> bool:
    """Whether the compiled float32 tanh gives numpy's values bit for bit: the same
    port as the DynamicQuantizeLSTM loop's, whose function ``qlstm_activation``
    exposes, checked over every range of exponents."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.linspace(-12, 12, 1 << 18, dtype=np.float32)])
    x = x[np.isfinite(x)]
    y = np.empty_like(x)
    numpy_algorithm = native.K.qlstm_activation(x, y, "tanh")
    return bool(numpy_algorithm and np.array_equal(y.view(np.uint32), np.tanh(x).view(np.uint32)))


@pytest.mark.parametrize("op,attrs,peepholes", [
    ("RNN", {}, False),
    ("GRU", {}, False),
    ("GRU", {"linear_before_reset": 1}, False),
    ("LSTM", {}, False),
    ("LSTM", {}, True),
])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_compiled_loop_is_the_numpy_loop_where_the_product_is_zero(op, attrs, peepholes, direction):
    # R = 0: the recurrent product is exactly zero both ways, and every other
    # operation is the numpy loop's in its order (gates, 0.5 * tanh + 0.5, cell,
    # update, ragged masks), so the values are numpy's bit for bit where the compiled
    # tanh is numpy's (else a few ulps apart). Gate inputs over [-20, 20] and tiny
    # ones reach every interval of tanh; the initial states still feed the cell, the
    # GRU update and the peepholes
    rng = np.random.default_rng(21)
    seq, batch, hidden = 7, 5, 40
    model, feeds = _layer(op, direction, seq, batch, 6, hidden, states=("h0", "c0") if op == "LSTM" else ("h0",),
                          ragged=[7, 3, 0, 7, 1], peepholes=peepholes, rng=rng, r_scale=0.0, x_scale=6.0, **attrs)
    feeds["x"][0, 1] *= 1e-6
    compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds, threads=2)
    assert calls == 1
    if _compiled_tanh_is_numpys():
        for a, b in zip(compiled, numpy_loop):
            np.testing.assert_array_equal(a, b)
    else:
        _assert_close(compiled, numpy_loop, 1e-6, "numpy loop")


@pytest.mark.parametrize("op,attrs", [("GRU", {"linear_before_reset": 1}), ("GRU", {}), ("LSTM", {}), ("RNN", {})])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_loop_with_the_benchmarks_sizes(op, attrs, threads):
    # the benchmark's layers: hidden 256, 64 steps, batch 1 (the units split between
    # two threads); and a batch of 8 ragged rows in both directions
    rng = np.random.default_rng(256)
    model, feeds = _layer(op, "forward", 64, 1, 128, 256, rng=rng, **attrs)
    compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds, threads)
    assert calls == 1 and np.abs(compiled[0]).max() > 0.1
    _assert_close(compiled, numpy_loop, _ATOL, "numpy loop")
    _assert_close(compiled, rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds),
                  _ATOL_ORT, "onnxruntime")
    model, feeds = _layer(op, "bidirectional", 32, 8, 64, 256, rng=rng, ragged=[32, 5, 0, 31, 32, 1, 17, 9],
                          states=("h0",), **attrs)
    compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds, threads)
    assert calls == 1
    _assert_close(compiled, numpy_loop, _ATOL, "numpy loop")


def test_compiled_loop_splits_both_directions_units_on_four_threads():
    # four threads, two directions: each direction's units in two parts, a job of
    # the pool a step; the same values as on one thread
    for op, attrs in (("LSTM", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1})):
        model, feeds = _layer(op, "bidirectional", 12, 3, 16, 160, states=("h0",), ragged=[12, 0, 7],
                              peepholes=op == "LSTM", rng=np.random.default_rng(160), **attrs)
        compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds, threads=4)
        assert calls == 1
        _assert_close(compiled, numpy_loop, _ATOL, "numpy loop")
        for a, b in zip(compiled, _run(model, feeds, 1, native.K)):
            np.testing.assert_array_equal(a, b)


def test_compiled_loop_with_no_steps():
    # a sequence of no steps: no outputs, the final states the initial ones
    for op in ("RNN", "GRU", "LSTM"):
        model, feeds = _layer(op, "bidirectional", 0, 3, 4, 8, states=("h0", "c0") if op == "LSTM" else ("h0",))
        compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds)
        assert calls == 1 and compiled[0].shape == (0, 2, 3, 8)
        for a, b in zip(compiled, numpy_loop):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(compiled[1], feeds["h0"])


@pytest.mark.parametrize("op,attrs", [
    ("RNN", {"clip": 0.5}),
    ("RNN", {"activations": ["Relu"]}),
    ("RNN", {"activations": ["Sigmoid"]}),
    ("GRU", {"clip": 0.8}),
    ("GRU", {"activations": ["HardSigmoid", "Tanh"]}),
    ("GRU", {"activations": ["Sigmoid", "Tanh", "Sigmoid", "Relu"]}),  # the reverse direction's differ
    ("LSTM", {"input_forget": 1}),
    ("LSTM", {"clip": 1.0}),
    ("LSTM", {"activations": ["Sigmoid", "Tanh", "Relu"]}),
])
def test_other_recurrent_layers_stay_on_the_numpy_loop(op, attrs):
    model, feeds = _layer(op, "bidirectional", 6, 3, 5, 12, states=("h0",), ragged=[6, 2, 0],
                          rng=np.random.default_rng(4), **attrs)
    compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds, threads=2)
    assert calls == 0
    for a, b in zip(compiled, numpy_loop):
        np.testing.assert_array_equal(a, b)


def test_default_activations_spelled_out_take_the_compiled_loop():
    model, feeds = _layer("LSTM", "bidirectional", 5, 2, 3, 8, activations=["Sigmoid", "Tanh", "Tanh"] * 2)
    compiled, numpy_loop, calls = _compiled_and_numpy(model, feeds)
    assert calls == 1
    _assert_close(compiled, numpy_loop, _ATOL, "numpy loop")


def test_compiled_loop_bad_arguments_are_typed_errors():
    seq, batch, dirs, hid = 3, 2, 1, 4
    f = np.float32
    kinds = {"RNN": 0, "GRU": 1, "LSTM": 2}

    def args(kind="LSTM", **over):
        g = _GATES[kind]
        a = {
            "kind": kinds[kind], "lbr": False, "xw": np.zeros((seq, batch, dirs * g * hid), f),
            "r": (np.zeros((hid, g * hid), f),), "rbh": None, "peep": None, "h": np.zeros((dirs, batch, hid), f),
            "c": np.zeros((dirs, batch, hid), f) if kind == "LSTM" else None, "lens": None, "reversed": 0,
            "y": np.zeros((seq, dirs, batch, hid), f), "sizes": (seq, batch, dirs, hid), "threads": 1,
        }
        a |= over
        return list(a.values())

    for kind in kinds:
        native.K.rnn_steps(*args(kind))
    native.K.rnn_steps(*args("GRU", lbr=True, rbh=np.zeros((dirs, hid), f)))
    native.K.rnn_steps(*args(peep=np.zeros((dirs, 3 * hid), f), lens=np.array([3, 0])))

    def bad(error, match, kind="LSTM", **over):
        with pytest.raises(error, match=match):
            native.K.rnn_steps(*args(kind, **over))

    with pytest.raises(ValueError, match="unknown kind"):
        a = args()
        a[0] = 3
        native.K.rnn_steps(*a)
    bad(ValueError, "invalid sizes", sizes=(seq, batch, 3, hid))
    bad(ValueError, "invalid sizes", sizes=(seq, 0, dirs, hid))
    bad(ValueError, "reversed", reversed=2)
    bad(ValueError, "lbr", lbr=True)
    bad(ValueError, "rbh", kind="GRU", lbr=True)
    bad(ValueError, "rbh", kind="GRU", rbh=np.zeros((dirs, hid), f))
    bad(ValueError, "peep is LSTM's", kind="GRU", peep=np.zeros((dirs, 3 * hid), f))
    bad(ValueError, "c is given for LSTM", c=None)
    bad(ValueError, "c is given for LSTM", kind="RNN", c=np.zeros((dirs, batch, hid), f))
    bad(TypeError, "r must be a sequence", r=3)
    bad(ValueError, "r holds 2 arrays", r=(np.zeros((hid, 4 * hid), f),) * 2)
    bad(TypeError, "xw must be float32 or float64", xw=np.zeros((seq, batch, 4 * hid), np.int32))
    bad(ValueError, "xw holds", xw=np.zeros((seq, batch, 4 * hid - 1), f))
    bad(TypeError, "rnn_steps: r has element format", r=(np.zeros((hid, 4 * hid), np.float64),))
    bad(ValueError, "rnn_steps: r holds", r=(np.zeros((hid, 4 * hid - 1), f),))
    bad(TypeError, "rnn_steps: h must be a writable C-contiguous", h=np.zeros((dirs, hid, batch), f).transpose(0, 2, 1))
    bad(TypeError, "rnn_steps: h has element format", h=np.zeros((dirs, batch, hid), np.float64))
    y = np.zeros((seq, dirs, batch, hid), f)
    y.flags.writeable = False
    bad(TypeError, "y must be a writable", y=y)
    bad(ValueError, "y holds", y=np.zeros((seq, dirs, batch, hid - 1), f))
    bad(TypeError, "lens", lens=np.array([3, 1], np.int32))
    bad(ValueError, r"lens\[1\] = 4 lies outside", lens=np.array([3, 4]))
    bad(ValueError, "peep holds", peep=np.zeros((dirs, 2 * hid), f))


# -- weights that are not constants of the node ----------------------------------------


@pytest.fixture
def pack_calls(monkeypatch):
    """The op types of the recurrent kernels' weight packings, in order."""
    from onnxrt_cpu.kernels import rnn

    calls = []
    pack = rnn._Recurrent._pack

    def counting(self, *args):
        calls.append(self.node.op_type)
        return pack(self, *args)

    monkeypatch.setattr(rnn._Recurrent, "_pack", counting)
    return calls


def _session(model, threads, kernels):
    """A session made (and run, by the caller) with ``native.K`` as ``kernels``."""
    so = onnxrt.SessionOptions()
    so.intra_op_num_threads = threads
    return onnxrt.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _fresh(model, feeds, threads, kernels):
    """The outputs of a new session (one packing of these weights)."""
    saved = native.K
    native.K = kernels
    try:
        return _session(model, threads, kernels).run(None, feeds)
    finally:
        native.K = saved


@pytest.mark.parametrize("op,attrs", [("LSTM", {}), ("GRU", {"linear_before_reset": 1}), ("GRU", {}), ("RNN", {})])
@pytest.mark.parametrize("compiled", [True, False])
def test_fed_weights_are_packed_again_only_when_their_bits_change(op, attrs, compiled, pack_calls):
    # W, R and B fed: packed on the first run, then reused while the next runs' are
    # the same bits (fresh copies included), packed again when any bit changes (the
    # caller's arrays changed in place, a 0.0 that becomes -0.0); a NaN is its own
    # value. Every run gives what a new session gives for its weights, bit for bit,
    # on the compiled loop and on the numpy loop
    kernels = native.K if compiled else None
    model, feeds = _layer(op, "bidirectional", 1, 2, 6, 16, states=("h0",), fed_weights=True,
                          rng=np.random.default_rng(31), **attrs)
    saved = native.K
    native.K = kernels
    try:
        sess = _session(model, 2, kernels)
        del pack_calls[:]

        def run(expect_pack: bool):
            before = len(pack_calls)
            got = sess.run(None, feeds)
            assert len(pack_calls) - before == int(expect_pack)
            return got

        first = run(True)
        feeds = {k: v.copy() for k, v in feeds.items()}
        for a, b in zip(run(False), first):
            np.testing.assert_array_equal(a, b)
        feeds["r"][0, 3, 2] += 0.25  # in place: the same array, other values
        changed = run(True)
        assert not np.array_equal(changed[0], first[0])
        checked = [(changed, {k: v.copy() for k, v in feeds.items()})]
        feeds["b"][1, 5] = 0.0
        run(True)
        run(False)
        feeds["b"][1, 5] = -0.0
        checked.append((run(True), {k: v.copy() for k, v in feeds.items()}))
        feeds["w"][0, 0, 0] = np.nan
        nan = run(True)
        assert np.isnan(nan[0]).any()
        for a, b in zip(run(False), nan):
            np.testing.assert_array_equal(a, b)
        checked.append((nan, {k: v.copy() for k, v in feeds.items()}))
    finally:
        native.K = saved
    for got, fed in checked:
        for a, b in zip(got, _fresh(model, fed, 2, kernels)):
            np.testing.assert_array_equal(a, b)
    fed = checked[0][1]
    expected = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, fed)
    _assert_close(checked[0][0], expected, _ATOL_ORT, "onnxruntime")


def _lstm_in_an_if(hidden=16, size=8, seq=1, batch=1, rng=None):
    """Silero VAD's pattern: an LSTM inside an If branch whose W, R and B the branch
    slices and concatenates from constants of the enclosing graph, so the node has no
    constant weights. (model bytes, feeds)."""
    rng = rng or np.random.default_rng(5)
    s = 1 / np.sqrt(hidden)
    w = rng.uniform(-s, s, (4 * hidden, size)).astype(np.float32)
    r = rng.uniform(-s, s, (4 * hidden, hidden)).astype(np.float32)
    b = rng.uniform(-s, s, (8 * hidden,)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w_src"), numpy_helper.from_array(r, "r_src"),
             numpy_helper.from_array(b, "b_src"), numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([2 * hidden], np.int64), "half"),
             numpy_helper.from_array(np.array([4 * hidden], np.int64), "all")]

    def branch(name, order):
        # the gate blocks sliced and put back (in another order in the else branch)
        nodes = [helper.make_node("Slice", ["w_src", "zero", "half"], [f"{name}_w0"]),
                 helper.make_node("Slice", ["w_src", "half", "all"], [f"{name}_w1"]),
                 helper.make_node("Concat", [f"{name}_w{order[0]}", f"{name}_w{order[1]}"], [f"{name}_wc"], axis=0),
                 helper.make_node("Unsqueeze", [f"{name}_wc", "zero"], [f"{name}_w"]),
                 helper.make_node("Unsqueeze", ["r_src", "zero"], [f"{name}_r"]),
                 helper.make_node("Unsqueeze", ["b_src", "zero"], [f"{name}_b"]),
                 helper.make_node("LSTM", ["x", f"{name}_w", f"{name}_r", f"{name}_b", "", "h0", "c0"],
                                  [f"{name}_y", f"{name}_yh", f"{name}_yc"], hidden_size=hidden)]
        outs = [helper.make_tensor_value_info(f"{name}_{o}", TensorProto.FLOAT, None) for o in ("y", "yh", "yc")]
        return helper.make_graph(nodes, name, [], outs)

    node = helper.make_node("If", ["cond"], ["y", "yh", "yc"], then_branch=branch("then", (0, 1)),
                            else_branch=branch("else", (1, 0)))
    state = [1, batch, hidden]
    inputs = [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, size]),
              helper.make_tensor_value_info("h0", TensorProto.FLOAT, state),
              helper.make_tensor_value_info("c0", TensorProto.FLOAT, state)]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh", "yc")]
    model = make_model([node], inputs, outs, inits, opset=14)
    feeds = {"cond": np.array(True), "x": rng.standard_normal((seq, batch, size)).astype(np.float32),
             "h0": (0.5 * rng.standard_normal(state)).astype(np.float32),
             "c0": (0.5 * rng.standard_normal(state)).astype(np.float32)}
    return model.SerializeToString(), feeds


@pytest.mark.parametrize("compiled", [True, False])
def test_weights_computed_inside_an_if_branch_are_packed_once(compiled, pack_calls):
    # one packing per branch over many runs (the weights are computed anew each run,
    # the same values), and each run's outputs those of a new session, bit for bit,
    # and onnxruntime's within its tolerance; the two branches' weights differ
    kernels = native.K if compiled else None
    model, feeds = _lstm_in_an_if()
    saved = native.K
    native.K = kernels
    try:
        sess = _session(model, 2, kernels)
        del pack_calls[:]
        runs = [sess.run(None, feeds) for _ in range(4)]
        assert len(pack_calls) <= 1  # none where the optimizer folds the weights
        other = {**feeds, "cond": np.array(False)}
        runs_else = [sess.run(None, other) for _ in range(3)]
        assert len(pack_calls) <= 2
    finally:
        native.K = saved
    want, want_else = _fresh(model, feeds, 2, kernels), _fresh(model, other, 2, kernels)
    for got in runs:
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    for got in runs_else:
        for a, b in zip(got, want_else):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(want[0], want_else[0])
    for got, f in ((want, feeds), (want_else, other)):
        _assert_close(got, rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, f),
                      _ATOL_ORT, "onnxruntime")
