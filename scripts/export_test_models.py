"""Export the PyTorch test models in ``tests/models/data/`` (random weights, seeded).

    pip install torch==2.13.0 && python scripts/export_test_models.py

Small versions of real architectures: a ResNet (basic blocks, BatchNorm), a
MobileNetV2-style net (inverted residuals, depthwise convolutions, ReLU6), a
transformer encoder (multi-head attention, LayerNorm, GELU), an LSTM tagger and a
YOLO-style detector (Conv/BN/SiLU stages, an upsample + concat neck, a two-scale
head that decodes boxes on a grid built from the input's height and width).
Each has a symbolic batch dimension; the detector's height and width are symbolic
too. IR version 10 keeps them loadable by onnxruntime too.
"""

from pathlib import Path

import onnx
import torch
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "models" / "data"


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
            nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        return x + self.block(x) if self.use_res else self.block(x)


class SmallMobileNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
            InvertedResidual(16, 16, 1, 1), InvertedResidual(16, 24, 2, 6), InvertedResidual(24, 24, 1, 6),
            InvertedResidual(24, 32, 2, 6), InvertedResidual(32, 32, 1, 6),
        )
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class EncoderLayer(nn.Module):
    """A BERT-style post-norm layer, written out so batch and sequence stay symbolic."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x, mask_bias):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + mask_bias
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.proj(ctx))
        return self.ln2(x + self.ff(x))


class Encoder(nn.Module):
    def __init__(self, vocab=1000, d=64, heads=4, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, 128, d) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        # token id 0 is padding: masked out of attention
        mask_bias = (ids == 0).to(torch.float32)[:, None, None, :] * -10000.0
        x = self.emb(ids) + self.pos[:, : ids.shape[1]]
        for layer in self.layers:
            x = layer(x, mask_bias)
        return self.head(x[:, 0])


class LSTMTagger(nn.Module):
    def __init__(self, vocab=500, d=32, hidden=48, tags=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, ids):
        y, _ = self.lstm(self.emb(ids))
        return self.out(y)


def conv_bn_silu(cin, cout, k=3, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())


class CSPBlock(nn.Module):
    """Split the channels, refine one half with a residual pair of convolutions, concatenate."""

    def __init__(self, c):
        super().__init__()
        self.cv1 = conv_bn_silu(c, c, 1)
        self.m = nn.Sequential(conv_bn_silu(c // 2, c // 2), conv_bn_silu(c // 2, c // 2))
        self.cv2 = conv_bn_silu(c + c // 2, c, 1)

    def forward(self, x):
        a, b = self.cv1(x).chunk(2, 1)
        return self.cv2(torch.cat([a, b, b + self.m(b)], 1))


class TinyYolo(nn.Module):
    """A YOLO-style detector: boxes ``[batch, anchors, 4]`` (x1, y1, x2, y2 in pixels) and
    class scores ``[batch, anchors, classes]`` over stride-8 and stride-16 grids."""

    def __init__(self, classes=4):
        super().__init__()
        self.classes = classes
        self.stem = conv_bn_silu(3, 8, 3, 2)                                     # stride 2
        self.s2 = nn.Sequential(conv_bn_silu(8, 16, 3, 2), CSPBlock(16))         # stride 4
        self.s3 = nn.Sequential(conv_bn_silu(16, 32, 3, 2), CSPBlock(32))        # stride 8
        self.s4 = nn.Sequential(conv_bn_silu(32, 64, 3, 2), CSPBlock(64))        # stride 16
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck = conv_bn_silu(64 + 32, 32, 1)
        self.head8 = nn.Sequential(conv_bn_silu(32, 32), nn.Conv2d(32, 4 + classes, 1))
        self.head16 = nn.Sequential(conv_bn_silu(64, 32), nn.Conv2d(32, 4 + classes, 1))

    def _decode(self, p, stride):
        b, _, h, w = p.shape
        ys = torch.arange(h, dtype=torch.float32)
        xs = torch.arange(w, dtype=torch.float32)
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        centers = (torch.stack([gx, gy], 0).reshape(1, 2, -1) + 0.5) * stride
        p = p.flatten(2)                                                         # [b, 4 + classes, h*w]
        xy = centers + p[:, 0:2].tanh() * stride
        wh = p[:, 2:4].exp().clamp(max=64.0) * stride
        boxes = torch.cat([xy - wh / 2, xy + wh / 2], 1)
        return boxes, p[:, 4:].sigmoid()

    def forward(self, x):
        c3 = self.s3(self.s2(self.stem(x)))
        c4 = self.s4(c3)
        p3 = self.neck(torch.cat([self.up(c4), c3], 1))
        b8, s8 = self._decode(self.head8(p3), 8)
        b16, s16 = self._decode(self.head16(c4), 16)
        boxes = torch.cat([b8, b16], 2).transpose(1, 2)
        scores = torch.cat([s8, s16], 2).transpose(1, 2)
        return boxes, scores


def bn_stats(model):
    """Give ``model``'s BatchNorms non-trivial statistics (from torch's random state),
    so that inference-mode BN, and folding it into the convolutions, does real work."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.8, 1.2)
            m.bias.data.uniform_(-0.1, 0.1)
    return model


def export_detector(model, name):
    bn_stats(model)
    for head in (model.head8, model.head16):  # confident scores, not all near 0.5
        head[-1].weight.data *= 8.0
    model.eval()
    path = OUT / f"{name}.onnx"
    dims = {0: "batch", 2: "height", 3: "width"}
    torch.onnx.export(model, (torch.randn(1, 3, 64, 96),), str(path), input_names=["images"],
                      output_names=["boxes", "scores"],
                      dynamic_axes={"images": dims, "boxes": {0: "batch", 1: "anchors"},
                                    "scores": {0: "batch", 1: "anchors"}},
                      opset_version=17, dynamo=False)
    m = onnx.load(path)
    m.ir_version = 10
    # the exporter leaves the last dimensions symbolic; they are fixed: 4 box coordinates, the classes
    for out, size in zip(m.graph.output, (4, model.classes)):
        out.type.tensor_type.shape.dim[2].Clear()
        out.type.tensor_type.shape.dim[2].dim_value = size
    onnx.checker.check_model(m)
    onnx.save(m, path)
    print(f"{path.name}: {len(m.graph.node)} nodes, {path.stat().st_size // 1024} KiB")


def export(model, example, name, input_name, dynamic):
    model.eval()
    path = OUT / f"{name}.onnx"
    torch.onnx.export(model, (example,), str(path), input_names=[input_name], output_names=["output"],
                      dynamic_axes={input_name: dynamic, "output": {0: "batch"}}, opset_version=17, dynamo=False)
    m = onnx.load(path)
    m.ir_version = 10
    onnx.checker.check_model(m)
    onnx.save(m, path)
    print(f"{path.name}: {len(m.graph.node)} nodes, {path.stat().st_size // 1024} KiB")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    export(SmallResNet(), torch.randn(1, 3, 64, 64), "resnet_small", "image", {0: "batch"})
    export(SmallMobileNet(), torch.randn(1, 3, 64, 64), "mobilenet_small", "image", {0: "batch"})
    export(Encoder(), torch.randint(0, 1000, (1, 32)), "transformer_encoder", "input_ids", {0: "batch", 1: "sequence"})
    export(LSTMTagger(), torch.randint(0, 500, (1, 20)), "lstm_tagger", "input_ids", {0: "batch", 1: "sequence"})
    torch.manual_seed(0)  # the detector's weights do not depend on the models above
    export_detector(TinyYolo(), "yolo_small")


if __name__ == "__main__":
    main()
