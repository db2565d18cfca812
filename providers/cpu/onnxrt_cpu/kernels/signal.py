"""Signal processing: DFT, STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix.

Complex values travel as a trailing dimension of size 2 (real, imaginary); real
signals have a trailing dimension of size 1. Transforms run on ``numpy.fft`` in
float32 (float64 for double inputs) and are cast back to the input type.
"""

from __future__ import annotations

import numpy as np

from onnxrt.dtypes import np_dtype
from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import check_allocation

from ..registry import op

__all__ = ["DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _scalar_int(v, name: str) -> int:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    return int(a.reshape(()))


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return _F64 if dt == _F64 else _F32


def _to_complex(x: np.ndarray, what: str) -> tuple[np.ndarray, bool]:
    """Split the trailing (re[, im]) dimension: returns (values, is_complex)."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ValueError(f"{what}: the last dimension must be 1 (real) or 2 (complex), got shape {x.shape}")
    cdt = _compute_dtype(x.dtype)
    v = x.astype(cdt, copy=False)
    if x.shape[-1] == 1:
        return v[..., 0], False
    return v[..., 0] + 1j * v[..., 1], True


def _from_complex(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(y.shape + (2,), dtype=dtype)
    out[..., 0] = y.real
    out[..., 1] = y.imag
    return out


def dft(x: np.ndarray, length: int | None, axis: int, inverse: bool, onesided: bool) -> np.ndarray:
    """DFT of ``x`` ([..., 1|2]) along ``axis`` with ONNX's output layout."""
    rank = x.ndim
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ValueError(f"DFT: axis {axis} is out of range for an input of rank {rank}")
    axis %= rank
    v, is_complex = _to_complex(x, "DFT")
    if length is not None and length <= 0:
        raise ValueError(f"DFT: dft_length must be positive, got {length}")
    if length is not None:
        # a fed dft_length sizes the transform (numpy pads the signal to it): complex128 work
        work = list(v.shape)
        work[axis] = length
        check_allocation(work, np.complex128, "DFT transform")
    if not inverse:
        if onesided:
            if is_complex:
                n = length or v.shape[axis]
                y = np.fft.fft(v, n=n, axis=axis)
                y = np.take(y, np.arange(n // 2 + 1), axis=axis)
            else:
                y = np.fft.rfft(v, n=length, axis=axis)
        else:
            y = np.fft.fft(v, n=length, axis=axis)
        return _from_complex(y, x.dtype)
    if onesided:
        n = length if length is not None else 2 * (v.shape[axis] - 1)
        if n <= 0:
            raise ValueError(f"DFT: inverse one-sided transform of length {n}")
        y = np.fft.irfft(v, n=n, axis=axis)
        return y[..., None].astype(x.dtype)
    y = np.fft.ifft(v, n=length, axis=axis)
    return _from_complex(y, x.dtype)


@op("DFT", since=17)
class DFT17(Kernel):
    """DFT (opset 17-19): the axis is an attribute, counted with the batch dimension."""

    def setup(self):
        self.axis = int(self.attrs.get("axis", 1))
        self.inverse = bool(self.attrs.get("inverse", 0))
        self.onesided = bool(self.attrs.get("onesided", 0))

    def run(self, x, dft_length=None):
        n = None if dft_length is None else _scalar_int(dft_length, "DFT dft_length")
        return (dft(x, n, self.axis, self.inverse, self.onesided),)


@op("DFT", since=20)
class DFT(Kernel):
    """DFT (opset 20+): the axis is an optional input, ``-2`` by default."""

    def setup(self):
        self.inverse = bool(self.attrs.get("inverse", 0))
        self.onesided = bool(self.attrs.get("onesided", 0))

    def run(self, x, dft_length=None, axis=None):
        n = None if dft_length is None else _scalar_int(dft_length, "DFT dft_length")
        ax = -2 if axis is None else _scalar_int(axis, "DFT axis")
        return (dft(x, n, ax, self.inverse, self.onesided),)


@op("STFT", since=17)
class STFT(Kernel):
    """STFT: DFTs of (windowed) frames sliding over the signal."""

    def setup(self):
        self.onesided = bool(self.attrs.get("onesided", 1))

    def run(self, signal, frame_step, window=None, frame_length=None):
        if signal.ndim != 3:
            raise ValueError(f"STFT: signal must have shape [batch, length, 1|2], got {signal.shape}")
        step = _scalar_int(frame_step, "STFT frame_step")
        if step <= 0:
            raise ValueError(f"STFT: frame_step must be positive, got {step}")
        length = signal.shape[1]
        if window is not None and window.ndim != 1:
            raise ValueError(f"STFT: window must be 1-D, got shape {window.shape}")
        if frame_length is not None:
            flen = _scalar_int(frame_length, "STFT frame_length")
            if window is not None and window.shape[0] != flen:
                raise ValueError(f"STFT: window length {window.shape[0]} differs from frame_length {flen}")
        elif window is not None:
            flen = window.shape[0]
        else:
            flen = length
        if not 0 < flen <= length:
            raise ValueError(f"STFT: frame_length {flen} must be in [1, signal length {length}]")
        v, is_complex = _to_complex(signal, "STFT")
        if is_complex and self.onesided:
            raise ValueError("STFT: a one-sided transform needs a real signal")
        frames = (length - flen) // step + 1
        # the frames overlap: a short step makes them far larger than the signal
        check_allocation((signal.shape[0], frames, flen), np.complex128, "STFT frames")
        idx = np.arange(frames)[:, None] * step + np.arange(flen)
        f = v[:, idx]  # [batch, frames, flen]
        if window is not None:
            f = f * window.astype(v.real.dtype, copy=False)
        y = np.fft.rfft(f, axis=-1) if self.onesided else np.fft.fft(f, axis=-1)
        return (_from_complex(y, signal.dtype),)


class _Window(Kernel):
    """Generalized cosine windows ``sum_k (-1)^k a_k cos(2 pi k n / N)``."""

    coeffs: tuple = ()

    def setup(self):
        self.periodic = bool(self.attrs.get("periodic", 1))
        self.dtype = np_dtype(self.attrs.get("output_datatype", 1))

    def run(self, size):
        n = _scalar_int(size, f"{self.node.op_type} size")
        if n < 0:
            raise ValueError(f"{self.node.op_type}: size must be non-negative, got {n}")
        check_allocation([n], _F64, f"{self.node.op_type} output")  # built in float64
        denom = n if self.periodic else n - 1
        if denom <= 0:
            return (np.ones(n, dtype=self.dtype),)
        phase = np.arange(n, dtype=_F64) * (2.0 * np.pi / denom)
        y = np.zeros(n, dtype=_F64)
        for k, a in enumerate(self.coeffs[1:], start=1):
            y += (-1) ** k * a * np.cos(k * phase)
        y += self.coeffs[0]  # last, so the peak of an integer-typed window is exactly 1
        return (y.astype(self.dtype),)


@op("HannWindow", since=17)
class HannWindow(_Window):
    """HannWindow: ``0.5 - 0.5 cos(2 pi n / N)``."""

    coeffs = (0.5, 0.5)


@op("HammingWindow", since=17)
class HammingWindow(_Window):
    """HammingWindow: ``25/46 - 21/46 cos(2 pi n / N)``."""

    coeffs = (25.0 / 46.0, 21.0 / 46.0)


@op("BlackmanWindow", since=17)
class BlackmanWindow(_Window):
    """BlackmanWindow: ``0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)``."""

    coeffs = (0.42, 0.5, 0.08)


@op("MelWeightMatrix", since=17)
class MelWeightMatrix(Kernel):
    """MelWeightMatrix: triangular filters, evenly spaced on the mel scale, over the
    ``dft_length // 2 + 1`` bins of a one-sided spectrum."""

    def setup(self):
        self.dtype = np_dtype(self.attrs.get("output_datatype", 1))

    def run(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        mels = _scalar_int(num_mel_bins, "MelWeightMatrix num_mel_bins")
        n_dft = _scalar_int(dft_length, "MelWeightMatrix dft_length")
        rate = _scalar_int(sample_rate, "MelWeightMatrix sample_rate")
        if mels <= 0 or n_dft <= 0 or rate <= 0:
            raise ValueError(
                f"MelWeightMatrix: num_mel_bins ({mels}), dft_length ({n_dft}) and sample_rate ({rate}) must be positive"
            )
        lo = float(np.asarray(lower_edge_hertz).reshape(()))
        hi = float(np.asarray(upper_edge_hertz).reshape(()))
        if not 0 <= lo < hi:
            raise ValueError(f"MelWeightMatrix: need 0 <= lower_edge_hertz < upper_edge_hertz, got {lo}, {hi}")
        n_spec = n_dft // 2 + 1
        # the filters are built as [n_spec, mels] float64 tables
        check_allocation((n_spec, mels), _F64, "MelWeightMatrix output")
        lo_mel = 2595.0 * np.log10(1.0 + lo / 700.0)
        hi_mel = 2595.0 * np.log10(1.0 + hi / 700.0)
        # band edges evenly spaced in mel; the spacing divides by mels + 2 as onnxruntime does
        step = (hi_mel - lo_mel) / (mels + 2)
        mel_pts = np.arange(mels + 2, dtype=_F64) * step + lo_mel
        hz = 700.0 * np.expm1(mel_pts / 2595.0 * np.log(10.0))
        bins = np.floor_divide((n_dft + 1) * hz, rate).astype(np.int64)
        left, center, right = bins[:-2], bins[1:-1], bins[2:]
        j = np.arange(n_spec, dtype=np.int64)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = np.where((j >= left) & (j <= center) & (center > left), (j - left) / (center - left), 0.0)
            fall = np.where((j >= center) & (j < right), (right - j) / (right - center), 0.0)
        w = np.maximum(rise, fall)
        w[j == center] = 1.0
        return (w.astype(self.dtype),)
