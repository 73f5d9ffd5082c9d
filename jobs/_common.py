"""What every job shares: logging set-up and MLflow tracking (default store, reachability check at start)."""
from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_TRACKING_DIR = "mlruns"


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def resolve_tracking_uri(flag: str | None) -> str:
    """The flag, else MLFLOW_TRACKING_URI, else a local store under the working directory (`mlflow ui` finds it)."""
    uri = flag or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{Path.cwd() / DEFAULT_TRACKING_DIR / 'mlflow.db'}"


def default_artifact_root(tracking_uri: str) -> str | None:
    """With a sqlite store and no artifact root, MLflow writes artifacts to the *logging process's* cwd, which
    inside Ray is a session temp dir: pin them beside the database instead. Servers manage their own."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        return (db.parent / "artifacts").resolve().as_uri()
    if tracking_uri.startswith("file:") or "://" not in tracking_uri:
        return None
    return None


def check_tracking_reachable(tracking_uri: str, timeout: float = 10.0) -> None:
    """Fail at start, not after an hour of training, when a tracking server does not answer."""
    if tracking_uri.startswith(("http://", "https://")):
        url = tracking_uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (the user's own server)
                if r.status != 200:
                    raise ValueError(f"MLflow tracking server {tracking_uri} answered {r.status} on /health")
        except (urllib.error.URLError, OSError) as e:
            raise ValueError(
                f"MLflow tracking server {tracking_uri} is unreachable ({e}). Start it, fix --mlflow-tracking-uri / "
                "MLFLOW_TRACKING_URI, or unset both to use the local store under ./mlruns."
            ) from e
    elif tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def get_or_create_experiment(name: str, tracking_uri: str) -> str:
    """Experiment id for `name`, created with an explicit artifact location where the store needs one."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    root = default_artifact_root(tracking_uri)
    return mlflow.create_experiment(name, artifact_location=f"{root}/{name}" if root else None)


START_ATTEMPTS = 3


def init_ray(num_cpus: int | None = None, dashboard: bool = False) -> None:
    """Join the cluster when there is one (`ray job submit` sets RAY_ADDRESS), else start a local Ray on loopback.

    `num_cpus` caps a local Ray (ignored when joining a cluster, whose size the cluster decides). `dashboard` starts
    the local dashboard (on 127.0.0.1): Ray Train needs it, because its placement-group cleaner asks the state API,
    served by the dashboard, whether the train controller is alive (without it, it warns every second and cannot
    clean up after a crashed controller). The data build does without it (less memory and CPU on small machines).
    """
    import ray

    if ray.is_initialized():
        log.info("using the Ray already initialised in this process (%d CPUs)",
                 int(ray.cluster_resources().get("CPU", 0)))
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        log.info("attached to the Ray cluster at %s (%d CPUs)", os.environ["RAY_ADDRESS"],
                 int(ray.cluster_resources().get("CPU", 0)))
    else:
        # address="local": without it, ray.init() joins any cluster already running on this machine (someone's
        # `ray start`, another job's session) and then refuses num_cpus; we promised a fresh local Ray.
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard)
                return
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this; anything else re-raises
                if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS:
                    raise
                # Ray gives a new node a hard-coded 30 s to register; an overloaded machine can miss that.
                log.warning("local Ray start timed out (attempt %d of %d, machine overloaded?); retrying",
                            attempt, START_ATTEMPTS)
                ray.shutdown()
