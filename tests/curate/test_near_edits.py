"""check curate-near-edits: the library default of ``--dedup near`` (no threshold flag) on planted copies of real
documents at every edit level, through benchmarks/curate_near_curve.py as docs/build-checks.md shows it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _curate_docs import need_shared

REPO = Path(__file__).resolve().parents[2]


def _rows(out: str) -> list[dict[str, str]]:
    head = next(ln for ln in out.splitlines() if ln.startswith("threshold"))
    names = head.split("|")[1].split()
    rows = []
    for ln in out.splitlines():
        if ln[:9].strip().replace(".", "").isdigit() and "|" in ln:
            cells = ln.split("|")
            rows.append({"setting": cells[0].strip(), **dict(zip(names, cells[1].split(), strict=True)),
                         "distinct": cells[2].strip(), "false": cells[3].strip()})
    return rows


def test_check_curate_near_edits_the_default_catches_every_level():
    """>= 68/75 at 3% word edits, >= 40/75 at 5%, >= 68/75 for each block edit (a paragraph removed, added or
    moved, a boilerplate header and footer), >= 399/400 distinct documents kept: the default, no flag."""
    need_shared()
    done = subprocess.run([sys.executable, "benchmarks/curate_near_curve.py", "--default-only"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = _rows(done.stdout)
    assert row["setting"].split()[:2] == ["0.65", "4"], row  # the library's default, not a flag
    got = {k: int(v.split("/")[0]) for k, v in row.items() if "/" in v and k != "distinct"}
    assert got["words1"] >= 68 and got["words3"] >= 68 and got["words5"] >= 40, got
    assert all(got[k] >= 68 for k in ("para_removed", "para_added", "para_moved", "boilerplate")), got
    assert got["words10"] < 40, got  # a tenth of the words edited is another document: not a copy
    assert int(row["distinct"].split("/")[0]) >= 399, row


def test_the_old_cut_misses_the_edited_copies():
    """The curve's other end, so the check above can fail: Jaccard 0.8 on 5-word shingles (the former default)
    catches under half of the 3% copies and none at 5%."""
    need_shared()
    done = subprocess.run([sys.executable, "benchmarks/curate_near_curve.py", "--thresholds", "0.8", "--shingles",
                           "5"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = _rows(done.stdout)
    assert int(row["words3"].split("/")[0]) < 38 and int(row["words5"].split("/")[0]) < 10, row
