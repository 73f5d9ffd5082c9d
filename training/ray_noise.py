"""Ray Train's lines that are noise in our jobs, filtered precisely: by the logger that emits them and the start of
the message, never a whole logger or a level, so a real warning from the same logger still shows. Standard library
only (the logger is named, Ray is not imported: `training.launch` is the one module of training that imports it).

- `Reporting training result N: TrainingReport(checkpoint=..., metrics={...})`: Ray Train logs every
  `ray.train.report` at INFO from each worker, the whole metrics dict, at every checkpoint. Our loop logs its own
  progress line and the checkpoint's path.

The other lines of issue 23 are handled where they arise: `SIGTERM handler is not set` (a ray.init from a thread) by
`cluster.ray_start`'s filter; the PreemptionWatcher's "constructor arguments in the object store" error line (a
C++ line, not a log record, of an actor that watches for cloud nodes being drained) by turning the watcher off on a
local one-node Ray (`training.launch`); the PlacementGroupCleaner's 30-line traceback "Found multiple active Ray
instances" at its cause: a local Ray's workers are told their cluster's address (`cluster.ray_start`).

- `Failed to get reserved resources ... it's safe to ignore this error` (and "Failed to send resource request"): Ray
  Train's elastic scaling policy, in its controller actor, logs a WARNING with a 20-line `GetTimeoutError`
  traceback whenever a 1 s call to its autoscaling coordinator times out on a busy machine (8 in one elastic run).
  `quiet_driver` drops them, traceback and all, from what the driver prints of its workers' lines; the actor's log
  file in Ray's session folder keeps them.
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any

from cluster.ray_start import drop_messages

SAFE_TO_IGNORE = "it's safe to ignore this error"
# What follows such a warning in the forwarded lines: its traceback (indented frames, chained exceptions and the
# exception's own line, e.g. "ray.exceptions.GetTimeoutError: Get timed out: ...").
_TRACEBACK = re.compile(r"^(\s|Traceback |During handling of|The above exception|[A-Za-z_][\w.]*(Error|Exception)\b"
                        r"|$)")


def quiet_train_worker() -> None:
    """In a Ray Train worker, before it reports."""
    # Ray names this logger after its file (`logging.getLogger(__file__)` in ray/train/v2/.../context.py).
    spec = importlib.util.find_spec("ray.train.v2._internal.execution.context")
    if spec is not None and spec.origin:
        drop_messages(spec.origin, "Reporting training result ")


def drop_safe_to_ignore(lines: list[str], skipping: bool = False) -> tuple[list[str], bool]:
    """``lines`` without Ray's warnings that say they are safe to ignore and the tracebacks logged under them; and
    whether the last line was still inside one (a traceback that goes on in the next batch of the same worker)."""
    out = []
    for line in lines:
        if SAFE_TO_IGNORE in line:
            skipping = True
        elif not (skipping and _TRACEBACK.match(line)):
            skipping = False
            out.append(line)
    return out, skipping


def quiet_driver(worker_module: Any) -> None:
    """In the driver, once Ray is up: wrap Ray's printer of its workers' lines (`ray._private.worker`, handed in:
    this module imports no Ray) so that `drop_safe_to_ignore`'s lines are not printed. Idempotent."""
    original = worker_module.print_worker_logs
    if getattr(original, "quiet", False):
        return
    inside: dict[Any, bool] = {}

    def print_worker_logs(data: dict, print_file: Any, ignore_prefix: bool = False) -> None:
        key = (data.get("pid"), data.get("is_err"))
        lines, inside[key] = drop_safe_to_ignore(list(data.get("lines") or []), inside.get(key, False))
        if lines:
            original({**data, "lines": lines}, print_file, ignore_prefix)

    print_worker_logs.quiet = True  # type: ignore[attr-defined]
    worker_module.print_worker_logs = print_worker_logs
