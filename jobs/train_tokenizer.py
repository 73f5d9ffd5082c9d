"""Train a WordPiece vocabulary (BERT rules) on a corpus, with the same readers as the dataset build.

    python jobs/train_tokenizer.py --input URL [--input URL ...] --output vocab.txt --vocab-size 30522 [--cased]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterator

from jobs import _common
from pipeline.readers import FORMATS, ON_ERROR, ReadOptions, ReadReport, plan_units, read_unit
from pipeline.storage import expand_inputs, write_bytes_atomic
from pipeline.tokenize import train_wordpiece

log = logging.getLogger("train_tokenizer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # a typo must fail, not match a longer flag
    p.add_argument("--input", action="append", required=True, help="file, directory or glob; repeatable")
    p.add_argument("--output", required=True, help="where to write vocab.txt (path or URL)")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--min-frequency", type=int, default=2)
    case = p.add_mutually_exclusive_group()
    case.add_argument("--do-lower-case", dest="do_lower_case", action="store_true", default=True)
    case.add_argument("--cased", dest="do_lower_case", action="store_false")
    p.add_argument("--format", choices=FORMATS, default="auto")
    p.add_argument("--text-field", default="text")
    p.add_argument("--presplit", action="store_true")
    p.add_argument("--on-error", choices=ON_ERROR, default="fail")
    p.add_argument("--endpoint-url")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _common.setup_logging(args.log_level)
    opts = ReadOptions(fmt=args.format, presplit=args.presplit, text_field=args.text_field, on_error=args.on_error)
    files = expand_inputs(args.input, args.endpoint_url)
    report = ReadReport()
    units = plan_units(files, opts, 1 << 62, args.endpoint_url, report)  # one unit per file: no parallelism here

    def texts() -> Iterator[str]:
        for u in units:
            for doc in read_unit(u, opts, args.endpoint_url, report):
                yield "\n".join(doc.lines)

    tokens = train_wordpiece(texts(), args.vocab_size, args.do_lower_case, args.min_frequency)
    write_bytes_atomic(args.output, ("\n".join(tokens) + "\n").encode(), args.endpoint_url)
    print(json.dumps({"output": args.output, "vocab_size": len(tokens), "files": len(files),
                      "dropped": dict(report.dropped + Counter(report.bad_files.values()))}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"train_tokenizer: error: {e}", file=sys.stderr)
        sys.exit(2)
