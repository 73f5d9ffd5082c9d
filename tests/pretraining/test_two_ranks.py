"""Data parallelism is exact: two Ray Train ranks (gloo, DDP) each taking half of every global batch give the same
losses and gradient norms as one rank taking the whole batch in two accumulated micro-batches. On CPU in the normal
suite; on a GPU (gpu marker) the two ranks share the one GPU (half a GPU each, gloo) and run the compiled step with
bert_core's fused kernels.

Both runs read the same shard through the global data order (`pretraining.order`): step k's batch is the same 8
rows, cut into the same two micro-batches of 4 (rank r's share, or micro-batch r of the one rank). Rows carry
different numbers of masked tokens: the loss is the mean over the global batch's masked tokens whatever the split
(`pretraining.step.micro_weights` with the batch's totals). On CPU dropout is on: it is seeded per micro-batch by
its place in the global batch, so the two runs drop the same units. The GPU check runs in fp32 with dropout off
(bf16 rounding would need a tolerance loose enough to hide a real mismatch).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _manifests import manifest_of

from bert_core import bert_tiny
from pretraining.config import ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.loop import fit
from tracking.config import TrackingConfig
from training.worker import Worker

pytestmark = pytest.mark.timeout(600)
GLOBAL, STEPS, VOCAB = 8, 3, 300


def all_rows(n: int = 64) -> list[dict]:
    """Deterministic rows of varied length (16..48 tokens), 1 to 5 masked positions each."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(n):
        length = int(rng.integers(16, 49))
        a = int(rng.integers(4, length - 8))
        ids = rng.integers(5, VOCAB, length).tolist()
        ids[0], ids[a + 1], ids[-1] = 2, 3, 3
        k = int(rng.integers(1, 6))
        pos = sorted(rng.choice([i for i in range(1, length - 1) if i != a + 1], k, replace=False).tolist())
        rows.append({"input_ids": ids, "a_length": a, "masked_lm_positions": pos,
                     "masked_lm_ids": rng.integers(5, VOCAB, k).tolist(), "next_sentence_label": int(rng.integers(2))})
    return rows


def shard(directory: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpus.schema import instance_schema

    path = directory / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(all_rows(), schema=instance_schema(VOCAB)), path)
    return str(path)


def config(world: int, device: str, shard: str) -> PretrainConfig:
    cuda = device == "cuda"
    dropout = 0.0 if cuda else 0.1
    shards = manifest_of((shard,), (64,), max_seq_length=48, max_predictions=5, vocab_size=VOCAB)
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=dropout,
                                         attention_probs_dropout_prob=dropout)),
        data=DataConfig(train=shards, micro_batch_size=GLOBAL // 2, accum=2 // world, batch_size=GLOBAL,
                        bucket_window=4, length_buckets=(16, 32, 48)),
        max_steps=STEPS, optimizer=OptimizerConfig(lr=1e-3), tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device=device, threads=1, precision="fp32", compile=cuda, seed=1,
                              fused_kernels=None))


def ray_loop(loop_config: dict) -> None:
    """Runs in each Ray Train worker: fit on this rank's half of every batch; rank 0 writes the history."""
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    result = fit(config(world, loop_config["device"], loop_config["shard"]),
                 Worker(rank=rank, world_size=world, device=ray.train.torch.get_device(),
                        wrap=ray.train.torch.prepare_model))
    if rank == 0:
        Path(loop_config["out"]).write_text(json.dumps(result.history))


def two_ranks(tmp_path: Path, device: str) -> dict[int, dict]:
    import ray.cloudpickle
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import tests/
    ray.cloudpickle.register_pickle_by_value(sys.modules["_manifests"])
    resources = {"CPU": 0.5} if device == "cpu" else {"CPU": 0.5, "GPU": 0.5}
    out = tmp_path / "history.json"
    TorchTrainer(ray_loop, train_loop_config={"device": device, "out": str(out), "shard": shard(tmp_path)},
                 torch_config=TorchConfig(backend="gloo"),
                 scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=device == "cuda",
                                                        resources_per_worker=resources),
                 run_config=ray.train.RunConfig(name="two-ranks", storage_path=str(tmp_path / "ray"))).fit()
    return {int(step): metrics for step, metrics in json.loads(out.read_text())}


def one_rank(device: str, tmp_path: Path) -> dict[int, dict]:
    torch.manual_seed(0)
    return dict(fit(config(1, device, shard(tmp_path)), Worker(device=torch.device(device))).history)


def check_same(one: dict[int, dict], two: dict[int, dict], rel: float) -> None:
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    for step in one:
        for key in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
            assert two[step][key] == pytest.approx(one[step][key], rel=rel), (step, key)
        assert two[step]["mlm_accuracy"] == one[step]["mlm_accuracy"]
    assert one[1]["loss"] != one[STEPS]["loss"]  # the optimizer really stepped in between


def test_two_gloo_ranks_equal_one_rank_accumulating_two_micro_batches(ray_local, tmp_path):
    check_same(one_rank("cpu", tmp_path), two_ranks(tmp_path, "cpu"), rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_ranks_sharing_one_gpu_equal_one_rank(ray_local, tmp_path):
    check_same(one_rank("cuda", tmp_path), two_ranks(tmp_path, "cuda"), rel=1e-3)
