"""Decoder-only language models as onnxruntime's generative-AI model builder writes
them (``scripts/export_llm_models.py``: a tiny Llama, float32 and 4-bit, and a tiny
Gemma 2 with a window-sized cache on one layer and soft-capped logits), run in a
greedy generation loop on onnxrt and on onnxruntime side by side: a left-padded
batch of two prompts, then one token a step, each engine feeding its own present
key/value caches back as the next step's past. Logits agree to 1e-5 and both pick
the same tokens at every step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxrt

ort = pytest.importorskip("onnxruntime")

DATA = Path(__file__).parent / "data"


class _Loop:
    """One engine's generation loop: its session, caches, tokens and mask."""

    def __init__(self, session, layers, heads_kv, head_size, ids, mask, windows=None):
        self.session = session
        b = ids.shape[0]
        # a layer with a window-sized cache starts from an empty cache of that capacity
        windows = windows or {}
        self.past = {f"past_key_values.{i}.{kv}": np.zeros((b, heads_kv, windows.get(i, 0), head_size), np.float32)
                     for i in range(layers) for kv in ("key", "value")}
        self.ids, self.mask = ids, mask

    def step(self):
        names = [o.name for o in self.session.get_outputs()]
        out = dict(zip(names, self.session.run(None, {"input_ids": self.ids, "attention_mask": self.mask,
                                                      **self.past})))
        for name in self.past:
            self.past[name] = out[name.replace("past_key_values", "present")]
        logits = out["logits"]
        self.ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
        self.mask = np.concatenate([self.mask, np.ones((self.mask.shape[0], 1), np.int64)], axis=1)
        return logits


def _windows(path: Path) -> dict[int, int]:
    """Layer -> capacity of its window-sized cache (``sliding_window_cache``)."""
    model = onnx.load(path, load_external_data=False)
    out = {}
    for n in model.graph.node:
        attrs = {a.name: a.i for a in n.attribute if a.type == onnx.AttributeProto.INT}
        if n.op_type == "GroupQueryAttention" and attrs.get("sliding_window_cache") == 1:
            out[int(n.input[3].split(".")[1])] = attrs["local_window_size"]
    return out


def _shape(path: Path):
    model = onnx.load(path, load_external_data=False)
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: a.i for a in gqa.attribute}
    layers = sum(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    past = next(i for i in model.graph.input if i.name == "past_key_values.0.key")
    head_size = past.type.tensor_type.shape.dim[3].dim_value
    if not head_size:  # symbolic in the model: hidden size over query heads
        hidden = next(i.dims[0] for i in model.graph.initializer if i.name.endswith("input_layernorm.weight"))
        head_size = hidden // attrs["num_heads"]
    return layers, attrs["kv_num_heads"], head_size, {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("name,ops", [
    ("llama_tiny.onnx", {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"}),
    ("llama_tiny_int4.onnx", {"GroupQueryAttention", "MatMulNBits", "GatherBlockQuantized"}),
    ("gemma2_tiny.onnx", {"GroupQueryAttention", "Gelu"}),
], ids=["float32", "int4", "sliding window"])
def test_greedy_generation_matches_onnxruntime_token_for_token(name, ops):
    path = DATA / name
    layers, heads_kv, head_size, present = _shape(path)
    assert ops <= present  # the model holds the ops this test is about
    windows = _windows(path)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 128, size=(2, 6)).astype(np.int64)
    mask = np.ones((2, 6), np.int64)
    if not windows:  # onnxruntime's window-sized caches take no padded prompt
        mask[1, :2] = 0  # the second prompt is two tokens shorter, padded on the left
    ours = _Loop(onnxrt.InferenceSession(str(path), providers=["CPUExecutionProvider"]),
                 layers, heads_kv, head_size, ids, mask, windows)
    theirs = _Loop(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]),
                   layers, heads_kv, head_size, ids, mask, windows)
    # more steps than the window holds: the window-sized cache evicts
    for step in range(10):
        got, want = ours.step(), theirs.step()
        assert got.shape == want.shape
        # a padded prompt position's logits are unspecified: compare the real tokens
        rows = mask.astype(bool) if step == 0 else np.ones(got.shape[:2], bool)
        np.testing.assert_allclose(got[rows], want[rows], rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
        np.testing.assert_array_equal(ours.ids, theirs.ids, err_msg=f"step {step}")
        for cache in ours.past:
            np.testing.assert_allclose(ours.past[cache], theirs.past[cache], rtol=1e-5, atol=1e-5)
