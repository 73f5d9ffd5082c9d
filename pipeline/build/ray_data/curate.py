"""The curate stage's dedup decision on Ray Data (``pipeline/build/curation/stage.py``): every unit's signature file read
by a task (``ReadSignatures``), then ``pipeline.curate.ray_dedup``'s shuffles and its one deciding task. The driver
launches the executions and holds object references; no signature passes through it. The drop set stays in the
object store, where the stage's items read it (``RayShared``)."""
from __future__ import annotations

import pyarrow as pa
import ray.data

from pipeline.build.ray_data.cluster import RayShared
from pipeline.build.work import StepContext, read_table
from pipeline.curate import ray_dedup
from pipeline.curate.dedup import DedupConfig, signature_schema

MAX_READ_BLOCKS = 2048  # read tasks at most (a unit's signatures are ~0.5 KB per document: ~1.5 MB per 4 MiB unit)


class ReadSignatures:
    """A block of signature files' paths -> their (id, content, sig) rows."""

    def __init__(self, ctx: StepContext, cfg: DedupConfig):
        self.ctx, self.cfg = ctx, cfg

    def __call__(self, batch: dict) -> pa.Table:
        tables = [read_table(str(f), self.ctx) for f in batch["file"]]
        return pa.concat_tables(tables).cast(signature_schema(self.cfg)) if tables \
            else signature_schema(self.cfg).empty_table()


def drop_set_shared(executor, files: list[str], ctx: StepContext, cfg: DedupConfig, key: str) -> RayShared:
    """The drop set of the signatures in ``files``, as a shared handle to its object-store copy."""
    executor._wait()  # Ray up and configured (the read pass has run: it is)
    options = executor._options()
    ds = ray.data.from_items([{"file": f} for f in files], override_num_blocks=max(1, min(len(files),
                                                                                         MAX_READ_BLOCKS)))
    sigs = ds.map_batches(ReadSignatures(ctx, cfg), batch_size=None, batch_format="numpy", **options)
    return RayShared(key, ray_dedup.drop_set_ref(sigs, cfg, executor.width))
