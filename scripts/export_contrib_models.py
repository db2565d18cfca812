"""Export the BERT-like test model in ``tests/models/data/`` (random weights, seeded).

    python scripts/export_contrib_models.py

``bert_tiny.onnx`` is a transformers ``BertModel`` with tiny sizes (2 layers, hidden
32, 2 heads) and random weights, exported from PyTorch with inputs ``input_ids``,
``attention_mask`` and ``token_type_ids`` (symbolic batch and sequence) and outputs
``last_hidden_state`` and ``pooler_output``. The tests rewrite it with
``onnxruntime.transformers.optimizer.optimize_model(..., model_type="bert")`` into
com.microsoft ops (EmbedLayerNormalization, Attention, SkipLayerNormalization,
BiasGelu/FastGelu) at run time, so only the plain export is committed. IR version 10
keeps it loadable by onnxruntime.
"""

from pathlib import Path

import onnx
import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "models" / "data"


def export_bert_tiny(path: Path) -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        attn_implementation="eager",
    )
    bert = BertModel(cfg).eval()

    class Wrapper(torch.nn.Module):
        # keyword arguments: BertModel.forward's positional order differs between versions
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
            )
            return out.last_hidden_state, out.pooler_output

    model = Wrapper().eval()
    ids = torch.randint(0, 120, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    types = torch.zeros(2, 8, dtype=torch.int64)
    dyn = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        (ids, mask, types),
        str(path),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={
            "input_ids": dyn,
            "attention_mask": dyn,
            "token_type_ids": dyn,
            "last_hidden_state": {0: "batch", 1: "sequence"},
            "pooler_output": {0: "batch"},
        },
        opset_version=17,
        dynamo=False,
    )
    m = onnx.load(str(path))
    m.ir_version = 10
    onnx.save(m, str(path))


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    export_bert_tiny(OUT / "bert_tiny.onnx")
    print("wrote", OUT / "bert_tiny.onnx")
