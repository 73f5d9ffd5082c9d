"""A build's inputs are part of its identity: a finished build whose inputs changed (size, etag or mtime) is refused,
never reported complete, on local files and on s3:// (a real S3-protocol server); an unfinished build that
committed nothing is started over with the corrected command."""
from __future__ import annotations

import gzip
import json
import os

import pytest

from corpus.create_instances import InstanceConfig
from corpus.readers import ReadOptions
from corpus.schema import read_manifest
from pipeline import BuildConfig, build
from pipeline.identity import input_changes
from storage.fs import filesystem_for


def moby_chapters(sample_dir, first: int, last: int) -> bytes:
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    return "".join(lines[first:last]).encode()


def config(inputs, output, sample_dir, **kw) -> BuildConfig:
    return BuildConfig(inputs=tuple(inputs), output=output, dupe_factor=1, num_shards=2,
                       vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10), **kw)


def test_an_edited_local_input_is_refused_naming_what_changed(tmp_path, sample_dir):
    corpus = tmp_path / "in" / "moby.jsonl"
    corpus.parent.mkdir()
    corpus.write_bytes(moby_chapters(sample_dir, 1, 4))
    cfg = config([str(corpus.parent)], str(tmp_path / "out"), sample_dir)
    first = build(cfg)
    assert build(cfg) == first  # unchanged: already complete

    corpus.write_bytes(moby_chapters(sample_dir, 1, 5))  # one chapter more
    with pytest.raises(ValueError, match=r"finished dataset built from other versions of the inputs \(.*moby\.jsonl:"
                                         r" size \d+ -> \d+.*left as it is.*another --output"):
        build(cfg)
    assert read_manifest(str(tmp_path / "out")) == first  # not replaced, not "complete"

    corpus.write_bytes(moby_chapters(sample_dir, 1, 4))  # the same bytes again, but a new mtime
    os.utime(corpus, (1_000_000_000, 1_000_000_000))
    with pytest.raises(ValueError, match=r"moby\.jsonl: mtime"):
        build(cfg)
    (corpus.parent / "more.jsonl").write_bytes(moby_chapters(sample_dir, 5, 6))
    with pytest.raises(ValueError, match=r"more\.jsonl added"):
        build(cfg)


def test_an_edited_s3_input_is_refused_naming_the_etag(s3_bucket, tmp_path, sample_dir):
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    endpoint, bucket = s3_bucket
    fs, _ = filesystem_for(f"s3://{bucket}", endpoint)
    original = moby_chapters(sample_dir, 1, 4)
    fs.pipe_file(f"{bucket}/corpus/moby.jsonl", original)
    cfg = config([f"s3://{bucket}/corpus/"], f"s3://{bucket}/datasets/moby", sample_dir, endpoint_url=endpoint)
    first = build(cfg)
    assert first.inputs[0]["etag"]
    assert build(cfg) == first

    edited = original.replace(b"whale", b"Whale")  # same size, other bytes: only the etag (and mtime) tell
    assert len(edited) == len(original) and edited != original
    fs.pipe_file(f"{bucket}/corpus/moby.jsonl", edited)
    with pytest.raises(ValueError, match=rf"s3://{bucket}/corpus/moby\.jsonl: etag \w+ -> \w+"):
        build(cfg)
    assert read_manifest(f"s3://{bucket}/datasets/moby", endpoint) == first


def test_an_unfinished_build_that_committed_nothing_starts_over_with_the_fixed_command(tmp_path, sample_dir):
    corpus = tmp_path / "moby.jsonl"
    rows = [json.loads(line) for line in moby_chapters(sample_dir, 1, 4).decode().splitlines()]
    corpus.write_text("".join(json.dumps({"body": r["text"]}) + "\n" for r in rows))
    cfg = config([str(corpus)], str(tmp_path / "out"), sample_dir)
    with pytest.raises(ValueError, match="--text-field"):
        build(cfg)
    assert (tmp_path / "out" / "_work" / "config.json").exists()
    fixed = config([str(corpus)], str(tmp_path / "out"), sample_dir, read=ReadOptions(text_field="body"))
    assert build(fixed).totals.documents == 3


def test_input_changes_lists_added_removed_and_changed_fields():
    old = [{"path": "a", "size": 1, "etag": "x", "mtime": "1"}, {"path": "b", "size": 2, "etag": None, "mtime": "2"}]
    new = [{"path": "a", "size": 1, "etag": "y", "mtime": "3"}, {"path": "c", "size": 2, "etag": None, "mtime": "2"}]
    assert input_changes(old, new) == ["c added", "b removed", "a: etag x -> y, mtime 1 -> 3"]
    assert input_changes(old, old) == []
