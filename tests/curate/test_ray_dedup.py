"""Curation on Ray Data: the global dedup decision equals the plain loop's drop set byte for byte at 1 and 2 CPUs
and on three raylets, with every shuffle cut into several partitions; a filter as a Ray Data operator (contract.Rows)
gives the plain filter's rows."""
from __future__ import annotations

import pyarrow as pa
import pytest
from _curate_docs import batches, passages, plant, shuffled, table

from curate.contract import Rows, split_rows
from curate.dedup import DedupConfig, Signatures, drop_set
from curate.quality import QualityConfig, QualityFilter

NEAR = DedupConfig(mode="near")
PARTITION_BYTES = 256 << 10  # 1 to 7 partitions per shuffle for these ~1,560 documents


@pytest.fixture(scope="module")
def corpus():
    docs = passages(["mobydick", "webbible"], n_words=200, per_corpus=700)
    docs, _ = plant(docs, n_exact=30, n_near=30, seed=5)
    t = table(docs)
    return t, drop_set([Signatures(NEAR)(t)], NEAR)


def _ray_drops(t: pa.Table, num_cpus=None, blocks=6, seed=0) -> pa.Table:
    import ray

    from curate import ray_dedup

    ds = ray.data.from_arrow(batches(shuffled(t, seed), [len(t) // blocks + 1]))
    return ray_dedup.drop_set(ray_dedup.signatures(ds, NEAR), NEAR, num_cpus=num_cpus,
                              partition_bytes=PARTITION_BYTES)


@pytest.mark.timeout(300)
def test_ray_drop_set_equals_the_plain_loop_at_1_and_2_cpus(ray_local, corpus):
    t, plain = corpus
    assert len(plain) >= 60  # the planted copies and the corpus's own (Psalms repeat in the Bible)
    one = _ray_drops(t, num_cpus=1, blocks=3, seed=1)
    two = _ray_drops(t, num_cpus=2, blocks=7, seed=2)
    assert one.equals(plain)
    assert two.equals(plain)


@pytest.mark.timeout(300)
def test_a_filter_as_a_ray_data_operator_gives_the_plain_filters_rows(ray_local, corpus):
    """Rows(filter) in map_batches: kept rows, dropped rows marked with their reasons (every row a document: the
    contract's)."""
    import ray

    t, _ = corpus
    t = t.slice(0, 400)
    plain = QualityFilter(QualityConfig())(t)
    ds = ray.data.from_arrow(batches(t, [101]))
    rows = ds.map_batches(Rows(lambda: QualityFilter(QualityConfig())), batch_format="pyarrow").take_all()
    out = split_rows(pa.Table.from_pylist(rows))
    assert sorted(out.kept["id"].to_pylist()) == sorted(plain.kept["id"].to_pylist())
    assert out.dropped.sort_by("id").equals(plain.dropped.sort_by("id"))
    assert len(plain.dropped) > 0


@pytest.mark.timeout(420)
def test_three_raylets_give_the_same_drop_set(ray_shutdown, corpus):
    import ray
    from ray.cluster_utils import Cluster

    t, plain = corpus
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        assert len([n for n in ray.nodes() if n["Alive"]]) == 3
        got = _ray_drops(t, blocks=9, seed=3)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert got.equals(plain)


def test_the_shuffles_are_sort_based_whatever_the_callers_context(ray_local, corpus):
    """The caller's Dataset was made under Ray's default (hash) shuffle; the computation must still use sorted
    shuffles (hash shuffles start aggregator processes: ~30 CPU-s a run on 2 CPUs) and leave the context as it was."""
    import ray

    from curate import ray_dedup

    t, plain = corpus
    ds = ray.data.from_arrow(t.slice(0, 300))
    before = ds.context.shuffle_strategy
    seen = []
    real = ray_dedup._shuffled

    def spy(d, parts, fn, **kw):
        seen.append(d.context.shuffle_strategy)
        return real(d, parts, fn, **kw)

    ray_dedup._shuffled = spy
    try:
        ray_dedup.drop_set(ray_dedup.signatures(ds, NEAR), NEAR)
    finally:
        ray_dedup._shuffled = real
    assert seen and set(seen) == {ray.data.context.ShuffleStrategy.SORT_SHUFFLE_PULL_BASED}
    assert ds.context.shuffle_strategy == before


def test_edge_rows_of_the_verification_shuffle_carry_no_signature_bytes():
    """An edge row (up to one per band per duplicate: most rows of a corpus of many copies) goes through the shuffle
    with a null signature; at the signatures' fixed width a null still held 4 x num_perm bytes, so the edges filled
    the object store with ~448 bytes of nothing each (4.1 GB of a worker's mapped store at 514 MB of input)."""
    from curate.ray_dedup import _Keyed

    n = 10_000
    ids = pa.array([f"doc-{i:06d}" for i in range(n)])
    rows = _Keyed("edges", parts=4)(pa.table({"a": ids, "b": ids}))
    assert rows["sig"].null_count == n
    assert rows.nbytes < n * 64 < n * 4 * NEAR.num_perm  # ids, part and offsets only
