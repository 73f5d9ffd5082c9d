"""jobs/train_tokenizer.py trains on the same seeded, bounded sample as a build without --vocab: same vocabulary."""
from __future__ import annotations

import gzip
import json

from corpus.create_instances import InstanceConfig
from jobs import train_tokenizer
from pipeline import BuildConfig, build

UNIT = 64 << 10


def _corpus(root, sample_dir):
    """Moby Dick and Austen as gzipped JSON Lines (real text, ~5 MB decompressed): both go through pieces."""
    root.mkdir()
    for name in ("mobydick", "austen"):
        raw = gzip.decompress((sample_dir / "corpus" / f"{name}.jsonl.gz").read_bytes())
        (root / f"{name}.jsonl.gz").write_bytes(gzip.compress(raw, compresslevel=1))
    return root


def test_train_tokenizer_job_uses_the_builds_sample(tmp_path, sample_dir, capsys):
    gz = _corpus(tmp_path / "gz", sample_dir)
    cfg = BuildConfig(inputs=(str(gz),), output=str(tmp_path / "ds"), vocab=None, vocab_size=300,
                      vocab_sample_bytes=300_000, unit_bytes=UNIT, dupe_factor=1, num_shards=2,
                      instances=InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, seed=3))
    m = build(cfg)
    assert m.vocab.trained and m.vocab.size == 300
    assert train_tokenizer.main(["--input", str(gz), "--output", str(tmp_path / "v.txt"), "--vocab-size", "300",
                                 "--sample-bytes", "300000", "--unit-bytes", str(UNIT), "--seed", "3"]) == 0
    assert (tmp_path / "v.txt").read_bytes() == (tmp_path / "ds" / "vocab.txt").read_bytes()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 300_000 <= out["sampled_bytes"] < 300_000 + UNIT and out["sampled_blocks"] == -(-300_000 // UNIT)


def test_the_vocabulary_job_has_its_own_run(tmp_path, sample_dir, mlflow_uri, capsys):
    from mlflow.tracking import MlflowClient

    assert train_tokenizer.main(["--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output",
                                 str(tmp_path / "v.txt"), "--vocab-size", "500", "--experiment", "vocab"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    client = MlflowClient(mlflow_uri)
    run = client.get_run(out["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "vocab v.txt"
    assert run.data.metrics["vocab_size"] == 500 and run.data.params["vocab-size"] == "500"
    assert run.data.tags["stage"] == "vocab" and "WordPiece vocabulary of 500 entries" in run.data.tags[
        "mlflow.note.content"]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "vocab")] == ["vocab/vocab.txt"]


def test_no_mlflow_logs_no_run(tmp_path, sample_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert train_tokenizer.main(["--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output",
                                 str(tmp_path / "v.txt"), "--vocab-size", "500", "--no-mlflow"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mlflow_run_id"] is None
    assert not (tmp_path / "mlruns").exists()
