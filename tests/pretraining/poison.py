"""Test-only fault injection for the guard's tests: a model wrapper (the loop's `Worker.wrap` seam, where DDP goes)
that makes the loss NaN on chosen batches, recognised by their content, so a batch replayed after a rollback would
be poisoned again and one skipped is never seen."""
from __future__ import annotations

import hashlib

import torch
from torch import nn

from pretraining.loader import DataConfig, train_batches


def fingerprint(input_ids) -> str:
    array = input_ids.cpu().numpy() if isinstance(input_ids, torch.Tensor) else input_ids
    return hashlib.sha256(array.tobytes()).hexdigest()[:16]


def step_fingerprints(data: DataConfig, vocab_size: int, seed: int, steps: list[int], rank: int = 0,
                      world: int = 1) -> set[str]:
    """The micro-batches this rank trains on at `steps` (1-based) of an undisturbed run of `world` workers."""
    data = data.for_world(world)
    wanted = {(s - 1) * data.accum + i for s in steps for i in range(data.accum)}
    batches = train_batches(data, vocab_size, seed, rank, world, 0)
    found = set()
    try:
        for index in range(max(wanted) + 1):
            batch = next(batches)
            if index in wanted:
                found.add(fingerprint(batch["input_ids"]))
    finally:
        batches.close()
    return found


class Poisoned(nn.Module):
    """The model, whose MLM loss is NaN on the poisoned batches (a real NaN through the real backward)."""

    def __init__(self, model: nn.Module, poisoned: set[str]) -> None:
        super().__init__()
        self.model, self.poisoned, self.hits = model, poisoned, 0

    def forward(self, **batch):
        out = self.model(**batch)
        if fingerprint(batch["input_ids"]) in self.poisoned:
            self.hits += 1
            out.mlm_loss = out.mlm_loss * float("nan")
        return out


def ray_loop(loop_config: dict) -> dict:
    """A Ray Train loop: pretrain_worker's Worker, with the poison (`loop_config["marks"]`) around rank 0's DDP
    model. The test registers this module with cloudpickle by value, so it reaches the workers."""
    import ray.train
    import ray.train.torch

    from pretraining.loop import fit
    from training.checkpoint import RayCheckpoints
    from training.worker import Worker

    cfg, ctx = loop_config["config"], ray.train.get_context()
    rank = ctx.get_world_rank()
    wrapped: list = []

    def wrap(model):
        ddp = ray.train.torch.prepare_model(model)
        wrapped.append(Poisoned(ddp, loop_config["marks"] if rank == 0 else set()))
        return wrapped[-1]

    result = fit(cfg, Worker(rank=rank, world_size=ctx.get_world_size(), device=ray.train.torch.get_device(),
                             wrap=wrap, checkpoints=RayCheckpoints(ray.train), tracking=loop_config.get("tracking")))
    return {"step": result.step, "hits": wrapped[0].hits}
