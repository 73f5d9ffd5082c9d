"""The build's newer flags answer like the old ones (issue 44, item 3): each mistake refused in one line naming the
flag or file and the fix, before any work, leaving no output and no MLflow run; run as a user runs the job."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def chapters(sample_dir: Path, n: int = 4) -> list[dict]:
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f][1:n + 1]


@pytest.fixture
def corpus(tmp_path, sample_dir) -> Path:
    path = tmp_path / "in" / "moby.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(d) + "\n" for d in chapters(sample_dir)))
    return path


def refused(tmp_path: Path, *args: str) -> str:
    """Run the job; it must exit 2 with one error line, no traceback, no output folder and no MLflow run."""
    store = tmp_path / "mlflow.db"
    p = subprocess.run([sys.executable, str(REPO / "jobs" / "build_dataset.py"), "--output", str(tmp_path / "out"),
                        "--mlflow-tracking-uri", f"sqlite:///{store}", "--no-ray", "--log-level", "WARNING", *args],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("build_dataset: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert not (tmp_path / "out").exists()
    if store.exists():  # a store opened by the check is empty of runs
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{store}")
        assert [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])] == []
    return errors[0]


@pytest.mark.parametrize("flag,value", [("--dedup-threshold", "0.5"), ("--dedup-num-perm", "64")])
def test_a_near_dedup_setting_without_dedup_near(tmp_path, corpus, flag, value):
    line = refused(tmp_path, "--input", str(corpus), flag, value, "--dedup", "exact")
    assert f"{flag} is used by --dedup near only (this build has --dedup exact): add --dedup near" in line


def test_a_mix_that_leaves_every_input_at_weight_zero(tmp_path, corpus):
    line = refused(tmp_path, "--input", str(corpus), "--mix", f"{corpus.parent}=0")
    assert "--mix" in line and "every input file gets weight 0" in line and "a weight > 0" in line


def test_a_latin1_decontaminate_file_is_named(tmp_path, corpus):
    dev = tmp_path / "dev.jsonl"
    dev.write_bytes(json.dumps({"text": "caf\u00e9 au lait " * 20}, ensure_ascii=False).encode("latin-1") + b"\n")
    line = refused(tmp_path, "--input", str(corpus), "--decontaminate", str(dev))
    assert f"--decontaminate {dev}: not UTF-8 text (byte 0xe9 at offset" in line
    assert "iconv -f latin1 -t utf-8 dev.jsonl > dev.utf8.jsonl" in line


@pytest.mark.slow
def test_languages_that_keep_nothing_name_languages_not_format(tmp_path, corpus, sample_dir):
    p = subprocess.run([sys.executable, str(REPO / "jobs" / "build_dataset.py"), "--input", str(corpus),
                        "--output", str(tmp_path / "out"), "--no-mlflow", "--no-ray", "--log-level", "WARNING",
                        "--languages", "fr", "--dupe-factor", "1",
                        "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("build_dataset: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert "--languages" in errors[0] and "--format" not in errors[0], errors[0]
