"""Seed models and the mutations the fuzz tests apply to them.

Shared by ``test_fuzz.py`` (bounded, deterministic, in CI) and
``scripts/fuzz_models.py`` (the long run). Every mutation is a plain function of a
``random.Random``, so a failing case is reproduced from its seed alone.

The contract under test: loading and running a mutated model, with well-formed or
mutated feeds, either succeeds or raises an :class:`onnxrt.OnnxRtError`. Any other
exception, a crash or a hang is a bug.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import onnx
from onnx import AttributeProto, ModelProto, TensorProto, helper, numpy_helper

import onnxrt as ort

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

#: allocation cap for fuzzed sessions: keeps every run small and fast
FUZZ_MAX_BYTES = 64 << 20


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, inputs, outputs, inits=(), opset=18, extra_opsets=()):
    g = helper.make_graph(nodes, "seed", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(g, opset_imports=ops, ir_version=10)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def seed_models() -> dict[str, ModelProto]:
    """Small valid models covering common op families, control flow and shape ops."""
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    seeds = {}
    seeds["mlp"] = _model(
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
         helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("Gemm", ["h2", "w2", "b2"], ["l"], transB=1),
         helper.make_node("Softmax", ["l"], ["y"], axis=-1)],
        [_vi("x", F, ["N", 4])], [_vi("y", F, ["N", 3])],
        [_init("w1", r(4, 8)), _init("b1", r(8)), _init("w2", r(3, 8)), _init("b2", r(3))],
    )
    seeds["conv"] = _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
         helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-5),
         helper.make_node("Relu", ["n"], ["r"]),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
         helper.make_node("GlobalAveragePool", ["a"], ["g"]), helper.make_node("Flatten", ["g"], ["y"], axis=1)],
        [_vi("x", F, ["N", 2, 6, 6])], [_vi("y", F, ["N", 4])],
        [_init("w", r(4, 2, 3, 3)), _init("b", r(4)), _init("s", np.abs(r(4)) + 0.5), _init("bb", r(4)),
         _init("m", r(4)), _init("v", np.abs(r(4)) + 0.5)],
    )
    seeds["shapes"] = _model(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
         helper.make_node("Reshape", ["t", "shape"], ["rs"]),
         helper.make_node("Slice", ["rs", "starts", "ends", "axes"], ["sl"]),
         helper.make_node("Unsqueeze", ["sl", "ax0"], ["u"]), helper.make_node("Squeeze", ["u", "ax0"], ["sq"]),
         helper.make_node("Concat", ["sq", "sq"], ["cc"], axis=1),
         helper.make_node("Gather", ["cc", "idx"], ["ga"], axis=1),
         helper.make_node("Expand", ["ga", "eshape"], ["ex"]),
         helper.make_node("Tile", ["ex", "reps"], ["ti"]),
         helper.make_node("Split", ["ti", "split"], ["y", "z"], axis=0)],
        [_vi("x", F, [2, 3, 4]), _vi("idx", I64, ["K"])], [_vi("y", F, None), _vi("z", F, None)],
        [_init("shape", np.array([3, 8], np.int64)), _init("starts", np.array([0], np.int64)),
         _init("ends", np.array([6], np.int64)), _init("axes", np.array([1], np.int64)),
         _init("ax0", np.array([0], np.int64)), _init("eshape", np.array([2, 1, 1], np.int64)),
         _init("reps", np.array([1, 1, 2], np.int64)), _init("split", np.array([1, 1], np.int64))],
    )
    then_b = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["o"])], "then", [], [_vi("o", F, None)])
    else_b = helper.make_graph([helper.make_node("Neg", ["x"], ["o2"])], "else", [], [_vi("o2", F, None)])
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]), helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["acc_out", "fi"], ["scan_out"])],
        "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("acc_in", F, None)],
        [_vi("c_out", B, []), _vi("acc_out", F, None), _vi("scan_out", F, None)],
    )
    seeds["control"] = _model(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["ify"], then_branch=then_b, else_branch=else_b),
         helper.make_node("Loop", ["n", "", "ify"], ["acc", "scans"], body=body)],
        [_vi("x", F, [3]), _vi("n", I64, [])], [_vi("acc", F, None), _vi("scans", F, None)],
        [_init("zero", np.float32(0)), _init("two", np.float32(2))],
    )
    seeds["misc"] = _model(
        [helper.make_node("Cast", ["x"], ["xd"], to=TensorProto.DOUBLE),
         helper.make_node("ReduceMean", ["xd"], ["mean"], keepdims=1),
         helper.make_node("Sub", ["xd", "mean"], ["cent"]), helper.make_node("Cast", ["cent"], ["c32"], to=F),
         helper.make_node("Clip", ["c32", "lo", "hi"], ["cl"]),
         helper.make_node("Pad", ["cl", "pads"], ["pd"], mode="reflect"),
         helper.make_node("TopK", ["pd", "k"], ["tv", "ti"], axis=-1),
         helper.make_node("LayerNormalization", ["tv", "gamma", "beta"], ["ln"], axis=-1),
         helper.make_node("Where", ["cond", "ln", "ln2"], ["y"]),
         helper.make_node("Neg", ["ln"], ["ln2"]), helper.make_node("Less", ["ln", "zero"], ["cond"]),
         helper.make_node("ArgMax", ["ti"], ["am"], axis=1, keepdims=0)],
        [_vi("x", F, ["N", 5])], [_vi("y", F, None), _vi("am", I64, None)],
        [_init("lo", np.float32(-1)), _init("hi", np.float32(1)), _init("pads", np.array([0, 1, 0, 1], np.int64)),
         _init("k", np.array([3], np.int64)), _init("gamma", r(3)), _init("beta", r(3)), _init("zero", np.float32(0))],
    )
    seeds["generators"] = _model(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
         helper.make_node("Range", ["a", "lim", "d"], ["rg"]),
         helper.make_node("OneHot", ["ids", "depth", "vals"], ["oh"], axis=-1),
         helper.make_node("Resize", ["img", "", "scales"], ["rz"], mode="linear"),
         helper.make_node("ScatterND", ["c", "sidx", "supd"], ["sc"]),
         helper.make_node("GatherElements", ["sc", "gidx"], ["ge"], axis=1)],
        [_vi("s", I64, [2]), _vi("a", F, []), _vi("lim", F, []), _vi("d", F, []), _vi("ids", I64, ["K"]),
         _vi("img", F, [1, 1, 2, 2]), _vi("gidx", I64, [2, 2])],
        [_vi("ge", F, None), _vi("rg", F, None), _vi("oh", F, None), _vi("rz", F, None)],
        [_init("depth", np.int64(4)), _init("vals", np.array([0, 1], np.float32)),
         _init("scales", np.array([1, 1, 2, 2], np.float32)), _init("sidx", np.array([[0, 0]], np.int64)),
         _init("supd", np.array([9.0], np.float32))],
    )
    seeds.update(_control_flow_seeds())
    seeds["feedkinds"] = _feed_kinds_seed()
    return seeds


def _control_flow_seeds() -> dict[str, ModelProto]:
    """Bodies of every control-flow kind, for the mutations to reach into: a Scan with
    a state and a scan output, a Loop whose carried value grows through Concat and
    collects a sequence, an If whose branches return two values, a local function."""
    seeds = {}
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["st_in", "x_t"], ["st_out"]), helper.make_node("Mul", ["st_out", "x_t"], ["y_t"])],
        "scan_body", [_vi("st_in", F, [2]), _vi("x_t", F, [2])], [_vi("st_out", F, [2]), _vi("y_t", F, [2])])
    seeds["scan"] = _model(
        [helper.make_node("Scan", ["s0", "xs"], ["st", "ys"], body=scan_body, num_scan_inputs=1)],
        [_vi("s0", F, [2]), _vi("xs", F, ["T", 2])], [_vi("st", F, [2]), _vi("ys", F, ["T", 2])])
    grow_body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Concat", ["v_in", "v_in"], ["v_out"], axis=0),
         helper.make_node("SequenceInsert", ["q_in", "v_in"], ["q_out"]),
         helper.make_node("ReduceSum", ["v_out"], ["tot"], keepdims=0)],
        "grow_body",
        [_vi("i", I64, []), _vi("c_in", B, []), _vi("v_in", F, [None]),
         helper.make_value_info("q_in", helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None)))],
        [_vi("c_out", B, []), _vi("v_out", F, [None]),
         helper.make_value_info("q_out", helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))),
         _vi("tot", F, [])])
    seeds["loop_grow"] = _model(
        [helper.make_node("SequenceEmpty", [], ["q0"], dtype=F),
         helper.make_node("Loop", ["n", "", "v", "q0"], ["vf", "qf", "tots"], body=grow_body),
         helper.make_node("ConcatFromSequence", ["qf"], ["all"], axis=0)],
        [_vi("n", I64, []), _vi("v", F, [1])], [_vi("vf", F, None), _vi("all", F, None), _vi("tots", F, None)])
    then_b = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Shape", ["x"], ["b"])], "then", [],
        [_vi("a", F, None), _vi("b", I64, None)])
    else_b = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["a2"]), helper.make_node("Size", ["x"], ["b0"]),
         helper.make_node("Unsqueeze", ["b0", "ax"], ["b2"])], "else", [],
        [_vi("a2", F, None), _vi("b2", I64, None)])
    seeds["if2"] = _model(
        [helper.make_node("If", ["c"], ["ya", "yb"], then_branch=then_b, else_branch=else_b)],
        [_vi("c", B, []), _vi("x", F, ["N", 3])], [_vi("ya", F, None), _vi("yb", I64, None)],
        [_init("ax", np.array([0], np.int64))])
    fn = helper.make_function("local", "Twice", ["x"], ["y"], [helper.make_node("Add", ["x", "x"], ["y"])],
                              [helper.make_opsetid("", 18)])
    m = _model([helper.make_node("Twice", ["x"], ["h"], domain="local"),
                helper.make_node("Twice", ["h"], ["y"], domain="local")],
               [_vi("x", F, ["N"])], [_vi("y", F, ["N"])], extra_opsets=[("local", 1)])
    m.functions.append(fn)
    seeds["function"] = m
    return seeds


def _feed_kinds_seed() -> ModelProto:
    """Inputs of every kind a feed can take: a sequence, an optional, a string tensor and a map."""
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2]))
    map_t = helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(F, None))
    return _model(
        [helper.make_node("ConcatFromSequence", ["sq"], ["cat"], axis=0),
         helper.make_node("OptionalHasElement", ["op"], ["has"]),
         helper.make_node("StringNormalizer", ["st"], ["up"], case_change_action="UPPER"),
         helper.make_node("DictVectorizer", ["mp"], ["dv"], domain="ai.onnx.ml", string_vocabulary=["a", "b"]),
         helper.make_node("MatMul", ["mx", "mx"], ["mm"])],
        [helper.make_value_info("sq", seq_t), helper.make_value_info("op", opt_t), _vi("st", TensorProto.STRING, [None]),
         helper.make_value_info("mp", map_t), _vi("mx", F, [2, 2])],
        [_vi("cat", F, None), _vi("has", B, []), _vi("up", TensorProto.STRING, None), _vi("dv", F, None),
         _vi("mm", F, [2, 2])],
        extra_opsets=[("ai.onnx.ml", 3)])


# -- feeds ---------------------------------------------------------------------------------------

_NP_BY_TYPE = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_, "tensor(string)": object,
}
_VALUE_POOL = [0.0, 1.0, -1.0, 2.0, 0.5, 3.0, -7.0, np.nan, np.inf, -np.inf, 1e30, -1e30]


def _array(rnd: random.Random, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    if dtype is object:
        return np.array([rnd.choice(["", "a", "zz"]) for _ in range(n)], dtype=object).reshape(shape)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        vals = [rnd.choice(_VALUE_POOL) if rnd.random() < 0.2 else rnd.uniform(-3, 3) for _ in range(n)]
        return np.array(vals, dtype=np.float64).astype(dt).reshape(shape)
    if dt.kind == "b":
        return np.array([rnd.random() < 0.5 for _ in range(n)], dtype=dt).reshape(shape)
    info = np.iinfo(dt)
    pool = [0, 1, 2, 3, -1, -2, info.max, info.min, 5]
    vals = [rnd.choice(pool) if rnd.random() < 0.2 else rnd.randint(0, 3) for _ in range(n)]
    return np.array([min(max(v, info.min), info.max) for v in vals], dtype=dt).reshape(shape)


def _other_kind(rnd: random.Random, arg, dims):
    """A well-formed value for a sequence, optional or map input (None for a tensor)."""
    t = arg.type
    if t.startswith("seq("):
        inner = _NP_BY_TYPE.get(t[4:-1], np.float32)
        return [_array(rnd, inner, [rnd.randint(1, 3), 2]) for _ in range(rnd.randint(1, 3))]
    if t.startswith("optional("):
        inner = _NP_BY_TYPE.get(t[9:-1], np.float32)
        return None if rnd.random() < 0.3 else _array(rnd, inner, [2])
    if t.startswith("map("):
        return {rnd.choice(["a", "b", "c"]): rnd.uniform(-2, 2) for _ in range(rnd.randint(0, 3))}
    return None


def _mutate_kind(rnd: random.Random, v):
    """One thing wrong with a value of any kind: the feed kinds onnxrt checks."""
    if isinstance(v, list):
        return rnd.choice([v[0] if v else np.ones(2), [v], [x.astype(np.float64) for x in v], [np.matrix(x) for x in v
                           if x.ndim == 2], v + [None], "abc"])
    if isinstance(v, dict):
        return rnd.choice([{1: 1.0}, {"a": "x"}, {"a": None}, {True: 1.0}, list(v.items()), {"a": np.ones(2)}])
    if v is None:
        return rnd.choice([[np.ones(2, np.float32)], np.ones(2), "x"])
    if v.dtype == object:
        return rnd.choice([v.astype("S") if v.size else v, np.array(["a", 3], dtype=object),
                           np.array([b"\xff"]), np.array([None], dtype=object), v.astype(str)])
    return rnd.choice([np.matrix(v) if v.ndim == 2 else v[None], np.ma.masked_array(v), v.view(_Tagged)])


class _Tagged(np.ndarray):
    """An ndarray subclass with nothing of its own, as a caller might pass one."""


def make_feeds(rnd: random.Random, inputs, mutate: bool) -> dict:
    """Feeds for a session's inputs: well-formed, or (``mutate``) with one thing wrong."""
    dims: dict[str, int] = {}
    feeds = {}
    for arg in inputs:
        other = _other_kind(rnd, arg, dims)
        if other is not None or arg.type.startswith("optional("):
            feeds[arg.name] = other
            continue
        dtype = _NP_BY_TYPE.get(arg.type, np.float32)
        shape = arg.shape if arg.shape is not None else [None] * rnd.randint(0, 3)
        concrete = []
        for d in shape:
            if isinstance(d, int):
                concrete.append(d)
            elif isinstance(d, str) and d:
                concrete.append(dims.setdefault(d, rnd.randint(0, 4)))
            else:
                concrete.append(rnd.randint(0, 4))
        if int(np.prod(concrete)) > 4096:
            concrete = [min(c, 4) for c in concrete]
        feeds[arg.name] = _array(rnd, dtype, concrete)
    if mutate and feeds:
        name = rnd.choice(sorted(feeds))
        what = rnd.randrange(7)
        v = feeds[name]
        if what == 6 or not isinstance(v, np.ndarray):
            if what == 0:
                del feeds[name]
            else:
                feeds[name] = _mutate_kind(rnd, v)
        elif what == 0:
            del feeds[name]
        elif what == 1:
            feeds[name + "_extra"] = v
        elif what == 2 and v.dtype != object:
            feeds[name] = v.astype(rnd.choice([np.float64, np.int32, np.float16, np.uint8]))
        elif what == 3:
            feeds[name] = v.reshape(v.shape + (1,))
        elif what == 4:
            feeds[name] = _array(rnd, v.dtype if v.dtype != object else object, [rnd.randint(0, 5) for _ in range(v.ndim)])
        else:
            feeds[name] = v.tolist() if v.ndim else float(v) if v.dtype.kind == "f" else v
    return feeds


# -- model mutations -----------------------------------------------------------------------------

_INTS = [-(1 << 40), -3, -2, -1, 0, 1, 2, 3, 5, 1 << 40]
_FLOATS = [0.0, -1.0, 1e-9, 0.5, 2.0, 1e30, float("nan"), float("inf")]
_OPS = ["Relu", "Add", "MatMul", "Conv", "Reshape", "Gather", "Slice", "Concat", "Softmax", "Transpose",
        "ReduceSum", "Cast", "Pad", "Resize", "Tile", "Expand", "Split", "Squeeze", "If", "Loop", "Scan",
        "ConstantOfShape", "TopK", "Where", "NonZero", "Einsum", "CumSum", "DepthToSpace", "LRN",
        "MaxPool", "Unique", "Identity", "Not", "Mod", "BitShift", "QuantizeLinear", "NoSuchOp"]
_ATTR_NAMES = ["axis", "axes", "perm", "to", "kernel_shape", "pads", "strides", "dilations", "group", "keepdims",
               "epsilon", "mode", "transA", "transB", "alpha", "beta", "k", "largest", "sorted", "value"]
_DTYPES = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL,
           TensorProto.FLOAT16, TensorProto.STRING, TensorProto.UINT8, TensorProto.BFLOAT16, TensorProto.INT4, 0, 99]


def _all_graphs(g):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from _all_graphs(a.g)
            for sg in a.graphs:
                yield from _all_graphs(sg)


def _names(g) -> list[str]:
    out = [vi.name for vi in g.input] + [t.name for t in g.initializer]
    for n in g.node:
        out.extend(n.output)
    return out


def _mutate_attribute(rnd, node):
    if node.attribute and rnd.random() < 0.8:
        a = rnd.choice(node.attribute)
        # mostly new values of the right type: those get past validation into the kernels
        choice = rnd.choice([0, 1, 1, 1, 2, 2, 2, 3, 4, 4, 5])
        if choice == 0:
            node.attribute.remove(a)
        elif choice == 1 and a.type == AttributeProto.INT:
            a.i = rnd.choice(_INTS)
        elif choice == 1 and a.type == AttributeProto.FLOAT:
            a.f = rnd.choice(_FLOATS)
        elif choice == 2 and a.type == AttributeProto.INTS:
            del a.ints[:]
            a.ints.extend(rnd.choice(_INTS) for _ in range(rnd.randint(0, 5)))
        elif choice == 3:
            # the same name with another type of value
            new = helper.make_attribute(a.name, rnd.choice([1, 2.5, "abc", [1, 2], [0.5], b"\xff"]))
            node.attribute.remove(a)
            node.attribute.append(new)
        elif choice == 4 and a.type == AttributeProto.STRING:
            a.s = rnd.choice([b"", b"nearest", b"linear", b"cubic", b"reflect", b"\xff\xfe", b"SAME_UPPER"])
        else:
            a.type = rnd.choice([AttributeProto.UNDEFINED, AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.TENSOR])
    else:
        name = rnd.choice(_ATTR_NAMES)
        if any(a.name == name for a in node.attribute):
            return
        node.attribute.append(helper.make_attribute(name, rnd.choice([0, 1, -1, 7, 1 << 40, [1, 1], [0, 0, 0, 0], 0.1, "x"])))


def _mutate_tensor(rnd, t):
    choice = rnd.randrange(5)
    if choice == 0:
        t.data_type = rnd.choice(_DTYPES)
    elif choice == 1:
        dims = list(t.dims)
        if dims and rnd.random() < 0.7:
            dims[rnd.randrange(len(dims))] = rnd.choice([0, 1, 2, 3, -1, 1 << 40])
        else:
            dims.append(rnd.choice([0, 1, 2]))
        del t.dims[:]
        t.dims.extend(dims)
    elif choice == 2 and t.HasField("raw_data"):
        raw = bytearray(t.raw_data)
        op = rnd.randrange(3)
        if op == 0 and raw:
            for _ in range(rnd.randint(1, 4)):
                raw[rnd.randrange(len(raw))] = rnd.randrange(256)
        elif op == 1:
            raw = raw[: rnd.randint(0, len(raw))]
        else:
            raw.extend(bytes(rnd.randint(1, 9)))
        t.raw_data = bytes(raw)
    elif choice == 3:
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=rnd.choice(["../w.bin", "/etc/passwd", "w.bin", ""]))
    else:
        t.ClearField("raw_data")
        t.float_data.extend([1.0] * rnd.randint(0, 3))


_CONTROL = ("If", "Loop", "Scan")


def _mutate_body(rnd: random.Random, g) -> bool:
    """Change a control-flow body so that it no longer fits its node: drop or add a
    body output or input, change a declared output type, swap an If's branches'
    outputs. Returns False where the graph has no control-flow node."""
    nodes = [n for n in g.node if n.op_type in _CONTROL]
    if not nodes:
        return False
    node = rnd.choice(nodes)
    bodies = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
    if not bodies:
        return False
    body = rnd.choice(bodies)
    what = rnd.randrange(5)
    if what == 0 and body.output:
        del body.output[rnd.randrange(len(body.output))]
    elif what == 1 and body.input:
        del body.input[rnd.randrange(len(body.input))]
    elif what == 2 and body.output:
        vi = rnd.choice(body.output)
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.elem_type = rnd.choice([TensorProto.INT64, TensorProto.DOUBLE, TensorProto.BOOL, 0])
        else:
            vi.type.CopyFrom(helper.make_tensor_type_proto(F, None))
    elif what == 3:
        extra = onnx.ValueInfoProto()
        extra.CopyFrom(rnd.choice(list(body.output) or list(body.input) or [_vi("nothing")]))
        (body.output if rnd.random() < 0.5 else body.input).append(extra)
    elif len(bodies) == 2 and bodies[0].output and bodies[1].output:
        a, b = bodies[0].output[0], bodies[1].output[-1]
        ta, tb = onnx.TypeProto(), onnx.TypeProto()
        ta.CopyFrom(a.type)
        tb.CopyFrom(b.type)
        a.type.CopyFrom(tb)
        b.type.CopyFrom(ta)
    else:
        node.output.append(f"extra_{len(node.output)}")
    return True


def mutate_model(rnd: random.Random, model: ModelProto, n: int = 1) -> bytes:
    """Apply ``n`` random mutations to a copy of ``model`` and return its bytes."""
    m = ModelProto()
    m.CopyFrom(model)
    byte_level = False
    for _ in range(n):
        graphs = list(_all_graphs(m.graph))
        g = rnd.choice(graphs)
        kind = rnd.randrange(11)
        if kind == 9 and _mutate_body(rnd, rnd.choice(graphs)):
            continue
        if kind == 0 and g.node:
            rnd.choice(g.node).op_type = rnd.choice(_OPS)
        elif kind in (1, 2) and g.node:
            _mutate_attribute(rnd, rnd.choice(g.node))
        elif kind == 3 and g.node:
            node = rnd.choice(g.node)
            names = _names(g) + ["", "undefined_name"]
            if node.input and rnd.random() < 0.7:
                node.input[rnd.randrange(len(node.input))] = rnd.choice(names)
            elif rnd.random() < 0.5:
                node.input.append(rnd.choice(names))
            elif node.output:
                node.output[rnd.randrange(len(node.output))] = rnd.choice(names)
        elif kind == 4 and g.input:
            vi = rnd.choice(g.input)
            tt = vi.type.tensor_type
            if rnd.random() < 0.4:
                tt.elem_type = rnd.choice(_DTYPES[:-1])
            elif tt.shape.dim:
                d = rnd.choice(tt.shape.dim)
                if rnd.random() < 0.5:
                    d.dim_value = rnd.choice([0, 1, 2, 3, 7])
                else:
                    d.dim_param = rnd.choice(["N", "K", "M"])
            else:
                tt.shape.dim.add().dim_value = rnd.choice([1, 2])
        elif kind == 5 and g.initializer:
            _mutate_tensor(rnd, rnd.choice(g.initializer))
        elif kind == 6:
            imp = rnd.choice(m.opset_import)
            imp.version = rnd.choice([1, 6, 7, 9, 11, 13, 17, 18, 21, 23, 99])
        elif kind == 7 and g.node:
            i = rnd.randrange(len(g.node))
            j = rnd.randrange(len(g.node))
            node = onnx.NodeProto()
            node.CopyFrom(g.node[i])
            if rnd.random() < 0.5:
                del g.node[i]
            g.node.insert(j, node)
        elif kind == 8 and g.output:
            vi = rnd.choice(g.output)
            vi.name = rnd.choice(_names(g) + ["never_made"])
        else:
            byte_level = True
    data = m.SerializeToString()
    if byte_level and data:
        raw = bytearray(data)
        for _ in range(rnd.randint(1, 6)):
            op = rnd.randrange(3)
            pos = rnd.randrange(len(raw))
            if op == 0:
                raw[pos] = rnd.randrange(256)
            elif op == 1:
                del raw[pos: pos + rnd.randint(1, 8)]
            else:
                raw[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
            if not raw:
                break
        data = bytes(raw)
    return data


def check_one(data: bytes, rnd: random.Random, runs: int = 2, run_seconds: float = 2.0) -> str:
    """Load ``data`` and run it with random feeds; return what happened.

    Returns ``"load-error"``, ``"run-error"`` or ``"ok"``. Raises whatever onnxrt raised
    if it is not an :class:`onnxrt.OnnxRtError`: that is a bug.
    """
    so = ort.SessionOptions()
    so.max_allocation_bytes = FUZZ_MAX_BYTES
    try:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except ort.OnnxRtError:
        return "load-error"
    outcome = "ok"
    for _ in range(runs):
        feeds = make_feeds(rnd, sess.get_inputs(), mutate=rnd.random() < 0.3)
        # a fed trip count can make a Loop run for ever, as in any runtime: stop it
        ro = ort.RunOptions()
        watchdog = threading.Timer(run_seconds, setattr, (ro, "terminate", True))
        watchdog.start()
        try:
            outs = sess.run(None, feeds, ro)
        except ort.OnnxRtError:
            outcome = "run-error"
            continue
        finally:
            watchdog.cancel()
        assert len(outs) == len(sess.get_outputs())
    return outcome
