"""The workflow's plan: a config -> an ordered list of stages, each one stand-alone job's exact command line, and
which of them must run.

A stage is `python jobs/<job>.py <argv>`: the config gives each stage's own flags (`args:`, spelled as on the job's
command line) and the job's spec (`workflows.specs`) adds the wiring between stages (inputs, outputs, --init).
Output locations carry the first 8 hex digits of the stage's *fingerprint* (a hash of its job, its flags and its
upstream stages' fingerprints): a changed config lands in a fresh location and reruns that stage and everything
downstream, an unchanged one finds its finished output and is skipped, an interrupted one resumes in place (the
jobs themselves resume: dataset builds continue, pre-training restarts from its last checkpoint under the same
--run-name).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.specs import SECTIONS
from workflows.stage import JobStage, Planned


def plan(cfg: Mapping[str, Any], workdir: str) -> list[JobStage]:
    """The stages in dependency order: each section of the config planned by its job's spec. Pure: no file is
    touched (the fingerprints read input files' stats)."""
    planned = Planned(cfg.get("name") or "workflow", workdir, cfg)
    stages: list[JobStage] = []
    for section, spec in SECTIONS.items():
        entries = cfg.get(section)
        if not entries:
            continue
        if not spec.named:  # a single stage (the vocabulary), named after its section
            entries = {section: entries}
        made = planned.by_section.setdefault(section, {})
        for name, entry in entries.items():
            made[name] = spec.stage(name, entry or {}, planned)
            stages.append(made[name])
    return stages


def to_run(stages: list[JobStage], finished: Mapping[str, bool]) -> dict[str, bool]:
    """Which stages run: those not finished (done-marker matching, output complete), and everything downstream of
    a stage that runs (its inputs are about to be (re)made)."""
    todo = {s.name: not finished.get(s.name, False) for s in stages}
    for s in stages:  # dependency order: upstream decisions are final when a stage is reached
        if any(todo.get(d) for d in s.deps):
            todo[s.name] = True
    return todo
