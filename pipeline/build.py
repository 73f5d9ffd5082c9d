"""The dataset build: config, resumable orchestration of the steps, and the manifest (written last).

    plan (inputs -> fixed units) -> pieces (big compressed inputs) -> [vocab] -> docs stage -> pool -> instances
    stage -> shards stage -> manifest

An ``Executor`` runs a stage's pending units: ``LocalExecutor`` is a plain loop over the step functions (tests,
debugging), ``pipeline.ray_data.RayDataExecutor`` runs the same functions as Ray Data stages. Output never depends
on which one ran, nor on CPUs, nodes or blocks: ids and seeds come from the files, the order from instance keys.

Resume: ``_work/config.json`` holds the config hash and the input stamps, taken at start. Every unit of every stage
commits atomically with a completion marker, so a killed build rerun with the same command redoes only what has no
marker. A finished build (manifest present, same hash) is left alone; a different config is refused.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import pickle
import time
from collections import Counter
from typing import Any, Protocol

from pipeline.instances import InstanceConfig, RandomDocPool, VocabInfo
from pipeline.pieces import PieceContext, PiecesStep, done_pieces, piece_units, plan_pieces
from pipeline.readers import ReadOptions, ReadReport, Unit, plan_units
from pipeline.schema import (FORMAT, FORMAT_VERSION, MANIFEST, SHARDS_DIR, VOCAB_FILE, WORK_DIR, config_hash,
                             token_dtype, validate_manifest)
from pipeline.shards import ShardTask, bucket_bits, plan_shards
from pipeline.steps import StepContext, bucket_sources, instances_step, load_pool, read_split, select_pool, \
    shard_step, tokenize_commit
from pipeline.storage import (check_writable, exists, expand_inputs, join, list_names, read_bytes, read_json,
                              remove_stale_temps, remove_tree, write_bytes_atomic, write_json_atomic)
from pipeline.vocab import DEFAULT_SAMPLE_BYTES, VocabContext, VocabStep, VocabTask, sample_blocks

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything that decides the dataset's content (``identity``) plus where it goes."""

    inputs: tuple[str, ...]
    output: str
    read: ReadOptions = ReadOptions()
    instances: InstanceConfig = InstanceConfig()
    vocab: str | None = None
    vocab_size: int = 30522  # only used to train a vocabulary when none is given
    min_frequency: int = 2
    vocab_sample_bytes: int = DEFAULT_SAMPLE_BYTES  # the trained vocabulary's sample (0: the whole corpus)
    do_lower_case: bool = True
    dupe_factor: int = 10
    num_shards: int = 16
    pool_tokens: int = 4_000_000
    unit_bytes: int = 4 << 20
    endpoint_url: str | None = None

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("no inputs: pass at least one --input")
        if not self.output:
            raise ValueError("no output: pass --output")
        if self.dupe_factor < 1:
            raise ValueError(f"--dupe-factor {self.dupe_factor}: use at least 1 (the reference uses 10)")
        if self.num_shards < 1:
            raise ValueError(f"--num-shards {self.num_shards}: use at least 1")
        if self.pool_tokens < 1:
            raise ValueError(f"--pool-tokens {self.pool_tokens}: use a positive token budget")
        if self.vocab_sample_bytes < 0:
            raise ValueError(f"vocab_sample_bytes {self.vocab_sample_bytes}: use 0 (whole corpus) or a byte budget")
        if self.unit_bytes < 1024:
            raise ValueError(f"unit_bytes {self.unit_bytes}: use at least 1024")

    def identity(self) -> dict[str, Any]:
        """The config that decides the content: not where it is written or which endpoint serves it."""
        d = dataclasses.asdict(self)
        d.pop("output")
        d.pop("endpoint_url")
        return d

    def step_context(self, vocab_size: int) -> StepContext:
        return StepContext(work=join(self.output, WORK_DIR), output=self.output, read=self.read,
                           instances=self.instances, do_lower_case=self.do_lower_case, dupe_factor=self.dupe_factor,
                           vocab_size=vocab_size, pool_tokens=self.pool_tokens, endpoint_url=self.endpoint_url)


class Executor(Protocol):
    def docs(self, units: list[Unit], ctx: StepContext, vocab_tokens: list[str]) -> list[dict]: ...

    def instances(self, uids: list[str], ctx: StepContext, pool: RandomDocPool, vocab_tokens: list[str],
                  bits: int) -> list[dict]: ...

    def shards(self, tasks: list[ShardTask], ctx: StepContext, sources: dict) -> list[dict]: ...


class LocalExecutor:
    """A plain loop over the step functions, no Ray: what tests and debugging use."""

    def docs(self, units: list[Unit], ctx: StepContext, vocab_tokens: list[str]) -> list[dict]:
        from pipeline.tokenize import WordPieceEncoder

        encoder = WordPieceEncoder(tokens=vocab_tokens, do_lower_case=ctx.do_lower_case)
        return [tokenize_commit(read_split(u, ctx), ctx, encoder) for u in units]

    def instances(self, uids: list[str], ctx: StepContext, pool: RandomDocPool, vocab_tokens: list[str],
                  bits: int) -> list[dict]:
        vocab = VocabInfo.from_tokens(vocab_tokens)
        return [instances_step(uid, ctx, pool, vocab, bits) for uid in uids]

    def shards(self, tasks: list[ShardTask], ctx: StepContext, sources: dict) -> list[dict]:
        return [shard_step(t, ctx, sources) for t in tasks]


def _read_markers(folder: str, endpoint_url: str | None) -> dict[str, dict]:
    names = [n for n in list_names(folder, endpoint_url) if n.endswith(".done.json")]
    return {n[: -len(".done.json")]: read_json(join(folder, n), endpoint_url) for n in names}


def _tokens_of(data: bytes) -> list[str]:
    tokens = [line.rstrip("\r") for line in data.decode("utf-8").split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


def _step_batch(batch: dict[str, Any], step) -> dict[str, list]:
    """Ray Data batch function running ``step(item)`` on pickled items (for today's RayDataExecutor)."""
    out = [step(pickle.loads(base64.b64decode(item))) for item in batch["item"]]
    return {"marker": [json.dumps(base64.b64encode(pickle.dumps(m)).decode()) for m in out]}


def _map(executor: Executor, step, items: list) -> list:
    """``[step(item) for item in items]`` as tasks: the executor's generic ``map(step, items)`` when it has one,
    Ray Data tasks on today's RayDataExecutor, else a plain loop. Markers come in any order."""
    if not items:
        return []
    if hasattr(executor, "map"):
        return list(executor.map(step, items))
    if hasattr(executor, "_run"):
        executor._wait()
        encoded = [{"item": base64.b64encode(pickle.dumps(item)).decode()} for item in items]
        return [pickle.loads(base64.b64decode(m)) for m in executor._run(encoded, _step_batch, {"step": step}, None)]
    return [step(item) for item in items]


def _inputs_stage(cfg: BuildConfig, files: list, executor: Executor, report: ReadReport,
                  vocab_bytes: bytes | None) -> tuple[list[Unit], bytes]:
    """The docs stage's units and the vocabulary: big compressed inputs are cut into pieces first (one task per
    file, resumable by marker), then without --vocab one task trains it on a seeded sample (pipeline/vocab.py).
    The driver only plans from metadata here: it reads no corpus bytes."""
    work, ep = join(cfg.output, WORK_DIR), cfg.endpoint_url
    pctx = PieceContext(work, cfg.unit_bytes, cfg.read, ep)
    tasks = plan_pieces(files, cfg.read, cfg.unit_bytes, ep)
    done = done_pieces(pctx) if tasks else {}
    pending = [t for t in tasks if t.index not in done]
    if tasks:
        log.info("pieces: %d big compressed inputs (%d already cut)", len(tasks), len(tasks) - len(pending))
    for m in _map(executor, PiecesStep(pctx), pending):
        done[m.index] = m
    markers = [done[t.index] for t in tasks]
    for m in markers:
        report.bad_files.update(m.bad_files)
    units = plan_units(files, cfg.read, cfg.unit_bytes, ep, report, exclude={t.path for t in tasks})
    units = sorted(units + piece_units(markers, pctx), key=lambda u: u.uid)
    if vocab_bytes is None:
        vocab_url = join(work, VOCAB_FILE)
        if not exists(vocab_url, ep):
            blocks, nbytes = sample_blocks(units, {f.path: f.size for f in files}, cfg.unit_bytes,
                                           cfg.vocab_sample_bytes, cfg.instances.seed)
            log.info("training a %d-entry WordPiece vocabulary on a %.1f MB sample", cfg.vocab_size, nbytes / 1e6)
            vctx = VocabContext(cfg.read, cfg.vocab_size, cfg.min_frequency, cfg.do_lower_case, ep, work)
            _map(executor, VocabStep(vctx), [VocabTask(blocks, vocab_url, nbytes)])
        vocab_bytes = read_bytes(vocab_url, ep)
    return units, vocab_bytes


def _check_state(cfg: BuildConfig, chash: str, inputs: list[dict]) -> None:
    """Refuse to mix two configs (or changed inputs) in one output; record ours for a later resume."""
    out, ep = cfg.output, cfg.endpoint_url
    state_url = join(out, WORK_DIR, "config.json")
    if exists(state_url, ep):
        state = read_json(state_url, ep)
        if state["config_hash"] != chash:
            raise ValueError(
                f"{out} holds an unfinished build with a different config (hash {state['config_hash'][:12]} vs "
                f"{chash[:12]}). Rerun with the same flags to resume it, or use another --output, or delete "
                f"{join(out, WORK_DIR)} to start over.")
        if state["inputs"] != inputs:
            raise ValueError(f"the inputs changed since the unfinished build in {out} started (size/etag/mtime);"
                             f" delete {join(out, WORK_DIR)} to start over, or restore the inputs")
        log.info("resuming the unfinished build in %s", out)
        return
    if list_names(join(out, SHARDS_DIR), ep):
        raise ValueError(f"{out} already holds shards but no manifest and no resumable state: use an empty --output")
    write_json_atomic(state_url, {"config_hash": chash, "config": cfg.identity(), "inputs": inputs}, ep)


def build(cfg: BuildConfig, executor: Executor | None = None) -> dict[str, Any]:
    """Run (or resume, or confirm) the build; returns the manifest."""
    executor = executor or LocalExecutor()
    out, ep = cfg.output, cfg.endpoint_url
    t0 = time.time()
    # Everything that can fail cheaply fails here, before any work: inputs, vocab, output, config clashes.
    files = expand_inputs(list(cfg.inputs), ep)
    inputs = [{"path": f.path, "size": f.size, "etag": f.etag, "mtime": f.mtime} for f in files]
    vocab_bytes = None
    if cfg.vocab:
        try:
            vocab_bytes = read_bytes(cfg.vocab, ep)
        except FileNotFoundError as e:
            raise ValueError(f"--vocab {cfg.vocab} does not exist: pass a BERT vocab.txt, or omit --vocab to train"
                             " one on the input") from e
    ident = cfg.identity() | {"vocab_sha256": hashlib.sha256(vocab_bytes).hexdigest() if vocab_bytes else None}
    chash = config_hash(ident)
    check_writable(out, ep)
    manifest_url = join(out, MANIFEST)
    if exists(manifest_url, ep):
        m = read_json(manifest_url, ep)
        if m.get("config_hash") != chash:
            raise ValueError(f"{out} already holds a finished dataset built with a different config (hash "
                             f"{str(m.get('config_hash'))[:12]} vs {chash[:12]}): use another --output")
        log.info("%s is already complete with this config: nothing to do", out)
        remove_tree(join(out, WORK_DIR), ep)  # a kill between manifest and clean-up leaves it behind
        return m
    _check_state(cfg, chash, inputs)

    report = ReadReport()
    units, vocab_bytes = _inputs_stage(cfg, files, executor, report, vocab_bytes)
    tokens = _tokens_of(vocab_bytes)
    vocab = VocabInfo.from_tokens(tokens)
    ctx = cfg.step_context(vocab.vocab_size)

    done = _read_markers(ctx.url("docs"), ep)
    pending = [u for u in units if u.uid not in done]
    log.info("docs stage: %d units (%d already done)", len(units), len(units) - len(pending))
    for m in executor.docs(pending, ctx, tokens):
        done[m["uid"]] = m
    doc_markers = [done[u.uid] for u in units]
    totals, dropped, bad_files = _doc_totals(doc_markers, report, cfg.read.on_error)
    if totals["documents"] == 0:
        raise ValueError(f"no documents with tokens in {list(cfg.inputs)} (dropped: {dict(dropped)}); check the"
                         " --format/--text-field and the inputs")

    expected = cfg.dupe_factor * totals["tokens"] // max(1, cfg.instances.max_seq_length - 3) + 1
    bits = bucket_bits(expected, cfg.num_shards)
    selection = select_pool(doc_markers, cfg.pool_tokens)
    pool = load_pool(ctx, selection)
    log.info("random-next pool: %d documents (%d tokens)", len(pool), len(pool.tokens))

    done_i = {k: m for k, m in _read_markers(ctx.url("instances"), ep).items() if m.get("bits") == bits}
    pending_i = [u.uid for u in units if u.uid not in done_i]
    log.info("instances stage: %d units (%d already done)", len(units), len(units) - len(pending_i))
    for m in executor.instances(pending_i, ctx, pool, tokens, bits):
        done_i[m["uid"]] = m
    inst_markers = [done_i[u.uid] for u in units]
    bucket_rows: Counter = Counter()
    for m in inst_markers:
        for b, _, n in m["buckets"]:
            bucket_rows[b] += n
    tasks = plan_shards(dict(bucket_rows), cfg.num_shards)

    done_s = {int(k): m for k, m in _read_markers(ctx.url("shards"), ep).items()}
    pending_s = [t for t in tasks if t.index not in done_s]
    log.info("shards stage: %d shards (%d already done)", len(tasks), len(tasks) - len(pending_s))
    for m in executor.shards(pending_s, ctx, bucket_sources(inst_markers, ctx)):
        done_s[m["index"]] = m
    shards = [{"file": done_s[t.index]["file"], "rows": done_s[t.index]["rows"]} for t in tasks]

    write_bytes_atomic(join(out, VOCAB_FILE), vocab_bytes, ep)
    remove_stale_temps(join(out, SHARDS_DIR), ep)
    hist: Counter = Counter()
    for m in inst_markers:
        hist.update({k: v for k, v in m["seq_len_histogram"].items()})
    totals |= {
        "instances": sum(m["instances"] for m in inst_markers),
        "random_next": sum(m["random_next"] for m in inst_markers),
        "masked_lm_positions": sum(m["masked"] for m in inst_markers),
        "dropped": dict(sorted(dropped.items())),
    }
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "config": ident, "config_hash": chash,
        "vocab": {"file": VOCAB_FILE, "sha256": hashlib.sha256(vocab_bytes).hexdigest(), "size": vocab.vocab_size,
                  "do_lower_case": cfg.do_lower_case, "trained": cfg.vocab is None},
        "token_dtype": str(token_dtype(vocab.vocab_size)), "max_seq_length": cfg.instances.max_seq_length,
        "inputs": inputs, "skipped_files": bad_files,
        "shards": shards, "totals": totals,
        "seq_len_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "random_pool": {"documents": len(pool), "tokens": int(len(pool.tokens))},
        "build_seconds": round(time.time() - t0, 2),
    }
    manifest = json.loads(json.dumps(manifest))  # what readers will see (tuples become lists)
    validate_manifest(manifest, "the new manifest")
    write_json_atomic(manifest_url, manifest, ep)  # last: its presence means the dataset is complete
    remove_tree(join(out, WORK_DIR), ep)
    log.info("built %s: %d instances in %d shards", out, totals["instances"], len(shards))
    return manifest


def _doc_totals(markers: list[dict], report: ReadReport, on_error: str) -> tuple[dict, Counter, dict[str, str]]:
    """Sum the docs markers; find files that gave nothing at all (empty after decompression, whitespace only)."""
    from pipeline.readers import InputError

    dropped: Counter = Counter()
    bad_files = dict(report.bad_files)
    per_file: Counter = Counter()
    for m in markers:
        dropped.update(m["dropped"])
        bad_files.update(m["bad_files"])
        per_file[m["path"]] += m["read_documents"] + sum(m["dropped"].values())
    for path, n in per_file.items():
        if n == 0 and path not in bad_files:
            if on_error == "fail":
                raise InputError(f"input {path}: no documents in it (empty after decompression?) [empty_file]."
                                 " Fix or remove the file, or pass --on-error skip.")
            bad_files[path] = "empty_file"
    for reason in bad_files.values():
        dropped[reason] += 1  # file-level reasons count files
    totals = {k: sum(m[k] for m in markers) for k in ("documents", "sentences", "tokens")}
    return totals, dropped, bad_files
