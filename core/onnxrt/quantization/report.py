"""What a quantization or float16 conversion did, for scripts and the CLI's table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

__all__ = ["QuantizationReport"]


@dataclass
class QuantizationReport:
    """The result of ``quantize_static`` / ``quantize_dynamic``.

    :ivar model: the quantized ``ModelProto``.
    :ivar format: ``"QDQ"``, ``"QOperator"`` or ``"dynamic"``.
    :ivar before: / :ivar after: op type -> count in the input and output models.
    :ivar quantized: the nodes quantized; :ivar skipped: node -> why it stayed float.
    :ivar folded: ReLUs folded into the op before them.
    :ivar size_before: / :ivar size_after: serialized sizes in bytes.
    :ivar ranges: the calibrated range of each activation (static only).
    """

    model: onnx.ModelProto
    format: str
    before: dict[str, int]
    after: dict[str, int]
    quantized: list[str]
    skipped: dict[str, str] = field(default_factory=dict)
    folded: list[str] = field(default_factory=list)
    size_before: int = 0
    size_after: int = 0
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    output: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def op_changes(self) -> list[tuple[str, int, int]]:
        """(op type, count before, count after) for every op whose count changed."""
        ops = sorted(set(self.before) | set(self.after))
        return [(op, self.before.get(op, 0), self.after.get(op, 0)) for op in ops
                if self.before.get(op, 0) != self.after.get(op, 0)]
