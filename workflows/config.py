"""A workflow config: the YAML that names the stages and gives each its own job's flags (configs/*.yaml)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

TOP_KEYS = {"name", "workdir", "mlflow", "vocab", "datasets", "pretrain", "finetune"}


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config as a mapping, its shape checked (the sections themselves are checked when planned)."""
    cfg = yaml.safe_load(Path(path).read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a YAML mapping with keys {sorted(TOP_KEYS)}")
    unknown = set(cfg) - TOP_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown top-level keys {sorted(unknown)}; known: {sorted(TOP_KEYS)}")
    for key in ("datasets", "pretrain", "finetune"):
        if not isinstance(cfg.get(key) or {}, dict):
            raise ValueError(f"{path}: `{key}` must be a mapping of name -> stage")
    if not cfg.get("datasets") or not cfg.get("pretrain"):
        raise ValueError(f"{path}: needs at least one entry under `datasets` and one under `pretrain`")
    return cfg


def workdir_of(cfg: dict[str, Any], flag: str | None) -> Path:
    """--workdir, else the config's `workdir`, else runs/NAME: a local or shared-filesystem path."""
    workdir = flag or cfg.get("workdir") or f"runs/{cfg.get('name') or 'workflow'}"
    if "://" in workdir:
        raise ValueError(f"workdir {workdir}: must be a local or shared-filesystem path (exports and done-markers "
                         "live there); put datasets on object storage with `output_root`")
    return Path(workdir).resolve()
