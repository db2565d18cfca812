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
    """Collects events for one session; thread safe."""

    def __init__(self, session_options):
        self.prefix = session_options.profile_file_prefix or "onnxrt_profile"
        self.start_ns = time.time_ns()
        self._t0 = time.perf_counter_ns()
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

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
        """Record one node's run."""
        size = 0
        shapes = []
        for v in outputs:
            size += getattr(v, "nbytes", 0) or 0
            shapes.append(_type_shape(v))
        self._add({
            "cat": "Node", "ph": "X", "name": f"{step.node_name}_kernel_time", "ts": self._us(t0),
            "dur": max(0, (t1 - t0) // 1000), "pid": self._pid, "tid": threading.get_ident(),
            "args": {"op_name": step.op_type, "provider": step.provider, "node_name": step.node_name,
                     "output_size": str(size), "output_type_shape": shapes},
        })

    def _add(self, ev: dict) -> None:
        with self._lock:
            self.events.append(ev)

    def write(self, path: str | None = None) -> str:
        """Write the trace and return its path."""
        if path is None:
            stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
            path = f"{self.prefix}_{stamp}.json"
        with self._lock:
            events = list(self.events)
        with open(path, "w") as f:
            json.dump(events, f)
        return path


def _type_shape(v) -> dict:
    """``{"float": [2, 3]}``, as onnxruntime writes a value's type and shape."""
    dtype = getattr(v, "dtype", None)
    shape = getattr(v, "shape", None)
    if dtype is None or shape is None:
        return {type(v).__name__: []}
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
