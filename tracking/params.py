"""A typed config (dataclasses, mappings) as MLflow params: dotted keys, one length rule for every job."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
MAX_LIST_ITEMS = 8  # a longer list or tuple is logged as its length (`key.count`): shard URLs, input files


def flatten_params(value: Any, prefix: str = "") -> dict[str, str]:
    """A dataclass or mapping (nested) as MLflow params: dotted keys, values as text.

    One length rule for every job: a list or tuple of more than MAX_LIST_ITEMS items is logged as its length under
    `key.count` (thousands of shard URLs say nothing in a params table), and any value is cut to MLflow's
    MAX_PARAM_LENGTH characters."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten_params(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, (list, tuple)) and len(value) > MAX_LIST_ITEMS:
        return {f"{prefix}.count": str(len(value))}
    return {prefix: str(value)[:MAX_PARAM_LENGTH]}
