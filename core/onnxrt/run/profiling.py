"""Profiling to Chrome-trace JSON in onnxruntime's event schema.

Each node run is an event ``{"cat": "Node", "ph": "X", "name": "<node>_kernel_time",
"ts", "dur" (µs), "pid", "tid", "args": {"op_name", "provider", "node_name",
"output_size", "output_type_shape"}}``, the fields and spellings onnxruntime writes
(``output_type_shape`` is a list of ``{"float": [1, 16, 32, 32]}``); session phases
are ``"cat": "Session"`` events. The file is a JSON array of events, as onnxruntime's
is, which Perfetto and chrome://tracing open.

:func:`load_trace` and :func:`op_time_table` read a trace back (onnxrt's or
onnxruntime's) and total the time per op type.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from datetime import datetime

import numpy as np

__all__ = ["Profiler", "load_trace", "op_time_table"]


class Profiler:
    """Collects events for one session; thread safe.

    A node's event is recorded as a tuple (the step, its times, its thread and its
    outputs' types, shapes and sizes) and made the trace's dict only when the events are
    read: the work between two profiled nodes is then a list append, so that it does not
    show as the time of the node around them (an If's body ran 60 nodes whose events,
    built as dicts on the spot, made the If's own time most of the profile's)."""

    def __init__(self, session_options):
        self.prefix = session_options.profile_file_prefix or "onnxrt_profile"
        self.start_ns = time.time_ns()
        self._t0 = time.perf_counter_ns()
        # dicts (session phases) and tuples (nodes, see node_event), in the order recorded
        self._records: list = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def events(self) -> list[dict]:
        """Every event recorded so far, as the trace's dicts."""
        with self._lock:
            records = list(self._records)
        return [r if type(r) is dict else self._node_dict(r) for r in records]

    def now(self) -> int:
        """A monotonic timestamp in nanoseconds."""
        return time.perf_counter_ns()

    def _us(self, t: int) -> int:
        return (t - self._t0) // 1000

    def session_event(self, name: str, t0: int) -> None:
        """Record a session phase that started at ``t0`` and ends now."""
        t1 = time.perf_counter_ns()
        self._add({"cat": "Session", "ph": "X", "name": name, "ts": self._us(t0), "dur": max(0, (t1 - t0) // 1000),
                   "pid": self._pid, "tid": threading.get_ident(), "args": {}})

    def node_event(self, step, t0: int, t1: int, outputs) -> None:
        """Record one node's run (its outputs' types and shapes, not the outputs: a
        profile keeps no value alive)."""
        outs = tuple((v.dtype, v.shape, v.nbytes) if type(v) is np.ndarray else _described(v) for v in outputs)
        self._records.append((step, t0, t1, threading.get_ident(), outs))  # one append: atomic

    def _node_dict(self, record: tuple) -> dict:
        step, t0, t1, tid, outs = record
        size = 0
        shapes = []
        for o in outs:
            if type(o) is tuple:
                size += o[2]
                shapes.append(_type_shape_of(o[0], o[1]))
            else:
                shapes.append({o.__name__: []})
        return {
            "cat": "Node", "ph": "X", "name": f"{step.node_name}_kernel_time", "ts": self._us(t0),
            # whole microseconds, as onnxruntime writes them, rounded: truncated, a
            # body of sixty sub-microsecond nodes lost half a microsecond each to its If
            "dur": max(0, (t1 - t0 + 500) // 1000), "pid": self._pid, "tid": tid,
            "args": {"op_name": step.op_type, "provider": step.provider, "node_name": step.node_name,
                     "output_size": str(size), "output_type_shape": shapes},
        }

    def _add(self, ev: dict) -> None:
        with self._lock:
            self._records.append(ev)

    def write(self, path: str | None = None) -> str:
        """Write the trace and return its path."""
        if path is None:
            stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
            path = f"{self.prefix}_{stamp}.json"
        events = self.events
        with open(path, "w") as f:
            json.dump(events, f)
        return path


def _described(v):
    """A node output that is not a numpy array, as a node event keeps it: ``(dtype,
    shape, bytes)`` for a device array, else its class (a sequence, an empty optional)."""
    dtype = getattr(v, "dtype", None)
    shape = getattr(v, "shape", None)
    if dtype is None or shape is None:
        return v.__class__
    return (dtype, tuple(shape), getattr(v, "nbytes", 0) or 0)


def _type_shape(v) -> dict:
    """``{"float": [2, 3]}``, as onnxruntime writes a value's type and shape."""
    dtype = getattr(v, "dtype", None)
    shape = getattr(v, "shape", None)
    if dtype is None or shape is None:
        return {type(v).__name__: []}
    return _type_shape_of(dtype, shape)


def _type_shape_of(dtype, shape) -> dict:
    try:
        from ..dtypes import elem_type_name, onnx_elem_type

        name = elem_type_name(onnx_elem_type(np.dtype(dtype)))
    except (TypeError, ValueError):
        name = str(dtype)
    return {name: [int(d) for d in shape]}


def load_trace(path) -> list[dict]:
    """The events of a Chrome-trace file: a JSON array, or an object with ``traceEvents``."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: not a Chrome trace (expected a JSON array of events)")
    return data


def op_time_table(events: list[dict], runs: int = 1) -> list[dict]:
    """Time per op type over the ``"Node"`` events, most expensive first.

    Each row: ``op_type``, ``providers`` (sorted), ``calls`` (per run), ``total_us``
    (per run), ``mean_us`` (per call) and ``share`` (of all node time, 0..1).
    """
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    providers: dict[str, set] = defaultdict(set)
    for ev in events:
        if ev.get("cat") != "Node" or ev.get("ph") != "X":
            continue
        args = ev.get("args", {})
        op = args.get("op_name", "?")
        total[op] += float(ev.get("dur", 0))
        calls[op] += 1
        providers[op].add(args.get("provider", "?"))
    grand = sum(total.values()) or 1.0
    runs = max(1, runs)
    rows = [{"op_type": op, "providers": sorted(providers[op]), "calls": calls[op] / runs,
             "total_us": t / runs, "mean_us": t / calls[op], "share": t / grand} for op, t in total.items()]
    rows.sort(key=lambda r: -r["total_us"])
    return rows
