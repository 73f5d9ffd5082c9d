"""pretraining.memory's estimate against the measured peak RSS of real CPU training steps, one fresh process per case.

    python benchmarks/memory_fit.py                    # the default cases (bert_mini .. bert_base)
    python benchmarks/memory_fit.py bert_base 32 128   # one case: preset, micro-batch, sequence length

Each case runs two AdamW steps (`training.step.train_step`, eager fp32, 30,522-entry vocabulary, 15% of the
tokens masked) in a subprocess and prints the process's peak RSS (VmHWM, torch's own footprint included), the
estimate, and estimate / measured: above 1 means the planner is on the safe side.
"""
from __future__ import annotations

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


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(REPO))
    cases = [(argv[0], int(argv[1]), int(argv[2]))] if argv else CASES
    for case in cases:
        measure(*case)


if __name__ == "__main__":
    main(sys.argv[1:])
