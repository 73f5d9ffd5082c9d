"""What a pre-training run holds while it runs (``TrainRun``: built by the loop's set-up, advanced by its steps,
restored by a rollback), the model as a run starts it, and the host-side all-reduce for the few values every rank
must agree on (a memory budget, a window's clocks, a divergence verdict)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from bert_core import BertForPreTraining
from pretraining.config import PretrainConfig
from pretraining.metrics import MetricSums
from pretraining.perf import RunTotals, Window
from tracking.tracker import Tracker
from training.guard import Guard, StepLog
from training.model_fetch import local_model_dir
from training.progress import Progress
from training.worker import Worker

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class LoopState:
    """What the step loop advances while a run runs (and a rollback sets back): the one mutable part of a run."""

    step: int = 0
    """Optimizer steps taken: the run's position in its schedule (a rollback sets it back)."""
    position: object = None
    """A packed stream's position after the last step taken (None: not packed)."""
    seen: dict = field(default_factory=dict)
    """Step -> the example ids of its global batch, since the guard's last review (spike forensics)."""
    digests: dict = field(default_factory=dict)
    """Step -> its batch's digest since the last checkpoint (rank 0): saved into the next checkpoint."""
    executed: int = 0
    """Steps run by this process: the throughput warm-up exclusion counts these, not ``step``."""
    step_log: StepLog = field(default_factory=StepLog)
    """The guard's per-step records, kept on the device until a log or checkpoint step reads them."""
    sums: MetricSums = field(default_factory=MetricSums)
    """The current log window's metric sums, on the device (read every ``log_every`` steps)."""
    window: Window | None = None
    """The current log window's clock and data-wait baseline (None before the first window)."""
    totals: RunTotals = field(default_factory=RunTotals)
    """Throughput totals over the run, warm-up excluded."""


@dataclass(frozen=True, kw_only=True)
class TrainRun:
    """What the set-up builds once (the model, its optimizer and schedule, the guard, the tracker, this rank's
    batches) and, in ``loop``, what the step loop advances. A rollback restores the weights, optimizer and schedule
    in place and sets ``loop.step`` back; nothing else is reassigned."""

    config: PretrainConfig
    """The run's whole configuration, as the job built it."""
    worker: Worker
    """This process's place in the run: rank, world size, device, DDP wrapper, checkpoint store, tracking."""
    device: torch.device
    """Where the model and every batch live."""
    raw: BertForPreTraining
    """The unwrapped model: what checkpoints save and a rollback loads into, in place."""
    model: nn.Module
    """What steps: ``raw`` wrapped for DDP and perhaps compiled (the same parameters)."""
    optimizer: torch.optim.Optimizer
    """The optimizer over ``raw``'s parameters (AdamW or LAMB)."""
    scheduler: object
    """The learning-rate schedule (warm-up, then linear or polynomial decay), stepped once per step."""
    initial_state: tuple[dict, dict] | None
    """A fresh run's (optimizer, scheduler) state dicts: what a rollback to step 0 restores. None when
    the run resumed (it always has a checkpoint to roll back to)."""
    autocast_dtype: torch.dtype | None
    """bf16 under autocast (a CUDA run, or --precision bf16); None: full precision."""
    resumed_from: int
    """The step this process started from (0: a fresh run)."""
    guard: Guard
    """The divergence guard: non-finite steps skipped, spikes and rollbacks counted (checkpointed)."""
    tracker: Tracker
    """Where metrics go: MLflow on rank 0, nowhere elsewhere."""
    progress: Progress
    """The log's progress line: step, share done, speed, ETA, and the wall-clock budget."""
    vocab_text: str | None
    """The dataset's vocab.txt, saved into each checkpoint beside the model (rank 0 only)."""
    peak: float | None
    """The accelerator's peak FLOP/s for MFU (None: unknown, MFU not reported)."""
    eval_rows: object | None
    """The evaluation dataset's rows, read once (None: no --eval-data)."""
    warmup: int
    """Steps of this process left out of the throughput figures (compilation's first steps)."""
    compiled: bool = False
    """Whether ``model`` went through torch.compile (its artifacts are saved beside checkpoints)."""
    data: object = None
    """``config.data`` for this world size (``DataConfig.for_world``): micro-batch and accumulation."""
    batches: object = None
    """This rank's share of each global batch, in the global order, from the data position on."""
    t_start: float = field(default_factory=time.perf_counter)
    """When this process's loop started (``time.perf_counter``)."""
    host_group: object = None
    """A gloo process group for the per-step stop verdict when the collectives run on NCCL (no GPU sync for it);
    None: the default group (gloo on CPU), or one process."""
    loop: LoopState
    """The step, the stream's position and the windows' sums: what changes from step to step."""


def build_model(config: PretrainConfig, checkpoint_dir: Path | None) -> BertForPreTraining:
    """The model a run starts from: a checkpoint's, else ``--init``'s weights, else a seeded fresh one (the same
    initial weights on every rank)."""
    if checkpoint_dir is not None:
        return BertForPreTraining.from_pretrained(checkpoint_dir / "model")
    if config.model.init:
        m = config.model  # a URL is fetched once per machine: this worker's may be another than the job's
        init_dir = local_model_dir(m.init, m.init_cache, m.init_endpoint_url)
        model, info = BertForPreTraining.from_pretrained(init_dir, output_loading_info=True)
        if info["missing_keys"]:
            log.warning("init %s lacked %s (freshly initialised)", config.model.init, info["missing_keys"])
        return model
    torch.manual_seed(config.runtime.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return BertForPreTraining(config.model.bert)


def all_reduce_host(t: torch.Tensor, op: str = "sum", group: object = None) -> torch.Tensor:
    """``t`` reduced over every rank (NCCL reduces on the GPU; a gloo ``group`` on the host), back on the host;
    ``t`` itself without a process group."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return t
    dev = (torch.device("cuda", torch.cuda.current_device())
           if group is None and torch.distributed.get_backend() == "nccl" else torch.device("cpu"))
    t = t.to(dev)
    ops = {"sum": torch.distributed.ReduceOp.SUM, "min": torch.distributed.ReduceOp.MIN}
    torch.distributed.all_reduce(t, op=ops[op], group=group)
    return t.cpu()


def host_group() -> object:
    """A gloo group beside an NCCL default group (every rank must call this at the same point); None otherwise."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return dist.new_group(backend="gloo")
    return None
