"""The workflow's state in its workdir: one done-marker per finished stage (WORKDIR/_workflow/<stage>.json, holding
the stage's fingerprint, command, outputs and result) and a lock against two workflows on one workdir: a writer
lease."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from storage.lease import Lease
from storage.untrusted import read_local_bounded
from workflows.specs import SPECS
from workflows.stage import JobStage

STATE_DIR = "_workflow"
MAX_STATE_BYTES = 16 << 20  # a done-marker holds a command, outputs and a result: KBs; a workdir may be shared
LOCK = "writer.lease"  # not *.json: the folder's *.json are the done-markers


def marker_path(workdir: Path, stage: JobStage) -> Path:
    return workdir / STATE_DIR / f"{stage.key}.json"


def write_atomic(path: Path, text: str) -> None:
    """A marker is either absent or whole, whenever the workflow is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def finished(workdir: Path, stage: JobStage) -> dict[str, Any] | None:
    """The stage's done-marker when it matches the stage's fingerprint and the output is complete, else None."""
    path = marker_path(workdir, stage)
    if not path.is_file():
        return None
    try:
        marker = json.loads(read_local_bounded(path, MAX_STATE_BYTES, "workflow marker"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(marker, dict):
        return None
    if marker.get("fingerprint") != stage.fingerprint or not SPECS[stage.job].complete(stage):
        return None
    return marker


def acquire_lock(workdir: Path):
    """The workflow's writer lease (storage/lease.py) at WORKDIR/_workflow/writer.lease, held until
    ``release()``: one workflow per workdir, taken exclusively (not a PID file written after a check), a killed
    workflow on this host taken over at once, one elsewhere after the lease's stale time; refused (LeaseHeld, a
    ValueError naming the holder) while another live workflow holds it."""
    path = workdir.resolve() / STATE_DIR / LOCK
    return Lease(str(path), str(workdir.resolve()), "workflow",
                 hint="or give this workflow another --workdir").acquire()
