"""bert_core: a BERT (Devlin et al. 2019) in plain PyTorch that reads and writes Hugging Face checkpoints.

Torch and safetensors only: no Ray, MLflow or storage code here (tests/test_layering.py keeps it so).
"""
from .attention import BertSelfAttention
from .config import PRESETS, BertConfig, bert_base, bert_large, bert_medium, bert_mini, bert_small, bert_tiny
from .embeddings import BertEmbeddings
from .finetuning import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from .flops import executed_flops, executed_flops_per_batch, flops_per_sequence, mfu
from .layers import BertEncoder, BertLayer
from .model import BertModel, BertPooler
from .outputs import (
                      BertForPreTrainingOutput,
                      BertModelOutput,
                      QuestionAnsweringOutput,
                      SequenceClassifierOutput,
                      TokenClassifierOutput,
)
from .pretrained import BertPreTrainedModel
from .pretraining import BertForPreTraining

__all__ = [
    "BertConfig", "PRESETS", "bert_tiny", "bert_mini", "bert_small", "bert_medium", "bert_base", "bert_large",
    "BertEmbeddings", "BertSelfAttention", "BertLayer", "BertEncoder", "BertPooler", "BertModel",
    "BertPreTrainedModel", "BertForPreTraining", "BertForSequenceClassification", "BertForTokenClassification",
    "BertForQuestionAnswering", "BertModelOutput", "BertForPreTrainingOutput", "SequenceClassifierOutput",
    "TokenClassifierOutput", "QuestionAnsweringOutput",
    "flops_per_sequence", "mfu", "executed_flops", "executed_flops_per_batch",
]
