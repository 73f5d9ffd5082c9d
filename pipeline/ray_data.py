"""The one Ray adapter: the build's stages as Ray Data pipelines over the same step functions as the plain loop.

    docs:       from_items(units) -> map_batches(read_split) [tasks] -> map_batches(TokenizeCommit) [actor pool]
    instances:  from_items(uids)  -> map_batches(instances) [tasks; the random-next pool from the object store]
    shards:     from_items(tasks) -> map_batches(write one shard) [tasks]

(Ray Data fuses read_split into the tokenizer actors: one process reads, splits and tokenizes a unit.)

Streaming execution with Ray Data's backpressure: one unit per block, so memory is bounded by the unit size. Actors
take fractional CPUs (0.5) so that an actor pool as wide as the CPUs never starves the read tasks (the 2-CPU hang of
NOTES-stack.md). Results are completion markers (small JSON); the data itself goes to storage, atomically.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from pipeline.instances import RandomDocPool, VocabInfo
from pipeline.readers import InputError, ReadReport, Unit
from pipeline.shards import ShardTask
from pipeline.steps import SplitUnit, StepContext, instances_step, read_split, shard_step, tokenize_commit
from pipeline.storage import aws_env

log = logging.getLogger(__name__)

ACTOR_CPUS = 0.5
TASK_CPUS = 0.5


def _unit_from(d: dict) -> Unit:
    return Unit(**d)


def _read_split_batch(batch: dict[str, Any], ctx: StepContext) -> dict[str, list]:
    out: dict[str, list] = {"uid": [], "payload": []}
    for item in batch["item"]:
        s = read_split(_unit_from(json.loads(item)), ctx)
        payload = {"uid": s.uid, "path": s.path, "doc_ids": s.doc_ids, "sentences": s.sentences,
                   "dropped": dict(s.report.dropped), "bad_files": s.report.bad_files}
        out["uid"].append(s.uid)
        out["payload"].append(json.dumps(payload))
    return out


class TokenizeCommit:
    """Loads the WordPiece tokenizer once per actor; tokenizes and commits whole units."""

    def __init__(self, ctx: StepContext, vocab_tokens: list[str]):
        from pipeline.tokenize import WordPieceEncoder

        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per actor: Ray gives the parallelism
        self.ctx = ctx
        self.encoder = WordPieceEncoder(tokens=vocab_tokens, do_lower_case=ctx.do_lower_case)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        markers = []
        for payload in batch["payload"]:
            p = json.loads(payload)
            report = ReadReport()
            report.dropped.update(p["dropped"])
            report.bad_files.update(p["bad_files"])
            split = SplitUnit(p["uid"], p["path"], p["doc_ids"], p["sentences"], report)
            markers.append(json.dumps(tokenize_commit(split, self.ctx, self.encoder)))
        return {"marker": markers}


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
    """Runs pending units of each stage on Ray Data; ``num_cpus`` = how wide the actor pools may grow."""

    def __init__(self, num_cpus: int | None = None):
        import ray

        self.width = max(1, int(num_cpus or ray.cluster_resources().get("CPU", 1)))

    def _remote_args(self, ctx: StepContext) -> dict[str, Any]:
        # Workers do not inherit the driver's environment: hand them the AWS settings (never logged).
        env = aws_env()
        return {"runtime_env": {"env_vars": env}} if env else {}

    def _pool(self, n_items: int):
        import ray

        size = max(1, min(self.width, n_items))
        return ray.data.ActorPoolStrategy(min_size=size, max_size=size)

    def _run(self, ds) -> list[dict]:
        try:
            return [json.loads(r["marker"]) for r in ds.iter_rows()]
        except Exception as e:  # noqa: BLE001 - re-raised below, unwrapped when it is the user's error
            inner = _unwrap(e)
            if inner is not None and inner is not e:
                raise type(inner)(str(inner)) from e
            raise

    def docs(self, units: list[Unit], ctx: StepContext, vocab_tokens: list[str]) -> list[dict]:
        import dataclasses

        import ray

        if not units:
            return []
        items = [{"item": json.dumps(dataclasses.asdict(u))} for u in units]
        extra = self._remote_args(ctx)
        ds = (ray.data.from_items(items, override_num_blocks=len(items))
              .map_batches(_read_split_batch, batch_size=1, fn_kwargs={"ctx": ctx}, num_cpus=TASK_CPUS, **extra)
              .map_batches(TokenizeCommit, batch_size=1, fn_constructor_kwargs={"ctx": ctx,
                           "vocab_tokens": vocab_tokens}, compute=self._pool(len(units)), num_cpus=ACTOR_CPUS,
                           **extra))
        return self._run(ds)

    def instances(self, uids: list[str], ctx: StepContext, pool: RandomDocPool, vocab_tokens: list[str],
                  bits: int) -> list[dict]:
        import ray

        if not uids:
            return []
        pool_ref = ray.put(pool)
        # Tasks, not an actor pool: the work per unit dwarfs fetching the pool, and tasks reuse the warm workers
        # instead of starting a new process per actor (seconds each at this corpus size).
        ds = ray.data.from_items([{"item": u} for u in uids], override_num_blocks=len(uids)).map_batches(
            _instances_batch, batch_size=1, num_cpus=1,
            fn_kwargs={"ctx": ctx, "pool_ref": [pool_ref], "vocab_tokens": vocab_tokens, "bits": bits},
            **self._remote_args(ctx))
        return self._run(ds)

    def shards(self, tasks: list[ShardTask], ctx: StepContext, sources: dict) -> list[dict]:
        import ray

        if not tasks:
            return []
        items = [{"item": json.dumps({"index": t.index, "count": t.count, "slices": t.slices})} for t in tasks]
        ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            _shard_batch, batch_size=1, fn_kwargs={"ctx": ctx, "sources": sources}, num_cpus=TASK_CPUS,
            **self._remote_args(ctx))
        return self._run(ds)
