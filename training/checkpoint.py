"""Checkpoints: the model in the Hugging Face layout plus the train state, as safetensors + JSON (nothing to unpickle).

A checkpoint directory holds
    model/                      `save_pretrained` of the unwrapped model (config.json, model.safetensors, vocab.txt)
    train_state.safetensors     the optimizer's tensors (Adam/LAMB moments)
    train_state.json            param groups, scalar optimizer state, the scheduler, the step, the data position,
                                the RNG rule and the job's config (`dataclasses.asdict`, the one MLflow logs too)

Where checkpoints live is the caller's business: `LocalCheckpoints` keeps the last k in a local folder for
`pretraining.loop.fit` without Ray; the Ray wrapper hands the same folder to `ray.train.report` (local or S3 storage).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from pipeline.safe_io.redact import redact
from pipeline.safe_io.untrusted import read_local_bounded
from training.guard import model_and_optimizer_tensors, nonfinite_tensors

log = logging.getLogger(__name__)

TRAIN_STATE_TENSORS = "train_state.safetensors"
TRAIN_STATE_JSON = "train_state.json"
MODEL_DIR = "model"
PREFIX = "checkpoint-"
# train_state.json holds param groups, scalars and the config (KBs); a checkpoint folder may be anyone's, so a file
# past this is refused unread.
MAX_TRAIN_STATE_JSON_BYTES = 64 << 20


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def save_train_state(directory, optimizer: torch.optim.Optimizer, scheduler=None, extra: dict | None = None) -> None:
    """Write the optimizer's tensors to train_state.safetensors and everything else (param groups, scalar state,
    the scheduler, `extra` such as step / data position / RNG seeds) to train_state.json."""
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
    # URLs in the run's config lose their userinfo and signatures: a checkpoint is read by whoever shares its storage.
    (directory / TRAIN_STATE_JSON).write_text(json.dumps(redact(meta), indent=1, sort_keys=True, default=str))
    save_file(tensors, str(directory / TRAIN_STATE_TENSORS))


def load_train_state(directory, optimizer: torch.optim.Optimizer | None = None, scheduler=None) -> dict:
    """Restore what `save_train_state` wrote into `optimizer` / `scheduler` (on the optimizer's device); return the
    JSON (with `extra`'s keys at top level)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    meta = json.loads(read_local_bounded(directory / TRAIN_STATE_JSON, MAX_TRAIN_STATE_JSON_BYTES, "train state"))
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


def write_checkpoint(directory, model, optimizer, scheduler, extra: dict, vocab_text: str | None = None,
                     do_lower_case: bool = True) -> None:
    """Model (HF layout, with vocab.txt when given) + train state into `directory` (created). Refuses a model or
    optimizer holding a NaN or inf: no checkpoint (and so no export, a copy of one) is ever non-finite."""
    bad = nonfinite_tensors(model_and_optimizer_tensors(model, optimizer))
    if bad:
        raise RuntimeError(f"refusing to write checkpoint {directory}: NaN or inf in {', '.join(bad[:5])}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = None
    if vocab_text is not None:
        vocab = directory / "_vocab.txt"
        vocab.write_text(vocab_text)
    try:
        model.save_pretrained(directory / MODEL_DIR, vocab_file=vocab, do_lower_case=do_lower_case)
    finally:
        if vocab is not None:
            vocab.unlink()
    save_train_state(directory, optimizer, scheduler, extra=extra)


class LocalCheckpoints:
    """Checkpoints in a local folder, the last `keep` kept: what `pretraining.loop.fit` uses without Ray.

    A checkpoint is written under a temporary name and renamed into place, so a folder named checkpoint-N is
    always complete (a killed run leaves at most a stray temp folder, which is ignored and cleaned next time).
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3) -> None:
        self.directory, self.keep = Path(directory), keep

    def all(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob(f"{PREFIX}*") if (p / TRAIN_STATE_JSON).is_file())

    @contextmanager
    def latest(self) -> Iterator[Path | None]:
        found = self.all()
        yield found[-1] if found else None

    def save(self, step: int, metrics: dict, write) -> str | None:
        """`write(tmp_dir)` fills a new checkpoint; it becomes checkpoint-<step> atomically."""
        if write is None:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.directory))
        try:
            write(tmp)
            final = self.directory / checkpoint_name(step)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in self.all()[:-self.keep] if self.keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        for stray in self.directory.glob(".tmp-*"):
            shutil.rmtree(stray, ignore_errors=True)
        return str(final)
