"""Faults: a kernel that raises, runs out of memory, a provider that cannot start, and a
run stopped from another thread. Each is a typed error, and the session keeps working."""

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt import hookimpl
from onnxrt.plugin.kernel import Kernel, KernelRegistry
from onnxrt.plugin.provider import ExecutionProvider

from ..conftest import make_model

F = TensorProto.FLOAT
DOMAIN = "test.faults"


def _registry():
    reg = KernelRegistry()

    @reg.op("Fault", since=1, domain=DOMAIN)
    class Fault(Kernel):
        """Doubles its input; a first element of 1, 2 or 3 makes it fail in one of three ways."""

        def run(self, x):
            code = int(x.reshape(-1)[0])
            if code == 1:
                raise RuntimeError("the kernel broke")
            if code == 2:
                raise MemoryError("cannot allocate")
            if code == 3:
                raise ZeroDivisionError("division by zero")
            return (x * 2,)

    return reg


class FaultyProvider(ExecutionProvider):
    """Runs the Fault op on the host."""

    name = "FaultyExecutionProvider"
    aliases = ("faulty",)
    priority = 60

    @classmethod
    def build_registry(cls):
        return _registry()


class CannotStartProvider(ExecutionProvider):
    """Installed and 'available', but its device fails to initialize."""

    name = "CannotStartExecutionProvider"
    priority = 70

    def create_device(self):
        raise RuntimeError("device 0 is wedged")


class UnavailableProvider(ExecutionProvider):
    """Installed but unusable here."""

    name = "UnavailableExecutionProvider"
    priority = 80

    @classmethod
    def is_available(cls):
        return "no such hardware"


class _Plugin:
    @hookimpl
    def onnxrt_register_providers(self, registry):
        registry.add_provider(FaultyProvider)
        registry.add_provider(CannotStartProvider)
        registry.add_provider(UnavailableProvider)


@pytest.fixture
def faulty():
    plugin = _Plugin()
    ort.plugin.register_plugin(plugin, name="faults")
    try:
        yield
    finally:
        ort.plugin.unregister_plugin(plugin)


def _fault_model():
    """x -> Relu -> Fault (on FaultyExecutionProvider) -> Neg -> y."""
    model = make_model(
        [helper.make_node("Abs", ["x"], ["a"], name="before"),
         helper.make_node("Fault", ["a"], ["b"], name="the_fault", domain=DOMAIN),
         helper.make_node("Neg", ["b"], ["y"], name="after")],
        [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, [3])],
    )
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model.SerializeToString()


def _x(code):
    return np.array([code, 5, -6], np.float32)


@pytest.mark.parametrize(
    "code, error, match",
    [
        (1, ort.Fail, "RuntimeError: the kernel broke"),
        (2, ort.Fail, "out of memory"),
        (3, ort.Fail, "ZeroDivisionError"),
    ],
)
def test_kernel_failure_names_node_op_and_provider_and_the_next_run_is_correct(faulty, code, error, match):
    sess = ort.InferenceSession(_fault_model(), providers=["FaultyExecutionProvider", "CPUExecutionProvider"])
    assert {d["node"]: d["provider"] for d in sess.get_provider_assignment()}["the_fault"] == "FaultyExecutionProvider"
    with pytest.raises(error, match=match) as e:
        sess.run(None, {"x": _x(code)})
    msg = str(e.value)
    assert "Fault node 'the_fault'" in msg and "FaultyExecutionProvider" in msg
    assert not isinstance(e.value, MemoryError)
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": _x(4)})[0], [-8, -10, -12])


def test_memory_error_in_a_cpu_kernel_is_typed(monkeypatch):
    model = make_model([helper.make_node("Sub", ["x", "x"], ["y"], name="sub")],
                       [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, [3])])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    class Exhausted:
        """An array namespace whose subtract cannot allocate its result."""

        def __getattr__(self, name):
            if name == "subtract":
                def subtract(*a, **k):
                    raise MemoryError("Unable to allocate 4.00 PiB")
                return subtract
            return getattr(np, name)

    (step,) = sess._built.plan.steps
    monkeypatch.setattr(type(step.fn.__self__), "xp", Exhausted(), raising=False)
    with pytest.raises(ort.Fail, match="out of memory running Sub node 'sub' on CPUExecutionProvider") as e:
        sess.run(None, {"x": np.ones(3, np.float32)})
    assert not isinstance(e.value, MemoryError)
    monkeypatch.undo()
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones(3, np.float32)})[0], [0, 0, 0])


def test_provider_that_fails_to_start_is_ep_fail(faulty):
    model = _fault_model()
    with pytest.raises(ort.EPFail, match="CannotStartExecutionProvider failed to start.*device 0 is wedged"):
        ort.InferenceSession(model, providers=["CannotStartExecutionProvider", "FaultyExecutionProvider"])


def test_unavailable_provider_is_ep_fail(faulty):
    with pytest.raises(ort.EPFail, match="UnavailableExecutionProvider.*no such hardware"):
        ort.InferenceSession(_fault_model(), providers=["UnavailableExecutionProvider", "FaultyExecutionProvider"])


def test_fallback_when_the_user_allows_it(faulty):
    so = ort.SessionOptions()
    so.allow_provider_fallback = True
    sess = ort.InferenceSession(
        _fault_model(), so,
        providers=["UnavailableExecutionProvider", "CannotStartExecutionProvider", "FaultyExecutionProvider"])
    assert sess.get_providers() == ["FaultyExecutionProvider", "CPUExecutionProvider"]
    np.testing.assert_array_equal(sess.run(None, {"x": _x(4)})[0], [-8, -10, -12])


def _long_loop_model(reads_outer=True):
    """A Loop of up to 10**9 iterations adding 1: it runs until stopped. Its body reads
    the constant 1 from the main graph, or (``reads_outer=False``) makes its own."""
    own = [] if reads_outer else [helper.make_node("Constant", [], ["one"], value_floats=[1.0])]
    body = helper.make_graph(
        own + [helper.make_node("Add", ["v_in", "one"], ["v_out"]),
               helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", F, [1])],
    )
    outer = [helper.make_node("Constant", [], ["one"], value_floats=[1.0])] if reads_outer else []
    return make_model(
        outer + [helper.make_node("Loop", ["n", "", "v0"], ["v"], body=body, name="long_loop")],
        [helper.make_tensor_value_info("n", TensorProto.INT64, []), helper.make_tensor_value_info("v0", F, [1])],
        [helper.make_tensor_value_info("v", F, [1])],
    ).SerializeToString()


@pytest.mark.parametrize("reads_outer", [True, False])
def test_terminate_from_another_thread_stops_an_in_flight_run(reads_outer):
    # a body reading nothing from outside was called without the run's context, so
    # its Loop never saw terminate
    sess = ort.InferenceSession(_long_loop_model(reads_outer))
    feed = {"n": np.array(10**9, np.int64), "v0": np.zeros(1, np.float32)}
    ro = ort.RunOptions()
    outcome = {}

    def worker():
        t0 = time.perf_counter()
        try:
            sess.run(None, feed, ro)
            outcome["result"] = "finished"
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            outcome["error"] = e
        outcome["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    time.sleep(0.3)
    assert t.is_alive(), "the run finished before it could be stopped"
    ro.terminate = True
    t.join(timeout=10)
    assert not t.is_alive(), "terminate did not stop the run"
    assert isinstance(outcome.get("error"), ort.RuntimeException), outcome
    assert "terminate" in str(outcome["error"])
    # the session is fine afterwards
    small = {"n": np.array(5, np.int64), "v0": np.zeros(1, np.float32)}
    np.testing.assert_array_equal(sess.run(None, small)[0], [5.0])
    np.testing.assert_array_equal(sess.run(None, small, ort.RunOptions())[0], [5.0])


def test_terminate_set_before_the_run_stops_it_at_once():
    sess = ort.InferenceSession(_long_loop_model())
    ro = ort.RunOptions()
    ro.terminate = True
    with pytest.raises(ort.RuntimeException, match="terminate"):
        sess.run(None, {"n": np.array(10**9, np.int64), "v0": np.zeros(1, np.float32)}, ro)
