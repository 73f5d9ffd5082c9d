"""Links into the MLflow UI that open where a person expects: an experiment's runs, a run, in the model-training view.

What MLflow 3.17.2's UI reads to pick an experiment's view (read from its bundle, mlflow/server/js/build/static/js,
and checked in headless Chromium, tests/jobs/test_mlflow_views_browser.py): the sidebar's switch "GenAI | Model
training" is always on (its feature flag is hard-wired true), and the experiment kind the pages use is derived from
that switch, not from the experiment's `mlflow.experimentKind` tag. The switch's value is the URL's
`workflowType` query parameter (`genai` or `machine_learning`), else the browser's localStorage entry
`mlflow.workflowType_v1` (written only when a person clicks the switch), else `genai`. So a fresh browser that
clicks an experiment in the list (`#/experiments/ID`, no parameter) lands on the GenAI overview whatever the tag
says; a link carrying `workflowType=machine_learning` opens the runs table, and one click on "Model training" in the
sidebar makes it the browser's default for every experiment. No server-side setting changes it in 3.17.2; the
tag is still set (`tracking.store`): it is what the UI reads where the switch is off.
"""
from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import quote

WORKFLOW_PARAM = "workflowType=machine_learning"  # the model-training view (runs, metrics, charts)
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui --backend-store-uri <store>` serves a local store


def ui_base(tracking_uri: str) -> str:
    """The UI's address for a store: the server itself, or the local `mlflow ui` a person starts on a file store."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return LOCAL_UI


def experiment_url(tracking_uri: str, experiment_id: str) -> str:
    """The experiment's runs table in the model-training view."""
    return f"{ui_base(tracking_uri)}/#/experiments/{quote(str(experiment_id))}/runs?{WORKFLOW_PARAM}"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """A run's page (Overview: description, params, metrics, datasets) in the model-training view."""
    return f"{ui_base(tracking_uri)}/#/experiments/{quote(str(experiment_id))}/runs/{quote(run_id)}?{WORKFLOW_PARAM}"


def ui_command(tracking_uri: str, python: str | None = None) -> str | None:
    """The command that serves a local store's UI at LOCAL_UI in seconds, every page in the model-training view
    (`jobs/mlflow_ui.py`, run by `python`, default this interpreter: a fresh shell can run the line as printed);
    None for a tracking server: it serves its own."""
    if tracking_uri.startswith(("http://", "https://")):
        return None
    python = python or sys.executable
    job = Path(__file__).resolve().parent.parent / "jobs" / "mlflow_ui.py"
    return f"{python} {job} --store {tracking_uri} --port {LOCAL_UI.rsplit(':', 1)[1]}"
