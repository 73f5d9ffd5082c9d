"""Source weights (``--mix SOURCE=WEIGHT,...``): "wikipedia x2 + books x1 + web x0.5" as one build.

A document's source is the input it was read from (the ``source`` column); a weight applies to every source that is
its SOURCE or lies under it (a file, or a folder and everything under it, matched by whole path components:
``data/wiki`` is not ``data/wikipedia``; the longest matching SOURCE wins), and sources that none matches keep
weight 1. A document of weight w is kept ``floor(w)`` times plus once more with
probability ``w - floor(w)``: upsampling by repetition, downsampling by a seeded draw. The draw is
``derive_seed(seed, document id, "mix") / 2**64 < frac(w)``, a function of the id alone, so the same documents are
kept whatever the batching, order or number of workers, and the expected share of each source is w * its size
over the sum of all. A document kept 0 times is dropped as ``mix``; the others get ``copies`` (1, 2, ...), which the
build turns into that many times its passes (each repeat with its own pairs and masks, as ``dupe_factor`` does).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa

from corpus.rng import DEFAULT_SEED, derive_seed
from curate import contract

MAX_WEIGHT = 100.0


def parse_mix(spec: str) -> tuple[tuple[str, float], ...]:
    """``"wiki/=2,books/=1,web/=0.5"`` -> ((source, weight), ...); ValueError naming the fix."""
    out: list[tuple[str, float]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        source, sep, weight = item.rpartition("=")
        try:
            w = float(weight)
        except ValueError:
            w = math.nan
        if not sep or not source or math.isnan(w):
            raise ValueError(f"--mix {spec!r}: {item!r} is not SOURCE=WEIGHT (e.g. --mix wiki/=2,books/=1,web/=0.5)")
        out.append((source, w))
    if not out:
        raise ValueError(f"--mix {spec!r}: give at least one SOURCE=WEIGHT")
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class MixConfig:
    """``weights``: (source prefix, weight) pairs (empty: every document once); ``seed``: the draw's seed."""

    weights: tuple[tuple[str, float], ...] = ()
    """(source path prefix, weight) pairs, weights in [0, 100]; empty: every document once. Sources no prefix
    matches keep weight 1."""
    seed: int = DEFAULT_SEED
    """Seed of the fractional weights' draw, hashed with each document id (the build passes its ``--seed``)."""

    def __post_init__(self) -> None:
        seen = set()
        for source, w in self.weights:
            if not 0.0 <= w <= MAX_WEIGHT or math.isinf(w):
                raise ValueError(f"--mix {source}={w}: use a weight in [0, {MAX_WEIGHT:g}] (0 leaves the source out,"
                                 " 0.5 keeps half of it, 2 repeats it twice)")
            if source in seen:
                raise ValueError(f"--mix names {source} twice: give each source one weight")
            seen.add(source)

    def match(self, source: str | None) -> str | None:
        """The SOURCE that decides ``source``'s weight: the longest one it is or lies under; None: none."""
        best = None
        for prefix, _ in self.weights:
            if source is not None and under(source, prefix) and (best is None or len(prefix) > len(best)):
                best = prefix
        return best

    def weight_of(self, source: str | None) -> float:
        prefix = self.match(source)
        return 1.0 if prefix is None else dict(self.weights)[prefix]

    def unmatched(self, sources: list[str]) -> list[str]:
        """The SOURCEs that match none of ``sources`` (a typo the job should refuse before any work)."""
        return [p for p, _ in self.weights if not any(under(s, p) for s in sources)]


def under(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or lies under it, by whole path components."""
    p = prefix.rstrip("/")
    return path == p or path.startswith(p + "/") or not p


def copies(ids: list[str], sources: list[str | None], cfg: MixConfig) -> np.ndarray:
    """How many times each document is kept (module docstring)."""
    return copies_at(ids, np.array([cfg.weight_of(s) for s in sources], dtype=np.float64), cfg.seed)


def copies_at(ids: list[str], weights: np.ndarray | float, seed: int) -> np.ndarray:
    """How many times each document of weight ``weights`` (one per document, or one for all) is kept."""
    weights = np.broadcast_to(np.asarray(weights, dtype=np.float64), (len(ids),))
    whole = np.floor(weights)
    frac = weights - whole
    u = np.array([derive_seed(seed, i, "mix") for i in ids], dtype=np.float64) / 2.0 ** 64
    return (whole + (u < frac)).astype(np.int64)


class Mix:
    """The filter: drops documents drawn 0 times as ``mix``, adds ``copies`` to the others."""

    def __init__(self, cfg: MixConfig):
        self.cfg = cfg

    def __call__(self, table: pa.Table) -> contract.Filtered:
        n = copies(table.column(contract.ID).to_pylist(), contract.sources(table), self.cfg)
        table = table.append_column("copies", pa.array(n, pa.int64())) if "copies" not in table.column_names \
            else table.set_column(table.column_names.index("copies"), "copies", pa.array(n, pa.int64()))
        drop = n == 0
        w = [f"weight {self.cfg.weight_of(s):g}" for s, d in zip(contract.sources(table), drop, strict=False) if d]
        return contract.split(table, drop, [contract.MIX] * int(drop.sum()), details=w)


def expand(table: pa.Table) -> pa.Table:
    """Each row repeated ``copies`` times, the repeats' ids suffixed ``#2``, ``#3``, ... (for a consumer that has
    no notion of passes: every copy then has an id, and seeds, of its own)."""
    n = table.column("copies").to_numpy()
    rows = np.repeat(np.arange(len(table)), n)
    out = table.take(pa.array(rows, pa.int64()))
    rank = np.arange(len(rows)) - np.repeat(np.cumsum(n) - n, n)
    ids = [i if r == 0 else f"{i}#{r + 1}"
           for i, r in zip(out.column(contract.ID).to_pylist(), rank.tolist(), strict=False)]
    return out.set_column(out.column_names.index(contract.ID), contract.ID, pa.array(ids, pa.string()))
