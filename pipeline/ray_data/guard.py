"""What every Ray task of the build runs its code through (``in_worker``): our log lines redacted, and an
unexpected exception replaced by a ``WorkerError`` of redacted text, because Ray prints a task's exception to its
session logs and the driver's console itself, past any log filter."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.allocators import fixed_mmap_threshold
from pipeline.rows import users_mistake
from storage.redact import redact_worker_logging, redacted_error


def in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as a Ray task of the build runs it: our log lines redacted, and an unexpected exception raised
    as a ``WorkerError`` of redacted text (Ray prints a task's exception to its session logs and the driver itself,
    past any log filter; a user's mistake, an ``InputError`` or our ``ValueError``, goes through as it is, to be
    returned as a value)."""
    redact_worker_logging()
    fixed_mmap_threshold()  # once per process: a worker's memory flat from item to item (cluster/allocators.py)
    fence = _fence_of(fn)
    try:
        if fence is None:
            return fn(*args)
        with fence.watching():  # the build's writer lease, proved every S/8 while the task runs (storage/fence.py)
            return fn(*args)
    except Exception as e:  # noqa: BLE001 - re-raised: a user's mistake as it is, anything else redacted
        if users_mistake(e):
            raise
        raise redacted_error(e) from None


def _fence_of(fn: Callable[..., Any]) -> Any:
    """The build's fence a step (``step.ctx.fence``, ``step.fence``) or a sink's bound ``write`` carries; None for a
    row operator, which commits nothing."""
    owner = getattr(fn, "__self__", fn)
    fence = getattr(owner, "fence", None)
    return fence if fence is not None else getattr(getattr(owner, "ctx", None), "fence", None)


class Guarded:
    """A row operator run through ``in_worker``; ``guarded`` names its class after the operator's, so Ray's plans
    still read ``MapBatches(SplitTokenize)``."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return in_worker(self.fn, *args)


def guarded(fn: Callable[..., Any]) -> Guarded:
    return type(type(fn).__name__, (Guarded,), {})(fn)
