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


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything that decides the dataset's content (``identity``) plus where it goes."""

    inputs: tuple[str, ...]
    output: str
    read: ReadOptions = ReadOptions()
    instances: InstanceConfig = InstanceConfig()
    vocab: str | None = None
    vocab_size: int = BERT_VOCAB_SIZE  # only used to train a vocabulary when none is given
    min_frequency: int = 2
    vocab_sample_bytes: int = DEFAULT_SAMPLE_BYTES  # the trained vocabulary's sample (0: the whole corpus)
    do_lower_case: bool = True
    dupe_factor: int = 10
    num_shards: int | None = None  # None: from the planned size (shards.default_num_shards, ~128 MiB each)
    pool_tokens: int = 4_000_000
    unit_bytes: int = 4 << 20
    endpoint_url: str | None = None
    checks: CheckConfig = CheckConfig()
    curate: CurateConfig = CurateConfig()  # every filter off by default (pipeline/curation/filters.py)

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

    def step_context(self, vocab_size: int, build_id: str, fence: Any = None) -> StepContext:
        return StepContext(work=self.work, output=self.output, read=self.read,
                           instances=self.instances, do_lower_case=self.do_lower_case, dupe_factor=self.dupe_factor,
                           vocab_size=vocab_size, build_id=build_id, endpoint_url=self.endpoint_url, fence=fence)
