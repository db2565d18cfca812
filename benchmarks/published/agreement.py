"""Whether onnxrt's outputs agree with onnxruntime's, by the model's tolerance class.

* ``float32``: elementwise ``|a - b| <= ATOL * max(1, max|b|) + RTOL * |b|``, the
  tolerance ``onnxrt compare`` uses. Two correct float32 runtimes differ by summation
  order (a convolution adds thousands of products in another order) and by their
  exp/tanh approximations, about eps = 1.2e-7 relative per operation, growing through
  the layers; across the suite the worst measured difference is below 3e-5 of the
  output's magnitude, so the bound leaves a margin of about 3 and still catches any
  wrong kernel, whose errors are of the order of the values.
* ``quantized``: one value on the other side of a rounding boundary moves a code by
  one and the step grows layer by layer, so no fixed tolerance fits. The bound is
  onnxruntime's own spread: its output under ``SPREAD_TRIALS`` perturbations of the
  input by ``SPREAD_REL`` (1e-6) relative, each element moved by +-1e-6 of itself.
  onnxrt agrees when its largest difference is within ``SPREAD_FACTOR`` times the
  largest spread and its mean difference within ``SPREAD_FACTOR`` times the mean
  spread (or within the float32 bound, where onnxruntime's spread is smaller).
* ``float16``: in float16 steps: ``|a - b| <= FP16_STEPS * spacing(float16(max|b|))``.
  Each op's result is rounded to float16 (a step is 2**-11 of the value, 4.9e-4 at
  0.5..1), and two correct runtimes that compute an op in a different order or width
  differ where that rounding lands the other way: one step at the op, which the ops
  after it carry on and amplify. The deepest float16 model here (IS-Net: 119
  convolutions, each rounded to float16, then resizes and sigmoids) measured 3.6
  steps of its output while onnxrt computed float16 ops its own way (1 step once it
  computed them in float32 between casts, as onnxruntime does); 8 steps (3.9e-3 on a mask in [0, 1]) leaves a margin of about
  2 for other inputs, while a wrong kernel is off by hundreds of steps (the int8
  IS-Net, which does differ by its quantization, is 280 steps away).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["RTOL", "ATOL", "SPREAD_REL", "SPREAD_TRIALS", "SPREAD_FACTOR", "FP16_STEPS", "Verdict",
           "float32_agree", "float16_agree", "spread", "quantized_agree", "perturbed"]

RTOL = 1e-3
ATOL = 1e-4
SPREAD_REL = 1e-6
SPREAD_TRIALS = 3
SPREAD_FACTOR = 2.0
FP16_STEPS = 8


@dataclass
class Verdict:
    """One output's agreement: ``ok``, the largest difference and what it was held to."""

    name: str
    ok: bool
    max_abs: float
    bound: float
    detail: str

    def __str__(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'DIFFERS'}, max abs {self.max_abs:.3g} (bound {self.bound:.3g}; {self.detail})"


def _exactness(name: str, a: np.ndarray, b: np.ndarray) -> Verdict | None:
    """A verdict where the comparison is not numeric: shapes, dtypes, integers, bools."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return Verdict(name, False, float("inf"), 0.0, f"shape {list(a.shape)} vs {list(b.shape)}")
    if a.dtype != b.dtype:
        return Verdict(name, False, float("inf"), 0.0, f"dtype {a.dtype} vs {b.dtype}")
    if b.dtype.kind != "f":
        same = bool(np.array_equal(a, b))
        return Verdict(name, same, 0.0 if same else float(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64)))),
                       0.0, f"{b.dtype}: exact")
    if b.size == 0:
        return Verdict(name, True, 0.0, 0.0, "empty")
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return Verdict(name, False, float("inf"), 0.0, "NaN in different places")
    return None


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore"):
        return np.where(same, 0.0, np.abs(x - y))


def float32_agree(name: str, a: np.ndarray, b: np.ndarray) -> Verdict:
    """``a`` (onnxrt) against ``b`` (onnxruntime) with the float32 bound."""
    v = _exactness(name, a, b)
    if v is not None:
        return v
    d = _diff(a, b)
    mag = np.abs(np.nan_to_num(np.asarray(b, np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    scale = max(1.0, float(mag.max()))
    bound = ATOL * scale + RTOL * mag
    worst = int(np.argmax(d - bound))
    return Verdict(name, bool((d <= bound).all()), float(d.max()), float(bound.flat[worst]),
                   f"float32: {ATOL:g} x {scale:.3g} + {RTOL:g} x abs(b); {float(d.max()) / scale:.2g} of the magnitude")


def float16_agree(name: str, a: np.ndarray, b: np.ndarray) -> Verdict:
    """``a`` against ``b`` in float16 steps of ``b``'s largest magnitude."""
    v = _exactness(name, a, b)
    if v is not None:
        return v
    d = _diff(a, b)
    top = float(np.nanmax(np.abs(np.asarray(b, np.float64))))
    step = float(np.spacing(np.float16(min(top, 65504.0))))
    bound = FP16_STEPS * step
    return Verdict(name, bool(d.max() <= bound), float(d.max()), bound,
                   f"float16: {d.max() / step:.2g} steps of {step:.3g} (at {top:.3g}), {FP16_STEPS} allowed")


def perturbed(feeds: dict[str, np.ndarray], trial: int) -> dict[str, np.ndarray]:
    """The feeds with each float element moved by +-SPREAD_REL of itself (seeded by ``trial``)."""
    rng = np.random.default_rng(1000 + trial)
    out = {}
    for k, v in feeds.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            sign = rng.choice(np.array([-1.0, 1.0]), size=v.shape)
            out[k] = (v * (1.0 + SPREAD_REL * sign)).astype(v.dtype)
        else:
            out[k] = v
    return out


def spread(run: Callable[[dict], Sequence[np.ndarray]], feeds: dict[str, np.ndarray],
           reference: Sequence[np.ndarray], trials: int = SPREAD_TRIALS) -> list[tuple[float, float]]:
    """onnxruntime's own spread per output: (largest, mean) difference between its
    output on the feeds and on ``trials`` perturbed copies, the worst over the trials."""
    worst = [(0.0, 0.0)] * len(reference)
    for t in range(trials):
        got = run(perturbed(feeds, t))
        worst = [(max(w[0], float(_diff(g, r).max(initial=0.0))), max(w[1], float(_diff(g, r).mean())))
                 for w, g, r in zip(worst, got, reference)]
    return worst


def quantized_agree(name: str, a: np.ndarray, b: np.ndarray, own_spread: tuple[float, float]) -> Verdict:
    """``a`` against ``b`` held to onnxruntime's own ``(largest, mean)`` spread."""
    v = _exactness(name, a, b)
    if v is not None:
        return v
    d = _diff(a, b)
    f32 = float32_agree(name, a, b)
    if f32.ok:
        return Verdict(name, True, f32.max_abs, f32.bound,
                       f"within the float32 bound; onnxruntime's own spread {own_spread[0]:.3g}")
    big, mean = own_spread
    ok = d.max() <= SPREAD_FACTOR * big and d.mean() <= SPREAD_FACTOR * mean
    return Verdict(name, bool(ok), float(d.max()), SPREAD_FACTOR * big,
                   f"quantized: onnxruntime's own spread under a {SPREAD_REL:g} relative perturbation is "
                   f"{big:.3g} (mean {mean:.3g}); onnxrt's difference {float(d.max()):.3g} (mean {float(d.mean()):.3g}), "
                   f"{SPREAD_FACTOR:g}x allowed")
