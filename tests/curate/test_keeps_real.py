"""check curate-keeps-real in a small form: benchmarks/curate_keeps_real.py --smoke (as docs/build-checks.md runs it
in full) keeps the clean documents it samples and drops every planted junk document; the language curve runs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _curate_docs import need_shared

REPO = Path(__file__).resolve().parents[2]


def _rows(out: str) -> dict[str, float]:
    return {c[1].strip(): float(c[4]) for c in (ln.split("|") for ln in out.splitlines())
            if len(c) > 5 and c[4].strip().replace(".", "").isdigit()}


def test_keeps_real_smoke_keeps_clean_documents_and_drops_the_junk():
    need_shared()
    done = subprocess.run([sys.executable, "benchmarks/curate_keeps_real.py", "--smoke"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    kept = _rows(done.stdout)
    junk = {k: v for k, v in kept.items() if k.startswith("junk/")}
    assert len(junk) == 5 and all(v == 0.0 for v in junk.values()), junk
    assert kept["austen"] == 100.0 and kept["tech/manpages"] >= 80.0 and kept["multilang/de"] >= 80.0, kept
    # every rule, C4's one brace among them, on the same sample keeps fewer man pages: the check can fail
    gopher = subprocess.run([sys.executable, "benchmarks/curate_keeps_real.py", "--smoke", "--rules", "all",
                             "--no-language"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert gopher.returncode == 0, gopher.stderr[-3000:]
    assert _rows(gopher.stdout)["tech/manpages"] < kept["tech/manpages"], gopher.stdout
