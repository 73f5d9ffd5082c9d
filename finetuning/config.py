"""The typed, frozen configuration of a fine-tuning run, composed like pre-training's `PretrainConfig` from the
configs of the modules that use them: the task and its data (`finetuning.prepare.TaskConfig`), the model it starts
from (`finetuning.task_model.HeadConfig`), the schedule (`finetuning.loop.ScheduleConfig`) and where metrics go
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
    model: HeadConfig
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    seed: int = 42  # weights of new heads / random init, dropout, data order
