"""One optimisation step of BERT pre-training, free of any launcher: gradient accumulation, clipping, metrics.

The Ray Train worker calls `train_step` once per optimizer step with this rank's micro-batches; tests call it on CPU
with a tiny config and no process group. Nothing here knows about Ray, MLflow or storage.

Loss weighting under accumulation: the MLM loss of the step is the mean over *all* masked tokens of the rank's
micro-batches (each micro-batch's mean is weighted by its share of masked tokens), the NSP loss the mean over all
its sequences. So accumulating k micro-batches gives the same gradient as one batch k times larger (up to float
rounding), whatever the number of masks per row. Across ranks DDP averages, as usual.

Metrics are kept as sums (loss x count, correct, count) in `MetricSums` and reduced across ranks only when logged:
one all-reduce every `log_every` steps instead of one per step.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

MLM_IGNORE = -100
_FIELDS = ("mlm_loss_sum", "mlm_correct", "mlm_count", "nsp_loss_sum", "nsp_correct", "nsp_count",
           "sequences", "tokens")


@dataclass
class MetricSums:
    """Additive statistics over any number of batches (and, after `all_reduce`, ranks)."""

    values: torch.Tensor = field(default_factory=lambda: torch.zeros(len(_FIELDS), dtype=torch.float64))

    def add(self, out, batch: dict[str, torch.Tensor]) -> None:
        mlm_count = out.mlm_count.detach().double()
        nsp_count = out.nsp_count.detach().double()
        update = torch.stack([
            torch.nan_to_num(out.mlm_loss.detach().double()) * mlm_count,
            out.mlm_correct.detach().double(), mlm_count,
            out.nsp_loss.detach().double() * nsp_count, out.nsp_correct.detach().double(), nsp_count,
            torch.tensor(float(batch["input_ids"].shape[0]), dtype=torch.float64, device=mlm_count.device),
            batch["attention_mask"].detach().sum().double(),
        ])
        self.values = self.values.to(update.device) + update

    def all_reduce(self) -> "MetricSums":
        """Sum over the ranks of the default process group (a no-op without one). Every rank must call it."""
        values = self.values.clone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            backend = torch.distributed.get_backend()
            if backend == "nccl" and values.device.type != "cuda":
                values = values.cuda()
            torch.distributed.all_reduce(values)
        return MetricSums(values.cpu())

    def summary(self, prefix: str = "") -> dict[str, float]:
        v = dict(zip(_FIELDS, self.values.cpu().tolist()))
        mlm_loss = v["mlm_loss_sum"] / v["mlm_count"] if v["mlm_count"] else math.nan
        nsp_loss = v["nsp_loss_sum"] / v["nsp_count"] if v["nsp_count"] else math.nan
        return {
            f"{prefix}loss": mlm_loss + nsp_loss,
            f"{prefix}mlm_loss": mlm_loss,
            f"{prefix}nsp_loss": nsp_loss,
            f"{prefix}mlm_accuracy": v["mlm_correct"] / v["mlm_count"] if v["mlm_count"] else math.nan,
            f"{prefix}nsp_accuracy": v["nsp_correct"] / v["nsp_count"] if v["nsp_count"] else math.nan,
        }

    @property
    def sequences(self) -> float:
        return float(self.values[_FIELDS.index("sequences")])

    @property
    def tokens(self) -> float:
        """Real (unpadded) tokens."""
        return float(self.values[_FIELDS.index("tokens")])


def forward(model: nn.Module, batch: dict[str, torch.Tensor], autocast_dtype: torch.dtype | None = None):
    """The pre-training forward on one collated batch, under bf16 autocast when `autocast_dtype` is given."""
    device_type = batch["input_ids"].device.type
    ctx = (torch.autocast(device_type=device_type, dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    with ctx:
        return model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            masked_lm_positions=batch["masked_lm_positions"],
            masked_lm_labels=batch["masked_lm_labels"],
            next_sentence_label=batch["next_sentence_label"],
        )


def _micro_weights(micro_batches: Sequence[dict[str, torch.Tensor]]) -> list[tuple[float, float]]:
    """(MLM weight, NSP weight) per micro-batch: its share of the step's masked tokens and of its sequences."""
    mlm = [int((b["masked_lm_labels"] != MLM_IGNORE).sum()) for b in micro_batches]
    nsp = [int(b["next_sentence_label"].shape[0]) for b in micro_batches]
    total_mlm, total_nsp = max(sum(mlm), 1), sum(nsp)
    return [(m / total_mlm, n / total_nsp) for m, n in zip(mlm, nsp)]


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[dict[str, torch.Tensor]],
    *,
    scheduler=None,
    max_grad_norm: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    sums: MetricSums | None = None,
) -> dict[str, float | torch.Tensor]:
    """Forward/backward over the micro-batches (DDP gradient sync only on the last), clip, step, schedule.

    Returns the learning rate used and the gradient norm before clipping (a tensor: reading it would sync a GPU,
    so callers convert it only when they log). `sums`, when given, accumulates the micro-batches' metrics.
    `max_grad_norm <= 0` disables clipping (the norm is still measured).
    """
    if not micro_batches:
        raise ValueError("train_step needs at least one micro-batch")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    no_sync = getattr(model, "no_sync", None)  # DDP: all-reduce gradients once, on the last micro-batch
    weights = _micro_weights(micro_batches)
    for i, (batch, (w_mlm, w_nsp)) in enumerate(zip(micro_batches, weights)):
        last = i == len(micro_batches) - 1
        with (no_sync() if no_sync is not None and not last else contextlib.nullcontext()):
            out = forward(model, batch, autocast_dtype)
            # A micro-batch without masked tokens has mlm_loss NaN (0/0); it carries no MLM weight either.
            loss = torch.nan_to_num(out.mlm_loss) * w_mlm + out.nsp_loss * w_nsp
            loss.backward()
        if sums is not None:
            sums.add(out, batch)
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return {"learning_rate": lr, "grad_norm": grad_norm}


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]],
             autocast_dtype: torch.dtype | None = None) -> MetricSums:
    """Metric sums over `batches` in eval mode (no dropout); the model's previous mode is restored.

    Pass the unwrapped module, not DDP: ranks may hold different numbers of eval batches, and DDP's forward
    can communicate. Reduce the returned sums across ranks once, after the loop.
    """
    was_training = model.training
    model.eval()
    sums = MetricSums()
    try:
        for batch in batches:
            sums.add(forward(model, batch, autocast_dtype), batch)
    finally:
        model.train(was_training)
    return sums


def to_device(batch: dict, device: torch.device | str) -> dict[str, torch.Tensor]:
    """numpy or torch arrays -> torch tensors on `device` (non-blocking from pinned memory on GPU)."""
    out = {}
    for k, v in batch.items():
        t = v if isinstance(v, torch.Tensor) else torch.from_numpy(v)
        out[k] = t.to(device, non_blocking=True)
    return out


# ---- train state: optimizer + scheduler + counters, as safetensors + JSON (nothing to unpickle) -----------------

TRAIN_STATE_TENSORS = "train_state.safetensors"
TRAIN_STATE_JSON = "train_state.json"


def save_train_state(directory, optimizer: torch.optim.Optimizer, scheduler=None, extra: dict | None = None) -> None:
    """Write the optimizer's tensors to train_state.safetensors and everything else (param groups, scalar state,
    the scheduler, `extra` such as step / data position / RNG seeds) to train_state.json."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    directory = Path(directory)
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            key = f"optimizer.state.{idx}.{name}"
            if isinstance(value, torch.Tensor):
                tensors[key] = value.detach().to("cpu").contiguous()
            else:
                scalars[key] = value
    meta = {
        "optimizer": {"class": type(optimizer).__name__, "param_groups": sd["param_groups"], "scalars": scalars},
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        **(extra or {}),
    }
    (directory / TRAIN_STATE_JSON).write_text(json.dumps(meta, indent=1, sort_keys=True))
    save_file(tensors, str(directory / TRAIN_STATE_TENSORS))


def load_train_state(directory, optimizer: torch.optim.Optimizer | None = None, scheduler=None) -> dict:
    """Restore what `save_train_state` wrote into `optimizer` / `scheduler` (on the optimizer's device); return the
    JSON (with `extra`'s keys at top level)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    directory = Path(directory)
    meta = json.loads((directory / TRAIN_STATE_JSON).read_text())
    if optimizer is not None:
        saved = meta["optimizer"]
        if saved["class"] != type(optimizer).__name__:
            raise ValueError(f"the checkpoint's optimizer is {saved['class']}, this run builds "
                             f"{type(optimizer).__name__}; resume with the same --optimizer")
        state: dict[int, dict] = {}
        for key, value in load_file(str(directory / TRAIN_STATE_TENSORS)).items():
            _, _, idx, name = key.split(".", 3)
            state.setdefault(int(idx), {})[name] = value
        for key, value in saved["scalars"].items():
            _, _, idx, name = key.split(".", 3)
            state.setdefault(int(idx), {})[name] = value
        optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
    if scheduler is not None and meta.get("scheduler") is not None:
        scheduler.load_state_dict(meta["scheduler"])
    return meta
