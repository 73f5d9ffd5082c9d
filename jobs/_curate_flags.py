"""The build job's curation flags (``jobs/build_dataset.py``): parsed into ``curate.CurateConfig``, part of
the build's config and identity. Every filter is off by default: a build without these flags keeps every document
and the reference algorithm's statistics (docs/data.md, docs/build-checks.md)."""
from __future__ import annotations

import argparse

from curate import CurateConfig, DecontaminationConfig, DedupConfig, LanguageConfig, MixConfig, QualityConfig, parse_mix
from curate.dedup import MODES


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("curation (each off by default; docs/build-checks.md says what each removes)")
    g.add_argument("--dedup", choices=MODES, default="off",
                   help="drop duplicate documents across the whole corpus, keeping the smallest id of each group: "
                        "exact (the same text, whitespace aside) or near (MinHash + LSH: word-shingle Jaccard >= "
                        "--dedup-threshold; exact copies too). Off by default, so that a build keeps every document "
                        "and the reference's statistics (curated books and Wikipedia have few copies); web text "
                        "wants near")
    g.add_argument("--dedup-threshold", type=float, default=DedupConfig.threshold,
                   help="--dedup near: the Jaccard similarity of two documents' shingle sets that makes them "
                        "copies (the common choice: datatrove, FineWeb, NeMo Curator)")
    g.add_argument("--dedup-shingle-words", type=int, default=DedupConfig.shingle_words,
                   help="--dedup near: words per shingle (the common choice)")
    g.add_argument("--dedup-num-perm", type=int, default=DedupConfig.num_perm,
                   help="--dedup near: MinHash permutations (112: a standard error of 0.038 at Jaccard 0.8; the LSH "
                        "bands follow from them and the threshold)")
    g.add_argument("--decontaminate", nargs="+", action="extend", metavar="PATH",
                   help="evaluation sets (files or folders of .jsonl/.json/.csv/.tsv/.parquet/.conll, as "
                        "jobs/finetune.py reads them): a document sharing a --decontaminate-ngram-word n-gram with "
                        "any of their texts is dropped (or cut: --decontaminate-mode)")
    g.add_argument("--decontaminate-mode", choices=("drop", "cut"), default=DecontaminationConfig.mode,
                   help="drop the whole document, or cut only its sentences that overlap an evaluation text "
                        "(reported in reports/edited.jsonl)")
    g.add_argument("--decontaminate-ngram", type=int, default=DecontaminationConfig.ngram,
                   help="words per n-gram (GPT-3's and datatrove's choice)")
    g.add_argument("--decontaminate-fields",
                   help="comma-separated record fields holding the evaluation text (default: every string field)")
    g.add_argument("--languages",
                   help="comma-separated ISO 639 codes to keep (en,de,...): fastText's lid.176, shipped in its "
                        "package, per document; other languages are dropped")
    g.add_argument("--language-threshold", type=float, default=LanguageConfig.threshold,
                   help="--languages: the model's probability a kept document needs (FineWeb's threshold)")
    g.add_argument("--quality", action="store_true",
                   help="drop documents failing the Gopher and C4 quality rules (each counted as quality:<rule>; "
                        "made for web pages: they also remove a third of a Bible extracted in blocks)")
    g.add_argument("--mix",
                   help="SOURCE=WEIGHT,...: weigh the input files at or under SOURCE (a file or folder of --input): "
                        "2 makes each document twice (each copy its own pairs and masks), 0.5 keeps a seeded half, "
                        "0 leaves the source out; inputs no SOURCE names keep weight 1")


def _codes(text: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in (text or "").split(",") if c.strip())


def curate_config(args: argparse.Namespace) -> CurateConfig:
    """The flags as the build's ``CurateConfig`` (ValueError naming the flag and the fix)."""
    return CurateConfig(
        dedup=DedupConfig(mode=args.dedup, threshold=args.dedup_threshold, shingle_words=args.dedup_shingle_words,
                          num_perm=args.dedup_num_perm),
        decontamination=DecontaminationConfig(paths=tuple(args.decontaminate or ()), mode=args.decontaminate_mode,
                                              ngram=args.decontaminate_ngram,
                                              min_words=min(DecontaminationConfig.min_words, args.decontaminate_ngram),
                                              fields=_codes(args.decontaminate_fields)),
        language=LanguageConfig(languages=_codes(args.languages), threshold=args.language_threshold),
        quality=QualityConfig() if args.quality else None,
        mix=MixConfig(weights=parse_mix(args.mix) if args.mix else (), seed=args.seed))
