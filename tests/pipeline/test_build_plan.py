"""The build's plan without Ray: typed markers, shard slices (balance, coverage, order, mixing), and the
random-next pool as a seeded hash sample of the whole corpus."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _corpus import ships_corpus

from corpus.create_instances import InstanceConfig
from corpus.readers import ReadOptions, ReadReport, plan_units, read_unit
from corpus.rng import derive_seed
from pipeline import BuildConfig, build
from pipeline.instances import InstancesMarker
from pipeline.markers import read_markers, write_marker
from pipeline.read import ReadMarker
from pipeline.shards import (
    SHARD_BYTES,
    ShardItem,
    ShardMarker,
    chunk_bounds,
    chunks_per_pass,
    default_num_shards,
    even_cuts,
    plan_shards,
    unit_order,
    write_shard,
)
from pipeline.sizes import pool_threshold
from storage.fs import expand_inputs


def test_markers_round_trip_and_are_read_back_concurrently(tmp_path):
    work = str(tmp_path / "_work")
    written = [InstancesMarker(uid=f"{i:05d}-00000", documents=i, rows=(i, i + 1), cuts=((0, i), (0, 1, i + 1)))
               for i in range(40)]
    for m in written:
        write_marker(work, m)
    got = read_markers(work, InstancesMarker)
    assert got == {m.uid: m for m in written}
    d = ReadMarker(uid="u", path="p", read_documents=1, dropped={"bad_json": 1}, bad_files={}, documents=1,
                   sentences=2, tokens=3, unk_tokens=1, tokens_per_document={"2": 1})
    assert ReadMarker.from_json(d.to_json()) == d
    s = ShardMarker(index=3, file="shards/part-00003-of-00004.parquet", rows=5, random_next=2, masked=9,
                    seq_len_histogram={"64": 5}, masked_per_seq_histogram={"1": 1, "2": 4}, sha256="a" * 64, bytes=7,
                    index_sha256="b" * 64)
    assert ShardMarker.from_json(s.to_json()) == s and s.key == "00003"
    assert read_markers(str(tmp_path / "nothing"), ReadMarker) == {}


def _rows(n_units=7, passes=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(f"{u:05d}-00000", tuple(int(x) for x in rng.integers(0, 60, passes))) for u in range(n_units)]


@pytest.mark.parametrize("num_shards,chunks", [(1, 1), (4, 1), (5, 3), (40, 1), (40, 7)])
def test_shards_are_balanced_and_cover_every_row_once_in_the_seeded_order(num_shards, chunks):
    unit_rows = _rows()
    tasks = plan_shards([(u, [even_cuts(n, chunks) for n in r]) for u, r in unit_rows], num_shards, seed=12345)
    total = sum(sum(r) for _, r in unit_rows)
    sizes = [t.rows for t in tasks]
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1 and [t.index for t in tasks] == list(range(num_shards))
    # Concatenated, the slices are the global order: pass by pass, (unit, chunk) pieces permuted by (seed, pass).
    expected = []
    for p in range(3):
        for k in unit_order(len(unit_rows) * chunks, 12345, p):
            u, c = divmod(int(k), chunks)
            a, b = chunk_bounds(unit_rows[u][1][p], chunks)[c]
            expected += [(unit_rows[u][0], p, i) for i in range(a, b)]
    got = [(uid, p, i) for t in tasks for uid, p, lo, hi in t.slices for i in range(lo, hi)]
    assert got == expected
    assert all(hi > lo for t in tasks for _, _, lo, hi in t.slices)  # a task holds only slices it reads


def test_passes_are_ordered_independently_so_a_units_passes_land_in_different_shards():
    unit_rows = [(f"{u:05d}-00000", (100, 100, 100)) for u in range(12)]
    orders = [unit_order(12, 7, p).tolist() for p in range(3)]
    assert len({tuple(o) for o in orders}) == 3 and all(sorted(o) == list(range(12)) for o in orders)
    tasks = plan_shards([(u, [even_cuts(n, 1) for n in r]) for u, r in unit_rows], 6, seed=7)
    for uid, _ in unit_rows:
        shards = {t.index for t in tasks for u, _, _, _ in t.slices if u == uid}
        assert len(shards) >= 3  # each pass spans two shards of its own


def test_chunks_mix_more_units_into_each_shard_of_a_small_corpus():
    assert chunks_per_pass(10_000, 5, 1024) == 1  # a large corpus: shards span hundreds of units already
    assert chunks_per_pass(4, 2, 8) == 32 and chunks_per_pass(1, 1, 1000) == 64
    unit_rows = [(f"{u:05d}-00000", (400, 400)) for u in range(6)]
    chunks = chunks_per_pass(6, 2, 4)

    def units_per_shard(c):
        return [len({u for u, _, _, _ in t.slices})
                for t in plan_shards([(u, [even_cuts(n, c) for n in r]) for u, r in unit_rows], 4, seed=3)]
    assert max(units_per_shard(1)) <= 4 and min(units_per_shard(chunks)) == 6  # every unit in every shard


def test_shard_rows_are_in_key_order_within_each_group(tmp_path):
    schema = pa.schema([("input_ids", pa.list_(pa.uint16())), ("masked_lm_positions", pa.list_(pa.uint16())),
                        ("next_sentence_label", pa.int8()), ("doc", pa.int64()), ("key", pa.uint64())])
    rng = np.random.default_rng(1)

    def rows_of(u, p):  # row r of (u, p): r % 5 + 2 tokens, one masked position, random next when u == 2
        return pa.table([pa.array([[1] * (r % 5 + 2) for r in range(50)], pa.list_(pa.uint16())),
                         pa.array([[1]] * 50, pa.list_(pa.uint16())), pa.array(np.full(50, int(u == 2), np.int8)),
                         pa.array(np.full(50, 10 * u + p)),
                         pa.array(np.sort(rng.integers(0, 2**63, 50).astype(np.uint64)))], schema=schema)
    rows = {(str(u), p): rows_of(u, p) for u in range(3) for p in range(2)}
    task = ShardItem(0, 1, (("0", 0, 10, 50), ("1", 1, 0, 50), ("2", 0, 0, 30), ("2", 1, 0, 50)))
    path = str(tmp_path / "out.parquet")
    stats = write_shard(task, path, lambda s: rows[s[0], s[1]].slice(s[2], s[3] - s[2]), schema, rows_per_group=100)
    t = pq.read_table(path)
    assert stats.rows == t.num_rows == 170
    keys, docs = t.column("key").to_numpy(), t.column("doc").to_numpy()
    # Groups of at most 100 rows, whole slices: [40 + 50], [30 + 50]; each in key order, documents interleaved.
    assert np.all(np.diff(keys[:90].astype(np.float64)) >= 0) and np.all(np.diff(keys[90:].astype(np.float64)) >= 0)
    assert sorted(set(docs[:90])) == [0, 11] and sorted(set(docs[90:])) == [20, 21]
    assert np.count_nonzero(np.diff(docs[:90])) > 20  # mixed, not two runs
    assert stats.random_next == 80 and stats.masked == 170 and stats.masked_per_seq == {1: 170}
    assert sum(stats.seq_len.values()) == 170 and set(stats.seq_len) == {2, 3, 4, 5, 6}
    assert np.concatenate(stats.lengths).tolist() == [len(x) for x in t.column("input_ids").to_pylist()]


def test_default_num_shards_follows_the_corpus_size():
    per_shard = SHARD_BYTES / 2.4  # tokens x passes per shard at uint16
    assert default_num_shards(1000, 10, 30522) == 1  # at least one
    assert default_num_shards(int(per_shard * 8 / 5), 5, 30522) == 8
    assert default_num_shards(int(per_shard * 8 / 5), 10, 30522) == 16  # twice the passes, twice the shards
    assert default_num_shards(int(per_shard * 8 / 5), 5, 70000) == 16  # uint32 ids: twice the bytes


def test_a_build_without_num_shards_plans_them_from_its_size(tmp_path, sample_dir):
    cfg = BuildConfig(inputs=(str(sample_dir / "corpus" / "austen.jsonl.gz"),), output=str(tmp_path / "out"),
                      vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), dupe_factor=1,
                      instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))
    m = build(cfg)
    assert len(m.shards) == 1 and m.config["num_shards"] is None  # ~3 MB of text: far below one shard


def test_pool_threshold():
    assert pool_threshold(10, 5) == 1 << 64  # the whole corpus fits the budget: every document
    assert pool_threshold(1, 4) == 1 << 62


def _corpus(path, n_docs=400):
    return ships_corpus(path, n_docs, sentences=4)


def test_pool_is_the_seeded_hash_sample_of_the_whole_corpus(tmp_path, sample_dir):
    corpus = _corpus(tmp_path / "c.jsonl")
    cfg = BuildConfig(inputs=(corpus,), output=str(tmp_path / "out"), dupe_factor=1, num_shards=2,
                      vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), unit_bytes=4096,
                      pool_tokens=3600, instances=InstanceConfig(max_seq_length=64))
    m = build(cfg)
    tokens = m.totals.tokens  # "A river saw 7 ships on day 3." is 9 WordPiece tokens, more for 3-digit numbers
    assert 400 * 4 * 9 <= tokens < 400 * 4 * 10
    files = expand_inputs([corpus])
    ids = [d.doc_id for u in plan_units(files, ReadOptions(), 4096) for d in read_unit(u, ReadOptions(), None,
                                                                                      ReadReport())]
    threshold = pool_threshold(cfg.pool_tokens, tokens)  # from the exact count the read pass made
    members = [d for d in ids if derive_seed(cfg.instances.seed, d, "pool") < threshold]
    pool = dict(m.random_pool)
    assert pool["documents"] == len(members) and pool["corpus_tokens"] == tokens
    assert 9 * 4 * len(members) <= pool["tokens"] < 10 * 4 * len(members)
    assert abs(len(members) / len(ids) - 0.25) < 0.07  # a Bernoulli(1/4) sample of 400 documents
    assert pool["sample_fraction"] == pytest.approx(3600 / tokens, rel=1e-6)
    assert members != [d for d in ids if derive_seed(1, d, "pool") < threshold]  # another seed, another sample
