"""The ONNX conformance node tests, through the session, for every available provider.

Each available provider runs with the CPU provider as its fallback, at
``ORT_DISABLE_ALL`` and ``ORT_ENABLE_ALL``. Exclusions are strict expected failures,
each with its reason (``exclusions.py``), except random outputs that can match by chance.
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
