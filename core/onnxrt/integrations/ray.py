"""Ray Data: run a model over a ``ray.data.Dataset`` with one session per actor.

``predict_dataset(ds, model)`` is ``ds.map_batches(PredictorUDF, ...)`` with the
settings filled in: a fixed pool of actors (``concurrency``), each holding one
:class:`~onnxrt.Predictor` whose session is built once when the actor starts; a GPU per
actor when the CUDA provider is available and the cluster has GPUs; one BLAS thread
per reserved CPU; and the input order kept. Each output batch holds the columns named
in ``keep_columns`` followed by one column per model output (N-D outputs become Ray
tensor columns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:
    import ray
    import ray.data
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "onnxrt.integrations.ray needs Ray Data; install it with: pip install 'onnxrt[ray]'"
    ) from e

from ..errors import InvalidArgument
from ..plugin.discovery import get_available_providers
from ..predictor import Predictor, as_predictor

__all__ = ["PredictorUDF", "predict_dataset"]

CUDA = "CUDAExecutionProvider"


class PredictorUDF:
    """A callable class for ``Dataset.map_batches``: one predictor and session per actor.

    :param predictor: the :class:`~onnxrt.Predictor` (pickled once per actor).
    :param keep_columns: input columns copied to the output ahead of the model's
        outputs, e.g. an id to join on.
    """

    def __init__(self, predictor: Predictor, keep_columns: Sequence[str] = ()):
        self.predictor = predictor
        self.keep_columns = tuple(keep_columns)
        # Build the session when the actor starts: a broken model fails before any
        # batch is taken, and the first batch does not pay for the build.
        _ = predictor.session

    def __call__(self, batch) -> dict[str, Any]:
        """Run one batch; return ``{column: array}``: kept columns, then the outputs."""
        out = self.predictor(batch)
        kept: dict[str, Any] = {}
        for name in self.keep_columns:
            if name not in batch:
                raise InvalidArgument(f"keep_columns names {name!r}, which the batch does not have")
            if name in out:
                raise InvalidArgument(f"keep_columns names {name!r}, which is also a model output")
            value = batch[name]
            kept[name] = value.to_numpy() if hasattr(value, "to_numpy") else value
        return {**kept, **out}


def predict_dataset(
    ds: ray.data.Dataset,
    model,
    *,
    providers: Sequence | None = None,
    sess_options=None,
    num_threads: int | None = None,
    outputs: str | Sequence[str] | None = None,
    input_map: Mapping[str, str | Sequence[str]] | None = None,
    keep_columns: Sequence[str] = (),
    batch_size: int | None = 4096,
    batch_format: str = "pandas",
    concurrency: int | tuple[int, int] | None = None,
    num_gpus: float | None = None,
    num_cpus: float = 1,
    preserve_order: bool = True,
    **map_batches_kwargs,
) -> ray.data.Dataset:
    """Add the model's predictions to ``ds``; returns a lazy ``Dataset``.

    :param model: a :class:`~onnxrt.Predictor`, or a path, bytes or ``ModelProto``
        with the predictor settings (``providers`` ... ``input_map``) given here.
    :param num_threads: ``intra_op_num_threads`` per actor; default ``num_cpus`` (at
        least 1). A ready ``Predictor`` keeps its own setting.
    :param keep_columns: input columns to carry into the output.
    :param batch_size: rows per call; ``batch_format``: ``"pandas"`` or ``"numpy"``.
    :param concurrency: actors in the pool, or ``(min, max)`` for an autoscaling pool;
        default: as many as the cluster's CPUs (or GPUs) allow.
    :param num_gpus: GPUs per actor; default 1 when ``CUDAExecutionProvider`` is
        available here and the cluster has GPUs, else 0.
    :param num_cpus: CPUs reserved per actor.
    :param preserve_order: keep the input order in the output (Ray's default is not to).
    :param map_batches_kwargs: passed on to ``Dataset.map_batches``.

    Ray is initialized (``ray.init()``, which honours ``RAY_ADDRESS``) if it is not yet.
    """
    if batch_format not in ("pandas", "numpy"):
        raise InvalidArgument(f"batch_format must be 'pandas' or 'numpy', not {batch_format!r}")
    if num_threads is None and not isinstance(model, Predictor):
        num_threads = max(1, int(num_cpus))
    predictor = as_predictor(
        model, providers=providers, sess_options=sess_options, num_threads=num_threads,
        outputs=outputs, input_map=input_map,
    )
    if not ray.is_initialized():
        ray.init()
    resources = ray.cluster_resources()
    if num_gpus is None:
        has_gpus = resources.get("GPU", 0) > 0
        num_gpus = 1 if has_gpus and CUDA in get_available_providers() else 0
    if concurrency is None:
        if num_gpus:
            concurrency = max(1, int(resources.get("GPU", 0) // num_gpus))
        else:
            concurrency = max(1, int(resources.get("CPU", 1) // max(num_cpus, 1e-9)))
    if isinstance(concurrency, tuple):
        compute = ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    elif isinstance(concurrency, int) and concurrency >= 1:
        compute = ray.data.ActorPoolStrategy(size=concurrency)
    else:
        raise InvalidArgument(f"concurrency must be a positive int or (min, max), not {concurrency!r}")
    out = ds.map_batches(
        PredictorUDF,
        fn_constructor_args=(predictor, tuple(keep_columns)),
        batch_size=batch_size,
        batch_format=batch_format,
        compute=compute,
        num_cpus=num_cpus,
        num_gpus=num_gpus or None,
        **_row_count_hint(),
        **map_batches_kwargs,
    )
    if preserve_order:
        out.context.execution_options.preserve_order = True
    return out


def _row_count_hint() -> dict[str, Any]:
    # One output row per input row lets newer Ray push limits down; older Ray lacks the flag.
    import inspect

    if "udf_modifying_row_count" in inspect.signature(ray.data.Dataset.map_batches).parameters:
        return {"udf_modifying_row_count": False}
    return {}
