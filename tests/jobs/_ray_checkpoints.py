"""What Ray Train's controller has registered of a run's checkpoints, for the tests that remove a raylet mid-run."""
from __future__ import annotations

import json
import re
from pathlib import Path


def registered_step(root: Path) -> int:
    """The step of the latest checkpoint Ray Train's controller has registered (what a restarted group resumes from),
    read from the snapshot it writes beside the checkpoints; 0 while there is none. A checkpoint folder on disk is
    not enough: the worker writes it before the controller hears of it, and on a loaded machine the controller can
    lag several checkpoints behind."""
    for snapshot in root.glob("*/checkpoint_manager_snapshot.json"):
        try:
            latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result")
        except (OSError, ValueError):
            continue  # being rewritten
        if m := re.search(r"checkpoint-(\d+)", json.dumps(latest)):
            return int(m.group(1))
    return 0
