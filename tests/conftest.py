"""Shared test fixtures: one local Ray per session, a real S3-protocol server and a real MLflow store on loopback.

Everything binds to 127.0.0.1. Ray tests use `ray_local`; a test that needs its own cluster layout
(`ray.cluster_utils.Cluster`) must not run while `ray_local` is up, so it shuts it down via `ray_shutdown`.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

# Before anything imports ray: keep every Ray listener on loopback and keep logs quiet.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
os.environ.pop("RAY_ADDRESS", None)

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"
SHARED_DATA = REPO.parent / "shared" / "data"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """Small public-domain fixtures shipped in the repo (data/sample)."""
    return SAMPLE


@pytest.fixture(scope="session")
def ray_tmpdir():
    # Unix socket paths are limited to ~107 bytes: keep Ray's temp dir short.
    d = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_local(ray_tmpdir):
    """One local Ray (2 logical CPUs) for the session's Ray tests."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=ray_tmpdir,
        log_to_driver=False,
        configure_logging=False,
    )
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_shutdown():
    """For tests that start their own cluster (ray.cluster_utils.Cluster): no session Ray may be running."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-protocol server (moto) on loopback. Yields its endpoint URL; credentials are set in the env."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    yield f"http://127.0.0.1:{port}"
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket on the loopback S3 server; yields (endpoint_url, bucket_name)."""
    import uuid

    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=name)
    yield s3_server, name


@pytest.fixture
def mlflow_uri(tmp_path):
    """A real MLflow tracking store (sqlite) with artifacts under tmp_path; read it back with MlflowClient."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (tmp_path / "mlartifacts").mkdir()
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield uri
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old
