"""Shared checks of the OpenCL compute kernels (imported by ``test_kernels_*.py``).

* :func:`node_cases` picks the ONNX node tests of some ops whose graph holds only
  those ops, and :func:`check_node_case` runs one on OpenCL (CPU fallback allowed),
  asserting the expected outputs and, through ``get_provider_assignment``, that
  each of those nodes ran on OpenCL unless the case is a listed fallback.
* :func:`compare_with_cpu` runs one model on OpenCL and on the CPU provider and
  compares every output.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxrt as ort
import pytest
from onnxrt.testing.outputs import assert_outputs_close
from onnxrt.testing.nodetests import _decode, iter_node_tests

OCL = "OpenCLExecutionProvider"
CPU = "CPUExecutionProvider"


def skip_without_opencl():
    """A module-level ``pytestmark`` that skips when the OpenCL provider cannot run."""
    pytest.importorskip("onnxrt_opencl")
    from onnxrt_opencl import OpenCLExecutionProvider

    reason = OpenCLExecutionProvider.is_available()
    return pytest.mark.skipif(reason is not None, reason=f"OpenCLExecutionProvider unavailable: {reason}")


def has_fp64() -> bool:
    """Whether the default OpenCL device computes in float64 (kernels then take float64 nodes)."""
    from onnxrt_opencl.runtime import get_runtime

    return get_runtime().has_fp64


def node_cases(ops: set[str]) -> list:
    """``pytest.param`` for every node test whose graph uses only ``ops`` (id: the test name)."""
    out = []
    for case in iter_node_tests(sorted(ops)):
        if all(n.op_type in ops and not n.domain for n in case.model.graph.node):
            out.append(pytest.param(case, id=case.name))
    return out


def check_node_case(case, ops: set[str], fallbacks: dict[str, str]) -> None:
    """Run ``case`` on OpenCL first; check outputs and where each node ran.

    :param fallbacks: case name -> a word the refusal reason must contain, for the
        cases the OpenCL kernels refuse (they must then run on the CPU). float64
        cases fall back on devices without float64, as the provider says.
    """
    sess = ort.InferenceSession(case.model, providers=[OCL, CPU])
    fallbacks = dict(fallbacks)
    elem = case.model.graph.input[0].type.tensor_type.elem_type if case.model.graph.input else 0
    if elem == onnx.TensorProto.DOUBLE and not has_fp64():
        fallbacks.setdefault(case.name, "float64")
    expect_cl = case.name not in fallbacks
    for row in sess.get_provider_assignment():
        if row["op_type"] not in ops:
            continue
        if expect_cl:
            assert row["provider"] == OCL, f"{case.name}: {row['op_type']} ran on {row['provider']}: {row['reason']}"
        else:
            assert row["provider"] == CPU, f"{case.name}: {row['op_type']} was expected to fall back"
            assert fallbacks[case.name] in row["reason"], row["reason"]
    inits = {t.name for t in case.model.graph.initializer}
    feed_names = [vi.name for vi in case.model.graph.input if vi.name not in inits]
    for inputs, expected in case.data_sets:
        got = sess.run(None, dict(zip(feed_names, [_decode(x) for x in inputs])))
        assert len(got) == len(expected)
        for vi, e, g in zip(case.model.graph.output, expected, got):
            assert_outputs_close(_decode(e), g, case.rtol, case.atol, f"{case.name}:{vi.name}")


def compare_with_cpu(model: onnx.ModelProto, feeds: dict, rtol=1e-4, atol=1e-4, expect_ops=None) -> list:
    """Run ``model`` on OpenCL and on the CPU; assert equal outputs; return the OpenCL ones.

    :param expect_ops: op types that must have run on OpenCL (default: every node).
    """
    cl = ort.InferenceSession(model, providers=[OCL, CPU])
    for row in cl.get_provider_assignment():
        if expect_ops is None or row["op_type"] in expect_ops:
            assert row["provider"] == OCL, f"{row['op_type']} ran on {row['provider']}: {row['reason']}"
    ref = ort.InferenceSession(model, providers=[CPU]).run(None, feeds)
    got = cl.run(None, feeds)
    for r, g in zip(ref, got):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    return got
