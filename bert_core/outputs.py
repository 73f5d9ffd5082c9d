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
    pooler_output: torch.Tensor | None = None


@dataclass
class BertForPreTrainingOutput(_Output):
    """`mlm_logits`, when masked positions were given: (B, P, V) on the static path (every slot; padding slots'
    rows are meaningless) or (N_valid, V) on the valid-only path (rows in the order of the valid slots, batch
    major); without positions (B, T, V). It is None when the chunked training loss ran (CPU, gradients on, labels
    given), which never keeps the logits. The *_correct / *_count tensors let a trainer aggregate accuracy exactly
    over batches and ranks (sum both, divide once); the *_accuracy floats are this batch's ratio."""

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    mlm_logits: torch.Tensor | None = None
    nsp_logits: torch.Tensor | None = None
    mlm_accuracy: torch.Tensor | None = None
    nsp_accuracy: torch.Tensor | None = None
    mlm_correct: torch.Tensor | None = None
    mlm_count: torch.Tensor | None = None
    nsp_correct: torch.Tensor | None = None
    nsp_count: torch.Tensor | None = None

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
    logits: torch.Tensor | None = None


@dataclass
class TokenClassifierOutput(_Output):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


@dataclass
class QuestionAnsweringOutput(_Output):
    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None

    @property
    def logits(self) -> torch.Tensor | None:
        """(B, T, 2): start and end logits stacked, for code that wants one tensor."""
        if self.start_logits is None:
            return None
        return torch.stack([self.start_logits, self.end_logits], dim=-1)
