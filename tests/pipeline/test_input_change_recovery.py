"""Issue 43, item 9, written as the attack: after "the inputs changed while this build read them", the advice (delete
_work and rerun once the inputs stay put) is followed, and it works. Before: the refused build had left shards/ and
vocab.txt in the output, so the rerun was refused ("already holds shards but no manifest").

The input is really rewritten during the build: between its read pass and its commit (the driver's listing of the
inputs at the commit is where the rewrite is done, just before it looks)."""
from __future__ import annotations

import gzip
import re
import shutil

import pytest

import pipeline.driver as driver
from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build


def test_the_advice_after_an_input_changed_during_the_build_works_when_followed(tmp_path, sample_dir, monkeypatch):
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    corpus = tmp_path / "moby.jsonl"
    corpus.write_text("".join(lines[1:4]))
    real = driver.expand_inputs

    def listed_at_commit(urls, *args, **kwargs):  # someone appends a chapter while the build runs
        corpus.write_text("".join(lines[1:5]))
        return real(urls, *args, **kwargs)

    monkeypatch.setattr(driver, "expand_inputs", listed_at_commit)
    out = tmp_path / "out"
    cfg = BuildConfig(inputs=(str(corpus),), output=str(out), dupe_factor=1, num_shards=2,
                      vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                      instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))
    with pytest.raises(ValueError, match=r"the inputs changed while this build read them") as refused:
        build(cfg)
    monkeypatch.undo()  # the inputs stay put from now on
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("_")) == []  # no shards/, no vocab.txt
    work = re.search(r"delete (\S+) and rerun", str(refused.value)).group(1)
    shutil.rmtree(work)  # the advice, followed
    manifest = build(cfg)
    assert (out / "manifest.json").exists() and manifest.totals.documents == 4
