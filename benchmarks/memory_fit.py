"""pretraining.memory's estimate against the measured peak RSS of real CPU training steps, one fresh process per case.

    python benchmarks/memory_fit.py                    # the default cases (bert_mini .. bert_base)
    python benchmarks/memory_fit.py bert_base 32 128   # one case: preset, micro-batch, sequence length
    python benchmarks/memory_fit.py --gpu              # the GPU estimate against the measured GPU peaks, and plans

Each case runs two AdamW steps (`training.step.train_step`, eager fp32, 30,522-entry vocabulary, 15% of the
tokens masked) in a subprocess and prints the process's peak RSS (VmHWM, torch's own footprint included), the
estimate, and estimate / measured: above 1 means the planner is on the safe side.

--gpu runs nothing: it prints, one line each, the GPU peaks measured so far (`pretraining.memory.MEASURED_GPU`:
machine, date, shape, peak) beside the GPU estimate as `estimate/measured R`, then the plan (micro-batch,
accumulation) for BERT-base phase 2, 256 x 512 with 80 masked slots, on an 80 GB and a 40 GB GPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = [("bert_mini", 32, 128), ("bert_mini", 8, 512), ("bert_small", 32, 128), ("bert_base", 8, 128),
         ("bert_base", 32, 128), ("bert_base", 64, 128)]

CHILD = """
import json, sys
import torch
torch.set_num_threads(2)
from bert_core import PRESETS, BertForPreTraining
from training.optim import build_optimizer
from pretraining.step import train_step
from pretraining.memory import peak_rss
name, b, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p, v = max(1, round(0.15 * t)), 30522
config = PRESETS[name](vocab_size=v)
batch = {"input_ids": torch.randint(5, v, (b, t)), "attention_mask": torch.ones(b, t, dtype=torch.int64),
         "token_type_ids": torch.zeros(b, t, dtype=torch.int64),
         "masked_lm_positions": (torch.arange(p) % (t - 1) + 1).expand(b, p).contiguous(),
         "masked_lm_labels": torch.randint(5, v, (b, p)), "next_sentence_label": torch.zeros(b, dtype=torch.int64)}
model = BertForPreTraining(config).train()
optimizer = build_optimizer(model)
for _ in range(2):
    train_step(model, optimizer, [batch])
print(json.dumps({"peak": peak_rss(), "predictions": p}))
"""


def measure(name: str, micro: int, seq: int) -> None:
    from bert_core import PRESETS
    from pretraining.memory import estimate

    out = subprocess.run([sys.executable, "-c", CHILD, name, str(micro), str(seq)], cwd=REPO, capture_output=True,
                         text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    if out.returncode:
        print(f"{name} {micro}x{seq}: failed\n{out.stderr[-2000:]}")
        return
    got = json.loads(out.stdout.strip().splitlines()[-1])
    est = estimate(PRESETS[name](vocab_size=30522), micro, seq, got["predictions"]).total
    print(f"{name:11s} {micro:4d} x {seq:4d}  measured {got['peak'] / 2**20:7.0f} MiB  estimate {est / 2**20:7.0f} MiB"
          f"  estimate/measured {est / got['peak']:.3f}", flush=True)


def gpu_report() -> list[str]:
    from bert_core import PRESETS
    from pretraining.memory import GIB, HEADROOM, MEASURED_GPU, estimate, plan_micro_batch

    lines = []
    for m in MEASURED_GPU:
        est = estimate(PRESETS[m.preset](vocab_size=30522), m.micro_batch, m.seq_len, m.predictions, "cuda",
                       m.compiled).total / GIB
        lines.append(f"{m.machine}, {m.date}: {m.preset} {m.micro_batch} x {m.seq_len} "
                     f"{'compiled' if m.compiled else 'eager'} peak {m.peak_gib:.1f} GiB, estimate {est:.2f} GiB, "
                     f"estimate/measured {est / m.peak_gib:.2f}")
    bert = PRESETS["bert_base"](vocab_size=30522)
    for gb in (80, 40):
        chosen = plan_micro_batch(bert, 256, 512, 80, gb * 10**9, device_type="cuda", model_name="bert_base")
        lines.append(f"plan: bert_base 256 x 512 (80 masked) on a {gb} GB GPU: micro-batch {chosen.micro_batch}, "
                     f"accumulation {chosen.accum} (estimate {chosen.estimate.total / GIB:.1f} GiB of "
                     f"{gb * 10**9 * HEADROOM / GIB:.1f} GiB plannable)")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", nargs="*", help="PRESET MICRO_BATCH SEQ_LEN: one CPU case (default: the list above)")
    p.add_argument("--gpu", action="store_true", help="the GPU estimate against the measured GPU peaks, and plans "
                   "(runs nothing, needs no GPU)")
    args = p.parse_args(argv)
    if args.case and (args.gpu or len(args.case) != 3):
        p.error("give PRESET MICRO_BATCH SEQ_LEN (e.g. bert_base 32 128), or --gpu alone")
    sys.path.insert(0, str(REPO))
    if args.gpu:
        print("\n".join(gpu_report()))
        return 0
    cases = [(args.case[0], int(args.case[1]), int(args.case[2]))] if args.case else CASES
    for case in cases:
        measure(*case)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
