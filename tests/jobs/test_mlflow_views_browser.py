"""The MLflow UI as a person meets it: every stage's run (vocabulary, build, pre-training, fine-tuning) logged to one
`mlflow server` on 127.0.0.1 by the jobs themselves, then opened in a fresh headless Chromium.

- The link the jobs print (`tracking.links`) opens the experiment's runs in the model-training view.
- Clicking the experiment in the list: MLflow 3.17.2 picks the view from the browser's GenAI | Model training
  switch (tracking/links.py says how it was found); after one click on "Model training", every experiment in the
  list opens on its runs.
- The pre-training run shows its dataset; the build run its report; the fine-tuning run its task data and a
  description whose link opens the pre-training run it started from.

Screenshots go to $MLFLOW_VIEWS_SCREENSHOTS when set (to look at them), else to the test's temp folder. Skipped
only where Chromium is not installed (Debian: `apt-get install chromium`).
"""
from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from tests._browser import CHROMIUM, Browser, mlflow_server

pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium"),
              pytest.mark.slow, pytest.mark.timeout(900)]
EXPERIMENT = "views"


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def run_every_stage(tmp_path: Path, sample_dir: Path, uri: str, capsys) -> dict[str, str]:
    """vocab -> build -> pre-training -> fine-tuning, each the job a user runs, logging to `uri`; their run ids."""
    from jobs import build_dataset, finetune, pretrain, train_tokenizer

    track = ["--mlflow-tracking-uri", uri, "--experiment", EXPERIMENT]
    moby = str(sample_dir / "corpus" / "mobydick.jsonl.gz")
    ids = {}
    assert train_tokenizer.main(["--input", moby, "--output", str(tmp_path / "vocab.txt"), "--vocab-size", "3000",
                                 *track]) == 0
    ids["vocab"] = last_json(capsys)["mlflow_run_id"]
    assert build_dataset.main(["--input", moby, "--output", str(tmp_path / "moby-64"), "--vocab",
                               str(tmp_path / "vocab.txt"), "--max-seq-length", "64", "--dupe-factor", "1",
                               "--num-shards", "2", "--no-ray", *track]) == 0
    ids["build"] = last_json(capsys)["mlflow_run_id"]
    assert pretrain.main(["--data", str(tmp_path / "moby-64"), "--preset", "bert_tiny", "--max-steps", "8",
                          "--batch-size", "8", "--no-ray", "--threads", "1", "--storage", str(tmp_path / "runs"),
                          "--run-name", "tiny-moby", "--export", str(tmp_path / "tiny-moby"), "--checkpoint-every",
                          "8", "--no-system-metrics", *track]) == 0
    ids["pretrain"] = last_json(capsys)["mlflow_run_id"]
    rows = [json.loads(line) for line in gzip.open(sample_dir / "tasks" / "rt_sentiment.jsonl.gz", "rt")][:3000:25]
    (tmp_path / "rt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert finetune.main(["--task", "classification", "--train", str(tmp_path / "rt.jsonl"),
                          "--split-eval-from-train", "0.25", "--init", str(tmp_path / "tiny-moby"), "--epochs", "1",
                          "--batch-size", "16", "--max-seq-length", "32", "--no-ray", "--cpus-per-worker", "1",
                          "--output", str(tmp_path / "rt-model"), *track]) == 0
    ids["finetune"] = last_json(capsys)["mlflow_run_id"]
    return ids


def open_from_list(b: Browser, exp_id: str) -> None:
    """Clicks the experiment in the list (again if the list was still rendering) until its page opens."""
    for _ in range(5):
        b.click_link(EXPERIMENT)
        try:
            b.wait_for_url(f"/experiments/{exp_id}", timeout=10)
            return
        except AssertionError:
            continue
    raise AssertionError(f"clicking {EXPERIMENT!r} in the list did not open it: {b.url()}")


def test_the_jobs_runs_open_in_the_model_training_view(tmp_path, sample_dir, capsys):
    from mlflow.tracking import MlflowClient

    from tracking.links import experiment_url, run_url

    shots = Path(os.environ.get("MLFLOW_VIEWS_SCREENSHOTS") or tmp_path / "shots")
    with mlflow_server(tmp_path) as uri:
        ids = run_every_stage(tmp_path, sample_dir, uri, capsys)
        client = MlflowClient(uri)
        exp_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
        names = {k: client.get_run(v).info.run_name for k, v in ids.items()}

        # The link a job prints: the runs table, model-training view, every stage's run in it.
        with Browser(tmp_path / "profile-link") as b:
            b.goto(experiment_url(uri, exp_id))
            # Every stage's run (the fine-tuning run is nested under its pre-training run), and the Dataset column:
            # the build's output is the pre-training's input.
            for needle in ("4 matching runs", names["vocab"], names["build"], names["pretrain"], "moby-64"):
                text = b.wait_for(needle)
            b.screenshot(shots / "printed-link-runs.png")
            assert "/runs" in b.url() and "workflowType=machine_learning" in b.url()
            assert "Observability" not in text and "Detect Issues" not in text  # not the GenAI view

        # The experiment list, a fresh browser. As MLflow 3.17.2 ships, a click on the experiment opens the GenAI
        # overview (kept as a screenshot, not asserted: tracking/links.py); after one click on the switch, it
        # opens the runs, then and later.
        with Browser(tmp_path / "profile-list") as b:
            b.goto(f"{uri}/#/experiments")
            b.wait_for(EXPERIMENT)
            b.screenshot(shots / "list.png")
            open_from_list(b, exp_id)
            time.sleep(3)
            b.screenshot(shots / "list-click-fresh-browser.png")
            b.goto(f"{uri}/#/experiments")
            b.wait_for(EXPERIMENT)
            b.click_text("Model training")
            open_from_list(b, exp_id)
            b.wait_for(names["pretrain"])
            b.screenshot(shots / "list-click-after-switch.png")
            assert f"/experiments/{exp_id}/runs" in b.url() and "workflowType=machine_learning" in b.url()
            b.click_link("Experiments")  # back to the list, and the experiment again: the browser remembers
            b.wait_for_url("#/experiments")
            open_from_list(b, exp_id)
            b.wait_for(names["pretrain"])
            assert f"/experiments/{exp_id}/runs" in b.url()

        with Browser(tmp_path / "profile-runs", height=1700) as b:  # tall: the description below the fold too
            b.goto(run_url(uri, exp_id, ids["pretrain"]))
            text = b.wait_for("moby-64")  # its dataset input
            b.screenshot(shots / "pretrain-run.png")

            b.goto(run_url(uri, exp_id, ids["build"]))
            text = b.wait_for("Dataset build of")  # the build's description
            assert "moby-64" in text
            b.screenshot(shots / "build-run.png")

            b.goto(run_url(uri, exp_id, ids["vocab"]))
            text = b.wait_for("WordPiece vocabulary of 3,000 entries")
            b.screenshot(shots / "vocab-run.png")

            b.goto(run_url(uri, exp_id, ids["finetune"]))
            text = b.wait_for("Fine-tuning for")
            assert "rt.jsonl" in text  # the task data, as its dataset input and in the description
            b.screenshot(shots / "finetune-run.png")
            # The lineage link in the description: MLflow opens a description's links in a new tab (target
            # _blank); the tab gets the link's address, which is opened here.
            link = b.eval("[...document.querySelectorAll('a')].filter(a => a.innerText.trim() === "
                          f"{json.dumps('pre-training run ' + names['pretrain'])}).map(a => a.href)[0]")
            assert link and ids["pretrain"] in link and "workflowType=machine_learning" in link, link
            b.goto(link)
            b.wait_for_url(ids["pretrain"])
            text = b.wait_for("moby-64")
            assert names["pretrain"] in text
            b.screenshot(shots / "finetune-lineage-link-opened.png")
