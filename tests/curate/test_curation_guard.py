"""Nothing removed in silence: a build where one input is mostly junk names that input, the rule and the share, and
stops before the pool and the shards unless --allow-drop (the report written, no dataset); the manifest's counts
per input and reason are the report's lines; the quality flags turn rules off and set their thresholds."""
from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from _curate_docs import need_shared

from jobs import build_dataset

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"
SMALL = ["--vocab", str(VOCAB), "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", "1",
         "--num-shards", "2", "--no-ray", "--no-mlflow", "--log-level", "WARNING"]


def _passages(name: str, n_words: int, n: int) -> list[tuple[str, str]]:
    need_shared()
    out = []
    with gzip.open(SHARED / "corpora" / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        for doc in map(json.loads, f):
            w = doc["text"].split()
            out += [(f"{doc['id']}@{i}", " ".join(w[i:i + n_words])) for i in range(0, len(w) - n_words + 1, n_words)]
            if len(out) >= n:
                return out[:n]
    return out


def _write(path: Path, docs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs))
    return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """clean/: 60 300-word passages of Austen; web/: 10 of Moby Dick and 30 of 150-word word salad (Austen's
    vocabulary in random order, no sentence: Gopher's stop-word rule drops it)."""
    root = tmp_path_factory.mktemp("guard")
    clean = _passages("austen", 300, 60)
    vocab = sorted({w for _, t in clean for w in t.split() if w.isalpha() and len(w) > 3})
    rng = random.Random(5)
    salad = [(f"salad-{k:02d}", " ".join(rng.choice(vocab) for _ in range(150)) + ".") for k in range(30)]
    web = _passages("mobydick", 300, 10) + salad
    return root, {"clean": _write(root / "clean" / "part.jsonl", clean),
                  "web": _write(root / "web" / "part.jsonl", web)}


def _job(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / "build_dataset.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_a_mostly_junk_input_stops_the_build_naming_input_rule_and_flag(inputs, tmp_path):
    root, files = inputs
    out = tmp_path / "out"
    done = _job("--input", str(root / "clean"), "--input", str(root / "web"), "--output", str(out), "--quality",
                "--languages", "en", *SMALL)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("build_dataset: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = errors[0]
    assert files["web"] in line and "quality:stop_words" in line and "--allow-drop" in line, line
    assert "--quality-skip stop_words" in line, line
    # the warning names it too, and nothing of the dataset was written: the report only (and the build's own
    # bookkeeping, _work and the writer's lease, so the same command with --allow-drop goes on from there)
    assert any("WARNING" in ln and files["web"] in ln and "quality:stop_words" in ln for ln in done.stderr.splitlines())
    assert {p.name for p in out.iterdir() if not p.name.startswith("_")} == {"reports"}
    assert not (out / "manifest.json").exists() and not list(out.glob("*.parquet"))
    lines = [json.loads(x) for x in open(out / "reports" / "dropped.jsonl")]
    salad = Counter((x["source"], x["reason"]) for x in lines)[files["web"], "quality:stop_words"]
    assert salad >= 25 and f"{salad / 40:.0%} of {files['web']} ({salad} of 40 documents)" in line, line

    # The same command with --allow-drop goes on from there (the same build: checks are not its identity).
    assert build_dataset.main(["--input", str(root / "clean"), "--input", str(root / "web"), "--output", str(out),
                               "--quality", "--languages", "en", "--allow-drop", *SMALL]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert any(files["web"] in w and "quality:stop_words" in w and f"{salad / 40:.0%}" in w
               for w in manifest["warnings"])
    assert not any(files["clean"] in w for w in manifest["warnings"])
    lines = [json.loads(x) for x in open(out / "reports" / "dropped.jsonl")]
    by_input = manifest["curation"]["by_input"]
    # per input and reason, the manifest's counts are the report's lines
    assert {(src, r): n for src, v in by_input.items() for r, n in v["dropped"].items()} == dict(
        Counter((x["source"], x["reason"]) for x in lines))
    assert by_input[files["web"]]["documents"] == 40 and by_input[files["clean"]]["documents"] == 60
    assert sum(by_input[files["clean"]]["dropped"].values()) <= 3  # Austen is kept


def test_the_quality_flags_turn_a_rule_off_and_set_a_threshold(inputs, tmp_path):
    root, files = inputs
    out = tmp_path / "out"
    assert build_dataset.main(["--input", str(root / "web"), "--output", str(out), "--quality", "--quality-skip",
                               "stop_words", "--quality-min-words", "200", "--allow-drop", *SMALL]) == 0
    reasons = Counter(json.loads(x)["reason"] for x in open(out / "reports" / "dropped.jsonl"))
    assert "quality:stop_words" not in reasons  # turned off
    # the 151-word salads now fall under --quality-min-words 200 (word_count is checked first), the passages do not
    assert reasons["quality:word_count"] == 30 and reasons.total() <= 32, reasons


@pytest.mark.parametrize("flags, needle", [
    (["--quality", "--quality-skip", "nonsense"], "--quality-skip nonsense: not a quality rule"),
    (["--quality-min-words", "10"], "--quality-min-words needs --quality"),
    (["--quality", "--quality-rules", "word_count", "--quality-skip", "word_count"], "--quality-skip turns off every"),
])
def test_quality_flag_mistakes_are_one_line(inputs, tmp_path, flags, needle):
    root, _ = inputs
    args = [a for a in SMALL if a != "--no-mlflow"]
    done = _job("--input", str(root / "clean"), "--output", str(tmp_path / "out"), *flags, "--no-mlflow", *args)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_the_vocabulary_is_trained_on_what_curation_keeps(tmp_path):
    """A corpus of Austen and German documentation with --languages en (and --allow-drop: the German input goes
    whole): the trained vocabulary has no German word; without curation the same corpus's vocabulary has them."""
    need_shared()
    with gzip.open(SHARED / "corpora" / "multilang.jsonl.gz", "rt", encoding="utf-8") as f:
        german = [(d["id"], d["text"]) for d in map(json.loads, f) if d["lang"] == "de"][:100]
    _write(tmp_path / "in" / "en.jsonl", _passages("austen", 300, 100))
    _write(tmp_path / "in" / "de.jsonl", german)
    small = [a for a in SMALL if a not in ("--vocab", str(VOCAB))] + ["--vocab-size", "3000"]
    words = {}
    for name, flags in (("plain", []), ("curated", ["--languages", "en", "--allow-drop"])):
        out = tmp_path / name
        assert build_dataset.main(["--input", str(tmp_path / "in"), "--output", str(out), *flags, *small]) == 0
        words[name] = set((out / "vocab.txt").read_text().split())
    german_words = {"nicht", "werden", "eine", "oder", "wird", "sie", "kann", "auch"}
    assert len(words["plain"] & german_words) >= 6, words["plain"] & german_words  # the attack: they are there
    assert not words["curated"] & german_words, words["curated"] & german_words


def test_the_mlflow_run_holds_the_counts_per_input(inputs, tmp_path, mlflow_uri, capsys):
    """The build's run has the per-input table (reports/by_input.json), equal to the manifest's and to the report's
    lines, and the warning naming the mostly-junk input."""
    from mlflow.tracking import MlflowClient

    root, files = inputs
    out = tmp_path / "out"
    args = [a for a in SMALL if a != "--no-mlflow"]
    assert build_dataset.main(["--input", str(root / "clean"), "--input", str(root / "web"), "--output", str(out),
                               "--quality", "--allow-drop", "--mlflow-tracking-uri", mlflow_uri, *args]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    client = MlflowClient(mlflow_uri)
    logged = client.download_artifacts(summary["mlflow_run_id"], "reports/by_input.json", str(tmp_path))
    table = json.loads(Path(logged).read_text())
    assert table == manifest["curation"]["by_input"]
    lines = [json.loads(x) for x in open(out / "reports" / "dropped.jsonl")]
    assert {(src, r): n for src, v in table.items() for r, n in v["dropped"].items()} == dict(
        Counter((x["source"], x["reason"]) for x in lines))
    assert any(files["web"] in w for w in summary["warnings"])
