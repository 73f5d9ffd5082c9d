"""The fine-tuning model: which weights a task head starts from (`HeadConfig`: a model directory, or random with a
preset's architecture), the tokenizer of that model's vocabulary, and the head built on top.

The head is new (seeded); the encoder comes from `init`: an HF BERT directory, our export or a pre-training
checkpoint, local or at a URL (`training.model_fetch`). The label map travels in config.json (HF's id2label/label2id).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from bert_core.config import PRESETS, BertConfig
from bert_core.finetuning import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from finetuning.features import TaskTokenizer
from finetuning.prepare import PreparedTask
from storage.fs import is_url
from training.model_fetch import local_model_dir
from training.model_size import check_fits

HEADS = {
    "classification": BertForSequenceClassification,
    "pair_classification": BertForSequenceClassification,
    "regression": BertForSequenceClassification,
    "token_classification": BertForTokenClassification,
    "question_answering": BertForQuestionAnswering,
}
# For --init random: the vocabulary of bert-base-uncased (and of all-MiniLM), shipped with the repository.
DEFAULT_VOCAB = Path(__file__).resolve().parent.parent / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"


@dataclass(frozen=True)
class HeadConfig:
    init: str
    """Where the encoder's weights come from: an HF BERT directory, our export or checkpoint directory (a local path,
    or a URL such as s3://... that every worker fetches into `cache_dir`), or "random"."""
    preset: str | None = None
    """--init random only: a preset name (`bert_core.config.PRESETS`) or a model directory whose config.json gives
    the shape."""
    vocab: str | None = None
    """--init random only: the vocab.txt to tokenise with; None: bert-base-uncased's, shipped in the repository."""
    cache_dir: str | None = None
    """The local folder a URL init is fetched into (jobs/finetune.py: .init-cache beside the job's output); needed
    for a URL."""
    endpoint_url: str | None = None
    """S3-compatible endpoint of an s3:// init (MinIO, Ceph, ...)."""

    def __post_init__(self) -> None:
        if self.init == "random":
            if self.preset not in PRESETS and not (self.preset and Path(self.preset, "config.json").is_file()):
                raise ValueError(f"--init random needs --preset, one of {', '.join(PRESETS)}, or a model directory "
                                 "whose config.json gives the architecture")
        elif self.preset is not None:
            raise ValueError("--preset only applies to --init random (a pre-trained model brings its own config)")
        elif is_url(self.init):
            if not self.cache_dir:
                raise ValueError(f"--init {self.init}: a URL needs a local folder to fetch it into (cache_dir)")
        elif not Path(self.init).exists():
            raise ValueError(f"--init {self.init}: no such directory; pass an HF BERT dir, our export/checkpoint "
                             "(a path or a URL such as s3://bucket/model), or random")


def model_dir_of(head: HeadConfig) -> Path | None:
    """The local directory holding the encoder's config.json and weights (inside a checkpoint: its model/), None
    for random. A URL is fetched first, once per machine and version of the model there: the job calls this, and
    so does each worker where it runs (the config only names the model)."""
    if head.init == "random":
        return None
    return local_model_dir(head.init, head.cache_dir, head.endpoint_url)


def hidden_size_of(head: HeadConfig) -> int:
    """The model's hidden width (what its default learning rate is chosen by: training.defaults)."""
    if head.init == "random":
        return PRESETS[head.preset]().hidden_size if head.preset in PRESETS else BertConfig.from_json_file(
            Path(head.preset) / "config.json").hidden_size
    return BertConfig.from_json_file(model_dir_of(head) / "config.json").hidden_size


def tokenizer_for(head: HeadConfig) -> tuple[TaskTokenizer, int]:
    """(the model's tokenizer, the model's vocabulary size); the vocabulary must fit the embeddings."""
    if head.init == "random":
        tok = TaskTokenizer(Path(head.vocab) if head.vocab else DEFAULT_VOCAB)
        if head.preset not in PRESETS:  # a model directory's config.json gives the shape: bounded like an init's
            check_fits(BertConfig.from_json_file(Path(head.preset) / "config.json").replace(vocab_size=tok.vocab_size),
                       f"{Path(head.preset) / 'config.json'} (--preset)")
        return tok, tok.vocab_size
    model_dir = model_dir_of(head)
    tok = TaskTokenizer.from_model_dir(model_dir)
    config = BertConfig.from_json_file(model_dir / "config.json")
    check_fits(config, f"{model_dir / 'config.json'} (--init {head.init})")  # before anything is allocated
    vocab_size = config.vocab_size
    if tok.vocab_size > vocab_size:
        raise ValueError(f"{model_dir}/vocab.txt has {tok.vocab_size} entries but the model embeds only {vocab_size}: "
                         "they do not belong together")
    return tok, vocab_size


def head_overrides(prepared: PreparedTask) -> dict[str, Any]:
    """Config fields of the head: the label map goes into config.json (HF's id2label/label2id)."""
    if prepared.task == "regression":
        return {"num_labels": 1, "id2label": {0: "LABEL_0"}, "problem_type": "regression"}
    if prepared.task == "question_answering":
        return {}
    over = {"num_labels": len(prepared.label_map), "id2label": prepared.label_map.id2label,
            "label2id": prepared.label_map.label2id}
    if prepared.task != "token_classification":
        over["problem_type"] = "single_label_classification"
    return over


def build_model(head: HeadConfig, prepared: PreparedTask, vocab_size: int) -> nn.Module:
    """The task's head on weights from `head.init` (the head is new) or, for random, on the preset's shape."""
    cls, overrides = HEADS[prepared.task], head_overrides(prepared)
    if head.init == "random":
        if head.preset in PRESETS:
            return cls(PRESETS[head.preset](vocab_size=vocab_size, **overrides))
        # A model directory as the preset: its architecture, fresh weights (e.g. MiniLM's shape from scratch).
        base = BertConfig.from_json_file(Path(head.preset) / "config.json").replace(vocab_size=vocab_size)
        return cls(base.replace(**overrides))
    return cls.from_pretrained(str(model_dir_of(head)), **overrides)
