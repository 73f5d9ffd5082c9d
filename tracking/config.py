"""What a training loop needs to log its metrics: the run the job opened, and how often."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrackingConfig:
    """Where metrics go: an MLflow run (created by the job) or nowhere (`tracking_uri` None: the no-op tracker)."""

    tracking_uri: str | None = None
    run_id: str | None = None
    run_name: str = ""
    system_metrics: bool = False
    log_every: int = 50

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise ValueError("--log-every must be >= 1")
        if (self.tracking_uri is None) != (self.run_id is None):
            raise ValueError("give both an MLflow tracking URI and a run id, or neither (no tracking)")
