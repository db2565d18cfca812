"""Bernoulli, whose conformance tests can only match by chance, checked by its
statistics instead: outputs are 0 or 1 of the requested type, certain probabilities
give certain outcomes, and the mean follows the probabilities."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort


def _bernoulli(shape, **attrs):
    out_type = attrs.get("dtype", TensorProto.DOUBLE)
    g = helper.make_graph([helper.make_node("Bernoulli", ["p"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("p", TensorProto.DOUBLE, list(shape))],
                          [helper.make_tensor_value_info("y", out_type, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("dtype,np_type", [(None, np.float64), (TensorProto.FLOAT, np.float32),
                                           (TensorProto.INT32, np.int32), (TensorProto.BOOL, np.bool_)])
def test_bernoulli_outcomes_follow_the_probabilities(dtype, np_type):
    n = 40_000
    p = np.random.default_rng(0).uniform(0, 1, n)
    p[:100], p[100:200] = 0.0, 1.0
    sess = _bernoulli((n,), **({} if dtype is None else {"dtype": dtype}))
    (y,) = sess.run(None, {"p": p})
    assert y.dtype == np.dtype(np_type) and y.shape == (n,)
    v = y.astype(np.float64)
    assert set(np.unique(v)) <= {0.0, 1.0}
    assert not v[:100].any() and v[100:200].all()
    # the number of ones is a sum of independent Bernoulli variables: within 5 sigma
    sigma = np.sqrt(np.sum(p * (1 - p)))
    assert abs(v.sum() - p.sum()) < 5 * sigma
    # and the ones fall where the probabilities are high
    assert v[p > 0.9].mean() > 0.85 and v[(p < 0.1) & (p > 0)].mean() < 0.15


def test_bernoulli_with_a_seed_repeats_in_a_new_session():
    p = np.random.default_rng(1).uniform(0, 1, 1000)
    a = _bernoulli((1000,), seed=5.0).run(None, {"p": p})[0]
    b = _bernoulli((1000,), seed=5.0).run(None, {"p": p})[0]
    np.testing.assert_array_equal(a, b)


def test_bernoulli_rejects_probabilities_outside_zero_one():
    with pytest.raises(ort.Fail, match="probabilities must lie in"):
        _bernoulli((3,)).run(None, {"p": np.array([0.2, 1.5, 0.1])})
