"""The workflow's planning, tested directly (no job runs): a config becomes fingerprinted stages wired by their
jobs' specs, and a changed stage reruns with exactly what depends on it. Each test builds its own config."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from workflows.config import load_config
from workflows.plan import plan, to_run
from workflows.specs import SPECS
from workflows.state import finished, marker_path, write_atomic

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample"


def config(root: Path, corpus: Path, steps: int = 40, epochs: int = 1, dupe_factor: int = 1) -> dict:
    return {
        "name": "tiny", "mlflow": {"experiment": "tiny"},
        "vocab": {"input": [str(corpus)], "args": {"vocab-size": 2000}},
        "datasets": {"train": {"input": [str(corpus)], "args": {"max-seq-length": 64, "dupe-factor": dupe_factor}},
                     "eval": {"input": [str(corpus)], "args": {"max-seq-length": 64, "dupe-factor": 1}}},
        "pretrain": {"phase1": {"data": "train", "eval_data": "eval", "args": {"preset": "bert_tiny",
                                                                               "max-steps": steps}},
                     "phase2": {"data": "train", "init": "phase1", "args": {"max-steps": 5}}},
        "finetune": {"rt": {"args": {"task": "classification", "epochs": epochs,
                                     "train": str(SAMPLE / "tasks" / "rt_sentiment.jsonl.gz"),
                                     "split-eval-from-train": 0.1}}},
    }


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.jsonl.gz"
    shutil.copy(SAMPLE / "corpus" / "mobydick.jsonl.gz", path)
    return path


def by_name(stages) -> dict:
    return {s.name: s for s in stages}


def test_stages_are_wired_by_their_specs(tmp_path, corpus):
    stages = by_name(plan(config(tmp_path, corpus), str(tmp_path / "w")))
    assert list(stages) == ["vocab", "dataset train", "dataset eval", "pretrain phase1", "pretrain phase2",
                            "finetune rt"]
    vocab, train, p1, p2, ft = (stages[k] for k in ("vocab", "dataset train", "pretrain phase1", "pretrain phase2",
                                                    "finetune rt"))
    assert vocab.outputs["vocab"] == str(tmp_path / "w" / "vocab" / f"vocab-{vocab.fingerprint[:8]}.txt")
    # The vocabulary stage has its own run, a child of the workflow's like every stage.
    assert vocab.argv_with_tracking("sqlite:///m.db", "e", "p")[-6:] == [
        "--mlflow-tracking-uri", "sqlite:///m.db", "--experiment", "e", "--parent-run-id", "p"]
    # The dataset builds with the workflow's vocabulary; the phases read the datasets, phase 2 starts from phase 1.
    assert train.argv[train.argv.index("--vocab") + 1] == vocab.outputs["vocab"] and train.deps == ["vocab"]
    assert train.outputs["dataset"] == str(tmp_path / "w" / "datasets" / f"train-{train.fingerprint[:8]}")
    assert p1.argv[p1.argv.index("--data") + 1] == train.outputs["dataset"]
    assert p1.deps == ["dataset train", "dataset eval"]
    assert p1.argv[p1.argv.index("--run-name") + 1] == f"tiny-phase1-{p1.fingerprint[:8]}"
    assert p2.argv[p2.argv.index("--init") + 1] == p1.outputs["export"] and "pretrain phase1" in p2.deps
    assert ft.argv[ft.argv.index("--init") + 1] == p2.outputs["export"]  # the last phase by default
    tracked = ft.argv_with_tracking("sqlite:///m.db", "tiny", "abc")
    assert tracked[-6:] == ["--mlflow-tracking-uri", "sqlite:///m.db", "--experiment", "tiny", "--parent-run-id",
                            "abc"]


def test_a_changed_stage_reruns_with_what_depends_on_it(tmp_path, corpus):
    base = plan(config(tmp_path, corpus), str(tmp_path))

    def rerun(cfg: dict) -> list[str]:
        """What runs when every stage of `base` finished: the stages whose fingerprint changed, and downstream."""
        done = {s.name: s.fingerprint for s in base}
        stages = plan(cfg, str(tmp_path))
        todo = to_run(stages, {s.name: done.get(s.name) == s.fingerprint for s in stages})
        return [s.name for s in stages if todo[s.name]]

    assert rerun(config(tmp_path, corpus)) == []
    assert rerun(config(tmp_path, corpus, epochs=2)) == ["finetune rt"]
    assert rerun(config(tmp_path, corpus, steps=50)) == ["pretrain phase1", "pretrain phase2", "finetune rt"]
    assert rerun(config(tmp_path, corpus, dupe_factor=2)) == ["dataset train", "pretrain phase1", "pretrain phase2",
                                                              "finetune rt"]
    # An edited input file (same name) is a changed input: everything built from it reruns.
    os.utime(corpus, (time.time() + 10, time.time() + 10))
    assert rerun(config(tmp_path, corpus)) == [s.name for s in base]


def test_to_run_takes_everything_downstream_of_what_runs(tmp_path, corpus):
    stages = plan(config(tmp_path, corpus), str(tmp_path))
    todo = to_run(stages, {s.name: s.name != "dataset eval" for s in stages})
    assert [s.name for s in stages if todo[s.name]] == ["dataset eval", "pretrain phase1", "pretrain phase2",
                                                        "finetune rt"]


@pytest.mark.parametrize("change, message", [
    (lambda c: c["datasets"]["train"]["args"].update(output="x"), r"args \['output'\] are set by the workflow"),
    (lambda c: c["pretrain"]["phase1"]["args"].update({"run_name": "x"}), r"args \['run-name'\]"),
    (lambda c: c["pretrain"]["phase1"].update(data="nope"), "'nope' is not one of the datasets"),
    (lambda c: c["pretrain"]["phase1"].update(init="phase2"), "phase 'phase2' must come before 'phase1'"),
    (lambda c: c["finetune"]["rt"].update(init="phase9"), "'phase9' is not one of the pretrain phases"),
    (lambda c: c["datasets"]["eval"].pop("input"), r"datasets.eval: needs `input`"),
])
def test_config_mistakes_name_the_entry(tmp_path, corpus, change, message):
    cfg = config(tmp_path, corpus)
    change(cfg)
    with pytest.raises(ValueError, match=message):
        plan(cfg, str(tmp_path))


def test_load_config_checks_the_shape(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text("name: x\nstages: {}\n")
    with pytest.raises(ValueError, match=r"unknown top-level keys \['stages'\]"):
        load_config(path)
    path.write_text("name: x\ndatasets: {a: {input: [f]}}\n")
    with pytest.raises(ValueError, match="one under `pretrain`"):
        load_config(path)
    assert load_config(REPO / "configs" / "quickstart.yaml")["name"] == "quickstart"


def test_a_stage_is_finished_only_with_its_marker_and_its_whole_output(tmp_path, corpus):
    stages = by_name(plan(config(tmp_path, corpus), str(tmp_path)))
    p1 = stages["pretrain phase1"]
    marker = {"stage": p1.name, "fingerprint": p1.fingerprint, "result": {"loss": 2.5, "run_name": "x"}}
    write_atomic(marker_path(tmp_path, p1), json.dumps(marker))
    export = Path(p1.outputs["export"])
    export.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (export / name).write_text("{}")
    assert finished(tmp_path, p1) is None  # no lineage file: the export was cut short
    (export / "bert_pretrain_run.json").write_text("{}")
    assert finished(tmp_path, p1) == marker
    write_atomic(marker_path(tmp_path, p1), json.dumps({**marker, "fingerprint": "other"}))
    assert finished(tmp_path, p1) is None
    assert SPECS["pretrain"].metrics(marker["result"]) == {"loss": 2.5}
    assert SPECS["finetune"].metrics({"accuracy": 0.8, "best_epoch": 2, "output": "o", "ok": True}) == {
        "accuracy": 0.8, "best_epoch": 2.0}
