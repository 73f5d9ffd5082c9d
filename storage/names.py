"""User-given names that become parts of a path (a run's name, the last part of an output folder): one rule for all,
so that no name given on a command line or read from a file leads a writer outside the folder it was meant for.

A path part is refused when it is empty, ``.`` or ``..``, holds a separator (``/`` or ``\\``), a NUL or any other
control character (a newline splits a log line and a listing), or is absolute (``/x``, ``~x``, ``C:x``). An output
folder (a local path or a URL) may be absolute and have several parts, but none of its characters is a control
character and its last part, the one the job names or creates, obeys the same rule. Checked where the name is
parsed, before anything is written; the refusal names the flag and what to give instead.
"""
from __future__ import annotations

import re

_DRIVE = re.compile(r"^[A-Za-z]:")


def path_part_problem(name: object) -> str | None:
    """Why ``name`` cannot be one part of a path (None when it can)."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if name in (".", ".."):
        return f"{name!r} names a folder itself or its parent, not a part of its own"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a control character (a NUL, a newline, ...) in a name"
    if "/" in name or "\\" in name:
        return "a path separator in a name"
    if name.startswith("~") or _DRIVE.match(name):
        return "an absolute path"
    return None


def check_path_part(name: object, flag: str) -> str:
    """``name`` when it is one plain part of a path (module docstring); ValueError naming ``flag`` otherwise."""
    problem = path_part_problem(name)
    if problem:
        raise ValueError(f"{flag} {name!r}: {problem}; give a plain name (letters, digits, '-', '_', '.'), without"
                         " '/', '..' or control characters")
    return name  # type: ignore[return-value]


def check_output(url: object, flag: str) -> str:
    """``url`` (an output folder: a local path or a URL) when it has no control character and its last part is a
    plain name (module docstring); ValueError naming ``flag`` otherwise."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"{flag} {url!r}: give a folder (a local path or a URL such as s3://bucket/prefix)")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError(f"{flag} {url!r}: a control character (a NUL, a newline, ...) in a path; give the folder"
                         " without it")
    path = url.split("://", 1)[1] if "://" in url else url
    last = path.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    if last in ("", ".", ".."):
        raise ValueError(f"{flag} {url!r}: name a folder of its own (e.g. {flag} out/my-dataset), not"
                         " '.', '..' or a root: the job writes and cleans up inside it")
    return url
