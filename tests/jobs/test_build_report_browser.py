"""The build's MLflow run as a person sees it: `mlflow server` on 127.0.0.1, the run's pages opened in headless
Chromium. The rendered pages must show the run, its dataset (name and digest) and every figure of the report as an
image. Screenshots go to $BUILD_REPORT_SCREENSHOTS when set (to look at them), else to the test's temp folder.

Skipped only where Chromium is not installed (Debian: `apt-get install chromium`; .ci/run installs it).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import _browser
import pytest

from corpus.schema import read_manifest
from tracking.build_report import FIGURES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def mlflow_server(tmp_path):
    """An MLflow server on loopback over a sqlite store; its artifacts under tmp_path. Yields its URL."""
    with _browser.mlflow_server(tmp_path) as url:
        yield url


def chromium(url: str, user_dir: Path, screenshot: Path) -> str:
    """The page's DOM after its scripts ran (and a screenshot of it): the MLflow UI is a single-page app."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={user_dir}", "--window-size=1400,1100", "--virtual-time-budget=20000"]
    subprocess.run([*flags, f"--screenshot={screenshot}", url], capture_output=True, timeout=120, check=True)
    assert screenshot.stat().st_size > 10_000, screenshot
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
    screenshot.with_suffix(".html").write_text(dom)  # beside the screenshot, to see what an assertion saw
    return dom


@pytest.mark.timeout(400)
def test_the_run_page_shows_the_dataset_and_the_reports_figures(tmp_path, sample_dir, mlflow_server, capsys):
    from jobs import build_dataset

    shots = Path(os.environ.get("BUILD_REPORT_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "moby-128"
    assert build_dataset.main(["--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output", str(out),
                               "--vocab-size", "4000", "--dupe-factor", "2", "--num-shards", "2", "--no-ray",
                               "--mlflow-tracking-uri", mlflow_server, "--experiment", "datasets",
                               "--log-level", "WARNING"]) == 0
    run_id = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mlflow_run_id"]
    manifest = read_manifest(str(out))
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    from mlflow.tracking import MlflowClient

    exp_id = MlflowClient(mlflow_server).get_run(run_id).info.experiment_id
    page = f"{mlflow_server}/#/experiments/{exp_id}/runs/{run_id}"
    user_dir = tmp_path / "chromium"

    overview = chromium(page, user_dir, shots / "overview.png")
    assert "build moby-128 seq128" in overview
    assert "moby-128" in overview and manifest.sha256[:16] in overview  # the Datasets section
    assert f"{totals['instances']:,} sequences" in overview  # the description

    # The experiment's runs table: the build's run with its dataset in the Datasets column.
    table = chromium(f"{mlflow_server}/#/experiments/{exp_id}/runs", user_dir, shots / "runs-table.png")
    assert "build moby-128 seq128" in table and "moby-128" in table

    for name in FIGURES:
        dom = chromium(f"{page}/artifacts/report/{name}", user_dir, shots / name.replace(".png", "-page.png"))
        # The artifact viewer shows the image itself: fetched from the server, displayed from a blob: URL.
        assert re.search(rf'<img[^>]*alt="report/{re.escape(name)}"[^>]*src="blob:', dom), name
