"""docs/benchmarks.md's loader commands ("Pre-training input at cluster scale", issue 45) run here in a small form:
their flags as documented, the datasets swapped for the tiny fixture's (with indexes) and the steps and ranks
cut down; over the local folder, the counting HTTP server and a moto S3 server. Nothing timed is asserted: that
every row of the table is printed, and the bytes columns are there."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def documented() -> list[list[str]]:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    section = text[text.index("\n## Pre-training input at cluster scale"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    return [shlex.split(line.strip()) for block in re.findall(r"^```\n(.*?)^```", section, re.M | re.S)
            for line in block.splitlines() if "benchmarks/loader_scale.py" in line]


def test_the_documented_loader_benchmark_commands_run(tiny_pretrain_data):
    pytest.importorskip("moto")
    commands = documented()
    assert commands, "docs/benchmarks.md documents no benchmarks/loader_scale.py command"
    for argv in commands:
        args = argv[argv.index("benchmarks/loader_scale.py") + 1:]
        kept, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("--data", "--ranks", "--max-steps"):
                skip = True
                continue
            kept.append(a)
        small = ["--data", tiny_pretrain_data["train"], "--ranks", "1,2", "--max-steps", "2"]
        out = subprocess.run([sys.executable, "benchmarks/loader_scale.py", *kept, *small], cwd=REPO,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        rows = [line for line in out.stdout.splitlines() if line.startswith("| train |")]
        stores = kept[kept.index("--stores") + 1].split(",") if "--stores" in kept else ["local", "http", "s3"]
        packing = kept[kept.index("--packing") + 1].split(",") if "--packing" in kept else ["off", "on"]
        per_store = {"local": 2}  # share and whole
        assert len(rows) == sum(per_store.get(s, 1) for s in stores) * 2 * len(packing)
        assert all(re.search(r"\| share \| \d+\.\d\d \| \d+ \|", r) for r in rows if "| share |" in r)
