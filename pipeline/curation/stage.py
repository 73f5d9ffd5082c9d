"""The curate stage: curation's global step, between the read pass and the pool (docs/architecture.md, "A global
step"), when the build asks for ``--dedup exact|near`` or ``--mix``. Per unit's file of tokenized documents it
commits what the later passes leave out or repeat:

    the drop set   every unit's signatures (``_work/sigs``, written by the read pass: ``filters.py``) -> the
                   duplicates, each with the kept document it copies, decided over the whole corpus once, before the
                   items: on Ray by ``curate.ray_dedup`` (Ray Data shuffles, memory bounded by partition;
                   the driver holds an object reference: ``ray_data/curate.py``), in the plain loop by
                   ``curate.dedup.drop_set``
    CurateStep     a unit's docs file -> its drop list (duplicates, then the documents ``--mix`` draws 0 times) and
                   its copies list (documents ``--mix`` makes twice or more), then its CurateMarker (what they remove
                   and add, and the unit's tokens before and after the mix)

Its hook hands the state what they remove (``drops.leave_out``) and repeat (``drops.repeat``): the pool's merge and
the instances pass leave the dropped documents out, the instances pass makes every copy's passes, the shard count
counts the copies. Every decision depends on the documents' ids and signatures only (the kept copy of a cluster is its
smallest id; the mix draw is ``derive_seed(seed, id, "mix")``), so the result is the same for any executor, CPUs or
nodes. A rerun computes the drop set again only when some unit has no marker yet.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import Counter
from typing import Any

import numpy as np

from curate.contract import MIX
from curate.dedup import DedupConfig, drop_set
from curate.mix import copies_at, under
from pipeline.curation.filters import check_mix, mix_source, sigs_url
from pipeline.docs import doc_arrays, docs_url, power_of_two_histogram, vocab_info_for
from pipeline.drops import LeftOut, leave_out, repeat, write_copies, write_drop_list
from pipeline.executor import LocalShared, Shared, Stage
from pipeline.markers import Marker, marker, read_markers, write_marker
from pipeline.state import BuildState
from pipeline.work import StepContext, cached, read_table

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CurateItem:
    """A unit's docs file, and the ``--mix`` SOURCE that weighs it (None: none does, weight 1)."""

    uid: str
    """The unit's id: its marker's name."""
    docs_file: str
    """URL of the unit's tokenized documents under _work (``docs_url``), which its drop and copies lists sit beside."""
    source: str | None = None
    """The longest --mix SOURCE the unit's input is or lies under; None when no SOURCE names it."""
    weight: float = 1.0
    """That SOURCE's mix weight: the expected copies of each document (0 leaves it out, 0.5 keeps half, 2 doubles);
    1.0, every document once, for a unit no SOURCE names."""


@marker("curate")
class CurateMarker(Marker):
    """What a unit's drop list removes and its copies list adds; the stage's hook sums them for the later passes."""

    uid: str
    """The unit's id: the marker's name."""
    file: str
    """URL of the unit's docs file, whose drop list the pool's merge and the instances pass read."""
    documents: int
    """Documents the drop list removes (duplicates, and documents the mix draws 0 times)."""
    sentences: int
    """Sentences of the removed documents."""
    tokens: int
    """WordPiece tokens of the removed documents."""
    unk_tokens: int
    """[UNK] tokens among them; like the other counts, subtracted from the read pass's totals."""
    reasons: dict[str, int]
    """Removed documents by reason (``exact_duplicate``, ``near_duplicate``, ``mix``)."""
    tokens_per_document: dict[str, int]
    """Removed documents by token count, a power-of-two histogram ({lower bound: documents}): mergeable by adding."""
    copied: bool
    """Whether the unit has a copies list (a document the mix keeps twice or more)."""
    repeat_tokens: int
    """Tokens the extra copies add (each copy past the first), counted into the shard count."""
    source: str | None
    """The --mix SOURCE that weighs the unit; None when none does (it counts in the group at weight 1)."""
    mix: tuple[int, int, int, int]
    """(documents, tokens) the dedup left before the mix draw, then (documents, tokens) with their copies: each
    SOURCE's asked and made share in the manifest."""


def _hashes(ids: list[str]) -> np.ndarray:
    return np.fromiter((int.from_bytes(hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                       "little") for i in ids), np.uint64, len(ids))


class DropSet:
    """The drop set, looked up by id: its rows (the object-store copy) and their ids' sorted 64-bit hashes, 8 bytes
    per dropped document in each process (not a Python object per id: the drop set of a web corpus is large)."""

    def __init__(self, table):
        self.table = table
        keys = _hashes(table["id"].to_pylist())
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]

    def find(self, ids: list[str]) -> list[tuple[str, str | None] | None]:
        """(reason, duplicate_of) of each id the drop set names, else None."""
        out: list[tuple[str, str | None] | None] = [None] * len(ids)
        keys = _hashes(ids)
        at = np.searchsorted(self.keys, keys)
        for i in np.flatnonzero(at < len(self.keys)).tolist():
            k = int(at[i])
            while k < len(self.keys) and self.keys[k] == keys[i]:  # equal hashes: the ids decide
                row = int(self.order[k])
                if self.table["id"][row].as_py() == ids[i]:
                    out[i] = (self.table["reason"][row].as_py(), self.table["duplicate_of"][row].as_py())
                    break
                k += 1
        return out


def _lookup(drops: Shared) -> DropSet:
    """The drop set, made searchable once per process."""
    return cached("drop_set", drops.key, lambda: DropSet(drops.get()))


@dataclasses.dataclass(frozen=True)
class CurateStep:
    """One unit: its documents' fates from the drop set and the mix draw, committed beside its docs file."""

    ctx: StepContext
    """Where _work is, and the build's writer lease (proved before each commit)."""
    vocab: Shared
    """The build's vocabulary, shared once: its [UNK] id counts the removed documents' unknown tokens."""
    drops: Shared | None
    """The whole corpus's drop set (duplicate id -> reason, kept copy); None without dedup, or when every unit was
    done before (the drop set is not computed again then)."""
    mix_seed: int
    """Seed of the mix draw: a document's copies depend on ``derive_seed(mix_seed, id, "mix")`` only."""

    def __call__(self, item: CurateItem) -> CurateMarker:
        ctx = self.ctx
        ids, outer, inner, flat = doc_arrays(read_table(item.docs_file, ctx))
        n = len(ids)
        first = inner[outer[:-1]].astype(np.int64)
        tokens = inner[outer[1:]].astype(np.int64) - first
        sentences = np.diff(outer).astype(np.int64)
        unk = np.add.reduceat((flat == vocab_info_for(self.vocab).unk_id).astype(np.int64), first) \
            if len(flat) else np.zeros(n, np.int64)
        unk[tokens == 0] = 0  # reduceat at an empty slice gives the next value, not 0 (no document is empty here)
        reason: list[str | None] = [None] * n
        dup_of: list[str | None] = [None] * n
        if self.drops is not None:
            for i, hit in enumerate(_lookup(self.drops).find(ids)):
                if hit is not None:
                    reason[i], dup_of[i] = hit
        copies = np.array([0 if r else 1 for r in reason], np.int64)
        live = np.flatnonzero(copies)
        before = (len(live), int(tokens[live].sum()))
        if item.weight != 1.0 and len(live):
            copies[live] = copies_at([ids[i] for i in live.tolist()], item.weight, self.mix_seed)
            for i in live[copies[live] == 0].tolist():
                reason[i] = MIX
        gone = [i for i, r in enumerate(reason) if r]
        if gone:
            write_drop_list(item.docs_file, [ids[i] for i in gone], [reason[i] for i in gone], ctx,
                            [dup_of[i] for i in gone],
                            [f"weight {item.weight:g}" if reason[i] == MIX else None for i in gone])
        many = np.flatnonzero(copies > 1)
        if len(many):
            write_copies(item.docs_file, [ids[i] for i in many.tolist()], copies[many].tolist(), ctx)
        g = np.array(gone, np.int64)
        marker = CurateMarker(
            uid=item.uid, file=item.docs_file, documents=len(gone), sentences=int(sentences[g].sum()),
            tokens=int(tokens[g].sum()), unk_tokens=int(unk[g].sum()), reasons=dict(Counter(reason[i] for i in gone)),
            tokens_per_document=power_of_two_histogram(tokens[g].tolist()), copied=bool(len(many)),
            repeat_tokens=int(((copies - 1) * tokens)[many].sum()), source=item.source,
            mix=(*before, int(copies.sum()), int((copies * tokens).sum())))
        write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
        return marker


def _drop_set(s: BuildState, files: list[str], cfg: DedupConfig) -> Shared:
    """The duplicates of the whole corpus, from every unit's signatures (the module's docstring)."""
    key = f"drop_set:{s.build_id}"
    t0 = time.perf_counter()
    if s.executor.in_process:  # (an executor wrapped by the build's run too: not an isinstance check)
        shared: Shared = LocalShared(key, drop_set((read_table(f, s.ctx) for f in files), cfg))
    else:
        from pipeline.ray_data.curate import drop_set_shared

        documents = sum(m.documents for m in s.markers["read"])  # type: ignore[attr-defined]
        shared = drop_set_shared(s.executor, files, documents, s.ctx, cfg, key)
    log.info("curate: dedup (%s) over the signatures of %d unit(s) in %.1f s wall", cfg.mode, len(files),
             time.perf_counter() - t0)
    return shared


def curate_stage(s: BuildState) -> Stage | None:
    c = s.cfg.curate
    if c.dedup.mode == "off" and not c.mix.weights:
        return None
    items = {}
    resolved = [(p, mix_source(p), w) for p, w in c.mix.weights]
    if resolved:
        check_mix(s.cfg, [u.path for u in s.units])
    for uid, unit in s.doc_units.items():
        match = max((r for r in resolved if under(unit.path, r[1])), key=lambda r: len(r[1]), default=None)
        items[uid] = CurateItem(uid, docs_url(s.ctx, uid), match[0] if match else None, match[2] if match else 1.0)
    drops = None
    if c.dedup.mode != "off":
        done = read_markers(s.cfg.work, CurateMarker, s.cfg.endpoint_url)
        if any(uid not in done for uid in items):
            drops = _drop_set(s, [sigs_url(s.ctx, uid) for uid in items], c.dedup)
    return Stage("curate", CurateStep(s.ctx, s.vocab, drops, c.mix.seed), items, CurateMarker, noun="units",
                 after=_curated)


def _curated(s: BuildState) -> BuildState:
    markers: list[CurateMarker] = s.markers["curate"]  # type: ignore[assignment]
    left = LeftOut(documents=sum(m.documents for m in markers), sentences=sum(m.sentences for m in markers),
                   tokens=sum(m.tokens for m in markers), unk_tokens=sum(m.unk_tokens for m in markers),
                   reasons=sum((Counter(m.reasons) for m in markers), Counter()),
                   tokens_per_document=sum((Counter(m.tokens_per_document) for m in markers), Counter()))
    s = leave_out(s, [m.file for m in markers if m.documents], left)
    s = repeat(s, [m.file for m in markers if m.copied], sum(m.repeat_tokens for m in markers))
    if left.documents or s.repeat_tokens:
        log.info("curate: %d document(s) left out (%s), %d token(s) of extra copies", left.documents,
                 ", ".join(f"{k} {v}" for k, v in sorted(left.reasons.items())) or "none", s.repeat_tokens)
    return s


def mix_shares(s: BuildState) -> dict[str, Any]:
    """Each --mix SOURCE's share of the tokens, asked (weight x its tokens over the sum) and made (with the copies);
    the inputs no SOURCE weighs count as one group at weight 1."""
    if "curate" not in s.markers or not s.cfg.curate.mix.weights:
        return {}
    weights = dict(s.cfg.curate.mix.weights)
    groups: dict[str, list[int]] = {}
    for m in s.markers["curate"]:  # type: ignore[attr-defined]
        g = groups.setdefault(m.source if m.source is not None else "", [0, 0, 0, 0])
        for i, v in enumerate(m.mix):
            g[i] += v
    asked_total = sum(weights.get(k, 1.0) * g[1] for k, g in groups.items()) or 1
    made_total = sum(g[3] for g in groups.values()) or 1
    return {k or "(inputs no SOURCE names)": {
        "weight": weights.get(k, 1.0), "documents": g[0], "tokens": g[1], "documents_made": g[2],
        "tokens_made": g[3], "asked_share": round(weights.get(k, 1.0) * g[1] / asked_total, 6),
        "share": round(g[3] / made_total, 6)} for k, g in sorted(groups.items())}
