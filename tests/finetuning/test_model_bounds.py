"""Issue 30, item 15: fine-tuning bounds the model it is handed like pre-training bounds its own. A config.json in an
--init folder (a model fetched from elsewhere) that asks for a model this machine cannot hold is refused at job
start, in one line naming the file, before anything is allocated; a real small model passes."""
from __future__ import annotations

import json
import shutil

import pytest

from bert_core.config import BertConfig
from finetuning.task_model import DEFAULT_VOCAB, HeadConfig, tokenizer_for
from training.model_size import check_fits, parameter_count


def _model_dir(tmp_path, **config) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", **config}))
    shutil.copy(DEFAULT_VOCAB, folder / "vocab.txt")
    return str(folder)


def test_a_crafted_config_is_refused_before_anything_is_allocated(tmp_path):
    init = _model_dir(tmp_path, vocab_size=30522, hidden_size=16384, num_hidden_layers=400, num_attention_heads=256,
                      intermediate_size=65536)
    with pytest.raises(ValueError, match=r"config\.json \(--init .*\): a model of .*M parameters .* needs ~.* GiB .*"
                                         r"more than the .* GiB free here") as refused:
        tokenizer_for(HeadConfig(init=init))
    assert "\n" not in str(refused.value)


def test_a_crafted_shape_for_a_random_init_is_refused_too(tmp_path):
    preset = _model_dir(tmp_path, vocab_size=30522, hidden_size=16384, num_hidden_layers=400,
                        num_attention_heads=256, intermediate_size=65536)
    with pytest.raises(ValueError, match=r"config\.json \(--preset\): a model of"):
        tokenizer_for(HeadConfig(init="random", preset=preset))


def test_the_bound_is_the_state_a_step_keeps():
    tiny = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=512)
    need = check_fits(tiny, "tiny", budget=1 << 40)
    assert need == 16 * parameter_count(tiny) + 512 * 2**20
    with pytest.raises(ValueError, match=r"^tiny: a model of 1M parameters"):
        check_fits(tiny, "tiny", budget=need - 1)
