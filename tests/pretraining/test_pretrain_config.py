"""PretrainConfig: components validate themselves with messages that say how to fix, and one flattened asdict
serves MLflow params and checkpoints."""
from __future__ import annotations

import dataclasses
import json

import pytest
from _manifests import manifest_of

from bert_core import bert_tiny
from pretraining.config import CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig, EvalConfig, default_length_buckets
from tracking.config import TrackingConfig
from tracking.params import flatten_params

SHARDS = manifest_of(("a.parquet", "b.parquet"), (5, 5), max_seq_length=128, max_predictions=20, vocab_size=600)


def config(**changes) -> PretrainConfig:
    base = dict(model=ModelConfig(bert=bert_tiny(vocab_size=600)), data=DataConfig(train=SHARDS, micro_batch_size=8),
                max_steps=10)
    return PretrainConfig(**{**base, **changes})


def test_default_buckets_are_few_fixed_widths():
    assert default_length_buckets(128) == (32, 64, 96, 128)
    assert default_length_buckets(64) == (16, 32, 48, 64)
    assert default_length_buckets(512) == (128, 256, 384, 512)
    assert default_length_buckets(100) == (32, 64, 96, 100)  # rounded to 8, capped at the max length
    assert config().data.length_buckets == (32, 64, 96, 128)


@pytest.mark.parametrize("make, message", [
    (lambda: DataConfig(train=SHARDS, micro_batch_size=8, length_buckets=(32, 64)), "largest must be >= "),
    (lambda: DataConfig(train=SHARDS, micro_batch_size=8, length_buckets=(64, 32, 128)), "increasing"),
    (lambda: DataConfig(train=SHARDS, micro_batch_size=0), "must be >= 1"),
    (lambda: OptimizerConfig(name="sgd"), "use one of adamw, lamb"),
    (lambda: RuntimeConfig(precision="fp16"), "use one of auto, fp32, bf16"),
    (lambda: TrackingConfig(log_every=0), "--log-every must be >= 1"),
    (lambda: CheckpointConfig(every=0), "--checkpoint-every must be >= 1"),
    (lambda: config(max_steps=5, optimizer=OptimizerConfig(warmup_steps=6)), "exceeds --max-steps"),
    (lambda: config(model=ModelConfig(bert=bert_tiny(vocab_size=600, max_position_embeddings=64))), "only 64"),
    # The model and its data agree (checked here only, whichever flags made them).
    (lambda: config(data=DataConfig(train=manifest_of(("a",), (5,), vocab_size=700, url="s3://b/d"),
                                    micro_batch_size=8)), "has vocab_size 600 but s3://b/d was built with a 700"),
    (lambda: config(model=ModelConfig(bert=bert_tiny(vocab_size=600), init="/m", init_vocab_sha256="a"),
                    data=DataConfig(train=dataclasses.replace(SHARDS,
                                                              vocab=dataclasses.replace(SHARDS.vocab, sha256="b")),
                                    micro_batch_size=8)),
     "--init /m's vocab.txt differs"),
    (lambda: config(eval=EvalConfig(data=dataclasses.replace(SHARDS, url="ev",
                                                             vocab=dataclasses.replace(SHARDS.vocab, sha256="other")))),
     "--eval-data ev was built with another vocabulary"),
])
def test_bad_values_fail_with_the_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_frozen_and_params_are_the_flattened_asdict():
    c = config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_steps = 3
    params = flatten_params(c)
    assert params["model.bert.hidden_size"] == "128" and params["data.micro_batch_size"] == "8"
    assert params["optimizer.lr"] == "0.0001" and params["runtime.compile"] == "None"
    assert params["data.train.max_seq_length"] == "128" and params["data.train.url"] == "synthetic"
    json.dumps(dataclasses.asdict(c), default=str)  # what checkpoints store
    many = config(data=DataConfig(train=manifest_of(tuple(f"s{i}" for i in range(20)), (1,) * 20, vocab_size=600),
                                  micro_batch_size=8))
    assert flatten_params(many)["data.train.shards.count"] == "20"  # long lists: their length, not 6000 characters
