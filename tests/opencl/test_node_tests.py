"""Every op the OpenCL provider claims passes that op's ONNX node tests *on OpenCL*.

For each node test whose graph uses only claimed ops, the session must put every node
on the OpenCL provider and match the expected outputs. A node the provider refuses
(an unsupported dtype or attribute, recorded with its reason) skips that case; the
summary test bounds how many are refused, so a pass here means the device computed it.
"""

import warnings

import numpy as np
import pytest

import onnxrt as ort
from onnxrt.testing import NodeRefused, provider_node_tests, run_provider_node_test

pytest.importorskip("onnxrt_opencl")
from onnxrt_opencl import OpenCLExecutionProvider  # noqa: E402

OCL = "OpenCLExecutionProvider"
REASON = OpenCLExecutionProvider.is_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"OpenCL unavailable: {REASON}")
CASES = provider_node_tests(OCL) if REASON is None else []
#: at least this share of the claimed-op node tests must run wholly on OpenCL
MIN_ON_DEVICE = 0.75


def _options():
    so = ort.SessionOptions()
    # keep each test's nodes as they are, so the op under test is what runs
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_claimed_op_runs_on_opencl(case):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            run_provider_node_test(case, OCL, _options())
        except NodeRefused as e:
            pytest.skip(f"refused with a reason: {e}")


def test_most_claimed_op_tests_really_run_on_opencl():
    ran, refused = [], {}
    for case in CASES:
        sess = ort.InferenceSession(case.model, _options(), providers=[OCL, "CPUExecutionProvider"])
        off = [a for a in sess.get_provider_assignment() if a["provider"] != OCL]
        if off:
            assert all(a["reason"] for a in off), f"{case.name}: refused without a reason"
            refused[case.name] = off[0]["reason"]
        else:
            ran.append(case.name)
    assert len(CASES) >= 300
    share = len(ran) / len(CASES)
    assert share >= MIN_ON_DEVICE, f"only {len(ran)}/{len(CASES)} ran on OpenCL; refused: {refused}"
