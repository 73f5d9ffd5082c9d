"""The whole curation as a plain loop over batches of documents, in this process: the reference for the Ray Data
operators (same functions, same drop set) and for debugging a curation on a sample.

Pass 1 runs the per-document filters and the signature operator on every batch; the global step decides the
duplicates; pass 2 applies the drop set and the mix weights. The build runs the same three parts at its read pass,
between its passes, and in its instances pass (``curate/__init__.py``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pyarrow as pa

from curate import contract
from curate.config import CurateConfig
from curate.decontaminate import NgramIndex
from curate.dedup import ApplyDrops, Signatures, drop_set
from curate.mix import Mix
from curate.report import counts


@dataclasses.dataclass
class Curated:
    kept: list[pa.Table]
    """The documents that stay, one table per input batch, in order (text possibly cut by decontamination)."""
    dropped: list[pa.Table]
    """The removed documents (``DROPPED_SCHEMA``), non-empty tables only."""
    edited: list[pa.Table]
    """Documents kept with part of their text removed (``DROPPED_SCHEMA``), non-empty tables only."""
    drops: pa.Table
    """The dedup drop set (``DUPLICATE_SCHEMA``: id, reason, duplicate_of); empty when dedup is off."""

    def counts(self) -> dict[str, int]:
        return counts(self.dropped)


def curate(batches: Iterable[pa.Table], cfg: CurateConfig, index: NgramIndex | None = None,
           presplit: bool = False) -> Curated:
    filters = [f for _, f in cfg.document_filters(index, presplit)]
    kept, dropped, edited, sigs = [], [], [], []
    for batch in batches:
        contract.check_documents(batch)
        for f in filters:
            out = f(batch)
            batch = out.kept
            dropped.append(out.dropped)
            edited.append(out.edited)
        if cfg.dedup.mode != "off":
            sigs.append(Signatures(cfg.dedup)(batch))
        kept.append(batch)
    drops = drop_set(sigs, cfg.dedup) if cfg.dedup.mode != "off" else contract.DUPLICATE_SCHEMA.empty_table()
    second = [ApplyDrops(drops)] if len(drops) else []
    if cfg.mix.weights:
        second.append(Mix(cfg.mix))
    out_kept = []
    for batch in kept:
        for f in second:
            out = f(batch)
            batch = out.kept
            dropped.append(out.dropped)
        out_kept.append(batch)
    return Curated(out_kept, [d for d in dropped if len(d)], [e for e in edited if len(e)], drops)
