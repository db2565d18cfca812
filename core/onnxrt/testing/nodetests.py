"""The ONNX conformance node tests (``onnx.backend.test.case.node``), run through sessions."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import onnx

from .outputs import assert_outputs_close

__all__ = ["NodeTest", "iter_node_tests", "run_node_test", "claimed_ops", "provider_node_tests",
           "run_provider_node_test", "NodeRefused"]


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
    _check_outputs(sess, case)


def _check_outputs(sess, case: NodeTest) -> None:
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


class NodeRefused(Exception):
    """The provider under test left a node of a node test to another provider."""


def claimed_ops(provider) -> set[tuple[str, str]]:
    """The (domain, op_type) pairs a provider's kernel registry holds.

    :param provider: a provider name, alias or :class:`~onnxrt.plugin.provider.ExecutionProvider` class.
    """
    from ..errors import InvalidArgument
    from ..plugin.discovery import provider_registry

    cls = provider if isinstance(provider, type) else provider_registry().lookup(provider)
    if cls is None:
        known = ", ".join(provider_registry().names()) or "none"
        raise InvalidArgument(f"provider {provider!r} is not installed; installed providers: {known}")
    return {(dom, op) for dom, op, _ in cls.kernel_registry().ops()}


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _case_modules(package) -> Iterator[tuple[str, Path | None]]:
    """(module name, source path) of every node-test case module, subpackages included."""
    for mod in pkgutil.iter_modules(package.__path__):
        full = f"{package.__name__}.{mod.name}"
        if mod.ispkg:
            yield from _case_modules(importlib.import_module(full))
        else:
            path = Path(package.__path__[0]) / f"{mod.name}.py"
            yield full, path if path.is_file() else None


def _cases_naming(op_types: set[str]) -> list[NodeTest]:
    """The node tests of the case modules that can hold a test made of ``op_types`` only.

    Generating every node test takes seconds; a provider claiming a few ops needs only
    the modules whose source names one of them, plus those of ops with a function body
    (their ``_expanded`` tests use the body's ops, which the module need not name).
    Cases generated earlier are included too; callers filter by ops.
    """
    import onnx.backend.test.case.node as pkg

    if _all_cases.cache_info().currsize:
        return list(_all_cases())
    wanted = set(op_types) | _function_ops()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, path in _case_modules(pkg):
            if path is None or wanted & set(_WORD.findall(path.read_text(encoding="utf-8"))):
                importlib.import_module(name)
    return [NodeTest(c.name, c.model, c.data_sets, c.rtol, c.atol) for c in pkg._NodeTestCases]


@functools.lru_cache(maxsize=1)
def _function_ops() -> frozenset[str]:
    return frozenset(s.name for s in onnx.defs.get_all_schemas_with_history()
                     if s.has_function or s.has_context_dependent_function)


def provider_node_tests(provider, ops: Iterable[str | tuple[str, str]] | None = None) -> list[NodeTest]:
    """The node tests whose graph uses only ops ``provider`` claims (or only ``ops``)."""
    if ops is None:
        want = claimed_ops(provider)
    else:
        want = {o if isinstance(o, tuple) else ("", o) for o in ops}
    cases = _cases_naming({op for _, op in want})
    seen: set[str] = set()
    out = []
    for c in cases:
        if c.ops and c.ops <= want and c.name not in seen:
            seen.add(c.name)
            out.append(c)
    return out


def run_provider_node_test(case: NodeTest, provider, sess_options=None) -> None:
    """Run ``case`` with ``provider`` first and the CPU as fallback; assert its outputs.

    :raises NodeRefused: when ``provider`` did not run every node itself (the message
        gives the provider's reason), so a pass always means the provider computed it.
    """
    from ..session import InferenceSession

    # the session appends the CPU provider itself (and a CPU under test is not listed twice)
    sess = InferenceSession(case.model, sess_options=sess_options, providers=[provider])
    name = sess.get_providers()[0]
    refused = [d for d in sess.get_provider_assignment() if d["provider"] != name]
    if refused:
        d = refused[0]
        raise NodeRefused(f"{name} does not take {d['op_type']} node {d['node']!r}: {d['reason']}")
    _check_outputs(sess, case)


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
