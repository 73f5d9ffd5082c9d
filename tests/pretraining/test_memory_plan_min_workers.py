"""`--num-workers MIN:MAX` plans the micro-batch for MIN workers, as docs/scaling.md says (issue 44, item 3): an
elastic run with a large MAX is not refused as if all MAX workers shared this machine's memory."""
from __future__ import annotations

import subprocess
import sys

from bert_core import PRESETS
from pretraining.memory import plan_for_workers


def plan(workers: tuple[int, int]):
    try:
        return plan_for_workers(PRESETS["bert_base"](vocab_size=30522), 256, workers, 128, 20, use_gpu=False,
                                budget_gb=None, requested=None, model_name="bert_base")
    except ValueError as e:
        return str(e)


def test_min_max_is_planned_for_min():
    one = plan((1, 1))
    assert isinstance(one, tuple), one  # bert_base fits one worker on this machine
    assert plan((1, 99)) == one  # not the memory of 1/99 of the machine


def test_the_batches_tool_states_its_default_batch_size():
    out = subprocess.run([sys.executable, "-m", "pretraining.batches", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "default: 256" in " ".join(out.stdout.split())
