"""The typed, frozen configuration of a fine-tuning run, composed like pre-training's `PretrainConfig` from the
configs of the modules that use them: the task and its data (`finetuning.prepare.TaskConfig`), the model it starts
from (`finetuning.task_model.HeadConfig`), the schedule (`finetuning.schedule.ScheduleConfig`) and where metrics go
(`tracking.config.TrackingConfig`). Where the workers run is the launcher's (`training.launch.LaunchConfig`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from finetuning.prepare import TaskConfig
from finetuning.schedule import ScheduleConfig
from finetuning.task_model import HeadConfig
from tracking.config import TrackingConfig


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    data: TaskConfig
    """The task and its data: files, evaluation split, columns and feature lengths (`finetuning.prepare`)."""
    model: HeadConfig
    """The model under the new head: a model directory or URL to start from, or random weights in a preset's shape."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Epochs, batch sizes, the optimizer's rate and decay (`finetuning.schedule`)."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """How a loop logs. Fine-tuning's loop does not read it yet (it logs every `finetuning.loop.LOG_EVERY` steps,
    without system metrics); it reaches the run's params with the rest of the config."""
    seed: int = 42
    """Seeds the new head's weights (the whole model with --init random), dropout (offset by 1000 x rank) and each
    epoch's data order. The split and subsets have their own, `TaskConfig.split_seed`."""
