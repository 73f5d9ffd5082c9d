"""`python -m pretraining.batches`: the training loader's data order, replayed without training.

    python -m pretraining.batches --data DATASET --batch-size 256 --num-workers 8 --seed 12345 --steps 1:60
    python -m pretraining.batches --run STORAGE/RUN_NAME --step 1234 --text      # a run's own settings

One line per optimizer step: `step N: <digest>`, 16 hex digits of the sha256 of the sorted example ids (`shard <<
32 | row`, `pretraining.order`) that the ranks' micro-batches of that step hold, every rank's share replayed with the
loader's own code and joined. The digests are the same for any `--num-workers` (the global data order) and differ
with `--seed`, the dataset, `--batch-size` or the bucketing and packing flags. `--ids` lists a step's examples
(`shard:row`, the shard's index in the manifest), `--text` decodes them too (the original tokens, masks undone).

Spike forensics: `--run` reads the data settings, seed and vocabulary of a run's newest checkpoint that its job
committed under the run's writer lease and whose files still have the committed digest (what a resume would take;
local or a URL), says which, and prints the steps asked for with them. Every field is checked, and the dataset is
fetched only from the absolute URL the committed state names (its manifest's digest must match).
`--step N` is the N-th batch of the data order, which is the run's
step N until a rollback: a run that rolled back trains, after it, the batches past every one it had seen, so its
step N reads batch N + the batches skipped before it (the checkpoint's `skipped_batches`). The divergence guard's
rollback line names the examples of the batch that tripped it, and this command with that batch's number.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterator

import numpy as np

from corpus.rng import DEFAULT_SEED
from corpus.schema import read_manifest
from pretraining import order
from pretraining.loader import DataConfig, rank_steps
from storage.fs import filesystem_for, join, list_names, read_bytes
from storage.lease import lease_url_beside
from storage.lease_store import store_for
from storage.untrusted import read_bounded
from training.checkpoint import COMMITS

MAX_TRAIN_STATE_BYTES = 64 << 20  # as training.checkpoint reads it: a run folder may be anyone's


@dataclasses.dataclass(frozen=True)
class Replay:
    """What a replay needs: the data order's settings, the seed, the vocabulary size and the number of workers."""

    data: DataConfig
    """The data order's settings (dataset, global batch, bucketing, masking, packing); `steps` cuts it for `world`
    workers (`DataConfig.for_world`)."""
    seed: int
    """The run's seed (`RuntimeConfig.seed`): the order and the dynamic masks derive from it."""
    vocab_size: int
    """The model's vocabulary size: dynamic masking draws its random tokens below it."""
    world: int = 1
    """Workers whose shares are replayed and joined; the digests are the same for any number."""


def steps(replay: Replay, first: int, last: int) -> Iterator[tuple[int, np.ndarray, order.GlobalBatch]]:
    """(step, the example ids every rank's micro-batches hold, the global batch) for steps first..last (1-based,
    inclusive). Each rank's share comes from the loader's own stream, as a worker of that world would read it."""
    data = replay.data.for_world(replay.world)
    streams = [rank_steps(data, replay.vocab_size, replay.seed, rank, replay.world, first - 1)
               for rank in range(replay.world)]
    for step in range(first, last + 1):
        shares = [next(stream) for stream in streams]
        held = np.concatenate([ids for share in shares for ids in share.examples])
        yield step, held, shares[0].batch


def from_flags(a: argparse.Namespace) -> Replay:
    manifest = read_manifest(a.data, a.endpoint_url)
    micro = a.micro_batch_size or a.batch_size
    data = DataConfig(train=manifest, endpoint_url=a.endpoint_url, micro_batch_size=micro, batch_size=a.batch_size,
                      length_bucketing=a.length_bucketing, length_buckets=a.length_buckets or (),
                      dynamic_masking=a.dynamic_masking, mask_id=manifest.vocab.mask_id,
                      masked_lm_prob=manifest.masked_lm_prob, packing=a.packing, pack_sequences=a.pack_sequences)
    return Replay(data, a.seed, manifest.vocab.size, a.num_workers)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} in a train state: not a number a run writes")


def _int(value: object, where: str, low: int = 0, high: int = 1 << 62) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{where} is {value!r}, not a whole number in [{low}, {high}]")
    return value


def _field(config: dict, default: object, value: object, where: str) -> object:
    """A saved DataConfig field checked against its default's type (a list for a tuple of ints)."""
    if isinstance(default, bool):
        if type(value) is not bool:
            raise ValueError(f"{where} is {value!r}, not true or false")
        return value
    if isinstance(default, int) or default is dataclasses.MISSING:  # the one field without a default is a size
        return _int(value, where)
    if isinstance(default, float):
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= 1:
            raise ValueError(f"{where} is {value!r}, not a finite number in [0, 1]")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, list):
            raise ValueError(f"{where} is {value!r}, not a list of whole numbers")
        return tuple(_int(v, where, 1, 1 << 20) for v in value)
    raise ValueError(f"{where}: a field this version does not replay")


def _data_url(url: object, run_url: str) -> str:
    """The dataset a run read: an absolute local path or a URL, with no '.' or '..' part (a crafted state must not
    send the operator's credentials somewhere the run never read)."""
    if not isinstance(url, str) or not url or any(ord(c) < 32 for c in url):
        raise ValueError(f"{run_url}: the train state names no dataset")
    path = url.split("://", 1)[1] if "://" in url else url
    if ("://" not in url and not url.startswith("/")) or any(part in (".", "..") for part in path.split("/")):
        raise ValueError(f"{run_url}: the train state names the dataset {url!r}, not an absolute path or URL without"
                         " '.' or '..' parts")
    return url


def tree_digest(url: str, endpoint_url: str | None) -> str:
    """``training.checkpoint.checkpoint_digest`` of a checkpoint folder at ``url`` (local or a URL), streamed: the
    same ``sha256:<hex>`` over every file's relative name, size and bytes, in the same order (by path parts)."""
    fs, root = filesystem_for(url, endpoint_url)
    root = root.rstrip("/")
    files = [p for p, info in fs.find(root, detail=True).items() if info.get("type", "file") != "directory"]
    rels = sorted((p[len(root):].lstrip("/") for p in files), key=lambda r: tuple(r.split("/")))
    total = hashlib.sha256()
    for rel in rels:
        h, size = hashlib.sha256(), 0
        with fs.open(f"{root}/{rel}", "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
                size += len(chunk)
        total.update(f"{rel}\0{size}\0{h.hexdigest()}\n".encode())
    return "sha256:" + total.hexdigest()


def committed_checkpoint(run_url: str, endpoint_url: str | None) -> tuple[str, int]:
    """(name, step) of the newest checkpoint of the run that its job committed under its writer lease (the lease
    record beside the run's folder) and whose files still have the committed digest: what a resume would take.
    ValueError (one line) when there is none."""
    names = [n for n in list_names(run_url, endpoint_url) if n.startswith("checkpoint-")]
    if not names:
        raise ValueError(f"{run_url} holds no checkpoint-* folder: give the run's folder, STORAGE/RUN_NAME")
    got = store_for(lease_url_beside(run_url), endpoint_url).read()
    commits = ((got[0].get("commits") or {}).get(COMMITS) or []) if got is not None else []
    entries = [e for e in commits if isinstance(e, dict) and e.get("name") in names
               and isinstance(e.get("digest"), str) and type(e.get("step")) is int]
    if not entries:
        raise ValueError(f"{run_url}: none of its checkpoint-* folders was committed by its job (no entry in "
                         f"{lease_url_beside(run_url)}): nothing a resume would take, nothing to replay")
    for e in sorted(entries, key=lambda e: e["step"], reverse=True):
        if tree_digest(join(run_url, e["name"]), endpoint_url) == e["digest"]:
            return e["name"], e["step"]
        sys.stderr.write(f"pretraining.batches: not replaying {e['name']}: its files differ from what was committed"
                         "; trying an older one\n")
    raise ValueError(f"{run_url}: no committed checkpoint still has the files that were committed: nothing to replay")


def from_run(run_url: str, endpoint_url: str | None, world: int | None) -> tuple[Replay, dict]:
    """A run's replay from its newest committed, verified checkpoint's train_state.json (and that state), on the
    run's last world size unless `world` is given. Every field is checked before anything is fetched."""
    name, step = committed_checkpoint(run_url, endpoint_url)
    where = join(run_url, name, "train_state.json")
    try:
        state = json.loads(read_bounded(where, MAX_TRAIN_STATE_BYTES, endpoint_url, "train state"),
                           parse_constant=_refuse_constant)
        config, saved = state["config"], state["config"]["data"]
        if _int(state["step"], "step") != step:
            raise ValueError(f"its step {state['step']} is not the committed {step}")
        train = saved["train"]
        url, digest = _data_url(train["url"], run_url), train["sha256"]
        if not isinstance(digest, str) or not digest:
            raise ValueError("the dataset's digest is missing")
        defaults = {f.name: f.default for f in dataclasses.fields(DataConfig)}
        kwargs = {k: _field(saved, defaults[k], v, f"config.data.{k}") for k, v in saved.items()
                  if k in defaults and k not in ("train", "endpoint_url")}
        seed = _int(config["runtime"]["seed"], "config.runtime.seed")
        vocab_size = _int(config["model"]["bert"]["vocab_size"], "config.model.bert.vocab_size", 1, 1 << 24)
        world_size = world or _int(state["world_size"], "world_size", 1, 1 << 20)
        skipped = state.get("guard", {}).get("skipped_batches", 0)
        _int(skipped, "guard.skipped_batches")
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise ValueError(f"{where}: {what}: not a train state this tool wrote; nothing replayed") from None
    sys.stderr.write(f"pretraining.batches: replaying with the settings of {name} (step {step}), committed by the"
                     " run's job and verified\n")
    manifest = read_manifest(url, endpoint_url)
    if manifest.sha256 != digest:
        raise ValueError(f"{url} changed since the run read it (its manifest's digest differs): "
                         "its batches cannot be replayed")
    data = DataConfig(train=manifest, endpoint_url=endpoint_url, **kwargs)
    return Replay(data, seed, vocab_size, world_size), state


def decode(rows, i: int, vocab: list[str]) -> str:
    """Row i's original text (its masked positions restored), WordPiece pieces joined. A segment may start inside a
    word: a `##` piece right after [CLS] or [SEP] is shown as it is, not glued to the special token."""
    ids = rows.ids[rows.ids_off[i]:rows.ids_off[i + 1]].copy()
    ids[rows.pos[rows.pos_off[i]:rows.pos_off[i + 1]]] = rows.lab[rows.pos_off[i]:rows.pos_off[i + 1]]
    words: list[str] = []
    for piece in (vocab[t] if 0 <= t < len(vocab) else f"<{t}>" for t in ids):
        if piece.startswith("##") and words and not (words[-1].startswith("[") and words[-1].endswith("]")):
            words[-1] += piece[2:]
        else:
            words.append(piece)
    return " ".join(words)


def show(replay: Replay, first: int, last: int, ids: bool, text: bool, write: Callable[[str], object]) -> None:
    vocab = read_bytes(replay.data.train.vocab.url, replay.data.endpoint_url).decode("utf-8").splitlines() \
        if text else []
    for step, held, batch in steps(replay, first, last):
        write(f"step {step}: {order.digest(held)}\n")
        if not (ids or text):
            continue
        index = np.arange(len(batch.rows)) if batch.packs is None else np.concatenate(batch.packs)
        part = batch.rows.take(index[np.argsort(batch.rows.example[index], kind="stable")])
        rows = batch.materialize(part) if text else part  # planned rows (indexed shards) are read for --text only
        for i in range(len(part)):
            shard, row = order.split_example(part.example[i])
            write(f"  {int(shard)}:{int(row)}" + (f"  {decode(rows, i, vocab)}" if text else "") + "\n")


def _span(text: str) -> tuple[int, int]:
    first, _, last = text.partition(":")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or A:B (1-based optimizer steps)") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: steps count from 1, and A <= B")
    return a, b


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pretraining.batches", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="dataset directory written by jobs/build_dataset.py (local or a URL)")
    p.add_argument("--run", metavar="STORAGE/RUN", help="a run's checkpoint folder: replay with its own settings")
    p.add_argument("--steps", "--step", dest="steps", type=_span, default=(1, 10), help="N or A:B (1-based)")
    # The data flags of jobs/pretrain.py, with its defaults: DataConfig's fields' (read here, not written again;
    # pretraining cannot import jobs._fields, which gives the job's flags their help too) and the run's seed.
    data = {f.name: f.default for f in dataclasses.fields(DataConfig)}
    p.add_argument("--batch-size", type=int, default=256, help="GLOBAL rows per optimizer step (default: 256, "
                   "jobs/pretrain.py's default)")
    p.add_argument("--num-workers", type=int, help="workers whose shares are replayed (default 1; --run: the run's)")
    p.add_argument("--micro-batch-size", type=int, help="a worker's largest micro-batch (does not change the order)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--length-bucketing", action=argparse.BooleanOptionalAction, default=data["length_bucketing"])
    p.add_argument("--length-buckets", type=lambda t: tuple(int(x) for x in t.split(",")), help="e.g. 32,64,96,128")
    p.add_argument("--dynamic-masking", action="store_true")
    p.add_argument("--packing", action="store_true")
    p.add_argument("--pack-sequences", type=int, default=data["pack_sequences"])
    p.add_argument("--endpoint-url", help="S3-compatible endpoint of s3:// data or runs")
    p.add_argument("--ids", action="store_true", help="list each step's examples (shard:row)")
    p.add_argument("--text", action="store_true", help="list each step's examples with their text")
    a = p.parse_args(argv)
    if bool(a.data) == bool(a.run):
        p.error("give --data (and the run's data flags) or --run STORAGE/RUN_NAME")
    if a.batch_size < 1 or (a.num_workers is not None and a.num_workers < 1):
        p.error("--batch-size and --num-workers must be >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        if a.run:
            replay, state = from_run(a.run, a.endpoint_url, a.num_workers)
            skipped = int(state.get("guard", {}).get("skipped_batches", 0))
            if skipped:
                sys.stderr.write(f"{a.run} rolled back past {skipped} batches by its checkpoint of step "
                                 f"{state['step']}: a step after a rollback reads batch step + the batches skipped "
                                 "before it\n")
        else:
            replay = dataclasses.replace(from_flags(a), world=a.num_workers or 1)
        show(replay, *a.steps, ids=a.ids, text=a.text, write=sys.stdout.write)
    except ValueError as e:  # a user's mistake: one line
        sys.stderr.write(f"pretraining.batches: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
