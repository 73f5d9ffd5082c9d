"""What the driver plans from counts, never from documents: the random-next pool's sampling threshold, the
default number of shards, both from the tokens the read pass counted (exact, the same however the input came), and
the pieces each unit's passes are cut into for the shards' global order."""
from __future__ import annotations

COMPRESSED_RATIO = 3  # text compresses ~3x (gzip/zstd/Parquet+zstd): a compressed unit's text, for progress
SHARD_BYTES = 128 << 20  # the default shard size
# Parquet bytes per token and pass (uint16 ids, zstd, masks included): 2.40 measured on Moby Dick at seq 128, dupe 5
# (3.55 MB of shards for 296k tokens); it plans --num-shards from the corpus's tokens.
PARQUET_BYTES_PER_TOKEN = 2.4


def pool_threshold(pool_tokens: int, corpus_tokens: int) -> int:
    """The 64-bit hash threshold that makes the pool a p = min(1, budget / corpus tokens) sample of documents."""
    p = min(1.0, pool_tokens / max(1, corpus_tokens))
    return 1 << 64 if p >= 1.0 else int(p * (1 << 64))


def default_num_shards(corpus_tokens: int, dupe_factor: int, vocab_size: int) -> int:
    """Shards of at most about ``SHARD_BYTES`` of Parquet for the corpus (at least one): a size a training worker
    loads in a second or two and a shard item writes in bounded memory, whatever the corpus's size. It depends on
    the corpus's tokens only, never on the CPUs, so the dataset does not either."""
    per_token = PARQUET_BYTES_PER_TOKEN * (1 if vocab_size <= 65536 else 2)
    return max(1, -(-int(corpus_tokens * dupe_factor * per_token) // SHARD_BYTES))


CHUNKS_PER_SHARD = 32  # pieces of units a shard should mix, when the corpus has fewer units than that per shard
MAX_CHUNKS = 64  # pieces per unit and pass at most: the plan holds (units x passes x chunks) cuts


def chunks_per_pass(num_units: int, dupe_factor: int, num_shards: int) -> int:
    """Pieces per unit and pass, so that a shard spans ~CHUNKS_PER_SHARD pieces (1 for a large corpus)."""
    need = -(-CHUNKS_PER_SHARD * num_shards // max(1, num_units * dupe_factor))  # ceil
    return max(1, min(MAX_CHUNKS, need))
