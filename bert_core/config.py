"""`BertConfig`: the model's hyper-parameters under Hugging Face's field names, plus the paper's size presets.

The dataclass is frozen (derive variants with `dataclasses.replace` or a preset's keyword overrides) and validated
in `__post_init__`. `to_json_file`/`from_json_file` read and write HF's `config.json`, so a directory we write loads
in `transformers` and theirs loads here; keys we do not model (HF bookkeeping such as `transformers_version`) are
ignored on read, keys that would change the maths in a way we do not support are rejected with a clear message.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 1 << 20  # a config.json is ~1 KB; a model folder may be anyone's, so more is refused unread

logger = logging.getLogger(__name__)

# Activations we implement, by HF name. "gelu" is the exact erf form (the original BERT), the others the tanh one.
SUPPORTED_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    vocab_size: int = 30522
    """WordPiece vocabulary entries: rows of the word embedding and of the tied MLM decoder. 30522 is the
    bert-base-uncased vocab.txt (Devlin et al. 2019: a 30,000-token WordPiece vocabulary)."""
    hidden_size: int = 768
    """H, the width of every token's representation; 768 is BERT-base's (Devlin et al. 2019)."""
    num_hidden_layers: int = 12
    """L, the number of Transformer encoder layers; 12 is BERT-base's (Devlin et al. 2019)."""
    num_attention_heads: int = 12
    """A, self-attention heads per layer, each hidden_size / A wide; 12 is BERT-base's (Devlin et al. 2019), and
    the presets keep heads 64 wide."""
    intermediate_size: int = 3072
    """Inner width of each layer's feed-forward block; 3072 = 4H, the paper's choice (Devlin et al. 2019)."""
    hidden_act: str = "gelu"
    """Feed-forward activation, one of ``SUPPORTED_ACTS``: "gelu" is the exact erf form of the original BERT
    (Devlin et al. 2019 use GELU), "gelu_new" and "gelu_pytorch_tanh" its tanh approximation."""
    hidden_dropout_prob: float = 0.1
    """Dropout on the embeddings and on each sublayer's output before its residual add; 0.1 as in Devlin et al.
    2019. Also the classifier heads' dropout when ``classifier_dropout`` is None."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities; 0.1 as in the original BERT."""
    max_position_embeddings: int = 512
    """Learned absolute positions, so the longest sequence the model takes; 512 as in Devlin et al. 2019."""
    type_vocab_size: int = 2
    """Segment (token type) embeddings: 2 for sentence A and sentence B of BERT's pairs."""
    initializer_range: float = 0.02
    """Std of the truncated normal (cut at +/-2 std) every dense and embedding matrix starts from; the original
    BERT's 0.02."""
    layer_norm_eps: float = 1e-12
    """Epsilon added to the variance in every LayerNorm; 1e-12 is the original TensorFlow BERT's."""
    pad_token_id: int = 0
    """Id of [PAD] (0 in BERT's vocab.txt); kept for HF's config.json: the attention mask, not this id, keeps
    padding out (the embedding has no padding_idx)."""
    # Fine-tuning heads, as HF has them.
    num_labels: int | None = None
    """Outputs of a classification head (1: regression); None: len(id2label), else 2. Not written to
    config.json: HF derives it from id2label."""
    id2label: dict[int, str] | None = None
    """Label names by class index 0..num_labels - 1; None: LABEL_0, LABEL_1, ... as HF names them."""
    label2id: dict[str, int] | None = None
    """The inverse of id2label; derived from it when not given."""
    problem_type: str | None = None
    """One of ``PROBLEM_TYPES``: the sequence classifier's loss (MSE, cross-entropy or BCE); None: chosen per
    call from num_labels and the labels' dtype, as HF does."""
    classifier_dropout: float | None = None
    """Dropout before a classification head; None: ``hidden_dropout_prob``."""
    architectures: tuple[str, ...] | None = field(default=None, compare=False)
    """The model classes these weights belong to (HF's config.json key, set on save); not compared, so a
    config equals its reload whatever class saved it."""

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "max_position_embeddings", "type_vocab_size")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}); BERT uses heads = hidden_size // 64, "
                f"e.g. num_attention_heads={max(1, self.hidden_size // 64)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {p!r}")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(f"classifier_dropout must be None or in [0, 1), got {self.classifier_dropout!r}")
        if self.hidden_act not in SUPPORTED_ACTS:
            raise ValueError(f"hidden_act={self.hidden_act!r} is not supported; use one of {SUPPORTED_ACTS}")
        for name in ("initializer_range", "layer_norm_eps"):  # NaN passed `<= 0`: every comparison with it is false
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ValueError(f"BertConfig.{name} must be a finite number in (0, 1), got {value!r} (BERT uses "
                                 "0.02 and 1e-12)")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} must be a valid id in "
                             f"[0, vocab_size={self.vocab_size})")
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type={self.problem_type!r} must be one of {PROBLEM_TYPES}")
        self._resolve_labels()
        if self.problem_type == "single_label_classification" and self.num_labels == 1:
            raise ValueError('problem_type="single_label_classification" needs num_labels >= 2; '
                             'for one output use problem_type="regression"')
        if self.architectures is not None:
            object.__setattr__(self, "architectures", tuple(self.architectures))

    def _resolve_labels(self) -> None:
        # HF derives num_labels from id2label; keep the two consistent, and regenerate the default LABEL_i names
        # when only num_labels changed (so `replace(cfg, num_labels=3)` works on a config with default labels).
        id2label = None if self.id2label is None else {int(k): str(v) for k, v in self.id2label.items()}
        num_labels = self.num_labels
        if num_labels is not None and (not isinstance(num_labels, int) or num_labels < 1):
            raise ValueError(f"num_labels must be a positive int, got {num_labels!r}")
        default_names = id2label is not None and all(v == f"LABEL_{k}" for k, v in id2label.items())
        if id2label is None or (num_labels is not None and len(id2label) != num_labels and default_names):
            num_labels = 2 if num_labels is None else num_labels
            id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
            label2id = None
        else:
            label2id = self.label2id
        if num_labels is None:
            num_labels = len(id2label)
        if len(id2label) != num_labels:
            raise ValueError(f"num_labels={num_labels} disagrees with id2label ({len(id2label)} entries); "
                             "pass only one of them, or make them agree")
        if sorted(id2label) != list(range(num_labels)):
            raise ValueError(f"id2label keys must be 0..{num_labels - 1}, got {sorted(id2label)}")
        if label2id is None:
            label2id = {v: k for k, v in id2label.items()}
        label2id = {str(k): int(v) for k, v in label2id.items()}
        if label2id != {v: k for k, v in id2label.items()}:
            raise ValueError("label2id must be the inverse of id2label; pass only id2label and it is derived")
        object.__setattr__(self, "num_labels", num_labels)
        object.__setattr__(self, "id2label", id2label)
        object.__setattr__(self, "label2id", label2id)

    # ---- derived -------------------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)

    # ---- HF config.json ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["architectures"] = list(self.architectures) if self.architectures else None
        if d["architectures"] is None:
            d.pop("architectures")
        d.pop("num_labels")  # HF stores the label maps only and derives num_labels from them
        d["id2label"] = {str(k): v for k, v in self.id2label.items()}
        if d["problem_type"] is None:
            d.pop("problem_type")
        d["model_type"] = "bert"
        d["position_embedding_type"] = "absolute"
        d["tie_word_embeddings"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], **overrides: Any) -> BertConfig:
        d = {**d, **overrides}
        if d.get("model_type", "bert") != "bert":
            raise ValueError(f"config has model_type={d['model_type']!r}; only BERT ('bert') checkpoints are supported")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only position_embedding_type='absolute' (the original BERT) is supported")
        if d.get("is_decoder") or d.get("add_cross_attention"):
            raise ValueError("decoder / cross-attention BERT configs are not supported; this is an encoder")
        names = {f.name for f in dataclasses.fields(cls)}
        if "id2label" not in d and "num_labels" not in d and "label2id" in d:
            d["id2label"] = {v: k for k, v in d["label2id"].items()}
        if "num_labels" in overrides and "id2label" not in overrides:
            d.pop("label2id", None)  # an explicit new num_labels replaces the stored label map
            if d.get("id2label") is not None and len(d["id2label"]) != overrides["num_labels"]:
                d.pop("id2label")
        ignored = sorted(k for k in d if k not in names)
        if ignored:
            logger.debug("BertConfig ignores config keys %s", ignored)
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_json_file(cls, path: str | Path, **overrides: Any) -> BertConfig:
        path = Path(path)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
            if len(data) > MAX_CONFIG_BYTES:
                raise ValueError(f"{path} is over {MAX_CONFIG_BYTES} bytes: not a BERT config.json (those are ~1 KB)")
            d = json.loads(data)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read a BERT config from {path}: {e}") from e
        if not isinstance(d, dict):
            raise ValueError(f"cannot read a BERT config from {path}: not a JSON object")
        return cls.from_dict(d, **overrides)


# ---- presets: the paper's family (Turc et al. 2019 for the small ones), heads = H/64, intermediate = 4H -----------
def _preset(layers: int, hidden: int) -> Callable[..., BertConfig]:
    def make(**overrides: Any) -> BertConfig:
        base = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
                    intermediate_size=4 * hidden)
        return BertConfig(**{**base, **overrides})

    make.__doc__ = f"BERT L={layers} H={hidden} A={hidden // 64} I={4 * hidden}; keyword arguments override fields."
    return make


bert_tiny = _preset(2, 128)
bert_mini = _preset(4, 256)
bert_small = _preset(4, 512)
bert_medium = _preset(8, 512)
bert_base = _preset(12, 768)
bert_large = _preset(24, 1024)
for _name, _fn in [("bert_tiny", bert_tiny), ("bert_mini", bert_mini), ("bert_small", bert_small),
                   ("bert_medium", bert_medium), ("bert_base", bert_base), ("bert_large", bert_large)]:
    _fn.__name__ = _fn.__qualname__ = _name

PRESETS: dict[str, Callable[..., BertConfig]] = {
    "bert_tiny": bert_tiny,
    "bert_mini": bert_mini,
    "bert_small": bert_small,
    "bert_medium": bert_medium,
    "bert_base": bert_base,
    "bert_large": bert_large,
}
