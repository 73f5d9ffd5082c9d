"""Names read from files other people could write (a dataset manifest, an export pointer), confined to the folder
they are relative to, so that a crafted file cannot make us read or write outside it."""
from __future__ import annotations

import re
from typing import Any


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
