"""End to end on a real S3-protocol server on loopback (moto): read from and write to s3://, and fail before any
work, naming the bucket or path, when the input, the bucket or the credentials are wrong."""
from __future__ import annotations

import gzip
import json

import pyarrow.parquet as pq
import pytest

from jobs.build_dataset import main
from storage.fs import filesystem_for, read_json

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
    m = read_json(f"{out}/manifest.json", endpoint)  # the build's own record: inputs, totals
    assert m["inputs"][0]["path"] == f"s3://{bucket}/corpus/part.jsonl.gz" and m["inputs"][0]["etag"]
    assert not fs.exists(f"{bucket}/datasets/tiny/_work") and fs.exists(f"{bucket}/datasets/tiny/vocab.txt")
    # The same files from a local folder give the same rows: ids come from names relative to the input folder.
    local = tmp_path / "local"
    assert main(["--input", str(tmp_path / "corpus"), "--vocab", str(sample_dir / "reference" /
                 "bert-base-uncased-vocab.txt"), "--output", str(local), "--no-ray", *ARGS]) == 0
    ml = read_json(str(local / "manifest.json"))
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
    with pytest.raises(ValueError, match="cannot write to s3://missing-out-bucket-7/ds .*bucket"):
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


def _concurrent(monkeypatch, module, name):
    """Wrap module.name so that its first two calls must overlap: run one after another they break the barrier."""
    import threading

    real, barrier, calls = getattr(module, name), threading.Barrier(2, timeout=20), []

    def spy(*args, **kwargs):
        calls.append(args[0])
        if len(calls) <= 2:
            barrier.wait()
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, spy)
    return calls


def test_listing_probes_and_pieces_on_s3_run_in_parallel(s3_bucket, tmp_path, monkeypatch, sample_dir):
    import s3fs

    import pipeline.inputs.pieces as pieces_mod
    import storage.fs as storage_mod
    from corpus.readers import ReadOptions, read_unit
    from pipeline.inputs.pieces import PieceContext, piece_units, pieces_step, plan_pieces
    from storage.fs import expand_inputs

    s3fs.S3FileSystem.clear_instance_cache()
    endpoint, bucket = s3_bucket
    fs, _ = filesystem_for(f"s3://{bucket}", endpoint)
    small = {f"part-{k:03d}.txt.gz": gzip.compress(f"Document {k}.\n\n".encode() * (k + 1)) for k in range(40)}
    for name, data in small.items():
        fs.pipe_file(f"{bucket}/many/{name}", data)
    big = gzip.decompress((sample_dir / "reference" / "mobydick.sentences.txt.gz").read_bytes())
    fs.pipe_file(f"{bucket}/big/moby.txt.gz", gzip.compress(big, compresslevel=1))
    listed = _concurrent(monkeypatch, storage_mod, "_list_url")
    urls = [f"s3://{bucket}/many/{n}" for n in small] + [f"s3://{bucket}/big/*.gz"]
    files = expand_inputs(urls, endpoint)
    assert len(listed) == len(urls)  # one listing per URL, the first two at the same time
    assert [f.key for f in files] == ["moby.txt"] + [n[:-3] for n in small]  # keys without .gz
    assert {f.key: f.size for f in files[1:]} == {n[:-3]: len(d) for n, d in small.items()}
    assert all(f.etag for f in files)
    # Size probes (gzip trailers) also overlap; only the big file needs pieces.
    probed = _concurrent(monkeypatch, pieces_mod, "_decompressed_size")
    opts = ReadOptions(presplit=True)
    tasks = plan_pieces(files, opts, 64 << 10, endpoint)
    assert [t.key for t in tasks] == ["moby.txt"] and len(probed) == 40
    # The pieces go to _work on S3 and read back as the documents of the plain text.
    ctx = PieceContext(f"s3://{bucket}/out/_work", 64 << 10, opts, endpoint)
    marker = pieces_step(tasks[0], ctx)
    assert len(marker.pieces) > 10 and fs.exists(f"{bucket}/out/_work/pieces/00000.done.json")
    (tmp_path / "moby.txt").write_bytes(big)
    [plain] = expand_inputs([str(tmp_path / "moby.txt")])
    from corpus.readers import plan_units

    want = [(d.doc_id, d.lines) for u in plan_units([plain], opts, 64 << 10) for d in read_unit(u, opts)]
    got = [(d.doc_id, d.lines) for u in piece_units([marker], ctx) for d in read_unit(u, opts, endpoint)]
    assert got == want and len(got) > 100


def test_a_file_another_process_wrote_after_a_listing_is_read(s3_bucket):
    """The driver lists a folder (s3fs caches the listing), then a Ray worker writes a file in it (the trained
    vocabulary, a marker): the driver must see it. s3fs sizes a cat_file from that cache, so a stale listing read
    as 'not found' (a Ray build to S3 failed on its own _work/vocab.txt)."""
    import boto3

    from storage.fs import exists, list_names, read_bytes

    endpoint, bucket = s3_bucket
    folder = f"s3://{bucket}/work"
    fs, _ = filesystem_for(folder, endpoint)
    fs.pipe_file(f"{bucket}/work/first.txt", b"1")
    assert list_names(folder, endpoint) == ["first.txt"]
    fs.ls(f"{bucket}/work")  # the listing, cached in this process
    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket, Key="work/vocab.txt", Body=b"[PAD]\n")
    assert exists(f"{folder}/vocab.txt", endpoint)
    assert read_bytes(f"{folder}/vocab.txt", endpoint) == b"[PAD]\n"
