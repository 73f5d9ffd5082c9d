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
"""
from __future__ import annotations

import importlib.util

from cluster.ray_start import drop_messages


def quiet_train_worker() -> None:
    """In a Ray Train worker, before it reports."""
    # Ray names this logger after its file (`logging.getLogger(__file__)` in ray/train/v2/.../context.py).
    spec = importlib.util.find_spec("ray.train.v2._internal.execution.context")
    if spec is not None and spec.origin:
        drop_messages(spec.origin, "Reporting training result ")
