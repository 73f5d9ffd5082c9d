"""End to end on a real S3-protocol server on loopback (moto): read from and write to s3://, and fail before any
work, naming the bucket or path, when the input, the bucket or the credentials are wrong."""
from __future__ import annotations

import gzip
import json

import pyarrow.parquet as pq
import pytest

from jobs.build_dataset import main
from pipeline.schema import read_manifest
from pipeline.storage import filesystem_for

ARGS = ["--dupe-factor", "2", "--num-shards", "3", "--max-seq-length", "64", "--max-predictions-per-seq", "10"]


def _corpus_bytes(n_docs=16):
    words = "apple river house music water garden silver winter".split()
    rows = [{"id": i, "text": " ".join(f"The {words[i % 8]} saw {i} ships on day {j}." for j in range(10))}
            for i in range(n_docs)]
    return gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())


@pytest.fixture
def s3_inputs(s3_bucket, sample_dir, tmp_path):
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    endpoint, bucket = s3_bucket
    fs, _ = filesystem_for(f"s3://{bucket}", endpoint)
    fs.pipe_file(f"{bucket}/corpus/part.jsonl.gz", _corpus_bytes())
    fs.pipe_file(f"{bucket}/vocab.txt", (sample_dir / "reference" / "bert-base-uncased-vocab.txt").read_bytes())
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "part.jsonl.gz").write_bytes(_corpus_bytes())
    return endpoint, bucket, fs


@pytest.mark.timeout(300)
def test_s3_in_s3_out_equals_local_build(ray_local, s3_inputs, tmp_path, sample_dir):
    endpoint, bucket, fs = s3_inputs
    out = f"s3://{bucket}/datasets/tiny"
    assert main(["--input", f"s3://{bucket}/corpus/", "--vocab", f"s3://{bucket}/vocab.txt", "--output", out,
                 "--endpoint-url", endpoint, *ARGS]) == 0
    m = read_manifest(out, endpoint)
    assert m["inputs"][0]["path"] == f"s3://{bucket}/corpus/part.jsonl.gz" and m["inputs"][0]["etag"]
    assert not fs.exists(f"{bucket}/datasets/tiny/_work") and fs.exists(f"{bucket}/datasets/tiny/vocab.txt")
    # The same files from a local folder give the same rows: ids come from names relative to the input folder.
    local = tmp_path / "local"
    assert main(["--input", str(tmp_path / "corpus"), "--vocab", str(sample_dir / "reference" /
                 "bert-base-uncased-vocab.txt"), "--output", str(local), "--no-ray", *ARGS]) == 0
    ml = read_manifest(str(local))
    assert ml["totals"] == m["totals"] and ml["shards"] == m["shards"]
    for s in m["shards"]:
        with fs.open(f"{bucket}/datasets/tiny/{s['file']}", "rb") as f:
            assert pq.read_table(f).equals(pq.read_table(local / s["file"]))


def test_missing_input_or_bucket_fails_before_work(s3_inputs, tmp_path):
    endpoint, bucket, fs = s3_inputs
    vocab = ["--vocab", f"s3://{bucket}/vocab.txt", "--endpoint-url", endpoint, "--no-ray", *ARGS]
    with pytest.raises(ValueError, match=f"s3://{bucket}/nope.*does not exist"):
        main(["--input", f"s3://{bucket}/nope.jsonl", "--output", str(tmp_path / "o"), *vocab])
    with pytest.raises(ValueError, match="no-such-bucket-42"):
        main(["--input", "s3://no-such-bucket-42/x.jsonl", "--output", str(tmp_path / "o"), *vocab])
    with pytest.raises(ValueError, match="cannot write output to s3://missing-out-bucket-7/ds .*bucket"):
        main(["--input", f"s3://{bucket}/corpus/", "--output", "s3://missing-out-bucket-7/ds", *vocab])
    assert not (tmp_path / "o").exists()
    assert fs.ls(bucket) == [f"{bucket}/corpus", f"{bucket}/vocab.txt"]  # nothing written


def test_missing_credentials_fail_before_work(s3_inputs, tmp_path, monkeypatch):
    import s3fs

    endpoint, bucket, _ = s3_inputs
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(ValueError, match=f"s3://{bucket}/corpus.*bucket '{bucket}'.*redential"):
            main(["--input", f"s3://{bucket}/corpus/", "--output", str(tmp_path / "o"), "--vocab",
                  f"s3://{bucket}/vocab.txt", "--endpoint-url", endpoint, "--no-ray", *ARGS])
        assert not (tmp_path / "o").exists()
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
