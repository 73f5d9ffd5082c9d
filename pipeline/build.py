"""The dataset build: config, the stages the driver walks, resume, and the manifest (written last).

    plan (inputs -> fixed units) -> [pieces of big compressed inputs] -> [vocab] -> docs -> pool -> instances
    -> shards -> manifest

Each stage is a ``pipeline.executor.Stage`` (a step mapped over items, one marker per item) planned from the markers
of the stages before it; ``build`` walks ``STAGES`` and runs each with ``run_stage`` on the executor it was given
(``LocalExecutor``: a plain loop; ``pipeline.ray_tasks.RayExecutor``: the same steps as Ray tasks). The driver only
plans and sums markers: it reads no corpus bytes and no per-document data, so its work is O(units) of metadata.
Barriers are the ones the algorithm needs: the pool needs every unit's members, the shards need every unit's row
counts. Output never depends on the executor, CPUs, nodes or blocks: ids and seeds come from the files.

Resume: ``_work/config.json`` holds the config hash and the input stamps, taken at start. Every item of every stage
commits atomically with a completion marker, so a killed build rerun with the same command redoes only what has no
marker. A finished build (manifest present, same hash) is left alone; a different config is refused.

To add a stage, write ``<name>_stage(state) -> Stage`` (its step in ``pipeline/steps.py``, its marker type in
``pipeline/markers.py``) and put it in ``STAGES``; later stages read its markers from ``state.markers[name]``. The
instances stage takes its units from the docs markers, so a stage before docs (cutting big files into pieces) only
has to change the items ``docs_stage`` maps over.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from pipeline.executor import Executor, LocalExecutor, Shared, Stage, run_stage
from pipeline.instances import InstanceConfig, VocabInfo
from pipeline.markers import DocsMarker, InstancesMarker, Marker, PoolMarker, ShardMarker
from pipeline.pieces import PieceContext, PieceMarker, PiecesStep, piece_units, plan_pieces
from pipeline.readers import ReadOptions, ReadReport, Unit, detect_format, plan_units
from pipeline.schema import (FORMAT, FORMAT_VERSION, MANIFEST, SHARDS_DIR, VOCAB_FILE, WORK_DIR, config_hash,
                             token_dtype, validate_manifest)
from pipeline.shards import chunks_per_pass, plan_shards
from pipeline.steps import DocsStep, InstancesStep, PoolStep, ShardStep, StepContext
from pipeline.storage import (FileInfo, check_writable, compression_of, exists, expand_inputs, join, list_names,
                              read_bytes, read_json, remove_stale_temps, remove_tree, write_bytes_atomic,
                              write_json_atomic)
from pipeline.vocab import DEFAULT_SAMPLE_BYTES, VocabContext, VocabMarker, VocabStep, VocabTask, sample_blocks

__all__ = ["BuildConfig", "LocalExecutor", "STAGES", "build"]

log = logging.getLogger(__name__)

# Planning the random-next pool before any text is read: tokens are estimated from the input's size. ~4.2 bytes of
# English text per WordPiece token (bert-base-uncased on Moby Dick, news, docs); 4.0 errs towards a pool a little
# under the budget. Compressed inputs count COMPRESSED_RATIO text bytes per stored byte.
BYTES_PER_TOKEN = 4.0
COMPRESSED_RATIO = 3  # text compresses ~3x (gzip/zstd/Parquet+zstd); only the pool's threshold uses it


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything that decides the dataset's content (``identity``) plus where it goes."""

    inputs: tuple[str, ...]
    output: str
    read: ReadOptions = ReadOptions()
    instances: InstanceConfig = InstanceConfig()
    vocab: str | None = None
    vocab_size: int = 30522  # only used to train a vocabulary when none is given
    min_frequency: int = 2
    vocab_sample_bytes: int = DEFAULT_SAMPLE_BYTES  # the trained vocabulary's sample (0: the whole corpus)
    do_lower_case: bool = True
    dupe_factor: int = 10
    num_shards: int = 16
    pool_tokens: int = 4_000_000
    unit_bytes: int = 4 << 20
    endpoint_url: str | None = None

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("no inputs: pass at least one --input")
        if not self.output:
            raise ValueError("no output: pass --output")
        if self.dupe_factor < 1:
            raise ValueError(f"--dupe-factor {self.dupe_factor}: use at least 1 (the reference uses 10)")
        if self.num_shards < 1:
            raise ValueError(f"--num-shards {self.num_shards}: use at least 1")
        if self.pool_tokens < 1:
            raise ValueError(f"--pool-tokens {self.pool_tokens}: use a positive token budget")
        if self.vocab_sample_bytes < 0:
            raise ValueError(f"vocab_sample_bytes {self.vocab_sample_bytes}: use 0 (whole corpus) or a byte budget")
        if self.unit_bytes < 1024:
            raise ValueError(f"unit_bytes {self.unit_bytes}: use at least 1024")

    def identity(self) -> dict[str, Any]:
        """The config that decides the content: not where it is written or which endpoint serves it."""
        d = dataclasses.asdict(self)
        d.pop("output")
        d.pop("endpoint_url")
        return d

    def step_context(self, vocab_size: int, pool_threshold: int, build_id: str) -> StepContext:
        return StepContext(work=join(self.output, WORK_DIR), output=self.output, read=self.read,
                           instances=self.instances, do_lower_case=self.do_lower_case, dupe_factor=self.dupe_factor,
                           vocab_size=vocab_size, pool_threshold=pool_threshold, build_id=build_id,
                           endpoint_url=self.endpoint_url)


def planned_tokens(files: list[FileInfo], units: list[Unit], read: ReadOptions) -> int:
    """Tokens the inputs should hold, from metadata alone (no reads): listed sizes, and for big compressed inputs
    the decompressed sizes of their pieces, so that a ``.gz`` and the same text uncompressed plan the same pool."""
    pieces = [u for u in units if u.data is not None]
    text_bytes = sum(u.end - u.start for u in pieces)
    cut = {u.path for u in pieces}
    for f in files:
        if f.path not in cut:
            packed = compression_of(f.path) or detect_format(f.path, read.fmt) == "parquet"
            text_bytes += f.size * (COMPRESSED_RATIO if packed else 1)
    return max(1, int(text_bytes / BYTES_PER_TOKEN))


def pool_threshold(pool_tokens: int, planned: int) -> int:
    """The 64-bit hash threshold that makes the pool a p = min(1, budget / planned tokens) sample of documents."""
    p = min(1.0, pool_tokens / planned)
    return 1 << 64 if p >= 1.0 else int(p * (1 << 64))


@dataclasses.dataclass
class BuildState:
    """What the stage planners see: the config, the step context, the units, the shared vocabulary and the
    markers of the stages run so far (by stage name, in item order)."""

    cfg: BuildConfig
    ctx: StepContext
    units: list[Unit]
    vocab: Shared
    report: ReadReport
    planned_tokens: int
    markers: dict[str, list[Marker]] = dataclasses.field(default_factory=dict)


def docs_stage(s: BuildState) -> Stage:
    return Stage("docs", DocsStep(s.ctx, s.vocab), {u.uid: u for u in s.units}, DocsMarker)


def pool_stage(s: BuildState) -> Stage:
    docs: list[DocsMarker] = s.markers["docs"]  # type: ignore[assignment]
    totals, dropped, _ = _doc_totals(docs, s.report, s.cfg.read.on_error)  # fails early on empty files
    if totals["documents"] == 0:
        raise ValueError(f"no documents with tokens in {list(s.cfg.inputs)} (dropped: {dict(dropped)}); check the"
                         " --format/--text-field and the inputs")
    if not any(m.pool_documents for m in docs):
        raise ValueError(f"the random-next pool sampled no document (budget {s.cfg.pool_tokens} tokens of an"
                         f" estimated {s.planned_tokens}): raise --pool-tokens")
    return Stage("pool", PoolStep(s.ctx, tuple(m.uid for m in docs if m.pool_documents)), {"pool": "pool"},
                 PoolMarker)


def instances_stage(s: BuildState) -> Stage:
    uids = [m.uid for m in s.markers["docs"]]  # type: ignore[attr-defined]
    chunks = chunks_per_pass(len(uids), s.cfg.dupe_factor, s.cfg.num_shards)
    return Stage("instances", InstancesStep(s.ctx, s.vocab, chunks), {u: u for u in uids}, InstancesMarker)


def shards_stage(s: BuildState) -> Stage:
    inst: list[InstancesMarker] = s.markers["instances"]  # type: ignore[assignment]
    (chunks,) = {m.chunks for m in inst}  # the same plan for every unit, resumed or not
    tasks = plan_shards([(m.uid, m.rows) for m in inst], s.cfg.num_shards, s.cfg.instances.seed, chunks)
    return Stage("shards", ShardStep(s.ctx), {f"{t.index:05d}": t for t in tasks}, ShardMarker)


STAGES: tuple[Callable[[BuildState], Stage], ...] = (docs_stage, pool_stage, instances_stage, shards_stage)


def _tokens_of(data: bytes) -> list[str]:
    tokens = [line.rstrip("\r") for line in data.decode("utf-8").split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


def _input_units(cfg: BuildConfig, files: list[FileInfo], executor: Executor, report: ReadReport) -> list[Unit]:
    """The docs stage's units: big compressed inputs are first cut into unit-sized pieces (one task per file,
    streaming it once, so memory per task stays bounded and the docs stage is parallel over the pieces)."""
    work, ep = join(cfg.output, WORK_DIR), cfg.endpoint_url
    pctx = PieceContext(work, cfg.unit_bytes, cfg.read, ep)
    tasks = plan_pieces(files, cfg.read, cfg.unit_bytes, ep)
    markers: list[PieceMarker] = run_stage(  # type: ignore[assignment]
        Stage("pieces", PiecesStep(pctx), {f"{t.index:05d}": t for t in tasks}, PieceMarker), executor, work, ep)
    for m in markers:
        report.bad_files.update(m.bad_files)
    units = plan_units(files, cfg.read, cfg.unit_bytes, ep, report, exclude={t.path for t in tasks})
    return sorted(units + piece_units(markers, pctx), key=lambda u: u.uid)


def _trained_vocab(cfg: BuildConfig, files: list[FileInfo], units: list[Unit], executor: Executor) -> bytes:
    """Without --vocab: one task trains WordPiece on a seeded sample of bounded size (pipeline/vocab.py)."""
    work, ep = join(cfg.output, WORK_DIR), cfg.endpoint_url
    vocab_url = join(work, VOCAB_FILE)
    blocks, nbytes = sample_blocks(units, {f.path: f.size for f in files}, cfg.unit_bytes, cfg.vocab_sample_bytes,
                                   cfg.instances.seed)
    log.info("vocabulary: %d entries from a %.1f MB sample", cfg.vocab_size, nbytes / 1e6)
    vctx = VocabContext(cfg.read, cfg.vocab_size, cfg.min_frequency, cfg.do_lower_case, ep, work)
    run_stage(Stage("vocab", VocabStep(vctx), {"vocab": VocabTask(blocks, vocab_url, nbytes)}, VocabMarker),
              executor, work, ep)
    return read_bytes(vocab_url, ep)


def _check_state(cfg: BuildConfig, chash: str, inputs: list[dict]) -> None:
    """Refuse to mix two configs (or changed inputs) in one output; record ours for a later resume."""
    out, ep = cfg.output, cfg.endpoint_url
    state_url = join(out, WORK_DIR, "config.json")
    if exists(state_url, ep):
        state = read_json(state_url, ep)
        if state["config_hash"] != chash:
            raise ValueError(
                f"{out} holds an unfinished build with a different config (hash {state['config_hash'][:12]} vs "
                f"{chash[:12]}). Rerun with the same flags to resume it, or use another --output, or delete "
                f"{join(out, WORK_DIR)} to start over.")
        if state["inputs"] != inputs:
            raise ValueError(f"the inputs changed since the unfinished build in {out} started (size/etag/mtime);"
                             f" delete {join(out, WORK_DIR)} to start over, or restore the inputs")
        log.info("resuming the unfinished build in %s", out)
        return
    if list_names(join(out, SHARDS_DIR), ep):
        raise ValueError(f"{out} already holds shards but no manifest and no resumable state: use an empty --output")
    write_json_atomic(state_url, {"config_hash": chash, "config": cfg.identity(), "inputs": inputs}, ep)


def build(cfg: BuildConfig, executor: Executor | None = None) -> dict[str, Any]:
    """Run (or resume, or confirm) the build; returns the manifest."""
    executor = executor or LocalExecutor()
    out, ep = cfg.output, cfg.endpoint_url
    t0 = time.time()
    # Everything that can fail cheaply fails here, before any work: inputs, vocab, output, config clashes.
    files = expand_inputs(list(cfg.inputs), ep)
    inputs = [{"path": f.path, "size": f.size, "etag": f.etag, "mtime": f.mtime} for f in files]
    vocab_bytes = None
    if cfg.vocab:
        try:
            vocab_bytes = read_bytes(cfg.vocab, ep)
        except FileNotFoundError as e:
            raise ValueError(f"--vocab {cfg.vocab} does not exist: pass a BERT vocab.txt, or omit --vocab to train"
                             " one on the input") from e
    ident = cfg.identity() | {"vocab_sha256": hashlib.sha256(vocab_bytes).hexdigest() if vocab_bytes else None}
    chash = config_hash(ident)
    check_writable(out, ep)
    manifest_url = join(out, MANIFEST)
    if exists(manifest_url, ep):
        m = read_json(manifest_url, ep)
        if m.get("config_hash") != chash:
            raise ValueError(f"{out} already holds a finished dataset built with a different config (hash "
                             f"{str(m.get('config_hash'))[:12]} vs {chash[:12]}): use another --output")
        log.info("%s is already complete with this config: nothing to do", out)
        remove_tree(join(out, WORK_DIR), ep)  # a kill between manifest and clean-up leaves it behind
        return m
    _check_state(cfg, chash, inputs)

    executor.begin()  # a cluster comes up while the driver plans
    report = ReadReport()
    units = _input_units(cfg, files, executor, report)
    if vocab_bytes is None:
        vocab_bytes = _trained_vocab(cfg, files, units, executor)
    vocab_sha = hashlib.sha256(vocab_bytes).hexdigest()
    tokens = _tokens_of(vocab_bytes)
    vocab = VocabInfo.from_tokens(tokens)
    planned = planned_tokens(files, units, cfg.read)
    # The id that keys per-process caches (the pool): the config and the input stamps, so a rebuild of changed
    # inputs into the same output, in the same process, never sees the old pool.
    build_id = config_hash({"config_hash": chash, "inputs": inputs})
    ctx = cfg.step_context(vocab.vocab_size, pool_threshold(cfg.pool_tokens, planned), build_id)
    # The vocabulary goes to the workers once (the object store on Ray); each builds its encoder once.
    state = BuildState(cfg, ctx, units, executor.share(vocab_sha, tokens), report, planned)
    for plan in STAGES:
        stage = plan(state)
        state.markers[stage.name] = run_stage(stage, executor, ctx.work, ep)

    doc_markers: list[DocsMarker] = state.markers["docs"]  # type: ignore[assignment]
    inst_markers: list[InstancesMarker] = state.markers["instances"]  # type: ignore[assignment]
    pool: PoolMarker = state.markers["pool"][0]  # type: ignore[assignment]
    totals, dropped, bad_files = _doc_totals(doc_markers, report, cfg.read.on_error)
    shards = [{"file": m.file, "rows": m.rows} for m in state.markers["shards"]]  # type: ignore[attr-defined]

    write_bytes_atomic(join(out, VOCAB_FILE), vocab_bytes, ep)
    remove_stale_temps(join(out, SHARDS_DIR), ep)
    hist: Counter = Counter()
    for m in inst_markers:
        hist.update(m.seq_len_histogram)
    totals |= {
        "instances": sum(sum(m.rows) for m in inst_markers),
        "random_next": sum(m.random_next for m in inst_markers),
        "masked_lm_positions": sum(m.masked for m in inst_markers),
        "dropped": dict(sorted(dropped.items())),
    }
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "config": ident, "config_hash": chash,
        "vocab": {"file": VOCAB_FILE, "sha256": vocab_sha, "size": vocab.vocab_size,
                  "do_lower_case": cfg.do_lower_case, "trained": cfg.vocab is None},
        "token_dtype": str(token_dtype(vocab.vocab_size)), "max_seq_length": cfg.instances.max_seq_length,
        "inputs": inputs, "skipped_files": bad_files,
        "shards": shards, "totals": totals,
        "seq_len_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "random_pool": {"documents": pool.documents, "tokens": pool.tokens, "planned_tokens": planned,
                        "sample_fraction": min(1.0, ctx.pool_threshold / (1 << 64))},
        "build_seconds": round(time.time() - t0, 2),
    }
    manifest = json.loads(json.dumps(manifest))  # what readers will see (tuples become lists)
    validate_manifest(manifest, "the new manifest")
    write_json_atomic(manifest_url, manifest, ep)  # last: its presence means the dataset is complete
    remove_tree(join(out, WORK_DIR), ep)
    log.info("built %s: %d instances in %d shards", out, totals["instances"], len(shards))
    return manifest


def _doc_totals(markers: list[DocsMarker], report: ReadReport, on_error: str) -> tuple[dict, Counter, dict[str, str]]:
    """Sum the docs markers; find files that gave nothing at all (empty after decompression, whitespace only)."""
    from pipeline.readers import InputError

    dropped: Counter = Counter()
    bad_files = dict(report.bad_files)
    per_file: Counter = Counter()
    for m in markers:
        dropped.update(m.dropped)
        bad_files.update(m.bad_files)
        per_file[m.path] += m.read_documents + sum(m.dropped.values())
    for path, n in per_file.items():
        if n == 0 and path not in bad_files:
            if on_error == "fail":
                raise InputError(f"input {path}: no documents in it (empty after decompression?) [empty_file]."
                                 " Fix or remove the file, or pass --on-error skip.")
            bad_files[path] = "empty_file"
    for reason in bad_files.values():
        dropped[reason] += 1  # file-level reasons count files
    totals = {k: sum(getattr(m, k) for m in markers) for k in ("documents", "sentences", "tokens")}
    return totals, dropped, bad_files
