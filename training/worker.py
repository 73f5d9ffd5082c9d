"""What a training loop is handed by whoever runs it, and what it hands back: the contract between the launcher
(`training.launch`: in this process or on Ray Train workers) and either trainer's `fit(config, worker)`
(`pretraining.loop.fit`, `finetuning.loop.fit`)."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from tracking.config import RunRef
from tracking.tracker import Tracker


class Verdict(ValueError):
    """An error that is the settings' fault (a micro-batch that does not fit, a run that keeps diverging), reached by
    every rank at the same point: the launcher ends the run with its message instead of restarting the workers into
    the same failure. Subclass it; the driver re-raises the worker's class with its message."""


class Checkpoints(Protocol):
    """Where a loop's checkpoints live: ``training.checkpoint.LocalCheckpoints`` (a local folder, no Ray) or
    ``RayCheckpoints`` beside it (through Ray Train, local or S3)."""

    def latest(self) -> AbstractContextManager[Path | None]: ...
    def save(self, step: int, metrics: dict[str, float], write: Callable[[Path], None] | None) -> str | None: ...


@dataclass
class Worker:
    """Where this copy of the loop runs. The defaults are one process with no launcher; the Ray wrapper fills in
    its rank, world size, device, DDP wrapper and checkpoint storage; `inputs` is what the job prepared once on the
    driver for every worker (fine-tuning's task data), None when the loop reads its own."""

    rank: int = 0
    """This worker's rank in the group (0: the one that logs, tracks and writes checkpoints)."""
    world_size: int = 1
    """Workers in the group: the global batch is split among them (accumulation absorbs the rest)."""
    local_world_size: int = 1
    """Workers on this machine: they share its RAM, which the memory plan divides among them."""
    device: torch.device | None = None
    """Where this worker trains; None: the loop resolves its config's device (``resolve_device``)."""
    wrap: Callable[[nn.Module], nn.Module] = lambda m: m
    """Wraps the model for the group (DDP under Ray Train); the identity in one process."""
    checkpoints: Checkpoints | None = None
    """Where checkpoints go and are resumed from (``LocalCheckpoints``, ``RayCheckpoints``); None: none written."""
    inputs: Any = None
    """What the job prepared once on the driver for every worker (fine-tuning's task data); None: the loop reads
    its own."""
    tracking: RunRef | None = None
    """The job's MLflow run, which rank 0 logs into; None: not tracked."""
    tracker: Tracker | None = None
    """A tracker to use as it is (tests, a caller's own); None: one into ``tracking``, on rank 0."""
    fence: Any = None
    """The job's writer lease, proved before each write (storage/fence.py); None: unfenced."""
    stop: Callable[[], str | None] = lambda: None
    """Asked at every step boundary: what asked the run to stop ("SIGINT", cluster.interrupt), or None. The loop then
    ends after a checkpoint, as at its last step."""

    def make_tracker(self, system_metrics: bool = False) -> Tracker:
        """`tracker`, or one into `tracking` (rank 0's): under a fence, a point is logged only while the lease can
        be proved (training/fenced.py)."""
        if self.tracker is not None:
            return self.tracker
        from tracking.tracker import make_tracker
        from training.fenced import FencedTracker

        tracker = make_tracker(self.tracking, system_metrics)
        return FencedTracker(tracker, self.fence) if self.fence is not None else tracker


@dataclass
class FitResult:
    """What a trainer's ``fit`` returns to the launcher (and the launcher to the job)."""

    step: int
    """The step the run ended at (``max_steps``, or earlier when the wall-clock budget stopped it)."""
    metrics: dict[str, float]
    """The last logged metrics."""
    checkpoint: str | None
    """The last checkpoint written (None: none, or not by this rank)."""
    resumed_from: int = 0
    """The step this process resumed from (0: a fresh run)."""
    throughput: dict[str, float] = field(default_factory=dict)
    """Over the whole run, compile warm-up excluded, all ranks together: sequences_per_second, tokens_per_second,
    data_wait_fraction, padding_fraction, mean_real_tokens, seconds, sequences and (with a known peak) mfu."""
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    """Every logged step and its metrics, on rank 0."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but torch sees no GPU; use --device cpu")
    return torch.device(name)
