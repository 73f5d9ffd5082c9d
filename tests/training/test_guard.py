"""The guard's parts on CPU: the optimizer skips a non-finite step on the device, metric sums count a non-finite
batch instead of hiding it, and the host-side verdicts (non-finite steps in a row, sustained loss spikes)."""
from __future__ import annotations

import math

import pytest
import torch

from pretraining.metrics import MetricSums
from training.guard import Guard, GuardConfig, StepLog, advice, model_and_optimizer_tensors, nonfinite_tensors
from training.optim import Lamb
from training.step import apply_gradients


def _params() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


@pytest.mark.parametrize("make", [lambda ps: torch.optim.AdamW(ps, lr=0.1, fused=True),
                                  lambda ps: Lamb(ps, lr=0.1)], ids=["fused-adamw", "lamb"])
def test_a_nonfinite_gradient_leaves_weights_and_state_untouched(make):
    model = _params()
    opt = make(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    apply_gradients(model, opt)  # one real step, so there is optimizer state to keep
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}

    opt.zero_grad()
    (model(torch.ones(2, 4)).sum() * float("nan")).backward()
    out = apply_gradients(model, opt)
    assert not out["finite"] and not math.isfinite(float(out["grad_norm"]))
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    for p, s in opt.state.items():
        for k, v in s.items():
            assert torch.equal(v, state[id(p)][k]), k  # moments and the step count

    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    out = apply_gradients(model, opt)
    assert out["finite"] and not torch.equal(model.weight, weights["weight"])
    assert all(int(s["step"]) == 2 for s in opt.state.values())  # the skipped step did not count


def test_lamb_with_found_inf_zero_equals_a_plain_step():
    a, b = _params(), _params()
    opt_a, opt_b = Lamb(a.parameters(), lr=0.05), Lamb(b.parameters(), lr=0.05)
    for _ in range(3):
        for m, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            m(torch.arange(8.0).reshape(2, 4)).pow(2).sum().backward()
        opt_a.step()
        opt_b.found_inf = torch.zeros(())
        opt_b.step()
        del opt_b.found_inf
    torch.testing.assert_close(a.weight, b.weight, rtol=1e-6, atol=1e-7)


class _Out:
    def __init__(self, mlm_loss: float, nsp_loss: float = 0.5) -> None:
        self.mlm_loss, self.nsp_loss = torch.tensor(mlm_loss), torch.tensor(nsp_loss)
        self.mlm_count, self.mlm_correct = torch.tensor(10), torch.tensor(4)
        self.nsp_count, self.nsp_correct = torch.tensor(2), torch.tensor(1)


def test_metric_sums_count_a_nonfinite_batch_and_keep_it_out_of_the_mean():
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.int64), "attention_mask": torch.ones(2, 8),
             "masked_lm_positions": torch.ones(2, 3, dtype=torch.int64)}
    sums = MetricSums()
    sums.add(_Out(2.0), batch)
    sums.add(_Out(float("nan")), batch)
    sums.add(_Out(4.0, nsp_loss=float("inf")), batch)
    s = sums.summary()
    assert sums.nonfinite == 2
    assert s["mlm_loss"] == pytest.approx(2.0) and s["mlm_accuracy"] == pytest.approx(0.4)
    assert sums.sequences == 6  # every batch was seen
    only_bad = MetricSums()
    only_bad.add(_Out(float("nan")), batch)
    assert math.isnan(only_bad.summary()["loss"])  # nothing finite: NaN, never 0


def _review(guard: Guard, losses: list[float], first_step: int = 1, applied: list[bool] | None = None):
    steps = list(range(first_step, first_step + len(losses)))
    return guard.review(steps, losses, applied or [math.isfinite(x) for x in losses])


def test_nonfinite_steps_in_a_row_diverge_and_a_lone_one_does_not():
    guard = Guard(GuardConfig(nonfinite_in_a_row=3))
    assert _review(guard, [5.0, math.nan, 4.9, math.inf, 4.8]) is None
    assert guard.window_metrics()["nonfinite_steps"] == 2
    assert guard.window_metrics()["nonfinite_steps"] == 0  # counts are per log window
    assert _review(guard, [4.7, math.nan], first_step=6) is None and guard.open
    verdict = _review(guard, [math.nan, math.nan], first_step=8)
    assert verdict is not None and verdict.step == 9 and "steps 7-9" in verdict.reason
    # A finite loss whose gradient was not finite (the step says so) counts as non-finite too.
    assert _review(Guard(GuardConfig(nonfinite_in_a_row=1)), [3.0], applied=[False]) is not None


def test_sustained_spikes_diverge_single_outliers_do_not():
    cfg = GuardConfig(spike_in_a_row=3, spike_min_history=20, spike_window=50)
    guard = Guard(cfg)
    noise = [3.0 + 0.05 * math.sin(i) for i in range(30)]
    assert guard.threshold() is None and _review(guard, noise[:10]) is None  # too little history to judge
    assert _review(guard, noise[10:]) is None
    limit = guard.threshold()
    assert 3.1 < limit < 3.6
    assert _review(guard, [9.0, 3.0, 9.0, 9.0, 3.01], first_step=31) is None  # outliers, not a sustained spike
    assert guard.window_metrics()["loss_spikes"] == 3
    verdict = _review(guard, [8.0, 8.5, 9.0, 3.0], first_step=36)
    assert verdict is not None and verdict.step == 38 and "spiked for 3 steps" in verdict.reason
    assert max(guard.baseline) < 3.1  # spikes never enter the baseline


def test_rollback_state_travels_with_checkpoints():
    guard = Guard()
    guard.rolled_back(to_step=20, from_step=30)
    restored = Guard()
    restored.load_state_dict(guard.state_dict())
    assert (restored.rollbacks, restored.skipped_batches) == (1, 10)
    assert restored.window_metrics() == {"nonfinite_steps": 0.0, "loss_spikes": 0.0, "rollbacks": 1.0,
                                         "skipped_batches": 10.0}


def test_step_log_reads_once_without_a_process_group():
    log = StepLog()
    log.add(1, torch.tensor(2.5), torch.tensor(True))
    log.add(2, torch.tensor(float("nan")), torch.tensor(False))
    steps, losses, applied = log.read()
    assert steps == [1, 2] and losses[0] == 2.5 and math.isnan(losses[1]) and applied == [True, False]
    assert log.read() == ([], [], [])


def test_nonfinite_tensors_names_weights_and_optimizer_state():
    model = _params()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    assert nonfinite_tensors(model_and_optimizer_tensors(model, opt)) == []
    opt.state[model.bias]["exp_avg_sq"][0] = float("inf")
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    assert nonfinite_tensors(model_and_optimizer_tensors(model, opt)) == ["weight", "optimizer[bias].exp_avg_sq"]


def test_advice_names_the_flags_and_a_concrete_lower_rate():
    assert advice(1e-3, 1.0, 0) == ("try --lr 0.0001 (a tenth of this run's 0.001), a lower --max-grad-norm (now 1) "
                                    "or more --warmup-steps (now 0)")
    # A tenth of an absurd rate is still absurd: never above the default for the model's width.
    assert advice(1e4, 1.0, 0, width=768).startswith("try --lr 0.0001 (the default for this model's width; this "
                                                       "run: 10000)")
    assert advice(1e-3, 1.0, 0, width=128).startswith("try --lr 0.0001 (a tenth of this run's 0.001)")
    assert "gradient clipping (--max-grad-norm 1.0; it is off)" in advice(1e-3, 0.0, 10)


def test_config_is_checked():
    with pytest.raises(ValueError, match="must be >= 1"):
        GuardConfig(nonfinite_in_a_row=0)
    with pytest.raises(ValueError, match="spike_min_history"):
        GuardConfig(spike_min_history=300, spike_window=200)


def test_an_export_refuses_non_finite_weights(tmp_path, mlflow_uri):
    """The last line of defence: a model directory holding a NaN is never published (nor logged as the artifact)."""
    from bert_core import BertForPreTraining, bert_tiny
    from tracking.runs import open_run
    from training.export import export_model

    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=50))
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[3, 0] = float("nan")
    model.save_pretrained(tmp_path / "model")
    run = open_run(mlflow_uri, "guard-export", "x")
    with pytest.raises(RuntimeError, match=r"refusing to export .*model.safetensors:.*word_embeddings"):
        export_model(tmp_path / "model", str(tmp_path / "out"), run, "lineage.json")
    assert not (tmp_path / "out").exists()
