"""Fine-tuning's loop without Ray: rank sharding, the shared train step, per-row predictions, and `fit` itself."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bert_core.config import bert_tiny
from bert_core.finetuning import BertForTokenClassification
from bert_core.losses import IGNORE_INDEX
from finetuning.features import Features, collate_features
from finetuning.loop import predict, rank_indices, to_tensors
from finetuning.step import finetune_step
from training.optim import build_optimizer, build_scheduler


def test_rank_indices_equal_and_complete():
    rng_rows = [rank_indices(10, 3, r, np.random.default_rng(0)) for r in range(3)]
    assert [len(r) for r in rng_rows] == [4, 4, 4]  # padded by wrap-around: every rank runs the same steps
    assert set(np.concatenate(rng_rows).tolist()) == set(range(10))
    eval_rows = [rank_indices(5, 2, r, None) for r in range(2)]
    assert eval_rows[0].tolist() == [0, 2, 4] and eval_rows[1].tolist() == [1, 3, 0]


def _features() -> Features:
    rng = np.random.default_rng(0)
    ids = [rng.integers(1000, 2000, size=n).astype(np.int32) for n in (5, 9, 7, 12)]
    labels = [np.where(np.arange(len(r)) % 2 == 0, r % 3, IGNORE_INDEX).astype(np.int64) for r in ids]
    return Features(ids, [np.zeros(len(r), dtype=np.int8) for r in ids], labels)


def test_train_step_fits_a_fixed_batch_and_predict_trims_rows():
    # One thread: a tiny model gains nothing from two, and on a busy 2-core box two OpenMP threads thrash.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _fit_fixed_batch()
    finally:
        torch.set_num_threads(before)


def _fit_fixed_batch() -> None:
    torch.manual_seed(0)
    model = BertForTokenClassification(bert_tiny(vocab_size=2048, num_labels=3))
    feats = _features()
    batch = to_tensors(collate_features(feats, [0, 1, 2, 3], pad_id=0), torch.device("cpu"))
    opt = build_optimizer(model, lr=3e-3, weight_decay=0.0)
    sched = build_scheduler(opt, 0, 40)
    losses = [float(finetune_step(model, batch, opt, sched)) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]
    out = predict(model, "token_classification", feats, np.array([3, 0]), 2, 0, torch.device("cpu"))
    assert [o.shape for o in out] == [(12, 3), (5, 3)]  # one array per row, padding trimmed
    pred = out[1].argmax(-1)
    keep = feats.labels[0] != IGNORE_INDEX
    assert (pred[keep] == feats.labels[0][keep]).mean() >= 0.66


def test_fit_has_pretrainings_shape(sample_dir, tmp_path, caplog):
    """`finetuning.fit(config, worker)` takes the launcher's Worker like `pretraining.loop.fit`: it prepares its task
    from the config, reports each epoch through the tracker, and the best epoch's model is the last checkpoint written
    (model/ in the HF layout beside its evaluation)."""
    import inspect
    import json
    import logging

    from finetuning import FinetuneConfig, fit
    from finetuning.examples import TaskColumns
    from finetuning.loop import BEST_METRICS_FILE
    from finetuning.prepare import FeatureConfig, TaskConfig
    from finetuning.schedule import ScheduleConfig
    from finetuning.task_model import HeadConfig
    from pretraining.loop import fit as pretrain_fit
    from tracking.tracker import NullTracker
    from training.checkpoint import LocalCheckpoints
    from training.worker import Worker

    assert list(inspect.signature(fit).parameters) == list(inspect.signature(pretrain_fit).parameters)
    config = FinetuneConfig(
        data=TaskConfig(task="classification", train=str(sample_dir / "tasks" / "rt_sentiment.jsonl.gz"),
                        split_eval_from_train=0.25, max_train_examples=48, max_eval_examples=16,
                        columns=TaskColumns(), features=FeatureConfig(max_seq_length=32)),
        model=HeadConfig(init="random", preset="bert_tiny"),
        schedule=ScheduleConfig(epochs=2, batch_size=16, lr=1e-3))
    tracker = NullTracker()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with caplog.at_level(logging.INFO, logger="finetuning.loop"):
            result = fit(config, Worker(checkpoints=LocalCheckpoints(tmp_path / "ckpt", keep=1), tracker=tracker))
    finally:
        torch.set_num_threads(before)
    # What an operator sees: progress with percentage, rate and ETA (3 steps per epoch, 6 in all).
    lines = [r.getMessage() for r in caplog.records if "ETA" in r.getMessage()]
    assert any(line.startswith("epoch 1/2 done, step 3/6 (50.0%)") for line in lines), lines
    assert any(line.startswith("epoch 2/2 done, step 6/6 (100.0%)") for line in lines), lines
    assert all(m["train_nonfinite_steps"] == 0 for _, m in result.history)
    assert [epoch for epoch, _ in result.history] == [1, 2] and [s for s, _ in tracker.history][-1] == 2
    assert result.step == 2 * 3  # 48 training rows in batches of 16: 3 steps per epoch
    best = json.loads((tmp_path / "ckpt" / Path(result.checkpoint).name / BEST_METRICS_FILE).read_text())
    assert best == result.metrics and best["eval_accuracy"] == max(m["eval_accuracy"] for _, m in result.history)
    model_dir = Path(result.checkpoint) / "model"
    assert {"config.json", "model.safetensors", "vocab.txt"} <= {p.name for p in model_dir.iterdir()}
    assert json.loads((model_dir / "config.json").read_text())["label2id"] == {"0": 0, "1": 1}
