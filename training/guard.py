"""The run's guard against divergence: what a non-finite or spiking loss does to a pre-training run.

Per step (on the device, no host read): a step whose gradient is NaN or inf does not update the weights
(`training.step`). At each review (every log step and before every checkpoint) the loop hands the guard the steps
since the last one: their losses (averaged over ranks) and whether their update was applied. The guard counts
skipped steps and loss spikes and says when the run has diverged:

- `nonfinite_in_a_row` skipped steps in a row: the weights no longer give finite losses, skipping will not end it;
- `spike_in_a_row` steps in a row whose loss is above a robust threshold: the median of the last `spike_window`
  healthy step losses plus `spike_sigmas` robust standard deviations (1.4826 x the median absolute deviation,
  floored at 1% of the median so a flat curve does not turn noise into spikes). Single outliers (an odd batch)
  are counted but do not roll back; the threshold is measured only once `spike_min_history` healthy steps exist.

A divergence rolls the run back to its last checkpoint (or to its initial weights when it has none) and skips the
batches since then, as PaLM did for its loss spikes (Chowdhery et al. 2022, section 5.1): the data position moves on
past every batch already seen, so the offending ones are never replayed. Checkpoints are written only after a
review found nothing open and every weight and optimizer tensor finite, so the last checkpoint is a good one. After
`max_rollbacks` rollbacks the next divergence raises `TrainingDiverged`, whose message names the step and what to
try.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch

from training.worker import Verdict


@dataclass(frozen=True)
class GuardConfig:
    nonfinite_in_a_row: int = 5
    """Skipped steps (non-finite loss or gradient) in a row that make a divergence: the weights no longer give finite
    losses, and skipping will not end it."""
    spike_sigmas: float = 6.0
    """A loss above the baseline's median plus this many robust standard deviations (1.4826 x the median absolute
    deviation, at least 1% of the median) is a spike."""
    spike_in_a_row: int = 3
    """Spike steps in a row that make a divergence; fewer (an odd batch) are counted, not rolled back."""
    spike_window: int = 200
    """Healthy steps the spike threshold is measured over (the most recent ones)."""
    spike_min_history: int = 20
    """Healthy steps needed before any loss can be called a spike."""
    max_rollbacks: int = 3
    """Rollbacks allowed in a run; the next divergence after them raises `TrainingDiverged`."""

    def __post_init__(self) -> None:
        if min(self.nonfinite_in_a_row, self.spike_in_a_row, self.spike_window, self.spike_min_history) < 1:
            raise ValueError("the guard's step counts (non-finite / spike steps in a row, spike window) must be >= 1")
        if self.spike_min_history > self.spike_window:
            raise ValueError("spike_min_history cannot exceed spike_window")
        if not self.spike_sigmas > 0 or self.max_rollbacks < 0:
            raise ValueError("spike_sigmas must be > 0 and max_rollbacks >= 0")


class TrainingDiverged(Verdict):
    """The run diverged again after its rollbacks (a user's problem: the settings, not the code)."""


@dataclass(frozen=True)
class Divergence:
    step: int
    """The step at which the run of bad steps reached its limit."""
    reason: str
    """What happened, for the log and the error: which steps, which losses."""


def advice(lr: float, max_grad_norm: float, warmup_steps: int, width: int | None = None) -> str:
    """What to try, in the flags' words, with a concrete lower rate: a tenth of the one that diverged, and never
    above the default for a model of this hidden `width` (a tenth of an absurd --lr 10000 is still absurd)."""
    lower = lr / 10
    why = "a tenth of this run's"
    if width is not None:
        from training.defaults import default_lr

        default = default_lr(width, "pretrain")
        if lower > default:
            lower, why = default, "the default for this model's width"
    tips = [f"--lr {lower:.2g} ({why} {lr:g})" if why.startswith("a tenth") else f"--lr {lower:.2g} ({why}; this "
            f"run: {lr:g})"]
    if max_grad_norm <= 0:
        tips.append("gradient clipping (--max-grad-norm 1.0; it is off)")
    else:
        tips.append(f"a lower --max-grad-norm (now {max_grad_norm:g})")
    tips.append(f"more --warmup-steps (now {warmup_steps})")
    return "try " + ", ".join(tips[:-1]) + " or " + tips[-1]


def nonfinite_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the tensors holding a NaN or inf. One host read for all of them (a checkpoint is about to copy
    them to the host anyway)."""
    named = [(n, t) for n, t in named if t.is_floating_point()]
    if not named:
        return []
    flags = torch.stack([torch.isfinite(t).all().to("cpu", non_blocking=True) for _, t in named]).tolist()
    return [n for (n, _), ok in zip(named, flags, strict=False) if not ok]


def safetensors_tensors(directory: str | Path):
    """(file:name, tensor) of every tensor in a directory's *.safetensors files, one at a time."""
    from safetensors import safe_open

    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield f"{path.name}:{name}", f.get_tensor(name)


def model_and_optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """(name, tensor) of every weight and optimizer state tensor: what a checkpoint holds."""
    yield from model.state_dict().items()
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield f"optimizer[{names.get(id(p), '?')}].{key}", value


class StepLog:
    """Each step's loss and applied flag, kept on the device until the next review."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.losses: list[torch.Tensor] = []
        self.applied: list[torch.Tensor] = []

    def add(self, step: int, loss: torch.Tensor, applied: torch.Tensor) -> None:
        self.steps.append(step)
        self.losses.append(loss.detach().reshape(()))
        self.applied.append(applied.detach().reshape(()))

    def read(self) -> tuple[list[int], list[float], list[bool]]:
        """(steps, losses averaged over ranks, applied on every rank) since the last read; clears the log. A
        collective when a process group is up: every rank calls it at the same steps."""
        steps, n = self.steps, len(self.steps)
        if not n:
            return [], [], []
        values = torch.cat([torch.stack(self.losses).double(), (~torch.stack(self.applied)).double()])
        world = 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            if torch.distributed.get_backend() == "nccl" and values.device.type != "cuda":
                values = values.cuda()
            torch.distributed.all_reduce(values)
        values = values.cpu().tolist()
        self.__init__()
        return steps, [v / world for v in values[:n]], [v == 0 for v in values[n:]]


@dataclass
class Guard:
    """The host side: counts, the spike baseline and the verdicts. `state_dict()` goes into every checkpoint."""

    config: GuardConfig = field(default_factory=GuardConfig)
    """The limits: what makes a divergence and how many rollbacks are allowed."""
    rollbacks: int = 0
    """Rollbacks so far in the run; in the checkpoint (`state_dict`), so a resume goes on counting."""
    skipped_batches: int = 0
    """Optimizer steps' worth of data skipped by rollbacks (each: `accum` micro-batches); in the checkpoint, so the
    data position stays exact on resume."""
    nonfinite_steps: int = 0
    """Steps with a non-finite loss or a skipped update, in the current log window (`window_metrics` resets it)."""
    loss_spikes: int = 0
    """Spike steps in the current log window (`window_metrics` resets it)."""
    _nonfinite_streak: int = 0
    """Skipped steps in a row up to the last one reviewed; above 0 a run of bad steps is open and no checkpoint is
    written."""
    _spike_streak: int = 0
    """Spike steps in a row up to the last one reviewed; above 0 it too holds checkpoints back."""
    baseline: deque = field(default_factory=deque)
    """The last `spike_window` healthy step losses, which the spike threshold is measured on (spikes and skipped
    steps never enter)."""

    @property
    def open(self) -> bool:
        """A run of bad steps is under way: not the moment to write a checkpoint."""
        return self._nonfinite_streak > 0 or self._spike_streak > 0

    def threshold(self) -> float | None:
        """The loss above which a step is a spike (None while the baseline is too short)."""
        if len(self.baseline) < self.config.spike_min_history:
            return None
        med = median(self.baseline)
        sigma = max(1.4826 * median(abs(x - med) for x in self.baseline), 0.01 * abs(med))
        return med + self.config.spike_sigmas * sigma

    def review(self, steps: list[int], losses: list[float], applied: list[bool]) -> Divergence | None:
        """Walk the steps since the last review; the first divergence found (the rest of the span is moot: the
        run rolls back past it)."""
        cfg = self.config
        for step, loss, ok in zip(steps, losses, applied, strict=False):
            if not ok or not math.isfinite(loss):
                self.nonfinite_steps += 1
                self._nonfinite_streak += 1
                if self._nonfinite_streak >= cfg.nonfinite_in_a_row:
                    return Divergence(step, f"{self._nonfinite_streak} steps in a row had a non-finite loss or "
                                            f"gradient (steps {step - self._nonfinite_streak + 1}-{step}; their "
                                            "updates were skipped)")
                continue
            self._nonfinite_streak = 0
            limit = self.threshold()
            if limit is not None and loss > limit:
                self.loss_spikes += 1
                self._spike_streak += 1
                if self._spike_streak >= cfg.spike_in_a_row:
                    return Divergence(step, f"the loss spiked for {self._spike_streak} steps in a row (step {step}: "
                                            f"{loss:.4g}, above {limit:.4g} = median + {cfg.spike_sigmas:g} robust "
                                            f"sigmas of the last {len(self.baseline)} healthy steps)")
                continue
            self._spike_streak = 0
            self.baseline.append(loss)
            if len(self.baseline) > cfg.spike_window:
                self.baseline.popleft()
        return None

    def window_metrics(self) -> dict[str, float]:
        """The log window's counts (then reset) and the run's totals."""
        out = {"nonfinite_steps": float(self.nonfinite_steps), "loss_spikes": float(self.loss_spikes),
               "rollbacks": float(self.rollbacks), "skipped_batches": float(self.skipped_batches)}
        self.nonfinite_steps = self.loss_spikes = 0
        return out

    def rolled_back(self, to_step: int, from_step: int) -> None:
        """The run is back at `to_step`; the data of steps to_step+1..from_step is skipped."""
        self.rollbacks += 1
        self.skipped_batches += from_step - to_step
        self._nonfinite_streak = self._spike_streak = 0

    def state_dict(self) -> dict[str, int]:
        return {"rollbacks": self.rollbacks, "skipped_batches": self.skipped_batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.rollbacks = int(state.get("rollbacks", 0))
        self.skipped_batches = int(state.get("skipped_batches", 0))
