"""Lineage a person can click both ways, in a fresh browser: build run -> pre-training run -> fine-tuning run and back,
and MLflow's own "Parent run" link, every page in the model-training view.

The jobs run as a user runs them (no --experiment: the pipeline's one default experiment), logging to a local
sqlite store; the store is served by the command the jobs print (`jobs/mlflow_ui.py`), and each hop starts in a
new headless Chromium profile (nothing remembered). Screenshots go to $LINEAGE_SCREENSHOTS when set, else to the
test's temp folder. Skipped only where Chromium is not installed (Debian: `apt-get install chromium`).
"""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests._browser import CHROMIUM, Browser
from tests._local_stack import free_ports

pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium"),
              pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]
# The sidebars of the two views of MLflow 3.17.2 (read off its pages): GenAI's and model training's.
GENAI = ("Observability", "Sessions", "Judges", "AI Gateway", "Detect Issues")
MODEL_TRAINING = "Model registry"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, sample_dir):
    """build -> pre-training -> fine-tuning, each the job a user runs, into one local store; the store served by
    jobs/mlflow_ui.py. Yields the UI's URL, the runs' ids and names, the experiment's id."""
    from mlflow.tracking import MlflowClient

    from jobs import build_dataset, finetune, pretrain
    from tracking.store import DEFAULT_EXPERIMENT

    tmp = tmp_path_factory.mktemp("lineage")
    uri = f"sqlite:///{tmp}/mlruns/mlflow.db"
    track = ["--mlflow-tracking-uri", uri]
    moby = str(sample_dir / "corpus" / "mobydick.jsonl.gz")
    ids = {}

    def run(main, args) -> str:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(args) == 0
        return json.loads(out.getvalue().strip().splitlines()[-1])["mlflow_run_id"]

    ids["build"] = run(build_dataset.main, ["--input", moby, "--output", str(tmp / "moby-64"), "--vocab-size", "2000",
                                            "--max-seq-length", "64", "--dupe-factor", "1", "--num-shards", "2",
                                            "--no-ray", *track])
    ids["pretrain"] = run(pretrain.main, ["--data", str(tmp / "moby-64"), "--eval-data", str(tmp / "moby-64"),
                                          "--eval-sequences", "64", "--preset", "bert_tiny", "--max-steps", "8",
                                          "--batch-size", "8", "--log-every", "4", "--no-ray", "--threads", "1",
                                          "--storage", str(tmp / "runs"), "--run-name", "tiny-moby", "--export",
                                          str(tmp / "tiny-moby"), "--checkpoint-every", "8", "--no-system-metrics",
                                          *track])
    rows = [json.loads(line) for line in gzip.open(sample_dir / "tasks" / "rt_sentiment.jsonl.gz", "rt")][:3000:25]
    (tmp / "rt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids["finetune"] = run(finetune.main, ["--task", "classification", "--train", str(tmp / "rt.jsonl"),
                                          "--split-eval-from-train", "0.25", "--init", str(tmp / "tiny-moby"),
                                          "--epochs", "1", "--batch-size", "16", "--max-seq-length", "32", "--no-ray",
                                          "--cpus-per-worker", "1", "--output", str(tmp / "rt-model"), *track])
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name(DEFAULT_EXPERIMENT).experiment_id
    names = {k: client.get_run(v).info.run_name for k, v in ids.items()}
    [port] = free_ports(1)
    ui = subprocess.Popen([sys.executable, str(REPO / "jobs" / "mlflow_ui.py"), "--store", uri, "--port", str(port)],
                          cwd=tmp, stdout=open(tmp / "ui.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                assert ui.poll() is None, (tmp / "ui.log").read_text()
                assert time.time() < deadline, "jobs/mlflow_ui.py did not answer in 120 s"
                time.sleep(0.3)
        yield {"url": url, "ids": ids, "names": names, "exp": exp_id, "tmp": tmp, "client": client}
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(30)


def shots(tmp: Path) -> Path:
    return Path(os.environ.get("LINEAGE_SCREENSHOTS") or tmp / "shots")


def href(b: Browser, text: str) -> str:
    """The address of the link saying `text` (a description's links open in a new tab; the tab gets this)."""
    link = b.eval("[...document.querySelectorAll('a')].filter(a => a.innerText.trim() === "
                  f"{json.dumps(text)}).map(a => a.href)[0]")
    assert link, f"no link saying {text!r} on {b.url()}:\n{b.text()[:2000]}"
    return link


def click_href(b: Browser, pattern: str) -> None:
    """Click, as a person does, the first link whose address matches `pattern` (a JS regular expression), scrolled
    into view first (a page opened by a link can be scrolled past it: a click at its place would land elsewhere)."""
    box = b.eval(f"(() => {{ const a = [...document.querySelectorAll('a')].find(a => new RegExp({json.dumps(pattern)})"
                 ".test(a.href)); if (!a) return null; a.scrollIntoView({block: 'center'});"
                 " const r = a.getBoundingClientRect();"
                 " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    assert box, f"no link to {pattern} on {b.url()}"
    for kind in ("mousePressed", "mouseReleased"):
        b.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)


def model_training_view(text: str) -> None:
    assert MODEL_TRAINING in text and not [g for g in GENAI if g in text], f"not the model-training view:\n{text[:500]}"


def test_one_experiment_holds_the_pipelines_runs(pipeline):
    client, exp = pipeline["client"], pipeline["exp"]
    runs = {r.info.run_id: r for r in client.search_runs([exp])}
    assert set(pipeline["ids"].values()) <= set(runs)
    build, pre = runs[pipeline["ids"]["build"]], runs[pipeline["ids"]["pretrain"]]
    assert pre.data.tags["lineage.training_build_run_id"] == build.info.run_id
    assert f"bert.used_by.{pre.info.run_id}" in build.data.tags
    assert runs[pipeline["ids"]["finetune"]].data.tags["mlflow.parentRunId"] == pre.info.run_id


def test_build_to_pretraining_to_finetuning_and_back_in_fresh_browsers(pipeline):
    url, ids, names, exp, tmp = (pipeline[k] for k in ("url", "ids", "names", "exp", "tmp"))
    from tracking.links import run_url

    where = shots(tmp)
    # build -> pre-training: the build run's description lists the runs trained on its dataset.
    with Browser(tmp / "p1", height=1500) as b:
        b.goto(run_url(url, exp, ids["build"]))
        model_training_view(b.wait_for("Used by:"))
        b.screenshot(where / "1-build-run-used-by.png")
        forward = href(b, f"pre-training run {names['pretrain']}")
    with Browser(tmp / "p2", height=1500) as b:
        b.goto(forward)
        b.wait_for_url(ids["pretrain"])
        text = b.wait_for("Training data:")
        model_training_view(text)
        assert f"built by run {names['build']}" in text and f"fine-tuning run {names['finetune']}" in text
        b.screenshot(where / "2-pretraining-run-both-ways.png")
        back, down = href(b, names["build"]), href(b, f"fine-tuning run {names['finetune']} (classification)")
    # pre-training -> build (back), and pre-training -> fine-tuning.
    with Browser(tmp / "p3", height=1500) as b:
        b.goto(back)
        b.wait_for_url(ids["build"])
        model_training_view(b.wait_for("Dataset build of"))
        b.screenshot(where / "3-back-to-the-build-run.png")
    with Browser(tmp / "p4", height=1500) as b:
        b.goto(down)
        b.wait_for_url(ids["finetune"])
        text = b.wait_for("Fine-tuning for")
        model_training_view(text)
        b.screenshot(where / "4-finetuning-run.png")
        # fine-tuning -> pre-training by MLflow's own "Parent run" link (no workflowType in it): clicked, in this
        # fresh browser, it opens the pre-training run in the model-training view.
        b.click_link(names["pretrain"])
        b.wait_for_url(f"/runs/{ids['pretrain']}")
        text = b.wait_for("Training data:")
        model_training_view(text)
        b.screenshot(where / "5-parent-run-link-clicked.png")
        # and the experiment from the run page's link to it (its id, no view in the link): its runs table, not the
        # GenAI overview
        click_href(b, rf"#/experiments/{exp}(\?|$)")
        b.wait_for_url(f"/experiments/{exp}")
        text = b.wait_for("matching runs")
        model_training_view(text)
        assert "/runs" in b.url()
        b.screenshot(where / "6-experiment-from-the-run-page.png")
    # The experiment list, a fresh browser: a click on the experiment opens its runs (MLflow's own link, no view in
    # it: as MLflow serves it, the GenAI overview).
    with Browser(tmp / "p5") as b:
        b.goto(f"{url}/#/experiments")
        b.wait_for(pipeline["client"].get_experiment(exp).name)
        click_href(b, rf"#/experiments/{exp}(\?|$)")
        b.wait_for_url(f"/experiments/{exp}")
        model_training_view(b.wait_for("matching runs"))
        b.screenshot(where / "7-experiment-from-the-list.png")
