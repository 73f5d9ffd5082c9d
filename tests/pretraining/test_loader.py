"""The training loader and its batches: padding to a multiple of 8 or to length buckets, segment ids from a_length,
MLM slots, dynamic masking keyed by example, the global data order (the same examples per step on any number of
workers, equal work on every rank, exact resume)."""
from __future__ import annotations

import numpy as np
import pytest
from _manifests import manifest_of

from pretraining.batching import Remasker, collate, finite_batches
from pretraining.loader import DataConfig, Prefetcher
from pretraining.order import GlobalBatch, global_batches, rank_share, split_example
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
    rows.example, rows.epoch = np.arange(100, 109), np.full(9, 2)
    again = Rows.concat([rows.slice(0, 4), rows.slice(4, 9)])
    for name in ("ids", "ids_off", "a_length", "pos", "pos_off", "lab", "nsp", "example", "epoch"):
        assert np.array_equal(getattr(rows, name), getattr(again, name))
    picked = rows.take(np.array([7, 2]))
    assert picked.ids[picked.ids_off[0]:picked.ids_off[1]].tolist() == \
        rows.ids[rows.ids_off[7]:rows.ids_off[8]].tolist()
    assert picked.example.tolist() == [107, 102] and Rows.concat([picked, Rows.from_pylist([])]).example is None


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
    rows.example, rows.epoch = np.arange(len(rows)), np.zeros(len(rows), np.int64)
    out = Remasker(vocab_size=VOCAB * 3, mask_id=MASK, max_predictions=20)(rows, 7)
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
    again = Remasker(vocab_size=VOCAB * 3, mask_id=MASK, max_predictions=20)(rows, 7)
    assert np.array_equal(again.ids, out.ids) and np.array_equal(again.pos, out.pos)


def _row_masks(rows: Rows) -> dict[int, tuple]:
    return {int(rows.example[i]): (tuple(rows.pos[rows.pos_off[i]:rows.pos_off[i + 1]]),
                                   tuple(rows.ids[rows.ids_off[i]:rows.ids_off[i + 1]])) for i in range(len(rows))}


def test_dynamic_masks_are_keyed_by_example_and_epoch_not_by_batch():
    """A row's new mask depends on (seed, example, epoch) only: the same in any batch, order or company (so on
    any rank and world size), new in another epoch or with another seed."""
    rng = np.random.default_rng(3)
    rows = Rows.from_pylist([make_row(int(rng.integers(10, 40)), int(rng.integers(10, 40)), rng) for _ in range(12)])
    rows.example, rows.epoch = np.arange(12) + (5 << 32), np.zeros(12, np.int64)
    remask = Remasker(vocab_size=VOCAB * 3, mask_id=MASK, max_predictions=20)
    whole = _row_masks(remask(rows, 11))
    shuffled = np.random.default_rng(0).permutation(12)
    parts = {**_row_masks(remask(rows.take(shuffled[:5]), 11)), **_row_masks(remask(rows.take(shuffled[5:]), 11))}
    assert parts == whole
    later = rows.take(np.arange(12))
    later.epoch = np.ones(12, np.int64)
    assert sum(_row_masks(remask(later, 11))[k][0] != whole[k][0] for k in whole) >= 10
    assert sum(_row_masks(remask(rows, 12))[k][0] != whole[k][0] for k in whole) >= 10


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


def shares(data: DataConfig, shards, world: int, steps: int, seed: int = 5, start: int = 0, remasker=None):
    """Every rank's share of `steps` steps from global batch `start` on: [step][rank]."""
    view = data.for_world(world)

    def stream(rank: int):
        for batch in global_batches(view, seed, shards.__getitem__, start, remasker=remasker):
            yield rank_share(batch, view, rank, world, view.accum)

    streams = [stream(r) for r in range(world)]
    return [[next(s) for s in streams] for _ in range(steps)]


@pytest.mark.parametrize("bucketing", [False, True])
def test_each_step_trains_the_same_examples_on_any_number_of_workers(bucketing):
    """The global batch of step k is the same for 1, 2, 3 and 4 workers; every rank's micro-batches join into it
    (none lost, none twice); every rank yields exactly `accum` micro-batches of near-equal size, also when the
    world does not divide the batch (3 workers, 16 rows: 6, 5, 5); the first epoch reads every row once."""
    shard_rows = [7, 7, 6, 6, 6]  # 32 rows, balanced like the builder's shards
    shards = _dataset(shard_rows)
    data = data_config(shard_rows, 4, batch_size=16, length_bucketing=bucketing, bucket_window=2)
    per_world = {}
    for world in (1, 2, 3, 4):
        steps = shares(data, shards, world, 6)
        view = data.for_world(world)
        for step in steps:
            assert all(len(share.micro) == view.accum for share in step)  # equal work: nothing can hang
            sizes = [len(ids) for share in step for ids in share.examples]
            assert max(sizes) - min(sizes) <= 1 and max(sizes) <= 4
            held = np.concatenate([ids for share in step for ids in share.examples])
            assert sorted(held.tolist()) == sorted(step[0].batch.examples.tolist()) and len(set(held.tolist())) == 16
            for share in step:
                # the micro-batches hold the rows their example ids name
                assert [_uids(m) for m in share.micro] == [[uid_of(shards, e) for e in ids] for ids in share.examples]
        per_world[world] = [sorted(step[0].batch.examples.tolist()) for step in steps]
    assert per_world[1] == per_world[2] == per_world[3] == per_world[4]
    first_epoch = [e for batch in per_world[1][:2] for e in batch]
    assert len(set(first_epoch)) == 32  # epoch 0 whole before epoch 1: no row lost at the wrap-around
    assert data.for_world(3).accum == 2 and data.for_world(1).accum == 4 and data.for_world(4) is data


def uid_of(shards, example: int) -> int:
    shard, row = split_example(np.asarray(example))
    return int(shards[int(shard)].ids[shards[int(shard)].ids_off[int(row)] + 1])


def test_resume_at_any_step_on_any_world_size_is_exact():
    shard_rows = [7, 7, 6, 6, 6]
    shards = _dataset(shard_rows, seed=1)
    data = data_config(shard_rows, 4, batch_size=8, bucket_window=3)
    rem = Remasker(vocab_size=3000, mask_id=MASK, max_predictions=20)
    full = shares(data, shards, 2, 9, remasker=rem)
    for world in (1, 2, 4):
        for start in (1, 4, 7):
            resumed = shares(data, shards, world, 2, start=start, remasker=rem)
            for k, step in enumerate(resumed):
                want = full[start + k]
                assert sorted(step[0].batch.examples.tolist()) == sorted(want[0].batch.examples.tolist())
                if world == 2:  # the same shares, masks and padding
                    for a, b in zip(step, want, strict=False):
                        for x, y in zip(a.micro, b.micro, strict=False):
                            assert all(np.array_equal(x[key], y[key]) for key in x)
    other_seed = shares(data, shards, 2, 3, seed=6)
    assert [sorted(s[0].batch.examples.tolist()) for s in other_seed] != \
        [sorted(s[0].batch.examples.tolist()) for s in full[:3]]


def test_bucketing_reduces_padding():
    shard_rows = [64, 64]
    shards = _dataset(shard_rows, seed=3)

    def padded_tokens(bucketing):
        # Widths every 8 tokens: each batch is padded to its longest row rounded up to a multiple of 8.
        data = data_config(shard_rows, 8, length_bucketing=bucketing, bucket_window=16,
                           length_buckets=tuple(range(8, 65, 8)))
        batches = [m for step in shares(data, shards, 1, 16) for m in step[0].micro]
        return sum(b["input_ids"].size - b["attention_mask"].sum() for b in batches)

    assert padded_tokens(True) < 0.5 * padded_tokens(False)


def test_remasking_in_stream_is_keyed_by_example_and_new_each_epoch():
    shard_rows = [10, 10]
    shards = _dataset(shard_rows, seed=2)
    rem = Remasker(vocab_size=3000, mask_id=MASK, max_predictions=20)
    data = data_config(shard_rows, 4, length_bucketing=False, bucket_window=5)  # a window is an epoch of 20 rows
    full = shares(data, shards, 1, 10, seed=9, remasker=rem)
    resumed = shares(data, shards, 1, 2, seed=9, start=6, remasker=rem)
    assert np.array_equal(full[6][0].micro[0]["masked_lm_positions"], resumed[0][0].micro[0]["masked_lm_positions"])
    # Epoch 1 (steps 5-9) revisits epoch 0's rows (in another shard order) with fresh masks.
    def masked(steps) -> dict[int, list[int]]:
        return {int(e): m["masked_lm_positions"][i].tolist() for step in steps for ids, m in
                zip(step[0].examples, step[0].micro, strict=False) for i, e in enumerate(ids)}

    epoch0, epoch1 = masked(full[:5]), masked(full[5:])
    assert set(epoch0) == set(epoch1) and len(epoch0) == 20
    assert sum(epoch0[e] != epoch1[e] for e in epoch0) >= 15


def test_a_global_batch_knows_its_totals():
    rows = Rows.concat(_dataset([6]))
    rows.example = np.arange(6)
    batch = GlobalBatch(rows, 1)
    assert batch.totals == (int(np.diff(rows.pos_off).sum()), 6)
    packed = GlobalBatch(rows, (0, 1), packs=[np.array([0, 3]), np.array([5])])
    assert packed.totals == (int(np.diff(rows.pos_off)[[0, 3, 5]].sum()), 3)
    assert sorted(packed.examples.tolist()) == [0, 3, 5]


def test_finite_batches_split_ranks_without_loss():
    """Evaluation never drops a row (ray#63285), also when the ranks' shares are uneven: 10 rows over 3 ranks in
    batches of 3 are 1, 1 and 2 batches (3, 3 and 3 + 1 rows); the loop sums per rank and reduces once, so unequal
    batch counts cannot hang it."""
    rows = Rows.concat(_dataset([11]))
    got = [u for r in range(2) for b in finite_batches(rows, 4, r, 2) for u in _uids(b)]
    assert sorted(got) == list(range(11))
    per_rank = [[_uids(b) for b in finite_batches(rows, 3, r, 3, max_rows=10)] for r in range(3)]
    assert [len(b) for b in per_rank] == [1, 1, 2]
    assert sorted(u for batches in per_rank for b in batches for u in b) == list(range(10))


def test_for_world_keeps_the_batch_and_never_grows_the_planned_micro_batch():
    """A job planned for 2 workers (micro-batches of 6, one a step, a batch of 12): 1 worker accumulates two of 6, 3
    take 4 each, 12 take 1 each; 5 take shares of 2 or 3 rows in one micro-batch; 13 cannot share 12 rows."""
    data = data_config([7, 7, 6, 6, 6], 6, batch_size=12)
    geometry = {w: (data.for_world(w).micro_batch_size, data.for_world(w).accum) for w in (1, 2, 3, 5, 12)}
    assert geometry == {1: (6, 2), 2: (6, 1), 3: (4, 1), 5: (3, 1), 12: (1, 1)}
    assert data.for_world(2) is data
    with pytest.raises(ValueError, match="cannot be shared by 13 workers"):
        data.for_world(13)
    with pytest.raises(ValueError, match="smaller than one worker's micro-batch"):
        data_config([7, 7], 6, accum=2, batch_size=8)


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
    batches = [m for step in shares(data, shards, 1, 20, seed=2) for m in step[0].micro]
    widths = {b["input_ids"].shape[1] for b in batches}
    assert widths <= {16, 32, 48, 64} and len(widths) >= 2
    assert {b["masked_lm_positions"].shape for b in batches} == {(4, 20)}
