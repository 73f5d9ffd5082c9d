"""A build's identity and its resume rules: which config and inputs an output folder holds, finished or not.

A dataset is its config *and* its inputs: ``_work/config.json`` holds the config hash and the input stamps (size,
etag, mtime; for an http(s) input without an ETag, a digest of its bytes) taken at start, and the manifest keeps
both. Rerunning a command on an output folder:

- finished, same config, same inputs: left alone ("already complete");
- finished, other config, or inputs changed since: refused, saying what differs. Never rebuilt in place: a training
  run may be reading it and MLflow records it by its manifest's digest, so replacing it would change what they
  point at;
- unfinished, same config and inputs: resumed (every committed item is kept);
- unfinished, other config or changed inputs: started over when it committed nothing yet (a build that failed at
  once, e.g. on a wrong --text-field, is retried with the fix); refused when it did, so that no work is lost by a
  mistyped flag.
"""
from __future__ import annotations

import logging
from typing import Any

from corpus.schema import SHARDS_DIR, WORK_DIR, manifest_stamps
from pipeline.config import BuildConfig
from pipeline.markers import SUFFIX
from storage.fs import exists, join, list_names, map_threads, read_json, remove_tree, write_json_atomic

log = logging.getLogger(__name__)

STATE_FILE = "config.json"
_SHOWN = 3  # changed inputs named in a message; the rest are counted


def input_changes(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """What differs between two input stamp lists, one readable item per input (added, removed, changed fields)."""
    before, after = {i["path"]: i for i in old}, {i["path"]: i for i in new}
    out = [f"{p} added" for p in sorted(after.keys() - before.keys())]
    out += [f"{p} removed" for p in sorted(before.keys() - after.keys())]
    for p in sorted(before.keys() & after.keys()):
        diff = [f"{k} {before[p].get(k)} -> {after[p].get(k)}" for k in ("size", "etag", "mtime", "digest")
                if before[p].get(k) != after[p].get(k)]
        if diff:
            out.append(f"{p}: {', '.join(diff)}")
    return out


def _listing(changes: list[str]) -> str:
    return "; ".join(changes[:_SHOWN]) + (f"; and {len(changes) - _SHOWN} more" if len(changes) > _SHOWN else "")


def finished(cfg: BuildConfig, chash: str, inputs: list[dict[str, Any]]) -> bool:
    """Whether ``cfg.output`` holds a finished build of this config and these inputs (False: no finished build);
    refuses one of another config or of other versions of the inputs."""
    out, ep = cfg.output, cfg.endpoint_url
    stamps = manifest_stamps(out, ep)
    if stamps is None:
        return False
    their_hash, their_inputs = stamps
    if their_hash != chash:
        raise ValueError(f"{out} already holds a finished dataset built with a different config (hash "
                         f"{their_hash[:12]} vs {chash[:12]}): use another --output")
    changes = input_changes(their_inputs, inputs)
    if changes:
        raise ValueError(f"{out} holds a finished dataset built from other versions of the inputs"
                         f" ({_listing(changes)}), so it is not this command's dataset and was left as it is. Use"
                         f" another --output, or delete {out} to rebuild it there")
    log.info("%s is already complete with this config and these inputs: nothing to do", out)
    remove_tree(join(out, WORK_DIR), ep)  # a kill between manifest and clean-up leaves it behind
    return True


def committed_items(work: str, endpoint_url: str | None = None, but: tuple[str, ...] = ()) -> int:
    """How many items an unfinished build has committed (markers under ``<work>/<stage>/``, but ``but``'s)."""
    stages = [n for n in list_names(work, endpoint_url) if n != STATE_FILE and n not in but]
    counts = map_threads(lambda n: sum(x.endswith(SUFFIX) for x in list_names(join(work, n), endpoint_url)), stages)
    return sum(counts)


def check_state(cfg: BuildConfig, chash: str, inputs: list[dict], keep: tuple[str, ...] = ()) -> None:
    """Refuse to mix two configs (or versions of the inputs) in one output; record ours for a later resume.
    ``keep``: the folders of ``_work`` a start over leaves (what this run has just written)."""
    out, ep = cfg.output, cfg.endpoint_url
    work = join(out, WORK_DIR)
    state_url = join(work, STATE_FILE)
    if exists(state_url, ep):
        state = read_json(state_url, ep)
        changes = input_changes(state["inputs"], inputs)
        if state["config_hash"] == chash and not changes:
            log.info("resuming the unfinished build in %s", out)
            return
        what = (f"a different config (hash {state['config_hash'][:12]} vs {chash[:12]})"
                if state["config_hash"] != chash else f"other versions of the inputs ({_listing(changes)})")
        done = committed_items(work, ep, keep)
        if done:
            raise ValueError(
                f"{out} holds an unfinished build with {what} that has committed {done} item(s). Rerun it with the same"
                f" flags and inputs to resume it, use another --output, or delete {work} to start over")
        log.info("starting over in %s: the unfinished build there had %s and had committed nothing", out, what)
        for name in list_names(work, ep):
            if name not in keep:
                remove_tree(join(work, name), ep)
    elif list_names(join(out, SHARDS_DIR), ep):
        raise ValueError(f"{out} already holds shards but no manifest and no resumable state: use an empty --output")
    write_json_atomic(state_url, {"config_hash": chash, "config": cfg.identity(), "inputs": inputs}, ep)
