"""No secret where it can be read back, no listener off loopback: the three jobs as a team runs them, each in its own
process with its own local Ray, on canaries.

Canaries sit in the AWS environment (key id, secret, session token: moto accepts any), in URL userinfo (the build's
http input `http://u:PASSWORD@127.0.0.1:PORT/corpus.txt`, fine-tuning's http train and eval files) and in signed
query parameters (`?X-Amz-Signature=...`, `?sig=...`), through a Ray build of that input, a Ray pre-training run
with checkpoints and --export on S3 (moto on loopback), and a Ray fine-tuning run from that export. (The build writes
locally: a Ray build into S3 fails here on s3fs's stale listing cache in the driver, a separate bug.) Then every
file the jobs, Ray (its session folder: RAY_TMPDIR) and MLflow (sqlite store and artifacts) wrote, every object in
the bucket and the jobs' own output are searched: no canary anywhere. The URLs that carry canaries reach the jobs in
@FILE arguments (never on a command line, which every user reads with ps): an --endpoint-url with a password on the
command line is refused in one line that does not show it.

While pre-training and fine-tuning run, the listening TCP sockets of each job's process tree (the driver, Ray's
GCS, raylet, dashboard and agents, the train workers) are sampled with psutil: every one is on 127.0.0.1 or ::1 (the
torch.distributed rendezvous included: training/rendezvous.py), read from /proc (a process's socket inodes, the
kernel's TCP tables). 1 worker x 0.5 CPU, bert_tiny, 2 steps, 1 epoch.
"""
from __future__ import annotations

import functools
import gzip
import http.server
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLE, _chapters

pytestmark = pytest.mark.timeout(1800)

AWS = {"AWS_ACCESS_KEY_ID": "CANARYAWSKEYID", "AWS_SECRET_ACCESS_KEY": "CANARYAWSSECRET",
       "AWS_SESSION_TOKEN": "CANARYAWSTOKEN", "AWS_DEFAULT_REGION": "us-east-1"}
PASSWORD, SIGNATURE = "CANARYUSERPW", "CANARYSIGNATURE"
CANARIES = (*[v for k, v in AWS.items() if v.startswith("CANARY")], PASSWORD, SIGNATURE)
LOOPBACK = ("127.0.0.1", "::1")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """The folder over http; a GET under /failing/ is answered 500 from the second on (the build's driver reads the
    input's head, then its read task in a Ray worker fails)."""

    failing_gets = 0

    def log_message(self, *args) -> None:  # the test's output is grepped too; keep it ours
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/failing/"):
            type(self).failing_gets += 1
            if type(self).failing_gets > 1:
                self.send_error(500, "store failure")
                return
        super().do_GET()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A loopback http server over a folder with the corpus and the fine-tuning files; yields its base URL."""
    root = tmp_path_factory.mktemp("http")
    with gzip.open(_chapters(root / "c.jsonl.gz", 1, 9), "rt") as f:
        (root / "corpus.txt").write_text("\n\n".join(json.loads(line)["text"] for line in f))
    (root / "failing").mkdir()
    shutil.copy(root / "corpus.txt", root / "failing" / "corpus.txt")
    with gzip.open(SAMPLE / "tasks" / "rt_sentiment.jsonl.gz", "rt") as f:
        rows = [line for line in f][:48]
    (root / "train.jsonl").write_text("".join(rows[:32]))
    (root / "eval.jsonl").write_text("".join(rows[32:]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _tree(root: int) -> list[int]:
    """`root` and every process under it (by the parent pids in /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            pid, ppid = text.split(" (", 1)[0], text.rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        children.setdefault(int(ppid), []).append(int(pid))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _listening_sockets() -> dict[str, tuple[str, int]]:
    """{socket inode: (local ip, port)} of every TCP socket in LISTEN state (state 0A) on this host."""
    found = {}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":
                continue
            addr, port = fields[1].split(":")
            raw = bytes.fromhex(addr)
            if width == 4:
                ip = ".".join(str(b) for b in raw[::-1])
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                v6 = ipaddress.IPv6Address(words)
                ip = str(v6.ipv4_mapped or v6)
            found[fields[9]] = (ip, int(port, 16))
    return found


def _listening(root: int) -> set[tuple[str, str, int]]:
    """(process name, ip, port) of every listening TCP socket held by `root`'s process tree."""
    listening, found = _listening_sockets(), set()
    for pid in _tree(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and (inode := link[8:-1]) in listening:
                found.add((name, *listening[inode]))
    return found


def run_job(script: str, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> tuple[int, set]:
    """Run jobs/<script> to completion, sampling its process tree's listening sockets; (exit code, listeners)."""
    listeners: set = set()
    with open(log, "wb") as out:
        job = subprocess.Popen([sys.executable, str(REPO / "jobs" / script), *args], env=env, cwd=cwd, stdout=out,
                               stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        while job.poll() is None and time.monotonic() < deadline:
            listeners |= _listening(job.pid)
            time.sleep(0.3)
        if job.poll() is None:
            job.kill()
        return job.wait(), listeners


@pytest.fixture(scope="module")
def jobs(served, s3_server, tmp_path_factory):
    import boto3

    tmp = tmp_path_factory.mktemp("canaries")
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Unix socket paths: at most 107 bytes
    bucket = "canaries"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RAY_ADDRESS", "MLFLOW_"))}
    env.update(AWS, PYTHONPATH=str(REPO), RAY_TMPDIR=ray_tmp, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING="false")
    uri = f"sqlite:///{tmp}/mlflow.db"
    common = ["--endpoint-url", s3_server, "--mlflow-tracking-uri", uri]
    http_auth = f"http://u:{PASSWORD}@{served}"

    def args_file(name: str, *args: str) -> str:
        """Arguments that hold credentials, in a file only we can read, given as @FILE (issue 30, item 13)."""
        path = tmp / f"{name}.args"
        path.write_text("\n".join(args) + "\n")
        path.chmod(0o600)
        return f"@{path}"

    result = {"tmp": tmp, "ray_tmp": Path(ray_tmp), "bucket": bucket, "endpoint": s3_server, "logs": {}}
    try:
        steps = {
            "build": ("build_dataset.py", [
                args_file("build", "--input", f"{http_auth}/corpus.txt?X-Amz-Signature={SIGNATURE}&X-Amz-Expires=600"),
                "--format", "text", "--output", str(tmp / "ds"), "--vocab-size", "600",
                "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--num-shards", "2",
                "--dupe-factor", "1", "--num-cpus", "1", "--progress", "lines", *common]),
            "pretrain": ("pretrain.py", [
                "--data", str(tmp / "ds"), "--preset", "bert_tiny", "--max-steps", "2", "--batch-size", "8",
                "--num-workers", "1", "--cpus-per-worker", "0.5", "--storage", f"s3://{bucket}/runs",
                "--run-name", "canary", "--checkpoint-every", "2", "--log-every", "1",
                "--export", f"s3://{bucket}/export", "--no-system-metrics", *common]),
            "finetune": ("finetune.py", [
                "--task", "classification", args_file("finetune", "--train", f"{http_auth}/train.jsonl?sig={SIGNATURE}",
                                                      "--eval", f"{http_auth}/eval.jsonl?token={SIGNATURE}"),
                "--data-format", "jsonl",
                "--init", f"s3://{bucket}/export", "--epochs", "1", "--batch-size", "8", "--max-seq-length", "64",
                "--num-workers", "1", "--cpus-per-worker", "0.5", "--output", str(tmp / "ft"), *common]),
        }
        for name, (script, args) in steps.items():
            log = tmp / f"{name}.log"
            rc, listeners = run_job(script, args, env, tmp, log)
            result["logs"][name] = log
            result[name] = {"rc": rc, "listeners": listeners}
            assert rc == 0, f"{name} failed:\n" + log.read_text()[-4000:]
        # A store that fails the build's read task (in a Ray worker): a one-line error naming the input, redacted.
        failed = tmp / "failed-build.log"
        rc, _ = run_job("build_dataset.py", [
            args_file("failing", "--input", f"{http_auth}/failing/corpus.txt?X-Amz-Signature={SIGNATURE}"),
            "--format", "text",
            "--output", str(tmp / "failed"), "--vocab", str(SAMPLE / "reference" / "bert-base-uncased-vocab.txt"),
            "--max-seq-length", "64", "--num-shards", "2", "--dupe-factor", "1", "--num-cpus", "1",
            "--progress", "lines", *common], env, tmp, failed)
        result["failed_build"] = {"rc": rc, "log": failed, "gets": _Quiet.failing_gets}
        refused = subprocess.run([sys.executable, str(REPO / "jobs" / "build_dataset.py"), "--input",
                                  f"http://{served}/corpus.txt", "--output", f"s3://{bucket}/other",
                                  "--endpoint-url", f"http://user:{PASSWORD}@{s3_server.split('://')[1]}"],
                                 env=env, cwd=tmp, capture_output=True, text=True, timeout=300)
        result["refused"] = refused
        yield result
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _files_with(root: Path, needles: tuple[str, ...]) -> dict[str, list[str]]:
    hits: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            found = [n for n in needles if n.encode() in data]
            if found:
                hits[str(path)] = found
    return hits


@pytest.mark.slow
def test_no_canary_in_anything_the_jobs_ray_or_mlflow_wrote(jobs):
    import boto3

    assert jobs["refused"].returncode != 0
    assert "a credential on the command line is readable by every user" in jobs["refused"].stderr
    assert len(jobs["refused"].stderr.strip().splitlines()) == 1
    assert not [c for c in CANARIES if c in jobs["refused"].stderr + jobs["refused"].stdout]
    # The runs did what they are for (a redaction that broke reading would pass the search below).
    assert (jobs["tmp"] / "ft" / "model.safetensors").is_file()
    s3 = boto3.client("s3", endpoint_url=jobs["endpoint"], region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=jobs["bucket"])["Contents"]]
    assert any(k.startswith("export/") and k.endswith("/config.json") or k == "export/config.json" for k in keys)
    assert any(k.startswith("runs/canary/checkpoint") for k in keys)
    manifest = json.loads((jobs["tmp"] / "ds" / "manifest.json").read_text())
    assert manifest["inputs"][0]["path"].startswith("http://REDACTED@127.0.0.1:")
    hits = {**_files_with(jobs["tmp"], CANARIES), **_files_with(jobs["ray_tmp"], CANARIES)}
    hits = {k: v for k, v in hits.items() if not k.endswith(".args")}  # the @FILEs we gave the jobs
    hits.update({f"s3://{jobs['bucket']}/{k}": [c for c in CANARIES if c.encode() in body]
                 for k in keys if (body := s3.get_object(Bucket=jobs["bucket"], Key=k)["Body"].read())
                 and any(c.encode() in body for c in CANARIES)})
    assert not hits
    assert any(p.name.startswith("session_") for p in (jobs["ray_tmp"] / "ray").iterdir())  # Ray wrote there


@pytest.mark.slow
def test_a_store_failing_a_build_task_is_one_redacted_line(jobs):
    """The failure happened in the read task (the server failed the second GET, the first was the driver's), and
    the job ended on one line naming the input without its secrets (the search above covers Ray's logs of it)."""
    failed = jobs["failed_build"]
    assert failed["gets"] >= 2
    lines = failed["log"].read_text().splitlines()
    assert failed["rc"] == 2 and not any(line.startswith("Traceback") for line in lines), lines[-20:]
    assert lines[-1].startswith("build_dataset: error: cannot read input http://REDACTED@127.0.0.1:"), lines[-1]
    assert "/failing/corpus.txt?X-Amz-Signature=REDACTED" in lines[-1] and "500" in lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("job", ["pretrain", "finetune"])
def test_every_listener_of_a_training_job_is_on_loopback(jobs, job):
    listeners = jobs[job]["listeners"]
    assert len({name for name, _, _ in listeners}) >= 2  # the sampler saw Ray's processes, not just the driver
    assert not [(name, ip, port) for name, ip, port in listeners if ip not in LOOPBACK]


def test_the_sampler_sees_what_ray_trains_default_rendezvous_opens():
    """The control: torch's TCPStore (Ray Train's default rendezvous), even with host 127.0.0.1, listens on every
    interface, and the sampler above reports it as off loopback."""
    code = ("import time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, 1, True); print(s.port, flush=True);"
            " time.sleep(60)")
    store = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(store.stdout.readline())
        seen = _listening(store.pid)
    finally:
        store.kill()
        store.wait()
    assert {(ip, p) for _, ip, p in seen if p == port} and all(ip not in LOOPBACK for _, ip, p in seen if p == port)
