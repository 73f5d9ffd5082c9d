"""A build's identity and its resume rules: which config and inputs an output folder holds, finished or not.

``_work/config.json`` holds the config hash and the input stamps, taken at start. A finished build (manifest present,
same hash) is left alone; a different config is refused; an unfinished build with the same config is resumed, and
one whose inputs changed since it started is refused.
"""
from __future__ import annotations

import logging
from typing import Any

from pipeline.build.config import BuildConfig
from pipeline.schema import MANIFEST, SHARDS_DIR, WORK_DIR
from pipeline.storage import exists, join, list_names, read_json, remove_tree, write_json_atomic

log = logging.getLogger(__name__)


def finished_manifest(cfg: BuildConfig, chash: str) -> dict[str, Any] | None:
    """The manifest of a finished build of this config in ``cfg.output``, None when there is none; refuses a
    finished build of another config."""
    out, ep = cfg.output, cfg.endpoint_url
    manifest_url = join(out, MANIFEST)
    if not exists(manifest_url, ep):
        return None
    m = read_json(manifest_url, ep)
    if m.get("config_hash") != chash:
        raise ValueError(f"{out} already holds a finished dataset built with a different config (hash "
                         f"{str(m.get('config_hash'))[:12]} vs {chash[:12]}): use another --output")
    log.info("%s is already complete with this config: nothing to do", out)
    remove_tree(join(out, WORK_DIR), ep)  # a kill between manifest and clean-up leaves it behind
    return m


def check_state(cfg: BuildConfig, chash: str, inputs: list[dict]) -> None:
    """Refuse to mix two configs (or changed inputs) in one output; record ours for a later resume."""
    out, ep = cfg.output, cfg.endpoint_url
    state_url = join(out, WORK_DIR, "config.json")
    if exists(state_url, ep):
        state = read_json(state_url, ep)
        if state["config_hash"] != chash:
            raise ValueError(
                f"{out} holds an unfinished build with a different config (hash {state['config_hash'][:12]} vs "
                f"{chash[:12]}). Rerun with the same flags to resume it, or use another --output, or delete "
                f"{join(out, WORK_DIR)} to start over.")
        if state["inputs"] != inputs:
            raise ValueError(f"the inputs changed since the unfinished build in {out} started (size/etag/mtime);"
                             f" delete {join(out, WORK_DIR)} to start over, or restore the inputs")
        log.info("resuming the unfinished build in %s", out)
        return
    if list_names(join(out, SHARDS_DIR), ep):
        raise ValueError(f"{out} already holds shards but no manifest and no resumable state: use an empty --output")
    write_json_atomic(state_url, {"config_hash": chash, "config": cfg.identity(), "inputs": inputs}, ep)
