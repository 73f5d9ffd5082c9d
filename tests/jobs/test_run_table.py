"""A clean run table (issue 44, item 5): a no-op rerun of a finished build logs no new MLflow run (the job answers
with the id of the run that built the dataset); a mistake caught before any work leaves no run
(tests/jobs/test_build_answers.py checks that for each of its cases)."""
from __future__ import annotations

import gzip
import json

from jobs import build_dataset


def test_a_noop_rerun_logs_no_new_run(tmp_path, sample_dir, capsys, mlflow_uri):
    from mlflow.tracking import MlflowClient

    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f][1:6]
    corpus = tmp_path / "moby.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    argv = ["--input", str(corpus), "--output", str(tmp_path / "ds"), "--vocab",
            str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), "--max-seq-length", "64",
            "--dupe-factor", "1", "--num-shards", "1", "--no-ray", "--mlflow-tracking-uri", mlflow_uri,
            "--experiment", "table"]
    ids = []
    for _ in range(2):
        assert build_dataset.main(argv) == 0
        ids.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mlflow_run_id"])
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("table").experiment_id])
    assert [r.info.run_id for r in runs] == [ids[0]]  # one run: the build's; the rerun answered with its id
    assert ids[1] == ids[0] and runs[0].data.tags["dataset.result"] == "built"
