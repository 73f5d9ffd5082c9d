"""benchmarks/build_disk.py as docs/architecture.md shows it, in a small form: scratch and disk per byte of real
text, and rows made per row written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TECH = "/work/shared/data/corpora/tech.jsonl.gz"


def test_build_disk_reports_scratch_below_the_text(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/build_disk.py", "--input", TECH, "--text-mb", "0.4",
                           "--output", str(tmp_path / "bd"), "--num-shards", "2"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["text_bytes"] >= 400_000 and r["shards"] == 2 and r["rows"] > 1000
    assert 0 < r["work_peak_x"] <= 1.0 and r["shards_x"] > 0 and r["output_peak_x"] >= r["shards_x"]
    assert 1.0 <= r["rows_made_per_row"] < 1.1


def test_build_disk_refuses_a_missing_input_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/build_disk.py", "--input", str(tmp_path / "nope.gz"),
                           "--output", str(tmp_path / "bd")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nope.gz" in done.stderr and not (tmp_path / "bd").exists()
