"""This rank's batches for the loop: the deterministic `RankStream` over the shards (or rows a launcher hands in,
e.g. Ray Data's dataset shard), cut, bucketed, re-masked and collated in a background thread.

The data position is the number of micro-batches this rank consumed: resuming at step s starts the stream at
micro-batch s * accum, so a resumed run sees exactly the batches of an uninterrupted one (with the default
loader; a launcher's row source can only skip as many rows as were consumed).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from training.loader import (Prefetcher, RankStream, Remasker, Rows, StreamConfig, finite_batches, micro_batches,
                               read_shard)
from pipeline.storage import storage_options
from training.config import DataConfig, EvalConfig, ShardSet

RowSource = Callable[[int], Iterator[Rows]]  # rows to skip -> this rank's rows, epoch after epoch


def _load(shards: ShardSet) -> Callable[[int], Rows]:
    def load(i: int) -> Rows:
        url = shards.shard_urls[i]
        return read_shard(url, storage_options(url, shards.endpoint_url))
    return load


def stream_config(data: DataConfig, vocab_size: int, seed: int, rank: int, world: int) -> StreamConfig:
    remasker = None
    if data.dynamic_masking:
        remasker = Remasker(vocab_size=vocab_size, mask_id=data.mask_id, max_predictions=data.train.max_predictions,
                            masked_lm_prob=data.masked_lm_prob)
    return StreamConfig(micro_batch_size=data.micro_batch_size, seed=seed, rank=rank, world_size=world,
                        max_predictions=data.train.max_predictions, length_bucketing=data.length_bucketing,
                        bucket_window=data.bucket_window, length_buckets=data.length_buckets, remasker=remasker)


def _pinned(batches: Iterator[dict]) -> Iterator[dict]:
    """Page-locked torch tensors, made in the prefetch thread: the loop's host-to-GPU copies are then asynchronous
    and the pinning copy costs the training thread nothing."""
    import torch

    for batch in batches:
        yield {k: torch.from_numpy(v).pin_memory() for k, v in batch.items()}


def train_batches(data: DataConfig, vocab_size: int, seed: int, rank: int, world: int, start_batch: int,
                  rows: RowSource | None = None, pin_memory: bool = False) -> Prefetcher:
    """This rank's micro-batches from `start_batch` on, prefetched by a background thread (`.wait_seconds` is how
    long the loop waited for them); pinned torch tensors with `pin_memory` (for a GPU), else numpy arrays."""
    cfg = stream_config(data, vocab_size, seed, rank, world)
    if rows is not None:
        window = cfg.bucket_window if cfg.length_bucketing else 1
        first_window, skip = divmod(start_batch, window)
        source = micro_batches(rows(first_window * window * cfg.micro_batch_size), cfg, first_window, skip)
    else:
        source = iter(RankStream(data.train.shard_rows, _load(data.train), cfg, start_batch=start_batch))
    return Prefetcher(_pinned(source) if pin_memory else source, depth=max(4, 2 * data.accum))


def eval_rows(ev: EvalConfig) -> Rows:
    """The first `ev.sequences` rows of the eval shards (all when 0), read whole: eval sets are small."""
    load, parts, have = _load(ev.data), [], 0
    for i in range(len(ev.data.shard_urls)):
        parts.append(load(i))
        have += len(parts[-1])
        if ev.sequences and have >= ev.sequences:
            break
    return Rows.concat(parts)


def eval_batches(rows: Rows, ev: EvalConfig, batch_size: int, rank: int, world: int,
                 length_buckets: tuple[int, ...]) -> Iterator[dict]:
    return finite_batches(rows, batch_size, rank, world, ev.sequences or None, ev.data.max_predictions,
                          length_buckets=length_buckets)


def read_shard_set(url: str, endpoint_url: str | None = None) -> ShardSet:
    """A built dataset (its manifest, validated by `pipeline.schema`) as the loader's `ShardSet`."""
    from pipeline import schema

    manifest = schema.read_manifest(url, endpoint_url)
    inst = manifest.get("config", {}).get("instances", {})
    return ShardSet(shard_urls=tuple(schema.shard_urls(url, manifest)),
                    shard_rows=tuple(int(s["rows"]) for s in manifest["shards"]),
                    max_seq_length=int(manifest["max_seq_length"]),
                    max_predictions=int(inst.get("max_predictions_per_seq", 20)),
                    endpoint_url=endpoint_url, config_hash=manifest.get("config_hash", ""))
