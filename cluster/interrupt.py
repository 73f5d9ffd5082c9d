"""Ctrl-C and SIGTERM for a training job: the first signal stops the run at the next step boundary, after a whole
checkpoint, and the job ends its MLflow run KILLED and exits 130 (SIGINT) or 143 (SIGTERM, what `ray job stop` and
Kubernetes send) with one line saying how to resume; a second signal exits at once.

    install("pretrain")            # the job, once, in its main thread
    with deferred(on_request):     # the launcher, while the loop runs: a signal is a request, not an exception
        ...                        #   on_request() tells the workers (a marker file on Ray Train: training.launch)
    raise_if_requested()           # after the loop: `Interrupted` (a KeyboardInterrupt: the run ends KILLED)

Outside `deferred` (the checks, Ray's start-up) nothing is half-written, so the first signal raises `Interrupted`
at once. The loop asks `requested()` at every step (`training.worker.Worker.stop`). Standard library only: the
build job (which reaches no trainer module) and the trainers share it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

_state: dict = {"signum": None, "deferring": 0, "on_request": [], "job": "job"}


class Interrupted(KeyboardInterrupt):
    """The job was stopped by SIGINT/SIGTERM; `exit_code` is 128 + the signal's number."""

    def __init__(self, signum: int, detail: str = "") -> None:
        super().__init__(detail or f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def requested() -> str | None:
    """The signal's name ("SIGINT") once one asked the run to stop; None otherwise."""
    signum = _state["signum"]
    return signal.Signals(signum).name if signum else None


def exit_code(e: BaseException) -> int:
    """130 for Ctrl-C (a KeyboardInterrupt of Python's own), 128 + the signal's number for `Interrupted`."""
    return e.exit_code if isinstance(e, Interrupted) else 128 + signal.SIGINT


def _handler(signum: int, _frame) -> None:
    name = signal.Signals(signum).name
    if _state["signum"] is not None:
        # A second signal: the operator means it. What is not checkpointed is lost; the next run resumes from the
        # last checkpoint (and marks a run left RUNNING as KILLED).
        log.warning("%s: %s again: exiting now; rerun the same command to resume from the last checkpoint",
                    _state["job"], name)
        os._exit(128 + signum)
    _state["signum"] = signum
    if not _state["deferring"]:
        raise Interrupted(signum)
    log.warning("%s: %s: stopping after the current step and a checkpoint (%s again to exit at once)",
                _state["job"], name, name)
    for tell in list(_state["on_request"]):
        try:
            tell()
        except Exception as e:  # noqa: BLE001 - the workers then stop at the lease check or the second signal
            log.warning("could not pass the stop request on to the workers: %s", e)


def install(job: str) -> None:
    """SIGINT and SIGTERM handlers for this job (main thread only; elsewhere, e.g. a test's thread, nothing)."""
    _state.update(signum=None, job=job, installed=True)
    reinstall()


def reinstall() -> None:
    """Our handlers again, after a library replaced them (`ray.init` sets a SIGTERM handler of its own in the main
    thread); nothing for a job that did not `install` them."""
    if not _state.get("installed") or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def reset() -> None:
    """Forget a request (tests that run several jobs in one process)."""
    _state.update(signum=None, deferring=0, on_request=[])


@contextlib.contextmanager
def deferred(on_request: Callable[[], None] | None = None) -> Iterator[None]:
    """While the block runs, a first signal is a request the loop honours at its next step boundary; `on_request`
    (called at once if one came already) passes it on to workers in other processes."""
    _state["deferring"] += 1
    if on_request is not None:
        _state["on_request"].append(on_request)
        if _state["signum"] is not None:
            on_request()
    try:
        yield
    finally:
        _state["deferring"] -= 1
        if on_request is not None:
            _state["on_request"].remove(on_request)


def raise_if_requested(detail: str = "") -> None:
    """`Interrupted` when a signal asked the run to stop (the loop has stopped at a checkpoint by now)."""
    if _state["signum"] is not None:
        raise Interrupted(_state["signum"], detail)
