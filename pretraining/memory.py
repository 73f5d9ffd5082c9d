"""Sizes that fit: the memory a pre-training step needs, against the memory a worker has, checked before training.

`estimate` adds weights, gradients and optimizer state (fp32: 4 + 4 + 8 bytes per parameter for AdamW and LAMB)
to the activations autograd keeps for the backward pass of one micro-batch at the widest length bucket. The
activation formula counts what `bert_core`'s eager fp32 step saves (measured on CPU with
`torch.autograd.graph.saved_tensors_hooks`, weights excluded; tests/pretraining/test_memory.py holds the formula to
that probe), in bytes:

    full layers (all but the last):  per token 34 H + 8 I     (8 H + 2 I fp32 tensors, 2 H one-byte dropout masks)
                                     per head, query and key 9 (attention probabilities, their dropout mask, scores)
    the last layer (only [CLS] and the masked slots are computed, over every key) and the embeddings:
                                     per token 18 H + 96, per computed row 34 H + 8 I and 9 per head and key
    the MLM head:                    per masked slot 3 H, plus 4 V H (the fused loss' decoder gradient)

A step's peak also holds the gradients flowing back through one layer while the saved tensors of the layers below
are still alive; `GRADIENTS_IN_FLIGHT` adds that as a fraction of the activations (the estimate against measured
peak RSS: `benchmarks/memory_fit.py`, figures in docs/benchmarks.md).

On a GPU (`device_type="cuda"`: bf16 autocast, SDPA's flash / cuDNN attention, the fused LayerNorm sites,
`torch.compile`, the default there) the step saves different tensors, counted per token of a full layer in bytes:

    2 H   the QKV GEMM's input (the bf16 copy of the layer input)     6 H   Q, K, V (bf16), kept by attention
    2 H   attention's output (bf16; also the output projection's input) 4 a  its log-sum-exp (fp32 per head)
    2 H   the projection's output and 4 H the fp32 residual, both kept by the fused LayerNorm
    4 H   that LayerNorm's fp32 output (the FFN's residual), 2 H its bf16 copy (the FFN GEMM's input)
    2 I   the FFN's pre-GELU activation (bf16); compiled, Inductor recomputes GELU from it in backward (eager
          keeps GELU's output too: 2 I more)
    2 H   the FFN output projection's output, kept by the second fused LayerNorm

so 24 H + 2 I + 4 a compiled (24 KB at BERT-base), no dropout masks (the kernels and flash attention recompute
theirs from seeds) and no attention probabilities. The last layer keeps its input, its QKV input and K, V for every
token (10 H) and the rest at [CLS] + the masked slots only; the embeddings about 10 H per token. One layer's worth
of gradients in flight (`1 / layers` of the activations), fp32 weights, gradients and AdamW state, a bf16 copy of
the weights (autocast's cast cache) and the static MLM path's logits (B x P x V: bf16, fp32 copy, gradient) make the
rest, plus `RUNTIME_BYTES` of allocator slack (the CUDA context is taken before the free memory is read).
Derived from what each op saves, then held against the two H100 peaks of 2026-11-24 (`MEASURED_GPU`,
`python benchmarks/memory_fit.py --gpu`): estimate/measured 1.08 at 256 x 128 and 1.12 at 32 x 512 compiled,
1.15 for the eager 256 x 128 peak, on the safe side. Not fitted to them;
nothing else on a GPU is measured.

`plan_micro_batch` picks the largest micro-batch that divides the per-rank batch and fits in `HEADROOM` of the budget
(gradient accumulation keeps the global batch), or says which flag to change; a job runs it (`plan_for_workers`)
before it starts any worker, when it can know their memory (`local_budget`). `check` is what `pretraining.loop.fit`
runs at set-up on every worker: it fails only when the micro-batch cannot fit at all, so a run planned by its job
(with headroom) does not fail because Ray's own processes took some memory since.
"""
from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from dataclasses import dataclass

import torch

from bert_core.config import BertConfig
from pretraining.loader import batch_geometry
from training.model_size import GIB, RUNTIME_BYTES, parameter_count, ram_available
from training.worker import Verdict

log = logging.getLogger(__name__)

HEADROOM = 0.8  # plan for this share of the free memory: the allocator, the data thread, Python and Ray take some
GRADIENTS_IN_FLIGHT = 0.5  # gradients in flight during backward, as a share of the saved activations


@dataclass(frozen=True)
class GpuMeasurement:
    """A measured peak of a BERT-base training step on a GPU (bf16 autocast, fused AdamW)."""

    machine: str
    """The GPU's name, e.g. "H100 80GB HBM3"."""
    date: str
    """The day of the measurement, ISO 8601."""
    preset: str
    """The `bert_core` preset trained."""
    micro_batch: int
    """Sequences per forward."""
    seq_len: int
    """Tokens per sequence (the padded width)."""
    predictions: int
    """Masked-LM slots per sequence (the dataset's max_predictions)."""
    compiled: bool
    """Whether the step was `torch.compile`d (else eager)."""
    peak_gib: float
    """The step's measured peak GPU memory, in GiB (2**30 bytes)."""


# From the GPU session's logs (../shared/GPU.md, issue 24): torch 2.11, CUDA 13, 30,522-entry vocabulary.
MEASURED_GPU = (
    GpuMeasurement("H100 80GB HBM3", "2026-11-24", "bert_base", 256, 128, 20, True, 12.4),
    GpuMeasurement("H100 80GB HBM3", "2026-11-24", "bert_base", 256, 128, 20, False, 13.6),
    GpuMeasurement("H100 80GB HBM3", "2026-11-24", "bert_base", 32, 512, 80, True, 7.0),
)


class DoesNotFit(Verdict):
    """A micro-batch that cannot fit in a worker's memory (every rank reaches this verdict on the same budget)."""


@dataclass(frozen=True)
class MemoryConfig:
    """The memory per worker a micro-batch is checked against (`--memory-gb`; None: what the machine or GPU has
    free when the worker starts)."""

    budget_gb: float | None = None
    """Memory per worker that a micro-batch is checked against, in GiB (x `GIB`, 2**30 bytes, whatever the name
    says); None: what the machine or GPU has free when the worker starts."""

    def __post_init__(self) -> None:
        if self.budget_gb is not None and self.budget_gb <= 0:
            raise ValueError("--memory-gb must be > 0 (or left out: the free memory of the machine or GPU)")


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    """Bytes of the fp32 weights (4 per parameter)."""
    gradients: int
    """Bytes of the fp32 gradients (4 per parameter)."""
    optimizer: int
    """Bytes of the optimizer state: AdamW's or LAMB's two fp32 moments (8 per parameter)."""
    activations: int
    """Bytes autograd keeps for one micro-batch's backward, gradients in flight included; on CUDA also the static
    MLM path's logits and autocast's bf16 copies of the weights (the module's docstring has the formulas)."""
    runtime: int
    """Bytes of torch's own footprint per process (`RUNTIME_BYTES`: the library and allocator, or the CUDA
    context)."""

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.runtime

    def describe(self) -> str:
        return (f"{gib(self.total)} ({gib(self.weights + self.gradients + self.optimizer)} weights, gradients and "
                f"optimizer state, {gib(self.activations)} activations)")


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def activation_bytes(bert: BertConfig, micro_batch: int, seq_len: int, predictions: int) -> int:
    """What autograd saves for one micro-batch's backward (fp32, eager), in bytes: the formula above."""
    h, i, v, a, layers = (bert.hidden_size, bert.intermediate_size, bert.vocab_size, bert.num_attention_heads,
                          bert.num_hidden_layers)
    b, t, p = micro_batch, seq_len, predictions
    rows = p + 1  # the last layer's queries: [CLS] and the masked slots
    full = (layers - 1) * (b * t * (34 * h + 8 * i) + 9 * b * a * t * t)
    last = b * t * 18 * h + b * rows * (34 * h + 8 * i) + 9 * b * a * rows * t
    rest = b * t * 96 + 3 * b * p * h + 4 * v * h
    return full + last + rest


def gpu_activation_bytes(bert: BertConfig, micro_batch: int, seq_len: int, predictions: int,
                         compiled: bool = True) -> int:
    """What a bf16-autocast GPU step keeps for backward (the table above), gradients in flight included."""
    h, i, a, layers = bert.hidden_size, bert.intermediate_size, bert.num_attention_heads, bert.num_hidden_layers
    tokens, rows = micro_batch * seq_len, micro_batch * (predictions + 1)
    per_token = 24 * h + (2 if compiled else 4) * i + 4 * a
    full = (layers - 1) * tokens * per_token
    last = tokens * 10 * h + rows * (per_token - 10 * h)
    saved = full + last + tokens * 10 * h
    return int(saved * (1 + 1 / layers))


def estimate(bert: BertConfig, micro_batch: int, seq_len: int, predictions: int,
             device_type: str = "cpu", compiled: bool = True) -> MemoryEstimate:
    """The peak memory of a training step of `micro_batch` sequences of `seq_len` tokens (AdamW or LAMB, fp32
    state): CPU eager fp32, or (device_type "cuda") a bf16 autocast step, compiled unless `compiled` is False."""
    n = parameter_count(bert)
    if device_type == "cuda":
        act = gpu_activation_bytes(bert, micro_batch, seq_len, predictions, compiled)
        act += micro_batch * predictions * bert.vocab_size * (2 + 4 + 4)  # static-path logits, fp32 copy, gradient
        act += 2 * n  # autocast's bf16 copies of the weights, alive from forward to backward
    else:
        act = int(activation_bytes(bert, micro_batch, seq_len, predictions) * (1 + GRADIENTS_IN_FLIGHT))
    return MemoryEstimate(weights=4 * n, gradients=4 * n, optimizer=8 * n, activations=act,
                          runtime=RUNTIME_BYTES)


def available_bytes(device: torch.device, local_workers: int = 1) -> int:
    """Free memory one worker may use: the GPU's free memory, or the machine's available RAM (within the cgroup's
    limit, as in a container) shared by the workers on this machine."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(ram_available() / max(1, local_workers))


def gpu_free_bytes(gpus: int) -> int | None:
    """The smallest free memory of this machine's first `gpus` GPUs (one per worker), read without creating a CUDA
    context in this process (a context would hold ~0.5 GiB of the GPU for the job's lifetime): `nvidia-smi`, else a
    short child process. None when neither can tell (no GPU here)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            free = [int(float(x)) * 2**20 for x in out.stdout.split()]
            if len(free) >= gpus:
                return min(free[:gpus])
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    code = ("import torch,sys\nn=int(sys.argv[1])\nif torch.cuda.device_count()>=n:\n"
            "    print(min(torch.cuda.mem_get_info(i)[0] for i in range(n)))")
    try:
        out = subprocess.run([sys.executable, "-c", code, str(gpus)], capture_output=True, text=True, timeout=120)
        return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def peak_rss() -> int:
    """This process's peak resident set in bytes (VmHWM). Not getrusage's ru_maxrss: Linux keeps that across exec,
    so a child started from a large process reports its parent's size."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


@dataclass(frozen=True)
class Plan:
    micro_batch: int
    """Sequences a worker forwards at once: the requested one, else the largest divisor of its per-step batch that
    fits."""
    accum: int
    """Micro-batches per optimizer step (the per-rank batch / `micro_batch`), so the global batch is kept."""
    estimate: MemoryEstimate
    """The step's estimated peak at `micro_batch`."""
    budget: int
    """Bytes free per worker that the plan was made against (it uses `HEADROOM` of them)."""


def plan_micro_batch(bert: BertConfig, per_rank_batch: int, seq_len: int, predictions: int, budget: int,
         requested_micro: int | None = None, device_type: str = "cpu", model_name: str = "the model") -> Plan:
    """The largest micro-batch dividing `per_rank_batch` whose step fits in HEADROOM of `budget` (only
    `requested_micro` itself when the user fixed it); a ValueError naming the flag to change otherwise."""
    usable = int(budget * HEADROOM)

    def fits(micro: int) -> MemoryEstimate | None:
        est = estimate(bert, micro, seq_len, predictions, device_type)
        return est if est.total <= usable else None

    if requested_micro is not None:
        est = fits(requested_micro)
        if est is not None:
            return Plan(requested_micro, per_rank_batch // requested_micro, est, budget)
        best = _largest_fitting(per_rank_batch, fits)
        need = estimate(bert, requested_micro, seq_len, predictions, device_type)
        hint = (f"use --micro-batch-size {best} (gradient accumulation keeps --batch-size)" if best else
                _too_big_hint(model_name))
        raise DoesNotFit(f"--micro-batch-size {requested_micro} needs ~{need.describe()} per worker with {model_name} "
                         f"at {seq_len} tokens, but only {gib(usable)} of the {gib(budget)} free can be planned for: "
                         f"{hint}")
    best = _largest_fitting(per_rank_batch, fits)
    if best is None:
        need = estimate(bert, 1, seq_len, predictions, device_type)
        raise DoesNotFit(f"{model_name} needs ~{need.describe()} per worker even at a micro-batch of 1 sequence of "
                         f"{seq_len} tokens, but only {gib(usable)} of the {gib(budget)} free can be planned for: "
                         f"{_too_big_hint(model_name)}")
    return Plan(best, per_rank_batch // best, fits(best), budget)


def _largest_fitting(per_rank_batch: int, fits) -> int | None:
    divisors = sorted({d for k in range(1, math.isqrt(per_rank_batch) + 1) if per_rank_batch % k == 0
                       for d in (k, per_rank_batch // k)}, reverse=True)
    # Activations grow with the micro-batch, so the first that fits (from the largest) is the answer; a bisection
    # over ~10-40 divisors would save nothing measurable.
    return next((d for d in divisors if fits(d) is not None), None)


def _too_big_hint(model_name: str) -> str:
    return (f"use a smaller --preset than {model_name}, a GPU (--use-gpu), fewer --num-workers per machine, or "
            "--memory-gb if more memory is really free")


def check(bert: BertConfig, micro_batch: int, seq_len: int, predictions: int, budget: int,
          device_type: str = "cpu", per_rank_batch: int | None = None) -> MemoryEstimate:
    """At the start of `fit`: a ValueError when the micro-batch's step cannot fit in `budget` at all, naming the
    micro-batch that would (of those dividing `per_rank_batch`, the sequences a worker takes per step)."""
    est = estimate(bert, micro_batch, seq_len, predictions, device_type)
    if est.total > budget:
        fitting = _largest_fitting(per_rank_batch, lambda m: m if estimate(
            bert, m, seq_len, predictions, device_type).total <= int(budget * HEADROOM) else None) \
            if per_rank_batch else None
        hint = (f"use --micro-batch-size {fitting} (gradient accumulation keeps --batch-size)" if fitting else
                "lower --micro-batch-size")
        raise DoesNotFit(f"a micro-batch of {micro_batch} sequences of {seq_len} tokens needs ~{est.describe()} but "
                         f"this worker has {gib(budget)} free: {hint}, or give --memory-gb (the memory each worker "
                         "has) so that the job plans one")
    return est


def local_budget(use_gpu: bool, workers: int, budget_gb: float | None) -> int | None:
    """The memory each worker will have, as far as the job can tell before it starts them: the user's figure, else
    this machine's free memory when they run here (a local Ray, or this process): on CPUs its free RAM shared by
    its workers, on GPUs the smallest free memory of the GPUs they take (one each). None when they run elsewhere
    (a Ray cluster address) or no GPU answers (then each worker checks its own at its start)."""
    if budget_gb:
        return int(budget_gb * GIB)
    if os.environ.get("RAY_ADDRESS"):
        return None
    if use_gpu:
        return gpu_free_bytes(workers)
    return available_bytes(torch.device("cpu"), workers)


def micro_batch_for(bert: BertConfig, per_worker: tuple[int, int], width: int, max_predictions: int, *,
                    workers: int, use_gpu: bool, budget_gb: float | None, requested: int | None,
                    model_name: str) -> tuple[int, int]:
    """(micro-batch, accumulation) for `per_worker` (the micro-batch and accumulation `batch_geometry` gives one
    worker): `plan_micro_batch`'s for the memory the workers will have, as far as the job can tell before starting them
    (`local_budget`); the requested or whole per-worker batch when it cannot (each worker then checks its own at
    the start). The per-worker batch (micro-batch x accumulation) is kept."""
    micro, accum = per_worker
    batch = micro * accum
    if requested is not None and (requested < 1 or batch % requested):
        raise ValueError(f"--micro-batch-size {requested} must divide the {batch} sequences each worker gets per "
                         "step (--batch-size / --num-workers)")
    budget = local_budget(use_gpu, workers, budget_gb)
    if budget is None:
        return (requested, batch // requested) if requested else (micro, accum)
    chosen = plan_micro_batch(bert, batch, width, max_predictions, budget, requested, "cuda" if use_gpu else "cpu",
                              model_name)
    if chosen.micro_batch != (requested or batch):
        log.warning("a micro-batch of %d sequences of %d tokens would not fit in the %s free per worker: training "
                    "with micro-batches of %d and %d accumulation steps (the same --batch-size); set "
                    "--micro-batch-size to choose", requested or batch, width, gib(budget), chosen.micro_batch,
                    chosen.accum)
    return chosen.micro_batch, chosen.accum


def plan_for_workers(bert: BertConfig, batch_size: int, workers: tuple[int, int], width: int, max_predictions: int,
                     *, use_gpu: bool, budget_gb: float | None, requested: int | None,
                     model_name: str) -> tuple[int, int]:
    """A job's (micro-batch, accumulation) for a run on `workers` = (fewest, most) workers: `micro_batch_for` the
    fewest (the largest share of each step), with the memory each has when the fewest share this machine
    (docs/scaling.md: the plan is made for MIN; `--num-workers 1:99` must not read as a machine out of memory, since
    the most land on the cluster's other nodes, and each worker checks its own memory at its start). An elastic
    run's other world sizes take micro-batches no larger (`pretraining.loader.DataConfig.for_world`), so the plan
    holds for each of them."""
    fewest, most = workers
    geometry = batch_geometry(batch_size, fewest, requested, most)
    return micro_batch_for(bert, geometry, width, max_predictions, workers=fewest, use_gpu=use_gpu,
                           budget_gb=budget_gb, requested=geometry[0] if requested else None, model_name=model_name)
