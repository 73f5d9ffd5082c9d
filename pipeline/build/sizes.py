"""What the driver plans from metadata alone, before any text is read: the tokens the inputs should hold (the
random-next pool's sampling threshold follows from them) and the default number of shards."""
from __future__ import annotations

from pipeline.readers import ReadOptions, Unit, detect_format
from pipeline.storage import FileInfo, compression_of

# Planning the random-next pool before any text is read: tokens are estimated from the input's size. ~4.2 bytes of
# English text per WordPiece token (bert-base-uncased on Moby Dick, news, docs); 4.0 errs towards a pool a little
# under the budget. Compressed inputs count COMPRESSED_RATIO text bytes per stored byte.
BYTES_PER_TOKEN = 4.0
COMPRESSED_RATIO = 3  # text compresses ~3x (gzip/zstd/Parquet+zstd); only the pool's threshold uses it
SHARD_BYTES = 128 << 20  # the default shard size
# Parquet bytes per token and pass (uint16 ids, zstd, masks included): 2.40 measured on Moby Dick at seq 128, dupe 5
# (3.55 MB of shards for 296k tokens); it plans --num-shards before any text is read.
PARQUET_BYTES_PER_TOKEN = 2.4


def planned_tokens(files: list[FileInfo], units: list[Unit], read: ReadOptions) -> int:
    """Tokens the inputs should hold, from metadata alone (no reads): listed sizes, and for big compressed inputs
    the decompressed sizes of their pieces, so that a ``.gz`` and the same text uncompressed plan the same pool."""
    pieces = [u for u in units if u.data is not None]
    text_bytes = sum(u.end - u.start for u in pieces)
    cut = {u.path for u in pieces}
    for f in files:
        if f.path not in cut:
            packed = compression_of(f.path) or detect_format(f.path, read.fmt) == "parquet"
            text_bytes += f.size * (COMPRESSED_RATIO if packed else 1)
    return max(1, int(text_bytes / BYTES_PER_TOKEN))


def pool_threshold(pool_tokens: int, planned: int) -> int:
    """The 64-bit hash threshold that makes the pool a p = min(1, budget / planned tokens) sample of documents."""
    p = min(1.0, pool_tokens / planned)
    return 1 << 64 if p >= 1.0 else int(p * (1 << 64))


def default_num_shards(planned_tokens: int, dupe_factor: int, vocab_size: int) -> int:
    """Shards of at most about ``SHARD_BYTES`` of Parquet for the planned corpus (at least one): a size a training
    worker loads in a second or two and a shard item writes in bounded memory, whatever the corpus's size. It
    depends on the inputs' listed sizes only, never on the CPUs, so the dataset does not either."""
    per_token = PARQUET_BYTES_PER_TOKEN * (1 if vocab_size <= 65536 else 2)
    return max(1, -(-int(planned_tokens * dupe_factor * per_token) // SHARD_BYTES))
