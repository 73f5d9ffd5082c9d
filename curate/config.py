"""``CurateConfig``: every curation component's own config, composed, and the order the filters run in.

Order, and why: language (a page in another language would fail rules tuned for English and be miscounted as
quality), quality, decontamination (per document, so far), then deduplication among the documents still kept (a
dropped page never decides which copy survives; only their signatures are computed), then the mix weights (applied
to the corpus that will be built). Every filter is off by default: a build without flags keeps every document and
the reference algorithm's statistics (docs/data.md).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pyarrow as pa

from curate.contract import Filtered
from curate.decontaminate import Decontaminate, DecontaminationConfig, NgramIndex
from curate.dedup import DedupConfig
from curate.language import LanguageConfig, LanguageFilter
from curate.mix import MixConfig
from curate.quality import QualityConfig, QualityFilter


@dataclasses.dataclass(frozen=True)
class CurateConfig:
    dedup: DedupConfig = DedupConfig()
    """Duplicate removal across the whole corpus; off by default, as the reference keeps every document."""
    decontamination: DecontaminationConfig = DecontaminationConfig()
    """Removal of documents sharing an n-gram with an evaluation set; off while it names no paths."""
    language: LanguageConfig = LanguageConfig()
    """Language identification; off while it names no languages."""
    quality: QualityConfig | None = None
    """The Gopher and C4 quality rules; None: no quality rules (``--quality`` turns them on)."""
    mix: MixConfig = MixConfig()
    """Per-source weights; off while it holds none (every document once)."""

    @property
    def enabled(self) -> bool:
        return bool(self.dedup.mode != "off" or self.decontamination.paths or self.language.languages
                    or self.quality is not None or self.mix.weights)

    def document_filters(self, index: NgramIndex | None = None,
                         presplit: bool = False) -> list[tuple[str, Callable[[pa.Table], Filtered]]]:
        """(name, filter) of the per-document filters that are on, in order; ``index``: the evaluation n-grams
        (``decontaminate.build_index``), needed when decontamination is on."""
        out: list[tuple[str, Callable[[pa.Table], Filtered]]] = []
        if self.language.languages:
            out.append(("language", LanguageFilter(self.language)))
        if self.quality is not None:
            out.append(("quality", QualityFilter(self.quality)))
        if self.decontamination.paths:
            if index is None:
                raise ValueError("decontamination is on but no evaluation index was built: pass"
                                 " build_index(eval_texts(...)) to document_filters")
            out.append(("decontaminate", Decontaminate(index, self.decontamination, presplit)))
        return out
