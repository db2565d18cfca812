"""Run ONNX node tests straight through the CPU kernel registry (no session).

A development aid for kernel authors: ``python scripts/dev_nodetests.py Conv MaxPool``
runs every node test whose graph uses one of those ops and prints failures.
``-k substr`` filters by test name instead. Subgraph attributes stay raw GraphProtos,
so control flow cannot be checked here.
"""

import sys
import traceback
import warnings

import numpy as np
from onnx.backend.test.case.node import collect_testcases

sys.path[:0] = ["core", "providers/cpu"]
from onnxrt.plugin.kernel import NodeInfo, decode_attribute  # noqa: E402
from onnxrt_cpu.registry import REGISTRY  # noqa: E402
import importlib  # noqa: E402
import onnxrt_cpu.kernels as _k  # noqa: E402

for _m in _k.MODULES:  # tolerate a module another author is still writing
    try:
        importlib.import_module(f"onnxrt_cpu.kernels.{_m}")
    except Exception as e:  # noqa: BLE001
        print(f"WARNING: kernels/{_m}.py does not import: {e!r}")


def compare(exp, got, rtol, atol, where):
    if isinstance(exp, list):
        assert isinstance(got, list), f"{where}: expected a sequence, got {type(got)}"
        assert len(exp) == len(got), f"{where}: sequence length {len(got)} != {len(exp)}"
        for i, (e, g) in enumerate(zip(exp, got)):
            compare(e, g, rtol, atol, f"{where}[{i}]")
        return
    if exp is None:
        assert got is None, f"{where}: expected None"
        return
    exp = np.asarray(exp)
    got = np.asarray(got)
    assert got.dtype == exp.dtype, f"{where}: dtype {got.dtype} != {exp.dtype}"
    assert got.shape == exp.shape, f"{where}: shape {got.shape} != {exp.shape}"
    if exp.dtype == object:
        assert exp.tolist() == got.tolist(), f"{where}: {got} != {exp}"
    elif exp.dtype.kind in "fc" or exp.dtype.itemsize == 1 and exp.dtype.kind == "V":
        np.testing.assert_allclose(got, exp, rtol=rtol, atol=atol, err_msg=where)
    else:
        try:
            np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=rtol, atol=atol, err_msg=where)
        except (TypeError, ValueError):
            assert np.array_equal(got, exp), where


def run_case(t):
    m = t.model
    opsets = {o.domain or "": o.version for o in m.opset_import}
    for inputs, expected in t.data_sets:
        env = {}
        for vi, x in zip(m.graph.input, inputs):
            env[vi.name] = x
        for init in m.graph.initializer:
            from onnx import numpy_helper
            env[init.name] = numpy_helper.to_array(init)
        for n in m.graph.node:
            dom = n.domain or ""
            info = NodeInfo(
                name=n.name or n.op_type,
                op_type=n.op_type,
                domain=dom,
                opset=opsets.get(dom, opsets.get("ai.onnx", 1)),
                attrs={a.name: decode_attribute(a) for a in n.attribute},
                inputs=list(n.input),
                outputs=list(n.output),
            )
            k = REGISTRY.create(info)
            args = [env[i] if i else None for i in n.input]
            outs = k.run(*args)
            assert len(outs) >= len([o for o in n.output if o]), f"{n.op_type} returned {len(outs)} outputs"
            for name, v in zip(n.output, outs):
                if name:
                    env[name] = v
        for vi, e in zip(m.graph.output, expected):
            compare(e, env[vi.name], t.rtol, t.atol, f"{t.name}:{vi.name}")


def main(argv):
    warnings.simplefilter("ignore")
    name_filter = None
    if argv[:1] == ["-k"]:
        name_filter, argv = argv[1], argv[2:]
    ops = set(argv)
    passed = failed = 0
    for t in collect_testcases():
        if name_filter is not None and name_filter not in t.name:
            continue
        if ops and not ({n.op_type for n in t.model.graph.node} & ops):
            continue
        try:
            run_case(t)
            passed += 1
        except Exception as e:  # report and go on
            failed += 1
            msg = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
            print(f"FAIL {t.name}: {' | '.join(msg)[:400]}")
    print(f"{passed} passed, {failed} failed")


if __name__ == "__main__":
    main(sys.argv[1:])
