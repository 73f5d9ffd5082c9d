"""pretraining.compile: only the batch widths the data can produce are compiled (from the manifest's lengths), the
synthetic warm-up batches have the loader's exact shapes (padded and packed), and CUDA graphs are a no-op on CPU."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from bert_core import bert_tiny
from corpus.schema import read_manifest
from pretraining.compile import compile_model, present_widths, synthetic_batch
from pretraining.config import ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig, train_batches
from pretraining.loop import fit
from tracking.config import TrackingConfig
from tracking.tracker import NullTracker
from training.worker import Worker

pytestmark = pytest.mark.timeout(600)


def data_config(data: str, **kw) -> DataConfig:
    vocab = Path(data, "vocab.txt").read_text().splitlines()
    return DataConfig(train=read_manifest(data), micro_batch_size=4, mask_id=vocab.index("[MASK]"), **kw)


def test_present_widths_from_the_manifest(varied_pretrain_data):
    data = data_config(varied_pretrain_data, length_buckets=(8, 16, 24, 32, 64))
    lengths = data.train.seq_lengths
    assert lengths and max(lengths) <= 64
    expected = {next(b for b in (8, 16, 24, 32, 64) if n <= b) for n in lengths}
    assert set(present_widths(data)) == expected
    assert 8 not in expected, "the fixture has no row of 8 tokens or fewer: that bucket must not be compiled"
    unknown = dataclasses.replace(data, train=dataclasses.replace(data.train, seq_len_histogram=()))
    assert present_widths(unknown) == (8, 16, 24, 32, 64)
    assert present_widths(data_config(varied_pretrain_data, packing=True, pack_width=128)) == (128,)


@pytest.mark.parametrize("packing", [False, True])
def test_synthetic_batches_have_the_loaders_shapes(varied_pretrain_data, packing):
    data = data_config(varied_pretrain_data, packing=packing)
    batches = train_batches(data, 600, seed=0, rank=0, world=1, start=0)
    try:
        real = next(batches)
    finally:
        batches.close()
    width = real["input_ids"].shape[1]
    fake = synthetic_batch(data, width, 600, torch.Generator().manual_seed(0))
    assert fake.keys() == real.keys()
    for key, value in real.items():
        assert tuple(fake[key].shape) == value.shape and fake[key].dtype == torch.from_numpy(value).dtype, key


class GraphCounter(NullTracker):
    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        super().__init__()
        self.base, self.graphs = int(counters["stats"]["unique_graphs"]), {}

    def log(self, metrics, step):
        from torch._dynamo.utils import counters

        self.graphs[step] = int(counters["stats"]["unique_graphs"]) - self.base


def test_fit_compiles_only_the_present_widths(varied_pretrain_data):
    torch._dynamo.reset()
    data = data_config(varied_pretrain_data, length_buckets=(8, 16, 24, 32, 64))
    config = PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=600, max_position_embeddings=64)), data=data, max_steps=2,
        optimizer=OptimizerConfig(lr=1e-3), tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device="cpu", threads=1, compile=True, compile_backend="aot_eager", seed=3))
    counter = GraphCounter()
    fit(config, Worker(tracker=counter))
    assert counter.graphs[1] == len(present_widths(data)) < len(data.length_buckets)


def test_cuda_graphs_have_no_effect_on_cpu(varied_pretrain_data):
    model = torch.nn.Linear(2, 2)
    runtime = RuntimeConfig(device="cpu", compile=True, compile_backend="aot_eager", cuda_graphs=True)
    compiled = compile_model(model, runtime, data_config(varied_pretrain_data, accum=2), torch.device("cpu"))
    assert not compiled._forward_pre_hooks  # no CUDA-graph step marker, and no refusal of accum > 1 on CPU
    assert torch.equal(compiled(torch.ones(1, 2)), model(torch.ones(1, 2)))
