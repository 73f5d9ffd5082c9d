"""The build job runs Arrow on jemalloc, in its own process and in the workers of the local Ray it starts
(pipeline/cluster/arrow_pool.py: with mimalloc a worker's memory crept up with every shard item it ran); a value the
user set wins; the cluster configs set it for their nodes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="jemalloc is in pyarrow's Linux wheels")

# What the job does, in its order: import the job module (which picks the allocator before anything imports
# pyarrow), then start its local Ray, whose worker processes inherit the choice.
PROBE = """
import json, sys
import jobs.build_dataset
import pyarrow as pa
out = {"driver": pa.default_memory_pool().backend_name}
if "--ray" in sys.argv:
    import ray
    from pipeline.build.work import process_state
    from pipeline.cluster.ray_start import init_ray
    init_ray(1)
    out["worker"] = ray.get(ray.remote(num_cpus=1)(process_state).remote())["arrow_pool"]
    ray.shutdown()
print(json.dumps(out))
"""


def probe(*args: str, pool: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "RAY_ADDRESS")}
    if pool:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    p = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_the_job_and_its_local_rays_workers_run_on_jemalloc():
    assert probe("--ray") == {"driver": "jemalloc", "worker": "jemalloc"}


def test_a_pool_the_user_chose_wins():
    assert probe(pool="system") == {"driver": "system"}


def test_the_cluster_configs_set_it_for_their_nodes():
    infra = REPO / "infra"
    assert "ARROW_DEFAULT_MEMORY_POOL=jemalloc" in (infra / "docker" / "Dockerfile").read_text()  # KubeRay's image
    for cloud in ("aws", "gcp"):
        assert "--env ARROW_DEFAULT_MEMORY_POOL=jemalloc" in (infra / cloud / "cluster.yaml").read_text(), cloud
