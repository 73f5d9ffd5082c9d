"""The one place that knows how our parameter names differ from Hugging Face's, and how HF directories are laid out.

Differences handled here:
- our fused `attention.self.qkv` (3H x H) <-> HF's separate `attention.self.{query,key,value}`;
- the MLM decoder weight is tied to the word embeddings: never written (as HF 5 writes it), ignored when read;
  the decoder bias is `cls.predictions.bias` (older files also carry `cls.predictions.decoder.bias`);
- checkpoints with (`bert.embeddings...`) or without (`embeddings...`, e.g. sentence-transformers) the `bert.` prefix;
- old TF-converted files name LayerNorm parameters `gamma`/`beta`;
- non-persistent buffers some files carry (`embeddings.position_ids`).

Weights are read from `model.safetensors` (sharded too) only: a model directory may come from shared storage or a
colleague, and `pytorch_model.bin` is a pickle (even `torch.load(weights_only=True)`'s restricted unpickler has had
code-execution bugs, CVE-2025-32434), so it is refused with the one-line conversion to run where the file is trusted.
`config.json` is read only when small (`MAX_CONFIG_BYTES`, bert_core.config).
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

logger = logging.getLogger(__name__)

BASE_PREFIX = "bert."
BASE_ROOTS = ("embeddings.", "encoder.", "pooler.")
TIED_KEYS = ("cls.predictions.decoder.weight",)
_QKV = re.compile(r"^(.*attention\.self\.)qkv\.(weight|bias)$")
_SPLIT = re.compile(r"^(.*attention\.self\.)(query|key|value)\.(weight|bias)$")
_IGNORED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def to_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> HF key names, each tensor its own contiguous storage (safetensors refuses shared ones)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        key = key.replace("_orig_mod.", "")  # a torch.compile'd submodule nests its parameters under _orig_mod
        if key in TIED_KEYS:
            continue
        m = _QKV.match(key)
        if m:
            for name, part in zip(("query", "key", "value"), value.detach().chunk(3, dim=0), strict=False):
                out[f"{m.group(1)}{name}.{m.group(2)}"] = part.clone().contiguous()
        else:
            out[key] = value.detach().clone().contiguous()
    return out


def from_hf_state_dict(state_dict: dict[str, torch.Tensor], with_prefix: bool) -> dict[str, torch.Tensor]:
    """HF (or prefix-less) keys -> ours. `with_prefix`: the target keeps the encoder under `bert.` (head models)."""
    sd: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key.startswith(BASE_PREFIX):
            key = key[len(BASE_PREFIX):]
        if key.endswith(_IGNORED_BUFFERS) or key in TIED_KEYS:
            continue
        sd[key] = value
    if "cls.predictions.decoder.bias" in sd:
        bias = sd.pop("cls.predictions.decoder.bias")
        sd.setdefault("cls.predictions.bias", bias)
    # Fuse query/key/value into one qkv projection when all three are present.
    groups: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key in list(sd):
        m = _SPLIT.match(key)
        if m:
            groups.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = sd[key]
    for (stem, kind), parts in groups.items():
        if len(parts) == 3:
            for name in ("query", "key", "value"):
                del sd[f"{stem}{name}.{kind}"]
            sd[f"{stem}qkv.{kind}"] = torch.cat([parts["query"], parts["key"], parts["value"]], dim=0)
    if with_prefix:
        sd = {(BASE_PREFIX + k if k.startswith(BASE_ROOTS) else k): v for k, v in sd.items()}
    return sd


# ---- directories ---------------------------------------------------------------------------------------------------
def resolve_model_dir(path: str | Path) -> Path:
    """The directory holding config.json: `path` itself, or its `model/` (our pre-training checkpoints)."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    if (path / "model" / "config.json").is_file():
        return path / "model"
    if not path.exists():
        raise ValueError(f"{path} does not exist; pass a directory in HF layout (config.json + model.safetensors)")
    raise ValueError(f"{path} holds no config.json (nor model/config.json); expected an HF-layout model directory "
                     f"or a checkpoint directory with a model/ subfolder. "
                     f"Found: {sorted(p.name for p in path.iterdir())}")


MAX_INDEX_BYTES = 64 << 20  # a sharded model's index names each tensor once: a few MB for the largest models


def _index_shards(index: Path) -> list[str]:
    """The shard files an index names, each a plain file name beside it (the index may be anyone's: a name that
    leaves the folder, such as "../x" or "/etc/x", is refused)."""
    with open(index, "rb") as f:
        data = f.read(MAX_INDEX_BYTES + 1)
    if len(data) > MAX_INDEX_BYTES:
        raise ValueError(f"{index} is over {MAX_INDEX_BYTES} bytes: not a weight index")
    names = json.loads(data).get("weight_map", {}).values()
    bad = [n for n in names if not isinstance(n, str) or not n or "/" in n or "\\" in n or n in (".", "..")]
    if bad:
        raise ValueError(f"{index}: shard file {bad[0]!r} is not a file name beside the index; refusing to read it")
    return list(names)


def _refuse_pickle(path: Path) -> ValueError:
    return ValueError(
        f"{path}: pickled weights are not loaded (a pickle can run code); convert the folder to safetensors where you "
        "trust it, e.g. `python -c \"import transformers as t; t.BertForPreTraining.from_pretrained('DIR')"
        ".save_pretrained('OUT')\"` (transformers writes model.safetensors), and pass OUT")


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF directory: model.safetensors or sharded safetensors; pickled weights are refused."""
    if (model_dir / "model.safetensors").is_file():
        return load_file(model_dir / "model.safetensors")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        sd: dict[str, torch.Tensor] = {}
        for shard in sorted(set(_index_shards(index))):
            sd.update(load_file(model_dir / shard))
        return sd
    for name in ("pytorch_model.bin.index.json", "pytorch_model.bin"):
        if (model_dir / name).is_file():
            raise _refuse_pickle(model_dir / name)
    raise ValueError(f"{model_dir} has no weights: expected model.safetensors "
                     f"(found {sorted(p.name for p in model_dir.iterdir())})")


def save_weights(hf_state_dict: dict[str, torch.Tensor], path: Path) -> None:
    save_file(hf_state_dict, str(path), metadata={"format": "pt"})


@dataclass
class LoadingInfo:
    """What `from_pretrained` did with the checkpoint's keys (in our names)."""

    missing_keys: list[str] = field(default_factory=list)
    """Model keys the checkpoint did not fill, mismatched ones included (tied weights aside): they keep their
    fresh initialisation."""
    unexpected_keys: list[str] = field(default_factory=list)
    """Checkpoint keys the model has no place for (those the model declares ignorable aside)."""
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """(key, checkpoint shape, model shape) of the weights not loaded for their shape, e.g. a head with another
    ``num_labels``."""

    def as_dict(self) -> dict[str, list]:
        return {"missing_keys": self.missing_keys, "unexpected_keys": self.unexpected_keys,
                "mismatched_keys": self.mismatched_keys}


def match_state_dict(
    model_sd: dict[str, torch.Tensor],
    ckpt_sd: dict[str, torch.Tensor],
    ignore_mismatched_sizes: bool = False,
    ignore_unexpected: tuple[str, ...] = (),
) -> tuple[dict[str, torch.Tensor], LoadingInfo]:
    """Keys to load and a report. Shape mismatches raise unless `ignore_mismatched_sizes` (then they count as
    missing and keep their fresh init, e.g. a classifier with a different number of labels)."""
    info = LoadingInfo()
    to_load: dict[str, torch.Tensor] = {}
    for key, value in ckpt_sd.items():
        if key not in model_sd:
            if not key.startswith(ignore_unexpected):
                info.unexpected_keys.append(key)
            continue
        if tuple(value.shape) != tuple(model_sd[key].shape):
            info.mismatched_keys.append((key, tuple(value.shape), tuple(model_sd[key].shape)))
            continue
        to_load[key] = value
    if info.mismatched_keys and not ignore_mismatched_sizes:
        lines = "; ".join(f"{k}: checkpoint {c} vs model {m}" for k, c, m in info.mismatched_keys)
        raise ValueError(f"shape mismatch loading the checkpoint ({lines}). The config does not describe these "
                         "weights; if a task head differs on purpose (e.g. num_labels), pass "
                         "ignore_mismatched_sizes=True to re-initialise it")
    info.missing_keys = [k for k in model_sd if k not in to_load and k not in TIED_KEYS]
    return to_load, info
