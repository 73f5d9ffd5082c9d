"""A fine-tuning run is named `<task>-<data>-from-<parent>` by default (issue 44, item 5), so a pre-training's
"Used by" list tells its fine-tunings apart."""
from __future__ import annotations

import re

from jobs import finetune


def test_the_default_run_name_names_task_data_and_parent(tmp_path, sample_dir):
    export = tmp_path / "exports" / "phase1-db9059bb"
    a = finetune.parse_args(["--task", "classification", "--train", str(sample_dir / "tasks" / "rt_sentiment.jsonl.gz"),
                             "--split-eval-from-train", "0.1", "--init", "random", "--preset", "bert_tiny",
                             "--vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")])
    name = finetune.job_from(a).launch.name
    assert re.fullmatch(r"classification-rt_sentiment-from-random-bert_tiny-\d{4}-\d{6}", name), name
    assert finetune.data_name(f"s3://b/tasks/{export.name}/dev.conll.gz") == "dev"
