"""Run a :class:`onnxrt.Predictor` over large datasets with a distributed engine.

- :mod:`onnxrt.integrations.ray`: Ray Data, ``Dataset.map_batches`` with one actor per
  worker (``pip install 'onnxrt[ray]'``);
- :mod:`onnxrt.integrations.dask`: Dask, ``DataFrame.map_partitions`` and
  ``Array.map_blocks`` (``pip install 'onnxrt[dask]'``).

Neither engine is imported until its module is; a missing engine is an ``ImportError``
naming the extra to install.
"""

__all__: list[str] = []
