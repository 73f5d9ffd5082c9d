"""Checkpoints: the model in the Hugging Face layout plus the train state, as safetensors + JSON (nothing to unpickle).

A checkpoint directory holds
    model/                      `save_pretrained` of the unwrapped model (config.json, model.safetensors, vocab.txt)
    train_state.safetensors     the optimizer's tensors (Adam/LAMB moments)
    train_state.json            param groups, scalar optimizer state, the scheduler, the step, the data position,
                                the RNG rule and the job's config (`dataclasses.asdict`, the one MLflow logs too)

Where checkpoints live is the caller's business: `LocalCheckpoints` keeps the last k in a local folder for
`pretraining.loop.fit` without Ray; the Ray wrapper hands the same folder to `ray.train.report` (local or S3 storage).

Under a job's writer lease (storage/fence.py) a checkpoint counts only once committed: its writer adds its
name, step and digest (`checkpoint_digest`, every file's bytes) to the lease's record by a conditional write before it
puts the files in place (a rename, an upload). A run resumes only from a committed checkpoint whose
files still have that digest (`resumable`): a folder a stalled or cut-off job wrote after it lost the lease is never
resumed from, and neither is one such a job overwrote.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from storage.redact import redact
from storage.untrusted import read_local_bounded
from training.guard import model_and_optimizer_tensors, nonfinite_tensors

log = logging.getLogger(__name__)

TRAIN_STATE_TENSORS = "train_state.safetensors"
TRAIN_STATE_JSON = "train_state.json"
MODEL_DIR = "model"
PREFIX = "checkpoint-"
# train_state.json holds param groups, scalars and the config (KBs); a checkpoint folder may be anyone's, so a file
# past this is refused unread.
MAX_TRAIN_STATE_JSON_BYTES = 64 << 20


COMMITS = "checkpoints"  # the kind of entry checkpoints are committed as in the lease's record
_HASH_CHUNK = 8 << 20


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def checkpoint_digest(directory: str | os.PathLike) -> str:
    """``sha256:<hex>`` over every file of a checkpoint (relative name, size and bytes, in name order): what its
    commit records and a resume verifies. About a second per GB, once per checkpoint and once per resume."""
    root, total = Path(directory), hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                h.update(chunk)
        total.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0{h.hexdigest()}\n".encode())
    return "sha256:" + total.hexdigest()


def commit_entry(step: int, directory: str | os.PathLike) -> dict[str, Any]:
    return {"name": checkpoint_name(step), "step": step, "digest": checkpoint_digest(directory)}


def resumable(fence, written: dict[str, float]) -> list[tuple[str, str | None]]:
    """The checkpoints a run under ``fence`` may resume from, newest first, as (name, digest to verify or None):
    the committed ones among ``written`` (folder name -> when its files were written, by the store's clock), or, when
    nothing was ever committed under the lease, the folders older than the lease's first record (written by a
    version of this tool without commits). Anything else is named in a warning and left alone."""
    entries, legacy_before = fence.committed(COMMITS)
    if entries:
        chosen = [(e["name"], e.get("digest")) for e in sorted(entries, key=lambda e: e["step"], reverse=True)
                  if e["name"] in written]
        newest = max((e["step"] for e in entries), default=-1)
        ignored = sorted(n for n in written if n not in {e["name"] for e in entries} and _step(n) > newest)
    elif legacy_before is not None:
        chosen = [(n, None) for n in sorted(written, reverse=True) if written[n] <= legacy_before]
        ignored = sorted(n for n in written if written[n] > legacy_before)
    else:
        chosen, ignored = [], sorted(written)
    if ignored:
        log.warning("not resuming from %s: written without a commit under this run's writer lease (by a job that had"
                    " lost it, or was stopped before committing); left as it is", ", ".join(ignored))
    return chosen


def _step(name: str) -> int:
    try:
        return int(name.removeprefix(PREFIX))
    except ValueError:
        return -1


def first_verified(candidates: list[tuple[str, str | None]], directory_of: Callable[[str], Any]):
    """The name of the first candidate whose files have its committed digest (None: none has): ``directory_of(name)``
    is a context manager giving the checkpoint as a local directory."""
    for name, digest in candidates:
        with directory_of(name) as d:
            if digest is None or checkpoint_digest(d) == digest:
                return name
            log.warning("not resuming from %s: its files differ from what was committed (overwritten by a job that"
                        " had lost the run's writer lease?); trying an older one", name)
    return None


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


def _check_step(meta: dict, directory: Path) -> None:
    """The state's step is what its checkpoint was committed as: a whole number, the one its folder's name
    (``checkpoint-<step>``, the name a commit records) carries. A state planted or replaced in a folder (a step
    beyond --max-steps would make a rerun report the run complete) is refused naming the file."""
    if "step" not in meta:
        return
    step, where = meta["step"], directory / TRAIN_STATE_JSON
    if type(step) is not int or step < 0:
        raise ValueError(f"{where}: step {step!r} is not a whole number >= 0: not a train state this tool wrote;"
                         " delete that checkpoint folder to resume from the one before")
    named = directory.name.removeprefix(PREFIX)
    if directory.name.startswith(PREFIX) and named.isdigit() and int(named) != step:
        raise ValueError(f"{where}: step {step}, but the checkpoint was committed as {directory.name} (step "
                         f"{int(named)}): its state was replaced; delete that checkpoint folder to resume from the"
                         " one before")


def load_train_state(directory, optimizer: torch.optim.Optimizer | None = None, scheduler=None) -> dict:
    """Restore what `save_train_state` wrote into `optimizer` / `scheduler` (on the optimizer's device); return the
    JSON (with `extra`'s keys at top level)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    meta = json.loads(read_local_bounded(directory / TRAIN_STATE_JSON, MAX_TRAIN_STATE_JSON_BYTES, "train state"))
    _check_step(meta, directory)
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
    With a `fence` (the job's writer lease), each checkpoint is proved before and committed after (see above).
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, fence=None) -> None:
        self.directory, self.keep, self.fence = Path(directory), keep, fence

    def all(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob(f"{PREFIX}*") if (p / TRAIN_STATE_JSON).is_file())

    @contextmanager
    def latest(self) -> Iterator[Path | None]:
        found = self.all()
        if self.fence is None:
            yield found[-1] if found else None
            return
        written = {p.name: max(f.stat().st_mtime for f in p.rglob("*") if f.is_file()) for p in found}

        @contextmanager
        def local(name: str) -> Iterator[Path]:
            yield self.directory / name

        name = first_verified(resumable(self.fence, written), local)
        yield self.directory / name if name else None

    def save(self, step: int, metrics: dict, write) -> str | None:
        """`write(tmp_dir)` fills a new checkpoint; it becomes checkpoint-<step> atomically (and, with a fence,
        committed under the job's writer lease)."""
        if write is None:
            return None
        if self.fence is not None:
            self.fence.check(fresh=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.directory))
        committed = None
        try:
            write(tmp)
            if self.fence is not None:  # committed before it takes its name: a writer that cannot commit names nothing
                committed = self.fence.commit(COMMITS, commit_entry(step, tmp))
            final = self.directory / checkpoint_name(step)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = self.all()[:-self.keep] if self.keep > 0 else []
        if committed is not None:
            # Under a lease only what was committed counts: keep the last `keep` committed ones and remove what is
            # older than all of them; a newer folder that was never committed is not ours to remove.
            kept = sorted(e["step"] for e in committed)[-self.keep:]
            old = [p for p in self.all() if _step(p.name) < kept[0]]
        for path in old:
            shutil.rmtree(path, ignore_errors=True)
        for stray in self.directory.glob(".tmp-*"):
            shutil.rmtree(stray, ignore_errors=True)
        return str(final)

# ---- through Ray Train (the launcher's workers) --------------------------------------------------------------------
# The same contract as LocalCheckpoints. The launcher hands in Ray Train's module (``train``): this file imports no Ray,
# whose homes in training/ stay the launcher and its rendezvous.

class RayCheckpoints:
    """Checkpoints through Ray Train: it uploads them to the run's storage (local or S3) and keeps the last k. With
    a `fence`, rank 0 commits each checkpoint under the run's writer lease before uploading it; the verdict is
    broadcast, so every rank stops together (a rank left waiting in a collective would hang the group). `folder`:
    (pyarrow filesystem or None, path) of the run's folder, where a fenced resume looks for committed checkpoints."""

    def __init__(self, train: Any, fence=None, folder: tuple[Any, str] | None = None, keep: int = 3) -> None:
        self.train, self.fence, self.folder, self.keep = train, fence, folder, keep
        self.last: str | None = None  # the checkpoint resumed from or last committed (rank 0)
        # A committed checkpoint resumed from that Ray Train never registered (its worker died between the upload and
        # the report's registration): Ray's num_to_keep never prunes it, so rank 0 does, once `keep` newer exist.
        self.unregistered: list[str] = []
        self.saved: list[str] = []

    @contextmanager
    def latest(self) -> Iterator[Path | None]:
        """The latest checkpoint persisted (under a fence: the latest committed whose files are intact), the same
        on every rank: Ray updates `get_checkpoint()` after a report only on the rank that reported one (rank 0), so
        rank 0's choice is broadcast."""
        checkpoint = self._committed() if self.fence is not None else self.train.get_checkpoint()
        checkpoint = _from_rank0(checkpoint)
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as d:
            yield Path(d)

    def _committed(self):
        """Rank 0: the newest committed checkpoint in the run's folder that still has its committed digest."""
        if self.train.get_context().get_world_rank() != 0:
            return None
        fs, folder = self.folder
        fs = fs or _local_fs()
        written = _written(fs, folder)
        at = {name: self.train.Checkpoint(path=f"{folder}/{name}", filesystem=fs) for name in written}
        name = first_verified(resumable(self.fence, written), lambda n: at[n].as_directory())
        self.last = name
        registered = self.train.get_checkpoint()
        if name and (registered is None or Path(registered.path).name < name):  # names sort by step
            self.unregistered.append(name)
        return at[name] if name else None

    def save(self, step: int, metrics: dict[str, float], write: Callable[[Path], None] | None) -> str | None:
        tmp = Path(tempfile.mkdtemp(prefix=f"ckpt-{step:08d}-")) if write is not None else None
        try:
            if tmp is not None:
                write(tmp)
            # Committed (name, step, digest) before it is uploaded: a writer that cannot commit uploads nothing, and
            # one stopped mid-upload leaves files a resume finds differ from the digest (it takes an older one).
            entry = commit_entry(step, tmp) if self.fence is not None and tmp is not None else None
            _agree(lambda: self.fence.commit(COMMITS, entry) if entry is not None else None)
            self.train.report({"step": step, **metrics},
                             checkpoint=self.train.Checkpoint.from_directory(str(tmp)) if tmp else None,
                             checkpoint_dir_name=checkpoint_name(step))
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        if tmp is not None:
            self.last = checkpoint_name(step)
            self.saved.append(self.last)
            self._prune_unregistered()
        return checkpoint_name(step) if tmp is not None else None

    def _prune_unregistered(self) -> None:
        for name in [n for n in self.unregistered if sum(s > n for s in self.saved) >= self.keep]:
            fs, folder = self.folder
            try:
                (fs or _local_fs()).delete_dir(f"{folder}/{name}")
            except OSError as e:  # left in place: a folder too many, never a failed run
                log.warning("could not remove %s/%s, an old checkpoint Ray Train never registered: %s", folder, name,
                            e)
            self.unregistered.remove(name)


def _agree(action: Callable[[], Any]) -> None:
    """Run `action` (rank 0's proof or commit; a no-op elsewhere) and raise its LeaseLost on every rank."""
    from storage.lease_record import LeaseLost

    message = None
    try:
        action()
    except LeaseLost as e:
        message = str(e)
    message = _from_rank0(message)
    if message is not None:
        raise LeaseLost(message)


def _from_rank0(value: Any) -> Any:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        shared = [value]
        torch.distributed.broadcast_object_list(shared, src=0)
        return shared[0]
    return value


def _local_fs():
    import pyarrow.fs

    return pyarrow.fs.LocalFileSystem()


def _written(fs, folder: str) -> dict[str, float]:
    """The run's checkpoint folders -> when their train state was written (the store's clock)."""
    import pyarrow.fs

    try:
        entries = fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return {}
    names = [e.base_name for e in entries if e.type == pyarrow.fs.FileType.Directory and e.base_name.startswith(PREFIX)]
    paths = [f"{folder}/{n}/{TRAIN_STATE_JSON}" for n in names]
    infos = fs.get_file_info(paths)
    fsspec_fs = getattr(getattr(fs, "handler", None), "fs", None)  # S3 through fsspec: pyarrow gives no mtime
    written = {}
    for name, path, info in zip(names, paths, infos, strict=False):
        if info.type != pyarrow.fs.FileType.File:
            continue
        when = info.mtime
        if when is None and fsspec_fs is not None:
            when = fsspec_fs.info(path).get("LastModified")
        # A time we cannot read: a candidate if committed, never trusted as older than the lease.
        written[name] = when.timestamp() if when is not None else float("inf")
    return written
