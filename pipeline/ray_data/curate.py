"""The curate stage's dedup decision on Ray Data (``pipeline/curation/stage.py``): every unit's signature file read
by a task (``ReadSignatures``), then ``curate.ray_dedup``'s shuffles and its one deciding task (or, for
signatures that fit one shuffle partition, one task that reads and decides: ``curate.dedup.drop_set``,
the same functions on the same rows). The driver
launches the executions and holds object references; no signature passes through it. The drop set stays in the
object store, where the stage's items read it (``RayShared``)."""
from __future__ import annotations

import pyarrow as pa
import ray
import ray.data

from curate import ray_dedup
from curate.dedup import DedupConfig, drop_set, signature_schema
from pipeline.ray_data.cluster import RayShared
from pipeline.work import StepContext, read_table

PARTITION_BYTES = ray_dedup.PARTITION_BYTES  # rows per shuffle partition (and what one task decides alone)
MAX_READ_BLOCKS = 2048  # read tasks at most (a unit's signatures are ~0.5 KB per document: ~1.5 MB per 4 MiB unit)


class ReadSignatures:
    """A block of signature files' paths -> their (id, content, sig) rows."""

    def __init__(self, ctx: StepContext, cfg: DedupConfig):
        self.ctx, self.cfg = ctx, cfg

    def __call__(self, batch: dict) -> pa.Table:
        tables = [read_table(str(f), self.ctx) for f in batch["file"]]
        return pa.concat_tables(tables).cast(signature_schema(self.cfg)) if tables \
            else signature_schema(self.cfg).empty_table()


def _in_one_task(files: list[str], ctx: StepContext, cfg: DedupConfig) -> pa.Table:
    return drop_set((read_table(f, ctx) for f in files), cfg)


def drop_set_shared(executor, files: list[str], documents: int, ctx: StepContext, cfg: DedupConfig,
                    key: str) -> RayShared:
    """The drop set of the signatures in ``files`` (of ``documents`` documents), as a shared handle to its
    object-store copy. Signatures that fit one shuffle partition are decided by one task, as the shuffles would
    (one partition each) without their executions' fixed cost; more go through ``ray_dedup``'s shuffles."""
    executor._wait()  # Ray up and configured (the read pass has run: it is)
    options = executor._options()
    if documents * ray_dedup.signature_row_bytes(cfg) <= PARTITION_BYTES:
        return RayShared(key, ray.remote(_in_one_task).options(**options).remote(files, ctx, cfg))
    ds = ray.data.from_items([{"file": f} for f in files], override_num_blocks=max(1, min(len(files),
                                                                                         MAX_READ_BLOCKS)))
    sigs = ds.map_batches(ReadSignatures(ctx, cfg), batch_size=None, batch_format="numpy", **options)
    return RayShared(key, ray_dedup.drop_set_ref(sigs, cfg, executor.width, PARTITION_BYTES))
