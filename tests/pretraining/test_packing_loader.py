"""The loader side of packing: best-fit decreasing within the limits, a hand-checked packed micro-batch, every row of
the stream packed exactly once, exact resume from a saved position or by replay, the same sequences per step on any
number of workers, and `fit` training on packed batches (resumed exactly) on real shards."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bert_core import bert_tiny
from corpus.schema import read_manifest
from pretraining.config import CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.loop import fit
from pretraining.order import global_batches, rank_share, stream_rows
from pretraining.packing import PackConfig, collate_packed, pack
from pretraining.rows import Rows, read_shard
from tracking.config import TrackingConfig
from training.checkpoint import LocalCheckpoints
from training.worker import Worker

CLS, SEP = 101, 102


def test_best_fit_decreasing_respects_the_limits_and_packs_tightly():
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 129, 2000)
    slots = np.maximum(1, np.round(lengths * 0.15)).astype(np.int64)
    cfg = PackConfig(width=128, sequences=3, slots=22, window_rows=2000)
    packs = pack(lengths, slots, cfg, np.random.default_rng(1))
    members = np.concatenate(packs)
    assert sorted(members.tolist()) == list(range(2000))  # every row once
    assert all(lengths[p].sum() <= 128 and len(p) <= 3 and slots[p].sum() <= 22 for p in packs)
    # within 3% of the lower bound ceil(tokens / width) for these lengths (uniform 8..128)
    bound = -(-lengths.sum() // 128)
    assert len(packs) <= 1.03 * bound, (len(packs), bound)
    again = pack(lengths, slots, cfg, np.random.default_rng(1))
    assert all(np.array_equal(a, b) for a, b in zip(packs, again, strict=False))


def test_slots_limit_opens_a_new_packed_row():
    cfg = PackConfig(width=64, sequences=4, slots=5, window_rows=3)
    packs = pack(np.array([10, 10, 10]), np.array([3, 3, 2]), cfg, np.random.default_rng(0))
    assert sorted(sorted(p.tolist()) for p in packs) == [[0, 2], [1]] or \
        sorted(sorted(p.tolist()) for p in packs) == [[0], [1, 2]]
    with pytest.raises(ValueError, match="more than the 5 slots"):
        pack(np.array([10]), np.array([6]), cfg, np.random.default_rng(0))


def test_collate_packed_by_hand():
    rows = Rows.from_pylist([
        {"input_ids": [CLS, 5, 6, SEP, 7, SEP], "a_length": 2, "masked_lm_positions": [2],
         "masked_lm_ids": [66], "next_sentence_label": 1},
        {"input_ids": [CLS, 8, SEP, 9, 10, SEP], "a_length": 1, "masked_lm_positions": [3, 4],
         "masked_lm_ids": [77, 99], "next_sentence_label": 0},
        {"input_ids": [CLS, 11, SEP, 12, SEP], "a_length": 1, "masked_lm_positions": [1],
         "masked_lm_ids": [55], "next_sentence_label": 1},
    ])
    cfg = PackConfig(width=12, sequences=2, slots=4, window_rows=3)
    b = collate_packed(rows, [np.array([0, 1]), np.array([2])], 3, cfg)  # 3 packed rows: the last one empty
    assert b["input_ids"].tolist() == [[CLS, 5, 6, SEP, 7, SEP, CLS, 8, SEP, 9, 10, SEP],
                                       [CLS, 11, SEP, 12, SEP] + [0] * 7, [0] * 12]
    assert b["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1],
                                            [0, 0, 0, 1, 1] + [0] * 7, [0] * 12]
    assert b["attention_mask"].sum(1).tolist() == [12, 5, 0]
    assert b["sequence_lengths"].tolist() == [[6, 6], [5, 0], [0, 0]]
    assert b["masked_lm_positions"].tolist() == [[2, 9, 10, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert b["masked_lm_labels"].tolist() == [[66, 77, 99, -100], [55, -100, -100, -100], [-100] * 4]
    assert b["next_sentence_label"].tolist() == [[1, 0], [1, -100], [-100, -100]]


def _unpack(batch: dict) -> list[tuple]:
    """The sequences of a packed micro-batch as (ids, masked positions within the sequence, labels, nsp)."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        pairs = zip(batch["masked_lm_positions"][r], batch["masked_lm_labels"][r], strict=False)
        start, slots = 0, [(int(p), int(lab)) for p, lab in pairs if lab != -100]
        for j, n in enumerate(batch["sequence_lengths"][r]):
            if n:
                mine = [(p - start, lab) for p, lab in slots if start <= p < start + n]
                out.append((tuple(batch["input_ids"][r, start:start + n].tolist()), tuple(mine),
                            int(batch["next_sentence_label"][r, j])))
                start += int(n)
    return out


def _config(data: str, **data_kw) -> DataConfig:
    vocab = Path(data, "vocab.txt").read_text().splitlines()
    return DataConfig(train=read_manifest(data), micro_batch_size=4, packing=True, mask_id=vocab.index("[MASK]"),
                      **data_kw)


def _steps(data: DataConfig, load, world: int = 1, **kwargs):
    """Every rank's share of each step: [(position, [RankShare per rank]), ...] (an infinite iterator)."""
    view = data.for_world(world)
    for batch in global_batches(view, 3, load, **kwargs):
        yield batch.position, [rank_share(batch, view, r, world, view.accum) for r in range(world)]


def test_stream_packs_every_row_once_and_resumes_exactly(varied_pretrain_data):
    data = _config(varied_pretrain_data, pack_window_rows=40)
    shards = data.train

    def load(i):
        return read_shard(shards.shard_urls[i])

    total = sum(shards.shard_rows)
    stream = _steps(data, load)
    seen, batches, positions = [], [], []
    while len(seen) < total // 40 * 40:  # whole windows of the first epoch
        position, (share,) = next(stream)
        (batch,) = share.micro
        assert batch["input_ids"].shape == (4, 64) and batch["masked_lm_positions"].shape == (4, 10 + 3)
        seen += _unpack(batch)
        batches.append(batch)
        positions.append(position)
    rows = Rows.concat([load(i) for i in range(len(shards.shard_urls))])
    # The epoch's first rows, as the stream reads them (its shard order), are exactly what was packed.
    expected = []
    for piece in stream_rows(shards.shard_rows, 3, load):
        for i in range(len(piece)):
            ids = piece.ids[piece.ids_off[i]:piece.ids_off[i + 1]]
            pos = piece.pos[piece.pos_off[i]:piece.pos_off[i + 1]]
            lab = piece.lab[piece.pos_off[i]:piece.pos_off[i + 1]]
            expected.append((tuple(ids.tolist()), tuple(zip(pos.tolist(), lab.tolist(), strict=False)),
                             int(piece.nsp[i])))
        if len(expected) >= len(seen):
            break
    assert sorted(seen) == sorted(expected[:len(seen)])
    assert len(rows) == total
    # Resume at step k: from the saved position, and by replaying the windows from the start.
    k = len(batches) // 2 + 1
    for kwargs in ({"start": k, "start_position": positions[k - 1]}, {"start": k}):
        resumed = _steps(data, load, **kwargs)
        for want, want_pos in zip(batches[k:k + 5], positions[k:k + 5], strict=False):
            got_pos, (share,) = next(resumed)
            assert got_pos == want_pos
            assert all(np.array_equal(share.micro[0][key], want[key]) for key in want), kwargs


def test_packed_steps_hold_the_same_sequences_on_any_number_of_workers(varied_pretrain_data):
    """A window is packed once, globally: a step's packed rows, dealt to 1, 2 or 3 workers (3 do not divide the
    batch of 8 packed rows: 3, 3, 2), hold the same sequences, each once; the position does not depend on them."""
    data = _config(varied_pretrain_data, pack_window_rows=48, batch_size=8)
    load = lambda i: read_shard(data.train.shard_urls[i])  # noqa: E731
    runs = {}
    for world in (1, 2, 3):
        steps = []
        for position, shares in itertools.islice(_steps(data, load, world), 6):
            held = np.concatenate([ids for share in shares for ids in share.examples])
            assert len(set(held.tolist())) == len(held) == len(shares[0].batch.examples)
            assert {len(share.micro) for share in shares} == {data.for_world(world).accum}
            steps.append((position, sorted(held.tolist())))
        runs[world] = steps
    assert runs[1] == runs[2] == runs[3]


def fit_config(data: str, steps: int) -> PretrainConfig:
    vocab = Path(data, "vocab.txt").read_text().splitlines()
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64)),
        data=_config(data, accum=2, pack_width=128, pack_window_rows=64, dynamic_masking=True),
        max_steps=steps, optimizer=OptimizerConfig(lr=3e-3),
        checkpoint=CheckpointConfig(every=3),
        tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device="cpu", threads=1, seed=5),
    )


def test_fit_on_packed_batches_resumes_exactly(varied_pretrain_data, tmp_path):
    """6 steps straight (checkpoints at 3 and 6), then a resume from a copy of the step-3 checkpoint alone: the
    same losses at steps 4-6, from the saved packed position."""
    import json
    import shutil

    straight = fit(fit_config(varied_pretrain_data, 6), Worker(checkpoints=LocalCheckpoints(tmp_path / "a", keep=2)))
    assert straight.throughput["padding_fraction"] < 0.2
    assert straight.throughput["sequences"] / (6 * 2 * 4) > 1.8  # ~two 64-token sequences per 128-wide row
    state = json.loads((tmp_path / "a" / "checkpoint-00000003" / "train_state.json").read_text())
    assert state["data_position"]["packed_position"] == [0, 3]  # window 0, 3 global batches (steps)
    shutil.copytree(tmp_path / "a" / "checkpoint-00000003", tmp_path / "b" / "checkpoint-00000003")
    resumed = fit(fit_config(varied_pretrain_data, 6), Worker(checkpoints=LocalCheckpoints(tmp_path / "b", keep=2)))
    assert resumed.resumed_from == 3
    history = dict(straight.history)
    assert [s for s, _ in resumed.history] == [4, 5, 6]
    for step, metrics in resumed.history:
        assert metrics["loss"] == pytest.approx(history[step]["loss"], rel=1e-6), step
