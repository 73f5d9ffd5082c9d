"""How big a model is and whether this machine can hold it, shared by both trainers: pre-training's memory check
(pretraining/memory.py: the whole step) and fine-tuning's bound on a model it is handed (a config.json fetched from
elsewhere can ask for any size: it is refused before anything is allocated, not found out by the OOM killer)."""
from __future__ import annotations

import os
from pathlib import Path

from bert_core.config import BertConfig

GIB = 2**30
STATE_BYTES_PER_PARAMETER = 16  # fp32 weights, gradients and AdamW's two moments
# torch's own footprint per process besides the model (CPU: the interpreter, the library, its thread pools and
# allocator arenas, ~300 MiB after import here, more once threads have run; CUDA: the context and kernels)
RUNTIME_BYTES = 512 * 2**20


def parameter_count(bert: BertConfig) -> int:
    """BertForPreTraining's parameters (the MLM decoder is tied to the word embeddings); a task head adds a few."""
    h, i, v = bert.hidden_size, bert.intermediate_size, bert.vocab_size
    embeddings = (v + bert.max_position_embeddings + bert.type_vocab_size) * h + 2 * h
    layer = 4 * h * h + 2 * h * i + 9 * h + i
    heads = (h * h + h) + (h * h + 3 * h) + v + (2 * h + 2)  # pooler, MLM transform + bias, NSP
    return embeddings + bert.num_hidden_layers * layer + heads


def ram_available() -> int:
    """The machine's available RAM, within this process's cgroup limit (a container's)."""
    free = _meminfo_available()
    limit = _cgroup_free()
    if limit is not None:
        free = min(free, limit) if free else limit
    return int(free)


def check_fits(bert: BertConfig, where: str, budget: int | None = None) -> int:
    """The bytes a training step needs for the model's state (weights, gradients, AdamW), refused (ValueError naming
    ``where``) when that alone exceeds ``budget`` (default: the RAM available here)."""
    need = STATE_BYTES_PER_PARAMETER * parameter_count(bert) + RUNTIME_BYTES
    budget = ram_available() if budget is None else budget
    if need > budget:
        raise ValueError(
            f"{where}: a model of {parameter_count(bert) / 1e6:,.0f}M parameters (hidden_size {bert.hidden_size}, "
            f"{bert.num_hidden_layers} layers, intermediate_size {bert.intermediate_size}, vocab_size "
            f"{bert.vocab_size}) needs ~{need / GIB:.1f} GiB for its weights, gradients and optimizer state, more "
            f"than the {budget / GIB:.1f} GiB free here; use a smaller model or a machine with more memory (a "
            "config.json from elsewhere can ask for any size)")
    return need


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _cgroup_free() -> int | None:
    """limit - usage of this process's cgroup (v2, else v1); None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, int(limit) - usage)
    return None
