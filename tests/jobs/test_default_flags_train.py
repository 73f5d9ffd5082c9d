"""Defaults that train: a bert_tiny pre-trained with the default --lr and warm-up for 400 steps on real text, then
fine-tuned with the default flags, beats the majority class on wordnet_lexname; with --lr 1e-7 the job names the
collapse on rt_sentiment.

Not asserted, because it does not hold: this weak model (held-out MLM accuracy 0.11) beating rt_sentiment's
majority with the default flags. Across pre-training data orders (before and after the world-size-free order of
issue 31; the same data, flags and seeds) it scored 0.557 on a 1,000-example subset and 0.65 on 2,000 before, 0.507
on 2,000 and 0.547 on the whole file (9,596 examples) after, 2026-11-28: its fine-tuning sits at the edge of
collapsing to one class. wordnet_lexname needs enough optimizer steps: 0.143 on 2,000 examples x 3 epochs (63
steps an epoch), 0.303 on 4,000 or on 2,000 x 5 epochs (the small-data instability of Mosbach et al., 2021: too few
steps, not a bad rate). One pre-trained model is shared by the tests (a session fixture: pre-training is the
expensive part).

What is not a default here, to keep the suite's cost small: --batch-size 32 for pre-training (the setting the
learning-rate sweep measured, docs/learning-rates.md), task subsets (--max-train-examples) and --max-seq-length 64.
"""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from finetuning.records import split_train_eval, subsample
from jobs import build_dataset, finetune, pretrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"
# The shared tasks (../shared/data beside the checkout, or two levels up from a worktree), else the bundled copies.
SHARED = next((d for d in (REPO.parent / "shared" / "data" / "tasks", REPO.parent.parent / "shared" / "data" / "tasks")
               if d.is_dir()), None)
# task -> (file, flags): rt_sentiment is bundled whole; wordnet_lexname's full file (else the bundled 3,000-row
# sample, its rare classes left out: see task_file) with a 4,000-example subset (see the module's docstring).
TASKS = {
    "rt_sentiment": ((SHARED or SAMPLE / "tasks") / "rt_sentiment.jsonl.gz", ["--max-train-examples", "1000"]),
    "wordnet_lexname": ((SHARED / "wordnet_lexname.jsonl.gz") if SHARED else SAMPLE / "tasks" /
                        "wordnet_lexname.sample.jsonl.gz", ["--max-train-examples", "4000"]),
}
EVAL_EXAMPLES = 300
RARE = 20  # rows: the bundled sample's classes below this are left out (one had a single row, held out for eval)


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def task_file(task: str, folder: Path) -> Path:
    """The task's file as the job reads it. The shared file holds every class many times; the bundled sample of
    wordnet_lexname does not (the job rightly refuses a held-out label the training part never has), so its rare
    classes are left out, in a copy under ``folder``, and the copy is checked the way the job checks it."""
    path, flags = TASKS[task]
    if SHARED or task != "wordnet_lexname":
        return path
    rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    counts = Counter(str(r["label"]) for r in rows)
    rows = [r for r in rows if counts[str(r["label"])] >= RARE]
    train, held = split_train_eval(rows, 0.1, 0)
    train = subsample(train, int(flags[flags.index("--max-train-examples") + 1]), 0)
    assert {str(r["label"]) for r in held} <= {str(r["label"]) for r in train}
    copy = folder / path.name
    with gzip.open(copy, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return copy


def majority_share(path: Path) -> float:
    """The majority label's share of the rows the job evaluates on, from the file: the seeded 10% it holds out
    (--split-eval-from-train 0.1 --split-seed 0) and the seeded 300 of them (--max-eval-examples), selected by
    the job's own split functions."""
    rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    held = subsample(split_train_eval(rows, 0.1, 0)[1], EVAL_EXAMPLES, 0)
    return Counter(str(r["label"]) for r in held).most_common(1)[0][1] / len(held)


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory) -> Path:
    """bert_tiny, 400 steps with the default --lr and warm-up, on Austen (real text), exported."""
    work = tmp_path_factory.mktemp("default-tiny")
    assert build_dataset.main(["--input", str(SAMPLE / "corpus" / "austen.jsonl.gz"), "--output", str(work / "data"),
                               "--vocab-size", "8000", "--max-seq-length", "128", "--dupe-factor", "1",
                               "--num-shards", "2", "--no-ray", "--no-mlflow", "--log-level", "WARNING"]) == 0
    assert pretrain.main(["--data", str(work / "data"), "--preset", "bert_tiny", "--max-steps", "400",
                          "--batch-size", "32", "--no-ray", "--threads", "1", "--storage", str(work / "runs"),
                          "--run-name", "default-tiny", "--export", str(work / "model"), "--checkpoint-every", "400",
                          "--no-system-metrics"]) == 0
    return work / "model"


def run_finetune(model: Path, task: str, tmp_path: Path, capsys, *extra: str) -> dict:
    path, flags = task_file(task, tmp_path), TASKS[task][1]
    capsys.readouterr()
    assert finetune.main(["--task", "classification", "--train", str(path), "--split-eval-from-train", "0.1",
                          "--init", str(model), "--max-eval-examples", str(EVAL_EXAMPLES), "--max-seq-length", "64",
                          "--no-ray", "--cpus-per-worker", "1", "--output", str(tmp_path / "out"), *flags,
                          *extra]) == 0
    return last_json(capsys)


@pytest.mark.parametrize("task", ["wordnet_lexname"])
def test_default_flags_train_above_the_majority_class(pretrained, task, tmp_path, capsys, caplog):
    majority = majority_share(task_file(task, tmp_path))
    result = run_finetune(pretrained, task, tmp_path, capsys)
    print(f"{task}: accuracy {result['accuracy']:.3f} with the default flags, majority share {majority:.3f}")
    assert result["majority_share"] == pytest.approx(majority)  # what the job measured is what the data says
    assert result["accuracy"] > majority + 0.05, (result, majority)
    assert result["collapse"] is None


def test_a_rate_too_low_to_learn_is_named(pretrained, tmp_path, capsys, caplog):
    result = run_finetune(pretrained, "rt_sentiment", tmp_path, capsys, "--lr", "1e-7", "--epochs", "1")
    assert result["collapse"] and "try a higher --lr (this run: 1e-07)" in result["collapse"]
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "collapsed model" in r.getMessage()]
    assert len(warnings) == 1
