"""The dataset build: the stages the driver walks, one file each, and the manifest (written last).

    pieces (big compressed inputs cut; the units planned) -> [vocab] -> read -> [curate -> reports] -> pool
    -> instances -> shards -> manifest       ([...]: only when the build curates: pipeline/build/curation/filters.py)

    the per-unit passes, as Ray Data pipelines over rows (rows.py); the input is read once, by the first:
    read       ReadCorpus -> [document filters] -> SplitTokenize -> WriteDocs (tokenized documents in _work)
    instances  ReadDocs -> PairsAndMasks (the pool as an object reference) -> WriteUnits

    config.py state.py  BuildConfig (what decides the dataset); BuildState (what planners and hooks see)
    inputs/       what the build reads: the inputs, their stamps and the vocabulary first; pieces.py, the first stage
    manifest.py   the typed Manifest, made from the markers and written by one writer, last
    sizes.py      what the driver plans from counts (the pool's threshold, the default shard count)
    identity.py   the config hash and input stamps of an output folder: finished, resumable or refused
    executor.py   Stage, run_stage (resume by markers), the Executor protocol and the plain-loop LocalExecutor
    rows.py       RowStage: a read, operators over rows, a sink that commits units; users' errors as values
    ray_data/     the build on Ray Data (RayDataExecutor, its datasource and datasink, a Dataset as the input)
    progress.py   a progress line per stage; markers.py: completion markers; work.py: _work, per-process caches
    vocab.py read.py pool.py instances.py shards.py: one stage each, with its work item or operators, its sink or
                  step, its marker, its planner and hook; docs.py: what the passes share (read, tokenize, tables)
    curation/     the read pass's curation filters, the curate stage (dedup's decision, --mix), the report;
                  drops.py: what a global step leaves out or repeats

Each stage is a ``Stage`` (a step mapped over items) or a ``RowStage`` (read, operators, sink over units), one
marker per item or unit, planned from the markers of the stages before it; ``build`` walks ``STAGES``, runs each
with ``run_stage`` on the executor it was given, then calls the stage's hook (``after``), which adds to the state
what the next stages need (the units, the vocabulary, the corpus's token count, the pool) or refuses early (an
input without documents, a vocabulary that does not fit). The driver only plans and sums markers: it reads no
corpus bytes and no per-document data (O(units) of metadata). Barriers are the ones the algorithm needs: the pool
needs every unit's documents (it is a sample of the whole corpus), the shards every unit's row counts. Output never
depends on the executor, CPUs, nodes or blocks: ids and seeds come from the documents.

Resume: every item of every stage commits atomically with a completion marker, so a killed build rerun with the same
command redoes only what has no marker (``identity.py`` says which reruns are refused).

To add a stage, write ``<name>_stage(state) -> Stage | RowStage | None`` in a file of its own (its work item, step
and marker beside it, and its hook if later stages need more than its markers) and put it in ``STAGES``; later
stages read its markers from ``state.markers[name]``. The driver has no stage names in it. A document filter is an
operator of the read pass (``read.DOC_FILTERS``); docs/architecture.md says how to add either.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from pipeline.build.config import BuildConfig
from pipeline.build.curation import filters
from pipeline.build.curation.reports import reports_stage
from pipeline.build.curation.stage import curate_stage
from pipeline.build.executor import Executor, LocalExecutor, Stage, run_stage
from pipeline.build.identity import check_state, finished, input_changes
from pipeline.build.inputs import file_stamps, read_inputs
from pipeline.build.instances import instances_stage
from pipeline.build.manifest import make_manifest, write_manifest
from pipeline.build.inputs.pieces import pieces_stage
from pipeline.build.pool import pool_stage
from pipeline.build.read import read_stage
from pipeline.build.rows import RowStage
from pipeline.build.shards import shards_stage
from pipeline.build.state import BuildState
from pipeline.build.vocab import vocab_stage
from pipeline.checks import settings_warnings
from pipeline.safe_io.lease import output_lease
from pipeline.schema import SHARDS_DIR, VOCAB_FILE, Manifest, config_hash, read_manifest
from pipeline.storage import check_writable, expand_inputs, join, remove_stale_temps, remove_tree, write_bytes_atomic

__all__ = ["BuildConfig", "STAGES", "build"]

log = logging.getLogger(__name__)

# The stages in order: each plans from the state (the stages before it; None: the stage does not apply to this
# build), runs, then its hook adds to the state.
STAGES: tuple[Callable[[BuildState], Stage | RowStage | None], ...] = (
    pieces_stage, vocab_stage, read_stage, curate_stage, reports_stage, pool_stage, instances_stage, shards_stage)

# Told when a stage has finished: (stage name, its markers, wall start, wall end). The job's MLflow run uses it.
OnStage = Callable[[str, list, float, float], None]


def build(cfg: BuildConfig, executor: Executor | None = None, on_stage: OnStage | None = None,
          documents: Any = None, id_column: str = "id") -> Manifest:
    """Run (or resume, or confirm) the build; returns its manifest. ``on_stage`` hears of every finished stage.
    One build writes an output at a time: it holds the output's lease (pipeline/safe_io/lease.py) from its first write.

    The input is ``cfg.inputs`` (files, folders, globs) or ``documents``: a ``ray.data.Dataset`` with an
    ``id_column`` and a ``cfg.read.text_field`` column (``pipeline/build/ray_data/documents.py``)."""
    with contextlib.ExitStack() as held:
        return _build(cfg, executor or LocalExecutor(), on_stage or (lambda *a: None), documents, id_column,
                      hold=lambda: held.enter_context(output_lease(cfg.output, ep=cfg.endpoint_url)))


def _build(cfg: BuildConfig, executor: Executor, told: OnStage, documents: Any, id_column: str,
           hold: Callable) -> Manifest:
    t0 = time.time()
    out, ep = cfg.output, cfg.endpoint_url
    warnings = settings_warnings(cfg.instances)
    for w in warnings:
        log.warning("%s", w)
    # Everything that can fail cheaply fails here, before any work: inputs, vocab, output, config clashes.
    inputs = read_inputs(cfg, documents, id_column)
    ident = cfg.identity() | {"vocab_sha256": inputs.vocab_sha256} | filters.identity(cfg, inputs)
    chash = config_hash(ident)
    fence = hold().fence  # before the first write (the probe, a finished build's _work clean-up, check_state's wipe)
    check_writable(out, ep)
    # The inputs' identity: files' stamps now; a Dataset's digest once its read pass has taken it on the way.
    known = inputs.stamps is not None
    if known and finished(cfg, chash, inputs.stamps):
        return read_manifest(out, ep)
    if known:
        check_state(cfg, chash, inputs.stamps)

    executor.begin()  # a cluster comes up while the driver plans
    state = BuildState(cfg, inputs, executor, chash, vocab_bytes=inputs.vocab_bytes, warnings=warnings,
                       fence=fence)
    for plan in STAGES:
        started = time.time()  # a planner may do the stage's first part (the curate stage's global decision)
        stage = plan(state)
        if stage is None:
            continue
        state.markers[stage.name] = run_stage(stage, executor, cfg.work, ep)
        if stage.after is not None:
            stage.after(state)
        told(stage.name, state.markers[stage.name], started, time.time())
        if not known and inputs.stamps is not None:  # a Dataset's, taken by the read pass: checked as files' are
            known = True
            if finished(cfg, chash, inputs.stamps):
                return read_manifest(out, ep)
            check_state(cfg, chash, inputs.stamps, keep=(stage.name, "docs"))

    manifest = make_manifest(state, ident, chash, time.time() - t0)
    write_bytes_atomic(join(out, VOCAB_FILE), state.vocab_bytes, ep)
    remove_stale_temps(join(out, SHARDS_DIR), ep)
    if inputs.documents is None:  # the inputs as they are now: a manifest never vouches for bytes it did not read
        changes = input_changes(inputs.stamps, file_stamps(expand_inputs(list(cfg.inputs), ep)))
        if changes:
            raise ValueError(f"{out}: the inputs changed while this build read them ({'; '.join(changes[:3])}), so "
                             f"its shards mix versions and were not committed as a dataset: delete {cfg.work} and "
                             "rerun once the inputs stay put")
    fence.check(fresh=True)  # the commit of the whole build: only while this build still holds the output
    write_manifest(manifest, out, ep)  # last: its presence means the dataset is complete
    remove_tree(cfg.work, ep)
    log.info("built %s: %d instances in %d shards", out, manifest.totals.instances, len(manifest.shards))
    return manifest
