"""``InferenceSession.run_async``: a run on its own thread, reported to a callback.

As in onnxruntime, the callback gets ``(outputs, user_data, error)``: the outputs as
``run`` returns them and ``""`` on success, or ``[]`` and the error's text. The thread
holds the session and the feeds until the callback returns, so the caller may drop
its own references right after the call.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from ..errors import InvalidArgument

__all__ = ["start_async"]

logger = logging.getLogger("onnxrt")


def start_async(session, output_names, input_feed: dict[str, Any], callback: Callable, user_data: Any,
                run_options=None) -> None:
    """Start ``session.run(output_names, input_feed, run_options)`` on a daemon thread."""
    if not callable(callback):
        raise InvalidArgument(f"run_async needs a callable callback, not {type(callback).__name__}")
    if not isinstance(input_feed, dict):
        raise InvalidArgument(f"input_feed must be a dict of name -> value, not {type(input_feed).__name__}")

    def work(session=session, feed=dict(input_feed), user_data=user_data, run_options=run_options):
        try:
            outputs, error = session.run(output_names, feed, run_options), ""
        except Exception as e:  # noqa: BLE001 - reported to the callback, as onnxruntime does
            outputs, error = [], f"{type(e).__name__}: {e}"
        try:
            callback(outputs, user_data, error)
        except Exception:  # noqa: BLE001 - nobody else could see it
            logger.exception("the run_async callback raised")

    threading.Thread(target=work, name="onnxrt-run-async", daemon=True).start()
