"""A dataset's typed manifest (`corpus.schema.Manifest`) for tests that make their rows themselves instead of
building a dataset: the fields the loader and the configs read, the rest empty."""
from __future__ import annotations

from corpus.schema import Manifest, Shard, Totals, Vocab


def manifest_of(shard_urls: tuple[str, ...], shard_rows: tuple[int, ...], max_seq_length: int = 128,
                max_predictions: int = 20, vocab_size: int = 30522, url: str = "synthetic") -> Manifest:
    if len(shard_urls) != len(shard_rows):
        raise ValueError("one row count per shard URL")
    return Manifest(url=url, sha256="0" * 64, config_hash="0" * 64,
                    vocab=Vocab(url=f"{url}/vocab.txt", size=vocab_size, sha256="1" * 64, do_lower_case=True,
                                mask_id=103),
                    max_seq_length=max_seq_length, max_predictions=max_predictions, masked_lm_prob=0.15,
                    shards=tuple(Shard(u, u, n) for u, n in zip(shard_urls, shard_rows, strict=False)),
                    seq_len_histogram=((max_seq_length, sum(shard_rows)),),
                    totals=Totals(documents=0, sentences=0, tokens=0, instances=sum(shard_rows)), config={})
