"""Curation on Ray Data gives the plain loop's dataset byte for byte, whatever the CPUs or raylets: the read pass's
filters, the dedup decision (Ray Data shuffles, ``pipeline/ray_data/curate.py``) and the mix draw, and the
report, all on (near dedup, quality, language, --mix). The dedup decision is made by one task at 1 CPU and by
ray_dedup's shuffles at 2 CPUs and on 3 raylets."""
from __future__ import annotations

import json

import pytest
from _curate_docs import REPO, need_shared, passages, plant

from corpus.create_instances import InstanceConfig
from curate import CurateConfig, DedupConfig, LanguageConfig, MixConfig, QualityConfig
from pipeline import BuildConfig, build
from pipeline.executor import LocalExecutor

VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """240 passages of two corpora with 12 exact and 12 near copies, in two folders; and the plain loop's build."""
    need_shared()
    docs, _ = plant(passages(["mobydick", "webbible"], n_words=120, per_corpus=120), 12, 12, seed=3)
    d = tmp_path_factory.mktemp("curate-ray")
    for k, name in enumerate(("a", "b")):
        (d / name).mkdir()
        (d / name / "part.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                                     for i, t, _ in docs[k::2]))
    plain = build(_cfg(d, "plain"), LocalExecutor())
    assert plain.dropped.get("near_duplicate") and plain.dropped.get("mix") and plain.dropped.get("exact_duplicate")
    return d, plain


def _cfg(d, name: str) -> BuildConfig:
    # ~16 KiB units: several units per input, so the decision spans units, files and tasks
    return BuildConfig(inputs=(str(d / "a"), str(d / "b")), output=str(d / name), dupe_factor=2, num_shards=3,
                       pool_tokens=5000, vocab=str(VOCAB), unit_bytes=16 << 10,
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10),
                       curate=CurateConfig(dedup=DedupConfig(mode="near"), quality=QualityConfig(),
                                           language=LanguageConfig(languages=("en",)),
                                           mix=MixConfig(weights=((str(d / "a"), 2.0), (str(d / "b"), 0.6)))))


def _same(m, ref) -> None:
    assert m.totals == ref.totals and m.curation == ref.curation and m.random_pool == ref.random_pool
    assert [open(s.url, "rb").read() for s in m.shards] == [open(s.url, "rb").read() for s in ref.shards]
    report = "reports/dropped.jsonl"
    assert open(f"{m.url}/{report}", "rb").read() == open(f"{ref.url}/{report}", "rb").read()


def _shuffled(monkeypatch) -> None:
    """The dedup decision through ray_dedup's shuffles with several partitions (the corpus is small enough for one
    task to decide, which is what the build does with it by default)."""
    from pipeline.ray_data import curate

    monkeypatch.setattr(curate, "PARTITION_BYTES", 48 << 10)


@pytest.mark.timeout(300)
def test_ray_at_1_and_2_cpus_equals_the_plain_loop(ray_local, corpus, monkeypatch):
    from pipeline.ray_data import RayDataExecutor

    d, plain = corpus
    _same(build(_cfg(d, "ray1"), RayDataExecutor(num_cpus=1)), plain)  # one deciding task
    _shuffled(monkeypatch)
    _same(build(_cfg(d, "ray2"), RayDataExecutor(num_cpus=2)), plain)  # the shuffles


@pytest.mark.timeout(420)
def test_three_raylets_give_the_plain_loops_bytes(ray_shutdown, corpus, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    from pipeline.ray_data import RayDataExecutor

    d, plain = corpus
    _shuffled(monkeypatch)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 3
        m = build(_cfg(d, "cluster"), RayDataExecutor())
    finally:
        ray.shutdown()
        cluster.shutdown()
    _same(m, plain)
