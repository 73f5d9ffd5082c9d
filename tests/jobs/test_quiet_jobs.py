"""Quiet jobs: a pre-training job on Ray, with another Ray running on the machine, prints none of Ray's noise of
issue 23 (the TrainingReport dumps, the PreemptionWatcher error line, "SIGTERM handler is not set", the
PlacementGroupCleaner's "multiple active Ray instances" traceback), and the filters drop only those messages."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.ray_start import DropMessages, drop_messages

REPO = Path(__file__).resolve().parents[2]
NOISE = ("TrainingReport(", "PreemptionWatcher", "SIGTERM handler is not set", "multiple active Ray instances")


def test_a_filter_drops_its_message_and_nothing_else(caplog):
    drop_messages("tests.quiet.ray", "SIGTERM handler is not set")
    log = logging.getLogger("tests.quiet.ray")
    with caplog.at_level(logging.INFO, logger="tests.quiet.ray"):
        log.warning("SIGTERM handler is not set because current thread is not the main thread.")
        log.warning("a real warning from the same logger")
    assert [r.getMessage() for r in caplog.records] == ["a real warning from the same logger"]
    drop_messages("tests.quiet.ray", "SIGTERM handler is not set")  # installed once, however often asked
    assert sum(isinstance(f, DropMessages) for f in log.filters) == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_ray_training_job_prints_none_of_rays_noise(tiny_pretrain_data, ray_tmpdir, tmp_path):
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": ray_tmpdir}  # short: socket paths
    env.pop("RAY_ADDRESS", None)
    # Another Ray on this machine (another user's, another job's): what made the state API find several.
    other = subprocess.Popen([sys.executable, "-c", "import ray, time; ray.init(address='local', num_cpus=1, "
                              "include_dashboard=False, _node_ip_address='127.0.0.1'); print('up', flush=True); "
                              "time.sleep(900)"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, start_new_session=True)
    try:
        assert other.stdout.readline().strip() == "up"
        out = subprocess.run([sys.executable, str(REPO / "jobs" / "pretrain.py"), "--data", tiny_pretrain_data["train"],
                              "--preset", "bert_tiny", "--max-steps", "6", "--batch-size", "8", "--checkpoint-every",
                              "2", "--log-every", "2", "--storage", str(tmp_path / "runs"), "--run-name", "quiet",
                              "--cpus-per-worker", "1", "--no-system-metrics"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=800)
    finally:
        os.killpg(other.pid, 15)
        other.wait(60)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "step 6/6 (100.0%)" in text  # the job's own progress lines still show
    assert [n for n in NOISE if n in text] == [], text[-6000:]
