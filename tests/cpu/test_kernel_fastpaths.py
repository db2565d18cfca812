"""The CPU provider's fast paths give onnxruntime's answers, and threads behave.

- row passes, byte tables, branch-free selection and pooling without a padded copy
  against numpy and onnxruntime (the convolutions' lowerings are specified in
  ``test_conv.py``);
- ``onnxrt_cpu.parallel``: ``parallel_for`` runs each chunk once and re-raises
  errors; the split matrix products equal ``np.matmul``;
- ``onnxrt.run.threads``: a run sees its session's ``intra_op_num_threads`` and a
  single-threaded BLAS, restored when the last concurrent run ends, and two sessions
  with different settings run side by side from two threads without disturbing
  each other.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt.plugin import discovery as plugins
from onnxrt.run.threads import ThreadSettings, blas_threads, current_thread_count
from onnxrt_cpu import parallel
from tests.cpu.conv_cases import make_model, small_conv_model

# these tests check the numpy paths' internals; the compiled kernels have their own
# (tests/cpu/test_native_kernels.py)
pytestmark = pytest.mark.usefixtures("numpy_kernels")

rt = pytest.importorskip("onnxruntime")


def test_integer_products_are_exact_on_either_side_of_the_column_sum_bound(monkeypatch):
    """A constant 8-bit B whose columns' absolute sums times max |A| stay below 2**24
    is multiplied in one float32 product, although K * max |A| * max |B| is far above
    it; a B with one dense column of 127s (K = 2000, A = 255: sums of 64.8M) is cut
    into exact chunks. Both equal the int64 product exactly."""
    from onnxrt_cpu.kernels import quantize

    calls = []
    product = quantize.matmul_nd
    monkeypatch.setattr(quantize, "matmul_nd", lambda a, b: calls.append(a.shape[-1]) or product(a, b))
    rng = np.random.default_rng(6)
    k = 2000
    sparse = np.zeros((k, 8), np.int8)
    sparse[rng.integers(0, k, 300), rng.integers(0, 8, 300)] = 127  # column sums <= 300 * 127
    dense = np.zeros((k, 8), np.int8)
    dense[:, 3] = 127
    for b, single in ((sparse, True), (dense, False)):
        graph = helper.make_graph(
            [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "mmi",
            [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, k])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [numpy_helper.from_array(b, "b")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=10)
        a = np.full((4, k), 255, np.uint8)
        a[1] = rng.integers(0, 256, k)
        calls.clear()
        got, = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
        np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
        assert (calls == [k]) is single, calls


@pytest.mark.parametrize("shape", [(8192, 16), (96, 24), (7, 16), (1, 64), (5, 3, 32), (1024, 256), (48, 768),
                                   (3 * 1024, 64), (4, 128, 3072)])
def test_columns_op_equals_broadcasting(shape):
    """rows.columns_op widens the inner loop by taking rows together with the
    vector repeated; any row count (odd ones included) gives numpy's broadcast, in
    place or into ``out``, with the vector as either operand."""
    from onnxrt_cpu.rows import columns_op

    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    vec = rng.standard_normal(shape[-1]).astype(np.float32) + 3
    for ufunc in (np.add, np.multiply, np.subtract, np.divide):
        y = x.copy()
        columns_op(ufunc, y, vec)
        np.testing.assert_array_equal(y, ufunc(x, vec))
        out = np.empty_like(x)
        assert columns_op(ufunc, x, vec, out=out, vec_first=True) is out
        np.testing.assert_array_equal(out, ufunc(vec, x))
    if x.ndim == 2:
        t = np.asfortranarray(x.copy())  # not C-contiguous (but for one row): numpy's own broadcast
        columns_op(np.add, t, vec)
        np.testing.assert_array_equal(t, x + vec)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [((64, 256), (256,)), ((256,), (2, 32, 256)), ((4, 96, 768), (1, 1, 768)),
                                    ((33, 512), (512,))])
def test_binary_ops_with_a_row_vector_equal_numpy(op_type, shapes):
    """Add/Sub/Mul/Div of an array and a row (a bias) take the widened loop; the
    result is numpy's broadcast bit for bit, with the row on either side."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = (rng.standard_normal(shapes[1]) + 3).astype(np.float32)
    g = helper.make_graph([helper.make_node(op_type, ["a", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape)),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": b})[0]
    want = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op_type](a, b)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_softmax_goes_straight_to_the_shift_once_a_call_needed_it(monkeypatch):
    """A Softmax whose logits overflow exp needs the shift by the row maximum; from
    then on the kernel skips the unshifted attempt, and both kinds of logits still
    give onnxruntime's probabilities."""
    from onnxrt_cpu import rows

    attempts = []
    unshifted = rows.unshifted_softmax
    monkeypatch.setattr(rows, "unshifted_softmax", lambda x: attempts.append(x.shape) or unshifted(x))
    model = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    ).SerializeToString()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(8)
    small = rng.standard_normal((16, 32)).astype(np.float32)
    large = small * np.float32(1e4)
    for x, tries in ((small, 1), (large, 2), (small, 2), (large, 2)):
        got, = sess.run(None, {"x": x})
        want, = ref.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        assert len(attempts) == tries


@pytest.mark.parametrize("table_type", [np.uint8, np.int8, np.bool_])
@pytest.mark.parametrize("index_type", [np.uint8, np.int8])
def test_gather_from_a_byte_table_equals_take(table_type, index_type):
    """Gather from a 256-entry table of one-byte values with one-byte indices (the
    8-bit lookups the QDQ fusions build) goes through bytes.translate: negative int8
    indices wrap as take wraps them, the output is a fresh writeable array, and a
    transposed (non-contiguous) index array reads in its logical order."""
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, 256).astype(np.uint8)
    table = (raw & 1).astype(np.bool_) if table_type is np.bool_ else raw.view(table_type)
    info = np.iinfo(index_type)
    idx = rng.integers(info.min, info.max + 1, (6, 5, 7)).astype(index_type).transpose(2, 0, 1)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["t", "i"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("i", helper.np_dtype_to_tensor_dtype(idx.dtype), list(idx.shape))],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(table.dtype), None)],
        [numpy_helper.from_array(table, "t")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    got, = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"i": idx})
    want = np.take(table, idx.astype(np.int64))
    assert got.dtype == table.dtype and got.shape == idx.shape and got.flags.writeable
    np.testing.assert_array_equal(got, want)


# -- parallel ------------------------------------------------------------------------


def test_parallel_for_runs_every_chunk_once():
    seen = []
    lock = threading.Lock()

    def fn(i):
        with lock:
            seen.append(i)

    parallel.parallel_for(50, fn, threads=4)
    assert sorted(seen) == list(range(50))


def test_parallel_for_reraises_the_error_of_a_chunk():
    def fn(i):
        if i == 7:
            raise ValueError("chunk 7 failed")

    with pytest.raises(ValueError, match="chunk 7 failed"):
        parallel.parallel_for(16, fn, threads=2)
    # the pool still works afterwards
    out = np.zeros(8)

    def ok(i):
        out[i] = i

    parallel.parallel_for(8, ok, threads=2)
    assert out.tolist() == list(range(8))


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((300, 256), (256, 200)), ((64, 512), (512, 1024)), ((2, 128, 768), (768, 768)),
     ((1, 12, 128, 64), (1, 12, 64, 128)), ((3, 1, 64, 96), (1, 4, 96, 80)), ((7, 5), (5, 3))],
)
def test_split_matmul_equals_numpy(a_shape, b_shape):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    with ThreadSettings(2):
        got = parallel.matmul_nd(a, b)
        if a.ndim == 2 and b.ndim == 2:
            got2 = parallel.matmul(a, b)
            np.testing.assert_allclose(got2, np.matmul(a, b), rtol=1e-5, atol=1e-4)
    want = np.matmul(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_split_matmul_keeps_numpy_errors_and_integer_semantics():
    with ThreadSettings(2):
        with pytest.raises(ValueError):
            parallel.matmul_nd(np.ones((4, 3), np.float32), np.ones((4, 3), np.float32))
        a = np.arange(12, dtype=np.int64).reshape(3, 4)
        assert parallel.matmul_nd(a, a.T).tolist() == np.matmul(a, a.T).tolist()


# -- threads ---------------------------------------------------------------------------


def test_thread_settings_scope_the_kernel_thread_count():
    assert current_thread_count() == 1
    with ThreadSettings(3):
        assert current_thread_count() == 3
        with ThreadSettings(1):  # a nested run
            assert current_thread_count() == 1
        assert current_thread_count() == 3
    assert current_thread_count() == 1


def test_blas_is_single_threaded_during_runs_and_restored_after():
    before = blas_threads()
    if not before:
        pytest.skip("threadpoolctl finds no BLAS library")
    with ThreadSettings(2):
        assert set(blas_threads()) == {1}
        with ThreadSettings(4):
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {1}
    assert blas_threads() == before


class _Probe:
    """A custom op that reports the thread settings its kernel runs under."""

    @ort.hookimpl
    def onnxrt_register_kernels(self, provider_name, registry):
        if provider_name == "CPUExecutionProvider":

            @registry.op("ThreadProbe", since=1, domain="test.threads")
            def probe(k, x):
                blas = blas_threads() or [1]
                return np.array([current_thread_count(), max(blas)], dtype=np.int64) + x


def _probe_model():
    model = make_model(
        [helper.make_node("ThreadProbe", ["x"], ["y"], domain="test.threads")],
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])],
    )
    model.opset_import.append(helper.make_opsetid("test.threads", 1))
    return model


@pytest.fixture
def probe_plugin():
    plugin = _Probe()
    plugins.register_plugin(plugin, name="thread_probe")
    try:
        yield
    finally:
        plugins.unregister_plugin(plugin)


def test_sessions_with_different_thread_counts_run_side_by_side(probe_plugin):
    """Two sessions (1 and 2 threads) run from two threads at once: each run sees its
    own count, BLAS stays at one thread inside every run, and is restored after."""
    before = blas_threads()
    sessions = {}
    for n in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = n
        sessions[n] = ort.InferenceSession(_probe_model(), so, providers=["CPUExecutionProvider"])
    conv = small_conv_model((1, 16, 32, 32), (32, 16, 3, 3), pads=[1, 1, 1, 1]).SerializeToString()
    conv_sessions = {}
    for n in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = n
        conv_sessions[n] = ort.InferenceSession(conv, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 16, 32, 32)).astype(np.float32)
    want = rt.InferenceSession(conv, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    errors, seen = [], {1: set(), 2: set()}
    barrier = threading.Barrier(2)

    def worker(n):
        try:
            barrier.wait()
            for _ in range(30):
                y = sessions[n].run(None, {"x": np.zeros(2, np.int64)})[0]
                seen[n].add(tuple(y.tolist()))
                np.testing.assert_allclose(conv_sessions[n].run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen == {1: {(1, 1)}, 2: {(2, 1)}}
    assert blas_threads() == before


def test_default_thread_count_is_the_usable_cores(probe_plugin):
    import os

    sess = ort.InferenceSession(_probe_model(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.zeros(2, np.int64)})[0]
    assert y[0] == len(os.sched_getaffinity(0))


# -- branch-free selection (onnxrt_cpu.select) -----------------------------------

SELECT_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint16, np.bool_, np.complex64]
SELECT_SHAPES = [
    ((4, 5000), (4, 5000), (4, 5000)),
    ((5000,), (4, 5000), (4, 1)),
    ((1,), (3000,), (3000,)),
    ((), (4, 600), (4, 600)),
    ((3, 1, 700), (1, 5, 700), (3, 5, 1)),
    ((7,), (7,), (7,)),  # below the blend's size: numpy's own where
]


@pytest.mark.parametrize("dtype", SELECT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shapes", SELECT_SHAPES, ids=str)
def test_blend_where_is_bitwise_numpy_where(dtype, shapes):
    from onnxrt_cpu.select import where

    rng = np.random.default_rng(0)
    sa, sb, sc = shapes
    with np.errstate(invalid="ignore"):
        a = (rng.standard_normal(sa) * 50).astype(dtype)
        b = (rng.standard_normal(sb) * 50).astype(dtype)
    if np.dtype(dtype).kind == "f" and a.ndim == 2:
        a[0, :5] = np.nan
        b[1, :3] = -np.inf
        a[1, 5:9] = -0.0
    cond = rng.random(sc) > 0.5
    got, want = where(cond, a, b), np.where(cond, a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_relu_and_clamp_match_numpy_including_nan():
    from onnxrt_cpu.select import clamp, relu

    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    x[:3] = [np.nan, np.inf, -np.inf]
    np.testing.assert_array_equal(relu(x), np.maximum(x, np.float32(0)))
    np.testing.assert_array_equal(clamp(x, 0, 6), np.minimum(np.maximum(x, np.float32(0)), np.float32(6)))
    np.testing.assert_array_equal(clamp(x, None, 1), np.minimum(x, np.float32(1)))
    xi = (x[3:] * 100).astype(np.int32)
    np.testing.assert_array_equal(clamp(xi, None, 5), np.minimum(xi, 5))
    np.testing.assert_array_equal(relu(xi), np.maximum(xi, 0))
    # min > max: every value becomes max, as the ONNX spec says
    np.testing.assert_array_equal(clamp(x[3:], 2, 1), np.full(x.size - 3, 1, np.float32))
    out = x.copy()
    assert relu(out, out=out) is out


# -- pooling without a padded copy ---------------------------------------------------------

def _pool_cases():
    rng = np.random.default_rng(7)
    cases = []
    for i in range(40):
        nd = 1 + i % 3
        k = [int(v) for v in rng.integers(1, 5, nd)]
        s = [int(v) for v in rng.integers(1, 4, nd)]
        d = [int(v) for v in rng.integers(1, 3, nd)] if i % 4 == 0 else [1] * nd
        pads = [int(rng.integers(0, k[j] // 2 + 1)) for j in range(nd)] + [
            int(rng.integers(0, k[j] // 2 + 1)) for j in range(nd)]
        sp = [int(v) for v in rng.integers(max(k) * max(d), max(k) * max(d) + 9, nd)]
        cases.append((f"case{i}", [2, 3] + sp, dict(kernel_shape=k, strides=s, pads=pads, ceil_mode=i % 2,
                                                     **({"dilations": d} if d != [1] * nd else {}))))
    return cases


POOLS = _pool_cases() + [
    # the stride-2 3x3 windows of the benchmark's CNNs (fewer channels), which split
    # both their rows and their columns into even and odd halves
    ("resnet-stem", [1, 8, 112, 112], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("inception-end-pads", [1, 16, 56, 56], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ("inception-small", [1, 24, 14, 14], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ("no-pads", [2, 4, 28, 28], dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("ceil", [1, 6, 28, 28], dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
]


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool", "AveragePool-include-pad"])
@pytest.mark.parametrize("name,shape,attrs", POOLS, ids=[c[0] for c in POOLS])
def test_pooling_borders_match_onnxruntime(op_type, name, shape, attrs):
    """Pooling applies each window tap only where it lies inside the input, instead of
    padding a copy; random kernels, strides, dilations, pads and ceil modes."""
    attrs = dict(attrs)
    if op_type == "AveragePool-include-pad":
        op_type, attrs["count_include_pad"] = "AveragePool", 1
    if op_type == "AveragePool" and "dilations" in attrs:
        attrs.pop("dilations")  # onnxruntime's AveragePool has no dilations before opset 19
    model = make_model(
        [helper.make_node(op_type, ["x"], ["y"], **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    ).SerializeToString()
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want, = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got, = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _windows_reference(x, kernel, strides, dil, pb, out_sp, ufunc, fill):
    """The pooling reduction the plain way: a padded copy and every window's taps."""
    nd = len(kernel)
    sp = x.shape[-nd:]
    pe = [max(0, (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - pb[i] - sp[i]) for i in range(nd)]
    xp = np.full(x.shape[:-nd] + tuple(sp[i] + pb[i] + pe[i] for i in range(nd)), fill, dtype=x.dtype)
    xp[(Ellipsis,) + tuple(slice(pb[i], pb[i] + sp[i]) for i in range(nd))] = x
    y = None
    for tap in np.ndindex(*kernel):
        sl = tuple(slice(tap[i] * dil[i], tap[i] * dil[i] + (out_sp[i] - 1) * strides[i] + 1, strides[i])
                   for i in range(nd))
        v = xp[(Ellipsis,) + sl]
        y = v.copy() if y is None else ufunc(y, v)
    return y


def _count_results(monkeypatch, module, name: str) -> dict:
    """Wrap ``module.name`` for the test: ``counts["results"]`` counts its calls that
    returned a result (not None), to show that a fast path did run."""
    real = getattr(module, name)
    counts = {"results": 0}

    def counting(*args):
        r = real(*args)
        counts["results"] += r is not None
        return r

    monkeypatch.setattr(module, name, counting)
    return counts


def test_pooling_flat_passes_match_every_window(monkeypatch):
    """Box pooling runs each tap of an axis as one pass over the flattened array
    where it can (stride 1, or a stride dividing the last axis), recomputing the
    outputs whose windows reach into the padding; random shapes, windows, strides,
    dilations and pads (including windows wholly in the padding), float and uint8,
    contiguous and channels-last inputs, give what reducing every window gives,
    bit for bit; and the flat passes did run."""
    from onnxrt_cpu.kernels import pool

    rng = np.random.default_rng(11)
    calls = _count_results(monkeypatch, pool, "_reduce_axis_flat")
    for i in range(300):
        nd = 1 + i % 3
        k = [int(v) for v in rng.integers(1, 5, nd)]
        s = [int(v) for v in rng.integers(1, 3, nd)]
        d = [int(v) for v in rng.integers(1, 3, nd)] if i % 5 == 0 else [1] * nd
        pb = [int(rng.integers(0, k[j] + 1)) for j in range(nd)]
        pe = [int(rng.integers(0, k[j] + 1)) for j in range(nd)]
        sp = [int(v) for v in rng.integers(1, 12, nd)]
        out_sp = [(sp[j] + pb[j] + pe[j] - (k[j] - 1) * d[j] - 1) // s[j] + 1 for j in range(nd)]
        if min(out_sp) < 1:
            continue
        shape = [1 + i % 2, 3] + sp
        if i % 3 == 2:
            x = rng.integers(0, 256, shape).astype(np.uint8)
            ufunc, fill = np.maximum, 0
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            ufunc, fill = (np.maximum, -np.inf) if i % 2 else (np.add, 0)
        if i % 7 == 3 and nd == 2:  # an NCHW view of channels-last memory
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        got = pool._reduce_taps(x, k, s, d, pb, out_sp, ufunc, fill)
        want = _windows_reference(x, k, s, d, pb, out_sp, ufunc, fill)
        assert got.shape == want.shape, (i, k, s, d, pb, pe, sp)
        if ufunc is np.add:
            # the flat passes sum in the per-tap order; the reference in window order
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str((i, k, s, d, pb, pe, sp)))
        else:
            np.testing.assert_array_equal(got, want, err_msg=str((i, k, s, d, pb, pe, sp)))
    assert calls["results"] > 50  # 108 of the axes reduced, with this seed


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, np.float32, np.int32])
@pytest.mark.parametrize("size", [0, 2, 4, 6, 1000])
def test_deinterleave_splits_even_and_odd_values(dtype, size):
    """The pair view's narrowing cast gives the even values, the shifted view the odd
    ones, bit for bit (NaN payloads and signed zeros included)."""
    from onnxrt_cpu.kernels.pool import deinterleave

    raw = np.random.default_rng(size).integers(0, 256, size * np.dtype(dtype).itemsize, dtype=np.uint8)
    flat = raw.view(dtype)
    even, odd = deinterleave(flat)
    assert even.dtype == odd.dtype == flat.dtype and even.flags.c_contiguous and odd.flags.c_contiguous
    np.testing.assert_array_equal(even.view(np.uint8), np.ascontiguousarray(flat[0::2]).view(np.uint8))
    np.testing.assert_array_equal(odd.view(np.uint8), np.ascontiguousarray(flat[1::2]).view(np.uint8))


def _stride2_geometry(rng, i, nd, first_taps, sizes, width_halves, axis=-1, odd=False):
    """A random pooling geometry whose spatial axis ``axis`` (the last, or the first:
    0) has stride 2, three to five taps and an even length (odd with ``odd``), the
    other axes ``first_taps`` taps and ``sizes`` lengths: ``(k, s, d, pb, pe, sp,
    out_sp)``, ``out_sp`` None where a window reaches past the padded input."""
    def placed(others, special):
        return [special] + others if axis == 0 else others + [special]

    k = placed([int(v) for v in rng.integers(*first_taps, nd - 1)], int(rng.integers(3, 6)))
    s = placed([int(v) for v in rng.integers(1, 3, nd - 1)], 2)
    d = [int(v) for v in rng.integers(1, 3, nd)] if i % 4 == 0 else [1] * nd
    pb = [int(rng.integers(0, k[j] + 1)) for j in range(nd)]
    pe = [int(rng.integers(0, k[j] + 1)) for j in range(nd)]
    sp = placed([int(v) for v in rng.integers(*sizes, nd - 1)], 2 * int(rng.integers(*width_halves)) + odd)
    out_sp = [(sp[j] + pb[j] + pe[j] - (k[j] - 1) * d[j] - 1) // s[j] + 1 for j in range(nd)]
    return k, s, d, pb, pe, sp, (out_sp if min(out_sp) >= 1 else None)


def _assert_pooled(got, want, ufunc, dtype, info):
    """Maxima bit for bit, sums to float rounding (the passes sum in tap order)."""
    assert got.shape == want.shape and got.dtype == want.dtype, info
    if ufunc is np.add:
        tol = 2e-3 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str(info))
    else:
        np.testing.assert_array_equal(got, want, err_msg=str(info))


def test_pooling_stride2_pairs_match_every_window(monkeypatch):
    """A stride-2 last axis with three taps or more reduces the even and odd columns'
    contiguous halves instead of strided views; random windows, dilations, pads (up
    to the whole window), even row lengths, several dtypes and a channels-last view,
    against every window reduced the plain way; and the pair path did run."""
    from onnxrt_cpu.kernels import pool

    rng = np.random.default_rng(5)
    calls = _count_results(monkeypatch, pool, "_reduce_pairs")
    for i in range(200):
        nd = 1 + i % 2
        k, s, d, pb, pe, sp, out_sp = _stride2_geometry(rng, i, nd, (3, 6), (2, 14), (1, 9))
        if out_sp is None:
            continue
        dtype = (np.float32, np.uint8, np.float16, np.float64)[i % 4]
        shape = [1 + i % 2, 3] + sp
        x = (rng.integers(0, 256, shape) if dtype == np.uint8 else rng.standard_normal(shape)).astype(dtype)
        ufunc = np.add if i % 3 == 0 and dtype != np.uint8 else np.maximum
        fill = 0 if ufunc is np.add or dtype == np.uint8 else -np.inf
        if i % 5 == 1 and nd == 2:
            x = _channels_last_view(x)
        got = pool._reduce_taps(x, k, s, d, pb, out_sp, ufunc, fill)
        want = _windows_reference(x, k, s, d, pb, out_sp, ufunc, fill)
        _assert_pooled(got, want, ufunc, dtype, (i, k, s, d, pb, pe, sp))
    assert calls["results"] > 50


def test_pooling_stride2_rows_split_into_even_and_odd_rows(monkeypatch):
    """A stride-2 axis before the last (the rows of a 3x3 stride-2 MaxPool) splits
    whole rows (or planes) into even and odd halves: random windows of three to five
    taps, dilations, pads up to the whole window, even and odd lengths, 2-D and 3-D
    maps, five dtypes, give what reducing every window gives (maxima bit for bit,
    sums to rounding); and the row split did run on an axis before the last."""
    from onnxrt_cpu.kernels import pool

    rng = np.random.default_rng(31)
    axes = []
    real = pool._reduce_pairs

    def spy(y, ax, *rest):
        r = real(y, ax, *rest)
        if r is not None and ax < y.ndim - 1:
            axes.append(ax)
        return r

    monkeypatch.setattr(pool, "_reduce_pairs", spy)
    cases = 0
    for i in range(160):
        nd = 2 + i % 2
        k, s, d, pb, pe, sp, out_sp = _stride2_geometry(rng, i, nd, (3, 6), (2, 11), (2, 9), axis=0, odd=i % 7 == 5)
        if out_sp is None:
            continue
        dtype = (np.float32, np.uint8, np.float16, np.float64, np.int32)[i % 5]
        shape = [1 + i % 2, 1 + i % 4] + sp
        if np.dtype(dtype).kind in "iu":
            x = rng.integers(0, 200, shape).astype(dtype)
        else:
            x = rng.standard_normal(shape).astype(dtype)
        # sums in float32 and float64 only: AveragePool sums float16 in float32, and up
        # to 125 taps summed in float16 in two orders differ by several steps
        ufunc = np.add if i % 3 == 0 and dtype in (np.float32, np.float64) else np.maximum
        fill = 0 if ufunc is np.add else (-np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min)
        got = pool._reduce_taps(x, k, s, d, pb, out_sp, ufunc, fill)
        want = _windows_reference(x, k, s, d, pb, out_sp, ufunc, fill)
        _assert_pooled(got, want, ufunc, dtype, (i, k, s, d, pb, pe, sp))
        cases += 1
    assert cases > 100 and len(axes) > 40 and set(axes) == {2, 3}  # 70 of 153 with this seed


def test_pooling_stride2_pixels_of_channels_last_maps(monkeypatch):
    """On an NCHW view of channels-last memory (what integer convolutions return), a
    stride-2 last axis splits whole pixels into even and odd halves: random windows,
    dilations, pads, 1 to 3 spatial axes, 2 to 16 channels and five dtypes give what
    reducing every window gives, bit for bit (sums to rounding); the result keeps the
    channels-last layout; and the pixel halves ran (all but the few cases where a 1-tap
    strided axis before the last leaves a strided view, which takes the per-tap views)."""
    from onnxrt_cpu.kernels import pool

    rng = np.random.default_rng(23)
    calls = _count_results(monkeypatch, pool, "_reduce_pairs")
    halves = []
    real_halves = pool._pixel_halves
    monkeypatch.setattr(pool, "_pixel_halves", lambda rows, inner: halves.append(inner) or real_halves(rows, inner))
    cases = 0
    for i in range(120):
        nd = 1 + i % 3
        k, s, d, pb, pe, sp, out_sp = _stride2_geometry(rng, i, nd, (1, 4), (2, 9), (2, 9))
        if out_sp is None or out_sp[-1] > sp[-1] // 2:
            continue
        dtype = (np.int8, np.uint8, np.float32, np.float16, np.float64)[i % 5]
        c = (2, 3, 16)[i % 3]
        shape = [1 + i % 2, c] + sp
        if np.dtype(dtype).kind in "iu":
            x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape).astype(dtype)
        else:
            x = rng.standard_normal(shape).astype(dtype)
        x = _channels_last_view(x)
        ufunc = np.add if i % 4 == 1 and np.dtype(dtype).kind == "f" else np.maximum
        fill = 0 if ufunc is np.add else (-np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min)
        got = pool._reduce_taps(x, k, s, d, pb, out_sp, ufunc, fill)
        want = _windows_reference(x, k, s, d, pb, out_sp, ufunc, fill)
        _assert_pooled(got, want, ufunc, dtype, (i, k, s, d, pb, pe, sp))
        assert got.strides[1] == got.itemsize  # still channels last: a pixel's values adjacent
        cases += 1
    assert cases > 40 and calls["results"] >= 0.9 * cases and set(halves) == {2, 3, 16}


def _channels_last_view(x):
    """``x`` (NCHW) as an NCHW view of channels-last memory."""
    return np.ascontiguousarray(np.moveaxis(x, 1, -1)).transpose(0, x.ndim - 1, *range(1, x.ndim - 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (1, 64, 13), (2, 3, 4, 5, 6), (1, 1, 1, 1)])
@pytest.mark.parametrize("layout", ["nchw", "channels-last", "strided"])
def test_global_average_pool_as_products_with_ones(dtype, shape, layout):
    """GlobalAveragePool sums each map as a product with ones (NCHW or channels-last
    memory) and falls back to ``np.mean`` for other layouts; all agree with it."""
    from onnxrt_cpu.kernels.pool import global_average_pool

    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    if layout == "channels-last":
        x = _channels_last_view(x)
    elif layout == "strided":
        x = np.repeat(x, 2, axis=-1)[..., ::2]
    got = global_average_pool(None, x)
    want = np.mean(x.astype(np.float64), axis=tuple(range(2, x.ndim)), keepdims=True)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3 if dtype == np.float16 else 1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("layout", ["nchw", "channels-last", "nhwc"])
@pytest.mark.parametrize("spatial", [(4, 4), (9, 11), (260, 260)])
def test_qlinear_global_average_pool_float32_sums_are_exact(dtype, layout, spatial):
    """QLinearGlobalAveragePool sums 8-bit maps in float32 where every partial sum is
    an integer below 2**24 (and in float64 beyond): the result is the float64 sum's,
    bit for bit, for NCHW, channels-last views and NHWC (``channels_last=1``)."""
    from onnxrt_cpu.kernels import contrib_quant as cq

    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    if spatial[0] > 255:  # near the top of the range: uint8 sums pass 2**24 there
        x = (info.max - rng.integers(0, 4, (2, 6, *spatial))).astype(dtype)
    else:
        x = rng.integers(info.min, info.max + 1, (2, 6, *spatial)).astype(dtype)
    channels_last = 0
    if layout == "channels-last":
        x = _channels_last_view(x)
    elif layout == "nhwc":
        x, channels_last = np.ascontiguousarray(np.moveaxis(x, 1, -1)), 1
    args = (x, np.float32(0.04), np.array(3, dtype), np.float32(0.01), np.array(-2 if dtype == np.int8 else 7, dtype))
    got = cq.qlinear_global_average_pool(None, *args, channels_last=channels_last)
    plane_sum = cq.plane_sum
    cq.plane_sum = lambda v: None  # the float64 sum
    try:
        want = cq.qlinear_global_average_pool(None, *args, channels_last=channels_last)
    finally:
        cq.plane_sum = plane_sum
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_batchnorm_with_overridable_parameters_folds_only_its_own_arrays():
    """BatchNormalization whose parameters are initializers listed as graph inputs
    (overridable, so not constants) keeps the fold of the session's own arrays across
    runs, and never that of a fed array, which the caller may change in place."""
    rng = np.random.default_rng(4)
    c = 6
    params = {
        "scale": rng.uniform(0.5, 2, c), "bias": rng.standard_normal(c),
        "mean": rng.standard_normal(c), "var": rng.uniform(0.5, 2, c),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    model = make_model(
        [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 5, 5])]
        + [helper.make_tensor_value_info(k, TensorProto.FLOAT, [c]) for k in params],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    ).SerializeToString()
    x = rng.standard_normal((2, c, 5, 5)).astype(np.float32)
    ours = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])

    def check(feeds):
        np.testing.assert_allclose(ours.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)

    check({"x": x})
    check({"x": x})
    fed = (params["scale"] * 3).astype(np.float32)
    check({"x": x, "scale": fed})
    fed *= -1  # the same array, changed in place
    check({"x": x, "scale": fed})
    check({"x": x})


def test_large_gelu_split_over_threads_is_bitwise_the_serial_one():
    """A Gelu of ``_GELU_SPLIT`` values or more is computed in one part per kernel thread,
    and on one thread in cache-sized chunks: both bitwise the whole array's passes."""
    import math

    from onnxrt_cpu.kernels.activation import _GELU_SPLIT, _gelu_erf, gelu_erf

    x = (np.random.default_rng(0).standard_normal(_GELU_SPLIT + 1000) * 3).astype(np.float32).reshape(-1, 8)
    with ThreadSettings(1):
        one = gelu_erf(x)
    with ThreadSettings(2):
        two = gelu_erf(x)
    assert two.shape == x.shape and two.dtype == np.float32
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, _gelu_erf(x))
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel()[:2000].astype(np.float64)])
    np.testing.assert_allclose(two.ravel()[:2000], want, rtol=1e-5, atol=1e-6)


def _softmax_regimes():
    """Logits of [6, 4, 8, 32] in the regimes that keep or leave the unshifted path."""
    rng = np.random.default_rng(5)
    base = rng.standard_normal((6, 4, 8, 32)).astype(np.float32) * 3
    big = base.copy()
    big[2, 1, 3] += 200  # one row's exp overflows float32 unshifted
    low = base.copy()
    low[4, 0, 5] -= 1000  # one row's exp underflows entirely unshifted
    masked = base.copy()
    masked[..., 20:] = -10000  # attention padding: those terms underflow, rows do not
    inf = base.copy()
    inf[1, 2, 0, 7] = np.inf
    inf[3, 3, 3] = -np.inf  # a row with no finite logit
    nan = base.copy()
    nan[0, 0, 0, 0] = np.nan
    return {"plain": base, "overflow row": big, "underflow row": low, "masked": masked,
            "infinities": inf, "nan": nan}


@pytest.mark.parametrize("regime", list(_softmax_regimes()))
def test_softmax_unshifted_path_and_its_fallbacks_match_onnxruntime(regime):
    """Softmax over short rows takes exp unshifted when every row sum stays in range,
    and shifts by the row maximum otherwise: both give onnxruntime's probabilities."""
    from onnxrt_cpu.rows import unshifted_softmax

    x = _softmax_regimes()[regime]
    model = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    ).SerializeToString()
    want, = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got, = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    takes_unshifted = unshifted_softmax(x) is not None
    assert takes_unshifted == (regime in ("plain", "masked"))


_ROW_REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL1", "ReduceL2"]


@pytest.mark.parametrize("op_type", _ROW_REDUCE_OPS)
@pytest.mark.parametrize("shape", [(400, 3), (64, 8, 7), (40, 30), (8, 65), (4, 600)])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_last_axis_reductions_through_the_row_helpers_match_onnxruntime(op_type, shape, keepdims):
    """Reductions over the last axis alone of float arrays of 512 values or more go
    through onnxrt_cpu.rows (column passes, the transposed maximum, halving,
    products with ones): onnxruntime's values and shapes. A NaN gives a NaN for its
    row, as numpy's reductions (and onnxrt's before the row route) do; onnxruntime's
    ReduceMax and ReduceMin skip it."""
    from onnxrt_cpu.kernels import reduce as reduce_kernels

    x = np.random.default_rng(5).normal(size=shape).astype(np.float32)
    assert x.size >= reduce_kernels._ROWS_MIN_SIZE and shape[-1] <= reduce_kernels._ROWS_MAX_LEN
    model = make_model(
        [helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=keepdims)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes")],
    ).SerializeToString()
    want, = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got, = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    nan = x.copy()
    nan[1, ..., 1] = np.nan  # one NaN in one row (of each plane)
    got_nan, = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": nan})
    assert np.array_equal(np.isnan(got_nan), np.isnan(np.sum(nan, axis=-1, keepdims=bool(keepdims))))
    # the row route itself, on the same input (and not numpy's reduction)
    calls = []
    row_fn = reduce_kernels._REDUCERS[op_type][3]
    kernel = reduce_kernels.Reduce.__new__(reduce_kernels.Reduce)
    kernel.rows = lambda a: calls.append(a.shape) or row_fn(a)
    kernel.upcast, kernel.fn, kernel.xp = True, None, np
    (direct,) = kernel._reduce(x, (x.ndim - 1,), bool(keepdims))
    assert calls == [shape]
    np.testing.assert_allclose(direct, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("archs,mflops", [(["SkylakeX"], 24), (["Cooperlake"], 24), (["Haswell"], 12), ([], 12)])
def test_split_threshold_doubles_with_avx512_blas_kernels(archs, mflops, monkeypatch):
    """Products are split over threads from 12M multiply-adds, or 24M where the BLAS
    library's kernels run twice as fast; the threshold in effect is the one for the
    BLAS this process loaded."""
    import onnxrt.run.threads as threads

    monkeypatch.setattr(parallel, "blas_architectures", lambda: archs)
    assert parallel._min_flops() == mflops << 20
    monkeypatch.undo()
    loaded = threads.blas_architectures()
    assert all(isinstance(a, str) and a for a in loaded)
    assert parallel.PARALLEL_MIN_FLOPS == parallel._min_flops()


# -- recurrent layers: both directions of a bidirectional layer step together ---------------


def _rnn_model(op, direction, w, r, b, seq, batch, hidden, with_states, ragged=False, **attrs):
    lstm = op == "LSTM"
    states = (["h0", "c0"] if lstm else ["h0"]) if with_states else []
    outputs = ["y", "yh", "yc"] if lstm else ["y", "yh"]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, w.shape[2]])]
    if ragged:
        inputs.append(helper.make_tensor_value_info("sl", TensorProto.INT32, [batch]))
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [w.shape[0], batch, hidden]) for n in states]
    return make_model(
        [helper.make_node(op, ["x", "w", "r", "b", "sl" if ragged else ""] + states, outputs, hidden_size=hidden,
                          direction=direction, **attrs)],
        inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in (("w", w), ("r", r), ("b", b))],
    )


@pytest.mark.parametrize(
    "op,attrs,with_states,ragged",
    [
        ("LSTM", {}, False, False),
        ("LSTM", {}, True, False),
        ("LSTM", {}, True, True),
        ("GRU", {}, True, False),
        ("GRU", {}, False, True),
        ("GRU", {"linear_before_reset": 1}, False, False),
        ("GRU", {"linear_before_reset": 1}, True, True),
        # a non-default activation: the loop per direction for both
        ("LSTM", {"activations": ["sigmoid", "tanh", "relu"] * 2}, True, False),
    ],
)
def test_bidirectional_layer_equals_its_two_directions_and_onnxruntime(op, attrs, with_states, ragged,
                                                                       monkeypatch):
    # a bidirectional layer runs both directions' steps at once: the same values bit
    # for bit as its loop per direction, and as each direction alone (a model of
    # its own) up to the rounding of the input projection, one product for both
    # directions there (BLAS may round a column of a wider product differently).
    # Ragged sequence_lens (one entry empty, one whole): each entry's valid
    # prefix, its outputs past its length zero and its final state its last valid one
    from onnxrt_cpu.kernels import rnn

    rng = np.random.default_rng(3)
    seq, batch, size, hidden = 9, 5, 12, 16
    gates = 4 if op == "LSTM" else 3
    w = (rng.standard_normal((2, gates * hidden, size)) * 0.3).astype(np.float32)
    r = (rng.standard_normal((2, gates * hidden, hidden)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((2, 2 * gates * hidden)) * 0.1).astype(np.float32)
    feeds = {"x": rng.standard_normal((seq, batch, size)).astype(np.float32)}
    if ragged:
        feeds["sl"] = np.array([4, 9, 0, 1, 7], np.int32)
    if with_states:
        feeds |= {n: rng.standard_normal((2, batch, hidden)).astype(np.float32)
                  for n in (("h0", "c0") if op == "LSTM" else ("h0",))}
    both = _rnn_model(op, "bidirectional", w, r, b, seq, batch, hidden, with_states, ragged,
                      **attrs).SerializeToString()
    got = ort.InferenceSession(both, providers=["CPUExecutionProvider"]).run(None, feeds)
    monkeypatch.setattr(rnn, "_BOTH_MAX_WEIGHT_BYTES", -1)  # one direction at a time
    apart = ort.InferenceSession(both, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, a in zip(got, apart):
        np.testing.assert_array_equal(g, a)
    one_attrs = {k: v[: len(v) // 2] for k, v in attrs.items() if k == "activations"}
    one_attrs |= {k: v for k, v in attrs.items() if k != "activations"}
    for d, direction in enumerate(("forward", "reverse")):
        one = _rnn_model(op, direction, w[d : d + 1], r[d : d + 1], b[d : d + 1], seq, batch, hidden,
                         with_states, ragged, **one_attrs)
        one_feeds = {k: v if k in ("x", "sl") else v[d : d + 1] for k, v in feeds.items()}
        outs = ort.InferenceSession(one.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, one_feeds)
        np.testing.assert_allclose(got[0][:, d : d + 1], outs[0], rtol=1e-6, atol=1e-6)
        for g, o in zip(got[1:], outs[1:]):
            np.testing.assert_allclose(g[d : d + 1], o, rtol=1e-6, atol=1e-6)
        if ragged:
            np.testing.assert_array_equal(got[0][:, d : d + 1] == 0, outs[0] == 0)
    exp = rt.InferenceSession(both, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(got, exp):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
