"""A local Ray started by a job (`init_ray`) requires a token of its own: the token file is mode 0600 in a 0700
folder, the folder is gone after the job, and a process that attaches without that token (none, or the user's
default ~/.ray/auth_token) is refused, while one that has it attaches (the control)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)

JOB = """
import json, os, sys
from cluster.ray_start import init_ray
init_ray(num_cpus=1)
import ray
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "token": os.environ["RAY_AUTH_TOKEN_PATH"]}),
      flush=True)
sys.stdin.read()  # hold the cluster until the test closes stdin
"""

ATTACH = """
import sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print("ATTACHED", int(ray.cluster_resources().get("CPU", 0)))
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


def attach(gcs: str, home: Path, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    out = subprocess.run([sys.executable, "-c", ATTACH, gcs], capture_output=True, text=True, timeout=120,
                         env={**base, "HOME": str(home), "PYTHONPATH": str(REPO), **env})
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]


def test_the_jobs_local_ray_refuses_an_attach_without_its_token(tmp_path, ray_shutdown):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Unix socket paths: at most 107 bytes
    job = subprocess.Popen([sys.executable, "-c", JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env={**env, "PYTHONPATH": str(REPO), "RAY_TMPDIR": ray_tmp})
    try:
        info = json.loads(job.stdout.readline())
        token = Path(info["token"])
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
        assert len(token.read_text()) == 64
        # No token at all (an empty home: no ~/.ray/auth_token), and the user's default token file holding another.
        empty, other = tmp_path / "home-empty", tmp_path / "home-other"
        empty.mkdir()
        (other / ".ray").mkdir(parents=True)
        (other / ".ray" / "auth_token").write_text("0" * 64)
        for home, extra in ((empty, {}), (empty, {"RAY_AUTH_MODE": "token"}), (other, {"RAY_AUTH_MODE": "token"})):
            answer = attach(info["gcs"], home, **extra)  # an auth error, or a ConnectionError when Ray gives up
            assert answer.startswith("REFUSED"), answer
        assert attach(info["gcs"], empty, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token)) == "ATTACHED 1"
    finally:
        job.stdin.close()
        job.wait(timeout=120)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not token.parent.exists()
