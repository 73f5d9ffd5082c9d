"""The build's processes allocate so that a worker's memory stays flat from item to item
(cluster/allocators.py): Arrow on jemalloc in the job and in the workers of the local Ray it starts (a value
the user set wins; the cluster configs set it for their nodes), and glibc's mmap threshold fixed, so that large blocks
freed by reader threads go back to the system instead of staying in the threads' arenas."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="jemalloc and mallopt: Linux (glibc)")

# What the job does, in its order: import the job module (which picks the allocators before anything imports
# pyarrow), then start its local Ray, whose worker processes inherit the choice.
POOL_PROBE = """
import json, sys
import jobs.build_dataset
import pyarrow as pa
out = {"driver": pa.default_memory_pool().backend_name}
if "--ray" in sys.argv:
    import ray
    from pipeline.work import process_state
    from cluster.ray_start import init_ray
    init_ray(1)
    out["worker"] = ray.get(ray.remote(num_cpus=1)(process_state).remote())["arrow_pool"]
    ray.shutdown()
print(json.dumps(out))
"""

# glibc's own account of its mmapped blocks (mallinfo2, glibc >= 2.33) after a 3 MiB block is freed and asked for
# again (the bytes mmapped for it): with the dynamic threshold the free raised it past 3 MiB and the block comes from
# the heap; fixed, mmapped.
MMAP_PROBE = """
import ctypes, json, sys
from cluster.allocators import fixed_mmap_threshold
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
fixed = fixed_mmap_threshold() if "--fixed" in sys.argv else None
block = bytearray(3 << 20)
del block
before = libc.mallinfo2().hblkhd
block = bytearray(3 << 20)
print(json.dumps({"fixed": fixed, "mmapped": libc.mallinfo2().hblkhd - before}))
"""


def probe(code: str, *args: str, pool: str | None = None) -> dict:
    # Without what would choose the allocators for the probe: a user's pool, glibc's malloc tunables (either form).
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "RAY_ADDRESS",
                                                             "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_")}
    if pool:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    p = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_the_job_and_its_local_rays_workers_run_arrow_on_jemalloc():
    assert probe(POOL_PROBE, "--ray") == {"driver": "jemalloc", "worker": "jemalloc"}


def test_a_pool_the_user_chose_wins():
    assert probe(POOL_PROBE, pool="system") == {"driver": "system"}


def test_the_cluster_configs_set_it_for_their_nodes():
    infra = REPO / "infra"
    assert "ARROW_DEFAULT_MEMORY_POOL=jemalloc" in (infra / "docker" / "Dockerfile").read_text()  # KubeRay's image
    for cloud in ("aws", "gcp"):
        assert "--env ARROW_DEFAULT_MEMORY_POOL=jemalloc" in (infra / cloud / "cluster.yaml").read_text(), cloud


def test_a_fixed_mmap_threshold_gives_a_freed_large_block_back():
    from cluster.allocators import MMAP_THRESHOLD

    dynamic, fixed = probe(MMAP_PROBE), probe(MMAP_PROBE, "--fixed")
    assert dynamic == {"fixed": None, "mmapped": 0}, dynamic  # glibc's default: the block stayed in the heap
    assert fixed["fixed"] == MMAP_THRESHOLD and fixed["mmapped"] >= 3 << 20, fixed


def test_the_plain_loop_fixes_it_in_its_process():
    code = ("import json; from pipeline.executor import LocalExecutor; "
            "from cluster.allocators import mmap_threshold_fixed; before = mmap_threshold_fixed(); "
            "LocalExecutor().begin(); print(json.dumps({'before': before, 'after': mmap_threshold_fixed()}))")
    from cluster.allocators import MMAP_THRESHOLD

    assert probe(code) == {"before": None, "after": MMAP_THRESHOLD}
