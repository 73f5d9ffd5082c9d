"""`torch.compile` for the training step: one static graph per batch shape, all compiled before step 1, optionally
replayed as CUDA graphs, and a fast restart from compiled artifacts kept where the operator trusts them.

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
- **Fast restart, from trusted places only.** Compiled artifacts are code: Inductor's caches hold pickles and
  generated modules that run when loaded, and `torch.compiler.load_cache_artifacts` writes files at the paths its
  input names. So nothing compiled is ever read from the checkpoint directory (shared storage that colleagues or a
  compromised job can write) and none is written there. A restart on the same node hits Inductor's own on-disk cache,
  which `private_inductor_cache` keeps in a folder of this user's (`TORCHINDUCTOR_CACHE_DIR` when the operator set
  it, else `~/.cache/bert-pretrain/inductor`, mode 0700; refused when another user owns it or can write it) instead
  of torch's default under the world-writable /tmp (which torch writes into TORCHINDUCTOR_CACHE_DIR itself once
  anything asks for its cache: that value is replaced, not taken for the operator's). A restart on another node
  compiles again, unless the operator names a shared folder they trust with `--compile-cache DIR`
  (`RuntimeConfig.compile_cache`): `torch.compiler.save_cache_artifacts()` (FX-graph and AOTAutograd caches, autotune
  results, Triton kernels) is written there after every checkpoint, one file per compile identity (`compile_key`:
  torch, device, backend, model, batch shapes), and hot-loaded before anything compiles. Dynamo still traces
  (seconds); code generation and kernel compilation become cache hits. A mismatch only costs a normal compile.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import stat
import time
from pathlib import Path

import torch
from torch import nn

from bert_core import BertConfig
from pretraining.batching import padded_width
from pretraining.config import RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.step import forward
from training.step import to_device

log = logging.getLogger(__name__)



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


def private_inductor_cache() -> Path:
    """The folder Inductor caches compiled code in for this process, made private to this user (see the module
    docstring): the operator's `TORCHINDUCTOR_CACHE_DIR`, else `~/.cache/bert-pretrain/inductor` (XDG_CACHE_HOME
    honoured), created mode 0700, checked (ours, not writable by anyone else), and set in the environment before
    anything compiles. torch itself sets `TORCHINDUCTOR_CACHE_DIR` to its /tmp default the first time anything asks
    for its cache folder (building a fused optimizer does): that value is torch's, not the operator's, and is
    replaced."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != _torch_default_cache():
        directory = Path(chosen)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _check_private(directory, "TORCHINDUCTOR_CACHE_DIR", tighten=False)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        directory = base / "bert-pretrain" / "inductor"
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _check_private(directory, "the compile cache", tighten=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    return directory


def _torch_default_cache() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def _check_private(directory: Path, what: str, tighten: bool) -> None:
    """Refuse a compile cache another user owns or can write (its contents run as code in this job); our own default
    folder, loosened by someone, is tightened back to 0700."""
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise ValueError(f"{what} {directory} belongs to uid {info.st_uid}, not to this user: its contents would run as"
                         " code in this job; remove it or set TORCHINDUCTOR_CACHE_DIR to a folder of yours")
    if stat.S_IMODE(info.st_mode) & 0o022:
        if not tighten:
            raise ValueError(f"{what} {directory} can be written by other users (mode "
                             f"{stat.S_IMODE(info.st_mode):o}): its contents would run as code in this job; chmod 700"
                             " it or set TORCHINDUCTOR_CACHE_DIR to a private folder")
        directory.chmod(0o700)
    elif tighten and stat.S_IMODE(info.st_mode) & 0o077:
        directory.chmod(0o700)


# BertConfig fields that name or describe a model without changing its graph (a checkpoint's config.json carries
# `architectures`, a fresh config does not: the same run must find its own artifacts after a resume).
_NOT_IN_THE_GRAPH = frozenset({"architectures", "initializer_range", "id2label", "label2id"})


def compile_key(runtime: RuntimeConfig, data: DataConfig, bert: BertConfig, device: torch.device) -> str:
    """What the compiled artifacts depend on: torch and its GPU stack, the device, the compile settings, the model
    and the batch shapes. One trusted-cache file per key, so runs of different shapes never overwrite each other."""
    what = {
        "torch": torch.__version__, "git": torch.version.git_version, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "backend": runtime.compile_backend, "cuda_graphs": runtime.cuda_graphs, "fused": runtime.fused_kernels,
        "low_precision_residual": runtime.low_precision_residual, "precision": runtime.precision,
        "model": {k: v for k, v in dataclasses.asdict(bert).items() if k not in _NOT_IN_THE_GRAPH},
        "micro_batch": data.micro_batch_size, "max_predictions": data.train.max_predictions,
        "widths": present_widths(data), "packing": data.packing,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def artifacts_path(trusted_dir: str | os.PathLike, key: str) -> Path:
    return Path(trusted_dir) / f"compile-{key}.bin"


def save_artifacts(trusted_dir: str | os.PathLike, key: str) -> Path | None:
    """Write this process's compiled artifacts (those it compiled and those it loaded) into the operator's trusted
    folder, atomically (a reader sees the previous file or this one). Returns the file, or None when there are none."""
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is None:
        return None
    path = artifacts_path(trusted_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(artifacts[0])
    tmp.replace(path)
    return path


def load_artifacts(trusted_dir: str | os.PathLike, key: str) -> bool:
    """Hot-load the compiled artifacts of `key` from the operator's trusted folder, if any; call before compiling
    anything. Never pass a folder that others can write: what is loaded runs as code."""
    path = artifacts_path(trusted_dir, key)
    if not path.is_file():
        log.info("no compiled artifacts at %s yet: compiling from scratch", path)
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as e:  # noqa: BLE001 (a stale cache only costs a normal compile)
        log.warning("could not load the compiled artifacts %s (%s): compiling from scratch", path, e)
        return False
    log.info("loaded compiled artifacts from %s: %s", path,
             {k: len(v) for k, v in info.artifacts.items()} if info is not None else "none")
    return True


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), for "time to first step" figures; None elsewhere."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
