"""What the stage planners and their hooks see: the config, the inputs, the executor, and what the stages have made
so far (the units, the vocabulary, the pool, every stage's markers by name). A value, never a shared bag: a planner
reads it; a stage's hook (``Stage.after``) returns the next state with what the later stages need from it
(``dataclasses.replace``), and the driver hands that on."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from corpus.readers import ReadReport, Unit
from corpus.schema import config_hash
from pipeline.config import BuildConfig
from pipeline.drops import LeftOut
from pipeline.executor import Shared
from pipeline.inputs import BuildInputs
from pipeline.markers import Marker
from pipeline.sizes import default_num_shards
from pipeline.work import StepContext


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildState:
    cfg: BuildConfig
    """The build's config, whole: the planners read it; the steps get ``ctx`` instead."""
    inputs: BuildInputs
    """The inputs (files and their stamps, or a Dataset), the vocabulary given and the files ignored."""
    executor: Any
    """The ``executor.Executor`` every stage runs on: the plain loop or Ray Data."""
    chash: str
    """The config's hash: the identity (``cfg.identity()``, the vocabulary's SHA-256, curation's), as
    ``_work/config.json`` and the manifest keep it."""
    report: ReadReport = dataclasses.field(default_factory=ReadReport)
    """Input files skipped (--on-error skip) while the units were planned and the pieces cut, and why."""
    units: tuple[Unit, ...] = ()
    """Every unit of the inputs; set by the pieces stage's hook (a Dataset's: by the read pass's)."""
    unit_sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    """Bytes of text per unit, by uid (compressed ones estimated): the progress lines' MB/s and ETA."""
    vocab_bytes: bytes | None = None
    """The given vocab.txt's bytes, or the trained one's once its stage has run (``with_vocab``)."""
    vocab: Shared | None = None
    """The vocabulary's tokens handed to the workers once (the object store on Ray), each building its encoder
    once; set with ``vocab_bytes``."""
    corpus_tokens: int = 0
    """The tokens the read pass kept, less what global steps left out: exact once it has run; plans the pool's
    threshold and the default shard count."""
    doc_units: dict[str, Unit] = dataclasses.field(default_factory=dict)
    """The instances pass's units by uid: those whose read kept at least one document."""
    doc_files: tuple[str, ...] = ()
    """Every file of tokenized documents the read pass wrote: what the pool samples and global steps decide on."""
    dropped: frozenset[str] = frozenset()
    """The docs files a global step gave a drop list (drops.py)."""
    left_out: LeftOut = dataclasses.field(default_factory=LeftOut)
    """What those drop lists remove, summed: subtracted from the read pass's totals in the manifest."""
    copied: frozenset[str] = frozenset()
    """The docs files a global step gave a copies list (--mix; drops.py)."""
    repeat_tokens: int = 0
    """The tokens of those extra copies: the instances pass makes them too, so the default shard count counts them."""
    pool: Shared | None = None
    """The merged random-next pool once its stage has run (an object reference on Ray)."""
    warnings: tuple[str, ...] = ()
    """The manifest's warnings, one line each (instance settings, the [UNK] share, a vocabulary shortfall, ...)."""
    markers: dict[str, list[Marker]] = dataclasses.field(default_factory=dict)
    """Every finished stage's markers by stage name, in item order: what later planners read."""
    fence: Any = None
    """The output's writer lease (storage/fence.py): proved by every item's commit; None: nothing to prove."""

    @functools.cached_property
    def vocab_tokens(self) -> list[str]:
        assert self.vocab_bytes is not None, "the vocabulary is known once the vocab stage has run"
        tokens = [line.rstrip("\r") for line in self.vocab_bytes.decode("utf-8").split("\n")]
        while tokens and tokens[-1] == "":
            tokens.pop()
        return tokens

    @functools.cached_property
    def vocab_size(self) -> int:
        return len(self.vocab_tokens)

    @property
    def build_id(self) -> str:
        """The config and the input stamps: keys the per-process caches (the pool), so that a rebuild of changed
        inputs into the same output, in the same process, never sees the old pool."""
        assert self.inputs.stamps is not None, "a Dataset's stamp is known once the read pass has run"
        return config_hash({"config_hash": self.chash, "inputs": self.inputs.stamps})

    @functools.cached_property
    def ctx(self) -> StepContext:
        return self.cfg.step_context(self.vocab_size, self.fence)

    @property
    def num_shards(self) -> int:
        """The config's, or the default from the corpus's tokens (never from the CPUs or how the input came)."""
        assert self.corpus_tokens, "the shards are planned once the read pass has counted the tokens"
        return self.cfg.num_shards or default_num_shards(self.corpus_tokens + self.repeat_tokens, self.cfg.dupe_factor,
                                                         self.vocab_size)

    def with_vocab(self, vocab_bytes: bytes) -> BuildState:
        """This state with the vocabulary known: its bytes, and its tokens shared with the workers once."""
        import hashlib

        state = dataclasses.replace(self, vocab_bytes=vocab_bytes)
        return dataclasses.replace(state, vocab=self.executor.share(hashlib.sha256(vocab_bytes).hexdigest(),
                                                                    state.vocab_tokens))

    def with_markers(self, stage: str, markers: list[Marker]) -> BuildState:
        """This state with ``stage``'s markers (a finished stage's, or what its hook made of them)."""
        return dataclasses.replace(self, markers={**self.markers, stage: markers})

    def warned(self, warning: str) -> BuildState:
        """This state with one more of the manifest's warnings."""
        return dataclasses.replace(self, warnings=(*self.warnings, warning))
