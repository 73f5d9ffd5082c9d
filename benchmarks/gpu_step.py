"""The pre-training step on a GPU: bert_core vs transformers BertForPreTraining, eager and compiled, same batches.

One process, one device. For each workload every variant gets the same initial weights and the same sequences, and
runs the full step: bf16 autocast forward and backward over the step's micro-batches (gradient accumulation keeps
the global batch), gradient clipping, fused AdamW. Throughput counts only the timed steps; the first step
(compilation) and the warm-up steps are printed separately. transformers runs with SDPA attention and, as HF's
BertForPreTraining does, projects every position onto the vocabulary.

Two utilisations per row, both against the device's dense bf16 peak (by name, or --peak-tflops):
- MFU: model FLOPs of the real tokens (`bert_core.flops.flops_per_sequence` summed over the real sequences: every
  encoder layer in full, the MLM head at the masked tokens only), the same for every variant; the convention of
  every MFU figure in docs/benchmarks.md;
- HFU: the FLOPs the variant executes (`bert_core.flops.executed_flops`): padding included; bert_core's last layer
  at [CLS] + the MLM slots only and its head at every slot; transformers' full last layer and head at every
  position.

    python benchmarks/gpu_step.py                               # BERT-base: seq 128 x 256 (20 masked), 512 x 32 (76-80)
    python benchmarks/gpu_step.py --shapes 128x512x20 --micro-batch 512                  # bigger micro-batches
    python benchmarks/gpu_step.py --shapes 128x256x20 --cuda-graphs                      # reduce-overhead (accum 1)
    python benchmarks/gpu_step.py --shapes 128x256x20 --fused-kernels on                 # the fused LayerNorm op
    python benchmarks/gpu_step.py --shapes 128x256x20 --fused-kernels on --low-precision-residual   # bf16 residual
    python benchmarks/gpu_step.py --data DIR --batch 32 --micro-batch 32 --packing       # real shards, packed rows
    python benchmarks/gpu_step.py --profile /tmp/gpu_prof       # + a torch.profiler trace and top-kernel table each
    python benchmarks/gpu_step.py --device cpu --preset bert_tiny --steps 3    # the same logic on a CPU

With --data the batches come from the training loader over a built dataset (length buckets, or --packing); the
transformers variants then run the same dataset padded to its length buckets (they cannot attend within packed
rows), and seq/s counts real sequences. Each compiled variant compiles once per shape (BERT-base: ~1.5 min on an
H100 with torch 2.11); under a time limit per command, run one workload per command.

bert_core runs Inductor's composition by default (`--fused-kernels auto`, the measured path); `--fused-kernels on`
swaps in the fused dropout + residual + LayerNorm op (docs/benchmarks.md, GPU: why it is not the default).

Prints a table per workload, `<workload> speedup_vs_transformers_compiled=X.XX` per workload, and last the
smallest of those as `speedup_vs_transformers_compiled=X.XX`. After each variant's row, one `result {...}` JSON
line with its figures (what benchmarks/gpu_suite.py reads): seq/s, MFU, HFU, the peak GPU memory and bert_core's
`pretraining.memory.estimate` of it (peak / estimate), the first step's seconds and the process's age at its end.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from step_batches import Step, dataset_steps, synthetic_steps  # noqa: E402

import bert_core  # noqa: E402
from bert_core.hf import to_hf_state_dict  # noqa: E402
from pretraining import kernel_options  # noqa: E402
from pretraining.compile import process_age  # noqa: E402
from training.optim import build_optimizer  # noqa: E402

VARIANTS = ("bert_core", "bert_core_compiled", "transformers", "transformers_compiled")
# Dense bf16 peak (TFLOP/s, no sparsity) by device name, most specific first.
PEAKS = (("H100 NVL", 835.0), ("H100 PCIE", 756.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
         ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("A10G", 70.0))
CONVENTION = ("MFU = model FLOPs of the real tokens (bert_core.flops.flops_per_sequence: every layer in full, MLM "
              "head at the masked tokens) / peak; HFU = FLOPs the variant executes (bert_core.flops.executed_flops) "
              "/ peak")


@dataclass(frozen=True)
class Shape:
    seq_len: int
    batch_size: int
    min_masked: int
    max_masked: int  # P: slots padded to this, as the loader pads to max_predictions_per_seq

    @staticmethod
    def parse(text: str) -> Shape:
        """"128x256x20" or "512x32x76-80": seq x batch x masked tokens per row (a range: drawn per row)."""
        try:
            seq, batch, masked = text.lower().split("x")
            lo, _, hi = masked.partition("-")
            shape = Shape(int(seq), int(batch), int(lo), int(hi or lo))
        except ValueError as e:
            raise ValueError(f"bad shape {text!r}: expected SEQxBATCHxMASKED, e.g. 128x256x20 or 512x32x76-80") from e
        if not 1 <= shape.min_masked <= shape.max_masked <= shape.seq_len - 2:
            raise ValueError(f"bad shape {text!r}: masked tokens must be within 1..seq_len-2")
        return shape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when available)")
    p.add_argument("--preset", default="bert_base", choices=sorted(bert_core.PRESETS))
    p.add_argument("--shapes", default=None,
                   help="comma-separated SEQxBATCHxMASKED (default: 128x256x20,512x32x76-80 on CUDA, "
                        "128x4x20,512x2x76-80 on CPU); BATCH is the global batch of a step")
    p.add_argument("--data", help="time the training loader's batches of this built dataset instead of shapes")
    p.add_argument("--batch", type=int, default=None, help="with --data: rows (packed rows) per step")
    p.add_argument("--packing", action="store_true", help="with --data: bert_core trains on packed rows")
    p.add_argument("--pack-sequences", type=int, default=3, help="at most this many sequences per packed row")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="rows per forward; the step accumulates batch / micro-batch of them (default: the batch)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps after the first (compiling) one (default: 3 on CUDA, 1 on CPU)")
    p.add_argument("--batches", type=int, default=4, help="distinct steps of batches, cycled")
    p.add_argument("--mode", default="default", choices=("default", "max-autotune", "max-autotune-no-cudagraphs",
                                                         "reduce-overhead"), help="torch.compile mode")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="compiled variants replay CUDA graphs (--mode reduce-overhead; one micro-batch per step)")
    p.add_argument("--fused-kernels", choices=tuple(kernel_options.FUSED_KERNELS), default="auto",
                   help=kernel_options.FUSED_KERNELS_HELP)
    p.add_argument("--low-precision-residual", action="store_true", help=kernel_options.LOW_PRECISION_RESIDUAL_HELP)
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend of the compiled variants (aot_eager: tracing without code generation, "
                        "for a quick CPU run of the same code path)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="autocast dtype (fp32: none)")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense peak for MFU (default: by device name)")
    p.add_argument("--profile", type=Path, default=None, help="folder for torch.profiler traces and tables")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                               "cpu" if args.device == "auto" else args.device)
    cuda = args.device.type == "cuda"
    default = "128x256x20,512x32x76-80" if cuda else "128x4x20,512x2x76-80"
    args.warmup = args.warmup if args.warmup is not None else 3 if cuda else 1
    args.shapes = [] if args.data else [Shape.parse(s) for s in (args.shapes or default).split(",")]
    if args.data and not args.batch:
        p.error("--data needs --batch (rows, or packed rows, per step)")
    if args.packing and not args.data:
        p.error("--packing needs --data: packing removes the padding of real data (synthetic rows have none)")
    batches = [args.batch] if args.data else [s.batch_size for s in args.shapes]
    args.micro_batch = args.micro_batch or min(batches)
    if any(b % args.micro_batch for b in batches):
        p.error(f"--micro-batch {args.micro_batch} must divide every batch {batches}")
    if args.cuda_graphs:
        if args.mode != "default":
            p.error("--cuda-graphs is --mode reduce-overhead; give one of them")
        if any(b != args.micro_batch for b in batches):
            p.error("--cuda-graphs needs one micro-batch per step: torch's CUDA graph trees mis-accumulate "
                    "gradients (pytorch#96693)")
        args.mode = "reduce-overhead"
    if args.mode != "default" and args.compile_backend != "inductor":
        p.error(f"--mode {args.mode} (and --cuda-graphs) are Inductor's: drop --compile-backend {args.compile_backend}")
    args.fused = kernel_options.FUSED_KERNELS[args.fused_kernels]
    try:
        kernel_options.validate(args.fused, args.low_precision_residual)
    except ValueError as e:
        p.error(str(e))
    args.variants = [v.strip() for v in args.variants.split(",")]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    return args


def peak_tflops(args: argparse.Namespace) -> float | None:
    if args.peak_tflops is not None:
        return args.peak_tflops
    if args.device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(args.device).upper()
    return next((peak for key, peak in PEAKS if key in name), None)


def build(variant: str, cfg: bert_core.BertConfig, hf_weights: dict, args: argparse.Namespace):
    """(model, callable batch -> loss). Every variant starts from the same weights."""
    if variant.startswith("bert_core"):
        model = bert_core.BertForPreTraining(cfg)
        model.load_state_dict(bert_core.hf.from_hf_state_dict(hf_weights, with_prefix=True), strict=False)
        model.tie_weights()
        kernel_options.apply(model, args.fused, args.low_precision_residual)

        def loss_fn(m, b):
            return m(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                     token_type_ids=b["token_type_ids"], masked_lm_positions=b["masked_lm_positions"],
                     masked_lm_labels=b["masked_lm_labels"], next_sentence_label=b["next_sentence_label"],
                     sequence_lengths=b.get("sequence_lengths")).loss
    else:
        import transformers

        hf_cfg = transformers.BertConfig(**{k: v for k, v in cfg.to_dict().items()
                                            if k not in ("architectures", "id2label", "label2id")},
                                         attn_implementation="sdpa")
        model = transformers.BertForPreTraining(hf_cfg)
        model.load_state_dict(hf_weights, strict=False)
        model.tie_weights()

        def loss_fn(m, b):
            return m(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                     token_type_ids=b["token_type_ids"], labels=b["labels"],
                     next_sentence_label=b["next_sentence_label"]).loss
    model = model.to(args.device).train()
    runner = model
    if variant.endswith("_compiled"):
        # dynamic=False: each shape is its own static graph; fullgraph for ours (a break would be a bug).
        runner = torch.compile(model, mode=None if args.mode == "default" else args.mode, dynamic=False,
                               fullgraph=variant.startswith("bert_core"), backend=args.compile_backend)
    return model, lambda b: loss_fn(runner, b)


@dataclass
class Result:
    seq_per_s: float
    model_flops_per_s: float
    executed_flops_per_s: float
    first_step_s: float
    warmup_s: float
    peak_mem_gib: float | None
    graphs: int
    recompiled: int
    final_loss: float
    process_age_s: float | None  # seconds from this process's start to the end of the variant's first step
    estimate_gib: float | None  # pretraining.memory.estimate of bert_core's step on CUDA (None for transformers)


def memory_estimate_gib(variant: str, cfg: bert_core.BertConfig, steps: list[Step], args) -> float | None:
    """What `pretraining.memory.estimate` (the planner a GPU job sizes its micro-batch with) says bert_core's step
    at these shapes needs on CUDA; None for transformers and on CPU."""
    if not variant.startswith("bert_core") or args.device.type != "cuda":
        return None
    from pretraining.memory import GIB, estimate

    batch = max((b for s in steps for b in s.micro), key=lambda b: b["input_ids"].numel())
    rows, width = batch["input_ids"].shape
    return estimate(cfg, rows, width, batch["masked_lm_positions"].shape[1], "cuda",
                    compiled=variant.endswith("_compiled")).total / GIB


def run_variant(variant: str, cfg, hf_weights, steps: list[Step], args, tag: str) -> Result:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gc.collect()
    cuda = args.device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(args.device)
    model, loss_of = build(variant, cfg, hf_weights, args)
    opt = build_optimizer(model, "adamw", lr=1e-4)  # fused AdamW, BERT's decay groups
    params = [p for p in model.parameters() if p.requires_grad]
    dtype = torch.bfloat16 if args.dtype == "bf16" else None
    graphs = args.mode == "reduce-overhead" and variant.endswith("_compiled")

    def step(s: Step):
        opt.zero_grad(set_to_none=True)
        for batch in s.micro:  # equal weights per micro-batch: a timing, not a training run
            if graphs:  # CUDA graphs reuse output buffers: tell them a new iteration starts
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(args.device.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_of(batch)
            (loss / len(s.micro)).backward()
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        opt.step()
        return loss.detach().clone()

    def sync():
        if cuda:
            torch.cuda.synchronize(args.device)

    start = time.perf_counter()
    step(steps[0])
    sync()
    first = time.perf_counter() - start
    age = process_age()
    start = time.perf_counter()
    for i in range(args.warmup):
        step(steps[(i + 1) % len(steps)])
    sync()
    warmup = time.perf_counter() - start
    graphs_before = counters["stats"]["unique_graphs"]
    timed = [steps[i % len(steps)] for i in range(args.steps)]
    start = time.perf_counter()
    for s in timed:
        loss = step(s)
    sync()
    elapsed = time.perf_counter() - start
    ours = variant.startswith("bert_core")
    result = Result(
        seq_per_s=sum(s.sequences for s in timed) / elapsed,
        model_flops_per_s=sum(s.model_flops for s in timed) / elapsed,
        executed_flops_per_s=sum(s.executed_ours if ours else s.executed_transformers for s in timed) / elapsed,
        first_step_s=first, warmup_s=warmup,
        peak_mem_gib=torch.cuda.max_memory_allocated(args.device) / 2**30 if cuda else None,
        graphs=graphs_before, recompiled=counters["stats"]["unique_graphs"] - graphs_before,
        final_loss=float(loss), process_age_s=age, estimate_gib=memory_estimate_gib(variant, cfg, steps, args))
    if args.profile is not None:
        profile(step, steps, args, f"{variant}_{tag}")
    return result


def profile(step, steps: list[Step], args, name: str) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    args.profile.mkdir(parents=True, exist_ok=True)
    cuda = args.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities, record_shapes=True) as prof:
        for i in range(3):
            step(steps[i % len(steps)])
        if cuda:
            torch.cuda.synchronize(args.device)
    prof.export_chrome_trace(str(args.profile / f"{name}.json"))
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    (args.profile / f"{name}.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40))


def workloads(args, cfg) -> list[tuple[str, str, dict[str, list[Step]]]]:
    """(tag, description, steps by variant family) per workload; "ours" and "theirs" share the same steps except
    with packed rows (transformers gets the same dataset padded to its buckets)."""
    out = []
    gen = torch.Generator().manual_seed(args.seed)
    for shape in args.shapes:
        steps = synthetic_steps(cfg, shape.seq_len, shape.batch_size, (shape.min_masked, shape.max_masked),
                                args.micro_batch, args.batches, args.device, gen)
        masked = sum(int((b["masked_lm_labels"] != -100).sum()) for s in steps for b in s.micro) / sum(
            s.sequences for s in steps)
        out.append((f"seq{shape.seq_len}", f"seq {shape.seq_len}, batch {shape.batch_size} (micro-batch "
                    f"{args.micro_batch}), {masked:.1f} masked/row (slots padded to {shape.max_masked})",
                    {"ours": steps, "theirs": steps}))
    if args.data:
        ours = dataset_steps(cfg, args.data, args.batch, args.micro_batch, args.packing, args.pack_sequences,
                             args.batches, args.device)
        theirs = ours
        if args.packing and any(v.startswith("transformers") for v in args.variants):
            theirs = dataset_steps(cfg, args.data, args.batch, args.micro_batch, False, 0, args.batches,
                                   args.device)
        real = sum(s.tokens for s in ours) / sum(s.sequences for s in ours)
        width = ours[0].micro[0]["input_ids"].shape[1]
        out.append(("packed" if args.packing else "data", f"{args.data}: {'packed rows' if args.packing else 'rows'} "
                    f"x {args.batch} per step (micro-batch {args.micro_batch}), {real:.1f} real tokens/sequence, "
                    f"first width {width}", {"ours": ours, "theirs": theirs}))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    torch.set_float32_matmul_precision("high")  # any fp32 matmul left may use TF32 (none should be, under bf16)
    cfg = bert_core.PRESETS[args.preset](max_position_embeddings=max([512] + [s.seq_len for s in args.shapes]))
    peak = peak_tflops(args)
    name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else f"CPU x{os.cpu_count()}"
    print(f"# {args.preset} (L={cfg.num_hidden_layers} H={cfg.hidden_size} V={cfg.vocab_size}) on {name}, "
          f"{args.dtype} autocast, fused AdamW, compile mode {args.mode}, fused kernels {args.fused_kernels}"
          f"{' (bf16 residual)' if args.low_precision_residual else ''}, "
          f"torch {torch.__version__}, "
          f"transformers {transformers.__version__}, peak {peak or 'unknown (pass --peak-tflops)'} TFLOP/s, "
          f"{args.steps} timed steps after 1 + {args.warmup} warm-up")
    print(f"# {CONVENTION}")
    torch.manual_seed(args.seed)
    hf_weights = to_hf_state_dict(bert_core.BertForPreTraining(cfg).state_dict())
    speedups = []
    for tag, description, steps in workloads(args, cfg):
        per_seq = sum(s.model_flops for s in steps["ours"]) / sum(s.sequences for s in steps["ours"])
        print(f"\n## {description}, {per_seq / 1e9:.1f} model GFLOP/sequence")
        print(f"{'variant':<24}{'seq/s':>10}{'MFU':>8}{'HFU':>8}{'peak GiB':>10}{'1st step s':>12}{'warm-up s':>11}"
              f"{'graphs':>8}{'recomp':>8}{'loss':>9}")
        results = {}
        for variant in args.variants:
            family = "ours" if variant.startswith("bert_core") else "theirs"
            r = results[variant] = run_variant(variant, cfg, hf_weights, steps[family], args, tag)
            mfu = f"{r.model_flops_per_s / (peak * 1e12):.1%}" if peak else "n/a"
            hfu = f"{r.executed_flops_per_s / (peak * 1e12):.1%}" if peak else "n/a"
            mem = f"{r.peak_mem_gib:.1f}" if r.peak_mem_gib is not None else "n/a"
            print(f"{variant:<24}{r.seq_per_s:>10.1f}{mfu:>8}{hfu:>8}{mem:>10}{r.first_step_s:>12.1f}"
                  f"{r.warmup_s:>11.1f}{r.graphs:>8}{r.recompiled:>8}{r.final_loss:>9.3f}", flush=True)
            print("result " + json.dumps({
                "workload": tag, "variant": variant, "fused_kernels": args.fused_kernels,
                "low_precision_residual": args.low_precision_residual, "seq_per_s": round(r.seq_per_s, 2),
                "mfu": round(r.model_flops_per_s / (peak * 1e12), 4) if peak else None,
                "hfu": round(r.executed_flops_per_s / (peak * 1e12), 4) if peak else None,
                "peak_gib": r.peak_mem_gib, "estimate_gib": r.estimate_gib, "first_step_s": round(r.first_step_s, 2),
                "process_age_s": r.process_age_s, "recompiled": r.recompiled, "final_loss": r.final_loss}),
                flush=True)
        if args.device.type == "cpu":
            print(f"(CPU: peak memory not tracked per variant; process max RSS "
                  f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB)")
        for ours, theirs in (("bert_core", "transformers"), ("bert_core_compiled", "transformers_compiled"),
                             ("bert_core_compiled", "bert_core")):
            if ours in results and theirs in results:
                print(f"{tag} {ours}/{theirs}={results[ours].seq_per_s / results[theirs].seq_per_s:.2f}")
        if "bert_core_compiled" in results and "transformers_compiled" in results:
            speedups.append(results["bert_core_compiled"].seq_per_s / results["transformers_compiled"].seq_per_s)
            print(f"{tag} speedup_vs_transformers_compiled={speedups[-1]:.2f}")
    if speedups:
        print(f"speedup_vs_transformers_compiled={min(speedups):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
