"""The one Ray adapter: the build's stages as Ray Data pipelines over the same step functions as the plain loop.

    docs:       from_items(units) -> map_batches(read, split, tokenize, commit) [tasks]
    instances:  from_items(uids)  -> map_batches(instances) [tasks; the random-next pool from the object store]
    shards:     from_items(tasks) -> map_batches(write one shard) [tasks]

Every stage is one map of tasks taking one CPU each: one process reads, splits and tokenizes a unit, so its
sentences never cross a process boundary, and tasks reuse Ray's warm worker processes (the WordPiece encoder is
cached per process, its chunk table warm from unit to unit). No actor pools: nothing holds a CPU while waiting on
another stage (the 2-CPU hang of NOTES-stack.md cannot happen), and ``--num-cpus`` caps the parallelism exactly.

Streaming execution with Ray Data's backpressure: one unit per block, so memory is bounded by the unit size.
Results are completion markers (small JSON); the data itself goes to storage, atomically.

Start-up: given ``init`` (how to start or join Ray), the executor brings the cluster up in a background thread when
the first stage begins: ``init``, then one tiny Ray Data execution whose task imports the step modules (Ray Data's
first execution costs seconds: a worker process, its stats and autoscaling actors, imports). Until that is done
the driver, otherwise idle, runs docs units itself with the very same step functions; the rest go to Ray Data.
Which process ran a unit never shows in the output.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from pipeline.instances import RandomDocPool, VocabInfo
from pipeline.readers import InputError, Unit
from pipeline.shards import ShardTask
from pipeline.steps import StepContext, instances_step, read_split, shard_step, tokenize_commit
from pipeline.storage import aws_env

log = logging.getLogger(__name__)



def _unit_from(d: dict) -> Unit:
    return Unit(**d)


_ENCODERS: dict[tuple, Any] = {}


def _encoder(vocab_tokens: list[str], do_lower_case: bool):
    """One WordPiece encoder per worker process and vocabulary: Ray reuses its workers across tasks, so the
    tokenizer loads once per process and its word cache stays warm from unit to unit."""
    from pipeline.tokenize import WordPieceEncoder

    key = (len(vocab_tokens), hash(tuple(vocab_tokens)), do_lower_case)
    if key not in _ENCODERS:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per task: Ray gives the parallelism
        _ENCODERS.clear()
        _ENCODERS[key] = WordPieceEncoder(tokens=vocab_tokens, do_lower_case=do_lower_case)
    return _ENCODERS[key]


def _docs_batch(batch: dict[str, Any], ctx: StepContext, vocab_tokens: list[str]) -> dict[str, list]:
    """Read, split, tokenize and commit whole units in one task: the sentences never leave the process."""
    encoder = _encoder(vocab_tokens, ctx.do_lower_case)
    return {"marker": [json.dumps(tokenize_commit(read_split(_unit_from(json.loads(item)), ctx), ctx, encoder))
                       for item in batch["item"]]}


def _instances_batch(batch: dict[str, Any], ctx: StepContext, pool_ref: list, vocab_tokens: list[str],
                     bits: int) -> dict[str, list]:
    import ray

    # The pool's arrays are read zero-copy from the object store; only its doc id list is unpickled per task.
    pool: RandomDocPool = ray.get(pool_ref[0])
    vocab = VocabInfo.from_tokens(vocab_tokens)
    return {"marker": [json.dumps(instances_step(uid, ctx, pool, vocab, bits)) for uid in batch["item"]]}


def _shard_batch(batch: dict[str, Any], ctx: StepContext, sources: dict) -> dict[str, list]:
    out = []
    for item in batch["item"]:
        d = json.loads(item)
        task = ShardTask(d["index"], d["count"], tuple(tuple(s) for s in d["slices"]))
        out.append(json.dumps(shard_step(task, ctx, sources)))
    return {"marker": out}


def _warm(batch: dict[str, Any]) -> dict[str, Any]:
    """A worker's first task: import what the stages use, so that their first tasks do not."""
    import pyarrow.compute  # noqa: F401
    import tokenizers  # noqa: F401

    import pipeline.steps  # noqa: F401
    import pipeline.tokenize  # noqa: F401
    return batch


def _unwrap(e: BaseException) -> BaseException:
    """The user's error inside Ray's wrappers (RayTaskError, UserCodeException), so the message stays clear."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (InputError, ValueError)) and type(e).__module__.startswith(("pipeline", "builtins")):
            return e
        e = getattr(e, "cause", None) or e.__cause__
    return None


class RayDataExecutor:
    """Runs pending units of each stage on Ray Data; ``num_cpus`` caps the concurrent tasks of every stage (None:
    as many as the cluster's CPUs allow, which is what an autoscaling cluster wants)."""

    def __init__(self, num_cpus: int | None = None, init: Callable[[], None] | None = None):
        self.width = int(num_cpus) if num_cpus else None
        self._init = init  # None: the caller's Ray (or, as Ray Data does, a default ray.init())
        self._ready: concurrent.futures.Future | None = None
        self._queue = self.width  # tasks in flight per stage (see _bring_up)

    def _start(self) -> concurrent.futures.Future:
        """Start (once) bringing Ray up in a background thread; the future is done when the stages can run.

        The thread then stays alive (a daemon, idle) for the life of the process: Ray ties the processes it
        starts (GCS, raylet) to the *thread* that started them (parent-death signal), so they must not see it exit.
        """
        if self._ready is None:
            self._ready = concurrent.futures.Future()
            threading.Thread(target=self._bring_up, name="ray-start", daemon=True).start()
        return self._ready

    def _bring_up(self) -> None:
        import ray

        try:
            if self._init is not None:
                self._init()
            elif not ray.is_initialized():
                ray.init()  # what Ray Data itself does when used without ray.init()
            cluster_cpus = int(ray.cluster_resources().get("CPU", 1))
            # Ray Data notices a finished task up to 0.1 s late (its executor's ray.wait timeout) and only then
            # submits the next, and on a small machine whose CPUs all run tasks its loop also waits for a CPU. When
            # the cluster's own CPUs enforce the cap (a local Ray started with --num-cpus), a second task per CPU
            # waits at the raylet instead, which starts it the moment a CPU frees (40 tasks of ~0.4 s on 2 CPUs:
            # 1.27x -> 1.73x parallelism). On a bigger cluster the cap stays the number of tasks in flight.
            if self.width and cluster_cpus <= self.width:
                self._queue = 2 * self.width
            # One warm-up task: more workers starting at once only slow the driver's work on a small machine.
            self._run([{"item": "0"}], _warm, {}, None)
        except BaseException as e:  # noqa: BLE001 - handed to the stages, which re-raise it
            self._ready.set_exception(e)
            return
        self._ready.set_result(None)
        threading.Event().wait()  # never returns: see _start

    def _wait(self) -> None:
        self._start().result()  # re-raises a failed start

    def _map_args(self, ctx: StepContext) -> dict[str, Any]:
        import ray

        args: dict[str, Any] = {"num_cpus": 1, "compute": ray.data.TaskPoolStrategy(size=self._queue)}
        # Workers do not inherit the driver's environment: hand them the AWS settings (never logged).
        env = aws_env()
        if env:
            args["runtime_env"] = {"env_vars": env}
        return args

    def _run(self, items: list[dict], fn, fn_kwargs: dict, ctx: StepContext | None) -> list[dict]:
        """One map of ``fn`` over ``items`` (one item per block and task); the markers it returns, in any order."""
        import ray

        # Ray Data reserves half of the cluster's resources per operator by default, so that a chain of operators
        # cannot starve its later stages. Our pipelines are one map over in-memory items: the reservation only
        # leaves CPUs idle (on 2 CPUs, 16 one-CPU tasks of 0.2 s took 4.1 s with it, 1.8 s without:
        # benchmarks/build_overheads.py).
        data_ctx = ray.data.DataContext.get_current()
        saved, data_ctx.op_resource_reservation_enabled = data_ctx.op_resource_reservation_enabled, False
        try:
            args = self._map_args(ctx)
            if self._queue and self._queue > len(items):  # Ray Data warns about a cap above the number of tasks
                args["compute"] = ray.data.TaskPoolStrategy(size=len(items))
            ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                fn, batch_size=1, fn_kwargs=fn_kwargs, **args)
            markers = [json.loads(r["marker"]) for r in ds.iter_rows() if "marker" in r]
            if log.isEnabledFor(logging.DEBUG):
                log.debug("Ray Data stats:\n%s", ds.stats())
            return markers
        except Exception as e:  # noqa: BLE001 - re-raised below, unwrapped when it is the user's error
            inner = _unwrap(e)
            if inner is not None and inner is not e:
                raise type(inner)(str(inner)) from e
            raise
        finally:
            data_ctx.op_resource_reservation_enabled = saved

    def docs(self, units: list[Unit], ctx: StepContext, vocab_tokens: list[str]) -> list[dict]:
        import dataclasses

        if not units:
            return []
        ready, done, todo = self._start(), [], list(units)
        while todo and not ready.done():  # the driver works while the cluster comes up
            done.append(tokenize_commit(read_split(todo.pop(0), ctx), ctx, _encoder(vocab_tokens, ctx.do_lower_case)))
        if done:
            log.info("docs stage: %d units ran in the driver while Ray started", len(done))
        self._wait()
        if not todo:
            return done
        items = [{"item": json.dumps(dataclasses.asdict(u))} for u in todo]
        return done + self._run(items, _docs_batch, {"ctx": ctx, "vocab_tokens": vocab_tokens}, ctx)

    def instances(self, uids: list[str], ctx: StepContext, pool: RandomDocPool, vocab_tokens: list[str],
                  bits: int) -> list[dict]:
        import ray

        if not uids:
            return []
        self._wait()
        # The pool goes to the object store once; tasks read its arrays zero-copy.
        pool_ref = ray.put(pool)
        return self._run([{"item": u} for u in uids], _instances_batch,
                         {"ctx": ctx, "pool_ref": [pool_ref], "vocab_tokens": vocab_tokens, "bits": bits}, ctx)

    def shards(self, tasks: list[ShardTask], ctx: StepContext, sources: dict) -> list[dict]:
        if not tasks:
            return []
        self._wait()
        items = [{"item": json.dumps({"index": t.index, "count": t.count, "slices": t.slices})} for t in tasks]
        return self._run(items, _shard_batch, {"ctx": ctx, "sources": sources}, ctx)
