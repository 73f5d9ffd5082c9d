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

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Flags that only say where to log: the workflow sets them at run time, and changing them reruns nothing.
TRACKING_FLAGS = frozenset({"parent-run-id", "mlflow-tracking-uri", "experiment"})


@dataclass
class JobStage:
    """One stage of the workflow: one run of a job, with its command line, upstream stages and outputs."""

    name: str                      # e.g. "dataset train", "pretrain phase1"
    job: str                       # jobs/<job>.py
    argv: list[str]                # the full command line after `python jobs/<job>.py`, tracking flags aside
    deps: list[str]                # names of the stages whose outputs this one reads
    fingerprint: str
    outputs: dict[str, str]        # what the stage produces: {"vocab": path} / {"dataset": url} / ...
    tracked: bool = True           # the job takes the tracking flags
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.name.replace(" ", ".")

    def command(self) -> str:
        return shlex.join(["python", f"jobs/{self.job}.py", *self.argv])

    def argv_with_tracking(self, tracking_uri: str, experiment: str, parent_run_id: str | None) -> list[str]:
        """The stage's argv plus where to log (kept out of the fingerprint)."""
        if not self.tracked:
            return list(self.argv)
        extra = ["--mlflow-tracking-uri", tracking_uri, "--experiment", experiment]
        if parent_run_id:
            extra += ["--parent-run-id", parent_run_id]
        return list(self.argv) + extra


def to_argv(args: Mapping[str, Any] | None) -> list[str]:
    """{"max-steps": 10, "use-gpu": True, "input": [a, b]} -> ["--max-steps", "10", "--use-gpu", "--input", a, ...]."""
    out: list[str] = []
    for k, v in (args or {}).items():
        flag = "--" + str(k).replace("_", "-")
        if v is None or v is False:
            continue
        if v is True:
            out.append(flag)
        elif isinstance(v, (list, tuple)):
            for item in v:
                out += [flag, str(item)]
        else:
            out += [flag, str(v)]
    return out


def input_stamps(inputs: list[str]) -> list[Any]:
    """Size and mtime of local input files: an edited corpus under the same name is a changed input."""
    stamps: list[Any] = []
    for i in inputs:
        p = Path(i)
        if "://" not in i and p.is_file():
            st = p.stat()
            stamps.append([i, st.st_size, int(st.st_mtime)])
        else:
            stamps.append(i)
    return stamps


def fingerprint(job: str, argv: list[str], deps: list[JobStage], extra: Any = None) -> str:
    body = json.dumps({"job": job, "argv": argv, "deps": {d.name: d.fingerprint for d in deps}, "extra": extra},
                      sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts]) if "://" in root else str(Path(root, *parts))


@dataclass
class Planned:
    """What the stages planned so far give the next ones: the workflow's name and workdir, and stages by name."""

    name: str
    workdir: str
    config: Mapping[str, Any]
    by_section: dict[str, dict[str, JobStage]] = field(default_factory=dict)


def plan(cfg: Mapping[str, Any], workdir: str) -> list[JobStage]:
    """The stages in dependency order: each section of the config planned by its job's spec. Pure: no file is
    touched (the fingerprints read input files' stats)."""
    from workflows.specs import SECTIONS

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
