"""The build on Ray Data runs the same operators as the plain loop: identical shards whatever the CPUs or raylets,
the driver itself reads no corpus bytes (every step runs in a Ray worker), and Ray's own logs show our read
operator, our operators over rows and our sink."""
from __future__ import annotations

import dataclasses
import json
import os

import pyarrow.parquet as pq
import pytest
from _corpus import ships_corpus

from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build
from pipeline.executor import LocalExecutor


def _corpus(path, n_docs=24):
    return ships_corpus(path, n_docs, sentences=10)


def _shards(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    return m, [pq.read_table(os.path.join(out, s["file"])) for s in m["shards"]]


def _cfg(tmp_path, corpus, sample_dir, name, **kw):
    # ~2 KiB units: several units per stage, so tasks really run side by side; a pool budget below the corpus's
    # tokens, so the pool is a sample and its members must agree between executors.
    kw = {"pool_tokens": 1500, **kw}
    return BuildConfig(inputs=(corpus,), output=str(tmp_path / name), dupe_factor=2, num_shards=3,
                       vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), unit_bytes=2048,
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10), **kw)


def _same(out, ref):
    (m, t), (mp, tp) = _shards(out), _shards(ref)
    assert m["totals"] == mp["totals"] and m["shards"] == mp["shards"] and m["config_hash"] == mp["config_hash"]
    assert m["random_pool"] == mp["random_pool"]
    assert all(a.equals(b) for a, b in zip(t, tp, strict=False)), out


@pytest.mark.timeout(300)
def test_ray_equals_plain_loop_and_cpu_count_does_not_matter(ray_local, tmp_path, sample_dir):
    from pipeline.ray_data import RayDataExecutor

    corpus = _corpus(tmp_path / "c.jsonl")
    build(_cfg(tmp_path, corpus, sample_dir, "plain"), LocalExecutor())
    mp, _ = _shards(tmp_path / "plain")
    assert mp["totals"]["instances"] > 0 and len(mp["inputs"]) == 1
    assert 0 < mp["random_pool"]["documents"] < mp["totals"]["documents"]  # a sample, not every document
    build(_cfg(tmp_path, corpus, sample_dir, "ray1"), RayDataExecutor(num_cpus=1))
    build(_cfg(tmp_path, corpus, sample_dir, "ray2"), RayDataExecutor(num_cpus=2))
    _same(tmp_path / "ray1", tmp_path / "plain")
    _same(tmp_path / "ray2", tmp_path / "plain")


@pytest.mark.timeout(300)
def test_the_driver_reads_no_corpus_bytes(ray_local, tmp_path, sample_dir, monkeypatch):
    """Every read of text, documents, the pool or row counts is made to fail in the driver process: the Ray build
    must not notice (its workers are other processes) and must equal the plain loop."""
    import pipeline.docs
    import pipeline.instances
    import pipeline.pool
    import pipeline.shards
    from corpus import readers
    from pipeline.ray_data import RayDataExecutor

    corpus = _corpus(tmp_path / "c.jsonl", n_docs=36)
    build(_cfg(tmp_path, corpus, sample_dir, "plain"), LocalExecutor())

    def forbidden(*a, **k):
        raise AssertionError("the driver read corpus data")
    for mod, name in [(readers, "read_unit"), (pipeline.docs, "read_unit"),
                      (pipeline.docs, "read_docs"), (pipeline.docs, "read_block"),
                      (pipeline.pool, "merge_members"), (pipeline.pool, "read_members"),
                      (pipeline.instances, "read_table"), (pipeline.shards, "load_unit")]:
        monkeypatch.setattr(mod, name, forbidden)
    build(_cfg(tmp_path, corpus, sample_dir, "ray"), RayDataExecutor(num_cpus=2))
    _same(tmp_path / "ray", tmp_path / "plain")


@pytest.mark.timeout(300)
def test_two_raylet_cluster_of_16_cpus_equals_plain_loop(ray_shutdown, tmp_path, sample_dir):
    """Two raylets of 8 logical CPUs each: 16 CPUs' worth of tasks in flight on several nodes (~30 units of
    2 KiB), the same bytes as the plain loop."""
    import ray
    from ray.cluster_utils import Cluster

    from pipeline.ray_data import RayDataExecutor

    corpus = _corpus(tmp_path / "c.jsonl", n_docs=160)
    build(_cfg(tmp_path, corpus, sample_dir, "plain"), LocalExecutor())
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "include_dashboard": False})
    cluster.add_node(num_cpus=8)
    try:
        # Attach, as a job submitted to a running cluster does: the executor must use the cluster, not start one.
        ray.init(address=cluster.address, log_to_driver=False)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        build(_cfg(tmp_path, corpus, sample_dir, "cluster"), RayDataExecutor())
        assert int(ray.cluster_resources()["CPU"]) == 16
    finally:
        ray.shutdown()
        cluster.shutdown()
    _same(tmp_path / "cluster", tmp_path / "plain")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_node_removed_mid_build_on_s3_gives_the_same_bytes(ray_shutdown, tmp_path, sample_dir, s3_bucket):
    """Three raylets (a head with no CPU, two nodes of one CPU each, all on 127.0.0.1), the input, the output and
    its _work on the loopback S3 server. Once the build has committed its first units, one node is removed abruptly
    (its raylet and the tasks on it die, as when a machine goes away): Ray retries the lost tasks on the other node,
    the build completes in the same call, and its shards are the plain loop's (of the same input on local disk),
    byte for byte. A build that finished before the removal fails the test (nothing was survived)."""
    import threading
    import time

    import ray
    from ray.cluster_utils import Cluster

    from pipeline.markers import SUFFIX
    from pipeline.ray_data import RayDataExecutor
    from storage.fs import filesystem_for, list_names, read_bytes

    endpoint, bucket = s3_bucket
    corpus = _corpus(tmp_path / "c.jsonl", n_docs=240)
    fs, _ = filesystem_for(f"s3://{bucket}/in/c.jsonl", endpoint)
    fs.put_file(corpus, f"{bucket}/in/c.jsonl")
    build(_cfg(tmp_path, corpus, sample_dir, "plain"), LocalExecutor())
    out = f"s3://{bucket}/cluster"
    cfg = dataclasses.replace(_cfg(tmp_path, f"s3://{bucket}/in/c.jsonl", sample_dir, "x"), output=out,
                              endpoint_url=endpoint)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["manifest"] = build(cfg, RayDataExecutor())
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome["error"] = e

    def committed() -> bool:
        return any(n.endswith(SUFFIX) for n in list_names(f"{out}/_work/read", endpoint))
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        job = threading.Thread(target=run, daemon=True)
        job.start()
        deadline = time.monotonic() + 300
        while not committed() and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job.is_alive() and committed(), "the build ended (or stalled) before a unit committed"
        cluster.remove_node(nodes[0], allow_graceful=False)
        job.join(timeout=max(1.0, deadline - time.monotonic()))
        assert not job.is_alive(), "the build did not finish after the node was removed"
        assert "error" not in outcome, outcome.get("error")
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2  # the head and the surviving node
    finally:
        ray.shutdown()
        cluster.shutdown()
    m, mp = outcome["manifest"], json.load(open(tmp_path / "plain" / "manifest.json"))
    assert m.to_dict()["totals"] == mp["totals"] and [s.rows for s in m.shards] == [s["rows"] for s in mp["shards"]]
    assert [read_bytes(s.url, endpoint) for s in m.shards] == [open(tmp_path / "plain" / s["file"], "rb").read()
                                                               for s in mp["shards"]]
    assert not list_names(f"{out}/_work", endpoint)  # the finished build cleaned its markers up


@pytest.mark.timeout(120)
def test_a_bad_input_fails_through_ray_naming_the_file(ray_local, tmp_path, sample_dir):
    from corpus.readers import InputError
    from pipeline.ray_data import RayDataExecutor

    corpus = _corpus(tmp_path / "c.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "The whale."}\n{"text": oops\n')
    cfg = _cfg(tmp_path, corpus, sample_dir, "bad")
    with pytest.raises(InputError, match=r"bad\.jsonl.*bad_json"):
        build(BuildConfig(**{**cfg.__dict__, "inputs": (corpus, str(bad))}), RayDataExecutor(num_cpus=2))


@pytest.mark.timeout(600)
def test_real_text_at_1_2_and_4_cpus_equals_the_plain_loop(ray_shutdown, ray_tmpdir, tmp_path, sample_dir):
    """Two shared corpus files (one big enough to be cut into pieces, units of 256 KiB: ~20 units), a sampled pool:
    a local Ray of 1, 2 and 4 CPUs started by the executor gives the plain loop's shards byte for byte."""
    import ray

    from pipeline.ray_data import RayDataExecutor

    def cfg(name):
        return BuildConfig(inputs=(str(sample_dir / "corpus" / "mobydick.jsonl.gz"),
                                   str(sample_dir / "corpus" / "austen.jsonl.gz")),
                           output=str(tmp_path / name), dupe_factor=2, num_shards=4, pool_tokens=300_000,
                           unit_bytes=256 << 10,
                           vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"))
    build(cfg("plain"))
    for n in (1, 2, 4):
        def init(n=n):
            return ray.init(address="local", num_cpus=n, include_dashboard=False, _temp_dir=ray_tmpdir,
                            log_to_driver=False, configure_logging=False)

        executor = RayDataExecutor(num_cpus=n, init=init)
        try:
            build(cfg(f"ray{n}"), executor)
        finally:
            executor.end()
        _same(tmp_path / f"ray{n}", tmp_path / "plain")
    m, _ = _shards(tmp_path / "plain")
    assert 0 < m["random_pool"]["documents"] < m["totals"]["documents"]


@pytest.mark.timeout(300)
def test_rays_logs_show_our_read_our_row_operators_and_our_sink(ray_local, ray_tmpdir, tmp_path, sample_dir):
    """What a Ray user reads in Ray Data's logs (<session>/logs/ray-data/, what the Dashboard's Data view shows):
    the per-unit passes as ReadCorpus -> MapBatches(SplitTokenize) -> Write (the read pass, the only one reading
    the input) and ReadDocs -> MapBatches(CountPairs) -> Write, each fused into one task per unit, the sinks by
    their names with the rows they wrote, and rows per operator."""
    import glob

    from pipeline.ray_data import RayDataExecutor

    corpus = _corpus(tmp_path / "c.jsonl")
    m = build(_cfg(tmp_path, corpus, sample_dir, "ray"), RayDataExecutor(num_cpus=2))
    # Every session of the test run under Ray's temp folder: Ray Data's process-wide ray-data.log stays with the
    # first session this process started, its per-dataset logs go to the current one.
    logs = "".join(open(f, errors="replace").read()
                   for f in glob.glob(os.path.join(ray_tmpdir, "**", "ray-data", "*.log"), recursive=True))
    assert "TaskPoolMapOperator[ReadCorpus->MapBatches(SplitTokenize)->Write]" in logs  # the read pass
    assert "TaskPoolMapOperator[ReadDocs->MapBatches(CountPairs)->Write]" in logs  # the instances pass
    assert "TaskPoolMapOperator[MapBatches(ShardStep)]" in logs
    # The sink's rows: one per document (its rows per pass), plus one summary row per unit (what becomes its marker).
    wrote = [line for line in logs.splitlines() if "Data sink WriteCounts finished" in line]
    assert wrote, "no line from our WriteCounts sink"
    rows = [int(line.split("finished. ")[1].split(" rows")[0]) for line in wrote]
    assert any(m.totals.documents < r < m.totals.documents + 100 for r in rows), (rows, m.totals.documents)
    assert "Data sink WriteDocs finished" in logs
    assert "'rows_outputs_of_finished_tasks'" in logs and "'bytes_outputs_of_finished_tasks'" in logs
