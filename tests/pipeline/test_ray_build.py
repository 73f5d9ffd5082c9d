"""The Ray Data adapter runs the same steps as the plain loop: identical shards, whatever the CPUs."""
from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from pipeline.build import BuildConfig, LocalExecutor, build
from pipeline.instances import InstanceConfig


def _corpus(path, n_docs=24):
    words = "apple river house music water garden silver winter doctor castle forest engine".split()
    with open(path, "w") as f:
        for i in range(n_docs):
            w = words[i % len(words)]
            f.write(json.dumps({"text": " ".join(f"A {w} saw {i} ships on day {j}." for j in range(10))}) + "\n")
    return str(path)


def _shards(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    return m, [pq.read_table(os.path.join(out, s["file"])) for s in m["shards"]]


@pytest.mark.timeout(300)
def test_ray_equals_plain_loop_and_cpu_count_does_not_matter(ray_local, tmp_path, sample_dir):
    from pipeline.ray_data import RayDataExecutor

    corpus = _corpus(tmp_path / "c.jsonl")

    def cfg(name):
        # ~1 KiB units: several units per stage, so the actor pools really run in parallel.
        return BuildConfig(inputs=(corpus,), output=str(tmp_path / name), dupe_factor=2, num_shards=3,
                           vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), unit_bytes=2048,
                           instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))

    build(cfg("plain"), LocalExecutor())
    build(cfg("ray1"), RayDataExecutor(num_cpus=1))
    build(cfg("ray2"), RayDataExecutor(num_cpus=2))
    mp, tp = _shards(tmp_path / "plain")
    assert mp["totals"]["instances"] > 0 and len(mp["inputs"]) == 1
    for name in ("ray1", "ray2"):
        m, t = _shards(tmp_path / name)
        assert m["totals"] == mp["totals"] and m["shards"] == mp["shards"] and m["config_hash"] == mp["config_hash"]
        assert all(a.equals(b) for a, b in zip(t, tp)), name


@pytest.mark.timeout(300)
def test_units_the_driver_runs_while_ray_starts_change_nothing(ray_local, tmp_path, sample_dir, caplog):
    """The driver works through docs units until the cluster is up; here the start is held until it has committed
    two, and the dataset must still equal the plain loop's."""
    import logging
    import re
    import time

    from pipeline.ray_data import RayDataExecutor

    corpus = _corpus(tmp_path / "c.jsonl", n_docs=48)

    def cfg(name):
        return BuildConfig(inputs=(corpus,), output=str(tmp_path / name), dupe_factor=2, num_shards=3,
                           vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), unit_bytes=2048,
                           instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))

    markers = tmp_path / "slow" / "_work" / "docs"

    def slow_start():  # Ray is already up (the fixture): a start that lasts until the driver has done two units
        deadline = time.time() + 120
        while len(list(markers.glob("*.done.json"))) < 2 and time.time() < deadline:
            time.sleep(0.01)

    build(cfg("plain"), LocalExecutor())
    with caplog.at_level(logging.INFO, logger="pipeline.ray_data"):
        build(cfg("slow"), RayDataExecutor(num_cpus=2, init=slow_start))
    ran = re.search(r"docs stage: (\d+) units ran in the driver", caplog.text)
    assert ran and int(ran.group(1)) >= 2, caplog.text
    (mp, tp), (m, t) = _shards(tmp_path / "plain"), _shards(tmp_path / "slow")
    assert m["totals"] == mp["totals"] and m["shards"] == mp["shards"]
    assert all(a.equals(b) for a, b in zip(t, tp))
