"""Issue 30, item 11: a build checks its inputs' versions again at its commit. An input rewritten while the build
reads it (here: between two of its units' writes) leaves no manifest stamped with the old size over shards of
mixed bytes: the build is refused in one line naming the input and what to do, and nothing reads as a dataset."""
from __future__ import annotations

import gzip

import pytest

import pipeline.instances as instances
from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build


def test_an_input_rewritten_during_the_build_is_refused_at_commit(tmp_path, sample_dir, monkeypatch):
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    corpus = tmp_path / "moby.jsonl"
    corpus.write_text("".join(lines[1:4]))
    write_unit = instances.write_unit

    def rewritten(*args, **kwargs):  # someone appends a chapter while the build runs
        if corpus.stat().st_size == len("".join(lines[1:4]).encode()):
            corpus.write_text("".join(lines[1:5]))
        return write_unit(*args, **kwargs)

    monkeypatch.setattr(instances, "write_unit", rewritten)
    cfg = BuildConfig(inputs=(str(corpus),), output=str(tmp_path / "out"), dupe_factor=1, num_shards=2,
                      vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                      instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))
    with pytest.raises(ValueError, match=r"the inputs changed while this build read them \(.*moby\.jsonl: size "):
        build(cfg)
    assert not (tmp_path / "out" / "manifest.json").exists()
