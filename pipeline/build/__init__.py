"""The dataset build: the stages the driver walks, one file each, and the manifest (written last).

    plan (inputs -> fixed units; or a Ray Dataset of documents -> units) -> [pieces of big compressed inputs]
    -> [vocab] -> pool parts -> pool -> instances -> shards -> manifest

    the per-unit passes, as Ray Data pipelines over rows (rows.py):
    pool parts  ReadCorpus -> SplitTokenize (pool members only) -> WritePoolParts
    instances   ReadCorpus -> SplitTokenize (members skipped) -> PairsAndMasks (pool as an object ref) -> WriteUnits

    config.py     BuildConfig (what decides the dataset), BuildState (what the stage planners see)
    identity.py   the config hash and input stamps of an output folder: finished, resumable or refused
    executor.py   Stage, run_stage (resume by markers), the Executor protocol and the plain-loop LocalExecutor
    rows.py       RowStage: a read, operators over rows, a sink that commits units; users' errors as values
    ray_data/     the build on Ray Data: RayDataExecutor, CorpusDatasource and UnitsDatasink, the cluster's set-up,
                  and documents.py: a Ray Dataset of documents as the input (its digest, its units)
    progress.py   a progress line per stage every few seconds (items, MB of text, MB/s, ETA, wall seconds)
    markers.py    the base completion marker; work.py: the _work folder, its Arrow tables, per-process caches
    pieces.py vocab.py pool.py instances.py shards.py
                  one stage each (pool.py two): its work item or operators, its sink or step, its marker, its
                  planner; docs.py: ReadCorpus and SplitTokenize, what the per-unit passes share

Each stage is a ``Stage`` (a step mapped over items) or a ``RowStage`` (read, operators, sink over units), one
marker per item or unit, planned from the markers of the stages before it; ``build`` walks ``STAGES`` and runs each
with ``run_stage`` on the executor it was given. The driver only plans and sums markers: it reads no corpus bytes
and no per-document data, so its work is O(units) of metadata. Barriers are the ones the algorithm needs: the
instances need the whole corpus's pool, the shards need every unit's row counts. Output never depends on the
executor, CPUs, nodes or blocks: ids and seeds come from the files (or the Dataset's id column).

Resume: every item of every stage commits atomically with a completion marker, so a killed build rerun with the same
command redoes only what has no marker (``identity.py`` says which reruns are refused).

To add a stage, write ``<name>_stage(state) -> Stage | RowStage`` in a file of its own (its work item, step and
marker beside it) and put it in ``STAGES``; later stages read its markers from ``state.markers[name]``. The per-unit
stages map over ``state.units``, so a stage before them (cutting big files into pieces) only has to change the units.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from pipeline.build.config import BuildConfig, BuildState
from pipeline.build.docs import doc_totals
from pipeline.build.ray_data.documents import check_columns, dataset_stamp, dataset_units
from pipeline.build.executor import Executor, LocalExecutor, Stage, run_stage
from pipeline.build.identity import check_state, finished, input_changes
from pipeline.build.instances import InstancesMarker, instances_stage
from pipeline.build.pieces import input_units, unit_sizes
from pipeline.build.docs import SplitTokenize
from pipeline.build.pool import (COMPRESSED_RATIO, LoadPool, PoolMarker, planned_tokens, pool_parts_stage, pool_stage,
                                 pool_threshold)
from pipeline.build.shards import SHARD_BYTES, default_num_shards, shards_stage
from pipeline.build.vocab import VocabContext, VocabSample, train_vocab
from pipeline.checks import settings_warnings, unk_check, vocab_size_warning
from pipeline.create_instances import VocabInfo
from pipeline.safe_io.lease import output_lease
from pipeline.readers import ReadReport
from pipeline.schema import (FORMAT, FORMAT_VERSION, MANIFEST, SHARDS_DIR, VOCAB_FILE, Manifest, config_hash,
                             parse_manifest, read_manifest, token_dtype, validate_manifest)
from pipeline.safe_io.redact import redact, redact_url
from pipeline.storage import (absolute, check_writable, expand_inputs, join, read_bytes, remove_stale_temps,
                              remove_tree, write_bytes_atomic, write_json_atomic)

__all__ = ["BuildConfig", "STAGES", "build"]

log = logging.getLogger(__name__)

STAGES: tuple[Callable[[BuildState], Stage], ...] = (pool_parts_stage, pool_stage, instances_stage, shards_stage)

# Told when a stage has finished: (stage name, its markers, wall start, wall end). The job's MLflow run uses it.
OnStage = Callable[[str, list, float, float], None]


def _tokens_of(data: bytes) -> list[str]:
    tokens = [line.rstrip("\r") for line in data.decode("utf-8").split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


def _unk_check(cfg: BuildConfig, markers: list, of: str) -> str | None:
    """What the tokenized text says about the vocabulary: [UNK] per file, warned or refused (pipeline/checks.py).
    ``markers``: per-unit markers with ``path``, ``unk_tokens`` and ``tokens``."""
    per_file: dict[str, tuple[int, int]] = {}
    for m in markers:
        u, t = per_file.get(m.path, (0, 0))
        per_file[m.path] = (u + m.unk_tokens, t + m.tokens)
    vocab = f"--vocab {cfg.vocab}" if cfg.vocab else "the vocabulary trained on the input"
    return unk_check(sum(m.unk_tokens for m in markers), sum(m.tokens for m in markers), per_file, vocab,
                     cfg.checks.max_unk_fraction, of)


def _histogram(markers: list, field: str) -> dict[str, int]:
    hist: Counter = Counter()
    for m in markers:
        hist.update(getattr(m, field))
    return dict(sorted(hist.items(), key=lambda kv: int(kv[0])))


def _stamps(files) -> list[dict[str, Any]]:
    return [{"path": redact_url(f.path), "size": f.size, "etag": f.etag, "mtime": f.mtime}
            | ({"digest": f.digest} if f.digest else {}) for f in files]


def build(cfg: BuildConfig, executor: Executor | None = None, on_stage: OnStage | None = None,
          documents: Any = None, id_column: str = "id") -> Manifest:
    """Run (or resume, or confirm) the build; returns its manifest. ``on_stage`` hears of every finished stage.
    One build writes an output at a time: it holds the output's lease (pipeline/safe_io/lease.py) from its first write.

    The input is ``cfg.inputs`` (files, folders, globs) or ``documents``: a ``ray.data.Dataset`` with an
    ``id_column`` and a ``cfg.read.text_field`` column (``pipeline/build/ray_data/documents.py``)."""
    with contextlib.ExitStack() as held:
        return _build(cfg, executor, on_stage, documents, id_column,
                      hold=lambda: held.enter_context(output_lease(cfg.output, ep=cfg.endpoint_url)))


def _build(cfg: BuildConfig, executor: Executor | None, on_stage: OnStage | None, documents: Any, id_column: str,
           hold: Callable) -> Manifest:
    executor = executor or LocalExecutor()
    out, ep = cfg.output, cfg.endpoint_url
    t0 = time.time()
    told = on_stage or (lambda *a: None)
    if (documents is None) == (not cfg.inputs):
        raise ValueError("no inputs: pass at least one --input" if documents is None else
                         "both inputs and a documents Dataset: give the build one of them")
    warnings = settings_warnings(cfg.instances)
    for w in warnings:
        log.warning("%s", w)
    # Everything that can fail cheaply fails here, before any work: inputs, vocab, output, config clashes.
    ignored: list[str] = []
    if documents is not None:
        if cfg.vocab is None:
            raise ValueError("a build of a documents Dataset needs a vocabulary: pass BuildConfig(vocab=...) (train"
                             " one with jobs/train_tokenizer.py)")
        check_columns(documents, id_column, cfg.read.text_field)
        documents = documents.materialize()  # the user's pipeline runs once; read twice (digest, units)
        inputs = [dataset_stamp(documents, id_column, cfg.read.text_field)]
    else:
        files = expand_inputs(list(cfg.inputs), ep, skipped=ignored)
        # An input's identity is its redacted URL (no userinfo, no signature): what the manifest shows and reruns
        # compare; an http(s) input without an ETag adds its bytes' digest.
        inputs = _stamps(files)
    vocab_bytes = None
    if cfg.vocab:
        try:
            vocab_bytes = read_bytes(cfg.vocab, ep)
        except FileNotFoundError as e:
            raise ValueError(f"--vocab {cfg.vocab} does not exist: pass a BERT vocab.txt, or omit --vocab to train"
                             " one on the input") from e
    ident = cfg.identity() | {"vocab_sha256": hashlib.sha256(vocab_bytes).hexdigest() if vocab_bytes else None}
    chash = config_hash(ident)
    fence = hold().fence  # before the first write (the probe, a finished build's _work clean-up, check_state's wipe)
    check_writable(out, ep)
    if finished(cfg, chash, inputs):
        return read_manifest(out, ep)
    check_state(cfg, chash, inputs)

    executor.begin()  # a cluster comes up while the driver plans
    report = ReadReport()
    started = time.time()
    if documents is not None:
        files, units = dataset_units(documents, inputs[0], id_column, cfg.read.text_field, cfg.work, cfg.unit_bytes,
                                     ep)
    else:
        units = input_units(files, cfg.read, cfg.unit_bytes, cfg.work, executor, report, ep, fence)
    told("pieces", [], started, time.time())
    if vocab_bytes is None:
        # Without --vocab: one item trains WordPiece on a seeded sample of bounded size (pipeline/build/vocab.py).
        vctx = VocabContext(cfg.read, cfg.vocab_size, cfg.min_frequency, cfg.do_lower_case, ep, cfg.work, fence)
        sample = VocabSample(cfg.unit_bytes, cfg.vocab_sample_bytes, cfg.instances.seed)
        started = time.time()
        marker = train_vocab(files, units, vctx, sample, join(cfg.work, VOCAB_FILE), executor)
        told("vocab", [marker], started, time.time())
        warnings += [w for w in [vocab_size_warning(cfg.vocab_size, marker.vocab_size, marker.documents)] if w]
        vocab_bytes = read_bytes(marker.file, ep)
    vocab_sha = hashlib.sha256(vocab_bytes).hexdigest()
    tokens = _tokens_of(vocab_bytes)
    vocab = VocabInfo.from_tokens(tokens)
    planned = planned_tokens(files, units, cfg.read)
    # The id that keys per-process caches (the pool): the config and the input stamps, so a rebuild of changed
    # inputs into the same output, in the same process, never sees the old pool.
    build_id = config_hash({"config_hash": chash, "inputs": inputs})
    ctx = cfg.step_context(vocab.vocab_size, pool_threshold(cfg.pool_tokens, planned), build_id, fence)
    # The vocabulary goes to the workers once (the object store on Ray); each builds its encoder once, ahead of the
    # first stage that tokenizes.
    shared = executor.share(vocab_sha, tokens)
    num_shards = cfg.num_shards or default_num_shards(planned, cfg.dupe_factor, vocab.vocab_size)
    executor.warm(SplitTokenize(ctx, shared, members="only").setup, max(len(units), num_shards))
    if cfg.num_shards is None:
        log.info("%d shards of at most about %d MiB (from the planned size; --num-shards to choose)", num_shards,
                 SHARD_BYTES >> 20)
    state = BuildState(cfg, ctx, units, shared, report, planned, unit_sizes(units, files, COMPRESSED_RATIO),
                       num_shards)
    for plan in STAGES:
        stage = plan(state)
        started = time.time()
        state.markers[stage.name] = run_stage(stage, executor, ctx.work, ep)
        told(stage.name, state.markers[stage.name], started, time.time())
        if stage.name == "pool":  # the instances pass gets the merged pool as one shared object
            state.pool = executor.share_result(f"pool:{build_id}", LoadPool(ctx))
        if stage.name == "pool_parts":  # the pool is a seeded sample of the corpus: refuse before the heavy stage
            _unk_check(cfg, state.markers["pool_parts"], "of the random-next pool's tokens (a seeded sample of the"
                       " corpus)")
        if stage.name == "instances":  # every token counted: the figure the manifest keeps
            if (w := _unk_check(cfg, state.markers["instances"], "of the corpus's tokens")) is not None:
                log.warning("%s", w)
                warnings.append(w)

    inst_markers: list[InstancesMarker] = state.markers["instances"]  # type: ignore[assignment]
    pool: PoolMarker = state.markers["pool"][0]  # type: ignore[assignment]
    dropped, bad_files = doc_totals(inst_markers, report, cfg.read.on_error)
    totals = {k: sum(getattr(m, k) for m in inst_markers) for k in ("documents", "sentences", "tokens", "unk_tokens")}
    shards = [{"file": m.file, "rows": m.rows} for m in state.markers["shards"]]  # type: ignore[attr-defined]

    write_bytes_atomic(join(out, VOCAB_FILE), vocab_bytes, ep)
    remove_stale_temps(join(out, SHARDS_DIR), ep)
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
        "seq_len_histogram": _histogram(inst_markers, "seq_len_histogram"),
        "masked_per_seq_histogram": _histogram(inst_markers, "masked_per_seq_histogram"),
        "tokens_per_document_histogram": _histogram(inst_markers, "tokens_per_document"),
        "ignored_files": ignored, "warnings": warnings,
        "random_pool": {"documents": pool.documents, "tokens": pool.tokens, "planned_tokens": planned,
                        "sample_fraction": min(1.0, ctx.pool_threshold / (1 << 64))},
        "build_seconds": round(time.time() - t0, 2),
    }
    manifest = redact(json.loads(json.dumps(manifest)))  # what readers will see (tuples become lists, no secrets)
    validate_manifest(manifest, "the new manifest")
    if documents is None:  # the inputs as they are now: a manifest never vouches for bytes it did not read
        changes = input_changes(inputs, _stamps(expand_inputs(list(cfg.inputs), ep)))
        if changes:
            raise ValueError(f"{out}: the inputs changed while this build read them ({'; '.join(changes[:3])}), so "
                             f"its shards mix versions and were not committed as a dataset: delete {cfg.work} and "
                             "rerun once the inputs stay put")
    fence.check(fresh=True)  # the commit of the whole build: only while this build still holds the output
    write_json_atomic(join(out, MANIFEST), manifest, ep)  # last: its presence means the dataset is complete
    remove_tree(cfg.work, ep)
    log.info("built %s: %d instances in %d shards", out, totals["instances"], len(shards))
    return parse_manifest(manifest, absolute(out), vocab_bytes.decode("utf-8"), "the new manifest")
