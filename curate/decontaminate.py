"""Decontamination: documents that share a word n-gram with an evaluation example are dropped, or lose the
sentences that hold it.

GPT-3 (Brown et al. 2020, appendix C) and datatrove's decontamination flag a training document that shares a
13-gram of normalised words (lower case, punctuation removed: ``curate.words``) with any evaluation
example. Evaluation texts shorter than ``ngram`` words but at least ``min_words`` long are matched whole (a 10-word
review sentence found verbatim in the corpus is a leak; a 3-word gloss is not evidence of one); shorter ones are
counted as too short to check.

The index holds, per n-gram length, the sorted unique 64-bit hashes of the evaluation n-grams and which file each
came from: 8 bytes + 4 per n-gram (the shared tasks' 6 MB of text: ~2.6 M n-grams, ~30 MB). A document's n-grams
are looked up with one ``searchsorted`` per length. ``mode="drop"`` drops a hit document (``contaminated``, with
the matched file and count as detail); ``mode="cut"`` removes every sentence that overlaps a matched n-gram (the
build's sentences: its splitter on running text, the lines of presplit input) and keeps the rest, reported as an
edit (``contaminated_cut``); a document left with no sentence is dropped.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from curate import contract
from curate.words import Ngrams, Words, words

MODES = ("drop", "cut")
QUOTE_CHARS = 160  # of a matched n-gram's words quoted in a report line
_BATCH = 4096  # evaluation texts hashed per call


@dataclasses.dataclass(frozen=True)
class DecontaminationConfig:
    """``paths``: evaluation files or folders (empty: off); ``ngram``: words per n-gram (13, GPT-3's);
    ``min_words``: the shortest evaluation text matched whole; ``mode``: drop | cut; ``fields``: the record fields
    that hold text (empty: every string field)."""

    paths: tuple[str, ...] = ()
    """Evaluation files or folders, read as fine-tuning reads them; empty: decontamination is off."""
    ngram: int = 13
    """Normalised words per n-gram; 13 is GPT-3's (Brown et al. 2020, appendix C) and datatrove's."""
    min_words: int = 8
    """Shortest evaluation text, in words, that is matched whole when shorter than ``ngram``; shorter ones are
    counted as too short to check (a few words verbatim are no evidence of a leak)."""
    mode: str = "drop"
    """drop: the whole document goes; cut: only its sentences that overlap a matched n-gram (an edit)."""
    fields: tuple[str, ...] = ()
    """Record fields that hold the evaluation text; empty: every string field."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--decontaminate-mode {self.mode!r}: use drop (the whole document) or cut (the"
                             " sentences that overlap an evaluation text)")
        if not 5 <= self.ngram <= 50:
            raise ValueError(f"--decontaminate-ngram {self.ngram}: use 5..50 words (13 is GPT-3's choice)")
        if not 1 <= self.min_words <= self.ngram:
            raise ValueError(f"min_words {self.min_words}: use 1..ngram ({self.ngram})")


@dataclasses.dataclass
class NgramIndex:
    """Per n-gram length: sorted unique hashes and, aligned, the index in ``files`` of a file holding each."""

    files: list[str]
    """The evaluation files, in the order their texts came; ``file_of`` indexes this list."""
    grams: dict[int, np.ndarray]
    """n-gram length -> sorted unique uint64 hashes of the evaluation n-grams of that length (``ngram``, and the
    lengths of short texts matched whole), looked up with ``searchsorted``."""
    file_of: dict[int, np.ndarray]
    """n-gram length -> int32 index in ``files`` of a file holding each hash of ``grams``, aligned with it."""
    texts: int = 0
    """Evaluation texts read, all files together."""
    too_short: int = 0
    """Evaluation texts under ``min_words`` words, not checked."""
    checked: list[int] = dataclasses.field(default_factory=list)
    """Per file (aligned with ``files``): its texts long enough to be matched."""
    examples: list[str] = dataclasses.field(default_factory=list)
    """How the report names each evaluation example (its id field or ``record k``), when the texts came with them
    (``eval_texts(..., examples=True)``); ``example_of`` indexes this list."""
    example_of: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    """n-gram length -> int32 index in ``examples`` of an example holding each hash of ``grams`` (empty without
    examples)."""

    @property
    def size(self) -> int:
        return sum(len(g) for g in self.grams.values())

    def digest(self) -> str:
        """sha256 of what the filter matches against (the n-grams by length, the files' names): a changed
        evaluation set changes it, a copied or touched one does not."""
        import hashlib

        h = hashlib.sha256(repr((self.files, sorted(self.grams))).encode())
        for n in sorted(self.grams):
            h.update(np.ascontiguousarray(self.grams[n]).tobytes())
            h.update(np.ascontiguousarray(self.file_of[n]).tobytes())
        return h.hexdigest()


def build_index(texts: Iterable[tuple[str, ...]], cfg: DecontaminationConfig) -> NgramIndex:
    """The index of (file, text) pairs, or (file, text, example) triples (``curate.eval_sets.eval_texts``): with
    examples, a drop's report names the example it matched."""
    files: dict[str, int] = {}
    examples: dict[tuple[str, str], int] = {}
    parts: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    n_texts = too_short = 0
    checked: list[int] = []
    batch: list[tuple[str, ...]] = []

    def flush() -> None:
        nonlocal too_short
        w = words([item[1] for item in batch])
        fid = np.array([files.setdefault(item[0], len(files)) for item in batch], dtype=np.int32)
        eid = np.array([examples.setdefault((item[0], item[2]), len(examples)) if len(item) > 2 else -1
                        for item in batch], dtype=np.int32)
        counts = np.diff(w.offsets)
        too_short += int((counts < cfg.min_words).sum())
        per_file = np.bincount(fid[counts >= cfg.min_words], minlength=len(files))
        checked.extend([0] * (len(files) - len(checked)))
        for f, c in enumerate(per_file.tolist()):
            checked[f] += c
        lengths = {cfg.ngram} | {int(c) for c in np.unique(counts) if cfg.min_words <= c < cfg.ngram}
        grams = Ngrams(w)
        for n in sorted(lengths):
            g, off = grams(n)
            per_doc = np.diff(off)
            if n < cfg.ngram:  # a short text is one gram of its own length; longer texts' n-grams are not these
                keep = np.repeat(counts == n, per_doc)
                g, per_doc = g[keep], np.where(counts == n, per_doc, 0)
            parts.setdefault(n, []).append((g, np.repeat(fid, per_doc), np.repeat(eid, per_doc)))
        batch.clear()

    for item in texts:
        batch.append(item)
        n_texts += 1
        if len(batch) >= _BATCH:
            flush()
    if batch:
        flush()
    grams, file_of, example_of = {}, {}, {}
    for n, chunks in parts.items():
        g = np.concatenate([c[0] for c in chunks])
        f = np.concatenate([c[1] for c in chunks])
        uniq, first = np.unique(g, return_index=True)
        grams[n], file_of[n] = uniq, f[first]
        if examples:
            example_of[n] = np.concatenate([c[2] for c in chunks])[first]
    return NgramIndex(list(files), grams, file_of, n_texts, too_short, checked, [e for _, e in examples],
                      example_of)


def _hits(index: NgramIndex, w: Words) -> tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray, np.ndarray,
                                                                         np.ndarray]]]:
    """(hit count per document, per length: (n, gram positions, their documents, matched file ids, their places
    in the index's table of that length))."""
    n_docs = len(w.offsets) - 1
    total = np.zeros(n_docs, dtype=np.int64)
    found = []
    grams = Ngrams(w)
    for n, table in index.grams.items():
        g, off = grams(n)
        if not len(g) or not len(table):
            continue
        at = np.minimum(np.searchsorted(table, g), len(table) - 1)
        hit = table[at] == g
        if not hit.any():
            continue
        pos = np.flatnonzero(hit)
        doc = np.searchsorted(off, pos, side="right") - 1
        total += np.bincount(doc, minlength=n_docs)
        found.append((n, pos - off[doc], doc, index.file_of[n][at[pos]], at[pos]))
    return total, found


class Decontaminate:
    """The filter (module docstring). ``presplit``: a ``lines`` column holds one sentence per line."""

    def __init__(self, index: NgramIndex, cfg: DecontaminationConfig, presplit: bool = False):
        self.index, self.cfg, self.presplit = index, cfg, presplit

    def _sentences(self, table: pa.Table, row: int, text: str) -> list[str]:
        if self.presplit and contract.LINES in table.column_names:
            return [s for s in table.column(contract.LINES)[row].as_py() if s.strip()]
        from corpus.sentences import split_sentences

        return split_sentences(text)

    def _cut(self, sentences: list[str]) -> list[str]:
        """The sentences that no matched n-gram touches (matching over the whole word stream of the document)."""
        w = words(sentences)
        per_sentence = w.offsets
        doc = Words(w.hashes, np.array([0, len(w.hashes)], dtype=np.int64), w.lengths)
        _, found = _hits(self.index, doc)
        touched = np.zeros(len(w.hashes) + 1, dtype=np.int64)
        for n, pos, _, _, _ in found:
            np.add.at(touched, pos, 1)
            np.add.at(touched, pos + n, -1)
        hit_word = np.cumsum(touched[:-1]) > 0
        per = np.add.reduceat(hit_word.astype(np.int64), per_sentence[:-1]) if len(hit_word) else []
        empty = np.diff(per_sentence) == 0
        return [s for s, h, e in zip(sentences, per, empty, strict=False) if e or not h]

    def _first_match(self, w: Words, buf: bytes, found, d: int, f: int) -> str:
        """``; <example>: "<the document's matched words>"`` for document d's first n-gram matched in file f (the
        words lower-cased, at most ``QUOTE_CHARS``); empty when the index has no examples."""
        best = None
        for n, pos, doc, fid, at in found:
            sel = np.flatnonzero((doc == d) & (fid == f))
            if len(sel) and (best is None or int(pos[sel[0]]) < best[1]):
                best = (n, int(pos[sel[0]]), int(at[sel[0]]))
        if best is None or not self.index.example_of or w.starts is None:
            return ""
        n, pos, at = best
        first = int(w.offsets[d]) + pos
        a, b = int(w.starts[first]), int(w.starts[first + n - 1] + w.lengths[first + n - 1])
        quote = buf[a:b].decode("utf-8", "replace").replace("\n", " ")
        if len(quote) > QUOTE_CHARS:
            quote = quote[:QUOTE_CHARS - 1] + "…"
        example = self.index.examples[int(self.index.example_of[n][at])]
        return f'; {example}: "{quote}"'

    @contract.per_slice
    def __call__(self, table: pa.Table) -> contract.Filtered:
        text = contract.texts(table)
        w = words([t or "" for t in text])
        total, found = _hits(self.index, w)
        buf = " ".join((t or "").lower() for t in text).encode("utf-8", "surrogatepass") if total.any() else b""
        files: dict[int, Counter] = {}
        for _, _, doc, fid, _ in found:
            for d, f in zip(doc.tolist(), fid.tolist(), strict=False):
                files.setdefault(d, Counter())[f] += 1
        drop = np.zeros(len(table), dtype=bool)
        details, edit_rows, edits, edit_details = [], [], [], []
        for d in np.flatnonzero(total).tolist():
            f, _ = files[d].most_common(1)[0]
            what = f"{int(total[d])} n-grams of {self.index.files[f]}{self._first_match(w, buf, found, d, f)}"
            if self.cfg.mode == "cut":
                sentences = self._sentences(table, d, text[d] or "")
                kept = self._cut(sentences)
                if kept:
                    edit_rows.append(d)
                    edits.append(kept)
                    edit_details.append(f"cut {len(sentences) - len(kept)} of {len(sentences)} sentences: {what}")
                    continue
            drop[d] = True
            details.append(what)
        edited = contract.dropped_rows(table, edit_rows, [contract.CUT] * len(edit_rows), details=edit_details)
        table = contract.with_texts(table, edit_rows, edits)
        return contract.split(table, drop, [contract.CONTAMINATED] * len(details), details=details, edited=edited)
