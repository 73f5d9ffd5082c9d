"""A stage of the workflow: one run of a job (`JobStage`: its command line, upstream stages, outputs), and how a
stage is named and fingerprinted. Shared by the plan (`workflows.plan`) and the jobs' specs (`workflows.specs`)."""
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

    name: str
    """The stage's name, as the plan and its log lines show it: ``vocab``, ``dataset train``, ``pretrain phase1``."""
    job: str
    """The job it runs: ``jobs/<job>.py``."""
    argv: list[str]
    """The full command line after ``python jobs/<job>.py``, the tracking flags aside (added at run time)."""
    deps: list[str]
    """Names of the stages whose outputs this one reads: when one of them runs, this one runs again."""
    fingerprint: str
    """sha256 hex of the job, its argv and its upstream stages' fingerprints (and the sizes and mtimes of local input
    files, for the stages that read a corpus): a done-marker with another fingerprint does not count as done."""
    outputs: dict[str, str]
    """What the stage produces, by kind: ``{"vocab": path}``, ``{"dataset": url}``, ``{"export": ..., ...}``."""
    tracked: bool = True
    """Whether the job takes the tracking flags (--mlflow-tracking-uri, --experiment, --parent-run-id)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What else the plan knows of the stage, kept out of the fingerprint (a pre-training stage's ``run_name``)."""

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
    """The workflow's name (the config's ``name``, else ``workflow``): it prefixes pre-training run names."""
    workdir: str
    """The workflow's working directory: vocabularies, datasets, checkpoints and exports go under it by default."""
    config: Mapping[str, Any]
    """The whole workflow config, as loaded."""
    by_section: dict[str, dict[str, JobStage]] = field(default_factory=dict)
    """The stages planned so far, by config section then name: how a stage finds the ones it reads from."""
