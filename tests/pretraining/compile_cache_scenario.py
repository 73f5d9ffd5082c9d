"""Run by tests/pretraining/test_compile_cache.py in a fresh interpreter (Inductor's in-memory caches must be empty):
`pretraining.loop.fit` with torch.compile on real shards, checkpointing, resuming from any checkpoint found.

    python tests/pretraining/compile_cache_scenario.py DATASET_DIR CHECKPOINT_DIR STEPS [BACKEND [COMPILE_CACHE]]
    -> one JSON line on stdout

BACKEND defaults to inductor; COMPILE_CACHE is the operator's trusted folder (`RuntimeConfig.compile_cache`).
Prints Dynamo's cache counters (Inductor's FX-graph cache, AOTAutograd's cache) for this process, the step it
resumed from and the files of the last checkpoint.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bert_core import BertConfig
from corpus.schema import read_manifest
from pretraining.config import CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.loop import fit
from tracking.config import TrackingConfig
from training.checkpoint import LocalCheckpoints
from training.worker import Worker


def main(dataset: str, checkpoints: str, steps: int, backend: str = "inductor",
         compile_cache: str | None = None) -> None:
    from torch._dynamo.utils import counters

    torch.set_num_threads(1)
    vocab = Path(dataset, "vocab.txt").read_text().splitlines()
    shards = read_manifest(dataset)
    # As small as a BERT gets: Inductor's C++ code generation is what this run pays for, once.
    bert = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    config = PretrainConfig(
        model=ModelConfig(bert=bert),
        # One width (the dataset's max length): one graph each way is all the mechanism needs, at a quarter of the
        # C++ compile time of the default four buckets.
        data=DataConfig(train=shards, micro_batch_size=4, mask_id=vocab.index("[MASK]"),
                        length_buckets=(shards.max_seq_length,)),
        max_steps=steps, optimizer=OptimizerConfig(lr=1e-3),
        checkpoint=CheckpointConfig(every=1),
        tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device="cpu", threads=1, compile=True, compile_backend=backend,
                              compile_cache=compile_cache, seed=3),
    )
    result = fit(config, Worker(checkpoints=LocalCheckpoints(checkpoints, keep=1)))
    last = sorted(Path(checkpoints).glob("checkpoint-*"))[-1]
    print(json.dumps({
        "resumed_from": result.resumed_from, "steps": [s for s, _ in result.history],
        "inductor": {k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
        "aot_autograd": {k: int(v) for k, v in counters["aot_autograd"].items() if "cache" in k},
        "files": sorted(p.name for p in last.iterdir()),
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
