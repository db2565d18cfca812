"""The CUDA provider's tests need the onnxrt-cuda package (not CuPy, not a GPU)."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("onnxrt_cuda") else ["test_*.py"]
