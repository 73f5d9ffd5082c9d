"""One spec per job: everything the workflow knows about a job in one place. How a config section becomes its
stages (the flags the workflow wires between stages, refused in a config's `args`), where the outputs go, how to
tell they are complete (each job writes that evidence last), whether it is tracked in MLflow, and which numbers of
its last JSON line the summary shows.

`SECTIONS` maps each section of a workflow config to its job's spec, in dependency order.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corpus.schema import MANIFEST
from storage import fs as storage_fs
from storage.publish import is_complete
from training.export import PRETRAIN_LINEAGE
from workflows.stage import TRACKING_FLAGS, JobStage, Planned, fingerprint, input_stamps, join, to_argv


class JobSpec:
    job: str                          # jobs/<job>.py
    wired: frozenset[str]             # flags the workflow sets itself: a config that sets them is refused
    tracked: bool = True              # takes --mlflow-tracking-uri / --experiment / --parent-run-id
    key_metrics: tuple[str, ...] | None = None  # the numbers of its last JSON line worth a line (None: all)
    named: bool = True                # its section is a mapping of name -> entry (else one entry)

    def stage(self, name: str, entry: Mapping[str, Any], planned: Planned) -> JobStage:
        raise NotImplementedError

    def complete(self, stage: JobStage) -> bool:
        raise NotImplementedError

    def args(self, entry: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The entry's `args:` with flag spelling (dashes), refusing the ones the workflow wires."""
        args = {str(k).replace("_", "-"): v for k, v in (entry.get("args") or {}).items()}
        clash = sorted(set(args) & self.wired)
        if clash:
            raise ValueError(f"{where}: args {clash} are set by the workflow (it wires stages together); remove them")
        return args

    def metrics(self, result: Mapping[str, Any]) -> dict[str, float]:
        return {k: float(v) for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                and (self.key_metrics is None or k in self.key_metrics)}


def _inputs(entry: Mapping[str, Any], where: str, what: str) -> list[str]:
    inputs = entry.get("input")
    if not inputs:
        raise ValueError(f"{where}: needs `input` ({what})")
    return list(inputs) if isinstance(inputs, list) else [inputs]


class TrainTokenizer(JobSpec):
    job = "train_tokenizer"
    wired = frozenset({"input", "output"}) | TRACKING_FLAGS
    key_metrics = ("vocab_size",)
    named = False

    def stage(self, name, entry, planned):
        inputs = _inputs(entry, name, "the corpus to train the WordPiece vocabulary on")
        base = to_argv(self.args(entry, name)) + to_argv({"input": inputs})
        fp = fingerprint(self.job, base, [], input_stamps(inputs))
        out = join(planned.workdir, "vocab", f"vocab-{fp[:8]}.txt")
        return JobStage(name, self.job, base + ["--output", out], [], fp, {"vocab": out})

    def complete(self, stage):
        return storage_fs.exists(stage.outputs["vocab"])


class BuildDataset(JobSpec):
    job = "build_dataset"
    wired = frozenset({"input", "output"}) | TRACKING_FLAGS
    key_metrics = ("instances", "documents", "tokens", "shards")

    def stage(self, name, entry, planned):
        where = f"datasets.{name}"
        inputs = _inputs(entry, where, "files, directories or globs; local or s3://")
        args, deps = self.args(entry, where), []
        vocab = planned.by_section.get("vocab", {}).get("vocab")
        if "vocab" not in args and vocab is not None:  # the workflow's own vocabulary, unless one is given
            args["vocab"], deps = vocab.outputs["vocab"], [vocab]
        base = to_argv(args) + to_argv({"input": inputs})
        fp = fingerprint(self.job, base, deps, input_stamps(inputs))
        out = join(entry.get("output_root") or join(planned.workdir, "datasets"), f"{name}-{fp[:8]}")
        return JobStage(f"dataset {name}", self.job, base + ["--output", out], [d.name for d in deps], fp,
                     {"dataset": out})

    def complete(self, stage):
        return storage_fs.exists(storage_fs.join(stage.outputs["dataset"], MANIFEST))


class Pretrain(JobSpec):
    job = "pretrain"
    wired = frozenset({"data", "eval-data", "storage", "run-name", "export", "init"}) | TRACKING_FLAGS
    key_metrics = ("loss", "mlm_accuracy", "nsp_accuracy", "eval_loss", "eval_mlm_accuracy", "eval_mlm_top_token_share",
                   "eval_nsp_accuracy", "sequences_per_second", "mfu", "hfu")

    def stage(self, name, entry, planned):
        where, datasets = f"pretrain.{name}", planned.by_section.get("datasets", {})
        phases = planned.by_section.get("pretrain", {})  # the phases planned before this one
        args, deps, wiring = self.args(entry, where), [], {}
        for key, flag in (("data", "data"), ("eval_data", "eval-data")):
            ref = entry.get(key)
            if ref is None:
                if key == "data":
                    raise ValueError(f"{where}: needs `data: <name under datasets>`")
                continue
            if ref not in datasets:
                raise ValueError(f"{where}.{key}: {ref!r} is not one of the datasets {sorted(datasets)}")
            deps.append(datasets[ref])
            wiring[flag] = datasets[ref].outputs["dataset"]
        init = entry.get("init")
        if init is not None:
            if init in phases:
                deps.append(phases[init])
                wiring["init"] = phases[init].outputs["export"]
            elif init in planned.config["pretrain"]:
                raise ValueError(f"{where}.init: phase {init!r} must come before {name!r}")
            else:
                wiring["init"] = init  # a model directory given by path (an HF BERT, an earlier export)
        base = to_argv(args)
        fp = fingerprint(self.job, base + to_argv({"init": wiring.get("init") if init not in phases else None}), deps)
        run_name = f"{planned.name}-{name}-{fp[:8]}"
        checkpoints = entry.get("storage") or join(planned.workdir, "checkpoints")
        export = join(planned.workdir, "exports", f"{name}-{fp[:8]}")
        argv = base + to_argv(wiring) + ["--storage", checkpoints, "--run-name", run_name, "--export", export]
        return JobStage(f"pretrain {name}", self.job, argv, [d.name for d in deps], fp,
                     {"export": export, "checkpoints": join(checkpoints, run_name)}, info={"run_name": run_name})

    def complete(self, stage):  # a local export folder, or an S3 one whose export.json names these
        return is_complete(stage.outputs["export"], ("config.json", "model.safetensors", PRETRAIN_LINEAGE))


class Finetune(JobSpec):
    job = "finetune"
    wired = frozenset({"init", "output"}) | TRACKING_FLAGS

    def stage(self, name, entry, planned):
        where, phases = f"finetune.{name}", planned.by_section.get("pretrain", {})
        init = entry.get("init", list(phases)[-1] if phases else None)
        if init not in phases:
            raise ValueError(f"{where}.init: {init!r} is not one of the pretrain phases {sorted(phases)}")
        base = to_argv(self.args(entry, where))
        fp = fingerprint(self.job, base, [phases[init]])
        out = join(planned.workdir, "finetune", f"{name}-{fp[:8]}")
        argv = base + ["--init", phases[init].outputs["export"], "--output", out]
        return JobStage(f"finetune {name}", self.job, argv, [phases[init].name], fp, {"model": out})

    def complete(self, stage):
        return is_complete(stage.outputs["model"])


# The config's sections, in dependency order, and the job each one runs.
SECTIONS: dict[str, JobSpec] = {"vocab": TrainTokenizer(), "datasets": BuildDataset(), "pretrain": Pretrain(),
                                "finetune": Finetune()}
SPECS: dict[str, JobSpec] = {spec.job: spec for spec in SECTIONS.values()}
