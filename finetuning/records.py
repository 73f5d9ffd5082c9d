"""Fine-tuning's task readers: ``corpus.records`` (the build's decontamination reads evaluation sets with
the same code, and ``pipeline`` may not import ``finetuning``)."""
from corpus.records import FORMATS, flatten_squad, read_conll, read_records, record_format, split_train_eval, subsample  # noqa: F401
