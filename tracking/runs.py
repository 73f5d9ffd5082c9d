"""A job's MLflow run: the one opener (`open_run`: new, or the run a rerun continues), and `Run`, how the driver
logs params, tags, metrics and artifacts into it and ends it."""
from __future__ import annotations

import contextlib
import logging
import numbers
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from storage.redact import redact_text
from tracking.links import run_url, ui_command
from tracking.params import MAX_PARAM_LENGTH
from tracking.store import get_or_create_experiment

log = logging.getLogger(__name__)
# MLflow prints its own "View run / View experiment" links to stdout when a run on a tracking server ends; they open
# the GenAI view (tracking/links.py). The jobs log their own link, in the model-training view, instead.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

RUN_NAME_TAG = "bert.run_name"  # the tag a rerun of pre-training finds its run by
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests a run under its parent


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
    """The MLflow tracking URI the run lives at (a server URL or a local store)."""
    run_id: str
    """The MLflow run id."""
    experiment_id: str
    """The id of the experiment the run belongs to (what its UI link names)."""
    resumed: bool = False
    """True when `open_run` reopened an earlier run found by its tag (a rerun continues it), False for a new one."""

    def _client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.tracking_uri)

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        # MlflowClient.log_batch splits a long list into batches within the store's limits itself. Redacted before
        # the cut: a URL's secret must not survive as a prefix either.
        self._client().log_batch(self.run_id, params=[Param(k, redact_text(str(v))[:MAX_PARAM_LENGTH])
                                                      for k, v in sorted(params.items())])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self._client().log_batch(self.run_id, tags=[RunTag(k, redact_text(str(v))) for k, v in tags.items()])

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        self._client().log_batch(self.run_id, metrics=_as_metrics(metrics, step, int(time.time() * 1000)))

    def log_artifacts(self, local_dir: str | os.PathLike, artifact_path: str | None = None) -> None:
        self._client().log_artifacts(self.run_id, str(local_dir), artifact_path=artifact_path)

    def end(self, status: str, end_time: float | None = None) -> None:
        """``end_time`` (epoch seconds, default now): when what the run tracks ended, if the writes come later."""
        self._client().set_terminated(self.run_id, status=status,
                                      end_time=None if end_time is None else int(end_time * 1000))

    @contextlib.contextmanager
    def ending(self) -> Iterator[Run]:
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
    log.info("MLflow run page: %s%s", run_url(tracking_uri, exp_id, run.run_id),
             f"  (serve the store first: {ui_command(tracking_uri)})" if ui_command(tracking_uri) else "")
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


STALE_NOTE = ("the job ended without closing this run (killed, or its machine lost); marked KILLED by the next job "
              "on the same output, run {run_id}")


def close_stale_runs(run: Run, tag: str, value: str) -> list[str]:
    """Runs of `run`'s experiment whose tag `tag` is `value`, left RUNNING by a job that died, are marked KILLED with
    an `error` tag saying so; their ids. Call it holding what rules out a live job on that thing (its lease)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(run.tracking_uri)
    # The value is compared here, not in the filter: a path may hold quotes.
    running = client.search_runs([run.experiment_id], filter_string="attributes.status = 'RUNNING'")
    stale = [r.info.run_id for r in running if r.data.tags.get(tag) == value and r.info.run_id != run.run_id]
    for run_id in stale:
        client.set_tag(run_id, "error", STALE_NOTE.format(run_id=run.run_id))
        client.set_terminated(run_id, status="KILLED")
        log.warning("MLflow run %s was left RUNNING by a job that died: marked KILLED", run_id)
    return stale


def run_exists(tracking_uri: str, run_id: str) -> bool:
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except Exception:  # noqa: BLE001 (each store raises its own type for an unknown or deleted run)
        return False
    return True


def run_tags(tracking_uri: str, run_id: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    return dict(MlflowClient(tracking_uri).get_run(run_id).data.tags)


def run_metrics(tracking_uri: str, run_id: str) -> dict[str, float]:
    """The latest value of every metric of a run (a finished stage's, read by the workflow)."""
    from mlflow.tracking import MlflowClient

    return dict(MlflowClient(tracking_uri).get_run(run_id).data.metrics)


def metric_history(tracking_uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of every point of a run's metric, by step."""
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri).get_metric_history(run_id, key))


def run_summary(tracking_uri: str, run_id: str) -> dict[str, str] | None:
    """{"run_id", "experiment_id", "name"} of a run of this store (None when it is not there): what a link to it
    needs."""
    from mlflow.tracking import MlflowClient

    try:
        run = MlflowClient(tracking_uri).get_run(run_id)
    except Exception:  # noqa: BLE001 (each store raises its own type for an unknown or deleted run)
        return None
    return {"run_id": run_id, "experiment_id": run.info.experiment_id, "name": run.info.run_name or run_id}
