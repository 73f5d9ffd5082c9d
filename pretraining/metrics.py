"""Additive training metrics kept on the device: sums, not means, so they reduce across micro-batches, steps and ranks.

Every statistic is a sum (loss x count, correct, count, sequences, real tokens, and what the model executed: padded
positions, attention pairs, last-layer rows, head slots) in one float64 vector on the step's device. Adding a
batch launches a few small kernels and never reads a value on the host (no GPU sync inside a step); the vector is
all-reduced across ranks and copied to the host only when the loop logs (every `log_every` steps), which is also
one collective per log instead of one per step.

A micro-batch whose loss is NaN or inf (a diverging or poisoned step, which the guard skips) is counted in
`nonfinite` and kept out of the loss and accuracy sums: one poisoned batch neither turns a window's mean loss into
NaN nor silently into a 0 (as `nan_to_num` in the sums did). A window without a finite batch has NaN losses, and
the loop logs them as NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

FIELDS = ("mlm_loss_sum", "mlm_correct", "mlm_count", "nsp_loss_sum", "nsp_correct", "nsp_count",
          "sequences", "tokens", "positions",  # positions: padded B x T, so padding = 1 - tokens / positions
          # what bert_core executes (`bert_core.flops.executed_flops`'s arguments), as its static head and, for
          # packed rows, variable-length attention run it
          "attention_pairs", "query_rows", "query_pairs", "head_slots", "pooled_rows",
          "nonfinite")  # micro-batches whose loss was NaN or inf (left out of the loss and accuracy sums)
EXECUTED = ("positions", "attention_pairs", "query_rows", "query_pairs", "head_slots", "pooled_rows")


def executed_counts(batch: dict[str, torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """`EXECUTED`'s values for one batch, as float64 device scalars (shapes on the host, packed lengths on the
    device: no sync). Packed rows attend inside their blocks (each sequence, and the padding), as CUDA's
    variable-length kernel runs them (the CPU reference scores all W^2 pairs): sum of squared block lengths; the
    last layer's queries are counted at the mean block length of a position (exact in expectation: MLM slots are
    spread over each sequence's positions)."""
    b, t = batch["input_ids"].shape
    p = batch["masked_lm_positions"].shape[1]
    lengths = batch.get("sequence_lengths")
    if lengths is None:
        shape = [b * t, b * t * t, b * (1 + p), b * (1 + p) * t, b * p, b]
        return [torch.full((), float(v), dtype=torch.float64, device=device) for v in shape]
    s = lengths.shape[1]
    lengths = lengths.detach().double()
    pairs = (lengths ** 2).sum() + ((t - lengths.sum(1)) ** 2).sum()
    rows = float(b * (s + p))
    full = [torch.full((), float(v), dtype=torch.float64, device=device) for v in (b * t, rows, b * p, b * s)]
    return [full[0], pairs, full[1], pairs * (rows / (b * t)), full[2], full[3]]


@dataclass
class MetricSums:
    """Additive statistics over any number of batches (and, after `all_reduce`, ranks)."""

    values: torch.Tensor = field(default_factory=lambda: torch.zeros(len(FIELDS), dtype=torch.float64))
    """One float64 sum per name of `FIELDS`, in that order; it moves to the device of the batches added, and
    `all_reduce` returns it on the host."""

    def add(self, out, batch: dict[str, torch.Tensor]) -> None:
        """Accumulate one pre-training forward's output (`BertForPreTrainingOutput`) on its batch."""
        mlm_loss, nsp_loss = out.mlm_loss.detach().double(), out.nsp_loss.detach().double()
        finite = torch.isfinite(mlm_loss) & torch.isfinite(nsp_loss)
        zero = torch.zeros((), dtype=torch.float64, device=mlm_loss.device)

        def kept(x: torch.Tensor) -> torch.Tensor:  # torch.where, not a product: NaN * 0 is NaN
            return torch.where(finite, x.detach().double(), zero)

        mlm_count, nsp_count = kept(out.mlm_count), kept(out.nsp_count)
        device = mlm_count.device
        # torch.full is a fill kernel on the device; torch.tensor(python_float, device=cuda) would be a host copy.
        if "sequence_lengths" in batch:  # packed rows: the real sequences are the used places
            sequences = (batch["sequence_lengths"].detach() > 0).sum().double()
        else:
            sequences = torch.full((), float(batch["input_ids"].shape[0]), dtype=torch.float64, device=device)
        executed = executed_counts(batch, device)
        update = torch.stack([
            kept(mlm_loss) * mlm_count, kept(out.mlm_correct), mlm_count,
            kept(nsp_loss) * nsp_count, kept(out.nsp_correct), nsp_count,
            sequences, batch["attention_mask"].detach().sum().double(), *executed, (~finite).double(),
        ])
        if self.values.device != device:
            self.values = self.values.to(device)
        self.values = self.values + update

    def all_reduce(self) -> MetricSums:
        """Sum over the ranks of the default process group (a no-op without one), on the host. Every rank must
        call it."""
        values = self.values.clone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_backend() == "nccl" and values.device.type != "cuda":
                values = values.cuda()
            torch.distributed.all_reduce(values)
        return MetricSums(values.cpu())

    def summary(self, prefix: str = "") -> dict[str, float]:
        v = dict(zip(FIELDS, self.values.cpu().tolist(), strict=False))
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
        return float(self.values[FIELDS.index("sequences")])

    @property
    def tokens(self) -> float:
        """Real (unpadded) tokens."""
        return float(self.values[FIELDS.index("tokens")])

    @property
    def positions(self) -> float:
        """Padded positions (batch x width): what the model computed on."""
        return float(self.values[FIELDS.index("positions")])

    def executed(self) -> dict[str, float]:
        """`bert_core.flops.executed_flops`'s keyword arguments, summed."""
        v = dict(zip(FIELDS, self.values.cpu().tolist(), strict=False))
        out = {k: v[k] for k in EXECUTED}
        out["sequences"] = out.pop("pooled_rows")
        return out

    @property
    def nonfinite(self) -> float:
        """Micro-batches whose loss was NaN or inf."""
        return float(self.values[FIELDS.index("nonfinite")])

    @property
    def masked(self) -> float:
        """Real masked-LM predictions (padded slots excluded)."""
        return float(self.values[FIELDS.index("mlm_count")])
