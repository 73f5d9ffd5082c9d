"""Reading what other people could write (a dataset manifest, an export pointer, a model's config, a checkpoint's
state, a workflow's markers): names confined to the folder they are relative to, so that a crafted file cannot make
us read or write outside it, and sizes bounded, so that it cannot make us read gigabytes into memory."""
from __future__ import annotations

import os
import re
from typing import Any

from storage import fs as storage_fs
from storage.retry import retrying


def check_relative_name(name: Any, where: str, what: str = "file name") -> str:
    """``name`` (read from a file other people could write: a manifest, an export pointer) as a plain relative
    path that stays inside its folder; ValueError naming ``where`` otherwise. Refused: absolute paths, ``..`` or
    ``.`` parts, empty parts, backslashes, URL schemes and drive letters, control characters."""
    bad = (not isinstance(name, str) or not name or name.startswith(("/", "~")) or "\\" in name or "://" in name
           or any(ord(c) < 32 for c in name) or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", name) is not None
           or any(part in ("", ".", "..") for part in name.split("/")))
    if bad:
        raise ValueError(f"{where}: {what} {name!r} is not a relative name inside its folder (absolute paths, '..',"
                         " URL schemes are refused); the file was not written by this tool or was edited: rebuild it")
    return name


def read_local_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of a local file of at most ``limit`` bytes; ValueError naming it when it is larger."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} {os.fspath(path)} is over {limit} bytes, more than one of ours can be: it was not"
                         " written by this tool or was tampered with; replace it")
    return data


def read_bounded(url: str, limit: int, endpoint_url: str | None = None, what: str = "file") -> bytes:
    """The bytes at ``url`` (local or remote) when it holds at most ``limit``; refused (ValueError naming the file)
    before reading otherwise."""
    fs, path = storage_fs.filesystem_for(url, endpoint_url)
    size = int(retrying(lambda: fs.info(path), f"stat {url}").get("size") or 0)
    if size > limit:
        raise ValueError(f"{what} {url} is {size} bytes, more than the {limit} a {what} can be: it is not one of ours"
                         " or was tampered with; replace it")
    data = retrying(lambda: fs.cat_file(path), f"read {url}")
    if len(data) > limit:  # it grew between the two calls
        raise ValueError(f"{what} {url} is over {limit} bytes: it is not one of ours or was tampered with; replace it")
    return data
