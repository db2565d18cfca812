"""The long fuzz run: mutate seed models and feeds for a while, report what breaks.

    python scripts/fuzz_models.py --minutes 10
    python scripts/fuzz_models.py --cases 50000 --start 1000000
    python scripts/fuzz_models.py --replay 13344     # show one case in full

Each case is reproducible from its number alone (it seeds the mutations). A case
passes when loading and running either succeed or raise an ``onnxrt.OnnxRtError``;
any other exception is printed with the case number and a traceback, grouped by where
it was raised. The process's address space is capped (``--memory-gb``) so that a
missed allocation guard shows up as a ``MemoryError`` instead of the OOM killer, and
each run is stopped after ``--run-seconds`` with ``RunOptions.terminate``.
Exits 1 when anything was found. The bounded, deterministic version of this runs in
CI as ``tests/reliability/test_fuzz.py``.
"""

from __future__ import annotations

import argparse
import collections
import random
import resource
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.reliability.model_mutations import check_one, mutate_model, seed_models


def _case(i: int, seeds: dict):
    rnd = random.Random(i)
    name = rnd.choice(sorted(seeds))
    data = mutate_model(rnd, seeds[name], rnd.randint(1, 4))
    return rnd, name, data


def _cap_memory(gb: float) -> None:
    if gb <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = int(gb * (1 << 30))
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def replay(i: int, run_seconds: float) -> int:
    """Run one case in full, printing the mutated graph and any traceback."""
    import onnx

    seeds = seed_models()
    rnd, name, data = _case(i, seeds)
    print(f"case {i}: seed model {name!r}, {len(data)} bytes")
    try:
        print(onnx.helper.printable_graph(onnx.load_from_string(data).graph))
    except Exception as e:  # noqa: BLE001 - the bytes may not even parse
        print(f"(not parseable by onnx: {e})")
    try:
        print("outcome:", check_one(data, rnd, run_seconds=run_seconds))
    except Exception:  # noqa: BLE001 - this is what we are looking for
        traceback.print_exc()
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=None, help="stop after this long (default 10 unless --cases)")
    ap.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--run-seconds", type=float, default=2.0, help="terminate each run after this long")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address-space cap, 0 for none")
    ap.add_argument("--replay", type=int, default=None, help="run one case verbosely")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.replay is not None:
        return replay(args.replay, args.run_seconds)
    minutes = args.minutes if args.minutes is not None else (None if args.cases else 10.0)
    deadline = time.monotonic() + minutes * 60 if minutes else None
    _cap_memory(args.memory_gb)
    seeds = seed_models()
    outcomes: collections.Counter = collections.Counter()
    found: dict[tuple, list] = {}
    i = args.start
    t0 = time.monotonic()
    last_report = t0
    while (args.cases is None or i < args.start + args.cases) and (deadline is None or time.monotonic() < deadline):
        rnd, name, data = _case(i, seeds)
        try:
            outcomes[check_one(data, rnd, run_seconds=args.run_seconds)] += 1
        except Exception as e:  # noqa: BLE001 - every non-onnxrt exception is a finding
            frame = traceback.extract_tb(e.__traceback__)[-1]
            key = (type(e).__name__, Path(frame.filename).name, frame.lineno)
            if key not in found:
                found[key] = [i, name, f"{type(e).__name__}: {e}"[:300], traceback.format_exc()]
                print(f"case {i} ({name}): {key[0]} at {key[1]}:{key[2]}: {str(e)[:200]}", flush=True)
            else:
                found[key].append(i)
            outcomes["bug"] += 1
        i += 1
        now = time.monotonic()
        if now - last_report > 30:
            last_report = now
            print(f"{i - args.start} cases in {now - t0:.0f} s: {dict(outcomes)}", flush=True)
    total = i - args.start
    print(f"\n{total} cases in {time.monotonic() - t0:.1f} s: {dict(outcomes)}")
    for key, (first, name, msg, tb, *more) in found.items():
        print(f"\n== {key[0]} at {key[1]}:{key[2]}, {1 + len(more)} case(s), first {first} ({name})")
        print(msg)
        print(tb)
        print(f"replay: python scripts/fuzz_models.py --replay {first}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
