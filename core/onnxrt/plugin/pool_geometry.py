"""Sliding-window geometry of pooling and transposed convolution, per the ONNX rules.

Every provider that runs these ops needs the same pads and output sizes from the same
attributes (``auto_pad``, ``pads``, ``ceil_mode``, ``output_padding``,
``output_shape``), and the answers must agree exactly, or the providers disagree on
output shapes. The rules live here once; kernels pass the spatial sizes and their
parsed attributes. Errors are :class:`~onnxrt.errors.InvalidArgument` prefixed with
``desc`` (the node's description).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import InvalidArgument

__all__ = ["pool_geometry", "conv_transpose_geometry"]


def _prefix(desc: str) -> str:
    return f"{desc}: " if desc else ""


def pool_geometry(in_sp: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int], pads, auto_pad: str | None, ceil_mode: int | bool,
                  desc: str = "") -> tuple[list[int], list[int], list[int], list[int]]:
    """Padding and output size of a pooling window, per spatial axis.

    :returns: ``(pads_begin, pads_end, extra_end, out_spatial)``: ``pads_*`` are the
        explicit (or automatic) pads; ``extra_end`` is the additional end padding that
        ceil mode needs so the last window is fully addressable (it never counts as
        padding).
    """
    nd = len(in_sp)
    auto_pad = auto_pad or "NOTSET"
    ek = [(kernel[i] - 1) * dilations[i] + 1 for i in range(nd)]
    out = []
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe = [], []
        for i in range(nd):
            o = -(-in_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + ek[i] - in_sp[i])
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pb.append(b)
            pe.append(total - b)
            out.append(o)
    elif auto_pad == "VALID":
        pb, pe = [0] * nd, [0] * nd
        for i in range(nd):
            if ceil_mode:
                out.append(-(-(in_sp[i] - ek[i] + 1) // strides[i]))
            else:
                out.append((in_sp[i] - ek[i]) // strides[i] + 1)
    elif auto_pad == "NOTSET":
        pads = list(pads) if pads else [0] * (2 * nd)
        if len(pads) != 2 * nd or min(pads) < 0:
            raise InvalidArgument(f"{_prefix(desc)}pads {pads} must be {2 * nd} non-negative entries")
        pb, pe = pads[:nd], pads[nd:]
        for i in range(nd):
            span = in_sp[i] + pb[i] + pe[i] - ek[i]
            if ceil_mode:
                o = -(-span // strides[i]) + 1
                # a window starting in the end padding is dropped
                if (o - 1) * strides[i] >= in_sp[i] + pb[i]:
                    o -= 1
            else:
                o = span // strides[i] + 1
            out.append(o)
    else:
        raise InvalidArgument(f"{_prefix(desc)}unknown auto_pad {auto_pad!r}")
    for i in range(nd):
        # a window that just fits nowhere gives an empty axis, as in onnxruntime; one
        # that overshoots the padded input is an error there and here
        if out[i] < 0:
            raise InvalidArgument(
                f"{_prefix(desc)}pooling window {kernel[i]} (dilation {dilations[i]}) does not fit spatial "
                f"axis {i} of size {in_sp[i]} with pads ({pb[i]}, {pe[i]})"
            )
    extra = [max(0, (out[i] - 1) * strides[i] + ek[i] - (in_sp[i] + pb[i] + pe[i])) for i in range(nd)]
    return list(pb), list(pe), extra, out


def conv_transpose_geometry(in_sp: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                            dilations: Sequence[int], attrs: dict, auto_pad: str | None,
                            desc: str = "") -> tuple[list[int], list[int]]:
    """``(pads_begin, out_spatial)`` of a ConvTranspose from its attributes.

    Padding is never negative, as in onnxruntime: a target larger than the natural
    output is zero-extended (an explicit ``output_shape``) or not reached (SAME).
    """
    nd = len(in_sp)
    auto_pad = auto_pad or "NOTSET"
    opad = list(attrs.get("output_padding") or [0] * nd)
    if len(opad) != nd:
        raise InvalidArgument(f"{_prefix(desc)}output_padding {opad} must have {nd} entries")
    full = [strides[i] * (in_sp[i] - 1) + opad[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(nd)]
    out_shape = attrs.get("output_shape")
    pads = attrs.get("pads")
    explicit = bool(out_shape)
    if explicit:
        out_shape = list(out_shape)[-nd:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER") and not pads:
        out_shape = [in_sp[i] * strides[i] for i in range(nd)]
    if out_shape:
        pb, out = [], []
        for i in range(nd):
            total = max(0, full[i] - out_shape[i])
            pb.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
            out.append(out_shape[i] if explicit else full[i] - total)
        return pb, out
    if auto_pad == "VALID" or not pads:
        pads = [0] * (2 * nd)
    if len(pads) != 2 * nd or min(pads) < 0:
        raise InvalidArgument(f"{_prefix(desc)}pads {list(pads)} must be {2 * nd} non-negative entries")
    out = [full[i] - pads[i] - pads[nd + i] for i in range(nd)]
    if min(out) < 1:
        raise InvalidArgument(f"{_prefix(desc)}ConvTranspose output shape {out} is not positive")
    return list(pads[:nd]), out
