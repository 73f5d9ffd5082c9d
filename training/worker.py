"""What a training loop is handed by whoever runs it, and what it hands back: the contract between the launcher
(`training.launch`: in this process or on Ray Train workers) and either trainer's `fit(config, worker)`
(`pretraining.loop.fit`, `finetuning.loop.fit`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Protocol

import torch
from torch import nn

from tracking.config import RunRef
from tracking.tracker import Tracker


class Verdict(ValueError):
    """An error that is the settings' fault (a micro-batch that does not fit, a run that keeps diverging), reached by
    every rank at the same point: the launcher ends the run with its message instead of restarting the workers into
    the same failure. Subclass it; the driver re-raises the worker's class with its message."""


class Checkpoints(Protocol):
    def latest(self) -> ContextManager[Path | None]: ...
    def save(self, step: int, metrics: dict[str, float], write: Callable[[Path], None] | None) -> str | None: ...


@dataclass
class Worker:
    """Where this copy of the loop runs. The defaults are one process with no launcher; the Ray wrapper fills in
    its rank, world size, device, DDP wrapper and checkpoint storage; `inputs` is what the job prepared once on the
    driver for every worker (fine-tuning's task data), None when the loop reads its own."""

    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # workers on this machine (they share its RAM)
    device: torch.device | None = None
    wrap: Callable[[nn.Module], nn.Module] = lambda m: m
    checkpoints: Checkpoints | None = None
    inputs: Any = None
    tracking: RunRef | None = None  # the job's MLflow run (None: not tracked)
    tracker: Tracker | None = None  # default: into `tracking`, on rank 0
    fence: Any = None  # the job's writer lease, proved before each write (storage/fence.py); None: unfenced

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
    step: int
    metrics: dict[str, float]  # the last logged ones
    checkpoint: str | None  # the last checkpoint written (None: none, or not by this rank)
    resumed_from: int = 0
    # Over the whole run, compile warm-up excluded: sequences_per_second, tokens_per_second, data_wait_fraction,
    # padding_fraction, mean_real_tokens, seconds, sequences and (with a known peak) mfu, all ranks together.
    throughput: dict[str, float] = field(default_factory=dict)
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # every logged step, on rank 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but torch sees no GPU; use --device cpu")
    return torch.device(name)
