"""``Predictor``: a picklable model and its settings, for batch inference on many workers.

An ``InferenceSession`` holds compiled kernels and cannot be pickled, so it cannot be
shipped to Ray actors or Dask workers. A ``Predictor`` keeps only the model (a path or
the serialized bytes) and the settings; each process that calls it builds its own
session on the first call, once, and unpickling never carries a session along.

Calling a predictor on a batch maps the batch's columns to the model's inputs:

- a ``dict[str, ndarray]`` (Ray's ``"numpy"`` batch format) or a pandas DataFrame;
- a column whose name is an input's name feeds that input; ``input_map`` overrides
  this per input, naming one column or a list of columns;
- a model with a single input takes the batch's only column whatever its name, or,
  when the batch has several columns and none is named after the input, every
  column in order, stacked side by side (one feature per column);
- several columns named for one input are stacked side by side into ``[rows, columns]``;
- a column of arrays (an object column holding one array per row) is stacked into
  ``[rows, *row_shape]``; a 1-D column feeding a rank-2 input becomes ``[rows, 1]``;
- columns no input uses are ignored.

Casts are limited to the ones users expect from tabular data: a floating column into
a floating input of another width (pandas' float64 into a float32 model, rounding to
nearest) and an integer or boolean column into a floating input (exact up to 2**24
for float32). Any other mismatch is left to the session, which raises
:class:`~onnxrt.errors.InvalidArgument` naming the input and both dtypes.

Errors raised while a batch runs keep their type and gain a prefix naming the batch
(its number in this process, its row count and, for a DataFrame, its index range),
so a failing partition is never silently skipped.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import os
import pickle
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from .errors import Fail, InvalidArgument, NoModel, OnnxRtError
from .options import SessionOptions
from .run.feeds import NodeArg

__all__ = ["Predictor", "as_predictor", "outputs_to_frame"]

# Attributes rebuilt in each process, never pickled.
_PROCESS_LOCAL = ("_session", "_lock", "_batches", "_io")


class Predictor:
    """A picklable model plus settings; builds its :class:`InferenceSession` lazily.

    :param model: a model path, serialized bytes, or an ``onnx.ModelProto`` (stored as
        bytes). A relative path is made absolute here; on a cluster without a shared
        file system pass the bytes instead.
    :param providers: as for ``InferenceSession`` (``None``: every available one).
    :param sess_options: a :class:`SessionOptions`, copied.
    :param num_threads: sets ``intra_op_num_threads``, so that several workers on one
        machine do not each start a thread per core.
    :param outputs: the output names to compute (``None``: all), or one name.
    :param input_map: ``{model_input: column}`` or ``{model_input: [columns...]}``;
        listed columns are stacked side by side into that input.
    """

    def __init__(
        self,
        model,
        providers: Sequence | None = None,
        sess_options: SessionOptions | None = None,
        num_threads: int | None = None,
        outputs: str | Sequence[str] | None = None,
        input_map: Mapping[str, str | Sequence[str]] | None = None,
    ):
        self._model = _normalize_model(model)
        if providers is not None and (isinstance(providers, (str, bytes)) or not isinstance(providers, Sequence)):
            raise InvalidArgument(f"providers must be a list of provider names, not {providers!r}")
        self._providers = list(providers) if providers is not None else None
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise InvalidArgument(f"sess_options must be a SessionOptions, not {type(sess_options).__name__}")
        self._sess_options = copy.deepcopy(sess_options) if sess_options is not None else None
        if num_threads is not None and (
            isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1
        ):
            raise InvalidArgument(f"num_threads must be a positive int or None, not {num_threads!r}")
        self._num_threads = num_threads
        if isinstance(outputs, str):
            outputs = [outputs]
        if outputs is not None and not all(isinstance(o, str) for o in outputs):
            raise InvalidArgument(f"outputs must be output names, not {outputs!r}")
        self._outputs = list(outputs) if outputs is not None else None
        self._input_map = _normalize_input_map(input_map)
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._session = None
        self._lock = threading.Lock()
        self._batches = itertools.count(1)
        self._io: tuple[list[NodeArg], list[NodeArg]] | None = None

    # -- pickling: the model and the settings only ------------------------------------
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in _PROCESS_LOCAL}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def __dask_tokenize__(self) -> str:
        """A stable token, so Dask names the same predictor the same way in every graph."""
        h = hashlib.sha256(pickle.dumps(self.__getstate__()))
        if isinstance(self._model, str) and os.path.exists(self._model):
            # a rewritten model file is a different predictor
            st = os.stat(self._model)
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        return "onnxrt.Predictor-" + h.hexdigest()

    # -- the session ----------------------------------------------------------------------
    @property
    def model(self) -> str | bytes:
        """The model as stored: an absolute path, or serialized bytes."""
        return self._model

    @property
    def is_loaded(self) -> bool:
        """Whether this process has built the session yet."""
        return self._session is not None

    def session_options(self) -> SessionOptions:
        """The :class:`SessionOptions` the session is built with (a fresh copy)."""
        so = copy.deepcopy(self._sess_options) if self._sess_options is not None else SessionOptions()
        if self._num_threads is not None:
            so.intra_op_num_threads = self._num_threads
        return so

    @property
    def session(self):
        """This process's :class:`InferenceSession`, built on first use (thread-safe)."""
        session = self._session
        if session is None:
            with self._lock:
                session = self._session
                if session is None:
                    from .session import InferenceSession

                    session = InferenceSession(self._model, self.session_options(), providers=self._providers)
                    if self._outputs is not None:
                        known = [a.name for a in session.get_outputs()]
                        unknown = [o for o in self._outputs if o not in known]
                        if unknown:
                            raise InvalidArgument(
                                f"Predictor outputs {unknown} are not outputs of the model; "
                                f"its outputs are: {', '.join(known)}"
                            )
                    self._session = session
        return session

    def input_info(self) -> list[NodeArg]:
        """The model's inputs, read from the model without building a session."""
        return self._declared_io()[0]

    def output_info(self) -> list[NodeArg]:
        """The selected outputs (all by default), read from the model without a session."""
        outs = self._declared_io()[1]
        if self._outputs is None:
            return outs
        by_name = {a.name: a for a in outs}
        unknown = [o for o in self._outputs if o not in by_name]
        if unknown:
            raise InvalidArgument(
                f"Predictor outputs {unknown} are not outputs of the model; its outputs are: {', '.join(by_name)}"
            )
        return [by_name[o] for o in self._outputs]

    def _declared_io(self) -> tuple[list[NodeArg], list[NodeArg]]:
        if self._session is not None:
            return self._session.get_inputs(), self._session.get_outputs()
        if self._io is None:
            from .load.model import load_model

            if isinstance(self._model, bytes):
                proto, _ = load_model(self._model)
            else:
                if not os.path.isfile(self._model):
                    load_model(self._model)  # raises the typed "no such file" error
                proto = onnx.load(self._model, load_external_data=False)
            g = proto.graph
            inits = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
            self._io = (
                [NodeArg(v.name, v.type) for v in g.input if v.name not in inits],
                [NodeArg(v.name, v.type) for v in g.output],
            )
        return self._io

    # -- running --------------------------------------------------------------------------
    def __call__(self, batch, *, batch_id: str | None = None) -> dict[str, Any]:
        """Run one batch; return ``{output_name: array}`` for the selected outputs.

        :param batch: a ``dict[str, ndarray]``, a pandas DataFrame (see the module doc),
            or, for a model with one input, a bare array.
        :param batch_id: how errors name this batch (default: its number in this
            process, its row count and its index range).
        """
        label = batch_id or self._describe_batch(batch)
        session = self.session
        feeds = self.feeds(batch, batch_id=label)
        try:
            outs = session.run(self._outputs, feeds)
        except OnnxRtError as e:
            raise type(e)(f"{label}: {e}") from e
        except Exception as e:
            raise Fail(f"{label}: {type(e).__name__}: {e}") from e
        names = self._outputs or [a.name for a in session.get_outputs()]
        return dict(zip(names, outs))

    def predict_frame(self, frame, *, keep_columns: Sequence[str] = (), batch_id: str | None = None):
        """Run a DataFrame; return a DataFrame with the same index.

        ``keep_columns`` are copied from the input first, then one column per output:
        1-D outputs as they are, N-D outputs as an object column of per-row arrays.
        """
        pd = _pandas()
        if not isinstance(frame, pd.DataFrame):
            raise InvalidArgument(f"predict_frame needs a pandas DataFrame, not {type(frame).__name__}")
        label = batch_id or self._describe_batch(frame)
        missing = [c for c in keep_columns if c not in frame.columns]
        if missing:
            raise InvalidArgument(f"{label}: keep_columns {missing} are not columns of the batch")
        outs = self(frame, batch_id=label)
        clash = [c for c in keep_columns if c in outs]
        if clash:
            raise InvalidArgument(f"keep_columns {clash} have the same names as model outputs")
        result = outputs_to_frame(outs, index=frame.index, batch_id=label)
        for i, c in enumerate(keep_columns):
            result.insert(i, c, frame[c].to_numpy())
        return result

    def feeds(self, batch, *, batch_id: str | None = None) -> dict[str, Any]:
        """The session feed for ``batch``: columns mapped, stacked and cast (see the module doc)."""
        label = batch_id or self._describe_batch(batch)
        inputs = self.session.get_inputs()
        if isinstance(batch, np.ndarray):
            if len(inputs) != 1:
                raise InvalidArgument(
                    f"{label}: a bare array can only feed a model with one input; this one has "
                    f"{', '.join(a.name for a in inputs)}: pass a dict of name -> array"
                )
            batch = {inputs[0].name: batch}
        columns = _Columns(batch, label)
        sources = self._sources(inputs, columns.names, label, columns.listing())
        return {
            arg.name: _feed_value(arg, sources[arg.name], columns, label, self._auto(arg.name, columns.names))
            for arg in inputs
        }

    def column_sources(self, columns: Sequence[str], *, batch_id: str = "the batch") -> dict[str, str | list[str]]:
        """Which column(s) feed each model input, for a batch with these columns.

        Reads the model without building a session, so a driver can check a table's
        columns before any work is sent out; a missing column is ``InvalidArgument``.
        """
        names = list(columns)
        listing = _Columns.describe(names)
        inputs = self.input_info()
        sources = self._sources(inputs, names, batch_id, listing)
        for arg in inputs:
            src = sources[arg.name]
            for col in [src] if isinstance(src, str) else src:
                if col not in names:
                    raise InvalidArgument(
                        f"{batch_id} has no column {col!r} (for model input {arg.name!r}); its columns are: {listing}"
                    )
            width = arg.shape[1] if arg.shape is not None and len(arg.shape) == 2 else None
            if isinstance(src, list) and isinstance(width, int) and width != len(src):
                raise InvalidArgument(
                    f"{batch_id}: input {arg.name!r} takes {width} features per row but {len(src)} columns "
                    "would be stacked into it; choose them with input_map="
                )
        return sources

    def _auto(self, name: str, columns: Sequence[str]) -> bool:
        return name not in self._input_map and name not in columns

    def _sources(self, inputs: list[NodeArg], columns: list, label: str, listing: str) -> dict[str, str | list[str]]:
        sources: dict[str, str | list[str]] = {}
        for arg in inputs:
            source = self._input_map.get(arg.name)
            if source is None:
                if arg.name in columns:
                    source = arg.name
                elif len(inputs) == 1 and len(columns) == 1:
                    source = columns[0]
                elif len(inputs) == 1 and len(columns) > 1:
                    source = list(columns)
                else:
                    raise InvalidArgument(
                        f"{label} has no column {arg.name!r} for model input {arg.name!r}; "
                        f"its columns are: {listing} (map columns with input_map=)"
                    )
            sources[arg.name] = source
        return sources

    def _describe_batch(self, batch) -> str:
        n = next(self._batches)
        rows = _num_rows(batch)
        where = f"batch {n} in process {os.getpid()}"
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(batch, pd.DataFrame) and len(batch.index):
            return f"{where} ({rows} rows, index {batch.index[0]!r}..{batch.index[-1]!r})"
        return f"{where} ({rows} rows)" if rows is not None else where

    def __repr__(self) -> str:
        model = self._model if isinstance(self._model, str) else f"<{len(self._model)} bytes>"
        return (
            f"Predictor({model!r}, providers={self._providers}, num_threads={self._num_threads}, "
            f"outputs={self._outputs}, loaded={self.is_loaded})"
        )


def outputs_to_frame(outputs: Mapping[str, Any], index=None, *, batch_id: str = "batch"):
    """A DataFrame from ``{name: output}``: 1-D outputs as columns, N-D as per-row arrays.

    Every output must have one entry per row (the length of ``index`` when given), so
    no rows are dropped or invented silently.
    """
    pd = _pandas()
    n = len(index) if index is not None else None
    data: dict[str, Any] = {}
    for name, value in outputs.items():
        rows = len(value) if hasattr(value, "__len__") else None
        if n is None:
            n = rows
        if rows != n:
            raise InvalidArgument(
                f"{batch_id}: output {name!r} has {rows} rows but the batch has {n}; "
                "only outputs with one entry per row fit a DataFrame (choose them with outputs=)"
            )
        if isinstance(value, np.ndarray) and value.ndim > 1:
            col = np.empty(n, dtype=object)
            col[:] = list(value)
            data[name] = col
        elif isinstance(value, np.ndarray):
            data[name] = value
        else:
            col = np.empty(n, dtype=object)
            col[:] = list(value)
            data[name] = col
    return pd.DataFrame(data, index=index)


def as_predictor(model, **settings) -> Predictor:
    """``model`` itself if it is a :class:`Predictor`, else ``Predictor(model, **settings)``.

    Giving both a ready predictor and settings is an error, not a silent choice.
    """
    given = sorted(k for k, v in settings.items() if v is not None)
    if isinstance(model, Predictor):
        if given:
            raise InvalidArgument(
                f"pass either a Predictor or a model with settings, not both (got {', '.join(given)})"
            )
        return model
    return Predictor(model, **settings)


# -- helpers ------------------------------------------------------------------------------
def _pandas():
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - pandas ships with the ray/dask extras
        raise ImportError("DataFrame support needs pandas: pip install 'onnxrt[dask]' or 'onnxrt[ray]'") from e
    return pd


def _normalize_model(model) -> str | bytes:
    if model is None:
        raise NoModel("Predictor needs a model: a path, bytes or an onnx.ModelProto")
    if isinstance(model, ModelProto):
        try:
            return model.SerializeToString()
        except ValueError as e:  # protobuf refuses models over 2 GiB
            raise InvalidArgument(
                f"the ModelProto cannot be serialized ({e}); save it with external data and pass the path"
            ) from e
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        if not data:
            raise NoModel("Predictor got an empty model (0 bytes)")
        return data
    if isinstance(model, (str, os.PathLike)):
        return os.path.abspath(os.fspath(model))
    raise InvalidArgument(f"model must be a path, bytes or onnx.ModelProto, not {type(model).__name__}")


def _normalize_input_map(input_map) -> dict[str, str | list[str]]:
    if input_map is None:
        return {}
    if not isinstance(input_map, Mapping):
        raise InvalidArgument(f"input_map must map model input names to columns, not {type(input_map).__name__}")
    out: dict[str, str | list[str]] = {}
    for name, cols in input_map.items():
        if isinstance(cols, str):
            out[name] = cols
        elif isinstance(cols, Sequence) and cols and all(isinstance(c, str) for c in cols):
            out[name] = list(cols)
        else:
            raise InvalidArgument(
                f"input_map[{name!r}] must be a column name or a non-empty list of names, not {cols!r}"
            )
    return out


def _num_rows(batch) -> int | None:
    if hasattr(batch, "shape") and getattr(batch, "ndim", 0) >= 1:
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        for v in batch.values():
            return len(v) if hasattr(v, "__len__") else None
    return None


class _Columns:
    """Uniform access to a dict-of-arrays batch or a DataFrame's columns."""

    def __init__(self, batch, label: str):
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(batch, pd.DataFrame):
            self._frame = batch
            self.names = [c for c in batch.columns]
        elif isinstance(batch, Mapping):
            self._frame = None
            self._dict = batch
            self.names = list(batch)
        else:
            raise InvalidArgument(
                f"{label}: a batch must be a dict of column name -> array or a pandas DataFrame, "
                f"not {type(batch).__name__}"
            )
        self.label = label

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __len__(self) -> int:
        return len(self.names)

    def listing(self) -> str:
        return self.describe(self.names)

    @staticmethod
    def describe(names: list) -> str:
        """Column names for an error message, the first 20 of them."""
        shown = ", ".join(repr(c) for c in names[:20])
        return shown + (f", ... ({len(names)} in all)" if len(names) > 20 else "") if names else "none"

    def array(self, name: str, input_name: str) -> np.ndarray:
        if name not in self.names:
            raise InvalidArgument(
                f"{self.label} has no column {name!r} (for model input {input_name!r}); "
                f"its columns are: {self.listing()}"
            )
        value = self._frame[name] if self._frame is not None else self._dict[name]
        if hasattr(value, "to_numpy"):
            value = value.to_numpy()
        value = np.asarray(value)
        if value.dtype == object and value.ndim == 1 and len(value) and isinstance(value[0], (np.ndarray, list, tuple)):
            try:
                value = np.stack([np.asarray(v) for v in value])
            except ValueError as e:
                raise InvalidArgument(
                    f"{self.label}: column {name!r} holds arrays of different shapes, which cannot be "
                    f"stacked into input {input_name!r}: {e}"
                ) from None
        return value


def _tensor_dtype(arg: NodeArg) -> np.dtype | None:
    """The numpy dtype of a tensor input or output; ``None`` for other types."""
    if not (arg.type.startswith("tensor(") and arg.type.endswith(")")):
        return None
    try:
        code = TensorProto.DataType.Value(arg.type[len("tensor("):-1].upper())
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
    except (ValueError, KeyError, TypeError):
        return None


def _safe_cast(value: np.ndarray, want: np.dtype | None) -> np.ndarray:
    if want is None or value.dtype == want or want.kind != "f":
        return value
    if value.dtype.kind in "fiub":
        return value.astype(want)
    return value


def _feed_value(arg: NodeArg, source: str | list[str], columns: _Columns, label: str, auto: bool) -> np.ndarray:
    """One input's value; ``auto`` when the columns were chosen by the single-input rule."""
    want = _tensor_dtype(arg)
    rank = len(arg.shape) if arg.shape is not None else None
    if isinstance(source, str):
        value = _safe_cast(_not_text(columns.array(source, arg.name), source, arg, want, label), want)
        if rank == 2 and value.ndim == 1:
            value = value.reshape(-1, 1)
        return value
    parts = []
    for name in source:
        part = columns.array(name, arg.name)
        if part.ndim != 1 and auto:
            raise InvalidArgument(
                f"{label} has no column {arg.name!r} for model input {arg.name!r}, and its columns "
                f"({columns.listing()}) cannot be stacked into it: column {name!r} has shape {list(part.shape)}; "
                f"name the column with input_map={{{arg.name!r}: {name!r}}}"
            )
        if part.ndim != 1:
            raise InvalidArgument(
                f"{label}: column {name!r} has shape {list(part.shape)}; only 1-D columns can be "
                f"stacked side by side into input {arg.name!r}"
            )
        parts.append(_safe_cast(_not_text(part, name, arg, want, label), want))
    width = arg.shape[1] if arg.shape is not None and len(arg.shape) == 2 else None
    if isinstance(width, int) and width != len(parts):
        raise InvalidArgument(
            f"{label}: input {arg.name!r} takes {width} features per row but {len(parts)} columns were "
            f"stacked into it ({', '.join(repr(p) for p in source[:10])}{', ...' if len(source) > 10 else ''}); "
            "choose them with input_map="
        )
    return np.stack(parts, axis=1)


def _not_text(value: np.ndarray, column: str, arg: NodeArg, want: np.dtype | None, label: str) -> np.ndarray:
    """Refuse text feeding a numeric input, with the usual cause named."""
    if want is None or want.kind not in "fiub" or not len(value):
        return value
    if value.dtype.kind in "US" or (value.dtype == object and isinstance(value.flat[0], (str, bytes))):
        raise InvalidArgument(
            f"{label}: column {column!r} holds text ({value.flat[0]!r:.40}), but input {arg.name!r} is {arg.type}. "
            "A column of arrays stored by Dask becomes text unless dask.config 'dataframe.convert-string' is False"
        )
    return value
