"""The CUDA provider's partition, fusion and kernels, run on the host with numpy.

:class:`HostCUDA` is the real :class:`CUDAExecutionProvider` (same claims, same fused
groups, same kernel classes) with its kernels bound to numpy instead of CuPy and its
fused groups evaluated node by node instead of compiled. Every kernel the GPU will run
is thereby checked against the CPU provider here; on a GPU only the namespace differs.
"""

import numpy as np
import onnxrt as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxrt import hookimpl
from onnxrt.plugin.provider import HostDevice
from onnxrt_cuda.codegen import EwNode, EwProgram
from onnxrt.plugin.provider import group_io
from onnxrt_cuda.provider import CUDAExecutionProvider
from onnxrt_cuda.registry import build_registry

from ..models.test_real_models import DATA, _feeds

HOST = "CUDAKernelsOnHostExecutionProvider"


class _Fused:
    def __init__(self, prog):
        self.prog = prog

    def run(self, *inputs):
        return tuple(self.prog.evaluate(np, list(inputs)))


class HostCUDA(CUDAExecutionProvider):
    """The CUDA provider's logic with numpy in place of CuPy."""

    name = HOST
    aliases = ("cudahost",)
    priority = -100

    def __init__(self, options=None, session_options=None):
        from onnxrt_cuda.provider import parse_options

        self.options = parse_options(options or {})
        self.session_options = session_options
        self.device = HostDevice()

    @classmethod
    def is_available(cls):
        return None

    @classmethod
    def build_registry(cls):
        return build_registry(np)

    def compile(self, capability, graph, node_info):
        inputs, outputs = group_io(graph, capability.nodes)
        chain = [EwNode(n.op_type, list(n.inputs), list(n.outputs[:1]), dict(node_info(n).attrs), n.name)
                 for n in capability.nodes]
        return _Fused(EwProgram(chain, inputs, outputs))


class _Plugin:
    @hookimpl
    def onnxrt_register_providers(self, registry):
        registry.add_provider(HostCUDA)


@pytest.fixture(scope="module", autouse=True)
def host_cuda():
    plugin = _Plugin()
    ort.plugin.register_plugin(plugin, name="host_cuda")
    try:
        yield
    finally:
        ort.plugin.unregister_plugin(plugin)


def _opts(level=None):
    so = ort.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    return so


def _node_model(op, inputs, out_shapes, attrs=None, inits=(), opset=17, outputs=("y",), out_types=None):
    ins = [helper.make_tensor_value_info(n, _onnx_t(a.dtype), list(a.shape)) for n, a in inputs]
    init = [numpy_helper.from_array(a, n) for n, a in inits]
    names = [n for n, _ in inputs] + [n for n, _ in inits]
    node = helper.make_node(op, names, list(outputs), **(attrs or {}))
    outs = [helper.make_tensor_value_info(o, (out_types or {}).get(o, _onnx_t(inputs[0][1].dtype)), None)
            for o in outputs]
    g = helper.make_graph([node], op, ins, outs, init)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10).SerializeToString()


def _onnx_t(dt):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def _run_both(model, feeds, rtol=1e-5, atol=1e-6, expect_on=True):
    so = _opts(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = ort.InferenceSession(model, so, providers=[HOST, "CPUExecutionProvider"])
    if expect_on:
        off = [a for a in sess.get_provider_assignment() if a["provider"] != HOST]
        assert not off, off
    ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    got, want = sess.run(None, feeds), ref.run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    return got


R = np.random.default_rng(0)


def _r(*shape, dt=np.float32):
    return R.standard_normal(shape).astype(dt)


CONV_CASES = {
    "plain_bias": ((2, 3, 9, 9), (4, 3, 3, 3), {}, True),
    "stride_pad": ((1, 3, 10, 11), (5, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 2, 1]}, True),
    "dilated": ((1, 2, 12, 12), (3, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, False),
    "groups": ((2, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, True),
    "depthwise": ((2, 6, 9, 9), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}, True),
    "depthwise_x2": ((1, 3, 7, 7), (6, 1, 3, 3), {"group": 3}, False),
    "same_upper": ((1, 3, 7, 8), (2, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, False),
    "pointwise": ((2, 8, 5, 5), (4, 8, 1, 1), {}, True),
    "conv1d": ((2, 3, 15), (4, 3, 5), {"pads": [2, 1], "strides": [2]}, True),
}


@pytest.mark.parametrize("name", CONV_CASES)
@pytest.mark.parametrize("const_w", [True, False])
def test_conv(name, const_w):
    xs, ws, attrs, bias = CONV_CASES[name]
    x, w = _r(*xs), _r(*ws)
    extra = [("b", _r(ws[0]))] if bias else []
    if const_w:
        model = _node_model("Conv", [("x", x)], None, attrs, inits=[("w", w)] + extra)
        feeds = {"x": x}
    else:
        model = _node_model("Conv", [("x", x), ("w", w)] + extra, None, attrs)
        feeds = {"x": x, "w": w, **dict(extra)}
    _run_both(model, feeds, rtol=1e-4, atol=1e-5)


def test_conv_float16():
    x, w = _r(1, 4, 8, 8, dt=np.float16), _r(8, 4, 3, 3, dt=np.float16)
    _run_both(_node_model("Conv", [("x", x)], None, {"pads": [1, 1, 1, 1]}, inits=[("w", w)]), {"x": x},
              rtol=2e-2, atol=2e-2)


POOL_CASES = [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1, "strides": [2, 2]}),
    ("AveragePool", {"kernel_shape": [2, 3]}),
    # a window that fits nowhere along the rows: an empty axis
    ("MaxPool", {"kernel_shape": [10, 3]}),
    ("AveragePool", {"kernel_shape": [10, 3], "strides": [2, 1]}),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
]


@pytest.mark.parametrize("op,attrs", POOL_CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(POOL_CASES)])
def test_pool(op, attrs):
    x = _r(2, 3, 9, 10)
    _run_both(_node_model(op, [("x", x)], None, attrs), {"x": x})


def test_maxpool_with_indices_stays_on_cpu():
    x = _r(1, 2, 4, 4)
    model = _node_model("MaxPool", [("x", x)], None, {"kernel_shape": [2, 2]}, outputs=("y", "i"),
                        out_types={"i": TensorProto.INT64})
    sess = ort.InferenceSession(model, providers=[HOST, "CPUExecutionProvider"])
    (a,) = sess.get_provider_assignment()
    assert a["provider"] == "CPUExecutionProvider" and "Indices" in a["reason"]


@pytest.mark.parametrize("ta,tb,alpha,beta,cshape", [
    (0, 0, 1.0, 1.0, (5,)), (1, 0, 0.5, 2.0, (3, 5)), (0, 1, 1.0, 0.0, (1, 5)), (1, 1, 2.0, 1.0, (3, 1))])
@pytest.mark.parametrize("const_b", [True, False])
def test_gemm(ta, tb, alpha, beta, cshape, const_b):
    a = _r(4, 3) if ta else _r(3, 4)
    b = _r(5, 4) if tb else _r(4, 5)
    c = _r(*cshape)
    attrs = {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}
    if const_b:
        model = _node_model("Gemm", [("a", a)], None, attrs, inits=[("b", b), ("c", c)])
        feeds = {"a": a}
    else:
        model = _node_model("Gemm", [("a", a), ("b", b), ("c", c)], None, attrs)
        feeds = {"a": a, "b": b, "c": c}
    _run_both(model, feeds)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 3)),
                                   ((2, 3, 4), (4,))])
def test_matmul(sa, sb):
    a, b = _r(*sa), _r(*sb)
    _run_both(_node_model("MatMul", [("a", a), ("b", b)], None), {"a": a, "b": b})
    _run_both(_node_model("MatMul", [("a", a)], None, inits=[("b", b)]), {"a": a})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, -1), (13, -1), (13, 1), (13, 0)])
def test_softmax(op, opset, axis):
    x = _r(2, 3, 5) * 4
    _run_both(_node_model(op, [("x", x)], None, {"axis": axis}, opset=opset), {"x": x})


def test_softmax_float16():
    x = _r(4, 7, dt=np.float16)
    _run_both(_node_model("Softmax", [("x", x)], None), {"x": x}, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm_with_stash_outputs(axis):
    x, s, b = _r(2, 3, 6), _r(*((3, 6) if axis == 1 else (6,))), _r(*((3, 6) if axis == 1 else (6,)))
    model = _node_model("LayerNormalization", [("x", x)], None, {"axis": axis, "epsilon": 1e-3},
                        inits=[("s", s), ("b", b)], outputs=("y", "mean", "inv"))
    _run_both(model, {"x": x})


@pytest.mark.parametrize("const", [True, False])
def test_batch_norm(const):
    x = _r(2, 4, 5, 5)
    stats = [("s", _r(4)), ("b", _r(4)), ("m", _r(4)), ("v", np.abs(_r(4)) + 0.5)]
    if const:
        model = _node_model("BatchNormalization", [("x", x)], None, {"epsilon": 1e-4}, inits=stats, opset=15)
        feeds = {"x": x}
    else:
        model = _node_model("BatchNormalization", [("x", x)] + stats, None, {"epsilon": 1e-4}, opset=15)
        feeds = {"x": x, **dict(stats)}
    _run_both(model, feeds)


@pytest.mark.parametrize("to", [TensorProto.FLOAT16, TensorProto.INT32, TensorProto.BOOL, TensorProto.DOUBLE])
def test_cast(to):
    x = _r(3, 4) * 10
    so = _opts(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    model = _node_model("Cast", [("x", x)], None, {"to": to}, out_types={"y": to})
    for providers in ([HOST], ):
        sess = ort.InferenceSession(model, so, providers=providers)
        assert sess.get_provider_assignment()[0]["provider"] == HOST
    _run_both(model, {"x": x})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    x = _r(4, 5, 6)
    idx = np.array([[0, -1], [2, 1]], np.int64)
    _run_both(_node_model("Gather", [("x", x), ("i", idx)], None, {"axis": axis}), {"x": x, "i": idx})
    _run_both(_node_model("Gather", [("x", x)], None, {"axis": axis}, inits=[("i", idx)]), {"x": x})


def test_gather_out_of_range_is_invalid_argument():
    x = _r(4, 5)
    sess = ort.InferenceSession(_node_model("Gather", [("x", x), ("i", np.array([4], np.int64))], None),
                                providers=[HOST, "CPUExecutionProvider"])
    with pytest.raises(ort.InvalidArgument, match=r"indices must be in \[-4, 3\]"):
        sess.run(None, {"x": x, "i": np.array([4], np.int64)})


def test_fused_chain_matches_cpu_and_is_one_group():
    """x*w + b -> Sigmoid -> Mul(x) : one fused group."""
    x, w, b = _r(2, 8), _r(8), _r(8)
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="mul"), helper.make_node("Add", ["m", "b"], ["a"], name="add"),
             helper.make_node("Sigmoid", ["a"], ["s"], name="sig"), helper.make_node("Mul", ["s", "x"], ["y"], name="out")]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    so = _opts(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = ort.InferenceSession(model, so, providers=[HOST, "CPUExecutionProvider"])
    assert sess._built.fused == [{"provider": HOST, "nodes": ["mul", "add", "sig", "out"]}]
    _run_both(model, {"x": x})


def test_fusion_off_runs_single_kernels():
    x = _r(2, 8)
    model = _node_model("Relu", [("x", x)], None)
    sess = ort.InferenceSession(model, providers=[(HOST, {"enable_fusion": False}), "CPUExecutionProvider"])
    assert sess._built.fused == [] and sess.get_provider_assignment()[0]["provider"] == HOST
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def test_strings_stay_on_cpu():
    x = np.array(["a", "b"], dtype=object)
    model = _node_model("Identity", [("x", x)], None, out_types={"y": TensorProto.STRING})
    sess = ort.InferenceSession(model, _opts(ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                                providers=[HOST, "CPUExecutionProvider"])
    (a,) = sess.get_provider_assignment()
    assert a["provider"] == "CPUExecutionProvider" and "does not hold" in a["reason"]


MODELS = {
    "resnet_small": ({"batch": 2}, None),
    "mobilenet_small": ({"batch": 2}, None),
    "yolo_small": ({"batch": 1, "height": 64, "width": 64}, None),
    "bert_tiny": ({"batch": 2, "sequence": 7}, 2),
    "transformer_encoder": ({"batch": 2, "sequence": 6}, 1000),
}
#: share of the compute nodes (all but the shape computations kept on the CPU by design)
MIN_SHARE = 0.9


def model_share(assignment, provider):
    """(nodes on ``provider``, compute nodes, the others' (op, reason)) of an assignment."""
    compute = [a for a in assignment if "shape computation kept on the CPU" not in a["reason"]]
    on = [a for a in compute if a["provider"] == provider]
    off = sorted({(a["op_type"], a["reason"]) for a in compute if a["provider"] != provider})
    return len(on), len(compute), off


@pytest.mark.parametrize("name", MODELS)
def test_real_model_mostly_on_cuda_kernels(name):
    shapes, int_high = MODELS[name]
    path = str(DATA / f"{name}.onnx")
    sess = ort.InferenceSession(path, providers=[HOST, "CPUExecutionProvider"])
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    on, total, off = model_share(sess.get_provider_assignment(), HOST)
    assert on >= MIN_SHARE * total, f"{on}/{total} on CUDA kernels; off: {off}"
    feeds = _feeds(sess, shapes, int_high)
    for g, w in zip(sess.run(None, feeds), ref.run(None, feeds)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
