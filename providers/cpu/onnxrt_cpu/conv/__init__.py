"""The CPU provider's convolution algorithms, apart from the ops that call them
(:mod:`onnxrt_cpu.kernels.conv`, FusedConv, the pooling kernels).

Every convolution is lowered to matrix products that BLAS runs, or to the compiled
kernels of :mod:`onnxrt_cpu.native`; :func:`~onnxrt_cpu.conv.forward.convolve`
chooses among them by the layer's shape:

* :mod:`~onnxrt_cpu.conv.compiled`: the compiled kernels, for 2-D (and 1-D) float
  maps: Winograd's F(2x2, 3x3) for wide 3x3 layers, the direct kernel for short,
  narrow reductions, im2col in cache-sized tiles otherwise, and the depthwise
  kernel; QLinearConv's 8-bit convolutions;
* a 1x1, stride-1, unpadded Conv is one GEMM on the input viewed as ``[C, H*W]``
  (no copy), split over the output columns or images (in :mod:`~.forward`);
* :mod:`~onnxrt_cpu.conv.bands`: the banded im2col, a band of output rows' taps
  gathered into a per-thread buffer and multiplied straight into the output; the
  grouped convolution of small maps, one batched product over the groups;
* :mod:`~onnxrt_cpu.conv.channels_last`: a batch of small 2-D images padded once
  into a channels-last copy, a block of images' im2col rows one strided copy and
  one product; small depthwise maps as one ``einsum``;
* :mod:`~onnxrt_cpu.conv.phases`: a strided layer with few channels gathered from
  the stride phases of its padded input, every tap a contiguous run;
* :mod:`~onnxrt_cpu.conv.depthwise`: depthwise layers in numpy calls, a block of
  channels' taps and one batched product;
* :mod:`~onnxrt_cpu.conv.integer`: the integer convolutions' exact accumulation
  on float copies of the operands.

Below them: :mod:`~onnxrt_cpu.conv.packing` (the weights in each algorithm's
layout, packed once), :mod:`~onnxrt_cpu.conv.geometry` (pads, taps, phase and
row-pitch layouts, shared with pooling) and :mod:`~onnxrt_cpu.conv.buffers`
(views and per-thread scratch).
"""
