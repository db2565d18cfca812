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


def test_attention_on_a_symbolic_shape_is_not_fused_until_it_is_fixed():
    m = bert_attention()
    m.graph.input[0].CopyFrom(vi("x", ["batch", "seq", D]))
    m.graph.input[1].CopyFrom(vi("mask", ["batch", 1, 1, "seq"]))
    m.graph.output[0].CopyFrom(vi("y", None))
    assert ops(assert_same_outputs(m, feeds(), atol=1e-5))["Softmax"] == 1
    sess = assert_same_outputs(m, feeds(), atol=1e-5, fixed={"batch": B, "seq": S})
    assert ops(sess)["com.microsoft:MultiHeadAttention"] == 1


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
