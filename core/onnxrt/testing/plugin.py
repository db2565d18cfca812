"""onnxrt's pytest plugin: fixtures for testing execution providers.

It is opt-in: installing onnxrt does not load it into every pytest run. A project
enables it with ``-p onnxrt.testing`` (on the command line or in ``addopts``) or
``pytest_plugins = ["onnxrt.testing"]`` in its top-level ``conftest.py``; naming this
module itself works too. It imports nothing heavy until a test asks for one of its
fixtures.

Fixtures:

- ``onnxrt_node_test``: a test taking it is parametrized with every ONNX node test whose
  graph uses only ops the provider under test claims (its kernel registry), for each
  provider under test. ``onnxrt_node_test.run()`` runs the case with that provider first
  and the CPU as fallback, fails if an output is wrong, and skips, with the provider's
  reason, where the provider left a node to another provider.
- ``onnxrt_compare``: ``onnxrt_compare(model, feeds=None, providers=None, rtol=1e-4,
  atol=1e-5)`` runs a model on the provider under test and on the CPU alone, asserts
  every output agrees, and returns a :class:`onnxrt.testing.outputs.Comparison`.
- ``onnxrt_models``: the :mod:`onnxrt.testing.models` builders (``make_model``, ``node``,
  ``tensor``, ``single_op``, ``chain``, ``mlp``, ``random_feeds``).
- ``onnxrt_provider``: the name of the (first) provider under test.

The provider under test comes from, first to last: the marker
``@pytest.mark.onnxrt_provider("AcmeExecutionProvider", ops=None, xfail=None)`` on the
test or its module (several names parametrize over them), the ``--onnxrt-provider NAME``
option (repeatable), and the ``onnxrt_provider`` ini setting. ``ops`` narrows the node
tests to those ops; ``xfail`` maps node-test names to the reason they are expected to
fail (strict: a fixed one is reported).
"""

from __future__ import annotations

import pytest

MARKER = "onnxrt_provider"


def pytest_addoption(parser) -> None:
    """``--onnxrt-provider`` and the ``onnxrt_provider`` ini setting."""
    group = parser.getgroup("onnxrt", "onnxrt provider testing")
    group.addoption("--onnxrt-provider", action="append", default=[], metavar="NAME",
                    help="execution provider the onnxrt fixtures test (repeatable)")
    parser.addini(MARKER, "execution providers the onnxrt fixtures test (names or aliases)",
                  type="args", default=[])


def pytest_configure(config) -> None:
    """Declare the marker, so ``--strict-markers`` accepts it."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names, ops=None, xfail=None): execution providers the onnxrt fixtures test; "
        "ops narrows the ONNX node tests, xfail maps node-test names to reasons",
    )


def _configured(config) -> list[str]:
    return list(config.getoption("onnxrt_provider") or []) or list(config.getini(MARKER) or [])


def _marker(node_or_metafunc):
    get = getattr(node_or_metafunc, "get_closest_marker", None)
    if get is None:
        get = node_or_metafunc.definition.get_closest_marker
    return get(MARKER)


def _providers_for(metafunc) -> tuple[list[str], dict]:
    mark = _marker(metafunc)
    if mark is not None and mark.args:
        return list(mark.args), dict(mark.kwargs)
    return _configured(metafunc.config), dict(mark.kwargs) if mark is not None else {}


class ProviderNodeTest:
    """One ONNX node test bound to the provider under test; the value of ``onnxrt_node_test``."""

    def __init__(self, provider: str, case):
        self.provider = provider
        self.case = case

    @property
    def name(self) -> str:
        """The node test's name, e.g. ``test_add_bcast``."""
        return self.case.name

    def run(self, sess_options=None) -> None:
        """Run the case on the provider (CPU as fallback) and check its outputs."""
        from .nodetests import NodeRefused, run_provider_node_test

        try:
            run_provider_node_test(self.case, self.provider, sess_options=sess_options)
        except NodeRefused as e:
            pytest.skip(str(e))

    def __repr__(self) -> str:
        return f"<{self.provider} {self.case.name}>"


def pytest_generate_tests(metafunc) -> None:
    """Parametrize ``onnxrt_node_test`` with the node tests of each provider under test."""
    if "onnxrt_node_test" not in metafunc.fixturenames:
        return
    providers, opts = _providers_for(metafunc)
    if not providers:
        metafunc.parametrize("onnxrt_node_test", [pytest.param(
            None, marks=pytest.mark.skip(reason="no provider under test: use the onnxrt_provider marker, "
                                               "--onnxrt-provider NAME or the onnxrt_provider ini setting"),
        )], ids=["no-provider"])
        return
    from ..plugin.discovery import provider_registry
    from .nodetests import provider_node_tests

    xfail = dict(opts.get("xfail") or {})
    params = []
    for given in providers:
        cls = provider_registry().lookup(given)
        if cls is None:
            known = ", ".join(provider_registry().names()) or "none"
            raise pytest.Collector.CollectError(
                f"{MARKER}: provider {given!r} is not installed; installed providers: {known}")
        prov = cls.name
        cases = provider_node_tests(cls, opts.get("ops"))
        unknown = set(xfail) - {c.name for c in cases}
        if unknown:
            raise pytest.Collector.CollectError(
                f"{MARKER} xfail names node tests {prov} does not run: {', '.join(sorted(unknown))}")
        if not cases:
            raise pytest.Collector.CollectError(f"{prov}: no ONNX node test uses only the ops it claims")
        for case in cases:
            marks = [pytest.mark.xfail(reason=xfail[case.name], strict=True)] if case.name in xfail else []
            params.append(pytest.param(ProviderNodeTest(prov, case), id=f"{prov}-{case.name}", marks=marks))
    metafunc.parametrize("onnxrt_node_test", params)


@pytest.fixture
def onnxrt_provider(request) -> str:
    """The name of the provider under test (the first, when several are configured)."""
    mark = request.node.get_closest_marker(MARKER)
    names = list(mark.args) if mark is not None and mark.args else _configured(request.config)
    if not names:
        pytest.skip("no provider under test: use the onnxrt_provider marker, --onnxrt-provider NAME "
                    "or the onnxrt_provider ini setting")
    from ..plugin.discovery import provider_registry

    cls = provider_registry().lookup(names[0])
    return cls.name if cls is not None else names[0]


@pytest.fixture
def onnxrt_models():
    """The model builders of :mod:`onnxrt.testing.models`."""
    from . import models

    return models


@pytest.fixture
def onnxrt_compare(request):
    """``compare(model, feeds=None, providers=None, rtol=1e-4, atol=1e-5, seed=0)``.

    Runs ``model`` on ``providers`` (default: the provider under test) with the CPU as
    fallback, and on the CPU alone, asserts that every output agrees, and returns a
    :class:`~onnxrt.testing.outputs.Comparison` (``outputs``, ``expected``, ``feeds``,
    ``assignment``, ``session``).
    """
    from .outputs import compare_with_cpu

    def compare(model, feeds=None, providers=None, rtol=1e-4, atol=1e-5, seed=0, sess_options=None):
        if providers is None:
            providers = [request.getfixturevalue("onnxrt_provider")]
        return compare_with_cpu(model, providers, feeds=feeds, rtol=rtol, atol=atol, seed=seed,
                                sess_options=sess_options)

    return compare
