"""The planner and the executor (onnxrt.plan): slots, copies between devices, frees at
the last use, and plans run as generated straight-line Python: its text, tracebacks
through it, errors naming the node, termination, profiling, subgraphs and threads."""

from __future__ import annotations

import gc
import json
import linecache
import re
import threading
import traceback
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.plan import Plan, PlanBuilder, RunContext
from onnxrt.plugin.kernel import DirectCall, FunctionKernel, Kernel, KernelRegistry, NodeInfo
from onnxrt.plugin.provider import HostDevice
from onnxrt.run.limits import allocation_limit

from ..conftest import make_model

F = TensorProto.FLOAT
CAP = 1 << 30


def _node(op="Op", name="n", **attrs) -> NodeInfo:
    return NodeInfo(name=name, op_type=op, attrs=attrs)


class _Call(Kernel):
    """A class kernel running ``self.f`` (set per test) on its inputs."""

    def run(self, *inputs):
        return (self.f(*inputs),)


def _kernel(f, op="Op", name="n", cls=_Call) -> Kernel:
    k = cls(_node(op, name))
    k.f = f
    return k


def _chain_plan(*fns, memoize=True) -> Plan:
    """x -> fns[0] -> ... -> y, each a class kernel named n0, n1, ..."""
    b = PlanBuilder(HostDevice(), CAP, memoize_shapes=memoize)
    b.add_input("x")
    prev = "x"
    for i, f in enumerate(fns):
        b.add_step(_kernel(f, name=f"n{i}").run, [prev], [f"t{i}"], b.host, f"n{i}", "Op", "TestProvider")
        prev = f"t{i}"
    return b.build([prev])


def _session(model, **opts):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for k, v in opts.items():
        setattr(so, k, v)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _mlp():
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", F, [3, 3], rng.standard_normal(9).astype(np.float32).tolist())
    return make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Neg", ["r"], ["n"], name="neg"),
         helper.make_node("Add", ["n", "x"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])], [w],
    )


def _mlp_expected(x, sess_model):
    w = np.array(sess_model.graph.initializer[0].float_data, np.float32).reshape(3, 3)
    return -np.maximum(x @ w, 0) + x


# -- slots, copies and last uses -------------------------------------------------------------


def test_every_value_is_freed_once_after_its_last_use_and_outputs_are_kept():
    sess = _session(_mlp())
    plan = sess._built.plan
    freed = [s for st in plan.steps for s in st.free]
    produced = [s for st in plan.steps for s in st.outs]
    inputs = set(plan.input_slots.values())
    # every intermediate (and the feed's slot) is released exactly once; the output is kept
    assert sorted(freed) == sorted((set(produced) | inputs) - set(plan.output_slots))
    last_read = {}
    for i, st in enumerate(plan.steps):
        for s in st.ins:
            last_read[s] = i
    for i, st in enumerate(plan.steps):
        for s in st.free:
            assert last_read.get(s, i) == i


def test_the_generated_code_deletes_each_value_at_its_last_use():
    sess = _session(_mlp())
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _mlp_expected(x, _mlp()), rtol=1e-6)
    body = [ln.strip() for ln in sess._built.plan.code.splitlines()]
    dels = [ln for ln in body if ln.startswith("del ")]
    deleted = [n.strip() for ln in dels for n in ln[4:].split(",")]
    plan = sess._built.plan
    want = sorted(f"v{s}" for st in plan.fast_steps for s in st.free)
    assert sorted(deleted) == want
    # x is read by the first and the last step: deleted right after the last one
    x_del = next(i for i, ln in enumerate(body) if ln.startswith("del ") and f"v{plan.input_slots['x']}" in ln)
    assert body[x_del - 1].startswith(f"v{plan.output_slots[0]} = ")


def test_a_value_dies_right_after_its_last_reader():
    """The generated function holds values in locals: an intermediate is released when
    the step that reads it last returns, before the next step runs."""
    alive = []
    refs = {}

    def make(x):
        y = x + 1
        refs["y"] = weakref.ref(y)
        return y

    def read(y):
        return y * 2

    def check(z):
        gc.collect()
        alive.append(refs["y"]() is not None)
        return z - 1

    plan = _chain_plan(make, read, check)
    np.testing.assert_array_equal(plan.run({"x": np.zeros(3)})[0], [1, 1, 1])
    assert alive == [False]


def test_absent_optional_inputs_read_none_and_unused_outputs_are_dropped():
    seen = []

    class Two(Kernel):
        def run(self, a, b=None):
            seen.append(b)
            return a + 1, a + 2

    b = PlanBuilder(HostDevice(), CAP)
    b.add_input("x")
    b.add_step(Two(_node("Two")).run, ["x", ""], ["", "y"], b.host, "two", "Two", "TestProvider")
    plan = b.build(["y"])
    assert plan.run({"x": np.zeros(2)})[0].tolist() == [2, 2]
    assert seen == [None]
    assert "_" in plan.code and "del _" in plan.code


def test_constants_are_globals_of_the_code_and_overridable_ones_inputs():
    b = PlanBuilder(HostDevice(), CAP)
    b.add_input("x")
    b.add_constant("c", np.array([10.0]), overridable=False)
    b.add_constant("o", np.array([100.0]), overridable=True)
    k1, k2 = _kernel(np.add, name="a1"), _kernel(np.add, name="a2")
    b.add_step(k1.run, ["x", "c"], ["t"], b.host, "a1", "Add", "TestProvider")
    b.add_step(k2.run, ["t", "o"], ["y"], b.host, "a2", "Add", "TestProvider")
    plan = b.build(["y"])
    assert plan.run({"x": np.ones(1)})[0].tolist() == [111.0]
    assert plan.run({"x": np.ones(1), "o": np.array([0.0])})[0].tolist() == [11.0]
    assert "feeds.get('o', c" in plan.code


def test_copies_between_a_device_and_the_host(fake_provider):
    from ..fakes import FakeDevice

    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Add", ["r", "x"], ["a"], name="add"),
         helper.make_node("Softmax", ["a"], ["y"], name="softmax")],
        [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=["fake", "CPUExecutionProvider"])
    plan = sess._built.plan
    copies = [(st.op_type, st.node_name) for st in plan.steps if st.is_copy]
    assert copies == [("MemcpyFromHost", "copy:x"), ("MemcpyToHost", "copy:a")]
    FakeDevice.to_host_count = FakeDevice.from_host_count = 0
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    a = np.maximum(x, 0) + x
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert (FakeDevice.from_host_count, FakeDevice.to_host_count) == (1, 1)
    # a copy step is one call of the device's transfer, like any other step
    assert plan.code.count(" = cp") == 2


def test_device_run_scopes_are_entered_around_each_run():
    events = []

    class Scoped(HostDevice):
        kind = "scoped"

        def run_scope(self):
            from contextlib import contextmanager

            @contextmanager
            def scope():
                events.append("enter")
                yield
                events.append("exit")

            return scope()

    dev = Scoped()
    b = PlanBuilder(HostDevice(), CAP)
    b.add_input("x")
    b.add_step(_kernel(lambda x: events.append("step") or x).run, ["x"], ["y"], dev, "n", "Op", "TestProvider")
    plan = b.build(["y"])
    plan.run({"x": np.ones(1)})
    assert events == ["enter", "step", "exit"]


# -- the generated code --------------------------------------------------------------------


def test_the_code_is_one_line_per_step_over_locals():
    sess = _session(_mlp(), graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    plan = sess._built.plan
    code = plan.code
    assert code.startswith("def run(feeds, outer=None, ctx=None):")
    calls = [ln.strip() for ln in code.splitlines() if ln.strip().startswith(("v", "if type("))
             and "feeds.get" not in ln]
    assert len(calls) == len(plan.fast_steps) == 4
    # MatMul is a class kernel: its run, its outputs in a tuple; Relu, Neg and Add of
    # static types and shapes are the kernels' direct numpy calls
    assert calls[0].endswith("[0]") and calls[0].startswith("v")
    assert calls[1].startswith("v") and "d1(" in calls[1]
    assert "d2(" in calls[2] and "d3(" in calls[3]
    assert plan.run.__globals__["d2"] is np.negative
    assert plan.run.__globals__["d3"] is np.add


def test_function_kernels_are_called_directly_and_their_results_normalised():
    reg = KernelRegistry()

    @reg.op("Scalar", since=1, domain="t")
    def scalar(k, x, *, scale=1.0):
        return np.float32(x.sum() * scale)  # a numpy scalar: the output is a 0-d array

    @reg.op("Pair", since=1, domain="t")
    def pair(k, x):
        return x, x * 2

    @reg.op("Lone", since=1, domain="t")
    def lone(k, x):
        return (x,)  # one value for a node with two outputs: the second is None

    def kernel(op, **attrs):
        return reg.create(NodeInfo(name=op.lower(), op_type=op, domain="t", attrs=attrs))

    b = PlanBuilder(HostDevice(), CAP)
    b.add_input("x")
    b.add_step(kernel("Scalar", scale=2.0).run, ["x"], ["s"], b.host, "scalar", "Scalar", "T")
    b.add_step(kernel("Pair").run, ["x"], ["p", "q"], b.host, "pair", "Pair", "T")
    b.add_step(kernel("Lone").run, ["x"], ["l", "m"], b.host, "lone", "Lone", "T")
    plan = b.build(["s", "p", "q", "l", "m"])
    s, p, q, l, m = plan.run({"x": np.arange(3, dtype=np.float32)})
    assert type(s) is np.ndarray and s.shape == () and s == 6
    assert p.tolist() == [0, 1, 2] and q.tolist() == [0, 2, 4] and l.tolist() == [0, 1, 2] and m is None
    code = plan.code
    assert "scale=w0_0" in code and "is not nd: " in code
    assert plan.run.__globals__["f0"] is scalar


def test_a_kernels_direct_call_replaces_its_run():
    runs = []

    class Shift(Kernel):
        def run(self, x, y):
            runs.append(1)
            return (x + y + 1,)

        def direct_call(self):
            return DirectCall(np.add, args=(np.float64(1),), inputs=(0,))

    b = PlanBuilder(HostDevice(), CAP)
    b.add_input("x")
    b.add_input("unused")
    b.add_step(Shift(_node("Shift")).run, ["x", "unused"], ["y"], b.host, "s", "Shift", "T")
    plan = b.build(["y"])
    assert plan.run({"x": np.array([1.0]), "unused": np.array([5.0])})[0].tolist() == [2.0]
    assert runs == [] and "d0(v2, a0_0)" in plan.code


def test_direct_is_for_function_kernels_only():
    reg = KernelRegistry()
    with pytest.raises(TypeError, match="direct_call"):
        @reg.op("X", since=1, direct=lambda k: None)
        class X(Kernel):
            pass


def test_function_kernel_outputs_fit_the_node():
    assert FunctionKernel.outputs((np.float32(1), 2), 3)[2] is None
    assert type(FunctionKernel.outputs(np.float64(1), 1)[0]) is np.ndarray
    assert FunctionKernel.first_output(()) is None


def test_a_traceback_shows_the_generated_line_and_the_error_names_the_step():
    def boom(x):
        raise RuntimeError("the kernel broke")

    plan = _chain_plan(lambda x: x + 1, boom, lambda x: x)
    with pytest.raises(ort.Fail, match="running Op node 'n1' on TestProvider: RuntimeError: the kernel broke") as e:
        plan.run({"x": np.zeros(1)})
    text = "".join(traceback.format_exception(e.value))
    assert "<onnxrt plan #" in text
    line = next(ln.strip() for ln in plan.code.splitlines() if "k1(" in ln)
    assert line in text  # the generated line is shown, as for any source file
    assert isinstance(e.value.__cause__, RuntimeError)
    linecache.clearcache()  # the source comes back through the code's loader
    assert line in "".join(traceback.format_exception(e.value))


@pytest.mark.parametrize("exc, typ, match", [
    (IndexError("index 5 is out of bounds"), ort.InvalidArgument, "running Op node 'n0' on TestProvider: IndexError"),
    (MemoryError("cannot allocate"), ort.Fail, "out of memory running Op node 'n0' on TestProvider"),
    (ort.InvalidArgument("bad value"), ort.InvalidArgument, "node 'n0'.*InvalidArgument: bad value"),
    (ZeroDivisionError("division by zero"), ort.Fail, "ZeroDivisionError"),
])
def test_errors_keep_their_types(exc, typ, match):
    def fail(x):
        raise exc

    with pytest.raises(typ, match=match) as e:
        _chain_plan(fail).run({"x": np.zeros(1)})
    assert not isinstance(e.value, MemoryError)


def test_errors_already_naming_the_node_pass_unchanged():
    err = ort.Fail("node 'n0' could not do it")

    def fail(x):
        raise err

    with pytest.raises(ort.Fail) as e:
        _chain_plan(fail).run({"x": np.zeros(1)})
    assert e.value is err


def test_a_missing_outer_value_is_not_blamed_on_a_step():
    b = PlanBuilder(HostDevice(), CAP)
    b.add_outer("o")
    b.add_step(_kernel(lambda o: o).run, ["o"], ["y"], b.host, "n", "Op", "T")
    plan = b.build(["y"])
    assert plan.run({}, {"o": np.ones(1)})[0].tolist() == [1.0]
    with pytest.raises(KeyError):
        plan.run({}, {"other": 1})


def test_the_allocation_cap_and_the_error_state_hold_inside_a_run():
    seen = {}

    def probe(x):
        seen["cap"] = allocation_limit()
        seen["err"] = np.geterr()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return np.float32(1) / x  # division by zero: inf, no warning

    b = PlanBuilder(HostDevice(), 12345)
    b.add_input("x")
    b.add_step(_kernel(probe).run, ["x"], ["y"], b.host, "n", "Op", "T")
    before = (np.geterr(), allocation_limit())
    with np.errstate(divide="raise"):
        y = b.build(["y"]).run({"x": np.zeros(1, np.float32)})[0]
        assert np.geterr()["divide"] == "raise"  # the caller's state, back after the run
    assert np.isinf(y).all() and seen["cap"] == 12345
    assert set(seen["err"].values()) == {"ignore"}
    assert (np.geterr(), allocation_limit()) == before


# -- checked runs: termination and profiling ---------------------------------------------------


def test_terminate_stops_before_the_next_node():
    ro = ort.RunOptions()
    ran = []

    def stop(x):
        if not ran:
            ro.terminate = True  # on the first run only
        ran.append(0)
        return x

    plan = _chain_plan(stop, lambda x: ran.append(1) or x)
    with pytest.raises(ort.RuntimeException, match="terminated.*before node 'n1'"):
        plan.run({"x": np.zeros(1)}, None, RunContext(ro))
    assert ran == [0]
    ro.terminate = False
    assert plan.run({"x": np.zeros(1)}, None, RunContext(ro))[0].tolist() == [0]
    assert ran == [0, 0, 1]
    assert "ro.terminate" in plan.checked_code and "ro." not in plan.code


def test_profiled_runs_record_every_node_shape_computations_included(tmp_path):
    model = make_model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("Concat", ["s", "one"], ["t"], axis=0, name="concat"),
         helper.make_node("Reshape", ["x", "t"], ["y"], name="reshape")],
        [helper.make_tensor_value_info("x", F, ["A", 2])], [helper.make_tensor_value_info("y", F, None)],
        [helper.make_tensor("one", TensorProto.INT64, [1], [1])],
    )
    sess = _session(model, enable_profiling=True, profile_file_prefix=str(tmp_path / "p"))
    plan = sess._built.plan
    assert [st.op_type for st in plan.fast_steps] == ["ShapeSegment", "Reshape"]
    for _ in range(2):
        assert sess.run(None, {"x": np.ones((3, 2), np.float32)})[0].shape == (3, 2, 1)
    events = json.loads(Path(sess.end_profiling()).read_text())
    names = [e["args"]["node_name"] for e in events if e.get("cat") == "Node"]
    assert names == ["shape", "concat", "reshape"] * 2
    assert "prof.node_event" in plan.checked_code


# -- subgraphs and threads ---------------------------------------------------------------------


def _loop_model(body_nodes):
    body = helper.make_graph(
        body_nodes + [helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, [1])],
    )
    return make_model(
        [helper.make_node("Loop", ["n", "", "v0"], ["v"], body=body, name="loop")],
        [helper.make_tensor_value_info("n", TensorProto.INT64, []), helper.make_tensor_value_info("v0", F, [1]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("v", F, [1])],
    )


def test_subgraph_bodies_run_as_generated_code_of_their_own():
    model = _loop_model([helper.make_node("Add", ["v_in", "v_in"], ["v_out"], name="double")])
    model.graph.input.pop()  # no k
    sess = _session(model)
    out = sess.run(None, {"n": np.array(5, np.int64), "v0": np.ones(1, np.float32)})[0]
    assert out.tolist() == [32.0]
    (loop,) = sess._built.plan.steps
    body = loop.fn.__self__.attrs["body"].plan
    assert isinstance(body, Plan) and "def run(feeds" in body.code
    assert re.search(r"v\d+ = d0\((v\d+), \1\)", body.code)  # the body's Add: its direct call


def test_an_error_in_a_body_names_the_body_node_with_its_generated_line():
    model = _loop_model([helper.make_node("Gather", ["v_in", "k"], ["v_out"], name="pick")])
    model.graph.input[2].type.tensor_type.shape.dim.add().dim_value = 1  # k: [1]
    sess = _session(model)
    feeds = {"n": np.array(2, np.int64), "v0": np.ones(1, np.float32), "k": np.array([3], np.int64)}
    with pytest.raises(ort.InvalidArgument, match="Gather node 'pick'") as e:
        sess.run(None, feeds)
    text = "".join(traceback.format_exception(e.value))
    assert text.count("<onnxrt plan #") >= 2  # the main graph's run and the body's
    # the Loop reads k from the outer scope: passed with the run's context
    assert "outer={'k': v" in sess._built.plan.code and "ctx=ctx" in sess._built.plan.code
    feeds["k"] = np.array([0], np.int64)
    assert sess.run(None, feeds)[0].tolist() == [1.0]


def test_terminate_reaches_into_a_loop_body():
    model = _loop_model([helper.make_node("Add", ["v_in", "v_in"], ["v_out"], name="double")])
    model.graph.input.pop()
    sess = _session(model)
    ro = ort.RunOptions()
    ro.terminate = True
    with pytest.raises(ort.RuntimeException, match="terminate"):
        sess.run(None, {"n": np.array(10**9, np.int64), "v0": np.ones(1, np.float32)}, ro)


def test_threads_running_one_plan_get_their_own_results_and_one_generated_function():
    sess = _session(_mlp())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(16)]
    want = [_mlp_expected(x, _mlp()) for x in xs]
    start = threading.Barrier(8)
    errors, fns = [], set()

    def work(t):
        try:
            start.wait()
            for j in range(50):
                i = (t * 5 + j) % len(xs)
                np.testing.assert_allclose(sess.run(None, {"x": xs[i]})[0], want[i], rtol=1e-5, atol=1e-6)
            fns.add(id(sess._built.plan.run))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(fns) == 1


def test_the_session_shows_the_code_of_its_runs():
    sess = _session(_mlp())
    code = sess.get_plan_code()
    assert code == sess._built.plan.code and code.startswith("def run(feeds")
    assert "feeds.get('x')" in code


# -- the CPU kernels' direct calls ---------------------------------------------------------------


@pytest.mark.parametrize("op, dtype, shape", [
    ("Neg", np.float32, [3]), ("Neg", np.float32, []), ("Neg", np.int64, ["N"]), ("Neg", np.float16, [2]),
    ("Abs", np.int32, [2, 2]), ("Sqrt", np.float64, []), ("Exp", np.float32, [4]), ("Floor", np.float32, [2]),
    ("Relu", np.float32, [3]), ("Relu", np.float32, []), ("Relu", np.int8, [2, 3]), ("Relu", np.float32, [2048]),
    ("Tanh", np.float64, [3]),
])
def test_unary_direct_calls_give_what_run_gives(op, dtype, shape):
    model = make_model([helper.make_node(op, ["x"], ["y"], name="n")],
                       [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)],
                       [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)])
    sess = _session(model)
    rng = np.random.default_rng(0)
    concrete = [3 if d == "N" else d for d in shape]
    x = (rng.standard_normal(concrete) * 4).astype(dtype)
    if op == "Sqrt":
        x = np.abs(x)
    (y,) = sess.run(None, {"x": x})
    kernel = next(st.fn.__self__ for st in sess._built.plan.steps if st.op_type == op)
    want = FunctionKernel.first_output(type(kernel).fn(kernel, x))  # what run computes
    if dtype == np.float16:
        want = np.negative(x)  # (the CPU provider may compute a float16 node in float32)
    assert type(y) is np.ndarray and y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)
    dt = kernel.node.input_dtype(0)
    # narrow floats compute through float32 in run; Relu of 2048 values takes the clip pass
    assert (kernel.direct_call() is None) == (dt is None or dt == np.float16 or shape == [2048])


@pytest.mark.parametrize("op, dtype, shapes, direct", [
    ("Add", np.float32, ([2, 3], [2, 3]), True),
    ("Mul", np.int64, (["N"], ["N"]), True),
    ("Sub", np.float32, ([], []), True),
    ("Div", np.float32, ([3], [3]), True),
    ("Div", np.int32, ([3], [3]), False),  # integer division truncates: the kernel's own
    ("Add", np.float32, ([2, 3], [3]), False),  # a broadcast: the kernel's row pass and cap check
    ("Mul", np.float32, (["N", 3], [None, 3]), False),  # an unknown dimension
])
def test_binary_direct_calls_give_what_run_gives(op, dtype, shapes, direct):
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model([helper.make_node(op, ["a", "b"], ["y"], name="n")],
                       [helper.make_tensor_value_info("a", t, shapes[0]),
                        helper.make_tensor_value_info("b", t, shapes[1])],
                       [helper.make_tensor_value_info("y", t, None)])
    sess = _session(model)
    rng = np.random.default_rng(1)
    a, b = (np.asarray(rng.standard_normal([2 if d in ("N", None) else d for d in s]) * 5 + 7).astype(dtype)
            for s in shapes)
    b[b == 0] = 3
    (y,) = sess.run(None, {"a": a, "b": b})
    step = next(st for st in sess._built.plan.steps if st.op_type == op)
    want = step.fn(a, b)[0]
    assert type(y) is np.ndarray and y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)
    assert (step.fn.__self__.direct_call() is not None) == direct


@pytest.mark.parametrize("in_shape, target, direct", [
    ([2, 6], [3, 4], True), ([2, 6], [-1], True), ([2, 6], [0, 3, 2], False), (["N", 6], [-1, 3], False),
])
def test_reshape_direct_call_only_where_it_cannot_fail(in_shape, target, direct):
    model = make_model([helper.make_node("Reshape", ["x", "t"], ["y"], name="r")],
                       [helper.make_tensor_value_info("x", F, in_shape)], [helper.make_tensor_value_info("y", F, None)],
                       [helper.make_tensor("t", TensorProto.INT64, [len(target)], target)])
    sess = _session(model, graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = sess.run(None, {"x": x})
    want = x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(target)])
    np.testing.assert_array_equal(y, want)
    kernel = next(st.fn.__self__ for st in sess._built.plan.steps if st.op_type == "Reshape")
    assert (kernel.direct_call() is not None) == direct


def test_a_failing_direct_call_leaves_the_kernels_run(caplog):
    class Broken(Kernel):
        def run(self, x):
            return (x + 1,)

        def direct_call(self):
            raise RuntimeError("no shortcut here")

    b = PlanBuilder(HostDevice(), CAP)
    b.add_input("x")
    b.add_step(Broken(_node("Broken")).run, ["x"], ["y"], b.host, "b", "Broken", "T")
    plan = b.build(["y"])
    with caplog.at_level("WARNING", logger="onnxrt"):
        assert plan.run({"x": np.zeros(1)})[0].tolist() == [1.0]
    assert "direct_call failed" in caplog.text and "k0(v2)[0]" in plan.code
