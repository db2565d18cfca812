"""onnxruntime's own Python test suite, run against onnxruntime and against onnxrt.

onnxrt promises that code written for onnxruntime runs after changing the import; the
fairest measure is onnxruntime's own tests. ``../shared/ort-pytests`` (beside the
repository) holds them with ``run.sh``, which runs them against either runtime (see its
header). This test runs it for both and fails on every test onnxruntime passes and
onnxrt fails, unless ``exclusions.txt`` lists it with a reason; it also fails on an
exclusion that no longer matches a failing test, so that the list stays true.

Environment:
    ORT_PYTESTS_DIR       the suite's folder (default: ../shared/ort-pytests from the repository root)
    ORT_PYTESTS_ONLY      space-separated test files to run (default: all of run.sh's files)
    ORT_PYTESTS_BASELINE  an onnxruntime run's outcomes.jsonl to compare with instead of running
                          onnxruntime again (it must cover the same files)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SUITE = Path(os.environ.get("ORT_PYTESTS_DIR", REPO.parent / "shared" / "ort-pytests"))
EXCLUSIONS = HERE / "exclusions.txt"


def read_exclusions(path: Path = EXCLUSIONS) -> list[tuple[re.Pattern, str]]:
    """``(pattern, reason)`` per entry of the exclusion file; a malformed line is an error."""
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pattern, sep, reason = line.partition(" | ")
        if not sep or not pattern.strip() or len(reason.strip()) < 20:
            raise ValueError(f"{path.name}:{i}: expected 'PATTERN | reason a user would accept', got {line!r}")
        out.append((re.compile(pattern.strip()), reason.strip()))
    return out


def outcomes(path: Path) -> dict[str, dict]:
    """node id -> outcome row of a run's outcomes.jsonl."""
    return {r["nodeid"]: r for r in map(json.loads, filter(str.strip, path.read_text().splitlines()))}


def regressions(base: dict[str, dict], mine: dict[str, dict]) -> list[str]:
    """Tests onnxruntime passed that onnxrt failed or never reported (a file that did not
    import or a process that died reports one failure for the whole file)."""
    out = []
    dead = {k.split(" ")[0] for k, r in mine.items() if r["outcome"] == "failed" and "::" not in k}
    for nodeid, r in base.items():
        if r["outcome"] != "passed":
            continue
        got = mine.get(nodeid)
        if got is None and nodeid.split("::")[0] in dead:
            out.append(nodeid)
        elif got is not None and got["outcome"] == "failed":
            out.append(nodeid)
    return sorted(out)


def test_exclusions_are_well_formed():
    """Every entry has a pattern that compiles and a reason; there are few of them."""
    entries = read_exclusions()
    assert entries, "the exclusion file is empty: remove it rather than keep it empty"
    assert len(entries) <= 10, f"{len(entries)} exclusions: the list is meant to stay short"


def _run(runtime: str, out: Path, only: str | None) -> dict[str, dict]:
    env = dict(os.environ, PY=sys.executable, OUT=str(out))
    if only:
        env["ONLY"] = only
    env.pop("BASELINE", None)
    proc = subprocess.run(["bash", str(SUITE / "run.sh"), runtime], env=env, cwd=str(out.parent),
                          capture_output=True, text=True, timeout=7200)
    summary = proc.stdout.strip().splitlines()[-1:] or [""]
    assert proc.returncode == 0 and (out / "outcomes.jsonl").exists(), (
        f"run.sh {runtime} did not finish (rc={proc.returncode}): {summary[0]}\n{proc.stderr[-2000:]}")
    print(f"{runtime}: {summary[0]}")
    return outcomes(out / "outcomes.jsonl")


@pytest.mark.skipif(not (SUITE / "run.sh").is_file(),
                    reason=f"onnxruntime's Python tests are not there ({SUITE}/run.sh; set ORT_PYTESTS_DIR)")
def test_onnxrt_passes_what_onnxruntime_passes(tmp_path):
    """onnxrt fails no test of onnxruntime's suite that onnxruntime passes, except the listed ones."""
    only = os.environ.get("ORT_PYTESTS_ONLY") or None
    baseline = os.environ.get("ORT_PYTESTS_BASELINE")
    if baseline:
        base = outcomes(Path(baseline))
    else:
        if importlib.util.find_spec("onnxruntime") is None:
            pytest.skip("onnxruntime is not installed for the baseline run (or set ORT_PYTESTS_BASELINE)")
        base = _run("onnxruntime", tmp_path / "onnxruntime", only)
    mine = _run("onnxrt", tmp_path / "onnxrt", only)
    entries = read_exclusions()
    failing = regressions(base, mine)
    unexcused = [n for n in failing if not any(p.search(n) for p, _ in entries)]
    # an entry that matches no failing test is stale, but only where its file ran
    ran = {k.split("::")[0].split(" ")[0] for k in mine}
    stale = [p.pattern for p, _ in entries
             if not any(p.search(n) for n in failing)
             and any(p.search(k) for k in base if k.split("::")[0] in ran)]
    lines = [f"{n}: {mine.get(n, {}).get('message', 'no result (the file did not run)')[:300]}" for n in unexcused]
    assert not unexcused, (f"{len(unexcused)} test(s) onnxruntime passes fail on onnxrt:\n" + "\n".join(lines))
    assert not stale, f"exclusions that match no failing test any more (remove them): {stale}"
