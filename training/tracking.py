"""The one tracker adapter: metrics of a run go to MLflow, or nowhere. The only module of `training` that imports
mlflow (tests/test_layering.py holds it to that).

The job (the driver) creates the run and logs the params; the loop's rank 0 logs metrics into that run through
`MlflowTracker`. After a worker-group restart, or a rerun with the same run name, training replays the steps since
the last checkpoint; their metrics are already in the run, so each (metric, step) is logged once: what is there
is skipped.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def set_tag(self, key: str, value: str) -> None: ...
    def close(self) -> None: ...


class NullTracker:
    """No tracking (tests, debugging, fit without a tracking URI); keeps what was logged for the caller to read."""

    def __init__(self) -> None:
        self.history: list[tuple[int, dict[str, float]]] = []
        self.tags: dict[str, str] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.history.append((step, dict(metrics)))

    def set_tag(self, key: str, value: str) -> None:
        self.tags[key] = value

    def close(self) -> None:
        pass


class MlflowTracker:
    """Metrics into an existing MLflow run (created by the job), plus optional system metrics."""

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
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if math.isfinite(float(v)) and step > self.logged.get(k, -1)]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)
            for m in batch:
                self.logged[m.key] = step

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.finish()


def make_tracker(tracking_uri: str | None, run_id: str | None, system_metrics: bool = False) -> Tracker:
    if tracking_uri is None or run_id is None:
        return NullTracker()
    return MlflowTracker(tracking_uri, run_id, system_metrics)


# ---- the driver's side: one run per job ----------------------------------------------------------------------

def log_params(tracking_uri: str, run_id: str, params: dict[str, Any]) -> None:
    """Params in batches of 100 (MLflow's limit), values cut at 6000 characters (its size limit)."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
    client = MlflowClient(tracking_uri)
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i:i + 100])
