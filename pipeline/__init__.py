"""The dataset build: raw text -> balanced, masked Parquet shards and a manifest. The stages the driver walks
(driver.py), one file each, and the manifest (written last). What a stage computes lives in ``corpus`` (text ->
instances), ``curate`` (document filters) and ``storage`` (the house's I/O); this package plans, runs and commits.

    pieces (big compressed inputs cut; the units planned) -> [vocab] -> read -> [curate -> reports] -> pool
    -> instances -> shards -> manifest       ([...]: only when the build curates: pipeline/curation/filters.py)

    the per-unit passes, as Ray Data pipelines over rows (rows.py); the input is read once, by the first:
    read       ReadCorpus -> [document filters] -> SplitTokenize -> WriteDocs (tokenized documents in _work)
    instances  ReadDocs -> CountPairs -> WriteCounts (rows per document pass; shards.py makes the rows)

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
with ``run_stage`` on the executor it was given, then calls the stage's hook (``after``), which returns the next
state (``BuildState`` is a frozen value) with what the next stages need (the units, the vocabulary, the corpus's
token count, the pool) or refuses early (an input without documents, a vocabulary that does not fit). The driver
only plans and sums markers: it reads no corpus bytes and no per-document data (O(units) of metadata). Barriers are
the ones the algorithm needs: the pool needs every unit's documents (it is a sample of the whole corpus), the shards
every unit's row counts. Output never depends on the executor, CPUs, nodes or blocks: ids and seeds come from the
documents.

Resume: every item of every stage commits atomically with a completion marker, so a killed build rerun with the same
command redoes only what has no marker (``identity.py`` says which reruns are refused).

To add a stage, write ``<name>_stage(state) -> Stage | RowStage | None`` in a file of its own (its work item, step
and marker beside it, and its hook if later stages need more than its markers) and put it in ``STAGES``; later
stages read its markers from ``state.markers[name]``. The driver has no stage names in it. A document filter is an
operator of the read pass (``read.DOC_FILTERS``); docs/architecture.md says how to add either.
"""
from pipeline.config import BuildConfig
from pipeline.driver import STAGES, build

__all__ = ["BuildConfig", "STAGES", "build"]
