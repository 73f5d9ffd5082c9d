"""The workflow's plan: a YAML config -> an ordered list of stages, each one stand-alone job's exact command line.

A stage is `python jobs/<job>.py <argv>`: the config gives each stage's own flags (`args:`, spelled as on the job's
command line) and the plan adds the wiring between stages (inputs, outputs, --init, MLflow parent). Output
locations carry the first 8 hex digits of the stage's *fingerprint* (a hash of its job, its flags and its
upstream stages' fingerprints): a changed config lands in a fresh location and reruns that stage and everything
downstream, an unchanged one finds its finished output and is skipped, an interrupted one resumes in place (the
jobs themselves resume: dataset builds continue, pre-training restarts from its last checkpoint under the same
--run-name).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Flags the plan sets itself; a config that sets them in `args:` is refused (it would break the wiring).
WIRED = {
    "train_tokenizer": {"input", "output"},
    "build_dataset": {"input", "output", "parent-run-id", "mlflow-tracking-uri", "experiment"},
    "pretrain": {"data", "eval-data", "storage", "run-name", "export", "init", "parent-run-id",
                 "mlflow-tracking-uri", "experiment"},
    "finetune": {"init", "output", "parent-run-id", "mlflow-tracking-uri", "experiment"},
}
# Flags that only say where to log: changing them must not rerun finished work.
NOT_FINGERPRINTED = {"parent-run-id", "mlflow-tracking-uri", "experiment"}
TOP_KEYS = {"name", "workdir", "mlflow", "vocab", "datasets", "pretrain", "finetune"}


@dataclass
class Stage:
    name: str                      # e.g. "dataset train", "pretrain phase1"
    job: str                       # jobs/<job>.py
    argv: list[str]                # the full command line after `python jobs/<job>.py`
    deps: list[str]                # names of the stages whose outputs this one reads
    fingerprint: str
    outputs: dict[str, str]        # what the stage produces: {"vocab": path} / {"dataset": url} / ...
    mlflow: bool = True            # the job takes --parent-run-id (train_tokenizer does not)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.name.replace(" ", ".")

    def command(self) -> str:
        import shlex

        return shlex.join(["python", f"jobs/{self.job}.py", *self.argv])


def to_argv(args: dict[str, Any] | None) -> list[str]:
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


def _input_stamps(inputs: list[str]) -> list[Any]:
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


def fingerprint(job: str, argv: list[str], deps: list[Stage], extra: Any = None) -> str:
    body = json.dumps({"job": job, "argv": argv, "deps": {d.name: d.fingerprint for d in deps}, "extra": extra},
                      sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def _args(spec: dict, job: str, where: str) -> dict[str, Any]:
    args = {str(k).replace("_", "-"): v for k, v in (spec.get("args") or {}).items()}
    clash = sorted(set(args) & WIRED[job])
    if clash:
        raise ValueError(f"{where}: args {clash} are set by the workflow (it wires stages together); remove them")
    return args


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts]) if "://" in root else str(Path(root, *parts))


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    cfg = yaml.safe_load(Path(path).read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a YAML mapping with keys {sorted(TOP_KEYS)}")
    unknown = set(cfg) - TOP_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown top-level keys {sorted(unknown)}; known: {sorted(TOP_KEYS)}")
    for key in ("datasets", "pretrain", "finetune"):
        if not isinstance(cfg.get(key) or {}, dict):
            raise ValueError(f"{path}: `{key}` must be a mapping of name -> stage")
    if not cfg.get("datasets") or not cfg.get("pretrain"):
        raise ValueError(f"{path}: needs at least one entry under `datasets` and one under `pretrain`")
    return cfg


def plan(cfg: dict[str, Any], workdir: str) -> list[Stage]:
    """The stages in dependency order. Pure: no file is touched (the fingerprints read input files' stats)."""
    name = cfg.get("name") or "workflow"
    stages: list[Stage] = []
    vocab_stage: Stage | None = None

    vspec = cfg.get("vocab")
    if vspec:
        if not vspec.get("input"):
            raise ValueError("vocab: needs `input` (the corpus to train the WordPiece vocabulary on)")
        inputs = list(vspec["input"]) if isinstance(vspec["input"], list) else [vspec["input"]]
        args = _args(vspec, "train_tokenizer", "vocab")
        base = to_argv(args) + to_argv({"input": inputs})
        fp = fingerprint("train_tokenizer", base, [], _input_stamps(inputs))
        out = _join(workdir, "vocab", f"vocab-{fp[:8]}.txt")
        vocab_stage = Stage("vocab", "train_tokenizer", base + ["--output", out], [], fp, {"vocab": out},
                            mlflow=False)
        stages.append(vocab_stage)

    datasets: dict[str, Stage] = {}
    for dname, spec in cfg["datasets"].items():
        where = f"datasets.{dname}"
        spec = spec or {}
        inputs = spec.get("input")
        if not inputs:
            raise ValueError(f"{where}: needs `input` (files, directories or globs; local or s3://)")
        inputs = list(inputs) if isinstance(inputs, list) else [inputs]
        args = _args(spec, "build_dataset", where)
        deps = []
        if "vocab" not in args and vocab_stage is not None:
            args["vocab"] = vocab_stage.outputs["vocab"]
            deps = [vocab_stage]
        base = to_argv(args) + to_argv({"input": inputs})
        fp = fingerprint("build_dataset", base, deps, _input_stamps(inputs))
        out = _join(spec.get("output_root") or _join(workdir, "datasets"), f"{dname}-{fp[:8]}")
        datasets[dname] = Stage(f"dataset {dname}", "build_dataset", base + ["--output", out],
                                [d.name for d in deps], fp, {"dataset": out})
        stages.append(datasets[dname])

    phases: dict[str, Stage] = {}
    for pname, spec in cfg["pretrain"].items():
        where = f"pretrain.{pname}"
        spec = spec or {}
        args = _args(spec, "pretrain", where)
        deps: list[Stage] = []
        wiring: dict[str, Any] = {}
        for key, flag in (("data", "data"), ("eval_data", "eval-data")):
            ref = spec.get(key)
            if ref is None:
                if key == "data":
                    raise ValueError(f"{where}: needs `data: <name under datasets>`")
                continue
            if ref not in datasets:
                raise ValueError(f"{where}.{key}: {ref!r} is not one of the datasets {sorted(datasets)}")
            deps.append(datasets[ref])
            wiring[flag] = datasets[ref].outputs["dataset"]
        init = spec.get("init")
        if init is not None:
            if init in phases:
                deps.append(phases[init])
                wiring["init"] = phases[init].outputs["export"]
            elif init in cfg["pretrain"]:
                raise ValueError(f"{where}.init: phase {init!r} must come before {pname!r}")
            else:
                wiring["init"] = init  # a model directory given by path (an HF BERT, an earlier export)
        base = to_argv(args)
        fp = fingerprint("pretrain", base + to_argv({"init": wiring.get("init") if init not in phases else None}),
                         deps)
        run_name = f"{name}-{pname}-{fp[:8]}"
        storage = spec.get("storage") or _join(workdir, "checkpoints")
        export = _join(workdir, "exports", f"{pname}-{fp[:8]}")
        argv = base + to_argv(wiring) + ["--storage", storage, "--run-name", run_name, "--export", export]
        phases[pname] = Stage(f"pretrain {pname}", "pretrain", argv, [d.name for d in deps], fp,
                              {"export": export, "checkpoints": _join(storage, run_name)}, info={"run_name": run_name})
        stages.append(phases[pname])

    last_phase = list(phases)[-1]
    for tname, spec in (cfg.get("finetune") or {}).items():
        where = f"finetune.{tname}"
        spec = spec or {}
        args = _args(spec, "finetune", where)
        init = spec.get("init", last_phase)
        if init not in phases:
            raise ValueError(f"{where}.init: {init!r} is not one of the pretrain phases {sorted(phases)}")
        base = to_argv(args)
        fp = fingerprint("finetune", base, [phases[init]])
        out = _join(workdir, "finetune", f"{tname}-{fp[:8]}")
        argv = base + ["--init", phases[init].outputs["export"], "--output", out]
        stages.append(Stage(f"finetune {tname}", "finetune", argv, [phases[init].name], fp, {"model": out}))
    return stages


def with_tracking(stage: Stage, tracking_uri: str, experiment: str, parent_run_id: str | None) -> list[str]:
    """The stage's argv plus where to log (kept out of the fingerprint)."""
    if not stage.mlflow:
        return list(stage.argv)
    extra = ["--mlflow-tracking-uri", tracking_uri, "--experiment", experiment]
    if parent_run_id:
        extra += ["--parent-run-id", parent_run_id]
    return list(stage.argv) + extra
