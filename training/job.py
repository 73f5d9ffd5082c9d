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
   12. the run ended (FINISHED/FAILED/KILLED: Ctrl-C/SIGTERM, cluster.interrupt); the checkpoints removed when the
       job does not keep them

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

from cluster import interrupt
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
    """The run's MLflow params: the flags as given, the flattened config and what the job's checks found."""
    tags: Mapping[str, str]
    """The run's MLflow tags at its opening: the job, its data and where its weights came from."""
    parent_run_id: str | None = None
    """The MLflow run to nest this one under; None: a top-level run."""
    inputs: Any = None
    """What every worker is handed as `worker.inputs` (put in Ray's object store once); None when the loop reads its
    own data."""


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class JobParts:
    """One job's differences from the skeleton."""

    what: str
    """What holds the run's writer lease, as a second job that is refused is told: "pre-training run"."""
    fit: Callable
    """The trainer's loop, `fit(config, worker)`: handed in, since training imports neither trainer."""
    config: Any
    """The trainer's config, handed to `fit` on every worker."""
    launch: LaunchConfig
    """Where the workers run; its `name` is the run name, its `run_url` the checkpoint folder."""
    tracking_uri: str
    """The MLflow tracking store; checked reachable first (step 1)."""
    experiment: str
    """The MLflow experiment the run is opened in."""
    lineage: str
    """The name of the lineage file written beside the exported model (`training.export`)."""
    prepare: Callable[[], Prepared]
    """Step 3: the job's own checks and what they prepared (`Prepared`), before the lease is taken and the MLflow run
    opened."""
    destination: str | None = None
    """Where the model goes (a folder or a URL), checked writable at step 2; None: the MLflow artifact only."""
    resume: bool = False
    """A rerun with the same storage and run name continues the same MLflow run (found by its `bert.run_checkpoints`
    tag)."""
    keep_checkpoints: bool = True
    """False: the run's local checkpoint folder is removed at the end. True also tags the run with that folder, by
    which a rerun finds it (`resume`)."""
    log_inputs: Callable[[Run], None] = _nothing
    """Step 6: logs the run's dataset inputs into the opened run; default: nothing."""
    outcome: Callable[[Run, Path], Any] = _nothing
    """Step 8: what the final checkpoint says, read before the export; `diagnose` and `closing_tags` get it."""
    diagnose: Callable[[Run, Any], Collapse | None] = _nothing
    """Step 10: a `Collapse` found in the outcome (a WARNING and a `collapse` tag), or None."""
    closing_tags: Callable[[Any, Collapse | None], Mapping[str, str]] = field(default=lambda outcome, collapse: {})
    """Step 11: tags set from the outcome and the collapse as the run ends; default: none."""


@dataclass(frozen=True)
class Finished:
    run: Run
    """The job's MLflow run, ended."""
    checkpoints: str
    """The run's checkpoint folder (`LaunchConfig.run_url`; removed when not kept)."""
    outcome: Any
    """What `JobParts.outcome` read from the final checkpoint."""
    collapse: Collapse | None
    """What `JobParts.diagnose` found; None: no collapse."""


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
                        # Ctrl-C / SIGTERM: the loop stopped at a step boundary after a checkpoint; the run ends
                        # KILLED (no export), and the same command resumes from that checkpoint.
                        interrupt.raise_if_requested(f"stopped by {interrupt.requested()} after checkpoint "
                                                     f"{final.name} of {launch.run_url}")
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
