"""Feeds that look like what each model sees in use: pages of text, photos, speech-like
audio, spectrograms, a file's bytes. Each recipe returns ``make(rng) -> feeds``."""

from __future__ import annotations

from typing import Callable

import numpy as np

Feeds = dict[str, np.ndarray]
Recipe = Callable[[np.random.Generator], Feeds]

_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def _smooth(rng: np.random.Generator, shape: tuple[int, ...], cells: int = 8) -> np.ndarray:
    """Low-frequency noise in [0, 1]: a coarse grid upsampled, so neighbouring pixels
    correlate as in a photo."""
    *lead, h, w = shape
    coarse = rng.random((*lead, cells, cells), dtype=np.float32)
    up = np.repeat(np.repeat(coarse, -(-h // cells), axis=-2), -(-w // cells), axis=-1)
    return up[..., :h, :w]


def photo(h: int, w: int, name: str = "x", imagenet: bool = False, unit: bool = False) -> Recipe:
    """A photo-like RGB image, NCHW: smooth regions plus fine texture; ``unit`` leaves
    it in [0, 1] (YOLO), ``imagenet`` normalizes with ImageNet's mean and std, the
    default with PaddleOCR's (x - 0.5) / 0.5."""
    def make(rng: np.random.Generator) -> Feeds:
        img = 0.8 * _smooth(rng, (1, 3, h, w)) + 0.2 * rng.random((1, 3, h, w), dtype=np.float32)
        if unit:
            x = img
        elif imagenet:
            x = (img - _MEAN) / _STD
        else:
            x = (img - 0.5) / 0.5
        return {name: x.astype(np.float32)}
    return make


def ocr_page(h: int, w: int, name: str = "x", imagenet: bool = True, batch: int = 1) -> Recipe:
    """A page of text: a light background with dark strokes in lines, as PaddleOCR's
    detector (ImageNet normalization) and layout models see it."""
    def make(rng: np.random.Generator) -> Feeds:
        img = np.full((batch, 3, h, w), 0.92, np.float32)
        img += 0.03 * rng.standard_normal((batch, 3, h, w)).astype(np.float32)
        for b in range(batch):
            y = int(rng.integers(4, 24))
            while y < h - 24:
                lh = int(rng.integers(10, 22))
                x = int(rng.integers(4, 40))
                while x < w - 20:
                    cw = int(rng.integers(4, 14))
                    glyph = rng.random((lh, cw)) < 0.45
                    img[b, :, y:y + lh, x:x + cw][:, glyph] = 0.1
                    x += cw + int(rng.integers(1, 20 if rng.random() < 0.9 else 80))
                y += lh + int(rng.integers(8, 40))
        img = np.clip(img, 0, 1)
        x = (img - _MEAN) / _STD if imagenet else (img - 0.5) / 0.5
        return {name: x.astype(np.float32)}
    return make


def ocr_line(h: int, w: int, batch: int = 1, name: str = "x") -> Recipe:
    """Text-line crops as PaddleOCR's recognizer and orientation classifier take
    them: glyph strokes on a light background, normalized to [-1, 1]."""
    return ocr_page(h, w, name=name, imagenet=False, batch=batch)


def magika_bytes(name: str = "bytes") -> Recipe:
    """Magika's features of one file: its first and last 1024 bytes (padding token
    256 where the file is shorter), here of a Python source-like text."""
    words = [b"def ", b"return ", b"import ", b"self", b"(", b")", b":", b"\n    ", b" = ", b"np.",
             b"value", b"if ", b"else", b"for ", b" in ", b"range", b"# ", b"\n", b"0", b"1"]

    def make(rng: np.random.Generator) -> Feeds:
        text = b"".join(words[i] for i in rng.integers(0, len(words), 900))
        beg = np.frombuffer(text[:1024], np.uint8).astype(np.int32)
        end = np.frombuffer(text[-1024:], np.uint8).astype(np.int32)
        feat = np.full(2048, 256, np.int32)
        feat[:len(beg)] = beg
        feat[2048 - len(end):] = end
        return {name: feat.reshape(1, 2048)}
    return make


def _speech(rng: np.random.Generator, n: int) -> np.ndarray:
    """Speech-like audio at 16 kHz: a few harmonics of a gliding pitch under a
    syllable-rate envelope, plus background noise; peak about 0.5."""
    t = np.arange(n, dtype=np.float64) / 16000.0
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.random() * 6)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    env = np.clip(np.sin(2 * np.pi * 4 * t + rng.random() * 6), 0, None)
    x = 0.25 * env * voice + 0.01 * rng.standard_normal(n)
    return x.astype(np.float32)


def pcm(n: int, name: str, int16_scale: bool = False, batch: bool = True) -> Recipe:
    """``n`` samples of speech-like audio, shape (1, n); ``int16_scale`` multiplies by
    32767 as openWakeWord feeds its front end."""
    def make(rng: np.random.Generator) -> Feeds:
        x = _speech(rng, n)
        if int16_scale:
            x = np.round(x * 32767).astype(np.float32)
        return {name: x.reshape(1, n) if batch else x}
    return make


def vad_chunk(n: int, state: tuple[int, ...] | None = None, hc: tuple[int, ...] | None = None,
              sr: bool = True) -> Recipe:
    """One chunk of 16 kHz speech-like audio for Silero VAD with its recurrent state
    (``state``, or the older ``h`` and ``c``) as it is after a few chunks."""
    def make(rng: np.random.Generator) -> Feeds:
        feeds: Feeds = {"input": _speech(rng, n).reshape(1, n)}
        if state is not None:
            feeds["state"] = (0.1 * rng.standard_normal(state)).astype(np.float32)
        if hc is not None:
            feeds["h"] = (0.1 * rng.standard_normal(hc)).astype(np.float32)
            feeds["c"] = (0.1 * rng.standard_normal(hc)).astype(np.float32)
        if sr:
            feeds["sr"] = np.array(16000, np.int64)
        return feeds
    return make


def mel_window(shape: tuple[int, ...], name: str) -> Recipe:
    """A window of mel (or embedding) features: smooth in time, unit scale."""
    def make(rng: np.random.Generator) -> Feeds:
        base = rng.standard_normal(shape).astype(np.float32)
        smooth = (base + np.roll(base, 1, axis=1) + np.roll(base, 2, axis=1)) / 3.0
        return {name: smooth.astype(np.float32)}
    return make


def log_mel(shape: tuple[int, ...], name: str) -> Recipe:
    """A log-power mel spectrogram of speech-like audio (frames x bands), in dB / 10."""
    def make(rng: np.random.Generator) -> Feeds:
        frames, bands = shape[-2], shape[-1]
        env = _smooth(rng, (1, frames, bands), cells=12)[0]
        x = -6.0 + 5.0 * env + 0.3 * rng.standard_normal((frames, bands)).astype(np.float32)
        return {name: x.reshape(shape).astype(np.float32)}
    return make


def whisper_features(bands: int, frames: int, name: str = "input_features") -> Recipe:
    """Whisper's log-mel features: clipped to 8 dB below the peak and scaled into about
    [-1, 1], as WhisperFeatureExtractor makes them."""
    def make(rng: np.random.Generator) -> Feeds:
        env = _smooth(rng, (1, bands, frames), cells=16)[0]
        logmel = 2.0 * env + 0.2 * rng.standard_normal((bands, frames))
        logmel = np.maximum(logmel, logmel.max() - 8.0)
        x = (logmel + 4.0) / 4.0
        return {name: x.reshape(1, bands, frames).astype(np.float32)}
    return make


def aecmos(frames: int, hidden: int) -> Recipe:
    """AECMOS's input: three log-power spectrograms (mic, far end, output) of 160
    bins, and the GRU's initial state (zeros, as speechmos starts it)."""
    def make(rng: np.random.Generator) -> Feeds:
        spec = np.stack([log_mel((frames, 160), "s")(rng)["s"] for _ in range(3)])
        return {"input": spec.reshape(1, 3, frames, 160).astype(np.float32),
                "h0": np.zeros((4, 1, hidden), np.float32)}
    return make


def plcmos(frames: int) -> Recipe:
    """PLCMOS's input: a 257-bin log-power spectrogram and a rater embedding."""
    def make(rng: np.random.Generator) -> Feeds:
        spec = log_mel((frames, 257), "s")(rng)["s"]
        return {"degraded_audio": spec.reshape(1, 1, frames, 257).astype(np.float32),
                "rater_embed": (0.5 * rng.standard_normal((1, 64))).astype(np.float32)}
    return make
