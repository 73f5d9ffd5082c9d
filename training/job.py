"""The one skeleton of a training job: what `pretraining.pretrain_job` and `finetuning.finetune_job` both are, as one
sequence of steps, with the two jobs' differences handed in as a `JobParts`.

    1. the tracking store answers                          check_tracking_reachable
    2. the model's destination can be written              check_destination (a missing bucket fails now)
    3. the job's own checks and what it prepares           parts.prepare() -> Prepared (params, tags, parent, inputs)
    4. the run folder's writer lease                       launch.writer_lease (one job per storage and run name)
    5. the MLflow run: new, or the one a rerun continues   open_run (resume: by the run folder's tag)
    6. the run's dataset inputs                            parts.log_inputs(run)
    7. training                                            training.launch.run (Ray Train workers or this process)
    8. what the final checkpoint says                      parts.outcome(run, final checkpoint)
    9. export                                              export_model (the MLflow artifact, and the destination)
   10. collapse diagnosis                                  parts.diagnose(run, outcome) -> WARNING + `collapse` tag
   11. closing tags                                        parts.closing_tags(outcome, collapse)
   12. the run ended (FINISHED/FAILED/KILLED); the checkpoints removed when the job does not keep them

Where a run's checkpoints live is `LaunchConfig.run_url`, decided once in `training.launch`: the launcher writes
there, the run's `bert.run_checkpoints` tag names it (a rerun finds its MLflow run by it), the job reports it, and a
job that does not keep its checkpoints removes that folder.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracking.config import RunRef
from tracking.runs import Run, open_run
from tracking.store import check_tracking_reachable
from training import launch as launcher
from training.checkpoint import MODEL_DIR
from training.collapse import Collapse
from training.export import check_destination, export_model
from training.launch import LaunchConfig

log = logging.getLogger(__name__)

# The tag that names a run's checkpoint folder (`LaunchConfig.run_url`): a rerun of pre-training finds its MLflow run
# by it. Not the run name alone: two jobs with one --run-name and different --storage are two runs.
RUN_KEY_TAG = "bert.run_checkpoints"


@dataclass(frozen=True)
class Prepared:
    """What a job knows once its own checks have passed (step 3): the run's params and tags, its parent run, and
    what every worker is handed (`worker.inputs`; None when the loop reads its own data)."""

    params: Mapping[str, Any]
    tags: Mapping[str, str]
    parent_run_id: str | None = None
    inputs: Any = None


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class JobParts:
    """One job's differences from the skeleton."""

    what: str  # what holds the lease, said to a second job that is refused: "pre-training run"
    fit: Callable  # the trainer's loop: fit(config, worker)
    config: Any
    launch: LaunchConfig  # its `name` is the run name; `run_url` the checkpoint folder
    tracking_uri: str
    experiment: str
    lineage: str  # the lineage file written beside the exported model (training.export)
    prepare: Callable[[], Prepared]
    destination: str | None = None  # where the model goes (a folder or a URL); None: the MLflow artifact only
    resume: bool = False  # a rerun with the same storage and run name continues the same MLflow run
    keep_checkpoints: bool = True  # False: the run's local checkpoint folder is removed at the end
    log_inputs: Callable[[Run], None] = _nothing
    outcome: Callable[[Run, Path], Any] = _nothing  # read from the final checkpoint, before export
    diagnose: Callable[[Run, Any], Collapse | None] = _nothing
    closing_tags: Callable[[Any, Collapse | None], Mapping[str, str]] = field(default=lambda outcome, collapse: {})


@dataclass(frozen=True)
class Finished:
    run: Run
    checkpoints: str  # the run's checkpoint folder (`LaunchConfig.run_url`; removed when not kept)
    outcome: Any  # what `parts.outcome` read
    collapse: Collapse | None


def run_job(parts: JobParts) -> Finished:
    """The job, step by step (the module's docstring). A ValueError before any worker starts says what to fix."""
    launch = parts.launch
    check_tracking_reachable(parts.tracking_uri)  # 1
    if parts.destination:
        check_destination(parts.destination, launch.endpoint_url)  # 2
    ready = parts.prepare()  # 3
    tags = {**ready.tags, **({RUN_KEY_TAG: launch.run_url} if parts.keep_checkpoints else {})}
    try:
        # One job per run folder: the lease is held from before the run is looked up (a second job would find and
        # write into this job's MLflow run) until the run has ended.
        with launch.writer_lease(parts.what):  # 4
            try:
                run = open_run(parts.tracking_uri, parts.experiment, launch.name, params=ready.params, tags=tags,
                               parent_run_id=ready.parent_run_id,
                               resume_by=RUN_KEY_TAG if parts.resume else None)  # 5
                with run.ending():  # 12 (FINISHED when the block completes)
                    parts.log_inputs(run)  # 6
                    with launcher.run(parts.fit, parts.config, launch, inputs=ready.inputs,
                                      tracking=RunRef(parts.tracking_uri, run.run_id, launch.name)) as final:  # 7
                        outcome = parts.outcome(run, final)  # 8
                        export_model(final / MODEL_DIR, parts.destination, run, parts.lineage,
                                     launch.endpoint_url)  # 9
                    collapse = parts.diagnose(run, outcome)  # 10
                    if collapse is not None:
                        log.warning("%s", collapse.message)
                        run.set_tags({"collapse": collapse.figure})
                    closing = parts.closing_tags(outcome, collapse)  # 11
                    if closing:
                        run.set_tags(closing)
            finally:
                if not parts.keep_checkpoints:
                    _remove_checkpoints(launch)  # while the lease is held: the folder is the lease's
    finally:
        if not parts.keep_checkpoints:
            _remove_storage_folders(launch)
    return Finished(run, launch.run_url, outcome, collapse)


def _local(launch: LaunchConfig) -> bool:
    return "://" not in launch.storage or launch.storage.startswith("file://")


def _remove_checkpoints(launch: LaunchConfig) -> None:
    if _local(launch):
        shutil.rmtree(launch.local_directory, ignore_errors=True)


def _remove_storage_folders(launch: LaunchConfig) -> None:
    """The storage folder and its parent, when no other run uses them (a fine-tuning job's default storage is a
    folder of its own beside its output); after the lease, whose file lies in the storage folder, is released."""
    if _local(launch):
        launch.forget_writer_lease()  # released by now: the temporary run leaves nothing behind
        with contextlib.suppress(OSError):  # rmdir fails on a folder that is not empty: it is kept
            launch.local_directory.parent.rmdir()
            launch.local_directory.parent.parent.rmdir()
