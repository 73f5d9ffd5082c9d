"""conftest's ``ray_local``: a test after one that shut Ray down (``ray_shutdown``: the multi-raylet tests) gets the
local Ray again, with its 2 CPUs and its temp dir, not a Ray-less process (where Ray's auto-init in Ray Train or Ray
Data would start a default Ray, or join another one running on the machine). The three tests run in this order, in one
pytest process."""
from __future__ import annotations

import os

SEEN: dict[str, str] = {}


def test_1_ray_local_starts_the_local_ray(ray_local):
    assert ray_local.is_initialized() and ray_local.cluster_resources()["CPU"] == 2
    SEEN["gcs"] = ray_local.get_runtime_context().gcs_address


def test_2_a_test_shuts_ray_down(ray_shutdown):
    import ray

    assert not ray.is_initialized()


def test_3_ray_local_is_up_again(ray_local, ray_tmpdir):
    assert ray_local.is_initialized() and ray_local.cluster_resources()["CPU"] == 2
    assert ray_local.get_runtime_context().gcs_address != SEEN.get("gcs")  # a new one: the first was shut down
    assert any(os.scandir(ray_tmpdir))  # its session lives under the tests' short temp dir
