"""Shared test fixtures: one local Ray per session, a real S3-protocol server and a real MLflow store on loopback,
and tiny pre-training datasets made by the real builder (jobs.build_dataset).

Everything binds to 127.0.0.1. Ray tests use `ray_local`; a test that needs its own cluster layout
(`ray.cluster_utils.Cluster`) must not run while `ray_local` is up, so it shuts it down via `ray_shutdown`.
"""
from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from _bare import NOT_ON_THE_GPU_MACHINE, installed, needs
from _ray_local import ensure_local_ray, shutdown_local_ray

# Before anything imports ray: keep every Ray listener on loopback and keep logs quiet.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
os.environ.pop("RAY_ADDRESS", None)
# moto's throwaway credentials, before any Ray starts: Ray's workers get credentials as on a real host, by inheriting
# the environment of the process that started Ray (nothing passes them through runtime_env).
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
# Every job logs to MLFLOW_TRACKING_URI, else ./mlruns under its working directory: a test that names no store logs
# into this session's throw-away one, never into the checkout.
# One per pytest process: an xdist worker inherits the controller's variable, and two processes creating the tables
# of one fresh sqlite store race inside MLflow's migrations ("table trace_info already exists"). A store the user
# named before pytest started is kept.
_SESSION_MLRUNS = tempfile.mkdtemp(prefix="pytest-mlruns-")
if "pytest-mlruns-" in os.environ.get("MLFLOW_TRACKING_URI", "pytest-mlruns-"):
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_MLRUNS}/mlflow.db"
atexit.register(shutil.rmtree, _SESSION_MLRUNS, True)

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"
SHARED_DATA = REPO.parent / "shared" / "data"


class _Module(pytest.Module):
    """A test module whose import needs a stack that is not installed here (one the lent GPU machine lacks without
    the device bundle: Ray, MLflow, boto3, moto, ...) is skipped, naming it, instead of failing collection, which
    would stop `pytest -m gpu` before any test ran. Where every stack is installed (CI) nothing changes, and any
    other import error still fails collection."""

    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as e:
            cause = e.__cause__
            name = (getattr(cause, "name", None) or "").partition(".")[0]
            if not (isinstance(cause, ModuleNotFoundError) and name in NOT_ON_THE_GPU_MACHINE and not installed(name)):
                raise
            pytest.skip(f"{self.path.name} imports {name}, not installed here (the lent GPU machine without the "
                        "device bundle)", allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    return _Module.from_parent(parent, path=module_path)


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
def _ray_local_session(ray_tmpdir):
    """Shuts down, at the session's end and before its temp dir goes, the local Ray that ray_local started."""
    yield
    shutdown_local_ray()


@pytest.fixture
def ray_local(ray_tmpdir, _ray_local_session):
    """A local Ray (2 logical CPUs, loopback) for a Ray test: started once per pytest process and reused, and started
    again when a test before this one shut it down (``ray_shutdown``, a job's main() run in this process) or left
    another Ray up (``_ray_local.ensure_local_ray``). As a session fixture it was started once only: a test after such
    a shutdown found no Ray, and Ray's auto-init in Ray Train then attached to the newest Ray on the machine
    (/tmp/ray/ray_current_cluster), most likely the other pytest process's, which shut it down a moment later: this
    pytest process died mid-test in today's CI run (test_two_ranks, 2026-11-28)."""
    yield ensure_local_ray(ray_tmpdir)


@pytest.fixture
def ray_shutdown():
    """For tests that start their own cluster (ray.cluster_utils.Cluster): no session Ray may be running."""
    ray = needs("ray")

    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-protocol server (moto) on loopback. Yields its endpoint URL; credentials are set in the env."""
    needs("moto")
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

    boto3 = needs("boto3")

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=name)
    yield s3_server, name


@pytest.fixture
def mlflow_uri(tmp_path):
    """A real MLflow tracking store (sqlite) with artifacts under tmp_path; read it back with MlflowClient."""
    needs("mlflow")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (tmp_path / "mlartifacts").mkdir()
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield uri
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


MOBY = SAMPLE / "corpus" / "mobydick.jsonl.gz"
# The fixtures' builds log their MLflow run into the session's throw-away store; where MLflow is not installed (the
# lent GPU machine without the bundle: the GPU tests use these datasets) they log none.
_BUILD_TRACKING = [] if installed("mlflow") else ["--no-mlflow"]


def _chapters(dest: Path, first: int, last: int) -> Path:
    """Moby Dick chapters [first, last) as a small JSON Lines input (chapter 0 is the Gutenberg header)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(MOBY, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    with gzip.open(dest, "wt", encoding="utf-8") as f:
        for doc in docs[first:last]:
            f.write(json.dumps(doc) + "\n")
    return dest


@pytest.fixture(scope="session")
def tiny_pretrain_data(tmp_path_factory) -> dict[str, str]:
    """{"train": URL, "eval": URL}: seq 64, a 600-entry trained vocab, 4 balanced shards; eval from other chapters
    with the train vocabulary. Built with --no-ray (the builder's plain loop over the same steps): fast, no Ray."""
    from jobs import build_dataset

    root = tmp_path_factory.mktemp("pretrain-data")
    common = ["--max-seq-length", "64", "--max-predictions-per-seq", "10", "--num-shards", "4", "--no-ray",
              "--log-level", "WARNING", *_BUILD_TRACKING]
    rc = build_dataset.main(["--input", str(_chapters(root / "raw" / "train.jsonl.gz", 1, 9)),
                             "--output", str(root / "train"), "--vocab-size", "600", "--dupe-factor", "2", *common])
    assert rc == 0
    rc = build_dataset.main(["--input", str(_chapters(root / "raw" / "eval.jsonl.gz", 9, 11)),
                             "--output", str(root / "eval"), "--vocab", str(root / "train" / "vocab.txt"),
                             "--dupe-factor", "1", *common])
    assert rc == 0
    return {"train": str(root / "train"), "eval": str(root / "eval")}


@pytest.fixture(scope="session")
def varied_pretrain_data(tmp_path_factory) -> str:
    """A real build whose rows vary in length (30 chapters, half the document passes with a short target length),
    so batches land in several length buckets (tiny_pretrain_data's rows are all 64 tokens). Built with --no-ray."""
    from jobs import build_dataset

    root = tmp_path_factory.mktemp("varied-data")
    rc = build_dataset.main(["--input", str(_chapters(root / "raw.jsonl.gz", 1, 31)), "--output", str(root / "train"),
                             "--vocab-size", "600", "--max-seq-length", "64", "--max-predictions-per-seq", "10",
                             "--short-seq-prob", "0.5", "--dupe-factor", "2", "--num-shards", "2", "--no-ray",
                             "--log-level", "WARNING", *_BUILD_TRACKING])
    assert rc == 0
    return str(root / "train")
