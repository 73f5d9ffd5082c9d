"""No instance round trip through _work (issue 41): the instances pass only counts rows, each shard item makes its
own rows from the tokenized documents; what that keeps (the same rows, resumable, balanced) and what it bounds
(scratch and disk per byte of real text, rows made per row written); every shard indexed and vouched for in the
manifest."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.instances
import pipeline.shards
from corpus.create_instances import InstanceConfig, RandomDocPool, VocabInfo, count_pairs, create_instances_flat
from corpus.pairs import PackedDoc
from corpus.schema import read_manifest
from corpus.shard_index import ShardIndex, verify_span
from pipeline import BuildConfig, build

CORPORA = "/work/shared/data/corpora"


def _docs(n: int, seed: int) -> list[tuple[str, PackedDoc]]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        lengths = rng.integers(1, 90, rng.integers(1, 40))  # 1-39 sentences of 1-89 tokens
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        docs.append((f"d{i}", PackedDoc(rng.integers(1000, 30000, int(offsets[-1])).astype(np.uint16), offsets)))
    return docs


@pytest.mark.parametrize("seq, short", [(128, 0.1), (64, 0.5), (512, 0.0)])
def test_count_pairs_is_the_rows_create_instances_makes(sample_dir, seq, short):
    docs = _docs(60, seq)
    cfg = InstanceConfig(max_seq_length=seq, short_seq_prob=short, max_predictions_per_seq=20)
    tokens = (sample_dir / "reference" / "bert-base-uncased-vocab.txt").read_text().splitlines()
    vocab = VocabInfo.from_tokens(tokens)
    offsets, base = [0], 0  # every sentence's token offsets, then every document's sentence offsets
    for _, p in docs:
        offsets += (p.sent_offsets[1:] + base).tolist()
        base += len(p.tokens)
    sent = np.concatenate([[0], np.cumsum([len(p.sent_offsets) - 1 for _, p in docs])])
    pool = RandomDocPool.from_arrays([d for d, _ in docs], np.concatenate([p.tokens for _, p in docs]),
                                     np.asarray(offsets, np.int64), sent.astype(np.int64))
    passes = [0, 1, 7]
    got = count_pairs(docs, passes, cfg)
    want = [[len(create_instances_flat([d], [p], cfg, pool, vocab)["key"]) for p in passes] for d in docs]
    assert got.tolist() == want and got.sum() > 100


def _text(path: str, limit: int, out) -> int:
    """The first ``limit`` bytes of text (whole documents) of a shared corpus as JSON lines; the bytes of text."""
    n = 0
    with gzip.open(path, "rt") as f, open(out, "w") as g:
        for line in f:
            t = json.loads(line)["text"]
            g.write(json.dumps({"text": t}) + "\n")
            n += len(t.encode())
            if n >= limit:
                break
    return n


def _du(path) -> int:
    n = 0
    for root, _, files in os.walk(path):
        for x in files:
            try:
                n += os.stat(os.path.join(root, x)).st_size
            except FileNotFoundError:  # a temporary renamed or removed between the listing and the stat
                pass
    return n


@pytest.fixture(scope="module")
def real_build(tmp_path_factory, sample_dir):
    """A build of ~1.5 MB of real technical text (prose with code) at dupe 5, seq 128, in 4 shards, its disk
    sampled every few milliseconds and at every stage's end."""
    tmp = tmp_path_factory.mktemp("real")
    corpus = tmp / "tech.jsonl"
    text = _text(f"{CORPORA}/tech.jsonl.gz", 1_500_000, corpus)
    out = tmp / "out"
    peak = {"work": 0, "out": 0}
    seen: dict = {"work_files": set(), "max_doc_rows": 0}
    done = threading.Event()

    def sample() -> None:
        w, o = _du(out / "_work"), _du(out)
        peak["work"], peak["out"] = max(peak["work"], w), max(peak["out"], o)
        for root, _, files in os.walk(out / "_work"):
            seen["work_files"].update(os.path.relpath(os.path.join(root, f), out / "_work") for f in files)

    def poll() -> None:
        while not done.wait(0.005):
            sample()

    def told(stage, *_):
        sample()
        if stage == "instances":  # the longest document pass: what one cut at a shard's end can make twice
            for f in os.listdir(out / "_work" / "counts"):
                t = pa.ipc.open_file(str(out / "_work" / "counts" / f)).read_all()
                seen["max_doc_rows"] = max([seen["max_doc_rows"]] + [int(pa.compute.max(c).as_py() or 0)
                                                                     for c in t.columns])

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    cfg = BuildConfig(inputs=(str(corpus),), output=str(out), dupe_factor=5, num_shards=4, unit_bytes=256 << 10,
                      vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                      instances=InstanceConfig(max_seq_length=128))
    made: list = []
    real = pipeline.shards.ShardStep.__call__

    def step(self, item):
        m = real(self, item)
        made.append(m)
        return m

    pipeline.shards.ShardStep.__call__ = step
    try:
        m = build(cfg, on_stage=told)
    finally:
        pipeline.shards.ShardStep.__call__ = real
        done.set()
        thread.join()
    return {"manifest": m, "text": text, "out": out, "peak": peak, "seen": seen, "markers": made}


def test_scratch_holds_no_instance_and_peaks_below_the_text(real_build):
    b = real_build
    text, peak, out = b["text"], b["peak"], b["out"]
    shards = sum(os.path.getsize(out / s.file) for s in b["manifest"].shards)
    biggest = max(os.path.getsize(out / s.file) for s in b["manifest"].shards)
    print(f"text {text / 1e6:.2f} MB: _work peak {peak['work'] / text:.3f}x, output peak {peak['out'] / text:.3f}x, "
          f"shards {shards / text:.3f}x")
    # Only the tokenized documents, the row counts and markers: no instance, no merged pool.
    files = b["seen"]["work_files"]
    assert any(f.startswith("docs/") for f in files) and any(f.startswith("counts/") for f in files)
    others = {f for f in files if not (f.split("/")[0] in ("docs", "counts") or ".done.json" in f)}
    assert {f.split(".tmp-")[0] for f in others} <= {"config.json"}, sorted(others)
    assert not (out / "_work").exists()
    assert peak["work"] <= 1.0 * text, (peak["work"], text)
    # The output folder at its fullest: the shards, _work and the one shard being written (plain loop: one at a time),
    # with a little for the indexes, vocab.txt, the lease and the manifest.
    assert peak["out"] <= shards + peak["work"] + biggest + 1_000_000, (peak, shards, biggest)


def test_rows_are_made_twice_only_where_a_shard_ends_inside_a_document_pass(real_build):
    markers = real_build["markers"]
    rows, made = sum(m.rows for m in markers), sum(m.rows_made for m in markers)
    assert rows == real_build["manifest"].totals.instances > 10_000
    assert rows <= made <= rows + (len(markers) - 1) * 2 * real_build["seen"]["max_doc_rows"], (made, rows)
    print(f"rows made {made} for {rows} written: {made / rows:.4f}x")


def test_every_shard_has_a_verified_index_and_the_manifest_vouches_for_both(real_build):
    out, m = real_build["out"], real_build["manifest"]
    entries = json.loads((out / "manifest.json").read_text())["shards"]
    assert read_manifest(str(out)) == m
    for e, s in zip(entries, m.shards, strict=True):
        assert {"sha256", "bytes", "index", "index_sha256"} <= e.keys()
        data = (out / s.file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == e["sha256"] == s.sha256 and len(data) == e["bytes"] == s.bytes
        raw = (out / e["index"]).read_bytes()
        assert s.index_url.endswith(e["index"]) and hashlib.sha256(raw).hexdigest() == e["index_sha256"]
        index = ShardIndex.from_bytes(raw, e["index_sha256"], e["index"])
        table = pq.read_table(out / s.file)
        assert index.lengths.tolist() == [len(x) for x in table.column("input_ids").to_pylist()]
        assert index.rows == table.num_rows == e["rows"] and index.file_sha256 == e["sha256"]
        for (lo, size), digest in zip(index.group_spans.tolist(), index.group_sha256, strict=True):
            verify_span(data[lo:lo + size], digest, s.file)
        with pytest.raises(ValueError, match="replaced"):  # the attack: one byte of a row group changed
            lo, size = index.group_spans[0].tolist()
            verify_span(data[lo:lo + size - 1] + bytes([data[lo + size - 1] ^ 1]), index.group_sha256[0], s.file)
        with pytest.raises(ValueError, match="sha256"):
            ShardIndex.from_bytes(raw[:-1] + bytes([raw[-1] ^ 1]), e["index_sha256"], e["index"])


def _small(tmp_path, sample_dir, name, **kw):
    kw.setdefault("unit_bytes", 64 << 10)
    kw.setdefault("num_shards", 3)
    return BuildConfig(inputs=(str(sample_dir / "corpus" / "mobydick.jsonl.gz"),), output=str(tmp_path / name),
                       dupe_factor=2, vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10), **kw)


def _files(out) -> dict[str, str]:
    d = out / "shards"
    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in sorted(os.listdir(d))}


def test_a_shard_failing_half_written_then_rerun_gives_the_same_bytes(tmp_path, sample_dir, monkeypatch):
    calls, steps, fail_at = [], [], [None]
    real_rows, real_step = pipeline.shards.unit_rows, pipeline.shards.ShardStep.__call__

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == fail_at[0]:
            raise RuntimeError("injected failure")
        return real_rows(*a, **k)

    def counted(self, item):
        steps.append(item.index)
        return real_step(self, item)

    monkeypatch.setattr(pipeline.shards, "unit_rows", flaky)
    monkeypatch.setattr(pipeline.shards.ShardStep, "__call__", counted)
    monkeypatch.setattr(pipeline.shards, "ROWS_PER_GROUP", 2000)  # several Parquet groups per shard
    build(_small(tmp_path, sample_dir, "clean"))
    assert steps == [0, 1, 2]
    per_shard = len(calls) // 3
    calls.clear()
    steps.clear()
    fail_at[0] = per_shard + per_shard // 2  # half-way through the second shard: a group of it already written
    cfg = _small(tmp_path, sample_dir, "killed")
    with pytest.raises(RuntimeError, match="injected"):
        build(cfg)
    shards = tmp_path / "killed" / "shards"
    assert steps == [0, 1] and sorted(os.listdir(shards)) == ["part-00000-of-00003.index.npz",
                                                                "part-00000-of-00003.parquet"]
    fail_at[0] = None
    steps.clear()
    build(cfg)
    assert steps == [1, 2]  # the committed shard is not made again
    assert _files(tmp_path / "killed") == _files(tmp_path / "clean")
    clean, killed = (json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("clean", "killed"))
    assert clean["shards"] == killed["shards"] and clean["totals"] == killed["totals"]


@pytest.mark.slow
def test_a_build_to_s3_writes_the_same_shards_and_indexes_as_on_local_disk(tmp_path, sample_dir, s3_bucket):
    import dataclasses

    from storage.fs import list_names, read_bytes

    endpoint, bucket = s3_bucket
    local = build(_small(tmp_path, sample_dir, "local", unit_bytes=1 << 19))  # 3 units: few objects on the server
    out = f"s3://{bucket}/ds"
    m = build(dataclasses.replace(_small(tmp_path, sample_dir, "x", unit_bytes=1 << 19), output=out,
                                  endpoint_url=endpoint))
    assert [(s.file, s.rows, s.sha256, s.bytes, s.index_sha256) for s in m.shards] == \
        [(s.file, s.rows, s.sha256, s.bytes, s.index_sha256) for s in local.shards]
    for s in m.shards:
        raw = read_bytes(s.index_url, endpoint)
        assert hashlib.sha256(raw).hexdigest() == s.index_sha256
        assert hashlib.sha256(read_bytes(s.url, endpoint)).hexdigest() == s.sha256
    assert sorted(list_names(f"{out}/shards", endpoint)) == sorted(
        n for s in m.shards for n in (s.file.split("/")[1], s.index_name.split("/")[1]))


def test_chunks_are_cut_at_the_document_boundary_nearest_an_even_split():
    from pipeline.instances import doc_cuts

    starts = np.array([0, 10, 11, 40, 100, 100, 130])  # 6 document copies, 130 rows (one with none)
    assert doc_cuts(starts, 1) == (0, 130)
    assert doc_cuts(starts, 2) == (0, 40, 130)  # 65: 40 is nearer than 100
    assert doc_cuts(starts, 4) == (0, 40, 40, 100, 130)  # 32 -> 40, 65 -> 40, 97 -> 100
    one = np.array([0, 500])  # one long document: every cut at its ends, never inside it
    assert set(doc_cuts(one, 8)) <= {0, 500} and doc_cuts(one, 8)[-1] == 500
    for chunks in (1, 3, 7, 64):
        c = doc_cuts(starts, chunks)
        assert len(c) == chunks + 1 and list(c) == sorted(c) and set(c) <= set(starts.tolist())


@pytest.mark.timeout(240)
def test_a_build_killed_while_writing_shards_then_rerun_gives_the_same_bytes(tmp_path, sample_dir, monkeypatch):
    """SIGKILL once a shard is committed and the next is being made: the rerun makes only the shards without a
    marker (from _work's documents and counts), leaves no temporary behind and equals an uninterrupted build."""
    import pickle
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    monkeypatch.setenv("BERT_LEASE_STALE_SECONDS", "3")  # the killed build's lease is taken over once this old
    repo = str(Path(__file__).resolve().parents[2])
    cfg = _small(tmp_path, sample_dir, "killed", num_shards=8)
    code = (f"import sys; sys.path.insert(0, {repo!r}); import pickle; from pipeline import build; "
            f"build(pickle.loads({pickle.dumps(cfg)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, env=dict(os.environ))
    marks = tmp_path / "killed" / "_work" / "shards"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if marks.exists() and sum(n.endswith(".done.json") for n in os.listdir(marks)) >= 1:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the build ended before it could be killed"
    assert not (tmp_path / "killed" / "manifest.json").exists(), "the build finished before it could be killed"
    done = {n for n in os.listdir(marks) if n.endswith(".done.json")}
    assert 1 <= len(done) < 8
    time.sleep(3.5)  # the dead build's lease goes stale
    build(cfg)
    build(_small(tmp_path, sample_dir, "clean", num_shards=8))
    assert _files(tmp_path / "killed") == _files(tmp_path / "clean")  # no temporary left among the shards either
    clean, killed = (json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("clean", "killed"))
    assert clean["shards"] == killed["shards"] and clean["totals"] == killed["totals"]
