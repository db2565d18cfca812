"""Where the provider's values live, and how they cross to and from the host.

onnxrt hands values between providers as host numpy arrays. Wherever a value crosses
from the CPU provider to this one (or back), the planner inserts a copy step that
calls :meth:`{{Name}}Device.from_host` (or :meth:`{{Name}}Device.to_host`). Inside a run,
values produced and consumed by this provider's kernels stay "on the device" and are
never copied.

This template keeps its "device memory" in numpy arrays, so it works everywhere. A real
accelerator replaces the three methods below; nothing else in onnxrt changes.
"""

from __future__ import annotations

import numpy as np
from onnxrt.plugin import Device


class {{Name}}Device(Device):
    """The {{Name}} device: one per provider instance (so one per session)."""

    #: reported by ``OrtValue.device_name()``; anything but "cpu" makes the planner
    #: insert copy steps at provider boundaries
    kind = "{{name}}"

    def __init__(self, device_id: int = 0):
        self.device_id = device_id
        # A real accelerator opens its context/queue (stream) for ``device_id`` here,
        # and creates its memory pool, so that kernels can allocate without a sync.

    def from_host(self, value):
        """Host numpy array -> device value.

        A real accelerator allocates a device buffer (from its pool) and enqueues a
        host-to-device copy on its queue. The template copies, so that device values
        never alias host memory, as on real hardware.
        """
        return np.array(value, copy=True, order="C")

    def to_host(self, value):
        """Device value -> host numpy array.

        A real accelerator enqueues a device-to-host copy and waits for it (the
        result must be complete when this returns, since the CPU reads it next).
        """
        return np.asarray(value)

    def synchronize(self) -> None:
        """Wait for queued device work (a real accelerator: finish its queue/stream)."""
