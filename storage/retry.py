"""Retries against object stores, ours rather than the libraries' defaults.

botocore's "legacy" mode retries 4 times with a 2**n backoff and no jitter, and s3fs adds 5 tries of its own for
some errors only. ``s3_options`` gives every s3fs filesystem we open botocore's "standard" mode with S3_RETRIES:
throttling (503 SlowDown), 5xx and connection errors, with exponential backoff and full jitter. ``retrying`` wraps a
whole operation for what neither library retries: a connection reset in the middle of reading a body (or a body
cut short that fails its checksum), a PUT whose answer was lost (the store applied it; ``done`` says so). Both are
exercised through a fault-injecting proxy in tests/storage/test_s3_faults.py and tests/jobs/test_pretrain_s3_faults.py.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# 10 attempts of botocore's standard mode (backoff up to 20 s, full jitter) ride out ~1 minute of a throttling store.
S3_RETRIES = {"max_attempts": 10, "mode": "standard"}
RETRY_ATTEMPTS = 6  # our wrapper's tries of one whole operation, each already retried by botocore
RETRY_BASE_SECONDS = 0.25
RETRY_MAX_SECONDS = 8.0
_FAULT_WORDS = ("slowdown", "reduce your request rate", "serviceunavailable", "service unavailable", "internalerror",
              "throttl", "too many requests", "requestlimitexceeded", "429",
              "requesttimeout", "connection reset", "connection was closed", "server disconnected",
              "connection aborted", "incompleteread", "incomplete read", "response ended prematurely",
              "remotedisconnected", "broken pipe", "timed out", "payload", "content-length", "503", "500 ", "502",
              "504",
              # A body cut short that the client read without noticing the cut: botocore then finds that the bytes it
              # got do not match the checksum the store sent (FlexibleChecksumError). Read again; a stored object
              # whose checksum never matches still fails once the tries are spent.
              "did not match calculated checksum")


def s3_options(endpoint_url: str | None = None) -> dict[str, Any]:
    """s3fs.S3FileSystem keyword arguments: the endpoint, and our retry policy (S3_RETRIES)."""
    options: dict[str, Any] = {"config_kwargs": {"retries": dict(S3_RETRIES)}}
    if endpoint_url:
        options["endpoint_url"] = endpoint_url
    return options


def is_transient(e: BaseException) -> bool:
    """Whether an error from a store is worth retrying: throttling, 5xx, a dropped or reset connection. Missing
    files, refused credentials and failed preconditions are answers, not faults. Readers ask it too: a read that
    still fails this way after the retries is the store's fault, never a corrupt file to skip."""
    if isinstance(e, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError,
                      ValueError)):
        return False
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if isinstance(e, OSError) and e.errno in (errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT):
        return True  # s3fs's SlowDown, ServiceUnavailable and 503 (EBUSY); a timed-out read
    text = f"{type(e).__name__} {e}".lower()
    if "condition" in text or "accessdenied" in text or "nosuchkey" in text or "nosuchbucket" in text:
        return False
    return any(t in text for t in _FAULT_WORDS)


def retrying(fn: Callable[[], T], doing: str, done: Callable[[], bool] | None = None,
             attempts: int = RETRY_ATTEMPTS) -> T | None:
    """``fn()``, tried again after a transient fault (``is_transient``) with exponential backoff and full jitter.

    ``done``: for a write whose answer may have been lost (the store applied it, then the connection dropped):
    asked before a retry, True means it landed and ``None`` is returned instead of writing again (a conditional
    create would otherwise fail against its own object).
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - is_transient decides; everything else is raised as it was
            if attempt == attempts or not is_transient(e):
                raise
            if done is not None:
                with contextlib.suppress(Exception):
                    if done():
                        return None
            pause = random.uniform(0, min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** attempt))
            log.warning("transient storage fault while trying to %s (%s: %s); retry %d of %d in %.1f s", doing,
                        type(e).__name__, str(e)[:200], attempt, attempts - 1, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")
