"""WordPiece tokenisation with the reference BERT rules, on Hugging Face ``tokenizers``.

The reference (google-research/bert ``tokenization.py``) runs a BasicTokenizer (drop control characters, split CJK
characters, lowercase and strip accents when uncased, split punctuation) and then greedy longest-match WordPiece,
where a word of more than 200 characters becomes ``[UNK]``. ``tokenizers`` has the same pieces in Rust:
``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece``; its one different default is
``max_input_chars_per_word=100``, so we set 200.

Special tokens are deliberately *not* registered as added tokens: the reference tokenises the text "[MASK]" as
``[ mask ]`` like any other text, so must we (only the instance builder inserts [CLS]/[SEP]/[MASK] ids).

Speed: ``BertNormalizer`` is ~40% of the encoding time, and on printable ASCII (plus curly quotes and dashes) it
reduces to ``str.lower()`` (uncased) or nothing (cased): no accents, no CJK, no control characters, and
tabs/newlines split words the same either way. On such sentences ``encode`` splits on whitespace in Python (one
``str.split`` per batch) and pre-tokenizes and WordPieces each distinct whitespace-delimited chunk once per encoder,
through a second tokenizer with no normalizer; the other sentences go through the full tokenizer. Identical ids
(tested against the full path and the reference), several times faster on English text.

``WordPieceEncoder`` pickles by value (the vocabulary travels with it); build one per process and keep it, so that
its chunk table stays warm (the Ray build caches one per worker process). The table is bounded (``_WORD_CACHE_MAX``
chunks): when full it keeps its most used three quarters (uses counted per chunk, halved at each eviction) and
drops the rest, so a worker on a varied corpus (578k distinct chunks in 54 MB of news, docs and Wikipedia) keeps its
frequent words instead of dropping them all and encoding them again. Its lookup is a dict that lives with it: each
call hashes only its own batch's chunks (Arrow ``dictionary_encode``), where ``pc.index_in(value_set=table)``
rebuilt a hash table of the whole table on every call (~15% of a build worker's main thread on varied text).
Measured against ``tokenizers``' own pipeline: benchmarks/tokenizer_throughput.py, docs/benchmarks.md.
"""
from __future__ import annotations

import itertools
import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

from corpus.masking import VocabInfo
from corpus.ragged import ragged_indices
from corpus.schema import MAX_VOCAB_BYTES  # a model folder's vocab.txt may be anyone's
from storage.untrusted import read_local_bounded

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The reference's limit (HF's default is 100): longer words become [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
# A sentence may skip BertNormalizer when every character is printable ASCII (tab, newline and carriage return are
# whitespace to both paths) or punctuation the normalizer leaves alone: no case, no decomposition, not CJK, not
# control (curly quotes and dashes are common in edited English). Anything else takes the full path.
_SAFE_PUNCTUATION = ("\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2013\u2014\u2015\u2026\u00ab\u00bb\u2039"
                     "\u203a\u2022")
_NEEDS_NORMALIZER = re.compile(f"[^\t\n\r\x20-\x7e{_SAFE_PUNCTUATION}]")
# Distinct whitespace-delimited chunks remembered per encoder (the dict, the strings and the pieces: ~120 MB at
# most). A full table keeps its most used _WORD_CACHE_KEEP share (by uses, aged) and drops the rest: never whole.
_WORD_CACHE_MAX = 500_000
_WORD_CACHE_KEEP = 0.75


def _needs_normalizer(sentences: list[str]) -> np.ndarray:
    """Indices of the sentences that must go through BertNormalizer (one regex scan over the whole batch)."""
    joined = "".join(sentences)
    hits = [m.start() for m in _NEEDS_NORMALIZER.finditer(joined)]
    if not hits:
        return np.zeros(0, np.int64)
    ends = np.cumsum(np.fromiter(map(len, sentences), np.int64, len(sentences)))
    return np.unique(np.searchsorted(ends, np.asarray(hits), side="right"))


def read_vocab(path: str | Path) -> list[str]:
    """Vocabulary tokens in id order from a BERT ``vocab.txt`` (one token per line), at most MAX_VOCAB_BYTES
    (a model folder's vocabulary may be anyone's)."""
    text = read_local_bounded(path, MAX_VOCAB_BYTES, "vocabulary file").decode("utf-8")
    # rstrip("\n") only: the reference keeps other whitespace-free tokens verbatim; a blank line is an error.
    tokens = [line.rstrip("\r") for line in text.split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    if not tokens:
        raise ValueError(f"vocabulary file {path} is empty; pass a BERT vocab.txt (one token per line)")
    return tokens


def write_vocab(tokens: list[str], path: str | Path) -> None:
    """Write tokens in id order, one per line (the BERT ``vocab.txt`` format)."""
    with open(path, "w", encoding="utf-8") as f:
        for t in tokens:
            f.write(t + "\n")


def _normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    # The reference strips accents exactly when it lowercases.
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
    )


def build_tokenizer(tokens: list[str], do_lower_case: bool = True) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` reproducing the reference BasicTokenizer + WordpieceTokenizer."""
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("vocabulary has duplicate tokens; each line of vocab.txt must be unique")
    if "[UNK]" not in vocab:
        raise ValueError("vocabulary has no [UNK] token; a BERT vocab.txt must contain [UNK]")
    tok = Tokenizer(
        WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                  max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    )
    tok.normalizer = _normalizer(do_lower_case)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


class WordPieceEncoder:
    """Sentences -> WordPiece id arrays (no special tokens), loaded once per worker process
    (``pipeline.docs.encoder_for`` caches it).

    Attributes: ``vocab_size``, ``cls_id``, ``sep_id``, ``mask_id``, ``pad_id``, ``unk_id``, ``is_continuation``
    (bool array over ids, True for ``##`` pieces) and ``vocab_info`` (the small struct the instance builder needs).
    """

    def __init__(self, vocab_path: str | Path | None = None, do_lower_case: bool = True, *,
                 tokens: list[str] | None = None):
        if tokens is None:
            if vocab_path is None:
                raise ValueError("WordPieceEncoder needs vocab_path (a BERT vocab.txt) or tokens")
            tokens = read_vocab(vocab_path)
        self._init(list(tokens), do_lower_case)

    def _init(self, tokens: list[str], do_lower_case: bool) -> None:
        self.tokens = tokens
        self.do_lower_case = do_lower_case
        self._tok = build_tokenizer(tokens, do_lower_case)
        self._tok_ascii = build_tokenizer(tokens, do_lower_case)
        self._tok_ascii.normalizer = None  # fed clean ASCII words, already lowercased when uncased
        self.vocab_info = VocabInfo.from_tokens(tokens)
        self.vocab_size = self.vocab_info.vocab_size
        self.cls_id = self.vocab_info.cls_id
        self.sep_id = self.vocab_info.sep_id
        self.mask_id = self.vocab_info.mask_id
        self.pad_id = self.vocab_info.pad_id
        self.unk_id = self.vocab_info.unk_id
        self.is_continuation = self.vocab_info.is_continuation
        # uint16 halves memory and Arrow size; ids of a >65,535-entry vocab need uint32.
        self.dtype = np.dtype(np.uint16) if self.vocab_size <= 65536 else np.dtype(np.uint32)
        self._reset_word_table()

    def __getstate__(self) -> dict:
        # Rebuild from the token list rather than pickling the Rust object: small, version-independent.
        return {"tokens": self.tokens, "do_lower_case": self.do_lower_case}

    def __setstate__(self, state: dict) -> None:
        self._init(state["tokens"], state["do_lower_case"])

    def encode(self, sentences: list[str]) -> list[np.ndarray]:
        """One id array per sentence (possibly empty: callers drop sentences with no tokens, as the reference)."""
        values, lengths = self.encode_flat(sentences)
        return np.split(values, np.cumsum(lengths)[:-1]) if len(sentences) else []

    def encode_flat(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all ids concatenated, tokens per sentence): ``encode`` without one array per sentence.

        Plain sentences (see the module docstring) are lowercased and split on whitespace by Arrow compute kernels;
        every whitespace-delimited chunk ("whale," or "don't") is a row of a per-encoder table of its word pieces
        (a new chunk is pre-tokenized and WordPieced once, in a batch, by the normalizer-free tokenizer), found
        through the batch's distinct chunks (one dict lookup each), and the ids are gathered from the table with
        numpy: no Python loop over sentences, words or tokens. Other sentences go through the full tokenizer.
        """
        dtype = self.dtype
        n = len(sentences)
        if not n:
            return np.zeros(0, dtype), np.zeros(0, np.int64)
        full_idx = _needs_normalizer(sentences)
        plain_idx = np.setdiff1d(np.arange(n), full_idx) if len(full_idx) else None
        lengths = np.zeros(n, np.int64)
        plain_ids = np.zeros(0, dtype)
        if plain_idx is None or len(plain_idx):
            text = pa.array(sentences if plain_idx is None else [sentences[i] for i in plain_idx.tolist()], pa.string())
            chunks = pc.ascii_split_whitespace(pc.ascii_lower(text) if self.do_lower_case else text)
            rows = self._chunk_rows(chunks.flatten())
            wlen = self._wlen[rows]
            tok_cum = np.concatenate([[0], np.cumsum(wlen)])
            plain_ids = self._flat[ragged_indices(self._woff[rows], wlen)]  # each chunk's pieces, back to back
            self._evict()  # after the gather: the batch's rows were valid while it was read
            offsets = chunks.offsets.to_numpy()
            per_sentence = tok_cum[offsets[1:] - offsets[0]] - tok_cum[offsets[:-1] - offsets[0]]
            if plain_idx is None:
                return plain_ids, per_sentence.astype(np.int64)
            lengths[plain_idx] = per_sentence
        full_ids = [np.asarray(e.ids, dtype) for e in self._tok.encode_batch_fast(
            [sentences[i] for i in full_idx.tolist()], add_special_tokens=False)]
        lengths[full_idx] = [len(a) for a in full_ids]
        # Interleave back into sentence order: each group is contiguous in its own order.
        starts = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), dtype)
        for idx, vals in ((plain_idx, plain_ids), (full_idx, np.concatenate(full_ids))):
            out[ragged_indices(starts[idx], lengths[idx])] = vals
        return out, lengths

    def _chunk_rows(self, chunks: pa.Array) -> np.ndarray:
        """Row of each chunk in the word-piece table, WordPiecing (once) the chunks it does not hold.

        The batch's chunks are hashed once by Arrow (``dictionary_encode``: a table of this batch only, never of
        the whole word table), and each distinct chunk of the batch is looked up in a dict that lives as long as
        the encoder: nothing is rebuilt per call but the batch's own table. A chunk's hits (occurrences, halved at
        each eviction so that old counts fade) decide what stays when the table is full (see ``_evict``)."""
        encoded = pc.dictionary_encode(chunks)
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        distinct = encoded.dictionary.to_pylist()
        drows = np.fromiter(map(self._index.get, distinct, itertools.repeat(-1)), np.int64, len(distinct))
        missing = np.flatnonzero(drows < 0)
        if len(missing):
            new = [distinct[i] for i in missing.tolist()]
            drows[missing] = self._add(new)
            self._seen += len(new)
        self._hits[drows] += np.bincount(codes, minlength=len(distinct))
        rows = drows[codes]
        return rows

    def _add(self, new: list[str]) -> np.ndarray:
        """WordPiece the new chunks (one batch call) and append them to the table; their rows."""
        base = len(self._words)
        pieces = [e.ids for e in self._tok_ascii.encode_batch_fast(new, add_special_tokens=False)]
        lens = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
        self._woff = np.concatenate([self._woff, len(self._flat) + np.cumsum(lens) - lens])
        self._wlen = np.concatenate([self._wlen, lens])
        self._flat = np.concatenate([self._flat, np.fromiter(itertools.chain.from_iterable(pieces), self.dtype,
                                                              int(lens.sum()))])
        self._hits = np.concatenate([self._hits, np.zeros(len(new), np.int64)])
        self._index.update(zip(new, range(base, base + len(new)), strict=True))
        self._words.extend(new)
        return np.arange(base, base + len(new), dtype=np.int64)

    def _evict(self) -> None:
        """Over ``_WORD_CACHE_MAX`` chunks: keep the most used ``_WORD_CACHE_KEEP`` share of the table (by hits,
        which are then halved), drop the rest. Called between batches, never inside one (a batch's rows stay
        valid while it is gathered). The frequent words of a corpus are never re-encoded; only its long tail
        churns, a quarter of the table at a time, so the work to compact it is paid once per that many new chunks."""
        n = len(self._words)
        if n <= _WORD_CACHE_MAX:
            return
        keep_n = int(_WORD_CACHE_MAX * _WORD_CACHE_KEEP)
        keep = np.sort(np.argpartition(-self._hits, keep_n)[:keep_n]) if keep_n < n else np.arange(n)
        lens = self._wlen[keep]
        self._flat = self._flat[ragged_indices(self._woff[keep], lens)]
        self._woff = np.cumsum(lens) - lens
        self._wlen = lens
        self._hits = self._hits[keep] >> 1
        self._words = [self._words[i] for i in keep.tolist()]
        self._index = dict(zip(self._words, range(len(self._words)), strict=True))
        self._evicted += n - keep_n

    def cache_stats(self) -> dict[str, int]:
        """The chunk table: distinct chunks WordPieced so far (``distinct_chunks``, counting re-encodes after an
        eviction), chunks ``held`` now and ``evicted`` so far."""
        return {"distinct_chunks": self._seen, "held": len(self._words), "evicted": self._evicted}

    def _reset_word_table(self) -> None:
        self._index: dict[str, int] = {}  # chunk -> its row in the table
        self._words: list[str] = []  # the chunks of the table, in row order
        self._woff = np.zeros(0, np.int64)  # each row's first piece in _flat
        self._wlen = np.zeros(0, np.int64)  # and its number of pieces
        self._hits = np.zeros(0, np.int64)  # each row's uses, halved at each eviction
        self._flat = np.zeros(0, self.dtype)
        self._seen = 0
        self._evicted = 0

    __call__ = encode

    def tokenize(self, text: str) -> list[str]:
        """Word pieces as strings (for tests and debugging), through the same path as ``encode``."""
        return [self.tokens[i] for i in self.encode([text])[0]]


# The size of a trained vocabulary when none is given: BERT's WordPiece vocabularies (bert-base-uncased).
BERT_VOCAB_SIZE = 30522


def train_wordpiece(
    texts: Iterable[str] | Callable[[], Iterable[str]],
    vocab_size: int = BERT_VOCAB_SIZE,
    do_lower_case: bool = True,
    min_frequency: int = 2,
) -> list[str]:
    """Train a WordPiece vocabulary with the reference normalisation; special tokens first, as in BERT vocabs.

    ``texts``: an iterable (held in memory for two passes) or a function returning a fresh iterable (read twice,
    for big inputs). Deterministic: ``tokenizers``' trainer numbers the ``##c`` continuation symbols in the order of
    a hash map (seeded per process), which breaks ties between equally frequent merges differently from run to
    run (different vocabularies from the same text). A first pass collects them, and they are handed to the
    trainer up front in sorted order, so the merges and the result are the same in every process.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if not callable(texts):
        held = list(texts)
        texts = lambda: held  # noqa: E731
    normalizer = _normalizer(do_lower_case)
    continuation = _continuation_symbols(texts(), normalizer)
    tok = Tokenizer(WordPiece(unk_token="[UNK]", continuing_subword_prefix="##",
                              max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS + continuation,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(_nonempty(texts()), trainer=trainer)
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert tokens[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS, tokens[:10]
    log.info("trained WordPiece vocabulary: %d tokens", len(tokens))
    return tokens


def _splits_alone(c: str) -> bool:
    """Characters BertPreTokenizer always makes a word of their own (whitespace, punctuation as BERT defines it):
    they never continue a word, so they have no ``##`` form. CJK characters are spaced out by the normalizer."""
    cp = ord(c)
    return (c.isspace() or 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(c).startswith("P") or _is_cjk(cp))


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _continuation_symbols(texts: Iterable[str], normalizer: normalizers.Normalizer) -> list[str]:
    """``##c`` for every character of the normalized texts that can continue a word, sorted."""
    chars: set[str] = set()
    for t in _nonempty(texts):
        chars.update(normalizer.normalize_str(t))
    return sorted("##" + c for c in chars if not _splits_alone(c))


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    for t in texts:
        if t and not t.isspace():
            yield t
