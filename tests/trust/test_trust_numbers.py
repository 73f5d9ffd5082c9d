"""Issue 43, item 8, written as the attacks: NaN or inf was accepted by --max-minutes, --lr, --weight-decay,
--max-grad-norm, --poly-power, --peak-tflops, --resize-check-seconds and fine-tuning's config.json
(`layer_norm_eps: NaN`), and `--memory-gb nan` was answered without naming the flag; a forged train_state.json with a
step beyond --max-steps made a rerun report the run complete. Now each number is refused where it is parsed, naming
the flag (argparse's `argument --X:` line, exit 2), and a state whose step is not its checkpoint's is refused."""
from __future__ import annotations

import json

import pytest

PRETRAIN = ["--data", "ds", "--max-steps", "1"]
FINETUNE = ["--task", "classification", "--train", "t.jsonl", "--init", "random", "--preset", "bert_tiny"]


def _refused(capsys, parse, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag", ["--max-minutes", "--lr", "--weight-decay", "--max-grad-norm", "--poly-power",
                                  "--peak-tflops", "--resize-check-seconds", "--memory-gb", "--cpus-per-worker"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_pretraining_refuses_a_number_that_is_not_finite(capsys, flag, value):
    from jobs import pretrain

    line = _refused(capsys, pretrain.parse_args, [*PRETRAIN, f"{flag}={value}"])  # -inf would read as a flag
    assert line.startswith(f"pretrain: error: argument {flag}: {value!r}: give a finite number"), line


@pytest.mark.parametrize("flag, value", [("--lr", "0"), ("--lr", "-1e-3"), ("--weight-decay", "-0.1"),
                                         ("--max-minutes", "0"), ("--memory-gb", "-2"), ("--poly-power", "0")])
def test_pretraining_refuses_a_number_out_of_range(capsys, flag, value):
    from jobs import pretrain

    assert f"argument {flag}: {value!r}: give a finite number" in _refused(capsys, pretrain.parse_args,
                                                                          [*PRETRAIN, f"{flag}={value}"])


@pytest.mark.parametrize("flag", ["--lr", "--weight-decay", "--warmup-ratio", "--cpus-per-worker",
                                  "--split-eval-from-train"])
def test_fine_tuning_refuses_a_number_that_is_not_finite(capsys, flag):
    from jobs import finetune

    line = _refused(capsys, finetune.parse_args, [*FINETUNE, flag, "nan"])
    assert f"argument {flag}: 'nan': give a finite number" in line


@pytest.mark.parametrize("flag", ["--masked-lm-prob", "--short-seq-prob", "--max-unk-fraction"])
def test_every_float_flag_declared_from_a_field_is_finite(capsys, flag):
    from jobs import build_dataset

    line = _refused(capsys, build_dataset.parse_args, ["--input", "c.txt", "--output", "out", flag, "inf"])
    assert f"argument {flag}: 'inf': give a finite number" in line


def test_sane_numbers_still_parse():
    from jobs import pretrain

    a = pretrain.parse_args([*PRETRAIN, "--lr", "1e-4", "--weight-decay", "0", "--max-minutes", "0.5",
                             "--memory-gb", "2", "--max-grad-norm", "0"])
    assert (a.lr, a.weight_decay, a.max_minutes, a.memory_gb, a.max_grad_norm) == (1e-4, 0.0, 0.5, 2.0, 0.0)


@pytest.mark.parametrize("key, value", [("layer_norm_eps", "NaN"), ("layer_norm_eps", "Infinity"),
                                        ("initializer_range", "NaN"), ("layer_norm_eps", "-1e-12")])
def test_a_model_config_json_with_a_nonsense_float_is_refused(tmp_path, key, value):
    from bert_core.config import BertConfig

    good = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64)
    good.to_json_file(tmp_path / "config.json")
    text = (tmp_path / "config.json").read_text()
    data = json.loads(text)
    (tmp_path / "config.json").write_text(text.replace(f'"{key}": {json.dumps(data[key])}', f'"{key}": {value}'))
    assert value in (tmp_path / "config.json").read_text()
    with pytest.raises(ValueError, match=f"BertConfig.{key} must be a finite number"):
        BertConfig.from_json_file(tmp_path / "config.json")


def test_a_train_state_whose_step_is_not_its_checkpoints_is_refused(tmp_path):
    """A forged train_state.json saying step 1,000,000 in checkpoint-00000003 (a rerun took it as past --max-steps
    and reported the run complete, exit 0)."""
    import torch

    from training.checkpoint import checkpoint_name, load_train_state, save_train_state

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    folder = tmp_path / checkpoint_name(3)
    folder.mkdir()
    save_train_state(folder, optimizer, extra={"step": 3})
    assert load_train_state(folder, optimizer)["step"] == 3
    state = json.loads((folder / "train_state.json").read_text())
    for forged in (1_000_000, 2.5, -1, "3"):
        (folder / "train_state.json").write_text(json.dumps({**state, "step": forged}))
        with pytest.raises(ValueError, match="train_state.json: step"):
            load_train_state(folder, optimizer)
