"""Text -> BERT instances, and the dataset contract. Pure functions on plain types (Arrow tables, NumPy id
arrays, an explicit ``rng``); no Ray, no model, no MLflow.

    sentences.py          sentence splitting;  tokenize.py: WordPiece over Arrow batches (a per-process encoder)
    pairs.py              NSP pairs (the reference's algorithm: segments, truncation, random next)
    masking.py            MLM masks (15%, 80/10/10, whole-word);  create_instances.py: pairs + masks per document
    rng.py                seeds derived from (seed, document id, pass) with hashlib;  ragged.py: list-array helpers
    schema.py             the Parquet schema and the typed ``Manifest`` (read_manifest): what the build writes and
                          pre-training reads;  checks.py: settings that would make a poor dataset;  stats.py: histograms
    readers/              input formats -> documents, over fixed work units (ranged.py: one unit of a remote file)
    records.py            task files (labelled data for fine-tuning, evaluation sets for decontamination)
"""
