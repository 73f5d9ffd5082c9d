"""The build job's curation flags (``jobs/build_dataset.py``): parsed into ``curate.CurateConfig``, part of
the build's config and identity. Every filter is off by default: a build without these flags keeps every document
and the reference algorithm's statistics (docs/data.md, docs/build-checks.md)."""
from __future__ import annotations

import argparse
import dataclasses

from corpus.checks import CheckConfig
from curate import CurateConfig, DecontaminationConfig, DedupConfig, LanguageConfig, MixConfig, QualityConfig, parse_mix
from curate.dedup import MODES
from curate.quality import DEFAULT_RULES, RULES
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
                        "made for web pages: they also remove a third of a Bible extracted in blocks); every rule "
                        "but curly_bracket by default, each with its own --quality-* threshold")
    g.add_argument("--quality-rules", metavar="RULE,...",
                   help=f"with --quality: the rules to run instead of the default set ({', '.join(DEFAULT_RULES)}); "
                        f"all: {', '.join(RULES)}")
    g.add_argument("--quality-skip", metavar="RULE,...",
                   help="with --quality: rules to turn off (e.g. min_sentences,line_punct)")
    for f in QUALITY_THRESHOLDS:
        add_field(g, "--quality-" + f.name.replace("_", "-"), QualityConfig, f.name,
                  type=int if f.type in (int, "int") else float, help_suffix="Used with --quality.")
    add_field(g, "--allow-drop", CheckConfig, "allow_drop")
    g.add_argument("--mix",
                   help="SOURCE=WEIGHT,...: weigh the input files at or under SOURCE (a file or folder of --input): "
                        "2 makes each document twice (each copy its own pairs and masks), 0.5 keeps a seeded half, "
                        "0 leaves the source out; inputs no SOURCE names keep weight 1")


QUALITY_THRESHOLDS = tuple(f for f in dataclasses.fields(QualityConfig)
                           if f.name not in ("rules", "stop_word_languages"))


def _codes(text: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in (text or "").split(",") if c.strip())


def quality_config(args: argparse.Namespace) -> QualityConfig | None:
    """``--quality`` and its rule and threshold flags as a ``QualityConfig`` (None without --quality); ValueError
    naming the flag for an unknown rule, or a quality flag given without --quality."""
    given = [f"--quality-{f.name.replace('_', '-')}" for f in QUALITY_THRESHOLDS
             if getattr(args, "quality_" + f.name) != f.default]
    given += [flag for flag in ("--quality-rules", "--quality-skip") if getattr(args, flag[2:].replace("-", "_"))]
    if not args.quality:
        if given:
            raise ValueError(f"{given[0]} needs --quality: add --quality to run the quality rules")
        return None
    for flag in ("--quality-rules", "--quality-skip"):
        unknown = [r for r in _codes(getattr(args, flag[2:].replace("-", "_"))) if r not in RULES]
        if unknown:
            raise ValueError(f"{flag} {','.join(unknown)}: not a quality rule; name one or more of "
                             f"{', '.join(RULES)}")
    chosen = _codes(args.quality_rules) or DEFAULT_RULES
    skip = set(_codes(args.quality_skip))
    rules = tuple(r for r in chosen if r not in skip)
    if not rules:
        raise ValueError("--quality-skip turns off every rule: drop --quality instead, or skip fewer rules")
    return QualityConfig(rules=rules, stop_word_languages=_codes(args.languages) or ("en",),
                         **{f.name: getattr(args, "quality_" + f.name) for f in QUALITY_THRESHOLDS})


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
        quality=quality_config(args),
        mix=MixConfig(weights=parse_mix(args.mix) if args.mix else (), seed=args.seed))
