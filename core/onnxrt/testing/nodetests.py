"""The ONNX conformance node tests (``onnx.backend.test.case.node``), run through sessions."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator

import onnx

from .compare import assert_outputs_close

__all__ = ["NodeTest", "iter_node_tests", "run_node_test"]


@dataclass
class NodeTest:
    """One node test: a model, its input/output sets and tolerances."""

    name: str
    model: onnx.ModelProto
    data_sets: list
    rtol: float
    atol: float

    @property
    def ops(self) -> set[tuple[str, str]]:
        """The (domain, op_type) pairs the model's main graph uses."""
        return {(n.domain or "", n.op_type) for n in self.model.graph.node}


@functools.lru_cache(maxsize=1)
def _all_cases() -> tuple[NodeTest, ...]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return tuple(NodeTest(c.name, c.model, c.data_sets, c.rtol, c.atol) for c in cases)


def iter_node_tests(ops: Iterable[str | tuple[str, str]] | None = None) -> Iterator[NodeTest]:
    """Every node test, or those whose graph uses one of ``ops`` (names or (domain, op))."""
    want = None
    if ops is not None:
        want = {o if isinstance(o, tuple) else ("", o) for o in ops}
    for c in _all_cases():
        if want is None or c.ops & want:
            yield c


def run_node_test(case: NodeTest, providers=None, sess_options=None) -> None:
    """Run ``case`` through an ``InferenceSession`` and assert its expected outputs."""
    from ..session import InferenceSession

    sess = InferenceSession(case.model, sess_options=sess_options, providers=providers)
    names = [vi.name for vi in case.model.graph.input]
    inits = {t.name for t in case.model.graph.initializer}
    feed_names = [n for n in names if n not in inits]
    for inputs, expected in case.data_sets:
        inputs = [_decode(x) for x in inputs]
        expected = [_decode(x) for x in expected]
        feeds = dict(zip(feed_names, inputs))
        got = sess.run(None, feeds)
        assert len(got) == len(expected), f"{case.name}: {len(got)} outputs, expected {len(expected)}"
        for vi, e, g in zip(case.model.graph.output, expected, got):
            assert_outputs_close(e, g, case.rtol, case.atol, f"{case.name}:{vi.name}")


def _decode(x):
    """Test data may hold protos (TensorProto for exotic dtypes, sequences, optionals)."""
    from onnx import numpy_helper

    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, onnx.SequenceProto):
        return numpy_helper.to_list(x)
    if isinstance(x, onnx.OptionalProto):
        return numpy_helper.to_optional(x)
    if isinstance(x, list):
        return [_decode(v) for v in x]
    return x
