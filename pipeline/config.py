"""The build's config: what decides the dataset, and where it goes."""
from __future__ import annotations

import dataclasses
from typing import Any

from corpus.checks import CheckConfig
from corpus.create_instances import InstanceConfig
from corpus.readers import ReadOptions
from corpus.schema import WORK_DIR
from corpus.tokenize import BERT_VOCAB_SIZE
from curate.config import CurateConfig
from pipeline.work import StepContext
from storage.fs import join
from storage.redact import redact

DEFAULT_SAMPLE_BYTES = 256 << 20  # the trained vocabulary's sample (pipeline/vocab.py says why)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything that decides the dataset's content (``identity``) plus where it goes."""

    inputs: tuple[str, ...]
    """The input files, folders or globs (local paths or URLs); empty when a Ray Dataset of documents is built."""
    output: str
    """The dataset's folder (a local path or s3://...): shards, vocab.txt, manifest.json and, while running, _work."""
    read: ReadOptions = ReadOptions()
    """How the inputs are read: format, one sentence per line or not, the text and id fields, bad records."""
    instances: InstanceConfig = InstanceConfig()
    """How documents become instances: sequence length, masking, the seed every draw derives from."""
    vocab: str | None = None
    """A BERT vocab.txt (path or URL); None trains a WordPiece vocabulary on a sample of the inputs."""
    vocab_size: int = BERT_VOCAB_SIZE
    """Tokens in the trained vocabulary, used only when ``vocab`` is None; bert-base-uncased's 30522 by default."""
    min_frequency: int = 2
    """How many times a merge must occur in the sample to enter a trained vocabulary (``train_wordpiece``'s)."""
    vocab_sample_bytes: int = DEFAULT_SAMPLE_BYTES
    """Bytes of decompressed text the trained vocabulary's seeded sample holds (0: the whole corpus); 256 MiB sees
    every word frequent enough for a 30k English vocabulary in minutes (pipeline/vocab.py)."""
    do_lower_case: bool = True
    """Lowercase and strip accents before WordPiece (the reference does both or neither); False for cased text."""
    dupe_factor: int = 10
    """Passes over each document, each with its own seeds (other pairs, other masks); 10 is the reference's default."""
    num_shards: int | None = None
    """Parquet shards of the output; None plans them from the counted tokens, about 128 MiB each
    (``sizes.default_num_shards``), never from the CPUs."""
    pool_tokens: int = 4_000_000
    """Token budget of the random-next pool: each document joins it with probability min(1, budget / corpus
    tokens), so it is a seeded sample of the whole corpus (docs/data.md, ``sizes.pool_threshold``)."""
    unit_bytes: int = 4 << 20
    """Bytes of decompressed text per work unit (4 MiB; a Parquet input's unit is a row group): the build's unit of
    parallelism and resume. Part of the identity: it moves rows between shards, never changes them (docs/data.md)."""
    endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO, Ceph, a test server) for s3:// URLs; not part of the identity."""
    checks: CheckConfig = CheckConfig()
    """When the build stops because the vocabulary does not fit the text (the [UNK] share); not part of the
    identity: it decides whether to build, not what."""
    curate: CurateConfig = CurateConfig()
    """Document filters, dedup and mix weights; every one off by default, and then not part of the identity
    (pipeline/curation/filters.py)."""

    def __post_init__(self) -> None:
        if not self.output:
            raise ValueError("no output: pass --output")
        if self.dupe_factor < 1:
            raise ValueError(f"--dupe-factor {self.dupe_factor}: use at least 1 (the reference uses 10)")
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"--num-shards {self.num_shards}: use at least 1")
        if self.pool_tokens < 1:
            raise ValueError(f"--pool-tokens {self.pool_tokens}: use a positive token budget")
        if self.vocab_sample_bytes < 0:
            raise ValueError(f"vocab_sample_bytes {self.vocab_sample_bytes}: use 0 (whole corpus) or a byte budget")
        if self.unit_bytes < 1024:
            raise ValueError(f"unit_bytes {self.unit_bytes}: use at least 1024")

    @property
    def work(self) -> str:
        return join(self.output, WORK_DIR)

    def identity(self) -> dict[str, Any]:
        """The config that decides the content: not where it is written, which endpoint serves it or which
        credentials read it."""
        d = dataclasses.asdict(self)
        d.pop("output")
        d.pop("endpoint_url")
        d.pop("checks")  # they decide whether the build goes on, not what it makes
        if not self.curate.enabled:
            d.pop("curate")  # a build without curation keeps the hash it had before curation existed
        return redact(d)  # input URLs without userinfo or signatures: hashed, compared and written as such

    def step_context(self, vocab_size: int, fence: Any = None) -> StepContext:
        return StepContext(work=self.work, output=self.output, read=self.read,
                           instances=self.instances, do_lower_case=self.do_lower_case, dupe_factor=self.dupe_factor,
                           vocab_size=vocab_size, endpoint_url=self.endpoint_url, fence=fence)
