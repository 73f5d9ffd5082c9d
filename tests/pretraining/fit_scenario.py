"""Run by tests/pretraining/test_fit.py in a fresh interpreter, so that "no Ray, no MLflow" can be checked on
sys.modules: `pretraining.loop.fit` on real shards, then a resume from a kept checkpoint into the same folder.

    python tests/pretraining/fit_scenario.py DATASET_DIR WORK_DIR   -> one JSON line on stdout
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from bert_core import bert_tiny
from corpus.schema import read_manifest
from pretraining.config import CheckpointConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.loop import fit
from tracking.config import TrackingConfig
from training.checkpoint import LocalCheckpoints
from training.worker import Worker

STEPS, EVERY, KEEP_AT = 30, 10, 20


def main(dataset: str, work: str) -> None:
    torch.set_num_threads(1)
    shards = read_manifest(dataset)
    vocab = Path(dataset, "vocab.txt").read_text().splitlines()
    config = PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64)),
        data=DataConfig(train=shards, micro_batch_size=8, accum=2, dynamic_masking=True,
                        mask_id=vocab.index("[MASK]")),
        max_steps=STEPS,
        optimizer=OptimizerConfig(lr=3e-3, warmup_steps=2),
        checkpoint=CheckpointConfig(every=EVERY, vocab_url=str(Path(dataset, "vocab.txt"))),
        tracking=TrackingConfig(log_every=2),
        runtime=RuntimeConfig(device="cpu", threads=1, seed=7),
    )
    first = fit(config, Worker(checkpoints=LocalCheckpoints(Path(work) / "ckpt", keep=2)))
    ckpt = Path(work) / "ckpt"
    kept = sorted(p.name for p in ckpt.iterdir())
    state = json.loads((ckpt / kept[-1] / "train_state.json").read_text())
    # Lose everything after step KEEP_AT, as a crash would, and run the same config again.
    for name in kept:
        if int(name.split("-")[1]) > KEEP_AT:
            shutil.rmtree(ckpt / name)
    second = fit(config, Worker(checkpoints=LocalCheckpoints(Path(work) / "ckpt", keep=2)))
    print(json.dumps({
        "first": {s: m for s, m in first.history}, "second": {s: m for s, m in second.history},
        "resumed_from": second.resumed_from, "kept": kept, "state_step": state["step"],
        "state_config_lr": state["config"]["optimizer"]["lr"],
        "state_data_position": state["data_position"]["global_batches"],
        "model_files": sorted(p.name for p in (ckpt / kept[-1] / "model").iterdir()),
        "loaded": sorted(m for m in ("ray", "mlflow") if m in sys.modules),
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
