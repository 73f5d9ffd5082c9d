"""Normalised words and n-grams as hashes: what counts as a word, and hashes that do not depend on the batch."""
from __future__ import annotations

import numpy as np

from curate.words import ngrams, words


def _same(a, b):
    return np.array_equal(a, b)


def test_words_are_lowercased_runs_between_punctuation_and_spaces():
    w = words(["Hello, World!", "hello   world", "HELLO—world…", "“hello” (world)", "hello_world", "hello world2"])
    doc = [w.hashes[w.offsets[d]:w.offsets[d + 1]] for d in range(6)]
    for d in (1, 2, 3, 4):  # case, spaces, dashes, ellipsis, curly quotes, brackets and underscores do not matter
        assert _same(doc[d], doc[0]), d
    assert len(doc[5]) == 2 and doc[5][0] == doc[0][0] and doc[5][1] != doc[0][1]  # "world2" is another word
    assert w.lengths.tolist()[:2] == [5, 5]


def test_non_ascii_letters_are_word_characters_and_no_break_space_separates():
    w = words(["café crème", "cafe creme", "café\u00a0crème", "Ärger über Öl"])
    doc = [w.hashes[w.offsets[d]:w.offsets[d + 1]] for d in range(4)]
    assert len(doc[0]) == 2 and not _same(doc[0], doc[1])  # accents are kept: "café" is not "cafe"
    assert _same(doc[0], doc[2])
    assert len(doc[3]) == 3
    assert _same(doc[3], words(["ärger ÜBER öl"]).hashes)  # str.lower, not ASCII-only lower case


def test_empty_and_missing_texts_have_no_words_and_keep_their_place():
    w = words(["one two", None, "", "  ,.;  ", "three"])
    assert w.offsets.tolist() == [0, 2, 2, 2, 2, 3]


def test_hashes_do_not_depend_on_the_batch():
    texts = ["the quick brown fox jumps", "over the lazy dog", "a quick brown fox"]
    alone = [words([t]).hashes for t in texts]
    together = words(texts)
    for d, h in enumerate(alone):
        assert _same(together.hashes[together.offsets[d]:together.offsets[d + 1]], h)
    g, off = ngrams(together, 2)
    g0, _ = ngrams(words([texts[2]]), 2)
    assert _same(g[off[2]:off[3]], g0)
    # "quick brown" appears in documents 0 and 2 at different positions: one hash
    assert g[off[0] + 1] == g[off[2] + 1]


def test_ngrams_stay_inside_documents_and_short_documents_get_one_when_asked():
    w = words(["a b c d e f", "x y", "", "p q r"])
    g, off = ngrams(w, 3)
    assert off.tolist() == [0, 4, 4, 4, 5]
    g2, off2 = ngrams(w, 3, short=True)
    assert off2.tolist() == [0, 4, 5, 5, 6]
    assert g2[4] != g2[0]
    # an n-gram of n words never equals a shorter document's whole-text gram: the length is part of the hash
    assert g2[4] not in set(ngrams(words(["x y z"]), 3)[0].tolist())
