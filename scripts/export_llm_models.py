"""Export the tiny decoder-only language models in ``tests/models/data/`` (random
weights, seeded), as onnxruntime's generative-AI model builder writes them.

    pip install onnxruntime-genai transformers torch   # the script's needs only
    python scripts/export_llm_models.py

A transformers ``LlamaForCausalLM`` with tiny sizes (2 layers, hidden 64, 4 query
heads sharing 2 key/value heads, vocabulary 128, input and output embeddings tied)
and random weights is saved with a word-level tokenizer, and
``python -m onnxruntime_genai.models.builder`` turns it into:

- ``llama_tiny.onnx``: float32; GroupQueryAttention with rotary embeddings,
  SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization, MatMul;
- ``llama_tiny_int4.onnx``: 4-bit weights; MatMulNBits at ``accuracy_level`` 4 and
  the tied embedding table as a GatherBlockQuantized sharing the output layer's
  4-bit weights.

And a ``Gemma2ForCausalLM`` of the same sizes (head size 16, a sliding window of 4
tokens on its first layer, attention and final logits soft-capped) into
``gemma2_tiny.onnx``: float32; its first layer's GroupQueryAttention keeps a
window-sized cache (``sliding_window_cache``: past and present 4 rows long).

Inputs ``input_ids``, ``attention_mask`` and ``past_key_values.{layer}.{key,value}``,
outputs ``logits`` and ``present.{layer}.{key,value}``: a generation loop feeds the
presents back as the next step's past. Each model is stored as one file (the
builder writes its weights beside it).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

OUT = Path(__file__).resolve().parent.parent / "tests" / "models" / "data"


SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=128, max_position_embeddings=256)


def save_hf_model(path: Path, family: str = "llama") -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES, tie_word_embeddings=True))
    else:
        cfg = transformers.Gemma2Config(**SIZES, head_dim=16, sliding_window=4, attn_logit_softcapping=50.0,
                                        final_logit_softcapping=30.0)
        model = transformers.Gemma2ForCausalLM(cfg)
    model.save_pretrained(path)
    # the builder copies a tokenizer beside the model; a word-level one needs no download
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(path)


def build(hf: Path, precision: str, work: Path) -> onnx.ModelProto:
    out = work / f"{hf.name}-{precision}"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", hf.name, "-i", str(hf),
                    "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(work / "cache")], check=True)
    return onnx.load(out / "model.onnx")  # reads the weights written beside it


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        save_hf_model(work / "llama", "llama")
        save_hf_model(work / "gemma2", "gemma2")
        for family, precision, name in (("llama", "fp32", "llama_tiny.onnx"), ("llama", "int4", "llama_tiny_int4.onnx"),
                                        ("gemma2", "fp32", "gemma2_tiny.onnx")):
            model = build(work / family, precision, work)
            onnx.save(model, OUT / name)
            ops = sorted({n.op_type for n in model.graph.node})
            print(f"{name}: {(OUT / name).stat().st_size} bytes, ir_version {model.ir_version}, ops {ops}")


if __name__ == "__main__":
    main()
