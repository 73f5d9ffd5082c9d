"""The one module of `training` that imports Ray (tests/test_layering.py holds it to that): how a training run is
launched, for either kind of run, and the Ray Train worker that runs the Ray-free loop.

`run(fit, config, launch)` runs a trainer's loop, handed in by its job (`pretraining.loop.fit`,
`finetuning.loop.fit`: training imports neither trainer), on `launch.num_workers` Ray Train workers (DDP), on
`launch.min_workers` to `launch.num_workers` of them for an elastic run (Ray Train's elastic scaling: the group
restarts from the last checkpoint on fewer workers when one is lost and on more when they fit), or in this process
with `launch.no_ray`, and yields the final checkpoint's directory. Each worker gets a
`training.worker.Worker`: its rank, world size and device, DDP (`prepare_model`), checkpoint hooks (in this
process: the run's local folder; on Ray: resume from `get_checkpoint()`, save through `report(checkpoint=...)`,
which every rank calls: it is a barrier) and what the job prepared for every worker (`inputs`). This is the one
place that decides where a run keeps its checkpoints: `launch.local_directory` in this process, Ray Train's storage
(`launch.storage`/`launch.name`, local or S3) on Ray.

Ray is imported inside the functions (Ray itself is started by `cluster.ray_start.init_ray`, on loopback
unless the job joins a cluster), so `fit` without Ray never loads it.

Fencing (storage/fence.py): when this process holds the run's writer lease (`LaunchConfig.writer_lease`), its
fence goes to every worker. Rank 0 commits each checkpoint (name, step, digest) under the lease by a conditional
write before uploading it (the verdict is broadcast, so every rank stops together), logs to MLflow only while it can
prove the lease, resumes only from a committed checkpoint whose files have the committed digest, and watches the
lease between checkpoints: a worker whose job's driver is stopped or cut off stops within half the stale time of its
last heartbeat. The driver proves the lease again before it hands back
the final checkpoint (an export, the MLflow run's end follow), and steps down (exits, one line) when it cannot.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster import interrupt
from training.ray_noise import quiet_driver, quiet_train_worker

if TYPE_CHECKING:
    from tracking.config import RunRef
    from training.worker import Worker

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """Where a run's workers run and where Ray Train keeps its checkpoints (`storage`/`name`: local or s3://).
    `min_workers` below `num_workers` makes the run elastic: Ray Train starts it on as many workers as it can get
    (at least `min_workers`, at most `num_workers`), continues on fewer when one is lost and grows when workers
    return (each a restart of the worker group from the last checkpoint)."""

    num_workers: int = 1
    """Ray Train workers, one process each (DDP); an elastic run's most."""
    min_workers: int | None = None
    """An elastic run's fewest workers, when below `num_workers`; None: a fixed group of `num_workers`."""
    resize_check_seconds: float = 60.0
    """How often an elastic run looks for more workers (Ray Train's elastic_resize_monitor_interval_s), in seconds;
    each grow restarts from the last checkpoint."""
    cpus_per_worker: float | None = None
    """Ray CPUs (and torch threads) per worker: a fraction up to 1 or a whole number (Ray's rule); None: the
    cluster's CPUs / workers."""
    use_gpu: bool = False
    """One GPU per worker, collectives over NCCL (gloo on CPU)."""
    no_ray: bool = False
    """One worker in this process, no Ray: CPU, or one GPU with `use_gpu`; checkpoints on local disk."""
    storage: str = "./runs"
    """Where the run's folder lives: a local path or a URL such as s3://bucket/prefix (Ray Train's storage)."""
    name: str = "run"
    """The run's name: its folder under `storage` and its MLflow run name; no '/'."""
    keep_checkpoints: int = 3
    """How many of the most recent checkpoints are kept, on Ray (its num_to_keep) or in the local folder; older ones
    are deleted."""
    max_failures: int = 3
    """Worker-group restarts after a failure (a worker or node lost, an elastic shrink included) before the run
    gives up."""
    endpoint_url: str | None = None
    """S3-compatible endpoint of an s3:// storage (MinIO, Ceph, ...)."""

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.keep_checkpoints < 1 or self.max_failures < 0:
            raise ValueError("--num-workers and --keep-checkpoints must be >= 1 and --max-failures >= 0")
        if self.min_workers is not None and not 1 <= self.min_workers <= self.num_workers:
            raise ValueError(f"--num-workers {self.min_workers}:{self.num_workers}: give MIN:MAX with 1 <= MIN <= MAX")
        if self.resize_check_seconds <= 0:
            raise ValueError(f"--resize-check-seconds {self.resize_check_seconds}: give a positive number")
        cpus = self.cpus_per_worker
        if cpus is not None and not (0 < cpus <= 1 or float(cpus).is_integer()):
            raise ValueError(f"--cpus-per-worker {cpus}: use a fraction <= 1 or a whole number (Ray's rule)")
        if self.no_ray and (self.num_workers != 1 or self.elastic):
            raise ValueError("--no-ray runs one worker in this process; drop --num-workers or --no-ray")
        if not self.name or "/" in self.name:
            raise ValueError(f"run name {self.name!r}: give a non-empty name without '/' (--run-name)")
        if self.no_ray and "://" in self.storage and not self.storage.startswith("file://"):
            raise ValueError(f"--storage {self.storage}: a run in this process (--no-ray) keeps checkpoints on "
                             "local disk; give a local path, or drop --no-ray to use Ray Train's storage")

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None and self.min_workers < self.num_workers

    @property
    def fewest_workers(self) -> int:
        """The fewest workers the run may train on (all of them when not elastic)."""
        return self.min_workers if self.elastic else self.num_workers

    @property
    def init_cache(self) -> str:
        """Where a URL `--init` is fetched on each machine: beside the runs of a local storage, else under the
        working directory (never the system's /tmp)."""
        local = "://" not in self.storage or self.storage.startswith("file://")
        return str((Path(self.storage.removeprefix("file://")) if local else Path.cwd()).resolve() / ".init-cache")

    @property
    def run_url(self) -> str:
        """The run's folder: `<storage>/<name>` (a local one made absolute, as the lease record names it)."""
        local = "://" not in self.storage or self.storage.startswith("file://")
        return str(self.local_directory) if local else f"{self.storage.rstrip('/')}/{self.name}"

    def writer_lease(self, what: str):
        """The run's one-writer lease (`<storage>/<name>.lease.json`, storage/lease.py), to hold from before its
        MLflow run is opened until it ends: a second job on this storage and run name refuses before it touches
        the run's checkpoints or its MLflow run."""
        from storage.lease import holding, lease_url_beside

        return holding(lease_url_beside(self.run_url), self.run_url, what, self.endpoint_url,
                       hint="or give this job another --run-name")

    def forget_writer_lease(self) -> None:
        """Remove the run's released lease record: for a run folder removed as a whole once its job ended
        (fine-tuning's temporary checkpoints), so nothing of the run is left beside it."""
        from storage.lease import forget_released, lease_url_beside

        forget_released(lease_url_beside(self.run_url), self.endpoint_url)

    @property
    def local_directory(self) -> Path:
        """The run's folder on local disk, where a run in this process (`no_ray`) keeps its checkpoints."""
        return Path(self.storage.removeprefix("file://")).resolve() / self.name


def storage_filesystem(url: str, endpoint_url: str | None):
    """(pyarrow filesystem or None, path) for Ray Train's RunConfig. It carries no credentials: Ray pickles it to the
    Train controller and workers, and each resolves its own where it runs (boto's chain: a local Ray's processes
    inherit the job's environment; a cluster node has its environment, instance profile, IRSA role or credentials
    file). Keys baked in here would travel, and be kept, wherever Ray stores the run's config."""
    from storage import fs as storage_fs

    if not storage_fs.is_url(url):
        return None, str(Path(url.removeprefix("file://")).resolve())
    import pyarrow.fs

    fs, path = storage_fs.filesystem_for(url, endpoint_url)
    if storage_fs.protocol_of(url) in ("s3", "s3a"):
        import s3fs

        from storage.retry import S3_RETRIES

        # No credentials here: every process that uses this filesystem (the Ray Train controller, each worker)
        # resolves its own (inherited environment, instance profile, IRSA). Our retry policy
        # (storage/retry.py S3_RETRIES), not botocore's default: checkpoint uploads and snapshot reads.
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint_url} if endpoint_url else {},
                               config_kwargs={"retries": dict(S3_RETRIES)})
    return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)), path


# ---- a run, of either trainer -------------------------------------------------------------------------------------

@contextlib.contextmanager
def run(fit: Callable[[Any, Worker], Any], config: Any, launch: LaunchConfig, *, inputs: Any = None,
        tracking: RunRef | None = None) -> Iterator[Path]:
    """`fit(config, worker)` (`pretraining.loop.fit` or `finetuning.loop.fit`) on `launch.num_workers` Ray Train
    workers (DDP), or in this process with `launch.no_ray`; yields the last checkpoint kept (fine-tuning reports a
    checkpoint only for its best epoch, so that is the best one). `inputs`, when given, is handed to every worker
    as `worker.inputs` (through Ray's object store: put once, whatever the number of workers); `tracking` is the
    job's MLflow run, which rank 0 logs into."""
    fence = _fence(launch)
    if launch.no_ray:
        with _in_process(launch, inputs, tracking, fence) as worker, interrupt.deferred():
            result = fit(config, worker)
            final = result.checkpoint
            if final is None and result.step and result.step == result.resumed_from:
                with worker.checkpoints.latest() as done:  # a rerun of a finished run: nothing to train
                    final = str(done) if done is not None else None
                if final is not None:
                    log.info("%s is already complete (step %d, checkpoint %s): nothing to train",
                             launch.run_url, result.step, Path(final).name)
        if final is None:
            raise RuntimeError("training finished without a checkpoint; see the log above")
        _prove(fence)
        yield Path(final)
        return
    with _on_ray(fit, config, launch, inputs, tracking, fence) as directory:
        yield directory


def _fence(launch: LaunchConfig):
    """The fence of the run's writer lease when this process holds it (a job does; a test calling `run` may not)."""
    from storage.lease import held

    lease = held(launch.run_url)
    return lease.fence if lease is not None else None


def _prove(fence) -> None:
    """The driver proves the lease before what follows a run (the export, the MLflow run's end); when it cannot,
    the lease steps down (by default: one ERROR line naming who holds it, exit status 2)."""
    if fence is not None:
        fence.check(fresh=True)


@contextlib.contextmanager
def _in_process(launch: LaunchConfig, inputs: Any = None, tracking: RunRef | None = None,
                fence=None) -> Iterator[Worker]:
    """Rank 0 of 1 in this process, its checkpoints in the run's local folder (`launch.local_directory`); its torch
    threads are the launch's CPUs (restored after: the caller's process, a test session or a notebook, keeps its
    own)."""
    import torch

    from training.checkpoint import LocalCheckpoints
    from training.worker import Worker

    before = torch.get_num_threads()
    if launch.cpus_per_worker:
        torch.set_num_threads(max(1, round(launch.cpus_per_worker)))
    try:
        yield Worker(device=torch.device("cuda" if launch.use_gpu else "cpu"),
                     checkpoints=LocalCheckpoints(launch.local_directory, keep=launch.keep_checkpoints, fence=fence),
                     inputs=inputs, tracking=tracking, fence=fence, stop=interrupt.requested)
    finally:
        torch.set_num_threads(before)


def _cpus_per_worker(launch: LaunchConfig) -> float:
    if launch.cpus_per_worker is not None:
        return launch.cpus_per_worker
    import ray

    per = ray.cluster_resources().get("CPU", 1) / launch.num_workers
    # Ray accepts fractions up to 1 or whole numbers.
    return float(math.floor(per)) if per >= 1 else max(0.25, math.floor(per * 4) / 4)


@contextlib.contextmanager
def _on_ray(fit: Callable, config, launch: LaunchConfig, inputs: Any = None,
            tracking: RunRef | None = None, fence=None) -> Iterator[Path]:
    """`fit(config, worker)` on Ray Train workers (DDP); yields the last checkpoint Ray Train kept (under a fence: the
    last one committed, or the one a finished run was found complete at)."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from cluster.ray_start import init_ray
    from training.rendezvous import LocalRendezvous

    init_ray(dashboard=True)
    interrupt.reinstall()  # ray.init replaced our SIGTERM handler with its own (sys.exit)
    import ray._private.worker

    quiet_driver(ray._private.worker)  # Ray Train's "safe to ignore" tracebacks: in the session logs, not the console
    cpus = _cpus_per_worker(launch)
    resources = {"CPU": cpus, **({"GPU": 1} if launch.use_gpu else {})}
    fs, storage_path = storage_filesystem(launch.storage, launch.endpoint_url)
    # Elastic: Ray Train 2.60's ElasticScalingPolicy starts the group on the workers the cluster can hold (between
    # min and max), restarts it on fewer after a failure and, every `resize_check_seconds` while it runs, on more
    # when they fit: each resize is a restart from the last checkpoint, where the loop continues the same data
    # order on the new world size (pretraining.order) and logs the resize.
    workers = (launch.min_workers, launch.num_workers) if launch.elastic else launch.num_workers
    # Ctrl-C / SIGTERM reach this driver only: a marker beside the run folder tells the workers, who stop together
    # at their next step boundary after a checkpoint. A marker an earlier interrupted run left is removed first.
    marker = (fs, f"{storage_path}/{launch.name}.stop")
    _stop_marker(marker, write=False)
    trainer = TorchTrainer(
        ray_worker,
        train_loop_config={"fit": fit, "config": config, "threads": max(1, round(cpus)),
                           "inputs": ray.put(inputs) if inputs is not None else None, "tracking": tracking,
                           "fence": fence, "run_folder": (fs, f"{storage_path}/{launch.name}"),
                           "keep_checkpoints": launch.keep_checkpoints, "stop_marker": marker},
        # Single-node groups rendezvous through a private file store, not a TCPStore on every interface.
        torch_config=LocalRendezvous(backend="nccl" if launch.use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=launch.use_gpu,
                                               resources_per_worker=resources,
                                               elastic_resize_monitor_interval_s=launch.resize_check_seconds),
        run_config=ray.train.RunConfig(
            name=launch.name, storage_path=storage_path, storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=launch.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=launch.max_failures),
        ),
    )
    if hasattr(trainer, "_register_sigint_handler"):
        # Ray Train 2.60's fit() replaces the SIGINT handler with one that aborts the run mid-step (the run then ends
        # FAILED, exit 1): ours stops it at a step boundary after a checkpoint instead (cluster.interrupt).
        trainer._register_sigint_handler = lambda _controller: None
    log.info("training on %s Ray worker(s) x %s CPU%s", f"{launch.min_workers} to {launch.num_workers}" if
             launch.elastic else launch.num_workers, cpus, " + GPU" if launch.use_gpu else "")
    try:
        with interrupt.deferred(lambda: _stop_marker(marker, write=True)):
            result = trainer.fit()
    except Exception:
        _prove(fence)  # a worker that stopped because the lease was lost: say that, not what Ray made of it
        raise
    finally:
        _stop_marker(marker, write=False)
    _prove(fence)
    _raise_verdict(result.return_value)
    checkpoint = result.checkpoint
    named = (result.return_value or {}).get("checkpoint")
    if fence is not None and named:
        checkpoint = ray.train.Checkpoint(path=f"{storage_path}/{launch.name}/{named}", filesystem=fs)
    if checkpoint is None:
        raise RuntimeError("training finished without a checkpoint; see the worker logs above")
    if (result.return_value or {}).get("complete"):
        log.info("%s is already complete (checkpoint %s): nothing to train", launch.run_url, named)
    with checkpoint.as_directory() as d:
        yield Path(d)


def _stop_marker(marker: tuple, write: bool) -> None:
    """Write (the driver was asked to stop) or remove the run's stop marker (pyarrow filesystem or None, path)."""
    fs, path = marker
    if fs is None:
        p = Path(path)
        if write:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(interrupt.requested() or "SIGINT")
        else:
            p.unlink(missing_ok=True)
        return
    if write:
        with fs.open_output_stream(path) as f:
            f.write((interrupt.requested() or "SIGINT").encode())
    else:
        with contextlib.suppress(FileNotFoundError, OSError):
            fs.delete_file(path)


def _watch_stop_marker(marker: tuple | None, every: float = 1.0) -> Callable[[], str | None]:
    """In a worker: a thread that looks for the driver's stop marker every `every` seconds; the returned callable
    says "SIGINT/SIGTERM" (as the driver's request) once it is there. Each rank watches; the loop makes them agree."""
    import threading

    if marker is None:
        return lambda: None
    fs, path = marker
    seen: list[str] = []

    def read() -> str:
        if fs is None:
            return Path(path).read_text()
        with fs.open_input_stream(path) as f:
            return f.read().decode()

    def watch() -> None:
        while not seen:
            with contextlib.suppress(Exception):  # not there yet, or a storage hiccup: look again
                said = read().strip()
                seen.append(said if said in ("SIGINT", "SIGTERM") else "a stop request")
                return
            threading.Event().wait(every)

    threading.Thread(target=watch, name="stop-marker", daemon=True).start()
    return lambda: seen[0] if seen else None


# ---- inside a Ray Train worker -------------------------------------------------------------------------------------

def ray_worker(loop_config: dict[str, Any]) -> dict[str, Any]:
    """The Ray Train entry point of both trainers: `{"fit", "config", "threads", "inputs", "tracking", "fence",
    "run_folder", "keep_checkpoints"}`.

    Returns (rank 0's is `Result.return_value`) `{"checkpoint": name or None, "complete": bool}`, or
    `{"error": message, "kind": "module:Class"}` when the settings cannot work (a `training.worker.Verdict`: every rank
    reaches it at the same point) or the run's writer lease was lost: raised, either would make Ray Train restart the
    group (`max_failures` times) into the same failure."""
    import ray
    import ray.train
    import ray.train.torch
    import torch

    from storage.lease_record import LeaseLost
    from storage.redact import install_log_redaction, redact_exception, redact_text
    from training.checkpoint import RayCheckpoints
    from training.worker import Verdict, Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    install_log_redaction()  # the worker's lines land in Ray's session logs
    quiet_train_worker()
    torch.set_num_threads(loop_config["threads"])
    ctx = ray.train.get_context()
    world = ctx.get_world_size()
    inputs, fence = loop_config["inputs"], loop_config.get("fence")
    checkpoints = RayCheckpoints(ray.train, fence, loop_config.get("run_folder"),
                                 loop_config.get("keep_checkpoints", LaunchConfig.keep_checkpoints))
    worker = Worker(rank=ctx.get_world_rank(), world_size=world, local_world_size=ctx.get_local_world_size(),
                    device=ray.train.torch.get_device(),
                    wrap=ray.train.torch.prepare_model if world > 1 else (lambda m: m),
                    checkpoints=checkpoints, inputs=ray.get(inputs) if inputs is not None else None,
                    tracking=loop_config["tracking"], fence=fence,
                    stop=_watch_stop_marker(loop_config.get("stop_marker")))
    # Between checkpoints too: a worker whose driver is stopped or cut off stops (the process exits, status 2).
    watching = fence.watch() if fence is not None and worker.rank == 0 else None
    try:
        result = loop_config["fit"](loop_config["config"], worker)
    except (Verdict, LeaseLost) as e:
        logging.getLogger(__name__).error("%s", e)
        return {"error": redact_text(str(e)), "kind": f"{type(e).__module__}:{type(e).__qualname__}"}
    except Exception as e:
        # Redacted in place and re-raised as itself (`from e` would make it its own cause): Ray prints it to its
        # session logs and the driver, past our log filter.
        redact_exception(e)
        raise
    finally:
        if watching is not None:
            watching.set()
    complete = bool(result is not None and result.step and result.step == result.resumed_from and
                    result.checkpoint is None)
    return {"checkpoint": checkpoints.last, "complete": complete}


def _raise_verdict(return_value: dict | None) -> None:
    """The workers' verdict, raised in the driver as the error the loop raised (a ValueError if its class cannot
    be found here)."""
    if not (return_value and return_value.get("error")):
        return
    import importlib

    from storage.lease_record import LeaseLost
    from training.worker import Verdict

    module, _, name = str(return_value.get("kind", "")).partition(":")
    try:
        kind = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        kind = ValueError
    if not (isinstance(kind, type) and issubclass(kind, (Verdict, LeaseLost))):
        kind = ValueError
    raise kind(return_value["error"])
