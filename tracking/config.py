"""What a training loop needs to log its metrics: how often and what (`TrackingConfig`, part of a trainer's config),
and into which run (`RunRef`: the run the job opened, handed to the loop by the launcher, never part of the config:
the config is logged as the run's params before the run exists)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrackingConfig:
    """How a loop logs: every `log_every` steps, with or without system metrics (CPU/GPU/memory samples)."""

    system_metrics: bool = False
    log_every: int = 50

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise ValueError("--log-every must be >= 1")


@dataclass(frozen=True)
class RunRef:
    """The MLflow run a job opened: where rank 0 of its loop logs metrics, and what its checkpoints name."""

    tracking_uri: str
    run_id: str
    run_name: str = ""
