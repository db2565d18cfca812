"""The built-in fusions and weight folds, registered by name and level.

Level 1 (basic, before partitioning, provider independent): ``conv_bn_fusion``,
``conv_add_fusion``, ``conv_mul_fusion``, ``matmul_add_fusion``, ``bn_mul_fusion``,
``bn_add_fusion``.

Level 2 (extended, after partitioning, only where the owning provider has the fused
op's kernel): the quantization fusions of ``quant_fusions`` (first, as
onnxruntime runs its QDQ transformers first), ``gelu_fusion``, ``fast_gelu_fusion``, ``quick_gelu_fusion``, ``bias_gelu_fusion``,
``layer_norm_fusion``, ``simplified_layer_norm_fusion``, ``skip_layer_norm_fusion``,
``attention_fusion``, ``conv_activation_fusion``, ``gemm_activation_fusion``,
``transpose_cancellation``, ``transpose_matmul_fusion``, ``matmul_scale_fusion``, and
``fusion_dead_node_elimination`` to drop what the fusions left unused.

Transforms run in this order, in rounds, until none changes the graph, so that one
fusion's result can feed the next (Gelu before BiasGelu, attention before the MatMul
fusions that would otherwise take its pieces).

Level 3 (``ORT_ENABLE_LAYOUT``, part of the default ``ORT_ENABLE_ALL``): the fusions
into ops only onnxrt runs, ``conv_onnxrt_activation_fusion`` (FusedConv with HardSwish
or QuickGelu), ``hard_activation_fusion`` (``ai.onnxrt`` HardActivation) and
``dynamic_quant_conv_fusion`` (``ai.onnxrt`` ConvIntegerToFloat). onnxruntime keeps its
hardware-specific layouts at this level; a model saved at level 2 loads in onnxruntime.
"""

from __future__ import annotations

from ..options import GraphOptimizationLevel
from . import fold_conv, fuse_activation, fuse_hard, fuse_transformer, quant_fusions, transpose
from .attention import attention_fusion
from .basic import dead_node_elimination

__all__ = ["register"]


def fusion_dead_node_elimination(graph, ctx) -> bool:
    """Remove nodes and initializers the level-2 fusions left unread."""
    return dead_node_elimination(graph, ctx)


def register(reg) -> None:
    """Add the fusions to a :class:`~onnxrt.optimizer.TransformerRegistry`."""
    basic = GraphOptimizationLevel.ORT_ENABLE_BASIC
    extended = GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    # fusions into ops only onnxrt runs (ai.onnxrt ops, FusedConv activations onnxruntime's
    # lacks) run at level 3, as onnxruntime's own hardware-specific layouts do, so that a
    # model saved at level 2 (extended) still loads in onnxruntime
    onnxrt_only = GraphOptimizationLevel.ORT_ENABLE_LAYOUT
    reg.add("conv_bn_fusion", fold_conv.conv_bn_fusion, basic)
    reg.add("conv_add_fusion", fold_conv.conv_add_fusion, basic)
    reg.add("conv_mul_fusion", fold_conv.conv_mul_fusion, basic)
    reg.add("matmul_add_fusion", fold_conv.matmul_add_fusion, basic)
    reg.add("bn_mul_fusion", fold_conv.bn_mul_fusion, basic)
    reg.add("bn_add_fusion", fold_conv.bn_add_fusion, basic)
    quant_fusions.register(reg)
    reg.add("gelu_fusion", fuse_transformer.gelu_fusion, extended)
    reg.add("fast_gelu_fusion", fuse_transformer.fast_gelu_fusion, extended)
    reg.add("quick_gelu_fusion", fuse_transformer.quick_gelu_fusion, extended)
    reg.add("bias_gelu_fusion", fuse_transformer.bias_gelu_fusion, extended)
    reg.add("layer_norm_fusion", fuse_transformer.layer_norm_fusion, extended)
    reg.add("simplified_layer_norm_fusion", fuse_transformer.simplified_layer_norm_fusion, extended)
    reg.add("skip_layer_norm_fusion", fuse_transformer.skip_layer_norm_fusion, extended)
    reg.add("attention_fusion", attention_fusion, extended)
    reg.add("conv_activation_fusion", fuse_activation.conv_activation_fusion, extended)
    reg.add("conv_onnxrt_activation_fusion", fuse_activation.conv_onnxrt_activation_fusion, onnxrt_only)
    reg.add("gemm_activation_fusion", fuse_activation.gemm_activation_fusion, extended)
    reg.add("hard_activation_fusion", fuse_hard.hard_activation_fusion, onnxrt_only)
    reg.add("transpose_cancellation", transpose.transpose_cancellation, extended)
    reg.add("transpose_matmul_fusion", transpose.transpose_matmul_fusion, extended)
    reg.add("matmul_scale_fusion", transpose.matmul_scale_fusion, extended)
    reg.add("fusion_dead_node_elimination", fusion_dead_node_elimination, extended)
