"""`BertPreTrainedModel`: what every model class shares: init, `save_pretrained` and `from_pretrained` in the
Hugging Face layout (config.json, model.safetensors, vocab.txt, tokenizer_config.json)."""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from . import hf
from .config import BertConfig
from .init import init_bert_weights

logger = logging.getLogger(__name__)
M = TypeVar("M", bound="BertPreTrainedModel")

_SKIP_INIT = False


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Skip random init while building a model whose weights are about to be loaded (the largest cost of
    from_pretrained on CPU); what the checkpoint lacks is initialised afterwards."""
    global _SKIP_INIT
    previous, _SKIP_INIT = _SKIP_INIT, True
    try:
        yield
    finally:
        _SKIP_INIT = previous


SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}


class BertPreTrainedModel(nn.Module):
    # Head models keep the encoder under `self.bert` (HF's `base_model_prefix`); BertModel sets this False.
    has_base_prefix: bool = True
    # Checkpoint keys that are fine to drop silently (e.g. the pooler when a head has none).
    ignore_unexpected: tuple[str, ...] = ()

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a bert_core.BertConfig, got {type(config).__name__}")
        self.config = config
        self.source_dir: Path | None = None  # where from_pretrained read us from (vocab.txt is carried over)

    def init_weights(self) -> None:
        if not _SKIP_INIT:
            self.apply(lambda m: init_bert_weights(m, self.config.initializer_range))

    def _init_missing(self, missing_keys: list[str]) -> None:
        """Initialise (non-recursively) the modules that own parameters the checkpoint did not provide."""
        owners = {key.rpartition(".")[0] for key in missing_keys}
        for name in owners:
            init_bert_weights(self.get_submodule(name), self.config.initializer_range)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- save -----------------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str | Path, vocab_file: str | Path | None = None,
                        do_lower_case: bool = True) -> Path:
        """Write the HF layout. vocab.txt comes from `vocab_file`, else from the directory we were loaded from."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        config = self.config.replace(architectures=(type(self).__name__,))
        config.to_json_file(out / "config.json")
        hf.save_weights(hf.to_hf_state_dict(self.state_dict()), out / "model.safetensors")
        if vocab_file is None and self.source_dir is not None and (self.source_dir / "vocab.txt").is_file():
            vocab_file = self.source_dir / "vocab.txt"
            tok_cfg = self.source_dir / "tokenizer_config.json"
            if tok_cfg.is_file():
                do_lower_case = bool(json.loads(tok_cfg.read_text()).get("do_lower_case", do_lower_case))
        if vocab_file is not None:
            write_tokenizer_files(out, vocab_file, do_lower_case, self.config.max_position_embeddings)
        else:
            logger.warning("save_pretrained(%s): no vocab_file given, so no vocab.txt is written; tokenizers cannot "
                           "be loaded from this directory", out)
        return out

    # ---- load -----------------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls: type[M], path: str | Path, config: BertConfig | None = None,
                        output_loading_info: bool = False, ignore_mismatched_sizes: bool = False,
                        **config_overrides: Any) -> M | tuple[M, dict[str, list]]:
        """Load an HF-layout directory (or a checkpoint directory with a `model/` subfolder) into this class.

        Works across classes like transformers: a bare BertModel (e.g. all-MiniLM) into a head model (the head is
        freshly initialised and logged as such), a pre-training checkpoint into a fine-tuning model, with or without
        the `bert.` key prefix. `config_overrides` change config fields (e.g. `num_labels=3`).
        """
        model_dir = hf.resolve_model_dir(path)
        if config is None:
            config = BertConfig.from_json_file(model_dir / "config.json", **config_overrides)
        elif config_overrides:
            config = config.replace(**config_overrides)
        with _no_init():
            model = cls(config)
        ckpt = hf.from_hf_state_dict(hf.load_weights(model_dir), with_prefix=cls.has_base_prefix)
        model_sd = model.state_dict()
        to_load, info = hf.match_state_dict(model_sd, ckpt, ignore_mismatched_sizes, model.ignore_unexpected)
        with torch.no_grad():
            model.load_state_dict(to_load, strict=False)
        model._init_missing(info.missing_keys + [k for k, _, _ in info.mismatched_keys])
        if info.missing_keys:
            logger.warning("%s: weights not in %s were newly initialised: %s (train them before use)",
                           cls.__name__, model_dir, info.missing_keys)
        if info.unexpected_keys:
            logger.warning("%s: checkpoint weights in %s not used by this class: %s",
                           cls.__name__, model_dir, info.unexpected_keys)
        model.source_dir = model_dir
        model.eval()  # like transformers: loaded models start in eval mode; call .train() to fine-tune
        return (model, info.as_dict()) if output_loading_info else model


def write_tokenizer_files(out: Path, vocab_file: str | Path, do_lower_case: bool, model_max_length: int) -> None:
    """vocab.txt plus the small configs `transformers.BertTokenizerFast.from_pretrained(out)` needs."""
    vocab_file = Path(vocab_file)
    if not vocab_file.is_file():
        raise ValueError(f"vocab_file {vocab_file} does not exist")
    if vocab_file.resolve() != (out / "vocab.txt").resolve():
        shutil.copyfile(vocab_file, out / "vocab.txt")
    tok_cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case,
               "strip_accents": None, "tokenize_chinese_chars": True, "clean_up_tokenization_spaces": False,
               "model_max_length": model_max_length, **SPECIAL_TOKENS}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n")
