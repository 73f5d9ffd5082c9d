"""Ray, up: join the cluster a job was submitted to, or start a local Ray on loopback. Used by the dataset build's
engine and by the training launcher (`training.launch`), the two places that run on Ray.

A local Ray (no RAY_ADDRESS) listens on 127.0.0.1 only, whatever the environment: Ray decides at import time
whether to advertise the machine's external address, so `init_ray` sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before
importing it (and corrects Ray's constant when something imported Ray earlier) and passes the node address.

A local Ray also requires a token of its own (`local_token`): Ray 2.60's token authentication (RAY_AUTH_MODE=token)
with a fresh 256-bit token in a file of mode 0600 inside a 0700 folder, named by RAY_AUTH_TOKEN_PATH. Ray's default
for a new local Ray is one token per user in ~/.ray/auth_token, shared by every cluster that user starts (and left
as the umask makes it): any process that can read it attaches to any of them. Ray's processes inherit the two
variables from this one (they are set before `ray.init` starts them), so no secret travels in a `runtime_env`. The
folder is removed when the process exits.

Credentials reach the workers the same way: a local Ray's raylet inherits this process's environment (AWS_* set
before the job started), and on a cluster each node's own environment, instance profile, IRSA role or credentials
file provides them. Nothing is passed through `runtime_env`, which Ray writes to its logs and serves on its dashboard.
"""
from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
START_ATTEMPTS = 3
GCS_PORT_VARIABLE = "RAY_GCS_SERVER_PORT"  # ray._private.ray_constants.GCS_PORT_ENVIRONMENT_VARIABLE


class DropMessages(logging.Filter):
    """Drops the records of one logger whose message starts with one of `prefixes` (the rest of it still shows)."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def drop_messages(logger_name: str, *prefixes: str) -> None:
    """Installs `DropMessages(prefixes)` on that logger, once."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, DropMessages) and f.prefixes == prefixes for f in logger.filters):
        logger.addFilter(DropMessages(*prefixes))


def init_ray(num_cpus: int | None = None, dashboard: bool = False) -> None:
    """Join the cluster when there is one (`ray job submit` sets RAY_ADDRESS), else start a local Ray on loopback.

    `num_cpus` caps a local Ray (ignored when joining a cluster, whose size the cluster decides). `dashboard` starts
    the local dashboard (on 127.0.0.1): Ray Train needs it, because its placement-group cleaner asks the state API,
    served by the dashboard, whether the train controller is alive (without it, it warns every second and cannot
    clean up after a crashed controller). The data build does without it (less memory and CPU on small machines).
    """
    if not os.environ.get("RAY_ADDRESS"):
        # Read by Ray when it is imported and by every process it starts: with it, a node's listeners bind to
        # loopback and it advertises 127.0.0.1 (the node address alone does not stop the external one).
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # The job handles SIGTERM itself; Ray's warning that a ray.init from a thread (the build starts Ray in the
    # background) sets no handler is noise. Filtered by logger and message only.
    drop_messages("ray._private.worker", "SIGTERM handler is not set because current thread is not the main thread")
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        log.info("using the Ray already initialised in this process (%d CPUs)",
                 int(ray.cluster_resources().get("CPU", 0)))
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        log.info("attached to the Ray cluster at %s (%d CPUs)", os.environ["RAY_ADDRESS"],
                 int(ray.cluster_resources().get("CPU", 0)))
        return
    # Something imported Ray before the variable was set: correct what Ray read from it (pinned Ray: private name).
    ray_constants.ENABLE_RAY_CLUSTER = False
    local_token()
    # A local one-node Ray: Ray Train's preemption watcher looks for cloud nodes being drained, which cannot happen
    # to it, and logs an error line about its own actor in every job. Off for the Ray this process starts; a Ray it
    # joins (a cluster, or one a caller initialised, e.g. several raylets) keeps it.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # Ray starts its workers at niceness 15 by default (raylet config `worker_niceness`): beside any process at the
    # default priority (two busy loops, a browser, a compile) a worker then gets ~4% of its CPUs (CFS weights 36 vs
    # 1024): the quickstart's training ran at 0.04 steps/s against ~0.8 on this 2-core box with two `yes` loops
    # (2026-12-06). A local Ray is the job's own: its workers run at the job's priority. (`ray job submit` sets the
    # same for its drivers.) A user who wants them lower sets RAY_worker_niceness.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # address="local": without it, ray.init() joins any cluster already running on this machine (someone's
    # `ray start`, another job's session) and then refuses num_cpus; we promised a fresh local Ray.
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            _start_local(ray, num_cpus, dashboard)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this; anything else re-raises
            if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS:
                raise
            # Ray gives a new node a hard-coded 30 s to register; an overloaded machine can miss that.
            log.warning("local Ray start timed out (attempt %d of %d, machine overloaded?); retrying",
                        attempt, START_ATTEMPTS)
            ray.shutdown()


def local_token() -> Path:
    """Make the local Ray this process starts require a token of its own (see the module docstring); returns its
    file. Any RAY_AUTH_TOKEN inherited from the shell (another cluster's) is dropped: it would take precedence."""
    folder = Path(tempfile.mkdtemp(prefix="bert-ray-auth-"))  # mode 0700
    path = folder / "auth_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes: 256 bits
    atexit.register(_stop_and_remove, folder)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")  # Ray caches its config and token at first use: make this process see the new ones
    AuthenticationTokenLoader.instance().reset_cache()
    return path


def _stop_and_remove(folder: Path) -> None:
    import ray

    ray.shutdown()  # the token's last users first (atexit runs this before Ray's own hook)
    shutil.rmtree(folder, ignore_errors=True)


def _start_local(ray, num_cpus: int | None, dashboard: bool) -> None:
    """A local Ray whose GCS port we choose, so its workers can be told their cluster's address (RAY_ADDRESS in the
    job's environment): Ray's state API, which Ray Train's placement-group cleaner calls from a worker, otherwise
    looks the cluster up among every Ray on the machine and, with another one running (other users, other jobs),
    fails with "Found multiple active Ray instances" and a 30-line traceback in the job's output."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    before = os.environ.get(GCS_PORT_VARIABLE)
    os.environ[GCS_PORT_VARIABLE] = str(port)  # read by Ray when it starts the head's GCS
    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, _node_ip_address=LOOPBACK,
                 runtime_env={"env_vars": {"RAY_ADDRESS": f"{LOOPBACK}:{port}"}})
    finally:
        if before is None:
            os.environ.pop(GCS_PORT_VARIABLE, None)
        else:
            os.environ[GCS_PORT_VARIABLE] = before
