"""train_step / evaluate on CPU with a tiny config: accumulation equals one big batch, no_sync, clipping, metrics."""
from __future__ import annotations

import contextlib

import pytest
import torch

from bert_core.config import bert_tiny
from bert_core.pretraining import BertForPreTraining
from pretraining.metrics import MetricSums
from pretraining.step import evaluate, train_step

V, T, P = 64, 16, 3


def make_batch(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, V, (n, T), generator=g) * mask
    positions = torch.stack([torch.randperm(7, generator=g)[:P] + 1 for _ in range(n)])
    labels = torch.randint(5, V, (n, P), generator=g)
    labels[::3, -1] = -100  # rows with fewer predictions, as in real batches
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "masked_lm_positions": positions, "masked_lm_labels": labels,
            "next_sentence_label": torch.randint(0, 2, (n,), generator=g)}


def split(batch: dict[str, torch.Tensor], k: int) -> list[dict[str, torch.Tensor]]:
    n = batch["input_ids"].shape[0] // k
    return [{key: v[i * n:(i + 1) * n] for key, v in batch.items()} for i in range(k)]


def tiny_model(seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(bert_tiny(vocab_size=V, max_position_embeddings=T, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0))


def grads_after(micro_batches, seed=0) -> dict[str, torch.Tensor]:
    model = tiny_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    train_step(model, opt, micro_batches, max_grad_norm=0)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_accumulation_equals_one_large_batch():
    batch = make_batch(12, 0)
    whole, accumulated = grads_after([batch]), grads_after(split(batch, 3))
    assert whole.keys() == accumulated.keys()
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], atol=1e-6, rtol=1e-4, msg=name)


def test_no_sync_on_all_but_last_micro_step():
    class FakeDDP(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module, self.synced = module, []
            self._in_no_sync = False

        @contextlib.contextmanager
        def no_sync(self):
            self._in_no_sync = True
            yield
            self._in_no_sync = False

        def forward(self, **kw):
            self.synced.append(not self._in_no_sync)
            return self.module(**kw)

    wrapped = FakeDDP(tiny_model())
    train_step(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1), split(make_batch(8, 1), 4))
    assert wrapped.synced == [False, False, False, True]


def test_clipping_and_reported_norm():
    batch = make_batch(8, 2)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = train_step(model, opt, [batch], max_grad_norm=1e-3)
    norm_after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()
                                                        if p.grad is not None]))
    assert float(out["grad_norm"]) > 1e-2  # measured before clipping
    assert float(norm_after) == pytest.approx(1e-3, rel=1e-3)


def test_loss_falls_and_metrics_aggregate():
    batch = make_batch(16, 3)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 100)
    first = evaluate(model, [batch]).summary()["loss"]
    lrs = []
    for _ in range(30):
        sums = MetricSums()
        lrs.append(train_step(model, opt, split(batch, 2), scheduler=sched, sums=sums)["learning_rate"])
    assert lrs[0] == pytest.approx(3e-3) and lrs[-1] < lrs[0]
    last = evaluate(model, [batch]).summary()
    assert last["loss"] < 0.5 * first
    assert model.training  # evaluate restores the mode
    s = sums.summary()
    assert set(s) == {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"}
    assert sums.sequences == 16
    assert sums.tokens == float(batch["attention_mask"].sum())
    assert s["loss"] == pytest.approx(s["mlm_loss"] + s["nsp_loss"])


def test_evaluate_counts_exactly_over_batches():
    model = tiny_model()
    batch = make_batch(9, 4)
    whole = evaluate(model, [batch])
    parts = evaluate(model, split(batch, 3))
    labels = batch["masked_lm_labels"]
    assert whole.values[2] == (labels != -100).sum()  # mlm_count
    torch.testing.assert_close(parts.values, whole.values, rtol=1e-6, atol=1e-6)
    assert parts.all_reduce().values.tolist() == parts.values.tolist()  # no process group: identity


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_train_state_roundtrip_continues_identically(tmp_path, name):
    from training.checkpoint import load_train_state, save_train_state
    from training.optim import build_optimizer, build_scheduler

    batches = [make_batch(8, s) for s in range(4)]

    def setup():
        model = tiny_model()
        opt = build_optimizer(model, name, lr=1e-3, weight_decay=0.01)
        return model, opt, build_scheduler(opt, warmup_steps=1, total_steps=10)

    model, opt, sched = setup()
    for b in batches[:2]:
        train_step(model, opt, [b], scheduler=sched)
    save_train_state(tmp_path, opt, sched, extra={"step": 2})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for b in batches[2:]:
        train_step(model, opt, [b], scheduler=sched)

    model2, opt2, sched2 = setup()
    model2.load_state_dict(state)
    assert load_train_state(tmp_path, opt2, sched2)["step"] == 2
    for b in batches[2:]:
        train_step(model2, opt2, [b], scheduler=sched2)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(model2.state_dict()[k], v, rtol=0, atol=0, msg=k)
    assert sched2.get_last_lr() == sched.get_last_lr()
    with pytest.raises(ValueError, match="same --optimizer"):
        load_train_state(tmp_path, torch.optim.SGD(model2.parameters(), lr=0.1))
