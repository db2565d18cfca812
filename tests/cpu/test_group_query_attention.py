"""com.microsoft GroupQueryAttention against onnxruntime: prompts, generation steps
over a growing cache, ragged batches, rotary embeddings, windows, soft caps, sinks,
attention bias, float16; per-head Q/K norms against the same model written with
SimplifiedLayerNormalization; and the clear refusals of what is not supported."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import onnxrt
from onnx import helper

MS = "com.microsoft"
INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
          "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
          "q_norm_weight", "k_norm_weight", "query_seqlens")


def _model(feeds: dict, attrs: dict, n_out=3) -> bytes:
    names = [n if feeds.get(n) is not None else "" for n in INPUTS]
    while names and not names[-1]:
        names.pop()
    outs = ["output", "present_key", "present_value"][:n_out]
    node = helper.make_node("GroupQueryAttention", names, outs, domain=MS, **attrs)
    graph = helper.make_graph(
        [node], "gqa",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items() if a is not None],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                              ir_version=9)
    return model.SerializeToString()


def _run(model: bytes, feeds: dict, engine):
    given = {n: a for n, a in feeds.items() if a is not None}
    if engine == "ort":
        return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)
    return onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)


def _caches(rng, half, positions=32):
    angles = np.arange(positions)[:, None] * rng.uniform(0.05, 1.0, half)[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _assert_valid_rows_match(got, exp, lengths, s, first, tol=1e-5):
    """Outputs and caches agree wherever the operator defines them: every query row
    except a first prompt's right padding (rows at or past an entry's length), and
    the caches' first ``T_b`` rows (the rest are zeros in both)."""
    assert [g.shape for g in got] == [e.shape for e in exp]
    assert [g.dtype for g in got] == [e.dtype for e in exp]
    for b, t in enumerate(lengths):
        rows = min(s, t) if first else s
        np.testing.assert_allclose(got[0][b, :rows], exp[0][b, :rows], rtol=tol, atol=tol)
    for g, e in zip(got[1:], exp[1:]):
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


def _feeds(rng, b, s, n, nkv, h, lengths, total, past=0, packed=False, dtype=np.float32):
    q = rng.standard_normal((b, s, n * h)).astype(dtype)
    k = rng.standard_normal((b, s, nkv * h)).astype(dtype)
    v = rng.standard_normal((b, s, nkv * h)).astype(dtype)
    feeds = dict.fromkeys(INPUTS)
    if packed:
        feeds["query"] = np.concatenate([q, k, v], axis=-1)
    else:
        feeds.update(query=q, key=k, value=v)
    if past:
        feeds["past_key"] = rng.standard_normal((b, nkv, past, h)).astype(dtype)
        feeds["past_value"] = rng.standard_normal((b, nkv, past, h)).astype(dtype)
    feeds["seqlens_k"] = np.asarray(lengths, np.int32) - 1
    feeds["total_sequence_length"] = np.array(total, np.int32)
    return feeds


CONFIGS = [
    # (name, attrs, extra feeds)
    ("plain", {}, ()),
    ("rotary halves", {"do_rotary": 1}, ("rotary",)),
    ("rotary interleaved, partial", {"do_rotary": 1, "rotary_interleaved": 1}, ("rotary_partial",)),
    ("local window", {"local_window_size": 2}, ()),
    ("soft cap and scale", {"softcap": 2.0, "scale": 0.3}, ()),
    ("smooth softmax", {"smooth_softmax": 1}, ()),
    ("head sink", {}, ("sink",)),
    ("attention bias", {}, ("bias",)),
    ("not causal", {"causal": 0}, ("rotary",)),
    # onnxruntime's saved optimized models write smooth_softmax -1 for "unset"
    ("flags as onnxruntime saves them", {"smooth_softmax": -1, "rotary_interleaved": 0, "do_rotary": 1}, ("rotary",)),
    ("everything", {"do_rotary": 1, "local_window_size": 3, "softcap": 5.0}, ("rotary", "sink", "bias")),
]


def _extras(rng, feeds, extras, n, h, s, total):
    b = feeds["query"].shape[0]
    if "rotary" in extras:
        feeds["cos_cache"], feeds["sin_cache"] = _caches(rng, h // 2)
    if "rotary_partial" in extras:
        feeds["cos_cache"], feeds["sin_cache"] = _caches(rng, h // 4)
    if "sink" in extras:
        feeds["head_sink"] = rng.standard_normal(n).astype(np.float32)
    if "bias" in extras:
        feeds["attention_bias"] = rng.standard_normal((b, 1, s, total)).astype(np.float32)


@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("name,attrs,extras", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_prompt_with_right_padded_batch(name, attrs, extras, packed):
    rng = np.random.default_rng(1)
    b, s, n, nkv, h = 3, 5, 4, 2, 32
    lengths = [5, 3, 5]
    feeds = _feeds(rng, b, s, n, nkv, h, lengths, s, packed=packed)
    _extras(rng, feeds, extras, n, h, s, s)
    attrs = dict(attrs, num_heads=n, kv_num_heads=nkv)
    model = _model(feeds, attrs)
    _assert_valid_rows_match(_run(model, feeds, "onnxrt"), _run(model, feeds, "ort"), lengths, s, True)


@pytest.mark.parametrize("name,attrs,extras", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_generation_step_with_ragged_cache(name, attrs, extras):
    rng = np.random.default_rng(2)
    b, s, n, nkv, h, past = 3, 1, 6, 2, 32, 7
    lengths = [8, 3, 6]  # keys after this step, each entry its own
    total = max(lengths)
    feeds = _feeds(rng, b, s, n, nkv, h, lengths, total, past=past)
    _extras(rng, feeds, extras, n, h, s, total)
    attrs = dict(attrs, num_heads=n, kv_num_heads=nkv)
    model = _model(feeds, attrs)
    _assert_valid_rows_match(_run(model, feeds, "onnxrt"), _run(model, feeds, "ort"), lengths, s, False)


@pytest.mark.parametrize("attrs", [{}, {"do_rotary": 1, "local_window_size": 3}], ids=["plain", "rotary window"])
def test_subsequent_prompt_chunk(attrs):
    rng = np.random.default_rng(3)
    b, s, n, nkv, h, past = 1, 3, 4, 1, 16, 4
    lengths = [past + s]
    feeds = _feeds(rng, b, s, n, nkv, h, lengths, lengths[0], past=past)
    if attrs:
        feeds["cos_cache"], feeds["sin_cache"] = _caches(rng, h // 2)
    attrs = dict(attrs, num_heads=n, kv_num_heads=nkv)
    model = _model(feeds, attrs)
    _assert_valid_rows_match(_run(model, feeds, "onnxrt"), _run(model, feeds, "ort"), lengths, s, False)


def test_decoding_loop_feeds_present_back_as_past():
    """A prompt and then token after token, each step's present cache fed back as the
    next step's past, as a generation loop does; both engines run their own loop."""
    rng = np.random.default_rng(4)
    b, n, nkv, h, prompt = 2, 4, 2, 16, 4
    cos, sin = _caches(rng, h // 2)
    attrs = dict(num_heads=n, kv_num_heads=nkv, do_rotary=1, local_window_size=4)
    state = {"onnxrt": None, "ort": None}
    lengths = [prompt, prompt]
    steps = [prompt, 1, 1, 1, 1]
    for step, s in enumerate(steps):
        if step:
            lengths = [t + 1 for t in lengths]
        total = max(lengths)
        base = _feeds(rng, b, s, n, nkv, h, lengths, total)
        base["cos_cache"], base["sin_cache"] = cos, sin
        results = {}
        for engine in state:
            feeds = dict(base)
            if state[engine] is not None:
                feeds["past_key"], feeds["past_value"] = state[engine]
            model = _model(feeds, attrs)
            results[engine] = _run(model, feeds, engine)
            state[engine] = (results[engine][1], results[engine][2])
        _assert_valid_rows_match(results["onnxrt"], results["ort"], lengths, s, step == 0, tol=2e-5)


def test_float16():
    rng = np.random.default_rng(5)
    b, s, n, nkv, h, past = 2, 1, 4, 2, 16, 5
    lengths = [6, 4]
    feeds = _feeds(rng, b, s, n, nkv, h, lengths, 6, past=past, dtype=np.float16)
    cos, sin = _caches(rng, h // 2)
    feeds["cos_cache"], feeds["sin_cache"] = cos.astype(np.float16), sin.astype(np.float16)
    model = _model(feeds, dict(num_heads=n, kv_num_heads=nkv, do_rotary=1))
    got, exp = _run(model, feeds, "onnxrt"), _run(model, feeds, "ort")
    assert got[0].dtype == np.float16
    _assert_valid_rows_match([g.astype(np.float32) for g in got], [e.astype(np.float32) for e in exp],
                             lengths, s, False, tol=2e-3)


def test_query_and_key_norms_match_the_model_written_with_simplified_layer_norm():
    """q_norm_weight/k_norm_weight (onnxruntime's CPU kernel refuses them) are an RMS
    normalization of each head before the rotary embedding: the same model with each
    projection reshaped to heads, SimplifiedLayerNormalization'd and reshaped back,
    run on onnxruntime, is the oracle."""
    rng = np.random.default_rng(6)
    b, s, n, nkv, h, eps = 2, 4, 4, 2, 16, 1e-5
    lengths = [4, 4]
    feeds = _feeds(rng, b, s, n, nkv, h, lengths, s)
    feeds["cos_cache"], feeds["sin_cache"] = _caches(rng, h // 2)
    qw = rng.uniform(0.5, 1.5, h).astype(np.float32)
    kw = rng.uniform(0.5, 1.5, h).astype(np.float32)
    attrs = dict(num_heads=n, kv_num_heads=nkv, do_rotary=1, qk_norm_epsilon=eps)
    got = _run(_model(dict(feeds, q_norm_weight=qw, k_norm_weight=kw), attrs), feeds | {"q_norm_weight": qw,
                                                                                      "k_norm_weight": kw}, "onnxrt")

    def normed(x, w, heads):
        x = x.reshape(b, s, heads, h).astype(np.float64)
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w).reshape(b, s, heads * h)

    # the oracle's normalization on onnxruntime itself: SimplifiedLayerNormalization
    nodes = [helper.make_node("Reshape", ["q", "qs"], ["q4"]),
             helper.make_node("SimplifiedLayerNormalization", ["q4", "qw"], ["q4n"], axis=-1, epsilon=eps),
             helper.make_node("Reshape", ["q4n", "q3s"], ["qn"]),
             helper.make_node("Reshape", ["k", "ks"], ["k4"]),
             helper.make_node("SimplifiedLayerNormalization", ["k4", "kw"], ["k4n"], axis=-1, epsilon=eps),
             helper.make_node("Reshape", ["k4n", "k3s"], ["kn"])]
    inits = [onnx.numpy_helper.from_array(a, nm) for nm, a in (
        ("qs", np.array([b, s, n, h], np.int64)), ("q3s", np.array([b, s, n * h], np.int64)),
        ("ks", np.array([b, s, nkv, h], np.int64)), ("k3s", np.array([b, s, nkv * h], np.int64)),
        ("qw", qw), ("kw", kw))]
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None)
                                               for x in ("q", "k")],
                              [onnx.ValueInfoProto(name="qn"), onnx.ValueInfoProto(name="kn")], inits)
    norm_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    qn, kn = ort.InferenceSession(norm_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"q": feeds["query"], "k": feeds["key"]})
    np.testing.assert_allclose(qn, normed(feeds["query"], qw, n), rtol=1e-5, atol=1e-5)
    plain = dict(feeds, query=qn, key=kn)
    exp = _run(_model(plain, attrs), plain, "ort")
    _assert_valid_rows_match(got, exp, lengths, s, True, tol=2e-5)


@pytest.mark.parametrize("attrs,extra,what", [
    ({"k_quant_type": "PER_TENSOR"}, {}, "k_quant_type"),
    ({}, {"query_seqlens": np.array([2], np.int32)}, "query_seqlens"),
], ids=["quantized cache", "query_seqlens"])
def test_unsupported_features_are_refused_by_name(attrs, extra, what):
    rng = np.random.default_rng(7)
    feeds = _feeds(rng, 1, 2, 2, 1, 16, [2], 2) | extra
    model = _model(feeds, dict(attrs, num_heads=2, kv_num_heads=1))
    with pytest.raises(onnxrt.OnnxRtError, match=what):
        onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("change,what", [
    (lambda f: f.update(seqlens_k=np.array([1, 1], np.int32)), "seqlens_k must have shape"),
    (lambda f: f.update(seqlens_k=np.array([5], np.int32)), "seqlens_k"),
    (lambda f: f.update(key=f["key"][:, :, :8]), "key must have shape"),
], ids=["seqlens shape", "seqlens past total", "key width"])
def test_bad_inputs_get_a_typed_error_naming_them(change, what):
    rng = np.random.default_rng(8)
    feeds = _feeds(rng, 1, 2, 2, 1, 16, [2], 2)
    change(feeds)
    model = _model(feeds, dict(num_heads=2, kv_num_heads=1))
    sess = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(onnxrt.OnnxRtError, match=what):
        sess.run(None, {k: v for k, v in feeds.items() if v is not None})


def test_a_huge_total_sequence_length_is_refused_before_allocating():
    """The caches' length comes from total_sequence_length, a value fed at run time: a
    huge one is refused by the allocation cap, naming the node, and the session runs on."""
    rng = np.random.default_rng(9)
    feeds = _feeds(rng, 1, 1, 2, 1, 16, [2], 2, past=1)
    sess = onnxrt.InferenceSession(_model(feeds, dict(num_heads=2, kv_num_heads=1)), providers=["CPUExecutionProvider"])
    given = {k: v for k, v in feeds.items() if v is not None}
    huge = dict(given, total_sequence_length=np.array(2**31 - 1, np.int32), seqlens_k=np.array([1], np.int32))
    with pytest.raises(onnxrt.OnnxRtError, match="present_key"):
        sess.run(None, huge)
    assert sess.run(None, given)[1].shape == (1, 1, 2, 16)


@pytest.mark.parametrize("capacity,steps", [
    (3, [2, 1, 1, 1, 1]),  # capacity = window: one row evicted a step once full
    (6, [5, 1, 1, 1, 1, 1, 1]),  # slack above the window: several rows evicted at once
    (4, [6, 3, 1, 5]),  # steps longer than the capacity
], ids=["capacity=window", "slack", "long steps"])
def test_window_sized_cache(capacity, steps):
    """``sliding_window_cache=1``: the caches are ``capacity`` rows long and keep the
    most recent positions in order (the schema's L(T) layout), each step's new keys
    read with the resident ones; a generation loop over more tokens than the capacity,
    each engine feeding its own caches back, checked against onnxruntime."""
    rng = np.random.default_rng(10)
    b, n, nkv, h, window = 1, 4, 2, 16, 3
    cos, sin = _caches(rng, h // 2)
    attrs = dict(num_heads=n, kv_num_heads=nkv, do_rotary=1, local_window_size=window, sliding_window_cache=1,
                 softcap=5.0)
    evict = capacity - window + 1
    state = {e: (np.zeros((b, nkv, capacity, h), np.float32),) * 2 for e in ("onnxrt", "ort")}
    t = 0
    for s in steps:
        t += s
        base = _feeds(rng, b, s, n, nkv, h, [t], t)
        base["cos_cache"], base["sin_cache"] = cos, sin
        results = {}
        for engine in state:
            feeds = dict(base, past_key=state[engine][0], past_value=state[engine][1])
            results[engine] = _run(_model(feeds, attrs), feeds, engine)
            state[engine] = (results[engine][1], results[engine][2])
        got, exp = results["onnxrt"], results["ort"]
        resident = t if t <= capacity else t - evict * -(-(t - capacity) // evict)
        np.testing.assert_allclose(got[0], exp[0], rtol=2e-5, atol=2e-5)
        assert got[1].shape == exp[1].shape == (b, nkv, capacity, h)
        for g, e in zip(got[1:], exp[1:]):  # rows past the resident ones are unspecified
            np.testing.assert_allclose(g[:, :, :resident], e[:, :, :resident], rtol=1e-6, atol=1e-6)


def test_window_sized_cache_below_the_window_is_a_clear_error():
    rng = np.random.default_rng(11)
    feeds = _feeds(rng, 1, 1, 2, 1, 16, [1], 1, past=2)
    sess = onnxrt.InferenceSession(_model(feeds, dict(num_heads=2, kv_num_heads=1, local_window_size=4,
                                                      sliding_window_cache=1)), providers=["CPUExecutionProvider"])
    with pytest.raises(onnxrt.OnnxRtError, match="capacity 2 is below local_window_size 4"):
        sess.run(None, {k: v for k, v in feeds.items() if v is not None})
