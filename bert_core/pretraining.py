"""`BertForPreTraining`: BertModel + the masked-LM head (tied to the word embeddings) + the next-sentence head.

Called with `masked_lm_positions` (B, P) / `masked_lm_labels` (B, P, -100 in padding slots), as our dataset stores
them, the MLM head runs only on the valid masked positions. Without positions it returns logits for every position
(what HF returns; used for parity checks), and `masked_lm_labels` may then be HF-style (B, T) labels.
"""
from __future__ import annotations

import torch

from .config import BertConfig
from .heads import BertPreTrainingHeads
from .losses import accuracy_counts, gather_masked, mean_cross_entropy
from .model import BertModel
from .outputs import BertForPreTrainingOutput
from .pretrained import BertPreTrainedModel, _no_init


class BertForPreTraining(BertPreTrainedModel):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        with _no_init():  # initialised once, below, with the head
            self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """The MLM decoder shares the word-embedding matrix (same Parameter, same storage), as in the paper."""
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> BertForPreTrainingOutput:
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        if masked_lm_positions is not None:
            rows, labels = gather_masked(out.last_hidden_state, masked_lm_positions, masked_lm_labels)
        else:
            rows, labels = out.last_hidden_state, masked_lm_labels
        mlm_logits = self.cls.predictions(rows)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)

        result = BertForPreTrainingOutput(mlm_logits=mlm_logits, nsp_logits=nsp_logits)
        losses = []
        if labels is not None:
            result.mlm_loss = mean_cross_entropy(mlm_logits, labels)
            result.mlm_correct, result.mlm_count = accuracy_counts(mlm_logits, labels)
            result.mlm_accuracy = result.mlm_correct / result.mlm_count.clamp(min=1)
            losses.append(result.mlm_loss)
        if next_sentence_label is not None:
            result.nsp_loss = mean_cross_entropy(nsp_logits, next_sentence_label)
            result.nsp_correct, result.nsp_count = accuracy_counts(nsp_logits, next_sentence_label)
            result.nsp_accuracy = result.nsp_correct / result.nsp_count.clamp(min=1)
            losses.append(result.nsp_loss)
        if losses:
            result.loss = losses[0] if len(losses) == 1 else losses[0] + losses[1]
        return result
