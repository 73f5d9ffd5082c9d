"""Deduplication in one process (the plain loop): planted copies in real text are found, distinct passages are
kept, and the drop set does not depend on batching or order (the property the Ray version relies on)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from _curate_docs import batches, passages, plant, shuffled, table

from curate.dedup import ApplyDrops, DedupConfig, Signatures, drop_set

NEAR = DedupConfig(mode="near")


@pytest.fixture(scope="module")
def planted():
    """Passages of five corpora (~24k documents of 200 words) plus 200 exact and 200 near (~0.9) copies."""
    docs = passages(["austen", "mobydick", "mhcc", "tdavid", "webbible"], n_words=200)
    docs, pairs = plant(docs, n_exact=200, n_near=200, seed=3)
    t = table(docs)
    return t, pairs, drop_set([Signatures(NEAR)(b) for b in batches(t, [4096])], NEAR)


def test_planted_copies_keep_exactly_one_and_distinct_passages_stay(planted):
    """check curate-dedup (plain loop): >= 95% of planted pairs keep exactly one, >= 99% of the other documents are
    kept, each drop names a kept document."""
    t, pairs, drops = planted
    near_j = [j for _, c, j in pairs if "planted" in c and j < 1.0]
    assert 0.85 <= float(np.mean(near_j)) <= 0.95 and len(near_j) == 200  # the copies really are ~0.9 Jaccard
    dropped = dict(zip(drops["id"].to_pylist(), drops["duplicate_of"].to_pylist(), strict=False))
    one = sum((a in dropped) != (b in dropped) for a, b, _ in pairs)
    assert one / len(pairs) >= 0.95, one
    involved = {x for a, b, _ in pairs for x in (a, b)}
    distinct = [i for i in t["id"].to_pylist() if i not in involved]
    lost = [i for i in distinct if i in dropped]
    assert 1 - len(lost) / len(distinct) >= 0.99, lost[:10]
    assert not set(dropped.values()) & set(dropped)  # duplicate_of is always a kept document
    reasons = dict(zip(drops["id"].to_pylist(), drops["reason"].to_pylist(), strict=False))
    exact_pairs = [(a, b) for a, b, j in pairs if j == 1.0]
    # the larger id of an exact pair is dropped as its exact copy (the smaller may itself be a near copy of a third
    # passage: the World English Bible's two Books of Daniel, below)
    assert all(reasons.get(max(a, b)) == "exact_duplicate" for a, b in exact_pairs)
    assert {reasons.get(a, reasons.get(b)) for a, b, j in pairs if j < 1.0} <= {"near_duplicate", None}


def test_the_smallest_id_is_kept(planted):
    _, _, drops = planted
    assert all(d > k for d, k in zip(drops["id"].to_pylist(), drops["duplicate_of"].to_pylist(), strict=False))


def test_the_drop_set_does_not_depend_on_batching_or_order(planted):
    t, _, drops = planted
    small = t.slice(0, 3000)
    ref = drop_set([Signatures(NEAR)(small)], NEAR)
    for seed, sizes in ((1, [7]), (2, [1000, 13, 500]), (3, [3000])):
        other = drop_set([Signatures(NEAR)(b) for b in batches(shuffled(small, seed), sizes)], NEAR)
        assert other.equals(ref), (seed, sizes)
    # and the full set is a superset of what a subset finds only through the subset's own copies
    assert len(ref) <= len(drops)


def test_exact_mode_finds_only_exact_copies_after_whitespace_normalisation():
    t = pa.table({"id": ["d1", "d2", "d3", "d4", "d5"],
                  "text": ["The whale, the whale!", "The  whale,\nthe whale! ", "The whale, the whale.", "",
                           "   "]})
    drops = drop_set([Signatures(DedupConfig(mode="exact"))(t)], DedupConfig(mode="exact"))
    assert drops.to_pylist() == [{"id": "d2", "reason": "exact_duplicate", "duplicate_of": "d1"},
                                 {"id": "d5", "reason": "exact_duplicate", "duplicate_of": "d4"}]


def test_apply_drops_removes_what_the_drop_set_names_and_passes_the_rest():
    t = pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"], "source": ["s1", "s2", "s3"], "extra": [1, 2, 3]})
    drops = pa.table({"id": ["c", "zz"], "reason": ["near_duplicate", "exact_duplicate"], "duplicate_of": ["a", "b"]})
    out = ApplyDrops(drops)(t)
    assert out.kept.column_names == t.column_names and out.kept["id"].to_pylist() == ["a", "b"]
    assert out.dropped.to_pylist() == [{"id": "c", "source": "s3", "reason": "near_duplicate", "duplicate_of": "a",
                                        "detail": None}]


@pytest.mark.parametrize("kw, needle", [({"mode": "fuzzy"}, "--dedup 'fuzzy'"),
                                        ({"threshold": 0.3}, "--dedup-threshold 0.3"),
                                        ({"shingle_words": 0}, "--dedup-shingle-words 0"),
                                        ({"num_perm": 8}, "--dedup-num-perm 8")])
def test_config_mistakes_say_the_fix(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        DedupConfig(**kw)


def test_an_exact_copy_of_a_near_duplicate_points_at_the_kept_document():
    """c is an exact copy of b, b a near copy of a (a kept): c's duplicate_of is a, the document that stays."""
    words = [f"w{i}" for i in range(200)]
    a = " ".join(words)
    words[100] = "changed"
    b = " ".join(words)
    t = pa.table({"id": ["a", "b", "c"], "text": [a, b, b]})
    drops = drop_set([Signatures(NEAR)(t)], NEAR).to_pylist()
    assert drops == [{"id": "b", "reason": "near_duplicate", "duplicate_of": "a"},
                     {"id": "c", "reason": "exact_duplicate", "duplicate_of": "a"}]


def _components_by_hand(edges: list[tuple[str, str]]) -> dict[str, str]:
    """Each linked id -> the smallest id of its component, by a plain search (the reference for ``components``)."""
    nbr: dict[str, set[str]] = {}
    for a, b in edges:
        nbr.setdefault(a, set()).add(b)
        nbr.setdefault(b, set()).add(a)
    out: dict[str, str] = {}
    for start in nbr:
        if start in out:
            continue
        seen, todo = {start}, [start]
        while todo:
            for y in nbr[todo.pop()] - seen:
                seen.add(y)
                todo.append(y)
        for x in seen:
            out[x] = min(seen)
    return out


def test_components_keep_the_smallest_id_of_each_component_whatever_the_edges_order():
    import random

    from curate.clusters import components

    rng = random.Random(5)
    ids = [f"d{rng.randrange(10**6)}" for _ in range(300)]
    edges = [tuple(rng.sample(ids, 2)) for _ in range(260)] + [("z", "été"), ("日本", "z"), ("Ärger", "Z")]
    want = {x: r for x, r in _components_by_hand(edges).items() if x != r}
    for seed in range(3):  # any order, any batching of the edges
        order = random.Random(seed).sample(edges, len(edges))
        cut = len(order) // 3
        batches = [(pa.array([a for a, _ in part]), pa.array([b for _, b in part])) for part in (order[:cut],
                                                                                                order[cut:])]
        got = components(batches)
        assert dict(zip(got["id"].to_pylist(), got["duplicate_of"].to_pylist(), strict=False)) == want
        assert set(got["reason"].to_pylist()) == {"near_duplicate"}
    assert want["été"] == "z" and want["日本"] == "z" and want["Ärger"] == "Z"  # code-point order
