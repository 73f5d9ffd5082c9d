"""The instances stage: one unit read, split, tokenized and turned into NSP pairs + MLM masks for every
(document, pass), in one process, written as the record batches the shards read.

    InstancesStep   unit -> _work/instances/<uid>.arrow: each pass's rows as a few record batches, InstancesMarker

Reading and tokenizing (``docs.py``) and making instances were two stages until issue 18, with the unit's tokens
stored in between and a barrier after the last unit; fused, a unit's tokens never leave the process. The pool's
members are not tokenized again: their tokens come from the merged pool, which this stage loads anyway for the
random-next segments. The algorithm is ``pipeline.create_instances.create_instances_flat`` (pure numpy over token ids),
fed a block of documents at a time; each pass's rows are cut into ``chunks`` record batches
(``shards.chunk_bounds``) so that a shard can read just its slices. The encoder, the pool and the vocabulary's ids
are loaded once per worker process.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import ClassVar

import numpy as np
import pyarrow as pa

from pipeline.build.config import BuildState
from pipeline.build.docs import encoder_for, pool_members, power_of_two_histogram, read_docs, split, tokenize_docs
from pipeline.build.executor import Shared, Stage
from pipeline.build.markers import Marker, write_marker
from pipeline.build.pool import pool_doc, pool_for
from pipeline.build.shards import chunk_bounds, chunks_per_pass
from pipeline.build.work import WORK_SUFFIX, StepContext, cached
from pipeline.create_instances import RandomDocPool, VocabInfo, create_instances_flat
from pipeline.pairs import PackedDoc
from pipeline.readers import Unit
from pipeline.schema import token_dtype, work_instance_schema
from pipeline.storage import open_atomic

LIST_COLUMNS = ("input_ids", "masked_lm_positions", "masked_lm_ids")

_INSTANCE_BLOCK_TOKENS = 1 << 20  # instance tokens per block of documents (~10 bytes each while masking)


@dataclasses.dataclass(frozen=True)
class InstancesMarker(Marker):
    """A unit's documents and instances: ``rows[p]`` rows in pass ``p``, cut into ``chunks`` record batches per
    pass; ``documents``, ``sentences``, ``tokens`` count what was kept, ``dropped`` what was not, by reason."""

    stage: ClassVar[str] = "instances"
    uid: str
    path: str
    read_documents: int
    documents: int
    sentences: int
    tokens: int
    dropped: dict[str, int]
    bad_files: dict[str, str]
    rows: tuple[int, ...]
    chunks: int
    random_next: int
    masked: int
    seq_len_histogram: dict[str, int]
    unk_tokens: int  # tokens that are [UNK]: a vocabulary that does not fit the text (pipeline/checks.py)
    tokens_per_document: dict[str, int]  # documents by tokens, in power-of-two bins keyed by their lower bound
    masked_per_seq_histogram: dict[str, int]  # sequences by their number of masked positions

    @property
    def key(self) -> str:
        return self.uid


def vocab_info_for(vocab: Shared) -> VocabInfo:
    return cached("vocab_info", vocab.key, lambda: VocabInfo.from_tokens(vocab.get()))


def _table(parts: list[dict], vocab_size: int) -> pa.Table:
    """The flat instance columns of several blocks as one table of the _work instance schema."""
    schema = work_instance_schema(vocab_size)
    if not parts:
        return schema.empty_table()
    dtype = token_dtype(vocab_size)

    def column(name: str, np_dtype) -> pa.Array:
        if name in LIST_COLUMNS:  # (values, offsets) per block -> one list array
            values = np.concatenate([p[name][0] for p in parts]).astype(np_dtype, copy=False)
            lengths = np.concatenate([np.diff(p[name][1]) for p in parts])
            offsets = np.zeros(len(lengths) + 1, np.int32)
            np.cumsum(lengths, out=offsets[1:])
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        return pa.array(np.concatenate([p[name] for p in parts]).astype(np_dtype, copy=False))

    return pa.Table.from_arrays([
        column("input_ids", dtype), column("a_length", np.int16), column("masked_lm_positions", np.uint16),
        column("masked_lm_ids", dtype), column("next_sentence_label", np.int8), column("key", np.uint64),
    ], schema=schema)


def unit_docs(unit: Unit, ctx: StepContext, encoder, pool: RandomDocPool) -> tuple[list[tuple[str, PackedDoc]], dict]:
    """The unit's documents with tokens, in unit order (members from the pool, the rest tokenized here), and the
    marker's counts of them."""
    text = read_docs(unit, ctx)
    codes = [pool.code(d) if m else -1 for d, m in zip(text.doc_ids, pool_members(text.doc_ids, ctx).tolist())]
    todo = [i for i, c in enumerate(codes) if c < 0]  # a member with no tokens is not in the pool: tokenized here
    packed: list[PackedDoc | None] = [None if c < 0 else pool_doc(pool, c) for c in codes]
    for i, d in zip(todo, tokenize_docs([split(text.lines[i], ctx.read.presplit) for i in todo], encoder,
                                         ctx.vocab_size)):
        packed[i] = d
    docs = [(doc_id, d) for doc_id, d in zip(text.doc_ids, packed) if d is not None]
    dropped = Counter(text.report.dropped)
    if len(docs) < len(text.doc_ids):
        dropped["no_tokens"] += len(text.doc_ids) - len(docs)  # the reference removes documents left empty
    counts = {"path": unit.path, "read_documents": len(text.doc_ids), "documents": len(docs),
              "sentences": sum(len(d.sent_offsets) - 1 for _, d in docs),
              "tokens": sum(len(d.tokens) for _, d in docs), "dropped": dict(dropped),
              "bad_files": dict(text.report.bad_files),
              "unk_tokens": sum(int(np.count_nonzero(d.tokens == encoder.unk_id)) for _, d in docs),
              "tokens_per_document": power_of_two_histogram([len(d.tokens) for _, d in docs])}
    return docs, counts


def instances_step(unit: Unit, ctx: StepContext, encoder, pool: RandomDocPool, vocab: VocabInfo, chunks: int = 1
                   ) -> InstancesMarker:
    """NSP pairs + MLM masks for every (document, pass) of a unit; each pass's rows cut into ``chunks`` record
    batches (contiguous, sizes differing by at most one row; batch ``p * chunks + c``), what the shards read."""
    uid = unit.uid
    docs, counts = unit_docs(unit, ctx, encoder, pool)
    passes = range(ctx.dupe_factor)
    parts: list[list[dict]] = [[] for _ in passes]
    block: list[tuple[str, PackedDoc]] = []
    block_tokens = 0

    def flush() -> None:
        # A pass's rows do not depend on the other passes (each draws from its own stream): one call per pass
        # keeps every pass's rows apart for the shards, at one numpy pass per block and pass.
        for p in passes:
            out = create_instances_flat(block, [p], ctx.instances, pool, vocab)
            if out is not None:
                parts[p].append(out)
        block.clear()

    for doc_id, doc in docs:
        block.append((doc_id, doc))
        block_tokens += len(doc.tokens)
        if block_tokens * ctx.dupe_factor >= _INSTANCE_BLOCK_TOKENS:
            flush()
            block_tokens = 0
    if block:
        flush()
    schema = work_instance_schema(ctx.vocab_size)
    rows, hist, masked_hist, random_next, masked = [], Counter(), Counter(), 0, 0
    with open_atomic(ctx.url("instances", uid + WORK_SUFFIX), ctx.endpoint_url) as f:
        with pa.ipc.new_file(f, schema) as w:
            for p in passes:
                # Rows stay in document order: the shard writer orders its rows by key (sorting here too would
                # copy every row once more for nothing).
                table = _table(parts[p], ctx.vocab_size).combine_chunks()
                for a, b in chunk_bounds(table.num_rows, chunks):
                    batches = table.slice(a, b - a).to_batches()
                    w.write_batch(batches[0] if batches else pa.RecordBatch.from_pylist([], schema=schema))
                rows.append(table.num_rows)
                if parts[p]:
                    lengths = np.concatenate([np.diff(x["input_ids"][1]) for x in parts[p]])
                    hist.update({k: v for k, v in enumerate(np.bincount(lengths).tolist()) if v})
                    per_seq = np.concatenate([np.diff(x["masked_lm_positions"][1]) for x in parts[p]])
                    masked_hist.update({k: v for k, v in enumerate(np.bincount(per_seq).tolist()) if v})
                random_next += int(sum(int(x["next_sentence_label"].sum()) for x in parts[p]))
                masked += int(sum(len(x["masked_lm_positions"][0]) for x in parts[p]))
                parts[p] = []
    marker = InstancesMarker(uid=uid, **counts, rows=tuple(rows), chunks=chunks, random_next=random_next, masked=masked,
                             seq_len_histogram={str(k): int(v) for k, v in sorted(hist.items()) if v},
                             masked_per_seq_histogram={str(k): int(v) for k, v in sorted(masked_hist.items())})
    write_marker(ctx.work, marker, ctx.endpoint_url)
    return marker


@dataclasses.dataclass(frozen=True)
class InstancesStep:
    ctx: StepContext
    vocab: Shared
    chunks: int = 1  # record batches per pass (shards.chunks_per_pass)

    def setup(self) -> None:
        import pipeline.sentences  # noqa: F401 - imported here so a warm worker's first unit does not pay for it
        encoder_for(self.vocab, self.ctx.do_lower_case)
        vocab_info_for(self.vocab)
        pool_for(self.ctx)

    def __call__(self, unit: Unit) -> InstancesMarker:
        return instances_step(unit, self.ctx, encoder_for(self.vocab, self.ctx.do_lower_case), pool_for(self.ctx),
                              vocab_info_for(self.vocab), self.chunks)


def instances_stage(s: BuildState) -> Stage:
    chunks = chunks_per_pass(len(s.units), s.cfg.dupe_factor, s.num_shards)
    return Stage("instances", InstancesStep(s.ctx, s.vocab, chunks), {u.uid: u for u in s.units}, InstancesMarker,
                 s.unit_sizes, "units")
