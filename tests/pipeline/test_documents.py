"""Any Ray Dataset of documents as the build's input: the records of a shared corpus file as a Dataset give that
file's shards byte for byte, a user's filter changes exactly the documents it drops, and such a build has an
identity (changed documents are refused, never reported complete) and resumes like a file build."""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.instances
from corpus.create_instances import InstanceConfig
from jobs import build_dataset
from pipeline import BuildConfig, build
from pipeline.executor import LocalExecutor

# A shared corpus file (../shared/data/corpora holds the same bytes), bundled so that a fresh clone has it.
CORPUS = str(Path(__file__).resolve().parents[2] / "data" / "sample" / "corpus" / "mobydick.jsonl.gz")


def _records(path=CORPUS) -> list[dict]:
    """The file's records as they are: ``{"id", "text"}`` (a build of the file names its documents by their id)."""
    return [json.loads(line) for line in gzip.open(path, "rb")]


def _cfg(tmp_path, name, vocab, **kw):
    return BuildConfig(inputs=(), output=str(tmp_path / name), vocab=vocab, dupe_factor=1, num_shards=3,
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10), **kw)


def _shards(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    return m, [open(os.path.join(out, s["file"]), "rb").read() for s in m["shards"]]


@pytest.fixture
def vocab(sample_dir):
    return str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")


@pytest.mark.timeout(600)
def test_a_dataset_of_a_files_records_and_the_file_as_input_give_the_same_shards(ray_local, tmp_path, vocab):
    from pipeline.ray_data import RayDataExecutor

    assert build_dataset.main(["--input", CORPUS, "--output", str(tmp_path / "file"), "--vocab", vocab,
                               "--dupe-factor", "1", "--num-shards", "3", "--max-seq-length", "64",
                               "--max-predictions-per-seq", "10", "--no-ray"]) == 0
    records = _records()
    random.Random(0).shuffle(records)  # a Dataset has no order: the build fixes its own
    ds = ray_local.data.from_items(records)
    build(_cfg(tmp_path, "ds", vocab), RayDataExecutor(num_cpus=2), documents=ds)
    (mf, file_shards), (md, ds_shards) = _shards(tmp_path / "file"), _shards(tmp_path / "ds")
    assert file_shards == ds_shards and mf["totals"] == md["totals"] and mf["totals"]["documents"] == 135
    assert md["inputs"][0]["path"] == "ray.data.Dataset" and md["inputs"][0]["documents"] == 135

    # The same records as a Parquet dataset read by Ray Data (two files, another order): the same shards.
    (tmp_path / "lake").mkdir()
    for k in range(2):
        pq.write_table(pa.Table.from_pylist(records[k::2]), tmp_path / "lake" / f"part-{k}.parquet")
    build(_cfg(tmp_path, "parquet", vocab), RayDataExecutor(num_cpus=2),
          documents=ray_local.data.read_parquet(str(tmp_path / "lake")))
    assert _shards(tmp_path / "parquet")[1] == file_shards

    # A user's own step before the build (a length filter, as curation pipelines run): exactly the documents it
    # drops are gone, the rest are built as if the corpus had only them.
    keep = [r for r in records if len(r["text"]) > 8000]
    assert 20 < len(keep) < len(records)
    build(_cfg(tmp_path, "filtered", vocab), RayDataExecutor(num_cpus=2),
          documents=ds.filter(lambda r: len(r["text"]) > 8000))
    build(_cfg(tmp_path, "kept", vocab), LocalExecutor(), documents=ray_local.data.from_items(keep))
    (mfil, fil), (mk, kept) = _shards(tmp_path / "filtered"), _shards(tmp_path / "kept")
    assert fil == kept and mfil["totals"] == mk["totals"] and mfil["totals"]["documents"] == len(keep)
    assert fil != ds_shards and mfil["inputs"][0]["etag"] != md["inputs"][0]["etag"]


@pytest.mark.timeout(600)
def test_a_dataset_build_resumes_and_refuses_changed_documents(ray_local, tmp_path, vocab, monkeypatch):
    records = _records()
    ds = ray_local.data.from_items(records)
    # ~19 units of 64 KiB: the failure below comes after some units have committed.
    cfg = _cfg(tmp_path, "out", vocab, unit_bytes=64 << 10)
    build(dataclasses.replace(cfg, output=str(tmp_path / "clean")), documents=ds)
    real, calls, fail_at = pipeline.instances.write_unit, [], [3]

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == fail_at[0]:
            raise RuntimeError("injected failure")
        return real(*a, **k)
    monkeypatch.setattr(pipeline.instances, "write_unit", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        build(cfg, documents=ds)
    changed = ray_local.data.from_items(records[:-1])
    with pytest.raises(ValueError, match="unfinished build with other versions of the inputs.*ray.data.Dataset"):
        build(cfg, documents=changed)
    calls.clear()
    fail_at[0] = None
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    build(cfg, documents=ray_local.data.from_items(shuffled))  # the same documents, in another order: resumed
    (mc, clean), (mo, out) = _shards(tmp_path / "clean"), _shards(tmp_path / "out")
    assert out == clean and mo["totals"] == mc["totals"]
    units = -(-mc["inputs"][0]["size"] // (64 << 10))
    assert units > 4 and len(calls) == units - 2  # the two units committed before the failure are not redone
    with pytest.raises(ValueError, match="finished dataset built from other versions of the inputs"):
        build(cfg, documents=changed)
    again = build(cfg, documents=ds)  # the same documents: already complete, nothing rebuilt
    assert again.config_hash == mo["config_hash"] and again.build_seconds == mo["build_seconds"]


def test_a_dataset_without_the_columns_is_refused_naming_them(ray_local, tmp_path, vocab):
    ds = ray_local.data.from_items([{"doc": "a", "body": "The whale."}])
    with pytest.raises(ValueError, match=r"no column 'id' \(columns: \['doc', 'body'\]\).*id_column"):
        build(_cfg(tmp_path, "x", vocab), documents=ds)
    with pytest.raises(ValueError, match=r"no column 'text'.*--text-field"):
        build(_cfg(tmp_path, "x", vocab), documents=ds, id_column="doc")
    with pytest.raises(ValueError, match="needs a vocabulary"):
        build(_cfg(tmp_path, "x", None), documents=ds)


@pytest.mark.timeout(600)
def test_a_users_dataset_is_streamed_once_and_never_copied(ray_local, tmp_path, vocab, monkeypatch):
    """The user's own map runs once per row (no materialize, no digest pass, no second read), and _work holds
    tokenized documents only: no copy of any document's text."""
    from pipeline.ray_data import RayDataExecutor

    seen = tmp_path / "seen"
    seen.mkdir()

    def users_map(batch):  # runs in Ray's workers: each call leaves a file naming the rows it saw
        (seen / f"{os.getpid()}-{random.random()}").write_text("\n".join(batch["id"].to_pylist()))
        return batch

    real = ray_local.data.Dataset.materialize

    def materialize(self):  # Ray's write_datasink materializes what its sink returned (the markers): that only
        if type(self._logical_plan.dag).__name__ != "Write":
            raise AssertionError("the user's Dataset was materialized")
        return real(self)
    monkeypatch.setattr(ray_local.data.Dataset, "materialize", materialize)
    records = _records()
    ds = ray_local.data.from_items(records, override_num_blocks=4).map_batches(users_map, batch_format="pyarrow")
    work, schemas = [], []

    def on_stage(name, *a):
        if name == "read":  # what the read pass left in _work
            root = tmp_path / "ds" / "_work"
            work.extend(str(p.relative_to(root)) for p in root.rglob("*"))
            schemas.extend(pa.ipc.open_file(str(p)).schema.names for p in root.rglob("*.arrow"))
    m = build(_cfg(tmp_path, "ds", vocab), RayDataExecutor(num_cpus=2), on_stage=on_stage, documents=ds)
    rows = [i for f in seen.iterdir() for i in f.read_text().split("\n")]
    assert sorted(rows) == sorted(r["id"] for r in records)  # every row once, no row twice
    assert m.totals.documents == len(records) and m.inputs[0]["documents"] == len(records)
    assert work and not any(p.startswith("documents") for p in work)
    fragments = [p for p in work if p.endswith(".arrow")]
    assert fragments and all(p.startswith("docs/") for p in fragments)
    assert schemas and all(n == ["doc_id", "pool_hash", "sentences"] for n in schemas)  # token ids, not text
