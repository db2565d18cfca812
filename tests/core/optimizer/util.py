"""Helpers for the optimizer tests: build a session at a level, list its ops, compare
its outputs with the unoptimized session's."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxrt as ort
from onnx import TensorProto, helper, numpy_helper

ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
OFF = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
BASIC = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def session(model, level=ALL, disabled=(), fixed=None, save=None):
    """A CPU session of ``model`` (a ModelProto or path) at ``level``."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    if disabled:
        so.disabled_optimizers = list(disabled)
    for k, v in (fixed or {}).items():
        so.add_free_dimension_override_by_name(k, v)
    if save:
        so.optimized_model_filepath = str(save)
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ops(sess) -> collections.Counter:
    """``op_type`` counts (``domain:op`` outside ai.onnx) of the session's optimized graph."""
    return collections.Counter(
        (f"{n.domain}:{n.op_type}" if n.domain else n.op_type) for n in sess._built.graph.nodes)


def assert_same_outputs(model, feeds, rtol=1e-5, atol=1e-6, **kw):
    """The outputs at ORT_ENABLE_ALL equal those at ORT_DISABLE_ALL; returns the optimized session."""
    want = session(model, OFF).run(None, feeds)
    sess = session(model, ALL, **kw)
    got = sess.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return sess


def model(nodes, inputs, outputs, inits=(), opset=17):
    """A model (IR 10, so onnxruntime loads it) from helper-built parts."""
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def vi(name, shape, dtype=TensorProto.FLOAT):
    """A float (by default) tensor value info."""
    return helper.make_tensor_value_info(name, dtype, shape)


def f32(*shape, seed=0, scale=1.0):
    """Random float32 data."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
