"""Fine-tuning's loop parts without Ray: rank sharding, the shared train step, per-row predictions."""
from __future__ import annotations

import numpy as np
import torch

from bert_core.config import bert_tiny
from bert_core.finetuning import BertForTokenClassification
from training.optim import build_optimizer, build_scheduler
from finetuning.loop import predict, rank_indices, to_tensors
from training.step import finetune_step
from bert_core.losses import IGNORE_INDEX
from finetuning.features import Features, collate


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
    batch = to_tensors(collate(feats, [0, 1, 2, 3], pad_id=0), torch.device("cpu"))
    opt = build_optimizer(model, lr=3e-3, weight_decay=0.0)
    sched = build_scheduler(opt, 0, 40)
    losses = [float(finetune_step(model, batch, opt, sched)) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]
    out = predict(model, "token_classification", feats, np.array([3, 0]), 2, 0, torch.device("cpu"))
    assert [o.shape for o in out] == [(12, 3), (5, 3)]  # one array per row, padding trimmed
    pred = out[1].argmax(-1)
    keep = feats.labels[0] != IGNORE_INDEX
    assert (pred[keep] == feats.labels[0][keep]).mean() >= 0.66
