"""The typed, frozen configuration of a pre-training run: one small dataclass per component, composed by
`PretrainConfig`.

Each component validates itself in `__post_init__` and says how to fix a bad value. Nothing below `fit` receives
the whole config: the loop hands each part to the piece that owns it. The job logs it as MLflow params
(`tracking.params.flatten_params`: dotted keys) and every checkpoint's train_state.json holds its
`dataclasses.asdict`, so a run is reproducible from what it logged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bert_core.config import BertConfig
from corpus.rng import DEFAULT_SEED
from pretraining import kernel_options
from pretraining.loader import DataConfig, EvalConfig
from pretraining.memory import MemoryConfig
from tracking.config import TrackingConfig
from training.guard import GuardConfig

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("linear", "poly")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture, and where the first weights come from (None: fresh, seeded by `RuntimeConfig.seed`)."""

    bert: BertConfig
    """The architecture (HF field names); with `init`, the one in init's config.json
    (`pretraining.pretrain_job.model_config`)."""
    init: str | None = None
    """An export, a checkpoint directory or any HF BERT directory: a local path, or a URL (s3://, gs://, ...) that
    every worker fetches into `init_cache` (so stages on a cluster need no shared volume). None: fresh weights."""
    init_vocab_sha256: str = ""
    """sha256 of init's vocab.txt ("" without one, or without init); `PretrainConfig` requires it to equal the
    dataset's vocabulary hash: same-size vocabularies with other tokens would give the ids other meanings."""
    init_cache: str | None = None
    """The local folder a URL init is fetched into (under the job's storage or working directory: the launch's
    `init_cache`); None for a local init."""
    init_endpoint_url: str | None = None
    """S3-compatible endpoint of an s3:// init (MinIO, Ceph, ...); None: the S3 client's default."""


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    name: str = "adamw"
    """"adamw" or "lamb" (`training.optim`; LAMB, You et al. 2019: a per-parameter trust ratio, for very large
    global batches)."""
    lr: float = 1e-4
    """Peak learning rate, reached at the end of warm-up. 1e-4 is the BERT paper's at BERT-base width and batch 256;
    the job passes a default for the model's width instead (`training.defaults`, docs/learning-rates.md)."""
    weight_decay: float = 0.01
    """Decoupled weight decay on the weight matrices; biases and LayerNorm weights get none, as in BERT's reference
    (`training.optim.param_groups`). 0.01 is BERT's."""
    warmup_steps: int = 0
    """Optimizer steps over which the rate ramps linearly from 0 to `lr`; 0: none. The job defaults to 10% of
    `max_steps` (`training.defaults.WARMUP_FRACTION`): a small model at a high rate without it diverged or stalled."""
    decay: str = "linear"
    """How the rate falls from `lr` after warm-up to 0 at `max_steps`: "linear", or "poly" ((1 - progress) **
    `poly_power`)."""
    poly_power: float = 0.5
    """The exponent of the "poly" decay (no effect on "linear")."""
    max_grad_norm: float = 1.0
    """The global L2 norm the gradients are clipped to before each update; <= 0 disables clipping (the norm is
    still measured and logged). 1.0 is the BERT reference's clip."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.name!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.decay not in DECAYS:
            raise ValueError(f"decay {self.decay!r}: use one of {', '.join(DECAYS)}")
        if not self.lr > 0 or self.weight_decay < 0 or self.warmup_steps < 0 or self.poly_power <= 0:
            raise ValueError("need --lr > 0, --weight-decay >= 0, --warmup-steps >= 0 and --poly-power > 0")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """How often, and what goes beside the weights. Where checkpoints live, and how many are kept, is the
    launcher's (`training.launch`: `worker.checkpoints`); `fit` without one writes none."""

    every: int = 1000
    """Optimizer steps between checkpoints; the last step always writes one."""
    vocab_url: str | None = None
    """The vocab.txt written beside the weights (the dataset's), so a checkpoint is a whole HF model directory;
    None: none."""
    do_lower_case: bool = True
    """Written to the tokenizer config beside the weights: whether text is lower-cased before WordPiece. It must be
    the dataset's (the job passes its vocabulary's)."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError("--checkpoint-every must be >= 1")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Device, precision, compilation, threads, budget and the seed every random draw derives from."""

    device: str = "auto"
    """"auto" (CUDA when torch sees a GPU, else CPU), "cpu" or "cuda"; the device the launcher gives a worker wins."""
    precision: str = "auto"
    """"auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32" or "bf16" (autocast; weights and optimizer state stay
    fp32)."""
    compile: bool | None = None
    """`torch.compile` the model (one static graph per batch width: `pretraining.compile`); None: on for CUDA, off
    for CPU."""
    compile_backend: str = "inductor"
    """The `torch.compile` backend: "inductor" generates fused kernels; "aot_eager" traces without code
    generation."""
    cuda_graphs: bool = False
    """Replay the compiled step as CUDA graphs (`pretraining.compile`: reduce-overhead; accum 1 only; no effect on
    CPU). Off: unmeasured here, and torch's graph trees mis-accumulate gradients across micro-batches."""
    fused_kernels: bool | None = None
    """bert_core's fused GPU kernels (`pretraining.kernel_options`): None = bert_core's default (the composition,
    the measured path), True / False = always / never."""
    low_precision_residual: bool = False
    """The fused LayerNorm sites keep the residual stream in bf16 under autocast (needs the fused kernels on). Off:
    whether the loss curve stays fp32's is unmeasured."""
    precompile_buckets: bool = True
    """Compile every length bucket's graph before the first step (forward + backward on a synthetic batch of each
    width, gradients dropped): no bucket's first appearance stalls a measured window later in the run."""
    compile_cache: str | None = None
    """A folder the operator trusts (its contents run as code: Inductor's caches are pickles and generated modules):
    compiled artifacts are saved there after each checkpoint and loaded before compiling, for a fast restart on any
    node that mounts it. None: only this node's private Inductor cache (`pretraining.compile`)."""
    compile_warmup_steps: int = 3
    """Steps kept out of throughput, MFU and HFU when compiling: their time is compilation."""
    exclude_steps: int | None = None
    """Steps kept out of throughput whatever the compile setting (benchmarks: allocator and cache warm-up too);
    None: `compile_warmup_steps` when compiling, else none."""
    threads: int | None = None
    """torch intra-op threads on a CPU worker (restored when `fit` returns); None: torch's own. The job passes its
    CPUs per worker, rounded."""
    peak_flops: float | None = None
    """The accelerator's peak in FLOP/s, the denominator of mfu and hfu; None: known GPUs' dense bf16 peak
    (`pretraining.perf.PEAK_BF16_FLOPS`), and no mfu on CPU."""
    max_seconds: float | None = None
    """Wall-clock budget of the training loop in seconds (--max-minutes): checked at every step, it stops at the
    first step past it (an overrun of at most one step), with a final eval, checkpoint and export; the lr schedule
    still spans `max_steps`. None: no budget: the run is bounded by `max_steps` alone."""
    seed: int = DEFAULT_SEED
    """The seed of every random draw of the run (initial weights, data order, dropout, dynamic masks, packing);
    12345 is create_pretraining_data.py's --random_seed (`corpus.rng.DEFAULT_SEED`)."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r}: use one of {', '.join(DEVICES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError("--threads must be >= 1")
        if self.compile_warmup_steps < 0 or (self.exclude_steps or 0) < 0:
            raise ValueError("compile_warmup_steps and exclude_steps must be >= 0")
        if self.compile_cache is not None and "://" in self.compile_cache:
            raise ValueError(f"--compile-cache {self.compile_cache}: name a folder (a local disk or a shared volume "
                             "that only you and your jobs can write), not a URL")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError("--max-minutes must be > 0")
        kernel_options.validate(self.fused_kernels, self.low_precision_residual)


@dataclass(frozen=True, kw_only=True)
class PretrainConfig:
    """Everything a pre-training run needs, composed from the components above."""

    model: ModelConfig
    """The architecture and where its first weights come from; checked against `data` in `__post_init__`."""
    data: DataConfig
    """The training stream: the dataset, the global batch and a worker's share of it, bucketing, masking, packing."""
    max_steps: int
    """Optimizer steps of the run; the lr schedule (warm-up, then decay to 0) spans them."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimizer, its learning-rate schedule and gradient clipping."""
    eval: EvalConfig | None = None
    """Held-out data for eval_* metrics; None: no evaluation."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """How often checkpoints are written and what goes beside the weights."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """How often metrics are logged to MLflow, and whether system metrics are."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Device, precision, compilation, threads, time budget and the seed."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The divergence guard (`training.guard`): when a non-finite or spiking loss skips a step or rolls back."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """The memory per worker the micro-batch is checked against at set-up."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("--max-steps must be >= 1")
        if self.optimizer.warmup_steps > self.max_steps:
            raise ValueError(f"--warmup-steps {self.optimizer.warmup_steps} exceeds --max-steps {self.max_steps}")
        # The model and its data must agree, whichever flags built them (the one place this is checked).
        train, bert, init = self.data.train, self.model.bert, self.model.init
        if train.vocab.size != bert.vocab_size:
            raise ValueError(f"the model{f' (--init {init})' if init else ''} has vocab_size {bert.vocab_size} but "
                             f"{train.url or 'the dataset'} was built with a {train.vocab.size}-entry vocabulary: "
                             "rebuild the dataset with the model's vocab.txt")
        if self.model.init_vocab_sha256 and train.vocab.sha256 and self.model.init_vocab_sha256 != train.vocab.sha256:
            raise ValueError(f"--init {init}'s vocab.txt differs from {train.url or 'the dataset'}'s (same size, other "
                             "tokens): the ids would mean different words; rebuild the data with that vocab")
        if self.eval is not None and self.eval.data.vocab.sha256 != train.vocab.sha256:
            raise ValueError(f"--eval-data {self.eval.data.url} was built with another vocabulary than --data "
                             f"{train.url}: rebuild it with --vocab {train.url}/vocab.txt")
        if train.max_seq_length > bert.max_position_embeddings:
            raise ValueError(f"{train.url or 'the dataset'} has sequences of {train.max_seq_length} tokens but the "
                             f"model has only {bert.max_position_embeddings} positions")
