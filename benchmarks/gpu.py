"""The CUDA provider against PyTorch eager on the same GPU and against onnxrt on the CPU.

    python benchmarks/gpu.py [--runs 20] [--fp16] [--models resnet50,bert_base,yolo] [--no-write]

Three models, built in PyTorch with random weights (nothing is downloaded) and exported
to ONNX (opset 17): a ResNet-50-like classifier (bottleneck blocks 3-4-6-3, 224x224), a
BERT-base-like encoder (12 layers, hidden 768, sequence 128, through ``transformers``
with a random initialisation) and a YOLO-style detector (SiLU conv backbone with a
three-scale head, 640x640). For each model and batch size (1 and 32):

* onnxrt with ``["CUDAExecutionProvider", "CPUExecutionProvider"]``, outputs on the GPU
  through IOBinding (so the copy back is not timed) and with plain ``run`` (copy timed);
* PyTorch eager on the same GPU at the same precision (``torch.no_grad``, synchronized;
  TF32 off for float32, since CuPy's float32 products are full float32);
* onnxrt on the CPU (batch 1 only; batch 32 on the CPU takes minutes).

The file is not named ``cuda.py``: run as a script, its folder comes first on
``sys.path``, and a ``cuda`` module there hides the ``cuda`` package CuPy imports.

Latency is the median of ``--runs`` timed runs after warm-up; throughput is
batch / median latency. The table, with the device name, driver and CUDA versions and
the date, replaces the block between the ``bench`` (float32) or ``bench-fp16`` markers in
``docs/cuda.md``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import time
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cuda.md"
#: the float32 and the float16 tables each have their own place in the document
MARKERS = {False: ("<!-- bench:start -->", "<!-- bench:end -->"),
           True: ("<!-- bench-fp16:start -->", "<!-- bench-fp16:end -->")}


# -- models ------------------------------------------------------------------------------------


def resnet50_like():
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(n):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers).eval(), lambda b: (torch.randn(b, 3, 224, 224),), ["image"]


def bert_base_like():
    import torch
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(attn_implementation="eager")).eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

    def inputs(b):
        return torch.randint(0, 30000, (b, 128)), torch.ones(b, 128, dtype=torch.int64)

    return Wrap().eval(), inputs, ["input_ids", "attention_mask"]


def yolo_like():
    import torch
    from torch import nn

    def cbs(cin, cout, k=3, s=1):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.a, self.b = cbs(c, c // 2, 1), cbs(c // 2, c, 3)

        def forward(self, x):
            return x + self.b(self.a(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = cbs(3, 32, 6, 2)
            self.s1 = nn.Sequential(cbs(32, 64, 3, 2), Block(64))
            self.s2 = nn.Sequential(cbs(64, 128, 3, 2), Block(128), Block(128))
            self.s3 = nn.Sequential(cbs(128, 256, 3, 2), Block(256), Block(256))
            self.s4 = nn.Sequential(cbs(256, 512, 3, 2), Block(512))
            self.heads = nn.ModuleList([nn.Conv2d(c, 3 * 85, 1) for c in (128, 256, 512)])

        def forward(self, x):
            p3 = self.s2(self.s1(self.stem(x)))
            p4 = self.s3(p3)
            p5 = self.s4(p4)
            outs = []
            for h, p in zip(self.heads, (p3, p4, p5)):
                y = torch.sigmoid(h(p))
                outs.append(y.flatten(2).transpose(1, 2).reshape(x.shape[0], -1, 85))
            return torch.cat(outs, 1)

    return Net().eval(), lambda b: (torch.randn(b, 3, 640, 640),), ["images"]


MODELS = {"resnet50": resnet50_like, "bert_base": bert_base_like, "yolo": yolo_like}


# -- timing -----------------------------------------------------------------------------------


def _median(fn, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _export(model, example, names, path: Path, fp16: bool):
    import torch

    torch.onnx.export(model, example, str(path), input_names=names, output_names=["out"], opset_version=17,
                      dynamic_axes={n: {0: "batch"} for n in names} | {"out": {0: "batch"}}, dynamo=False)
    if fp16:
        import onnx
        from onnxconverter_common import float16

        onnx.save(float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(path))


def bench(name: str, runs: int, fp16: bool, tmp: Path) -> list[dict]:
    import cupy as cp
    import onnxrt as ort
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, make_inputs, names = MODELS[name]()
    path = tmp / f"{name}.onnx"
    _export(model, make_inputs(1), names, path, fp16)
    gpu = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assignment = gpu.get_provider_assignment()
    on = sum(a["provider"] == "CUDAExecutionProvider" for a in assignment)
    cpu = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tmodel = model.cuda()
    if fp16:
        tmodel = tmodel.half()
    rows = []
    for batch in (1, 32):
        inputs = make_inputs(batch)
        feeds = {n: t.numpy() for n, t in zip(names, inputs)}
        tin = [t.cuda() for t in inputs]
        if fp16:
            tin = [t.half() if t.is_floating_point() else t for t in tin]
        binding = gpu.io_binding()
        for n, v in feeds.items():
            binding.bind_ortvalue_input(n, ort.OrtValue.from_device_array(cp.asarray(v)))
        binding.bind_output("out", "cuda", 0)

        def torch_run(tin=tin):
            with torch.no_grad():
                tmodel(*tin)
            torch.cuda.synchronize()

        with torch.no_grad():
            want = tmodel(*tin).float().cpu().numpy()
        got = gpu.run(None, feeds)[0].astype("float32")
        err = float(abs(got - want).max() / max(abs(want).max(), 1e-30))
        row = {"model": name, "batch": batch, "on_cuda": f"{on}/{len(assignment)}", "max_rel_diff": err,
               "onnxrt_cuda_iobinding": _median(lambda b=binding: gpu.run_with_iobinding(b), runs),
               "onnxrt_cuda_run": _median(lambda f=feeds: gpu.run(None, f), runs),
               "torch_eager": _median(torch_run, runs),
               "onnxrt_cpu": _median(lambda f=feeds: cpu.run(None, f), max(3, runs // 5), 1) if batch == 1 else None}
        rows.append(row)
        print(row, flush=True)
    return rows


def _device_line() -> str:
    import cupy as cp

    rt = cp.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]

    def ver(v):
        return f"{v // 1000}.{(v % 1000) // 10}"

    return (f"{name}, driver CUDA {ver(rt.driverGetVersion())}, runtime CUDA {ver(rt.runtimeGetVersion())}, "
            f"CuPy {cp.__version__}, {datetime.date.today().isoformat()}")


def _table(rows: list[dict], fp16: bool) -> str:
    def ms(v):
        return "—" if v is None else f"{v * 1e3:.2f}"

    precision = "float16" if fp16 else "float32"
    out = [f"Measured on {_device_line()}, {precision}; median latency in ms (throughput in items/s in brackets).",
           "",
           "| model | batch | nodes on CUDA | onnxrt CUDA (IOBinding) | onnxrt CUDA (run) | PyTorch eager | "
           "IOBinding / PyTorch | onnxrt CPU | largest difference from PyTorch |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["batch"]
        cells = [f"{ms(r[k])} ({b / r[k]:.0f}/s)" if r[k] else "—"
                 for k in ("onnxrt_cuda_iobinding", "onnxrt_cuda_run", "torch_eager", "onnxrt_cpu")]
        cells.insert(3, f"{r['onnxrt_cuda_iobinding'] / r['torch_eager']:.2f}x")
        cells.append(f"{r['max_rel_diff']:.1e} of the largest output")
        out.append(f"| {r['model']} | {b} | {r['on_cuda']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--fp16", action="store_true", help="float16 models (PyTorch in half precision too)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    import onnxrt as ort

    info = {p["name"]: p for p in ort.get_provider_info()}
    why = info.get("CUDAExecutionProvider", {}).get("reason", "onnxrt-cuda is not installed")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit(f"the CUDA provider is unavailable: {why}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += bench(name.strip(), args.runs, args.fp16, Path(tmp))
    table = _table(rows, args.fp16)
    print(table)
    if not args.no_write:
        start, end = MARKERS[args.fp16]
        text = DOC.read_text()
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        DOC.write_text(f"{head}{start}\n{table}\n{end}{tail}")


if __name__ == "__main__":
    main()
