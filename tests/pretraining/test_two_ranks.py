"""Data parallelism is exact: two Ray Train ranks (gloo, DDP) each taking half of every global batch give the same
losses and gradient norms as one rank taking the whole batch. On CPU in the normal suite; on a GPU (gpu marker) the
two ranks share the one GPU (half a GPU each, gloo) and run the compiled step with bert_core's fused kernels.

The rows are real shards laid out for the loader's rank split (one shard; rank r reads the r-th contiguous half of
it): the two-rank dataset holds rank 0's halves of the global batches, then rank 1's; the one-rank dataset the same
global batches whole, so both runs see the same sequences in every step. Every row has the same number of masked tokens, so each rank's mean MLM loss
carries the same weight and DDP's average of the ranks' gradients is the gradient of the global mean. Dropout is
off (masks are drawn per rank). The GPU check runs in fp32: bf16 rounding would need a tolerance loose enough to
hide a real mismatch.
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
from tracking.config import TrackingConfig
from pretraining.loader import DataConfig
from training.worker import Worker
from pretraining.loop import fit

pytestmark = pytest.mark.timeout(600)
GLOBAL, STEPS, VOCAB = 8, 3, 300


def all_rows(n: int = 64) -> list[dict]:
    """Deterministic rows of varied length (16..48 tokens), 3 masked positions each."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(n):
        length = int(rng.integers(16, 49))
        a = int(rng.integers(4, length - 8))
        ids = rng.integers(5, VOCAB, length).tolist()
        ids[0], ids[a + 1], ids[-1] = 2, 3, 3
        pos = sorted(rng.choice([i for i in range(1, length - 1) if i != a + 1], 3, replace=False).tolist())
        rows.append({"input_ids": ids, "a_length": a, "masked_lm_positions": pos,
                     "masked_lm_ids": rng.integers(5, VOCAB, 3).tolist(), "next_sentence_label": int(rng.integers(2))})
    return rows


def shard_for(world: int, directory: Path) -> str:
    """One shard whose contiguous split over `world` ranks gives rank r the r-th part of every global batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.schema import instance_schema

    rows, share = all_rows(), GLOBAL // world
    order = [i for rank in range(world) for s in range(0, len(rows), GLOBAL)
             for i in range(s + rank * share, s + (rank + 1) * share)]
    path = directory / f"world{world}.parquet"
    pq.write_table(pa.Table.from_pylist([rows[i] for i in order], schema=instance_schema(VOCAB)), path)
    return str(path)


def config(world: int, device: str, shard: str) -> PretrainConfig:
    cuda = device == "cuda"
    shards = manifest_of((shard,), (64,), max_seq_length=48, max_predictions=3, vocab_size=VOCAB)
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)),
        data=DataConfig(train=shards, micro_batch_size=GLOBAL // world, length_bucketing=False,
                        length_buckets=(16, 32, 48)),
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
    TorchTrainer(ray_loop, train_loop_config={"device": device, "out": str(out), "shard": shard_for(2, tmp_path)},
                 torch_config=TorchConfig(backend="gloo"),
                 scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=device == "cuda",
                                                        resources_per_worker=resources),
                 run_config=ray.train.RunConfig(name="two-ranks", storage_path=str(tmp_path / "ray"))).fit()
    return {int(step): metrics for step, metrics in json.loads(out.read_text())}


def one_rank(device: str, tmp_path: Path) -> dict[int, dict]:
    torch.manual_seed(0)
    return dict(fit(config(1, device, shard_for(1, tmp_path)), Worker(device=torch.device(device))).history)


def check_same(one: dict[int, dict], two: dict[int, dict], rel: float) -> None:
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    for step in one:
        for key in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
            assert two[step][key] == pytest.approx(one[step][key], rel=rel), (step, key)
        assert two[step]["mlm_accuracy"] == one[step]["mlm_accuracy"]
    assert one[1]["loss"] != one[STEPS]["loss"]  # the optimizer really stepped in between


def test_two_gloo_ranks_equal_one_rank_with_the_doubled_batch(ray_local, tmp_path):
    check_same(one_rank("cpu", tmp_path), two_ranks(tmp_path, "cpu"), rel=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_ranks_sharing_one_gpu_equal_one_rank(ray_local, tmp_path):
    check_same(one_rank("cuda", tmp_path), two_ranks(tmp_path, "cuda"), rel=1e-3)
