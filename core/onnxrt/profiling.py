"""Profiling to Chrome-trace JSON in onnxruntime's event schema.

Each node run is an event ``{"cat": "Node", "ph": "X", "name": "<node>_kernel_time",
"ts", "dur" (µs), "pid", "tid", "args": {"op_name", "provider", "output_size"}}``;
session phases are ``"cat": "Session"`` events. Perfetto and chrome://tracing open it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime

__all__ = ["Profiler"]


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
        for v in outputs:
            size += getattr(v, "nbytes", 0) or 0
        self._add({
            "cat": "Node", "ph": "X", "name": f"{step.node_name}_kernel_time", "ts": self._us(t0),
            "dur": max(0, (t1 - t0) // 1000), "pid": self._pid, "tid": threading.get_ident(),
            "args": {"op_name": step.op_type, "provider": step.provider, "node_name": step.node_name,
                     "output_size": str(size)},
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
