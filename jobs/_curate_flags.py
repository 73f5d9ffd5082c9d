"""The build job's curation flags (``jobs/build_dataset.py``): parsed into ``curate.CurateConfig``, part of
the build's config and identity. Every filter is off by default: a build without these flags keeps every document
and the reference algorithm's statistics (docs/data.md, docs/build-checks.md)."""
from __future__ import annotations

import argparse

from curate import CurateConfig, DecontaminationConfig, DedupConfig, LanguageConfig, MixConfig, QualityConfig, parse_mix
from curate.dedup import MODES
from jobs._fields import add_field


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("curation (each off by default; docs/build-checks.md says what each removes)")
    add_field(g, "--dedup", DedupConfig, "mode", choices=MODES,
              help_suffix="Drops duplicate documents across the whole corpus, keeping the smallest id of each group: "
                          "exact (the same text, whitespace aside) or near (MinHash + LSH: word-shingle Jaccard >= "
                          "--dedup-threshold; exact copies too). Curated books and Wikipedia have few copies; web "
                          "text wants near.")
    add_field(g, "--dedup-threshold", DedupConfig, "threshold", type=float, help_suffix="Used by --dedup near.")
    add_field(g, "--dedup-shingle-words", DedupConfig, "shingle_words", type=int, help_suffix="Used by --dedup near.")
    add_field(g, "--dedup-num-perm", DedupConfig, "num_perm", type=int, help_suffix="Used by --dedup near.")
    g.add_argument("--decontaminate", nargs="+", action="extend", metavar="PATH",
                   help="evaluation sets (files or folders of .jsonl/.json/.csv/.tsv/.parquet/.conll, as "
                        "jobs/finetune.py reads them): a document sharing a --decontaminate-ngram-word n-gram with "
                        "any of their texts is dropped (or cut: --decontaminate-mode)")
    add_field(g, "--decontaminate-mode", DecontaminationConfig, "mode", choices=("drop", "cut"),
              help_suffix="Cut documents are reported in reports/edited.jsonl.")
    add_field(g, "--decontaminate-ngram", DecontaminationConfig, "ngram", type=int)
    g.add_argument("--decontaminate-fields",
                   help="comma-separated record fields holding the evaluation text (default: every string field)")
    g.add_argument("--languages",
                   help="comma-separated ISO 639 codes to keep (en,de,...): fastText's lid.176, shipped in its "
                        "package, per document; other languages are dropped")
    add_field(g, "--language-threshold", LanguageConfig, "threshold", type=float, help_suffix="Used with --languages.")
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
