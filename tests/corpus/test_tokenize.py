"""WordPiece encoder vs the reference BasicTokenizer + WordpieceTokenizer (transformers' legacy Python port)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from corpus.tokenize import WordPieceEncoder, read_vocab, train_wordpiece, write_vocab

TRICKY = [
    "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money...",
    "Héllo Wörld, café naïve Ångström façade résumé ÉCOLE",
    "我爱北京天安门 and 日本語のテキスト 한국어 text",
    "control\x00chars\x01here\x7f and\u200bzero width\ufeff bom \ufffd replacement",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp\u3000ideographic space",
    "punct: hello,world!!(x)[y]{z} don't U.S.A. $100.50 @user #tag 50% a/b a-b a_b",
    "quotes “curly” ‘single’ «guillemets» „low“ ‹x›",
    "emoji 😀👍🏽 math ∑∫√ ≠ ≤ ½ ² ℃ ™ ©",
    "[MASK] [CLS] [SEP] stay plain text",
    "Greek Αθήνα Cyrillic Москва Arabic العربية Hebrew עברית Thai ภาษาไทย",
    "İstanbul ǅ ß ﬁ ＡＢＣ full-width １２３",
    "unaffable electroencephalography antidisestablishmentarianism",
    "a" * 150 + " x " + "b" * 199 + " y " + "c" * 200 + " z " + "d" * 201 + " w " + "e" * 250,
    "",
    "   ",
]


@pytest.fixture(scope="module")
def vocab_path(sample_dir):
    return str(sample_dir / "reference" / "bert-base-uncased-vocab.txt")


@pytest.fixture(scope="module")
def encoder(vocab_path) -> WordPieceEncoder:
    return WordPieceEncoder(vocab_path)


def reference_tokenize(vocab_path: str, texts: list[str]) -> list[list[str]]:
    from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer, WordpieceTokenizer

    vocab = {t: i for i, t in enumerate(read_vocab(vocab_path))}
    basic = BasicTokenizer(do_lower_case=True)
    wordpiece = WordpieceTokenizer(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=200)
    return [[p for w in basic.tokenize(t) for p in wordpiece.tokenize(w)] for t in texts]


def test_agrees_with_reference_tokenizer(encoder, vocab_path) -> None:
    expected = reference_tokenize(vocab_path, TRICKY)
    got = [encoder.tokenize(t) for t in TRICKY]
    for text, e, g in zip(TRICKY, expected, got, strict=False):
        assert g == e, text[:40]


def test_agrees_on_real_text(encoder, vocab_path, sample_dir) -> None:
    import gzip

    with gzip.open(sample_dir / "reference" / "mobydick.sentences.txt.gz", "rt", encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(1500), f, strict=False)]
    ids = encoder.encode(lines)
    expected = reference_tokenize(vocab_path, lines)
    vocab = {t: i for i, t in enumerate(read_vocab(vocab_path))}
    for line, arr, e in zip(lines, ids, expected, strict=False):
        assert arr.tolist() == [vocab[t] for t in e], line


def test_word_length_limit_is_200_chars(encoder) -> None:
    assert encoder.tokenize("a" * 200) != ["[UNK]"]  # HF's default limit (100) would give [UNK]
    assert encoder.tokenize("a" * 201) == ["[UNK]"]


def test_encode_shapes_and_attributes(encoder) -> None:
    out = encoder.encode(["Call me Ishmael.", "", "whale"])
    assert [a.dtype for a in out] == [np.uint16] * 3
    assert len(out[1]) == 0 and len(out[0]) == 6  # call me ish ##mae ##l .
    assert encoder.encode([]) == []
    assert (encoder.vocab_size, encoder.pad_id, encoder.unk_id, encoder.cls_id, encoder.sep_id, encoder.mask_id) == (
        30522, 0, 100, 101, 102, 103,
    )
    assert encoder.is_continuation.dtype == np.bool_ and encoder.is_continuation.shape == (30522,)
    assert encoder.is_continuation[encoder.tokens.index("##s")]
    assert not encoder.is_continuation[encoder.tokens.index("s")]
    assert encoder.vocab_info.mask_id == 103
    assert encoder(["x"])[0].tolist() == encoder.encode(["x"])[0].tolist()


def test_pickles_by_value(encoder) -> None:
    blob = pickle.dumps(encoder)
    clone = pickle.loads(blob)
    text = ["Héllo Wörld, 我爱 unaffable"]
    assert clone.encode(text)[0].tolist() == encoder.encode(text)[0].tolist()
    assert len(blob) < 2_000_000


def test_cased_keeps_case_and_accents(tmp_path) -> None:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Café", "café", "cafe", "Cafe"]
    path = tmp_path / "vocab.txt"
    write_vocab(tokens, path)
    assert read_vocab(path) == tokens
    assert WordPieceEncoder(str(path), do_lower_case=False).tokenize("Café café") == ["Café", "café"]
    assert WordPieceEncoder(str(path)).tokenize("Café CAFÉ") == ["cafe", "cafe"]


def test_missing_specials_fail_clearly(tmp_path) -> None:
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(ValueError, match="CLS"):
        WordPieceEncoder(str(path))


def test_train_wordpiece_specials_first(sample_dir) -> None:
    import gzip
    import json

    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(10), f, strict=False)]
    tokens = train_wordpiece(texts, vocab_size=800)
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 700 <= len(tokens) <= 800 and len(set(tokens)) == len(tokens)
    assert any(t.startswith("##") for t in tokens)
    assert all(t == t.lower() for t in tokens[5:])  # uncased: lowercased, as the reference normalisation
    enc = WordPieceEncoder(tokens=tokens)
    assert enc.tokenize("[MASK]")[0] == "["  # text "[MASK]" is text, not the special token (as the reference)
    with pytest.raises(ValueError):
        train_wordpiece(texts, vocab_size=3)


def test_train_wordpiece_is_deterministic(sample_dir) -> None:
    """tokenizers' trainer alone gives a different vocabulary from run to run (its ##c symbols are numbered in a
    seeded hash map's order, which breaks merge ties); ours must not, or a build without --vocab is not
    reproducible. Several runs in one process see differently seeded maps."""
    import gzip
    import json

    texts = []
    for name in ("mobydick", "austen"):
        with gzip.open(sample_dir / "corpus" / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for _, line in zip(range(30), f, strict=False)]
    runs = [train_wordpiece(lambda: iter(texts), vocab_size=3000) for _ in range(4)]
    assert all(r == runs[0] for r in runs) and len(runs[0]) == 3000
    assert "##e" in runs[0] and "##." not in runs[0]  # punctuation never continues a word


@pytest.mark.parametrize("lower", [True, False])
def test_ascii_fast_path_equals_full_normalizer(vocab_path, lower) -> None:
    # Random ASCII with every control character, punctuation and case: the plain path must give the full path's ids.
    import random

    enc = WordPieceEncoder(vocab_path, do_lower_case=lower)
    r = random.Random(0)
    alphabet = [chr(c) for c in range(128)] + ["the ", "Whale ", "AHAB", " ", " ", "don't", "##", "[MASK]"]
    alphabet += list("\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2013\u2014\u2015\u2026"
                     "\u00ab\u00bb\u2039\u203a\u2022")
    alphabet += list("\u00e9\u00c9\u00a0\u3000\u4e2d\u0301\u200b\ufeff\u00b7\u2032")  # these take the full path
    texts = ["".join(r.choice(alphabet) for _ in range(r.randint(0, 60))) for _ in range(3000)]
    got = enc.encode(texts)
    full = [np.array(e.ids) for e in enc._tok.encode_batch_fast(texts, add_special_tokens=False)]
    for t, g, f in zip(texts, got, full, strict=False):
        assert g.tolist() == f.tolist(), repr(t)
    values, lengths = enc.encode_flat(texts)  # the build's path: one array, lengths per sentence
    assert lengths.tolist() == [len(f) for f in full]
    assert values.dtype == enc.dtype and values.tolist() == [i for f in full for i in f.tolist()]
    # Both paths were exercised: texts with no control character (plain path) and with one (full path).
    from corpus.tokenize import _NEEDS_NORMALIZER

    plain = sum(not _NEEDS_NORMALIZER.search(t) for t in texts)
    assert 150 < plain < 2900


def test_word_cache_warm_and_bounded(vocab_path, monkeypatch) -> None:
    import corpus.tokenize as tk

    enc = WordPieceEncoder(vocab_path)
    texts = ["Call me Ishmael, said the whale-man.", "The whale! The whale!", "ISHMAEL"]
    first = [a.tolist() for a in enc.encode(texts)]
    assert [a.tolist() for a in enc.encode(texts)] == first  # warm cache
    monkeypatch.setattr(tk, "_WORD_CACHE_MAX", 5)
    small = WordPieceEncoder(vocab_path)
    assert [a.tolist() for a in small.encode(texts)] == first
    assert [a.tolist() for a in small.encode(texts[::-1])] == first[::-1]
    assert len(small._words) <= 5  # over the bound after a batch: cut back to it, never growing without bound
    assert len(small._wlen) == len(small._words) == len(small._index) == len(small._hits)
    assert small._wlen.sum() == len(small._flat)


def test_a_full_word_cache_keeps_its_frequent_words(vocab_path, monkeypatch) -> None:
    # Varied text fills the table (578k distinct chunks in 54 MB): a full table used to be dropped whole, so every
    # worker re-encoded its most frequent words again. Now only the rarely used part goes.
    import random

    import corpus.tokenize as tk

    monkeypatch.setattr(tk, "_WORD_CACHE_MAX", 200)
    enc = WordPieceEncoder(vocab_path)
    r = random.Random(0)
    common = ["the", "whale", "of", "and", "ahab", "sea", "ship", "a", "to", "in"]
    for batch in range(30):  # each batch: the common words often, and 100 words never seen before
        words = [r.choice(common) for _ in range(400)] + [f"w{batch}x{i}q" for i in range(100)]
        r.shuffle(words)
        texts = [" ".join(words[i:i + 25]) for i in range(0, len(words), 25)]
        full = [e.ids for e in enc._tok.encode_batch_fast(texts, add_special_tokens=False)]  # no table at all
        assert [a.tolist() for a in enc.encode(texts)] == full
        assert len(enc._words) <= 200
        assert all(w in enc._index for w in common), batch  # never flushed whole: the frequent words stay
    stats = enc.cache_stats()
    assert stats["evicted"] > 2000 and stats["held"] <= 200
    assert stats["distinct_chunks"] == 10 + 30 * 100  # the common words were WordPieced once, not once per flush


