"""The build's checks of its settings and of what the data made of them: one line each, a warning with the figure
where the result may be what the user wanted, an error (``ValueError``) where the dataset would be wrong.

    CheckConfig                                  what the user allows (--max-unk-fraction)
    settings_warnings(instances)                 flags that are legal but waste or skew the data
    vocab_size_warning(asked, got)               a trained vocabulary far smaller than asked
    unk_check(unk, tokens, per_file, ...)        a vocabulary that maps much of the corpus to [UNK]

Thresholds, from measurements (2-core box, 2026-11-25, ``corpus.tokenize.WordPieceEncoder``, lower case):
the bert-base-uncased vocabulary gives 0 [UNK] in the 6.1 M tokens of our five English corpora
(../shared/data/corpora: Austen, Moby Dick, Treasury of David, Henry's commentary, World English Bible), 40.5% on
Vim's Chinese tutorial (data/sample/other) and 12.9% on its Japanese one. A vocabulary that fits its text gives
next to none, so 1% (one word in a hundred invisible to the model) is worth a warning; above 10% (about one [UNK]
per sentence of English length) the dataset teaches the model to predict [UNK], so the build stops unless
``--max-unk-fraction`` says that is intended.
"""
from __future__ import annotations

import dataclasses

from corpus.create_instances import InstanceConfig

UNK_WARN_FRACTION = 0.01
DEFAULT_MAX_UNK_FRACTION = 0.10
VOCAB_SHORTFALL_WARN = 0.9  # a trained vocabulary under 90% of the size asked is "far smaller"
_WORST_FILES = 3  # files named in the [UNK] message


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """What the user allows: not part of the dataset's identity (checks decide whether to build, not what)."""

    max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION
    """Share of the corpus's tokens that may be [UNK] before the build stops; above 10% (about one [UNK] per
    English sentence) the model would learn to predict [UNK] (module docstring); 1.0 builds anyway."""
    allow_drop: bool = False
    """Build on when a curation rule removes more than half of an input's documents; without it the build warns,
    writes the report and stops before the pool and the shards (pipeline/curation/reports.py)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_unk_fraction <= 1.0:
            raise ValueError(f"--max-unk-fraction {self.max_unk_fraction}: use a fraction in [0, 1] (default "
                             f"{DEFAULT_MAX_UNK_FRACTION}; 1 builds whatever the share of [UNK])")


def settings_warnings(cfg: InstanceConfig) -> list[str]:
    """Warnings about instance settings that are accepted but probably not meant."""
    out = []
    # The reference masks min(max_predictions_per_seq, round(len * masked_lm_prob)) tokens of a sequence.
    wanted = round(cfg.max_seq_length * cfg.masked_lm_prob)
    if cfg.max_predictions_per_seq < wanted:
        out.append(
            f"--max-predictions-per-seq {cfg.max_predictions_per_seq} caps masking below --masked-lm-prob "
            f"{cfg.masked_lm_prob}: a full {cfg.max_seq_length}-token sequence gets {cfg.max_predictions_per_seq} "
            f"masks instead of {wanted} ({cfg.max_predictions_per_seq / cfg.max_seq_length:.1%} of its tokens); "
            f"pass --max-predictions-per-seq {wanted} to mask {cfg.masked_lm_prob:.0%} (BERT: 20 at 128, 80 at 512)")
    return out


def vocab_size_warning(asked: int, got: int, documents: int) -> str | None:
    """A trained vocabulary far smaller than asked: the sample has too few distinct words (or min_frequency is
    high). The model is still right for that vocabulary, so this warns rather than fails."""
    if got >= asked * VOCAB_SHORTFALL_WARN:
        return None
    return (f"vocabulary: trained {got:,} entries of the {asked:,} asked ({got / asked:.0%}): the "
            f"{documents:,} documents it was trained on hold too few distinct words; pass a smaller --vocab-size"
            " to say so, more text, or an existing vocabulary with --vocab")


def unk_check(unk: int, tokens: int, per_file: dict[str, tuple[int, int]], vocab: str,
              max_fraction: float = DEFAULT_MAX_UNK_FRACTION, of: str = "of the corpus's tokens") -> str | None:
    """A warning (returned) above ``UNK_WARN_FRACTION`` of the tokens, a ValueError above ``max_fraction``.

    ``per_file``: path -> (unk, tokens), to name the files with the largest share. ``vocab``: what the user gave
    (a path, or a description of the trained one) and ``of`` (what was counted) for the message.
    """
    share = unk / tokens if tokens else 0.0
    if share <= min(UNK_WARN_FRACTION, max_fraction):
        return None
    worst = sorted(((u / t, p) for p, (u, t) in per_file.items() if t and u), reverse=True)[:_WORST_FILES]
    where = ", ".join(f"{p} {s:.1%}" for s, p in worst)
    what = (f"vocabulary: {share:.1%} {of} are [UNK] ({unk:,} of {tokens:,}) with {vocab}"
            f" (highest per file: {where})")
    if share > max_fraction:
        raise ValueError(f"{what}: it does not fit this text (another language or script?). Pass a vocabulary made"
                         " for it, omit --vocab to train one on the input, or raise --max-unk-fraction (now"
                         f" {max_fraction}) to build anyway")
    return f"{what}: the model will not see those words; check that the vocabulary fits this text"
