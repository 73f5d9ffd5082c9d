"""Train a WordPiece vocabulary (BERT rules) on a corpus, with the same readers and sample as the dataset build.

    python jobs/train_tokenizer.py --input URL [--input URL ...] --output vocab.txt --vocab-size 30522 [--cased]
        [--sample-bytes 268435456 | --sample-bytes 0]

By default it trains on a seeded sample of about 256 MB of text: blocks of --unit-bytes taken in a seeded hash order.
It calls the build's own vocabulary stage (``pipeline.vocab.train_vocab``, as a plain loop in this process):
with the same --unit-bytes and --seed as jobs/build_dataset.py it picks the same sample as a build without --vocab,
so it gives the same vocabulary. --sample-bytes 0 trains on the whole corpus.

Its MLflow run (``tracking.build_run.vocab_run``, in the store the other jobs log to; --no-mlflow for none) holds
the settings, the sample's figures, a description and the vocab.txt.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # `python jobs/X.py` from any shell: find the project; outside its venv, say how in one line
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jobs._preflight import require_project_env

    require_project_env(__file__)

from corpus.readers import FORMATS, ON_ERROR, ReadOptions, ReadReport, plan_units
from jobs import _common
from jobs._fields import add_field, field_help
from pipeline.config import BuildConfig
from pipeline.executor import LocalExecutor
from pipeline.inputs.pieces import input_units
from pipeline.vocab import VocabContext, VocabSample, train_vocab
from storage.fs import expand_inputs
from storage.redact import redact_text
from tracking.build_run import vocab_run
from tracking.store import DEFAULT_EXPERIMENT, check_tracking_reachable, resolve_tracking_uri

log = logging.getLogger("train_tokenizer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_common.HelpFormatter, fromfile_prefix_chars="@",
                                allow_abbrev=False)  # a typo must fail, not match a longer flag
    p.add_argument("--input", action="append", required=True, help="file, directory or glob; repeatable")
    p.add_argument("--output", required=True, help="where to write vocab.txt (path or URL)")
    add_field(p, "--vocab-size", VocabContext, type=int)
    add_field(p, "--min-frequency", VocabContext, type=int)
    add_field(p, "--sample-bytes", VocabSample, type=int)
    # The field it sets (VocabSample.unit_bytes) has no default: the build's is the one that draws the same blocks.
    p.add_argument("--unit-bytes", type=int, default=BuildConfig.unit_bytes, help=field_help(VocabSample, "unit_bytes"))
    add_field(p, "--seed", VocabSample, type=int, help_suffix="(the build's --seed)")
    case = p.add_mutually_exclusive_group()
    add_field(case, "--do-lower-case", VocabContext, action="store_true")
    case.add_argument("--cased", dest="do_lower_case", action="store_false")
    add_field(p, "--format", ReadOptions, "fmt", choices=FORMATS)
    add_field(p, "--text-field", ReadOptions)
    add_field(p, "--presplit", ReadOptions)
    add_field(p, "--on-error", ReadOptions, choices=ON_ERROR)
    p.add_argument("--endpoint-url")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--mlflow-tracking-uri", help="MLflow store (default: MLFLOW_TRACKING_URI, else "
                   "./mlruns/mlflow.db, where the other jobs log too)")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                   help="MLflow experiment (one for the whole pipeline: the build's, pre-training's and "
                        "fine-tuning's runs side by side)")
    p.add_argument("--parent-run-id", help="log this run as a child of that MLflow run")
    p.add_argument("--run-name", help="the MLflow run's name (default: vocab <output file name>)")
    p.add_argument("--no-mlflow", action="store_true", help="log no MLflow run")
    _common.refuse_secrets(p, argv)
    args = p.parse_args(argv)
    if args.sample_bytes < 0:
        p.error("--sample-bytes must be 0 (whole corpus) or a positive byte budget")
    if args.unit_bytes < 1024:
        p.error("--unit-bytes must be at least 1024")
    return args


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = parse_args(argv)
    _common.setup_logging(args.log_level)
    tracking_uri = None if args.no_mlflow else resolve_tracking_uri(args.mlflow_tracking_uri)
    if tracking_uri:
        check_tracking_reachable(tracking_uri)
    opts = ReadOptions(fmt=args.format, presplit=args.presplit, text_field=args.text_field, on_error=args.on_error)
    files = expand_inputs(args.input, args.endpoint_url)
    report = ReadReport()
    executor = LocalExecutor()
    with tempfile.TemporaryDirectory(prefix="vocab-work-") as work:
        if args.sample_bytes:  # blocks of big compressed files come from their pieces, as in the build
            units = input_units(files, opts, args.unit_bytes, work, executor, report, args.endpoint_url)
        else:  # the whole corpus: one unit per file, read straight through
            units = plan_units(files, opts, 1 << 62, args.endpoint_url, report)
        ctx = VocabContext(opts, args.vocab_size, args.min_frequency, args.do_lower_case, args.endpoint_url, work)
        marker = train_vocab(files, units, ctx, VocabSample(args.unit_bytes, args.sample_bytes, args.seed),
                             args.output, executor)
    dropped = dict(marker.dropped)
    for reason in report.bad_files.values():
        dropped[reason] = dropped.get(reason, 0) + 1
    run_id = None
    if tracking_uri:
        params = {k.replace("_", "-"): v for k, v in vars(args).items()
                  if v is not None and k not in ("mlflow_tracking_uri", "parent_run_id", "no_mlflow", "log_level")}
        params["input"] = ", ".join(args.input)
        run = vocab_run(tracking_uri, args.experiment, args.run_name or f"vocab {Path(args.output).name}", params,
                        marker, started, time.time(), parent_run_id=args.parent_run_id,
                        tags={"job": "train_tokenizer"}, vocab_file=args.output)
        run_id = run.run_id
    print(json.dumps({"output": args.output, "vocab_size": marker.vocab_size, "files": len(files),
                      "sampled_blocks": marker.blocks, "sampled_bytes": marker.sampled_bytes,
                      "documents": marker.documents,
                      "dropped": dropped, "mlflow_run_id": run_id}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"train_tokenizer: error: {redact_text(str(e))}", file=sys.stderr)
        sys.exit(2)
