"""The curation benchmarks run end to end in their small forms: benchmarks/curate_cost.py (every stage's cost
against the build's, near dedup on a local Ray, a worker's peak memory) and benchmarks/langid_candidates.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_curate_cost_smoke_prints_every_part():
    done = subprocess.run([sys.executable, "benchmarks/curate_cost.py", "--smoke", "--scales", "1",
                           "--ray-scales", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for line in ("| **the build**", "| language |", "| quality |", "| decontaminate |",
                 "| dedup near: signatures", "| build |", "| near dedup |",
                 "MB (1x) |", "adds "):
        assert line in out, line
    peak = [ln for ln in out.splitlines() if "MB (1x) |" in ln][-1]  # part 3's row
    assert float(peak.split("|")[-2].split()[0]) > 50  # a real worker's RSS was sampled


@pytest.mark.timeout(300)
def test_langid_candidates_smoke():
    done = subprocess.run([sys.executable, "benchmarks/langid_candidates.py", "--smoke"], cwd=REPO,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [ln for ln in done.stdout.splitlines() if ln.startswith("| fastText") or ln.startswith("| ours")]
    assert len(rows) == 6 and all(float(r.split("|")[3]) >= 0.9 for r in rows), rows
