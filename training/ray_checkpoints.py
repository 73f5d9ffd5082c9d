"""Checkpoints through Ray Train, beside ``training.checkpoint.LocalCheckpoints`` (the same ``Checkpoints``
contract, training/worker.py): Ray Train uploads each checkpoint to the run's storage (local or S3) and keeps the
last k; under the run's writer lease rank 0 commits each one before it is uploaded, and a resume takes the newest
committed checkpoint whose files still match their digest. One of Ray's homes in training/ (with the launcher and
its rendezvous): Ray is imported inside the methods, which run only in Ray Train workers."""
from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class RayCheckpoints:
    """Checkpoints through Ray Train: it uploads them to the run's storage (local or S3) and keeps the last k. With
    a `fence`, rank 0 commits each checkpoint under the run's writer lease before uploading it; the verdict is
    broadcast, so every rank stops together (a rank left waiting in a collective would hang the group). `folder`:
    (pyarrow filesystem or None, path) of the run's folder, where a fenced resume looks for committed checkpoints."""

    def __init__(self, fence=None, folder: tuple[Any, str] | None = None, keep: int = 3) -> None:
        self.fence, self.folder, self.keep = fence, folder, keep
        self.last: str | None = None  # the checkpoint resumed from or last committed (rank 0)
        # A committed checkpoint resumed from that Ray Train never registered (its worker died between the upload and
        # the report's registration): Ray's num_to_keep never prunes it, so rank 0 does, once `keep` newer exist.
        self.unregistered: list[str] = []
        self.saved: list[str] = []

    @contextlib.contextmanager
    def latest(self) -> Iterator[Path | None]:
        """The latest checkpoint persisted (under a fence: the latest committed whose files are intact), the same
        on every rank: Ray updates `get_checkpoint()` after a report only on the rank that reported one (rank 0), so
        rank 0's choice is broadcast."""
        import ray.train

        checkpoint = self._committed() if self.fence is not None else ray.train.get_checkpoint()
        checkpoint = _from_rank0(checkpoint)
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as d:
            yield Path(d)

    def _committed(self):
        """Rank 0: the newest committed checkpoint in the run's folder that still has its committed digest."""
        import ray.train

        from training.checkpoint import first_verified, resumable

        if ray.train.get_context().get_world_rank() != 0:
            return None
        fs, folder = self.folder
        fs = fs or _local_fs()
        written = _written(fs, folder)
        at = {name: ray.train.Checkpoint(path=f"{folder}/{name}", filesystem=fs) for name in written}
        name = first_verified(resumable(self.fence, written), lambda n: at[n].as_directory())
        self.last = name
        registered = ray.train.get_checkpoint()
        if name and (registered is None or Path(registered.path).name < name):  # names sort by step
            self.unregistered.append(name)
        return at[name] if name else None

    def save(self, step: int, metrics: dict[str, float], write: Callable[[Path], None] | None) -> str | None:
        import ray.train

        from training.checkpoint import COMMITS, checkpoint_name, commit_entry

        tmp = Path(tempfile.mkdtemp(prefix=f"ckpt-{step:08d}-")) if write is not None else None
        try:
            if tmp is not None:
                write(tmp)
            # Committed (name, step, digest) before it is uploaded: a writer that cannot commit uploads nothing, and
            # one stopped mid-upload leaves files a resume finds differ from the digest (it takes an older one).
            entry = commit_entry(step, tmp) if self.fence is not None and tmp is not None else None
            _agree(lambda: self.fence.commit(COMMITS, entry) if entry is not None else None)
            ray.train.report({"step": step, **metrics},
                             checkpoint=ray.train.Checkpoint.from_directory(str(tmp)) if tmp else None,
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
    import torch

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

    from training.checkpoint import PREFIX, TRAIN_STATE_JSON

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
