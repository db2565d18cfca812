"""Dask: run a model over a Dask DataFrame or Array with one session per worker process.

The predictor enters the task graph once, as a ``dask.delayed`` value: the scheduler
ships it to each worker once, and every task on that worker receives the same object,
so the session is built once per worker (lazily, and safely when a worker runs several
threads), not once per partition.

- :func:`predict_dataframe`: ``DataFrame.map_partitions``; the result has the input's
  index and divisions, with the ``keep_columns`` first and then one column per output
  (1-D outputs as typed columns, N-D outputs as object columns of per-row arrays).
- :func:`predict_array`: ``Array.map_blocks`` over row blocks; one output as an array.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

try:
    import dask
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "onnxrt.integrations.dask needs dask[array,dataframe] and pandas; "
        "install them with: pip install 'onnxrt[dask]'"
    ) from e

from ..errors import InvalidArgument
from ..predictor import Predictor, _tensor_dtype, as_predictor

__all__ = ["frame_meta", "predict_array", "predict_dataframe"]


def frame_meta(predictor: Predictor, input_meta: pd.DataFrame, keep_columns: Sequence[str] = ()) -> pd.DataFrame:
    """The empty DataFrame describing :func:`predict_dataframe`'s result.

    Built from the model's declared outputs, without building a session: a rank-1
    tensor output is a column of its dtype; anything else is an object column.
    """
    missing = [c for c in keep_columns if c not in input_meta.columns]
    if missing:
        raise InvalidArgument(f"keep_columns {missing} are not columns of the DataFrame")
    data = {c: input_meta[c] for c in keep_columns}
    for arg in predictor.output_info():
        if arg.name in data:
            raise InvalidArgument(f"keep_columns names {arg.name!r}, which is also a model output")
        dtype = _tensor_dtype(arg)
        rank1 = arg.shape is not None and len(arg.shape) == 1
        data[arg.name] = pd.Series(dtype=dtype if (dtype is not None and rank1) else object)
    return pd.DataFrame(data, index=input_meta.index[:0])


def predict_dataframe(
    ddf: dd.DataFrame,
    model,
    *,
    providers: Sequence | None = None,
    sess_options=None,
    num_threads: int | None = None,
    outputs: str | Sequence[str] | None = None,
    input_map: Mapping[str, str | Sequence[str]] | None = None,
    keep_columns: Sequence[str] = (),
    meta: pd.DataFrame | None = None,
) -> dd.DataFrame:
    """The model's outputs for every row of ``ddf``, partition by partition (lazy).

    :param model: a :class:`~onnxrt.Predictor`, or a path, bytes or ``ModelProto``
        with the predictor settings given here.
    :param keep_columns: input columns copied into the result ahead of the outputs.
    :param meta: the result's empty DataFrame; default :func:`frame_meta`.

    The columns are checked against the model's inputs here, before any work is
    sent out; errors while running name the partition number and its index range.
    """
    if not isinstance(ddf, dd.DataFrame):
        raise InvalidArgument(f"predict_dataframe needs a dask DataFrame, not {type(ddf).__name__}")
    predictor = as_predictor(
        model, providers=providers, sess_options=sess_options, num_threads=num_threads,
        outputs=outputs, input_map=input_map,
    )
    keep = tuple(keep_columns)
    # a missing or miscounted column fails here, before any partition is computed
    predictor.column_sources(list(ddf.columns), batch_id="the DataFrame")
    if meta is None:
        meta = frame_meta(predictor, ddf._meta, keep)
    shared = dask.delayed(predictor, pure=True)
    return ddf.map_partitions(_predict_partition, shared, keep, meta, meta=meta)


def _predict_partition(part: pd.DataFrame, predictor: Predictor, keep: tuple, meta: pd.DataFrame,
                       partition_info=None) -> pd.DataFrame:
    number = partition_info["number"] if partition_info else "?"
    if len(part) == 0:
        # models need not accept zero rows; an empty partition has an empty answer
        return meta.iloc[:0].set_axis(part.index[:0], axis=0)
    label = f"partition {number} ({len(part)} rows, index {part.index[0]!r}..{part.index[-1]!r})"
    result = predictor.predict_frame(part, keep_columns=keep, batch_id=label)
    differ = {c: t for c, t in meta.dtypes.items() if c in result and result[c].dtype != t}
    return result.astype(differ) if differ else result


def predict_array(
    arr: da.Array,
    model,
    *,
    output: str | None = None,
    input_name: str | None = None,
    providers: Sequence | None = None,
    sess_options=None,
    num_threads: int | None = None,
) -> da.Array:
    """One output of the model for every row block of ``arr`` (lazy).

    ``arr``'s first axis is the batch; its other axes are merged into single chunks.
    :param output: which output (default: the first of the model's or predictor's).
    :param input_name: the input ``arr`` feeds (default: the model's only input).

    The output's shape beyond the batch comes from the model; where the model leaves
    it symbolic, the model is run once here on the first row to find it.
    """
    if not isinstance(arr, da.Array) or arr.ndim < 1:
        raise InvalidArgument(f"predict_array needs a dask Array with a batch axis, not {type(arr).__name__}")
    predictor = as_predictor(
        model, providers=providers, sess_options=sess_options, num_threads=num_threads,
        outputs=None if isinstance(model, Predictor) else output,
    )
    inputs = predictor.input_info()
    if input_name is None:
        if len(inputs) != 1:
            raise InvalidArgument(
                f"the model has inputs {[a.name for a in inputs]}; say which one the array feeds with input_name="
            )
        input_name = inputs[0].name
    elif input_name not in [a.name for a in inputs]:
        raise InvalidArgument(f"input_name {input_name!r} is not an input of the model: {[a.name for a in inputs]}")
    outs = {a.name: a for a in predictor.output_info()}
    if output is None:
        output = next(iter(outs))
    if output not in outs:
        raise InvalidArgument(f"output {output!r} is not an output of the predictor: {list(outs)}")
    dtype = _tensor_dtype(outs[output])
    if dtype is None:
        raise InvalidArgument(f"output {output!r} is {outs[output].type}, not a tensor; it cannot form an array")
    shape = outs[output].shape
    if shape is None or not all(isinstance(d, int) for d in shape[1:]):
        probe = predictor({input_name: np.asarray(arr[:1].compute())}, batch_id="the shape probe (row 0)")[output]
        shape = list(probe.shape)
    trailing = tuple(int(d) for d in shape[1:])
    if arr.ndim > 1 and any(len(c) > 1 for c in arr.chunks[1:]):
        arr = arr.rechunk({i: -1 for i in range(1, arr.ndim)})
    out_ndim = 1 + len(trailing)
    extra = {}
    if out_ndim < arr.ndim:
        extra["drop_axis"] = list(range(out_ndim, arr.ndim))
    elif out_ndim > arr.ndim:
        extra["new_axis"] = list(range(arr.ndim, out_ndim))
    shared = dask.delayed(predictor, pure=True)
    return arr.map_blocks(
        _predict_block, shared, input_name, output,
        dtype=dtype, chunks=(arr.chunks[0],) + tuple((d,) for d in trailing),
        meta=np.empty((0,) * out_ndim, dtype=dtype), **extra,
    )


def _predict_block(block: np.ndarray, predictor: Predictor, input_name: str, output: str,
                   block_info=None) -> np.ndarray:
    if block_info:
        start, stop = block_info[0]["array-location"][0]
        label = f"block {block_info[0]['chunk-location'][0]} (rows {start}..{stop - 1})"
    else:
        label = f"a block of {len(block)} rows"
    return predictor({input_name: block}, batch_id=label)[output]
