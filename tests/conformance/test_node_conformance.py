"""The ONNX conformance node tests, through the session, for every available provider.

Each available provider runs with the CPU provider as its fallback, at
``ORT_DISABLE_ALL`` and ``ORT_ENABLE_ALL``; the CPU provider also runs without its
compiled kernels. Exclusions are strict expected failures, each with its reason
(``exclusions.py``), except random outputs that can match by chance.
"""

import warnings

import numpy as np
import pytest

import onnxrt as ort
from onnxrt.testing import iter_node_tests, run_node_test

from .exclusions import CHANCE, CPU, excluded

CASES = list(iter_node_tests())
PROVIDERS = ort.get_available_providers()
LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "enable_all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
TOTAL = 1884
REQUIRED_CPU_PASSES = 1790  # 95%


def _params():
    for prov in PROVIDERS:
        skip = excluded(prov)
        for level in LEVELS:
            for case in CASES:
                marks = []
                if case.name in skip:
                    marks.append(pytest.mark.xfail(reason=skip[case.name], strict=case.name not in CHANCE))
                yield pytest.param(prov, level, case, id=f"{prov}-{level}-{case.name}", marks=marks)


@pytest.mark.parametrize("provider,level,case", list(_params()))
def test_node(provider, level, case):
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS[level]
    providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        run_node_test(case, providers, so)


def test_suite_is_complete():
    # the whole generated suite runs, not a subset
    assert len(CASES) == TOTAL


def test_cpu_meets_the_pass_target():
    # every test not excluded must pass (enforced above), so this bounds the pass count
    assert TOTAL - len(CPU) >= REQUIRED_CPU_PASSES


def _numpy_params():
    skip = excluded("CPUExecutionProvider")
    for case in CASES:
        marks = []
        if case.name in skip:
            marks.append(pytest.mark.xfail(reason=skip[case.name], strict=case.name not in CHANCE))
        yield pytest.param(case, id=f"CPUExecutionProvider-numpy-{case.name}", marks=marks)


@pytest.mark.parametrize("case", list(_numpy_params()))
@pytest.mark.usefixtures("numpy_kernels")
def test_node_on_numpy_kernels_alone(case):
    """The CPU provider without its compiled kernels (as where no C compiler built
    them) passes the same suite: every kernel's numpy path, at ORT_ENABLE_ALL."""
    so = ort.SessionOptions()
    so.graph_optimization_level = LEVELS["enable_all"]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        run_node_test(case, ["CPUExecutionProvider"], so)
