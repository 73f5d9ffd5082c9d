"""Users' mistakes with jobs/build_dataset.py, run as a user runs it (a subprocess on real files): an error is one
line on stderr naming the flag or file and the fix, with no traceback; a warning carries the figure."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_job(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / "build_dataset.py"), *args, "--log-level", "WARNING"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    """The job's error: exit status 2, no traceback, exactly one line saying so."""
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("build_dataset: error:")]
    assert len(errors) == 1, p.stderr
    return errors[0]


def chapters(sample_dir: Path, n: int = 6) -> list[dict]:
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f][1:n + 1]


@pytest.mark.parametrize("cpus", ["0", "-2"])
def test_num_cpus_below_one(tmp_path, sample_dir, cpus):
    line = one_error_line(run_job("--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"),
                                  "--output", str(tmp_path / "out"), "--num-cpus", cpus))
    assert f"--num-cpus {cpus}: use at least 1" in line
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_max_seq_length_too_small_names_the_minimum(tmp_path, sample_dir):
    line = one_error_line(run_job("--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"),
                                  "--output", str(tmp_path / "out"), "--max-seq-length", "8", "--no-ray"))
    assert "--max-seq-length 8: use 16..65535" in line


def test_jsonl_without_the_text_field_lists_its_fields_and_the_flag(tmp_path, sample_dir):
    corpus = tmp_path / "moby.jsonl"
    corpus.write_text("".join(json.dumps({"id": d["id"], "body": d["text"]}) + "\n" for d in chapters(sample_dir)))
    line = one_error_line(run_job("--input", str(corpus), "--output", str(tmp_path / "out"), "--no-ray",
                                  "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")))
    assert "moby.jsonl, line 1" in line and "no string 'text' field (the record has fields 'id', 'body')" in line
    assert "--text-field NAME" in line
    # The flag it names is the fix.
    ok = run_job("--input", str(corpus), "--output", str(tmp_path / "out"), "--no-ray", "--text-field", "body",
                 "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), "--dupe-factor", "1",
                 "--num-shards", "1")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["documents"] == 6


def test_a_folder_holding_no_corpus_files(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "README.md").write_text("# My corpus\n\nThe text is elsewhere.\n")
    line = one_error_line(run_job("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--no-ray"))
    assert "matches no corpus files" in line and "README.md" in line


def test_a_vocabulary_that_does_not_fit_the_text_stops_the_build_unless_allowed(tmp_path, sample_dir):
    """Vim's Chinese tutorial with the English bert-base-uncased vocabulary: ~40% [UNK]."""
    args = ["--input", str(sample_dir / "other" / "vimtutor.zh_cn.txt.gz"), "--output", str(tmp_path / "out"),
            "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), "--no-ray",
            "--dupe-factor", "1", "--num-shards", "1"]
    line = one_error_line(run_job(*args))
    # Refused once the read pass has counted every token, before any instance is made.
    sampled = float(re.search(r"([\d.]+)% of the corpus's tokens are \[UNK\]", line).group(1))
    assert 30 < sampled < 50, line
    assert "vimtutor.zh_cn.txt.gz" in line and "--max-unk-fraction (now 0.1)" in line
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not (tmp_path / "out" / "_work" / "instances").exists()
    # Allowed, the same build resumes and finishes, the exact figure kept as a warning in the summary and manifest.
    ok = run_job(*args, "--max-unk-fraction", "1")
    assert ok.returncode == 0, ok.stderr
    share = float(re.search(r"([\d.]+)% of the corpus's tokens are \[UNK\]", ok.stderr).group(1))
    assert share == sampled
    [warning] = json.loads(ok.stdout.strip().splitlines()[-1])["warnings"]
    assert f"{share}% of the corpus's tokens are [UNK]" in warning
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["warnings"] == [warning]
    assert manifest["totals"]["unk_tokens"] / manifest["totals"]["tokens"] == pytest.approx(share / 100, abs=1e-3)


def test_english_with_the_english_vocabulary_gives_no_unk_warning(tmp_path, sample_dir):
    corpus = tmp_path / "moby.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in chapters(sample_dir)))
    p = run_job("--input", str(corpus), "--output", str(tmp_path / "out"), "--no-ray", "--dupe-factor", "1",
                "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), "--num-shards", "1")
    assert p.returncode == 0, p.stderr
    assert "[UNK]" not in p.stderr and json.loads(p.stdout.strip().splitlines()[-1])["warnings"] == []
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["totals"]["unk_tokens"] == 0


def test_a_trained_vocabulary_far_smaller_than_asked_and_a_masking_cap_are_warned_with_figures(tmp_path, sample_dir):
    corpus = tmp_path / "moby.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in chapters(sample_dir, 3)))
    p = run_job("--input", str(corpus), "--output", str(tmp_path / "out"), "--no-ray", "--dupe-factor", "1",
                "--num-shards", "1", "--max-seq-length", "256")  # --vocab-size 30522, --max-predictions-per-seq 20
    assert p.returncode == 0, p.stderr
    size = json.loads((tmp_path / "out" / "manifest.json").read_text())["vocab"]["size"]
    assert size < 0.9 * 30522
    vocab_warning = f"vocabulary: trained {size:,} entries of the 30,522 asked ({size / 30522:.0%})"
    masking_warning = "--max-predictions-per-seq 20 caps masking below --masked-lm-prob 0.15"
    assert vocab_warning in p.stderr and masking_warning in p.stderr
    assert "gets 20 masks instead of 38" in p.stderr
    warnings = json.loads(p.stdout.strip().splitlines()[-1])["warnings"]
    assert [w[:len(masking_warning)] for w in warnings[:1]] == [masking_warning]
    assert any(w.startswith(vocab_warning) for w in warnings)


# ---- mistakes found before any work: one line, before Ray or MLflow start, no run left behind ----------------------

def moby_text(tmp_path: Path, sample_dir: Path, separator: str) -> Path:
    """Moby Dick as plain text, a chapter per line, chapters separated by `separator` ("\n": no blank lines)."""
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        chapters = [" ".join(json.loads(line)["text"].split()) for line in f]
    path = tmp_path / f"moby-{len(separator)}.txt"
    path.write_text("".join(c + "\n" + separator[1:] for c in chapters))
    return path


@pytest.fixture
def own_store(tmp_path):
    """The job's environment with a store of the test's own, to see what a refused job leaves in it (nothing)."""
    store = tmp_path / "store" / "mlflow.db"
    return store, {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}


def refused(p: subprocess.CompletedProcess, store: Path) -> str:
    """One error line, and neither MLflow nor Ray started: no store created, nothing of theirs in the output."""
    line = one_error_line(p)
    assert not store.exists() and not store.parent.exists(), "a refused build must leave no MLflow run"
    assert "mlflow" not in p.stderr.lower().replace(line.lower(), "") and "ray" not in p.stderr.lower()
    return line


def test_text_without_blank_lines_is_one_document_and_refused(tmp_path, sample_dir, own_store):
    """1.2 MB of chapters, one per line, no blank line: it used to build as `"documents": 1`."""
    store, env = own_store
    line = refused(run_job("--input", str(moby_text(tmp_path, sample_dir, "\n")), "--output", str(tmp_path / "out"),
                           env=env), store)
    assert "moby-1.txt: its first 1 MiB of text hold no blank line, so it reads as one document" in line
    assert "put a blank line between documents" in line and "--format jsonl" in line
    assert not (tmp_path / "out").exists()


def test_num_shards_far_over_the_instances_is_refused(tmp_path, sample_dir, own_store):
    """Moby Dick at dupe factor 1 makes ~3,100 instances: 5,000 shards would leave ~1,900 empty."""
    store, env = own_store
    line = refused(run_job("--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output",
                           str(tmp_path / "out"), "--dupe-factor", "1", "--num-shards", "5000", env=env), store)
    estimate = int(re.search(r"--num-shards 5000 for about ([\d,]+) instances", line).group(1).replace(",", ""))
    assert 2500 < estimate < 3700, line
    assert "would be written empty" in line and re.search(r"pass --num-shards \d+ or fewer", line)


def test_vocab_with_the_trained_vocabularys_flags_is_refused(tmp_path, sample_dir, own_store):
    store, env = own_store
    vocab = str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")
    line = refused(run_job("--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output",
                           str(tmp_path / "out"), "--vocab", vocab, "--vocab-size", "8000", env=env), store)
    assert "--vocab-size with --vocab" in line and "drop --vocab-size to use --vocab" in line
    line = refused(run_job("--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output",
                           str(tmp_path / "out"), "--vocab", vocab, "--vocab-sample-bytes", "1000000", env=env), store)
    assert "--vocab-sample-bytes with --vocab" in line


def test_an_output_folder_of_someone_elses_files_is_refused_and_left_as_it_is(tmp_path, sample_dir, own_store):
    store, env = own_store
    mine = tmp_path / "my-project"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "todo.md").write_text("keep me\n")
    (mine / "results.csv").write_text("a,b\n")
    before = sorted(p.relative_to(mine) for p in mine.rglob("*"))
    line = refused(run_job("--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output", str(mine),
                           env=env), store)
    assert f"--output {mine} already holds files that a build does not write (notes, results.csv)" in line
    assert "choose a new or empty folder" in line
    assert sorted(p.relative_to(mine) for p in mine.rglob("*")) == before


def test_a_missing_input_leaves_no_failed_run(tmp_path, own_store):
    """It used to open an MLflow run first, mark it FAILED, and answer after 5-10 s."""
    store, env = own_store
    line = refused(run_job("--input", str(tmp_path / "nowhere.txt"), "--output", str(tmp_path / "out"), env=env),
                   store)
    assert "nowhere.txt does not exist" in line and "fix --input" in line


@pytest.mark.parametrize("case", ["named .gz, holds text", "cut short"])
def test_a_bad_compressed_file_is_named_with_what_is_wrong(tmp_path, sample_dir, own_store, case):
    store, env = own_store
    path = tmp_path / "corpus.jsonl.gz"
    if case == "cut short":
        path.write_bytes((sample_dir / "corpus" / "mobydick.jsonl.gz").read_bytes()[:200_000])
    else:
        path.write_bytes(gzip.decompress((sample_dir / "corpus" / "mobydick.jsonl.gz").read_bytes()))
    line = refused(run_job("--input", str(path), "--output", str(tmp_path / "out"), env=env), store)
    if case == "cut short":
        assert "the gzip stream ends before its end marker, 200,000 bytes in: the file is cut short" in line
        assert "fetch it again, or pass --on-error skip" in line
    else:
        assert "not a gzip file, though its name ends in .gz (it starts with text)" in line
        assert "rename it to what it holds" in line


def test_a_file_cut_short_past_its_first_mib_ends_in_its_one_line_on_ray(tmp_path, sample_dir, own_store):
    """Found by the build on Ray (the head reads fine): one line, no traceback of Ray's shutdown under it; the run,
    opened as the work began, FAILED with that line."""
    from mlflow.tracking import MlflowClient

    store, env = own_store
    path = tmp_path / "austen.jsonl.gz"
    path.write_bytes((sample_dir / "corpus" / "austen.jsonl.gz").read_bytes()[:1_200_000])
    p = run_job("--input", str(path), "--output", str(tmp_path / "out"), "--num-cpus", "1",
                "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), env=env)
    line = one_error_line(p)
    assert "Ray is not initialized" not in p.stderr
    assert "austen.jsonl.gz: the file is cut short (its compressed stream ends before its end marker" in line
    assert "fetch it again" in line and "--on-error skip" in line
    client = MlflowClient(f"sqlite:///{store}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED" and run.data.tags["error"] in line
