"""The build's manifest, made once as the typed record consumers read (``corpus.schema.Manifest``) and written by
one writer, last: its presence means the dataset is complete.

    manifest = make_manifest(state, ident, config_hash, seconds)   # from the stages' markers, no dict in between
    write_manifest(manifest, output, endpoint_url)                 # checked, then committed atomically

What the build returns is the record it wrote (its ``sha256`` that of the file's canonical JSON): the same record
``read_manifest`` gives a consumer, which a test holds.
"""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from corpus.schema import MANIFEST, VOCAB_FILE, Manifest, Shard, Totals, Vocab, token_dtype, validate_manifest
from corpus.shard_index import index_name
from pipeline.curation.reports import curation_section
from pipeline.docs import doc_totals
from pipeline.state import BuildState
from storage.fs import absolute, join, write_json_atomic
from storage.redact import redact_text


def _histogram(markers: list, field: str) -> tuple[tuple[int, int], ...]:
    hist: Counter = Counter()
    for m in markers:
        hist.update(getattr(m, field))
    return tuple(sorted((int(k), int(v)) for k, v in hist.items()))


def _as_json(v: Any) -> Any:
    """``v`` as a reader of its JSON sees it (tuples become lists)."""
    return json.loads(json.dumps(v))


def make_manifest(s: BuildState, ident: dict[str, Any], chash: str, seconds: float) -> Manifest:
    """The dataset the stages made, as its consumers will read it."""
    import hashlib

    cfg = s.cfg
    read, inst, shards = s.markers["read"], s.markers["instances"], s.markers["shards"]
    (pool,) = s.markers["pool"]
    dropped, bad_files = doc_totals(read, s.report, cfg.read.on_error)
    out = s.left_out  # what a global step removed after the read pass (drops.py)
    dropped.update(out.reasons)
    folder = absolute(cfg.output)
    totals = Totals(
        documents=sum(m.documents for m in read) - out.documents,
        sentences=sum(m.sentences for m in read) - out.sentences,
        tokens=sum(m.tokens for m in read) - out.tokens, unk_tokens=sum(m.unk_tokens for m in read) - out.unk_tokens,
        instances=sum(sum(m.rows) for m in inst), random_next=sum(m.random_next for m in shards),
        masked_lm_positions=sum(m.masked for m in shards), dropped=tuple(sorted(dropped.items())))
    tokens = s.vocab_tokens
    vocab = Vocab(url=join(folder, VOCAB_FILE), size=len(tokens), sha256=hashlib.sha256(s.vocab_bytes).hexdigest(),
                  do_lower_case=cfg.do_lower_case, mask_id=tokens.index("[MASK]") if "[MASK]" in tokens else -1,
                  trained=cfg.vocab is None)
    m = Manifest(
        url=folder, sha256="", config_hash=chash, vocab=vocab, max_seq_length=cfg.instances.max_seq_length,
        max_predictions=cfg.instances.max_predictions_per_seq, masked_lm_prob=cfg.instances.masked_lm_prob,
        shards=tuple(Shard(m.file, join(folder, m.file), m.rows, sha256=m.sha256, bytes=m.bytes,
                           index_url=join(folder, index_name(m.file)), index_sha256=m.index_sha256)
                     for m in shards),
        seq_len_histogram=_histogram(shards, "seq_len_histogram"), totals=totals, config=_as_json(ident),
        inputs=tuple(_as_json(s.inputs.stamps)), token_dtype=str(token_dtype(len(tokens))),
        masked_per_seq_histogram=_histogram(shards, "masked_per_seq_histogram"),
        tokens_per_document_histogram=tuple(
            (k, v - out.tokens_per_document.get(str(k), 0)) for k, v in _histogram(read, "tokens_per_document")
            if v > out.tokens_per_document.get(str(k), 0)),
        warnings=tuple(redact_text(w) for w in s.warnings), skipped_files=tuple(sorted(bad_files.items())),
        ignored_files=tuple(s.inputs.ignored),
        random_pool=(("corpus_tokens", s.corpus_tokens), ("documents", pool.documents),
                     ("sample_fraction", pool.threshold / (1 << 64)), ("tokens", pool.tokens)),
        build_seconds=round(seconds, 2), curation=curation_section(s, dropped))
    return dataclasses.replace(m, sha256=m.digest())


def write_manifest(m: Manifest, output: str, endpoint_url: str | None = None) -> None:
    """Commit the manifest (last: its presence means the dataset is complete), after the checks every reader makes."""
    d = m.to_dict()
    validate_manifest(d, "the new manifest")
    if m.vocab.mask_id < 0:
        raise ValueError("the vocabulary has no [MASK] token: not a BERT vocabulary; build with one")
    write_json_atomic(join(output, MANIFEST), d, endpoint_url)
