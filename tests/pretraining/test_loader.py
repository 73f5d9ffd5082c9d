"""The training loader and its batches: padding to a multiple of 8 or to length buckets, segment ids from a_length,
MLM slots, dynamic masking, equal rank streams with exact resume."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from pretraining.batching import Remasker, collate, finite_batches
from _manifests import manifest_of
from pretraining.loader import DataConfig, Prefetcher, RankStream, rank_segments
from pretraining.rows import Rows

CLS, SEP, MASK, VOCAB = 101, 102, 103, 1000


def make_row(a: int, b: int, rng: np.random.Generator, nsp: int = 0, uid: int | None = None) -> dict:
    """An unmasked [CLS] A [SEP] B [SEP] row with 15% of positions recorded as masked (ids kept)."""
    ids = [CLS] + list(rng.integers(1000, 2000, a)) + [SEP] + list(rng.integers(1000, 2000, b)) + [SEP]
    if uid is not None:
        ids[1] = uid  # identifies the row in stream tests
    cand = [i for i in range(1, len(ids) - 1) if i != a + 1]
    pos = sorted(rng.choice(cand, size=max(1, round(len(ids) * 0.15)), replace=False).tolist())
    return {"input_ids": ids, "a_length": a, "masked_lm_positions": pos,
            "masked_lm_ids": [ids[p] for p in pos], "next_sentence_label": nsp}


def test_collate_pads_to_multiple_of_8_with_segments_and_mlm_slots():
    rows = Rows.from_pylist([
        {"input_ids": [CLS, 5, 6, SEP, 7, SEP], "a_length": 2, "masked_lm_positions": [2],
         "masked_lm_ids": [66], "next_sentence_label": 1},
        {"input_ids": [CLS, 5, SEP, 7, 8, 9, 10, 11, 12, SEP], "a_length": 1, "masked_lm_positions": [3, 5],
         "masked_lm_ids": [77, 99], "next_sentence_label": 0},
    ])
    b = collate(rows, max_predictions=4)
    assert b["input_ids"].shape == (2, 16)  # longest row 10 -> 16
    assert b["input_ids"][0].tolist() == [CLS, 5, 6, SEP, 7, SEP] + [0] * 10
    assert b["attention_mask"].sum(1).tolist() == [6, 10]
    assert b["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1] + [0] * 10
    assert b["token_type_ids"][1].tolist() == [0, 0, 0] + [1] * 7 + [0] * 6
    assert b["masked_lm_positions"].tolist() == [[2, 0, 0, 0], [3, 5, 0, 0]]
    assert b["masked_lm_labels"].tolist() == [[66, -100, -100, -100], [77, 99, -100, -100]]
    assert b["next_sentence_label"].tolist() == [1, 0]
    assert all(v.dtype == np.int64 for v in b.values())
    assert collate(rows.take(np.array([0])))["input_ids"].shape == (1, 8)
    with pytest.raises(ValueError, match="max_predictions"):
        collate(rows, max_predictions=1)


def test_rows_take_concat_roundtrip():
    rng = np.random.default_rng(0)
    rows = Rows.from_pylist([make_row(int(rng.integers(2, 20)), int(rng.integers(2, 20)), rng) for _ in range(9)])
    again = Rows.concat([rows.slice(0, 4), rows.slice(4, 9)])
    for name in ("ids", "ids_off", "a_length", "pos", "pos_off", "lab", "nsp"):
        assert np.array_equal(getattr(rows, name), getattr(again, name))
    picked = rows.take(np.array([7, 2]))
    assert picked.ids[picked.ids_off[0]:picked.ids_off[1]].tolist() == rows.ids[rows.ids_off[7]:rows.ids_off[8]].tolist()


def test_dynamic_masking_follows_80_10_10_and_restores_originals():
    rng = np.random.default_rng(1)
    clean = [make_row(int(rng.integers(20, 60)), int(rng.integers(20, 60)), rng) for _ in range(400)]
    # Store them masked the way the builder would: every recorded position replaced by [MASK].
    stored = []
    for r in clean:
        ids = list(r["input_ids"])
        for p in r["masked_lm_positions"]:
            ids[p] = MASK
        stored.append({**r, "input_ids": ids})
    rows = Rows.from_pylist(stored)
    out = Remasker(vocab_size=VOCAB * 3, mask_id=MASK, max_predictions=20)(rows, np.random.default_rng(7))
    n_pred = np.diff(out.pos_off)
    expected = np.minimum(20, np.maximum(1, np.round(rows.lengths * 0.15)))
    assert n_pred.tolist() == expected.astype(int).tolist()
    masked = kept = rand = 0
    for i, r in enumerate(clean):
        orig = np.array(r["input_ids"])
        ids = out.ids[out.ids_off[i]:out.ids_off[i + 1]]
        pos = out.pos[out.pos_off[i]:out.pos_off[i + 1]]
        assert list(pos) == sorted(set(pos.tolist()))
        assert 0 not in pos and len(orig) - 1 not in pos and r["a_length"] + 1 not in pos
        assert out.lab[out.pos_off[i]:out.pos_off[i + 1]].tolist() == orig[pos].tolist()
        others = np.setdiff1d(np.arange(len(orig)), pos)
        assert np.array_equal(ids[others], orig[others])  # the old masks are gone
        masked += int((ids[pos] == MASK).sum())
        kept += int((ids[pos] == orig[pos]).sum())
        rand += int(((ids[pos] != MASK) & (ids[pos] != orig[pos])).sum())
    total = masked + kept + rand
    assert abs(masked / total - 0.8) < 0.02 and abs(kept / total - 0.1) < 0.015 and abs(rand / total - 0.1) < 0.015
    again = Remasker(vocab_size=VOCAB * 3, mask_id=MASK, max_predictions=20)(rows, np.random.default_rng(7))
    assert np.array_equal(again.ids, out.ids) and np.array_equal(again.pos, out.pos)


def test_rank_segments_partition_each_epoch():
    shard_rows = [5, 5, 4, 4]
    for world in (1, 2, 3):
        for epoch in (0, 1):
            seen = []
            for r in range(world):
                segs = rank_segments(shard_rows, 3, epoch, r, world)
                seen += [(s, i) for s, a, b in segs for i in range(a, b)]
            assert sorted(seen) == sorted((s, i) for s, n in enumerate(shard_rows) for i in range(n))
    sizes = [sum(b - a for _, a, b in rank_segments(shard_rows, 3, 0, r, 3)) for r in range(3)]
    assert max(sizes) - min(sizes) <= 1


def _dataset(shard_rows, seed=0):
    rng = np.random.default_rng(seed)
    shards, uid = [], 0
    for n in shard_rows:
        rows = []
        for _ in range(n):
            rows.append(make_row(int(rng.integers(2, 30)), int(rng.integers(2, 30)), rng, uid=uid))
            uid += 1
        shards.append(Rows.from_pylist(rows))
    return shards


def data_config(shard_rows, micro_batch_size: int, **changes) -> DataConfig:
    """The loader's config over synthetic shards (rows of at most 63 tokens, at most 20 masked positions)."""
    shards = manifest_of(tuple(f"shard-{i}" for i in range(len(shard_rows))), tuple(shard_rows), max_seq_length=64,
                         max_predictions=20)
    return DataConfig(train=shards, micro_batch_size=micro_batch_size, **changes)


def _uids(batch):
    return batch["input_ids"][:, 1].tolist()


@pytest.mark.parametrize("bucketing", [False, True])
def test_rank_stream_equal_counts_no_row_lost_and_exact_resume(bucketing):
    shard_rows = [7, 7, 6, 6, 6]  # 32 rows, balanced like the builder's shards
    shards = _dataset(shard_rows)
    world, m = 3, 4

    def stream(rank, start=0):
        data = data_config(shard_rows, m, length_bucketing=bucketing, bucket_window=2)
        return RankStream(data, shards.__getitem__, seed=5, rank=rank, world=world, start_batch=start)

    per_rank = {r: list(itertools.islice(stream(r), 12)) for r in range(world)}
    assert all(len(b) == 12 for b in per_rank.values())  # infinite streams: any count, equal on every rank
    for r, batches in per_rank.items():
        assert all(b["input_ids"].shape[0] == m for b in batches)
        uids = [u for b in batches for u in _uids(b)]
        n_r = stream(r).rank_rows
        # Each epoch's part is read whole before the next one starts: no row lost at the wrap-around.
        first_epoch = uids[:n_r] if not bucketing else uids[: (n_r // (2 * m)) * 2 * m]
        assert len(set(first_epoch)) == len(first_epoch)
    all_first_epoch = [u for r in range(world) for b in per_rank[r] for u in _uids(b)]
    assert set(all_first_epoch) == set(range(32))
    for r in range(world):
        for start in (1, 5, 9):
            resumed = list(itertools.islice(stream(r, start), 3))
            for a, b in zip(resumed, per_rank[r][start:start + 3]):
                assert all(np.array_equal(a[k], b[k]) for k in a)


def test_bucketing_reduces_padding():
    shard_rows = [64, 64]
    shards = _dataset(shard_rows, seed=3)

    def padded_tokens(bucketing):
        # Widths every 8 tokens: each batch is padded to its longest row rounded up to a multiple of 8.
        data = data_config(shard_rows, 8, length_bucketing=bucketing, bucket_window=16,
                           length_buckets=tuple(range(8, 65, 8)))
        batches = list(itertools.islice(RankStream(data, shards.__getitem__, seed=1), 16))
        return sum(b["input_ids"].size - b["attention_mask"].sum() for b in batches)

    assert padded_tokens(True) < 0.5 * padded_tokens(False)


def test_remasking_in_stream_is_seeded_by_batch_index():
    shard_rows = [10, 10]
    shards = _dataset(shard_rows, seed=2)
    rem = Remasker(vocab_size=3000, mask_id=MASK, max_predictions=20)
    data = data_config(shard_rows, 4, length_bucketing=False)
    full = list(itertools.islice(RankStream(data, shards.__getitem__, seed=9, remasker=rem), 8))
    resumed = list(itertools.islice(RankStream(data, shards.__getitem__, seed=9, start_batch=6, remasker=rem), 2))
    assert np.array_equal(full[6]["masked_lm_positions"], resumed[0]["masked_lm_positions"])
    # Epoch 1 revisits epoch 0's rows (5 batches of 4 = 20 rows) with fresh masks.
    assert not all(np.array_equal(full[i]["input_ids"], full[i + 5]["input_ids"]) for i in range(3))


def test_finite_batches_split_ranks_without_loss():
    rows = Rows.concat(_dataset([11]))
    got = [u for r in range(2) for b in finite_batches(rows, 4, r, 2) for u in _uids(b)]
    assert sorted(got) == list(range(11))


def test_read_shard_roundtrip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from pretraining.rows import read_shard

    rng = np.random.default_rng(0)
    raw = [make_row(3, 4, rng), make_row(5, 2, rng)]
    table = pa.table({
        "input_ids": pa.array([r["input_ids"] for r in raw], pa.list_(pa.uint16())),
        "a_length": pa.array([r["a_length"] for r in raw], pa.int16()),
        "masked_lm_positions": pa.array([r["masked_lm_positions"] for r in raw], pa.list_(pa.uint16())),
        "masked_lm_ids": pa.array([r["masked_lm_ids"] for r in raw], pa.list_(pa.uint16())),
        "next_sentence_label": pa.array([1, 0], pa.int8()),
    })
    pq.write_table(table, tmp_path / "s.parquet")
    rows = read_shard(str(tmp_path / "s.parquet"))
    assert np.array_equal(collate(rows)["input_ids"], collate(Rows.from_pylist(raw))["input_ids"])
    assert rows.ids.dtype == np.int64


def test_prefetcher_measures_wait_and_forwards_errors():
    def slow():
        yield 1
        raise RuntimeError("broken shard")

    it = Prefetcher(slow(), depth=2)
    assert next(it) == 1
    with pytest.raises(RuntimeError, match="broken shard"):
        next(it)
    assert list(Prefetcher(iter(range(5)))) == list(range(5))


def test_collate_pads_to_the_smallest_length_bucket_that_fits():
    rng = np.random.default_rng(4)
    short = Rows.from_pylist([make_row(3, 4, rng), make_row(5, 6, rng)])  # 10 and 14 tokens
    longer = Rows.from_pylist([make_row(3, 4, rng), make_row(20, 20, rng)])  # 10 and 43 tokens
    buckets = (16, 32, 48, 64)
    assert collate(short, max_predictions=8, length_buckets=buckets)["input_ids"].shape == (2, 16)
    b = collate(longer, max_predictions=8, length_buckets=buckets)
    assert b["input_ids"].shape == (2, 48) and b["masked_lm_positions"].shape == (2, 8)
    assert b["attention_mask"].sum(1).tolist() == [10, 43]
    with pytest.raises(ValueError, match="largest length bucket"):
        collate(longer, length_buckets=(16, 32))


def test_stream_with_buckets_yields_only_bucket_widths_and_fixed_mlm_slots():
    shard_rows = [40, 40]
    shards = _dataset(shard_rows, seed=6)
    data = data_config(shard_rows, 4, length_bucketing=True, bucket_window=8, length_buckets=(16, 32, 48, 64))
    batches = list(itertools.islice(RankStream(data, shards.__getitem__, seed=2), 20))
    widths = {b["input_ids"].shape[1] for b in batches}
    assert widths <= {16, 32, 48, 64} and len(widths) >= 2
    assert {b["masked_lm_positions"].shape for b in batches} == {(4, 20)}
