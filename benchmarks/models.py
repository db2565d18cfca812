"""The benchmark models: each builder writes an ONNX file and its feeds into a cache folder.

Models with random weights, built or exported here (nothing is downloaded):

* the onnx package's ``light_*`` models (ResNet-50, DenseNet-121, Inception v1/v2,
  SqueezeNet, ShuffleNet, VGG-19, ZFNet, AlexNet), given seeded random weights the way
  ``tests/models/test_real_models.py`` does;
* a ResNet-18 and a MobileNetV2 (depthwise convolutions) exported from PyTorch at
  224x224, a BERT-base encoder (``transformers.BertConfig()`` defaults, sequence 128,
  ~420 MB), a 2-layer GRU and a 2-layer LSTM (hidden 256, 64 steps);
* the repository's YOLO-style detector (``tests/models/data/yolo_small.onnx``) at 320x320;
* a scikit-learn pipeline (scaler, PCA, logistic regression on the bundled digits
  data set) converted by skl2onnx, 1,000 rows per run.

The cache folder is ``~/.cache/onnxrt-bench`` (``ONNXRT_BENCH_CACHE`` overrides it);
an existing file is reused, so only the first run pays for the exports.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "models" / "data"

__all__ = ["BenchModel", "MODELS", "cache_dir", "get_model", "QUICK"]


def cache_dir() -> Path:
    """Where exported models and their feeds are kept (outside the repository)."""
    d = Path(os.environ.get("ONNXRT_BENCH_CACHE", Path.home() / ".cache" / "onnxrt-bench"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass
class BenchModel:
    """A benchmark model: its name, a builder writing the ``.onnx`` file, and its feeds."""

    name: str
    build: Callable[[Path], None]
    feeds: Callable[[], dict]
    note: str = ""

    def path(self) -> Path:
        return cache_dir() / f"{self.name}.onnx"

    def feeds_path(self) -> Path:
        return cache_dir() / f"{self.name}.npz"

    def prepare(self) -> tuple[Path, Path]:
        """Build the model and its feeds if they are not cached yet; return both paths."""
        p, f = self.path(), self.feeds_path()
        if not p.exists():
            tmp = p.with_suffix(".tmp.onnx")
            self.build(tmp)
            tmp.replace(p)
        if not f.exists():
            np.savez(f, **self.feeds())
        return p, f


def _rng(seed=0):
    return np.random.default_rng(seed)


def _image(shape, seed=0):
    return lambda: {"__first__": _rng(seed).standard_normal(shape).astype(np.float32)}


# -- the onnx package's light models ---------------------------------------------------


def _light(name: str):
    def build(path: Path):
        import onnx

        sys.path.insert(0, str(ROOT))
        from tests.models.test_real_models import LIGHT_DIR, _randomized

        onnx.save(_randomized(LIGHT_DIR / f"light_{name}.onnx", expose=False), path)

    return build


# -- PyTorch exports --------------------------------------------------------------------


def _export(model, example: tuple, path: Path, input_names, dynamo=False):
    import onnx
    import torch

    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, example, str(path), input_names=input_names, opset_version=17, dynamo=dynamo)
    m = onnx.load(path, load_external_data=True)
    m.ir_version = 10
    big = m.ByteSize() > 1_800_000_000 or any(t.data_location == 1 for t in m.graph.initializer)
    onnx.save(m, path, save_as_external_data=big, location=path.name.replace(".tmp", "") + ".data" if big else None)


def _torch_blocks():
    """The export script's blocks and BatchNorm initializer (one definition of each)."""
    import torch  # noqa: F401

    sys.path.insert(0, str(ROOT))
    from scripts.export_test_models import BasicBlock, InvertedResidual, bn_stats

    return BasicBlock, InvertedResidual, bn_stats


def _resnet18(path: Path):
    import torch
    from torch import nn

    BasicBlock, _, bn_stats = _torch_blocks()
    torch.manual_seed(0)
    layers, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000),
    )
    _export(bn_stats(model), (torch.randn(1, 3, 224, 224),), path, ["image"])


def _mobilenet_v2(path: Path):
    import torch
    from torch import nn

    _, InvertedResidual, bn_stats = _torch_blocks()
    torch.manual_seed(0)
    blocks, cin = [], 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        for i in range(n):
            blocks.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(), *blocks,
        nn.Conv2d(320, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000),
    )
    _export(bn_stats(model), (torch.randn(1, 3, 224, 224),), path, ["image"])


BERT_SEQ = 128


def _bert_base(path: Path):
    import torch
    from transformers import BertConfig, BertModel

    from torch import nn

    torch.manual_seed(0)
    config = BertConfig()
    config._attn_implementation = "eager"
    bert = BertModel(config, add_pooling_layer=False)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(0, 30522, (1, BERT_SEQ))
    mask = torch.ones(1, BERT_SEQ, dtype=torch.int64)
    _export(Encoder(), (ids, mask), path, ["input_ids", "attention_mask"])


def _bert_feeds():
    rng = _rng()
    return {
        "input_ids": rng.integers(0, 30522, (1, BERT_SEQ)).astype(np.int64),
        "attention_mask": np.ones((1, BERT_SEQ), np.int64),
    }


def _recurrent(kind: str):
    def build(path: Path):
        import torch
        from torch import nn

        torch.manual_seed(0)
        cls = nn.GRU if kind == "gru" else nn.LSTM

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = cls(128, 256, num_layers=2, batch_first=True)
                self.out = nn.Linear(256, 10)

            def forward(self, x):
                y, _ = self.rnn(x)
                return self.out(y)

        _export(Net(), (torch.randn(1, 64, 128),), path, ["x"])

    return build


# -- YOLO-style detector and scikit-learn ---------------------------------------------


def _yolo(path: Path):
    import shutil

    shutil.copyfile(DATA / "yolo_small.onnx", path)


def _sklearn_pipeline(path: Path):
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    pipe = make_pipeline(StandardScaler(), PCA(32, random_state=0), LogisticRegression(max_iter=500))
    pipe.fit(x.astype(np.float32), y)
    onx = to_onnx(pipe, x[:1].astype(np.float32), options={id(pipe.steps[-1][1]): {"zipmap": False}},
                  target_opset={"": 17, "ai.onnx.ml": 3})
    onx.ir_version = 10
    path.write_bytes(onx.SerializeToString())


def _digits_feeds():
    from sklearn.datasets import load_digits

    x = load_digits().data.astype(np.float32)
    return {"X": np.concatenate([x] * 1)[:1000]}


LIGHT_NAMES = ["resnet50", "densenet121", "inception_v1", "inception_v2", "squeezenet", "shufflenet", "vgg19",
               "zfnet512", "bvlc_alexnet"]

MODELS: dict[str, BenchModel] = {}
for _n in LIGHT_NAMES:
    MODELS[f"light_{_n}"] = BenchModel(f"light_{_n}", _light(_n), _image((1, 3, 224, 224)))
MODELS.update({
    "resnet18": BenchModel("resnet18", _resnet18, _image((1, 3, 224, 224))),
    "mobilenet_v2": BenchModel("mobilenet_v2", _mobilenet_v2, _image((1, 3, 224, 224))),
    "bert_base": BenchModel("bert_base", _bert_base, _bert_feeds, "sequence 128"),
    "gru": BenchModel("gru", _recurrent("gru"), _image((1, 64, 128))),
    "lstm": BenchModel("lstm", _recurrent("lstm"), _image((1, 64, 128))),
    "yolo_small": BenchModel("yolo_small", _yolo, _image((1, 3, 320, 320)), "320x320"),
    "sklearn_pipeline": BenchModel("sklearn_pipeline", _sklearn_pipeline, _digits_feeds, "1000 rows"),
})

#: The models ``--quick`` runs: one of each kind, the cheap ones.
QUICK = ["light_squeezenet", "resnet18", "mobilenet_v2", "lstm", "yolo_small", "sklearn_pipeline"]


def get_model(name: str) -> BenchModel:
    """The benchmark model called ``name`` (a ``KeyError`` lists the known ones)."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def load_feeds(feeds_path: Path, input_names: list[str]) -> dict:
    """The saved feeds, with the placeholder name ``__first__`` bound to the first input."""
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    if "__first__" in feeds:
        feeds[input_names[0]] = feeds.pop("__first__")
    return feeds
