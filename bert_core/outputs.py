"""Typed output dataclasses of the models. Like HF's `ModelOutput`, fields read by name (`out.logits`) and, for
code written against transformers, by position over the fields that are set (`out[0]`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


class _Output:
    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(v for v in (getattr(self, f.name) for f in dataclasses.fields(self)) if v is not None)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]


@dataclass
class BertModelOutput(_Output):
    last_hidden_state: torch.Tensor
    """(B, T, H) the last encoder layer's output, or (B, K, H) at the ``output_positions`` asked for only."""
    pooler_output: torch.Tensor | None = None
    """(B, H) dense + tanh of [CLS] (B, S, H for packed rows: one per sequence); None without a pooler."""


@dataclass
class BertForPreTrainingOutput(_Output):
    """`mlm_logits`, when masked positions were given: (B, P, V) on the static path (every slot; padding slots'
    rows are meaningless) or (N_valid, V) on the valid-only path (rows in the order of the valid slots, batch
    major); without positions (B, T, V). It is None when the chunked training loss ran (CPU, gradients on, labels
    given), which never keeps the logits. The *_correct / *_count tensors let a trainer aggregate accuracy exactly
    over batches and ranks (sum both, divide once); the *_accuracy floats are this batch's ratio."""

    loss: torch.Tensor | None = None
    """``mlm_loss + nsp_loss`` (either alone when only its labels were given), unweighted as in Devlin et al.
    2019; None without labels."""
    mlm_loss: torch.Tensor | None = None
    """Mean cross-entropy over the real masked tokens (label -100 skipped)."""
    nsp_loss: torch.Tensor | None = None
    """Mean cross-entropy of the next-sentence prediction over the sequences whose label is not -100."""
    mlm_logits: torch.Tensor | None = None
    """Vocabulary logits at the masked slots, shaped as the class docstring says; None after the chunked loss."""
    nsp_logits: torch.Tensor | None = None
    """(B, 2) (or (B, S, 2) packed) next-sentence logits from the pooled [CLS]: 0 = B follows A, 1 = random."""
    mlm_accuracy: torch.Tensor | None = None
    """``mlm_correct / mlm_count`` for this batch."""
    nsp_accuracy: torch.Tensor | None = None
    """``nsp_correct / nsp_count`` for this batch."""
    mlm_correct: torch.Tensor | None = None
    """int64 count of masked tokens whose argmax is the label."""
    mlm_count: torch.Tensor | None = None
    """int64 count of real masked tokens (label not -100)."""
    nsp_correct: torch.Tensor | None = None
    """int64 count of sequences whose NSP argmax is the label."""
    nsp_count: torch.Tensor | None = None
    """int64 count of sequences with an NSP label (not -100)."""

    # HF's names, so code written against transformers reads the same tensors.
    @property
    def prediction_logits(self) -> torch.Tensor | None:
        return self.mlm_logits

    @property
    def seq_relationship_logits(self) -> torch.Tensor | None:
        return self.nsp_logits


@dataclass
class SequenceClassifierOutput(_Output):
    loss: torch.Tensor | None = None
    """MSE (regression), cross-entropy (single label) or BCE (multi-label) by ``problem_type``; None without
    labels."""
    logits: torch.Tensor | None = None
    """(B, num_labels) from the pooled [CLS]."""


@dataclass
class TokenClassifierOutput(_Output):
    loss: torch.Tensor | None = None
    """Mean cross-entropy over the tokens whose label is not -100; None without labels."""
    logits: torch.Tensor | None = None
    """(B, T, num_labels), one row per token."""


@dataclass
class QuestionAnsweringOutput(_Output):
    loss: torch.Tensor | None = None
    """Mean of the start and end cross-entropies (answers outside the sequence ignored, as in HF); None without
    positions."""
    start_logits: torch.Tensor | None = None
    """(B, T) score of each token as the answer's first."""
    end_logits: torch.Tensor | None = None
    """(B, T) score of each token as the answer's last."""

    @property
    def logits(self) -> torch.Tensor | None:
        """(B, T, 2): start and end logits stacked, for code that wants one tensor."""
        if self.start_logits is None:
            return None
        return torch.stack([self.start_logits, self.end_logits], dim=-1)
