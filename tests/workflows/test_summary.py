"""The workflow's summary tells what the numbers alone hide: a stage stopped by its time budget (with its step
count), a collapsed model, and the MLflow link in the model-training view."""
from __future__ import annotations

from pathlib import Path

from workflows.stage import JobStage
from workflows.summary import summary_lines


def test_a_budget_stop_and_a_collapse_are_said(tmp_path, mlflow_uri):
    stages = [JobStage("pretrain phase1", "pretrain", [], [], "f" * 16, {"export": "/x/export"}),
              JobStage("finetune rt", "finetune", [], [], "e" * 16, {"model": "/x/model"})]
    results = {
        "pretrain phase1": {"metrics": {"eval_mlm_accuracy": 0.07, "sequences_per_second": 69.4},
                            "result": {"stopped": "--max-minutes at step 400 of 1500",
                                       "slowed": "the machine is busy (load 6.2 on 2 cores): this process got 31% "
                                                 "of its 2 CPUs"}},
        "finetune rt": {"metrics": {"accuracy": 0.504, "majority_share": 0.504},
                        "result": {"collapse": "collapsed model: predicts one class for 100.0% of the evaluation "
                                               "set; try a higher --lr"}},
    }
    text = "\n".join(summary_lines("quickstart", stages, results, {"pretrain phase1": True, "finetune rt": True},
                                   Path(tmp_path), mlflow_uri, "quickstart", "p" * 32, 300.0))
    assert "STOPPED EARLY: by --max-minutes at step 400 of 1500" in text
    assert "WARNING: collapsed model: predicts one class for 100.0%" in text
    assert "SLOW: the machine is busy (load 6.2 on 2 cores): this process got 31% of its 2 CPUs" in text
    assert "sequences_per_second 69.4" in text
    assert f"jobs/mlflow_ui.py --store {mlflow_uri} --port 5000" in text and "http://127.0.0.1:5000" in text
