"""The loop's side: metrics from rank 0 into the job's run (`MlflowTracker`), or kept in memory (`NullTracker`)."""
from __future__ import annotations

import logging
import time
from typing import Protocol

from storage.redact import redact_text
from tracking.config import RunRef
from tracking.runs import _as_metrics

log = logging.getLogger(__name__)


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
        self.client.set_tag(self.run_id, key, redact_text(value))

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.finish()


def make_tracker(run: RunRef | None, system_metrics: bool = False) -> Tracker:
    """Into the job's run, or nowhere (no run: tests, debugging, `fit` without a job)."""
    if run is None:
        return NullTracker()
    return MlflowTracker(run.tracking_uri, run.run_id, system_metrics)
