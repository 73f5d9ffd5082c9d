"""The workflow's state in its workdir: one done-marker per finished stage (WORKDIR/_workflow/<stage>.json, holding
the stage's fingerprint, command, outputs and result) and a lock against two workflows on one workdir."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.safe_io.untrusted import read_local_bounded
from workflows.stage import JobStage
from workflows.specs import SPECS

STATE_DIR = "_workflow"
MAX_STATE_BYTES = 16 << 20  # a done-marker holds a command, outputs and a result: KBs; a workdir may be shared


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


def acquire_lock(workdir: Path) -> Path:
    """WORKDIR/_workflow/lock with this process's id; refused while another live workflow holds it."""
    lock = workdir / STATE_DIR / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    if lock.is_file():
        text = read_local_bounded(lock, 64, "workflow lock").decode("ascii", "replace").strip()
        pid = int(text) if text.isdigit() else 0
        try:
            if pid and pid != os.getpid():
                os.kill(pid, 0)
                raise ValueError(f"another workflow (pid {pid}) is running on {workdir}; wait for it or stop it")
        except ProcessLookupError:
            pass  # a killed run's lock
    lock.write_text(f"{os.getpid()}\n")
    return lock
