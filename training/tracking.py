"""The one MLflow module of `training` (tests/test_layering.py holds it to that): where runs are tracked, the one
run opener, the one param flattener, and the tracker through which a loop's rank 0 logs metrics into a run.

Every job logs one run: `open_run` creates it, or reopens the run a rerun should continue (found by a tag, e.g.
the pre-training run name), in an experiment created with an explicit artifact location and tagged so the MLflow
UI opens it in its model-training view. The job's driver logs the params (`flatten_params` of its typed config)
and ends the run (`Run.ending`); rank 0 of the loop logs metrics into it through `MlflowTracker`. After a
worker-group restart, or a rerun with the same run name, training replays the steps since the last checkpoint;
their metrics are already in the run, so each (metric, step) is logged once: what is there is skipped. A rollback
of the guard is different: it redoes steps on other batches, so it rewinds that rule (`MlflowTracker.rewind`).

mlflow is imported inside the functions: importing the trainer (`fit` without tracking) never loads it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import numbers
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

DEFAULT_TRACKING_DIR = "mlruns"
# MLflow 3 opens an experiment without this tag in its GenAI view (traces, prompts); this value selects the
# model-training view (runs, metrics, charts). The values are the UI's ExperimentKind enum (mlflow 3.17).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
RUN_NAME_TAG = "bert.run_name"  # the tag a rerun of pre-training finds its run by
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests a run under its parent
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
MAX_LIST_ITEMS = 8  # a longer list or tuple is logged as its length (`key.count`): shard URLs, input files
BATCH = 100  # params or tags per log_batch call (MLflow's limit)
METRICS_BATCH = 1000  # metrics per log_batch call (MLflow's limit)


# ---- where runs are tracked ------------------------------------------------------------------------------------

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


def _artifact_root(tracking_uri: str) -> str | None:
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
        root = _artifact_root(tracking_uri)
        return client.create_experiment(name, artifact_location=f"{root}/{name}" if root else None,
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


# ---- params ------------------------------------------------------------------------------------------------------

def flatten_params(value: Any, prefix: str = "") -> dict[str, str]:
    """A dataclass or mapping (nested) as MLflow params: dotted keys, values as text.

    One length rule for every job: a list or tuple of more than MAX_LIST_ITEMS items is logged as its length under
    `key.count` (thousands of shard URLs say nothing in a params table), and any value is cut to MLflow's
    MAX_PARAM_LENGTH characters."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten_params(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, (list, tuple)) and len(value) > MAX_LIST_ITEMS:
        return {f"{prefix}.count": str(len(value))}
    return {prefix: str(value)[:MAX_PARAM_LENGTH]}


# ---- runs --------------------------------------------------------------------------------------------------------

def _as_metrics(metrics: Mapping[str, Any], step: int, timestamp_ms: int) -> list:
    """The metrics MLflow gets: numbers only (not bools). NaN and inf are kept: a diverged value is logged as what
    it is (MLflow stores NaN, and +-inf as +-1.8e308), never dropped."""
    from mlflow.entities import Metric

    return [Metric(k, float(v), timestamp_ms, step) for k, v in metrics.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool)]


@dataclass(frozen=True)
class Run:
    """An open MLflow run of a job, as the driver uses it."""

    tracking_uri: str
    run_id: str
    experiment_id: str
    resumed: bool = False

    def _client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.tracking_uri)

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in sorted(params.items())]
        client = self._client()
        for i in range(0, len(items), BATCH):
            client.log_batch(self.run_id, params=items[i:i + BATCH])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        client = self._client()
        for i in range(0, len(items), BATCH):
            client.log_batch(self.run_id, tags=items[i:i + BATCH])

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        items = _as_metrics(metrics, step, int(time.time() * 1000))
        client = self._client()
        for i in range(0, len(items), METRICS_BATCH):
            client.log_batch(self.run_id, metrics=items[i:i + METRICS_BATCH])

    def log_artifacts(self, local_dir: str | os.PathLike, artifact_path: str | None = None) -> None:
        self._client().log_artifacts(self.run_id, str(local_dir), artifact_path=artifact_path)

    def end(self, status: str, end_time: float | None = None) -> None:
        """``end_time`` (epoch seconds, default now): when what the run tracks ended, if the writes come later."""
        self._client().set_terminated(self.run_id, status=status,
                                      end_time=None if end_time is None else int(end_time * 1000))

    @contextlib.contextmanager
    def ending(self) -> Iterator["Run"]:
        """FINISHED when the block completes, KILLED on Ctrl-C / SIGTERM, FAILED on any other exception."""
        try:
            yield self
        except KeyboardInterrupt:
            self.end("KILLED")
            raise
        except BaseException:
            self.end("FAILED")
            raise
        self.end("FINISHED")


def open_run(tracking_uri: str, experiment: str, run_name: str, *, params: Mapping[str, Any] | None = None,
             tags: Mapping[str, str] | None = None, parent_run_id: str | None = None,
             resume_by: str | None = None, start_time: float | None = None) -> Run:
    """The job's run: a new one, or (`resume_by` a tag key) the latest run of the experiment whose tag `resume_by`
    has the value given in `tags`, reopened as RUNNING. A resumed run keeps the params it was first logged with
    (a changed one is warned about) and gets the ones it lacks; tags are set either way. `start_time` (epoch
    seconds, default now) dates a new run from when its work began, when it is opened later (in a thread)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    tags = dict(tags or {})
    params = dict(params or {})
    if parent_run_id:
        if not run_exists(tracking_uri, parent_run_id):
            raise ValueError(f"--parent-run-id {parent_run_id} is not a run in {tracking_uri}; pass a run id of "
                             "that store or drop the flag")
        tags[PARENT_TAG] = parent_run_id
    exp_id = get_or_create_experiment(experiment, tracking_uri)
    found = []
    if resume_by is not None:
        if resume_by not in tags:
            raise ValueError(f"open_run: resume_by={resume_by!r} needs that tag's value in `tags`")
        found = client.search_runs([exp_id], filter_string=f"tags.`{resume_by}` = '{tags[resume_by]}'",
                                   max_results=1, order_by=["attributes.start_time DESC"])
    if found:
        run = Run(tracking_uri, found[0].info.run_id, exp_id, resumed=True)
        client.update_run(run.run_id, status="RUNNING")
        old = found[0].data.params
        changed = {k: (old[k], str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()
                   if k in old and old[k] != str(v)[:MAX_PARAM_LENGTH]}
        if changed:
            log.warning("resuming MLflow run %s with changed settings (kept as first logged): %s", run.run_id, changed)
        params = {k: v for k, v in params.items() if k not in old}
        log.info("resuming MLflow run %s (%s)", run.run_id, run_name)
    else:
        started = None if start_time is None else int(start_time * 1000)
        run = Run(tracking_uri, client.create_run(exp_id, start_time=started, run_name=run_name, tags=tags).info.run_id,
                  exp_id)
        log.info("MLflow run %s (%s) in experiment %r at %s", run.run_id, run_name, experiment, tracking_uri)
    run.log_params(params)
    run.set_tags(tags)
    return run


def close_stale_children(run: Run) -> None:
    """Child runs of `run` left RUNNING by a killed attempt are marked KILLED (a resumed job reopens its own)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(run.tracking_uri)
    for r in client.search_runs([run.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{run.run_id}'"):
        if r.info.status == "RUNNING":
            client.set_terminated(r.info.run_id, status="KILLED")


def run_exists(tracking_uri: str, run_id: str) -> bool:
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except Exception:  # noqa: BLE001 (each store raises its own type for an unknown or deleted run)
        return False
    return True


def run_metrics(tracking_uri: str, run_id: str) -> dict[str, float]:
    """The latest value of every metric of a run (a finished stage's, read by the workflow)."""
    from mlflow.tracking import MlflowClient

    return dict(MlflowClient(tracking_uri).get_run(run_id).data.metrics)


# ---- the loop's side: metrics from rank 0 --------------------------------------------------------------------

class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def rewind(self, step: int) -> None: ...
    def set_tag(self, key: str, value: str) -> None: ...
    def close(self) -> None: ...


class NullTracker:
    """No tracking (tests, debugging, fit without a tracking URI); keeps what was logged for the caller to read."""

    def __init__(self) -> None:
        self.history: list[tuple[int, dict[str, float]]] = []
        self.tags: dict[str, str] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.history.append((step, dict(metrics)))

    def rewind(self, step: int) -> None:
        pass

    def set_tag(self, key: str, value: str) -> None:
        self.tags[key] = value

    def close(self) -> None:
        pass


class MlflowTracker:
    """Metrics into an existing MLflow run (opened by the job), plus optional system metrics."""

    def __init__(self, tracking_uri: str, run_id: str, system_metrics: bool = False) -> None:
        from mlflow.tracking import MlflowClient

        self.client, self.run_id, self.monitor = MlflowClient(tracking_uri), run_id, None
        self.logged = {key: max((m.step for m in self.client.get_metric_history(run_id, key)), default=-1)
                       for key in self.client.get_run(run_id).data.metrics}
        if system_metrics:
            try:
                import mlflow
                from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

                mlflow.set_tracking_uri(tracking_uri)
                self.monitor = SystemMetricsMonitor(run_id, sampling_interval=10, samples_before_logging=1)
                self.monitor.start()
            except Exception as e:  # noqa: BLE001 (system metrics are nice to have, never fatal)
                log.warning("system metrics are off: %s", e)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Non-finite values are logged as they are (MLflow keeps NaN, and stores +-inf as +-1.8e308), so a chart
        shows a divergence where it happened instead of a gap or a silent 0."""
        batch = [m for m in _as_metrics(metrics, step, int(time.time() * 1000))
                 if step > self.logged.get(m.key, -1)]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)
            for m in batch:
                self.logged[m.key] = step

    def rewind(self, step: int) -> None:
        """The run went back to `step` (the guard's rollback) and redoes the steps after it on other batches: their
        metrics are new, so they are logged again (a second point at the same step), not skipped as a replay."""
        self.logged = {k: min(v, step) for k, v in self.logged.items()}

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.finish()


def make_tracker(tracking_uri: str | None, run_id: str | None, system_metrics: bool = False) -> Tracker:
    if tracking_uri is None or run_id is None:
        return NullTracker()
    return MlflowTracker(tracking_uri, run_id, system_metrics)


# ---- datasets: a build's output and a training run's input are the same MLflow dataset -------------------------

DATASET_DIGEST_CHARS = 16  # of the manifest's sha256 (MLflow keeps at most 36 characters of a digest)


def built_dataset(manifest: Any):
    """The MLflow dataset of a finished build (a ``pipeline.schema.Manifest``): named after its folder, its source
    the folder's URL, its digest the manifest's sha256 (what pre-training tags as ``dataset.manifest_sha256``), a
    profile of its size and the shards' columns as its schema."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import DataType
    from mlflow.types.schema import Array, ColSpec, Schema

    from pipeline.schema import instance_schema

    profile = {"instances": manifest.instances, "shards": len(manifest.shards),
               "max_seq_length": manifest.max_seq_length, "vocab_size": manifest.vocab.size,
               "config_hash": manifest.config_hash[:12]}

    class BuiltDataset(MetaDataset):
        @property
        def profile(self) -> dict[str, Any]:
            return profile

        def to_dict(self) -> dict[str, str]:
            import json

            return super().to_dict() | {"profile": json.dumps(profile)}

    with warnings.catch_warnings():  # a local path "can be interpreted in multiple ways": all of them local
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(manifest.url)  # absolute: read_manifest resolves a local path
    schema = Schema([ColSpec(Array(DataType.integer) if str(f.type).startswith("list") else DataType.integer, f.name)
                     for f in instance_schema(manifest.vocab.size)])
    return BuiltDataset(source, name=os.path.basename(manifest.url.rstrip("/")) or manifest.url,
                        digest=manifest.sha256[:DATASET_DIGEST_CHARS], schema=schema)


def log_dataset(tracking_uri: str, run_id: str, manifest: Any, context: str) -> None:
    """Record a finished build (a ``pipeline.schema.Manifest``) on a run: ``context="output"`` on the build's run,
    ``"training"`` / ``"eval"`` on a pre-training run (MLflow 3 has dataset inputs only, so the build's output is an
    input tagged "output"). Same name and digest on both, so the UI's Dataset column shows which build a model was
    trained on."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    entity = built_dataset(manifest)._to_mlflow_entity()
    MlflowClient(tracking_uri).log_inputs(run_id, datasets=[
        DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])])
