"""Level-2 attention fusion: BERT-style self-attention -> MultiHeadAttention, and
attention on one packed QKV projection -> Attention."""

import numpy as np
import onnx
import pytest
from onnx import helper

from .util import assert_same_outputs, f32, model, ops, session, vi

N = helper.make_node
B, S, D, HEADS = 2, 5, 16, 4
H = D // HEADS


def bert_attention(k_perm="0231", scale_op="Div", mask=True, probs_output=False, with_bias=True):
    """x[B,S,D] -> separate Q/K/V projections -> scaled dot-product attention -> y[B,S,D]."""
    nodes, inits = [], {"heads": np.array([0, 0, HEADS, H], np.int64), "merge": np.array([0, 0, D], np.int64)}
    for i, t in enumerate("qkv"):
        inits[f"w{t}"] = f32(D, D, seed=i, scale=0.3)
        if with_bias:
            inits[f"b{t}"] = f32(D, seed=10 + i)
            nodes += [N("MatMul", ["x", f"w{t}"], [f"{t}m"]), N("Add", [f"{t}m", f"b{t}"], [f"{t}3"])]
        else:
            nodes.append(N("MatMul", ["x", f"w{t}"], [f"{t}3"]))
        nodes.append(N("Reshape", [f"{t}3", "heads"], [f"{t}r"]))
    nodes += [N("Transpose", ["qr"], ["q4"], perm=[0, 2, 1, 3]), N("Transpose", ["vr"], ["v4"], perm=[0, 2, 1, 3])]
    if k_perm == "0231":
        nodes.append(N("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1]))
    else:
        nodes += [N("Transpose", ["kr"], ["k4"], perm=[0, 2, 1, 3]), N("Transpose", ["k4"], ["kt"], perm=[0, 1, 3, 2])]
    nodes.append(N("MatMul", ["q4", "kt"], ["qk"]))
    if scale_op == "Div":
        inits["c"] = np.float32(np.sqrt(H))
        nodes.append(N("Div", ["qk", "c"], ["sc"]))
    else:
        inits["c"] = np.float32(1 / np.sqrt(H))
        nodes.append(N("Mul", ["c", "qk"], ["sc"]))
    inputs = [vi("x", [B, S, D])]
    if mask:
        inputs.append(vi("mask", [B, 1, 1, S]))
        nodes.append(N("Add", ["sc", "mask"], ["sm_in"]))
    nodes += [N("Softmax", ["sm_in" if mask else "sc"], ["p"], axis=-1), N("MatMul", ["p", "v4"], ["ctx4"]),
              N("Transpose", ["ctx4"], ["ctx"], perm=[0, 2, 1, 3]), N("Reshape", ["ctx", "merge"], ["y"])]
    outputs = [vi("y", [B, S, D])] + ([vi("p", None)] if probs_output else [])
    return model(nodes, inputs, outputs, inits)


def feeds(mask=True):
    out = {"x": f32(B, S, D, seed=7)}
    if mask:
        m = np.zeros((B, 1, 1, S), np.float32)
        m[1, ..., 3:] = -10000.0
        out["mask"] = m
    return out


@pytest.mark.parametrize("k_perm", ["0231", "0213+swap"])
@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_bert_self_attention_becomes_multi_head_attention(k_perm, scale_op):
    m = bert_attention(k_perm, scale_op)
    sess = assert_same_outputs(m, feeds(), atol=1e-5)
    found = ops(sess)
    assert found["com.microsoft:MultiHeadAttention"] == 1 and found["MatMul"] == 3
    assert "Softmax" not in found and "Transpose" not in found and "Add" not in found  # biases went in too
    mha = next(n for n in sess._built.graph.nodes if n.op_type == "MultiHeadAttention")
    assert mha.attr("num_heads") == HEADS and mha.attr("scale") == pytest.approx(1 / np.sqrt(H))
    assert ops(session(m, disabled=["attention_fusion"]))["Softmax"] == 1


def test_attention_without_mask_or_biases():
    m = bert_attention(mask=False, with_bias=False)
    sess = assert_same_outputs(m, feeds(mask=False), atol=1e-5)
    assert ops(sess) == {"MatMul": 3, "com.microsoft:MultiHeadAttention": 1}


def test_attention_probabilities_read_outside_are_not_fused():
    m = bert_attention(probs_output=True)
    assert ops(assert_same_outputs(m, feeds(), atol=1e-5))["Softmax"] == 1


def test_attention_with_a_run_time_scale_is_not_fused():
    m = bert_attention()
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "c"))
    m.graph.input.append(vi("c", []))
    f = dict(feeds(), c=np.array(2.0, np.float32))
    assert ops(assert_same_outputs(m, f, atol=1e-5))["Softmax"] == 1


def _symbolic(m, mask=True):
    m.graph.input[0].CopyFrom(vi("x", ["batch", "seq", D]))
    if mask:
        m.graph.input[1].CopyFrom(vi("mask", ["batch", 1, 1, "seq"]))
    m.graph.output[0].CopyFrom(vi("y", None))
    return m


def _sized_feeds(b, s, mask=True, seed=7):
    out = {"x": f32(b, s, D, seed=seed)}
    if mask:
        m = np.zeros((b, 1, 1, s), np.float32)
        m[-1, ..., s // 2 + 1 :] = -10000.0
        out["mask"] = m
    return out


def _same_for_sizes(m, sess, sizes, mask=True):
    plain = session(m, disabled=["attention_fusion"])
    for b, s in sizes:
        f = _sized_feeds(b, s, mask)
        got, want = sess.run(None, f)[0], plain.run(None, f)[0]
        assert got.shape == want.shape == (b, s, D)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_on_symbolic_shapes_is_fused_and_runs_every_size(tmp_path):
    m = _symbolic(bert_attention())
    sess = session(m)
    found = ops(sess)
    # the [batch, 1, 1, seq] mask is expanded to [batch, 1, seq, seq] at run time
    assert found["com.microsoft:MultiHeadAttention"] == 1 and "Softmax" not in found, found
    assert found["Expand"] == 1 and found["Shape"] == 1, found
    _same_for_sizes(m, sess, [(2, 5), (1, 1), (3, 7), (2, 5)])
    # and the saved model, with that Expand, runs in onnxruntime
    rt = pytest.importorskip("onnxruntime")
    out = tmp_path / "opt.onnx"
    session(m, save=out)
    ref = rt.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    f = _sized_feeds(3, 6)
    np.testing.assert_allclose(ref.run(None, f)[0], sess.run(None, f)[0], rtol=1e-4, atol=1e-5)


def test_attention_mask_of_unknown_size_is_not_fused():
    m = _symbolic(bert_attention())
    m.graph.input[1].CopyFrom(vi("mask", ["batch", 1, 1, None]))  # neither a size nor a symbol
    assert ops(session(m))["Softmax"] == 1


def packed_attention():
    """One [D, 3D] projection, reshaped to [B, S, 3, N, H], split into Q, K and V."""
    inits = {"w": f32(D, 3 * D, seed=1, scale=0.3), "b": f32(3 * D, seed=2),
             "r5": np.array([0, 0, 3, HEADS, H], np.int64), "split": np.array([1, 1, 1], np.int64),
             "ax": np.array([0], np.int64), "c": np.float32(np.sqrt(H)), "merge": np.array([0, 0, D], np.int64)}
    nodes = [N("MatMul", ["x", "w"], ["pm"]), N("Add", ["b", "pm"], ["qkv"]), N("Reshape", ["qkv", "r5"], ["r"]),
             N("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
             N("Split", ["t", "split"], ["s0", "s1", "s2"], axis=0),
             N("Squeeze", ["s0", "ax"], ["q4"]), N("Squeeze", ["s1", "ax"], ["k4"]), N("Squeeze", ["s2", "ax"], ["v4"]),
             N("Transpose", ["k4"], ["kt"], perm=[0, 1, 3, 2]), N("MatMul", ["q4", "kt"], ["qk"]),
             N("Div", ["qk", "c"], ["sc"]), N("Add", ["sc", "mask"], ["a"]), N("Softmax", ["a"], ["p"], axis=-1),
             N("MatMul", ["p", "v4"], ["ctx4"]), N("Transpose", ["ctx4"], ["ctx"], perm=[0, 2, 1, 3]),
             N("Reshape", ["ctx", "merge"], ["y"])]
    return model(nodes, [vi("x", [B, S, D]), vi("mask", [B, 1, 1, S])], [vi("y", [B, S, D])], inits)


def test_packed_projection_becomes_attention(tmp_path):
    m = packed_attention()
    sess = assert_same_outputs(m, feeds(), atol=1e-5)
    assert ops(sess) == {"com.microsoft:Attention": 1, "Expand": 1}
    # the saved model runs in onnxruntime: the mask was expanded to [B, 1, S, S] for it
    rt = pytest.importorskip("onnxruntime")
    out = tmp_path / "opt.onnx"
    session(m, save=out)
    saved = onnx.load(out)
    onnx.checker.check_model(saved)
    got = rt.InferenceSession(saved.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds())
    np.testing.assert_allclose(got[0], sess.run(None, feeds())[0], rtol=1e-4, atol=1e-5)


def split_then_transposed_attention():
    """The packed [B, S, 3, N, H] split on axis 2 and each part transposed (K straight to
    [B, N, H, S]), as onnxruntime's transpose optimizer leaves a torch export, with the
    projection weight a graph input (not a constant one that Attention could take)."""
    inits = {"r5": np.array([0, 0, 3, HEADS, H], np.int64), "split": np.array([1, 1, 1], np.int64),
             "ax": np.array([2], np.int64), "c": np.float32(np.sqrt(H)), "merge": np.array([0, 0, D], np.int64)}
    nodes = [N("MatMul", ["x", "w"], ["qkv"]), N("Reshape", ["qkv", "r5"], ["r"]),
             N("Split", ["r", "split"], ["s0", "s1", "s2"], axis=2),
             N("Squeeze", ["s0", "ax"], ["q3"]), N("Squeeze", ["s1", "ax"], ["k3"]), N("Squeeze", ["s2", "ax"], ["v3"]),
             N("Transpose", ["q3"], ["q4"], perm=[0, 2, 1, 3]), N("Transpose", ["k3"], ["kt"], perm=[0, 2, 3, 1]),
             N("Transpose", ["v3"], ["v4"], perm=[0, 2, 1, 3]), N("MatMul", ["q4", "kt"], ["qk"]),
             N("Div", ["qk", "c"], ["sc"]), N("Add", ["sc", "mask"], ["a"]), N("Softmax", ["a"], ["p"], axis=-1),
             N("MatMul", ["p", "v4"], ["ctx4"]), N("Transpose", ["ctx4"], ["ctx"], perm=[0, 2, 1, 3]),
             N("Reshape", ["ctx", "merge"], ["y"])]
    inputs = [vi("x", ["batch", "seq", D]), vi("w", [D, 3 * D]), vi("mask", ["batch", 1, 1, "seq"])]
    return model(nodes, inputs, [vi("y", None)], inits)


def test_packed_heads_split_then_transposed_become_split_and_multi_head_attention():
    m = split_then_transposed_attention()
    sess = session(m)
    found = ops(sess)
    assert found["com.microsoft:MultiHeadAttention"] == 1 and found["Split"] == 1, found
    assert "Softmax" not in found and "Transpose" not in found and "Squeeze" not in found, found
    plain = session(m, disabled=["attention_fusion"])
    w = f32(D, 3 * D, seed=3, scale=0.3)
    for b, s in [(2, 5), (1, 3), (3, 1)]:
        f = dict(_sized_feeds(b, s), w=w)
        np.testing.assert_allclose(sess.run(None, f)[0], plain.run(None, f)[0], rtol=1e-5, atol=1e-5)
