"""jobs/build_dataset.py end to end: faithfulness to the reference on Moby Dick (statistics from the Parquet
output), the MLflow run read back, strict flags, and jobs/train_tokenizer.py."""
from __future__ import annotations

import json

import pyarrow.dataset as pads
import pytest

from corpus.schema import read_manifest
from corpus.stats import instance_stats
from jobs import build_dataset, train_tokenizer


@pytest.mark.timeout(300)
def test_faithful_to_the_reference_on_moby_dick_and_logged_to_mlflow(tmp_path, sample_dir, mlflow_uri, capsys):
    from mlflow.tracking import MlflowClient

    ref_dir = sample_dir / "reference"
    out = tmp_path / "moby"
    rc = build_dataset.main([
        "--input", str(ref_dir / "mobydick.sentences.txt.gz"), "--presplit",
        "--vocab", str(ref_dir / "bert-base-uncased-vocab.txt"), "--output", str(out),
        "--dupe-factor", "5", "--seed", "12345", "--num-shards", "4", "--no-ray",
        "--mlflow-tracking-uri", mlflow_uri, "--experiment", "build-test"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    m = read_manifest(str(out))
    table = pads.dataset(list(m.shard_urls), format="parquet").to_table()
    got = instance_stats(table, mask_id=103, max_seq_length=128)
    ref = json.loads((ref_dir / "mobydick.reference_stats.json").read_text())["stats"]
    # The statistics against the reference's (mean of three seeds, a sampled pool) are checked in
    # tests/corpus/test_faithfulness.py; here the job's output, summary and MLflow run.
    assert abs(got["instances"] / ref["instances"] - 1) < 0.05, got
    for kind in ("mask", "same", "random"):
        assert abs(got["mask_kind_fraction"][kind] - ref["mask_kind_fraction"][kind]) < 0.01, (kind, got)
    assert m.instances == got["instances"] == summary["instances"]

    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["dupe_factor"] == "5" and run.data.params["read.presplit"] == "True"
    assert run.data.metrics["instances"] == got["instances"]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["manifest.json", "report"]


def test_unknown_and_bad_flags_fail(tmp_path):
    with pytest.raises(SystemExit):
        build_dataset.main(["--input", "x", "--output", str(tmp_path), "--dupe_factor", "5"])
    with pytest.raises(SystemExit):
        build_dataset.main(["--input", "x", "--output", str(tmp_path), "--on-error", "ignore"])
    with pytest.raises(SystemExit):  # no prefix matching: --dupe is not --dupe-factor
        build_dataset.main(["--input", "x", "--output", str(tmp_path), "--dupe", "5"])
    with pytest.raises(ValueError, match="dupe-factor"):
        build_dataset.main(["--input", "x", "--output", str(tmp_path), "--dupe-factor", "0"])


def test_train_tokenizer_job(tmp_path, sample_dir, capsys):
    out = tmp_path / "vocab.txt"
    assert train_tokenizer.main(["--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output", str(out),
                                 "--vocab-size", "2000"]) == 0
    tokens = out.read_text().split("\n")[:-1]
    assert len(tokens) == 2000 and tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "whale" in tokens and any(t.startswith("##") for t in tokens)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["vocab_size"] == 2000
