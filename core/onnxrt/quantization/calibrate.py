"""Calibration: run the float model on onnxrt over representative inputs and turn what
each activation held into a range to quantize it with.

The model runs with every tensor to calibrate exposed as an output, one batch at a
time, on any onnxrt provider. Each tensor keeps its smallest and largest value and,
for the histogram methods, a histogram of 2 x ``CalibNumBins`` bins over ``[-M, M]``
where ``M`` is a power of two. When a batch holds a value beyond ``M``, ``M`` doubles
and pairs of bins merge: the bin edges stay aligned, so histograms from any batches,
in any order or on any worker, merge exactly. That lets the batches run in parallel
(``parallel="dask"`` or ``"ray"``, through :class:`~onnxrt.Predictor`), with the same
ranges as a run in one process.

Ranges:

- ``MinMax``: [min, max] over all batches, or with ``CalibMovingAverage`` an
  exponential moving average of each batch's min and max
  (``CalibMovingAverageConstant``, default 0.01), in batch order;
- ``Percentile``: the range that holds ``CalibPercentile`` (default 99.999) percent of
  the values, cutting half the rest at each end, or with ``CalibTensorRangeSymmetric``
  the symmetric range holding that percentage of ``|x|``;
- ``Entropy``: the threshold ``t`` on ``|x|`` whose histogram, clipped at ``t`` and
  quantized to ``CalibNumQuantizedBins`` levels (default 128 for tensors with negative
  values, 256 for non-negative ones, which use the whole unsigned range), has the
  least KL divergence from the observed one (the TensorRT method), exact zeros left
  out (0 is exact in every range); the range is ``[-t, t]`` met with ``[min, max]``.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx

from ..errors import InvalidArgument
from .types import CalibrationMethod

__all__ = ["CalibrationDataReader", "NumpyDataReader", "TensorStats", "collect_ranges", "CALIBRATION_OPTIONS"]

#: The ``extra_options`` keys calibration reads, with their defaults.
CALIBRATION_OPTIONS = {
    "CalibMovingAverage": False,
    "CalibMovingAverageConstant": 0.01,
    "CalibNumBins": 2048,
    "CalibNumQuantizedBins": None,
    "CalibPercentile": 99.999,
    "CalibTensorRangeSymmetric": False,
    "CalibMaxIntermediateOutputs": None,
    "CalibStridedMinMax": None,
    "CalibParallelChunk": 64,
}


class CalibrationDataReader(metaclass=abc.ABCMeta):
    """The calibration inputs, one batch at a time (onnxruntime's interface).

    Subclasses implement :meth:`get_next`, which returns ``{input name: array}`` for the
    next batch, or ``None`` when there are no more. Defining ``__len__`` (the number of
    batches) gives the progress bar its length.
    """

    @abc.abstractmethod
    def get_next(self) -> dict | None:
        """The next batch's feeds, or ``None`` at the end."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        batch = self.get_next()
        if batch is None:
            raise StopIteration
        return batch

    def set_range(self, start_index: int, end_index: int) -> None:
        """Restrict the reader to batches ``start_index..end_index`` (optional)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement set_range")


class NumpyDataReader(CalibrationDataReader):
    """A :class:`CalibrationDataReader` over arrays in memory.

    :param data: ``{input name: array}`` whose first axis counts samples (cut into
        batches of ``batch_size``), or a sequence of such dicts, each one batch.
    :param batch_size: rows per batch when ``data`` is one dict.
    """

    def __init__(self, data: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]], batch_size: int = 16):
        if isinstance(data, Mapping):
            if not data:
                raise InvalidArgument("NumpyDataReader needs at least one input array")
            if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
                raise InvalidArgument(f"batch_size must be a positive int, not {batch_size!r}")
            rows = {k: len(np.asarray(v)) for k, v in data.items()}
            if len(set(rows.values())) != 1:
                raise InvalidArgument(f"the input arrays have different numbers of rows: {rows}")
            n = next(iter(rows.values()))
            self._batches = [{k: np.asarray(v)[i:i + batch_size] for k, v in data.items()}
                             for i in range(0, n, batch_size)]
        else:
            self._batches = [dict(b) for b in data]
            for i, b in enumerate(self._batches):
                if not b:
                    raise InvalidArgument(f"calibration batch {i} holds no inputs")
        self._start, self._end, self._pos = 0, len(self._batches), 0

    def __len__(self) -> int:
        return self._end - self._start

    def get_next(self) -> dict | None:
        """The next batch, or ``None``."""
        if self._start + self._pos >= self._end:
            return None
        b = self._batches[self._start + self._pos]
        self._pos += 1
        return b

    def rewind(self) -> None:
        """Start again from the first batch."""
        self._pos = 0

    def set_range(self, start_index: int, end_index: int) -> None:
        """Read only batches ``start_index`` to ``end_index - 1``."""
        self._start, self._end = max(0, start_index), min(len(self._batches), end_index)
        self._pos = 0


@dataclass
class TensorStats:
    """What calibration keeps of one tensor: its range, and (for the histogram
    methods) a histogram of ``2 * bins`` bins over ``[-limit, limit]``."""

    bins: int
    histogram: bool
    min: float = math.inf
    max: float = -math.inf
    limit: float = 0.0
    counts: np.ndarray | None = None
    moving_min: float | None = None
    moving_max: float | None = None
    batches: int = 0
    zeros: int = 0
    extra: dict = field(default_factory=dict)

    def update(self, x: np.ndarray) -> None:
        """Add one batch's values."""
        x = np.asarray(x)
        if x.size == 0:
            return
        x = x.astype(np.float32, copy=False).reshape(-1)
        finite = x[np.isfinite(x)] if not np.isfinite(x).all() else x
        if finite.size == 0:
            return
        lo, hi = float(finite.min()), float(finite.max())
        self._add_range(lo, hi)
        if self.histogram:
            absmax = max(abs(lo), abs(hi))
            self._widen(absmax)
            h, _ = np.histogram(finite, bins=2 * self.bins, range=(-self.limit, self.limit))
            self.counts += h
            self.zeros += int(np.count_nonzero(finite == 0))

    def _add_range(self, lo: float, hi: float, moving: float | None = None) -> None:
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.batches += 1
        if self.moving_min is None:
            self.moving_min, self.moving_max = lo, hi
        elif moving is not None:
            self.moving_min += moving * (lo - self.moving_min)
            self.moving_max += moving * (hi - self.moving_max)

    def _widen(self, absmax: float) -> None:
        """Make ``limit`` a power of two at least ``absmax``, merging bins as it doubles."""
        need = 2.0 ** math.ceil(math.log2(absmax)) if absmax > 0 else 2.0 ** -24
        if self.counts is None:
            self.limit, self.counts = need, np.zeros(2 * self.bins, dtype=np.int64)
            return
        if need <= self.limit:
            return
        factor = int(round(need / self.limit))
        rel = np.arange(-self.bins, self.bins)
        merged = np.zeros(2 * self.bins, dtype=np.int64)
        np.add.at(merged, np.floor_divide(rel, factor) + self.bins, self.counts)
        self.limit, self.counts = need, merged

    def merge(self, other: "TensorStats", moving: float | None = None) -> None:
        """Fold in ``other`` (the stats of later batches); with ``moving``, ``other``
        must hold one batch, whose range enters the moving average."""
        if other.batches == 0:
            return
        if moving is not None:
            self._add_range(other.min, other.max, moving)
        else:
            self.min, self.max = min(self.min, other.min), max(self.max, other.max)
            if self.moving_min is None:
                self.moving_min, self.moving_max = other.moving_min, other.moving_max
            self.batches += other.batches
        if self.histogram and other.counts is not None:
            self.zeros += other.zeros
            if self.counts is None:
                self.limit, self.counts = other.limit, other.counts.copy()
            else:
                self._widen(other.limit)
                theirs = TensorStats(self.bins, True, limit=other.limit, counts=other.counts.copy())
                theirs._widen(self.limit)
                self.counts = self.counts + theirs.counts

    # -- ranges ---------------------------------------------------------------------
    def range(self, method: CalibrationMethod, options: Mapping[str, Any]) -> tuple[float, float]:
        """The calibrated range ``(rmin, rmax)`` by ``method`` (see the module doc)."""
        if self.batches == 0:
            raise InvalidArgument("no finite value was seen for this tensor")
        if method == CalibrationMethod.MinMax:
            if options.get("CalibMovingAverage"):
                return float(self.moving_min), float(self.moving_max)
            return self.min, self.max
        if self.counts is None or self.counts.sum() == 0:
            return self.min, self.max
        width = self.limit / self.bins
        if method == CalibrationMethod.Percentile:
            p = float(options.get("CalibPercentile", 99.999))
            if not 0 < p <= 100:
                raise InvalidArgument(f"CalibPercentile must be in (0, 100], not {p}")
            if options.get("CalibTensorRangeSymmetric"):
                cdf = np.cumsum(self._abs_counts()) / self.counts.sum()
                t = (int(np.searchsorted(cdf, p / 100.0)) + 1) * width
                return max(self.min, -t), min(self.max, t)
            cut = (100.0 - p) / 200.0
            cdf = np.cumsum(self.counts) / self.counts.sum()
            lo = -self.limit + int(np.searchsorted(cdf, cut)) * width
            hi = -self.limit + (int(np.searchsorted(cdf, 1.0 - cut)) + 1) * width
            return max(self.min, lo), min(self.max, hi)
        if method == CalibrationMethod.Entropy:
            q = options.get("CalibNumQuantizedBins") or (256 if self.min >= 0 else 128)
            # exact zeros (half of a ReLU's output) are exact in any range: left in, their
            # spike would make every threshold look alike and pick a short one
            hist = self._abs_counts().copy()
            hist[0] -= min(int(hist[0]), self.zeros)
            t = _kl_threshold(hist, int(q)) * width
            return max(self.min, -t), min(self.max, t)
        raise InvalidArgument(f"calibrate_method {method} is not supported; use MinMax, Entropy or Percentile")

    def _abs_counts(self) -> np.ndarray:
        """The histogram of ``|x|``: bin k covers [k, k + 1) widths."""
        return self.counts[self.bins:] + self.counts[:self.bins][::-1]


def _kl_threshold(hist: np.ndarray, quantized_bins: int, candidates: int = 96) -> int:
    """How many bins of ``hist`` (of ``|x|``) to keep: the count whose clipped
    distribution, quantized to ``quantized_bins`` levels, is closest in KL divergence.
    ``candidates`` evenly spaced counts are tried (each costs a pass over the bins)."""
    last = int(np.nonzero(hist)[0].max()) + 1 if hist.any() else 1
    if last <= quantized_bins:
        return last
    best, best_kl = last, math.inf
    step = max(1, (last - quantized_bins) // candidates)
    for i in list(range(quantized_bins, last, step)) + [last]:
        p = hist[:i].astype(np.float64)
        p[-1] += hist[i:].sum()
        nz = hist[:i] != 0
        edges = (np.arange(quantized_bins) * i) // quantized_bins
        sums = np.add.reduceat(hist[:i].astype(np.float64), edges)
        nonzero = np.add.reduceat(nz.astype(np.float64), edges)
        group = np.repeat(np.arange(quantized_bins), np.diff(np.append(edges, i)))
        q = np.where(nz, (sums / np.maximum(nonzero, 1))[group], 0.0)
        ps, qs = p.sum(), q.sum()
        if qs == 0:
            continue
        pn, qn = p / ps, q / qs
        mask = pn > 0
        # a bin P holds and Q does not is the clipped-off mass landing in the last bin
        kl = float(np.sum(pn[mask] * np.log(pn[mask] / np.maximum(qn[mask], 1e-12))))
        if kl < best_kl:
            best, best_kl = i, kl
    return best


# -- running the model ------------------------------------------------------------------
def _augmented(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """``model`` with each of ``tensors`` also a graph output."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for t in tensors:
        if t not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=t))
            have.add(t)
    return m


def _batch_stats(predictor, batch: Mapping[str, np.ndarray], tensors: Sequence[str], bins: int,
                 histogram: bool) -> dict[str, TensorStats]:
    """One batch's :class:`TensorStats` per tensor (runs wherever ``predictor`` lives)."""
    # the feeds go to the session as they are: a calibration batch is the model's own
    # inputs (scalars too), not a table of rows to map onto them
    session = predictor.session
    names = [o.name for o in session.get_outputs()]
    outs = dict(zip(names, session.run(None, dict(batch))))
    stats = {}
    for t in tensors:
        s = TensorStats(bins, histogram)
        v = outs.get(t)
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            s.update(v)
        stats[t] = s
    return stats


def _progress(show: bool, total: int | None, what: str):
    """A rich progress bar on stderr (on a terminal only), gone when done."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    con = Console(stderr=True)
    return Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=con, transient=True, disable=not (show and con.is_terminal))


def _batches(reader) -> Iterator[dict]:
    if isinstance(reader, CalibrationDataReader) or hasattr(reader, "get_next"):
        while True:
            b = reader.get_next()
            if b is None:
                return
            yield b
    elif isinstance(reader, Iterable):
        yield from reader
    else:
        raise InvalidArgument(f"calibration_data_reader must be a CalibrationDataReader or an iterable of feeds, "
                              f"not {type(reader).__name__}")


def _chunks(it: Iterator[dict], size: int) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for b in it:
        chunk.append(b)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Runner:
    """Runs chunks of batches: here, on Dask, or on Ray. The predictor reaches each
    worker once per calibration (a scattered Dask future, a pool of Ray actors), so
    every worker builds one session, however many chunks follow."""

    def __init__(self, parallel, predictor, tensors: Sequence[str], bins: int, histogram: bool):
        self.args = (tensors, bins, histogram)
        self.predictor = predictor
        self.kind, self.client, self.shared, self.actors = None, None, None, []
        if parallel is None:
            return
        kind = parallel if isinstance(parallel, str) else type(parallel).__module__.split(".")[0]
        if kind in ("dask", "distributed"):
            self.kind = "dask"
            client = parallel if not isinstance(parallel, str) else _current_dask_client()
            if client is not None:
                self.client = client
                self.shared = client.scatter(predictor, broadcast=True, hash=False)
        elif kind == "ray":
            import ray

            if not ray.is_initialized():
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            self.kind = "ray"
            workers = max(1, int(ray.available_resources().get("CPU", 1)))
            actor = ray.remote(num_cpus=1)(_RayWorker)
            self.actors = [actor.remote(predictor, *self.args) for _ in range(workers)]
        else:
            raise InvalidArgument(f"parallel must be None, 'dask', 'ray' or a dask.distributed Client, "
                                  f"not {parallel!r}")

    def __call__(self, chunk: list[dict]) -> list[dict[str, TensorStats]]:
        """Each batch's stats, in batch order."""
        if self.kind is None:
            return [_batch_stats(self.predictor, b, *self.args) for b in chunk]
        if self.kind == "dask" and self.client is not None:
            futures = [self.client.submit(_batch_stats, self.shared, b, *self.args, pure=False) for b in chunk]
            return list(self.client.gather(futures))
        if self.kind == "dask":
            import dask

            shared = dask.delayed(self.predictor, pure=True)
            tasks = [dask.delayed(_batch_stats, pure=True)(shared, b, *self.args) for b in chunk]
            return list(dask.compute(*tasks))
        import ray

        refs = [self.actors[i % len(self.actors)].stats.remote(b) for i, b in enumerate(chunk)]
        return ray.get(refs)

    def close(self) -> None:
        """Release the actors."""
        if self.actors:
            import ray

            for a in self.actors:
                ray.kill(a)
            self.actors = []


class _RayWorker:
    """A Ray actor holding one predictor (one session) for the whole calibration."""

    def __init__(self, predictor, tensors, bins, histogram):
        self.predictor, self.args = predictor, (tensors, bins, histogram)

    def stats(self, batch):
        return _batch_stats(self.predictor, batch, *self.args)


def _current_dask_client():
    """The default ``dask.distributed`` client, if one is running (else Dask's local scheduler)."""
    try:
        from distributed import get_client
    except ImportError:
        return None
    try:
        return get_client()
    except ValueError:
        return None


def collect_ranges(
    model: onnx.ModelProto,
    data_reader,
    tensors: Sequence[str],
    method: CalibrationMethod = CalibrationMethod.MinMax,
    providers: Sequence | None = None,
    extra_options: Mapping[str, Any] | None = None,
    parallel=None,
    show_progress: bool = True,
) -> dict[str, tuple[float, float]]:
    """Run ``model`` on onnxrt over ``data_reader``'s batches and return the calibrated
    range ``(rmin, rmax)`` of each of ``tensors`` (float tensors of the model).

    :param data_reader: a :class:`CalibrationDataReader`, or any iterable of feeds.
    :param providers: the onnxrt providers that run the model (default: all available).
    :param extra_options: the ``Calib*`` options of :data:`CALIBRATION_OPTIONS`.
    :param parallel: ``None`` (this process), ``"dask"`` (the current Dask client or
        scheduler), a ``dask.distributed.Client``, or ``"ray"``: batches run on the
        workers through a :class:`~onnxrt.Predictor`, ``CalibParallelChunk`` at a time.
    :param show_progress: a progress bar on stderr when it is a terminal.
    :raises InvalidArgument: no batch, or a tensor no batch gave a finite value for.
    """
    options = {**CALIBRATION_OPTIONS, **dict(extra_options or {})}
    method = method if isinstance(method, CalibrationMethod) else CalibrationMethod.from_string(method)
    if method == CalibrationMethod.Distribution:
        raise InvalidArgument("calibrate_method Distribution is not supported; use MinMax, Entropy or Percentile")
    bins = int(options["CalibNumBins"])
    if bins < 16:
        raise InvalidArgument(f"CalibNumBins must be at least 16, not {bins}")
    histogram = method != CalibrationMethod.MinMax
    moving = float(options["CalibMovingAverageConstant"]) if options["CalibMovingAverage"] else None
    tensors = list(dict.fromkeys(tensors))

    from ..predictor import Predictor
    from ..options import SessionOptions

    so = SessionOptions()
    so.graph_optimization_level = 1  # folding constants only: every exposed tensor stays the float model's
    predictor = Predictor(_augmented(model, tensors), providers=providers, sess_options=so,
                          num_threads=1 if parallel is not None else None)
    total = len(data_reader) if hasattr(data_reader, "__len__") else None
    merged = {t: TensorStats(bins, histogram) for t in tensors}
    seen = 0
    runner = _Runner(parallel, predictor, tensors, bins, histogram)
    try:
        with _progress(show_progress, total, "calibrating") as bar:
            task = bar.add_task("calibrating", total=total)
            size = int(options["CalibParallelChunk"]) if parallel is not None else 1
            for chunk in _chunks(_batches(data_reader), max(1, size)):
                for stats in runner(chunk):  # in batch order, which the moving average needs
                    for t in tensors:
                        merged[t].merge(stats[t], moving)
                seen += len(chunk)
                bar.update(task, advance=len(chunk))
    finally:
        runner.close()
    if seen == 0:
        raise InvalidArgument("the calibration data reader gave no batches")
    ranges = {}
    for t in tensors:
        if merged[t].batches == 0:
            continue  # not a float tensor at run time (the quantizers leave it in float)
        ranges[t] = merged[t].range(method, options)
    return ranges
