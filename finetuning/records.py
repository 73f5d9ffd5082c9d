"""Fine-tuning's task readers: ``corpus.records`` (the build's decontamination reads evaluation sets with
the same code, and ``pipeline`` may not import ``finetuning``)."""
from corpus.records import FORMATS, detect_format, flatten_squad, read_conll, read_records, split_train_eval, subsample  # noqa: F401
