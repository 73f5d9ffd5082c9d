"""Issue 30, item 15: the workflow's lock is a writer lease (workflows/state.py): taken exclusively, so a second
workflow on the same workdir is refused even from the same process (the PID file it replaces was written after a
check, and accepted its own pid), named in the refusal; released at the end; a workflow killed on this host taken
over at once."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage.lease import LeaseHeld
from workflows.state import acquire_lock

REPO = Path(__file__).resolve().parents[2]


def test_a_second_workflow_is_refused_even_from_this_process(tmp_path):
    first = acquire_lock(tmp_path)
    try:
        with pytest.raises(LeaseHeld, match=rf"^{tmp_path} is being written by another workflow \(host .*pid "):
            acquire_lock(tmp_path)
    finally:
        first.release()
    acquire_lock(tmp_path).release()  # free again


def test_a_killed_workflow_is_taken_over_at_once(tmp_path):
    code = ("from pathlib import Path; from workflows.state import acquire_lock;"
            f" acquire_lock(Path({str(tmp_path)!r})); print('held', flush=True); import time; time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid} "):
            acquire_lock(tmp_path)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        acquire_lock(tmp_path).release()
    finally:
        if holder.poll() is None:
            holder.kill()
