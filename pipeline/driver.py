"""The build's driver: plan each stage of ``STAGES`` from what the stages before it left, run it on the
executor, call its hook; the typed Manifest written last (the package docstring says how the stages fit)."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from corpus.checks import settings_warnings
from corpus.schema import SHARDS_DIR, VOCAB_FILE, Manifest, config_hash, read_manifest
from pipeline.config import BuildConfig
from pipeline.curation import filters
from pipeline.curation.reports import reports_stage
from pipeline.curation.stage import curate_stage
from pipeline.executor import Executor, LocalExecutor, Stage, run_stage
from pipeline.identity import check_state, finished, input_changes
from pipeline.inputs import file_stamps, read_inputs
from pipeline.inputs.pieces import pieces_stage
from pipeline.instances import instances_stage
from pipeline.manifest import make_manifest, write_manifest
from pipeline.pool import pool_stage
from pipeline.read import read_stage
from pipeline.rows import RowStage, sum_ops
from pipeline.shards import shards_stage
from pipeline.state import BuildState
from pipeline.vocab import vocab_stage
from storage.fs import check_writable, expand_inputs, join, remove_stale_temps, remove_tree, write_bytes_atomic
from storage.lease import output_lease

__all__ = ["BuildConfig", "STAGES", "build"]

log = logging.getLogger(__name__)

# The stages in order: each plans from the state (the stages before it; None: the stage does not apply to this
# build), runs, then its hook returns the next state.
STAGES: tuple[Callable[[BuildState], Stage | RowStage | None], ...] = (
    pieces_stage, vocab_stage, read_stage, curate_stage, reports_stage, pool_stage, instances_stage, shards_stage)

# Told when a stage has finished: (stage name, its markers, its operators' summed statistics, wall start, wall end).
# The job's MLflow run uses it.
OnStage = Callable[[str, list, dict[str, tuple[float, ...]], float, float], None]


def build(cfg: BuildConfig, executor: Executor | None = None, on_stage: OnStage | None = None,
          documents: Any = None, id_column: str = "id") -> Manifest:
    """Run (or resume, or confirm) the build; returns its manifest. ``on_stage`` hears of every finished stage.
    One build writes an output at a time: it holds the output's lease (storage/lease.py) from its first write.

    The input is ``cfg.inputs`` (files, folders, globs) or ``documents``: a ``ray.data.Dataset`` with an
    ``id_column`` and a ``cfg.read.text_field`` column (``pipeline/ray_data/documents.py``)."""
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
    state = BuildState(cfg=cfg, inputs=inputs, executor=executor, chash=chash, warnings=tuple(warnings), fence=fence)
    if inputs.vocab_bytes is not None:
        state = state.with_vocab(inputs.vocab_bytes)
    for plan in STAGES:
        started = time.time()  # a planner may do the stage's first part (the curate stage's global decision)
        stage = plan(state)
        if stage is None:
            continue
        state = state.with_markers(stage.name, run_stage(stage, executor, cfg.work, ep))
        if stage.after is not None:
            state = stage.after(state)
        told(stage.name, state.markers[stage.name], sum_ops(state.markers[stage.name]), started, time.time())
        if not known and state.inputs.stamps is not None:  # a Dataset's, taken by its read pass: checked as files'
            known = True
            if finished(cfg, chash, state.inputs.stamps):
                return read_manifest(out, ep)
            check_state(cfg, chash, state.inputs.stamps, keep=(stage.name, "docs"))

    manifest = make_manifest(state, ident, chash, time.time() - t0)
    if inputs.documents is None:  # the inputs as they are now: a manifest never vouches for bytes it did not read
        changes = input_changes(inputs.stamps, file_stamps(expand_inputs(list(cfg.inputs), ep)))
        if changes:  # the shards mix versions: removed, so that the advice below works when followed
            fence.check(fresh=True)
            for name in (SHARDS_DIR, "reports"):
                remove_tree(join(out, name), ep)
            raise ValueError(f"{out}: the inputs changed while this build read them ({'; '.join(changes[:3])}), so "
                             f"its shards mix versions and were not committed as a dataset (removed): delete "
                             f"{cfg.work} and rerun once the inputs stay put")
    write_bytes_atomic(join(out, VOCAB_FILE), state.vocab_bytes, ep)
    remove_stale_temps(join(out, SHARDS_DIR), ep)
    fence.check(fresh=True)  # the commit of the whole build: only while this build still holds the output
    write_manifest(manifest, out, ep)  # last: its presence means the dataset is complete
    remove_tree(cfg.work, ep)
    log.info("built %s: %d instances in %d shards", out, manifest.totals.instances, len(manifest.shards))
    return manifest
