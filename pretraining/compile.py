"""`torch.compile` for the training step: one static graph per batch shape, all compiled before step 1, optionally
replayed as CUDA graphs, and a fast restart from compiled artifacts kept beside the checkpoint.

- **Shapes.** `dynamic=False`: one graph per padded width (the loader's length buckets; one width when packing)
  instead of a symbolic-shape graph that would still recompile on specialised sizes. `precompile` runs forward +
  backward once per width *the data has* (`present_widths`: the dataset manifest's sequence lengths say which
  buckets a batch can land in), so no bucket stalls a measured window later and none is compiled for nothing.
- **CUDA graphs** (`RuntimeConfig.cuda_graphs`, off by default): `mode="reduce-overhead"`, so Inductor records
  each graph once and replays it, removing the host launch gaps (~2.3 ms of a ~51.5 ms BERT-base step on an H100,
  ../shared/GPU.md). The optimizer step stays outside (fused AdamW: a few launches). Off by default because it is
  unmeasured here and: torch's CUDA graph trees mis-accumulate gradients across micro-batches (pytorch#96693,
  #169545), so it refuses `accum > 1`; graph memory is held per recorded shape; DDP's bucketed all-reduce then
  splits the graph (DDPOptimizer), which we have not run. No effect on CPU.
- **Fast restart.** `torch.compiler.save_cache_artifacts()` (Inductor's FX-graph and AOTAutograd caches, autotune
  results, Triton kernels) is written beside every checkpoint as `compile_cache.bin` and hot-loaded by
  `load_artifacts` when a run resumes from it, before anything compiles: Dynamo still traces (seconds), but code
  generation and kernel compilation become cache hits, on this machine or any with the same torch, GPU and
  Triton. A mismatch only costs a normal compile.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch import nn

from pretraining.batching import padded_width
from pretraining.config import RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.step import forward
from training.step import to_device

log = logging.getLogger(__name__)

CACHE_FILE = "compile_cache.bin"


def present_widths(data: DataConfig) -> tuple[int, ...]:
    """The batch widths this run's data can produce: the packed width, or the length buckets that some sequence
    length of the dataset falls in (all buckets when the manifest has no length histogram)."""
    if data.packing:
        return (data.pack_width or data.train.max_seq_length,)
    if not data.train.seq_lengths:
        return data.length_buckets
    return tuple(sorted({padded_width(n, length_buckets=data.length_buckets) for n in data.train.seq_lengths}))


def compile_model(model: nn.Module, runtime: RuntimeConfig, data: DataConfig, device: torch.device) -> nn.Module:
    """The model compiled for training (see the module docstring for the choices)."""
    graphs = runtime.cuda_graphs and device.type == "cuda"
    if runtime.cuda_graphs and not graphs:
        log.info("--cuda-graphs has no effect on %s", device.type)
    if graphs and data.accum > 1:
        raise ValueError(f"--cuda-graphs with --accum {data.accum}: torch's CUDA graph trees mis-accumulate "
                         "gradients across micro-batches (pytorch#96693); use --accum 1 or --no-cuda-graphs")
    if graphs and runtime.compile_backend != "inductor":
        raise ValueError(f"--cuda-graphs needs --compile-backend inductor, got {runtime.compile_backend!r}")
    compiled = torch.compile(model, dynamic=False, backend=runtime.compile_backend,
                             mode="reduce-overhead" if graphs else None)
    # One graph per width and mode (train, and eval if the compiled module is ever evaluated): past Dynamo's cache
    # limit (8) it would silently fall back to eager.
    limit = torch._dynamo.config.cache_size_limit
    torch._dynamo.config.cache_size_limit = max(limit, 2 * len(data.length_buckets))
    if graphs:
        # A new step starts at every forward (accum is 1): the previous step's graph outputs may be reused.
        compiled.register_forward_pre_hook(lambda _module, _args: torch.compiler.cudagraph_mark_step_begin())
    return compiled


def synthetic_batch(data: DataConfig, width: int, vocab_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A micro-batch of the loader's exact shapes and dtypes at `width` (packed when the loader packs)."""
    b, p = data.micro_batch_size, data.train.max_predictions
    batch = {
        "input_ids": torch.randint(5, vocab_size, (b, width), generator=gen),
        "attention_mask": torch.ones(b, width, dtype=torch.int64),
        "token_type_ids": torch.zeros(b, width, dtype=torch.int64),
        "next_sentence_label": torch.zeros(b, dtype=torch.int64),
    }
    if data.packing:
        p, s = data.pack_geometry.slots, data.pack_geometry.sequences
        lengths = torch.full((b, s), width // s, dtype=torch.int64)
        batch.update(sequence_lengths=lengths, next_sentence_label=torch.zeros(b, s, dtype=torch.int64))
    batch["masked_lm_positions"] = (torch.arange(p) % (width - 1) + 1).expand(b, p).contiguous()
    batch["masked_lm_labels"] = torch.randint(5, vocab_size, (b, p), generator=gen)
    return batch


def precompile(model: nn.Module, data: DataConfig, vocab_size: int, device: torch.device,
               autocast_dtype: torch.dtype | None) -> tuple[int, ...]:
    """Run forward + backward once per width of `present_widths` on a synthetic batch, so the compiled model has
    all its graphs before the first real step; the gradients are dropped (no optimizer step, so the weights and
    the optimizer state are untouched, and dropout is re-seeded before every real step). Returns the widths."""
    g = torch.Generator().manual_seed(0)
    widths = present_widths(data)
    model.train()
    t0 = time.perf_counter()
    for width in widths:
        out = forward(model, to_device(synthetic_batch(data, width, vocab_size, g), device), autocast_dtype)
        (torch.nan_to_num(out.mlm_loss) + out.nsp_loss).backward()
    for param in model.parameters():
        param.grad = None
    log.info("compiled %d batch widths %s in %.1f s (of %d length buckets)", len(widths), list(widths),
             time.perf_counter() - t0, len(data.length_buckets))
    return widths


def save_artifacts(directory: Path) -> None:
    """Write this process's compiled artifacts (those it compiled and those it loaded) beside a checkpoint."""
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is not None:
        (Path(directory) / CACHE_FILE).write_bytes(artifacts[0])


def load_artifacts(checkpoint_dir: Path) -> bool:
    """Hot-load the compiled artifacts kept beside a checkpoint, if any; call before compiling anything."""
    path = Path(checkpoint_dir) / CACHE_FILE
    if not path.is_file():
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as e:  # noqa: BLE001 (a stale or foreign cache only costs a normal compile)
        log.warning("could not load the compiled artifacts %s (%s): compiling from scratch", path, e)
        return False
    log.info("loaded compiled artifacts from %s: %s", path,
             {k: len(v) for k, v in info.artifacts.items()} if info is not None else "none")
    return True


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), for "time to first step" figures; None elsewhere."""
    import os

    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
