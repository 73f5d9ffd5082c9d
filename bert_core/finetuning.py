"""Fine-tuning heads with HF's names and weight layout: sequence (and pair) classification or regression on the
pooled [CLS] vector, token classification on every position, extractive QA (start/end logits)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig
from .dropout import Dropout
from .losses import mean_cross_entropy
from .model import BertModel
from .outputs import QuestionAnsweringOutput, SequenceClassifierOutput, TokenClassifierOutput
from .pretrained import BertPreTrainedModel, _no_init


def _classifier_dropout(config: BertConfig) -> Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return Dropout(p)


class BertForSequenceClassification(BertPreTrainedModel):
    """Single sentences, or pairs through `token_type_ids`. num_labels == 1 (or problem_type="regression") is
    regression with MSE; integer labels are single-label CE; float multi-hot labels are multi-label BCE."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        with _no_init():  # initialised once, below, with the head
            self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def problem_type(self, labels: torch.Tensor) -> str:
        # Resolved per call as HF does, without mutating the (frozen) config.
        if self.config.problem_type is not None:
            return self.config.problem_type
        if self.num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int):
            return "single_label_classification"
        return "multi_label_classification"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None
                ) -> SequenceClassifierOutput:
        pooled = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).pooler_output
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            kind = self.problem_type(labels)
            if kind == "regression":
                target = labels.float()
                loss = F.mse_loss(logits.float().squeeze(-1), target.squeeze(-1)) if self.num_labels == 1 \
                    else F.mse_loss(logits.float(), target)
            elif kind == "single_label_classification":
                loss = mean_cross_entropy(logits, labels)
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return SequenceClassifierOutput(loss=loss, logits=logits)


class BertForTokenClassification(BertPreTrainedModel):
    """A label per token (e.g. NER tags on the first word piece of each word); labels of -100 are ignored."""

    ignore_unexpected = ("bert.pooler.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        with _no_init():  # initialised once, below, with the head
            self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None
                ) -> TokenClassifierOutput:
        hidden = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        logits = self.classifier(self.dropout(hidden))
        loss = mean_cross_entropy(logits, labels) if labels is not None else None
        return TokenClassifierOutput(loss=loss, logits=logits)


class BertForQuestionAnswering(BertPreTrainedModel):
    """SQuAD-style span extraction: `qa_outputs` maps each token to a start and an end logit. Positions outside
    the sequence (answers truncated away) are clamped to seq_len and ignored in the loss, as in HF."""

    ignore_unexpected = ("bert.pooler.",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        with _no_init():  # initialised once, below, with the head
            self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> QuestionAnsweringOutput:
        hidden = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        start_logits, end_logits = self.qa_outputs(hidden).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.shape[1]
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=ignored)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=ignored)) / 2
        return QuestionAnsweringOutput(loss=loss, start_logits=start_logits.contiguous(),
                                       end_logits=end_logits.contiguous())
