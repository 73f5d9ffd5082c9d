"""`--help` of every job shows every default, and the flags a user tunes carry one line of advice."""
from __future__ import annotations

import argparse
import importlib
import re

import pytest

from jobs._common import HelpFormatter

JOBS = ("build_dataset", "train_tokenizer", "pretrain", "finetune", "workflow")
# The flags a user tunes, per job, and a word each one's help must contain (its advice).
TUNED = {
    "pretrain": {"--lr": "width", "--warmup-steps": "warm", "--max-steps": "step", "--batch-size": "batch"},
    "finetune": {"--lr": "width", "--warmup-ratio": "warm", "--epochs": "epoch", "--batch-size": "batch"},
}


def parser_of(job: str, monkeypatch) -> argparse.ArgumentParser:
    seen = []
    parse = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):
        seen.append(self)
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    with pytest.raises(SystemExit):
        importlib.import_module(f"jobs.{job}").parse_args(["--help"])
    return seen[0]


@pytest.mark.parametrize("job", JOBS)
def test_help_shows_every_default(job, monkeypatch, capsys):
    parser = parser_of(job, monkeypatch)
    capsys.readouterr()
    text = re.sub(r"\s+", " ", parser.format_help())
    assert parser.formatter_class is HelpFormatter
    for action in parser._actions:
        if HelpFormatter.shows_default(action):
            shown = action.default if not isinstance(action.default, (list, tuple)) else list(action.default)
            assert f"(default: {shown})" in text, (action.option_strings, action.default)


@pytest.mark.parametrize("job", sorted(TUNED))
def test_the_flags_a_user_tunes_carry_advice(job, monkeypatch):
    parser = parser_of(job, monkeypatch)
    helps = {o: a.help or "" for a in parser._actions for o in a.option_strings}
    for flag, word in TUNED[job].items():
        assert word in helps[flag].lower() and len(helps[flag]) > 60, (flag, helps[flag])
