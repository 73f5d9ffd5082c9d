"""The vocab stage: WordPiece vocabulary training on a seeded, bounded sample of the corpus, as one item (never the
whole corpus in one process, never in the driver). The build without --vocab and jobs/train_tokenizer.py both call
``train_vocab``, so they train on the same sample and give the same vocabulary.

The sample is made of blocks: the byte ranges [k*U, (k+1)*U) of each input's decompressed text (U = unit_bytes),
a block reading the documents that start inside it. Blocks are taken in the order of a seeded hash of (seed, file
key, block start) until ``sample_bytes`` is reached (at least one block; 0 = every block), then read in corpus order
(key, offset). Because a block is defined on the decompressed text, ``corpus.txt.gz`` (read through its pieces) and
``corpus.txt`` give the same sample and the same vocabulary. Parquet row groups are blocks of their own.

    sample_blocks(units, sizes, unit_bytes, sample_bytes, seed) -> [[Unit]]    the driver: metadata only
    vocab_step(item, ctx) -> VocabMarker (VocabStep(ctx): a step)               one item: read, train, commit
    train_vocab(files, units, ctx, sample, output, executor) -> VocabMarker     all of it, resumable, on an executor
    vocab_stage(state) -> Stage                                                 the build's stage (none with --vocab)

Why a sample: WordPiece training counts words in one process; on 256 MB of text it sees every word frequent enough
to enter a 30k vocabulary of English (the long tail it misses would fall below min_frequency or become ##pieces
anyway), and it takes minutes instead of hours on a 10 GB corpus. The default budget is ``DEFAULT_SAMPLE_BYTES``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import time
from collections import Counter, defaultdict
from typing import Any

from corpus.checks import vocab_size_warning
from corpus.readers import ReadOptions, ReadReport, Unit, read_unit
from corpus.rng import DEFAULT_SEED, derive_seed
from corpus.tokenize import BERT_VOCAB_SIZE
from pipeline.config import DEFAULT_SAMPLE_BYTES
from pipeline.executor import Executor, Stage, run_stage
from pipeline.inputs.pieces import worker_id
from pipeline.markers import Marker, marker, write_marker
from pipeline.state import BuildState
from storage.fs import FileInfo, read_bytes, remove_tree, write_bytes_atomic

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VocabContext:
    read: ReadOptions
    """How the sampled inputs are read (``BuildConfig.read``)."""
    vocab_size: int = BERT_VOCAB_SIZE
    """Entries asked of the trainer, special tokens included; bert-base-uncased's 30522 by default. A sample with
    too few distinct words gives fewer (``vocab_size_warning``)."""
    min_frequency: int = 2
    """How many times a merge must occur in the sample to enter the vocabulary (``train_wordpiece``'s default)."""
    do_lower_case: bool = True
    """Lowercase and strip accents before training, as the encoder will before encoding."""
    endpoint_url: str | None = None
    """An S3-compatible endpoint for s3:// URLs; None: the default one."""
    work: str | None = None
    """Where the marker goes (``<work>/vocab/vocab.done.json``); None: no marker, nothing to resume from
    (``vocab_step`` called on its own)."""
    fence: Any = None
    """The output's writer lease (storage/fence.py), proved before the marker is committed; None: nothing to prove."""
    keep: Any = None
    """The build's per-document curation as a test of a batch of texts (``pipeline.curation.filters
    .kept_by_curation``): the vocabulary is trained on the sampled documents curation keeps; None: all of them."""


@dataclasses.dataclass(frozen=True)
class VocabItem:
    """The work item: the sampled blocks (each a list of units read in order) and where the vocab.txt goes."""

    blocks: list[list[Unit]]
    """The sampled blocks in corpus order, each the units (or parts of pieces) it reads in order."""
    output: str
    """Where vocab.txt is committed (its ``.progress`` file beside it while training)."""
    sampled_bytes: int = 0
    """Decompressed bytes the blocks span (``sample_blocks``): the progress share's denominator."""


@marker("vocab")
class VocabMarker(Marker):
    """The trained vocab.txt (``file``) and what it was trained on; committed after the file."""

    file: str
    """Where the trained vocab.txt was committed."""
    sha256: str
    """The vocab.txt's bytes' SHA-256 (hex)."""
    vocab_size: int
    """Entries the trainer gave: fewer than asked when the sample holds too few distinct words."""
    blocks: int
    """Sampled blocks it was trained on."""
    sampled_bytes: int
    """Decompressed bytes the blocks span (planned): what the ``sample_bytes`` budget bounds."""
    documents: int
    """Documents read from the sample (the first of the trainer's two passes)."""
    dropped: dict[str, int]
    """Records and files the reader dropped in the sample, by reason."""
    worker: str = ""
    """``host:pid`` of the process that trained it: shows the item ran on a worker, not the driver."""


def _blocks(units: list[Unit], sizes: dict[str, int], unit_bytes: int) -> list[tuple[str, int, int, list[Unit]]]:
    """(key, start, bytes, units) of every block of the corpus."""
    out = []
    pieces: dict[str, list[Unit]] = defaultdict(list)
    per_path = defaultdict(int)
    for u in units:
        per_path[u.path] += 1
    for u in units:
        if u.data is not None:  # a piece of a big compressed input: regroup the pieces into fixed blocks
            pieces[u.path].append(u)
        elif u.fmt == "parquet":
            out.append((u.key, u.start, sizes.get(u.path, 0) // per_path[u.path], [u]))
        else:
            end = u.end if u.end is not None else max(u.start, sizes.get(u.path, 0))
            out.append((u.key, u.start, end - u.start, [u]))
    for ps in pieces.values():
        ps.sort(key=lambda u: u.start)
        total = ps[-1].end
        for k in range(-(-total // unit_bytes)):
            lo, hi = k * unit_bytes, min(total, (k + 1) * unit_bytes)
            parts = [dataclasses.replace(p, start=max(lo, p.start), end=min(hi, p.end))
                     for p in ps if p.start < hi and p.end > lo]
            out.append((ps[0].key, lo, hi - lo, parts))
    return out


def sample_blocks(units: list[Unit], sizes: dict[str, int], unit_bytes: int, sample_bytes: int,
                  seed: int) -> tuple[list[list[Unit]], int]:
    """The sampled blocks in corpus order, and the bytes they span. ``sizes``: each input's size by path (the
    decompressed size is not needed: compressed inputs are pieces, or one small unit)."""
    blocks = _blocks(units, sizes, unit_bytes)
    if sample_bytes > 0:
        chosen, total = [], 0
        for b in sorted(blocks, key=lambda b: derive_seed(seed, "vocab", b[0], b[1])):
            if chosen and total >= sample_bytes:
                break
            chosen.append(b)
            total += b[2]
        blocks = chosen
    blocks.sort(key=lambda b: (b[0], b[1]))
    return [b[3] for b in blocks], sum(b[2] for b in blocks)


PROGRESS_EVERY_S = 2.0  # how often the step writes the share of its reading done, for the driver's progress line


def _tell(item: VocabItem, share: float, endpoint_url: str | None) -> None:
    with contextlib.suppress(Exception):  # a progress figure is never worth failing the vocabulary for
        write_bytes_atomic(f"{item.output}.progress", f"{share:.4f}".encode(), endpoint_url)


def read_progress(output: str, endpoint_url: str | None = None) -> float | None:  # of the two passes' reading
    with contextlib.suppress(FileNotFoundError, ValueError):
        return float(read_bytes(f"{output}.progress", endpoint_url))
    return None


def vocab_step(item: VocabItem, ctx: VocabContext) -> VocabMarker:
    """Train WordPiece on the blocks' documents and commit vocab.txt (one token per line) atomically."""
    from corpus.tokenize import train_wordpiece

    report = ReadReport()
    count, passes, read, told = 0, 0, 0, time.monotonic()

    def documents():
        nonlocal count, passes, read, told
        passes += 1
        for block in item.blocks:
            for u in block:
                for doc in read_unit(u, ctx.read, ctx.endpoint_url, report if passes == 1 else ReadReport()):
                    count += passes == 1
                    read += sum(len(line) + 1 for line in doc.lines)
                    if time.monotonic() - told > PROGRESS_EVERY_S:  # for the driver's progress line
                        told = time.monotonic()
                        _tell(item, min(0.99, read / max(1, 2 * item.sampled_bytes)), ctx.endpoint_url)
                    yield "\n".join(doc.lines)

    def texts():
        if ctx.keep is None:
            yield from documents()
            return
        batch: list[str] = []  # what curation keeps, judged a batch at a time (its filters work on batches)
        for text in documents():
            batch.append(text)
            if len(batch) >= 256:
                yield from (t for t, ok in zip(batch, ctx.keep(batch), strict=True) if ok)
                batch = []
        yield from (t for t, ok in zip(batch, ctx.keep(batch), strict=True) if ok)

    log.info("training a %d-entry WordPiece vocabulary on %d sampled blocks", ctx.vocab_size, len(item.blocks))
    # Two passes over the sample (see train_wordpiece): read twice rather than held, so memory stays bounded.
    tokens = train_wordpiece(texts, ctx.vocab_size, ctx.do_lower_case, ctx.min_frequency)
    data = ("\n".join(tokens) + "\n").encode()
    write_bytes_atomic(item.output, data, ctx.endpoint_url)
    with contextlib.suppress(Exception):  # a leftover progress figure is harmless
        remove_tree(f"{item.output}.progress", ctx.endpoint_url)
    dropped = dict(report.dropped + Counter(report.bad_files.values()))
    marker = VocabMarker(item.output, hashlib.sha256(data).hexdigest(), len(tokens), len(item.blocks),
                         item.sampled_bytes, count, dropped, worker_id())
    if ctx.work is not None:
        write_marker(ctx.work, marker, ctx.endpoint_url, ctx.fence)
    return marker


@dataclasses.dataclass(frozen=True)
class VocabStep:
    ctx: VocabContext
    """What the training reads with and asks for, and where the marker goes."""

    def __call__(self, item: VocabItem) -> VocabMarker:  # vocab_step as a picklable step of one argument
        return vocab_step(item, self.ctx)


@dataclasses.dataclass(frozen=True)
class VocabSample:
    """Which blocks the vocabulary is trained on: ``sample_bytes`` of blocks of ``unit_bytes`` (0: all of them), in
    the order of a hash seeded by ``seed``."""

    unit_bytes: int
    """Bytes of decompressed text per block: the build's ``unit_bytes``, so the build and jobs/train_tokenizer.py
    draw the same blocks."""
    sample_bytes: int = DEFAULT_SAMPLE_BYTES
    """The sample's budget in decompressed bytes (0: every block); 256 MiB by default (the module says why)."""
    seed: int = DEFAULT_SEED
    """Seeds the hash that orders the blocks: the build's ``instances.seed``."""


def vocab_stage(s: BuildState) -> Stage | None:
    """One item training the vocabulary on a seeded sample (its hook reads what it committed, and warns when the
    corpus gave fewer entries than asked); none when one is given."""
    from corpus.schema import VOCAB_FILE
    from storage.fs import join

    cfg = s.cfg
    if s.vocab_bytes is not None:
        return None
    from pipeline.curation.filters import kept_by_curation

    ctx = VocabContext(cfg.read, cfg.vocab_size, cfg.min_frequency, cfg.do_lower_case, cfg.endpoint_url, cfg.work,
                       s.fence, kept_by_curation(cfg))
    return dataclasses.replace(
        _stage(s.inputs.files, s.units, ctx, VocabSample(cfg.unit_bytes, cfg.vocab_sample_bytes, cfg.instances.seed),
               join(cfg.work, VOCAB_FILE)), after=_trained)


def _stage(files: list[FileInfo], units: list[Unit], ctx: VocabContext, sample: VocabSample, output: str) -> Stage:
    blocks, nbytes = sample_blocks(units, {f.path: f.size for f in files}, sample.unit_bytes, sample.sample_bytes,
                                   sample.seed)
    log.info("vocabulary: %d entries from a %.1f MB sample", ctx.vocab_size, nbytes / 1e6)
    return Stage("vocab", VocabStep(ctx), {"vocab": VocabItem(blocks, output, nbytes)}, VocabMarker,
                 {"vocab": nbytes}, "sample", probe=lambda: read_progress(output, ctx.endpoint_url))


def _trained(s: BuildState) -> BuildState:
    from storage.fs import read_bytes

    (marker,) = s.markers["vocab"]
    if (w := vocab_size_warning(s.cfg.vocab_size, marker.vocab_size, marker.documents)) is not None:
        log.warning("%s", w)
        s = s.warned(w)
    return s.with_vocab(read_bytes(marker.file, s.cfg.endpoint_url))


def train_vocab(files: list[FileInfo], units: list[Unit], ctx: VocabContext, sample: VocabSample, output: str,
                executor: Executor) -> VocabMarker:
    """Train (or, resuming, find the committed) vocabulary on ``sample`` of ``units`` and commit it to ``output``;
    ``ctx.work`` holds the marker. One item on ``executor``: never the driver's work."""
    assert ctx.work is not None, "train_vocab resumes from its marker: give the context a work folder"
    (marker,) = run_stage(_stage(files, units, ctx, sample, output), executor, ctx.work, ctx.endpoint_url)
    if (shortfall := vocab_size_warning(ctx.vocab_size, marker.vocab_size, marker.documents)) is not None:
        log.warning("%s", shortfall)
    return marker  # type: ignore[return-value]
