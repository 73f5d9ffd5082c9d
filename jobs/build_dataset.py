"""Build a BERT pre-training dataset: raw text (local or object storage) -> balanced, masked Parquet shards.

    python jobs/build_dataset.py --input URL [--input URL ...] --output URL [--vocab PATH_OR_URL] [options]
    ray job submit --working-dir . -- python jobs/build_dataset.py ...        # same flags, on a cluster

Runs on Ray Data (``ReadCorpus -> SplitTokenize -> WriteDocs``, then ``ReadDocs -> CountPairs -> WriteCounts``;
the shards step makes the pairs and masks of its own rows; pipeline/ray_data/): on the
cluster it is attached to (``ray job submit`` sets RAY_ADDRESS), else on a local Ray on loopback capped at
``--num-cpus``; ``--no-ray`` runs the same steps as a plain loop. Prints a one-line JSON summary at the end (with the
build's warnings). Users' mistakes end the job with one line on stderr and status 2.

The build has an MLflow run that spans it, in the store the other jobs log to (--mlflow-tracking-uri, else
MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db; --no-mlflow for none) (``tracking/build_run.py``): named
``build <output folder> seq<length>``, the report's figures, the dataset as its output, and a child run for the
vocabulary stage when one is trained.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import time
import traceback
from pathlib import Path

if __name__ == "__main__":  # `python jobs/X.py` from any shell: find the project; outside its venv, say how in one line
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jobs._preflight import require_project_env

    require_project_env(__file__)

from cluster.allocators import use_jemalloc  # noqa: E402 - before anything imports pyarrow

use_jemalloc()  # this process and the local Ray's workers: flat memory per worker (cluster/allocators.py)
# The imports below must follow it: pyarrow reads the allocator's variable when it loads.

from cluster import interrupt  # noqa: E402 - after use_jemalloc()
from cluster.ray_start import init_ray  # noqa: E402 - after use_jemalloc()
from corpus.checks import CheckConfig  # noqa: E402 - after use_jemalloc()
from corpus.create_instances import InstanceConfig  # noqa: E402 - after use_jemalloc()
from corpus.readers import FORMATS, ON_ERROR, ReadOptions  # noqa: E402 - after use_jemalloc()
from curate.dedup import DedupConfig  # noqa: E402 - after use_jemalloc()
from curate.eval_sets import eval_files  # noqa: E402 - after use_jemalloc()
from curate.mix import under  # noqa: E402 - after use_jemalloc()
from jobs import _common, _curate_flags  # noqa: E402 - after use_jemalloc()
from jobs._fields import add_field  # noqa: E402 - after use_jemalloc()
from pipeline import BuildConfig, build  # noqa: E402 - after use_jemalloc()
from pipeline.config import DEFAULT_SAMPLE_BYTES  # noqa: E402 - after use_jemalloc()
from pipeline.curation.filters import check as curation_check  # noqa: E402 - after use_jemalloc()
from pipeline.curation.filters import mix_source  # noqa: E402 - after use_jemalloc()
from pipeline.executor import LocalExecutor  # noqa: E402 - after use_jemalloc()
from pipeline.preflight import check_build  # noqa: E402 - after use_jemalloc()
from storage.fs import expand_inputs, read_bytes  # noqa: E402 - after use_jemalloc()
from storage.redact import redact, redact_text, redact_url  # noqa: E402 - after use_jemalloc()
from tracking.build_run import BuildRun  # noqa: E402 - after use_jemalloc()
from tracking.store import (  # noqa: E402 - after use_jemalloc()
    DEFAULT_EXPERIMENT,
    check_tracking_reachable,
    resolve_tracking_uri,
)

log = logging.getLogger("build_dataset")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_common.HelpFormatter, fromfile_prefix_chars="@",
                                allow_abbrev=False)  # a typo must fail, not match a longer flag
    p.add_argument("--input", action="append", required=True, help="file, directory or glob; repeatable")
    p.add_argument("--output", required=True, help="output folder (local path or s3://...)")
    p.add_argument("--vocab", help="BERT vocab.txt (path or URL); without it one is trained on the input")
    # --vocab-size and --vocab-sample-bytes default to None, not to their fields' values: check_args refuses them
    # beside --vocab only when given, and config_from puts the fields' defaults in.
    p.add_argument("--vocab-size", type=int,
                   help=f"size of the trained vocabulary (no --vocab) (default: {BuildConfig.vocab_size})")
    p.add_argument("--vocab-sample-bytes", type=int,
                   help="train the vocabulary (no --vocab) on a seeded sample of about this many bytes; 0 = all "
                        f"(default: {DEFAULT_SAMPLE_BYTES})")
    add_field(p, "--presplit", ReadOptions)
    add_field(p, "--format", ReadOptions, "fmt", choices=FORMATS)
    add_field(p, "--text-field", ReadOptions)
    add_field(p, "--id-field", ReadOptions, help_suffix="A document's seeds come from it: the same records give the "
              "same shards in a file or a Ray Dataset.")
    add_field(p, "--max-seq-length", InstanceConfig, type=int)
    add_field(p, "--max-predictions-per-seq", InstanceConfig, type=int)
    add_field(p, "--masked-lm-prob", InstanceConfig, type=float)
    add_field(p, "--short-seq-prob", InstanceConfig, type=float)
    add_field(p, "--dupe-factor", BuildConfig, type=int)
    add_field(p, "--whole-word-mask", InstanceConfig)
    add_field(p, "--seed", InstanceConfig, type=int)
    case = p.add_mutually_exclusive_group()
    add_field(case, "--do-lower-case", BuildConfig, action="store_true")
    case.add_argument("--cased", dest="do_lower_case", action="store_false",
                      help="keep case and accents (a cased vocabulary): --do-lower-case off")
    add_field(p, "--num-shards", BuildConfig, type=int)
    add_field(p, "--pool-tokens", BuildConfig, type=int)
    p.add_argument("--num-cpus", type=int, default=None,
                   help="caps parallelism: a local Ray's CPUs, or the tasks in flight on a cluster")
    add_field(p, "--on-error", ReadOptions, choices=ON_ERROR)
    add_field(p, "--max-unk-fraction", CheckConfig, type=float, help_suffix="A share above 1%% is a warning.")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph, a test server)")
    p.add_argument("--no-ray", action="store_true", help="run the steps as a plain loop (debugging)")
    p.add_argument("--progress", choices=("auto", "bars", "lines"), default="auto",
                   help="Ray Data's progress bars (auto: when stderr is a terminal) or a log line per stage every few"
                        " seconds")
    p.add_argument("--mlflow-tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else "
                   "./mlruns/mlflow.db, where pre-training and fine-tuning log too)")
    p.add_argument("--no-mlflow", action="store_true", help="log no MLflow run")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                   help="MLflow experiment (one for the whole pipeline: the build's, pre-training's and "
                        "fine-tuning's runs side by side)")
    p.add_argument("--parent-run-id")
    p.add_argument("--run-name", help="the MLflow run's name (default: build <output folder> seq<max-seq-length>)")
    p.add_argument("--log-level", default="INFO")
    _curate_flags.add_flags(p)
    _common.refuse_secrets(p, argv)
    a = p.parse_args(argv)
    _common.refuse_bad_names(p, outputs={"--output": a.output})
    return a


def config_from(args: argparse.Namespace) -> BuildConfig:
    return BuildConfig(
        inputs=tuple(args.input),
        output=args.output.rstrip("/"),
        read=ReadOptions(fmt=args.format, presplit=args.presplit, text_field=args.text_field,
                         id_field=args.id_field, on_error=args.on_error),
        instances=InstanceConfig(
            max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
            masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
            whole_word_mask=args.whole_word_mask, seed=args.seed),
        vocab=args.vocab, vocab_size=_or(args.vocab_size, BuildConfig.vocab_size),
        vocab_sample_bytes=_or(args.vocab_sample_bytes, DEFAULT_SAMPLE_BYTES),
        do_lower_case=args.do_lower_case,
        dupe_factor=args.dupe_factor, num_shards=args.num_shards, pool_tokens=args.pool_tokens,
        endpoint_url=args.endpoint_url, checks=CheckConfig(max_unk_fraction=args.max_unk_fraction,
                                                                 allow_drop=args.allow_drop),
        curate=_curate_flags.curate_config(args),
    )


def _or(value, default):
    return default if value is None else value


def check_args(args: argparse.Namespace) -> None:
    """The flags no config owns (how the build runs, not what it makes), and flags that contradict each other."""
    if args.num_cpus is not None and args.num_cpus < 1:
        raise ValueError(f"--num-cpus {args.num_cpus}: use at least 1 (it caps the CPUs the build uses), or leave it"
                         " out to use every CPU of this machine or of the cluster")
    trained = [f for f, v in (("--vocab-size", args.vocab_size), ("--vocab-sample-bytes", args.vocab_sample_bytes))
               if v is not None]
    if args.vocab and trained:
        raise ValueError(f"{' and '.join(trained)} with --vocab: {'they set' if len(trained) > 1 else 'it sets'} the "
                         "vocabulary a build trains when no --vocab is given, and --vocab gives one; drop "
                         f"{' and '.join(trained)} to use --vocab {args.vocab}, or drop --vocab to train one")
    near = [f for f, v, d in (("--dedup-threshold", args.dedup_threshold, DedupConfig.threshold),
                              ("--dedup-shingle-words", args.dedup_shingle_words, DedupConfig.shingle_words),
                              ("--dedup-num-perm", args.dedup_num_perm, DedupConfig.num_perm)) if v != d]
    if near and args.dedup != "near":
        raise ValueError(f"{near[0]} is used by --dedup near only (this build has --dedup {args.dedup}): add --dedup "
                         f"near, or drop {near[0]}")
    if args.no_mlflow and (args.mlflow_tracking_uri or args.parent_run_id):
        given = "--mlflow-tracking-uri" if args.mlflow_tracking_uri else "--parent-run-id"
        raise ValueError(f"{given} with --no-mlflow: drop one of them")


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = parse_args(argv)
    _common.setup_logging(args.log_level)
    check_args(args)
    cfg = config_from(args)
    # What the inputs and output tell in a second, before Ray or MLflow start (pipeline/preflight/).
    warnings = check_build(cfg.inputs, cfg.output, cfg.read, cfg.instances.max_seq_length,
                           cfg.instances.short_seq_prob, cfg.dupe_factor, cfg.num_shards, cfg.endpoint_url)
    check_curation_inputs(cfg)  # a --mix that leaves nothing, an evaluation file that is not UTF-8
    curation_check(cfg)  # evaluation files without text, a --mix SOURCE matching no input: before Ray and MLflow
    # The store every job logs to (the flag, MLFLOW_TRACKING_URI, else ./mlruns): pre-training's Datasets column
    # then points at a build that has a run.
    tracking_uri = None if args.no_mlflow else resolve_tracking_uri(args.mlflow_tracking_uri)
    run = None
    if tracking_uri:
        check_tracking_reachable(tracking_uri)
        # Opened as the build begins its work (in its own thread): the run spans the build, the store's start-up
        # overlaps Ray's and the build's, and a mistake found before (a refused rerun) leaves no run.
        run = BuildRun(tracking_uri, args.experiment, cfg, args, started)
    if args.no_ray:
        executor = LocalExecutor()
    else:
        from pipeline.ray_data import RayDataExecutor

        # Ray starts in the background once the build has work to do (not at all for a finished build).
        bars = args.progress == "bars" or (args.progress == "auto" and sys.stderr.isatty())
        executor = RayDataExecutor(args.num_cpus, init=lambda: init_ray(args.num_cpus), bars=bars)
    try:
        manifest = build(cfg, run.opening(executor) if run else executor, on_stage=run.on_stage if run else None)
    except BaseException as e:
        if run is not None:
            run.fail(e, time.time())
            _wait_quietly(run)
        # The error's frames hold the stage's Ray Data iterator: closed after Ray's shutdown (at exit), it logs a
        # 20-line "Ray is not initialized" traceback under the error's one line. Close it while Ray is up.
        traceback.clear_frames(e.__traceback__)
        executor.end()
        raise
    run_id = None
    if run is not None:
        run.finish(cfg.output, manifest, time.time())  # queued: the figures and the rest render in the run's thread
        run_id = run.run_id()  # the run opened while the build ran: its id needs no write
    t = manifest.totals
    summary = {"output": cfg.output, "instances": t.instances, "documents": t.documents, "tokens": t.tokens,
               "shards": len(manifest.shards), "dropped": manifest.dropped, "config_hash": manifest.config_hash[:12],
               "wall_seconds": manifest.build_seconds, "warnings": warnings + list(manifest.warnings),
               "mlflow_run_id": run_id}
    # The dataset is committed: say so now, not after the run's figures (what reads the job's output goes on).
    print(json.dumps(redact(summary)), flush=True)
    # Ray goes down while the run's thread draws the report (no collection in that thread meanwhile:
    # pipeline.ray_data.cluster.RayCluster.end); Ray's own exit handler would take longer.
    executor.end()
    if run is not None:
        run.wait()
    return 0


def check_curation_inputs(cfg: BuildConfig) -> None:
    """Before any work, in one line naming the flag or file: a --mix whose weights leave no input file above 0 (the
    build would find out after reading everything), and a --decontaminate file that is not UTF-8 text."""
    mix = cfg.curate.mix
    if mix.weights and cfg.inputs:
        files = [f.path for f in expand_inputs(list(cfg.inputs), cfg.endpoint_url)]
        weights = [mix_source(p) for p, _ in mix.weights]
        weight = {f: next((w for (_, w), p in zip(mix.weights, weights, strict=True) if under(f, p)), 1.0)
                  for f in files}
        if files and not any(w > 0 for w in weight.values()):
            raise ValueError(f"--mix {','.join(f'{p}={w:g}' for p, w in mix.weights)}: every input file gets weight 0,"
                             " so the dataset would be empty; give at least one input a weight > 0 (inputs no "
                             "SOURCE names keep 1), or drop the --mix entry that covers them all")
    for url in eval_files(cfg.curate.decontamination.paths, cfg.endpoint_url):
        if url.endswith((".parquet", ".pq")):
            continue
        data = read_bytes(url, cfg.endpoint_url)
        if url.endswith(".gz"):
            data = gzip.decompress(data)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            name = redact_url(url)
            raise ValueError(f"--decontaminate {name}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                             f"{e.start}: Latin-1 or another encoding?); convert it, e.g. iconv -f latin1 -t utf-8 "
                             f"{Path(name).name} > {Path(name).stem}.utf8{Path(name).suffix}, and name that file"
                             ) from None


def _wait_quietly(run: BuildRun) -> None:
    """Record the failure on the run; a tracking error then must not hide the build's own."""
    try:
        run.wait()
    except Exception as e:  # noqa: BLE001 - the build's error is the one the user needs
        log.warning("could not record the failure in MLflow: %s", e)


if __name__ == "__main__":
    # Ctrl-C / SIGTERM (`ray job stop`): the build stops where it is (Ray's tasks cancelled as Ray goes down), its
    # run ends KILLED, one line says how to resume; exit 130 / 143, no traceback. A second signal exits at once.
    interrupt.install("build_dataset")
    try:
        code = main()
    except ValueError as e:  # users' mistakes and bad inputs: the message says what to fix, no traceback
        print(f"build_dataset: error: {redact_text(str(e))}", file=sys.stderr)
        code = 2
    except Exception as e:  # a local Ray that could not start: one line, not Ray's traceback
        line = _common.ray_start_failed(e)
        if line is None:
            raise
        print(f"build_dataset: error: {line}", file=sys.stderr, flush=True)
        code = 1
    except KeyboardInterrupt as e:
        print(f"build_dataset: {e or 'interrupted'}; its MLflow run (if it had begun) ended KILLED. To resume, run "
              "the same command again: finished units are kept", file=sys.stderr, flush=True)
        code = interrupt.exit_code(e)
    _common.exit_now(code)
