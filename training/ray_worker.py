"""The one module of `training` that imports Ray: thin Ray Train worker functions around the Ray-free loops.

`pretrain_worker` hands `training.fit` this worker's rank, world size and device, DDP (`prepare_model`), Ray's
checkpoint hooks (resume from `get_checkpoint()`, save through `report(checkpoint=...)`, which every rank calls:
it is a barrier) and, for `--data-loader ray-data`, this worker's rows of the Ray Data shard. `finetune_worker`
does the same for fine-tuning's loop, which the job hands in (`{"fit": finetuning.loop.fit, ...}`: training never
imports finetuning). Jobs pass them to `TorchTrainer` with `{"config": ...}` as `train_loop_config`.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch

from training.checkpoint import checkpoint_name
from training.loop import Worker, fit

log = logging.getLogger(__name__)


class RayCheckpoints:
    """Checkpoints through Ray Train: it uploads them to the run's storage (local or S3) and keeps the last k."""

    @contextmanager
    def latest(self) -> Iterator[Path | None]:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as d:
            yield Path(d)

    def save(self, step: int, metrics: dict[str, float], write: Callable[[Path], None] | None) -> str | None:
        tmp = Path(tempfile.mkdtemp(prefix=f"ckpt-{step:08d}-")) if write is not None else None
        try:
            if tmp is not None:
                write(tmp)
            ray.train.report({"step": step, **metrics},
                             checkpoint=ray.train.Checkpoint.from_directory(str(tmp)) if tmp else None,
                             checkpoint_dir_name=checkpoint_name(step))
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        return checkpoint_name(step) if tmp is not None else None


def _dataset_rows(drop: int):
    """This worker's rows from Ray Data (`get_dataset_shard`), epoch after epoch, the first `drop` rows skipped.

    Train's DataConfig splits with `streaming_split(equal=True)`: every rank gets the same number of rows per epoch
    (Ray Data drops at most world_size - 1 rows of an epoch to make it so), and rows carry over epoch boundaries, so
    ranks stay equal. Which rows a rank gets depends on timing: a resumed run skips as many rows as were consumed,
    not the same rows (use the default loader for an exact replay).
    """
    from training.rows import Rows

    shard = ray.train.get_dataset_shard("train")
    while True:
        for table in shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
            rows = Rows.from_arrow(table)
            if drop >= len(rows):
                drop -= len(rows)
                continue
            yield rows.slice(drop, len(rows)) if drop else rows
            drop = 0


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def pretrain_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: `loop_config = {"config": PretrainConfig}`."""
    _setup_logging()
    config = loop_config["config"]
    ctx = ray.train.get_context()
    world = ctx.get_world_size()
    worker = Worker(rank=ctx.get_world_rank(), world_size=world, device=ray.train.torch.get_device(),
                    wrap=ray.train.torch.prepare_model if world > 1 else (lambda m: m),
                    checkpoints=RayCheckpoints(),
                    rows=_dataset_rows if config.data.loader == "ray-data" else None)
    fit(config, worker)


def finetune_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point of fine-tuning: `{"fit": the loop, "config": its config, "prepared_ref": ObjectRef}`;
    rank 0 reports the best epoch's model as the checkpoint."""
    finetune_fit = loop_config["fit"]
    _setup_logging()
    ctx = ray.train.get_context()

    def report(metrics: dict[str, float], checkpoint_dir: str | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.train.report(metrics, checkpoint=checkpoint)

    finetune_fit(loop_config["config"], ray.get(loop_config["prepared_ref"]), ctx.get_world_rank(),
                 ctx.get_world_size(), ray.train.torch.get_device(), report, ray.train.torch.prepare_model)
