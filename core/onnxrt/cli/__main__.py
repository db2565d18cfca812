"""``python -m onnxrt.cli``: the ``onnxrt`` command."""

import sys

from . import main

sys.exit(main())
