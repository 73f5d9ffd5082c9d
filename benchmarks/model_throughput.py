"""Training steps per second: bert_core.BertForPreTraining vs transformers.BertForPreTraining.

Same config, batch, sequence length and masking; one step = forward + backward + AdamW step, both models in train
mode (dropout on). Each library computes the pre-training loss its standard way: transformers' BertForPreTraining
takes (B, T) `labels` and projects every position onto the vocabulary; bert_core takes the masked positions
(B, P) and projects only those. The two are timed alternately in one process (the order flips every round) after
warm-up, so drifting machine load hits both; the median round decides.

    python benchmarks/model_throughput.py                      # bert_mini, batch 32, seq 128, 15% masked, fp32
    python benchmarks/model_throughput.py --compile            # also torch.compile our model
    python benchmarks/model_throughput.py --max-predictions 20 --mlm-slots static   # padded slots, static path

The last line printed is `speedup_vs_transformers=X.XX`.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import bert_core  # noqa: E402
from training.optim import build_optimizer  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="bert_mini", choices=sorted(bert_core.PRESETS))
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--max-predictions", type=int, default=None,
                   help="P, the padded number of masked slots per row (default: exactly the masked count, no padding)")
    p.add_argument("--mlm-slots", choices=("auto", "static", "valid"), default="auto",
                   help="bert_core's MLM slots: all P slots (static shapes) or only the valid ones (auto: by device)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps-per-round", type=int, default=2)
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile bert_core's whole model as one graph (not the HF model); compiled, it takes "
                        "the static MLM slots and the one-GEMM head")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_batch(args: argparse.Namespace, gen: torch.Generator) -> dict[str, torch.Tensor]:
    b, t = args.batch_size, args.seq_len
    ids = torch.randint(1000, args.vocab_size, (b, t), generator=gen)
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, t // 2:] = 1
    n_pred = max(1, round(t * args.mask_prob))
    # Masked positions avoid [CLS] at 0 and the last ([SEP]); sorted, as the data builder writes them.
    positions = torch.stack([torch.randperm(t - 2, generator=gen)[:n_pred].sort().values + 1 for _ in range(b)])
    labels = torch.randint(1000, args.vocab_size, (b, n_pred), generator=gen)
    dense_labels = torch.full((b, t), -100, dtype=torch.long)
    dense_labels.scatter_(1, positions, labels)
    pad = (args.max_predictions or n_pred) - n_pred
    if pad > 0:  # as pretraining/loader.py collates: position 0, label -100
        positions = torch.cat([positions, torch.zeros(b, pad, dtype=torch.long)], dim=1)
        labels = torch.cat([labels, torch.full((b, pad), -100, dtype=torch.long)], dim=1)
    return dict(input_ids=ids, attention_mask=torch.ones(b, t, dtype=torch.long), token_type_ids=types,
                masked_lm_positions=positions, masked_lm_labels=labels, labels=dense_labels,
                next_sentence_label=torch.randint(0, 2, (b,), generator=gen))


def ours_step(model, opt, batch) -> float:
    opt.zero_grad(set_to_none=True)
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"],
                masked_lm_positions=batch["masked_lm_positions"], masked_lm_labels=batch["masked_lm_labels"],
                next_sentence_label=batch["next_sentence_label"])
    out.loss.backward()
    opt.step()
    return out.loss.item()


def hf_step(model, opt, batch) -> float:
    opt.zero_grad(set_to_none=True)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                next_sentence_label=batch["next_sentence_label"])
    out.loss.backward()
    opt.step()
    return out.loss.item()


def timed(step, model, opt, batch, n: int) -> tuple[float, float]:
    """(steps per wall-clock second, process CPU seconds per step). CPU time is reported too because on a shared
    machine wall time also measures the neighbours; with --threads 1 CPU time is close to the work itself."""
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(n):
        step(model, opt, batch)
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = bert_core.PRESETS[args.preset](vocab_size=args.vocab_size, max_position_embeddings=max(512, args.seq_len))
    ours = bert_core.BertForPreTraining(cfg).train()
    ours.static_mlm = {"auto": None, "static": True, "valid": False}[args.mlm_slots]
    hf_cfg = transformers.BertConfig(**{k: v for k, v in cfg.to_dict().items()
                                        if k not in ("architectures", "id2label", "label2id")})
    theirs = transformers.BertForPreTraining(hf_cfg).train()
    # Same starting weights: the export path is also what users run.
    theirs.load_state_dict(bert_core.hf.to_hf_state_dict(ours.state_dict()), strict=False)
    runner = ours
    if args.compile:
        runner = torch.compile(ours, fullgraph=True)
    opt_ours = build_optimizer(ours, "adamw", lr=1e-4)
    opt_hf = build_optimizer(theirs, "adamw", lr=1e-4)
    batch = make_batch(args, torch.Generator().manual_seed(args.seed))

    n_masked = int((batch["masked_lm_labels"] != -100).sum(1).float().mean())
    print(f"# {args.preset} (L={cfg.num_hidden_layers} H={cfg.hidden_size} V={cfg.vocab_size}), batch "
          f"{args.batch_size} x seq {args.seq_len}, {batch['masked_lm_positions'].shape[1]} slots/seq "
          f"({n_masked} masked), MLM slots {args.mlm_slots}, fp32, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
          f"{platform.machine()} {os.cpu_count()} CPUs{' , compiled' if args.compile else ''}")
    for _ in range(args.warmup_steps):
        ours_step(runner, opt_ours, batch)
        hf_step(theirs, opt_hf, batch)
    rates: dict[str, list[float]] = {"bert_core": [], "transformers": []}
    cpu: dict[str, list[float]] = {"bert_core": [], "transformers": []}
    for r in range(args.rounds):
        order = [("bert_core", ours_step, runner, opt_ours), ("transformers", hf_step, theirs, opt_hf)]
        for name, step, model, opt in (order if r % 2 == 0 else order[::-1]):
            rate, cpu_s = timed(step, model, opt, batch, args.steps_per_round)
            rates[name].append(rate)
            cpu[name].append(cpu_s)
        print(f"round {r}: bert_core {rates['bert_core'][-1]:.3f} steps/s, "
              f"transformers {rates['transformers'][-1]:.3f} steps/s", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in rates.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"{'model':<14}{'steps/s (median)':>18}{'min':>9}{'max':>9}{'seq/s':>10}{'CPU s/step':>12}")
    for k, v in rates.items():
        print(f"{k:<14}{med[k]:>18.3f}{min(v):>9.3f}{max(v):>9.3f}{med[k] * args.batch_size:>10.1f}"
              f"{med_cpu[k]:>12.2f}")
    print(f"cpu_time_ratio={med_cpu['transformers'] / med_cpu['bert_core']:.2f}")
    print(f"speedup_vs_transformers={med['bert_core'] / med['transformers']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
