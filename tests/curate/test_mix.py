"""--mix: each source's share of the kept documents within 1% of what its weight asks, decided by document id."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from _curate_docs import batches, passages, shuffled, table

from curate.mix import Mix, MixConfig, copies, expand, parse_mix


@pytest.fixture(scope="module")
def docs() -> pa.Table:
    # Three sources of very different sizes: ~5.9k, ~2k and ~3.4k passages of 100 words.
    return table(passages(["tdavid", "mobydick", "webbible"], n_words=100, per_corpus=6000))


def test_shares_are_within_one_percent_of_the_asked_ones(docs):
    cfg = MixConfig(weights=parse_mix("corpora/tdavid=0.5,corpora/mobydick=2,corpora/webbible=1.3"))
    out = Mix(cfg)(docs)
    sources, counts = np.unique(docs["source"].to_numpy(zero_copy_only=False), return_counts=True)
    size = {s: n for s, n in zip(sources, counts, strict=False)}
    weight = {s: cfg.weight_of(s) for s in size}
    asked = {s: weight[s] * size[s] / sum(weight[t] * size[t] for t in size) for s in size}
    n = out.kept["copies"].to_numpy()
    src = out.kept["source"].to_numpy(zero_copy_only=False)
    got = {s: n[src == s].sum() / n.sum() for s in size}
    for s in size:
        assert abs(got[s] - asked[s]) < 0.01, (s, got[s], asked[s])
    # upsampling by repetition: mobydick x2 is every passage twice; the 0.5 and 1.3 draws are the rest
    assert set(n[src == "corpora/mobydick"].tolist()) == {2}
    assert set(n[src == "corpora/webbible"].tolist()) == {1, 2}
    assert set(out.dropped["reason"].to_pylist()) == {"mix"} and len(out.dropped) > 0


def test_the_draw_depends_on_the_id_only(docs):
    cfg = MixConfig(weights=(("corpora/", 0.37),), seed=9)
    ref = Mix(cfg)(docs)
    kept = dict(zip(ref.kept["id"].to_pylist(), ref.kept["copies"].to_pylist(), strict=False))
    for part in batches(shuffled(docs, 4), [977]):
        out = Mix(cfg)(part)
        got = dict(zip(out.kept["id"].to_pylist(), out.kept["copies"].to_pylist(), strict=False))
        assert got.items() <= kept.items()
    other = Mix(MixConfig(weights=cfg.weights, seed=10))(docs)
    assert set(other.kept["id"].to_pylist()) != set(kept)


def test_longest_prefix_wins_and_unmatched_sources_keep_weight_one():
    cfg = MixConfig(weights=(("data/", 0.0), ("data/wiki/", 3.0)))
    assert cfg.weight_of("data/wiki/a.txt") == 3.0 and cfg.weight_of("data/web/b.txt") == 0.0
    assert cfg.weight_of("other/c.txt") == 1.0 and cfg.weight_of(None) == 1.0
    assert copies(["x", "y"], ["data/wiki/a", "data/web/b"], cfg).tolist() == [3, 0]
    assert cfg.unmatched(["data/wiki/a.txt"]) == []
    assert MixConfig(weights=(("nope/", 1.0),)).unmatched(["a"]) == ["nope/"]


def test_expand_gives_each_copy_an_id_of_its_own():
    t = pa.table({"id": ["a", "b"], "text": ["x", "y"], "copies": [3, 1]})
    assert expand(t)["id"].to_pylist() == ["a", "a#2", "a#3", "b"]


@pytest.mark.parametrize("spec, needle", [("wiki", "is not SOURCE=WEIGHT"), ("wiki=two", "is not SOURCE=WEIGHT"),
                                          (",", "at least one"), ("a=1,a=2", "names a twice"),
                                          ("a=-1", "--mix a=-1.0")])
def test_mix_mistakes_say_the_fix(spec, needle):
    with pytest.raises(ValueError, match=needle):
        MixConfig(weights=parse_mix(spec))
