"""The dataset build's MLflow run: opened when the build begins its work (every check of its flags, inputs and
output passed: a mistake found before then leaves no run and waits for no store), written by one background thread,
closed with the build's own start and end times, so that its duration is the build's. Its end (the report's
figures, artifacts, the dataset) is written after the dataset is committed: the job prints its summary (with the
run's id, known once the run is open) first, and shuts Ray down while this thread draws the figures.

    run = BuildRun(tracking_uri, experiment, cfg, args, started)   # nothing opened yet
    build(cfg, run.opening(executor), on_stage=run.on_stage)  # the run opens as the executor begins
    run.finish(output, manifest, ended)             # metrics, the report's figures, manifest, dataset (queued)
    run.run_id()                                    # its id, once open (printed with the build's summary)
    run.wait()                                      # the run written; raises what the thread raised

Writes are queued on one thread (in order); ``on_stage`` raises at once if the run could not be opened, so a bad
tracking store stops the build at its next stage rather than after it. The run is opened by
``tracking.runs.open_run`` (dated from the job's start), the figures come from ``tracking.build_report``, the dataset
record from ``tracking.datasets.log_dataset`` (what pre-training calls for its input). A run of the same output left
RUNNING by a killed build is marked KILLED when the next build of that output opens its own (that build holds the
output's lease, so the other cannot be alive).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corpus.schema import Manifest

from storage.fs import is_url
from storage.redact import redact_url
from tracking.lineage import DATASET_SHA_TAG

log = logging.getLogger(__name__)

REPORT_DIR = "report"  # artifact folder of the figures
OUTPUT_TAG = "bert.build_output"  # the output folder a build's run is of: the next build there closes a stale one


class _Earlier:
    """The run that built a dataset a rerun found complete (only its id is needed)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


class BuildRun:
    def __init__(self, tracking_uri: str, experiment: str, cfg: Any, args: Any, started: float) -> None:
        self.uri, self.experiment, self.endpoint_url = tracking_uri, experiment, cfg.endpoint_url
        self.label = os.path.basename(cfg.output.rstrip("/")) or cfg.output  # names the runs, titles the figures
        self.name = args.run_name or f"build {self.label} seq{cfg.instances.max_seq_length}"
        self.vocab_params = None if cfg.vocab else {
            "vocab_size": cfg.vocab_size, "sample_bytes": cfg.vocab_sample_bytes, "min_frequency": cfg.min_frequency,
            "do_lower_case": cfg.do_lower_case, "seed": cfg.instances.seed, "unit_bytes": cfg.unit_bytes}
        self.vocab_run: Any = None
        self.output = cfg.output
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlflow")
        self._pending: list[concurrent.futures.Future] = []
        self._open_args = (readable_params(args, cfg), args.parent_run_id, started)
        self._opened: concurrent.futures.Future | None = None
        self._stages_run = 0

    def start(self) -> None:
        """Open the run (in the thread; at most once)."""
        if self._opened is None:
            self._opened = self._thread.submit(self._open, *self._open_args)

    def opening(self, executor: Any) -> Any:
        """``executor``, opening the run when the build begins its work (``Executor.begin``)."""
        return _OpensRun(executor, self)

    # --- the thread's work (queued in order) --------------------------------------------------------------------

    def _open(self, params: dict[str, Any], parent: str | None, started: float):
        from tracking.runs import close_stale_runs, open_run

        run = open_run(self.uri, self.experiment, self.name, params=params,
                       tags={"job": "build_dataset", OUTPUT_TAG: redact_url(self.output)},
                       parent_run_id=parent, start_time=started)
        close_stale_runs(run, OUTPUT_TAG, redact_url(self.output))
        import matplotlib.figure  # noqa: F401 - loaded while the build runs, not after it

        return run

    def _stage(self, name: str, markers: list, ops: dict[str, tuple[float, ...]], started: float,
               ended: float) -> None:
        run = self._opened.result()
        run.log_metrics({f"stage_seconds.{name}": round(ended - started, 3)})
        # Per operator of a row pass (Ray Data fuses a pass into one task, so its own statistics cannot tell them
        # apart): rows in and out, MB out, CPU seconds.
        run.log_metrics({f"op.{name}.{op}.{what}": round(float(v[i]) / (1e6 if what == "mb_out" else 1), 3)
                         for op, v in ops.items()
                         for i, what in enumerate(("rows_in", "rows_out", "mb_out", "cpu_s"))})
        if name == "vocab" and self.vocab_params is not None:
            self._vocab_run(run.run_id, markers[0], started, ended)

    def _vocab_run(self, parent: str, marker: Any, started: float, ended: float) -> None:
        """The vocabulary stage's own run, a child of the build's: what was asked, what came out."""
        self.vocab_run = vocab_run(self.uri, self.experiment, f"vocab {self.label}", self.vocab_params, marker,
                                   started, ended, parent_run_id=parent, tags={"job": "build_dataset"})

    def _finish(self, output: str, m: Manifest, ended: float, nothing_done: bool, run: Any = None) -> None:
        from corpus.schema import MANIFEST, VOCAB_FILE
        from storage.fs import join, read_bytes
        from tracking import build_report as report
        from tracking.build_curation import log_curation
        from tracking.datasets import log_dataset

        run = run or self._opened.result()
        figures = report.figures(m, self.label)
        run.log_metrics(report.metrics(m))
        run.log_params({"vocab.size": m.vocab.size, "vocab.sha256": m.vocab.sha256, "config_hash": m.config_hash,
                        "input_files": len(m.inputs), "input_bytes": m.input_bytes})
        run.set_tags({"dataset.url": output, DATASET_SHA_TAG: m.sha256, "dataset.result":
                      "already complete: nothing built" if nothing_done else "built",
                      "mlflow.note.content": _note(output, m, nothing_done)})
        with tempfile.TemporaryDirectory(prefix="build-report-") as d:
            (Path(d) / REPORT_DIR).mkdir()
            for fname, png in figures.items():
                (Path(d) / REPORT_DIR / fname).write_bytes(png)
            (Path(d) / MANIFEST).write_bytes(read_bytes(join(output, MANIFEST), self.endpoint_url))
            run.log_artifacts(d)
            log_curation(run, output, m, self.endpoint_url, d)  # the curation report, its shares (a curated build)
            if self.vocab_run is not None:  # the trained vocabulary, beside the run that trained it
                (Path(d) / "vocab").mkdir()
                (Path(d) / "vocab" / VOCAB_FILE).write_bytes(read_bytes(join(output, VOCAB_FILE), self.endpoint_url))
                self.vocab_run.log_artifacts(Path(d) / "vocab")
        # The dataset as its consumers read it (pre-training logs the same one as its input).
        log_dataset(self.uri, run.run_id, m, "output")
        run.end("FINISHED", end_time=ended)

    def _fail(self, error: BaseException, ended: float) -> None:
        run = self._opened.result()
        run.set_tags({"error": str(error)[:5000] or type(error).__name__})
        run.end("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED", end_time=ended)

    # --- the build's side: every call returns at once ------------------------------------------------------------

    def _submit(self, fn, *args) -> None:
        self._pending.append(self._thread.submit(fn, *args))

    def on_stage(self, name: str, markers: list, ops: dict[str, tuple[float, ...]], started: float,
                 ended: float) -> None:
        """A stage finished: its wall time and its operators' summed statistics (``ops``: rows in, rows out, bytes
        out, CPU seconds per operator) as metrics; the vocabulary stage gets a child run of its own."""
        self.start()
        if self._opened.done() and self._opened.exception() is not None:
            self._opened.result()  # the store refused the run: stop the build now, not after it
        self._stages_run += 1
        self._submit(self._stage, name, markers, ops, started, ended)

    def finish(self, output: str, manifest: Manifest, ended: float) -> None:
        if self._stages_run == 0 and self._opened is None:
            # A finished output's rerun begins no work: it logs no new run when the run that built the dataset is
            # in this store (its id is the job's answer); else one run that says it built nothing.
            self._opened = self._thread.submit(self._earlier_or_open, output, manifest, ended)
            return
        self.start()
        self._submit(self._finish, output, manifest, ended, self._stages_run == 0)

    def _earlier_or_open(self, output: str, m: Manifest, ended: float) -> Any:
        from tracking.lineage import find_build_run

        found = find_build_run(self.uri, m.sha256)
        if found is not None:
            log.info("the dataset is already complete: no new MLflow run (it was built by run %s)", found["run_id"])
            return _Earlier(found["run_id"])
        run = self._open(*self._open_args)
        self._finish(output, m, ended, True, run)
        return run

    def fail(self, error: BaseException, ended: float) -> None:
        """The build failed: its run (when its work had begun) ends FAILED, or KILLED for Ctrl-C."""
        if self._opened is not None:
            self._submit(self._fail, error, ended)

    def run_id(self, timeout: float = 600.0) -> str | None:
        """The run's id once it is open (None: it never opened); raises what opening it raised. Waits for no other
        write: the job prints it with the build's summary while the report is still being written."""
        return None if self._opened is None else self._opened.result(timeout).run_id

    def wait(self, timeout: float = 600.0) -> str | None:
        """The run's id once every queued write is done (None: the build failed before its run opened); raises the
        first error of the thread."""
        t0 = time.perf_counter()
        try:
            if self._opened is None:
                return None
            run = self._opened.result(timeout)
            for f in self._pending:
                f.result(timeout)
            log.info("MLflow run %s written; the job waited %.1f s (wall) for it after the build", run.run_id,
                     time.perf_counter() - t0)
            return run.run_id
        finally:
            self._thread.shutdown(wait=False)


class _OpensRun:
    """An executor whose ``begin`` opens the build's run first (the MLflow thread and Ray then start together)."""

    def __init__(self, executor: Any, run: BuildRun) -> None:
        self._executor, self._run = executor, run

    def begin(self) -> None:
        self._run.start()
        self._executor.begin()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)


def vocab_run(tracking_uri: str, experiment: str, name: str, params: dict[str, Any], marker: Any, started: float,
              ended: float, *, parent_run_id: str | None = None, tags: dict[str, str] | None = None,
              vocab_file: str | None = None):
    """A finished vocabulary stage (a ``pipeline.vocab`` marker) as its own run: what was asked (params),
    what came out (size, sample, documents, drops), a description, and the vocab.txt when `vocab_file` is given.
    The build's vocabulary stage is a child of the build's run; ``jobs/train_tokenizer.py`` logs one on its own."""
    from tracking.runs import open_run

    run = open_run(tracking_uri, experiment, name, params=params,
                   tags={"stage": "vocab", **(tags or {}), "vocab.sha256": marker.sha256},
                   parent_run_id=parent_run_id, start_time=started)
    run.log_metrics({"vocab_size": marker.vocab_size, "sampled_bytes": marker.sampled_bytes,
                     "sampled_blocks": marker.blocks, "documents": marker.documents}
                    | {f"dropped.{k}": v for k, v in marker.dropped.items()})
    run.set_tags({"mlflow.note.content": (
        f"WordPiece vocabulary of {marker.vocab_size:,} entries trained on {marker.sampled_bytes:,} bytes of text "
        f"({marker.blocks} sampled blocks, {marker.documents:,} documents); sha256 `{marker.sha256[:16]}`."
        + (f"\n\nWritten to `{vocab_file}` (Artifacts > vocab/)." if vocab_file else ""))})
    if vocab_file is not None and not is_url(vocab_file):
        with tempfile.TemporaryDirectory(prefix="vocab-run-") as d:
            (Path(d) / "vocab").mkdir()
            shutil.copyfile(vocab_file, Path(d) / "vocab" / "vocab.txt")
            run.log_artifacts(Path(d) / "vocab", "vocab")
    run.end("FINISHED", end_time=ended)
    return run


def _note(output: str, m: Manifest, nothing_done: bool) -> str:
    """The run's description (MLflow's Overview tab): what was built, where, and where the figures are."""
    t = m.totals
    lines = [f"Dataset build of `{output}`" + (" (already complete: nothing was built by this run)."
                                                if nothing_done else "."),
             f"{t.instances:,} sequences of at most {m.max_seq_length} tokens in {len(m.shards)} shards, "
             f"from {t.documents:,} documents ({t.tokens:,} tokens) of {len(m.inputs)} input file(s); "
             f"vocabulary of {m.vocab.size:,} entries" + (" trained on the input." if m.vocab.trained else "."),
             f"Figures: Artifacts > {REPORT_DIR}/. The dataset (Dataset column) carries the manifest's sha256 (first 16"
             " hex digits)."]
    for w in m.warnings:
        lines.append(f"**Warning:** {w}")
    return "\n\n".join(lines)


def readable_params(args: Any, cfg: Any) -> dict[str, Any]:
    """What a person needs to tell builds apart, flat: inputs as a list, the vocabulary as given (its real size is
    logged when known), the trained vocabulary's settings only when one is trained."""
    from tracking.params import flatten_params

    shown = list(cfg.inputs[:20]) + ([f"... ({len(cfg.inputs) - 20} more)"] if len(cfg.inputs) > 20 else [])
    params: dict[str, Any] = {"inputs": ", ".join(shown), "output": cfg.output,
                              "executor": "plain loop (--no-ray)" if args.no_ray else "ray data",
                              "num_cpus": args.num_cpus if args.num_cpus is not None else "all"}
    params |= flatten_params(cfg.read, "read") | flatten_params(cfg.instances, "instances")
    params |= {k: getattr(cfg, k) for k in ("do_lower_case", "dupe_factor", "pool_tokens", "unit_bytes")}
    params["num_shards"] = cfg.num_shards if cfg.num_shards is not None else "from the planned size"
    if cfg.curate.enabled:
        params |= flatten_params(cfg.curate, "curate")
    if cfg.vocab:
        params["vocab"] = cfg.vocab
    else:
        params |= {"vocab": "trained on the input", "vocab.asked_size": cfg.vocab_size,
                   "vocab.sample_bytes": cfg.vocab_sample_bytes, "vocab.min_frequency": cfg.min_frequency}
    return params
