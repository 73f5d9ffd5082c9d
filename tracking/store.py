"""Where runs are tracked: the tracking URI, its reachability, experiments created in the model-training view."""
from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_TRACKING_DIR = "mlruns"
# The experiment every stand-alone job logs to unless --experiment says otherwise: one per pipeline, so a build's
# runs, the vocabulary's, pre-training's and fine-tuning's sit in one runs table (the Dataset column beside them,
# fine-tuning nested under the pre-training run it started from, which MLflow shows within one experiment only).
# A workflow names its own (its config's `mlflow.experiment`).
DEFAULT_EXPERIMENT = "bert"
# The experiment's kind (the UI's ExperimentKind enum): model training. MLflow 3.17.2's UI does not read it to pick
# an experiment's view (its GenAI | Model training switch does, see tracking/links.py: the links we print carry the
# switch's URL parameter); it reads it where the switch is off, and other clients (the API, search) see it.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def resolve_tracking_uri(flag: str | None) -> str:
    """The flag, else MLFLOW_TRACKING_URI, else a local store under the working directory (`mlflow ui` finds it).
    A relative sqlite path is made absolute: Ray workers and stage subprocesses run in other directories."""
    default = f"sqlite:///{Path.cwd() / DEFAULT_TRACKING_DIR / 'mlflow.db'}"
    uri = flag or os.environ.get("MLFLOW_TRACKING_URI") or default
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
    return uri


def check_tracking_reachable(tracking_uri: str, timeout: float = 10.0) -> None:
    """Fail at start, not after an hour of training, when a tracking server does not answer."""
    if tracking_uri.startswith(("http://", "https://")):
        url = tracking_uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (the user's own server)
                if r.status != 200:
                    raise ValueError(f"MLflow tracking server {tracking_uri} answered {r.status} on /health")
        except (urllib.error.URLError, OSError) as e:
            raise ValueError(
                f"MLflow tracking server {tracking_uri} is unreachable ({e}). Start it, fix --mlflow-tracking-uri / "
                "MLFLOW_TRACKING_URI, or unset both to use the local store under ./mlruns."
            ) from e
    elif tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def artifact_root(tracking_uri: str) -> str | None:
    """With a sqlite store and no artifact root, MLflow writes artifacts to the *logging process's* cwd, which
    inside Ray is a session temp dir: pin them beside the database instead. Servers manage their own."""
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri[len("sqlite:///"):]).parent / "artifacts").resolve().as_uri()
    return None


def get_or_create_experiment(name: str, tracking_uri: str) -> str:
    """Experiment id for `name`: created with an explicit artifact location where the store needs one, and marked
    as model training (also an older experiment of ours that lacks the mark)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        root = artifact_root(tracking_uri)
        return client.create_experiment(name, artifact_location=f"{root}/{name}" if root else None,
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def experiment_id(tracking_uri: str, name: str) -> str | None:
    """The id of experiment `name` in the store (None when it does not exist)."""
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(tracking_uri).get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else None
