"""benchmarks/tokenizer_throughput.py and benchmarks/build_marginal_cost.py in a small form (their full runs are in
docs/benchmarks.md): the tokenizer's ids are compared with tokenizers' on real text and both rates printed; the
marginal cost builds a quarter and all of a corpus, counts each job's CPU and the peak disk under --output."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPORA = Path("/work/shared/data/corpora")


def test_tokenizer_throughput_small(tmp_path):
    out = tmp_path / "tok.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tokenizer_throughput.py"), "--corpora",
                        "multilang", "mobydick", "--max-mb", "0.3", "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [r["corpus"] for r in rows] == ["multilang", "mobydick"]
    assert all(r["mb"] >= 0.3 and r["ours_cpu_s"] > 0 and r["hf_cpu_s"] > 0 and r["distinct_chunks"] > 1000
               for r in rows)
    assert p.stdout.splitlines()[-1].startswith("all "), p.stdout


def test_tokenizer_throughput_names_a_missing_corpus():
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tokenizer_throughput.py"), "--corpora", "nope"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2 and "--corpora: no nope" in p.stderr


@pytest.mark.slow  # two small builds in subprocesses
def test_build_marginal_cost_small(tmp_path):
    out = tmp_path / "m.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "build_marginal_cost.py"), "--corpora", "mobydick",
                        "--no-ray", "--no-mlflow", "--dupe-factor", "1", "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    q, a = r["results"]["quarter"], r["results"]["all"]
    assert 3.5 < a["mb"] / q["mb"] < 4.5 and a["cpu_s"] > q["cpu_s"] > 0
    assert a["peak_disk_mb"] > 0 and r["marginal_mb_per_cpu_s"] > 0
    assert "marginal " in p.stdout and "peak disk" in p.stdout
