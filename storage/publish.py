"""All-or-nothing folders: a model export is replaced whole, so that a reader sees the previous complete export or
the new complete one, never a mix of the two and (on local disk) never nothing after a kill.

On local disk the new folder is staged beside the destination and swapped in with renames: on Linux one
``renameat2(RENAME_EXCHANGE)`` exchanges the two folders atomically (a kill at any point leaves one complete
export at the destination); elsewhere, or on a file system without it, the old folder is first renamed aside to
``.<name>.previous`` and the new one renamed in; a kill between those two renames leaves the destination missing
for an instant, and the next export or ``recover_local`` puts the previous one back. A local export stays a plain
Hugging Face folder: ``from_pretrained(destination)`` reads it.

On object storage nothing is renamed (there is no atomic rename of many keys): the files are uploaded under a new
version prefix ``<destination>/versions/<time>-<random>/``, and then ``<destination>/export.json`` naming that
version is written in one PUT (atomic). Readers (``resolve``, used by training.model_fetch for ``--init`` URLs)
follow ``export.json``; a destination that has version folders but no ``export.json`` (an interrupted first
export) is refused in one line. The previous version is kept (a reader that read the old pointer a moment ago is
still fetching it); older ones are deleted after the new pointer is in place.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import datetime as dt
import json
import logging
import os
import posixpath
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storage import fs as storage_fs
from storage.retry import retrying
from storage.untrusted import check_relative_name

log = logging.getLogger(__name__)

MARKER = "export.json"  # the pointer: {"format", "version", "files": {name: size}}
VERSIONS = "versions"
FORMAT = "bert-export-v1"
MAX_MARKER_BYTES = 1 << 20  # a pointer names a few files; a bigger one was not written by us
KEEP_VERSIONS = 2  # the new one and the one a reader may still be fetching


# ---- local disk --------------------------------------------------------------------------------------------------

def _aside(target: Path) -> Path:
    return target.with_name(f".{target.name}.previous")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL (not supported by this file system), EOPNOTSUPP
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def recover_local(target: Path) -> None:
    """Put the previous export back when a kill left only its aside copy (the fallback swap's one window)."""
    aside = _aside(target)
    if not target.exists() and aside.is_dir():
        os.rename(aside, target)
        log.warning("%s: restored the previous export from %s (an export was interrupted mid-swap)", target, aside)


def _nothing() -> None:
    pass


def swap_in_local(staged: Path, target: Path, prove: Callable[[], None] = _nothing) -> None:
    """Make ``staged`` (a folder on the same file system) the folder at ``target``; the old one is removed.
    ``prove()`` (the destination's writer lease, storage/fence.py) raises when this writer may no longer
    write there: it is asked right before the swap."""
    prove()
    recover_local(target)
    if not target.exists():
        os.rename(staged, target)
        return
    if _exchange(staged, target):
        shutil.rmtree(staged)  # now the old export
        return
    aside = _aside(target)
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(target, aside)
    os.rename(staged, target)
    shutil.rmtree(aside)


# ---- object storage ----------------------------------------------------------------------------------------------

def _new_version() -> str:
    """Sorts by time (microseconds: two exports in one second must still sort in order, or pruning keeps the wrong
    ones); the random part only tells apart two writers' versions in the same microsecond."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ") + "-" + uuid.uuid4().hex[:8]


def publish_remote(local: Path, url: str, endpoint_url: str | None = None, prove: Callable[[], None] = _nothing) -> str:
    """Upload the files of ``local`` under a new version of ``url`` and point ``url/export.json`` at it (last).
    Returns the version. Retries transient faults per file (``retry.retrying``). ``prove()`` (the destination's
    writer lease) is asked before the uploads, before the switch and before old versions are removed: a writer that
    lost the lease meanwhile leaves an unpointed version folder, never a pointer or a deletion."""
    prove()
    fs, root = storage_fs.filesystem_for(url, endpoint_url)
    version = _new_version()
    files = sorted(p for p in local.rglob("*") if p.is_file())
    for p in files:
        name = p.relative_to(local).as_posix()
        dest = storage_fs.join(root, VERSIONS, version, name)
        retrying(lambda p=p, dest=dest: fs.put_file(str(p), dest), f"upload {name} to {url}")
    pointer = {"format": FORMAT, "version": version,
               "files": {p.relative_to(local).as_posix(): p.stat().st_size for p in files}}
    prove()
    storage_fs.write_json_atomic(storage_fs.join(url, MARKER), pointer, endpoint_url)  # one PUT: the switch
    prove()
    _prune(fs, root, url, version)
    return version


def _prune(fs, root: str, url: str, current: str) -> None:
    try:
        fs.invalidate_cache()
        names = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(storage_fs.join(root, VERSIONS), detail=False))
    except FileNotFoundError:
        return
    older = [n for n in names if n != current and n < current]
    for name in older[: max(0, len(older) - (KEEP_VERSIONS - 1))]:
        try:
            fs.rm(storage_fs.join(root, VERSIONS, name), recursive=True)
        except Exception as e:  # noqa: BLE001 - an old version left behind costs space, not correctness
            log.warning("could not delete the old export version %s/%s/%s: %s", url, VERSIONS, name, e)


def read_marker(url: str, endpoint_url: str | None = None) -> dict[str, Any] | None:
    """The pointer at ``url/export.json`` (checked: format, a version name that stays inside the folder, file
    names confined to it); None when there is none."""
    marker_url = storage_fs.join(url, MARKER)
    fs, path = storage_fs.filesystem_for(marker_url, endpoint_url)
    try:
        info = retrying(lambda: fs.info(path), f"stat {marker_url}")
    except FileNotFoundError:
        return None
    if int(info.get("size") or 0) > MAX_MARKER_BYTES:
        raise ValueError(f"{marker_url} is {info.get('size')} bytes (at most {MAX_MARKER_BYTES} expected): not an"
                         " export pointer; re-export to this destination")
    data = retrying(lambda: fs.cat_file(path), f"read {marker_url}")
    try:
        marker = json.loads(data)
        version, files = marker["version"], marker["files"]
        ok = marker.get("format") == FORMAT and isinstance(version, str) and isinstance(files, dict)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"{marker_url} is not an export pointer of this format ({FORMAT}); re-export to this"
                         " destination")
    check_relative_name(version, marker_url, "version")
    for name in files:
        check_relative_name(name, marker_url, "file")
    return marker


def is_complete(url: str, names: tuple[str, ...] = ("config.json",), endpoint_url: str | None = None) -> bool:
    """Whether a complete export holding ``names`` is at ``url``: a local folder holding them, or an object-store
    destination whose pointer names them."""
    if not storage_fs.is_url(url):
        folder = url.removeprefix("file://")
        return all(os.path.isfile(os.path.join(folder, n)) for n in names)
    try:
        marker = read_marker(url, endpoint_url)
    except (ValueError, OSError):
        return False
    return marker is not None and all(n in marker["files"] for n in names)


def resolve(url: str, endpoint_url: str | None = None) -> tuple[str, dict[str, int]] | None:
    """(the folder URL of the current complete version, {file: size}) of an export at ``url``; None when ``url``
    holds no export pointer. Refuses a destination with versions but no pointer (an interrupted first export)."""
    marker = read_marker(url, endpoint_url)
    if marker is not None:
        return storage_fs.join(url, VERSIONS, marker["version"]), {k: int(v) for k, v in marker["files"].items()}
    if storage_fs.exists(storage_fs.join(url, VERSIONS), endpoint_url):
        raise ValueError(f"{url} holds an incomplete export (version folders, no {MARKER}: an export was"
                         " interrupted before it finished); export to it again")
    return None
