"""What a training loop needs to log its metrics: how often and what (`TrackingConfig`, part of a trainer's config),
and into which run (`RunRef`: the run the job opened, handed to the loop by the launcher, never part of the config:
the config is logged as the run's params before the run exists)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrackingConfig:
    """How a loop logs: every `log_every` steps, with or without system metrics (CPU/GPU/memory samples)."""

    system_metrics: bool = False
    """Also sample CPU, GPU and memory into the run (MLflow's system metrics monitor, every 10 s). Off here; the
    pre-training job turns it on unless given --no-system-metrics."""
    log_every: int = 50
    """Optimizer steps between logged points. Each log copies the on-device metric sums to the host and all-reduces
    them across ranks (pretraining/metrics.py): a sync and a collective that a per-step log would pay every step."""

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise ValueError("--log-every must be >= 1")


@dataclass(frozen=True)
class RunRef:
    """The MLflow run a job opened: where rank 0 of its loop logs metrics, and what its checkpoints name."""

    tracking_uri: str
    """The MLflow tracking URI the run lives at (a server URL or a local store)."""
    run_id: str
    """The MLflow run id that rank 0 logs metrics into."""
    run_name: str = ""
    """The job's run name, written into checkpoints and into the replay command of a spike's log line; empty
    when the job gave none."""
