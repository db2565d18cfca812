"""Using onnxrt.quantization never imports onnxruntime."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quantizing_and_converting_never_import_onnxruntime(tmp_path):
    script = textwrap.dedent(f"""
        import sys

        class Refuse:
            # any attempt to import onnxruntime fails loudly, not only a finished import
            def find_spec(self, name, path=None, target=None):
                if name == "onnxruntime" or name.startswith("onnxruntime."):
                    raise ImportError("onnxruntime was imported")
                return None

        sys.meta_path.insert(0, Refuse())
        import argparse
        import numpy as np
        import onnxrt.quantization as q
        from onnxrt.quantization import cli
        from tests.quantization.models import digits, encoder, encoder_data

        path, x_train, x_test, y_test = digits()
        out = {str(tmp_path)!r}
        for fmt in (q.QuantFormat.QDQ, q.QuantFormat.QOperator):
            for method in (q.CalibrationMethod.MinMax, q.CalibrationMethod.Entropy, q.CalibrationMethod.Percentile):
                q.quantize_static(path, out + f"/s_{{fmt}}_{{method.name}}.onnx",
                                  q.NumpyDataReader({{"pixels": x_train[:128]}}, 32),
                                  quant_format=fmt, calibrate_method=method, per_channel=True)
        q.quantize_dynamic(path, out + "/d.onnx")
        q.convert_float_to_float16(path, keep_io_types=True)
        q.auto_mixed_precision(encoder(layers=1), {{"x": encoder_data(2)}})
        p = argparse.ArgumentParser()
        cli.register(p.add_subparsers(dest="command"))
        args = p.parse_args(["quantize", path, "-o", out + "/c.onnx", "--dynamic"])
        assert args.func(args) == 0
        import onnxrt
        onnxrt.InferenceSession(out + "/s_QDQ_MinMax.onnx").run(None, {{"pixels": x_test}})
        bad = sorted(m for m in sys.modules if m == "onnxruntime" or m.startswith("onnxruntime."))
        assert not bad, bad
        print("clean")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("clean")
