"""training: the BERT trainer. Typed configs (`PretrainConfig`), the training loader (`training.loader`), the train
steps, `fit(config, worker)` (the whole pre-training loop in one process, free of Ray), optimizers and schedules,
checkpoints and exports, metric sums, the one MLflow module (`training.tracking`: run opener, param flattener,
tracker), the one Ray module (`training.launch`: a run on Ray Train workers or in this process, Ray on loopback),
and what `jobs/pretrain.py` calls (`training.pretrain_job`). Fine-tuning (`finetuning/`) uses the same pieces.

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
