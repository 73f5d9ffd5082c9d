"""The build's steps as plain functions over one work unit; the plain loop and the Ray adapter call exactly these.

Each step commits its output file atomically and then a small JSON completion marker (datatrove style): a unit with a
marker is done and is skipped on resume; a unit without one is redone from scratch, overwriting any leftover.

    read_split        unit -> documents as sentences (strings)           [Ray: one task with tokenize_commit]
    tokenize_commit   -> _work/docs/<uid>.arrow + marker                  [the encoder is cached per worker process]
    select_pool/load_pool: the random-next pool, a seeded sample of the whole corpus (driver, then object store)
    instances_step    -> _work/instances/<uid>.arrow (bucketed) + marker   [Ray: tasks, the pool from the object store]
    shard_step        -> shards/part-i-of-S.parquet + marker              [Ray: tasks]
"""
from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from pipeline.instances import InstanceConfig, RandomDocPool, VocabInfo, create_instances_flat
from pipeline.pairs import PackedDoc
from pipeline.readers import ReadOptions, ReadReport, Unit, read_unit
from pipeline.rng import derive_seed
from pipeline.schema import instance_schema, token_dtype, work_docs_schema
from pipeline.shards import WORK_SUFFIX, ShardTask, read_work_table, write_bucketed, write_shard, write_work_table
from pipeline.storage import filesystem_for, join, open_atomic, write_json_atomic

log = logging.getLogger(__name__)

LIST_COLUMNS = ("input_ids", "masked_lm_positions", "masked_lm_ids")

_ENCODE_BATCH = 20000  # sentences per encode call: bounds the tokenizer's temporary memory
_INSTANCE_BLOCK_TOKENS = 1 << 20  # instance tokens per create_instances_flat call (~10 bytes each while masking)


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What the steps need (never the whole job config): where _work is and the component configs."""

    work: str
    output: str
    read: ReadOptions
    instances: InstanceConfig
    do_lower_case: bool
    dupe_factor: int
    vocab_size: int
    pool_tokens: int
    endpoint_url: str | None = None

    def url(self, *parts: str) -> str:
        return join(self.work, *parts)


@dataclasses.dataclass
class SplitUnit:
    uid: str
    path: str
    doc_ids: list[str]
    sentences: list[list[str]]
    report: ReadReport


def read_split(unit: Unit, ctx: StepContext) -> SplitUnit:
    """Read one unit's documents and split them into sentences (lines, with presplit)."""
    from pipeline.sentences import split_sentences

    report = ReadReport()
    doc_ids, sentences = [], []
    for doc in read_unit(unit, ctx.read, ctx.endpoint_url, report):
        if ctx.read.presplit:
            sents = [s.strip() for line in doc.lines for s in line.split("\n")]
        else:
            sents = split_sentences(" ".join(doc.lines))
        doc_ids.append(doc.doc_id)
        sentences.append([s for s in sents if s and not s.isspace()])
    return SplitUnit(unit.uid, unit.path, doc_ids, sentences, report)


def tokenize_commit(split: SplitUnit, ctx: StepContext, encoder) -> dict:
    """WordPiece the unit's sentences and commit its documents (+ pool candidates) with a marker."""
    flat = [s for sents in split.sentences for s in sents]
    parts = [encoder.encode_flat(flat[i:i + _ENCODE_BATCH]) for i in range(0, len(flat), _ENCODE_BATCH)]
    del flat
    dtype = token_dtype(ctx.vocab_size)
    # Vectorised bookkeeping over all sentences of the unit (no Python loop per sentence).
    lens = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([p[0] for p in parts]).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    del parts
    n_per_doc = np.array([len(s) for s in split.sentences], dtype=np.int64)
    doc_of_sent = np.repeat(np.arange(len(n_per_doc)), n_per_doc)
    keep = lens > 0  # the reference drops lines with no tokens ...
    kept_per_doc = np.bincount(doc_of_sent[keep], minlength=len(n_per_doc))
    tok_per_doc = np.bincount(doc_of_sent, weights=lens, minlength=len(n_per_doc)).astype(np.int64)
    doc_keep = kept_per_doc > 0  # ... and removes documents left empty; we count them
    dropped = Counter(split.report.dropped)
    if (~doc_keep).sum():
        dropped["no_tokens"] += int((~doc_keep).sum())
    doc_ids = [d for d, k in zip(split.doc_ids, doc_keep.tolist()) if k]
    inner = np.zeros(int(keep.sum()) + 1, dtype=np.int32)
    np.cumsum(lens[keep], out=inner[1:])
    outer = np.zeros(len(doc_ids) + 1, dtype=np.int32)
    np.cumsum(kept_per_doc[doc_keep], out=outer[1:])
    sentences = pa.ListArray.from_arrays(pa.array(outer), pa.ListArray.from_arrays(pa.array(inner), pa.array(values)))
    table = pa.Table.from_arrays([pa.array(doc_ids, pa.string()), sentences], schema=work_docs_schema(ctx.vocab_size))
    with open_atomic(ctx.url("docs", split.uid + WORK_SUFFIX), ctx.endpoint_url) as f:
        write_work_table(f, table)
    seed = ctx.instances.seed
    ntoks = tok_per_doc[doc_keep].tolist()
    candidates = [(derive_seed(seed, d, "pool"), d, n) for d, n in zip(doc_ids, ntoks)]
    marker = {
        "uid": split.uid, "path": split.path, "documents": len(doc_ids), "sentences": int(keep.sum()),
        "tokens": int(lens.sum()), "read_documents": len(split.doc_ids), "dropped": dict(dropped),
        "bad_files": split.report.bad_files, "pool_candidates": pool_prefix(candidates, ctx.pool_tokens),
    }
    write_json_atomic(ctx.url("docs", f"{split.uid}.done.json"), marker, ctx.endpoint_url)
    return marker


def pool_prefix(candidates: list[tuple[int, str, int]], budget: int) -> list[list]:
    """The lowest-priority documents whose tokens fit ``budget`` (at least one): what the global pool can use."""
    out, total = [], 0
    for prio, doc_id, ntok in sorted(candidates):
        if out and total + ntok > budget:
            break
        out.append([prio, doc_id, ntok])
        total += ntok
    return out


def select_pool(markers: list[dict], budget: int) -> dict[str, list[str]]:
    """Doc ids of the pool by unit: the K documents of the whole corpus with the lowest seeded hash under a budget."""
    cands = sorted((p, d, n, m["uid"]) for m in markers for p, d, n in m["pool_candidates"])
    chosen: dict[str, list[str]] = {}
    total = 0
    for k, (_, doc_id, ntok, uid) in enumerate(cands):
        if k and total + ntok > budget:
            break
        chosen.setdefault(uid, []).append(doc_id)
        total += ntok
    return chosen


def _doc_arrays(table: pa.Table) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, sentences per document as offsets, token offsets per sentence, tokens) of a _work docs table."""
    col = table.column("sentences").combine_chunks()
    inner = col.values
    return (table.column("doc_id").to_pylist(), col.offsets.to_numpy(), inner.offsets.to_numpy(),
            inner.values.to_numpy())


def iter_docs(table: pa.Table) -> Iterator[tuple[str, PackedDoc]]:
    """(doc_id, packed document) from a _work docs table, the tokens as zero-copy numpy views."""
    doc_ids, outer, inner, flat = _doc_arrays(table)
    for i, doc_id in enumerate(doc_ids):
        s0, s1 = outer[i], outer[i + 1]
        t0 = inner[s0]
        yield doc_id, PackedDoc(flat[t0 : inner[s1]], (inner[s0 : s1 + 1] - t0).astype(np.int64))


def read_docs(ctx: StepContext, uid: str) -> pa.Table:
    fs, path = filesystem_for(ctx.url("docs", uid + WORK_SUFFIX), ctx.endpoint_url)
    with fs.open(path, "rb") as f:
        return read_work_table(f)


def load_pool(ctx: StepContext, selection: dict[str, list[str]]) -> RandomDocPool:
    """Build the pool from the chosen documents, in a fixed order (unit, then position)."""
    ids: list[str] = []
    tokens: list[np.ndarray] = []
    sent_lengths: list[np.ndarray] = []
    doc_sentences: list[int] = []
    for uid in sorted(selection):
        wanted = set(selection[uid])
        doc_ids, outer, inner, flat = _doc_arrays(read_docs(ctx, uid))
        for i, doc_id in enumerate(doc_ids):
            if doc_id in wanted:
                s0, s1 = outer[i], outer[i + 1]
                ids.append(doc_id)
                tokens.append(flat[inner[s0] : inner[s1]])
                sent_lengths.append(np.diff(inner[s0 : s1 + 1]))
                doc_sentences.append(int(s1 - s0))
    lengths = np.concatenate(sent_lengths) if sent_lengths else np.zeros(0, np.int64)
    sent_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=sent_offsets[1:])
    doc_offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(doc_sentences, out=doc_offsets[1:])
    flat = np.concatenate(tokens) if tokens else np.zeros(0, token_dtype(ctx.vocab_size))
    return RandomDocPool.from_arrays(ids, flat, sent_offsets, doc_offsets)


def instances_step(uid: str, ctx: StepContext, pool: RandomDocPool, vocab: VocabInfo, bits: int) -> dict:
    """NSP pairs + MLM masks for every (document, pass) of a unit, written bucketed by key, with a marker."""
    parts: list[dict] = []
    passes = range(ctx.dupe_factor)
    block: list[tuple[str, PackedDoc]] = []
    block_tokens = 0

    def flush() -> None:
        out = create_instances_flat(block, passes, ctx.instances, pool, vocab)
        if out is not None:
            parts.append(out)
        block.clear()

    # Blocks of documents: one masking pass per block (numpy's per-call cost paid per block), memory bounded.
    for doc_id, doc in iter_docs(read_docs(ctx, uid)):
        block.append((doc_id, doc))
        block_tokens += len(doc.tokens)
        if block_tokens * ctx.dupe_factor >= _INSTANCE_BLOCK_TOKENS:
            flush()
            block_tokens = 0
    if block:
        flush()
    dtype = token_dtype(ctx.vocab_size)
    schema = instance_schema(ctx.vocab_size).append(pa.field("key", pa.uint64()))

    def column(name: str, np_dtype) -> pa.Array:
        if name in LIST_COLUMNS:  # (values, offsets) per block -> one list array
            values = np.concatenate([p[name][0] for p in parts]).astype(np_dtype, copy=False)
            lengths = np.concatenate([np.diff(p[name][1]) for p in parts])
            offsets = np.zeros(len(lengths) + 1, np.int32)
            np.cumsum(lengths, out=offsets[1:])
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        return pa.array(np.concatenate([p[name] for p in parts]).astype(np_dtype, copy=False))

    table = schema.empty_table() if not parts else pa.Table.from_arrays([
        column("input_ids", dtype), column("a_length", np.int16), column("masked_lm_positions", np.uint16),
        column("masked_lm_ids", dtype), column("next_sentence_label", np.int8), column("key", np.uint64),
    ], schema=schema)
    index = write_bucketed(ctx.url("instances", uid + WORK_SUFFIX), table, bits, ctx.endpoint_url)
    lengths = np.concatenate([np.diff(p["input_ids"][1]) for p in parts]) if parts else np.zeros(0, np.int64)
    hist = np.bincount(lengths) if len(lengths) else np.zeros(0, np.int64)
    marker = {
        "uid": uid, "instances": table.num_rows, "buckets": index, "bits": bits,
        "random_next": int(sum(int(p["next_sentence_label"].sum()) for p in parts)),
        "masked": int(sum(len(p["masked_lm_positions"][0]) for p in parts)),
        "seq_len_histogram": {str(k): int(v) for k, v in enumerate(hist) if v},
    }
    write_json_atomic(ctx.url("instances", f"{uid}.done.json"), marker, ctx.endpoint_url)
    return marker


def bucket_sources(markers: list[dict], ctx: StepContext) -> dict[int, list[tuple[str, list[int]]]]:
    """For each bucket, the (instances file, row groups) that hold it, in unit order (the stable tie-break)."""
    out: dict[int, list[tuple[str, list[int]]]] = {}
    for m in sorted(markers, key=lambda m: m["uid"]):
        url = ctx.url("instances", m["uid"] + WORK_SUFFIX)
        for bucket, rg, _ in m["buckets"]:
            srcs = out.setdefault(bucket, [])
            if srcs and srcs[-1][0] == url:
                srcs[-1][1].append(rg)
            else:
                srcs.append((url, [rg]))
    return out


def shard_step(task: ShardTask, ctx: StepContext, sources: dict[int, list[tuple[str, list[int]]]]) -> dict:
    from pipeline.schema import shard_name

    name = shard_name(task.index, task.count)
    rows = write_shard(task, join(ctx.output, name), sources, instance_schema(ctx.vocab_size), ctx.endpoint_url)
    assert rows == task.rows, (rows, task.rows)
    marker = {"index": task.index, "file": name, "rows": rows}
    write_json_atomic(ctx.url("shards", f"{task.index:05d}.done.json"), marker, ctx.endpoint_url)
    return marker
