"""What the allocation-cap tests share: the cap they set, and a run that must be
refused before it allocates."""

from __future__ import annotations

import tracemalloc

import pytest

import onnxrt as ort

__all__ = ["CAP", "peak_during", "refused_run"]

#: 1 MiB for the capped sessions; every over-the-cap request is a few MiB or more
CAP = 1 << 20


def peak_during(fn) -> int:
    """The peak of the memory Python's allocators traced while ``fn()`` ran."""
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def refused_run(sess, feeds: dict, match: str = "max_allocation_bytes") -> tuple[str, int]:
    """Run ``sess`` on ``feeds``, which must fail with the cap's ``InvalidArgument``
    (its message matching ``match``): the message and the peak traced memory of the
    attempt."""
    errors = []

    def run():
        with pytest.raises(ort.InvalidArgument, match=match) as e:
            sess.run(None, feeds)
        errors.append(str(e.value))

    peak = peak_during(run)
    return errors[0], peak
