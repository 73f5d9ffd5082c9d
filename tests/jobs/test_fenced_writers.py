"""Fenced writers end to end (issue 30, items 1 and 8): the stalled-driver scenario (tests/jobs/fenced_scenario.py:
job 1 pre-trains on Ray, its driver is SIGSTOPped, job 2 takes the run over after the stale time) leaves no seed-1
checkpoint written after job 2 started, job 2 resumes from job 1's committed checkpoint and finishes, job 1 exits
non-zero with one line naming job 2, the MLflow run holds each step once; and a finished run rerun, on Ray with
--export and in this process with and without it, says it is complete and exits 0."""
from __future__ import annotations

import logging

import pytest
from fenced_scenario import scenario

pytestmark = pytest.mark.timeout(900)


def test_a_stalled_driver_is_fenced_and_a_finished_run_is_complete(tmp_path):
    verdict = scenario(tmp_path, stale=10.0)
    assert verdict["seed1_checkpoints_after_takeover"] == [], verdict
    assert verdict["job2_exit"] == 0 and verdict["seed2_checkpoints"], verdict
    assert verdict["job1_exit"] == 2, verdict
    assert "lost its writer lease to pre-training run on host" in verdict["job1_last_error"], verdict
    assert f"pid {verdict['job2_pid']} " in verdict["job1_last_error"], verdict
    assert verdict["mlflow"]["each_step_once"] and verdict["mlflow"]["status"] == "FINISHED", verdict
    assert verdict["rerun_exit"] == 0 and verdict["rerun_complete"], verdict
    assert verdict["ok"], verdict


def test_a_finished_run_in_this_process_is_complete(tiny_pretrain_data, tmp_path, caplog):
    from jobs import pretrain

    caplog.set_level(logging.INFO)
    flags = ["--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--max-steps", "20", "--batch-size", "8",
             "--threads", "1", "--storage", str(tmp_path / "runs"), "--run-name", "r", "--checkpoint-every", "20",
             "--log-every", "20", "--no-ray", "--mlflow-tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
             "--no-system-metrics"]
    assert pretrain.main(flags) == 0
    caplog.clear()
    assert pretrain.main(flags) == 0
    assert any("is already complete (step 20" in r.getMessage() for r in caplog.records)
    caplog.clear()
    assert pretrain.main([*flags, "--export", str(tmp_path / "export")]) == 0
    assert any("is already complete (step 20" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "export" / "config.json").is_file()
