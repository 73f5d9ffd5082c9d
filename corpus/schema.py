"""The dataset contract between the build and pre-training: Parquet schemas and the manifest (single source of truth).

See docs/architecture.md. Token ids are ``uint16`` when the vocabulary has at most 65,536 entries (ids up to
65,535), else ``uint32``; rows are unpadded; ``a_length`` rebuilds the segment ids
(``token_type_ids[i] = 0 if i < a_length + 2 else 1``). The build makes one frozen ``Manifest`` and writes it
(``Manifest.to_dict``, checked by ``validate_manifest``, ``pipeline/manifest.py``); consumers read it with
``read_manifest`` (``parse_manifest``), which gives the same record back. Nothing outside this module reads or
writes the manifest's keys.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from storage.fs import absolute, join
from storage.untrusted import check_relative_name, read_bounded

FORMAT = "bert-pretrain-dataset"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VOCAB_FILE = "vocab.txt"
SHARDS_DIR = "shards"
WORK_DIR = "_work"
UINT16_MAX_VOCAB = 65536  # ids 0..65535 fit uint16

# A manifest or a vocabulary past these was not written by the build (a manifest of 100,000 shards is ~10 MB, the
# largest BERT vocabularies ~1 MB): refused before it is read, since a dataset folder may be anyone's.
MAX_MANIFEST_BYTES = 64 << 20
MAX_VOCAB_BYTES = 64 << 20

REQUIRED_MANIFEST_KEYS = ("format", "format_version", "config", "config_hash", "vocab", "token_dtype",
                          "max_seq_length", "inputs", "shards", "totals", "seq_len_histogram")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= UINT16_MAX_VOCAB else np.dtype(np.uint32)


def _arrow(dtype: np.dtype) -> pa.DataType:
    return pa.uint16() if np.dtype(dtype) == np.uint16 else pa.uint32()


# The shards' columns, in file order: what the build writes and the training loader reads.
SHARD_COLUMNS = ("input_ids", "a_length", "masked_lm_positions", "masked_lm_ids", "next_sentence_label")


def instance_schema(vocab_size: int) -> pa.Schema:
    """The schema of the output shards."""
    tok = _arrow(token_dtype(vocab_size))
    types = (pa.list_(tok), pa.int16(), pa.list_(pa.uint16()), pa.list_(tok), pa.int8())
    return pa.schema(list(zip(SHARD_COLUMNS, types, strict=False)))


def work_instance_schema(vocab_size: int) -> pa.Schema:
    """Instances in _work: the output columns plus the hash ``key`` that orders them globally."""
    return instance_schema(vocab_size).append(pa.field("key", pa.uint64()))


def work_docs_schema(vocab_size: int) -> pa.Schema:
    """Tokenized documents in _work: one row per document, its random-next pool hash, its sentences as id lists."""
    return pa.schema([("doc_id", pa.string()), ("pool_hash", pa.uint64()),
                      ("sentences", pa.list_(pa.list_(_arrow(token_dtype(vocab_size)))))])


def shard_name(i: int, n: int) -> str:
    return f"{SHARDS_DIR}/part-{i:05d}-of-{n:05d}.parquet"


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a config dict (sorted keys, no whitespace)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


_HEX = frozenset("0123456789abcdef")


def _check_shard_digests(s: dict[str, Any], where: str) -> None:
    """The optional keys a shard entry has since the build writes a sidecar index (corpus/shard_index.py): all four
    or none (a dataset built before), each of its type; the index's name stays inside the dataset folder."""
    keys = ("sha256", "bytes", "index", "index_sha256")
    present = [k for k in keys if k in s]
    if not present:
        return
    if len(present) != len(keys):
        raise ValueError(f"{where}: shard {s.get('file')!r} has {present} but not all of {list(keys)}; "
                         "rebuild it with jobs/build_dataset.py")
    for k in ("sha256", "index_sha256"):
        if not isinstance(s[k], str) or len(s[k]) != 64 or not set(s[k]) <= _HEX:
            raise ValueError(f"{where}: shard {s.get('file')!r} {k} is not a sha256 hex digest")
    if not isinstance(s["bytes"], int) or isinstance(s["bytes"], bool) or s["bytes"] < 0:
        raise ValueError(f"{where}: shard {s.get('file')!r} bytes must be a non-negative integer")
    from corpus.shard_index import index_name

    if s["index"] != index_name(str(s.get("file"))):
        raise ValueError(f"{where}: shard {s.get('file')!r} index {s['index']!r} is not "
                         f"{index_name(str(s.get('file')))!r}; rebuild it with jobs/build_dataset.py")


def validate_manifest(m: dict[str, Any], where: str = "manifest") -> dict[str, Any]:
    """Check the keys and the invariants consumers rely on; raises ValueError saying what is wrong."""
    if not isinstance(m, dict):
        raise ValueError(f"{where} is not a JSON object: not a dataset manifest; rebuild it with jobs/build_dataset.py")
    missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in m]
    if missing:
        raise ValueError(f"{where} lacks {missing}: not a complete dataset; rebuild it with jobs/build_dataset.py")
    if m["format"] != FORMAT or m["format_version"] != FORMAT_VERSION:
        raise ValueError(f"{where}: format {m['format']!r} v{m['format_version']} is not {FORMAT!r} v{FORMAT_VERSION}")
    if not isinstance(m["shards"], list) or not all(isinstance(s, dict) and isinstance(s.get("rows"), int)
                                                    for s in m["shards"]):
        raise ValueError(f"{where}: 'shards' must be a list of {{file, rows}}; rebuild it with jobs/build_dataset.py")
    # The names are joined to the dataset's folder and read by every worker: each must stay inside the folder.
    for s in m["shards"]:
        check_relative_name(s.get("file"), where, "shard file")
        _check_shard_digests(s, where)
    check_relative_name(m["vocab"].get("file") if isinstance(m["vocab"], dict) else None, where, "vocab file")
    rows = [s["rows"] for s in m["shards"]]
    if not rows or max(rows) - min(rows) > 1:
        raise ValueError(f"{where}: shards are not balanced (rows {min(rows or [0])}..{max(rows or [0])})")
    if sum(rows) != m["totals"]["instances"]:
        raise ValueError(f"{where}: shard rows {sum(rows)} != totals.instances {m['totals']['instances']}")
    if m["token_dtype"] != str(token_dtype(m["vocab"]["size"])):
        raise ValueError(f"{where}: token_dtype {m['token_dtype']} does not fit vocab size {m['vocab']['size']}")
    return m


@dataclass(frozen=True)
class Shard:
    file: str
    """The shard's path relative to the dataset folder, e.g. shards/part-00000-of-00016.parquet (as the manifest
    stores it, so a dataset folder can be moved)."""
    url: str
    """``file`` joined to the dataset folder: where workers read it."""
    rows: int
    """Instances in the shard; shards differ by at most one row (``validate_manifest``)."""
    sha256: str = ""
    """sha256 hex of the whole shard file as the build wrote it; "" for a dataset built before shards had an index
    (corpus/shard_index.py), whose readers then read shards whole and unverified."""
    bytes: int = 0
    """The shard file's size; 0 when ``sha256`` is ""."""
    index_url: str = ""
    """Where the shard's sidecar index is (``corpus.shard_index.index_name``): row lengths, row group spans and
    digests; "" for a dataset built before."""
    index_sha256: str = ""
    """sha256 hex of the index file's bytes; "" for a dataset built before."""

    def entry(self) -> dict[str, Any]:
        """The shard's entry in manifest.json."""
        e: dict[str, Any] = {"file": self.file, "rows": self.rows}
        if self.sha256:
            e |= {"sha256": self.sha256, "bytes": self.bytes, "index": self.index_name,
                  "index_sha256": self.index_sha256}
        return e

    @property
    def index_name(self) -> str:
        """The index's path relative to the dataset folder."""
        from corpus.shard_index import index_name

        return index_name(self.file)


@dataclass(frozen=True)
class Vocab:
    """The vocabulary the ids refer to (read from the dataset's vocab.txt)."""

    url: str
    """Where the dataset's vocab.txt is."""
    size: int
    """Entries in vocab.txt; at most 65,536 keeps the shards' token ids uint16."""
    sha256: str
    """Of vocab.txt's bytes: a model trained on the dataset must use this exact vocabulary."""
    do_lower_case: bool
    """Whether the text was lower-cased (and accents stripped) before WordPiece, as for bert-base-uncased."""
    mask_id: int
    """The id of [MASK] in this vocabulary."""
    trained: bool = False
    """True when the build trained the vocabulary on its input (no ``--vocab`` given)."""


@dataclass(frozen=True)
class Totals:
    """What the build counted over the whole corpus."""

    documents: int
    """Documents kept: read, not dropped, with at least one token."""
    sentences: int
    """Sentences of the kept documents that hold tokens."""
    tokens: int
    """WordPiece tokens of the kept documents, [UNK] included, before instances repeat them over the passes."""
    instances: int
    """Rows over all shards: the training set's size."""
    random_next: int = 0
    """Instances whose B is a random next (``next_sentence_label`` 1); about half by the NSP law."""
    masked_lm_positions: int = 0
    """Masked positions over all instances: the MLM targets."""
    unk_tokens: int = 0
    """[UNK] among ``tokens``: how much of the text the vocabulary cannot represent (``corpus.checks``)."""
    dropped: tuple[tuple[str, int], ...] = ()
    """(reason, records or files) pairs, sorted by reason: what the build left out and why."""

    def to_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "sentences": self.sentences, "tokens": self.tokens,
                "unk_tokens": self.unk_tokens, "instances": self.instances, "random_next": self.random_next,
                "masked_lm_positions": self.masked_lm_positions, "dropped": dict(self.dropped)}

    @classmethod
    def from_dict(cls, t: dict[str, Any]) -> Totals:
        return cls(documents=int(t.get("documents", 0)), sentences=int(t.get("sentences", 0)),
                   tokens=int(t.get("tokens", 0)), instances=int(t["instances"]),
                   random_next=int(t.get("random_next", 0)), masked_lm_positions=int(t.get("masked_lm_positions", 0)),
                   unk_tokens=int(t.get("unk_tokens", 0)),
                   dropped=tuple(sorted((str(k), int(v)) for k, v in t.get("dropped", {}).items())))


def _pairs(histogram: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(k), int(v)) for k, v in histogram.items()))


def _histogram(pairs: tuple[tuple[int, int], ...]) -> dict[str, int]:
    return {str(k): int(v) for k, v in pairs}


@dataclass(frozen=True)
class Manifest:
    """A complete, validated dataset as its consumers need it."""

    url: str
    """The dataset folder (absolute), which the shard and vocabulary names are relative to."""
    sha256: str
    """Of the manifest's canonical JSON (sorted keys): names this exact build."""
    config_hash: str
    """Of the build config: builds of the same config share it, and a rerun resumes only on a match."""
    vocab: Vocab
    """The vocabulary the token ids refer to."""
    max_seq_length: int
    """The build's cap on an instance's tokens, [CLS] and both [SEP] included: the model needs at least this many
    positions."""
    max_predictions: int
    """Most masked positions per sequence (the build's ``max_predictions_per_seq``)."""
    masked_lm_prob: float
    """Share of each sequence's tokens the build masked (the build's ``masked_lm_prob``)."""
    shards: tuple[Shard, ...]
    """The Parquet shards, in order."""
    seq_len_histogram: tuple[tuple[int, int], ...]
    """(length in tokens, rows) pairs, sorted by length."""
    totals: Totals
    """What the build counted over the whole corpus."""
    config: dict[str, Any]
    """The build config as its canonical dict: what ``config_hash`` hashes, enough to rebuild the dataset."""
    inputs: tuple[dict[str, Any], ...] = ()
    """The inputs' stamps at the build's start (path, size, etag, mtime): a rerun on changed inputs is refused."""
    token_dtype: str = "uint16"
    """numpy dtype of the shards' token ids: uint16 up to 65,536 vocabulary entries, else uint32."""
    masked_per_seq_histogram: tuple[tuple[int, int], ...] = ()
    """(masked positions, sequences) pairs, sorted by the count."""
    tokens_per_document_histogram: tuple[tuple[int, int], ...] = ()
    """(tokens, documents) pairs of the kept documents, in power-of-two bins keyed by their lower bound."""
    warnings: tuple[str, ...] = ()
    """The build's warnings (``corpus.checks``), one line each, credentials redacted."""
    skipped_files: tuple[tuple[str, str], ...] = ()
    """(path, reason) pairs of the files left out with ``--on-error skip``."""
    ignored_files: tuple[str, ...] = ()
    """Files of an input folder that are not corpus files by name."""
    random_pool: tuple[tuple[str, float], ...] = ()
    """The random-next pool as (name, value) pairs: corpus_tokens, documents, sample_fraction, tokens (a Bernoulli
    sample of the documents, docs/data.md)."""
    build_seconds: float | None = None
    """Wall-clock seconds of the build, to two decimals; None when not recorded."""
    curation: dict[str, Any] | None = None
    """What curation asked, its reports and their lines by reason, the evaluation sets, the mix's shares
    (pipeline/curation/reports.py); None: the build curated nothing (and its manifest has no such key)."""

    @property
    def shard_urls(self) -> tuple[str, ...]:
        return tuple(s.url for s in self.shards)

    @property
    def shard_rows(self) -> tuple[int, ...]:
        return tuple(s.rows for s in self.shards)

    @property
    def instances(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def seq_lengths(self) -> tuple[int, ...]:
        """The distinct sequence lengths the dataset holds."""
        return tuple(n for n, rows in self.seq_len_histogram if rows)

    @property
    def input_bytes(self) -> int:
        return sum(int(i.get("size") or 0) for i in self.inputs)

    @property
    def dropped(self) -> dict[str, int]:
        return dict(self.totals.dropped)

    def to_dict(self) -> dict[str, Any]:
        """The manifest.json this record is read from (``parse_manifest`` gives the record back; ``url`` and
        ``sha256`` are where and what the file is, not in it)."""
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "config": self.config, "config_hash": self.config_hash,
            "vocab": {"file": self.vocab.url.rsplit("/", 1)[-1], "sha256": self.vocab.sha256, "size": self.vocab.size,
                      "do_lower_case": self.vocab.do_lower_case, "trained": self.vocab.trained},
            "token_dtype": self.token_dtype, "max_seq_length": self.max_seq_length,
            "inputs": [dict(i) for i in self.inputs], "skipped_files": dict(self.skipped_files),
            "shards": [s.entry() for s in self.shards], "totals": self.totals.to_dict(),
            "seq_len_histogram": _histogram(self.seq_len_histogram),
            "masked_per_seq_histogram": _histogram(self.masked_per_seq_histogram),
            "tokens_per_document_histogram": _histogram(self.tokens_per_document_histogram),
            "ignored_files": list(self.ignored_files), "warnings": list(self.warnings),
            "random_pool": dict(self.random_pool), "build_seconds": self.build_seconds,
        } | ({"curation": self.curation} if self.curation is not None else {})

    def digest(self) -> str:
        """sha256 of the canonical JSON of ``to_dict`` (sorted keys): what ``sha256`` holds once written."""
        return manifest_sha256(self.to_dict())


def manifest_sha256(m: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()


def manifest_stamps(url: str, endpoint_url: str | None = None) -> tuple[str, list[dict[str, Any]]] | None:
    """(config_hash, input stamps) of the finished dataset at ``url``, None when there is none: what a rerun of
    the build compares its own against, read without the checks a complete dataset must pass."""
    from storage.fs import exists

    path = join(url, MANIFEST)
    if not exists(path, endpoint_url):
        return None
    m = json.loads(read_bounded(path, MAX_MANIFEST_BYTES, endpoint_url, "manifest"))
    if not isinstance(m, dict):
        raise ValueError(f"{path} is not a JSON object: not a dataset manifest; use another --output")
    return str(m.get("config_hash")), list(m.get("inputs", []))


def _shard(s: dict[str, Any], folder: str) -> Shard:
    if "sha256" not in s:
        return Shard(s["file"], join(folder, s["file"]), int(s["rows"]))
    return Shard(s["file"], join(folder, s["file"]), int(s["rows"]), sha256=s["sha256"], bytes=int(s["bytes"]),
                 index_url=join(folder, s["index"]), index_sha256=s["index_sha256"])


def parse_manifest(m: dict[str, Any], folder: str, vocab_text: str, where: str = "manifest") -> Manifest:
    """A manifest's dict (validated) as the typed record; ``folder`` is the dataset's, ``vocab_text`` its vocab.txt."""
    validate_manifest(m, where)
    tokens = vocab_text.splitlines()
    vocab_url = join(folder, m["vocab"]["file"])
    if len(tokens) != m["vocab"]["size"]:
        raise ValueError(f"{vocab_url} has {len(tokens)} entries, the manifest says {m['vocab']['size']}: "
                         "the dataset folder is damaged; rebuild it")
    if "[MASK]" not in tokens:
        raise ValueError(f"{vocab_url} has no [MASK] token: not a BERT vocabulary; rebuild with one")
    instances = m.get("config", {}).get("instances", {})
    return Manifest(
        url=folder,
        sha256=manifest_sha256(m),
        config_hash=m["config_hash"],
        vocab=Vocab(url=vocab_url, size=int(m["vocab"]["size"]),
                    sha256=m["vocab"].get("sha256") or hashlib.sha256(vocab_text.encode()).hexdigest(),
                    do_lower_case=bool(m["vocab"].get("do_lower_case", True)), mask_id=tokens.index("[MASK]"),
                    trained=bool(m["vocab"].get("trained", False))),
        max_seq_length=int(m["max_seq_length"]),
        max_predictions=int(instances.get("max_predictions_per_seq", 20)),
        masked_lm_prob=float(instances.get("masked_lm_prob", 0.15)),
        shards=tuple(_shard(s, folder) for s in m["shards"]),
        seq_len_histogram=_pairs(m["seq_len_histogram"]),
        totals=Totals.from_dict(m["totals"]),
        config=m["config"],
        inputs=tuple(m.get("inputs", [])),
        token_dtype=str(m["token_dtype"]),
        masked_per_seq_histogram=_pairs(m.get("masked_per_seq_histogram", {})),
        tokens_per_document_histogram=_pairs(m.get("tokens_per_document_histogram", {})),
        warnings=tuple(m.get("warnings", [])),
        skipped_files=tuple(sorted(m.get("skipped_files", {}).items())),
        ignored_files=tuple(m.get("ignored_files", [])),
        random_pool=tuple(sorted((k, v) for k, v in m.get("random_pool", {}).items())),
        build_seconds=float(m["build_seconds"]) if m.get("build_seconds") is not None else None,
        curation=m.get("curation"),
    )


def read_manifest(url: str, endpoint_url: str | None = None) -> Manifest:
    """The dataset at ``url`` (the folder, or its manifest.json): its manifest validated, its vocabulary checked."""
    folder = absolute(url.rstrip("/"))  # its shards are read by workers, which have another working directory
    if folder.endswith(MANIFEST):
        folder = folder[: -len(MANIFEST)].rstrip("/")
    path = join(folder, MANIFEST)
    try:
        m = json.loads(read_bounded(path, MAX_MANIFEST_BYTES, endpoint_url, "manifest"))
    except FileNotFoundError as e:
        raise ValueError(f"{path} not found: the dataset is missing or its build did not finish") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): the dataset is damaged; rebuild it") from e
    validate_manifest(m, path)
    vocab_text = read_bounded(join(folder, m["vocab"]["file"]), MAX_VOCAB_BYTES, endpoint_url,
                              "vocabulary").decode("utf-8")
    if sum(s["rows"] for s in m["shards"]) == 0:
        raise ValueError(f"{path} lists no rows: rebuild the dataset from a larger corpus")
    return parse_manifest(m, folder, vocab_text, path)
