"""Completion markers: one small typed JSON record per finished work item (datatrove style).

Each stage's file defines its own marker type (``InstancesMarker`` in ``instances.py``, ...); this module holds what
they share. A step commits its output atomically, then its marker; a marker's presence means the item is done and is
skipped on resume. Markers are frozen dataclasses (``to_json`` / ``from_json``) rather than dicts, so a field that a
later stage reads has one name and one type. ``read_markers`` reads a stage's markers with a thread pool: on object
storage one GET costs tens of milliseconds, and a build has thousands of units.
"""
from __future__ import annotations

import array
import concurrent.futures
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from storage.fs import join, list_names, read_bytes, write_bytes_atomic

SUFFIX = ".done.json"
_READ_THREADS = 32  # concurrent GETs while resuming; a local disk answers faster than any pool overhead

M = TypeVar("M", bound="Marker")


def _freeze(v: Any) -> Any:
    """JSON lists back to the tuples the dataclasses declare (frozen markers hold no mutable lists)."""
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


@dataclasses.dataclass(frozen=True)
class Marker:
    """Base: ``key`` names the marker file (``<key>.done.json``) in its stage's folder."""

    stage: ClassVar[str] = ""

    @property
    def key(self) -> str:
        """The marker file's name: the unit's id (a ``uid`` field), the item's zero-padded number (an ``index``
        field), or, for a stage of one item, the stage's name. A marker that needs another overrides it."""
        if (uid := getattr(self, "uid", None)) is not None:
            return uid
        if (index := getattr(self, "index", None)) is not None:
            return f"{index:05d}"
        return self.stage

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=_plain)

    @classmethod
    def from_json(cls: type[M], text: str | bytes) -> M:
        d = json.loads(text)
        return cls(**{f.name: _freeze(d[f.name]) for f in dataclasses.fields(cls)})


class Counts(Mapping):
    """A read-only ``{str: int}`` in little memory: the keys a tuple shared by every table with the same keys, the
    values one array (a dict of 117 histogram bins is ~12 KB of Python objects, this ~1 KB). Reads as a dict does:
    ``[k]``, ``get``, ``items``, ``Counter(c)``, ``==`` a dict."""

    __slots__ = ("_keys", "_values")
    _KEYSETS: ClassVar[dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, int]]]] = {}
    _MAX_KEYSETS = 4096  # distinct key sets shared; beyond, a table keeps its own (still compact) tuple

    def __init__(self, table: Mapping[str, int]):
        keys = tuple(sys.intern(k) for k in table)
        shared = Counts._KEYSETS.get(keys)
        if shared is None:
            shared = (keys, {k: i for i, k in enumerate(keys)})
            if len(Counts._KEYSETS) < Counts._MAX_KEYSETS:
                Counts._KEYSETS[keys] = shared
        self._keys = shared
        values = list(table.values())
        small = all(-(1 << 31) <= v < (1 << 31) for v in values)
        self._values = array.array("i" if small else "q", values)

    def __getitem__(self, key: str) -> int:
        return self._values[self._keys[1][key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys[0])

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __reduce__(self):
        return Counts, (dict(self),)


def _plain(v: Any) -> Any:
    if isinstance(v, Counts):
        return dict(v)
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


_INTS: dict[int, int] = {}  # one int object per value seen in markers' tuples (row counts, cut points), bounded
_MAX_INTS = 1 << 16


def _int(x: int) -> int:
    shared = _INTS.get(x)
    if shared is not None:
        return shared
    if len(_INTS) < _MAX_INTS:
        _INTS[x] = x
    return x


def _compact_value(v: Any) -> Any:
    if isinstance(v, str):
        return sys.intern(v)
    if type(v) is tuple:  # row counts per pass, a pass's cut points: ints repeated across units share one object
        return tuple(_int(x) if type(x) is int else _compact_value(x) for x in v)
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        if len(v) > 4 and all(type(x) is int for x in v.values()):
            return Counts(v)
        if v:
            return {sys.intern(k): _compact_value(x) for k, x in v.items()}
    return v


def compact(m: M) -> M:
    """``m`` as the driver keeps it (the module's docstring says why): equal to ``m``, field by field."""
    if not dataclasses.is_dataclass(m):
        return m
    changes = {}
    for f in dataclasses.fields(m):
        v = getattr(m, f.name)
        c = _compact_value(v)
        if c is not v:
            changes[f.name] = c
    return dataclasses.replace(m, **changes) if changes else m


def marker(stage: str) -> Callable[[type[M]], type[M]]:
    """Declares a stage's marker type (``@marker("pool")`` above ``class PoolMarker(Marker)``): a frozen dataclass
    whose files live in ``<work>/<stage>/``."""

    def declare(cls: type[M]) -> type[M]:
        cls.stage = stage
        return dataclasses.dataclass(frozen=True)(cls)

    return declare


def write_marker(work: str, marker: Marker, endpoint_url: str | None = None, fence: Any = None) -> None:
    """Commit ``marker`` under ``<work>/<stage>/<key>.done.json`` (after the output it vouches for). ``fence``: the
    build's writer lease (storage/fence.py), proved first, in whichever process commits: a build that lost
    its output to another never commits an item into it."""
    if fence is not None:
        fence.check()
    write_bytes_atomic(join(work, marker.stage, marker.key + SUFFIX), marker.to_json().encode(), endpoint_url)


def read_markers(work: str, cls: type[M], endpoint_url: str | None = None) -> dict[str, M]:
    """The committed markers of ``cls``'s stage by key, read concurrently."""
    folder = join(work, cls.stage)
    names = [n for n in list_names(folder, endpoint_url) if n.endswith(SUFFIX)]
    if not names:
        return {}
    with concurrent.futures.ThreadPoolExecutor(min(_READ_THREADS, len(names))) as pool:
        texts = list(pool.map(lambda n: read_bytes(join(folder, n), endpoint_url), names))
    markers = [cls.from_json(t) for t in texts]
    return {m.key: m for m in markers}
