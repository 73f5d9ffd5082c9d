"""What the build can tell of its inputs and output before any work starts: a listing, the output folder's names and
the first MiB of a few input files, read in about a second, before Ray or MLflow start. Each finding is one line
naming the file or flag and the fix (a ``ValueError``), or a warning with its figure.

    check_build(...)                   all of it, for one build (what jobs/build_dataset.py calls)
    check_output(output)               a folder holding someone's own files is refused: the build writes beside
                                       them, and the advice to delete the output folder would delete them
    heads.sample_inputs(files, read)   documents and bytes in the head of each sampled input (Parquet: its footer),
                                       a compressed file that is not what its name says named
    heads.check_documents(samples)     plain text with no blank line in its first MiB reads as one document
    heads.estimate_instances(...)      the instances the inputs should make (an estimate, from the samples)
    check_num_shards(n, estimate)      more shards than instances: the rest would be written empty

Why an estimate and not the count: the count is known only after the instances stage, and the instances are cut
into as many pieces as the shards (``pipeline/shards.py``), so a corrected ``--num-shards`` then could not
resume that work. The estimate's error against real builds is in docs/build-checks.md.
"""
from __future__ import annotations

import logging

from corpus.readers import ReadOptions
from corpus.schema import MANIFEST, SHARDS_DIR, VOCAB_FILE, WORK_DIR
from pipeline.inputs import keep_listing, list_inputs
from pipeline.preflight.heads import check_documents, estimate_instances, sample_inputs
from storage.fs import list_names
from storage.lease import OUTPUT_LEASE
from storage.redact import redact_url

log = logging.getLogger(__name__)

# --num-shards above this many times the estimated instances is refused (shards past the count are empty), above
# WARN_SHARDS_OVER warned: the estimate's error on the corpora it was measured on is well inside both.
REFUSE_SHARDS_OVER = 1.5
WARN_SHARDS_OVER = 0.7
_OURS = {MANIFEST, VOCAB_FILE, SHARDS_DIR, WORK_DIR, OUTPUT_LEASE, "reports"}  # reports/: curation's report


def check_output(output: str, endpoint_url: str | None = None) -> None:
    """Refuse an output folder that holds files a build does not write (hidden names aside)."""
    names = list_names(output, endpoint_url)
    foreign = [n for n in names if n not in _OURS and not n.startswith((".", "_write_probe-"))
               and ".tmp-" not in n]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(f"--output {redact_url(output)} already holds files that a build does not write ({shown}): "
                         "a build writes manifest.json, vocab.txt, shards/ and _work/ there, and a rerun may be "
                         "told to delete the folder; choose a new or empty folder for --output")


def check_num_shards(num_shards: int | None, estimate: int | None) -> str | None:
    """A ValueError when --num-shards is far over the estimated instances (empty shards), a warning (returned)
    when near it; None when fine or not asked."""
    if num_shards is None or estimate is None or num_shards <= WARN_SHARDS_OVER * estimate:
        return None
    room = max(1, int(WARN_SHARDS_OVER * estimate))
    what = (f"--num-shards {num_shards} for about {estimate:,} instances (estimated from the inputs' first MiB and "
            "sizes)")
    if num_shards > REFUSE_SHARDS_OVER * estimate:
        raise ValueError(f"{what}: shards past the instance count would be written empty, one at a time; pass "
                         f"--num-shards {room} or fewer, or leave it out (one shard per ~128 MiB of Parquet)")
    return f"{what}: some shards may be empty; pass --num-shards {room} or fewer to be sure"


def check_build(inputs: list[str], output: str, read: ReadOptions, max_seq_length: int, short_seq_prob: float,
                dupe_factor: int, num_shards: int | None, endpoint_url: str | None = None) -> list[str]:
    """All of the above for one build, in about a second: ValueError for what must not be built, the warnings
    (logged here too) for what may be."""
    files, ignored = list_inputs(inputs, endpoint_url)
    check_output(output, endpoint_url)
    samples = sample_inputs(files, read, endpoint_url)
    check_documents(samples)
    warnings = [w for w in [check_num_shards(num_shards, estimate_instances(
        samples, files, max_seq_length, short_seq_prob, dupe_factor))] if w]
    for w in warnings:
        log.warning("%s", w)
    keep_listing(inputs, endpoint_url, files, ignored)  # listed once per build: the build that follows takes it
    return warnings
