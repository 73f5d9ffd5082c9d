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
