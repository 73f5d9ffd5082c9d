"""training: the BERT trainer, free of Ray. Typed configs (`PretrainConfig`), the train steps, `fit(config)` (the
whole pre-training loop in one process), checkpoints, metric sums, one tracker adapter (MLflow / no-op), and the
one module that wraps the loops in a Ray Train worker (`training.ray_worker`, imported only by jobs that use Ray).

Imports point one way: jobs -> training -> pipeline, bert_core (tests/test_layering.py).
"""
from training.config import (CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig,
                             TrackingConfig)
from training.loader import DataConfig, EvalConfig, ShardSet, default_length_buckets
from training.loop import FitResult, Worker, fit
from training.metrics import MetricSums
from training.step import evaluate, finetune_step, forward, to_device, train_step

__all__ = [
    "PretrainConfig", "ModelConfig", "OptimizerConfig", "DataConfig", "ShardSet", "EvalConfig", "CheckpointConfig",
    "TrackingConfig", "RuntimeConfig", "default_length_buckets", "fit", "FitResult", "Worker", "MetricSums",
    "train_step", "finetune_step", "forward", "evaluate", "to_device",
]
